//! Writes the small, seeded test checkpoints under `fixtures/` (see `fixtures/README.md`):
//!
//! * `dense/`, `moe/`: tiny Escha-W2 checkpoints shaped like the two public releases;
//! * `dense-base/`, `moe-base/`: the bf16 weights they were encoded from, in Hugging Face layout;
//! * `dense-base-fp8/`, `moe-base-fp8/`: the same, with the big linears as block-scaled fp8 e4m3.
//!
//! Run: `cargo run --release --example make_fixtures -- fixtures`
//!
//! Everything derives from one master seed (`SplitMix64`, Box-Muller), each tensor from a seed of
//! its own name, so the output is byte-identical from run to run. Only the fixture directories
//! listed above are replaced; other files in the output directory (the README) are left alone.

mod configs;
mod files;
mod linears;
mod values;

use anyhow::{bail, ensure, Context, Result};
use configs::{fp8_quant_config, layer_meta_entry, model_config, write_side_files};
use files::{leaf_grouped, natural_sorted, write_json, write_safetensors, write_sharded, Tensor};
use linears::{
    attention_linears, base_plain, escha_dense_linear, escha_experts, int8_pair, linear, plain_layer_tensors,
    plain_tensor, rel_err, Linear,
};
use serde_json::{json, Map};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;
use values::{base_linear, check_fp8, dual_normal, f8e4m3_decode, fp8_blocks, Rng};

// Shared dimensions of both tiny models.
const HIDDEN: usize = 128;
const INTERMEDIATE: usize = 256;
const LAYERS: usize = 4;
const HEADS: usize = 1;
const KV_HEADS: usize = 1;
const HEAD_DIM: usize = 128;
const LIN_K_HEADS: usize = 2;
const LIN_K_DIM: usize = 64;
const LIN_V_HEADS: usize = 4;
const LIN_V_DIM: usize = 64;
const CONV_KERNEL: usize = 4;
const VOCAB: usize = 256;
// MoE only.
const EXPERTS: usize = 4;
const EXPERTS_PER_TOK: usize = 2;
const MOE_INTERMEDIATE: usize = 128;
const SHARED_INTERMEDIATE: usize = 128;

const LM: &str = "model.language_model";

/// The final norm and the int8 embedding and head (bf16 in the base), shared by both models.
fn top_level_tensors(escha: &mut Vec<Tensor>, base: &mut Base) {
    let n = format!("{LM}.norm.weight");
    let vals = dual_normal(&n, HIDDEN, 0.0, 0.05);
    escha.push(Tensor::f16(&n, &[HIDDEN], &vals));
    base.tensors.push(Tensor::bf16(&n, &[HIDDEN], &vals));
    let (embed, head) = embed_and_head();
    escha.extend(int8_pair(&format!("{LM}.embed_tokens"), &embed, VOCAB, HIDDEN));
    escha.extend(int8_pair("lm_head", &head, VOCAB, HIDDEN));
    base.tensors.push(Tensor::bf16(&format!("{LM}.embed_tokens.weight"), &[VOCAB, HIDDEN], &embed));
    base.tensors.push(Tensor::bf16("lm_head.weight", &[VOCAB, HIDDEN], &head));
}

