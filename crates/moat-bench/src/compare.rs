//! `moat bench compare BASE.json CANDIDATE.json`: a verdict per metric.
//!
//! For each (load, variant, metric) present in both reports, the difference
//! `candidate − baseline` gets a Welch t-interval over the repetitions, and:
//!
//! - **regressed** / **improved**: the interval excludes 0 and the point estimate
//!   moved by more than the threshold (relative to the baseline mean), in the bad
//!   or good direction;
//! - **same**: the interval excludes 0 but the change is within the threshold, or
//!   the interval includes 0 and lies within ±threshold;
//! - **unstable**: the interval includes 0 but is wider than ±threshold (the runs
//!   are too noisy to tell), or there are fewer than 2 repetitions and the change
//!   exceeds the threshold.

use serde::Serialize;

use crate::report::{fmt_num, Metric, Report};
use crate::stats::{welch_interval, DiffInterval};

/// Verdict for one metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Better beyond the threshold, significantly.
    Improved,
    /// Worse beyond the threshold, significantly.
    Regressed,
    /// No change beyond the threshold.
    Same,
    /// Too noisy to tell.
    Unstable,
}

impl Verdict {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Improved => "improved",
            Verdict::Regressed => "regressed",
            Verdict::Same => "same",
            Verdict::Unstable => "unstable",
        }
    }
}

/// Judges a difference interval. `threshold` is relative (0.05 = 5%).
pub fn verdict(d: &DiffInterval, higher_is_better: bool, threshold: f64) -> Verdict {
    let better = |x: f64| if higher_is_better { x > 0.0 } else { x < 0.0 };
    if d.base_mean == 0.0 {
        // No relative scale: significance alone decides.
        if d.diff == 0.0 {
            return Verdict::Same;
        }
        return match (d.low, d.high) {
            (Some(l), Some(h)) if l > 0.0 || h < 0.0 => {
                if better(d.diff) {
                    Verdict::Improved
                } else {
                    Verdict::Regressed
                }
            }
            _ => Verdict::Unstable,
        };
    }
    let rel = d.diff / d.base_mean.abs();
    let Some((lo, hi)) = d.relative_bounds() else {
        return if rel.abs() <= threshold {
            Verdict::Same
        } else {
            Verdict::Unstable
        };
    };
    if lo > 0.0 || hi < 0.0 {
        if rel.abs() <= threshold {
            Verdict::Same
        } else if better(rel) {
            Verdict::Improved
        } else {
            Verdict::Regressed
        }
    } else if lo >= -threshold && hi <= threshold {
        Verdict::Same
    } else {
        Verdict::Unstable
    }
}

/// One line of a comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    /// Load.
    pub load: String,
    /// Variant.
    pub variant: String,
    /// Metric.
    pub metric: Metric,
    /// Interval of candidate − baseline.
    pub diff: DiffInterval,
    /// Verdict.
    pub verdict: Verdict,
}

/// Compares every metric of every cell present in both reports.
pub fn compare(base: &Report, cand: &Report, threshold: f64) -> Vec<Line> {
    let confidence = base.confidence.min(cand.confidence);
    let mut out = Vec::new();
    for c in &cand.cells {
        let Some(b) = base.cell(&c.load, &c.variant) else {
            continue;
        };
        for m in Metric::ALL {
            let Some(d) = welch_interval(&m.values(&b.runs), &m.values(&c.runs), confidence) else {
                continue;
            };
            out.push(Line {
                load: c.load.clone(),
                variant: c.variant.clone(),
                metric: m,
                verdict: verdict(&d, m.higher_is_better(), threshold),
                diff: d,
            });
        }
    }
    out
}

/// Parses `5%` or `0.05`.
pub fn parse_threshold(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let v = if let Some(p) = s.strip_suffix('%') {
        p.trim().parse::<f64>().map(|v| v / 100.0)
    } else {
        s.parse::<f64>()
    }
    .map_err(|_| format!("invalid threshold `{s}` (e.g. `5%` or `0.05`)"))?;
    if !(0.0..10.0).contains(&v) {
        return Err(format!("threshold `{s}` out of range"));
    }
    Ok(v)
}

