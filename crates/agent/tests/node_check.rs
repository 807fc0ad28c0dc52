//! The `fabric-agent` binary end to end: sim node checks against fleet files, the outputs
//! the operator reads (last stdout line, termination message), fault behaviour and exit codes.

mod common;

use common::{EXIT_NODE_FAILED, agent, fleet_dir, stderr, stdout};
use gpufabric_api::result::{ErrorKind, Phase};
use gpufabric_api::{CompactResult, ResultDocument};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const FLEET: &str = r#"
seed: 11
nodes:
  - name: clean
    product: NVIDIA-H100-80GB-HBM3
    gpus: 8
  - name: slow-pair
    product: NVIDIA-H100-80GB-HBM3
    gpus: 8
    faults: [{kind: slowPair, gpus: [2, 5], factor: 0.4}]
  - name: crash
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: crash, exitCode: 42}]
  - name: garbage
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: garbage}]
  - name: hang
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: hang}]
  - name: stuck
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: hang, phase: health, stuck: true}]
  - name: shared
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: gpusInUse, gpu: 3, bytes: 42949672960}]
  - name: stuck-on-a-failed-gpu
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: gpusInUse, gpu: 2, bytes: 3221225472}, {kind: ecc, gpu: 2, count: 4}]
  - name: started-during
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: gpusInUse, gpu: 6, bytes: 12884901888, during: true}]
  - name: started-during-hang
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: gpusInUse, gpu: 6, bytes: 12884901888, during: true}, {kind: hang}]
"#;

struct Env {
    dir: tempfile::TempDir,
    fleet: PathBuf,
}

impl Env {
    fn new() -> Env {
        let (dir, fleet) = fleet_dir(FLEET);
        Env { dir, fleet }
    }

    fn term(&self) -> PathBuf {
        self.dir.path().join("termination-log")
    }

    /// The agent with a clean environment and the termination message in the temp dir.
    fn agent(&self) -> Command {
        let mut cmd = agent();
        cmd.env("FABRIC_TERMINATION_LOG", self.term());
        cmd
    }

    fn sim(&self, node: &str, extra: &[&str]) -> Output {
        let mut cmd = self.agent();
        cmd.args(["node-check", "--backend", "sim", "--fleet"])
            .arg(&self.fleet)
            .args(["--node", node])
            .args(extra);
        cmd.output().expect("agent runs")
    }
}

fn last_line(o: &Output) -> String {
    stdout(o).lines().last().unwrap_or_default().to_string()
}

fn doc_of(o: &Output) -> ResultDocument {
    ResultDocument::parse(&last_line(o)).expect("last stdout line is the full document")
}

