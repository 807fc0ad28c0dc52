//! The multi-node DDP probe: step time and weak-scaling efficiency by node count, and the
//! nodes that compute a step markedly slower than the fastest.

use super::model::HtmlReport;
use super::svg::{Chart, Rule, Series, esc, num};
use crate::doc::wire;
use std::fmt::Write;

pub(super) fn section(r: &HtmlReport) -> String {
    const ID: &str = "ddp-nodes";
    const TITLE: &str = "Multi-node DDP probe";
    let Some(p) = &r.ddp else {
        return super::phase_absent(ID, TITLE, "multi-node DDP probe", "suite.ddpNodes");
    };
    let mut s = super::phase_opening(ID, TITLE);
    let _ = write!(
        s,
        r#"<p data-state="{}">Over {} ({}{}).</p>"#,
        esc(&wire(&p.state)),
        esc(&p.nodes.join(", ")),
        esc(&wire(&p.state)),
        p.message
            .as_ref()
            .map(|m| format!(": {}", esc(m)))
            .unwrap_or_default()
    );
    if !p.points.is_empty() {
        let ticks: Vec<(f64, String)> = p
            .points
            .iter()
            .map(|x| (f64::from(x.nodes), format!("{} ({} GPUs)", x.nodes, x.gpus)))
            .collect();
        let step = Chart {
            id: "ddp-step".into(),
            x_label: "nodes".into(),
            y_label: "step ms".into(),
            x_log2: true,
            x_ticks: ticks.clone(),
            series: vec![
                Series {
                    name: "step".into(),
                    key: "step".into(),
                    points: p
                        .points
                        .iter()
                        .map(|x| (f64::from(x.nodes), x.step_ms))
                        .collect(),
                },
                Series {
                    name: "communication alone".into(),
                    key: "comm".into(),
                    points: p
                        .points
                        .iter()
                        .map(|x| (f64::from(x.nodes), x.comm_alone_ms))
                        .collect(),
                },
                Series {
                    name: "exposed communication".into(),
                    key: "exposed".into(),
                    points: p
                        .points
                        .iter()
                        .map(|x| (f64::from(x.nodes), x.exposed_comm_ms))
                        .collect(),
                },
            ],
            rules: Vec::new(),
            width: 460.0,
            height: 260.0,
        };
        let efficiency = Chart {
            id: "ddp-scaling".into(),
            x_label: "nodes".into(),
            y_label: "scaling efficiency %".into(),
            x_log2: true,
            x_ticks: ticks,
            series: vec![Series {
                name: "efficiency".into(),
                key: "efficiency".into(),
                points: p
                    .points
                    .iter()
                    .map(|x| (f64::from(x.nodes), x.scaling_efficiency * 100.0))
                    .collect(),
            }],
            rules: vec![Rule {
                label: "perfect weak scaling".into(),
                key: "perfect".into(),
                y: 100.0,
            }],
            width: 460.0,
            height: 260.0,
        };
        let _ = write!(
            s,
            r#"<div class="figures"><figure>{}<figcaption>Step time by node count (all GPUs of each node).</figcaption></figure><figure>{}<figcaption>Throughput per GPU against one node.</figcaption></figure></div>"#,
            step.render(),
            efficiency.render()
        );
        s.push_str(r#"<table id="ddp-points"><tr><th>nodes</th><th>GPUs</th><th>step ms</th><th>efficiency</th><th>comm alone ms</th><th>exposed comm ms</th></tr>"#);
        for x in &p.points {
            let _ = write!(
                s,
                r#"<tr data-nodes="{}"><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{:.1}%</td><td class="num">{}</td><td class="num">{}</td></tr>"#,
                x.nodes,
                x.nodes,
                x.gpus,
                num(x.step_ms),
                x.scaling_efficiency * 100.0,
                num(x.comm_alone_ms),
                num(x.exposed_comm_ms)
            );
        }
        s.push_str("</table>");
    }
    for st in &p.stragglers {
        let _ = write!(
            s,
            r#"<p class="note" data-node="{}" data-straggler="true">Straggler: {} computes a step {:.1}% slower than the fastest node ({} ms against {} ms).</p>"#,
            esc(&st.node),
            esc(&st.node),
            st.slower_percent,
            num(st.compute_ms),
            num(st.fastest_ms)
        );
    }
    s.push_str("</section>\n");
    s
}
