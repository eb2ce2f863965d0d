//! The linears of both models: base weights, plain per-layer tensors, int8 pairs, and the
//! Escha encodings of dense linears and expert stacks with their decode checks.

use super::{
    CONV_KERNEL, EXPERTS, HEADS, HEAD_DIM, HIDDEN, KV_HEADS, LIN_K_DIM, LIN_K_HEADS, LIN_V_DIM, LIN_V_HEADS, LM,
};
use crate::files::Tensor;
use crate::values::{base_linear, dual_normal, uniform_vec, Rng};
use anyhow::{ensure, Result};
use escha_convert::codec::{best_decoder, Codebook};
use escha_convert::encode::encode_linear;
use escha_convert::transform::{fold_scales, CodedLinear};
use half::f16;

/// One base linear (bf16 values held in f32), `[out, in]`.
pub struct Linear {
    pub path: String,
    pub out: usize,
    pub inp: usize,
    pub w: Vec<f32>,
}

pub fn linear(path: String, out: usize, inp: usize, std: f64) -> Linear {
    let w = base_linear(&path, out, inp, std);
    Linear { path, out, inp, w }
}

pub fn is_linear_layer(i: usize) -> bool {
    !(i + 1).is_multiple_of(4)
}

/// The per-layer attention linears (GDN or full attention) of either model.
pub fn attention_linears(i: usize) -> Vec<Linear> {
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
pub fn plain_layer_tensors(i: usize, moe: bool) -> Vec<(String, Vec<f32>, Vec<usize>, &'static str)> {
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

pub fn plain_tensor(name: &str, vals: &[f32], shape: &[usize], dtype: &str) -> Tensor {
    match dtype {
        "F16" => Tensor::f16(name, shape, vals),
        "F32" => Tensor::f32(name, shape, vals),
        "BF16" => Tensor::bf16(name, shape, vals),
        _ => unreachable!(),
    }
}

/// The base's version of a plain tensor: 16-bit floats as bf16, F32 kept.
pub fn base_plain(name: &str, vals: &[f32], shape: &[usize], dtype: &str) -> Tensor {
    if dtype == "F32" {
        Tensor::f32(name, shape, vals)
    } else {
        Tensor::bf16(name, shape, vals)
    }
}

/// int8 pair with per-row absmax/127 scales (F16).
pub fn int8_pair(path: &str, w: &[f32], rows: usize, cols: usize) -> Vec<Tensor> {
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
pub fn rel_err(decoded: &[f32], base: &[f32]) -> f64 {
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
pub fn escha_dense_linear(l: &Linear, k: u32) -> Result<(Vec<Tensor>, f64)> {
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
pub fn escha_experts(
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
