//! Built-in GPU profiles: what a healthy GPU of a known product, on a board of a known GPU
//! count, should measure. Used when the spec sets no explicit threshold for a metric.
//!
//! Every nominal number carries its public source. Floors are a conservative fraction,
//! [`FLOOR_FRACTION`] (50%), of the nominal peak: real copy-engine and NCCL numbers reach
//! 80-90% of nominal on a healthy 8-GPU NVSwitch board (nvbandwidth and nccl-tests on
//! HGX H100 measure about 370-390 GB/s one-way per pair and 450-480 GB/s all_reduce busbw),
//! so a node below half of nominal is broken, not unlucky. Finer degradations are left to
//! the fleet comparison, which knows what this cluster really measures.
//!
//! Bandwidth floors are given only for the board layouts whose topology is known (8 GPUs
//! on NVSwitch, where every pair gets a GPU's full NVLink bandwidth); on other GPU counts
//! the per-GPU expectations (NVLink link count, PCIe generation and width, host bandwidth)
//! still apply.

use gpufabric_api::FabricTestSpec;
use gpufabric_api::keys::LABEL_GPU_PRODUCT;
use gpufabric_api::product::{self, ProductFamily};
use gpufabric_api::result::CompactResult;
use gpufabric_api::suite::Collective;
use gpufabric_api::validate::ValidationError;
use gpufabric_api::validate::memory::{Chosen, GpuMemory, validate_for};

/// Fraction of the nominal peak that a bandwidth floor is set at.
pub const FLOOR_FRACTION: f64 = 0.5;

/// Usable bytes per second of one PCIe x16 link, in GB/s per direction, by generation:
/// transfer rate (GT/s) x 16 lanes x encoding efficiency / 8 bits (PCI-SIG base
/// specifications: Gen3 8 GT/s, Gen4 16 GT/s, Gen5 32 GT/s, 128b/130b encoding).
pub fn pcie_x16_gbps(generation: u32) -> Option<f64> {
    let gts = match generation {
        3 => 8.0,
        4 => 16.0,
        5 => 32.0,
        _ => return None,
    };
    Some(gts * 16.0 * (128.0 / 130.0) / 8.0)
}

/// A known GPU product.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Profile {
    /// The product's family.
    pub family: ProductFamily,
    /// Canonical name, as [`normalize`] writes it.
    pub product: &'static str,
    /// Other normalized spellings of the same product.
    pub aliases: &'static [&'static str],
    /// GPU counts of the boards this product ships on (HGX/DGX baseboards).
    pub board_gpus: &'static [u32],
    /// GPU count of the NVSwitch board whose bandwidth floors this profile gives.
    pub switched_gpus: u32,
    /// NVLink links per GPU.
    pub nvlinks: u32,
    /// NVLink bandwidth per GPU, one direction, GB/s (half the datasheet's bidirectional total).
    pub nvlink_gbps: f64,
    /// PCIe generation of the GPU's host link.
    pub pcie_gen: u32,
    /// PCIe width of the GPU's host link.
    pub pcie_width: u32,
    /// Device memory, bytes, as the driver reports it (`cuDeviceTotalMem`, nvidia-smi's
    /// total: 81559 MiB on H100 80GB HBM3, 143771 MiB on H200 141GB, 81920 MiB on A100
    /// 80GB, 183359 MiB on B200 180GB).
    pub memory_bytes: u64,
    /// Dense bf16 tensor throughput, TFLOP/s (the datasheet's figure without sparsity).
    pub dense_bf16_tflops: f64,
    /// Device memory bandwidth, GB/s (datasheet).
    pub memory_gbps: f64,
}

