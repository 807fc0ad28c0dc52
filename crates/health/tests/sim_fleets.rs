//! The rules on what the agent really writes: the sim backend's documents for the sample
//! fleets (crates/measure/fleets), compacted as in a termination message, then evaluated.

use gpufabric_api::outcome::{HardwareFault, NotMeasuredReason};
use gpufabric_api::result::{CompactResult, Transport};
use gpufabric_api::run::NodeVerdict;
use gpufabric_api::{FindingKind, Metric, Severity, Subject, Suite};
use gpufabric_health::{NodeInput, NodeOutcome, evaluate};
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_measure::{CheckOptions, sim};
use std::path::Path;
use std::time::Duration;

fn load(name: &str) -> Fleet {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../measure/fleets")
        .join(name);
    Fleet::load(&path).expect("sample fleet loads")
}

/// What the operator would hand to `evaluate` for each node of a simulated run.
fn run_fleet(fleet: &Fleet) -> Vec<NodeInput> {
    let progress = |_: &str| {};
    fleet
        .nodes
        .iter()
        .map(|node| {
            let outcome = if node
                .faults
                .iter()
                .any(|f| matches!(f, Fault::Hang { stuck: true, .. }))
            {
                NodeOutcome::hardware(
                    HardwareFault::Hang,
                    "the agent had started and ran past the pod deadline",
                )
            } else {
                match sim::process_fault(node) {
                    Some(sim::ProcessFault::Crash { exit_code }) => NodeOutcome::hardware(
                        HardwareFault::Crash,
                        format!("the agent exited without a result (exit code {exit_code})"),
                    ),
                    Some(sim::ProcessFault::Garbage) => NodeOutcome::not_measured(
                        NotMeasuredReason::AgentBug,
                        "the result document is not valid JSON",
                    ),
                    None => {
                        let opts = CheckOptions {
                            node: node.name.clone(),
                            suite: Suite::default(),
                            quick: true,
                            expect_gpus: None,
                            phase_timeout: Duration::from_millis(300),
                            shared_gpus: false,
                        };
                        let doc = sim::node_check(&opts, node, fleet.seed, &progress)
                            .expect("the sim measures every node without a process fault");
                        let text =
                            doc.compact_within(gpufabric_api::keys::TERMINATION_MESSAGE_LIMIT);
                        NodeOutcome::Measured(Box::new(
                            CompactResult::parse(&text).expect("compact parses"),
                        ))
                    }
                }
            };
            NodeInput {
                baseline: None,
                history: Vec::new(),
                nccl_tuning: Vec::new(),
                node: node.name.clone(),
                product_label: Some(node.product.clone()),
                expected_gpus: Some(node.gpus),
                outcome,
            }
        })
        .collect()
}

#[test]
fn demo_fleet_names_exactly_the_slow_pair_and_the_straggler() {
    let fleet = load("demo-16.yaml");
    let e = evaluate(&run_fleet(&fleet), &Default::default());
    let critical: Vec<_> = e
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Critical)
        .collect();
    assert_eq!(critical.len(), 2, "{:#?}", e.findings);
    assert_eq!(critical[0].subject, Subject::gpu_pair("h100-03", 2, 5));
    assert_eq!(critical[0].kind, FindingKind::Slow);
    assert_eq!(critical[0].metric, Metric::PairBandwidth);
    assert_eq!(critical[1].subject, Subject::gpu("h200-05", 6));
    assert_eq!(critical[1].kind, FindingKind::Straggler);
    for (node, v) in &e.verdicts {
        let bad = node == "h100-03" || node == "h200-05";
        assert_eq!(
            *v,
            if bad {
                NodeVerdict::Failed
            } else {
                NodeVerdict::Passed
            },
            "{node}"
        );
    }
    assert!(
        e.findings.len() == 2,
        "no Info findings on a healthy simulated fleet either: {:#?}",
        e.findings
    );
}