/// Renders the comparison as Markdown.
pub fn markdown(lines: &[Line], threshold: f64) -> String {
    let mut o = String::from(
        "| load | variant | metric | baseline | candidate | change | interval | verdict |\n|---|---|---|---:|---:|---:|---|---|\n",
    );
    for l in lines {
        let rel = l
            .diff
            .relative()
            .map_or("–".to_string(), |r| format!("{:+.1}%", r * 100.0));
        let ci = match l.diff.relative_bounds() {
            Some((lo, hi)) => format!("[{:+.1}%, {:+.1}%]", lo * 100.0, hi * 100.0),
            None => "no CI".into(),
        };
        let mark = match l.verdict {
            Verdict::Regressed => "**regressed**",
            v => v.as_str(),
        };
        o.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            l.load,
            l.variant,
            l.metric.label(),
            fmt_num(l.diff.base_mean),
            fmt_num(l.diff.candidate_mean),
            rel,
            ci,
            mark
        ));
    }
    let regressed = lines
        .iter()
        .filter(|l| l.verdict == Verdict::Regressed)
        .count();
    o.push_str(&format!(
        "\n{} metric(s) compared, {} regressed beyond {:.1}%.\n",
        lines.len(),
        regressed,
        threshold * 100.0
    ));
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(base: &[f64], cand: &[f64]) -> DiffInterval {
        welch_interval(base, cand, 0.99).unwrap()
    }

    #[test]
    fn verdicts_of_known_inputs() {
        let base = [100.0, 101.0, 99.0, 100.0, 100.0];
        // Latency up 20%, tight: regressed. Down 20%: improved.
        assert_eq!(
            verdict(&d(&base, &[120.0, 121.0, 119.0, 120.0, 120.0]), false, 0.05),
            Verdict::Regressed
        );
        assert_eq!(
            verdict(&d(&base, &[80.0, 81.0, 79.0, 80.0, 80.0]), false, 0.05),
            Verdict::Improved
        );
        // Throughput: higher is better.
        assert_eq!(
            verdict(&d(&base, &[120.0, 121.0, 119.0, 120.0, 120.0]), true, 0.05),
            Verdict::Improved
        );
        // Significant but +2% < 5%: same.
        assert_eq!(
            verdict(&d(&base, &[102.0, 102.1, 101.9, 102.0, 102.0]), false, 0.05),
            Verdict::Same
        );
        // Indistinguishable and tight: same.
        assert_eq!(
            verdict(&d(&base, &[100.5, 99.5, 100.0, 101.0, 99.0]), false, 0.05),
            Verdict::Same
        );
        // Wildly noisy: unstable.
        assert_eq!(
            verdict(&d(&base, &[60.0, 150.0, 90.0, 140.0, 70.0]), false, 0.05),
            Verdict::Unstable
        );
        // One repetition: no interval.
        assert_eq!(
            verdict(&d(&[100.0], &[130.0]), false, 0.05),
            Verdict::Unstable
        );
        assert_eq!(verdict(&d(&[100.0], &[101.0]), false, 0.05), Verdict::Same);
        // Zero baseline (errors): significance decides.
        assert_eq!(
            verdict(&d(&[0.0, 0.0, 0.0], &[5.0, 5.0, 5.0]), false, 0.05),
            Verdict::Regressed
        );
        assert_eq!(
            verdict(&d(&[0.0, 0.0, 0.0], &[0.0, 0.0, 0.0]), false, 0.05),
            Verdict::Same
        );
    }

    #[test]
    fn thresholds_parse() {
        assert_eq!(parse_threshold("5%").unwrap(), 0.05);
        assert_eq!(parse_threshold("0.1").unwrap(), 0.1);
        assert!(parse_threshold("five").is_err());
        assert!(parse_threshold("-1%").is_err());
    }
}