/// A one-layer MTP head (`mtp.*`, plain F16, zero-centred norms), also added to the base in bf16.
/// The `MoE` head has its router and shared expert but no routed experts, like the 35B's.
fn mtp_head(moe: bool, base: &mut Base) -> Vec<Tensor> {
    let l = "mtp.layers.0";
    let mut specs: Vec<(String, Vec<usize>, f64)> = vec![
        ("mtp.fc.weight".into(), vec![HIDDEN, 2 * HIDDEN], 0.03),
        (format!("{l}.self_attn.q_proj.weight"), vec![2 * HEADS * HEAD_DIM, HIDDEN], 0.04),
        (format!("{l}.self_attn.k_proj.weight"), vec![KV_HEADS * HEAD_DIM, HIDDEN], 0.04),
        (format!("{l}.self_attn.v_proj.weight"), vec![KV_HEADS * HEAD_DIM, HIDDEN], 0.03),
        (format!("{l}.self_attn.o_proj.weight"), vec![HIDDEN, HEADS * HEAD_DIM], 0.03),
    ];
    let mlp: &[(&str, usize, usize)] = if moe {
        &[
            ("mlp.gate", EXPERTS, HIDDEN),
            ("mlp.shared_expert.gate_proj", SHARED_INTERMEDIATE, HIDDEN),
            ("mlp.shared_expert.up_proj", SHARED_INTERMEDIATE, HIDDEN),
            ("mlp.shared_expert.down_proj", HIDDEN, SHARED_INTERMEDIATE),
            ("mlp.shared_expert_gate", 1, HIDDEN),
        ]
    } else {
        &[
            ("mlp.gate_proj", INTERMEDIATE, HIDDEN),
            ("mlp.up_proj", INTERMEDIATE, HIDDEN),
            ("mlp.down_proj", HIDDEN, INTERMEDIATE),
        ]
    };
    specs.extend(mlp.iter().map(|&(n, out, inp)| (format!("{l}.{n}.weight"), vec![out, inp], 0.03)));
    for (n, len) in [
        ("mtp.pre_fc_norm_embedding.weight".to_string(), HIDDEN),
        ("mtp.pre_fc_norm_hidden.weight".into(), HIDDEN),
        ("mtp.norm.weight".into(), HIDDEN),
        (format!("{l}.input_layernorm.weight"), HIDDEN),
        (format!("{l}.post_attention_layernorm.weight"), HIDDEN),
        (format!("{l}.self_attn.q_norm.weight"), HEAD_DIM),
        (format!("{l}.self_attn.k_norm.weight"), HEAD_DIM),
    ] {
        specs.push((n, vec![len], 0.05));
    }
    specs
        .into_iter()
        .map(|(n, shape, std)| {
            let vals = dual_normal(&n, shape.iter().product(), 0.0, std);
            base.tensors.push(Tensor::bf16(&n, &shape, &vals));
            Tensor::f16(&n, &shape, &vals)
        })
        .collect()
}

/// Everything about one model needed by the writers: the bf16 base in HF layout, and which of
/// its tensors are linears eligible for fp8.
struct Base {
    tensors: Vec<Tensor>,
    /// (name, values, stack, rows, cols) of the weights stored as fp8 in the fp8 copy.
    fp8: Vec<(String, Vec<f32>, usize, usize, usize)>,
}

impl Base {
    fn linear(&mut self, name: String, w: &[f32], stack: usize, rows: usize, cols: usize) {
        let shape = if stack == 1 { vec![rows, cols] } else { vec![stack, rows, cols] };
        self.tensors.push(Tensor::bf16(&name, &shape, w));
        if rows >= 128 && cols >= 128 {
            self.fp8.push((name, w.to_vec(), stack, rows, cols));
        }
    }

    fn write(&self, dir: &Path, fp8_dir: &Path, moe: bool) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        write_json(&dir.join("config.json"), &model_config(moe, None))?;
        write_safetensors(&dir.join("model.safetensors"), &natural_sorted(self.tensors.clone()))?;

