//! Writes a large synthetic Escha-W2 checkpoint with random codes, for conversion benchmarks:
//! dense-27B-shaped layers (MLP gate K=2, up and down K=3, 5120×17408) until the codes reach the
//! requested size.
//!
//!     cargo run --release --example make_synthetic -- OUT_DIR [GB_OF_CODES] [--whole]
//!         [--layers N] [--vocab N] [--hybrid] [--mini]
//!
//! Every layer is a whole full-attention block (q/k/v/o projections at K=3 and the four norms),
//! with the int8 embeddings and head (a 4096-token vocabulary, or `--vocab N`) and the final norm:
//! a model whose config.json describes its tensors, which every format requires. `--whole` is
//! accepted for the scripts that pass it (it once added the attention to MLP-only layers).
//! `--layers N` writes exactly N layers, whatever `GB_OF_CODES` says. `--hybrid` lays the layers
//! out as the 27B does: three linear-attention (Gated `DeltaNet`) blocks in four, their `in_proj_qkv`,
//! `in_proj_z` and `out_proj` coded at K=2 beside the plain `in_proj_a`/`in_proj_b`, `conv1d`,
//! `A_log`, `dt_bias` and gated norm (llama.cpp's hybrid memory needs at least one such layer).
//! `--mini` makes the same model 256 wide (`MINI`): `fixtures/wide` is
//! `make_synthetic fixtures/wide --mini --hybrid --layers 4 --vocab 256` with `dense/`'s tokenizer
//! files (fixtures/README.md).

use half::f16;
use serde_json::json;
use std::io::Write;

/// The model's widths: the 27B's, or a miniature 256 wide.
#[derive(Clone, Copy)]
struct Shape {
    hidden: usize,
    intermediate: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// The linear-attention (Gated `DeltaNet`) heads and their width.
    lin_k_heads: usize,
    lin_v_heads: usize,
    lin_dim: usize,
}

const FULL: Shape = Shape {
    hidden: 5120,
    intermediate: 17408,
    heads: 24,
    kv_heads: 4,
    head_dim: 256,
    lin_k_heads: 16,
    lin_v_heads: 48,
    lin_dim: 128,
};
/// Every linear's rows 256 wide (or a multiple), so that every one takes ggml's 256-value types.
const MINI: Shape = Shape {
    hidden: 256,
    intermediate: 512,
    heads: 1,
    kv_heads: 1,
    head_dim: 256,
    lin_k_heads: 1,
    lin_v_heads: 2,
    lin_dim: 128,
};
const CONV_KERNEL: usize = 4;
/// The vocabulary: enough for a real embedding and head, small beside the layers.
const VOCAB: usize = 4096;

struct Tensor {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    len: usize,
}

