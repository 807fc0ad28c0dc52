//! One table of exit codes for every subcommand, end to end on the sim backend: `--help`
//! prints it under each subcommand; a node that fails its verdict exits 3, wrong values
//! exit 4 by default (as nccl-tests fails without being asked, `-c 0` skips the check), a
//! group test that was not measured exits 5, and a bad command line exits 2, whichever
//! subcommand ends so.

mod common;

use common::{
    EXIT_NODE_FAILED, EXIT_NOT_MEASURED, EXIT_USAGE, EXIT_WRONG_VALUES, RankEnv, SECRET, agent,
    finish_rank, fleet_dir, stderr, stdout,
};
use gpufabric_api::pair::NodePairResult;
use gpufabric_api::{CompactResult, ResultDocument};
use std::process::{Child, Output, Stdio};

const FLEET: &str = r#"
seed: 3
nodes:
  - {name: a, product: NVIDIA-H100-80GB-HBM3, gpus: 8}
  - {name: b, product: NVIDIA-H100-80GB-HBM3, gpus: 8}
"#;

/// The subcommands a person runs, each with its own `--help`.
const SUBCOMMANDS: [&str; 5] = [
    "node-check",
    "node-pair",
    "ddp-nodes",
    "nccl-nodes",
    "inject",
];

/// The exit-code lines of a help text: from its "Exit codes" heading to the end.
fn table_of(help: &str) -> String {
    let (_, table) = help
        .split_once("Exit codes (the same for every subcommand):")
        .unwrap_or_else(|| panic!("no exit-code table in:\n{help}"));
    table.to_string()
}

#[test]
fn every_subcommand_prints_the_same_table_of_exit_codes() {
    let top = agent().arg("--help").output().expect("agent runs");
    assert_eq!(top.status.code(), Some(0), "{}", stderr(&top));
    let table = table_of(&stdout(&top));
    for code in [
        "0", "1", "2", "3", "4", "5", "10", "11", "12", "13", "14", "143",
    ] {
        assert!(
            table
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{code}  "))),
            "code {code} missing from:\n{table}"
        );
    }
    for line in [
        "3  node failed",
        "4  wrong values",
        "5  not measured",
        "12  too few GPUs",
        "14  GPUs in use",
        "143  stopped by SIGTERM",
    ] {
        assert!(table.contains(line), "{line:?} missing from:\n{table}");
    }
    for sub in SUBCOMMANDS {
        let out = agent().args([sub, "--help"]).output().expect("agent runs");
        assert_eq!(out.status.code(), Some(0), "{sub}: {}", stderr(&out));
        assert_eq!(table_of(&stdout(&out)), table, "{sub} --help");
    }
}

#[test]
fn a_bad_command_line_exits_2_in_every_subcommand() {
    for sub in SUBCOMMANDS {
        let out = agent()
            .args([sub, "--no-such-flag"])
            .output()
            .expect("agent runs");
        assert_eq!(
            out.status.code(),
            Some(EXIT_USAGE),
            "{sub}: {}",
            stderr(&out)
        );
    }
    let (_dir, fleet) = fleet_dir(FLEET);
    let out = agent()
        .args([
            "node-check",
            "--backend",
            "sim",
            "--node",
            "nowhere",
            "--fleet",
        ])
        .arg(&fleet)
        .output()
        .expect("agent runs");
    assert_eq!(out.status.code(), Some(EXIT_USAGE), "{}", stderr(&out));
}

/// `node-check` on the sim's node `a` with `wrong` wrong elements in its first collective.
fn node_check(wrong: u64, extra: &[&str]) -> (Output, Option<String>) {
    let (dir, fleet) = fleet_dir(FLEET);
    let term = dir.path().join("termination-log");
    let out = agent()
        .env("FABRIC_TERMINATION_LOG", &term)
        .env("FABRIC_SIM_WRONG_ELEMENTS", wrong.to_string())
        .args([
            "node-check",
            "--backend",
            "sim",
            "--quick",
            "--node",
            "a",
            "--fleet",
        ])
        .arg(&fleet)
        .args(extra)
        .output()
        .expect("agent runs");
    (out, std::fs::read_to_string(&term).ok())
}

fn wrong_of(doc: &ResultDocument) -> u64 {
    doc.nccl
        .as_ref()
        .map(|n| n.collectives.iter().map(|c| c.total_wrong()).sum())
        .unwrap_or(0)
}

