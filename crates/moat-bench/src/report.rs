//! The report model (serialized as JSON) and its Markdown and HTML renderings.

use serde::{Deserialize, Serialize};

use crate::loadgen::ErrorCounts;
use crate::scenario::Cpus;
use crate::stats::{welch_interval, DiffInterval, LatencySummary};

/// Version of the JSON layout.
pub const SCHEMA_VERSION: u32 = 1;

/// A whole benchmark run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// JSON layout version.
    pub schema_version: u32,
    /// Scenario name.
    pub scenario: String,
    /// Scenario description.
    pub description: String,
    /// The command line that produced this report.
    pub command: String,
    /// Start time, seconds since the Unix epoch.
    pub started_unix: u64,
    /// Machine facts.
    pub machine: Machine,
    /// Repetitions per cell.
    pub repetitions: u32,
    /// Confidence level of intervals.
    pub confidence: f64,
    /// CPU pinning.
    pub cpus: Cpus,
    /// Loads, in order.
    pub loads: Vec<LoadInfo>,
    /// Variants, in order.
    pub variants: Vec<VariantInfo>,
    /// One cell per (load, variant).
    pub cells: Vec<Cell>,
}

/// Facts about the machine.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct Machine {
    /// CPUs available.
    pub cpus: usize,
    /// CPU model name.
    pub cpu_model: String,
    /// Kernel release.
    pub kernel: String,
    /// `/proc/loadavg` at the start (other work on the machine adds noise).
    pub loadavg_start: String,
    /// `/proc/loadavg` at the end.
    pub loadavg_end: String,
}

impl Machine {
    /// Reads what it can from `/proc`.
    pub fn probe() -> Machine {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_default();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Machine {
            cpus: crate::sys::available_cpus(),
            cpu_model,
            kernel,
            loadavg_start: loadavg(),
            loadavg_end: String::new(),
        }
    }
}

/// Current `/proc/loadavg` (first three fields).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A load, as described in the report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LoadInfo {
    /// Name.
    pub name: String,
    /// Human description, e.g. `open loop 1000 req/s, 64 conns, http1, 10s (+2s warm-up)`.
    pub description: String,
    /// A new connection per request (the rate is then handshakes per second).
    #[serde(default)]
    pub handshakes: bool,
}

/// A variant, as described in the report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VariantInfo {
    /// Name.
    pub name: String,
    /// `direct`, `moat: engines ...` or `external URL`.
    pub description: String,
}

/// Measurements of one run (one repetition of one load against one variant).
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct RunMetrics {
    /// Responses per second in the measured window.
    pub rps: f64,
    /// Responses in the measured window.
    pub responses: u64,
    /// Errors by kind.
    pub errors: ErrorCounts,
    /// Latency summary.
    pub latency: LatencySummary,
    /// CPU milliseconds of the gateway process per 1,000 requests (warm-up included in both).
    pub cpu_ms_per_1k: Option<f64>,
    /// Peak RSS of the gateway process in KiB (VmHWM).
    pub peak_rss_kib: Option<u64>,
    /// Heap allocations of the gateway process per measured response (moat
    /// built with `--features alloc-stats`; `None` otherwise).
    #[serde(default)]
    pub allocs_per_req: Option<f64>,
    /// Bytes requested from the heap per measured response (same condition).
    #[serde(default)]
    pub alloc_bytes_per_req: Option<f64>,
}

/// A metric that can be compared across runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Requests per second.
    Rps,
    /// Median latency.
    P50,
    /// 90th percentile.
    P90,
    /// 99th percentile.
    P99,
    /// 99.9th percentile.
    P999,
    /// Maximum latency.
    Max,
    /// CPU ms per 1,000 requests.
    CpuPer1k,
    /// Peak RSS.
    PeakRss,
    /// Errors.
    Errors,
    /// Heap allocations per request.
    AllocsPerReq,
    /// Heap bytes allocated per request.
    AllocBytesPerReq,
}

