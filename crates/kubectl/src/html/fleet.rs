//! The fleet at a glance: nodes by verdict (a bar, the counts, each node), the nodes not
//! measured and why, the nodes skipped, and the run's findings.

use super::model::{Fleet, HtmlReport};
use super::svg::{esc, num};
use crate::doc::wire;
use crate::findings::subject;
use gpufabric_api::run::NodeVerdict;
use std::fmt::Write;

/// Most nodes listed by name under one verdict.
const MAX_CHIPS: usize = 300;

fn colour(v: NodeVerdict) -> &'static str {
    match v {
        NodeVerdict::Passed => "#2da44e",
        NodeVerdict::Failed => "#cf222e",
        NodeVerdict::Errored => "#a40e26",
        NodeVerdict::Timeout => "#bc4c00",
        NodeVerdict::NotMeasured => "#8c959f",
        NodeVerdict::Running | NodeVerdict::Pending => "#54aeff",
    }
}

/// One bar of the nodes, a segment per verdict.
fn bar(f: &Fleet) -> String {
    let total = f.nodes.len().max(1) as f64;
    let (w, h) = (960.0, 22.0);
    let mut s = format!(
        r#"<svg id="verdict-bar" class="bar" width="{w}" height="{h}" viewBox="0 0 {w} {h}">"#
    );
    let mut x = 0.0;
    for v in Fleet::VERDICTS {
        let n = f.count(v);
        if n == 0 {
            continue;
        }
        let width = n as f64 / total * w;
        let _ = write!(
            s,
            r#"<rect data-verdict="{}" x="{x:.1}" y="0" width="{width:.1}" height="{h}" fill="{}"><title>{n} {}</title></rect>"#,
            v.name(),
            colour(v),
            v.name()
        );
        x += width;
    }
    s.push_str("</svg>");
    s
}

