//! The simulated fleet description: nodes, their GPUs and product, and the faults injected
//! into them. The process-kubelet registers these nodes; the agent's sim backend reads the
//! same file and produces faulty results on exactly the nodes (GPUs, GPU pairs) named here.

#![forbid(unsafe_code)]

use gpufabric_api::result::{Phase, Transport};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A simulated fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fleet {
    /// Seed of the measurement noise; the same seed gives the same documents.
    #[serde(default)]
    pub seed: u64,
    pub nodes: Vec<FleetNode>,
}

/// One simulated node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FleetNode {
    pub name: String,
    /// GPU product as the `nvidia.com/gpu.product` label writes it, e.g. `NVIDIA-H100-80GB-HBM3`.
    pub product: String,
    /// The GPUs the agent sees. 0 is a node whose GPUs are all hidden from the pod: its
    /// node check ends "no GPU found" (exit 10), as the CUDA backend's does.
    pub gpus: u32,
    /// Extra node labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<Fault>,
    /// The software the node reports where it differs from the sim's usual
    /// ([`SimSoftware::reported`]): how a test makes one node's driver drift.
    #[serde(default, skip_serializing_if = "SimSoftware::is_usual")]
    pub software: SimSoftware,
}

/// A simulated node's software, each field the sim's usual value where not set.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimSoftware {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<String>,
    /// The digest of NCCL's config files, as the agent reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_conf: Option<String>,
    /// Every GPU's VBIOS version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vbios: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_manager: Option<String>,
}

impl SimSoftware {
    /// The driver every simulated node reports unless its fleet entry says otherwise.
    pub const USUAL_DRIVER: &'static str = "550.90.07";
    const USUAL_CUDA: &'static str = "12.4";
    const USUAL_NCCL: &'static str = "2.21.5";
    const USUAL_VBIOS: &'static str = "96.00.74.00.01";
    const USUAL_FABRIC_MANAGER: &'static str = "completed";

    /// Whether the node reports only the usual values.
    pub fn is_usual(&self) -> bool {
        *self == SimSoftware::default()
    }

    /// The versions the node's agent reports for `gpus` GPUs: its own where set, else the
    /// usual ones (no NCCL config file).
    pub fn reported(&self, gpus: u32) -> gpufabric_api::result::Versions {
        let pick = |own: &Option<String>, usual: &str| {
            Some(own.clone().unwrap_or_else(|| usual.to_string()))
        };
        let vbios = self.vbios.as_deref().unwrap_or(Self::USUAL_VBIOS);
        gpufabric_api::result::Versions {
            agent: env!("CARGO_PKG_VERSION").to_string(),
            driver: pick(&self.driver, Self::USUAL_DRIVER),
            cuda: pick(&self.cuda, Self::USUAL_CUDA),
            nccl: pick(&self.nccl, Self::USUAL_NCCL),
            nccl_conf: pick(&self.nccl_conf, gpufabric_api::result::NO_CONF_FILE),
            vbios: (0..gpus).map(|_| vbios.to_string()).collect(),
            fabric_manager: pick(&self.fabric_manager, Self::USUAL_FABRIC_MANAGER),
        }
    }
}

