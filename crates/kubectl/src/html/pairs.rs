//! The node-pair phase as a matrix of nodes: each pair's bus bandwidth coloured against the
//! phase's median, the nodes it blames marked as suspects (`data-suspect`), their retests
//! (`data-retest`), and the paths blamed on neither node (`data-fault="path"`); then the
//! pairs worth a look, with their messages.

use super::model::{HtmlReport, PairCell, PairMatrix};
use super::svg::{esc, num, ratio_colour};
use crate::doc::wire;
use gpufabric_api::pair::PairState;
use std::fmt::Write;

/// `data-pair` of two nodes: their names in order, a space between.
pub(super) fn pair_key(a: &str, b: &str) -> String {
    if a <= b {
        format!("{a} {b}")
    } else {
        format!("{b} {a}")
    }
}

fn median(m: &PairMatrix) -> Option<f64> {
    if let Some(v) = m.status.within.as_ref().and_then(|w| w.median_gbps) {
        return Some(v);
    }
    let mut v: Vec<f64> = m.cells.iter().filter_map(|c| c.pair.busbw_gbps).collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

fn cell(c: &PairCell, median: Option<f64>) -> String {
    let p = &c.pair;
    let mut attrs = format!(
        r#" data-pair="{}" data-state="{}" data-round="{}""#,
        esc(&pair_key(&p.a, &p.b)),
        esc(&wire(&p.state)),
        p.round
    );
    if let Some(v) = p.busbw_gbps {
        let _ = write!(attrs, r#" data-gbps="{v:.1}""#);
    }
    if p.confirmation {
        attrs.push_str(r#" data-retest="true""#);
    }
    if c.path_fault {
        attrs.push_str(r#" data-fault="path""#);
    }
    let fill = match (p.state, p.busbw_gbps, median) {
        (PairState::Measured, Some(v), Some(m)) if m > 0.0 => ratio_colour(v / m),
        (PairState::Errored, _, _) => "hsl(0,70%,62%)".into(),
        _ => "#eaeef2".into(),
    };
    let text = match (p.state, p.busbw_gbps) {
        (PairState::Measured, Some(v)) => num(v),
        (state, _) => wire(&state).chars().take(3).collect(),
    };
    let title = format!(
        "{} <-> {}: round {}{}, {}{}{}",
        p.a,
        p.b,
        p.round,
        if p.confirmation { " (retest)" } else { "" },
        wire(&p.state),
        p.busbw_gbps
            .map(|v| format!(", {} GB/s", num(v)))
            .unwrap_or_default(),
        p.message
            .as_ref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default()
    );
    format!(
        r#"<td{attrs} style="background:{fill}" title="{}">{}</td>"#,
        esc(&title),
        esc(&text)
    )
}

pub(super) fn section(r: &HtmlReport) -> String {
    const ID: &str = "node-pairs";
    const TITLE: &str = "Node pairs";
    let Some(m) = &r.pairs else {
        return super::phase_absent(ID, TITLE, "node-pair phase", "suite.nodePairs");
    };
    let mut s = super::phase_opening(ID, TITLE);
    let st = &m.status;
    let med = median(m);
    let _ = write!(
        s,
        "<p>{} nodes that passed their own check, {} round(s){}, {} pair(s): {} measured, {} not measured, {} errored; median {} GB/s.{}</p>",
        st.candidates,
        st.rounds,
        crate::report::retest_words(st),
        st.pairs,
        st.measured,
        st.not_measured,
        st.errored,
        med.map(num).unwrap_or_else(|| "-".into()),
        st.message
            .as_ref()
            .map(|m| format!(" {}", esc(m)))
            .unwrap_or_default()
    );
    s.push_str(r#"<table id="pair-matrix" class="matrix"><tr><th></th>"#);
    for n in &m.nodes {
        let _ = write!(
            s,
            r#"<th class="col" data-node="{0}"{1}>{0}</th>"#,
            esc(&n.name),
            if n.suspect {
                r#" data-suspect="true""#
            } else {
                ""
            }
        );
    }
    s.push_str("</tr>");
    for row in &m.nodes {
        let mut attrs = format!(r#" data-node="{}""#, esc(&row.name));
        if row.suspect {
            attrs.push_str(r#" data-suspect="true""#);
        }
        if row.retested {
            attrs.push_str(r#" data-retested="true""#);
        }
        let _ = write!(
            s,
            "<tr><th{attrs}>{}{}</th>",
            esc(&row.name),
            match (row.suspect, row.retested) {
                (true, true) => " (suspect, retested)",
                (true, false) => " (suspect)",
                _ => "",
            }
        );
        for col in &m.nodes {
            if col.name == row.name {
                s.push_str(r#"<td class="self"></td>"#);
                continue;
            }
            match m.cell(&row.name, &col.name) {
                Some(c) => s.push_str(&cell(c, med)),
                None => s.push_str("<td></td>"),
            }
        }
        s.push_str("</tr>");
    }
    s.push_str("</table>");
    if m.hidden > 0 {
        let _ = write!(
            s,
            r#"<p class="muted">{} more node(s) of the phase not drawn (the matrix keeps the nodes of suspect, faulty and unmeasured pairs first).</p>"#,
            m.hidden
        );
    }
    s.push_str(r#"<p class="muted">Colour: bus bandwidth against the median pair. Outlined red: a slow path blamed on neither node. Dashed: a retest of a suspect against a known-good partner.</p>"#);
    s.push_str(&notable(m));
    s.push_str("</section>\n");
    s
}

/// The pairs worth a look: retests, faulty paths, pairs not measured or errored.
fn notable(m: &PairMatrix) -> String {
    let rows: Vec<&PairCell> = m
        .cells
        .iter()
        .filter(|c| c.pair.confirmation || c.path_fault || c.pair.state != PairState::Measured)
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        r#"<table id="pair-notes"><tr><th>round</th><th>pair</th><th>state</th><th>busbw GB/s</th><th>why listed</th><th>message</th></tr>"#,
    );
    for c in rows {
        let p = &c.pair;
        let mut why = Vec::new();
        if p.confirmation {
            why.push("retest of a suspect");
        }
        if c.path_fault {
            why.push("slow path, neither node blamed");
        }
        if p.state != PairState::Measured {
            why.push("not measured");
        }
        let _ = write!(
            s,
            r#"<tr data-pair="{}"><td>{}</td><td>{} &lt;-&gt; {}</td><td>{}</td><td class="num">{}</td><td>{}</td><td>{}</td></tr>"#,
            esc(&pair_key(&p.a, &p.b)),
            p.round,
            esc(&p.a),
            esc(&p.b),
            esc(&wire(&p.state)),
            p.busbw_gbps.map(num).unwrap_or_default(),
            why.join("; "),
            esc(p.message.as_deref().unwrap_or_default())
        );
    }
    s.push_str("</table>");
    s
}
