//! Splitting each planned output tensor into work units: runs of output rows small enough to
//! bound memory, large enough to amortise their set-up.

use crate::checkpoint::tensor::view;
use crate::checkpoint::{Catalog, Checkpoint, Leaf};
use crate::layout::RowSource;
use crate::plan::Plan;
use crate::transform::hadamard::HADAMARD_SIZE;
use anyhow::Result;
use std::collections::HashMap;
use std::ops::Range;

/// Elements per work unit for sources that are not coded (bounded memory, enough work per unit).
pub const ELEMENTS_PER_UNIT: usize = 1 << 20;

/// A piece of a source's output: rows (global, lead-major), and columns within each row. Only a
/// row too wide for one unit is cut into column pieces, one row each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub rows: Range<usize>,
    pub cols: Range<usize>,
}

/// A span of plan tensor `tensor`. A unit of a coded source lies within one 128-row block of one
/// lead.
pub struct Unit {
    pub tensor: usize,
    pub span: Span,
    /// Its share of the tensor's bytes (for batching).
    pub bytes: u64,
    /// The large input tensor it reads, as an index into [`Units::inputs`].
    pub input: Option<usize>,
}

pub struct Units {
    pub units: Vec<Unit>,
    /// The input tensors whose pages can be released once every unit reading them is done.
    pub inputs: Vec<String>,
}

/// `(leads, rows per lead, columns)` of a row source.
pub fn dims(source: &RowSource, ck: &Checkpoint, cat: &Catalog) -> Result<(usize, usize, usize)> {
    Ok(match source {
        RowSource::Coded { module, rows } => {
            (cat.coded[*module].expert_count(), rows.len(), cat.coded[*module].in_features)
        }
        RowSource::Int8(i) => (1, cat.int8[*i].shape[0], cat.int8[*i].shape[1]),
        RowSource::Tensor { name, rows, cols } => (view(&ck.entry(name)?.shape).0, rows.len(), *cols),
        RowSource::Stack(members) => {
            let (_, rows, cols) = dims(&members[0], ck, cat)?;
            (members.len(), rows, cols)
        }
        RowSource::Reordered { inner, .. } | RowSource::Product(inner, _) => dims(inner, ck, cat)?,
        RowSource::Slice { leads, rows, cols, .. } => (leads.len(), rows.len(), cols.len()),
        RowSource::Literal { width, .. } => (1, 1, *width),
    })
}

/// Whether units may span leads: a source that reads one input tensor whole, its leads following
/// each other there, or a slice of one (read lead by lead within a unit).
fn contiguous(source: &RowSource, ck: &Checkpoint) -> Result<bool> {
    Ok(match source {
        RowSource::Int8(_) | RowSource::Slice { .. } | RowSource::Literal { .. } => true,
        RowSource::Tensor { name, rows, cols } => {
            let (_, height, width) = view(&ck.entry(name)?.shape);
            *rows == (0..height) && *cols == width
        }
        RowSource::Reordered { inner, .. } => contiguous(inner, ck)?,
        RowSource::Coded { .. } | RowSource::Stack(_) | RowSource::Product(..) => false,
    })
}

pub fn units(plan: &Plan, ck: &Checkpoint, cat: &Catalog) -> Result<Units> {
    let mut out = Units { units: Vec::new(), inputs: Vec::new() };
    let mut input_ids: HashMap<String, usize> = HashMap::new();
    for (t, p) in plan.tensors.iter().enumerate() {
        let Some(recipe) = &p.tensor.recipe else { continue };
        let dims = dims(&recipe.source, ck, cat)?;
        let contiguous = contiguous(&recipe.source, ck)?;
        let values = (dims.0 * dims.1 * dims.2).max(1) as u64;
        for (lead, span) in spans(&recipe.source, dims, contiguous) {
            let input = bulk_input(&recipe.source, lead, cat).map(|name| id(&mut input_ids, &mut out.inputs, name));
            let bytes = p.tensor.byte_len() as u64 * (span.rows.len() * span.cols.len()) as u64 / values;
            out.units.push(Unit { tensor: t, span, bytes, input });
        }
    }
    Ok(out)
}

