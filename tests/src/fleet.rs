//! Simulated fleets for tests: build a `gpufabric_measure::fleet::Fleet` in Rust, write it to
//! a file (the process-kubelet and the agent's sim backend both read the file), or load one.

use crate::{Error, Result, io_err, workspace_root};
use gpufabric_measure::fleet::{Fault, Fleet, FleetNode};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// H100 product label, as NVIDIA's GPU feature discovery writes it.
pub const H100: &str = "NVIDIA-H100-80GB-HBM3";
/// H200 product label.
pub const H200: &str = "NVIDIA-H200";
/// Label every node of the fleets built here carries (what `deploy/examples` select).
pub const POOL_LABEL: (&str, &str) = ("pool", "training");

/// A fleet description and the file it is written in.
#[derive(Debug)]
pub struct SimFleet {
    path: PathBuf,
    fleet: Fleet,
    // Keeps a temp file's dir alive as long as the fleet.
    _dir: Option<tempfile::TempDir>,
}

impl SimFleet {
    /// Reads and checks a fleet file.
    pub fn load(path: impl AsRef<Path>) -> Result<SimFleet> {
        let path = path.as_ref().to_path_buf();
        let fleet = Fleet::load(&path)?;
        let path = std::path::absolute(&path).unwrap_or(path);
        Ok(SimFleet {
            path,
            fleet,
            _dir: None,
        })
    }

    /// Checks `fleet` and writes it to a file in a fresh temp dir (removed on drop).
    pub fn write(fleet: Fleet) -> Result<SimFleet> {
        let dir = tempfile::Builder::new()
            .prefix("gpufabric-fleet-")
            .tempdir()
            .map_err(io_err("creating a temp dir for the fleet"))?;
        let path = dir.path().join("fleet.yaml");
        let mut f = SimFleet::write_to(fleet, &path)?;
        f._dir = Some(dir);
        Ok(f)
    }

    /// Checks `fleet` and writes it to `path` (kept after drop).
    pub fn write_to(fleet: Fleet, path: impl AsRef<Path>) -> Result<SimFleet> {
        fleet
            .check()
            .map_err(|e| Error::Invalid(format!("fleet: {e}")))?;
        let path = path.as_ref().to_path_buf();
        let text = serde_yaml::to_string(&fleet)
            .map_err(|e| Error::Invalid(format!("serializing the fleet: {e}")))?;
        std::fs::write(&path, text).map_err(io_err(format!("writing {}", path.display())))?;
        let path = std::path::absolute(&path).unwrap_or(path);
        Ok(SimFleet {
            path,
            fleet,
            _dir: None,
        })
    }

    /// The fleet file (absolute).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fleet description.
    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// Node names, in file order.
    pub fn node_names(&self) -> Vec<String> {
        self.fleet.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// `count` healthy nodes `<prefix>-01`, `<prefix>-02`, ... with `gpus` GPUs of
    /// `product` each, labelled `pool=training`.
    pub fn uniform(prefix: &str, count: usize, product: &str, gpus: u32) -> Fleet {
        Fleet {
            seed: 1,
            nodes: (1..=count)
                .map(|i| node(&format!("{prefix}-{i:02}"), product, gpus))
                .collect(),
        }
    }

    /// The demo fleet: 16 nodes of 8 GPUs, `h100-01..08` and `h200-01..08`, labelled
    /// `pool=training`; `h100-03` has a slow GPU pair (GPUs 2 and 3 at 30% bandwidth)
    /// and `h200-06` a straggler GPU (GPU 5 computes 1.35x slower).
    pub fn demo() -> Fleet {
        let mut nodes: Vec<FleetNode> = (1..=8)
            .map(|i| node(&format!("h100-{i:02}"), H100, 8))
            .chain((1..=8).map(|i| node(&format!("h200-{i:02}"), H200, 8)))
            .collect();
        nodes[2].faults.push(Fault::SlowPair {
            gpus: [2, 3],
            factor: 0.3,
        });
        nodes[13].faults.push(Fault::Straggler {
            gpu: 5,
            factor: 1.35,
        });
        Fleet { seed: 42, nodes }
    }

    /// `crates/measure/fleets/demo-16.yaml`, when the bench crate ships it.
    pub fn shipped_demo_file() -> Option<PathBuf> {
        let p = workspace_root().join("crates/measure/fleets/demo-16.yaml");
        p.is_file().then_some(p)
    }
}

fn node(name: &str, product: &str, gpus: u32) -> FleetNode {
    FleetNode {
        name: name.to_string(),
        product: product.to_string(),
        gpus,
        labels: BTreeMap::from([(POOL_LABEL.0.to_string(), POOL_LABEL.1.to_string())]),
        faults: Vec::new(),
        software: Default::default(),
    }
}