impl Metric {
    /// Every metric, in report order.
    pub const ALL: [Metric; 11] = [
        Metric::Rps,
        Metric::P50,
        Metric::P90,
        Metric::P99,
        Metric::P999,
        Metric::Max,
        Metric::CpuPer1k,
        Metric::PeakRss,
        Metric::Errors,
        Metric::AllocsPerReq,
        Metric::AllocBytesPerReq,
    ];
    /// Label with unit.
    pub fn label(self) -> &'static str {
        match self {
            Metric::Rps => "req/s",
            Metric::P50 => "p50 µs",
            Metric::P90 => "p90 µs",
            Metric::P99 => "p99 µs",
            Metric::P999 => "p99.9 µs",
            Metric::Max => "max µs",
            Metric::CpuPer1k => "CPU ms/1k req",
            Metric::PeakRss => "peak RSS KiB",
            Metric::Errors => "errors",
            Metric::AllocsPerReq => "allocs/req",
            Metric::AllocBytesPerReq => "alloc B/req",
        }
    }
    /// Whether larger values are better.
    pub fn higher_is_better(self) -> bool {
        matches!(self, Metric::Rps)
    }
    /// The value of this metric in one run, if measured.
    pub fn value(self, r: &RunMetrics) -> Option<f64> {
        Some(match self {
            Metric::Rps => r.rps,
            Metric::P50 => r.latency.p50_us,
            Metric::P90 => r.latency.p90_us,
            Metric::P99 => r.latency.p99_us,
            Metric::P999 => r.latency.p999_us,
            Metric::Max => r.latency.max_us,
            Metric::CpuPer1k => r.cpu_ms_per_1k?,
            Metric::PeakRss => r.peak_rss_kib? as f64,
            Metric::Errors => r.errors.total() as f64,
            Metric::AllocsPerReq => r.allocs_per_req?,
            Metric::AllocBytesPerReq => r.alloc_bytes_per_req?,
        })
    }
    /// Values over runs (runs where it was not measured are skipped).
    pub fn values(self, runs: &[RunMetrics]) -> Vec<f64> {
        runs.iter().filter_map(|r| self.value(r)).collect()
    }
}

/// One (load, variant) cell.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cell {
    /// Load name.
    pub load: String,
    /// Variant name.
    pub variant: String,
    /// One entry per repetition.
    pub runs: Vec<RunMetrics>,
    /// Percentile curve of all repetitions merged: `(percentile, µs)`.
    pub curve: Vec<(f64, f64)>,
    /// Differences against baselines.
    pub comparisons: Vec<Comparison>,
    /// Why the cell has no (or incomplete) runs.
    #[serde(default)]
    pub failure: Option<String>,
}

/// Differences of a cell against a baseline variant of the same load.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    /// Baseline variant (`direct` or `proxy`).
    pub against: String,
    /// One interval per metric measured on both sides.
    pub metrics: Vec<(Metric, DiffInterval)>,
}

impl Cell {
    /// Mean of a metric over runs.
    pub fn mean(&self, m: Metric) -> Option<f64> {
        let v = m.values(&self.runs);
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
    /// The comparison against `against`, if computed.
    pub fn against(&self, against: &str, m: Metric) -> Option<&DiffInterval> {
        self.comparisons
            .iter()
            .find(|c| c.against == against)?
            .metrics
            .iter()
            .find(|(mm, _)| *mm == m)
            .map(|(_, d)| d)
    }
}

impl Report {
    /// Fills every cell's comparisons against `direct` and `proxy` of the same load.
    pub fn compute_comparisons(&mut self) {
        let snapshot = self.cells.clone();
        for cell in &mut self.cells {
            cell.comparisons.clear();
            for base in ["direct", "proxy"] {
                if cell.variant == base || cell.variant == "direct" {
                    continue;
                }
                let Some(b) = snapshot
                    .iter()
                    .find(|c| c.load == cell.load && c.variant == base)
                else {
                    continue;
                };
                let metrics: Vec<(Metric, DiffInterval)> = Metric::ALL
                    .into_iter()
                    .filter_map(|m| {
                        let d = welch_interval(
                            &m.values(&b.runs),
                            &m.values(&cell.runs),
                            self.confidence,
                        )?;
                        Some((m, d))
                    })
                    .collect();
                if !metrics.is_empty() {
                    cell.comparisons.push(Comparison {
                        against: base.to_string(),
                        metrics,
                    });
                }
            }
        }
    }