        std::fs::create_dir_all(fp8_dir)?;
        write_json(&fp8_dir.join("config.json"), &model_config(moe, Some(fp8_quant_config())))?;
        let mut out = Vec::new();
        let mut worst = 0f64;
        for t in &self.tensors {
            if let Some((_, w, stack, rows, cols)) = self.fp8.iter().find(|f| f.0 == t.name) {
                let (codes, scales) = fp8_blocks(w, *stack, *rows, *cols);
                let (br, bc) = (rows.div_ceil(128), cols.div_ceil(128));
                let sshape = if *stack == 1 { vec![br, bc] } else { vec![*stack, br, bc] };
                // Decode check: w ≈ fp8 · scale_inv.
                let mut dec = Vec::with_capacity(w.len());
                for (idx, &c) in codes.iter().enumerate() {
                    let (s, r, col) = (idx / (rows * cols), (idx / cols) % rows, idx % cols);
                    dec.push(f8e4m3_decode(c) * scales[(s * br + r / 128) * bc + col / 128]);
                }
                worst = worst.max(rel_err(&dec, w));
                out.push(Tensor::new(&t.name, "F8_E4M3", &t.shape, codes));
                out.push(Tensor::f32(&format!("{}_scale_inv", t.name), &sshape, &scales));
            } else {
                out.push(t.clone());
            }
        }
        ensure!(worst < 0.05, "fp8 copy: relative error {worst}");
        write_safetensors(&fp8_dir.join("model.safetensors"), &natural_sorted(out))?;
        println!("  {}: fp8 worst relative error {worst:.4}", fp8_dir.display());
        Ok(())
    }
}

fn embed_and_head() -> (Vec<f32>, Vec<f32>) {
    (
        base_linear(&format!("{LM}.embed_tokens.weight"), VOCAB, HIDDEN, 0.05),
        base_linear("lm_head.weight", VOCAB, HIDDEN, 0.03),
    )
}

fn make_dense(root: &Path) -> Result<()> {
    let dir = root.join("dense");
    std::fs::create_dir_all(dir.join("mtp"))?;
    let mut base = Base { tensors: Vec::new(), fp8: Vec::new() };
    let mut escha: Vec<Tensor> = Vec::new();
    let mut layer_meta = Map::new();
    let mut errs: BTreeMap<u32, Vec<f64>> = BTreeMap::new();

    for i in 0..LAYERS {
        let mut lins: Vec<(Linear, u32)> = attention_linears(i).into_iter().map(|l| (l, 2)).collect();
        let p = format!("{LM}.layers.{i}.mlp");
        lins.push((linear(format!("{p}.gate_proj"), INTERMEDIATE, HIDDEN, 0.03), 2));
        lins.push((linear(format!("{p}.up_proj"), INTERMEDIATE, HIDDEN, 0.03), 3));
        lins.push((linear(format!("{p}.down_proj"), HIDDEN, INTERMEDIATE, 0.02), 3));
        for (l, k) in &lins {
            let (t, err) = escha_dense_linear(l, *k)?;
            errs.entry(*k).or_default().push(err);
            escha.extend(t);
            layer_meta.insert(l.path.clone(), layer_meta_entry(*k, 2.0, l.inp, l.out));
            base.linear(format!("{}.weight", l.path), &l.w, 1, l.out, l.inp);
        }
        for (n, vals, shape, dt) in plain_layer_tensors(i, false) {
            escha.push(plain_tensor(&n, &vals, &shape, dt));
            base.tensors.push(base_plain(&n, &vals, &shape, dt));
        }
    }
    top_level_tensors(&mut escha, &mut base);

    // Shard 2: the codes of layers >= 2 and of every mlp.up_proj (whose vectors stay in shard 1,
    // so that module straddles the shards), and the lm_head pair.
    let in_shard2 = |name: &str| {
        if name.starts_with("lm_head.") {
            return true;
        }
        if !name.ends_with(".escha_code") {
            return false;
        }
        let layer: usize = name.split('.').nth(3).and_then(|s| s.parse().ok()).unwrap_or(0);
        layer >= 2 || name.contains(".mlp.up_proj.")
    };
    let (s2, s1): (Vec<Tensor>, Vec<Tensor>) = escha.into_iter().partition(|t| in_shard2(&t.name));
    write_sharded(&dir, &[leaf_grouped(s1), leaf_grouped(s2)])?;

    let quant = json!({
        "quant_method": "escha",
        "format_version": "2.0",
        "bits": 2.0,
        "int8_embedding": true,
        "ignore": ["model.visual", "model.language_model.embed_tokens", "lm_head",
                   "linear_attn.in_proj_a", "linear_attn.in_proj_b"],
        "layer_meta": layer_meta
    });
    let config = model_config(false, Some(quant));
    write_json(&dir.join("config.json"), &config)?;
    write_side_files(&dir, "escha")?;

    // The MTP head, as the 27B ships it: its own directory, one complete decoder layer, plain F16.
    write_json(&dir.join("mtp/config.json"), &config)?;
    let mtp = mtp_head(false, &mut base);
    write_safetensors(&dir.join("mtp/model.safetensors"), &natural_sorted(mtp))?;

    for (k, e) in &errs {
        let mean = e.iter().sum::<f64>() / e.len() as f64;
        let max = e.iter().copied().fold(0.0, f64::max);
        println!(
            "  dense K={k}: {} coded linears, relative error mean {mean:.4} max {max:.4} (2^-K = {:.4})",
            e.len(),
            0.5f64.powi(*k as i32)
        );
        ensure!(max < 1.6 * 0.5f64.powi(*k as i32), "dense K={k}: decode error {max} too large");
    }
    base.write(&root.join("dense-base"), &root.join("dense-base-fp8"), false)
}

