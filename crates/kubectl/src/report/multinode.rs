//! The run's multi-node phases: the DDP probe and the NCCL sweep, per node count.

use super::run_name;
use crate::doc::{Doc, Table, wire};
use gpufabric_api::FabricTestRun;

/// The heading of a multi-node phase: `title` (the run and the phase) over its nodes, and how
/// it ended.
fn group_heading(
    title: String,
    nodes: &[String],
    state: &gpufabric_api::pair::PairState,
    message: Option<&str>,
) -> String {
    format!(
        "{title} over {} ({}{})",
        nodes.join(", "),
        wire(state),
        message.map(|m| format!(": {m}")).unwrap_or_default()
    )
}

/// The run's multi-node DDP probe: its nodes, and step time and efficiency per node count.
/// Empty for a run without one.
pub fn ddp_nodes_doc(r: &FabricTestRun) -> Doc {
    let mut doc = Doc::default();
    let Some(p) = r.status.as_ref().and_then(|s| s.ddp_nodes.as_ref()) else {
        return doc;
    };
    doc.heading(group_heading(
        format!("run {}: multi-node DDP probe", run_name(r)),
        &p.nodes,
        &p.state,
        p.message.as_deref(),
    ));
    let mut t = Table::new(&[
        "NODES",
        "GPUS",
        "STEP ms",
        "EFFICIENCY",
        "COMM ALONE ms",
        "EXPOSED COMM ms",
    ]);
    for x in &p.points {
        t.push(vec![
            x.nodes.to_string(),
            x.gpus.to_string(),
            format!("{:.2}", x.step_ms),
            format!("{:.1}%", x.scaling_efficiency * 100.0),
            format!("{:.2}", x.comm_alone_ms),
            format!("{:.2}", x.exposed_comm_ms),
        ]);
    }
    doc.table(t);
    for s in &p.stragglers {
        doc.line(format!(
            "straggler: {} computes a step {:.1}% slower than the fastest node",
            s.node, s.slower_percent
        ));
    }
    doc
}

/// The run's multi-node NCCL sweep: its nodes, and per node count each collective's busbw at
/// the large sizes and time at the smallest (nccl-tests' columns), then each knee; with
/// topology blocks, the same for each block's sweep, and the blocks slower than the others.
/// Empty for a run without one.
pub fn nccl_nodes_doc(r: &FabricTestRun) -> Doc {
    let mut doc = Doc::default();
    let Some(p) = r.status.as_ref().and_then(|s| s.nccl_nodes.as_ref()) else {
        return doc;
    };
    let across = match &p.topology_key {
        Some(key) => format!(" across blocks of {key}"),
        None => String::new(),
    };
    sweep_doc(
        &mut doc,
        format!("run {}: multi-node NCCL sweep{across}", run_name(r)),
        &p.sweep,
    );
    let key = p.topology_key.as_deref().unwrap_or_default();
    for b in &p.blocks {
        sweep_doc(
            &mut doc,
            format!(
                "run {}: multi-node NCCL sweep in block {key}={}",
                run_name(r),
                b.value
            ),
            &b.sweep,
        );
    }
    for b in &p.slow_blocks {
        doc.line(format!("slow block: {}", b.message));
    }
    for g in &p.link_gaps {
        let what = match g.kind {
            gpufabric_api::link_ceiling::LinkGapKind::Below => "far below the links",
            gpufabric_api::link_ceiling::LinkGapKind::Above => "above the links",
        };
        doc.line(format!("{what}: {}", g.message));
    }
    doc
}

/// One sweep under `title`: its nodes, state, curve table (each collective's busbw beside the
/// ceiling its links allow, where known), what bounds the links, and its knees.
fn sweep_doc(doc: &mut Doc, title: String, p: &gpufabric_api::nccl_nodes::NcclNodesSweep) {
    doc.heading(group_heading(
        title,
        &p.nodes,
        &p.state,
        p.message.as_deref(),
    ));
    let collectives = p.collectives();
    let ceilinged: Vec<bool> = collectives
        .iter()
        .map(|c| p.points.iter().any(|x| x.ceiling(*c).is_some()))
        .collect();
    let mut header = vec!["NODES".to_string(), "RANKS".to_string()];
    for (c, has) in collectives.iter().zip(&ceilinged) {
        let name = c.nccl_tests_name().to_uppercase();
        header.push(format!("{name} busbw GB/s"));
        header.push(format!("{name} small us"));
        if *has {
            header.push(format!("{name} links GB/s"));
        }
    }
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = Table::new(&header);
    for x in &p.points {
        let mut row = vec![x.nodes.to_string(), x.ranks.to_string()];
        for (c, has) in collectives.iter().zip(&ceilinged) {
            match x.summary.iter().find(|s| s.collective == *c) {
                Some(s) => {
                    row.push(format!("{:.1}", s.large_busbw));
                    row.push(format!("{:.1}", s.small_time_us));
                }
                None => row.extend([String::new(), String::new()]),
            }
            if *has {
                row.push(
                    x.ceiling(*c)
                        .map(|k| format!("{:.1} ({:.0}%)", k.busbw, k.share * 100.0))
                        .unwrap_or_default(),
                );
            }
        }
        t.push(row);
    }
    doc.table(t);
    // What bounds the links, once per run of counts it holds for.
    let mut last: Option<String> = None;
    for x in &p.points {
        let Some(l) = &x.links else { continue };
        let said = l.describe();
        if last.as_deref() != Some(said.as_str()) {
            let what = if l.gbps.is_some() {
                format!("links from {} nodes: bounded by {said}", x.nodes)
            } else {
                format!("links from {} nodes: no ceiling, {said}", x.nodes)
            };
            doc.line(what);
            last = Some(said);
        }
    }
    for k in &p.knees {
        doc.line(format!("knee: {}", k.message));
    }
}
