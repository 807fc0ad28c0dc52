//! `fabric-agent nccl-nodes` end to end on the sim backend: four agent processes meet over
//! TCP on loopback, sweep the four collectives over 2 and 4 nodes, and each prints the same
//! nccl-tests rows and writes the same document; a slow NIC shows in every count it joins;
//! bad settings are refused before any rank meets another; a stop while a rank waits for the
//! others ends it with 143, the rendezvous named.

mod common;

use common::{EXIT_USAGE, RankEnv, SECRET, agent, assert_every_rank_measured};
use gpufabric_api::nccl_nodes::NcclNodesResult;
use gpufabric_api::suite::Collective;
use std::process::Output;
use std::time::{Duration, Instant};

const FLEET: &str = r#"
seed: 3
nodes:
  - {name: a, product: NVIDIA-H200, gpus: 8}
  - {name: b, product: NVIDIA-H200, gpus: 8}
  - {name: c, product: NVIDIA-H200, gpus: 8}
  - name: slownic
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: slowNic, factor: 0.2}]
"#;

impl RankEnv {
    /// Every rank of `nodes` sweeping 1K to 256M by 4, rank `r` writing `doc-r.json` too.
    fn nccl_all(&self, nodes: &str) -> Vec<(Output, NcclNodesResult)> {
        self.sim_ranks("nccl-nodes", "run-1/nccl", nodes, |rank| {
            let json = self.dir.path().join(format!("doc-{rank}.json"));
            let sweep = [
                "--rendezvous-timeout",
                "20",
                "-b",
                "1K",
                "-e",
                "256M",
                "-f",
                "4",
            ];
            let json = ["--json".to_string(), json.to_string_lossy().into_owned()];
            sweep.map(String::from).into_iter().chain(json).collect()
        })
    }
}

fn busbw(d: &NcclNodesResult, point: usize, c: Collective) -> f64 {
    d.points[point]
        .summary
        .iter()
        .find(|s| s.collective == c)
        .map_or(0.0, |s| s.large_busbw)
}

#[test]
fn four_agents_sweep_two_and_four_nodes_and_print_the_same_nccl_tests_rows() {
    let env = RankEnv::new(FLEET);
    let ranks = env.nccl_all("a,b,c,slownic");
    assert_every_rank_measured(&ranks, |d| {
        (
            d.header.rank,
            d.errors.is_empty() && d.not_measured.is_none(),
        )
    });
    for (r, (_, doc)) in ranks.iter().enumerate() {
        assert_eq!(doc.points, ranks[0].1.points, "rank {r}");
        // --json holds the same document.
        let file = std::fs::read_to_string(env.dir.path().join(format!("doc-{r}.json")))
            .expect("--json written");
        assert_eq!(&NcclNodesResult::parse(&file).expect("parses"), doc);
    }
    let d = &ranks[0].1;
    let counts: Vec<(u32, u32)> = d.points.iter().map(|p| (p.nodes, p.ranks)).collect();
    assert_eq!(counts, [(2, 16), (4, 32)]);
    assert_eq!(d.points[0].node_names, ["a", "b"]);
    // Two healthy nodes run near their eight NDR ports; the slow NIC of the fourth node
    // sets every collective of four nodes.
    for c in [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
    ] {
        assert!(busbw(d, 0, c) > 250.0, "{c:?}: {}", busbw(d, 0, c));
        assert!(
            busbw(d, 1, c) < 0.25 * busbw(d, 0, c),
            "{c:?}: {}",
            busbw(d, 1, c)
        );
    }
    let table = String::from_utf8_lossy(&ranks[2].0.stdout);
    assert!(
        table.contains("# 4 nodes, 32 ranks: a b c slownic"),
        "{table}"
    );
    let row = table
        .lines()
        .find(|l| l.trim_start().starts_with("alltoall") && l.contains(" 268435456 "))
        .expect("an alltoall row at 256 MiB");
    assert_eq!(row.split_whitespace().nth(2), Some("67108864"), "{row}");
}

#[test]
fn bad_settings_are_refused_with_exit_code_2() {
    let env = RankEnv::new(FLEET);
    for more in [
        &["--nodes", "a"][..],
        &["--nodes", "a,b", "--node-counts", "1,2"],
        &["--nodes", "a,b", "--collectives", "broadcast"],
        &["--nodes", "a,b", "-b", "1M", "-e", "1K"],
    ] {
        let out = agent()
            .args(["nccl-nodes", "--backend", "sim", "--fleet"])
            .arg(&env.fleet)
            .args(["--rank", "0", "--rendezvous", &env.addr, "--group", "g"])
            .args(["--secret", SECRET])
            .args(more)
            .output()
            .expect("agent runs");
        assert_eq!(out.status.code(), Some(EXIT_USAGE), "{more:?}: {out:?}");
    }
}

#[test]
fn sigterm_while_a_rank_waits_for_the_others_exits_143_naming_the_rendezvous() {
    let env = RankEnv::new(FLEET);
    let mut child = env.sim_rank(
        "nccl-nodes",
        "run-1/nccl",
        "a,b",
        0,
        &["--rendezvous-timeout", "60"],
    );
    let term = env.dir.path().join("termination-0");
    let t0 = Instant::now();
    while !std::fs::read_to_string(&term).is_ok_and(|t| t.contains("rendezvous at")) {
        assert!(t0.elapsed() < Duration::from_secs(20), "never waited");
        std::thread::sleep(Duration::from_millis(50));
    }
    let sent = std::process::Command::new("kill")
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
            panic!("the agent did not exit within 5 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(143));
    let text = std::fs::read_to_string(&term).expect("termination message");
    assert!(
        text.contains("stopped by SIGTERM in phase \"nccl-nodes: rendezvous at"),
        "{text}"
    );
}
