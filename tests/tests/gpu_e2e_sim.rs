//! `bench/gpu-e2e.sh`, the whole product on a lent GPU host, kept green where no GPU is: its
//! `sim` mode runs every step of the same script (the same FabricTests applied over the API,
//! the same reads of what the operator decided, the same verdict per row) with the agent's
//! sim backend, the hardware faults and the slowed links written into the sim fleet instead of
//! being made on a GPU host. A rule that comes to spare a fault the script makes, or a status
//! field the script reads that moves, fails here, in CI, rather than on the next lent host.
//!
//! What it does not cover: the GPUs, the network namespaces and the shaping commands (the
//! script's GPU branch), which only a lent host runs.
//!
//! Needs python3 with `requests` and `yaml` and `openssl` (.ci/run installs them), the
//! binaries (`cargo build --bins`) and the control plane (tests/cluster/build.sh).

use gpufabric_tests::cluster;
use gpufabric_tests::kubelet::default_agent_bin_dir;
use gpufabric_tests::workspace_root;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The rows the script writes, in order, on a host of two GPUs with its six emulated nodes.
const STEPS: [&str; 11] = [
    "control plane",
    "CRDs, pod namespace",
    "nodes registered",
    "clean test",
    "fault: hidden-gpu",
    "release after hidden-gpu",
    "fault: sdc",
    "release after sdc",
    "node pairs",
    "multi-node probe",
    "topology blocks",
];

/// A directory holding every binary the script runs, as `E2E_BIN` wants it.
fn bin_dir(under: &Path) -> PathBuf {
    let dir = under.join("bin");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a bin dir");
    let ours = default_agent_bin_dir();
    let control_plane = cluster::bin_dir().expect("the control plane (tests/cluster/build.sh)");
    for (from, name) in [
        (&ours, "fabric-agent"),
        (&ours, "fabric-operator"),
        (&ours, "fabric-kubelet"),
        (&control_plane, "etcd"),
        (&control_plane, "kube-apiserver"),
        (&control_plane, "kube-controller-manager"),
    ] {
        let src = from.join(name);
        assert!(
            src.is_file(),
            "{} is missing: run `cargo build --bins` (and tests/cluster/build.sh)",
            src.display()
        );
        std::os::unix::fs::symlink(&src, dir.join(name)).expect("a link to the binary");
    }
    dir
}

#[test]
fn the_gpu_end_to_end_script_passes_every_row_on_the_sim_backend() {
    let python = Command::new("python3")
        .args(["-c", "import requests, yaml"])
        .output()
        .expect("python3 runs");
    assert!(
        python.status.success(),
        "bench/gpu-e2e.py needs python3 with requests and yaml (.ci/run installs them): {}",
        String::from_utf8_lossy(&python.stderr)
    );
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gpu-e2e-sim");
    let out = tmp.join("out");
    let _ = std::fs::remove_dir_all(&out);
    let bin = bin_dir(&tmp);
    let run = Command::new("bash")
        .arg("bench/gpu-e2e.sh")
        .arg("sim")
        .current_dir(workspace_root())
        .env("E2E_BIN", &bin)
        .env("E2E_SIM_GPUS", "2")
        .env("E2E_WORK", tmp.join("work"))
        // The script's own bound: every wait gives up in time for its report.
        .env("E2E_BUDGET", "600")
        .env("OUT", &out)
        .output()
        .expect("bench/gpu-e2e.sh runs");
    let log = String::from_utf8_lossy(&run.stdout);
    let tail: String = {
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    };
    assert!(
        run.status.success(),
        "bench/gpu-e2e.sh sim exited {:?}:\n{tail}\n{}",
        run.status.code(),
        String::from_utf8_lossy(&run.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join("gpu-e2e.json")).expect("the script's gpu-e2e.json"),
    )
    .expect("gpu-e2e.json parses");
    let rows = doc["rows"].as_array().cloned().unwrap_or_default();
    let steps: Vec<&str> = rows.iter().filter_map(|r| r["step"].as_str()).collect();
    assert_eq!(steps, STEPS, "the rows the script wrote:\n{tail}");
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| r["ok"] != serde_json::Value::Bool(true))
        .map(|r| format!("{}: {}", r["step"], r["decided"]))
        .collect();
    assert!(
        failed.is_empty(),
        "rows not ok:\n{}\n{tail}",
        failed.join("\n")
    );

    // What the rows rest on, read back from the details the script kept.
    let details = &doc["details"];
    let slow: Vec<&str> = details["topology blocks"]["slow_blocks"]
        .as_array()
        .map(|v| v.iter().filter_map(|b| b["value"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        !slow.is_empty() && slow.iter().all(|v| *v == "b"),
        "the slowed block, and only it: {slow:?}"
    );
    let pairs_named = details["node pairs"]["findings"]
        .as_array()
        .map(|f| {
            f.iter()
                .filter(|f| f["severity"] == "Critical")
                .filter_map(|f| f["message"].as_str())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    assert!(
        !pairs_named.is_empty() && pairs_named.iter().all(|m| m.contains("emu-5")),
        "the shaped node, and only it: {pairs_named:?}"
    );
}
