//! Streaming statistics: sums that merge across work units in a fixed order.

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
        const LANES: usize = 8;
        const CHUNK: usize = 8 * LANES;
        debug_assert_eq!(x.len(), y.len());
        for (xc, yc) in x.chunks(CHUNK).zip(y.chunks(CHUNK)) {
            let mut acc = [[0f32; LANES]; 6];
            let (xs, ys) = (xc.chunks_exact(LANES), yc.chunks_exact(LANES));
            let (xr, yr) = (xs.remainder(), ys.remainder());
            for (a, b) in xs.zip(ys) {
                for i in 0..LANES {
                    let (u, v) = (a[i], b[i]);
                    let d = u - v;
                    acc[0][i] += u;
                    acc[1][i] += v;
                    acc[2][i] += u * u;
                    acc[3][i] += v * v;
                    acc[4][i] += u * v;
                    acc[5][i] += d * d;
                }
            }
            let sum = |lanes: &[f32; LANES]| lanes.iter().map(|&v| v as f64).sum::<f64>();
            self.sx += sum(&acc[0]);
            self.sy += sum(&acc[1]);
            self.sxx += sum(&acc[2]);
            self.syy += sum(&acc[3]);
            self.sxy += sum(&acc[4]);
            self.sdd += sum(&acc[5]);
            self.n += (xc.len() - xr.len()) as u64;
            for (&u, &v) in xr.iter().zip(yr) {
                self.add(u, v);
            }
        }
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

/// Σv² in f32 lanes carried on in f64, as [`PairSums::add_slices`] does.
pub fn sum_squares(v: &[f32]) -> f64 {
    let mut total = 0f64;
    for chunk in v.chunks(64) {
        let mut lanes = [0f32; 8];
        let parts = chunk.chunks_exact(8);
        let rest = parts.remainder();
        for c in parts {
            for i in 0..8 {
                lanes[i] += c[i] * c[i];
            }
        }
        total += lanes.iter().map(|&x| x as f64).sum::<f64>() + rest.iter().map(|&x| (x as f64).powi(2)).sum::<f64>();
    }
    total
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
        assert!((sum_squares(&y) - a.syy).abs() < 1e-6 * a.syy);
    }
}
