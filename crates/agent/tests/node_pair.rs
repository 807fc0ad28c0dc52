//! `fabric-agent node-pair` end to end: two agent processes meet over TCP on loopback and
//! report the pair from the fleet file; a missing or foreign peer is named in bounded time.

mod common;

use common::{EXIT_NOT_MEASURED, RankEnv, SECRET, agent, finish_rank};
use gpufabric_api::pair::{NetTransport, NodePairResult};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const FLEET: &str = r#"
seed: 5
nodes:
  - {name: a, product: NVIDIA-H200, gpus: 8}
  - {name: b, product: NVIDIA-H200, gpus: 8}
  - name: slow
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: slowNic, factor: 0.25}]
  - name: tcp
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: socketFallback}]
  - name: shared
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: gpusInUse, gpu: 5, bytes: 8589934592}]
  - name: started-during
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: gpusInUse, gpu: 4, bytes: 8589934592, during: true}]
"#;

impl RankEnv {
    fn term(&self, rank: u32) -> PathBuf {
        self.dir.path().join(format!("termination-{rank}"))
    }

    fn rank(&self, nodes: &str, rank: u32, secret: &str, timeout: &str) -> Child {
        self.rank_cmd(nodes, rank, secret, timeout)
            .spawn()
            .expect("agent starts")
    }

    fn rank_cmd(&self, nodes: &str, rank: u32, secret: &str, timeout: &str) -> Command {
        let mut cmd = agent();
        cmd.env("FABRIC_TERMINATION_LOG", self.term(rank))
            .env("FABRIC_RENDEZVOUS_SECRET", secret)
            .args(["node-pair", "--backend", "sim", "--fleet"])
            .arg(&self.fleet)
            .args(["--nodes", nodes, "--rank", &rank.to_string()])
            .args(["--rendezvous", &self.addr, "--group", "run-1/r0/p0"])
            .args(["--rendezvous-timeout", timeout])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }
}

fn finish(child: Child) -> (Output, NodePairResult) {
    finish_rank(child, "node-pair", NodePairResult::parse)
}

#[test]
fn two_agents_meet_over_tcp_in_either_start_order_and_report_the_same_pair() {
    let env = RankEnv::new(FLEET);
    // Rank 1 first: it retries until rank 0 listens.
    let r1 = env.rank("a,b", 1, SECRET, "20");
    std::thread::sleep(Duration::from_millis(300));
    let r0 = env.rank("a,b", 0, SECRET, "20");
    let (out0, d0) = finish(r0);
    let (out1, d1) = finish(r1);
    assert_eq!(out0.status.code(), Some(0));
    assert_eq!(out1.status.code(), Some(0));
    assert_eq!((d0.rank, d1.rank), (0, 1));
    assert_eq!(d0.collectives, d1.collectives);
    assert_eq!(d0.transport, Some(NetTransport::Ib));
    assert_eq!((d0.gpus_per_node, d0.nics_used), (8, 8));
    let bw = d0.busbw().expect("all_reduce");
    assert!(bw > 350.0, "{bw}");
    assert!(d0.not_measured.is_none() && d0.errors.is_empty());
    let table = String::from_utf8_lossy(&out0.stdout);
    assert!(
        table.contains("# node pair a <-> b  rank 0  8 GPUs each  transport InfiniBand"),
        "{table}"
    );
    // The termination message is the same document.
    let term = std::fs::read_to_string(env.term(1)).expect("termination message");
    assert_eq!(NodePairResult::parse(&term).expect("parses"), d1);
}

#[test]
fn a_slow_nic_and_a_socket_fallback_show_in_the_pair() {
    let env = RankEnv::new(FLEET);
    let r0 = env.rank("slow,b", 0, SECRET, "20");
    let r1 = env.rank("slow,b", 1, SECRET, "20");
    let (_, d) = finish(r0);
    finish(r1);
    assert!(d.busbw().expect("all_reduce") < 100.0);

    let env = RankEnv::new(FLEET);
    let r0 = env.rank("a,tcp", 0, SECRET, "20");
    let r1 = env.rank("a,tcp", 1, SECRET, "20");
    finish(r0);
    let (_, d) = finish(r1);
    assert_eq!(d.transport, Some(NetTransport::Socket));
}

#[test]
fn a_peer_that_never_arrives_is_named_and_the_pair_is_not_measured() {
    let env = RankEnv::new(FLEET);
    let started = Instant::now();
    let (out, doc) = finish(env.rank("a,b", 0, SECRET, "1"));
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(EXIT_NOT_MEASURED));
    let nm = doc.not_measured.expect("not measured");
    assert_eq!(nm.peer.as_deref(), Some("b"));
    assert!(
        nm.message
            .starts_with("rank 1 (b) did not join the rendezvous at 127.0.0.1:"),
        "{}",
        nm.message
    );
    assert!(doc.collectives.is_empty());

    let env = RankEnv::new(FLEET);
    let (out, doc) = finish(env.rank("a,b", 1, SECRET, "1"));
    assert_eq!(out.status.code(), Some(EXIT_NOT_MEASURED));
    let nm = doc.not_measured.expect("not measured");
    assert_eq!(nm.peer.as_deref(), Some("a"));
    assert!(
        nm.message.starts_with("could not reach rank 0 (a)"),
        "{}",
        nm.message
    );
}

