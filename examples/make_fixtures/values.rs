//! The seeded randomness every value comes from, and the fp8 e4m3fn codec of the fp8 bases.

use anyhow::{ensure, Result};
use escha_convert::rng::SplitMix64;
use half::{bf16, f16};

// ------------------------------------------------------------------------------------------------
// Randomness

const MASTER_SEED: u64 = 0xE5C4_A0F1_7E5C_2026;

/// The crate's `SplitMix64`, seeded per tensor name.
pub struct Rng(SplitMix64);

impl Rng {
    pub fn for_name(name: &str) -> Self {
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

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.0.uniform()
    }

    /// Standard normal (Box-Muller, cosine branch only).
    fn normal(&mut self) -> f64 {
        let u1 = ((self.next_u64() >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    pub fn below(&mut self, n: usize) -> usize {
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
pub fn dual_normal(name: &str, n: usize, mean: f64, std: f64) -> Vec<f32> {
    let mut r = Rng::for_name(name);
    (0..n).map(|_| dual_exact(mean + std * r.normal())).collect()
}

/// A bf16 base weight `[out, in]`: Gaussian with per-row and per-column log-normal scales (like
/// real weights, so the channel scales of the encoding have something to fit).
pub fn base_linear(name: &str, out: usize, inp: usize, std: f64) -> Vec<f32> {
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

pub fn uniform_vec(name: &str, n: usize, lo: f64, hi: f64) -> Vec<f32> {
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

pub fn f8e4m3_decode(c: u8) -> f32 {
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
pub fn check_fp8() -> Result<()> {
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

/// Block-scaled fp8 of a stack of `[rows, cols]` matrices: codes, and `scale_inv`
/// `[ceil(rows/128), ceil(cols/128)]` per matrix with `w ≈ fp8 · scale_inv`.
pub fn fp8_blocks(w: &[f32], stack: usize, rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
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

#[cfg(test)]
mod tests {
    #[test]
    fn fp8_codec() {
        super::check_fp8().unwrap();
    }
}
