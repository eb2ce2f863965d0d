//! The output plan: every output tensor placed in a shard at a fixed byte offset, so the whole
//! output header is known before any weight is decoded and workers write straight into place.

use crate::container::{Container, Metadata, ShardAt, TensorInfo};
use crate::layout::{Encoding, OutputTensor};
use anyhow::{bail, Result};
use serde_json::{Map, Value};
use std::collections::HashMap;

/// Part `index` (1-based) of a job split into `count` (`--part I/N`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartSpec {
    pub index: usize,
    pub count: usize,
}

impl std::str::FromStr for PartSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?}: expected I/N with 1 ≤ I ≤ N, e.g. 2/3");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count): (usize, usize) =
            (i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
        if index == 0 || index > count {
            return Err(bad());
        }
        Ok(PartSpec { index, count })
    }
}

/// A tensor with its place in the output.
#[derive(Clone, Debug)]
pub struct PlannedTensor {
    pub tensor: OutputTensor,
    pub shard: usize,
    /// Absolute offset of its first byte in the shard file.
    pub offset: u64,
    /// For an affine tensor: the plan indices of its scales and biases, which its units write.
    pub params: Option<[usize; 2]>,
}

/// One output file: its name, full header (length prefix included) and final length.
#[derive(Clone, Debug)]
pub struct ShardPlan {
    pub file_name: String,
    pub header: Vec<u8>,
    pub len: u64,
    /// Plan indices of its tensors, in data order.
    pub tensors: std::ops::Range<usize>,
}

#[derive(Clone, Debug)]
pub struct Plan {
    pub tensors: Vec<PlannedTensor>,
    pub shards: Vec<ShardPlan>,
    /// The container's index file (name, text), if it has one.
    pub index: Option<(String, String)>,
}

impl Plan {
    /// Places `tensors` (in output order, names unique) greedily into shards of at most
    /// `max_shard_size` tensor bytes; a tensor larger than the limit gets a shard of its own.
    pub fn new(
        tensors: Vec<OutputTensor>,
        max_shard_size: u64,
        container: &dyn Container,
        metadata: &Metadata,
        index_metadata: Map<String, Value>,
    ) -> Result<Plan> {
        let mut groups: Vec<Vec<OutputTensor>> = Vec::new();
        let mut current = 0u64;
        for t in tensors {
            let size = t.byte_len() as u64;
            match groups.last_mut() {
                Some(g) if current + size <= max_shard_size => g.push(t),
                _ => {
                    groups.push(vec![t]);
                    current = 0;
                }
            }
            current += size;
        }
        let n = groups.len();
        let tensors_total = groups.iter().map(Vec::len).sum();
        let (mut planned, mut shards, mut total_size) = (Vec::new(), Vec::new(), 0);
        for (i, group) in groups.into_iter().enumerate() {
            let infos: Vec<TensorInfo> = group.iter().map(OutputTensor::info).collect();
            let layout = container.shard_layout(&infos, metadata, ShardAt { index: i, count: n, tensors_total })?;
            let first = planned.len();
            for (t, offset) in group.into_iter().zip(layout.offsets) {
                total_size += t.byte_len() as u64;
                planned.push(PlannedTensor { tensor: t, shard: i, offset, params: None });
            }
            let tensors = first..planned.len();
            shards.push(ShardPlan {
                file_name: container.shard_name(i, n),
                header: layout.header,
                len: layout.len,
                tensors,
            });
        }
        resolve_params(&mut planned)?;
        let weight_map: Vec<(&str, &str)> =
            planned.iter().map(|p| (p.tensor.name.as_str(), shards[p.shard].file_name.as_str())).collect();
        let index = container.index(&weight_map, total_size, index_metadata);
        Ok(Plan { tensors: planned, shards, index })
    }

    /// Where shard `i` stands in the output.
    pub fn shard_at(&self, i: usize) -> ShardAt {
        ShardAt { index: i, count: self.shards.len(), tensors_total: self.tensors.len() }
    }

    /// Which shards part `part` of a split job writes (all of them without one): shards go, largest
    /// first, to the part with the fewest bytes so far (the lowest-numbered on a tie), so every
    /// machine computes the same assignment and the parts come out about equal in bytes.
    pub fn owned_shards(&self, part: Option<PartSpec>) -> Vec<bool> {
        let Some(part) = part else { return vec![true; self.shards.len()] };
        let mut order: Vec<usize> = (0..self.shards.len()).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(self.shards[i].len), i));
        let mut load = vec![0u64; part.count];
        let mut owner = vec![0; self.shards.len()];
        for i in order {
            let p = (0..part.count).min_by_key(|&p| (load[p], p)).expect("at least one part");
            load[p] += self.shards[i].len;
            owner[i] = p;
        }
        owner.into_iter().map(|p| p + 1 == part.index).collect()
    }

    /// The tensors of shard `i`, in data order.
    pub fn shard_tensors(&self, i: usize) -> impl Iterator<Item = &PlannedTensor> {
        self.tensors[self.shards[i].tensors.clone()].iter()
    }
}

/// Finds each affine tensor's scales and biases by name, once.
fn resolve_params(planned: &mut [PlannedTensor]) -> Result<()> {
    let index: HashMap<&str, usize> = planned.iter().enumerate().map(|(i, p)| (p.tensor.name.as_str(), i)).collect();
    let mut resolved = Vec::new();
    for (i, p) in planned.iter().enumerate() {
        let Some(Encoding::Affine { params, .. } | Encoding::Int8Affine { params, .. }) =
            p.tensor.recipe.as_ref().map(|r| &r.encoding)
        else {
            continue;
        };
        let find = |name: &str| match index.get(name) {
            Some(&j) if planned[j].tensor.recipe.is_none() => Ok(j),
            _ => bail!("{}: its {name} is not planned as a companion tensor", p.tensor.name),
        };
        resolved.push((i, [find(&params.scales)?, find(&params.biases)?]));
    }
    for (i, params) in resolved {
        planned[i].params = Some(params);
    }
    Ok(())
}
