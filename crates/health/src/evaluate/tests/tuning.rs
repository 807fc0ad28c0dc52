//! A test whose agent env caps NCCL: every node's collectives slow for the same reason
//! outside its hardware.

use super::*;

fn capped_fleet() -> Vec<NodeInput> {
    let mut fleet = fleet_of(6, 0.0);
    for r in fleet.iter_mut() {
        for c in r.collectives.iter_mut() {
            c.peak_busbw *= 0.3;
            c.largest_busbw *= 0.3;
        }
    }
    inputs(fleet)
}

#[test]
fn collectives_capped_by_the_agent_env_fail_no_node() {
    // Without the setting known, the capped collectives fail every node.
    let e = evaluate(&capped_fleet(), &Thresholds::default());
    assert!(
        e.verdicts.values().all(|v| *v == NodeVerdict::Failed),
        "{:#?}",
        e.findings
    );
    let mut nodes = capped_fleet();
    for n in nodes.iter_mut() {
        n.nccl_tuning = vec!["NCCL_MAX_NCHANNELS".into()];
    }
    let e = evaluate(&nodes, &Thresholds::default());
    assert!(
        e.verdicts.values().all(|v| *v == NodeVerdict::Passed),
        "{:#?}",
        e.findings
    );
    let spared: Vec<_> = e
        .findings
        .iter()
        .filter(|f| f.message.contains("sets NCCL_MAX_NCHANNELS"))
        .collect();
    assert!(!spared.is_empty());
    assert!(spared.iter().all(|f| f.severity == Severity::Info));
}

#[test]
fn a_node_slower_than_its_peers_run_alike_still_fails() {
    let mut fleet = fleet_of(8, 0.01);
    for (i, r) in fleet.iter_mut().enumerate() {
        let k = if i == 3 { 0.3 * 0.6 } else { 0.3 };
        for c in r.collectives.iter_mut() {
            c.peak_busbw *= k;
            c.largest_busbw *= k;
        }
    }
    let mut nodes = inputs(fleet);
    for n in nodes.iter_mut() {
        n.nccl_tuning = vec!["NCCL_ALGO".into()];
    }
    let e = evaluate(&nodes, &Thresholds::default());
    assert_eq!(
        e.verdicts.get("node-03"),
        Some(&NodeVerdict::Failed),
        "{:#?}",
        e.findings
    );
    assert!(
        on(&e, "node-03")
            .iter()
            .any(|f| f.severity == Severity::Critical && f.source == Some(ExpectationSource::Fleet))
    );
    let others = e.verdicts.iter().filter(|(n, _)| n.as_str() != "node-03");
    assert!(others.into_iter().all(|(_, v)| *v == NodeVerdict::Passed));
}
