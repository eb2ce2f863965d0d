//! Streaming statistics: sums that merge across work units in a fixed order.

use std::ops::Range;

/// Element-wise comparison sums of a decoded tensor `x` against its base `y`.
#[derive(Clone, Copy, Debug, Default)]
pub struct PairSums {
    pub n: u64,
    sx: f64,
    sy: f64,
    sxx: f64,
    syy: f64,
    sxy: f64,
    sdd: f64,
}

impl PairSums {
    pub fn add(&mut self, x: f32, y: f32) {
        let (x, y) = (x as f64, y as f64);
        self.n += 1;
        self.sx += x;
        self.sy += y;
        self.sxx += x * x;
        self.syy += y * y;
        self.sxy += x * y;
        self.sdd += (x - y) * (x - y);
    }

    /// Adds every pair of `x` and `y` (equally long). Sums run in f32 lanes over short chunks,
    /// which vectorises, and each chunk's sums are carried on in f64, so the rounding error stays
    /// that of a few f32 additions.
    pub fn add_slices(&mut self, x: &[f32], y: &[f32]) {
        let mut unused = RowSums::default();
        dispatch::<_, false>(self, &mut unused, x, &y, &mut [], &[]);
    }

    /// Σy², the base's squared norm.
    pub fn syy(&self) -> f64 {
        self.syy
    }

    pub fn merge(&mut self, o: &PairSums) {
        self.n += o.n;
        self.sx += o.sx;
        self.sy += o.sy;
        self.sxx += o.sxx;
        self.syy += o.syy;
        self.sxy += o.sxy;
        self.sdd += o.sdd;
    }

    /// Pearson correlation.
    pub fn corr(&self) -> f64 {
        let n = self.n as f64;
        let cov = self.sxy - self.sx * self.sy / n;
        let vx = self.sxx - self.sx * self.sx / n;
        let vy = self.syy - self.sy * self.sy / n;
        cov / (vx * vy).sqrt()
    }

    pub fn cosine(&self) -> f64 {
        self.sxy / (self.sxx * self.syy).sqrt()
    }

    /// ‖x − y‖ / ‖y‖.
    pub fn rel_err(&self) -> f64 {
        (self.sdd / self.syy).sqrt()
    }
}

/// What a row of the base adds to its comparison besides [`PairSums`].
#[derive(Clone, Copy, Debug, Default)]
pub struct RowSums {
    pub pair: PairSums,
    /// `Σ y²·w`: the row's squared norm with a weight per column.
    pub weighted: f64,
    /// Whether any `y` was non-zero.
    pub nonzero: bool,
}

impl RowSums {
    /// Adds a piece of one row: the pairs of `x` and `y` to `pair` exactly as
    /// [`PairSums::add_slices`] adds them (so a row added in pieces that start at multiples of 64
    /// sums bit for bit as the whole row would), `y²` to `col_sq` and `y²·w` to `weighted`, in
    /// one pass. All four slices are equally long.
    pub fn add(&mut self, x: &[f32], y: &impl Values, col_sq: &mut [f32], w: &[f32]) {
        assert!(y.len() == x.len() && col_sq.len() == x.len() && w.len() == x.len(), "row piece lengths");
        let mut pair = self.pair;
        dispatch::<_, true>(&mut pair, self, x, y, col_sq, w);
        self.pair = pair;
    }
}

/// A run of base values, read eight at a time.
pub trait Values {
    fn len(&self) -> usize;
    /// Values `i .. i + 8`.
    fn eight(&self, i: usize) -> [f32; 8];
    fn at(&self, i: usize) -> f32;
    /// Values `i .. i + 8` in one vector. Only called from AVX2 code.
    #[cfg(target_arch = "x86_64")]
    unsafe fn eight_avx2(&self, i: usize) -> std::arch::x86_64::__m256;
}

impl Values for &[f32] {
    #[inline(always)]
    fn len(&self) -> usize {
        <[f32]>::len(self)
    }

    #[inline(always)]
    fn eight(&self, i: usize) -> [f32; 8] {
        self[i..i + 8].try_into().unwrap()
    }

    #[inline(always)]
    fn at(&self, i: usize) -> f32 {
        self[i]
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn eight_avx2(&self, i: usize) -> std::arch::x86_64::__m256 {
        assert!(i + 8 <= <[f32]>::len(self));
        // SAFETY: in bounds; AVX is there (the caller's contract).
        unsafe { std::arch::x86_64::_mm256_loadu_ps(self.as_ptr().add(i)) }
    }
}

/// Stored little-endian bf16 values, widened as they are read (exact: the bits move up by 16).
pub struct Bf16Bytes<'a>(pub &'a [u8]);