/// A fault injected into a simulated node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase", deny_unknown_fields)]
pub enum Fault {
    /// Copies and NCCL traffic between two GPUs run at `factor` of normal bandwidth.
    #[serde(rename_all = "camelCase")]
    SlowPair { gpus: [u32; 2], factor: f64 },
    /// Every link between the node's GPUs runs at `factor` of normal bandwidth (a worn
    /// NVSwitch baseboard, a power cap): copies and NCCL slow down alike, every pair the
    /// same, as on a node drifting slowly over nights.
    #[serde(rename_all = "camelCase")]
    SlowFabric { factor: f64 },
    /// One GPU computes `factor` times slower (e.g. 1.3).
    #[serde(rename_all = "camelCase")]
    Straggler { gpu: u32, factor: f64 },
    /// One GPU's device memory copies and fills run at `factor` of normal bandwidth (e.g. 0.7).
    #[serde(rename_all = "camelCase")]
    SlowMemory { gpu: u32, factor: f64 },
    /// One GPU computes a wrong result: one bit of its silent-data-corruption GEMM's output
    /// flips in every output, while every rate stays normal.
    #[serde(rename_all = "camelCase")]
    Sdc { gpu: u32 },
    /// `links` NVLink links of a GPU are down.
    #[serde(rename_all = "camelCase")]
    DeadLink { gpu: u32, links: u32 },
    /// The node's network runs at `factor` of normal bandwidth (node-pair tests).
    #[serde(rename_all = "camelCase")]
    SlowNic { factor: f64 },
    /// The path between this node and `peer` runs at `factor` of normal bandwidth, while
    /// both nodes are fine with other partners (node-pair tests).
    #[serde(rename_all = "camelCase")]
    BadPath { peer: String, factor: f64 },
    /// Network port `nic` (0-based, one per GPU) of the node is down: NCCL uses the others.
    #[serde(rename_all = "camelCase")]
    NicDown { nic: u32 },
    /// Network port `nic`'s symbol error counter grows by `perSecond` every second (a
    /// marginal cable or transceiver), as `nvlinkErrors` does for a GPU: two pair tests
    /// apart in time see it grow. The port stays up at full rate.
    #[serde(rename_all = "camelCase")]
    NicErrors { nic: u32, per_second: f64 },
    /// NCCL on this node finds no usable RDMA device and falls back to TCP sockets.
    SocketFallback,
    /// The CPU that launches the NCCL sweep's calls runs `factor` times slower (e.g. 1.4: a
    /// busy core, or the slow state of a shared host): the small sizes of a host-launched
    /// sweep take that much longer per call, while a sweep timed with CUDA graphs
    /// (`graphLaunches`) does not see it. Not a fault of the GPUs.
    #[serde(rename_all = "camelCase")]
    SlowLaunchCpu { factor: f64 },
    /// Another process (unknown to the scheduler) holds `bytes` of GPU `gpu`'s memory when
    /// the check starts, or with `during: true` starts while the check measures (its first
    /// look sees nothing, its last does): the agent does not measure (exit 14) unless told
    /// `--shared-gpus`. Not a fault of the GPUs.
    #[serde(rename_all = "camelCase")]
    GpusInUse {
        gpu: u32,
        bytes: u64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        during: bool,
    },
    /// NCCL hangs in this phase (default: the NCCL sweep); the watchdog must catch it.
    /// With `stuck: true` the whole agent hangs beyond any watchdog, so that only the
    /// pod's deadline (`activeDeadlineSeconds`) ends it.
    #[serde(rename_all = "camelCase")]
    Hang {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        phase: Option<Phase>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stuck: bool,
    },
    /// The agent dies (exit code, default 134 as for SIGABRT) without a result.
    #[serde(rename_all = "camelCase")]
    Crash {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
    },
    /// The agent writes a broken result document (truncated JSON).
    Garbage,
    /// The agent, told to stop (SIGTERM), dies with this exit code (default 139, a
    /// segmentation fault) instead of 143: what GPU libraries torn down under a running
    /// collective did. Whoever stopped the pod, not the node, is the cause.
    #[serde(rename_all = "camelCase")]
    CrashOnStop {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        exit_code: Option<i32>,
    },
    /// The driver reports an XID on a GPU.
    #[serde(rename_all = "camelCase")]
    Xid { gpu: u32, code: u64 },
    /// A GPU's NVLink error counters grow by `perSecond` every second (a marginal link):
    /// the count reported is the wall-clock time times the rate, so two checks apart in
    /// time see it grow, as a real counter since driver load does.
    #[serde(rename_all = "camelCase")]
    NvlinkErrors { gpu: u32, per_second: f64 },
    /// Uncorrectable ECC errors on a GPU.
    #[serde(rename_all = "camelCase")]
    Ecc { gpu: u32, count: u64 },
    /// A GPU's PCIe link trained below its maximum.
    #[serde(rename_all = "camelCase")]
    PcieDegraded {
        gpu: u32,
        generation: u32,
        width: u32,
    },
    /// NCCL falls back from NVLink to another transport between two GPUs.
    #[serde(rename_all = "camelCase")]
    TransportFallback {
        gpus: [u32; 2],
        transport: Transport,
    },
}

/// Errors reading a fleet description.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("reading fleet file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{origin} is not a valid fleet description: {detail}")]
    Parse { origin: String, detail: String },
    #[error("{origin}: {detail}")]
    Invalid {
        origin: String,
        detail: FleetInvalid,
    },
}

/// What is wrong with a fleet description that parsed ([`Fleet::check`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FleetInvalid {
    #[error("node {0} appears twice")]
    DuplicateNode(String),
    #[error(
        "node {node}: fault {fault:?} names a GPU, NIC or peer the node does not have or a factor out of range"
    )]
    BadFault { node: String, fault: Fault },
}

