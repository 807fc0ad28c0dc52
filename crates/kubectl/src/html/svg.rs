//! The page's drawing parts: HTML escaping, numbers as the page prints them, the colour of a
//! bandwidth against what it should be, line charts and sparklines as inline SVG.

use std::fmt::Write;

/// `s` safe as HTML text and as a quoted attribute value.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A number with as many decimals as its size needs: `391`, `48.5`, `0.95`.
pub fn num(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A byte count as nccl-tests' sizes read: `8 B`, `64 KiB`, `1 GiB`.
pub fn bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{} {}", num(v), UNITS[u])
}

/// The fill of a cell measuring `ratio` of what it should (1.0 and above: green; half and
/// below: red; yellow between).
pub fn ratio_colour(ratio: f64) -> String {
    let r = if ratio.is_finite() { ratio } else { 0.0 };
    let t = ((r - 0.5) / 0.5).clamp(0.0, 1.0);
    format!("hsl({:.0},70%,{:.0}%)", t * 120.0, 62.0 + 10.0 * t)
}

/// Colours of a chart's series, in order.
pub const PALETTE: [&str; 7] = [
    "#1f6feb", "#8250df", "#bf8700", "#1a7f37", "#cf222e", "#0a7ea4", "#6e7781",
];

/// One line of a chart.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    /// Its `data-series` attribute.
    pub key: String,
    pub points: Vec<(f64, f64)>,
}

/// A horizontal line across a chart: a floor.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub label: String,
    /// Its `data-rule` attribute.
    pub key: String,
    pub y: f64,
}

/// A line chart: series over a shared x axis (log 2 for sizes and node counts).
#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    pub id: String,
    pub x_label: String,
    pub y_label: String,
    pub x_log2: bool,
    /// How an x value is printed under its tick.
    pub x_ticks: Vec<(f64, String)>,
    pub series: Vec<Series>,
    pub rules: Vec<Rule>,
    pub width: f64,
    pub height: f64,
}

/// Round tick steps for an axis from 0 to `max`: about four of them.
fn y_step(max: f64) -> f64 {
    let raw = max / 4.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(raw)
}

impl Chart {
    /// The chart as one `<svg>` element.
    pub fn render(&self) -> String {
        let (w, h) = (self.width, self.height);
        let (left, right, top, bottom) = (56.0, 16.0, 12.0, 40.0);
        let fx = |x: f64| if self.x_log2 { x.max(1e-9).log2() } else { x };
        let xs: Vec<f64> = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| fx(p.0)))
            .chain(self.x_ticks.iter().map(|t| fx(t.0)))
            .filter(|x| x.is_finite())
            .collect();
        let x_min = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let x_max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let (x_min, x_max) = if x_min.is_finite() && x_max > x_min {
            (x_min, x_max)
        } else {
            (x_min.min(0.0), x_min.max(0.0) + 1.0)
        };
        let y_top = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .chain(self.rules.iter().map(|r| r.y))
            .filter(|y| y.is_finite())
            .fold(0.0, f64::max);
        let step = y_step(if y_top > 0.0 { y_top * 1.08 } else { 1.0 });
        let y_max = (y_top * 1.08 / step).ceil().max(1.0) * step;
        let px = |x: f64| left + (fx(x) - x_min) / (x_max - x_min) * (w - left - right);
        let py = |y: f64| top + (1.0 - y / y_max) * (h - top - bottom);
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg id="{}" class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{}">"#,
            esc(&self.id),
            esc(&format!("{} by {}", self.y_label, self.x_label))
        );
        let mut y = 0.0;
        while y <= y_max + step / 2.0 {
            let _ = write!(
                s,
                r#"<line class="grid" x1="{left}" x2="{:.1}" y1="{:.1}" y2="{:.1}"/><text class="tick" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                w - right,
                py(y),
                py(y),
                left - 6.0,
                py(y) + 4.0,
                num(y)
            );
            y += step;
        }
        let last = self.x_ticks.len().saturating_sub(1);
        for (i, (x, label)) in self.x_ticks.iter().enumerate() {
            // The outer labels stay inside the chart.
            let anchor = match i {
                0 => "start",
                i if i == last => "end",
                _ => "middle",
            };
            let _ = write!(
                s,
                r#"<text class="tick" x="{:.1}" y="{:.1}" text-anchor="{anchor}">{}</text>"#,
                px(*x),
                h - bottom + 16.0,
                esc(label)
            );
        }
        let _ = write!(
            s,
            r#"<text class="axis" x="{:.1}" y="{:.1}" text-anchor="middle">{}</text><text class="axis" x="12" y="{:.1}" transform="rotate(-90 12 {:.1})" text-anchor="middle">{}</text>"#,
            (left + w - right) / 2.0,
            h - 6.0,
            esc(&self.x_label),
            (top + h - bottom) / 2.0,
            (top + h - bottom) / 2.0,
            esc(&self.y_label)
        );
        for r in &self.rules {
            let _ = write!(
                s,
                r#"<g data-rule="{}"><line class="rule" x1="{left}" x2="{:.1}" y1="{:.1}" y2="{:.1}"/><text class="rule-label" x="{:.1}" y="{:.1}">{}</text></g>"#,
                esc(&r.key),
                w - right,
                py(r.y),
                py(r.y),
                left + 6.0,
                py(r.y) - 4.0,
                esc(&r.label)
            );
        }
        for (i, series) in self.series.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            let pts: Vec<String> = series
                .points
                .iter()
                .filter(|p| p.0.is_finite() && p.1.is_finite())
                .map(|p| format!("{:.1},{:.1}", px(p.0), py(p.1)))
                .collect();
            let _ = write!(
                s,
                r#"<g data-series="{}"><polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
                esc(&series.key),
                pts.join(" ")
            );
            for p in &pts {
                let (x, y) = p.split_once(',').unwrap_or(("0", "0"));
                let _ = write!(s, r#"<circle cx="{x}" cy="{y}" r="2.5" fill="{colour}"/>"#);
            }
            s.push_str("</g>");
        }
        s.push_str("</svg>");
        if self.series.len() > 1 || !self.rules.is_empty() {
            s.push_str(r#"<div class="legend">"#);
            for (i, series) in self.series.iter().enumerate() {
                let _ = write!(
                    s,
                    r#"<span><i style="background:{}"></i>{}</span>"#,
                    PALETTE[i % PALETTE.len()],
                    esc(&series.name)
                );
            }
            for r in &self.rules {
                let _ = write!(s, r#"<span><i class="dash"></i>{}</span>"#, esc(&r.label));
            }
            s.push_str("</div>");
        }
        s
    }
}