impl Values for Bf16Bytes<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.len() / 2
    }

    #[inline(always)]
    fn eight(&self, i: usize) -> [f32; 8] {
        std::array::from_fn(|j| self.at(i + j))
    }

    #[inline(always)]
    fn at(&self, i: usize) -> f32 {
        f32::from_bits(u32::from(u16::from_le_bytes([self.0[2 * i], self.0[2 * i + 1]])) << 16)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn eight_avx2(&self, i: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{_mm256_castsi256_ps, _mm256_cvtepu16_epi32, _mm256_slli_epi32, _mm_loadu_si128};
        assert!(2 * i + 16 <= self.0.len());
        // SAFETY: in bounds; AVX2 is there (the caller's contract).
        unsafe {
            let halves = _mm_loadu_si128(self.0.as_ptr().add(2 * i).cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(halves)))
        }
    }
}

const LANES: usize = 8;
/// Values per chunk: each f32 lane sums at most eight before the chunk is carried on in f64.
const CHUNK: usize = 8 * LANES;

/// [`accumulate`] with AVX2 where the CPU has it. There is no FMA and the order of operations is
/// the same on both paths, so the sums are the same bit for bit.
#[inline(always)]
fn dispatch<Y: Values, const ROW: bool>(
    pair: &mut PairSums,
    row: &mut RowSums,
    x: &[f32],
    y: &Y,
    col_sq: &mut [f32],
    w: &[f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::has_avx2() {
        // SAFETY: the feature was detected.
        unsafe { accumulate_avx2::<Y, ROW>(pair, row, x, y, col_sq, w) };
        return;
    }
    accumulate::<Y, ROW, false>(pair, row, x, y, col_sq, w);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn accumulate_avx2<Y: Values, const ROW: bool>(
    pair: &mut PairSums,
    row: &mut RowSums,
    x: &[f32],
    y: &Y,
    col_sq: &mut [f32],
    w: &[f32],
) {
    accumulate::<Y, ROW, true>(pair, row, x, y, col_sq, w);
}

/// The pair sums of `x` and `y` over chunks of 64, each in eight f32 lanes carried on in f64, the
/// few values past the last full group of a chunk in f64; with `ROW`, also the column squares,
/// the weighted norm and the non-zero flag of [`RowSums`].
#[inline(always)]
fn accumulate<Y: Values, const ROW: bool, const AVX2: bool>(
    pair: &mut PairSums,
    row: &mut RowSums,
    x: &[f32],
    y: &Y,
    col_sq: &mut [f32],
    w: &[f32],
) {
    debug_assert_eq!(x.len(), y.len());
    for start in (0..x.len()).step_by(CHUNK) {
        let len = CHUNK.min(x.len() - start);
        let full = start..start + len - len % LANES;
        #[cfg(target_arch = "x86_64")]
        let (t, nonzero) = if AVX2 {
            // SAFETY: only `accumulate_avx2` passes AVX2.
            unsafe { lanes_avx2::<Y, ROW>(x, y, col_sq, w, full.clone()) }
        } else {
            lanes::<Y, ROW>(x, y, col_sq, w, full.clone())
        };
        #[cfg(not(target_arch = "x86_64"))]
        let (t, nonzero) = lanes::<Y, ROW>(x, y, col_sq, w, full.clone());
        pair.sx += t[0];
        pair.sy += t[1];
        pair.sxx += t[2];
        pair.syy += t[3];
        pair.sxy += t[4];
        pair.sdd += t[5];
        pair.n += full.len() as u64;
        if ROW {
            row.weighted += t[6];
            row.nonzero |= nonzero;
        }
        for i in full.end..start + len {
            let (u, v) = (x[i], y.at(i));
            pair.add(u, v);
            if ROW {
                col_sq[i] += v * v;
                row.weighted += (v as f64) * (v as f64) * w[i] as f64;
                row.nonzero |= v != 0.0;
            }
        }
    }
}

/// The sums over the groups of eight in `groups` of x, y, x², y², xy, (x−y)² and, with `ROW`,
/// y²·w: each in eight f32 lanes, then the lanes added in order in f64. With `ROW` it also adds
/// y² to `col_sq` and says whether any y was non-zero.
#[inline(always)]
fn lanes<Y: Values, const ROW: bool>(
    x: &[f32],
    y: &Y,
    col_sq: &mut [f32],
    w: &[f32],
    groups: Range<usize>,
) -> ([f64; 7], bool) {
    let mut acc = [[0f32; LANES]; 7];
    let mut nonzero = false;
    for o in groups.step_by(LANES) {
        let a: &[f32; LANES] = x[o..o + LANES].try_into().unwrap();
        let b = y.eight(o);
        for i in 0..LANES {
            let (u, v) = (a[i], b[i]);
            let d = u - v;
            let vv = v * v;
            acc[0][i] += u;
            acc[1][i] += v;
            acc[2][i] += u * u;
            acc[3][i] += vv;
            acc[4][i] += u * v;
            acc[5][i] += d * d;
            if ROW {
                col_sq[o + i] += vv;
                acc[6][i] += vv * w[o + i];
                nonzero |= v != 0.0;
            }
        }
    }
    (acc.map(|lanes| lanes.iter().map(|&v| v as f64).sum::<f64>()), nonzero)
}

/// [`lanes`] in AVX2 registers: the same operations in the same order. The lanes of the seven
/// sums are transposed so that their f64 additions, still lane 0 to 7 (after −0.0, as `Sum`
/// starts) for each sum, run side by side.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn lanes_avx2<Y: Values, const ROW: bool>(
    x: &[f32],
    y: &Y,
    col_sq: &mut [f32],
    w: &[f32],
    groups: Range<usize>,
) -> ([f64; 7], bool) {
    #[allow(clippy::wildcard_imports)] // the intrinsics
    use std::arch::x86_64::*;
    assert!(groups.end <= x.len() && (!ROW || (groups.end <= col_sq.len() && groups.end <= w.len())));
    // SAFETY: every access is within `groups`, checked above; AVX2 is there (the caller's
    // contract).
    unsafe {
        let mut s: [__m256; 8] = [_mm256_setzero_ps(); 8];
        let mut nonzero = _mm256_setzero_ps();
        for o in groups.step_by(LANES) {
            let u = _mm256_loadu_ps(x.as_ptr().add(o));
            let v = y.eight_avx2(o);
            let d = _mm256_sub_ps(u, v);
            let vv = _mm256_mul_ps(v, v);
            s[0] = _mm256_add_ps(s[0], u);
            s[1] = _mm256_add_ps(s[1], v);
            s[2] = _mm256_add_ps(s[2], _mm256_mul_ps(u, u));
            s[3] = _mm256_add_ps(s[3], vv);
            s[4] = _mm256_add_ps(s[4], _mm256_mul_ps(u, v));
            s[5] = _mm256_add_ps(s[5], _mm256_mul_ps(d, d));
            if ROW {
                let c = col_sq.as_mut_ptr().add(o);
                _mm256_storeu_ps(c, _mm256_add_ps(_mm256_loadu_ps(c), vv));
                s[6] = _mm256_add_ps(s[6], _mm256_mul_ps(vv, _mm256_loadu_ps(w.as_ptr().add(o))));
                nonzero = _mm256_or_ps(nonzero, _mm256_cmp_ps::<_CMP_NEQ_UQ>(v, _mm256_setzero_ps()));
            }
        }
        // Lane j of sums 0–3 is half j / 4 of a[j % 4], of sums 4–7 half j / 4 of b[j % 4].
        let a = transpose4(s[0], s[1], s[2], s[3]);
        let b = transpose4(s[4], s[5], s[6], s[7]);
        let (mut lo, mut hi) = (_mm256_set1_pd(-0.0), _mm256_set1_pd(-0.0));
        for m in 0..4 {
            lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(a[m])));
            hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_castps256_ps128(b[m])));
        }
        for m in 0..4 {
            lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(a[m])));
            hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(b[m])));
        }
        let mut t64 = [0f64; 8];
        _mm256_storeu_pd(t64.as_mut_ptr(), lo);
        _mm256_storeu_pd(t64.as_mut_ptr().add(4), hi);
        (t64[..7].try_into().unwrap(), _mm256_movemask_ps(nonzero) != 0)
    }
}