/// Where a fleet description comes from: a file, or the document itself (how a benchmark
/// pod gets one: an environment variable filled from a ConfigMap key).
#[derive(Debug, Clone, PartialEq)]
pub enum FleetSource {
    File(PathBuf),
    Document(String),
}

impl std::fmt::Display for FleetSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FleetSource::File(path) => write!(f, "fleet file {}", path.display()),
            FleetSource::Document(_) => write!(f, "the fleet document given inline"),
        }
    }
}

impl FleetSource {
    /// Reads and checks the description (see [`Fleet::parse`]).
    pub fn load(&self) -> Result<Fleet, FleetError> {
        match self {
            FleetSource::File(path) => Fleet::load(path),
            FleetSource::Document(text) => Fleet::parse(text, &self.to_string()),
        }
    }
}

impl Fleet {
    /// Reads a fleet description (YAML or JSON) from a file and checks it (see
    /// [`Fleet::parse`]).
    pub fn load(path: &Path) -> Result<Fleet, FleetError> {
        let text = std::fs::read_to_string(path).map_err(|source| FleetError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Fleet::parse(&text, &FleetSource::File(path.to_path_buf()).to_string())
    }

    /// Parses a fleet description (YAML or JSON) and checks it: unique node names, GPU and
    /// NIC indices of faults within the node's GPUs, factors in (0, 1] for slow faults and
    /// >= 1 for stragglers, error rates finite and above 0. `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Fleet, FleetError> {
        let fleet: Fleet = serde_yaml::from_str(text).map_err(|e| FleetError::Parse {
            origin: origin.to_string(),
            detail: e.to_string(),
        })?;
        fleet.check().map_err(|detail| FleetError::Invalid {
            origin: origin.to_string(),
            detail,
        })?;
        Ok(fleet)
    }

