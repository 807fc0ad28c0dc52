//! The sim backend's node pair: NCCL between two simulated nodes from a model of their
//! network ports and the path between them, with the fleet file's network faults.
//!
//! # Model
//! - Each node has one network port per GPU (rail-optimised, as DGX and HGX systems), at
//!   400 Gb/s (NDR) for H100, H200 and B200, 200 Gb/s (HDR) for A100, 100 Gb/s otherwise,
//!   InfiniBand link layer.
//! - A node's network carries `up ports x rate / 8` GB/s, times a `slowNic` factor; a pair
//!   runs at the lower of its two nodes, times a `badPath` factor naming the other node.
//! - busbw is that bandwidth times the collective's efficiency (all_reduce 0.92, sendrecv
//!   0.95, all_to_all 0.80, model values), with 1% noise that depends only on the seed, the
//!   two nodes and the collective, so both ranks report the same numbers.
//! - `socketFallback` on either node: NCCL's socket transport, 12 GB/s (model value for
//!   TCP over one 100 GbE-class interface), one interface used.
//! - `nicDown`: that port is `DOWN`/`Polling` in the node's ports; NCCL uses the others.
//! - `nicErrors`: that port's symbol error counter is the wall-clock time times the rate
//!   (as a counter since driver load grows on a marginal link); bandwidth is untouched.
//! - time per iteration = latency (20 µs RDMA, 60 µs sockets) + bytes / algbw, with
//!   algbw = busbw / the collective's bus factor for 2 x G ranks (nccl-tests' definitions).

use super::PairOptions;
use crate::fleet::{Fault, Fleet, FleetNode};
use gpufabric_api::nic_counters::PortErrors;
use gpufabric_api::pair::{NetTransport, NicPort, NodePairResult, PairCollective};
use gpufabric_api::product::{ProductFamily, family};
use gpufabric_api::suite::Collective;
use std::hash::{Hash, Hasher};

/// Socket transport bandwidth between two nodes, GB/s (model value).
pub(crate) const SOCKET_GBPS: f64 = 12.0;

/// Port rate of a product's nodes, Gb/s, by the product's [`family`].
pub(crate) fn port_rate_gbps(product: &str) -> f64 {
    match family(product) {
        Some(ProductFamily::H100 | ProductFamily::H200 | ProductFamily::B200) => 400.0,
        Some(ProductFamily::A100) => 200.0,
        Some(ProductFamily::B300 | ProductFamily::H20) | None => 100.0,
    }
}

/// Why a pair cannot be simulated.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SimPairError {
    #[error("node {0:?} is not in the fleet file")]
    UnknownNode(String),
}

/// The node's network ports as sysfs would show them now.
pub(crate) fn ports(node: &FleetNode) -> Vec<NicPort> {
    ports_at(node, crate::sim::counter_at_now)
}

/// The node's network ports, with `counter(per_second)` the count of an error counter
/// growing at that rate (the `nicErrors` faults).
pub(crate) fn ports_at(node: &FleetNode, counter: impl Fn(f64) -> u64) -> Vec<NicPort> {
    let rate = port_rate_gbps(&node.product);
    (0..node.gpus)
        .map(|i| {
            let down = node
                .faults
                .iter()
                .any(|f| matches!(f, Fault::NicDown { nic } if *nic == i));
            let symbol_errors: u64 = node
                .faults
                .iter()
                .filter_map(|f| match f {
                    Fault::NicErrors { nic, per_second } if *nic == i => Some(counter(*per_second)),
                    _ => None,
                })
                .fold(0, u64::saturating_add);
            NicPort {
                device: format!("mlx5_{i}"),
                port: 1,
                link_layer: Some("InfiniBand".into()),
                state: if down { "DOWN" } else { "ACTIVE" }.into(),
                phys_state: if down { "Polling" } else { "LinkUp" }.into(),
                rate_gbps: Some(rate),
                errors: PortErrors {
                    symbol_errors: Some(symbol_errors),
                    link_downed: Some(0),
                    rcv_errors: Some(0),
                },
            }
        })
        .collect()
}