/// The built-in profiles.
pub const PROFILES: &[Profile] = &[
    // NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): "NVLink: 900GB/s,
    // PCIe Gen5: 128GB/s"; NVIDIA Hopper architecture whitepaper: 18 fourth-generation
    // NVLink links per GPU; HGX H100 ships as 4-GPU and 8-GPU (NVSwitch) baseboards.
    Profile {
        family: ProductFamily::H100,
        product: "H100 80GB HBM3",
        aliases: &["H100 SXM5 80GB", "H100 SXM 80GB"],
        board_gpus: &[4, 8],
        switched_gpus: 8,
        nvlinks: 18,
        nvlink_gbps: 450.0,
        pcie_gen: 5,
        pcie_width: 16,
        memory_bytes: 81_559 << 20,

        // Datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity (989 dense); 3.35TB/s.
        dense_bf16_tflops: 989.0,
        memory_gbps: 3_350.0,
    },
    // NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column): 141GB HBM3e, "NVLink:
    // 900GB/s, PCIe Gen5: 128GB/s"; same 18-link NVLink 4 as H100; HGX H200 4- and 8-GPU.
    Profile {
        family: ProductFamily::H200,
        product: "H200",
        aliases: &["H200 141GB HBM3E", "H200 SXM 141GB"],
        board_gpus: &[4, 8],
        switched_gpus: 8,
        nvlinks: 18,
        nvlink_gbps: 450.0,
        pcie_gen: 5,
        pcie_width: 16,
        memory_bytes: 143_771 << 20,

        // Datasheet: the same 989 dense BF16 TFLOPS as H100 SXM; 4.8TB/s HBM3e.
        dense_bf16_tflops: 989.0,
        memory_gbps: 4_800.0,
    },
    // NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column): "NVLink: 600GB/s,
    // PCIe Gen4: 64GB/s"; NVIDIA Ampere architecture whitepaper: 12 third-generation
    // NVLink links per GPU; HGX A100 4-GPU and 8-GPU (NVSwitch) baseboards.
    Profile {
        family: ProductFamily::A100,
        product: "A100 SXM4 80GB",
        aliases: &["A100 80GB SXM4", "A100 SXM 80GB"],
        board_gpus: &[4, 8],
        switched_gpus: 8,
        nvlinks: 12,
        nvlink_gbps: 300.0,
        pcie_gen: 4,
        pcie_width: 16,
        memory_bytes: 81_920 << 20,

        // Datasheet: BF16 Tensor Core 312 TFLOPS (dense); 2,039GB/s (80GB SXM).
        dense_bf16_tflops: 312.0,
        memory_gbps: 2_039.0,
    },
    // NVIDIA HGX B200 / DGX B200 datasheets: 8 GPUs, fifth-generation NVLink at 1.8TB/s
    // per GPU (18 links of 100 GB/s), host link PCIe Gen5 x16 (the GPU itself can train
    // Gen6 on some hosts; Gen5 is the conservative expectation).
    Profile {
        family: ProductFamily::B200,
        product: "B200",
        aliases: &["B200 180GB HBM3E", "B200 SXM 180GB"],
        board_gpus: &[8],
        switched_gpus: 8,
        nvlinks: 18,
        nvlink_gbps: 900.0,
        pcie_gen: 5,
        pcie_width: 16,
        memory_bytes: 183_359 << 20,

        // DGX B200 datasheet: 72 PFLOPS FP8 training for 8 GPUs, 2.25 PFLOPS dense BF16
        // per GPU; HBM3e 8TB/s per GPU.
        dense_bf16_tflops: 2_250.0,
        memory_gbps: 8_000.0,
    },
];

/// Normalizes a product name so that the label form (`NVIDIA-H100-80GB-HBM3`, as GPU
/// feature discovery writes `nvidia.com/gpu.product`) and NVML's form (`NVIDIA H100 80GB
/// HBM3`) compare equal: [`gpufabric_api::product::normalize`].
pub fn normalize(product: &str) -> String {
    product::normalize(product)
}

/// The profile of a product, by any spelling: one of its [`family`](product::family)
/// whose name or alias the normalized name is (a PCIe H100 is an H100 but no profile's).
pub fn find(product: &str) -> Option<&'static Profile> {
    let family = product::family(product)?;
    let n = normalize(product);
    PROFILES
        .iter()
        .find(|p| p.family == family && (p.product == n || p.aliases.contains(&n.as_str())))
}

/// The GPU a FabricTest's suite must fit: the known product its nodeSelector names
/// ([`LABEL_GPU_PRODUCT`], matched by [`find`]), else the known product with the most
/// memory (a test that names no product, or one this list does not know, may run on any).
pub fn suite_gpu(spec: &FabricTestSpec) -> GpuMemory<'static> {
    let selected = spec
        .node_selector
        .get(LABEL_GPU_PRODUCT)
        .and_then(|label| find(label));
    let (profile, chosen) = match selected {
        Some(p) => (Some(p), Chosen::NodeSelector),
        None => (
            PROFILES.iter().max_by_key(|p| p.memory_bytes),
            Chosen::LargestKnown,
        ),
    };
    GpuMemory {
        product: profile.map_or("known", |p| p.product),
        bytes: profile.map_or(u64::MAX, |p| p.memory_bytes),
        chosen,
    }
}

/// Every rule of [`gpufabric_api::validate()`], and that the GPU the test selects
/// ([`suite_gpu`]) holds its suite: what the admission webhook and the operator check.
pub fn validate(spec: &FabricTestSpec) -> Result<(), ValidationError> {
    validate_for(spec, &suite_gpu(spec))
}