fn main() -> std::io::Result<()> {
    const USAGE: &str =
        "usage: make_synthetic OUT_DIR [GB_OF_CODES] [--whole] [--layers N] [--vocab N] [--hybrid] [--mini]";
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.retain(|a| a != "--whole");
    let hybrid = args.iter().any(|a| a == "--hybrid");
    args.retain(|a| a != "--hybrid");
    let shape = if args.iter().any(|a| a == "--mini") { MINI } else { FULL };
    args.retain(|a| a != "--mini");
    let Shape { hidden, intermediate, heads, kv_heads, head_dim, lin_k_heads, lin_v_heads, lin_dim } = shape;
    let mut number = |flag: &str| -> Option<usize> {
        let i = args.iter().position(|a| a == flag)?;
        let value = args.get(i + 1).and_then(|v| v.parse().ok());
        let Some(value) = value else {
            eprintln!("{flag} needs a number\n{USAGE}");
            std::process::exit(2);
        };
        args.drain(i..i + 2);
        Some(value)
    };
    let layers = number("--layers");
    let vocab = number("--vocab").unwrap_or(VOCAB);
    if args.is_empty() || args.len() > 2 || args.iter().any(|a| a.starts_with('-')) {
        eprintln!("{USAGE}");
        std::process::exit(2);
    }
    let out = std::path::PathBuf::from(&args[0]);
    let gb: f64 = match args.get(1).map(|s| s.parse()) {
        None => 2.0,
        Some(Ok(gb)) => gb,
        Some(Err(_)) => {
            eprintln!("GB_OF_CODES must be a number\n{USAGE}");
            std::process::exit(2);
        }
    };
    std::fs::create_dir_all(&out)?;

    // One shard per layer keeps files at a realistic size; the final norm, embedding and head
    // make one more.
    let mut shards: Vec<Vec<Tensor>> = Vec::new();
    let mut code_bytes = 0usize;
    let mut layer = 0;
    let mut layer_types = Vec::new();
    let f16_vector = |name: String, n: usize| Tensor { name, dtype: "F16", shape: vec![n], len: 2 * n };
    let conv_dim = 2 * lin_k_heads * lin_dim + lin_v_heads * lin_dim;
    let linear_attention: &[(&str, usize, usize, usize)] = &[
        ("linear_attn.in_proj_qkv", hidden, conv_dim, 2),
        ("linear_attn.in_proj_z", hidden, lin_v_heads * lin_dim, 2),
        ("linear_attn.out_proj", lin_v_heads * lin_dim, hidden, 2),
    ];
    let attention: &[(&str, usize, usize, usize)] = &[
        ("self_attn.q_proj", hidden, 2 * heads * head_dim, 3),
        ("self_attn.k_proj", hidden, kv_heads * head_dim, 3),
        ("self_attn.v_proj", hidden, kv_heads * head_dim, 3),
        ("self_attn.o_proj", heads * head_dim, hidden, 3),
    ];
    let mlp = [
        ("mlp.gate_proj", hidden, intermediate, 2),
        ("mlp.up_proj", hidden, intermediate, 3),
        ("mlp.down_proj", intermediate, hidden, 3),
    ];
    while layers.map_or((code_bytes as f64) < gb * 1e9, |n| layer < n) {
        let block = format!("model.language_model.layers.{layer}");
        let mut tensors = Vec::new();
        tensors.push(f16_vector(format!("{block}.input_layernorm.weight"), hidden));
        tensors.push(f16_vector(format!("{block}.post_attention_layernorm.weight"), hidden));
        let linear = hybrid && !(layer + 1).is_multiple_of(4);
        let coded = if linear {
            let a = format!("{block}.linear_attn");
            for ab in ["a", "b"] {
                let shape = vec![lin_v_heads, hidden];
                tensors.push(Tensor {
                    name: format!("{a}.in_proj_{ab}.weight"),
                    dtype: "F16",
                    shape,
                    len: 2 * lin_v_heads * hidden,
                });
            }
            let shape = vec![conv_dim, 1, CONV_KERNEL];
            tensors.push(Tensor {
                name: format!("{a}.conv1d.weight"),
                dtype: "F16",
                shape,
                len: 2 * conv_dim * CONV_KERNEL,
            });
            tensors.push(Tensor {
                name: format!("{a}.A_log"),
                dtype: "F32",
                shape: vec![lin_v_heads],
                len: 4 * lin_v_heads,
            });
            tensors.push(f16_vector(format!("{a}.dt_bias"), lin_v_heads));
            tensors.push(f16_vector(format!("{a}.norm.weight"), lin_dim));
            linear_attention
        } else {
            tensors.push(f16_vector(format!("{block}.self_attn.q_norm.weight"), head_dim));
            tensors.push(f16_vector(format!("{block}.self_attn.k_norm.weight"), head_dim));
            attention
        };
        layer_types.push(if linear { "linear_attention" } else { "full_attention" });
        for &(proj, ic, oc, k) in coded.iter().chain(&mlp) {
            let p = format!("{block}.{proj}");
            let code_len = ic * oc * k / 8;
            code_bytes += code_len;
            tensors.push(Tensor {
                name: format!("{p}.escha_code"),
                dtype: "I16",
                shape: vec![ic / 16, oc / 16, 16 * k],
                len: code_len,
            });
            tensors.push(Tensor { name: format!("{p}.escha_rin"), dtype: "F16", shape: vec![ic], len: 2 * ic });
            tensors.push(Tensor { name: format!("{p}.escha_rout"), dtype: "F16", shape: vec![oc], len: 2 * oc });
        }
        shards.push(tensors);
        layer += 1;
    }
    let mut tail = vec![f16_vector("model.language_model.norm.weight".into(), hidden)];
    for p in ["model.language_model.embed_tokens", "lm_head"] {
        let len = vocab * hidden;
        tail.push(Tensor { name: format!("{p}.weight_int8"), dtype: "I8", shape: vec![vocab, hidden], len });
        tail.push(f16_vector(format!("{p}.weight_scale"), vocab));
    }
    shards.push(tail);

    let mut rng = 0x1234_5678_9ABC_DEF0u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    for (l, chunk) in shards.iter().enumerate() {
        let mut header = serde_json::Map::new();
        let mut offset = 0;
        for t in chunk {
            header.insert(
                t.name.clone(),
                json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + t.len]}),
            );
            offset += t.len;
        }
        let mut text = serde_json::to_string(&header)?;
        while text.len() % 8 != 0 {
            text.push(' ');
        }
        let path = out.join(format!("layer-{l:03}.safetensors"));
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
        f.write_all(&(text.len() as u64).to_le_bytes())?;
        f.write_all(text.as_bytes())?;
        for t in chunk {
            if t.dtype == "F16" || t.dtype == "F32" {
                // Values of a plausible size: rin and the linear-attention projections ~ 0.01, rout,
                // norms and A_log ~ 1, random signs; int8 row scales ~ 0.01, positive.
                let small = ["rin", "in_proj_a.weight", "in_proj_b.weight", "conv1d.weight"];
                let (base, signed) = if small.iter().any(|s| t.name.ends_with(s)) {
                    (0.01, true)
                } else if t.name.ends_with("weight_scale") || t.name.ends_with("A_log") {
                    (0.01 + 0.99 * f32::from(t.name.ends_with("A_log")), false)
                } else {
                    (1.0, true)
                };
                let width = if t.dtype == "F16" { 2 } else { 4 };
                for _ in 0..t.len / width {
                    let r = next();
                    let sign = if signed && r & 1 == 1 { -1.0 } else { 1.0 };
                    let v = base * (0.5 + (r >> 40) as f32 / (1u64 << 24) as f32) * sign;
                    if width == 2 {
                        f.write_all(&f16::from_f32(v).to_le_bytes())?;
                    } else {
                        f.write_all(&v.to_le_bytes())?;
                    }
                }
            } else {
                let mut buf = vec![0u8; 1 << 20];
                let mut left = t.len;
                while left > 0 {
                    let n = left.min(buf.len());
                    for c in buf[..n].chunks_mut(8) {
                        let r = next().to_le_bytes();
                        c.copy_from_slice(&r[..c.len()]);
                    }
                    f.write_all(&buf[..n])?;
                    left -= n;
                }
            }
        }
    }
    // The 27B's text config with as many layers as were written, so that every format, GGUF
    // included, has the model keys it needs.
    let config = json!({
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "quantization_config": {"quant_method": "escha"},
        "tie_word_embeddings": false,
        "text_config": {
            "model_type": "qwen3_5_text", "hidden_size": hidden, "intermediate_size": intermediate,
            "num_hidden_layers": layer, "layer_types": layer_types,
            "full_attention_interval": if hybrid { 4 } else { 1 }, "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
            "linear_num_key_heads": lin_k_heads, "linear_key_head_dim": lin_dim,
            "linear_num_value_heads": lin_v_heads, "linear_value_head_dim": lin_dim,
            "linear_conv_kernel_dim": CONV_KERNEL, "vocab_size": vocab,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                "mrope_section": [11, 11, 10]},
        },
    });
    std::fs::write(out.join("config.json"), config.to_string())?;
    eprintln!("{} layers, {:.2} GB of codes in {}", layer, code_bytes as f64 / 1e9, out.display());
    Ok(())
}
