//! What the model card says of an MLX output: its tags, its settings in one line and how to load it.

use super::options::MlxOptions;
use crate::layout::options::Int8Mode;
use crate::layout::policy::FormatCard;
use crate::quant::affine::AffineSpec;

/// The card of an output written with `opts`.
pub(super) fn card(opts: MlxOptions) -> FormatCard {
    let AffineSpec { bits, group_size } = opts.spec;
    let int8 = match opts.int8 {
        Int8Mode::Exact => "int8 layers repacked exactly as 8-bit affine",
        Int8Mode::Requant => "int8 layers requantized",
    };
    // Under a size budget every quantized tensor, int8 tables and routers included, takes the
    // encoding the budget chose; its own note says how the tables were kept.
    let (tag, setting) = if opts.fitted {
        (
            "mixed-bit".to_string(),
            "at the width and group size the size budget chose per tensor (int8 tables and routers included)"
                .to_string(),
        )
    } else {
        (format!("{bits}-bit"), format!("at {bits} bits, group size {group_size} (routers at 8 bits); {int8}"))
    };
    FormatCard {
        library: "mlx",
        tags: vec!["mlx".into(), tag],
        description: format!("MLX layout, affine-quantized {setting}"),
        how_to_load: "mlx-lm:\n\n```python\nfrom mlx_lm import load, generate\n\
                      model, tokenizer = load(\"path/to/model\")\n\
                      print(generate(model, tokenizer, prompt=\"Hello\"))\n```\n"
            .into(),
    }
}
