//! What a run measures: the NCCL sweep, GPU-pair copies, node pairs, the DDP probe and the
//! NVML health snapshot, with the defaults that make an empty `suite` complete.

use crate::phase::Phase;
use serde::{Deserialize, Serialize};

mod compute;
pub use compute::{Compute, Gemm, MemoryBandwidth, Sdc};

/// The benchmarks a run executes. Every part has defaults, so `suite: {}` (or no suite)
/// runs the default node check.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Suite {
    /// NCCL collective sweep over all GPUs of a node.
    pub nccl_sweep: NcclSweep,
    /// Copy-engine bandwidth between every GPU pair of a node, and host<->device per GPU.
    pub gpu_pairs: GpuPairs,
    /// Bandwidth between pairs of nodes (one GPU pair each way through the network).
    pub node_pairs: NodePairs,
    /// A synthetic data-parallel training step, weak-scaled over GPU counts.
    pub ddp_probe: DdpProbe,
    /// The same step weak-scaled over whole nodes (1, 2, 4, ... nodes, all GPUs each).
    pub ddp_nodes: DdpNodes,
    /// NCCL collectives over 2, 4, 8, ... whole nodes (all GPUs each): the fabric's busbw
    /// curve over node counts.
    pub nccl_nodes: NcclNodes,
    /// NVML health snapshot: NVLink, PCIe, XID, ECC, remapped rows, throttling.
    pub health: HealthCheck,
    /// What each GPU computes: dense GEMM throughput, device memory bandwidth, and one
    /// deterministic GEMM checked for silent data corruption.
    pub compute: Compute,
}

/// NCCL collectives, named as in the NCCL API.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    /// All-to-all through grouped send/recv, as nccl-tests' `alltoall`.
    AllToAll,
    /// Ring of send/recv pairs, as nccl-tests' `sendrecv`.
    SendRecv,
}

impl Collective {
    /// Every collective, in the order the sweep runs them.
    pub const ALL: [Collective; 7] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
        Collective::SendRecv,
    ];

    /// The name nccl-tests gives the collective (`all_reduce`, `alltoall`, ...).
    pub fn nccl_tests_name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "alltoall",
            Collective::SendRecv => "sendrecv",
        }
    }

    /// The API name (`allReduce`, ...).
    pub fn api_name(self) -> &'static str {
        match self {
            Collective::AllReduce => "allReduce",
            Collective::AllGather => "allGather",
            Collective::ReduceScatter => "reduceScatter",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllToAll => "allToAll",
            Collective::SendRecv => "sendRecv",
        }
    }

    /// nccl-tests' bus-bandwidth factor for `n` ranks (doc/PERFORMANCE.md): busbw = algbw * factor.
    pub fn busbw_factor(self, n: usize) -> f64 {
        let n = n.max(1) as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
                (n - 1.0) / n
            }
            Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1.0,
        }
    }
}

impl std::fmt::Display for Collective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.api_name())
    }
}

/// Element type of the NCCL sweep buffers.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum DataType {
    Int8,
    Uint8,
    Int32,
    Uint32,
    Int64,
    Uint64,
    Float16,
    #[default]
    Float32,
    Float64,
    Bfloat16,
}

impl DataType {
    /// Size of one element in bytes.
    pub fn size(self) -> u64 {
        match self {
            DataType::Int8 | DataType::Uint8 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// The name nccl-tests prints in its `type` column.
    pub fn nccl_tests_name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "bfloat16",
        }
    }
}

/// NCCL collective sweep over all GPUs of a node, as nccl-tests runs it.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
#[schemars(extend("x-kubernetes-validations" = [{"rule": "self.minBytes <= self.maxBytes", "message": "ncclSweep.minBytes must not be larger than ncclSweep.maxBytes"}]))]
pub struct NcclSweep {
    /// Run the sweep.
    pub enabled: bool,
    /// Collectives to sweep (default: all seven).
    #[schemars(length(min = 1))]
    pub collectives: Vec<Collective>,
    /// Smallest message size in bytes.
    #[schemars(range(min = 1))]
    pub min_bytes: u64,
    /// Largest message size in bytes.
    #[schemars(range(min = 1))]
    pub max_bytes: u64,
    /// Each size is the previous one times this factor (at least 2).
    #[schemars(range(min = 2))]
    pub step_factor: u32,
    /// Untimed iterations before each size.
    pub warmup_iters: u32,
    /// Timed iterations per size.
    #[schemars(range(min = 1))]
    pub iters: u32,
    /// Element type.
    pub data_type: DataType,
    /// Time each size as launches of a CUDA graph of its `iters` iterations, this many
    /// (nccl-tests' `-G`); 0 launches every iteration from the host, as nccl-tests does by
    /// default. Small sizes then time the GPUs and links rather than the launching CPU,
    /// whose speed moved them by up to 1.5x between runs on shared 4 x H200 hosts. Each GPU's
    /// graphs are launched from a thread of its own, as NCCL recommends where one process
    /// drives several GPUs (one thread launching them all can deadlock).
    #[schemars(range(max = 1000))]
    pub graph_launches: u32,
}

