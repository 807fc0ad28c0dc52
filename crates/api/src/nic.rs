//! A node's network ports (InfiniBand / RoCE) as sysfs shows them: read by the agent into
//! its documents, kept as counters between pair tests (`crate::nic_counters`), judged by
//! `gpufabric_health::nics`. Imports nothing of the crate: the documents build on it.

use serde::{Deserialize, Serialize};

/// One port of an InfiniBand or RoCE device as sysfs shows it
/// (`/sys/class/infiniband/<device>/ports/<port>/`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NicPort {
    /// Device, e.g. `mlx5_0`.
    pub device: String,
    pub port: u32,
    /// `InfiniBand` or `Ethernet` (RoCE), from `link_layer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_layer: Option<String>,
    /// Logical state without its number, e.g. `ACTIVE`, `DOWN`, `INIT`.
    pub state: String,
    /// Physical state without its number, e.g. `LinkUp`, `Polling`, `Disabled`.
    pub phys_state: String,
    /// Active rate in Gb/s (`400` of `400 Gb/sec (4X NDR)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_gbps: Option<f64>,
    #[serde(flatten)]
    pub errors: PortErrors,
}

impl NicPort {
    /// `mlx5_0 port 1`.
    pub fn name(&self) -> String {
        format!("{} port {}", self.device, self.port)
    }

    /// Logically active and physically up.
    pub fn is_up(&self) -> bool {
        self.state.eq_ignore_ascii_case("ACTIVE") && self.phys_state.eq_ignore_ascii_case("LinkUp")
    }
}

/// A port's error counters since the driver loaded (sysfs `counters/`); each is absent
/// when sysfs has none. Flattened into [`NicPort`] and
/// [`PortCounters`](crate::nic_counters::PortCounters): the fields sit in
/// their objects as they always did.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PortErrors {
    /// `symbol_error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symbol_errors: Option<u64>,
    /// `link_downed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_downed: Option<u64>,
    /// `port_rcv_errors`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rcv_errors: Option<u64>,
}

impl PortErrors {
    /// Whether sysfs gave any of the counters.
    pub fn any(&self) -> bool {
        self.symbol_errors.is_some() || self.link_downed.is_some() || self.rcv_errors.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_is_up_only_when_active_and_linked() {
        let mut p = NicPort {
            device: "mlx5_0".into(),
            port: 1,
            link_layer: Some("InfiniBand".into()),
            state: "ACTIVE".into(),
            phys_state: "LinkUp".into(),
            rate_gbps: Some(400.0),
            errors: PortErrors::default(),
        };
        assert!(p.is_up());
        p.phys_state = "Polling".into();
        assert!(!p.is_up());
        p.phys_state = "LinkUp".into();
        p.state = "INIT".into();
        assert!(!p.is_up());
        assert_eq!(p.name(), "mlx5_0 port 1");
    }
}
