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

use anyhow::{bail, ensure, Context, Result};
use escha_convert::codec::{best_decoder, Codebook};
use escha_convert::encode::encode_linear;
use escha_convert::layout::natural_key;
use escha_convert::rng::SplitMix64;
use escha_convert::transform::{fold_scales, CodedLinear};
use half::{bf16, f16};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

const MASTER_SEED: u64 = 0xE5C4_A0F1_7E5C_2026;

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

// ------------------------------------------------------------------------------------------------
// Randomness

/// The crate's `SplitMix64`, seeded per tensor name.
struct Rng(SplitMix64);

impl Rng {
    fn for_name(name: &str) -> Self {
        // FNV-1a of the name, mixed with the master seed.
        let mut h: u64 = 0xCBF2_9CE4_8422_2325;
        for b in name.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01B3);
        }
        let mut r = Rng(SplitMix64(h ^ MASTER_SEED));
        r.next_u64();
        r
    }

    fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1).
    fn uniform(&mut self) -> f64 {
        self.0.uniform()
    }

    /// Standard normal (Box-Muller, cosine branch only).
    fn normal(&mut self) -> f64 {
        let u1 = ((self.next_u64() >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// A value exactly representable in both f16 and bf16 (so the F16 Escha copy and the bf16 base
/// agree bit for bit after the converter's cast); values too small for a normal f16 become 0.
fn dual_exact(x: f64) -> f32 {
    let v = bf16::from_f64(x).to_f32();
    if f16::from_f32(v).to_f32() == v {
        v
    } else {
        0.0
    }
}

/// `n` values `mean + std·N(0,1)`, each exact in f16 and bf16.
fn dual_normal(name: &str, n: usize, mean: f64, std: f64) -> Vec<f32> {
    let mut r = Rng::for_name(name);
    (0..n).map(|_| dual_exact(mean + std * r.normal())).collect()
}

/// A bf16 base weight `[out, in]`: Gaussian with per-row and per-column log-normal scales (like
/// real weights, so the channel scales of the encoding have something to fit).
fn base_linear(name: &str, out: usize, inp: usize, std: f64) -> Vec<f32> {
    let mut r = Rng::for_name(name);
    let rows: Vec<f64> = (0..out).map(|_| (0.25 * r.normal()).exp()).collect();
    let cols: Vec<f64> = (0..inp).map(|_| (0.15 * r.normal()).exp()).collect();
    let mut w = Vec::with_capacity(out * inp);
    for &rs in &rows {
        for &cs in &cols {
            w.push(bf16::from_f64(std * rs * cs * r.normal()).to_f32());
        }
    }
    w
}

fn uniform_vec(name: &str, n: usize, lo: f64, hi: f64) -> Vec<f32> {
    let mut r = Rng::for_name(name);
    (0..n).map(|_| (lo + (hi - lo) * r.uniform()) as f32).collect()
}

// ------------------------------------------------------------------------------------------------
// fp8 e4m3fn

/// `float8_e4m3fn` encode: round to nearest even, saturating to ±448 (the format has no infinity),
/// NaN to 0x7F. Exact in f32 arithmetic.
fn f8e4m3_encode(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs();
    if a >= 448.0 {
        return sign | 0x7E;
    }
    let min_normal = 2f32.powi(-6);
    if a < min_normal {
        // Subnormals step by 2^-9; q = 8 is the smallest normal, whose code is also 8.
        let q = (a * 512.0).round_ties_even() as u8;
        return sign | q;
    }
    let mut e = ((a.to_bits() >> 23) as i32) - 127; // a is a normal f32 here
    let mut q = ((a / 2f32.powi(e) - 1.0) * 8.0).round_ties_even() as i32;
    if q == 8 {
        q = 0;
        e += 1;
    }
    let code = (((e + 7) as u8) << 3) | q as u8;
    sign | code.min(0x7E)
}

fn f8e4m3_decode(c: u8) -> f32 {
    let sign = if c & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((c >> 3) & 0xF) as i32;
    let m = (c & 7) as f32;
    if c & 0x7F == 0x7F {
        return f32::NAN;
    }
    if e == 0 {
        sign * m * 2f32.powi(-9)
    } else {
        sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
    }
}

/// Checks the fp8 codec exhaustively; run at start-up and as a unit test.
fn check_fp8() -> Result<()> {
    for c in 0..=255u8 {
        let v = f8e4m3_decode(c);
        if c & 0x7F == 0x7F {
            ensure!(v.is_nan() && f8e4m3_encode(v) == 0x7F, "fp8 NaN code {c:#x}");
            continue;
        }
        ensure!(f8e4m3_encode(v) == c, "fp8 round trip of {c:#x} ({v})");
    }
    ensure!(f8e4m3_decode(0x7E) == 448.0 && f8e4m3_decode(0x38) == 1.0 && f8e4m3_decode(0x01) == 2f32.powi(-9));
    ensure!(f8e4m3_decode(0x08) == 2f32.powi(-6));
    for (x, want) in [(448.0f32, 0x7E), (449.0, 0x7E), (1e9, 0x7E), (-1e9, 0xFE), (f32::INFINITY, 0x7E), (-0.0, 0x80)] {
        ensure!(f8e4m3_encode(x) == want, "fp8 encode({x}) = {:#x}, want {want:#x}", f8e4m3_encode(x));
    }
    // Between neighbours: below, at and above the midpoint (ties go to the even code).
    for a in 0..0x7Eu8 {
        let (lo, hi) = (f8e4m3_decode(a), f8e4m3_decode(a + 1));
        let mid = f32::midpoint(lo, hi);
        let tie = if a % 2 == 0 { a } else { a + 1 };
        ensure!(f8e4m3_encode(mid) == tie, "fp8 tie between {a:#x} and {:#x}", a + 1);
        ensure!(f8e4m3_encode(f32::from_bits(mid.to_bits() - 1)) == a, "fp8 below midpoint of {a:#x}");
        ensure!(f8e4m3_encode(f32::from_bits(mid.to_bits() + 1)) == a + 1, "fp8 above midpoint of {a:#x}");
        ensure!(f8e4m3_encode(-mid) == 0x80 | tie, "fp8 negative tie at {a:#x}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn fp8_codec() {
        super::check_fp8().unwrap();
    }
}

/// Block-scaled fp8 of a stack of `[rows, cols]` matrices: codes, and `scale_inv`
/// `[ceil(rows/128), ceil(cols/128)]` per matrix with `w ≈ fp8 · scale_inv`.
fn fp8_blocks(w: &[f32], stack: usize, rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    const B: usize = 128;
    let (br, bc) = (rows.div_ceil(B), cols.div_ceil(B));
    let mut codes = vec![0u8; w.len()];
    let mut scales = Vec::with_capacity(stack * br * bc);
    for s in 0..stack {
        let m = &w[s * rows * cols..(s + 1) * rows * cols];
        for bi in 0..br {
            for bj in 0..bc {
                let (r0, r1, c0, c1) = (bi * B, ((bi + 1) * B).min(rows), bj * B, ((bj + 1) * B).min(cols));
                let mut amax = 0f32;
                for r in r0..r1 {
                    for c in c0..c1 {
                        amax = amax.max(m[r * cols + c].abs());
                    }
                }
                let scale = if amax > 0.0 { amax / 448.0 } else { 1.0 };
                scales.push(scale);
                for r in r0..r1 {
                    for c in c0..c1 {
                        codes[s * rows * cols + r * cols + c] = f8e4m3_encode(m[r * cols + c] / scale);
                    }
                }
            }
        }
    }
    (codes, scales)
}

// ------------------------------------------------------------------------------------------------
// Tensors and files

#[derive(Clone)]
struct Tensor {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl Tensor {
    fn new(name: &str, dtype: &'static str, shape: &[usize], data: Vec<u8>) -> Self {
        let width = match dtype {
            "F32" | "I32" => 4,
            "F16" | "BF16" | "I16" => 2,
            "I8" | "F8_E4M3" => 1,
            other => panic!("dtype {other}"),
        };
        assert_eq!(shape.iter().product::<usize>() * width, data.len(), "{name}: shape {shape:?} vs bytes");
        Tensor { name: name.to_string(), dtype, shape: shape.to_vec(), data }
    }
    fn bf16(name: &str, shape: &[usize], v: &[f32]) -> Self {
        Self::new(name, "BF16", shape, v.iter().flat_map(|&x| bf16::from_f32(x).to_le_bytes()).collect())
    }
    fn f16(name: &str, shape: &[usize], v: &[f32]) -> Self {
        Self::new(name, "F16", shape, v.iter().flat_map(|&x| f16::from_f32(x).to_le_bytes()).collect())
    }
    fn f16h(name: &str, shape: &[usize], v: &[f16]) -> Self {
        Self::new(name, "F16", shape, v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
    fn f32(name: &str, shape: &[usize], v: &[f32]) -> Self {
        Self::new(name, "F32", shape, v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
    fn i32(name: &str, shape: &[usize], v: &[i32]) -> Self {
        Self::new(name, "I32", shape, v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
    fn i8(name: &str, shape: &[usize], v: &[i8]) -> Self {
        Self::new(name, "I8", shape, v.iter().map(|&x| x as u8).collect())
    }
}

/// Writes a safetensors file with the tensors in the given order (data and header alike).
fn write_safetensors(path: &Path, tensors: &[Tensor]) -> Result<()> {
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut offset = 0usize;
    for t in tensors {
        let end = offset + t.data.len();
        header.insert(t.name.clone(), json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, end]}));
        offset = end;
    }
    let mut h = serde_json::to_vec(&Value::Object(header))?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + h.len() + offset);
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    for t in tensors {
        out.extend_from_slice(&t.data);
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

fn write_json(path: &Path, v: &Value) -> Result<()> {
    let mut s = serde_json::to_string_pretty(v)?;
    s.push('\n');
    std::fs::write(path, s).with_context(|| format!("writing {}", path.display()))
}

/// Writes shards plus `model.safetensors.index.json`.
fn write_sharded(dir: &Path, shards: &[Vec<Tensor>]) -> Result<()> {
    let n = shards.len();
    let mut map = BTreeMap::new();
    let mut total = 0usize;
    for (i, tensors) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, n);
        write_safetensors(&dir.join(&file), tensors)?;
        for t in tensors {
            total += t.data.len();
            ensure!(map.insert(t.name.clone(), file.clone()).is_none(), "duplicate tensor {}", t.name);
        }
    }
    let weight_map: Map<String, Value> = map.into_iter().map(|(k, v)| (k, Value::String(v))).collect();
    write_json(
        &dir.join("model.safetensors.index.json"),
        &json!({"metadata": {"total_size": total}, "weight_map": weight_map}),
    )
}

/// Orders tensors like the real dense export: grouped by leaf name (all `escha_s_in` first, …,
/// the codes last), by module within a group.
fn leaf_grouped(mut v: Vec<Tensor>) -> Vec<Tensor> {
    let rank = |name: &str| match name.rsplit_once('.').map_or(name, |x| x.1) {
        "escha_s_in" => 0,
        "escha_s_out" => 1,
        "escha_rin" => 2,
        "escha_rout" => 3,
        "escha_config" => 4,
        "bias" => 5,
        "weight_int8" | "weight_scale" => 7,
        "escha_code" => 8,
        _ => 6,
    };
    v.sort_by_cached_key(|t| (rank(&t.name), natural_key(&t.name)));
    v
}

fn natural_sorted(mut v: Vec<Tensor>) -> Vec<Tensor> {
    v.sort_by_cached_key(|t| natural_key(&t.name));
    v
}

// ------------------------------------------------------------------------------------------------
// Model pieces

/// One base linear (bf16 values held in f32), `[out, in]`.
struct Linear {
    path: String,
    out: usize,
    inp: usize,
    w: Vec<f32>,
}

fn linear(path: String, out: usize, inp: usize, std: f64) -> Linear {
    let w = base_linear(&path, out, inp, std);
    Linear { path, out, inp, w }
}

fn is_linear_layer(i: usize) -> bool {
    !(i + 1).is_multiple_of(4)
}

/// The per-layer attention linears (GDN or full attention) of either model.
fn attention_linears(i: usize) -> Vec<Linear> {
    let p = format!("{LM}.layers.{i}");
    let conv_dim = 2 * LIN_K_HEADS * LIN_K_DIM + LIN_V_HEADS * LIN_V_DIM;
    if is_linear_layer(i) {
        vec![
            linear(format!("{p}.linear_attn.in_proj_qkv"), conv_dim, HIDDEN, 0.04),
            linear(format!("{p}.linear_attn.in_proj_z"), LIN_V_HEADS * LIN_V_DIM, HIDDEN, 0.04),
            linear(format!("{p}.linear_attn.out_proj"), HIDDEN, LIN_V_HEADS * LIN_V_DIM, 0.03),
        ]
    } else {
        vec![
            linear(format!("{p}.self_attn.q_proj"), 2 * HEADS * HEAD_DIM, HIDDEN, 0.04),
            linear(format!("{p}.self_attn.k_proj"), KV_HEADS * HEAD_DIM, HIDDEN, 0.04),
            linear(format!("{p}.self_attn.v_proj"), KV_HEADS * HEAD_DIM, HIDDEN, 0.03),
            linear(format!("{p}.self_attn.o_proj"), HIDDEN, HEADS * HEAD_DIM, 0.03),
        ]
    }
}

/// Plain (never coded) per-layer tensors, identical in the Escha checkpoint and the base:
/// (name, values, shape, stored dtype in the Escha checkpoint). Norms are zero-centred except
/// `linear_attn.norm`.
fn plain_layer_tensors(i: usize, moe: bool) -> Vec<(String, Vec<f32>, Vec<usize>, &'static str)> {
    let p = format!("{LM}.layers.{i}");
    let mut v = Vec::new();
    let mut norm = |n: String, len: usize| {
        let vals = dual_normal(&n, len, 0.0, 0.05);
        v.push((n, vals, vec![len], "F16"));
    };
    norm(format!("{p}.input_layernorm.weight"), HIDDEN);
    norm(format!("{p}.post_attention_layernorm.weight"), HIDDEN);
    if is_linear_layer(i) {
        let conv_dim = 2 * LIN_K_HEADS * LIN_K_DIM + LIN_V_HEADS * LIN_V_DIM;
        let a = format!("{p}.linear_attn");
        let n = format!("{a}.in_proj_a.weight");
        v.push((n.clone(), dual_normal(&n, LIN_V_HEADS * HIDDEN, 0.0, 0.03), vec![LIN_V_HEADS, HIDDEN], "F16"));
        let n = format!("{a}.in_proj_b.weight");
        v.push((n.clone(), dual_normal(&n, LIN_V_HEADS * HIDDEN, 0.0, 0.03), vec![LIN_V_HEADS, HIDDEN], "F16"));
        let n = format!("{a}.conv1d.weight");
        v.push((n.clone(), dual_normal(&n, conv_dim * CONV_KERNEL, 0.0, 0.2), vec![conv_dim, 1, CONV_KERNEL], "F16"));
        let n = format!("{a}.A_log");
        let mut r = Rng::for_name(&n);
        let alog: Vec<f32> = (0..LIN_V_HEADS).map(|_| (1.0 + 15.0 * r.uniform()).ln() as f32).collect();
        v.push((n, alog, vec![LIN_V_HEADS], "F32"));
        let n = format!("{a}.dt_bias");
        v.push((n.clone(), dual_normal(&n, LIN_V_HEADS, 1.0, 0.1), vec![LIN_V_HEADS], "F16"));
        let n = format!("{a}.norm.weight");
        v.push((n.clone(), dual_normal(&n, LIN_V_DIM, 1.0, 0.05), vec![LIN_V_DIM], "F16"));
    } else {
        norm(format!("{p}.self_attn.q_norm.weight"), HEAD_DIM);
        norm(format!("{p}.self_attn.k_norm.weight"), HEAD_DIM);
    }
    if moe {
        let n = format!("{p}.mlp.gate.weight");
        v.push((n.clone(), dual_normal(&n, EXPERTS * HIDDEN, 0.0, 0.05), vec![EXPERTS, HIDDEN], "F16"));
        let n = format!("{p}.mlp.shared_expert_gate.weight");
        v.push((n.clone(), dual_normal(&n, HIDDEN, 0.0, 0.05), vec![1, HIDDEN], "F16"));
    }
    v
}

fn plain_tensor(name: &str, vals: &[f32], shape: &[usize], dtype: &str) -> Tensor {
    match dtype {
        "F16" => Tensor::f16(name, shape, vals),
        "F32" => Tensor::f32(name, shape, vals),
        "BF16" => Tensor::bf16(name, shape, vals),
        _ => unreachable!(),
    }
}

/// The base's version of a plain tensor: 16-bit floats as bf16, F32 kept.
fn base_plain(name: &str, vals: &[f32], shape: &[usize], dtype: &str) -> Tensor {
    if dtype == "F32" {
        Tensor::f32(name, shape, vals)
    } else {
        Tensor::bf16(name, shape, vals)
    }
}

/// int8 pair with per-row absmax/127 scales (F16).
fn int8_pair(path: &str, w: &[f32], rows: usize, cols: usize) -> Vec<Tensor> {
    let mut q = Vec::with_capacity(w.len());
    let mut scales = Vec::with_capacity(rows);
    for r in 0..rows {
        let row = &w[r * cols..(r + 1) * cols];
        let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
        let s = f16::from_f32(amax / 127.0);
        let sf = s.to_f32();
        for &x in row {
            let v = if sf > 0.0 { (x / sf).round_ties_even().clamp(-127.0, 127.0) } else { 0.0 };
            q.push(v as i8);
        }
        scales.push(s);
    }
    vec![
        Tensor::i8(&format!("{path}.weight_int8"), &[rows, cols], &q),
        Tensor::f16h(&format!("{path}.weight_scale"), &[rows], &scales),
    ]
}

/// Relative Frobenius error of the decoded coded linear against the base.
fn rel_err(decoded: &[f32], base: &[f32]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&d, &b) in decoded.iter().zip(base) {
        num += (d as f64 - b as f64).powi(2);
        den += (b as f64).powi(2);
    }
    (num / den).sqrt()
}

fn to_f32(v: &[f16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

/// One Escha-coded dense linear: its leaves, and the relative error of its decode.
fn escha_dense_linear(l: &Linear, k: u32) -> Result<(Vec<Tensor>, f64)> {
    let (oc, ic) = (l.out, l.inp);
    let p = &l.path;
    let s_in = uniform_vec(&format!("{p}.escha_s_in"), ic, 0.98, 1.02);
    let s_out = uniform_vec(&format!("{p}.escha_s_out"), oc, 0.98, 1.02);
    let mut target = Vec::with_capacity(oc * ic);
    for (row, &so) in l.w.chunks_exact(ic).zip(&s_out) {
        for (&x, &si) in row.iter().zip(&s_in) {
            target.push(x / (so * si));
        }
    }
    let seed = Rng::for_name(&format!("{p}.encode")).next_u64();
    let enc = encode_linear(&target, oc, ic, k, Codebook::Mcg, seed);
    ensure!(enc.code.len() == ic * oc * k as usize / 8, "{p}: code size {}", enc.code.len());
    ensure!(enc.rin.len() == ic && enc.rout.len() == oc, "{p}: vector sizes");
    let bias = dual_normal(&format!("{p}.bias"), oc, 0.0, 0.01);

    let su = fold_scales(&to_f32(&enc.rin), Some(&s_in));
    let sv = fold_scales(&to_f32(&enc.rout), Some(&s_out));
    let lin = CodedLinear { code: &enc.code, k, codebook: Codebook::Mcg, su: &su, sv: &sv };
    let err = rel_err(&lin.reconstruct(best_decoder(), oc, ic), &l.w);

    let tensors = vec![
        Tensor::new(&format!("{p}.escha_code"), "I16", &[ic / 16, oc / 16, 16 * k as usize], enc.code),
        Tensor::f16h(&format!("{p}.escha_rin"), &[ic], &enc.rin),
        Tensor::f16h(&format!("{p}.escha_rout"), &[oc], &enc.rout),
        Tensor::f32(&format!("{p}.escha_s_in"), &[ic], &s_in),
        Tensor::f32(&format!("{p}.escha_s_out"), &[oc], &s_out),
        Tensor::i32(&format!("{p}.escha_config"), &[6], &[16, k as i32, 2, 1, ic as i32, oc as i32]),
        Tensor::f16(&format!("{p}.bias"), &[oc], &bias),
    ];
    Ok((tensors, err))
}

/// A stack of `[E]` Escha-coded experts (`s_in` = `s_out` = 1, no bias). `ws[e]` is `[oc, ic]`.
/// Returns the leaves, the worst decode error, and per expert the channels whose rout is 0.
fn escha_experts(
    path: &str,
    ws: &[Vec<f32>],
    oc: usize,
    ic: usize,
    k: u32,
) -> Result<(Vec<Tensor>, f64, Vec<Vec<usize>>)> {
    let e = ws.len();
    let (mut code, mut rin, mut rout) = (Vec::new(), Vec::new(), Vec::new());
    let mut worst = 0f64;
    let mut zeros = Vec::new();
    let ones_in = vec![1f32; ic];
    let ones_out = vec![1f32; oc];
    for (x, w) in ws.iter().enumerate() {
        let seed = Rng::for_name(&format!("{path}.encode.{x}")).next_u64();
        let enc = encode_linear(w, oc, ic, k, Codebook::Mcg, seed);
        ensure!(
            enc.code.len() == ic * oc * k as usize / 8 && enc.rin.len() == ic && enc.rout.len() == oc,
            "{path}[{x}]: sizes"
        );
        let su = fold_scales(&to_f32(&enc.rin), Some(&ones_in));
        let sv = fold_scales(&to_f32(&enc.rout), Some(&ones_out));
        let lin = CodedLinear { code: &enc.code, k, codebook: Codebook::Mcg, su: &su, sv: &sv };
        let dec = lin.reconstruct(best_decoder(), oc, ic);
        worst = worst.max(rel_err(&dec, w));
        // Rows that are zero in the base must decode to exact zeros.
        for o in 0..oc {
            if w[o * ic..(o + 1) * ic].iter().all(|&v| v == 0.0) {
                ensure!(
                    dec[o * ic..(o + 1) * ic].iter().all(|&v| v == 0.0),
                    "{path}[{x}]: base row {o} is zero but decodes to non-zero values (rout {})",
                    enc.rout[o]
                );
            }
        }
        zeros.push((0..oc).filter(|&o| enc.rout[o].to_f32() == 0.0).collect());
        code.extend_from_slice(&enc.code);
        rin.extend_from_slice(&enc.rin);
        rout.extend_from_slice(&enc.rout);
    }
    let (ei, ici, oci) = (e as i32, ic as i32, oc as i32);
    let tensors = vec![
        Tensor::new(&format!("{path}.escha_code"), "I16", &[e, ic / 16, oc / 16, 16 * k as usize], code),
        Tensor::f16h(&format!("{path}.escha_rin"), &[e, ic], &rin),
        Tensor::f16h(&format!("{path}.escha_rout"), &[e, oc], &rout),
        Tensor::f32(&format!("{path}.escha_s_in"), &[e, ic], &vec![1.0; e * ic]),
        Tensor::f32(&format!("{path}.escha_s_out"), &[e, oc], &vec![1.0; e * oc]),
        Tensor::i32(&format!("{path}.escha_config"), &[9], &[16, k as i32, 2, 1, ei, ici, oci, ici, oci]),
    ];
    Ok((tensors, worst, zeros))
}

// ------------------------------------------------------------------------------------------------
// Configs

fn layer_types() -> Vec<&'static str> {
    (0..LAYERS).map(|i| if is_linear_layer(i) { "linear_attention" } else { "full_attention" }).collect()
}

fn text_config(moe: bool) -> Value {
    let mut c = json!({
        "model_type": if moe { "qwen3_5_moe_text" } else { "qwen3_5_text" },
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "layer_types": layer_types(),
        "full_attention_interval": 4,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "attn_output_gate": true,
        "linear_num_key_heads": LIN_K_HEADS,
        "linear_key_head_dim": LIN_K_DIM,
        "linear_num_value_heads": LIN_V_HEADS,
        "linear_value_head_dim": LIN_V_DIM,
        "linear_conv_kernel_dim": CONV_KERNEL,
        "vocab_size": VOCAB,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10]
        },
        "max_position_embeddings": 4096,
        "mtp_num_hidden_layers": 1,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": true,
        "dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2
    });
    if moe {
        let m = c.as_object_mut().unwrap();
        for (k, v) in [
            ("num_experts", json!(EXPERTS)),
            ("num_experts_per_tok", json!(EXPERTS_PER_TOK)),
            ("moe_intermediate_size", json!(MOE_INTERMEDIATE)),
            ("shared_expert_intermediate_size", json!(SHARED_INTERMEDIATE)),
            ("decoder_sparse_step", json!(1)),
            ("norm_topk_prob", json!(true)),
            ("mlp_only_layers", json!([])),
            ("router_aux_loss_coef", json!(0.001)),
            ("output_router_logits", json!(false)),
        ] {
            m.insert(k.into(), v);
        }
    }
    c
}

fn vision_config() -> Value {
    json!({
        "model_type": "qwen3_5",
        "depth": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_heads": 2,
        "out_hidden_size": HIDDEN,
        "in_channels": 3,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 64,
        "hidden_act": "gelu_pytorch_tanh",
        "deepstack_visual_indexes": []
    })
}

/// config.json of the base model; `quant` is appended as `quantization_config` when given.
fn model_config(moe: bool, quant: Option<Value>) -> Value {
    let mut c = json!({
        "architectures": [if moe { "Qwen3_5MoeForConditionalGeneration" } else { "Qwen3_5ForConditionalGeneration" }],
        "model_type": if moe { "qwen3_5_moe" } else { "qwen3_5" },
        "text_config": text_config(moe),
        "vision_config": vision_config(),
        "tie_word_embeddings": false,
        "transformers_version": "5.8.0"
    });
    if let Some(q) = quant {
        c.as_object_mut().unwrap().insert("quantization_config".into(), q);
    }
    c
}

fn fp8_quant_config() -> Value {
    json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})
}

fn write_side_files(dir: &Path, quant_method: &str) -> Result<()> {
    write_json(
        &dir.join("generation_config.json"),
        &json!({"bos_token_id": 1, "eos_token_id": [2], "pad_token_id": 0, "do_sample": true,
                "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "5.8.0"}),
    )?;
    write_json(
        &dir.join("tokenizer_config.json"),
        &json!({"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 4096, "bos_token": null,
                "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": false,
                "chat_template": CHAT_TEMPLATE}),
    )?;
    write_json(&dir.join("tokenizer.json"), &tokenizer())?;
    // Must never be copied into a converted output (tools treat it as proof of an Escha checkpoint).
    write_json(
        &dir.join("quantize_config.json"),
        &json!({"quant_method": quant_method, "format_version": "2.0",
                "global_config": {"codebook": "cbA", "bits": 2.0}}),
    )
}

/// A `ChatML` template, as Qwen's tokenizers carry (shortened).
const CHAT_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The split pattern of Qwen3.5's tokenizer.
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A byte-level BPE tokenizer shaped like Qwen3.5's (its pre-tokenizer, normalizer, added tokens),
/// small enough for the fixtures' 256-entry vocabulary: 232 byte tokens, 16 merges, five added
/// tokens (three special), and ids 253–255 unused.
fn tokenizer() -> Value {
    // GPT-2's byte-to-character map: printable bytes stand for themselves, the rest from U+0100 on.
    let mut printable: Vec<u32> = (0x21..=0x7E).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut chars: Vec<char> = printable.iter().map(|&b| char::from_u32(b).unwrap()).collect();
    let mut next = 0x100;
    for b in 0..=255u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(char::from_u32(next).unwrap());
            next += 1;
        }
    }
    let mut vocab = serde_json::Map::new();
    for (id, c) in chars.iter().take(232).enumerate() {
        vocab.insert(c.to_string(), json!(id));
    }
    let merges = [
        ("Ġ", "t"),
        ("h", "e"),
        ("Ġt", "he"),
        ("Ġ", "a"),
        ("i", "n"),
        ("e", "r"),
        ("o", "n"),
        ("Ġ", "s"),
        ("r", "e"),
        ("a", "t"),
        ("e", "n"),
        ("Ġ", "w"),
        ("o", "r"),
        ("Ġ", "c"),
        ("i", "s"),
        ("Ġ", "o"),
    ];
    for (i, (a, b)) in merges.iter().enumerate() {
        vocab.insert(format!("{a}{b}"), json!(232 + i));
    }
    let added = |id: usize, content: &str, special: bool| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": special})
    };
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [
            added(248, "<|endoftext|>", true), added(249, "<|im_start|>", true), added(250, "<|im_end|>", true),
            added(251, "<think>", false), added(252, "</think>", false),
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN35_SPLIT}, "behavior": "Isolated", "invert": false},
            byte_level.clone(),
        ]},
        "post_processor": byte_level.clone(),
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges.iter().map(|(a, b)| json!([a, b])).collect::<Vec<_>>()},
    })
}

fn layer_meta_entry(k: u32, bits: f64, ic: usize, oc: usize) -> Value {
    json!({"K": k, "bits": bits, "in_features": ic, "out_features": oc})
}

// ------------------------------------------------------------------------------------------------
// The two models

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
