//! The node-pair rules on documents `fabric-agent node-pair --backend cuda` wrote on a real
//! GPU (`bench/node-pair-check.sh localize`, bench/results/node-pairs-h200-netns-2026-11-24.md):
//! four emulated nodes, each in its own network namespace, NCCL between them over its
//! socket transport, all six pairs per run. Clean runs name nothing; a node whose link is
//! shaped to 2 Gbit/s is named and no other node is; a shaped path between two nodes is a
//! finding on that pair that blames neither node.

use gpufabric_api::pair::{NetTransport, NodePairResult};
use gpufabric_api::{FindingKind, Severity, Subject};
use gpufabric_health::pairs::{Localization, PairObservation, PairRules, localize};
use std::collections::BTreeMap;

/// The documents of each run (the run is the group's middle part, `t/loc/<run>/<a>-<b>`).
fn runs() -> BTreeMap<String, Vec<NodePairResult>> {
    let path = format!(
        "{}/tests/data/h200-netns-node-pairs.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("test data is readable");
    let mut runs: BTreeMap<String, Vec<NodePairResult>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let doc = NodePairResult::parse(line).expect("a node-pair document");
        let run = doc
            .group
            .split('/')
            .nth(2)
            .expect("t/loc/<run>/<pair>")
            .to_string();
        runs.entry(run).or_default().push(doc);
    }
    runs
}

fn localized(docs: &[NodePairResult]) -> (Vec<PairObservation>, Localization) {
    let pairs = PairObservation::from_documents(docs);
    let loc = localize(&pairs, &PairRules::default());
    (pairs, loc)
}

fn of<'a>(
    runs: &'a BTreeMap<String, Vec<NodePairResult>>,
    prefix: &str,
) -> Vec<(&'a String, &'a Vec<NodePairResult>)> {
    runs.iter().filter(|(r, _)| r.starts_with(prefix)).collect()
}

#[test]
fn every_measured_pair_used_sockets_and_checked_its_outputs() {
    for (run, docs) in runs() {
        for d in docs.iter().filter(|d| d.not_measured.is_none()) {
            assert_eq!(d.transport, Some(NetTransport::Socket), "{run}: {d:?}");
            assert_eq!(d.gpus_per_node, 1, "{run}");
            assert_eq!(d.collectives.len(), 2, "{run}: {d:?}");
            assert!(d.collectives.iter().all(|c| c.wrong == 0), "{run}: {d:?}");
        }
    }
}

#[test]
fn clean_runs_name_nothing() {
    let runs = runs();
    let clean = of(&runs, "clean");
    let mut complete = 0;
    for (run, docs) in clean {
        let (pairs, loc) = localized(docs);
        if pairs.len() == 6 {
            complete += 1;
        }
        assert!(loc.findings.is_empty(), "{run}: {:#?}", loc.findings);
        assert!(loc.suspects.is_empty(), "{run}: {:?}", loc.suspects);
    }
    // One of the five clean runs lost its namespaces (the emulation, not the agent): its
    // ranks wrote not-measured documents or none, which count against no node.
    assert!(complete >= 4, "{complete} complete clean runs");
}

#[test]
fn a_shaped_node_link_names_that_node_and_no_other() {
    let runs = runs();
    let shaped = of(&runs, "node2slow");
    assert_eq!(shaped.len(), 3);
    for (run, docs) in shaped {
        let (pairs, loc) = localized(docs);
        assert_eq!(pairs.len(), 6, "{run}");
        assert_eq!(
            loc.blamed_nodes().into_iter().collect::<Vec<_>>(),
            vec!["node2"],
            "{run}: {:#?}",
            loc.findings
        );
        let f = &loc.findings[0];
        assert_eq!(f.kind, FindingKind::Slow, "{run}");
        assert_eq!(f.subject, Subject::node("node2"), "{run}");
        assert!(
            f.message
                .starts_with("node node2: NCCL busbw to 3 partners"),
            "{run}: {}",
            f.message
        );
        assert_eq!(loc.findings.len(), 1, "{run}: {:#?}", loc.findings);
    }
}

#[test]
fn a_shaped_path_is_a_finding_on_the_pair_that_blames_neither_node() {
    let runs = runs();
    let shaped = of(&runs, "path03slow");
    assert_eq!(shaped.len(), 3);
    for (run, docs) in shaped {
        let (pairs, loc) = localized(docs);
        assert_eq!(pairs.len(), 6, "{run}");
        assert!(loc.blamed_nodes().is_empty(), "{run}: {:#?}", loc.findings);
        assert_eq!(loc.findings.len(), 1, "{run}: {:#?}", loc.findings);
        let f = &loc.findings[0];
        assert_eq!(f.severity, Severity::Info, "{run}");
        assert_eq!(f.kind, FindingKind::Slow, "{run}");
        let names = match &f.subject {
            Subject::NodePair { a, b } => {
                let mut v = [a.as_str(), b.as_str()];
                v.sort();
                v
            }
            other => panic!("{run}: a finding on {other:?}"),
        };
        assert_eq!(names, ["node0", "node3"], "{run}");
    }
}
