//! Each failing node on its own: its findings, its GPU-pair copy matrix as a heatmap (the
//! pairs its findings name outlined) and its bus bandwidth by size per collective against
//! its floor, from the full result the operator kept.

use super::model::{HtmlReport, Kept, NodeDetail};
use super::svg::{Chart, Rule, Series, bytes, esc, num, ratio_colour};
use crate::doc::wire;
use gpufabric_api::ResultDocument;
use std::collections::BTreeMap;
use std::fmt::Write;

pub(super) fn section(r: &HtmlReport) -> String {
    let mut s = String::from(r#"<section id="failing-nodes"><h2>Failing nodes</h2>"#);
    if r.failing.is_empty() {
        s.push_str(r#"<p class="muted">No node failed.</p>"#);
    }
    for d in &r.failing {
        s.push_str(&node(d));
    }
    if !r.failing_not_drawn.is_empty() {
        let _ = write!(
            s,
            r#"<p class="muted">{} more failing node(s) not drawn: {}</p>"#,
            r.failing_not_drawn.len(),
            esc(&r.failing_not_drawn.join(", "))
        );
    }
    s.push_str("</section>\n");
    s
}

fn node(d: &NodeDetail) -> String {
    let e = &d.entry;
    let mut s = format!(
        r#"<article class="node-detail" id="node-{0}" data-node="{0}" data-verdict="{1}"><h3>{0} <span class="chip v-{1}">{1}</span> <span class="muted">{2}</span></h3>"#,
        esc(&e.node),
        e.verdict.name(),
        esc(e.product.as_deref().unwrap_or_default())
    );
    // The run's sentence on the node, unless it is one of the findings listed under it.
    if let Some(why) = e.reason.as_ref().or(e.finding.as_ref()) {
        let head: String = why.chars().take(60).collect();
        if !d.findings.iter().any(|f| f.message.starts_with(&head)) {
            let _ = write!(s, "<p>{}</p>", esc(why));
        }
    }
    if !d.findings.is_empty() {
        s.push_str("<ul>");
        for f in &d.findings {
            let sev = wire(&f.severity);
            let _ = write!(
                s,
                r#"<li data-severity="{}"><span class="sev-{}">{}</span> {}</li>"#,
                esc(&sev),
                esc(&sev),
                esc(&sev),
                esc(&f.message)
            );
        }
        s.push_str("</ul>");
    }
    match &d.kept {
        Kept::NotKept(why) => {
            let _ = write!(s, r#"<p class="note" data-kept="false">{}</p>"#, esc(why));
        }
        Kept::Document {
            doc,
            run,
            confirmation,
        } => {
            if *confirmation {
                let _ = write!(
                    s,
                    r#"<p class="note" data-kept="confirmation">Drawn from the full result of confirmation run {}, which retested this node after this run.</p>"#,
                    esc(run)
                );
            }
            s.push_str(r#"<div class="figures">"#);
            s.push_str(&heatmap(d, doc));
            s.push_str(&curves(d, doc));
            s.push_str("</div>");
        }
    }
    s.push_str("</article>");
    s
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// The one-way copy matrix: a cell per ordered pair, coloured against the node's median
/// pair; the pairs its findings name outlined (`data-suspect`), those under the floor
/// flagged (`data-below-floor`).
fn heatmap(d: &NodeDetail, doc: &ResultDocument) -> String {
    let Some(pm) = doc.pairs.as_ref().filter(|p| !p.unidirectional.is_empty()) else {
        return r#"<p class="muted" data-heatmap="none">No GPU-pair copies in the full result.</p>"#.into();
    };
    let cells: BTreeMap<(u32, u32), f64> = pm
        .unidirectional
        .iter()
        .map(|p| ((p.src, p.dst), p.gbps))
        .collect();
    let n = pm
        .unidirectional
        .iter()
        .map(|p| p.src.max(p.dst) + 1)
        .max()
        .unwrap_or(0)
        .max(doc.gpus.len() as u32);
    let reference = median(cells.values().copied().collect()).unwrap_or(1.0);
    let suspects = d.suspect_pairs();
    let gpus = d.suspect_gpus();
    let c = 40.0;
    let side = c * (f64::from(n) + 1.0);
    let node = esc(&d.entry.node);
    let mut s = format!(
        r#"<figure><svg id="heatmap-{node}" class="heat" data-node="{node}" width="{side}" height="{side}" viewBox="0 0 {side} {side}">"#
    );
    for i in 0..n {
        let at = c * (f64::from(i) + 1.5);
        let flag = if gpus.contains(&i) {
            r#" data-suspect="true""#
        } else {
            ""
        };
        let _ = write!(
            s,
            r#"<text class="label" data-gpu="{i}"{flag} x="{at}" y="{}">{i}</text><text class="label" data-gpu="{i}"{flag} x="{}" y="{at}">{i}</text>"#,
            c / 2.0,
            c / 2.0
        );
    }
    for src in 0..n {
        for dst in 0..n {
            let (x, y) = (c * (f64::from(dst) + 1.0), c * (f64::from(src) + 1.0));
            if src == dst {
                let _ = write!(
                    s,
                    r##"<rect x="{x}" y="{y}" width="{c}" height="{c}" fill="#eaeef2" stroke="#fff"/>"##
                );
                continue;
            }
            let Some(v) = cells.get(&(src, dst)) else {
                let _ = write!(
                    s,
                    r##"<g data-pair="{src}-{dst}" data-gbps="none"><rect x="{x}" y="{y}" width="{c}" height="{c}" fill="#fff" stroke="#d0d7de"/><text x="{}" y="{}">-</text></g>"##,
                    x + c / 2.0,
                    y + c / 2.0
                );
                continue;
            };
            let suspect = suspects.contains(&(src.min(dst), src.max(dst)));
            let below = d.pair_floor.as_ref().is_some_and(|f| *v < f.gbps);
            let _ = write!(
                s,
                r##"<g data-pair="{src}-{dst}" data-gbps="{v:.1}"{}{}><rect x="{x}" y="{y}" width="{c}" height="{c}" fill="{}" stroke="#fff"/><text x="{}" y="{}">{:.0}</text><title>GPU {src} to {dst}: {} GB/s</title></g>"##,
                if suspect {
                    r#" data-suspect="true""#
                } else {
                    ""
                },
                if below {
                    r#" data-below-floor="true""#
                } else {
                    ""
                },
                ratio_colour(v / reference),
                x + c / 2.0,
                y + c / 2.0,
                v,
                num(*v)
            );
        }
    }
    s.push_str("</svg>");
    let _ = write!(
        s,
        "<figcaption>One-way copy bandwidth, GB/s, source GPU by row, destination by column; colour against this node's median pair ({} GB/s){}; outlined: the pairs its findings name.</figcaption></figure>",
        num(reference),
        d.pair_floor
            .as_ref()
            .map(|f| format!(", floor {} GB/s ({})", num(f.gbps), esc(&f.source)))
            .unwrap_or_default()
    );
    s
}

/// Bus bandwidth by size, one line per collective of the sweep, all_reduce's floor as a
/// dashed line.
fn curves(d: &NodeDetail, doc: &ResultDocument) -> String {
    let Some(nccl) = doc.nccl.as_ref().filter(|n| !n.collectives.is_empty()) else {
        return r#"<p class="muted" data-busbw="none">No NCCL sweep in the full result.</p>"#
            .into();
    };
    let series: Vec<Series> = nccl
        .collectives
        .iter()
        .map(|c| Series {
            name: c.collective.nccl_tests_name().into(),
            key: wire(&c.collective),
            points: c
                .rows
                .iter()
                .map(|r| (r.bytes as f64, r.out_of_place.busbw))
                .collect(),
        })
        .collect();
    let mut sizes: Vec<u64> = nccl
        .collectives
        .iter()
        .flat_map(|c| c.rows.iter().map(|r| r.bytes))
        .filter(|b| *b > 0)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    // About six sizes under the axis, the largest always among them.
    let every = sizes.len().div_ceil(6).max(1);
    let last = sizes.len().saturating_sub(1);
    let x_ticks = sizes
        .iter()
        .enumerate()
        .filter(|(i, _)| (last - i).is_multiple_of(every))
        .map(|(_, b)| (*b as f64, bytes(*b as f64)))
        .collect();
    let rules = d
        .busbw_floor
        .iter()
        .map(|f| Rule {
            label: format!("all_reduce floor {} GB/s ({})", num(f.gbps), f.source),
            key: "floor".into(),
            y: f.gbps,
        })
        .collect();
    let chart = Chart {
        id: format!("busbw-{}", d.entry.node),
        x_label: "size".into(),
        y_label: "busbw GB/s".into(),
        x_log2: true,
        x_ticks,
        series,
        rules,
        width: 520.0,
        height: 300.0,
    };
    format!(
        r#"<figure data-node="{}">{}<figcaption>Bus bandwidth (out of place) by message size{}.</figcaption></figure>"#,
        esc(&d.entry.node),
        chart.render(),
        if nccl.graph_launches > 0 {
            format!(", timed with {} CUDA graph launches", nccl.graph_launches)
        } else {
            String::new()
        }
    )
}
