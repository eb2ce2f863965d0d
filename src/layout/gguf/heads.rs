//! llama.cpp's order of linear-attention V heads. Hugging Face stores the V heads that share a
//! key head together; when there are more V heads than key heads, llama.cpp's converter tiles
//! them instead (one V head of every key head, then the next), so that ggml can broadcast the key
//! heads by repetition. Every tensor indexed by V head moves the same way: the V rows of
//! `in_proj_qkv` and of `conv1d`, the rows of `in_proj_z`, `in_proj_a` and `in_proj_b`, the
//! entries of `A_log` and `dt_bias`, and the input columns of `out_proj`.

use super::hparams::Hparams;
use crate::layout::HeadOrder;
use anyhow::{bail, Result};

/// Which axis of a tensor moves, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reorder {
    Rows(HeadOrder),
    Cols(HeadOrder),
}

/// The linear-attention head counts and sizes.
#[derive(Clone, Copy, Debug)]
pub struct LinearHeads {
    key_heads: usize,
    key_dim: usize,
    value_heads: usize,
    value_dim: usize,
}

impl LinearHeads {
    /// The heads of `hp`, or `None` when V heads already match key heads (nothing moves).
    pub fn new(hp: &Hparams) -> Result<Option<LinearHeads>> {
        let count = |key: &str| hp.count(key).map(|n| n.map(|n| n as usize));
        let (Some(key_heads), Some(value_heads)) = (count("linear_num_key_heads")?, count("linear_num_value_heads")?)
        else {
            return Ok(None);
        };
        if key_heads == 0 {
            bail!("config.json: linear_num_key_heads is 0, with {value_heads} value heads");
        }
        if value_heads == key_heads {
            return Ok(None);
        }
        if value_heads % key_heads != 0 {
            bail!("config.json: {value_heads} linear-attention value heads do not divide among {key_heads} key heads");
        }
        let dim = |key: &str| count(key)?.ok_or_else(|| anyhow::anyhow!("config.json has no {key}"));
        Ok(Some(LinearHeads {
            key_heads,
            key_dim: dim("linear_key_head_dim")?,
            value_heads,
            value_dim: dim("linear_value_head_dim")?,
        }))
    }

    fn order(&self, skip: usize, head: usize) -> HeadOrder {
        HeadOrder { skip, key_heads: self.key_heads, per_key: self.value_heads / self.key_heads, head }
    }

    /// How HF tensor leaf `leaf` (after `layers.N.`) moves, if it does.
    pub fn reorder(&self, leaf: &str) -> Option<Reorder> {
        let qk = 2 * self.key_heads * self.key_dim;
        Some(match leaf {
            "linear_attn.in_proj_qkv.weight" | "linear_attn.conv1d.weight" => {
                Reorder::Rows(self.order(qk, self.value_dim))
            }
            "linear_attn.in_proj_z.weight" => Reorder::Rows(self.order(0, self.value_dim)),
            "linear_attn.in_proj_a.weight" | "linear_attn.in_proj_b.weight" => Reorder::Rows(self.order(0, 1)),
            "linear_attn.A_log" | "linear_attn.dt_bias" => Reorder::Cols(self.order(0, 1)),
            "linear_attn.out_proj.weight" => Reorder::Cols(self.order(0, self.value_dim)),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order as the converter computes it: view as `[key, per_key, head]`, swap the first two.
    fn reference(order: &HeadOrder) -> Vec<usize> {
        let mut out: Vec<usize> = (0..order.skip).collect();
        for v in 0..order.per_key {
            for k in 0..order.key_heads {
                out.extend((0..order.head).map(|d| order.skip + (k * order.per_key + v) * order.head + d));
            }
        }
        out
    }

    #[test]
    fn heads_move_from_grouped_to_tiled() {
        for order in [
            HeadOrder { skip: 0, key_heads: 2, per_key: 3, head: 1 },
            HeadOrder { skip: 5, key_heads: 2, per_key: 2, head: 4 },
            HeadOrder { skip: 0, key_heads: 16, per_key: 3, head: 128 },
        ] {
            let mapped: Vec<usize> = (0..order.width()).map(|i| order.source(i)).collect();
            assert_eq!(mapped, reference(&order), "{order:?}");
            let runs: Vec<usize> = order
                .runs()
                .into_iter()
                .flat_map(|(out, from, len)| (0..len).map(move |d| (out + d, from + d)))
                .map(|(o, f)| {
                    assert_eq!(order.source(o), f);
                    o
                })
                .collect();
            assert_eq!(runs, (0..order.width()).collect::<Vec<_>>(), "runs cover every index once, in order");
            let mut rows: Vec<usize> = (0..order.width()).chain(0..order.width()).collect();
            order.apply_to_rows(&mut rows, &mut Vec::new());
            assert_eq!(rows, [reference(&order), reference(&order)].concat());
        }
    }
}
