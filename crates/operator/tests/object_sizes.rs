//! Every object the operator writes stays below 256 KiB at 10,000 nodes, in the worst case:
//! every node failed, with long names, reasons and findings. Built with the same functions
//! the controllers write with (shards, the run's bounded status, the test's bounded
//! history).

use gpufabric_api::findings::{Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::outcome::HardwareFault;
use gpufabric_api::pair::{NetTransport, PairRecord, PairState};
use gpufabric_api::run::{
    FabricTestRun, FabricTestRunSpec, FabricTestRunStatus, NodeRunResult, NodeVerdict, RunPhase,
    RunProgress, SkipReason, SkippedNode, Trigger,
};
use gpufabric_api::shard::FabricTestRunShardStatus;
use gpufabric_api::standing::Standing;
use gpufabric_api::test::{FabricTest, FabricTestStatus, NodeHealth};
use gpufabric_operator::shards;
use gpufabric_operator::status as st;

const NODES: usize = 10_000;
const LIMIT: usize = 256 * 1024;

/// A 63-character node name (the longest a node label value holds).
fn node(i: usize) -> String {
    format!(
        "gpu-h100-sxm5-rack{:03}-unit{i:05}-{}",
        i / 40,
        "x".repeat(26)
    )
}

fn failed(i: usize) -> NodeRunResult {
    NodeRunResult {
        node: node(i),
        verdict: NodeVerdict::Errored,
        pod: Some(format!("nightly-29000000-{}", node(i))),
        pod_uid: Some("0b9a4f7e-63c4-4a8e-9d61-2f0e5c1d7a33".into()),
        product: Some("NVIDIA-H100-80GB-HBM3".into()),
        gpus: Some(8),
        reason: Some("r".repeat(2000)),
        hardware_fault: Some(HardwareFault::GpuUnusable),
        not_measured: None,
        // The numbers as `NodeRunResult::record` keeps them: four significant digits.
        all_reduce_bus_bw_gbps: Some(123.5),
        min_pair_gbps: Some(98.77),
        ddp_efficiency: Some(0.812345),
        min_host_gbps: Some(45.35),
        ddp_step_ms: Some(26.57),
        findings: 12,
        finding: Some("f".repeat(2000)),
        pairs: Vec::new(),
        confirmed: false,
        unmeasured: vec!["ncclSweep".into(), "gpuPairs".into(), "ddpProbe".into()],
    }
}

/// A node that passed its own check and then failed its node-pair tests: the most pair
/// records a node gets (3 rounds within its group, 2 across groups, 1 retest), every one
/// not measured with a long message, and port findings on each.
fn paired(i: usize) -> NodeRunResult {
    let nic = Finding::new(
        FindingKind::NicDown,
        Subject::nic(node(i), "mlx5_10 port 1"),
        Metric::NicLink,
        Severity::Critical,
        "n".repeat(600),
    );
    NodeRunResult {
        reason: None,
        hardware_fault: None,
        verdict: NodeVerdict::Failed,
        confirmed: true,
        pairs: (0..6)
            .map(|r| PairRecord {
                round: r + 1,
                index: 9999,
                partner: node(i + 1),
                rank: r % 2,
                across: r >= 3,
                confirmation: r == 5,
                state: PairState::NotMeasured,
                busbw_gbps: Some(123.456789),
                transport: Some(NetTransport::Socket),
                nics_used: Some(16),
                nic_findings: vec![nic.clone(); 16],
                nic_readings: u32::MAX,
                message: Some("p".repeat(2000)),
                pod_uid: Some("0b9a4f7e-63c4-4a8e-9d61-2f0e5c1d7a33".into()),
            })
            .collect(),
        ..failed(i)
    }
}

fn finding(i: usize, k: usize) -> Finding {
    let mut f = Finding::new(
        FindingKind::Slow,
        Subject::node(node(i)),
        Metric::NcclBusBw,
        if k == 0 {
            Severity::Critical
        } else {
            Severity::Info
        },
        "m".repeat(300),
    );
    f.measured = Some(123.456789);
    f.expected = Some(456.789012);
    f.deviation = Some(-0.7297);
    f.unit = Some("GB/s".into());
    f
}

fn run() -> FabricTestRun {
    let mut r = FabricTestRun::new(
        "nightly-29000000",
        FabricTestRunSpec::of_test(
            "nightly",
            &Default::default(),
            Trigger::Schedule,
            None,
            None,
        ),
    );
    r.metadata.namespace = Some("gpu".into());
    r.metadata.uid = Some("0b1e7d1c-5f0e-4d8e-9a61-2b7f3c0d9e11".into());
    r
}

fn size<T: serde::Serialize>(v: &T) -> usize {
    serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX)
}