pub(crate) fn socket(node: &FleetNode) -> bool {
    node.faults
        .iter()
        .any(|f| matches!(f, Fault::SocketFallback))
}

/// The node's network bandwidth in GB/s: up ports x rate, times a slow-NIC factor.
fn node_gbps(node: &FleetNode) -> f64 {
    let up = ports(node).iter().filter(|p| p.is_up()).count() as f64;
    let slow: f64 = node
        .faults
        .iter()
        .filter_map(|f| match f {
            Fault::SlowNic { factor } => Some(*factor),
            _ => None,
        })
        .product();
    up * port_rate_gbps(&node.product) / 8.0 * slow
}

fn path_factor(a: &FleetNode, b: &FleetNode) -> f64 {
    let named = |n: &FleetNode, peer: &str| -> f64 {
        n.faults
            .iter()
            .filter_map(|f| match f {
                Fault::BadPath { peer: p, factor } if p == peer => Some(*factor),
                _ => None,
            })
            .product()
    };
    named(a, &b.name) * named(b, &a.name)
}

pub(crate) fn efficiency(c: Collective) -> f64 {
    match c {
        Collective::AllReduce => 0.92,
        Collective::SendRecv => 0.95,
        Collective::AllToAll => 0.80,
        _ => 0.90,
    }
}

/// 1% Gaussian-like noise (sum of uniforms), the same for both ranks of the pair.
pub(crate) fn noise(seed: u64, a: &str, b: &str, c: Collective) -> f64 {
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    let mut sum = 0.0;
    for i in 0..4u32 {
        let mut h = std::hash::DefaultHasher::new();
        (seed, lo, hi, c.api_name(), i).hash(&mut h);
        sum += (h.finish() >> 11) as f64 / (1u64 << 53) as f64 - 0.5;
    }
    // The sum of 4 uniforms on (-0.5, 0.5) has a standard deviation of 1/sqrt(3).
    1.0 + 0.01 * sum * 3f64.sqrt()
}

/// Bandwidth in GB/s between nodes `a` and `b` as the model has it: sockets when either
/// falls back to them, else the slower node's NICs times a bad path's factor.
pub(crate) fn path_gbps(a: &FleetNode, b: &FleetNode) -> f64 {
    if socket(a) || socket(b) {
        SOCKET_GBPS
    } else {
        node_gbps(a).min(node_gbps(b)) * path_factor(a, b)
    }
}