/// A node's GPU links as the agent measured them through NVML: the base of its bandwidth
/// floors, whatever the GPU count (a 2-, 4- or 8-GPU slice of a switched board alike).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Topology {
    /// NVLink links each GPU should have up (the fewest any GPU expects); 0 without NVLink.
    pub nvlinks: u32,
    /// One-direction bandwidth of one NVLink link, GB/s; 0 when unknown.
    pub link_gbps: f64,
    /// Whether the links go to NVSwitches (every pair gets a GPU's full NVLink bandwidth)
    /// or straight to other GPUs (a pair gets only the links between the two); `None` when
    /// NVML could not say for every GPU.
    pub switched: Option<bool>,
    /// PCIe generation and width the host links can train to (the lowest of any GPU).
    pub pcie: Option<(u32, u32)>,
}

impl Topology {
    /// The topology a compact result reports, if it carries NVML health for its GPUs.
    pub fn of(r: &CompactResult) -> Option<Topology> {
        let h: Vec<_> = r.health.iter().take(r.gpus as usize).collect();
        if h.is_empty() {
            return None;
        }
        let nvlinks = h.iter().map(|x| x.nvlinks.1).min().unwrap_or(0);
        let speeds: Vec<f64> = h
            .iter()
            .map(|x| x.nvlink_link_gbps)
            .filter(|v| *v > 0.0)
            .collect();
        let link_gbps = if speeds.len() == h.len() {
            speeds.iter().copied().fold(f64::INFINITY, f64::min)
        } else {
            0.0
        };
        let switched = h
            .iter()
            .map(|x| x.nvlink_switch)
            .reduce(|a, b| if a == b { a } else { None })
            .flatten();
        let pcie = h
            .iter()
            .map(|x| (x.pcie.1, x.pcie.3))
            .filter(|(g, w)| *g > 0 && *w > 0)
            .reduce(|a, b| (a.0.min(b.0), a.1.min(b.1)));
        Some(Topology {
            nvlinks,
            link_gbps,
            switched,
            pcie,
        })
    }
}

/// Usable GB/s per direction of a PCIe link of `generation` and `width` lanes.
pub fn pcie_gbps(generation: u32, width: u32) -> Option<f64> {
    pcie_x16_gbps(generation)
        .filter(|_| width > 0)
        .map(|g| g * f64::from(width.min(16)) / 16.0)
}

/// What each collective's peak bus bandwidth reaches of the median one-way GPU-pair copy
/// on a healthy NVSwitch node: the lowest of five clean default checks on 4 x H100
/// (bench/results/compute-h100x4-2026-11-27.md; each collective moved 2% at most between
/// them), where 4 x H200's all_reduce (355 of 394 GB/s) agrees. Bus bandwidth is defined to
/// be comparable across rank counts; nccl-tests on 8-GPU HGX H100 without NVLS (all_reduce
/// 360-370 against 380-390 per pair) gives the same proportion.
pub const HEALTHY_COLLECTIVE_TO_COPY: &[(Collective, f64)] = &[
    (Collective::AllReduce, 0.894),
    (Collective::AllGather, 0.815),
    (Collective::ReduceScatter, 0.820),
    (Collective::Broadcast, 0.911),
    (Collective::Reduce, 0.922),
    (Collective::AllToAll, 0.847),
    (Collective::SendRecv, 0.910),
];

/// A collective below this share of what healthy nodes reach of their own pair copies
/// fails: one a quarter below fails, the spread of clean checks (2%) stays far from it.
pub const COLLECTIVE_TO_COPY_MARGIN: f64 = 0.8;

/// The sweep's largest size [`HEALTHY_COLLECTIVE_TO_COPY`] was measured at: the default
/// suite's 1 GiB, 5 warm-up and 20 timed iterations a size.
pub const PROFILE_BYTES: u64 = 1 << 30;

/// How much of its bus bandwidth at [`PROFILE_BYTES`] a healthy node's collective reaches
/// when the sweep ends at a smaller size: the expectation at each size, not only at 1 GiB.
/// `points` are (largest size in bytes, share), by size, each share the lowest a healthy node
/// read there; a sweep that ends between two points is held to the lower one, and one that
/// ends below the first is not judged by it. The built-in profiles are [`size_profile`]; a
/// fleet's own record can lend its points the same way.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SizeProfile<'a> {
    pub points: &'a [(u64, f64)],
}