impl Default for NcclSweep {
    fn default() -> Self {
        NcclSweep {
            enabled: true,
            collectives: Collective::ALL.to_vec(),
            min_bytes: 8,
            max_bytes: 1 << 30,
            step_factor: 2,
            warmup_iters: 5,
            iters: 20,
            data_type: DataType::Float32,
            graph_launches: 0,
        }
    }
}

impl NcclSweep {
    /// Device buffers the sweep holds on every GPU at once: send, receive, and the inputs it
    /// reloads them from before each checked size.
    pub const DEVICE_BUFFERS: u64 = 3;

    /// Bytes of each of the sweep's buffers on a node of `gpus` GPUs whose largest size is
    /// `largest`: that size, or one element per rank where it is smaller, plus one element
    /// per rank. nccl-tests' size is the whole collective's (all_gather's output, alltoall's
    /// send buffer), never a peer's share, so no collective needs more and the GPU count does
    /// not multiply it.
    pub fn buffer_bytes(&self, largest: u64, gpus: u32) -> u64 {
        let per_rank = u64::from(gpus.max(1)).saturating_mul(self.data_type.size());
        largest.max(per_rank).saturating_add(per_rank)
    }

    /// Message sizes of the sweep: min, min*f, ... up to max (max included when it is a step).
    /// nccl-tests rounds each size down to a whole number of elements; so does this.
    pub fn sizes(&self) -> Vec<u64> {
        let elem = self.data_type.size();
        let factor = u64::from(self.step_factor.max(2));
        let mut sizes = Vec::new();
        let mut size = self.min_bytes.max(1);
        while size <= self.max_bytes {
            let rounded = (size / elem).max(1) * elem;
            if sizes.last() != Some(&rounded) {
                sizes.push(rounded);
            }
            match size.checked_mul(factor) {
                Some(next) => size = next,
                None => break,
            }
        }
        sizes
    }
}

/// GPU memory one part of a suite holds on every GPU at once, and the field that sets it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryNeed {
    /// The phase that holds it.
    pub phase: Phase,
    /// The field (a JSON path under `spec`) whose size sets it.
    pub field: &'static str,
    /// Bytes on each GPU.
    pub bytes: u64,
    /// How the bytes follow from the field, said to the user.
    pub rule: String,
}

/// The field whose size sets the GPU memory `phase` holds, where one does.
pub fn memory_field(phase: Phase) -> Option<&'static str> {
    match phase {
        Phase::NcclSweep => Some("suite.ncclSweep.maxBytes"),
        Phase::GpuPairs => Some("suite.gpuPairs.bytes"),
        Phase::DdpProbe => Some("suite.ddpProbe"),
        Phase::NodePair => Some("suite.nodePairs.bytes"),
        Phase::Compute => Some("suite.compute"),
        Phase::Setup | Phase::Health => None,
    }
}

impl Suite {
    /// A short, stable fingerprint of what the node check measures: the JSON of the suite's
    /// parts whose numbers a trend keeps (the sweep, the GPU pairs and host copies, the DDP
    /// probe), FNV-1a hashed. The node-pair, multi-node and compute settings leave it alone.
    pub fn fingerprint(&self) -> String {
        let parts = (&self.nccl_sweep, &self.gpu_pairs, &self.ddp_probe);
        let text = serde_json::to_string(&parts).unwrap_or_default();
        format!("{:016x}", crate::fnv1a(text.as_bytes()))
    }

