//! Each node's own numbers over its last runs of the report's test (the node annotation
//! `gpufabric.io/trend`): all_reduce busbw, worst GPU pair, slowest host link and DDP step
//! time as sparklines, oldest run left.

use super::model::{HtmlReport, TrendState};
use super::svg::{esc, sparkline};
use gpufabric_api::trend::TrendMetric;
use std::fmt::Write;

pub(super) fn section(r: &HtmlReport) -> String {
    let mut s = format!(
        r#"<section id="trends"><h2>Trends</h2><p class="muted">Each node's last runs of {}, oldest left; red: worse than its first run by more than 5%.</p>"#,
        esc(&r.test)
    );
    s.push_str(r#"<table id="trend-table"><tr><th>node</th><th>verdict</th>"#);
    for m in TrendMetric::ALL {
        let _ = write!(s, "<th>{} ({})</th>", esc(m.label()), esc(m.unit()));
    }
    s.push_str("</tr>");
    for row in &r.trends {
        let (state, cells) = match &row.trend {
            TrendState::Points(points) => {
                let mut cells = String::new();
                for m in TrendMetric::ALL {
                    let values: Vec<Option<f64>> = points.iter().map(|p| p.get(m)).collect();
                    let _ = write!(
                        cells,
                        "<td>{}</td>",
                        sparkline(&values, m.unit(), m.higher_is_better())
                    );
                }
                ("points", cells)
            }
            TrendState::NoTrend => (
                "none",
                r#"<td colspan="4" class="muted">no trend yet</td>"#.to_string(),
            ),
            TrendState::Unreadable(e) => (
                "unreadable",
                format!(
                    r#"<td colspan="4" class="muted">trend not readable: {}</td>"#,
                    esc(e)
                ),
            ),
        };
        let _ = write!(
            s,
            r#"<tr data-node="{0}" data-trend="{state}"><td>{0}</td><td><span class="chip v-{1}">{1}</span></td>{cells}</tr>"#,
            esc(&row.node),
            row.verdict.name()
        );
    }
    s.push_str("</table>");
    if r.trends_not_drawn > 0 {
        let _ = write!(
            s,
            r#"<p class="muted">{} more node(s) not drawn.</p>"#,
            r.trends_not_drawn
        );
    }
    s.push_str("</section>\n");
    s
}