impl SizeProfile<'_> {
    /// The share a healthy node reaches in a sweep whose largest size is `largest`; `None`
    /// below the profile's smallest size.
    pub fn share_at(&self, largest: u64) -> Option<f64> {
        self.points
            .iter()
            .take_while(|(bytes, _)| *bytes <= largest)
            .last()
            .map(|(_, share)| *share)
    }

    /// The smallest size the profile knows.
    pub fn smallest(&self) -> Option<u64> {
        self.points.first().map(|(bytes, _)| *bytes)
    }
}

/// The share of its bus bandwidth at 1 GiB that each collective reaches, on healthy 4-GPU
/// NVSwitch nodes, when the sweep ends at 64 MiB to 1 GiB: the lowest of 3 default checks on
/// 4 x H200 and 4 on 4 x H100 (every size, factor 2: `h200x4-2026-11-21-final/full.json`,
/// `h200x4-2026-11-26-states/gpu-use-during/clean-default-*.json`,
/// `restricted-h100x4-2026-11-27/*.json`) and 26 more sweeps of factor 8 at 128 MiB
/// (`h200x4-2026-11-26-compare`, `-graph-threads`, `-states`, `h100x4-2026-11-26/graph-sweep`).
/// At 64 MiB also the quick checks (2 warm-up, 5 timed iterations): two on 4 x H100
/// (`h100x4-2026-11-26/gpu-use`, taken against 0.894-0.911 of their pair copies) and three on
/// 4 x H200 that read broadcast 257, alltoall 254 and sendrecv 152 GB/s against pair copies of
/// 393 GB/s. Each share is at most the next size's, so a longer sweep is never held lower.
/// sendrecv reaches less than half its 1 GiB busbw below 256 MiB (NCCL changes protocol there).
const SIZE_SHARES: &[(Collective, [(u64, f64); 5])] = &[
    (Collective::AllReduce, shares([0.866, 0.903, 0.951, 0.974])),
    (Collective::AllGather, shares([0.787, 0.867, 0.922, 0.966])),
    (
        Collective::ReduceScatter,
        shares([0.768, 0.871, 0.915, 0.957]),
    ),
    (Collective::Broadcast, shares([0.718, 0.898, 0.959, 0.984])),
    (Collective::Reduce, shares([0.814, 0.919, 0.960, 0.983])),
    (Collective::AllToAll, shares([0.750, 0.771, 0.842, 0.888])),
    (Collective::SendRecv, shares([0.425, 0.447, 0.823, 0.980])),
];

/// The points of a [`SIZE_SHARES`] row: its shares at 64, 128, 256 and 512 MiB, and all of it
/// at [`PROFILE_BYTES`].
const fn shares(s: [f64; 4]) -> [(u64, f64); 5] {
    [
        (64 << 20, s[0]),
        (128 << 20, s[1]),
        (256 << 20, s[2]),
        (512 << 20, s[3]),
        (PROFILE_BYTES, 1.0),
    ]
}

/// The built-in size profile of `collective`.
pub fn size_profile(collective: Collective) -> Option<SizeProfile<'static>> {
    SIZE_SHARES
        .iter()
        .find(|(c, _)| *c == collective)
        .map(|(_, points)| SizeProfile { points })
}

/// The least share of the median pair copy `collective`'s peak bus bandwidth must reach on
/// a node whose GPUs every pair reaches alike, in a sweep whose largest size is `largest`
/// (`None`: an agent that did not say, judged as the default suite), if it is known:
/// [`HEALTHY_COLLECTIVE_TO_COPY`] at that size ([`size_profile`]), times
/// [`COLLECTIVE_TO_COPY_MARGIN`]. `None` also for a sweep that ends below the profile.
pub fn collective_to_copy_floor(collective: Collective, largest: Option<u64>) -> Option<f64> {
    let full = HEALTHY_COLLECTIVE_TO_COPY
        .iter()
        .find(|(c, _)| *c == collective)
        .map(|(_, r)| *r)?;
    let at_size = match largest {
        Some(bytes) => size_profile(collective)?.share_at(bytes)?,
        None => 1.0,
    };
    Some(full * at_size * COLLECTIVE_TO_COPY_MARGIN)
}