#[test]
fn wrong_values_exit_4_by_default_with_the_document_written() {
    let (out, term) = node_check(7, &[]);
    assert_eq!(
        out.status.code(),
        Some(EXIT_WRONG_VALUES),
        "stderr: {}",
        stderr(&out)
    );
    let text = stdout(&out);
    assert!(
        text.contains("# Out of bounds values : 7 FAILED"),
        "nccl-tests' line says it: {text}"
    );
    assert!(
        stderr(&out).contains("7 wrong value(s) in the NCCL sweep"),
        "{}",
        stderr(&out)
    );
    // The document is still the last line and the termination message, for whoever
    // judges the node (the operator's health rules read the wrong elements there).
    let last = text.lines().last().unwrap_or_default();
    let doc = ResultDocument::parse(last).expect("the last line is the document");
    assert_eq!(wrong_of(&doc), 7);
    let compact = CompactResult::parse(term.as_deref().unwrap_or_default())
        .expect("the termination message is the compact result");
    assert_eq!(compact.node, "a");

    // Asked for explicitly, the same; a clean sweep exits 0.
    let (out, _) = node_check(7, &["-c", "1"]);
    assert_eq!(out.status.code(), Some(EXIT_WRONG_VALUES));
    let (out, _) = node_check(0, &[]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
}

#[test]
fn c_0_skips_the_check_and_nothing_is_wrong() {
    let (out, _) = node_check(7, &["-c", "0"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let doc = ResultDocument::parse(stdout(&out).lines().last().unwrap_or_default())
        .expect("the last line is the document");
    assert_eq!(wrong_of(&doc), 0, "nothing was checked");
}

#[test]
fn a_failed_verdict_wins_over_wrong_values_and_names_them() {
    let (out, _) = node_check(7, &["--verdict"]);
    assert_eq!(
        out.status.code(),
        Some(EXIT_NODE_FAILED),
        "stderr: {}",
        stderr(&out)
    );
    let text = stdout(&out);
    assert!(text.contains("# Verdict: FAILED"), "{text}");
    assert!(text.contains("wrong elements"), "{text}");
}

/// One rank of `subcommand` (`node-pair`, `ddp-nodes`, `nccl-nodes`) over the nodes `a,b`, waiting
/// `timeout` seconds for the other, with `wrong` wrong elements in its first collective.
fn rank(env: &RankEnv, subcommand: &str, rank: u32, wrong: u64, timeout: &str) -> Child {
    agent()
        .env(
            "FABRIC_TERMINATION_LOG",
            env.dir.path().join(format!("termination-{rank}")),
        )
        .env("FABRIC_RENDEZVOUS_SECRET", SECRET)
        .env("FABRIC_SIM_WRONG_ELEMENTS", wrong.to_string())
        .args([subcommand, "--backend", "sim", "--fleet"])
        .arg(&env.fleet)
        .args(["--nodes", "a,b", "--rank", &rank.to_string()])
        .args(["--rendezvous", &env.addr, "--group", "run-1/r0/p0"])
        .args(["--rendezvous-timeout", timeout])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agent starts")
}

#[test]
fn a_node_pair_with_wrong_values_exits_4() {
    let env = RankEnv::new(FLEET);
    let r0 = rank(&env, "node-pair", 0, 0, "20");
    let r1 = rank(&env, "node-pair", 1, 5, "20");
    let (out0, d0) = finish_rank(r0, "node-pair", NodePairResult::parse);
    let (out1, d1) = finish_rank(r1, "node-pair", NodePairResult::parse);
    assert_eq!(out0.status.code(), Some(0), "{}", stderr(&out0));
    assert_eq!(
        out1.status.code(),
        Some(EXIT_WRONG_VALUES),
        "{}",
        stderr(&out1)
    );
    assert!(d0.not_measured.is_none() && d1.not_measured.is_none());
    assert_eq!(d1.collectives.first().map(|c| c.wrong), Some(5));
    assert!(
        stderr(&out1).contains("5 wrong value(s) in the pair's collectives"),
        "{}",
        stderr(&out1)
    );
}

#[test]
fn a_group_test_never_measured_exits_5_with_its_document_in_either_subcommand() {
    for subcommand in ["node-pair", "ddp-nodes", "nccl-nodes"] {
        // Alone, rank 0 waits for rank 1 in vain.
        let env = RankEnv::new(FLEET);
        let (out, doc) = finish_rank(rank(&env, subcommand, 0, 0, "1"), subcommand, |l| {
            serde_json::from_str::<serde_json::Value>(l)
        });
        assert_eq!(
            out.status.code(),
            Some(EXIT_NOT_MEASURED),
            "{subcommand}: {}",
            stderr(&out)
        );
        assert!(
            doc["notMeasured"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("rank 1 (b)")),
            "{subcommand}: {doc}"
        );
    }
}
