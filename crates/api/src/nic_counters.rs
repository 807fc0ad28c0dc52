//! Network port error counters between pair tests. sysfs counts a port's symbol, receive
//! and link-downed errors since the driver loaded, so a count alone says little; growth is
//! what a marginal cable or transceiver shows. The operator keeps each node's port counters
//! at its latest node-pair test in the node annotation [`crate::keys::ANNOTATION_NIC_COUNTERS`]
//! (apart from [`crate::keys::ANNOTATION_COUNTERS`]: the node check and the node-pair phase
//! read their counters at different times); the next pair test compares.

use crate::counters::BaselineError;
use crate::nic::NicPort;
use serde::{Deserialize, Serialize};

pub use crate::nic::PortErrors;

/// Most ports a record keeps: far more than a node has. With device names of at most
/// [`MAX_DEVICE_NAME`] bytes a record always fits
/// [`crate::counters::MAX_ANNOTATION_BYTES`], so that what is
/// written can be read back.
pub const MAX_PORTS: usize = 64;
/// Longest device name kept (the kernel's `IB_DEVICE_NAME_MAX`); a port with a longer one
/// is left out of the record.
pub const MAX_DEVICE_NAME: usize = 64;

/// The error counters of one port.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PortCounters {
    /// Device, e.g. `mlx5_0`.
    pub device: String,
    pub port: u32,
    #[serde(flatten)]
    pub errors: PortErrors,
}

/// The port counters of one node at one node-pair test.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NicCounters {
    /// The run whose pair test read them.
    pub run: String,
    /// When, RFC 3339.
    pub at: String,
    #[serde(default)]
    pub ports: Vec<PortCounters>,
}

impl NicCounters {
    /// The counters of `ports` (the first [`MAX_PORTS`] with counters and a device name of
    /// at most [`MAX_DEVICE_NAME`] bytes); None when no port has any (a node without
    /// InfiniBand or RoCE devices, a sysfs without counters).
    pub fn of(ports: &[NicPort], run: &str, at: &str) -> Option<NicCounters> {
        let ports: Vec<PortCounters> = ports
            .iter()
            .filter(|p| p.device.len() <= MAX_DEVICE_NAME)
            .filter(|p| p.errors.any())
            .take(MAX_PORTS)
            .map(|p| PortCounters {
                device: p.device.clone(),
                port: p.port,
                errors: p.errors,
            })
            .collect();
        (!ports.is_empty()).then(|| NicCounters {
            run: run.to_string(),
            at: at.to_string(),
            ports,
        })
    }

    /// The counters of `device` port `port`, if the record holds them.
    pub fn port(&self, device: &str, port: u32) -> Option<&PortCounters> {
        self.ports
            .iter()
            .find(|p| p.device == device && p.port == port)
    }

    /// Parses a stored record; never panics on what a person or another tool wrote there.
    pub fn parse(text: &str) -> Result<NicCounters, BaselineError> {
        crate::counters::parse_record(text)
    }