    /// The cell of (load, variant).
    pub fn cell(&self, load: &str, variant: &str) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.load == load && c.variant == variant)
    }
}

/// Formats a number with sensible precision.
pub fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 || (v == v.trunc() && a < 1e15) {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// `+12.3 [+10.1, +14.6]` (or `+12.3 (n<2)` without an interval).
pub fn fmt_diff(d: &DiffInterval) -> String {
    let s = |v: f64| {
        if v >= 0.0 {
            format!("+{}", fmt_num(v))
        } else {
            fmt_num(v)
        }
    };
    match (d.low, d.high) {
        (Some(l), Some(h)) => format!("{} [{}, {}]", s(d.diff), s(l), s(h)),
        _ => format!("{} (no CI)", s(d.diff)),
    }
}

/// Renders the report as Markdown.
pub fn markdown(r: &Report) -> String {
    let mut o = String::new();
    o.push_str(&format!("# moat bench: {}\n\n", r.scenario));
    if !r.description.is_empty() {
        o.push_str(&format!("{}\n\n", r.description.trim()));
    }
    o.push_str(&format!(
        "- command: `{}`\n- machine: {} CPUs, {}, kernel {}; load average {} at start, {} at end\n- pinning: load generator on CPU {}, upstream on CPU {}, moat on CPU {}\n- {} repetition(s) per cell; differences are candidate − baseline with a {:.0}% Welch t-interval over the repetitions\n\n",
        r.command,
        r.machine.cpus,
        r.machine.cpu_model,
        r.machine.kernel,
        r.machine.loadavg_start,
        r.machine.loadavg_end,
        r.cpus.load,
        r.cpus.upstream,
        r.cpus.moat,
        r.repetitions,
        r.confidence * 100.0
    ));
    for l in &r.loads {
        o.push_str(&format!("## {}: {}\n\n", l.name, l.description));
        let rate = if l.handshakes {
            "handshakes/s"
        } else {
            "req/s"
        };
        o.push_str(&format!("| variant | {rate} | errors | mean µs | p50 µs | p90 µs | p95 µs | p99 µs | p99.9 µs | max µs | CPU ms/1k req | peak RSS MiB | allocs/req | alloc KiB/req | p50 vs direct µs | p90 vs direct µs | p99 vs direct µs | p50 vs proxy µs | p99 vs proxy µs | {rate} vs proxy |\n"));
        o.push_str(
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|---|---|\n",
        );
        for v in &r.variants {
            let Some(c) = r.cell(&l.name, &v.name) else {
                continue;
            };
            let m = |x: Metric| c.mean(x).map_or("–".to_string(), fmt_num);
            let rss = c
                .mean(Metric::PeakRss)
                .map_or("–".to_string(), |k| format!("{:.1}", k / 1024.0));
            let d = |base: &str, x: Metric| c.against(base, x).map_or("–".into(), fmt_diff);
            o.push_str(&format!(
                "| {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                v.name,
                c.failure
                    .as_ref()
                    .map_or(String::new(), |f| format!(" (failed: {f})")),
                m(Metric::Rps),
                m(Metric::Errors),
                mean_of(c, |r| r.latency.mean_us),
                m(Metric::P50),
                m(Metric::P90),
                mean_of(c, |r| r.latency.p95_us),
                m(Metric::P99),
                m(Metric::P999),
                m(Metric::Max),
                m(Metric::CpuPer1k),
                rss,
                allocs(c),
                alloc_kib(c),
                d("direct", Metric::P50),
                d("direct", Metric::P90),
                d("direct", Metric::P99),
                d("proxy", Metric::P50),
                d("proxy", Metric::P99),
                d("proxy", Metric::Rps),
            ));
        }
        o.push('\n');
    }
    o.push_str("Variants:\n\n");
    for v in &r.variants {
        o.push_str(&format!("- `{}`: {}\n", v.name, v.description));
    }
    o
}

/// Allocations per request; `n/a` when not measured (direct, an external target,
/// or a moat binary built without `alloc-stats`).
fn allocs(c: &Cell) -> String {
    c.mean(Metric::AllocsPerReq)
        .map_or_else(|| na(c), |v| format!("{v:.1}"))
}

/// Heap KiB allocated per request, `n/a` as [`allocs`].
fn alloc_kib(c: &Cell) -> String {
    c.mean(Metric::AllocBytesPerReq)
        .map_or_else(|| na(c), |v| format!("{:.2}", v / 1024.0))
}

fn na(c: &Cell) -> String {
    if c.runs.is_empty() {
        "–".into()
    } else {
        "n/a".into()
    }
}

fn mean_of(c: &Cell, f: impl Fn(&RunMetrics) -> f64) -> String {
    if c.runs.is_empty() {
        return "–".into();
    }
    fmt_num(c.runs.iter().map(f).sum::<f64>() / c.runs.len() as f64)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

const COLORS: [&str; 10] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// An SVG latency-by-percentile chart: x is `-log10(1 - p)` (50%, 90%, 99%, ...), y is µs (log).
pub fn svg_chart(title: &str, series: &[(&str, &[(f64, f64)])]) -> String {
    let (w, h, ml, mr, mt, mb) = (720.0, 360.0, 70.0, 170.0, 30.0, 40.0);
    let pw = w - ml - mr;
    let ph = h - mt - mb;
    let xmax = 5.0f64; // 99.999%
    let xval = |p: f64| {
        let q = (1.0 - p / 100.0).max(1e-5);
        (-q.log10()).clamp(0.0, xmax)
    };
    let all: Vec<f64> = series
        .iter()
        .flat_map(|(_, pts)| pts.iter().map(|p| p.1))
        .filter(|v| *v > 0.0)
        .collect();
    let ymin = all
        .iter()
        .cloned()
        .fold(f64::INFINITY, f64::min)
        .clamp(1.0, 1e12);
    let ymax = all
        .iter()
        .cloned()
        .fold(0.0, f64::max)
        .clamp(ymin * 10.0, 1e13);
    let (ly0, ly1) = (ymin.log10().floor(), ymax.log10().ceil());
    let ypos = |v: f64| mt + ph - (v.max(ymin).log10() - ly0) / (ly1 - ly0) * ph;
    let xpos = |x: f64| ml + x / xmax * pw;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n<text x=\"{}\" y=\"18\" font-size=\"13\" font-weight=\"bold\">{}</text>\n",
        ml,
        esc(title)
    );
    s.push_str(&format!(
        "<rect x=\"{ml}\" y=\"{mt}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#999\"/>\n"
    ));
    for (i, lab) in ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"]
        .iter()
        .enumerate()
    {
        let x = xpos(i as f64);
        s.push_str(&format!("<line x1=\"{x}\" y1=\"{mt}\" x2=\"{x}\" y2=\"{}\" stroke=\"#eee\"/><text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{lab}</text>\n", mt + ph, mt + ph + 14.0));
    }
    let mut e = ly0;
    while e <= ly1 {
        let v = 10f64.powf(e);
        let y = ypos(v);
        let lab = if v >= 1000.0 {
            format!("{} ms", v / 1000.0)
        } else {
            format!("{v} µs")
        };
        s.push_str(&format!("<line x1=\"{ml}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{lab}</text>\n", ml + pw, ml - 4.0, y + 4.0));
        e += 1.0;
    }
    s.push_str(&format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">percentile</text>\n",
        ml + pw / 2.0,
        h - 4.0
    ));
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts
            .iter()
            .map(|(p, v)| format!("{:.1},{:.1}", xpos(xval(*p)), ypos(*v)))
            .collect();
        if !path.is_empty() {
            s.push_str(&format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"><title>{}</title></polyline>\n",
                path.join(" "),
                esc(name)
            ));
        }
        let ly = mt + 12.0 + i as f64 * 16.0;
        s.push_str(&format!("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"4\" fill=\"{color}\"/><text x=\"{}\" y=\"{}\">{}</text>\n", ml + pw + 10.0, ly - 4.0, ml + pw + 26.0, ly, esc(name)));
    }
    s.push_str("</svg>\n");
    s
}