#[test]
fn every_object_of_a_10000_node_run_stays_below_256_kib() {
    // Every node failed with long texts; the second half after node-pair tests as well.
    let nodes: Vec<NodeRunResult> = (0..NODES)
        .map(|i| if i < NODES / 2 { failed(i) } else { paired(i) })
        .collect();
    let names: Vec<String> = nodes.iter().map(|n| n.node.clone()).collect();

    // Shards: every node's result.
    let mut shard_objects = shards::build(&run(), &names).expect("shards");
    let per_shard = gpufabric_api::shard::NODES_PER_SHARD;
    assert_eq!(shard_objects.len(), NODES.div_ceil(per_shard));
    let mut largest_shard = 0;
    for (s, chunk) in shard_objects.iter_mut().zip(nodes.chunks(per_shard)) {
        s.status = Some(FabricTestRunShardStatus::of(chunk.to_vec()));
        largest_shard = largest_shard.max(size(s));
    }
    let back: usize = shard_objects
        .iter()
        .map(|s| s.status.as_ref().map_or(0, |s| s.nodes.len()))
        .sum();
    assert_eq!(back, NODES, "every node's result is in a shard");

    // The run: counts, progress, the worst nodes, capped findings and skipped nodes.
    let findings: Vec<Finding> = (0..NODES)
        .flat_map(|i| (0..3).map(move |k| finding(i, k)))
        .collect();
    let (kept, _) = st::findings_for_status(findings.clone());
    let mut r = run();
    let mut status = FabricTestRunStatus {
        phase: RunPhase::Succeeded,
        node_count: NODES as u32,
        shards: NODES.div_ceil(per_shard) as u32,
        progress: Some(RunProgress {
            done: NODES as u32,
            total: NODES as u32,
            wave: 10,
            waves: 10,
            wave_size: 1000,
            ..Default::default()
        }),
        nodes: st::nodes_for_run_status(&nodes),
        findings: kept,
        finding_count: findings.len() as u32,
        skipped: (0..NODES)
            .map(|i| SkippedNode {
                node: node(i),
                reason: SkipReason::Tainted,
                message: "t".repeat(200),
            })
            .take(st::MAX_SKIPPED_IN_STATUS)
            .collect(),
        skipped_count: NODES as u32,
        message: Some("m".repeat(2000)),
        ..Default::default()
    };
    st::set_counts(&mut status, &nodes);
    assert_eq!(status.errored + status.failed, NODES as u32);
    r.status = Some(status);
    let run_bytes = size(&r);

    // The test: every node failing, half of them quarantined, all with a history.
    let history: Vec<NodeHealth> = (0..NODES)
        .map(|i| NodeHealth {
            node: node(i),
            verdict: NodeVerdict::Failed,
            consecutive_failures: 7,
            consecutive_passes: 0,
            standing: if i % 2 == 0 {
                Standing::Quarantined { hardware: false }
            } else {
                Standing::HeldBack {
                    why: "h".repeat(200),
                    hardware: false,
                }
            },
            quarantined_since: None,
            held_back: Some("h".repeat(200)),
            last_finding: Some("f".repeat(300)),
            last_run: Some("nightly-29000000".into()),
            ..Default::default()
        })
        .collect();
    let mut test_status = FabricTestStatus {
        nodes: history,
        quarantined_nodes: (0..NODES).step_by(2).map(node).collect(),
        quarantined_count: (NODES / 2) as u32,
        ..Default::default()
    };
    st::bound_test_status(&mut test_status);
    assert_eq!(test_status.nodes.len(), st::MAX_NODES_IN_TEST_STATUS);
    assert!(
        test_status
            .nodes
            .iter()
            .all(|h| h.standing.is_quarantined()),
        "quarantined nodes are listed first"
    );
    let mut t = FabricTest::new("nightly", Default::default());
    t.status = Some(test_status);
    let test_bytes = size(&t);

    eprintln!(
        "10000 failing nodes: largest shard {largest_shard} B, run {run_bytes} B, test {test_bytes} B"
    );
    for (what, bytes) in [
        ("a shard", largest_shard),
        ("the run", run_bytes),
        ("the test", test_bytes),
    ] {
        assert!(bytes < LIMIT, "{what} is {bytes} bytes at {NODES} nodes");
    }
}