/// What rank `opts.rank` measures of the pair, from the fleet's model, into its document.
pub(crate) fn measure(
    fleet: &Fleet,
    opts: &PairOptions,
    seed: u64,
    doc: &mut NodePairResult,
) -> Result<(), SimPairError> {
    let node = |name: &str| {
        fleet
            .node(name)
            .ok_or_else(|| SimPairError::UnknownNode(name.to_string()))
    };
    let (a, b) = (node(&opts.nodes[0])?, node(&opts.nodes[1])?);
    let me = node(opts.node())?;
    let gpus = a.gpus.min(b.gpus);
    let on_sockets = socket(a) || socket(b);
    let bandwidth = path_gbps(a, b);
    let (transport, alpha_us) = if on_sockets {
        (NetTransport::Socket, 60.0)
    } else {
        (NetTransport::Ib, 20.0)
    };
    let ranks = 2 * gpus as usize;
    let collectives = opts
        .collectives
        .iter()
        .map(|&c| {
            let busbw = bandwidth * efficiency(c) * noise(seed, &a.name, &b.name, c);
            let algbw = busbw / c.busbw_factor(ranks);
            let time_us = alpha_us + opts.bytes as f64 / (algbw * 1e3);
            PairCollective {
                collective: c,
                bytes: opts.bytes,
                time_us: round(time_us, 1),
                algbw: round(algbw, 2),
                busbw: round(busbw, 2),
                wrong: 0,
            }
        })
        .collect();
    let my_ports = ports(me);
    let nics_used = if on_sockets {
        1
    } else {
        my_ports.iter().filter(|p| p.is_up()).count() as u32
    };
    doc.gpus_per_node = gpus;
    doc.collectives = collectives;
    doc.transport = Some(transport);
    doc.nics_used = nics_used;
    doc.nics = my_ports;
    Ok(())
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pairs::DEFAULT_COLLECTIVES;
    use gpufabric_api::result::Backend;

    /// The document rank `opts.rank` writes for the pair.
    fn node_pair(
        fleet: &Fleet,
        opts: &PairOptions,
        seed: u64,
        started_at: String,
    ) -> Result<NodePairResult, SimPairError> {
        let mut doc = crate::node_pair::document(opts, Backend::Sim, started_at);
        measure(fleet, opts, seed, &mut doc)?;
        Ok(doc)
    }

    fn fleet(faults: &[(&str, Fault)]) -> Fleet {
        let nodes = ["a", "b", "c"]
            .iter()
            .map(|n| FleetNode {
                name: n.to_string(),
                product: "NVIDIA-H200".into(),
                gpus: 8,
                labels: Default::default(),
                faults: faults
                    .iter()
                    .filter(|(m, _)| m == n)
                    .map(|(_, f)| f.clone())
                    .collect(),
                software: Default::default(),
            })
            .collect();
        Fleet { seed: 1, nodes }
    }

    fn opts(a: &str, b: &str, rank: u32) -> PairOptions {
        PairOptions {
            group: "g".into(),
            rank,
            nodes: [a.into(), b.into()],
            bytes: 1 << 30,
            collectives: DEFAULT_COLLECTIVES.to_vec(),
        }
    }

    fn busbw(f: &Fleet, a: &str, b: &str) -> f64 {
        node_pair(f, &opts(a, b, 0), 3, String::new())
            .expect("simulates")
            .busbw()
            .expect("all_reduce")
    }

    #[test]
    fn a_clean_h200_pair_runs_at_eight_ndr_ports_over_infiniband() {
        let f = fleet(&[]);
        let d = node_pair(&f, &opts("a", "b", 1), 3, String::new()).expect("simulates");
        let bw = d.busbw().expect("all_reduce");
        // 8 x 400 Gb/s = 400 GB/s, x 0.92.
        assert!((bw - 368.0).abs() < 368.0 * 0.04, "{bw}");
        assert_eq!(d.transport, Some(NetTransport::Ib));
        assert_eq!((d.nics_used, d.nics.len(), d.gpus_per_node), (8, 8, 8));
        assert_eq!(d.rank, 1);
        let ar = &d.collectives[0];
        // algbw = busbw / (2 (16 - 1) / 16); time = 20 µs + bytes / algbw.
        assert!((ar.algbw - ar.busbw / 1.875).abs() < 0.01);
        let expect_us = 20.0 + (1u64 << 30) as f64 / (ar.algbw * 1e3);
        assert!((ar.time_us - expect_us).abs() / expect_us < 0.001);
    }

    #[test]
    fn both_ranks_report_the_same_numbers() {
        let f = fleet(&[]);
        let r0 = node_pair(&f, &opts("a", "b", 0), 3, String::new()).expect("simulates");
        let r1 = node_pair(&f, &opts("a", "b", 1), 3, String::new()).expect("simulates");
        assert_eq!(r0.collectives, r1.collectives);
        let other_seed = node_pair(&f, &opts("a", "b", 0), 4, String::new()).expect("sim");
        assert_ne!(r0.collectives, other_seed.collectives);
    }

    #[test]
    fn a_slow_nic_slows_every_pair_of_its_node_and_no_other() {
        let f = fleet(&[("a", Fault::SlowNic { factor: 0.25 })]);
        assert!(busbw(&f, "a", "b") < 100.0);
        assert!(busbw(&f, "c", "a") < 100.0);
        assert!(busbw(&f, "b", "c") > 350.0);
    }

    #[test]
    fn a_bad_path_slows_only_that_pair() {
        let f = fleet(&[(
            "b",
            Fault::BadPath {
                peer: "c".into(),
                factor: 0.3,
            },
        )]);
        assert!(busbw(&f, "c", "b") < 120.0);
        assert!(busbw(&f, "a", "b") > 350.0);
        assert!(busbw(&f, "a", "c") > 350.0);
    }

    #[test]
    fn a_nic_down_shows_in_the_ports_and_takes_its_share() {
        let f = fleet(&[("a", Fault::NicDown { nic: 3 })]);
        let d = node_pair(&f, &opts("a", "b", 0), 3, String::new()).expect("simulates");
        assert_eq!(d.nics_used, 7);
        assert_eq!(d.nics[3].state, "DOWN");
        assert!(!d.nics[3].is_up());
        let bw = d.busbw().expect("all_reduce");
        assert!((bw - 368.0 * 7.0 / 8.0).abs() < 15.0, "{bw}");
        // The peer's own ports are all up.
        let peer = node_pair(&f, &opts("a", "b", 1), 3, String::new()).expect("simulates");
        assert!(peer.nics.iter().all(NicPort::is_up));
    }

    #[test]
    fn a_nic_with_errors_counts_them_up_with_time_and_stays_up() {
        let f = fleet(&[(
            "a",
            Fault::NicErrors {
                nic: 5,
                per_second: 1000.0,
            },
        )]);
        let node = f.node("a").expect("node a");
        let at = |secs: u64| {
            ports_at(node, |per_second| {
                crate::sim::counter_at(per_second, std::time::Duration::from_secs(secs))
            })
        };
        let (then, later) = (at(1_000), at(1_060));
        assert_eq!(then[5].errors.symbol_errors, Some(1_000_000));
        assert_eq!(later[5].errors.symbol_errors, Some(1_060_000));
        for p in then.iter().chain(&later) {
            assert!(p.is_up(), "{p:?}");
            assert_eq!(
                (p.errors.link_downed, p.errors.rcv_errors),
                (Some(0), Some(0))
            );
            if p.device != "mlx5_5" {
                assert_eq!(p.errors.symbol_errors, Some(0), "{p:?}");
            }
        }
        // The pair runs at full speed, and its document carries the growing port.
        let d = node_pair(&f, &opts("a", "b", 0), 3, String::new()).expect("simulates");
        assert!(
            d.nics[5]
                .errors
                .symbol_errors
                .is_some_and(|n| n > 1_000_000_000),
            "{:?}",
            d.nics[5]
        );
        assert!(busbw(&f, "a", "b") > 350.0);
        let peer = node_pair(&f, &opts("a", "b", 1), 3, String::new()).expect("simulates");
        assert!(peer.nics.iter().all(|p| p.errors.symbol_errors == Some(0)));
    }

    #[test]
    fn a_socket_fallback_on_either_node_puts_the_pair_on_sockets() {
        let f = fleet(&[("b", Fault::SocketFallback)]);
        let d = node_pair(&f, &opts("a", "b", 0), 3, String::new()).expect("simulates");
        assert_eq!(d.transport, Some(NetTransport::Socket));
        assert_eq!(d.nics_used, 1);
        assert!(d.busbw().expect("all_reduce") < 13.0);
    }

    #[test]
    fn an_unknown_node_is_an_error_naming_it() {
        let f = fleet(&[]);
        let err = node_pair(&f, &opts("a", "zz", 0), 3, String::new()).expect_err("unknown");
        assert_eq!(err.to_string(), "node \"zz\" is not in the fleet file");
    }
}
