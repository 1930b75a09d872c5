//! Statistics: latency summaries from HdrHistogram, means and variances over
//! repetitions, Welch t-intervals for differences, and Student's t quantiles.
//!
//! The confidence interval of a difference `candidate - base` over repeated runs
//! is Welch's t-interval: `d ± t(1-α/2, ν) · sqrt(s_b²/n_b + s_c²/n_c)` with the
//! Welch–Satterthwaite degrees of freedom `ν`. It does not assume equal variances,
//! which matters because a gateway variant is usually noisier than the direct run.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Highest latency a histogram can record: 10 minutes in nanoseconds. Larger values are clamped.
pub const MAX_LATENCY_NS: u64 = 600_000_000_000;

/// A new latency histogram in nanoseconds with 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    match Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3) {
        Ok(h) => h,
        Err(e) => unreachable!("constant histogram bounds rejected: {e}"),
    }
}

/// Records `ns` into `h`, clamping to the histogram's range.
pub fn record_ns(h: &mut Histogram<u64>, ns: u64) {
    let v = ns.clamp(1, MAX_LATENCY_NS);
    // Within bounds by construction; saturate silently if the histogram disagrees.
    let _ = h.record(v);
}

/// Latency summary of one run, in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencySummary {
    /// Number of recorded samples.
    pub count: u64,
    /// Mean latency.
    pub mean_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 95th percentile.
    pub p95_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Maximum.
    pub max_us: f64,
}

