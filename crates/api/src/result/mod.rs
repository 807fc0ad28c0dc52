//! The result document an agent writes: a full form (JSON file and last line of stdout) and
//! a compact form (the termination message, at most 4096 bytes for an 8-GPU node with the
//! default suite). Both are versioned; readers reject a version they do not know.
//!
//! Bandwidths are GB/s (10^9 bytes per second), times are microseconds or milliseconds as
//! the field name says.
//!
//! This file holds the document and its parts common to both forms; `measurements` what a
//! check measured, `compact` the termination-message form.

mod compact;
mod key_numbers;
mod measurements;
mod settings;
mod software;
mod text;

pub use compact::{
    BANDWIDTH_BYTES, COPY_BYTES, CompactCollective, CompactDdpPoint, CompactGpuCompute,
    CompactGpuHealth, CompactResult, CompactSetting, DDP_COMPUTE_MS, SETTING_CHARS, upper_index,
};
pub use measurements::{
    AlphaBeta, CollectiveSweep, ComputeResult, DdpPoint, DdpResult, GpuCompute, GpuHealth,
    HealthSnapshot, HostBandwidth, LoadReading, NcclSweepResult, PairBandwidth, PairMatrix,
    SdcStatus, SweepRow, Timing, Transport, TransportInfo,
};

pub use settings::{NcclSetting, SettingSource};
pub use software::{CompactSoftware, NO_CONF_FILE, SoftwareField};

pub use crate::phase::{ErrorKind, Phase, PhaseError};
pub(crate) use key_numbers::KeyNumbers;

use serde::{Deserialize, Serialize};

/// Schema tag of the full document.
pub const FULL_SCHEMA: &str = "gpufabric.io/result/v1";
/// Version number of the compact document (field `v`).
pub const COMPACT_VERSION: u32 = 1;

/// Which backend produced a document.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    #[default]
    Cuda,
    Sim,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Cuda => "cuda",
            Backend::Sim => "sim",
        })
    }
}

/// The full result document of one node check.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResultDocument {
    /// Always [`FULL_SCHEMA`].
    pub schema: String,
    pub node: String,
    pub backend: Backend,
    /// RFC 3339.
    pub started_at: String,
    pub duration_s: f64,
    pub versions: Versions,
    pub gpus: Vec<GpuInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<NcclSweepResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pairs: Option<PairMatrix>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ddp: Option<DdpResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthSnapshot>,
    /// What each GPU computes (GEMM, memory bandwidth, silent data corruption).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute: Option<ComputeResult>,
    /// Transport NCCL chose between each pair of GPUs (from NCCL's own information).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transports: Vec<TransportInfo>,
    /// The node's InfiniBand / RoCE ports (sysfs), when it has any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<crate::nic::NicPort>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<PhaseError>,
    /// The NCCL tuning settings in effect, each with its source (the spec's agent env, a pod
    /// env the spec did not set, NCCL's config files); absent from older agents.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nccl_settings: Vec<NcclSetting>,
}

/// Software versions seen by the agent: what a node of a run should share with the others
/// (each field absent where it could not be read, and from older agents).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Versions {
    pub agent: String,
    /// The kernel driver's version (NVML), e.g. `550.90.07`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The CUDA version the driver supports (`cuDriverGetVersion`), e.g. `12.4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<String>,
    /// Digest of the NCCL config files in effect (`NCCL_CONF_FILE` or `~/.nccl.conf`, then
    /// `/etc/nccl.conf`): the first 16 hex digits of their SHA-256, or [`NO_CONF_FILE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_conf: Option<String>,
    /// The VBIOS version of each GPU, by index (NVML); empty where NVML could not say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vbios: Vec<String>,
    /// The GPUs' NVSwitch fabric state as the fabric manager left it (NVML's GPU fabric
    /// info): `completed`, `in progress`, `not started`, `not supported` (no NVSwitch
    /// fabric to join, or a GPU before Hopper), or each GPU's where they differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric_manager: Option<String>,
}

/// One GPU as the agent saw it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    pub index: u32,
    pub product: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    pub memory_bytes: u64,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

fn is_zero_f64(v: &f64) -> bool {
    *v == 0.0
}

/// Errors reading a result document.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ParseError {
    #[error("the result document is empty (the agent wrote no termination message)")]
    Empty,
    #[error("the result document is not valid JSON ({0}); it may be truncated")]
    Malformed(String),
    #[error("the result document has version {found}, this operator reads version {expected}")]
    Version { found: u32, expected: u32 },
}

/// Reads a document tagged with a schema string (`schema` of the parsed value must be
/// `expected`); never panics on what a pod wrote.
pub(crate) fn parse_tagged<T: serde::de::DeserializeOwned>(
    text: &str,
    schema: impl Fn(&T) -> &str,
    expected: &str,
) -> Result<T, ParseError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(ParseError::Empty);
    }
    let doc: T = serde_json::from_str(text).map_err(|e| ParseError::Malformed(e.to_string()))?;
    if schema(&doc) != expected {
        return Err(ParseError::Malformed(format!(
            "schema is {:?}, expected {expected:?}",
            schema(&doc)
        )));
    }
    Ok(doc)
}

impl ResultDocument {
    /// The document of a check of `gpus` on `node`, nothing measured yet.
    pub fn unmeasured(
        node: String,
        backend: Backend,
        started_at: String,
        versions: Versions,
        gpus: Vec<GpuInfo>,
    ) -> ResultDocument {
        ResultDocument {
            schema: FULL_SCHEMA.to_string(),
            node,
            backend,
            started_at,
            duration_s: 0.0,
            versions,
            gpus,
            nccl: None,
            pairs: None,
            ddp: None,
            health: None,
            compute: None,
            transports: Vec::new(),
            nics: Vec::new(),
            errors: Vec::new(),
            nccl_settings: Vec::new(),
        }
    }

    /// Reads a full document, rejecting malformed and unknown-schema input.
    pub fn parse(text: &str) -> Result<ResultDocument, ParseError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(ParseError::Empty);
        }
        let doc: ResultDocument =
            serde_json::from_str(text).map_err(|e| ParseError::Malformed(e.to_string()))?;
        if doc.schema != FULL_SCHEMA {
            return Err(ParseError::Malformed(format!(
                "schema is {:?}, expected {FULL_SCHEMA:?}",
                doc.schema
            )));
        }
        Ok(doc)
    }
}
