//! `kubectl gpufabric report RUN -o report.html`: one run as one self-contained page (inline
//! CSS and SVG; no script, no fonts or images fetched). `model` builds what it shows from the
//! fetched objects (`kept` reads the full results the operator keeps); each section renders from that model alone: the fleet (`fleet`), the
//! failing nodes' GPU pairs and collectives (`gpus`), the node-pair matrix (`pairs`), the
//! multi-node DDP probe (`ddp`), the multi-node NCCL sweep's curves (`nccl_nodes`) and each
//! node's trend (`trend`).
//!
//! Every element a reader's tool may look for has a stable `id` or `data-*` attribute:
//! `data-node`, `data-verdict`, `data-pair` (`2-5` for GPUs, `a b` for nodes),
//! `data-suspect`, `data-retest`, `data-fault`.

mod ddp;
mod fleet;
mod gpus;
pub mod kept;
pub mod model;
mod nccl_nodes;
mod pairs;
pub mod svg;
mod trend;

pub use model::{HtmlReport, Sources};

use svg::esc;

const CSS: &str = r#"
:root{--fg:#1f2328;--muted:#656d76;--line:#d0d7de;--bg:#ffffff;--panel:#f6f8fa;--bad:#cf222e;--warn:#bf8700;--ok:#1a7f37;--info:#0969da}
*{box-sizing:border-box}
body{margin:0;padding:24px 32px;font:14px/1.45 "DejaVu Sans",Verdana,Arial,sans-serif;color:var(--fg);background:var(--bg)}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:18px;margin:28px 0 8px;padding-bottom:4px;border-bottom:1px solid var(--line)}
h3{font-size:15px;margin:16px 0 6px}
.meta,.muted{color:var(--muted)}
.note{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:6px 10px;margin:6px 0}
.counts{display:flex;gap:10px;flex-wrap:wrap;margin:8px 0}
.count{border:1px solid var(--line);border-radius:8px;padding:6px 14px;background:var(--panel);min-width:110px}
.count b{display:block;font-size:22px}
.bar{display:block;margin:6px 0 10px}
.chips{margin:4px 0 8px}
.chip{display:inline-block;border-radius:10px;padding:1px 8px;margin:2px;font-size:12px;border:1px solid var(--line)}
.v-Passed{background:#dafbe1}.v-Failed{background:#ffd8d3}.v-Errored{background:#ffd8d3}.v-Timeout{background:#ffe7c2}
.v-NotMeasured{background:#eaeef2}.v-Running,.v-Pending{background:#ddf4ff}
table{border-collapse:collapse;margin:6px 0 12px}
th,td{border:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top;font-size:13px}
th{background:var(--panel)}
td.num{text-align:right;font-variant-numeric:tabular-nums}
td.node{white-space:nowrap}
.sev-Critical{color:var(--bad);font-weight:bold}.sev-Warning{color:var(--warn);font-weight:bold}.sev-Info{color:var(--info)}
.node-detail{border:1px solid var(--line);border-radius:8px;padding:8px 16px 12px;margin:12px 0}
.figures{display:flex;gap:28px;flex-wrap:wrap;align-items:flex-start}
figure{margin:0;max-width:560px}
figcaption{font-size:12px;color:var(--muted);margin-top:2px;max-width:480px}
.chart .grid{stroke:#eaeef2}.chart .tick{font-size:10px;fill:var(--muted)}.chart .axis{font-size:11px;fill:var(--muted)}
.chart .rule{stroke:var(--bad);stroke-dasharray:6 4;stroke-width:1.5}.chart .rule-label{font-size:10px;fill:var(--bad)}
.legend{font-size:12px;display:flex;gap:12px;flex-wrap:wrap}
.legend i{display:inline-block;width:14px;height:3px;margin-right:4px;vertical-align:middle}
.legend i.dash{border-top:2px dashed var(--bad);height:0}
.heat text{font-size:11px;text-anchor:middle;dominant-baseline:central}
.heat .label{fill:var(--muted)}
.heat .label[data-suspect="true"]{fill:var(--bad);font-weight:bold}
.heat [data-suspect="true"] rect{stroke:#000;stroke-width:3}
.matrix td{text-align:center;min-width:34px;font-size:11px;padding:2px 3px}
.matrix th{font-size:11px;white-space:nowrap}
.matrix th.col{writing-mode:vertical-rl;transform:rotate(180deg);padding:4px 2px}
.matrix td[data-retest="true"]{outline:2px dashed #000;outline-offset:-3px}
.matrix td[data-fault="path"]{outline:3px solid var(--bad);outline-offset:-3px;font-weight:bold}
.matrix th[data-suspect="true"]{background:#ffd8d3;color:var(--bad)}
.matrix td.self{background:#eaeef2}
.spark{vertical-align:middle}.spark-value{font-size:11px;color:var(--muted);margin-left:4px}
footer{margin-top:32px;color:var(--muted);font-size:12px}
"#;

/// The page of `r`, as one HTML document.
pub fn render(r: &HtmlReport) -> String {
    let mut out = String::with_capacity(64 * 1024);
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    out.push_str(&format!(
        "<title>gpufabric report: run {}</title>\n<style>{CSS}</style>\n</head>\n",
        esc(&r.run)
    ));
    out.push_str(&format!(
        "<body data-run=\"{}\" data-test=\"{}\">\n",
        esc(&r.run),
        esc(&r.test)
    ));
    out.push_str(&header(r));
    out.push_str(&fleet::section(r));
    out.push_str(&gpus::section(r));
    out.push_str(&pairs::section(r));
    out.push_str(&ddp::section(r));
    out.push_str(&nccl_nodes::section(r));
    out.push_str(&trend::section(r));
    out.push_str(&format!(
        "<footer>kubectl gpufabric report {} -o html, {}</footer>\n</body>\n</html>\n",
        esc(&r.run),
        esc(&r.generated_at)
    ));
    out
}

fn header(r: &HtmlReport) -> String {
    let mut meta = vec![
        format!("FabricTest {}", r.test),
        format!("trigger {}", r.trigger),
        format!("phase {}", r.phase),
    ];
    if let Some(s) = &r.started {
        meta.push(format!("started {s}"));
    }
    if let Some(d) = &r.duration {
        meta.push(format!("took {d}"));
    }
    let mut s = format!(
        "<header id=\"summary\"><h1>gpufabric run {}</h1><div class=\"meta\">{}</div>",
        esc(&r.run),
        esc(&meta.join(" · "))
    );
    if let Some(m) = &r.message {
        s.push_str(&format!("<p class=\"note\">{}</p>", esc(m)));
    }
    s.push_str("</header>\n");
    s
}

/// The opening of a phase's section: its anchor and heading.
fn phase_opening(id: &str, title: &str) -> String {
    format!(r#"<section id="{id}"><h2>{title}</h2>"#)
}

/// The whole section of a phase the run did not have: the heading and one line naming the
/// suite field that turns it on.
fn phase_absent(id: &str, title: &str, phase: &str, field: &str) -> String {
    format!(
        "{}<p class=\"muted\">This run had no {phase} ({field}).</p></section>\n",
        phase_opening(id, title)
    )
}

#[cfg(test)]
mod tests;
