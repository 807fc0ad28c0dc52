//! The sweep's sequence with the sim backend, its ranks as threads meeting on loopback.

use super::*;
use crate::fleet::Fleet;
use crate::rendezvous::Secret;
use crate::sim::nccl_nodes::SimNcclNodes;

const FLEET: &str = r#"
seed: 5
nodes:
  - {name: a, product: NVIDIA-H200, gpus: 8}
  - {name: b, product: NVIDIA-H200, gpus: 8}
  - {name: c, product: NVIDIA-H200, gpus: 8}
  - {name: d, product: NVIDIA-H200, gpus: 8}
  - {name: e, product: NVIDIA-H200, gpus: 8}
  - name: slow
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: slowNic, factor: 0.25}]
  - {name: four, product: NVIDIA-H200, gpus: 4}
  - name: started-during
    product: NVIDIA-H200
    gpus: 8
    faults: [{kind: gpusInUse, gpu: 3, bytes: 4294967296, during: true}]
"#;

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("local address").to_string()
}

fn sweep() -> Sweep {
    Sweep {
        collectives: COLLECTIVES.to_vec(),
        sizes: sizes(1 << 10, 256 << 20, 4),
        iters: (1, 2),
    }
}

/// Every rank of `names` run as a thread (ranks that `skip` leaves out never come); their
/// ends, by rank.
fn ranks(names: &[&str], skip: Option<u32>, timeout_ms: u64) -> Vec<Option<NcclNodesEnd>> {
    let fleet = Fleet::parse(FLEET, "test").expect("fleet");
    let nodes: Vec<_> = names
        .iter()
        .map(|n| fleet.node(n).cloned().expect("in the fleet"))
        .collect();
    let addr = free_addr();
    let secret = Secret::generate().expect("a secret");
    let threads: Vec<_> = (0..names.len() as u32)
        .map(|rank| {
            let nodes = nodes.clone();
            let addr = addr.clone();
            let secret = secret.clone();
            let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            std::thread::spawn(move || {
                if skip == Some(rank) {
                    return None;
                }
                let run = NcclNodesRun {
                    config: Config {
                        group: "run-1/nccl".into(),
                        rank,
                        names,
                        addr,
                        secret: secret.clone(),
                        timeout: Duration::from_millis(timeout_ms),
                    },
                    sweep: sweep(),
                    large_bytes: 64 << 20,
                    node_counts: None,
                    timeout: Duration::from_secs(10),
                    shared_gpus: false,
                };
                let mut m = SimNcclNodes {
                    nodes,
                    rank,
                    seed: 5,
                };
                Some(super::run(&mut m, &run, &|_| {}).expect("the rank gets ready"))
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("the rank's thread ends"))
        .collect()
}

fn busbw(p: &NcclNodesPoint, c: Collective) -> f64 {
    p.summary
        .iter()
        .find(|s| s.collective == c)
        .map_or(0.0, |s| s.large_busbw)
}

#[test]
fn the_sizes_grow_by_the_factor_up_to_the_largest() {
    assert_eq!(sizes(8, 128, 2), [8, 16, 32, 64, 128]);
    assert_eq!(sizes(1 << 10, 5 << 10, 4), [1 << 10, 4 << 10, 5 << 10]);
    assert_eq!(sizes(64, 64, 2), [64]);
}

#[test]
fn five_ranks_measure_two_four_and_five_nodes_agree_and_exchange_their_ports() {
    let ends = ranks(&["a", "b", "c", "d", "e"], None, 10_000);
    let docs: Vec<&NcclNodesResult> = ends.iter().map(|e| &e.as_ref().expect("ran").doc).collect();
    for (r, d) in docs.iter().enumerate() {
        assert_eq!(d.header.rank, r as u32);
        assert!(d.errors.is_empty() && d.not_measured.is_none(), "{d:?}");
        assert_eq!(d.points, docs[0].points, "rank {r} gathered the same rows");
    }
    let d = docs[0];
    let counts: Vec<(u32, u32)> = d.points.iter().map(|p| (p.nodes, p.ranks)).collect();
    assert_eq!(counts, [(2, 16), (4, 32), (5, 40)]);
    assert_eq!(d.points[1].node_names, ["a", "b", "c", "d"]);
    for p in &d.points {
        assert_eq!(p.rows.len(), 4 * d.sizes.len());
        for c in COLLECTIVES {
            // Eight NDR ports per H200 node: 400 GB/s, less the collective's efficiency.
            let bw = busbw(p, c);
            assert!((250.0..400.0).contains(&bw), "{c:?} at {}: {bw}", p.nodes);
        }
        let small = &p.summary[0];
        assert_eq!(d.sizes[0], 1 << 10);
        assert!(small.small_time_us > 20.0 && small.small_time_us < 200.0);
    }
    // Every rank has every node's ports, by rank: eight NDR ports each.
    for e in ends.iter().flatten() {
        assert_eq!(e.ports.len(), 5);
        assert!(
            e.ports.iter().all(|p| p
                .as_ref()
                .is_some_and(|p| p.len() == 8 && p.iter().all(|p| p.is_up()))),
            "{:?}",
            e.ports
        );
    }
}

#[test]
fn a_slow_nic_lowers_the_busbw_of_every_count_it_joins_and_of_none_before() {
    let ends = ranks(&["a", "b", "slow", "c"], None, 10_000);
    let d = &ends[0].as_ref().expect("ran").doc;
    let (two, four) = (&d.points[0], &d.points[1]);
    for c in COLLECTIVES {
        assert!(busbw(two, c) > 250.0, "{c:?}: {}", busbw(two, c));
        assert!(
            busbw(four, c) < busbw(two, c) / 3.0,
            "{c:?}: {}",
            busbw(four, c)
        );
    }
}

#[test]
fn nodes_with_different_gpu_counts_are_refused_with_each_count_named() {
    let ends = ranks(&["a", "four"], None, 10_000);
    let d = &ends[1].as_ref().expect("ran").doc;
    assert!(d.points.is_empty());
    let msg = &d.errors[0].message;
    assert!(msg.contains("a: 8, four: 4"), "{msg}");
}

#[test]
fn a_rank_that_never_comes_leaves_every_other_not_measured() {
    let ends = ranks(&["a", "b", "c"], Some(2), 1_500);
    for e in ends[..2].iter() {
        let end = e.as_ref().expect("ran");
        assert!(end.unmet.is_some());
        let nm = end.doc.not_measured.as_ref().expect("not measured");
        assert!(nm.message.contains("rank 2"), "{}", nm.message);
        assert!(end.doc.points.is_empty());
    }
}

#[test]
fn work_that_starts_on_a_ranks_gpus_while_it_measures_makes_only_that_rank_not_measured() {
    let ends = ranks(&["a", "started-during"], None, 10_000);
    let (a, other) = (
        &ends[0].as_ref().expect("ran").doc,
        &ends[1].as_ref().expect("ran").doc,
    );
    assert!(a.not_measured.is_none());
    let nm = other.not_measured.as_ref().expect("not measured");
    assert_eq!(nm.peer, None);
    assert_eq!(a.points, other.points);
}
