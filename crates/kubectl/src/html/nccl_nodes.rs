//! The multi-node NCCL sweep: each collective's bus bandwidth at the large sizes by node
//! count (the curve across all nodes, or across topology blocks, then each block's) beside
//! the ceiling the nodes' links allow, its knees, the blocks slower than the others, and the
//! counts far below their links or above them.

use super::model::HtmlReport;
use super::svg::{Chart, Series, esc, num};
use crate::doc::wire;
use gpufabric_api::link_ceiling::LinkGapKind;
use gpufabric_api::nccl_nodes::NcclNodesSweep;
use std::fmt::Write;

pub(super) fn section(r: &HtmlReport) -> String {
    const ID: &str = "nccl-nodes";
    const TITLE: &str = "Multi-node NCCL sweep";
    let Some(p) = &r.nccl else {
        return super::phase_absent(ID, TITLE, "multi-node NCCL sweep", "suite.ncclNodes");
    };
    let mut s = super::phase_opening(ID, TITLE);
    let key = p.topology_key.as_deref();
    let title = match key {
        Some(k) => format!("Across blocks of {k} (one node of each)"),
        None => "Over the group".to_string(),
    };
    sweep(&mut s, "nccl-nodes", &title, None, &p.sweep);
    for (i, b) in p.blocks.iter().enumerate() {
        let title = format!("Block {}={}", key.unwrap_or_default(), b.value);
        sweep(
            &mut s,
            &format!("nccl-nodes-b{i}"),
            &title,
            Some(&b.value),
            &b.sweep,
        );
    }
    for b in &p.slow_blocks {
        let _ = write!(
            s,
            r#"<p class="note" data-slow-block="{}">Slow block {}={}: {} (no node is held to account for it).</p>"#,
            esc(&b.value),
            esc(&b.key),
            esc(&b.value),
            esc(&b.message)
        );
    }
    for g in &p.link_gaps {
        let (kind, words) = match g.kind {
            LinkGapKind::Below => ("below", "Far below the links"),
            LinkGapKind::Above => ("above", "Above the links"),
        };
        let _ = write!(
            s,
            r#"<p class="note" data-link-gap="{kind}" data-nodes="{}">{words}: {} (no node is held to account for it).</p>"#,
            g.nodes,
            esc(&g.message)
        );
    }
    s.push_str("</section>\n");
    s
}

/// One sweep: its nodes and state, the busbw curve per collective, a table, and its knees.
/// `id` names its chart and table; `block` is the block's label value, when it is one.
fn sweep(s: &mut String, id: &str, title: &str, block: Option<&str>, p: &NcclNodesSweep) {
    let _ = write!(
        s,
        r#"<h3>{}</h3><p data-state="{}"{}>Over {} ({}{}).</p>"#,
        esc(title),
        esc(&wire(&p.state)),
        block
            .map(|b| format!(r#" data-block="{}""#, esc(b)))
            .unwrap_or_default(),
        esc(&p.nodes.join(", ")),
        esc(&wire(&p.state)),
        p.message
            .as_ref()
            .map(|m| format!(": {}", esc(m)))
            .unwrap_or_default()
    );
    if p.points.is_empty() {
        return;
    }
    let collectives = p.collectives();
    let chart = Chart {
        id: id.to_string(),
        x_label: "nodes".into(),
        y_label: "busbw GB/s (large sizes)".into(),
        x_log2: true,
        x_ticks: p
            .points
            .iter()
            .map(|x| {
                (
                    f64::from(x.nodes),
                    format!("{} ({} ranks)", x.nodes, x.ranks),
                )
            })
            .collect(),
        series: collectives
            .iter()
            .map(|c| Series {
                name: c.nccl_tests_name().to_string(),
                key: c.api_name().to_string(),
                points: p
                    .curve(*c)
                    .into_iter()
                    .map(|(nodes, busbw)| (f64::from(nodes), busbw))
                    .collect(),
            })
            .chain(collectives.iter().filter_map(|c| {
                let points: Vec<(f64, f64)> = p
                    .points
                    .iter()
                    .filter_map(|x| x.ceiling(*c).map(|k| (f64::from(x.nodes), k.busbw)))
                    .collect();
                (!points.is_empty()).then(|| Series {
                    name: format!("{} links' ceiling", c.nccl_tests_name()),
                    key: format!("{}-ceiling", c.api_name()),
                    points,
                })
            }))
            .collect(),
        rules: Vec::new(),
        width: 460.0,
        height: 260.0,
    };
    let _ = write!(
        s,
        r#"<div class="figures"><figure>{}<figcaption>Bus bandwidth at the large sizes by node count (nccl-tests' busbw, all GPUs of each node), beside the ceiling the slowest node's network ports allow where they are known.</figcaption></figure></div>"#,
        chart.render()
    );
    let _ = write!(
        s,
        r#"<table id="{id}-points"><tr><th>nodes</th><th>ranks</th>"#
    );
    for c in &collectives {
        let _ = write!(
            s,
            "<th>{} busbw GB/s</th><th>{} small µs</th><th>{} links' ceiling GB/s</th>",
            c.nccl_tests_name(),
            c.nccl_tests_name(),
            c.nccl_tests_name()
        );
    }
    s.push_str("<th>links</th></tr>");
    for x in &p.points {
        let _ = write!(
            s,
            r#"<tr data-nodes="{}"><td class="num">{}</td><td class="num">{}</td>"#,
            x.nodes, x.nodes, x.ranks
        );
        for c in &collectives {
            match x.summary.iter().find(|y| y.collective == *c) {
                Some(y) => {
                    let _ = write!(
                        s,
                        r#"<td class="num">{}</td><td class="num">{}</td>"#,
                        num(y.large_busbw),
                        num(y.small_time_us)
                    );
                }
                None => s.push_str("<td></td><td></td>"),
            }
            match x.ceiling(*c) {
                Some(k) => {
                    let _ = write!(
                        s,
                        r#"<td class="num" data-ceiling="{}">{} ({:.0}%)</td>"#,
                        esc(c.api_name()),
                        num(k.busbw),
                        k.share * 100.0
                    );
                }
                None => s.push_str("<td></td>"),
            }
        }
        let _ = write!(
            s,
            "<td>{}</td></tr>",
            esc(&x.links.as_ref().map(|l| l.describe()).unwrap_or_default())
        );
    }
    s.push_str("</table>");
    for k in &p.knees {
        let _ = write!(
            s,
            r#"<p class="note" data-knee="{}" data-at-nodes="{}">Knee: {}</p>"#,
            esc(k.collective.api_name()),
            k.at_nodes,
            esc(&k.message)
        );
    }
}
