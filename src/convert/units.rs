//! Splitting each planned output tensor into work units.

use super::{Part, ELEMENTS_PER_UNIT};
use crate::layout::mlx::{MlxRecipe, RowSource};
use crate::layout::Recipe;
use crate::transform::hadamard::HADAMARD_SIZE;
use std::ops::Range;

/// The work of one unit.
pub(super) enum Work {
    CodedBlock {
        expert: usize,
        block: usize,
    },
    Int8Rows(Range<usize>),
    Elements(Range<usize>),
    /// MLX: rows `rows` of expert `lead` of a row source; `params`: the plan indices of the
    /// `.scales` and `.biases` tensors the unit also writes.
    MlxRows {
        lead: usize,
        rows: Range<usize>,
        params: Option<[usize; 2]>,
    },
}

pub(super) struct Unit {
    pub(super) tensor: usize,
    pub(super) work: Work,
}

pub(super) fn units(part: &Part) -> Vec<Unit> {
    let mut units = Vec::new();
    for (t, p) in part.plan.tensors.iter().enumerate() {
        match &p.tensor.recipe {
            Recipe::Coded(i) => {
                let m = &part.cat.coded[*i];
                let blocks = m.out_features.div_ceil(HADAMARD_SIZE);
                for expert in 0..m.expert_count() {
                    for block in 0..blocks {
                        units.push(Unit { tensor: t, work: Work::CodedBlock { expert, block } });
                    }
                }
            }
            Recipe::Int8(i) => {
                let shape = &part.cat.int8[*i].shape;
                let rows_per_unit = (ELEMENTS_PER_UNIT / shape[1].max(1)).max(1);
                for start in (0..shape[0]).step_by(rows_per_unit) {
                    units.push(Unit { tensor: t, work: Work::Int8Rows(start..(start + rows_per_unit).min(shape[0])) });
                }
            }
            Recipe::Bias(_) | Recipe::Copy(_) | Recipe::Mlx(MlxRecipe::NormPlusOne(_)) => {
                let n = p.tensor.shape.iter().product::<usize>();
                for start in (0..n.max(1)).step_by(ELEMENTS_PER_UNIT) {
                    units.push(Unit { tensor: t, work: Work::Elements(start..(start + ELEMENTS_PER_UNIT).min(n)) });
                }
            }
            Recipe::Mlx(r) => mlx_units(part, t, r, &mut units),
        }
    }
    units
}

/// Units of an MLX row recipe: one per 128-row block of a coded source (per expert), runs of
/// rows otherwise. Quantized units also carry where their scales and biases go.
fn mlx_units(part: &Part, t: usize, recipe: &MlxRecipe, units: &mut Vec<Unit>) {
    let index = |name: &str| part.plan.tensors.iter().position(|p| p.tensor.name == name);
    let (source, params) = match recipe {
        MlxRecipe::Quantized { source, scales, biases, .. } => (source, index(scales).zip(index(biases))),
        MlxRecipe::Int8Exact { int8, scales, biases, .. } => {
            let rows = part.cat.int8[*int8].shape[0];
            let params = index(scales).zip(index(biases)).map(|(s, b)| [s, b]);
            let per_unit = (ELEMENTS_PER_UNIT / part.cat.int8[*int8].shape[1].max(1)).max(1);
            for start in (0..rows).step_by(per_unit) {
                units.push(Unit {
                    tensor: t,
                    work: Work::MlxRows { lead: 0, rows: start..(start + per_unit).min(rows), params },
                });
            }
            return;
        }
        MlxRecipe::Dense(source) => (source, None),
        MlxRecipe::NormPlusOne(_) | MlxRecipe::Companion => return,
    };
    let params = params.map(|(s, b)| [s, b]);
    if let RowSource::Stack(members) = source {
        for (lead, member) in members.iter().enumerate() {
            let (_, rows, cols) = row_source_dims(part, member);
            let per_unit = match member {
                RowSource::Coded { .. } => HADAMARD_SIZE,
                _ => (ELEMENTS_PER_UNIT / cols.max(1)).max(1),
            };
            for start in (rows.start..rows.end).step_by(per_unit) {
                units.push(Unit {
                    tensor: t,
                    work: Work::MlxRows { lead, rows: start..(start + per_unit).min(rows.end), params },
                });
            }
        }
        return;
    }
    match source {
        RowSource::Coded { coded, rows, .. } => {
            let m = &part.cat.coded[*coded];
            for lead in 0..m.expert_count() {
                for block in rows.start / HADAMARD_SIZE..rows.end.div_ceil(HADAMARD_SIZE) {
                    let r = (block * HADAMARD_SIZE).max(rows.start)..((block + 1) * HADAMARD_SIZE).min(rows.end);
                    units.push(Unit { tensor: t, work: Work::MlxRows { lead, rows: r, params } });
                }
            }
        }
        RowSource::Int8(_) | RowSource::Plain { .. } | RowSource::Stack(_) => {
            let (leads, rows, cols) = row_source_dims(part, source);
            let per_unit = (ELEMENTS_PER_UNIT / cols.max(1)).max(1);
            for lead in 0..leads {
                for start in (rows.start..rows.end).step_by(per_unit) {
                    units.push(Unit {
                        tensor: t,
                        work: Work::MlxRows { lead, rows: start..(start + per_unit).min(rows.end), params },
                    });
                }
            }
        }
    }
}

/// (leading count, row range, columns) of a row source.
pub(super) fn row_source_dims(part: &Part, source: &RowSource) -> (usize, Range<usize>, usize) {
    match source {
        RowSource::Coded { coded, rows, .. } => {
            let m = &part.cat.coded[*coded];
            (m.expert_count(), rows.clone(), m.in_features)
        }
        RowSource::Int8(i) => {
            let shape = &part.cat.int8[*i].shape;
            (1, 0..shape[0], shape[1])
        }
        RowSource::Plain { name, rows } => {
            let shape = &part.ck.tensors[name].shape;
            let leads = shape[..shape.len() - 2].iter().product();
            (leads, rows.clone(), shape[shape.len() - 1])
        }
        RowSource::Stack(members) => {
            let (_, rows, cols) = row_source_dims(part, &members[0]);
            (members.len(), rows, cols)
        }
    }
}
