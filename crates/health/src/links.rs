//! The multi-node NCCL sweep's expectation on paper: from the network ports the nodes report,
//! the busbw each collective can reach at each node count, and the counts whose measured
//! curve stands far below that ceiling or above it.
//!
//! # Model
//! busbw is nccl-tests' bus bandwidth (`doc/PERFORMANCE.md` of NVIDIA/nccl-tests): the
//! algorithm bandwidth times the collective's factor for `n` ranks
//! ([`Collective::busbw_factor`]), chosen so that it reads as the speed of the slowest link a
//! rank's data crosses, whatever `n`. Across nodes (`k` nodes of `G` GPUs, `n = k x G` ranks):
//! 1. **Rails.** NCCL spreads its channels over the node's InfiniBand / RoCE ports (one rail
//!    per port on a rail-optimised node): every port that is up (`ACTIVE`, `LinkUp`) with a
//!    rate counts, and the node carries their rates added up, `B = sum(rate) / 8` GB/s. A
//!    port that is down lowers `B` (NCCL uses the others).
//! 2. **Slowest node.** Each ring passes through every node, so the node count is bounded by
//!    the node of the lowest `B` among its nodes.
//! 3. **Ring collectives** (all_reduce, all_gather, reduce_scatter): each of the `R` rings
//!    enters and leaves every node over one port, and a ring carries `1/R` of the data, which
//!    is what busbw counts per rank; so busbw <= `B`. 8 ports of 400 Gb/s: 400 GB/s.
//! 4. **alltoall**: each rank sends `1/n` of its buffer to every other rank, so a node sends
//!    `G x (k-1) / k` of one rank's buffer across its ports while the rest stays inside the
//!    node; algbw <= `B x k / (G x (k-1))` and busbw is that times `(n-1)/n`, which tends to
//!    `B / G` (one rail per GPU) as `k` grows.
//! 5. **NVLink** inside a node is not the bound once there is more than one node: its links
//!    carry several times a node's network rate on every system this models.
//! 6. **Unknown.** A node with no port reported (NCCL over sockets, e.g. a veth on an emulated
//!    bed), none up (sockets again), a port up without a rate, or no report at all gives no
//!    ceiling, and says why; so does a sweep without its GPUs per node (alltoall needs `G`).
//!
//! The ceiling is an upper bound: protocol headers, the PCIe path to the NIC and the switches
//! take their share. A measured count below [`MIN_SHARE`] of it is far below (something other
//! than the links bounds it); one above `1 +` [`ABOVE_TOLERANCE`] of it means the ports were
//! reported wrong, the traffic does not cross them, or the switches reduce it (SHARP,
//! CollNet: not modelled), so the ceiling cannot be trusted. alltoall is judged only below
//! its ceiling: its bound rests on traffic spread evenly over the ranks, and a reading above
//! it says more of that assumption than of the ports. Neither is a finding on a node.

use gpufabric_api::link_ceiling::{
    LinkGapKind, LinksUnknown, NcclNodesCeiling, NcclNodesLinkGap, NcclNodesLinks,
};
use gpufabric_api::nic::NicPort;
use gpufabric_api::suite::Collective;

/// Least share of the links' ceiling a node count's busbw is expected to reach at the large
/// sizes. nccl-tests over healthy InfiniBand or RoCE reaches 80-95% of the ports' rate for the
/// ring collectives (headers, the PCIe hop and the flow control take the rest) and alltoall
/// somewhat less; below half, something other than the links bounds the curve: spine
/// oversubscription, a rail NCCL does not use, GPUDirect RDMA off, or sockets instead of
/// RDMA. Half is far enough below that the spread of a good fabric never reaches it.
pub const MIN_SHARE: f64 = 0.5;

/// How far above the ceiling a measurement may stand before the ceiling is distrusted: the
/// timing noise of one sweep (a few percent) and the rounding of the reported rates.
pub const ABOVE_TOLERANCE: f64 = 0.05;

/// One node's network as the model reads its ports (rule 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeRate {
    /// Ports up with a rate.
    pub rails: u32,
    /// Their rates added up, GB/s.
    pub gbps: f64,
}

/// Rule 1 for one node's reported ports (`None`: the node reported nothing).
pub fn node_rate(ports: Option<&[NicPort]>) -> Result<NodeRate, LinksUnknown> {
    let ports = ports.ok_or(LinksUnknown::NotReported)?;
    if ports.is_empty() {
        return Err(LinksUnknown::NoPorts);
    }
    let up: Vec<&NicPort> = ports.iter().filter(|p| p.is_up()).collect();
    if up.is_empty() {
        return Err(LinksUnknown::NoneUp);
    }
    let mut gbits = 0.0;
    for p in &up {
        match p.rate_gbps {
            Some(r) if r.is_finite() && r > 0.0 => gbits += r,
            _ => return Err(LinksUnknown::NoRate),
        }
    }
    Ok(NodeRate {
        rails: u32::try_from(up.len()).unwrap_or(u32::MAX),
        gbps: gbits / 8.0,
    })
}

