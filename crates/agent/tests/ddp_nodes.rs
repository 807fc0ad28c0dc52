//! `fabric-agent ddp-nodes` end to end on the sim backend: four agent processes meet over
//! TCP on loopback, measure 1, 2 and 4 nodes, and each writes the same points; a straggler
//! node is named; a rank that never arrives is named within the rendezvous timeout.

mod common;

use common::{EXIT_NOT_MEASURED, RankEnv, SECRET, agent, assert_every_rank_measured, finish_rank};
use gpufabric_api::ddp_nodes::DdpNodesResult;
use std::process::{Child, Output};
use std::time::{Duration, Instant};

const FLEET: &str = r#"
seed: 9
nodes:
  - {name: a, product: NVIDIA-H200, gpus: 8}
  - {name: b, product: NVIDIA-H200, gpus: 8}
  - {name: c, product: NVIDIA-H200, gpus: 8}
  - name: slowgpu
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: straggler, gpu: 5, factor: 1.3}]
  - name: slownic
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: slowNic, factor: 0.1}]
  - name: started-during
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: gpusInUse, gpu: 7, bytes: 4294967296, during: true}]
  - name: hung
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: hang, phase: ddpProbe}]
"#;

impl RankEnv {
    /// Rank `rank` of `nodes`, waiting `timeout` seconds for the others.
    fn rank(&self, nodes: &str, rank: u32, timeout: &str) -> Child {
        let args = ["--rendezvous-timeout", timeout];
        self.sim_rank("ddp-nodes", "run-1/ddp", nodes, rank, &args)
    }

    /// Every rank of `nodes`, each with `more` arguments for `fabric-agent ddp-nodes`.
    fn all_with(&self, nodes: &str, more: &[&str]) -> Vec<(Output, DdpNodesResult)> {
        let args: Vec<String> = ["--rendezvous-timeout", "20"]
            .iter()
            .chain(more)
            .map(|a| a.to_string())
            .collect();
        self.sim_ranks("ddp-nodes", "run-1/ddp", nodes, |_| args.clone())
    }

    /// Every rank of `nodes`.
    fn all(&self, nodes: &str) -> Vec<(Output, DdpNodesResult)> {
        self.all_with(nodes, &[])
    }
}

fn finish(child: Child) -> (Output, DdpNodesResult) {
    finish_rank(child, "ddp-nodes", |l| serde_json::from_str(l))
}

#[test]
fn four_agents_measure_one_two_and_four_nodes_and_agree() {
    let env = RankEnv::new(FLEET);
    let ranks = env.all("a,b,c,slowgpu");
    assert_every_rank_measured(&ranks, |d| {
        (
            d.header.rank,
            d.errors.is_empty() && d.not_measured.is_none(),
        )
    });
    let d = &ranks[0].1;
    // Every rank gathered the same times.
    for (_, other) in &ranks[1..] {
        assert_eq!(other.points, d.points);
        assert_eq!(other.stragglers, d.stragglers);
    }
    let counts: Vec<(u32, u32)> = d.points.iter().map(|p| (p.nodes, p.point.gpus)).collect();
    assert_eq!(counts, [(1, 8), (2, 16), (4, 32)]);
    assert_eq!(d.header.gpus_per_node, 8);
    assert!((d.points[0].point.scaling_efficiency - 1.0).abs() < 1e-9);
    // Healthy nodes on InfiniBand hide most of the all-reduce behind backward; the
    // straggling GPU of the fourth node sets the step of four nodes (1.3x compute).
    let (two, four) = (&d.points[1], &d.points[2]);
    assert!(
        (0.9..1.05).contains(&two.point.scaling_efficiency),
        "{two:?}"
    );
    assert!(
        four.point.scaling_efficiency < two.point.scaling_efficiency - 0.15,
        "{four:?}"
    );
    assert!(four.exposed_comm_ms > 0.0 && four.comm_alone_ms > 0.0);
    assert_eq!(four.node_compute_ms.len(), 4);
    assert_eq!(d.stragglers.len(), 1, "{:?}", d.stragglers);
    assert_eq!(d.stragglers[0].node, "slowgpu");
    assert!(d.stragglers[0].slower_percent > 25.0, "{:?}", d.stragglers);
    let table = String::from_utf8_lossy(&ranks[0].0.stdout);
    assert!(table.contains("# straggler: slowgpu"), "{table}");
}

