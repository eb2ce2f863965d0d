//! ggml's K-quant super-block encodings `Q4_K`, `Q5_K` and `Q6_K`: byte for byte what ggml's
//! reference quantizers (`quantize_row_q{4,5,6}_K_ref`, no importance matrix, asserts off as in a
//! release build) write, and ggml's dequantization of them.
//!
//! Bit-exactness rests on doing the same IEEE operations in the same order as the C code built
//! with `-ffp-contract=off`: every product and sum below is a separate, un-fused operation (Rust
//! never contracts), sums run front to back, integers become floats exactly where C converts them,
//! and rounding to the nearest integer uses ggml's magic-number trick rather than `f32::round`.
//! `tests/it/kquants_ref.rs` checks all of this against the C code itself.
//!
//! The block functions below are the scalar reference. [`quantize_row`] runs the fastest
//! [`Kernel`] this CPU has (AVX2 on `x86_64`, NEON on aarch64, chosen once per process), each
//! bit-identical to the reference for every input: a kernel runs the reference's scale searches
//! for the 8 (`Q4_K`, `Q5_K`) or 16 (`Q6_K`) groups of a block side by side, one group per vector
//! lane, every lane doing the reference's operations in the reference's order; the few scalar
//! steps per block (the super-scales, the 6- and 8-bit group scales) are the reference's own code.

use crate::block_type::BlockType;
use half::f16;
use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(test)]
mod kernel_tests;
#[cfg(target_arch = "aarch64")]
mod neon;

/// Values per super-block, for every K-quant type.
pub const QK_K: usize = BlockType::Q4_K.elements();
/// Bytes of one `Q4_K` super-block: f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins, 128
/// bytes of 4-bit quants.
pub const Q4_K_BLOCK_BYTES: usize = BlockType::Q4_K.bytes();
/// Bytes of one `Q5_K` super-block: as `Q4_K` plus 32 bytes holding each quant's fifth bit.
pub const Q5_K_BLOCK_BYTES: usize = BlockType::Q5_K.bytes();
/// Bytes of one `Q6_K` super-block: 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 int8
/// scales, f16 `d`.
pub const Q6_K_BLOCK_BYTES: usize = BlockType::Q6_K.bytes();

/// The K-quant types as the SIMD kernels take them, for their exhaustive matches; everything
/// else here dispatches on [`BlockType`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KQuant {
    Q4K,
    Q5K,
    Q6K,
}

impl KQuant {
    /// # Panics
    ///
    /// If `block` is not a K-quant.
    fn of(block: BlockType) -> KQuant {
        match block {
            BlockType::Q4_K => KQuant::Q4K,
            BlockType::Q5_K => KQuant::Q5K,
            BlockType::Q6_K => KQuant::Q6K,
            other => panic!("{} is not a K-quant", other.name()),
        }
    }

    /// Bytes of one super-block of [`QK_K`] values.
    #[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
    fn block_bytes(self) -> usize {
        match self {
            KQuant::Q4K => Q4_K_BLOCK_BYTES,
            KQuant::Q5K => Q5_K_BLOCK_BYTES,
            KQuant::Q6K => Q6_K_BLOCK_BYTES,
        }
    }
}

/// Appends `values` (a whole number of [`QK_K`]-value super-blocks) encoded as `kind` to `out`.
/// Runs [`Kernel::best`].
pub fn quantize_row(kind: BlockType, values: &[f32], out: &mut Vec<u8>) {
    quantize_row_with(Kernel::best(), kind, values, out);
}