    /// The record as stored (compact JSON).
    pub fn to_json(&self) -> String {
        // A struct of strings and integers always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether `other` holds the same ports and counts (the run and time aside): then there
    /// is nothing new to store.
    pub fn same_counts(&self, other: &NicCounters) -> bool {
        self.ports == other.ports
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::MAX_ANNOTATION_BYTES;

    fn port(device: &str, symbol_errors: Option<u64>) -> NicPort {
        NicPort {
            device: device.into(),
            port: 1,
            link_layer: Some("InfiniBand".into()),
            state: "ACTIVE".into(),
            phys_state: "LinkUp".into(),
            rate_gbps: Some(400.0),
            errors: PortErrors {
                symbol_errors,
                link_downed: Some(0),
                rcv_errors: Some(3),
            },
        }
    }

    fn record() -> NicCounters {
        NicCounters::of(
            &[port("mlx5_0", Some(12)), port("mlx5_1", None)],
            "nightly-1",
            "2026-11-24T02:00:00Z",
        )
        .expect("ports with counters")
    }

    #[test]
    fn a_record_keeps_each_ports_counters_and_nothing_else() {
        let r = record();
        assert_eq!(r.run, "nightly-1");
        assert_eq!(r.ports.len(), 2);
        assert_eq!(
            r.port("mlx5_0", 1),
            Some(&PortCounters {
                device: "mlx5_0".into(),
                port: 1,
                errors: PortErrors {
                    symbol_errors: Some(12),
                    link_downed: Some(0),
                    rcv_errors: Some(3),
                },
            })
        );
        assert_eq!(
            r.port("mlx5_1", 1).and_then(|p| p.errors.symbol_errors),
            None
        );
        assert_eq!(r.port("mlx5_0", 2), None);
        assert_eq!(
            r.to_json(),
            r#"{"run":"nightly-1","at":"2026-11-24T02:00:00Z","ports":[{"device":"mlx5_0","port":1,"symbolErrors":12,"linkDowned":0,"rcvErrors":3},{"device":"mlx5_1","port":1,"linkDowned":0,"rcvErrors":3}]}"#
        );
    }

    #[test]
    fn a_stored_record_reads_and_writes_back_byte_for_byte() {
        let text = concat!(
            r#"{"run":"nightly-1","at":"2026-11-24T02:00:00Z","ports":["#,
            r#"{"device":"mlx5_0","port":1,"symbolErrors":12,"linkDowned":0,"rcvErrors":3},"#,
            r#"{"device":"mlx5_1","port":2,"rcvErrors":18446744073709551615}]}"#
        );
        let r = NicCounters::parse(text).expect("parses");
        assert_eq!(
            r.port("mlx5_1", 2).map(|p| p.errors),
            Some(PortErrors {
                rcv_errors: Some(u64::MAX),
                ..Default::default()
            })
        );
        assert_eq!(r.to_json(), text);
    }

    #[test]
    fn ports_without_counters_make_no_record() {
        let bare = NicPort {
            errors: PortErrors::default(),
            ..port("mlx5_0", None)
        };
        assert_eq!(NicCounters::of(&[bare], "r", "t"), None);
        assert_eq!(NicCounters::of(&[], "r", "t"), None);
    }

    #[test]
    fn a_record_of_the_most_ports_still_fits_the_annotation_limit() {
        let many: Vec<NicPort> = (0..200)
            .map(|i| NicPort {
                device: format!("mlx5_{i:03}_{}", "x".repeat(MAX_DEVICE_NAME - 9)),
                port: u32::MAX,
                errors: PortErrors {
                    symbol_errors: Some(u64::MAX),
                    link_downed: Some(u64::MAX),
                    rcv_errors: Some(u64::MAX),
                },
                ..port("d", None)
            })
            .collect();
        let r = NicCounters::of(&many, &"r".repeat(253), "2026-11-24T02:00:00Z").expect("a record");
        assert_eq!(r.ports.len(), MAX_PORTS);
        assert!(r.ports.iter().all(|p| p.device.len() == MAX_DEVICE_NAME));
        assert!(
            r.to_json().len() <= MAX_ANNOTATION_BYTES,
            "{}",
            r.to_json().len()
        );
        assert_eq!(NicCounters::parse(&r.to_json()), Ok(r));
        // A device name no kernel gives is left out rather than making the record too large.
        let odd = NicPort {
            device: "x".repeat(MAX_DEVICE_NAME + 1),
            ..port("d", Some(1))
        };
        assert_eq!(NicCounters::of(&[odd], "r", "t"), None);
    }

    #[test]
    fn a_record_round_trips_and_junk_is_an_error_not_a_panic() {
        let r = record();
        assert_eq!(NicCounters::parse(&r.to_json()), Ok(r));
        assert!(matches!(
            NicCounters::parse("{not json"),
            Err(BaselineError::Malformed(_))
        ));
        assert!(matches!(
            NicCounters::parse(r#"{"run":"r","at":"t","ports":[{"device":"d","port":-1}]}"#),
            Err(BaselineError::Malformed(_))
        ));
        assert!(matches!(
            NicCounters::parse(r#"{"run":"r","at":"t","ports":[{"port":1}]}"#),
            Err(BaselineError::Malformed(_))
        ));
        let big = format!("{{\"run\":\"{}\"}}", "x".repeat(MAX_ANNOTATION_BYTES));
        assert!(matches!(
            NicCounters::parse(&big),
            Err(BaselineError::TooLarge(_))
        ));
        // An older record without ports reads as one with none.
        assert_eq!(
            NicCounters::parse(r#"{"run":"r","at":"t"}"#).map(|r| r.ports.len()),
            Ok(0)
        );
    }

    #[test]
    fn same_counts_ignores_run_and_time_only() {
        let a = record();
        let b = NicCounters {
            run: "nightly-2".into(),
            at: "2026-11-25T02:00:00Z".into(),
            ..a.clone()
        };
        assert!(a.same_counts(&b));
        let mut c = a.clone();
        c.ports[1].errors.rcv_errors = Some(4);
        assert!(!a.same_counts(&c));
        let mut d = a.clone();
        d.ports.pop();
        assert!(!a.same_counts(&d));
    }
}