/// Renders a self-contained HTML page: tables and one chart per load (all variants)
/// and one per variant (all loads).
pub fn html(r: &Report) -> String {
    let mut o = String::new();
    o.push_str(&format!("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>moat bench: {}</title>\n<style>body{{font-family:sans-serif;margin:2em;max-width:1400px}}table{{border-collapse:collapse;font-size:12px}}td,th{{border:1px solid #ccc;padding:3px 6px;text-align:right}}td:first-child,th:first-child{{text-align:left}}code{{background:#f4f4f4}}</style></head><body>\n", esc(&r.scenario)));
    o.push_str(&format!("<h1>moat bench: {}</h1>\n<p>{}</p>\n<p><code>{}</code><br>{} CPUs, {}, kernel {}; load average {} → {}; {} repetition(s); intervals are {:.0}% Welch t-intervals of candidate − baseline.</p>\n",
        esc(&r.scenario), esc(&r.description), esc(&r.command), r.machine.cpus, esc(&r.machine.cpu_model), esc(&r.machine.kernel), esc(&r.machine.loadavg_start), esc(&r.machine.loadavg_end), r.repetitions, r.confidence * 100.0));
    for l in &r.loads {
        o.push_str(&format!(
            "<h2>{}</h2><p>{}</p>\n<table><tr>",
            esc(&l.name),
            esc(&l.description)
        ));
        for h in [
            "variant",
            if l.handshakes {
                "handshakes/s"
            } else {
                "req/s"
            },
            "errors",
            "p50 µs",
            "p90 µs",
            "p99 µs",
            "p99.9 µs",
            "max µs",
            "CPU ms/1k",
            "RSS MiB",
            "allocs/req",
            "alloc KiB/req",
            "p50 vs direct",
            "p90 vs direct",
            "p99 vs direct",
            "p50 vs proxy",
            "p99 vs proxy",
        ] {
            o.push_str(&format!("<th>{h}</th>"));
        }
        o.push_str("</tr>\n");
        let mut series: Vec<(&str, &[(f64, f64)])> = Vec::new();
        for v in &r.variants {
            let Some(c) = r.cell(&l.name, &v.name) else {
                continue;
            };
            series.push((v.name.as_str(), &c.curve));
            let m = |x: Metric| c.mean(x).map_or("–".to_string(), fmt_num);
            let d = |b: &str, x: Metric| c.against(b, x).map_or("–".into(), fmt_diff);
            o.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                esc(&v.name),
                m(Metric::Rps),
                m(Metric::Errors),
                m(Metric::P50),
                m(Metric::P90),
                m(Metric::P99),
                m(Metric::P999),
                m(Metric::Max),
                m(Metric::CpuPer1k),
                c.mean(Metric::PeakRss).map_or("–".into(), |k| format!("{:.1}", k / 1024.0)),
                allocs(c),
                alloc_kib(c),
                esc(&d("direct", Metric::P50)),
                esc(&d("direct", Metric::P90)),
                esc(&d("direct", Metric::P99)),
                esc(&d("proxy", Metric::P50)),
                esc(&d("proxy", Metric::P99)),
            ));
        }
        o.push_str("</table>\n");
        o.push_str(&svg_chart(
            &format!("{}: latency by percentile", l.name),
            &series,
        ));
    }
    o.push_str("<h2>Per variant</h2>\n");
    for v in &r.variants {
        let series: Vec<(&str, &[(f64, f64)])> = r
            .loads
            .iter()
            .filter_map(|l| {
                r.cell(&l.name, &v.name)
                    .map(|c| (l.name.as_str(), &c.curve[..]))
            })
            .collect();
        o.push_str(&format!(
            "<h3>{}</h3><p>{}</p>\n",
            esc(&v.name),
            esc(&v.description)
        ));
        o.push_str(&svg_chart(&format!("{}: latency by load", v.name), &series));
    }
    o.push_str("</body></html>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn run(rps: f64, p50: f64, p99: f64) -> RunMetrics {
        RunMetrics {
            rps,
            responses: 1000,
            latency: LatencySummary {
                count: 1000,
                p50_us: p50,
                p99_us: p99,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn report() -> Report {
        let cell = |variant: &str, runs: Vec<RunMetrics>| Cell {
            load: "l".into(),
            variant: variant.into(),
            runs,
            curve: vec![(50.0, 100.0), (99.0, 300.0), (100.0, 1000.0)],
            comparisons: vec![],
            failure: None,
        };
        Report {
            schema_version: SCHEMA_VERSION,
            scenario: "s".into(),
            description: "d".into(),
            command: "moat bench run s.yaml".into(),
            started_unix: 0,
            machine: Machine::default(),
            repetitions: 3,
            confidence: 0.99,
            cpus: Cpus::default(),
            loads: vec![LoadInfo {
                name: "l".into(),
                description: "x".into(),
                handshakes: false,
            }],
            variants: ["direct", "proxy", "waf"]
                .iter()
                .map(|n| VariantInfo {
                    name: n.to_string(),
                    description: String::new(),
                })
                .collect(),
            cells: vec![
                cell(
                    "direct",
                    vec![
                        run(100.0, 50.0, 90.0),
                        run(102.0, 52.0, 92.0),
                        run(98.0, 48.0, 88.0),
                    ],
                ),
                cell(
                    "proxy",
                    vec![
                        run(90.0, 60.0, 100.0),
                        run(92.0, 62.0, 102.0),
                        run(88.0, 58.0, 98.0),
                    ],
                ),
                cell(
                    "waf",
                    vec![
                        run(80.0, 70.0, 120.0),
                        run(81.0, 71.0, 121.0),
                        run(79.0, 69.0, 119.0),
                    ],
                ),
            ],
        }
    }

    #[test]
    fn comparisons_against_direct_and_proxy() {
        let mut r = report();
        r.compute_comparisons();
        let waf = r.cell("l", "waf").unwrap();
        let d = waf.against("direct", Metric::P50).unwrap();
        assert!((d.diff - 20.0).abs() < 1e-9);
        assert!(d.low.unwrap() > 0.0, "{d:?}");
        let d = waf.against("proxy", Metric::Rps).unwrap();
        assert!((d.diff + 10.0).abs() < 1e-9);
        assert!(r.cell("l", "direct").unwrap().comparisons.is_empty());
        assert_eq!(r.cell("l", "proxy").unwrap().comparisons.len(), 1);
        // CPU was not measured: no interval for it.
        assert!(waf.against("proxy", Metric::CpuPer1k).is_none());
    }

    #[test]
    fn renders_markdown_html_and_json() {
        let mut r = report();
        for c in r.cells.iter_mut().filter(|c| c.variant == "waf") {
            for (i, run) in c.runs.iter_mut().enumerate() {
                run.allocs_per_req = Some(11.0 + i as f64);
                run.alloc_bytes_per_req = Some(2048.0);
            }
        }
        r.compute_comparisons();
        let md = markdown(&r);
        assert!(md.contains("| waf | 80 | 0 |"), "{md}");
        // Allocations: the mean where measured, n/a where not.
        let waf = md.lines().find(|l| l.starts_with("| waf |")).unwrap();
        assert!(waf.contains("| 12.0 | 2.00 |"), "{waf}");
        let proxy = md.lines().find(|l| l.starts_with("| proxy |")).unwrap();
        assert!(proxy.contains("| n/a | n/a |"), "{proxy}");
        assert!(md.contains("+20 ["), "{md}");
        // A chart with no data (every run of a variant failed) still renders.
        let empty = svg_chart("none", &[("a", &[])]);
        assert!(empty.contains("</svg>"));
        let page = html(&r);
        assert!(page.contains("<svg") && page.contains("<polyline"));
        assert!(page.contains("<td>12.0</td><td>2.00</td>"), "{page}");
        assert!(!page.contains("<script"));
        let json = serde_json::to_string(&r).unwrap();
        let back: Report = serde_json::from_str(&json).unwrap();
        assert_eq!(back.cells.len(), 3);
        // Reports written before allocations were measured still load.
        let old = json.replace("\"allocs_per_req\":null,", "");
        assert!(!old.contains("\"allocs_per_req\":null"));
        let back: Report = serde_json::from_str(&old).unwrap();
        assert_eq!(back.cells[0].runs[0].allocs_per_req, None);
    }
}
