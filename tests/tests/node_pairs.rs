//! Node pairs end to end without the operator: the rounds planned for a fleet, one real
//! `fabric-agent node-pair` process per node of each pair meeting over TCP (each node on
//! its own loopback address, as pods on their own IPs), and the localization of what they
//! report. Build the agent first: `cargo build -p gpufabric-agent`.

use gpufabric_api::SubjectKind;
use gpufabric_api::baseline::{BaselineKey, FleetBaseline, KeyedSample, RunSample, Series, Spread};
use gpufabric_api::findings::Severity;
use gpufabric_api::pair::NodePairResult;
use gpufabric_api::suite::Pairing;
use gpufabric_health::evaluate::Against;
use gpufabric_health::pairs::{
    Localization, PairObservation, PairRules, confirmation_pairs, localize, localize_against,
    require_confirmation,
};
use gpufabric_operator::pairs::rounds::{Candidate, PairSet, Round, RoundPlan, plan_rounds};
use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const SECRET: &str = "5ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2e75ec2";

/// Eight H200 nodes; `faults` is YAML appended to the named nodes.
fn fleet(dir: &Path, faults: &[(&str, &str)]) -> PathBuf {
    fleet_of(dir, "fleet.yaml", 8, faults)
}

/// `n` H200 nodes in the file `file` of `dir`; `faults` as [`fleet`].
fn fleet_of(dir: &Path, file: &str, n: usize, faults: &[(&str, &str)]) -> PathBuf {
    let mut text = String::from("seed: 3\nnodes:\n");
    for i in 0..n {
        let name = format!("n{i:02}");
        text.push_str(&format!(
            "  - name: {name}\n    product: NVIDIA-H200\n    gpus: 8\n"
        ));
        let mine: Vec<&str> = faults
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, f)| *f)
            .collect();
        if !mine.is_empty() {
            text.push_str(&format!("    faults: [{}]\n", mine.join(", ")));
        }
    }
    let path = dir.join(file);
    std::fs::write(&path, text).expect("write fleet");
    path
}

fn agent() -> PathBuf {
    let path = gpufabric_tests::kubelet::default_agent_bin_dir().join("fabric-agent");
    assert!(
        path.exists(),
        "{} is missing: run `cargo build -p gpufabric-agent` first",
        path.display()
    );
    path
}

/// A port free on 127.0.0.1, used by every rank 0 on its own node address.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("address").port()
}

/// The loopback address of node `n07`: 127.0.1.8.
fn node_addr(node: &str) -> String {
    let index: u8 = node.trim_start_matches('n').parse().unwrap_or(0);
    format!("127.0.1.{}", index + 1)
}

/// One rank of `pair`, with `more` arguments for `fabric-agent node-pair`.
fn spawn_rank(
    fleet: &Path,
    pair: [&str; 2],
    rank: u32,
    group: &str,
    port: u16,
    seed: u64,
    more: &[&str],
) -> Child {
    let mut cmd = Command::new(agent());
    cmd.env_clear()
        .env("FABRIC_RENDEZVOUS_SECRET", SECRET)
        .env("FABRIC_TERMINATION_LOG", "/dev/null")
        .args(["node-pair", "--backend", "sim", "--fleet"])
        .arg(fleet)
        .args(["--nodes", &pair.join(","), "--rank", &rank.to_string()])
        .args(["--rendezvous", &format!("{}:{port}", node_addr(pair[0]))])
        .args(["--group", group, "--rendezvous-timeout", "20"])
        .args(["--seed", &seed.to_string(), "--bytes", "256M"])
        .args(more)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().expect("agent starts")
}

