use super::*;
use crate::fixtures;
use crate::output::{Format, render};

fn report() -> Report {
    let nodes = [
        fixtures::node("h200-02", Some(fixtures::RECORD)),
        fixtures::node("h100-00", None),
    ];
    Report {
        run: fixtures::run(),
        pairs: pair_rows(&[fixtures::shard()]),
        quarantine: Some(Quarantine::of(&fixtures::test(), &nodes)),
    }
}

#[test]
fn pairs_are_listed_once_from_their_rank_0_node_by_round() {
    let rows = pair_rows(&[fixtures::shard()]);
    let pairs: Vec<(u32, &str, &str)> = rows
        .iter()
        .map(|p| (p.round, p.a.as_str(), p.b.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [(1, "h100-05", "h200-02"), (4, "h200-02", "h100-00")]
    );
}

#[test]
fn a_second_confirmation_round_is_named_beside_the_first() {
    let mut np = gpufabric_api::pair::NodePairsStatus {
        confirmation_round: Some(3),
        retested: 5,
        ..Default::default()
    };
    assert_eq!(retest_words(&np), ", round 3 retests 5 suspect(s)");
    np.second_confirmation_round = Some(4);
    np.retested = 7;
    assert_eq!(retest_words(&np), ", rounds 3 and 4 retest 7 suspect(s)");
    assert_eq!(retest_words(&Default::default()), "");
}

#[test]
fn the_report_prints_the_demos_tables() {
    let text = render(&report(), &Format::Table).expect("text");
    for needle in [
        "==> run nightly-manual-1 (manual): per-node results",
        "h100-03  Failed       NVIDIA-H100-80GB-HBM3  361.5           95.0           0.970    1",
        "==> findings (2)",
        "Critical  h100-03  gpu 2<->5    pairBandwidth  95.00 GB/s  300.00 GB/s  -68%       GPU pair 2-5 copies at 95 GB/s",
        "Info      h100-05  <-> h200-02  nodePairBusBw",
        "rounds, round 4 retests 1 suspect(s), 2 pairs: 2 measured, 0 not measured, 0 errored; median 48.5 GB/s)",
        "1           h100-05 <-> h200-02  Measured  13.0        ib",
        "4 (retest)  h200-02 <-> h100-00  Measured  12.5        ib",
        "==> run nightly-manual-1: multi-node DDP probe over h100-00, h100-01 (Measured)",
        "2      16    21.00    95.2%",
        "    straggler: h100-01 computes a step 30.0% slower than the fastest node",
        "    nightly holds 1 node(s) in quarantine: h200-02",
        "h200-02  true      true              true",
        "h100-03  would quarantine: the budget",
        "h200-07  nightly-manual-1  skipped: Busy  8 of 8 GPUs in use",
        "h100-09  nightly-manual-1  Evicted",
    ] {
        assert!(text.contains(needle), "{needle:?} missing in:\n{text}");
    }
    // A node without marks is not in the quarantine table.
    assert!(!text.contains("h100-00  false"), "{text}");
}

#[test]
fn the_report_lists_the_gpus_its_test_took_out_of_service() {
    let mut r = report();
    r.quarantine = Some(Quarantine::of(
        &fixtures::with_tainted_gpus(fixtures::test()),
        &[],
    ));
    let text = render(&r, &Format::Table).expect("text");
    assert!(
        text.contains(
            "==> GPUs out of service (DRA device taints; the node itself stays schedulable)"
        ),
        "{text}"
    );
    assert!(
        text.contains("h100-03  nightly  5    gpu.nvidia.com/h100-03/gpu-5  2026-11-21T02:04:10Z  gpufabric-gpu-q9w4z  GPU 5 computes a step 1.5x slower"),
        "{text}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&render(&r, &Format::Json).expect("json")).expect("parses");
    assert_eq!(
        json["quarantine"]["gpusOutOfService"][1]["device"],
        "gpu.nvidia.com/h100-03/gpu-2"
    );
    let plain = render(&report(), &Format::Table).expect("text");
    assert!(!plain.contains("GPUs out of service"), "{plain}");
}

#[test]
fn the_report_draws_the_nccl_curves_as_nodes_by_collective_per_block_and_names_knees_and_slow_blocks()
 {
    let mut r = report();
    if let Some(s) = r.run.status.as_mut() {
        s.nccl_nodes = Some(fixtures::nccl_nodes());
    }
    let text = render(&r, &Format::Table).expect("text");
    for needle in [
        "==> run nightly-manual-1: multi-node NCCL sweep over h100-00, h100-01, h100-02, h100-03 (Measured)",
        "NODES  RANKS  ALL_REDUCE busbw GB/s  ALL_REDUCE small us  ALL_REDUCE links GB/s  ALLTOALL busbw GB/s  ALLTOALL small us",
        "2      16     45.5                   41.2                 400.0 (11%)            38.0                 41.2",
        "4      32     14.0",
        "    links from 2 nodes: bounded by h100-01 (8 rails, 400.0 GB/s)",
        "    knee: all_reduce loses 69% of its bus bandwidth from 2 to 4 nodes",
    ] {
        assert!(text.contains(needle), "{needle:?} missing in:\n{text}");
    }

    // In topology blocks: the sweep across them, each block's, and the slow block named.
    if let Some(s) = r.run.status.as_mut() {
        s.nccl_nodes = Some(fixtures::in_blocks(fixtures::nccl_nodes()));
    }
    let text = render(&r, &Format::Table).expect("text");
    for needle in [
        "multi-node NCCL sweep across blocks of example.com/rack over h100-00",
        "multi-node NCCL sweep in block example.com/rack=rack-b over h100-02, h100-03 (Measured)",
        "2      16     9.5",
        "slow block: all_reduce over 2 nodes of block example.com/rack=rack-b reached 9.5 GB/s",
    ] {
        assert!(text.contains(needle), "{needle:?} missing in:\n{text}");
    }

    // A count far below its links is said once, under the sweeps.
    let p = fixtures::nccl_nodes_far_below_links();
    if let Some(s) = r.run.status.as_mut() {
        s.nccl_nodes = Some(p);
    }
    let text = render(&r, &Format::Table).expect("text");
    assert_eq!(
        text.matches("far below the links: all_reduce over 4 nodes reached 14.0 GB/s")
            .count(),
        1,
        "{text}"
    );
}

#[test]
fn a_run_without_pairs_probe_or_skipped_nodes_has_none_of_their_sections() {
    let mut run = fixtures::run();
    if let Some(s) = run.status.as_mut() {
        s.node_pairs = None;
        s.ddp_nodes = None;
        s.skipped.clear();
        s.nodes.retain(|n| n.not_measured.is_none());
    }
    let r = Report {
        run,
        pairs: Vec::new(),
        quarantine: None,
    };
    let text = render(&r, &Format::Table).expect("text");
    assert!(!text.contains("node pairs"), "{text}");
    assert!(!text.contains("multi-node"), "{text}");
    assert!(!text.contains("quarantined nodes"), "{text}");
    assert!(
        text.ends_with(
            "==> nodes not measured (infrastructure, never held against the node)\n    none\n"
        ),
        "{text}"
    );
}

#[test]
fn json_and_yaml_carry_the_run_pairs_and_quarantine() {
    let r = report();
    let json: serde_json::Value =
        serde_json::from_str(&render(&r, &Format::Json).expect("json")).expect("parses");
    assert_eq!(json["run"]["metadata"]["name"], "nightly-manual-1");
    assert_eq!(json["run"]["status"]["findings"][0]["severity"], "Critical");
    assert_eq!(json["pairs"][1]["confirmation"], true);
    assert_eq!(json["pairs"][1]["busbwGbps"], 12.5);
    assert_eq!(json["quarantine"]["quarantined"][0], "h200-02");
    assert_eq!(json["quarantine"]["marked"][0]["cordoned"], true);
    assert_eq!(json["quarantine"]["heldBack"][0]["node"], "h100-03");
    let yaml: serde_json::Value =
        serde_yaml::from_str(&render(&r, &Format::Yaml).expect("yaml")).expect("parses");
    assert_eq!(yaml, json);
}

#[test]
fn the_pair_phase_says_which_pairs_it_could_not_measure() {
    let mut r = report();
    let said = |r: &Report| pairs_doc(&r.run, &r.pairs).render();
    assert!(!said(&r).contains("note:"), "{}", said(&r));
    let note = "1 of 2 node pairs not measured, judging none of their 2 nodes; \
                the most common reason (1 of 1): rendezvous timed out after 60 s";
    if let Some(np) = r.run.status.as_mut().and_then(|s| s.node_pairs.as_mut()) {
        np.message = Some(note.into());
    }
    assert!(said(&r).contains(&format!("note: {note}")), "{}", said(&r));
}