/// Per 128-bit half, the 4×4 transpose of four vectors: half h of result m holds lane `4h + m` of
/// `a`, `b`, `c`, `d`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose4(
    a: std::arch::x86_64::__m256,
    b: std::arch::x86_64::__m256,
    c: std::arch::x86_64::__m256,
    d: std::arch::x86_64::__m256,
) -> [std::arch::x86_64::__m256; 4] {
    use std::arch::x86_64::{_mm256_shuffle_ps, _mm256_unpackhi_ps, _mm256_unpacklo_ps};
    // SAFETY: AVX is there (the caller's contract).
    unsafe {
        let (t0, t1) = (_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
        let (t2, t3) = (_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
        [
            _mm256_shuffle_ps::<0x44>(t0, t2),
            _mm256_shuffle_ps::<0xEE>(t0, t2),
            _mm256_shuffle_ps::<0x44>(t1, t3),
            _mm256_shuffle_ps::<0xEE>(t1, t3),
        ]
    }
}

/// Pearson correlation of two equally long series.
pub fn correlation(a: &[f64], b: &[f64]) -> f64 {
    let mut s = PairSums::default();
    for (&x, &y) in a.iter().zip(b) {
        s.add(x as f32, y as f32);
    }
    s.corr()
}

/// A finite number for JSON (NaN and infinities become null).
pub fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every running sum's bits: two accumulations agree only if these are equal.
    fn sum_bits(p: &PairSums) -> [u64; 6] {
        [p.sx, p.sy, p.sxx, p.syy, p.sxy, p.sdd].map(f64::to_bits)
    }

    #[test]
    fn blocked_sums_agree_with_one_at_a_time() {
        let x: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 997) as f32 / 500.0 - 1.0).collect();
        let y: Vec<f32> = x.iter().enumerate().map(|(i, v)| v * 0.9 + ((i % 13) as f32 - 6.0) * 0.01).collect();
        let (mut a, mut b) = (PairSums::default(), PairSums::default());
        x.iter().zip(&y).for_each(|(&u, &v)| a.add(u, v));
        b.add_slices(&x, &y);
        assert_eq!(a.n, b.n);
        for (p, q) in [(a.corr(), b.corr()), (a.cosine(), b.cosine()), (a.rel_err(), b.rel_err())] {
            assert!((p - q).abs() < 1e-6, "{p} vs {q}");
        }
    }

    #[test]
    fn a_row_in_pieces_sums_as_add_slices_and_reads_bf16() {
        let x: Vec<f32> = (0..300).map(|i| ((i * 7919) % 997) as f32 / 500.0 - 1.0).collect();
        let y: Vec<f32> =
            x.iter().enumerate().map(|(i, v)| half::bf16::from_f32(v * 0.9 + (i % 5) as f32 * 0.01).to_f32()).collect();
        let w: Vec<f32> = (0..300).map(|i| 1.0 + (i % 3) as f32).collect();
        let bytes: Vec<u8> = y.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect();
        let mut whole = PairSums::default();
        whole.add_slices(&x, &y);
        let (mut row, mut col_sq) = (RowSums::default(), vec![0f32; 300]);
        for c0 in (0..300).step_by(128) {
            let c1 = (c0 + 128).min(300);
            row.add(&x[c0..c1], &Bf16Bytes(&bytes[2 * c0..2 * c1]), &mut col_sq[c0..c1], &w[c0..c1]);
        }
        assert_eq!(sum_bits(&whole), sum_bits(&row.pair));
        assert_eq!(whole.n, row.pair.n);
        assert!(row.nonzero);
        let want: f64 = y.iter().zip(&w).map(|(&v, &w)| (v as f64).powi(2) * w as f64).sum();
        assert!((row.weighted - want).abs() < 1e-6 * want);
        for (c, &v) in col_sq.iter().zip(&y) {
            assert_eq!(*c, v * v);
        }

        // The portable lanes give the same bits as the dispatched (AVX2) ones.
        let (mut p, mut r, mut c) = (PairSums::default(), RowSums::default(), vec![0f32; 300]);
        accumulate::<_, true, false>(&mut p, &mut r, &x, &Bf16Bytes(&bytes), &mut c, &w);
        let (mut q, mut s, mut d) = (PairSums::default(), RowSums::default(), vec![0f32; 300]);
        dispatch::<_, true>(&mut q, &mut s, &x, &Bf16Bytes(&bytes), &mut d, &w);
        assert_eq!(sum_bits(&p), sum_bits(&q));
        assert_eq!(r.weighted.to_bits(), s.weighted.to_bits());
        assert_eq!(c, d);
        assert!(!RowSums::default().nonzero);
        let zeros = vec![0u8; 600];
        let mut z = RowSums::default();
        z.add(&x, &Bf16Bytes(&zeros), &mut vec![0f32; 300], &w);
        assert!(!z.nonzero && z.pair.syy() == 0.0);
    }
}