fn document(child: Child) -> NodePairResult {
    let out = child.wait_with_output().expect("agent ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    NodePairResult::parse(last).expect("a node-pair document")
}

/// Runs every round of the plan: the pairs of a round at once, rounds one after another.
fn run_plan(fleet: &Path, plan: &RoundPlan, seed: u64) -> Vec<NodePairResult> {
    let port = free_port();
    let mut docs = Vec::new();
    for (r, round) in plan.rounds.iter().enumerate() {
        let children: Vec<Child> = round
            .pairs
            .iter()
            .enumerate()
            .flat_map(|(p, pair)| {
                let group = format!("run-{seed}/r{r}/p{p}");
                let nodes = [pair.a.as_str(), pair.b.as_str()];
                // The joining rank first: start order must not matter.
                [
                    spawn_rank(fleet, nodes, 1, &group, port, seed, &[]),
                    spawn_rank(fleet, nodes, 0, &group, port, seed, &[]),
                ]
            })
            .collect();
        docs.extend(children.into_iter().map(document));
    }
    docs
}

fn plan() -> RoundPlan {
    plan_of(8)
}

/// The rounds a ring plans for `n` nodes.
fn plan_of(n: usize) -> RoundPlan {
    let nodes: Vec<Candidate> = (0..n)
        .map(|i| Candidate {
            name: format!("n{i:02}"),
            group: None,
        })
        .collect();
    plan_rounds(&nodes, Pairing::Ring, 0)
}

fn localized(docs: &[NodePairResult]) -> Localization {
    localize(
        &PairObservation::from_documents(docs),
        &PairRules::default(),
    )
}

#[test]
fn a_slow_nic_names_its_node_and_a_bad_path_names_the_pair_only() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plan = plan();
    // Round 0 pairs n01 with n06, n02 with n05; round 1 n07 with n05.
    let fleet = fleet(
        dir.path(),
        &[
            ("n05", "{kind: slowNic, factor: 0.3}"),
            ("n01", "{kind: badPath, peer: n06, factor: 0.3}"),
        ],
    );
    let docs = run_plan(&fleet, &plan, 3);
    assert_eq!(docs.len(), 2 * plan.pairs().count());
    let l = localized(&docs);
    assert_eq!(
        l.blamed_nodes().into_iter().collect::<Vec<_>>(),
        vec!["n05"],
        "{:#?}",
        l.findings
    );
    let node = l
        .findings
        .iter()
        .find(|f| f.subject.kind() == SubjectKind::Node)
        .expect("node finding");
    assert!(
        node.message
            .starts_with("node n05: NCCL busbw to 2 partners "),
        "{}",
        node.message
    );
    let paths: Vec<_> = l
        .findings
        .iter()
        .filter(|f| f.subject.kind() == SubjectKind::NodePair)
        .collect();
    assert_eq!(paths.len(), 1, "{paths:#?}");
    assert_eq!(paths[0].subject.to_string(), "n01 <-> n06");
    assert_eq!(paths[0].severity, Severity::Info);
    assert!(l.suspects.is_empty(), "{:?}", l.suspects);
}

/// The test's baseline after one clean run whose pairs are `clean`: what the operator
/// feeds (each pair's busbw, under the run's transport at 256 MiB) and looks up.
fn baseline_after(clean: &[PairObservation]) -> FleetBaseline {
    let transport = clean[0].transport.expect("a transport");
    let values: Vec<f64> = clean.iter().map(|p| p.busbw).collect();
    let sample = KeyedSample {
        key: BaselineKey {
            product: "h200".into(),
            gpus: 8,
            suite: "s".into(),
            settings: "n".into(),
        },
        sample: RunSample {
            run: "clean".into(),
            at: 0,
            nodes: 6,
            series: [(
                Series::NodePair(transport, 256 << 20).to_string(),
                Spread::of(&values).expect("values"),
            )]
            .into(),
        },
    };
    FleetBaseline::default().with_run(&[sample], 1_000)
}

