//! What the agent's end-to-end tests share: the agent started without the environment a
//! pod would give it, the fleet file in a temp dir, the agent's output as text, and for the
//! multi-node subcommands the secret, a free port for rank 0 and a rank's document.

// Each test binary that includes this module uses a part of it.
#![allow(dead_code)]

use std::fmt::Display;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Output};

/// Exit codes of docs/agent.md's table ("Exit codes"), the same for every subcommand.
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_NODE_FAILED: i32 = 3;
pub const EXIT_WRONG_VALUES: i32 = 4;
pub const EXIT_NOT_MEASURED: i32 = 5;
pub const EXIT_GPUS_IN_USE: i32 = 14;

/// The rendezvous secret of every test rank.
pub const SECRET: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// A free loopback `host:port`: bound, then released for rank 0.
pub fn free_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("address").to_string()
}

/// A temp dir with `yaml` written to its `fleet.yaml`, and the path of that file.
pub fn fleet_dir(yaml: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let fleet = dir.path().join("fleet.yaml");
    std::fs::write(&fleet, yaml).expect("write fleet");
    (dir, fleet)
}

/// The fleet file in a temp dir and a free rendezvous address: what the ranks of one
/// multi-node test share.
pub struct RankEnv {
    pub dir: tempfile::TempDir,
    pub fleet: PathBuf,
    pub addr: String,
}

impl RankEnv {
    /// `yaml` as the fleet file, and a free address for rank 0.
    pub fn new(yaml: &str) -> RankEnv {
        let (dir, fleet) = fleet_dir(yaml);
        let addr = free_addr();
        RankEnv { dir, fleet, addr }
    }
}

impl RankEnv {
    /// Rank `rank` of `nodes` of `fabric-agent SUBCOMMAND --backend sim` in group `group`,
    /// its termination log in the folder, the secret in the environment, output piped;
    /// `more` arguments after these.
    pub fn sim_rank(
        &self,
        subcommand: &str,
        group: &str,
        nodes: &str,
        rank: u32,
        more: &[&str],
    ) -> std::process::Child {
        let mut cmd = agent();
        cmd.env(
            "FABRIC_TERMINATION_LOG",
            self.dir.path().join(format!("termination-{rank}")),
        )
        .env("FABRIC_RENDEZVOUS_SECRET", SECRET)
        .args([subcommand, "--backend", "sim", "--fleet"])
        .arg(&self.fleet)
        .args(["--nodes", nodes, "--rank", &rank.to_string()])
        .args(["--rendezvous", &self.addr, "--group", group])
        .args(more)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        cmd.spawn().expect("agent starts")
    }

    /// Every rank of `nodes` of `fabric-agent SUBCOMMAND --backend sim` in group `group`,
    /// started the last first (they may start in any order), rank `r` with `more(r)`
    /// arguments; by rank, each one's output and document.
    pub fn sim_ranks<T: serde::de::DeserializeOwned>(
        &self,
        subcommand: &str,
        group: &str,
        nodes: &str,
        more: impl Fn(u32) -> Vec<String>,
    ) -> Vec<(Output, T)> {
        let n = nodes.split(',').count() as u32;
        let children: Vec<Child> = (0..n)
            .rev()
            .map(|r| {
                let more = more(r);
                let more: Vec<&str> = more.iter().map(String::as_str).collect();
                self.sim_rank(subcommand, group, nodes, r, &more)
            })
            .collect();
        let mut done: Vec<(Output, T)> = children
            .into_iter()
            .map(|c| finish_rank(c, subcommand, |l| serde_json::from_str(l)))
            .collect();
        done.reverse();
        done
    }
}

/// The agent's stdout, as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The agent's stderr, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Waits for a rank and reads its last stdout line with `parse`, or fails with both
/// outputs where that line is not a `what` document.
pub fn finish_rank<T, E: Display>(
    child: Child,
    what: &str,
    parse: impl Fn(&str) -> Result<T, E>,
) -> (Output, T) {
    let out = child.wait_with_output().expect("agent ends");
    let stdout = stdout(&out);
    let last = stdout.lines().last().unwrap_or_default().to_string();
    let doc = parse(&last).unwrap_or_else(|e| {
        panic!(
            "last line is a {what} document ({e}); stdout:\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, doc)
}

/// Asserts that every rank ended with 0 and wrote a document of its own rank, measured
/// whole: `facts` gives a document's rank and whether it holds no error and was measured.
pub fn assert_every_rank_measured<T: std::fmt::Debug>(
    ranks: &[(Output, T)],
    facts: impl Fn(&T) -> (u32, bool),
) {
    for (r, (out, doc)) in ranks.iter().enumerate() {
        assert_eq!(out.status.code(), Some(0), "rank {r}: {doc:?}");
        let (rank, whole) = facts(doc);
        assert_eq!(rank, r as u32);
        assert!(whole, "{doc:?}");
    }
}

/// `fabric-agent` with none of the `FABRIC_*` settings of the environment it runs in.
pub fn agent() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric-agent"));
    for var in [
        "FABRIC_BACKEND",
        "FABRIC_SIM_FLEET",
        "FABRIC_NODE_NAME",
        "FABRIC_TERMINATION_LOG",
        "FABRIC_SUITE",
        "FABRIC_RENDEZVOUS",
        "FABRIC_RENDEZVOUS_SECRET",
        "FABRIC_GROUP",
        "FABRIC_RANK",
        "FABRIC_PAIR_NODES",
        "FABRIC_LOG_FORMAT",
        "RUST_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd
}