    /// The GPU memory each enabled part of the suite holds on every GPU of a node of `gpus`
    /// GPUs, the NCCL sweep over `sweep_sizes` (its `sizes()`, fewer in a quick check). The
    /// agent's buffers, as the cuda backend allocates them; the CUDA context, NCCL's and
    /// cuBLAS's own memory come on top.
    pub fn memory_needs(&self, gpus: u32, sweep_sizes: &[u64]) -> Vec<MemoryNeed> {
        let field = |phase| memory_field(phase).unwrap_or("suite");
        let mut needs = Vec::new();
        let nccl = &self.nccl_sweep;
        if nccl.enabled
            && let Some(&largest) = sweep_sizes.iter().max()
        {
            needs.push(MemoryNeed {
                phase: Phase::NcclSweep,
                field: field(Phase::NcclSweep),
                bytes: NcclSweep::DEVICE_BUFFERS
                    .saturating_mul(nccl.buffer_bytes(largest, gpus)),
                rule: format!(
                    "3 x {}, the largest size the sweep runs (minBytes x stepFactor^k up to maxBytes), plus an element per GPU: the sweep's send, receive and input buffers; a size is the whole collective's, so the GPU count does not multiply it",
                    bytes_text(largest)
                ),
            });
        }
        if self.gpu_pairs.enabled {
            needs.push(MemoryNeed {
                phase: Phase::GpuPairs,
                field: field(Phase::GpuPairs),
                bytes: self.gpu_pairs.bytes.saturating_mul(2),
                rule: "2 x bytes: a source and a destination buffer".into(),
            });
        }
        if self.ddp_probe.enabled {
            needs.push(MemoryNeed {
                phase: Phase::DdpProbe,
                field: field(Phase::DdpProbe),
                bytes: self.ddp_probe.replica_bytes(),
                rule: "bf16 weights, fp32 gradients and two fp32 scratch layers of hidden x hidden per layer, and bf16 activations of batchPerGpu x hidden per layer".into(),
            });
        }
        if let Some(bytes) = self.compute.device_bytes() {
            needs.push(MemoryNeed {
                phase: Phase::Compute,
                field: field(Phase::Compute),
                bytes,
                rule: "the largest of its checks, one at a time: gemm 3 x size^2 fp32 matrices, memory 2 x bytes, sdc 2 x size^2 bf16 inputs and a size^2 fp32 output".into(),
            });
        }
        if self.node_pairs.enabled {
            needs.push(MemoryNeed {
                phase: Phase::NodePair,
                field: field(Phase::NodePair),
                bytes: self.node_pairs.bytes.saturating_mul(2),
                rule: "2 x bytes: a send and a receive buffer".into(),
            });
        }
        needs
    }
}

/// Copy-engine bandwidth between GPU pairs of one node.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct GpuPairs {
    /// Run the pair matrix.
    pub enabled: bool,
    /// Bytes per copy.
    #[schemars(range(min = 1))]
    pub bytes: u64,
    /// Also measure both directions at once for each pair.
    pub bidirectional: bool,
    /// Also measure host-to-device and device-to-host per GPU (pinned host memory).
    pub host_copies: bool,
}

impl Default for GpuPairs {
    fn default() -> Self {
        GpuPairs {
            enabled: true,
            bytes: 256 << 20,
            bidirectional: true,
            host_copies: true,
        }
    }
}

/// How nodes are paired for node-pair tests.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum Pairing {
    /// Node i with node i+1 (one round each way).
    #[default]
    Ring,
    /// A random perfect matching per round.
    Random,
    /// Every pair of nodes (n*(n-1)/2 tests; small fleets only).
    All,
}

/// Network bandwidth between pairs of nodes.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
#[schemars(extend("x-kubernetes-validations" = [{"rule": "!has(self.partners) || self.partners == 2 || !has(self.pairing) || self.pairing != 'all'", "message": "nodePairs.partners 1 is for pairing ring or random: pairing all meets every partner"}]))]
pub struct NodePairs {
    /// Run node-pair tests.
    pub enabled: bool,
    /// How to pair nodes.
    pub pairing: Pairing,
    /// Message size in bytes.
    #[schemars(range(min = 1))]
    pub bytes: u64,
    /// Node label that groups nodes (a rack, `topology.kubernetes.io/zone`): pairs within
    /// a group first, then pairs across groups as a separate, reported set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology_key: Option<String>,
    /// Also measure all_to_all (all_reduce and sendrecv always).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub all_to_all: bool,
    /// Partners each node meets in the planned rounds: 2 (the default; a node slow with
    /// both is named at once) or 1 (one pair test a node a night, half the node-pair
    /// phase's time away from work; a slow pair's two nodes are both retested against
    /// known-good partners before anything acts, and a ring meets a new partner each
    /// night). `all` pairing meets every partner and takes only 2.
    #[schemars(range(min = 1, max = 2))]
    #[serde(skip_serializing_if = "is_two")]
    pub partners: u32,
}