#[test]
fn two_slow_nodes_of_six_are_named_against_the_baseline_though_the_median_pair_is_slow() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plan = plan_of(6);
    // Ring of six: n00-n05, n01-n04, n02-n03, then n00-n04, n05-n03, n01-n02.
    let clean = fleet_of(dir.path(), "clean.yaml", 6, &[]);
    let baseline = baseline_after(&PairObservation::from_documents(&run_plan(
        &clean, &plan, 30,
    )));
    let against = Against {
        baseline: &baseline,
        suite: "s",
        settings: "n",
        now: 2_000,
    };
    let baselines = against.node_pairs(256 << 20);
    assert_eq!(baselines.len(), 1, "{baselines:?}");
    let slow = "{kind: slowNic, factor: 0.3}";
    let slowed = fleet_of(
        dir.path(),
        "slowed.yaml",
        6,
        &[("n04", slow), ("n05", slow)],
    );
    let mut pairs = PairObservation::from_documents(&run_plan(&slowed, &plan, 31));
    let rules = PairRules::default();
    // Four of six pairs slow, the median too: the run alone names nobody.
    assert!(localize(&pairs, &rules).blamed_nodes().is_empty());
    // Against the baseline, the suspects are retested with nodes it calls good.
    let before = localize_against(&pairs, &rules, Some(&baselines));
    let retests = confirmation_pairs(&before, &BTreeSet::new());
    let retested: BTreeSet<String> = retests
        .iter()
        .flat_map(|p| [p.a.clone(), p.b.clone()])
        .collect();
    let confirmation = RoundPlan {
        pairing: Pairing::Ring,
        seed: 0,
        rounds: vec![Round {
            set: PairSet::Within,
            pairs: retests,
        }],
    };
    pairs.extend(PairObservation::from_documents(&run_plan(
        &slowed,
        &confirmation,
        32,
    )));
    let mut after = localize_against(&pairs, &rules, Some(&baselines));
    require_confirmation(&mut after, &retested);
    assert_eq!(
        after.blamed_nodes().into_iter().collect::<Vec<_>>(),
        vec!["n04", "n05"],
        "{:#?}",
        after.findings
    );
}

#[test]
fn a_node_on_sockets_is_a_transport_finding() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fleet = fleet(dir.path(), &[("n03", "{kind: socketFallback}")]);
    let l = localized(&run_plan(&fleet, &plan(), 4));
    assert_eq!(l.findings.len(), 1, "{:#?}", l.findings);
    assert!(
        l.findings[0]
            .message
            .starts_with("node n03: NCCL fell back to sockets with 2 partners"),
        "{}",
        l.findings[0].message
    );
}

#[test]
fn clean_fleets_give_no_finding_in_five_runs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fleet = fleet(dir.path(), &[]);
    for seed in 10..15 {
        let l = localized(&run_plan(&fleet, &plan(), seed));
        assert!(l.findings.is_empty(), "seed {seed}: {:#?}", l.findings);
        assert_eq!(l.known_good.len(), 8);
    }
}

#[test]
fn a_hung_pair_is_its_watchdogs_timeout_on_the_rank_that_hung() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fleet = fleet(dir.path(), &[("n01", "{kind: hang, phase: nodePair}")]);
    let port = free_port();
    let nodes = ["n00", "n01"];
    let timeout = ["--timeout", "1"];
    let started = std::time::Instant::now();
    let r1 = spawn_rank(&fleet, nodes, 1, "hang/r0/p0", port, 5, &timeout);
    let r0 = spawn_rank(&fleet, nodes, 0, "hang/r0/p0", port, 5, &timeout);
    let (d0, d1) = (document(r0), document(r1));
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    // The rank that hung reports its watchdog's timeout and no bandwidth; its peer measured.
    assert!(d1.collectives.is_empty(), "{d1:#?}");
    assert!(
        d1.errors
            .iter()
            .any(|e| e.kind == gpufabric_api::result::ErrorKind::Timeout
                && e.phase == gpufabric_api::result::Phase::NodePair
                && e.message.contains("did not finish within 1.0 s")),
        "{d1:#?}"
    );
    assert!(
        d0.errors.is_empty() && !d0.collectives.is_empty(),
        "{d0:#?}"
    );
}