/// Rules 1, 2 and 6 for one node count: `nodes` are its nodes (name, reported ports), by rank.
/// The first node whose links are unknown, else the one of the lowest rate.
pub fn bound(nodes: &[(&str, Option<&[NicPort]>)]) -> Option<NcclNodesLinks> {
    let mut slowest: Option<(&str, NodeRate)> = None;
    for (name, ports) in nodes {
        match node_rate(*ports) {
            Err(why) => {
                return Some(NcclNodesLinks {
                    node: name.to_string(),
                    rails: 0,
                    gbps: None,
                    unknown: Some(why),
                });
            }
            Ok(r) if slowest.is_none_or(|(_, s)| r.gbps < s.gbps) => slowest = Some((name, r)),
            Ok(_) => {}
        }
    }
    slowest.map(|(name, r)| NcclNodesLinks {
        node: name.to_string(),
        rails: r.rails,
        gbps: Some(r.gbps),
        unknown: None,
    })
}

/// Rules 3 to 5: the busbw ceiling of `collective` over `nodes` nodes of `gpus` GPUs each,
/// whose slowest node carries `node_gbps` GB/s. None for one node, no GPUs, or a collective
/// the sweep does not run across nodes.
pub fn ceiling(collective: Collective, nodes: u32, gpus: u32, node_gbps: f64) -> Option<f64> {
    if nodes < 2 || !node_gbps.is_finite() || node_gbps <= 0.0 {
        return None;
    }
    match collective {
        Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter => {
            Some(node_gbps)
        }
        Collective::AllToAll if gpus > 0 => {
            let (k, g) = (f64::from(nodes), f64::from(gpus));
            let algbw = node_gbps * k / (g * (k - 1.0));
            Some(algbw * collective.busbw_factor((nodes * gpus) as usize))
        }
        _ => None,
    }
}

/// One measured point of a sweep: its node count, GPUs per node, what bounds it, and per
/// collective its busbw at the large sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured<'a> {
    pub nodes: u32,
    pub gpus: u32,
    pub links: Option<&'a NcclNodesLinks>,
    pub busbw: Vec<(Collective, f64)>,
}

/// Each collective's ceiling at a point and the share of it measured; empty when the links
/// are unknown.
pub fn ceilings(point: &Measured<'_>) -> Vec<NcclNodesCeiling> {
    let Some(gbps) = point.links.and_then(|l| l.gbps) else {
        return Vec::new();
    };
    point
        .busbw
        .iter()
        .filter_map(|&(collective, busbw)| {
            let c = ceiling(collective, point.nodes, point.gpus, gbps)?;
            Some(NcclNodesCeiling {
                collective,
                busbw: c,
                share: busbw / c,
            })
        })
        .collect()
}

/// The counts of one sweep (of topology block `block`, or the group's) far below their
/// ceiling or above it, each with a message a person can act on.
pub fn gaps(points: &[Measured<'_>], block: Option<&str>) -> Vec<NcclNodesLinkGap> {
    let mut out = Vec::new();
    for p in points {
        let Some(links) = p.links else { continue };
        for c in ceilings(p) {
            let Some(&(_, busbw)) = p.busbw.iter().find(|(k, _)| *k == c.collective) else {
                continue;
            };
            if !busbw.is_finite() || busbw <= 0.0 {
                continue;
            }
            let kind = if c.share < MIN_SHARE {
                LinkGapKind::Below
            } else if c.share > 1.0 + ABOVE_TOLERANCE && c.collective != Collective::AllToAll {
                LinkGapKind::Above
            } else {
                continue;
            };
            let name = c.collective.nccl_tests_name();
            let in_block = block.map(|b| format!(" in block {b}")).unwrap_or_default();
            let head = format!(
                "{name} over {} nodes{in_block} reached {busbw:.1} GB/s, {:.0}% of the {:.1} GB/s the links allow (slowest node {})",
                p.nodes,
                c.share * 100.0,
                c.busbw,
                links.describe(),
            );
            let message = match kind {
                LinkGapKind::Below => format!(
                    "{head}: less than {:.0}%, so something other than the links bounds it; look for spine oversubscription, rails NCCL does not use (NCCL_IB_HCA), GPUDirect RDMA off, or sockets instead of RDMA",
                    MIN_SHARE * 100.0
                ),
                LinkGapKind::Above => format!(
                    "{head}: more than the links can carry, so the ports were reported wrong, the traffic does not cross them, or the switches reduce it in the network (SHARP, CollNet), and this ceiling cannot be trusted"
                ),
            };
            out.push(NcclNodesLinkGap {
                kind,
                block: block.map(str::to_string),
                collective: c.collective,
                nodes: p.nodes,
                busbw,
                ceiling: c.busbw,
                message,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests;
