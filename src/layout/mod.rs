//! Output formats: which output tensors a checkpoint becomes, with names, shapes, dtypes and
//! recipes, and the policy for the files around them.
//!
//! An [`OutputFormat`] is the user's choice as a value; its [`Layout`] is the policy the engine
//! follows. Each format has its module: [`hf`] (dense bf16 or f16, Hugging Face layout), [`mlx`]
//! (MLX layout, affine-quantized), [`exl3`] (the trellis codes as stored, for exllamav3) and
//! [`gguf`] (GGUF for llama.cpp: bf16, f16, f32, `Q8_0` or K-quants). `tensor.rs` describes an
//! output tensor in terms every format shares; `options.rs` holds the options more than one
//! format takes ([`Int8Mode`], [`AutoBits`], [`BiasMode`]).

mod choice;
pub mod exl3;
mod fit;
mod flags;
pub mod gguf;
pub mod hf;
pub mod mlx;
pub mod mtp;
mod names;
mod options;
mod policy;
mod tensor;

pub use choice::{Chosen, WidthChoice};
pub use exl3::Exl3Layout;
pub use fit::{FitOption, FitRecipe, FitTensor, Yardsticks, TABLE_BITS};
pub use flags::FlagWords;
pub use gguf::{GgufLayout, GgufOptions, GgufType};
pub use hf::{DenseDtype, HfLayout};
pub use mlx::{MlxLayout, MlxOptions};
pub use mtp::MtpMode;
pub use names::{natural_key, norm_kind, NormKind};
pub use options::{AutoBits, BiasMode, Int8Mode};
pub use policy::{tensors_only_note, FormatCard, Layout, WeightProbe};
pub use tensor::{
    check_unique_names, Adjust, AffineParams, Encoding, HeadOrder, ImatrixKey, Importance, Kind, OutputTensor, Recipe,
    RowSource,
};

/// What the conversion writes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OutputFormat {
    /// Dense weights in the Hugging Face layout, with or without the MTP head.
    Dense { dtype: DenseDtype, mtp: MtpMode },
    /// MLX layout, affine-quantized.
    Mlx(MlxOptions),
    /// GGUF for llama.cpp.
    Gguf(GgufOptions),
    /// EXL3 for exllamav3: the trellis codes as stored, with or without the MTP head.
    Exl3 { mtp: MtpMode },
}

impl OutputFormat {
    /// The policy that writes this format.
    pub fn layout(&self) -> Box<dyn Layout> {
        match *self {
            OutputFormat::Dense { dtype, mtp } => Box::new(HfLayout { dtype, mtp }),
            OutputFormat::Mlx(opts) => Box::new(MlxLayout { opts }),
            OutputFormat::Gguf(opts) => Box::new(GgufLayout { opts }),
            OutputFormat::Exl3 { mtp } => Box::new(Exl3Layout { mtp }),
        }
    }
}
