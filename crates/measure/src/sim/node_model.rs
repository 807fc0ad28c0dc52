//! One simulated node: its product, its faults resolved per GPU and pair, and the
//! bandwidth and latency every measurement is computed from.

#![forbid(unsafe_code)]

use super::noise::Rng;
use super::products::{ProductModel, product_model};
use crate::fleet::{Fault, FleetNode};
use gpufabric_api::result::Transport;
use gpufabric_api::suite::Collective;

/// Per-node state of the model: product, faults resolved per GPU and pair, node bias.
pub(crate) struct NodeModel<'a> {
    pub(crate) node: &'a FleetNode,
    pub(crate) product: ProductModel,
    pub(crate) seed: u64,
    /// Systematic bandwidth and compute factors of this node (node-to-node spread).
    pub(crate) bw_bias: f64,
    pub(crate) compute_bias: f64,
}

impl<'a> NodeModel<'a> {
    pub(crate) fn new(node: &'a FleetNode, seed: u64) -> Self {
        let mut rng = Rng::new(seed, &node.name, "node-bias");
        NodeModel {
            node,
            product: product_model(&node.product),
            seed,
            bw_bias: rng.jitter(0.006),
            compute_bias: rng.jitter(0.004),
        }
    }

    pub(crate) fn rng(&self, stream: &str) -> Rng {
        Rng::new(self.seed, &self.node.name, stream)
    }

    pub(crate) fn gpus(&self) -> u32 {
        self.node.gpus
    }

    pub(crate) fn dead_links(&self, gpu: u32) -> u32 {
        self.node
            .faults
            .iter()
            .map(|f| match f {
                Fault::DeadLink { gpu: g, links } if *g == gpu => *links,
                _ => 0,
            })
            .sum::<u32>()
            .min(self.product.nvlinks)
    }

    pub(crate) fn nvlink_active(&self, gpu: u32) -> u32 {
        self.product.nvlinks - self.dead_links(gpu)
    }

    /// Share of a GPU's NVLink bandwidth still up.
    pub(crate) fn link_fraction(&self, gpu: u32) -> f64 {
        if self.product.nvlinks == 0 {
            return 1.0;
        }
        f64::from(self.nvlink_active(gpu)) / f64::from(self.product.nvlinks)
    }

    pub(crate) fn transport(&self, a: u32, b: u32) -> Transport {
        let fallback = self.node.faults.iter().rev().find_map(|f| match f {
            Fault::TransportFallback { gpus, transport } if same_pair(*gpus, a, b) => {
                Some(*transport)
            }
            _ => None,
        });
        fallback.unwrap_or(if self.product.nvlinks > 0 {
            Transport::Nvlink
        } else {
            Transport::Pcie
        })
    }

    /// Bandwidth (GB/s, one direction) of a transport other than NVLink between two GPUs
    /// of this node (model values: PCIe peer to peer at 80% of the host link, through host
    /// memory at 40%, through one 200 Gb/s NIC about 20 GB/s).
    pub(crate) fn fallback_gbps(&self, t: Transport) -> f64 {
        match t {
            Transport::Pcie => self.product.host_gbps * 0.8,
            Transport::Shm | Transport::Unknown => self.product.host_gbps * 0.4,
            Transport::Net => 20.0,
            Transport::Nvlink => self.product.copy_uni_gbps,
        }
    }

    /// Bandwidth factor (1.0 healthy) of the link between two GPUs.
    pub(crate) fn link_factor(&self, a: u32, b: u32) -> f64 {
        let slow: f64 = self
            .node
            .faults
            .iter()
            .map(|f| match f {
                Fault::SlowPair { gpus, factor } if same_pair(*gpus, a, b) => *factor,
                Fault::SlowFabric { factor } if a != b => *factor,
                _ => 1.0,
            })
            .product();
        let links = self.link_fraction(a).min(self.link_fraction(b));
        let mut factor = slow * links;
        let t = self.transport(a, b);
        let native = if self.product.nvlinks > 0 {
            Transport::Nvlink
        } else {
            Transport::Pcie
        };
        if t != native {
            factor = factor.min(self.fallback_gbps(t) / self.product.copy_uni_gbps);
        }
        factor
    }

    /// The slowest link among a set of ranks (1.0 for a single rank).
    pub(crate) fn ring_factor(&self, ranks: &[u32]) -> f64 {
        let mut f: f64 = 1.0;
        for (i, &a) in ranks.iter().enumerate() {
            for &b in &ranks[i + 1..] {
                f = f.min(self.link_factor(a, b));
            }
        }
        f
    }