#[test]
fn sim_node_check_prints_tables_then_the_document_as_the_last_line() {
    let env = Env::new();
    let out = env.sim("slow-pair", &[]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    for needle in [
        "# all_reduce_perf: 8 ranks, float",
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong",
        "# Avg bus bandwidth    :",
        "# Fit time = alpha + bytes",
        "memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)",
        "memcpy CE GPU(row) <-> GPU(column) bidirectional bandwidth",
        "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)",
        "# DDP probe:",
        "# Health (NVML)",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    let doc = doc_of(&out);
    assert_eq!(doc.node, "slow-pair");
    assert_eq!(doc.gpus.len(), 8);
    let pairs = doc.pairs.as_ref().expect("pair matrix");
    let slowest = pairs
        .unidirectional
        .iter()
        .min_by(|a, b| a.gbps.total_cmp(&b.gbps))
        .expect("pairs");
    assert_eq!(
        (slowest.src.min(slowest.dst), slowest.src.max(slowest.dst)),
        (2, 5)
    );
    // Progress goes to stderr, one line per phase at least.
    let err = stderr(&out);
    for phase in ["health:", "ncclSweep:", "gpuPairs:", "ddpProbe:"] {
        assert!(err.contains(phase), "no {phase} progress in {err}");
    }
}

#[test]
fn termination_message_is_a_compact_document_within_4096_bytes() {
    let env = Env::new();
    let out = env.sim("clean", &[]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let text = std::fs::read_to_string(env.term()).expect("termination message written");
    assert!(text.len() <= 4096, "{} bytes", text.len());
    let compact = CompactResult::parse(&text).expect("operator reads it");
    assert_eq!(compact.node, "clean");
    assert_eq!(compact.gpus, 8);
    assert_eq!(compact.collectives.len(), 7);
    assert_eq!(compact.copy_uni.len(), 64);
    assert!(compact.errors.is_empty());
    assert_eq!(compact, CompactResult::from(&doc_of(&out)));
}

#[test]
fn json_flag_writes_the_same_document() {
    let env = Env::new();
    let path = env.dir.path().join("out.json");
    let out = env.sim("clean", &["--json", path.to_str().expect("utf-8 path")]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let file = ResultDocument::parse(&std::fs::read_to_string(&path).expect("json written"))
        .expect("parses");
    assert_eq!(file, doc_of(&out));
}

#[test]
fn crash_fault_exits_with_its_code_and_writes_nothing() {
    let env = Env::new();
    let path = env.dir.path().join("out.json");
    let out = env.sim("crash", &["--json", path.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(42));
    // No result: at most the last progress line.
    let term = std::fs::read_to_string(env.term()).unwrap_or_default();
    assert!(
        term.is_empty() || term.starts_with(gpufabric_api::keys::PROGRESS_PREFIX),
        "{term}"
    );
    assert!(!path.exists(), "no json file");
    assert!(ResultDocument::parse(&last_line(&out)).is_err());
    assert!(stderr(&out).contains("crash"), "{}", stderr(&out));
}

#[test]
fn gpus_held_by_other_work_are_not_measured_unless_shared() {
    let env = Env::new();
    let path = env.dir.path().join("out.json");
    let out = env.sim("shared", &["--json", path.to_str().expect("utf-8 path")]);
    assert_eq!(out.status.code(), Some(14), "stderr: {}", stderr(&out));
    assert!(!path.exists(), "nothing measured, no document");
    // The reason is the termination message, for the operator's node entry, and on stderr.
    let term = std::fs::read_to_string(env.term()).expect("termination message");
    assert!(
        term.starts_with("the GPUs are in use by other work: GPU 3: 40.0 GiB of 140.4 GiB in use"),
        "{term}"
    );
    let err = stderr(&out);
    assert!(err.contains("--shared-gpus"), "{err}");
    assert!(err.contains("not a fault of the node"), "{err}");
    // Told to share, the same node is measured, and says what it measured beside.
    let out = env.sim("shared", &["--shared-gpus", "--quick"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert_eq!(doc_of(&out).gpus.len(), 8);
    assert!(
        stderr(&out).contains("measuring beside other work (--shared-gpus)"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_gpu_held_by_other_work_is_still_judged_on_its_own_faults() {
    let env = Env::new();
    let verdict = env.dir.path().join("verdict.json");
    let out = env.sim(
        "stuck-on-a-failed-gpu",
        &[
            "--verdict",
            "--verdict-json",
            verdict.to_str().expect("utf-8 path"),
        ],
    );
    // Not "not measured" (exit 14): the node fails on its GPU's own evidence.
    assert_eq!(
        out.status.code(),
        Some(EXIT_NODE_FAILED),
        "stderr: {}",
        stderr(&out)
    );
    let err = stderr(&out);
    assert!(
        err.contains("other work holds the GPUs, but their own readings show faults (GPU 2: 4 uncorrectable ECC errors; GPU 2: a memory row remap pending): reporting their health alone"),
        "{err}"
    );
    let doc = doc_of(&out);
    assert!(doc.nccl.is_none() && doc.pairs.is_none() && doc.ddp.is_none());
    assert_eq!(
        doc.health.as_ref().map(|h| h.gpus[2].ecc_uncorrected),
        Some(4)
    );
    assert!(!doc.errors.is_empty());
    for e in &doc.errors {
        assert_eq!(e.kind, ErrorKind::Unavailable, "{e:?}");
        assert!(
            e.message.contains("GPU 2: 3.0 GiB of 140.4 GiB in use"),
            "{e:?}"
        );
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&verdict).expect("verdict")).expect("json");
    assert_eq!(v["verdict"], "Failed", "{v}");
    let kinds: Vec<&str> = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["severity"] == "Critical")
        .filter_map(|f| f["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["EccUncorrectable", "RowRemap"], "{v}");
    // The same node without the fault is not measured at all (exit 14).
    let out = env.sim("shared", &[]);
    assert_eq!(out.status.code(), Some(14));
}

#[test]
fn work_that_starts_during_the_check_voids_its_measurements() {
    let env = Env::new();
    let path = env.dir.path().join("out.json");
    let out = env.sim(
        "started-during",
        &["--quick", "--json", path.to_str().expect("utf-8 path")],
    );
    assert_eq!(out.status.code(), Some(14), "stderr: {}", stderr(&out));
    assert!(
        !path.exists(),
        "measurements beside other work are not written"
    );
    let term = std::fs::read_to_string(env.term()).expect("termination message");
    assert!(
        term.starts_with("the GPUs are in use by other work: GPU 6: 0.0 GiB in use once the check's contexts were open, 12.0 GiB after its measurements; work the scheduler does not know about started on this node's GPUs while they were measured"),
        "{term}"
    );
    // Told to share, the check keeps what it measured.
    let out = env.sim("started-during", &["--quick", "--shared-gpus"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(doc_of(&out).nccl.is_some());
    // A phase that timed out is reported as such: a thread stuck in it holds the check's
    // own memory, which the end of the check cannot tell from other work's.
    let out = env.sim(
        "started-during-hang",
        &["--quick", "--phase-timeout", "0.3"],
    );
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert_eq!(doc_of(&out).errors[0].kind, ErrorKind::Timeout);
}

#[test]
fn garbage_fault_writes_documents_the_operator_refuses() {
    let env = Env::new();
    let out = env.sim("garbage", &[]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let text = std::fs::read_to_string(env.term()).expect("termination message written");
    assert!(!text.is_empty());
    assert!(CompactResult::parse(&text).is_err(), "{text}");
    assert!(ResultDocument::parse(&last_line(&out)).is_err());
}

#[test]
fn hang_fault_ends_in_a_timeout_error_of_that_phase() {
    let env = Env::new();
    let t0 = Instant::now();
    let out = env.sim("hang", &["--phase-timeout", "0.3", "--quick"]);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert!(t0.elapsed() >= Duration::from_millis(300));
    let doc = doc_of(&out);
    assert_eq!(doc.errors.len(), 1, "{:?}", doc.errors);
    assert_eq!(doc.errors[0].phase, Phase::NcclSweep);
    assert_eq!(doc.errors[0].kind, ErrorKind::Timeout);
    assert!(doc.nccl.is_none());
    let compact =
        CompactResult::parse(&std::fs::read_to_string(env.term()).expect("written")).expect("ok");
    assert_eq!(compact.errors.len(), 1);
    assert_eq!(compact.errors[0].kind, ErrorKind::Timeout);
}

#[test]
fn stuck_fault_hangs_past_the_watchdog_until_killed() {
    let env = Env::new();
    let mut child = env
        .agent()
        .args(["node-check", "--backend", "sim", "--fleet"])
        .arg(&env.fleet)
        .args(["--node", "stuck", "--phase-timeout", "0.2"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("agent starts");
    std::thread::sleep(Duration::from_millis(1500));
    let still_running = child.try_wait().expect("poll").is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        still_running,
        "a stuck agent must outlive its phase timeout"
    );
    // Killed without a result, it leaves the phase it was in as its termination message.
    let term = std::fs::read_to_string(env.term()).expect("a progress line was written");
    assert!(
        term.starts_with(gpufabric_api::keys::PROGRESS_PREFIX) && term.contains("health: stuck"),
        "{term}"
    );
    assert!(!term.contains('\n'), "one line: {term:?}");
}

#[test]
fn cuda_backend_without_gpus_exits_with_a_clear_code_and_message() {
    if Path::new("/dev/nvidiactl").exists() {
        eprintln!("skipped: this machine has NVIDIA GPUs");
        return;
    }
    let env = Env::new();
    let out = env
        .agent()
        .args(["node-check", "--node", "x"])
        .output()
        .expect("agent runs");
    let code = out.status.code();
    assert!(
        code == Some(10) || code == Some(11),
        "code {code:?}: {}",
        stderr(&out)
    );
    let err = stderr(&out);
    assert!(err.contains("fabric-agent: error:"), "{err}");
    assert!(err.contains("--backend sim"), "a hint on what to do: {err}");
    // No result: the reason is the termination message, for the operator's node entry.
    let term = std::fs::read_to_string(env.term()).unwrap_or_default();
    assert!(
        term.contains("could not be loaded") || term.starts_with("no GPU found"),
        "{term}"
    );
}

#[test]
fn unknown_node_is_refused_with_exit_2_and_the_known_names() {
    let env = Env::new();
    let out = env.sim("nope", &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("\"nope\" is not in fleet file"), "{err}");
    assert!(err.contains("clean"), "{err}");
}

#[test]
fn sim_needs_a_fleet_file() {
    let env = Env::new();
    let out = env
        .agent()
        .args(["node-check", "--backend", "sim", "--node", "clean"])
        .output()
        .expect("agent runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("FABRIC_SIM_FLEET"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn backend_fleet_and_node_come_from_the_environment() {
    let env = Env::new();
    let out = env
        .agent()
        .arg("node-check")
        .env("FABRIC_BACKEND", "sim")
        .env("FABRIC_SIM_FLEET", &env.fleet)
        .env("FABRIC_NODE_NAME", "clean")
        .arg("--quick")
        .output()
        .expect("agent runs");
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    assert_eq!(doc_of(&out).node, "clean");
}

#[test]
fn flags_override_the_suite() {
    let env = Env::new();
    let suite = env.dir.path().join("suite.yaml");
    std::fs::write(
        &suite,
        "ncclSweep:\n  collectives: [broadcast, allGather]\n  maxBytes: 1048576\nddpProbe:\n  enabled: false\n",
    )
    .expect("write suite");
    let out = env.sim(
        "clean",
        &[
            "--suite",
            suite.to_str().expect("utf-8"),
            "--collectives",
            "all_reduce,sendRecv",
            "-b",
            "1K",
            "--max-bytes",
            "16M",
            "--no-health",
            "--pair-bytes",
            "32M",
        ],
    );
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let doc = doc_of(&out);
    let nccl = doc.nccl.as_ref().expect("nccl");
    let names: Vec<_> = nccl
        .collectives
        .iter()
        .map(|c| c.collective.api_name())
        .collect();
    assert_eq!(names, vec!["allReduce", "sendRecv"]);
    let rows = &nccl.collectives[0].rows;
    assert_eq!(rows.first().map(|r| r.bytes), Some(1024));
    assert_eq!(rows.last().map(|r| r.bytes), Some(16 << 20));
    assert!(doc.ddp.is_none(), "the file disabled the probe");
    assert!(doc.health.is_none());
    assert_eq!(doc.pairs.as_ref().map(|p| p.bytes), Some(32 << 20));
}

#[test]
fn inline_suite_from_the_environment_sets_what_no_flag_covers() {
    let env = Env::new();
    let out = env
        .agent()
        .args(["node-check", "--backend", "sim", "--fleet"])
        .arg(&env.fleet)
        .args(["--node", "clean", "--collectives", "broadcast"])
        .env(
            "FABRIC_SUITE",
            r#"{"ncclSweep":{"collectives":["allReduce"],"maxBytes":4096},"ddpProbe":{"hidden":1024,"layers":2},"gpuPairs":{"bidirectional":false}}"#,
        )
        .output()
        .expect("agent runs");
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    let doc = doc_of(&out);
    let nccl = doc.nccl.as_ref().expect("nccl");
    assert_eq!(nccl.collectives.len(), 1);
    assert_eq!(nccl.collectives[0].collective.api_name(), "broadcast");
    assert_eq!(nccl.collectives[0].rows.last().map(|r| r.bytes), Some(4096));
    let ddp = doc.ddp.as_ref().expect("ddp");
    assert_eq!((ddp.hidden, ddp.layers), (1024, 2));
    assert!(
        doc.pairs
            .as_ref()
            .is_some_and(|p| p.bidirectional.is_empty())
    );

    let bad = env
        .agent()
        .args(["node-check", "--backend", "sim", "--fleet"])
        .arg(&env.fleet)
        .args(["--node", "clean"])
        .env("FABRIC_SUITE", "{not json")
        .output()
        .expect("agent runs");
    assert_eq!(bad.status.code(), Some(2));
    assert!(stderr(&bad).contains("FABRIC_SUITE"), "{}", stderr(&bad));
}

#[test]
fn invalid_suite_values_exit_2() {
    let env = Env::new();
    let out = env.sim("clean", &["-b", "1G", "-e", "1M"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("minBytes"), "{}", stderr(&out));
    let out = env.sim("clean", &["-b", "12Q"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("suffix"), "{}", stderr(&out));
}

#[test]
fn same_seed_gives_the_same_measurements() {
    let env = Env::new();
    let strip = |mut d: ResultDocument| {
        d.started_at.clear();
        d.duration_s = 0.0;
        d
    };
    let a = strip(doc_of(&env.sim("clean", &["--quick"])));
    let b = strip(doc_of(&env.sim("clean", &["--quick"])));
    let c = strip(doc_of(&env.sim("clean", &["--quick", "--seed", "99"])));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn help_explains_node_check_with_an_example() {
    let env = Env::new();
    let out = env
        .agent()
        .args(["node-check", "--help"])
        .output()
        .expect("agent runs");
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(text.contains("Examples:"), "{text}");
    assert!(text.contains("--backend sim --fleet"), "{text}");
    assert!(text.contains("Exit codes"), "{text}");
    let out = env
        .agent()
        .args(["inject", "--help"])
        .output()
        .expect("agent runs");
    assert!(out.status.success());
    assert!(stdout(&out).contains("Example"), "{}", stdout(&out));
}

#[test]
fn demo_fleet_runs_every_node_quickly() {
    let env = Env::new();
    let fleet = Path::new(env!("CARGO_MANIFEST_DIR")).join("../measure/fleets/demo-16.yaml");
    for node in ["h100-00", "h100-03", "h200-05"] {
        let t0 = Instant::now();
        let out = env
            .agent()
            .args(["node-check", "--backend", "sim", "--fleet"])
            .arg(&fleet)
            .args(["--node", node])
            .output()
            .expect("agent runs");
        assert!(out.status.success(), "{node}: {}", stderr(&out));
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{node} took {:?}",
            t0.elapsed()
        );
        assert_eq!(doc_of(&out).node, node);
    }
}

#[test]
fn log_format_json_writes_every_log_line_as_a_json_object() {
    let env = Env::new();
    let out = env
        .agent()
        .env("RUST_LOG", "debug")
        .args(["--log-format", "json", "node-check", "--backend", "sim"])
        .arg("--fleet")
        .arg(&env.fleet)
        .args(["--node", "clean", "--quick"])
        .output()
        .expect("agent runs");
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    // Progress lines stay text: the operator reads the last one from the pod log.
    let err = stderr(&out);
    let logs: Vec<&str> = err
        .lines()
        .filter(|l| !l.starts_with("[fabric-agent] "))
        .collect();
    assert!(!logs.is_empty(), "no log lines in:\n{err}");
    for line in logs {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
        assert!(v.is_object() && v.get("level").is_some(), "{line}");
    }
    // The tables and the document on stdout are as with text logs.
    assert!(
        stdout(&out).contains("# all_reduce_perf"),
        "{}",
        stdout(&out)
    );
    assert_eq!(doc_of(&out).node, "clean");
}

#[test]
fn sigterm_says_the_phase_it_stopped_in_and_exits_promptly() {
    let env = Env::new();
    let err_path = env.dir.path().join("stderr");
    let err_file = std::fs::File::create(&err_path).expect("stderr file");
    let mut child = env
        .agent()
        .args(["node-check", "--backend", "sim", "--fleet"])
        .arg(&env.fleet)
        .args(["--node", "stuck"])
        .stdout(Stdio::null())
        .stderr(Stdio::from(err_file))
        .spawn()
        .expect("agent starts");
    // Wait until it is stuck in its health phase.
    let t0 = Instant::now();
    while !std::fs::read_to_string(env.term()).is_ok_and(|t| t.contains("health: stuck")) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the agent never reached its stuck phase"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let sent = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let t0 = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll") {
            break status;
        }
        if t0.elapsed() > Duration::from_secs(5) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the agent did not exit within 5 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(143));
    let err = std::fs::read_to_string(&err_path).expect("stderr");
    assert!(
        err.contains("stopped by SIGTERM in phase \"health: stuck"),
        "{err}"
    );
    // The progress line stays first, for the operator; the stop follows it.
    let term = std::fs::read_to_string(env.term()).expect("termination message");
    let mut lines = term.lines();
    let first = lines.next().unwrap_or_default();
    assert!(
        first.starts_with(gpufabric_api::keys::PROGRESS_PREFIX) && first.contains("health: stuck"),
        "{term}"
    );
    assert!(
        lines.any(|l| l.contains("stopped by SIGTERM in phase \"health: stuck")),
        "{term}"
    );
    assert!(term.len() <= gpufabric_api::keys::TERMINATION_MESSAGE_LIMIT);
}
