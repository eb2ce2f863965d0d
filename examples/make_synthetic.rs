//! Writes a large synthetic Escha-W2 checkpoint with random codes, for conversion benchmarks:
//! dense-27B-shaped layers (MLP gate K=2, up and down K=3, 5120×17408) until the codes reach the
//! requested size.
//!
//!     cargo run --release --example make_synthetic -- OUT_DIR [GB_OF_CODES] [--whole]
//!         [--layers N] [--vocab N]
//!
//! Every layer is a whole full-attention block (q/k/v/o projections at K=3 and the four norms),
//! with the int8 embeddings and head (a 4096-token vocabulary, or `--vocab N`) and the final norm:
//! a model whose config.json describes its tensors, which every format requires. `--whole` is
//! accepted for the scripts that pass it (it once added the attention to MLP-only layers).
//! `--layers N` writes exactly N layers, whatever `GB_OF_CODES` says.

use half::f16;
use serde_json::json;
use std::io::Write;

const HIDDEN: usize = 5120;
const INTERMEDIATE: usize = 17408;
const HEADS: usize = 24;
const KV_HEADS: usize = 4;
const HEAD_DIM: usize = 256;
/// The vocabulary: enough for a real embedding and head, small beside the layers.
const VOCAB: usize = 4096;

struct Tensor {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    len: usize,
}

fn main() -> std::io::Result<()> {
    const USAGE: &str = "usage: make_synthetic OUT_DIR [GB_OF_CODES] [--whole] [--layers N] [--vocab N]";
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.retain(|a| a != "--whole");
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

    let mut tensors = Vec::new();
    let mut code_bytes = 0usize;
    let mut layer = 0;
    let f16_vector = |name: String, n: usize| Tensor { name, dtype: "F16", shape: vec![n], len: 2 * n };
    let attention: &[(&str, usize, usize, usize)] = &[
        ("self_attn.q_proj", HIDDEN, 2 * HEADS * HEAD_DIM, 3),
        ("self_attn.k_proj", HIDDEN, KV_HEADS * HEAD_DIM, 3),
        ("self_attn.v_proj", HIDDEN, KV_HEADS * HEAD_DIM, 3),
        ("self_attn.o_proj", HEADS * HEAD_DIM, HIDDEN, 3),
    ];
    let mlp = [
        ("mlp.gate_proj", HIDDEN, INTERMEDIATE, 2),
        ("mlp.up_proj", HIDDEN, INTERMEDIATE, 3),
        ("mlp.down_proj", INTERMEDIATE, HIDDEN, 3),
    ];
    while layers.map_or((code_bytes as f64) < gb * 1e9, |n| layer < n) {
        let block = format!("model.language_model.layers.{layer}");
        tensors.push(f16_vector(format!("{block}.input_layernorm.weight"), HIDDEN));
        tensors.push(f16_vector(format!("{block}.post_attention_layernorm.weight"), HIDDEN));
        tensors.push(f16_vector(format!("{block}.self_attn.q_norm.weight"), HEAD_DIM));
        tensors.push(f16_vector(format!("{block}.self_attn.k_norm.weight"), HEAD_DIM));
        for &(proj, ic, oc, k) in attention.iter().chain(&mlp) {
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
        layer += 1;
    }
    tensors.push(f16_vector("model.language_model.norm.weight".into(), HIDDEN));
    for p in ["model.language_model.embed_tokens", "lm_head"] {
        let len = vocab * HIDDEN;
        tensors.push(Tensor { name: format!("{p}.weight_int8"), dtype: "I8", shape: vec![vocab, HIDDEN], len });
        tensors.push(f16_vector(format!("{p}.weight_scale"), vocab));
    }

    // One shard per layer keeps files at a realistic size.
    let mut rng = 0x1234_5678_9ABC_DEF0u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let per_layer = 4 + 3 * (attention.len() + mlp.len());
    for (l, chunk) in tensors.chunks(per_layer).enumerate() {
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
            if t.dtype == "F16" {
                // Scales of a plausible size: rin ~ 0.01, rout and norms ~ 1, random signs; int8 row
                // scales ~ 0.01, positive.
                let (base, signed) = if t.name.ends_with("rin") {
                    (0.01, true)
                } else if t.name.ends_with("weight_scale") {
                    (0.01, false)
                } else {
                    (1.0, true)
                };
                for _ in 0..t.len / 2 {
                    let r = next();
                    let sign = if signed && r & 1 == 1 { -1.0 } else { 1.0 };
                    let v = base * (0.5 + (r >> 40) as f32 / (1u64 << 24) as f32) * sign;
                    f.write_all(&f16::from_f32(v).to_le_bytes())?;
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
            "model_type": "qwen3_5_text", "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
            "num_hidden_layers": layer, "layer_types": vec!["full_attention"; layer],
            "full_attention_interval": 1, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
            "linear_num_key_heads": 16, "linear_key_head_dim": 128, "linear_num_value_heads": 48,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "vocab_size": vocab,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 262144,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                "mrope_section": [11, 11, 10]},
        },
    });
    std::fs::write(out.join("config.json"), config.to_string())?;
    eprintln!("{} layers, {:.2} GB of codes in {}", layer, code_bytes as f64 / 1e9, out.display());
    Ok(())
}
