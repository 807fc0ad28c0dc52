//! Suites of every size on a healthy 4 x H200 node: each collective held to what healthy nodes
//! reach at the sweep's own largest size, and the faults still named in the default suite.

use super::*;

const H200: &str = "NVIDIA H200";

/// The median one-way pair copy of the 4 x H200 reports (393-395 GB/s at 256 MiB).
const PAIR: f64 = 394.0;

/// One suite and the lowest peak bus bandwidth a healthy 4 x H200 node read in it, by
/// collective in the order of [`Collective::ALL`] (GB/s).
struct Suite {
    name: &'static str,
    largest: u64,
    busbw: [f64; 7],
}

/// The suites a healthy node must pass, with the lowest numbers of the 4 x H200 reports:
/// `--quick` (2 warm-up and 5 timed iterations up to 64 MiB; broadcast, alltoall and sendrecv
/// the three quick checks that failed before sweeps knew their size, the rest the 64 MiB row
/// of the default checks), `-e 64M` and `-e 256M` (the rows of
/// `h200x4-2026-11-21-final/full.json` and `h200x4-2026-11-26-states/gpu-use-during/
/// clean-default-*.json` at those sizes), and the default suite (its 1 GiB row).
const SUITES: &[Suite] = &[
    Suite {
        name: "quick",
        largest: 64 << 20,
        busbw: [307.0, 264.0, 266.0, 257.0, 318.0, 254.0, 152.0],
    },
    Suite {
        name: "-e 64M",
        largest: 64 << 20,
        busbw: [307.0, 264.0, 266.0, 308.0, 318.0, 252.0, 154.0],
    },
    Suite {
        name: "-e 256M",
        largest: 256 << 20,
        busbw: [337.0, 304.0, 301.0, 347.0, 353.0, 292.0, 300.0],
    },
    Suite {
        name: "default",
        largest: 1 << 30,
        busbw: [353.0, 324.0, 324.0, 358.0, 362.0, 334.0, 358.0],
    },
];

/// A 4 x H200 node on NVSwitch whose pairs copy at [`PAIR`] and whose sweep ended at
/// `largest` with `busbw` per collective.
fn h200(name: &str, largest: u64, busbw: [f64; 7]) -> CompactResult {
    let mut r = node_of(name, H200, 4, 7, 0.0);
    for h in &mut r.health {
        h.nvlink_link_gbps = 25.0;
        h.nvlink_switch = Some(true);
    }
    for v in r.copy_uni.iter_mut().filter(|v| **v > 0.0) {
        *v = PAIR;
    }
    r.collectives = Collective::ALL
        .iter()
        .zip(busbw)
        .map(|(c, bw)| CompactCollective {
            collective: *c,
            peak_busbw: bw,
            largest_busbw: bw,
            smallest_time_us: 25.0,
            alpha_beta: None,
            wrong: 0,
            largest_bytes: Some(largest),
        })
        .collect();
    r
}

fn slow_findings(e: &Evaluation, node: &str) -> Vec<Finding> {
    e.findings_of(node)
        .filter(|f| f.severity == Severity::Critical && f.metric == Metric::NcclBusBw)
        .cloned()
        .collect()
}

#[test]
fn a_healthy_node_passes_every_suite_size_alone() {
    for s in SUITES {
        let e = run(vec![h200("healthy", s.largest, s.busbw)]);
        assert_eq!(
            e.verdicts["healthy"],
            NodeVerdict::Passed,
            "{}: {:#?}",
            s.name,
            e.findings
        );
        assert!(
            e.findings_of("healthy")
                .all(|f| f.severity != Severity::Critical),
            "{}: {:#?}",
            s.name,
            e.findings
        );
    }
}

#[test]
fn a_short_sweep_is_held_to_what_healthy_nodes_reach_at_its_own_size() {
    // The quick check's broadcast at 64 MiB (257 GB/s, 65% of the pair copy) fails against
    // what healthy nodes reach at 1 GiB, and passes against the 64 MiB profile.
    let quick = &SUITES[0];
    let mut as_if_full = quick.busbw;
    as_if_full[3] = 257.0;
    let e = run(vec![h200("full-size", 1 << 30, as_if_full)]);
    assert!(
        slow_findings(&e, "full-size")
            .iter()
            .any(|f| f.collective == Some(Collective::Broadcast)),
        "{:#?}",
        e.findings
    );
    let e = run(vec![h200("quick", quick.largest, quick.busbw)]);
    assert!(slow_findings(&e, "quick").is_empty(), "{:#?}", e.findings);
    // A short sweep a quarter below its own size's profile still fails, and says its size.
    let mut low = quick.busbw;
    low[3] = 0.7 * 0.718 * 0.911 * PAIR;
    let e = run(vec![h200("quick-slow", quick.largest, low)]);
    let bad = slow_findings(&e, "quick-slow");
    assert_eq!(bad.len(), 1, "{bad:#?}");
    assert_eq!(bad[0].collective, Some(Collective::Broadcast));
    assert!(
        bad[0].message.contains("in a sweep that ends at 64 MiB"),
        "{}",
        bad[0].message
    );
}

#[test]
fn nvlink_unused_fails_every_collective_at_every_size() {
    // NCCL_P2P_DISABLE=1 on 4 x H200: every collective about 30 GB/s.
    for s in SUITES {
        let e = run(vec![h200("p2p-off", s.largest, [30.0; 7])]);
        assert_eq!(e.verdicts["p2p-off"], NodeVerdict::Failed, "{}", s.name);
        assert_eq!(slow_findings(&e, "p2p-off").len(), 7, "{}", s.name);
    }
}

#[test]
fn a_small_nccl_buffer_still_fails_the_default_suite() {
    // all_gather 27% and broadcast 33% below a healthy node's default sweep.
    let default = SUITES.last().map(|s| s.busbw).unwrap_or_default();
    let mut busbw = default;
    busbw[1] *= 0.73;
    busbw[3] *= 0.67;
    let e = run(vec![h200("small-buffer", 1 << 30, busbw)]);
    let named: BTreeSet<_> = slow_findings(&e, "small-buffer")
        .iter()
        .filter_map(|f| f.collective)
        .collect();
    assert_eq!(
        named,
        BTreeSet::from([Collective::AllGather, Collective::Broadcast]),
        "{:#?}",
        e.findings
    );
}

#[test]
fn a_sweep_that_ends_below_the_profile_is_not_held_to_it() {
    // Up to 32 MiB: below what the profile knows; all_reduce says it was not judged.
    let e = run(vec![h200("latency", 32 << 20, [30.0; 7])]);
    assert!(slow_findings(&e, "latency").is_empty(), "{:#?}", e.findings);
    assert!(
        e.findings_of("latency")
            .any(|f| f.severity == Severity::Info && f.message.contains("not judged")),
        "{:#?}",
        e.findings
    );
}