fn is_two(n: &u32) -> bool {
    *n == 2
}

impl Default for NodePairs {
    fn default() -> Self {
        NodePairs {
            enabled: false,
            pairing: Pairing::Ring,
            bytes: 1 << 30,
            topology_key: None,
            all_to_all: false,
            partners: 2,
        }
    }
}

/// The multi-node DDP probe: `ddpProbe`'s step (its shape, buckets and step counts) over
/// 1, 2, 4, ... whole nodes, after the node checks and node pairs, on nodes that passed
/// them. It reports step time, scaling efficiency and exposed communication per node count,
/// and names straggler nodes (Info: a node's own check judges its GPUs).
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct DdpNodes {
    /// Run the multi-node probe.
    pub enabled: bool,
    /// Most nodes in the probe; the run picks them among the nodes that passed (a different
    /// set each run, named in status).
    #[schemars(range(min = 2, max = 16))]
    pub max_nodes: u32,
}

impl Default for DdpNodes {
    fn default() -> Self {
        DdpNodes {
            enabled: false,
            max_nodes: 4,
        }
    }
}

/// The multi-node NCCL sweep: all_reduce, all_gather, reduce_scatter and alltoall over 2, 4,
/// 8, ... whole nodes and all of them (one process per node driving all its GPUs), each at
/// every size from `minBytes` to `maxBytes`, after the node checks, the node pairs and the
/// multi-node DDP probe, on nodes that passed them. It reports, per node count and
/// collective, the busbw of the large sizes and the time of the smallest, and where the curve
/// has a knee (a condition on the run: each node's own checks judge the node).
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
#[schemars(extend("x-kubernetes-validations" = [{"rule": "self.minBytes <= self.maxBytes", "message": "ncclNodes.minBytes must not be larger than ncclNodes.maxBytes"}]))]
pub struct NcclNodes {
    /// Run the multi-node sweep.
    pub enabled: bool,
    /// Most nodes in the sweep; the run picks them among the nodes that passed (a different
    /// set each run, named in status).
    #[schemars(range(min = 2, max = 1024))]
    pub max_nodes: u32,
    /// Collectives to run: allReduce, allGather, reduceScatter, allToAll (default: all four).
    #[schemars(length(min = 1))]
    pub collectives: Vec<Collective>,
    /// Smallest size in bytes (nccl-tests' `-b`).
    #[schemars(range(min = 1))]
    pub min_bytes: u64,
    /// Largest size in bytes (nccl-tests' `-e`).
    #[schemars(range(min = 1))]
    pub max_bytes: u64,
    /// Each size is the previous one times this factor (at least 2).
    #[schemars(range(min = 2))]
    pub step_factor: u32,
    /// Sizes from this one up are the large ones whose busbw each node count reports.
    #[schemars(range(min = 1))]
    pub large_bytes: u64,
    /// Untimed iterations of each collective at each size.
    pub warmup_iters: u32,
    /// Timed iterations of each collective at each size.
    #[schemars(range(min = 1))]
    pub iters: u32,
    /// Node label that splits the nodes into topology blocks (`nvidia.com/gpu.clique` for an
    /// NVLink domain, a rack or leaf label): the sweep then runs inside each block (at most
    /// `maxNodes` of it), one block after the other, and last across blocks over one
    /// representative node of each (at most `maxNodes`). A block whose curve falls below the
    /// other blocks' is named in the status (a Warning on the block: its nodes are judged by
    /// their own checks and pairs). Nodes without the label take no part.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology_key: Option<String>,
}

impl NcclNodes {
    /// The collectives the multi-node sweep can run.
    pub const COLLECTIVES: [Collective; 4] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
    ];
}

impl Default for NcclNodes {
    fn default() -> Self {
        NcclNodes {
            enabled: false,
            max_nodes: 16,
            collectives: NcclNodes::COLLECTIVES.to_vec(),
            min_bytes: 1 << 10,
            max_bytes: 256 << 20,
            step_factor: 2,
            large_bytes: 64 << 20,
            warmup_iters: 5,
            iters: 20,
            topology_key: None,
        }
    }
}