    /// Checks the description; returns what is wrong.
    pub fn check(&self) -> Result<(), FleetInvalid> {
        let mut names = std::collections::BTreeSet::new();
        for node in &self.nodes {
            if !names.insert(node.name.as_str()) {
                return Err(FleetInvalid::DuplicateNode(node.name.clone()));
            }
            for fault in &node.faults {
                let gpu_ok = |g: u32| g < node.gpus;
                let ok = match fault {
                    Fault::SlowPair {
                        gpus: [a, b],
                        factor,
                    } => gpu_ok(*a) && gpu_ok(*b) && a != b && *factor > 0.0 && *factor <= 1.0,
                    Fault::TransportFallback { gpus: [a, b], .. } => {
                        gpu_ok(*a) && gpu_ok(*b) && a != b
                    }
                    Fault::Straggler { gpu, factor } => gpu_ok(*gpu) && *factor >= 1.0,
                    Fault::SlowMemory { gpu, factor } => {
                        gpu_ok(*gpu) && *factor > 0.0 && *factor <= 1.0
                    }
                    Fault::Sdc { gpu } => gpu_ok(*gpu),
                    Fault::NvlinkErrors { gpu, per_second } => {
                        gpu_ok(*gpu) && per_second.is_finite() && *per_second > 0.0
                    }
                    Fault::NicErrors { nic, per_second } => {
                        gpu_ok(*nic) && per_second.is_finite() && *per_second > 0.0
                    }
                    Fault::DeadLink { gpu, .. }
                    | Fault::GpusInUse { gpu, .. }
                    | Fault::Xid { gpu, .. }
                    | Fault::Ecc { gpu, .. }
                    | Fault::PcieDegraded { gpu, .. } => gpu_ok(*gpu),
                    Fault::SlowNic { factor } | Fault::SlowFabric { factor } => {
                        *factor > 0.0 && *factor <= 1.0
                    }
                    Fault::BadPath { peer, factor } => {
                        *peer != node.name
                            && self.nodes.iter().any(|n| n.name == *peer)
                            && *factor > 0.0
                            && *factor <= 1.0
                    }
                    Fault::NicDown { nic } => gpu_ok(*nic),
                    Fault::SocketFallback => true,
                    Fault::SlowLaunchCpu { factor } => factor.is_finite() && *factor >= 1.0,
                    Fault::Hang { .. }
                    | Fault::Crash { .. }
                    | Fault::Garbage
                    | Fault::CrashOnStop { .. } => true,
                };
                if !ok {
                    return Err(FleetInvalid::BadFault {
                        node: node.name.clone(),
                        fault: fault.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The node with this name.
    pub fn node(&self, name: &str) -> Option<&FleetNode> {
        self.nodes.iter().find(|n| n.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(name: &str) -> Fleet {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fleets")
            .join(name);
        Fleet::load(&path).unwrap_or_else(|e| panic!("{name} loads: {e}"))
    }

    #[test]
    fn demo_fleet_has_sixteen_training_nodes_and_four_faulty_ones() {
        let fleet = sample("demo-16.yaml");
        assert_eq!(fleet.nodes.len(), 16);
        assert!(
            fleet.nodes.iter().all(
                |n| n.gpus == 8 && n.labels.get("pool").map(String::as_str) == Some("training")
            )
        );
        let products: std::collections::BTreeMap<&str, usize> =
            fleet.nodes.iter().fold(Default::default(), |mut m, n| {
                *m.entry(n.product.as_str()).or_default() += 1;
                m
            });
        assert_eq!(products.get("NVIDIA-H100-80GB-HBM3"), Some(&8));
        assert_eq!(products.get("NVIDIA-H200"), Some(&8));
        let faulty: Vec<&str> = fleet
            .nodes
            .iter()
            .filter(|n| !n.faults.is_empty())
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(faulty, vec!["h100-03", "h100-05", "h200-02", "h200-05"]);
    }

    #[test]
    fn faults_fleet_names_every_fault_kind() {
        let fleet = sample("faults.yaml");
        let hang = fleet.node("stuck").map(|n| n.faults.clone());
        assert_eq!(
            hang,
            Some(vec![Fault::Hang {
                phase: None,
                stuck: true
            }])
        );
        assert_eq!(
            fleet.node("hang").map(|n| n.faults.clone()),
            Some(vec![Fault::Hang {
                phase: None,
                stuck: false
            }])
        );
        assert!(fleet.nodes.len() >= 11);
    }

    #[test]
    fn hang_without_stuck_keeps_the_old_format() {
        let f = Fault::Hang {
            phase: Some(Phase::GpuPairs),
            stuck: false,
        };
        let yaml = serde_yaml::to_string(&f).expect("serialises");
        assert!(!yaml.contains("stuck"), "{yaml}");
        let back: Fault = serde_yaml::from_str(&yaml).expect("parses");
        assert_eq!(back, f);
    }

    #[test]
    fn bad_fleets_are_refused_with_the_reason() {
        let dir = std::env::temp_dir().join(format!("fleet-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("bad.yaml");
        std::fs::write(
            &path,
            "nodes:\n  - {name: a, product: X, gpus: 2, faults: [{kind: straggler, gpu: 5, factor: 2}]}\n",
        )
        .expect("write");
        let err = Fleet::load(&path).expect_err("GPU 5 of 2");
        assert!(matches!(err, FleetError::Invalid { .. }), "{err}");
        std::fs::write(
            &path,
            "nodes:\n  - {name: a, product: X, gpus: 2, color: red}\n",
        )
        .expect("write");
        assert!(matches!(Fleet::load(&path), Err(FleetError::Parse { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn nic_errors_name_a_port_of_the_node_and_a_rate_above_zero() {
        let fleet = |fault: &str| -> Result<Fleet, String> {
            let yaml = format!("nodes:\n  - {{name: a, product: X, gpus: 8, faults: [{fault}]}}\n");
            let f: Fleet = serde_yaml::from_str(&yaml).map_err(|e| e.to_string())?;
            f.check().map(|()| f).map_err(|e| e.to_string())
        };
        let ok = fleet("{kind: nicErrors, nic: 7, perSecond: 1000}").expect("valid");
        assert_eq!(
            ok.nodes[0].faults,
            vec![Fault::NicErrors {
                nic: 7,
                per_second: 1000.0
            }]
        );
        for bad in [
            "{kind: nicErrors, nic: 8, perSecond: 1000}",
            "{kind: nicErrors, nic: 0, perSecond: 0}",
            "{kind: nicErrors, nic: 0, perSecond: -5}",
            "{kind: nicErrors, nic: 0, perSecond: .inf}",
            "{kind: nicErrors, nic: 0, perSecond: .nan}",
        ] {
            let err = fleet(bad).expect_err(bad);
            assert!(err.contains("names a GPU, NIC or peer"), "{bad}: {err}");
        }
        assert!(
            fleet("{kind: nicErrors, nic: 0}").is_err(),
            "perSecond is required"
        );
    }
}
