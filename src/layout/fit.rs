//! `--max-size`: the encodings a format offers each tensor it quantizes, what each costs in bytes
//! and the error each adds, for the engine to choose among (`convert/fit.rs`).

use super::choice::Chosen;
use crate::storage::Storage;

/// The bits an int8 table (an embedding, `lm_head`, any other int8 or plain weight a format
/// quantizes) counts as: its added error is weighed against `2^-8`, as a coded linear's is
/// against its trellis error `2^-K`, so a table is held to the same ratio as the coded linears.
pub const TABLE_BITS: u32 = 8;

/// One encoding a tensor may take.
#[derive(Clone, Debug, PartialEq)]
pub struct FitOption {
    pub chosen: Chosen,
    /// The MLX group size (`None` for a GGUF type).
    pub group_size: Option<usize>,
    /// How it is stored: the MLX scales' and biases' dtype, or the GGUF tensor's type.
    pub storage: Storage,
    /// The source's own values repacked (int8 as MLX 8-bit with F32 scales, or `Q8_0`): no error.
    pub lossless: bool,
    /// Bytes written for the tensor, its scales and biases included.
    pub bytes: u64,
    /// The added relative error `‖deq(Q(W)) − W‖ / ‖W‖`, estimated from sampled rows.
    pub error: f64,
}

/// A tensor whose encoding the budget chooses, with its menu.
#[derive(Clone, Debug)]
pub struct FitTensor {
    /// Its index in the format's tensor list.
    pub index: usize,
    pub name: String,
    /// The trellis bits of a coded linear; `None` for a table.
    pub k: Option<u32>,
    pub weights: u64,
    pub options: Vec<FitOption>,
}

impl FitTensor {
    /// The error the ratio is taken against: `2^-K`, or `2^-8` for a table.
    pub fn reference(&self) -> f64 {
        0.5f64.powi(self.k.unwrap_or(TABLE_BITS) as i32)
    }

    /// Option `i`'s added error over the reference (infinite when the error is not a number).
    pub fn ratio(&self, i: usize) -> f64 {
        let ratio = self.options[i].error / self.reference();
        if ratio.is_nan() {
            f64::INFINITY
        } else {
            ratio
        }
    }

    /// Whether it is a coded linear (the tensors the largest ratio is minimized over).
    pub fn coded(&self) -> bool {
        self.k.is_some()
    }
}

/// One of the format's fixed recipes (what `--bits 3` or `--gguf-type q3_k_m` would write), as an
/// option of every menu entry: a `--max-size` plan is held to be no worse than each that fits.
#[derive(Clone, Debug)]
pub struct FitRecipe {
    /// The recipe as the user would ask for it (`--bits 3 --group-size 64`, `--gguf-type q3_k_m`).
    pub name: String,
    /// Per menu entry, the index of the option the recipe gives it.
    pub choice: Vec<usize>,
}

/// The fixed recipes a plan is weighed against, and by name those it cannot be: each gives a menu
/// entry an encoding the menu does not offer (reported, so that a yardstick never goes missing
/// unseen).
#[derive(Clone, Debug, Default)]
pub struct Yardsticks {
    pub recipes: Vec<FitRecipe>,
    /// `"--gguf-type q3_k_m (token_embd.weight)"`: the recipe and the first entry off the menu.
    pub off_menu: Vec<String>,
}

impl Yardsticks {
    /// Adds the recipe that gives each menu entry `pick(entry)`, or names it off the menu when
    /// `pick` finds no option for an entry.
    pub fn add(&mut self, name: String, menu: &[FitTensor], pick: impl Fn(&FitTensor) -> Option<usize>) {
        match menu.iter().map(|t| pick(t).ok_or(t)).collect::<Result<Vec<_>, _>>() {
            Ok(choice) => self.recipes.push(FitRecipe { name, choice }),
            Err(t) => self.off_menu.push(format!("{name} ({})", t.name)),
        }
    }
}