/// [`quantize_row`] on a given kernel; every kernel appends the same bytes.
///
/// # Panics
///
/// If `kind` is not a K-quant, `values` is not whole blocks, or `kernel` is one this CPU cannot
/// run (see [`Kernel::available`]).
pub fn quantize_row_with(kernel: Kernel, kind: BlockType, values: &[f32], out: &mut Vec<u8>) {
    let kernel_kind = KQuant::of(kind);
    assert_eq!(values.len() % QK_K, 0, "{} rows hold whole blocks of {QK_K} values", kind.name());
    let len = values.len() / QK_K * kind.bytes();
    if kernel == Kernel::Reference {
        out.reserve(len);
        for block in values.chunks_exact(QK_K) {
            let x: &[f32; QK_K] = block.try_into().unwrap();
            match kind {
                BlockType::Q4_K => out.extend_from_slice(&quantize_q4_k_block(x)),
                BlockType::Q5_K => out.extend_from_slice(&quantize_q5_k_block(x)),
                BlockType::Q6_K => out.extend_from_slice(&quantize_q6_k_block(x)),
                _ => unreachable!("KQuant::of refused it"),
            }
        }
        return;
    }
    let start = out.len();
    out.resize(start + len, 0);
    let blocks = &mut out[start..];
    match kernel {
        Kernel::Reference => unreachable!(),
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => {
            assert!(is_x86_feature_detected!("avx2"), "the avx2 K-quant kernel needs a CPU with AVX2");
            // SAFETY: AVX2 was detected just above.
            unsafe { avx2::quantize_blocks(kernel_kind, values, blocks) }
        }
        #[cfg(target_arch = "aarch64")]
        // SAFETY: NEON is part of the aarch64 base architecture.
        Kernel::Neon => unsafe { neon::quantize_blocks(kernel_kind, values, blocks) },
    }
}

/// One implementation of [`quantize_row`]: the scalar reference or a SIMD kernel, all giving the
/// same bytes. A SIMD variant exists only on its architecture; [`quantize_row_with`] refuses one
/// the CPU lacks (AVX2 is detected at run time, NEON is part of aarch64).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// The block functions of this module, one block at a time.
    Reference,
    /// AVX2 (`x86_64`): the groups of a block (`Q6_K`), or of two blocks (`Q4_K`, `Q5_K`), eight
    /// to a register.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// NEON (aarch64): the groups of a block (`Q6_K`), or of two blocks (`Q4_K`, `Q5_K`), four to a
    /// register.
    #[cfg(target_arch = "aarch64")]
    Neon,
}

impl Kernel {
    /// Every kernel this CPU runs, the reference first and the fastest last.
    pub fn available() -> Vec<Kernel> {
        let mut v = vec![Kernel::Reference];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            v.push(Kernel::Avx2);
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            v.push(Kernel::Neon);
        }
        v
    }

    /// The fastest kernel this CPU runs, detected on the first call.
    pub fn best() -> Kernel {
        static BEST: OnceLock<Kernel> = OnceLock::new();
        *BEST.get_or_init(|| *Kernel::available().last().expect("the reference is always available"))
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernel::Reference => "reference",
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => "avx2",
            #[cfg(target_arch = "aarch64")]
            Kernel::Neon => "neon",
        }
    }
}

/// Appends the values of `blocks` (whole `kind` super-blocks) to `out`, computed as ggml's
/// `dequantize_row_q{4,5,6}_K` computes them.
pub fn dequantize_row(kind: BlockType, blocks: &[u8], out: &mut Vec<f32>) {
    let size = kind.bytes();
    assert_eq!(blocks.len() % size, 0, "{} data holds whole blocks of {size} bytes", kind.name());
    out.reserve(blocks.len() / size * QK_K);
    for block in blocks.chunks_exact(size) {
        match kind {
            BlockType::Q4_K => dequantize_q4_k_block(block, out),
            BlockType::Q5_K => dequantize_q5_k_block(block, out),
            BlockType::Q6_K => dequantize_q6_k_block(block, out),
            other => panic!("{} is not a K-quant", other.name()),
        }
    }
}

/// Rounds to the nearest integer, ties to even, as ggml does: adding 1.5·2²³ leaves the integer in
/// the low mantissa bits. Exact for |v| < 2²²; beyond that (ggml asserts against it in debug
/// builds only) the same bit pattern arithmetic is reproduced, NaN giving 0 and ±inf −2²².
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12582912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// f32 → f16 bits, round to nearest even, overflow to ±inf: what ggml's bit-trick conversion gives
/// for every non-NaN input (no NaN reaches a scale here).
#[inline(always)]
fn to_f16_bits(v: f32) -> u16 {
    f16::from_f32(v).to_bits()
}

#[inline(always)]
fn f16_at(block: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([block[at], block[at + 1]]).to_f32()
}

