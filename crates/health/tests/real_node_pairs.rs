//! The node-pair rules on documents `fabric-agent node-pair --backend cuda` wrote on real
//! GPUs (`bench/node-pair-check.sh localize`): four emulated nodes, each in its own network
//! namespace, NCCL between them over its socket transport, all six pairs per run. Clean
//! runs name nothing; a node whose link is shaped to 2 Gbit/s is named and no other node
//! is; a shaped path between two nodes is a finding on that pair that blames neither node.
//! A run whose namespaces were lost (the emulation, not the agent) has only not-measured
//! documents, and they name nothing either.
//!
//! Two recordings: `h200-netns-node-pairs.jsonl`, four nodes sharing one H200
//! (bench/results/node-pairs-h200-netns-2026-11-24.md), and `h200x4-netns-node-pairs.jsonl`,
//! four nodes of one H200 each (bench/results/node-pairs-h200x4-netns-2026-11-26.md).

use gpufabric_api::pair::{NetTransport, NodePairResult};
use gpufabric_api::{FindingKind, Severity, Subject};
use gpufabric_health::pairs::{Localization, PairObservation, PairRules, localize};
use std::collections::BTreeMap;

/// A recording, and how many of its runs of each kind kept their namespaces throughout.
struct Recording {
    file: &'static str,
    complete_clean: usize,
    complete_node_shaped: usize,
    complete_path_shaped: usize,
}

const RECORDINGS: [Recording; 2] = [
    Recording {
        file: "h200-netns-node-pairs.jsonl",
        complete_clean: 4,
        complete_node_shaped: 3,
        complete_path_shaped: 3,
    },
    Recording {
        file: "h200x4-netns-node-pairs.jsonl",
        complete_clean: 4,
        complete_node_shaped: 2,
        complete_path_shaped: 2,
    },
];

/// The documents of each run (the run is the group's middle part, `t/loc/<run>/<a>-<b>`).
fn runs(file: &str) -> BTreeMap<String, Vec<NodePairResult>> {
    let path = format!("{}/tests/data/{file}", env!("CARGO_MANIFEST_DIR"));
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

/// A run is complete when all six pairs were measured; an incomplete one (its namespaces
/// lost) has nothing measured at all and names nobody.
fn complete(run: &str, docs: &[NodePairResult]) -> Option<Localization> {
    let (pairs, loc) = localized(docs);
    if pairs.len() == 6 {
        return Some(loc);
    }
    assert!(
        docs.iter().all(|d| d.not_measured.is_some()),
        "{run}: an incomplete run with a measured document"
    );
    assert!(loc.findings.is_empty(), "{run}: {:#?}", loc.findings);
    assert!(loc.suspects.is_empty(), "{run}: {:?}", loc.suspects);
    None
}

#[test]
fn every_measured_pair_used_sockets_and_checked_its_outputs() {
    for rec in &RECORDINGS {
        for (run, docs) in runs(rec.file) {
            for d in docs.iter().filter(|d| d.not_measured.is_none()) {
                assert_eq!(d.transport, Some(NetTransport::Socket), "{run}: {d:?}");
                assert_eq!(d.gpus_per_node, 1, "{run}");
                assert_eq!(d.collectives.len(), 2, "{run}: {d:?}");
                assert!(d.collectives.iter().all(|c| c.wrong == 0), "{run}: {d:?}");
            }
        }
    }
}

#[test]
fn clean_runs_name_nothing() {
    for rec in &RECORDINGS {
        // The incomplete runs name nothing either: `complete` checks them.
        for (run, loc) in complete_runs(rec, "clean", 5, rec.complete_clean) {
            assert!(loc.findings.is_empty(), "{run}: {:#?}", loc.findings);
            assert!(loc.suspects.is_empty(), "{run}: {:?}", loc.suspects);
        }
    }
}

/// The localizations of a recording's complete runs named `prefix<N>`, after checking that
/// it has `total` such runs and `expected` of them kept their namespaces.
fn complete_runs(
    rec: &Recording,
    prefix: &str,
    total: usize,
    expected: usize,
) -> Vec<(String, Localization)> {
    let runs = runs(rec.file);
    let named = of(&runs, prefix);
    assert_eq!(named.len(), total, "{}", rec.file);
    let done: Vec<(String, Localization)> = named
        .into_iter()
        .filter_map(|(run, docs)| complete(run, docs).map(|loc| (run.clone(), loc)))
        .collect();
    assert_eq!(done.len(), expected, "{}: complete {prefix} runs", rec.file);
    done
}

#[test]
fn a_shaped_node_link_names_that_node_and_no_other() {
    for rec in &RECORDINGS {
        for (run, loc) in complete_runs(rec, "node2slow", 3, rec.complete_node_shaped) {
            assert_eq!(
                loc.blamed_nodes().into_iter().collect::<Vec<_>>(),
                vec!["node2"],
                "{run}: {:#?}",
                loc.findings
            );
            assert_eq!(loc.findings.len(), 1, "{run}: {:#?}", loc.findings);
            let f = &loc.findings[0];
            assert_eq!(f.kind, FindingKind::Slow, "{run}");
            assert_eq!(f.subject, Subject::node("node2"), "{run}");
            assert!(
                f.message
                    .starts_with("node node2: NCCL busbw to 3 partners"),
                "{run}: {}",
                f.message
            );
        }
    }
}

#[test]
fn a_shaped_path_is_a_finding_on_the_pair_that_blames_neither_node() {
    for rec in &RECORDINGS {
        for (run, loc) in complete_runs(rec, "path03slow", 3, rec.complete_path_shaped) {
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
}
