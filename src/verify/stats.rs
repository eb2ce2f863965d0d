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