/// A small line of `values` (oldest first; a gap where a run measured nothing), its last
/// value printed beside it. `lower_is_worse` colours a fall red, else a rise.
pub fn sparkline(values: &[Option<f64>], unit: &str, lower_is_worse: bool) -> String {
    let (w, h) = (120.0, 28.0);
    let known: Vec<(usize, f64)> = values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.filter(|v| v.is_finite()).map(|v| (i, v)))
        .collect();
    let Some(&(_, last)) = known.last() else {
        return r#"<span class="muted">no data</span>"#.into();
    };
    let lo = known.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let hi = known.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let span = if hi > lo { hi - lo } else { 1.0 };
    let n = values.len().max(2) - 1;
    let pts: Vec<String> = known
        .iter()
        .map(|(i, v)| {
            format!(
                "{:.1},{:.1}",
                2.0 + *i as f64 / n as f64 * (w - 4.0),
                h - 3.0 - (v - lo) / span * (h - 6.0)
            )
        })
        .collect();
    let first = known[0].1;
    let worse = if lower_is_worse {
        last < first * 0.95
    } else {
        last > first * 1.05
    };
    let colour = if worse { "#cf222e" } else { "#1f6feb" };
    // The latest run as a dot: a line of one run is a dot alone.
    let (lx, ly) = pts
        .last()
        .and_then(|p| p.split_once(','))
        .unwrap_or(("0", "0"));
    format!(
        r#"<svg class="spark" width="{w}" height="{h}" viewBox="0 0 {w} {h}"><polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/><circle cx="{lx}" cy="{ly}" r="2" fill="{colour}"/></svg><span class="spark-value">{} {}</span>"#,
        pts.join(" "),
        num(last),
        esc(unit)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_text_is_escaped_for_text_and_attributes() {
        assert_eq!(
            esc(r#"<img src=x onerror="a('b')">&"#),
            "&lt;img src=x onerror=&quot;a(&#39;b&#39;)&quot;&gt;&amp;"
        );
    }

    #[test]
    fn numbers_and_sizes_print_as_a_reader_expects() {
        assert_eq!(num(391.2), "391");
        assert_eq!(num(48.46), "48.5");
        assert_eq!(num(0.952), "0.95");
        assert_eq!(num(f64::NAN), "-");
        assert_eq!(num(0.0), "0");
        assert_eq!(bytes(8.0), "8.00 B");
        assert_eq!(bytes(64.0 * 1024.0 * 1024.0), "64.0 MiB");
    }

    #[test]
    fn a_full_bandwidth_is_green_and_half_or_less_is_red() {
        assert_eq!(ratio_colour(1.2), "hsl(120,70%,72%)");
        assert_eq!(ratio_colour(0.3), "hsl(0,70%,62%)");
        assert_eq!(ratio_colour(f64::NAN), "hsl(0,70%,62%)");
    }

    #[test]
    fn a_chart_draws_each_series_and_rule_with_its_key() {
        let c = Chart {
            id: "c1".into(),
            x_label: "size".into(),
            y_label: "GB/s".into(),
            x_log2: true,
            x_ticks: vec![(1024.0, "1 KiB".into()), (1048576.0, "1 MiB".into())],
            series: vec![Series {
                name: "all_reduce".into(),
                key: "allReduce".into(),
                points: vec![(1024.0, 1.0), (1048576.0, 300.0)],
            }],
            rules: vec![Rule {
                label: "floor 225 GB/s".into(),
                key: "floor".into(),
                y: 225.0,
            }],
            width: 400.0,
            height: 200.0,
        };
        let svg = c.render();
        assert!(svg.starts_with(r#"<svg id="c1""#), "{svg}");
        assert!(
            svg.contains(r#"<g data-series="allReduce"><polyline"#),
            "{svg}"
        );
        assert!(svg.contains(r#"<g data-rule="floor">"#), "{svg}");
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
    }

    #[test]
    fn a_sparkline_skips_gaps_and_says_when_there_is_nothing() {
        let s = sparkline(&[Some(400.0), None, Some(300.0)], "GB/s", true);
        assert_eq!(s.matches(',').count(), 2, "two points: {s}");
        assert!(s.contains("#cf222e"), "a fall is red: {s}");
        assert!(s.contains("300 GB/s"), "{s}");
        assert!(sparkline(&[None], "ms", false).contains("no data"));
        let one = sparkline(&[Some(41.0)], "ms", false);
        assert!(one.contains("<circle") && one.contains("41.0 ms"), "{one}");
    }
}