/// A synthetic data-parallel training step (MLP, bf16 GEMMs, bucketed gradient all-reduce
/// overlapped with backward), weak-scaled over GPU counts. Its stragglers and scaling are
/// judged only when the GPUs compute at least 1 ms a step (the default: about 22 ms on H200);
/// a smaller probe times kernel launches, and an Info finding says so.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
#[schemars(extend("x-kubernetes-validations" = [{"rule": "self.firstBucketBytes <= self.bucketBytes", "message": "ddpProbe.firstBucketBytes must not be larger than ddpProbe.bucketBytes"}]))]
pub struct DdpProbe {
    /// Run the probe.
    pub enabled: bool,
    /// Width of each square Linear layer.
    #[schemars(range(min = 1, max = 65536))]
    pub hidden: u32,
    /// Number of Linear layers.
    #[schemars(range(min = 1, max = 256))]
    pub layers: u32,
    /// Samples per GPU per step (weak scaling keeps this fixed).
    #[schemars(range(min = 1))]
    pub batch_per_gpu: u32,
    /// GPU counts to scale over; absent means 1, 2, 4, ... up to all GPUs of the node.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1), inner(range(min = 1)))]
    pub gpu_counts: Option<Vec<u32>>,
    /// Size of the first gradient bucket (PyTorch DDP: 1 MiB).
    #[schemars(range(min = 1))]
    pub first_bucket_bytes: u64,
    /// Size of the other gradient buckets (PyTorch DDP: 25 MiB).
    #[schemars(range(min = 1))]
    pub bucket_bytes: u64,
    /// Untimed steps before measuring.
    pub warmup_steps: u32,
    /// Timed steps.
    #[schemars(range(min = 1))]
    pub steps: u32,
}

impl Default for DdpProbe {
    fn default() -> Self {
        DdpProbe {
            enabled: true,
            hidden: 8192,
            layers: 8,
            batch_per_gpu: 4096,
            gpu_counts: None,
            first_bucket_bytes: 1 << 20,
            bucket_bytes: 25 << 20,
            warmup_steps: 3,
            steps: 10,
        }
    }
}

impl DdpProbe {
    /// Device bytes one replica of the probe holds (the cuda backend's `Replica`): bf16
    /// weights of every layer, bf16 activations of every layer and the input, two bf16
    /// output-gradient buffers, fp32 gradients of every weight and bias, and two fp32
    /// scratch buffers of one weight each.
    pub fn replica_bytes(&self) -> u64 {
        let h = u64::from(self.hidden);
        let l = u64::from(self.layers);
        let b = u64::from(self.batch_per_gpu);
        let square = h.saturating_mul(h);
        let act = b.saturating_mul(h).saturating_mul(2);
        let weights = square.saturating_mul(2).saturating_mul(l);
        let acts = act.saturating_mul(l + 1);
        let dy = act.saturating_mul(2);
        let grads = l.saturating_mul(h.saturating_mul(4).saturating_add(square.saturating_mul(4)));
        let scratch = square.saturating_mul(8);
        weights
            .saturating_add(acts)
            .saturating_add(dy)
            .saturating_add(grads)
            .saturating_add(scratch)
    }

    /// The GPU counts to measure on a node with `gpus` GPUs: the configured ones that fit,
    /// or 1, 2, 4, ... and always `gpus` itself.
    pub fn counts_for(&self, gpus: u32) -> Vec<u32> {
        let mut counts: Vec<u32> = match &self.gpu_counts {
            Some(list) => list
                .iter()
                .copied()
                .filter(|&c| c >= 1 && c <= gpus)
                .collect(),
            None => {
                let mut v = Vec::new();
                let mut c = 1;
                while c < gpus {
                    v.push(c);
                    c *= 2;
                }
                if gpus >= 1 {
                    v.push(gpus);
                }
                v
            }
        };
        counts.sort_unstable();
        counts.dedup();
        counts
    }
}

/// NVML health snapshot.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct HealthCheck {
    /// Take the snapshot.
    pub enabled: bool,
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck { enabled: true }
    }
}

/// A byte count as a person reads it: "512 MiB", "79.6 GiB", "3.0 TiB".
pub fn bytes_text(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if b >= KIB.powi(4) {
        format!("{:.1} TiB", b / KIB.powi(4))
    } else if b >= KIB.powi(3) {
        format!("{:.1} GiB", b / KIB.powi(3))
    } else {
        format!("{:.0} MiB", b / KIB.powi(2))
    }
}