#[test]
fn every_fault_kind_is_found_at_its_part_and_the_clean_node_passes() {
    let fleet = load("faults.yaml");
    let e = evaluate(&run_fleet(&fleet), &Default::default());
    let kinds_on = |node: &str| -> Vec<(FindingKind, Subject)> {
        e.findings_of(node)
            .filter(|f| f.severity == Severity::Critical)
            .map(|f| (f.kind, f.subject.clone()))
            .collect()
    };
    assert_eq!(e.verdicts["clean"], NodeVerdict::Passed);
    assert!(kinds_on("clean").is_empty(), "{:#?}", kinds_on("clean"));
    assert_eq!(
        kinds_on("slow-pair"),
        vec![(FindingKind::Slow, Subject::gpu_pair("slow-pair", 1, 6))]
    );
    assert_eq!(
        kinds_on("straggler"),
        vec![(FindingKind::Straggler, Subject::gpu("straggler", 4))]
    );
    assert_eq!(
        kinds_on("sdc"),
        vec![(FindingKind::WrongResults, Subject::gpu("sdc", 6))]
    );
    assert_eq!(
        kinds_on("slow-memory"),
        vec![(FindingKind::Straggler, Subject::gpu("slow-memory", 1))]
    );
    let dead = kinds_on("dead-link");
    assert!(
        dead.contains(&(FindingKind::NvlinkDown, Subject::gpu("dead-link", 2))),
        "{dead:#?}"
    );
    assert!(
        dead.iter().all(|(k, _)| *k != FindingKind::Slow),
        "{dead:#?}"
    );
    let fb = kinds_on("fallback");
    assert_eq!(
        fb,
        vec![(
            FindingKind::TransportFallback,
            Subject::gpu_pair("fallback", 0, 7)
        )],
        "{:#?}",
        e.findings_of("fallback").collect::<Vec<_>>()
    );
    let hw = kinds_on("xid-ecc-pcie");
    for want in [
        (FindingKind::Xid, Subject::gpu("xid-ecc-pcie", 3)),
        (
            FindingKind::EccUncorrectable,
            Subject::gpu("xid-ecc-pcie", 5),
        ),
        (FindingKind::PcieDegraded, Subject::gpu("xid-ecc-pcie", 0)),
    ] {
        assert!(hw.contains(&want), "{want:?} missing from {hw:#?}");
    }
    assert!(hw.iter().all(|(k, _)| *k != FindingKind::Slow), "{hw:#?}");
    // A slow NIC shows only in node-pair tests, which this node check does not run.
    assert_eq!(e.verdicts["slow-nic"], NodeVerdict::Passed);
    // So do a port's growing error counters.
    assert_eq!(e.verdicts["nic-errors"], NodeVerdict::Passed);
    let hang = kinds_on("hang");
    assert!(
        hang.iter().any(|(k, _)| *k == FindingKind::Timeout),
        "{hang:#?}"
    );
    assert_eq!(e.verdicts["hang"], NodeVerdict::Failed);
    assert_eq!(e.verdicts["stuck"], NodeVerdict::Timeout);
    assert_eq!(e.verdicts["crash"], NodeVerdict::Errored);
    assert_eq!(
        kinds_on("crash"),
        vec![(FindingKind::Crash, Subject::node("crash"))]
    );
    // An unreadable result is the agent's fault: the node is not measured, not failed.
    assert_eq!(e.verdicts["garbage"], NodeVerdict::NotMeasured);
    assert!(e.findings.iter().all(|f| !(f.kind == FindingKind::Slow
        && matches!(
            f.subject.node_name(),
            "crash" | "garbage" | "stuck" | "hang"
        ))));
    let _ = Transport::Shm;
}

#[test]
#[ignore = "prints the findings of the sample fleets, for a person to read"]
fn print_sample_fleet_findings() {
    for name in ["demo-16.yaml", "faults.yaml"] {
        let e = evaluate(&run_fleet(&load(name)), &Default::default());
        eprintln!("== {name}");
        for f in &e.findings {
            eprintln!(
                "{:?} {:?} {} [{:?} {:?}] {}",
                f.severity, f.kind, f.subject, f.metric, f.source, f.message
            );
        }
    }
}