impl LatencySummary {
    /// Summarizes a nanosecond histogram.
    pub fn from_histogram(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return LatencySummary::default();
        }
        let us = |ns: u64| ns as f64 / 1_000.0;
        LatencySummary {
            count: h.len(),
            mean_us: h.mean() / 1_000.0,
            p50_us: us(h.value_at_quantile(0.50)),
            p90_us: us(h.value_at_quantile(0.90)),
            p95_us: us(h.value_at_quantile(0.95)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// A percentile curve (for charts): `(percentile, latency µs)` pairs at fixed percentiles.
pub fn percentile_curve(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    const POINTS: [f64; 14] = [
        0.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.995, 99.999, 100.0,
    ];
    if h.is_empty() {
        return Vec::new();
    }
    POINTS
        .iter()
        .map(|&p| (p, h.value_at_percentile(p) as f64 / 1_000.0))
        .collect()
}

/// Mean and unbiased sample variance. `None` for an empty slice; variance is
/// `None` with fewer than two samples.
pub fn mean_var(xs: &[f64]) -> Option<(f64, Option<f64>)> {
    if xs.is_empty() {
        return None;
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return Some((mean, None));
    }
    let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    Some((mean, Some(var)))
}

/// A confidence interval of a difference `candidate - base`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct DiffInterval {
    /// Mean of the base samples.
    pub base_mean: f64,
    /// Mean of the candidate samples.
    pub candidate_mean: f64,
    /// Point estimate `candidate_mean - base_mean`.
    pub diff: f64,
    /// Lower bound (`None` when there are too few repetitions for an interval).
    pub low: Option<f64>,
    /// Upper bound.
    pub high: Option<f64>,
    /// Confidence level, e.g. 0.99.
    pub confidence: f64,
}

impl DiffInterval {
    /// The point estimate relative to the base mean (`0.05` = +5%); `None` when the base is 0.
    pub fn relative(&self) -> Option<f64> {
        (self.base_mean != 0.0).then(|| self.diff / self.base_mean.abs())
    }
    /// The interval bounds relative to the base mean.
    pub fn relative_bounds(&self) -> Option<(f64, f64)> {
        let (l, h) = (self.low?, self.high?);
        (self.base_mean != 0.0).then(|| (l / self.base_mean.abs(), h / self.base_mean.abs()))
    }
}

/// Welch's t-interval for `mean(candidate) - mean(base)` at `confidence` (e.g. 0.99).
/// Returns `None` when either side is empty; the bounds are `None` when either side
/// has fewer than two samples.
pub fn welch_interval(base: &[f64], candidate: &[f64], confidence: f64) -> Option<DiffInterval> {
    let (mb, vb) = mean_var(base)?;
    let (mc, vc) = mean_var(candidate)?;
    let diff = mc - mb;
    let mut out = DiffInterval {
        base_mean: mb,
        candidate_mean: mc,
        diff,
        low: None,
        high: None,
        confidence,
    };
    if let (Some(vb), Some(vc)) = (vb, vc) {
        let (nb, nc) = (base.len() as f64, candidate.len() as f64);
        let (qb, qc) = (vb / nb, vc / nc);
        let se2 = qb + qc;
        if se2 == 0.0 {
            out.low = Some(diff);
            out.high = Some(diff);
        } else {
            let df = se2 * se2 / (qb * qb / (nb - 1.0) + qc * qc / (nc - 1.0));
            let t = student_t_quantile(1.0 - (1.0 - confidence) / 2.0, df);
            let half = t * se2.sqrt();
            out.low = Some(diff - half);
            out.high = Some(diff + half);
        }
    }
    Some(out)
}

/// Quantile `p` (0 < p < 1) of Student's t distribution with `df` degrees of freedom.
pub fn student_t_quantile(p: f64, df: f64) -> f64 {
    if !(0.0..=1.0).contains(&p) || df.is_nan() || df <= 0.0 {
        return f64::NAN;
    }
    if p == 0.5 {
        return 0.0;
    }
    if p < 0.5 {
        return -student_t_quantile(1.0 - p, df);
    }
    // Bisection on the CDF: monotone, robust, and fast enough for report generation.
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while student_t_cdf(hi, df) < p {
        hi *= 2.0;
        if hi > 1e12 {
            return f64::INFINITY;
        }
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if student_t_cdf(mid, df) < p {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo < 1e-12 * hi.max(1.0) {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// CDF of Student's t distribution.
pub fn student_t_cdf(t: f64, df: f64) -> f64 {
    let x = df / (df + t * t);
    let tail = 0.5 * incomplete_beta(0.5 * df, 0.5, x);
    if t >= 0.0 {
        1.0 - tail
    } else {
        tail
    }
}

fn ln_gamma(x: f64) -> f64 {
    // Lanczos approximation (g = 7, n = 9).
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + G + 0.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Regularized incomplete beta function I_x(a, b).
fn incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    let front = ln_front.exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_cf(a, b, x) / a
    } else {
        1.0 - front * beta_cf(b, a, 1.0 - x) / b
    }
}

/// Continued fraction for the incomplete beta function (modified Lentz).
fn beta_cf(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..=300 {
        let m = m as f64;
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < 3e-16 {
            break;
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn t_quantiles_match_tables() {
        // Two-sided 99% critical values from standard t tables.
        for (df, want) in [
            (1.0, 63.657),
            (2.0, 9.925),
            (4.0, 4.604),
            (5.0, 4.032),
            (10.0, 3.169),
            (30.0, 2.750),
            (1e6, 2.576),
        ] {
            let got = student_t_quantile(0.995, df);
            assert!(close(got, want, 0.002), "df={df}: {got} vs {want}");
        }
        assert!(close(student_t_quantile(0.975, 9.0), 2.262, 0.001));
        assert!(close(student_t_quantile(0.025, 9.0), -2.262, 0.001));
        assert_eq!(student_t_quantile(0.5, 3.0), 0.0);
    }

    #[test]
    fn mean_and_variance() {
        let (m, v) = mean_var(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        assert!(close(m, 5.0, 1e-12));
        assert!(close(v.unwrap(), 32.0 / 7.0, 1e-12));
        assert_eq!(mean_var(&[3.0]), Some((3.0, None)));
        assert_eq!(mean_var(&[]), None);
    }

    #[test]
    fn welch_interval_known_values() {
        // base: mean 10, var 0.5 (n=5); candidate: mean 12, var 2 (n=5).
        let base = [9.0, 10.0, 11.0, 10.0, 10.0];
        let (mb, vb) = mean_var(&base).unwrap();
        let cand = [10.0, 12.0, 14.0, 12.0, 12.0];
        let (mc, vc) = mean_var(&cand).unwrap();
        let ci = welch_interval(&base, &cand, 0.99).unwrap();
        let (qb, qc) = (vb.unwrap() / 5.0, vc.unwrap() / 5.0);
        let df = (qb + qc).powi(2) / (qb * qb / 4.0 + qc * qc / 4.0);
        let half = student_t_quantile(0.995, df) * (qb + qc).sqrt();
        assert!(close(ci.diff, mc - mb, 1e-12));
        assert!(close(ci.low.unwrap(), 2.0 - half, 1e-9));
        assert!(close(ci.high.unwrap(), 2.0 + half, 1e-9));
        // Hand-computed: vb = 0.5, vc = 2.0, se² = 0.5, df = 0.25/(0.01/4+0.16/4) = 5.882
        assert!(close(df, 5.882_352_9, 1e-6));
        assert!(ci.low.unwrap() < 0.0 && ci.high.unwrap() > 0.0, "{ci:?}");
    }

    #[test]
    fn welch_interval_without_repetitions_has_no_bounds() {
        let ci = welch_interval(&[1.0], &[2.0, 3.0], 0.99).unwrap();
        assert_eq!(ci.diff, 1.5);
        assert!(ci.low.is_none() && ci.high.is_none());
        assert!(welch_interval(&[], &[1.0], 0.99).is_none());
        // Identical constant samples: a zero-width interval.
        let ci = welch_interval(&[5.0, 5.0], &[6.0, 6.0], 0.99).unwrap();
        assert_eq!((ci.low, ci.high), (Some(1.0), Some(1.0)));
    }

    #[test]
    fn histogram_percentiles_of_known_inputs() {
        let mut h = new_histogram();
        for us in 1..=1000u64 {
            record_ns(&mut h, us * 1_000);
        }
        let s = LatencySummary::from_histogram(&h);
        assert_eq!(s.count, 1000);
        // 3 significant digits: values are exact to within 0.1%.
        assert!(close(s.p50_us, 500.0, 0.5), "{s:?}");
        assert!(close(s.p90_us, 900.0, 0.9), "{s:?}");
        assert!(close(s.p99_us, 990.0, 1.0), "{s:?}");
        assert!(close(s.p999_us, 999.0, 1.0), "{s:?}");
        assert!(close(s.max_us, 1000.0, 1.0), "{s:?}");
        assert!(close(s.mean_us, 500.5, 0.5), "{s:?}");
        let curve = percentile_curve(&h);
        assert_eq!(curve.first().map(|p| p.0), Some(0.0));
        assert!(curve.windows(2).all(|w| w[0].1 <= w[1].1));
    }

    #[test]
    fn out_of_range_values_are_clamped() {
        let mut h = new_histogram();
        record_ns(&mut h, 0);
        record_ns(&mut h, u64::MAX);
        assert_eq!(h.len(), 2);
        assert!(h.max() >= MAX_LATENCY_NS / 2);
    }
}