#[test]
fn a_rank_whose_gpus_other_work_holds_ends_at_once_and_its_peer_is_not_measured() {
    let env = RankEnv::new(FLEET);
    let started = Instant::now();
    let r0 = env.rank("a,shared", 0, SECRET, "2");
    let r1 = env.rank("a,shared", 1, SECRET, "2");
    let out1 = r1.wait_with_output().expect("rank 1 ends");
    assert_eq!(out1.status.code(), Some(14));
    let term = std::fs::read_to_string(env.term(1)).expect("termination message");
    assert!(
        term.starts_with("the GPUs are in use by other work: GPU 5: 8.0 GiB of 140.4 GiB in use"),
        "{term}"
    );
    // Rank 0 never meets it: the pair is not measured, and says which peer.
    let (out0, d0) = finish(r0);
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(out0.status.code(), Some(EXIT_NOT_MEASURED));
    let nm = d0.not_measured.expect("not measured");
    assert_eq!(nm.peer.as_deref(), Some("shared"));
    // Told to share, the same rank measures.
    let env = RankEnv::new(FLEET);
    let r0 = env.rank("a,shared", 0, SECRET, "20");
    let mut shared = env.rank_cmd("a,shared", 1, SECRET, "20");
    shared.env("FABRIC_SHARED_GPUS", "true");
    let (out1, d1) = finish(shared.spawn().expect("agent starts"));
    let (_, d0) = finish(r0);
    assert_eq!(out1.status.code(), Some(0));
    assert!(d0.not_measured.is_none() && d1.not_measured.is_none());
    assert!(d0.busbw().is_some());
}

#[test]
fn work_that_starts_on_a_ranks_gpus_while_the_pair_measures_leaves_the_pair_not_measured() {
    let env = RankEnv::new(FLEET);
    let r0 = env.rank("a,started-during", 0, SECRET, "20");
    let r1 = env.rank("a,started-during", 1, SECRET, "20");
    let (out1, d1) = finish(r1);
    let (out0, d0) = finish(r0);
    // Rank 1's last look finds the work: its document says the pair is not measured
    // (which the operator reads for the pair), with exit 5 (not measured); rank 0 measured.
    assert_eq!(
        (out0.status.code(), out1.status.code()),
        (Some(0), Some(EXIT_NOT_MEASURED))
    );
    assert!(d0.not_measured.is_none());
    let nm = d1.not_measured.expect("not measured");
    assert!(
        nm.message.starts_with("GPU 4: 0.0 GiB in use once the check's contexts were open, 8.0 GiB after its measurements; work the scheduler does not know about started"),
        "{}",
        nm.message
    );
    // Told to share, rank 1 keeps its measurement.
    let env = RankEnv::new(FLEET);
    let r0 = env.rank("a,started-during", 0, SECRET, "20");
    let mut shared = env.rank_cmd("a,started-during", 1, SECRET, "20");
    shared.env("FABRIC_SHARED_GPUS", "true");
    let (out1, d1) = finish(shared.spawn().expect("agent starts"));
    let _ = finish(r0);
    assert_eq!(out1.status.code(), Some(0));
    assert!(d1.not_measured.is_none());
}

#[test]
fn a_rank_with_another_secret_is_turned_away_and_both_say_so() {
    let env = RankEnv::new(FLEET);
    let r0 = env.rank("a,b", 0, SECRET, "2");
    std::thread::sleep(Duration::from_millis(200));
    let other = "ff".repeat(32);
    let r1 = env.rank("a,b", 1, &other, "2");
    let (out1, d1) = finish(r1);
    let (out0, d0) = finish(r0);
    assert_eq!(
        (out0.status.code(), out1.status.code()),
        (Some(EXIT_NOT_MEASURED), Some(EXIT_NOT_MEASURED))
    );
    // Rank 0 says why it refused (protocol version 2), and the joining rank names it.
    let m1 = d1.not_measured.expect("rank 1 not measured").message;
    assert!(
        m1.contains("refused this rank: wrong secret or group"),
        "{m1}"
    );
    let m0 = d0.not_measured.expect("rank 0 not measured").message;
    assert!(m0.contains("1 connection(s) were refused"), "{m0}");
}

#[test]
fn bad_settings_are_refused_with_exit_code_2() {
    let env = RankEnv::new(FLEET);
    let (out, _) = {
        let child = env.rank("a,a", 0, SECRET, "1");
        let out = child.wait_with_output().expect("ends");
        (out, ())
    };
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--nodes names a twice"));
    let child = env.rank("a,b", 0, "abc", "1");
    let out = child.wait_with_output().expect("ends");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("rendezvous secret"));
}

/// The cuda backend on a host without NCCL or GPUs (this test machine, CI) says what is
/// missing with the library exit code, and never panics. On GPUs it is measured by
/// `bench/node-pair-check.sh`.
#[test]
fn the_cuda_backend_without_nccl_says_what_is_missing() {
    if gpufabric_measure::cuda::nccl::nccl_present() {
        eprintln!("libnccl is present here: the cuda backend would run; nothing to check");
        return;
    }
    let out = agent()
        .args([
            "node-pair",
            "--backend",
            "cuda",
            "--nodes",
            "a,b",
            "--rank",
            "0",
            "--rendezvous",
            "127.0.0.1:0",
            "--group",
            "g",
            "--secret",
            SECRET,
        ])
        .output()
        .expect("agent runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{stderr}");
    assert!(
        stderr.contains("libnccl.so could not be loaded"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
