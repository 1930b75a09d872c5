//! Charts as inline SVG, drawn on the server: bars and a time line. No chart library
//! (nothing to vendor, nothing to load); the live request rate of the overview is the
//! same polyline, redrawn by `console.js`.

use maud::{html, Markup};

/// Horizontal bars, one per `(label, value)`, scaled to the largest.
pub fn bars(id: &str, rows: &[(String, u64)]) -> Markup {
    let max = rows.iter().map(|(_, v)| *v).max().unwrap_or(0).max(1);
    let row_h = 22u64;
    let h = (rows.len() as u64 * row_h).max(row_h);
    // The label column fits the longest label (about 7 px a character at 11 px).
    let longest = rows
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0);
    let lw = (longest as u64 * 7 + 10).clamp(110, 320);
    let w = lw + 300;
    html! {
        svg.chart id=(id) viewBox={"0 0 " (w) " " (h)} width=(w) height=(h) role="img" {
            @if rows.is_empty() {
                text x="0" y="15" class="muted" { "nothing yet" }
            }
            @for (i, (label, v)) in rows.iter().enumerate() {
                @let y = i as u64 * row_h;
                @let bw = 1 + v * 240 / max;
                text x="0" y=(y + 15) { (label) }
                rect x=(lw) y=(y + 4) width=(bw) height="14" class="bar" {}
                text x=(lw + 5 + bw) y=(y + 15) { (v) }
            }
        }
    }
}

/// A column chart of counts over equal time slices (the events timeline).
pub fn columns(id: &str, counts: &[u64], first: &str, last: &str) -> Markup {
    let max = counts.iter().copied().max().unwrap_or(0).max(1);
    let n = counts.len().max(1) as u64;
    let w = 800 / n;
    html! {
        svg.chart.timeline id=(id) viewBox="0 0 800 110" width="800" height="110" role="img" {
            @for (i, c) in counts.iter().enumerate() {
                @let h = if *c == 0 { 0 } else { 1 + c * 80 / max };
                rect x=(i as u64 * w) y=(85 - h) width=(w.saturating_sub(1).max(1)) height=(h) class="bar" {
                    title { (c) }
                }
            }
            text x="0" y="104" class="muted" { (first) }
            text x="800" y="104" text-anchor="end" class="muted" { (last) }
            text x="0" y="10" class="muted" { "max " (max) }
        }
    }
}

/// An empty time line `console.js` fills (`data-series` names the series it plots).
pub fn live_line(id: &str, series: &str) -> Markup {
    html! {
        svg.chart.live id=(id) data-series=(series) viewBox="0 0 400 100" width="400" height="100" role="img" {
            polyline points="" class="line" {}
            text x="0" y="10" class="muted max" { "" }
        }
    }
}