/// The `j`-th (0..8) 6-bit scale and min of a `Q4_K`/`Q5_K` scales field: 0..4 sit in the low six
/// bits of bytes 0..4 and 4..8; 4..8 have their low nibbles in bytes 8..12 and their top two bits in
/// the spare top bits of bytes 0..8.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// ggml's `make_qkx2_quants` for 32 values, squared error: fits `x ≈ scale·L − min` with `L` in
/// 0..=nmax by trying `nstep + 1` stretched grids and keeping the weighted least-squares fit of the
/// best one. Writes `l`, returns `(scale, min)` with `min ≥ 0` (the offset subtracted).
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32; 32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (f32, f32) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..32 {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    // The grid always holds zero: the offset is never positive.
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..32].fill(0);
        return (0.0, -min);
    }
    let nmax_f = nmax as f32;
    let mut iscale = nmax_f / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..32 {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * q as f32 + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax_f) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..32 {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let w = weights[i];
            let qf = q as f32;
            sum_l += w * qf;
            sum_l2 += w * qf * qf;
            sum_xl += w * qf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            // A positive offset is not representable: refit the scale alone through zero.
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..32 {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                l[..32].copy_from_slice(&laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The part `Q4_K` and `Q5_K` share: per 32 values a scale and min (`make_qkx2_quants`, weights
/// `rms + |x|`), both quantized to 6 bits against f16 super-scales, then the quants recomputed
/// against the scales as stored. Returns `(d, dmin, scales field, quants in 0..=nmax)`.
fn quantize_scale_min_block(x: &[f32; QK_K], nmax: i32, rmin: f32, nstep: i32) -> (u16, u16, [u8; 12], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let mut weights = [0.0f32; 32];
    for j in 0..8 {
        let sub = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in sub {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(sub) {
            *w = av_x + v.abs();
        }
        let (scale, min) = make_qkx2_quants(nmax, sub, &weights, &mut l[32 * j..], rmin, 0.1, nstep);
        scales[j] = scale;
        mins[j] = min;
    }
    let (d, dmin, packed) = scale_min_header(&scales, &mins);

    // Re-quantize against what a decoder will see; a group whose scale came out zero keeps the
    // quants of its own fit.
    let d_f = f16::from_bits(d).to_f32();
    let dmin_f = f16::from_bits(dmin).to_f32();
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = d_f * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin_f * m as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed, l)
}

/// The super-scales `d`, `dmin` (f16 bits) and the 12-byte field of 6-bit group scales and mins
/// for the groups' fitted scales and mins, as `quantize_row_q{4,5}_K_ref` computes them.
fn scale_min_header(scales: &[f32; 8], mins: &[f32; 8]) -> (u16, u16, [u8; 12]) {
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for (&scale, &min) in scales.iter().zip(mins) {
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        // C stores the rounded int in a uint8_t before clamping: out-of-range values wrap first.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = to_f16_bits(max_scale / 63.0);
    let dmin = to_f16_bits(max_min / 63.0);
    (d, dmin, packed)
}

/// One `Q4_K` super-block: 8 groups of 32 values, `x ≈ d·sc·q − dmin·m`, q in 0..16.
fn quantize_q4_k_block(x: &[f32; QK_K]) -> [u8; Q4_K_BLOCK_BYTES] {
    let (d, dmin, scales, l) = quantize_scale_min_block(x, 15, -1.0, 20);
    let mut out = [0u8; Q4_K_BLOCK_BYTES];
    write_q4_k(d, dmin, &scales, &l, &mut out);
    out
}

/// Writes a `Q4_K` block from its header and quants (0..16).
#[inline(always)]
fn write_q4_k(d: u16, dmin: u16, scales: &[u8; 12], l: &[u8; QK_K], out: &mut [u8; Q4_K_BLOCK_BYTES]) {
    out[0..2].copy_from_slice(&d.to_le_bytes());
    out[2..4].copy_from_slice(&dmin.to_le_bytes());
    out[4..16].copy_from_slice(scales);
    // Each 64 values share 32 bytes: the first 32 in the low nibbles, the next 32 in the high.
    let qs = &mut out[16..];
    for (chunk, ls) in qs.chunks_exact_mut(32).zip(l.chunks_exact(64)) {
        for k in 0..32 {
            chunk[k] = ls[k] | (ls[k + 32] << 4);
        }
    }
}

/// One `Q5_K` super-block: as `Q4_K` with q in 0..32; the fifth bit of value `64·p + k` (k < 32) is
/// bit `2p` of byte `k` of `qh`, that of value `64·p + 32 + k` bit `2p + 1`.
fn quantize_q5_k_block(x: &[f32; QK_K]) -> [u8; Q5_K_BLOCK_BYTES] {
    let (d, dmin, scales, l) = quantize_scale_min_block(x, 31, -0.5, 15);
    let mut out = [0u8; Q5_K_BLOCK_BYTES];
    write_q5_k(d, dmin, &scales, &l, &mut out);
    out
}

/// Writes a `Q5_K` block from its header and quants (0..32) into `out`, which is zero.
#[inline(always)]
fn write_q5_k(d: u16, dmin: u16, scales: &[u8; 12], l: &[u8; QK_K], out: &mut [u8; Q5_K_BLOCK_BYTES]) {
    out[0..2].copy_from_slice(&d.to_le_bytes());
    out[2..4].copy_from_slice(&dmin.to_le_bytes());
    out[4..16].copy_from_slice(scales);
    let (qh, qs) = out[16..].split_at_mut(32);
    for (p, (chunk, ls)) in qs.chunks_exact_mut(32).zip(l.chunks_exact(64)).enumerate() {
        for k in 0..32 {
            let (lo, hi) = (ls[k], ls[k + 32]);
            qh[k] |= ((lo >> 4) << (2 * p)) | ((hi >> 4) << (2 * p + 1));
            chunk[k] = (lo & 0xF) | ((hi & 0xF) << 4);
        }
    }
}

/// ggml's `make_qx_quants` for 16 values with `rmse_type` 1 (weights x²) and no importance: a
/// symmetric grid `x ≈ scale·(L − nmax)`, L in 0..2·nmax, the scale chosen among 19 stretches of
/// the grid by weighted least squares. Writes `l`, returns the scale (its sign that of the
/// largest-magnitude value's negation, so the extreme value lands on L = 0).
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [u8]) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in &x[..16] {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < 1e-15 {
        l[..16].fill(0);
        return 0.0;
    }
    let nmax_f = nmax as f32;
    let mut iscale = -nmax_f / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..16 {
        let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = (q + nmax) as u8;
        let w = x[i] * x[i];
        let qf = q as f32;
        sumlx += w * x[i] * qf;
        suml2 += w * qf * qf;
    }
    // C tests `suml2 ? … : 0`: NaN counts as non-zero.
    let mut scale = if suml2 == 0.0 { 0.0 } else { sumlx / suml2 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        iscale = -(nmax_f + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &v in &x[..16] {
            let qf = nearest_int(iscale * v).clamp(-nmax, nmax - 1) as f32;
            let w = v * v;
            sumlx += w * v * qf;
            suml2 += w * qf * qf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..16 {
                l[i] = (nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// One `Q6_K` super-block: 16 groups of 16 values, `x ≈ d·sc·(q − 32)` with an int8 `sc` per group
/// and q in 0..64 split into a low nibble and a high bit pair.
fn quantize_q6_k_block(x: &[f32; QK_K]) -> [u8; Q6_K_BLOCK_BYTES] {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 16];
    for ib in 0..16 {
        scales[ib] = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..]);
    }
    let mut out = [0u8; Q6_K_BLOCK_BYTES];
    let Some((d, sc)) = q6_k_header(&scales) else {
        // ggml zeroes the whole block (d = +0 included).
        return out;
    };
    let d_f = f16::from_bits(d).to_f32();
    for (j, &s) in sc.iter().enumerate() {
        let dj = d_f * s as f32;
        if dj == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(x[i] / dj).clamp(-32, 31) + 32) as u8;
        }
    }

    write_q6_k(d, &sc, &l, &mut out);
    out
}

/// The super-scale `d` (f16 bits) and the int8 group scales for the groups' fitted scales, as
/// `quantize_row_q6_K_ref` computes them; `None` when every scale is below 1e-15 in magnitude
/// (ggml then writes a zero block).
fn q6_k_header(scales: &[f32; 16]) -> Option<(u16, [i8; 16])> {
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    for &scale in scales {
        let abs_scale = scale.abs();
        if abs_scale > max_abs_scale {
            max_abs_scale = abs_scale;
            max_scale = scale;
        }
    }
    if max_abs_scale < 1e-15 {
        return None;
    }
    // The largest-magnitude group scale maps to −128; the others round into −128..=127 (C clamps
    // above only, then stores in an int8_t).
    let iscale = -128.0 / max_scale;
    let d = to_f16_bits(1.0 / iscale);
    let mut sc = [0i8; 16];
    for ib in 0..16 {
        sc[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
    }
    Some((d, sc))
}

/// Writes a `Q6_K` block from its super-scale, group scales and quants (0..64).
#[inline(always)]
fn write_q6_k(d: u16, sc: &[i8; 16], l: &[u8; QK_K], out: &mut [u8; Q6_K_BLOCK_BYTES]) {
    // Per 128 values: 64 bytes of nibbles (values k and k + 64 share byte k, k + 32 and k + 96 share
    // byte 32 + k) and 32 bytes of high bit pairs (k, k + 32, k + 64, k + 96 from the bottom up).
    let (ql, rest) = out.split_at_mut(128);
    let (qh, tail) = rest.split_at_mut(64);
    for ((ql, qh), ls) in ql.chunks_exact_mut(64).zip(qh.chunks_exact_mut(32)).zip(l.chunks_exact(128)) {
        for k in 0..32 {
            let (q1, q2, q3, q4) = (ls[k], ls[k + 32], ls[k + 64], ls[k + 96]);
            ql[k] = (q1 & 0xF) | ((q3 & 0xF) << 4);
            ql[k + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4);
            qh[k] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
        }
    }
    for (b, &s) in tail[..16].iter_mut().zip(sc) {
        *b = s as u8;
    }
    tail[16..18].copy_from_slice(&d.to_le_bytes());
}

fn dequantize_q4_k_block(block: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(block, 0);
    let min = f16_at(block, 2);
    let scales = &block[4..16];
    for (p, qs) in block[16..144].chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * p, scales);
        let (sc2, m2) = scale_min_k4(2 * p + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        out.extend(qs.iter().map(|&q| d1 * (q & 0xF) as f32 - m1));
        out.extend(qs.iter().map(|&q| d2 * (q >> 4) as f32 - m2));
    }
}

fn dequantize_q5_k_block(block: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(block, 0);
    let min = f16_at(block, 2);
    let scales = &block[4..16];
    let qh = &block[16..48];
    for (p, qs) in block[48..176].chunks_exact(32).enumerate() {
        let (sc1, m1) = scale_min_k4(2 * p, scales);
        let (sc2, m2) = scale_min_k4(2 * p + 1, scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        let (u1, u2) = (1u8 << (2 * p), 2u8 << (2 * p));
        out.extend(qs.iter().zip(qh).map(|(&q, &h)| d1 * ((q & 0xF) + if h & u1 != 0 { 16 } else { 0 }) as f32 - m1));
        out.extend(qs.iter().zip(qh).map(|(&q, &h)| d2 * ((q >> 4) + if h & u2 != 0 { 16 } else { 0 }) as f32 - m2));
    }
}

fn dequantize_q6_k_block(block: &[u8], out: &mut Vec<f32>) {
    let d = f16_at(block, 208);
    let sc = &block[192..208];
    let mut y = [0.0f32; QK_K];
    for h in 0..2 {
        let ql = &block[64 * h..64 * h + 64];
        let qh = &block[128 + 32 * h..128 + 32 * h + 32];
        let sc = &sc[8 * h..8 * h + 8];
        let y = &mut y[128 * h..128 * h + 128];
        for k in 0..32 {
            let is = k / 16;
            let q1 = ((ql[k] & 0xF) | ((qh[k] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[k + 32] & 0xF) | (((qh[k] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[k] >> 4) | (((qh[k] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[k + 32] >> 4) | (((qh[k] >> 6) & 3) << 4)) as i32 - 32;
            y[k] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[k + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[k + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[k + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
    out.extend_from_slice(&y);
}

/// How a kernel's pass rounds its values `v` to quants in `lo..=hi`; each gives the reference's
/// `nearest_int(v).clamp(lo, hi)` for a pass it is chosen for.
///
/// Round to nearest even (`vroundps`, `frintn`) equals the reference's magic-number arithmetic for
/// |v| < 2²², and the clamp below `lo` (an even integer) changes nothing unless some `v < lo − ½`,
/// the one above `hi` nothing unless some `v ≥ hi + ½`. A kernel knows the range of a pass's `v`
/// in each group from the `v` of its least and greatest element (`v` is monotonic in the element,
/// and so is every rounding), provided no element is NaN or infinite. A `v` in `[−½, 0)` rounds to
/// −0 where the reference's integer is +0 (unless a clamp at 0 applies); no sum or product of the
/// searches can tell the two apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
enum Rounding {
    /// The reference's bit arithmetic, for any `v`: NaN, infinities and huge values included.
    Exact,
    /// Round to nearest even, then the clamps that some element needs: below `lo`, above `hi`.
    Round { lo: bool, hi: bool },
}

impl Rounding {
    /// Index into `PASSES`: `Exact`, then `Round` without clamps, `lo`, `hi`, both.
    #[cfg(test)]
    fn index(self) -> usize {
        match self {
            Rounding::Exact => 0,
            Rounding::Round { lo, hi } => 1 + usize::from(lo) + 2 * usize::from(hi),
        }
    }
}

/// How many passes each [`Rounding`] ran, `Q4_K`/`Q5_K` then `Q6_K`: the tests check that their
/// rows reach every one.
#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
static PASSES: [[std::sync::atomic::AtomicUsize; 5]; 2] =
    [const { [const { std::sync::atomic::AtomicUsize::new(0) }; 5] }; 2];

#[cfg(all(test, any(target_arch = "x86_64", target_arch = "aarch64")))]
fn count(search: usize, r: Rounding) {
    PASSES[search][r.index()].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// What a kernel's scale search found for each group ("unit") of the blocks it works on, lane by
/// lane: at most 32 units (four `Q4_K`/`Q5_K` blocks, or one `Q6_K` block).
///
/// `scale` and `min` are what the reference's `make_qkx2_quants` / `make_qx_quants` return.
/// A unit's quants are kept as the grid they came from instead: `iscale` and `lmin` (the
/// multiplier and the offset that the winning pass rounded `iscale·(x − lmin)` or `iscale·x`
/// with), and `zero` (non-zero when the reference returns all-zero quants). The quants are only
/// needed for a group whose stored scale comes out zero, and are then recomputed from the grid,
/// with the reference's operations.
#[derive(Clone, Copy, Default)]
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
struct Fits {
    scale: [f32; 32],
    min: [f32; 32],
    iscale: [f32; 32],
    lmin: [f32; 32],
    zero: [u32; 32],
}

/// The quants of one `make_qkx2_quants` pass: `nearest_int(iscale·(x − min))` in `0..=nmax`.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
fn qkx2_levels(nmax: i32, x: &[f32], iscale: f32, min: f32, l: &mut [u8]) {
    for (q, &v) in l.iter_mut().zip(x) {
        *q = nearest_int(iscale * (v - min)).clamp(0, nmax) as u8;
    }
}

/// The quants of one `make_qx_quants` pass: `nearest_int(iscale·x)` in `−nmax..nmax`, plus `nmax`.
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
fn qx_levels(nmax: i32, x: &[f32], iscale: f32, l: &mut [u8]) {
    for (q, &v) in l.iter_mut().zip(x) {
        *q = (nearest_int(iscale * v).clamp(-nmax, nmax - 1) + nmax) as u8;
    }
}

/// The rest of [`quantize_scale_min_block`] and the packing, for a kernel that has done the
/// groups' searches: the fits of the block's groups are units `first..first + 8` of `fits`.
/// Inlined into each kernel, so that its element loops are compiled for that kernel's CPU.
#[inline(always)]
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
fn finish_scale_min_block(kind: KQuant, x: &[f32], fits: &Fits, first: usize, out: &mut [u8]) {
    let x: &[f32; QK_K] = x.try_into().unwrap();
    let nmax = if kind == KQuant::Q4K { 15 } else { 31 };
    let scales: &[f32; 8] = fits.scale[first..first + 8].try_into().unwrap();
    let mins: &[f32; 8] = fits.min[first..first + 8].try_into().unwrap();
    let (d, dmin, packed) = scale_min_header(scales, mins);
    let d_f = f16::from_bits(d).to_f32();
    let dmin_f = f16::from_bits(dmin).to_f32();
    let mut l = [0u8; QK_K];
    for (j, (xs, ls)) in x.chunks_exact(32).zip(l.chunks_exact_mut(32)).enumerate() {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = d_f * sc as f32;
        if dj == 0.0 {
            let u = first + j;
            if fits.zero[u] == 0 {
                qkx2_levels(nmax, xs, fits.iscale[u], fits.lmin[u], ls);
            }
            continue;
        }
        let dm = dmin_f * m as f32;
        for (q, &v) in ls.iter_mut().zip(xs) {
            *q = nearest_int((v + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    if kind == KQuant::Q4K {
        write_q4_k(d, dmin, &packed, &l, out.try_into().unwrap());
    } else {
        out[16..48].fill(0);
        write_q5_k(d, dmin, &packed, &l, out.try_into().unwrap());
    }
}

/// The rest of [`quantize_q6_k_block`], for a kernel that has done the 16 groups' searches.
#[inline(always)]
#[cfg_attr(not(any(target_arch = "x86_64", target_arch = "aarch64")), allow(dead_code))]
fn finish_q6_k_block(x: &[f32], fits: &Fits, out: &mut [u8]) {
    let x: &[f32; QK_K] = x.try_into().unwrap();
    let out: &mut [u8; Q6_K_BLOCK_BYTES] = out.try_into().unwrap();
    let Some((d, sc)) = q6_k_header(fits.scale[..16].try_into().unwrap()) else {
        out.fill(0);
        return;
    };
    let d_f = f16::from_bits(d).to_f32();
    let mut l = [0u8; QK_K];
    for (j, (xs, ls)) in x.chunks_exact(16).zip(l.chunks_exact_mut(16)).enumerate() {
        let dj = d_f * sc[j] as f32;
        if dj == 0.0 {
            if fits.zero[j] == 0 {
                qx_levels(32, xs, fits.iscale[j], ls);
            }
            continue;
        }
        for (q, &v) in ls.iter_mut().zip(xs) {
            *q = (nearest_int(v / dj).clamp(-32, 31) + 32) as u8;
        }
    }
    write_q6_k(d, &sc, &l, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    fn encode(kind: BlockType, values: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        quantize_row(kind, values, &mut out);
        out
    }

    fn gaussian(rng: &mut SplitMix64) -> f32 {
        rng.gaussian() as f32
    }

    #[test]
    fn block_sizes() {
        let sizes: Vec<usize> = BlockType::K_QUANTS.iter().map(|k| k.bytes()).collect();
        assert_eq!(sizes, [144, 176, 210]);
        // ggml's bits per weight: 4.5, 5.5, 6.5625.
        for (kind, bpw) in BlockType::K_QUANTS.iter().zip([4.5, 5.5, 6.5625]) {
            assert_eq!(kind.bytes() as f64 * 8.0 / QK_K as f64, bpw);
            assert_eq!(encode(*kind, &[0.5; 3 * QK_K]).len(), 3 * kind.bytes());
        }
    }

    #[test]
    fn zero_rows_encode_to_zero_bytes() {
        // ggml: a zero group fits with scale 0 and min −0, which round to 0 and f16 +0; Q6_K zeroes
        // the block outright. −0.0 inputs give the same bytes.
        for kind in BlockType::K_QUANTS {
            for z in [0.0f32, -0.0] {
                let bytes = encode(kind, &[z; 2 * QK_K]);
                assert!(bytes.iter().all(|&b| b == 0), "{}: {z:?} row gave {bytes:?}", kind.name());
                let mut back = Vec::new();
                dequantize_row(kind, &bytes, &mut back);
                assert!(back.iter().all(|&v| v == 0.0));
            }
        }
    }

    #[test]
    fn nearest_int_rounds_ties_to_even() {
        let cases =
            [(0.5, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (0.49999997, 0), (-3.7, -4), (4194303.0, 4194303)];
        for (v, want) in cases {
            assert_eq!(nearest_int(v), want, "{v}");
        }
        // Outside the exact range the bit arithmetic goes on: NaN → 0, ±inf → −2²².
        assert_eq!(nearest_int(f32::NAN), 0);
        assert_eq!(nearest_int(f32::INFINITY), -0x40_0000);
    }

    /// ggml's own f32 → f16 conversion (the FP16 library's bit trick), as a check on `half`.
    fn ggml_fp32_to_fp16(f: f32) -> u16 {
        let scale_to_inf = f32::from_bits(0x7780_0000);
        let scale_to_zero = f32::from_bits(0x0880_0000);
        let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
        let w = f.to_bits();
        let shl1_w = w.wrapping_add(w);
        let sign = w & 0x8000_0000;
        let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);
        base += f32::from_bits((bias >> 1) + 0x0780_0000);
        let bits = base.to_bits();
        let nonsign = ((bits >> 13) & 0x7C00) + (bits & 0x0FFF);
        ((sign >> 16) | if shl1_w > 0xFF00_0000 { 0x7E00 } else { nonsign }) as u16
    }

    #[test]
    fn f16_rounding_matches_ggml() {
        // Every f32 exponent with a spread of mantissas, including the halfway points, both signs.
        let mut rng = SplitMix64(7);
        for exp in 0u32..255 {
            for m in [0u32, 1, 0xFFF, 0x1000, 0x1FFF, 0x2000, 0x3FFF, 0x7F_E000, 0x7F_FFFF, 0x40_1000, 0x40_0FFF] {
                for extra in [m, (rng.next_u64() as u32) & 0x7F_FFFF] {
                    for sign in [0, 0x8000_0000] {
                        let v = f32::from_bits(sign | (exp << 23) | extra);
                        assert_eq!(to_f16_bits(v), ggml_fp32_to_fp16(v), "{v:e} ({:#010x})", v.to_bits());
                    }
                }
            }
        }
        for v in [65504.0f32, 65519.996, 65520.0, f32::INFINITY, f32::NEG_INFINITY, 6.1e-5, 5.96e-8, 2.98e-8] {
            assert_eq!(to_f16_bits(v), ggml_fp32_to_fp16(v), "{v:e}");
        }
    }

    #[test]
    fn round_trip_error_is_small() {
        let mut rng = SplitMix64(0x5EED);
        let values: Vec<f32> = (0..16 * QK_K).map(|_| gaussian(&mut rng)).collect();
        let rms = (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
        // Relative RMS error bounds with margin over what ggml's own code reaches on Gaussian data
        // (about 0.070, 0.036 and 0.018; worst single errors about 0.18, 0.10 and 0.05).
        for (kind, bound) in BlockType::K_QUANTS.iter().zip([0.085f32, 0.045, 0.023]) {
            let bytes = encode(*kind, &values);
            let mut back = Vec::new();
            dequantize_row(*kind, &bytes, &mut back);
            assert_eq!(back.len(), values.len());
            let err =
                (values.iter().zip(&back).map(|(a, b)| (a - b) * (a - b)).sum::<f32>() / values.len() as f32).sqrt();
            assert!(err / rms < bound, "{}: relative RMS error {}", kind.name(), err / rms);
            let worst = values.iter().zip(&back).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
            assert!(worst < 0.3, "{}: worst error {worst}", kind.name());
        }
    }

    #[test]
    fn constant_rows_decode_close() {
        for kind in BlockType::K_QUANTS {
            for c in [1.0f32, -1.0, 0.37, -1234.5] {
                let bytes = encode(kind, &[c; QK_K]);
                let mut back = Vec::new();
                dequantize_row(kind, &bytes, &mut back);
                for &v in &back {
                    assert!((v - c).abs() <= c.abs() * 2e-3, "{}: {c} came back {v}", kind.name());
                }
            }
        }
    }
}