    /// Current PCIe generation and width of a GPU's host link.
    pub(crate) fn pcie(&self, gpu: u32) -> (u32, u32) {
        self.node
            .faults
            .iter()
            .rev()
            .find_map(|f| match f {
                Fault::PcieDegraded {
                    gpu: g,
                    generation,
                    width,
                } if *g == gpu => Some((*generation, *width)),
                _ => None,
            })
            .unwrap_or((self.product.pcie_gen, self.product.pcie_width))
    }

    /// Host link rate relative to its maximum.
    pub(crate) fn pcie_factor(&self, gpu: u32) -> f64 {
        let (generation, width) = self.pcie(gpu);
        let rate = |g: u32| 2.5 * f64::from(1u32 << g.clamp(1, 6).saturating_sub(1));
        let max = rate(self.product.pcie_gen) * f64::from(self.product.pcie_width.max(1));
        (rate(generation.max(1)) * f64::from(width) / max).clamp(0.0, 1.0)
    }

    pub(crate) fn straggler(&self, gpu: u32) -> f64 {
        self.node
            .faults
            .iter()
            .map(|f| match f {
                Fault::Straggler { gpu: g, factor } if *g == gpu => *factor,
                _ => 1.0,
            })
            .product()
    }

    /// Share of normal device memory bandwidth a GPU has (1.0: normal).
    pub(crate) fn memory_factor(&self, gpu: u32) -> f64 {
        self.node
            .faults
            .iter()
            .map(|f| match f {
                Fault::SlowMemory { gpu: g, factor } if *g == gpu => *factor,
                _ => 1.0,
            })
            .product()
    }

    /// Whether a GPU computes a wrong result (an `sdc` fault).
    pub(crate) fn corrupts(&self, gpu: u32) -> bool {
        self.node
            .faults
            .iter()
            .any(|f| matches!(f, Fault::Sdc { gpu: g } if *g == gpu))
    }

    /// How much slower than normal the CPU launching the NCCL sweep runs (1.0: normal).
    pub(crate) fn launch_cpu_factor(&self) -> f64 {
        self.node
            .faults
            .iter()
            .map(|f| match f {
                Fault::SlowLaunchCpu { factor } => *factor,
                _ => 1.0,
            })
            .product()
    }

    /// Large-size bus bandwidth (GB/s) of a collective among `ranks`.
    pub(crate) fn busbw(&self, c: Collective, ranks: &[u32]) -> f64 {
        // Ratios to all_reduce (sendrecv: to the one-way copy) as measured on 4 x H200
        // (see [`H200`]): all_gather 325, reduce_scatter 326, broadcast 361, reduce 364,
        // alltoall 335, sendrecv 360 GB/s against all_reduce 354 and copies 395.
        let ar = self.product.all_reduce_busbw_gbps;
        let base = match c {
            Collective::AllReduce => ar,
            Collective::AllGather | Collective::ReduceScatter => ar * 0.92,
            Collective::Broadcast | Collective::Reduce => ar * 1.02,
            Collective::AllToAll => ar * 0.95,
            Collective::SendRecv => self.product.copy_uni_gbps * 0.91,
        };
        base * self.ring_factor(ranks) * self.bw_bias
    }

    /// Small-size latency (microseconds) of a collective over `n` ranks.
    pub(crate) fn alpha_us(&self, c: Collective, n: u32) -> f64 {
        // Ratios of smallest-size times to all_reduce's, as measured on 4 x H200:
        // all_gather 10.7, reduce_scatter 13.9, broadcast 9.2, reduce 9.1, alltoall 6.8,
        // sendrecv 6.7 µs against all_reduce 10.2.
        let per = match c {
            Collective::AllReduce => 1.0,
            Collective::AllGather => 1.05,
            Collective::ReduceScatter => 1.35,
            Collective::Broadcast | Collective::Reduce => 0.9,
            Collective::AllToAll | Collective::SendRecv => 0.66,
        };
        if n <= 1 {
            return 4.0;
        }
        // Latency grows with the number of ring steps: log2(n)/3 of the 8-rank value.
        let steps = 0.5 + 0.5 * f64::from(n).log2() / 3.0;
        self.product.alpha_us * per * steps
    }

    /// Model time (µs) of one collective of `bytes` over `ranks`.
    pub(crate) fn collective_time_us(&self, c: Collective, ranks: &[u32], bytes: u64) -> f64 {
        let n = ranks.len() as u32;
        let alpha = self.alpha_us(c, n);
        if n <= 1 {
            // One rank: a local copy through HBM (model: 1.5 TB/s).
            return alpha + bytes as f64 / 1.5e6;
        }
        let bus_bytes = bytes as f64 * c.busbw_factor(n as usize);
        alpha + bus_bytes / (self.busbw(c, ranks) * 1e3)
    }
}

pub(crate) fn same_pair(pair: [u32; 2], a: u32, b: u32) -> bool {
    (pair[0] == a && pair[1] == b) || (pair[0] == b && pair[1] == a)
}