#[test]
fn a_slow_nic_lowers_the_efficiency_of_every_count_it_joins() {
    let env = RankEnv::new(FLEET);
    let clean = env.all("a,b");
    let env = RankEnv::new(FLEET);
    let slow = env.all("a,slownic");
    let eff = |r: &[(Output, DdpNodesResult)]| r[0].1.points[1].point.scaling_efficiency;
    assert!(
        eff(&slow) < eff(&clean) - 0.1,
        "{} vs {}",
        eff(&slow),
        eff(&clean)
    );
    // Compute is the same: a slow NIC is no straggler.
    assert!(
        slow[0].1.stragglers.is_empty(),
        "{:?}",
        slow[0].1.stragglers
    );
}

#[test]
fn work_that_starts_on_a_ranks_gpus_while_it_measures_leaves_the_probe_not_measured() {
    let env = RankEnv::new(FLEET);
    let done = env.all("a,started-during");
    let (out0, d0) = &done[0];
    let (out1, d1) = &done[1];
    assert_eq!(
        (out0.status.code(), out1.status.code()),
        (Some(0), Some(EXIT_NOT_MEASURED))
    );
    assert!(d0.not_measured.is_none());
    let nm = d1.not_measured.as_ref().expect("not measured");
    assert!(
        nm.message
            .starts_with("GPU 7: 4.0 GiB of 140.4 GiB in use (no process of it is visible here) after the measurements; work the scheduler does not know about started"),
        "{}",
        nm.message
    );
}

#[test]
fn a_rank_that_never_arrives_ends_every_rank_in_bounded_time() {
    let env = RankEnv::new(FLEET);
    let started = Instant::now();
    let r0 = env.rank("a,b,c", 0, "3");
    let r1 = env.rank("a,b,c", 1, "3");
    let (out0, d0) = finish(r0);
    let (out1, _) = finish(r1);
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(out0.status.code(), Some(EXIT_NOT_MEASURED));
    assert_eq!(out1.status.code(), Some(EXIT_NOT_MEASURED));
    let nm = d0.not_measured.expect("not measured");
    assert!(nm.message.contains('c'), "{}", nm.message);
    assert!(d0.points.is_empty());
}

#[test]
fn bad_settings_are_refused_with_exit_code_2() {
    let env = RankEnv::new(FLEET);
    for (nodes, rank) in [("a,a", 0), ("a,b", 2), ("a,nowhere", 0)] {
        let out = env.rank(nodes, rank, "5").wait_with_output().expect("ends");
        assert_eq!(out.status.code(), Some(2), "{nodes} rank {rank}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("fabric-agent: error:"), "{err}");
    }
}

#[test]
fn a_rank_that_cannot_measure_says_why_before_it_meets_the_others() {
    if gpufabric_measure::cuda::nccl::nccl_present() {
        eprintln!("libnccl is present here: the cuda backend would run; nothing to check");
        return;
    }
    let env = RankEnv::new(FLEET);
    let started = Instant::now();
    // Rank 1 with no rank 0 anywhere: it would wait 60 s for the rendezvous, but ends at
    // once, naming the missing library.
    let out = agent()
        .args([
            "ddp-nodes",
            "--backend",
            "cuda",
            "--nodes",
            "a,b",
            "--rank",
            "1",
        ])
        .args([
            "--rendezvous",
            &env.addr,
            "--group",
            "g",
            "--secret",
            SECRET,
        ])
        .args(["--rendezvous-timeout", "60"])
        .output()
        .expect("agent runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{stderr}");
    assert!(stderr.contains("libnccl.so"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(30), "{stderr}");
}

#[test]
fn a_rank_that_hangs_writes_its_timeout_and_the_others_end_in_bounded_time() {
    let env = RankEnv::new(FLEET);
    let started = Instant::now();
    let done = env.all_with("a,hung,b", &["--timeout", "1"]);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let hung = &done[1].1;
    assert!(hung.points.is_empty(), "{hung:?}");
    assert!(
        hung.errors
            .iter()
            .any(|e| e.kind == gpufabric_api::result::ErrorKind::Timeout
                && e.message.contains("did not finish within 1.0 s")),
        "{hung:?}"
    );
    // The others lost a rank: none of them reports points of a probe that did not run whole.
    for (r, (_, doc)) in done.iter().enumerate().filter(|(r, _)| *r != 1) {
        assert!(
            doc.points.is_empty() && (!doc.errors.is_empty() || doc.not_measured.is_some()),
            "rank {r}: {doc:?}"
        );
    }
}
