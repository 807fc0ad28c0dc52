//! A node's software as the compact result carries it (driver, CUDA, NCCL, NCCL's config
//! files, VBIOS, fabric manager), and the fields a run's nodes are compared by.

use super::{ResultDocument, text::cut};
use serde::{Deserialize, Serialize};

/// [`super::Versions::nccl_conf`] of a node where none of NCCL's config files exists.
pub const NO_CONF_FILE: &str = "none";

/// Longest version string the compact result carries.
const VERSION_CHARS: usize = 32;

/// The node's software, each field `None` where the agent did not say (an older agent, or
/// NVML could not read it).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct CompactSoftware {
    #[serde(rename = "d", default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    #[serde(rename = "n", default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<String>,
    #[serde(rename = "f", default, skip_serializing_if = "Option::is_none")]
    pub nccl_conf: Option<String>,
    /// The GPUs' VBIOS versions, each once, sorted, joined by `/` (one version where every
    /// GPU has the same).
    #[serde(rename = "vb", default, skip_serializing_if = "Option::is_none")]
    pub vbios: Option<String>,
    #[serde(rename = "fm", default, skip_serializing_if = "Option::is_none")]
    pub fabric_manager: Option<String>,
}

impl CompactSoftware {
    /// Whether the agent said nothing of its software.
    pub fn is_empty(&self) -> bool {
        SoftwareField::ALL.iter().all(|f| f.of(self).is_none())
    }
}

impl From<&ResultDocument> for CompactSoftware {
    fn from(doc: &ResultDocument) -> Self {
        let v = &doc.versions;
        let short = |s: &Option<String>| {
            s.as_deref()
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| cut(s, VERSION_CHARS))
        };
        let mut vbios: Vec<&str> = v
            .vbios
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .collect();
        vbios.sort_unstable();
        vbios.dedup();
        CompactSoftware {
            driver: short(&v.driver),
            cuda: short(&v.cuda),
            nccl: short(&v.nccl),
            nccl_conf: short(&v.nccl_conf),
            vbios: (!vbios.is_empty()).then(|| cut(&vbios.join("/"), 2 * VERSION_CHARS)),
            fabric_manager: short(&v.fabric_manager),
        }
    }
}

/// One piece of a node's software that the nodes of a run should share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SoftwareField {
    Driver,
    Cuda,
    Nccl,
    NcclConf,
    Vbios,
    FabricManager,
}

impl SoftwareField {
    pub const ALL: [SoftwareField; 6] = [
        SoftwareField::Driver,
        SoftwareField::Cuda,
        SoftwareField::Nccl,
        SoftwareField::NcclConf,
        SoftwareField::Vbios,
        SoftwareField::FabricManager,
    ];

    /// The field's value on a node, if its agent said.
    pub fn of(self, s: &CompactSoftware) -> Option<&str> {
        match self {
            SoftwareField::Driver => s.driver.as_deref(),
            SoftwareField::Cuda => s.cuda.as_deref(),
            SoftwareField::Nccl => s.nccl.as_deref(),
            SoftwareField::NcclConf => s.nccl_conf.as_deref(),
            SoftwareField::Vbios => s.vbios.as_deref(),
            SoftwareField::FabricManager => s.fabric_manager.as_deref(),
        }
    }

    /// Whether nodes are held to it only against nodes of their own GPU product and count:
    /// another product has its own VBIOS, and a board without NVSwitches no fabric.
    pub fn per_board(self) -> bool {
        matches!(self, SoftwareField::Vbios | SoftwareField::FabricManager)
    }
}

impl std::fmt::Display for SoftwareField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SoftwareField::Driver => "driver",
            SoftwareField::Cuda => "CUDA driver version",
            SoftwareField::Nccl => "NCCL",
            SoftwareField::NcclConf => "NCCL config files digest",
            SoftwareField::Vbios => "VBIOS",
            SoftwareField::FabricManager => "fabric manager state",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::{Backend, GpuInfo, Versions};

    fn doc(versions: Versions) -> ResultDocument {
        let gpu = |index| GpuInfo {
            index,
            product: "NVIDIA H100 80GB HBM3".into(),
            uuid: None,
            pci_bus_id: None,
            memory_bytes: 1,
        };
        ResultDocument::unmeasured(
            "n1".into(),
            Backend::Sim,
            "2026-01-01T00:00:00Z".into(),
            versions,
            vec![gpu(0), gpu(1)],
        )
    }

    #[test]
    fn a_node_whose_gpus_share_a_vbios_reports_it_once() {
        let s = CompactSoftware::from(&doc(Versions {
            driver: Some("550.90.07".into()),
            vbios: vec!["96.00.74.00.01".into(), "96.00.74.00.01".into()],
            ..Versions::default()
        }));
        assert_eq!(s.driver.as_deref(), Some("550.90.07"));
        assert_eq!(s.vbios.as_deref(), Some("96.00.74.00.01"));
        let mixed = CompactSoftware::from(&doc(Versions {
            vbios: vec!["96.00.89.00.01".into(), "96.00.74.00.01".into()],
            ..Versions::default()
        }));
        assert_eq!(
            mixed.vbios.as_deref(),
            Some("96.00.74.00.01/96.00.89.00.01")
        );
    }

    #[test]
    fn an_older_agents_result_reads_as_software_unknown() {
        let s = CompactSoftware::from(&doc(Versions::default()));
        assert!(s.is_empty());
        assert_eq!(SoftwareField::Driver.of(&s), None);
        let back: CompactSoftware = serde_json::from_str("{}").expect("parse");
        assert_eq!(back, s);
    }
}