fn make_moe(root: &Path) -> Result<()> {
    let dir = root.join("moe");
    std::fs::create_dir_all(&dir)?;
    let mut base = Base { tensors: Vec::new(), fp8: Vec::new() };
    let mut escha: Vec<Tensor> = Vec::new();
    let mut layer_meta = Map::new();
    let mut worst: BTreeMap<u32, f64> = BTreeMap::new();
    let (i2, h) = (2 * MOE_INTERMEDIATE, HIDDEN);

    for i in 0..LAYERS {
        let p = format!("{LM}.layers.{i}.mlp");
        // int8: attention / GDN projections and the shared expert.
        let mut int8_lins = attention_linears(i);
        int8_lins.push(linear(format!("{p}.shared_expert.gate_proj"), SHARED_INTERMEDIATE, HIDDEN, 0.03));
        int8_lins.push(linear(format!("{p}.shared_expert.up_proj"), SHARED_INTERMEDIATE, HIDDEN, 0.03));
        int8_lins.push(linear(format!("{p}.shared_expert.down_proj"), HIDDEN, SHARED_INTERMEDIATE, 0.02));
        for l in &int8_lins {
            escha.extend(int8_pair(&l.path, &l.w, l.out, l.inp));
            base.linear(format!("{}.weight", l.path), &l.w, 1, l.out, l.inp);
        }

        // Routed experts: gate ‖ up fused, with dead intermediate channels zero in both halves.
        let mut gate_up = Vec::new();
        let mut down = Vec::new();
        let mut dead_sets = Vec::new();
        for e in 0..EXPERTS {
            let mut w = linear(format!("{p}.experts.{e}.gate_proj"), MOE_INTERMEDIATE, h, 0.03).w;
            w.extend(linear(format!("{p}.experts.{e}.up_proj"), MOE_INTERMEDIATE, h, 0.03).w);
            let mut r = Rng::for_name(&format!("{p}.experts.{e}.dead"));
            let count = MOE_INTERMEDIATE / 4 + r.below(MOE_INTERMEDIATE / 4 + 1);
            let mut order: Vec<usize> = (0..MOE_INTERMEDIATE).collect();
            for j in 0..count {
                let pick = j + r.below(MOE_INTERMEDIATE - j);
                order.swap(j, pick);
            }
            let mut dead = order[..count].to_vec();
            dead.sort_unstable();
            for &c in &dead {
                w[c * h..(c + 1) * h].fill(0.0);
                w[(MOE_INTERMEDIATE + c) * h..(MOE_INTERMEDIATE + c + 1) * h].fill(0.0);
            }
            gate_up.push(w);
            down.push(linear(format!("{p}.experts.{e}.down_proj"), h, MOE_INTERMEDIATE, 0.02).w);
            dead_sets.push(dead);
        }
        let gu_path = format!("{p}.experts.gate_up_proj");
        let (t, err, zeros) = escha_experts(&gu_path, &gate_up, i2, h, 2)?;
        for (e, dead) in dead_sets.iter().enumerate() {
            let want: Vec<usize> = dead.iter().copied().chain(dead.iter().map(|c| c + MOE_INTERMEDIATE)).collect();
            let mut want = want;
            want.sort_unstable();
            ensure!(
                zeros[e] == want,
                "{gu_path}[{e}]: rout zeros {:?} differ from the dead channels {:?}",
                zeros[e],
                want
            );
        }
        escha.extend(t);
        let w = worst.entry(2).or_default();
        *w = w.max(err);
        let dn_path = format!("{p}.experts.down_proj");
        let (t, err, zeros) = escha_experts(&dn_path, &down, h, MOE_INTERMEDIATE, 3)?;
        ensure!(zeros.iter().all(Vec::is_empty), "{dn_path}: unexpected zeros in rout");
        escha.extend(t);
        let w = worst.entry(3).or_default();
        *w = w.max(err);
        layer_meta.insert(gu_path.clone(), layer_meta_entry(2, 2.0, h, i2));
        layer_meta.insert(dn_path.clone(), layer_meta_entry(3, 3.0, MOE_INTERMEDIATE, h));
        println!("  moe layer {i}: dead channels per expert {:?}", dead_sets.iter().map(Vec::len).collect::<Vec<_>>());
        base.linear(gu_path, &gate_up.concat(), EXPERTS, i2, h);
        base.linear(dn_path, &down.concat(), EXPERTS, h, MOE_INTERMEDIATE);

        for (n, vals, shape, dt) in plain_layer_tensors(i, true) {
            escha.push(plain_tensor(&n, &vals, &shape, dt));
            base.tensors.push(base_plain(&n, &vals, &shape, dt));
        }
    }
    top_level_tensors(&mut escha, &mut base);
    // The MTP head inline, as the 35B ships it: router and shared expert, no routed experts.
    escha.extend(mtp_head(true, &mut base));

    write_sharded(&dir, &[leaf_grouped(escha)])?;
    let quant = json!({
        "quant_method": "eschamoe",
        "format_version": "2.0",
        "bits": 2.0,
        "int8_embedding": true,
        "ignore": ["model.visual", "model.language_model.embed_tokens", "lm_head",
                   "self_attn", "linear_attn", "mlp.shared_expert", "mlp.gate",
                   "mlp.shared_expert_gate", "norm"],
        "layer_meta": layer_meta
    });
    write_json(&dir.join("config.json"), &model_config(true, Some(quant)))?;
    write_side_files(&dir, "eschamoe")?;
    for (k, w) in &worst {
        println!("  moe K={k}: worst expert relative error {w:.4} (2^-K = {:.4})", 0.5f64.powi(*k as i32));
        ensure!(*w < 1.6 * 0.5f64.powi(*k as i32), "moe K={k}: decode error {w} too large");
    }
    base.write(&root.join("moe-base"), &root.join("moe-base-fp8"), true)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 1 || args[0].starts_with('-') {
        bail!("usage: cargo run --release --example make_fixtures -- <fixtures-dir>");
    }
    check_fp8()?;
    let root = Path::new(&args[0]);
    std::fs::create_dir_all(root)?;
    for d in ["dense", "dense-base", "dense-base-fp8", "moe", "moe-base", "moe-base-fp8"] {
        let p = root.join(d);
        if p.exists() {
            std::fs::remove_dir_all(&p).with_context(|| format!("removing {}", p.display()))?;
        }
    }
    let t0 = Instant::now();
    println!("dense:");
    make_dense(root)?;
    println!("moe:");
    make_moe(root)?;
    println!("done in {:.1} s", t0.elapsed().as_secs_f64());
    Ok(())
}