/// The spans a source of `(leads, n, cols)` is cut into, each with the lead it reads: per lead,
/// 128-row blocks of a coded module, else runs of about [`ELEMENTS_PER_UNIT`] values (across
/// leads when `contiguous`); a row wider than that is cut into column pieces of that many values
/// (a multiple of every block and group size), so memory per unit is bounded whatever the shape.
pub fn spans(source: &RowSource, (leads, n, cols): (usize, usize, usize), contiguous: bool) -> Vec<(usize, Span)> {
    let per_unit = (ELEMENTS_PER_UNIT / cols.max(1)).max(1);
    let runs = row_runs(source, (leads, n), contiguous, per_unit);
    let mut out = Vec::with_capacity(runs.len());
    for (lead, rows) in runs {
        if cols <= ELEMENTS_PER_UNIT {
            out.push((lead, Span { rows, cols: 0..cols }));
            continue;
        }
        for row in rows {
            for c in (0..cols).step_by(ELEMENTS_PER_UNIT) {
                out.push((lead, Span { rows: row..row + 1, cols: c..(c + ELEMENTS_PER_UNIT).min(cols) }));
            }
        }
    }
    out
}

/// The runs of global (lead-major) rows that units cover, each with its lead: a reordered
/// source's runs are those of its input cut where the order moves rows apart.
fn row_runs(
    source: &RowSource,
    (leads, n): (usize, usize),
    contiguous: bool,
    per_unit: usize,
) -> Vec<(usize, Range<usize>)> {
    if let RowSource::Reordered { inner, rows: Some(order), .. } = source {
        let inner_runs = row_runs(inner, (leads, n), contiguous, per_unit);
        let mut runs = Vec::with_capacity(inner_runs.len() + order.runs().len());
        for (out, from, len) in order.runs() {
            // The input runs overlapping `from..from + len`, found by binary search: they are sorted.
            let mut i = inner_runs.partition_point(|(_, r)| r.end <= from);
            while let Some((lead, r)) = inner_runs.get(i).filter(|(_, r)| r.start < from + len) {
                let (start, end) = (r.start.max(from), r.end.min(from + len));
                runs.push((*lead, out + start - from..out + end - from));
                i += 1;
            }
        }
        return runs;
    }
    if contiguous {
        return (0..leads * n).step_by(per_unit).map(|s| (0, s..(s + per_unit).min(leads * n))).collect();
    }
    (0..leads)
        .flat_map(|lead| {
            lead_runs(source, n, per_unit).into_iter().map(move |r| (lead, lead * n + r.start..lead * n + r.end))
        })
        .collect()
}

/// The runs of one lead's `n` rows (`0..n`) that units cover: 128-row blocks of a coded module,
/// else `per_unit` rows at a time.
fn lead_runs(source: &RowSource, n: usize, per_unit: usize) -> Vec<Range<usize>> {
    let coded_start = match source {
        RowSource::Coded { rows, .. } => Some(rows.start),
        RowSource::Stack(members) => match &members[0] {
            RowSource::Coded { rows, .. } => Some(rows.start),
            _ => None,
        },
        RowSource::Reordered { inner, .. } => return lead_runs(inner, n, per_unit),
        _ => None,
    };
    match coded_start {
        // Cut where the module's own row index crosses a 128-row block.
        Some(first) => {
            let mut runs = Vec::new();
            let mut start = 0;
            while start < n {
                let block_end = ((first + start) / HADAMARD_SIZE + 1) * HADAMARD_SIZE - first;
                let end = block_end.min(n);
                runs.push(start..end);
                start = end;
            }
            runs
        }
        None => (0..n).step_by(per_unit).map(|s| s..(s + per_unit).min(n)).collect(),
    }
}

/// The large input tensor lead `lead` of a source reads: codes, int8 weights or a plain tensor.
pub(super) fn bulk_input<'a>(source: &'a RowSource, lead: usize, cat: &'a Catalog) -> Option<&'a str> {
    match source {
        RowSource::Coded { module, .. } => cat.coded[*module].tensor(Leaf::Code),
        RowSource::Int8(i) => Some(&cat.int8[*i].weight),
        RowSource::Tensor { name, .. } | RowSource::Slice { name, .. } => Some(name),
        // Small vectors, and a constant: nothing worth releasing early.
        RowSource::Product(..) | RowSource::Literal { .. } => None,
        RowSource::Stack(members) => bulk_input(members.get(lead)?, 0, cat),
        RowSource::Reordered { inner, .. } => bulk_input(inner, lead, cat),
    }
}

fn id(ids: &mut HashMap<String, usize>, names: &mut Vec<String>, name: &str) -> usize {
    *ids.entry(name.to_string()).or_insert_with(|| {
        names.push(name.to_string());
        names.len() - 1
    })
}