pub(super) fn section(r: &HtmlReport) -> String {
    let f = &r.fleet;
    let mut s = String::from(r#"<section id="fleet"><h2>The fleet at a glance</h2>"#);
    let _ = write!(
        s,
        r#"<p>{} node(s) tested, {} skipped before the run.</p>"#,
        f.nodes.len(),
        f.skipped_count
    );
    s.push_str(&bar(f));
    s.push_str(r#"<div class="counts">"#);
    for v in Fleet::VERDICTS {
        let n = f.count(v);
        let main = !matches!(v, NodeVerdict::Running | NodeVerdict::Pending);
        if n > 0 || main {
            let _ = write!(
                s,
                r#"<div class="count" id="count-{0}" data-verdict="{0}" data-count="{n}"><b>{n}</b>{0}</div>"#,
                v.name()
            );
        }
    }
    let _ = write!(
        s,
        r#"<div class="count" id="count-Skipped" data-count="{0}"><b>{0}</b>Skipped</div></div>"#,
        f.skipped_count
    );
    for v in Fleet::VERDICTS {
        let nodes: Vec<_> = f.nodes.iter().filter(|n| n.verdict == v).collect();
        if nodes.is_empty() {
            continue;
        }
        let _ = write!(
            s,
            r#"<div class="chips" data-verdict="{}"><b>{}</b>: "#,
            v.name(),
            v.name()
        );
        for n in nodes.iter().take(MAX_CHIPS) {
            let why = n.reason.as_ref().or(n.finding.as_ref());
            let _ = write!(
                s,
                r#"<span class="chip v-{}" data-node="{}" data-verdict="{}"{}>{}</span>"#,
                v.name(),
                esc(&n.node),
                v.name(),
                why.map(|w| format!(r#" title="{}""#, esc(w)))
                    .unwrap_or_default(),
                esc(&n.node)
            );
        }
        if nodes.len() > MAX_CHIPS {
            let _ = write!(s, " and {} more", nodes.len() - MAX_CHIPS);
        }
        s.push_str("</div>");
    }
    s.push_str(&not_measured(r));
    s.push_str(&gpus_out(r));
    s.push_str(&findings(r));
    s.push_str("</section>\n");
    s
}

/// The nodes the run did not measure and those it skipped: never held against the node.
fn not_measured(r: &HtmlReport) -> String {
    let f = &r.fleet;
    let mut s = String::from(
        r#"<h3 id="not-measured">Not measured (infrastructure, never held against the node)</h3>"#,
    );
    let rows: Vec<_> = f
        .nodes
        .iter()
        .filter(|n| n.not_measured.is_some())
        .collect();
    if rows.is_empty() && f.skipped.is_empty() {
        s.push_str(r#"<p class="muted">none</p>"#);
        return s;
    }
    s.push_str("<table><tr><th>node</th><th>not measured</th><th>why</th></tr>");
    for n in rows {
        let _ = write!(
            s,
            r#"<tr data-node="{}" data-not-measured="{}"><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            esc(&n.node),
            n.not_measured.map(|m| m.as_str()).unwrap_or_default(),
            esc(&n.node),
            n.not_measured.map(|m| m.as_str()).unwrap_or_default(),
            esc(n.reason.as_deref().unwrap_or_default())
        );
    }
    for k in &f.skipped {
        let _ = write!(
            s,
            r#"<tr data-node="{}" data-skipped="{}"><td>{}</td><td>skipped: {}</td><td>{}</td></tr>"#,
            esc(&k.node),
            k.reason.as_str(),
            esc(&k.node),
            k.reason.as_str(),
            esc(&k.message)
        );
    }
    s.push_str("</table>");
    let unlisted = (f.skipped_count as usize).saturating_sub(f.skipped.len());
    if unlisted > 0 {
        let _ = write!(
            s,
            r#"<p class="muted">{unlisted} more skipped node(s) not listed by the run.</p>"#
        );
    }
    s
}

/// The GPUs the test holds out of service with DRA device taints; nothing when it holds
/// none.
fn gpus_out(r: &HtmlReport) -> String {
    if r.gpus_out.is_empty() {
        return String::new();
    }
    let mut s = format!(
        r#"<h3 id="gpus-out">{}</h3><table><tr><th>node</th><th>GPU</th><th>device</th><th>since</th><th>rule</th><th>finding</th></tr>"#,
        esc(crate::gpus_out::HEADING)
    );
    for g in &r.gpus_out {
        let _ = write!(
            s,
            r#"<tr data-node="{}" data-gpu="{}"><td class="node">{}</td><td class="num">{}</td><td class="node">{}</td><td class="node">{}</td><td class="node">{}</td><td>{}</td></tr>"#,
            esc(&g.node),
            g.gpu.gpu,
            esc(&g.node),
            g.gpu.gpu,
            esc(&g.gpu.device),
            esc(&g
                .gpu
                .since
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default()),
            esc(&g.gpu.rule),
            esc(&g.gpu.reason)
        );
    }
    s.push_str("</table>");
    s
}

fn findings(r: &HtmlReport) -> String {
    let mut s = format!(r#"<h3 id="findings">Findings ({})</h3>"#, r.finding_count);
    if r.findings.is_empty() {
        s.push_str(r#"<p class="muted">none</p>"#);
        return s;
    }
    s.push_str("<table><tr><th>severity</th><th>node</th><th>subject</th><th>metric</th><th>measured</th><th>expected</th><th>message</th></tr>");
    for f in &r.findings {
        let sev = wire(&f.severity);
        let unit = f.unit.clone().unwrap_or_default();
        let v = |x: Option<f64>| x.map(|x| format!("{} {unit}", num(x))).unwrap_or_default();
        let _ = write!(
            s,
            r#"<tr data-node="{}" data-severity="{}"><td class="sev-{}">{}</td><td class="node">{}</td><td class="node">{}</td><td>{}</td><td class="num node">{}</td><td class="num node">{}</td><td>{}</td></tr>"#,
            esc(f.subject.node_name()),
            esc(&sev),
            esc(&sev),
            esc(&sev),
            esc(f.subject.node_name()),
            esc(&subject(&f.subject)),
            esc(&wire(&f.metric)),
            esc(&v(f.measured)),
            esc(&v(f.expected)),
            esc(&f.message)
        );
    }
    s.push_str("</table>");
    let more = (r.finding_count as usize).saturating_sub(r.findings.len());
    if more > 0 {
        let _ = write!(
            s,
            r#"<p class="muted">{more} more finding(s) not listed by the run: <code>kubectl get ftrs -l gpufabric.io/run={}</code> has every node's.</p>"#,
            esc(&r.run)
        );
    }
    s
}