/// What a node should measure: floors from its measured topology, else from its product's
/// board layout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Expectations {
    /// The known product, if any.
    pub profile: Option<&'static Profile>,
    /// The links the node reported, if it reported health.
    pub topology: Option<Topology>,
    pub gpus: u32,
    /// Floor on one-way copy bandwidth of every GPU pair (GB/s); NVSwitch boards only.
    pub pair_floor_gbps: Option<f64>,
    /// Floor on bidirectional copy bandwidth of every GPU pair (GB/s); NVSwitch boards only.
    pub pair_bidir_floor_gbps: Option<f64>,
    /// Floor on peak all_reduce bus bandwidth (GB/s); NVSwitch boards only.
    pub all_reduce_floor_gbps: Option<f64>,
    /// Floor on host-to-device and device-to-host copy bandwidth per GPU (GB/s).
    pub host_floor_gbps: Option<f64>,
    /// Whether the GPUs are on NVSwitches, so every pair should measure alike and every
    /// collective should reach [`collective_to_copy_floor`] of the pairs' copy bandwidth.
    pub switched: bool,
    /// Whether every GPU pair should measure alike (NVSwitch, or a board of the product).
    pub uniform_pairs: bool,
    /// Floor on each GPU's bf16 GEMM throughput (TFLOP/s), from the product's dense peak.
    pub gemm_floor_tflops: Option<f64>,
    /// Floor on each GPU's device memory copy bandwidth (GB/s, read and write counted),
    /// from the product's memory bandwidth.
    pub memory_floor_gbps: Option<f64>,
}

impl Profile {
    /// The expectations for a node with `gpus` GPUs of this product and no measured
    /// topology: bandwidth floors only on the product's NVSwitch board.
    pub fn expectations(&'static self, gpus: u32) -> Expectations {
        derive(Some(self), None, gpus)
    }

    /// Whether `gpus` is a GPU count this product ships with on one board.
    pub fn is_board_count(&self, gpus: u32) -> bool {
        self.board_gpus.contains(&gpus)
    }
}

/// The floors of a node: a switched topology gives pair and all_reduce floors from its
/// links (links per GPU x link speed, the speed from the product where NVML gave none);
/// links straight between GPUs give none (each pair has its own share); with no topology
/// the product's NVSwitch board does. Host floors follow the PCIe link the GPUs can train
/// to, else the product's.
fn derive(
    profile: Option<&'static Profile>,
    topology: Option<Topology>,
    gpus: u32,
) -> Expectations {
    let switched_topology = topology.and_then(|t| t.switched);
    let nominal_pair = match switched_topology {
        Some(true) => topology.and_then(|t| {
            let speed = if t.link_gbps > 0.0 {
                Some(t.link_gbps)
            } else {
                profile
                    .filter(|p| p.nvlinks > 0)
                    .map(|p| p.nvlink_gbps / f64::from(p.nvlinks))
            };
            speed.map(|s| s * f64::from(t.nvlinks)).filter(|v| *v > 0.0)
        }),
        Some(false) => None,
        None => profile
            .filter(|p| gpus == p.switched_gpus)
            .map(|p| p.nvlink_gbps),
    };
    let switched = nominal_pair.is_some() && gpus >= 2;
    let nominal_pair = nominal_pair.filter(|_| gpus >= 2);
    let host = topology
        .and_then(|t| t.pcie)
        .and_then(|(g, w)| pcie_gbps(g, w))
        .or_else(|| profile.and_then(|p| pcie_gbps(p.pcie_gen, p.pcie_width)));
    Expectations {
        profile,
        topology,
        gpus,
        pair_floor_gbps: nominal_pair.map(|v| v * FLOOR_FRACTION),
        pair_bidir_floor_gbps: nominal_pair.map(|v| 2.0 * v * FLOOR_FRACTION),
        // all_reduce busbw on an NVSwitch board is bounded by a GPU's one-way NVLink
        // bandwidth (nccl-tests' PERFORMANCE.md: busbw reflects the slowest link).
        all_reduce_floor_gbps: nominal_pair.map(|v| v * FLOOR_FRACTION),
        host_floor_gbps: host.map(|g| g * FLOOR_FRACTION),
        switched,
        uniform_pairs: switched || profile.is_some_and(|p| p.is_board_count(gpus)),
        // A healthy GPU's square GEMMs of 8192 reach about 70% of the dense peak and its
        // device copies about 80% of the memory bandwidth: half of either is broken.
        gemm_floor_tflops: profile.map(|p| p.dense_bf16_tflops * FLOOR_FRACTION),
        memory_floor_gbps: profile.map(|p| p.memory_gbps * FLOOR_FRACTION),
    }
}

/// The expectations for a product and GPU count, if the product is known.
pub fn expectations(product: &str, gpus: u32) -> Option<Expectations> {
    find(product).map(|p| p.expectations(gpus))
}

/// The expectations of a measured node: from the topology it reported where it reported
/// one, else from its product; `None` when neither is known.
pub fn expectations_of(product: &str, r: &CompactResult) -> Option<Expectations> {
    let profile = find(product);
    let topology = Topology::of(r);
    if profile.is_none() && topology.is_none() {
        return None;
    }
    Some(derive(profile, topology, r.gpus))
}

#[cfg(test)]
mod tests;
