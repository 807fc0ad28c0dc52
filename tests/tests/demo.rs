//! The demo of README's "Two commands", run as a user runs it (`fabric-demo --once`, with
//! what `tests/run.sh` built): it must end well and show what README says it shows.
//!
//! Build the binaries first: `cargo build --bins`, then
//! `cargo test -p gpufabric-tests --test demo`.

use gpufabric_tests::cluster::ENV_BIN;
use std::process::Command;

/// The lines of `out` that start with `prefix` (table rows start with the node name).
fn rows<'a>(out: &'a str, prefix: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(prefix)).collect()
}

#[test]
fn the_demo_refuses_bad_input_finds_every_injected_fault_and_cordons_within_the_budget() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric-demo"));
    cmd.args(["--once", "--no-build", "--timeout", "300"]);
    if let Ok(dir) = std::env::var(ENV_BIN) {
        cmd.env(ENV_BIN, dir);
    }
    let out = cmd.output().expect("fabric-demo runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let shown = |needle: &str| {
        assert!(
            stdout.contains(needle),
            "missing {needle:?} in:\n{stdout}\n{stderr}"
        )
    };

    // The admission webhook the operator serves refuses a FabricTest that cannot work, at
    // `kubectl apply`.
    shown("refused: Error from server");
    shown("admission webhook \"fabrictests.gpufabric.io\" denied the request");
    shown("schedule \"0 2 31 2 *\" never fires");

    // The four faults, each where it belongs: two node checks, a node found against its
    // partners, a path that blames neither node.
    shown("Critical  h200-05  gpu 6");
    shown("Critical  h100-03  gpu 2<->5");
    shown("Critical  h200-02  node         nodePairBusBw");
    shown("Info      h100-05  <-> h100-06  nodePairBusBw");
    shown("round 4 retests 1 suspect(s)");
    shown("4 (retest)  h200-02 <-> ");
    // The multi-node probe over four nodes that passed both, at 1, 2 and 4 nodes.
    shown(": multi-node DDP probe over ");
    assert_eq!(rows(&stdout, "4      32 ").len(), 1, "{stdout}");

    // One node cordoned (the budget), the other two failures held back, the busy node
    // skipped and never blamed.
    shown("nightly holds 1 node(s) in quarantine: h200-02");
    let held = rows(&stdout, "h100-03  would quarantine");
    assert_eq!(held.len(), 1, "{stdout}");
    assert!(held[0].contains("budget"), "{}", held[0]);
    shown("h200-07  nightly-manual-");
    shown("skipped: Busy");
    // A node's life: the busy node, free and gated, passes and its gate opens; the node
    // nightly cordoned is repaired, and one targeted run releases it.
    shown("h200-07: gated false, cordoned false; ValidationPassed: passed run nightly-t");
    shown("h200-02: gated false, cordoned false; Released: released by FabricTest nightly");
    shown("RepairPassed: passed its repair test in run nightly-t");
    for healthy in ["h100-00", "h100-05", "h100-06", "h200-07"] {
        assert!(
            rows(&stdout, &format!("{healthy}  true")).is_empty(),
            "{healthy} cordoned:\n{stdout}"
        );
    }
}
