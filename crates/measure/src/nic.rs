//! The node's InfiniBand and RoCE ports, read from sysfs
//! (`/sys/class/infiniband/<device>/ports/<port>/`): state, physical state, active rate and
//! error counters. Reads from any root so that tests use a directory fixture.

use gpufabric_api::nic_counters::PortErrors;
use gpufabric_api::pair::NicPort;
use std::path::Path;

/// Where the kernel lists RDMA devices.
pub(crate) const SYSFS_ROOT: &str = "/sys/class/infiniband";

/// Why the ports could not be listed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NicError {
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// Every port of every device under `root`, sorted by device and port. A missing root is
/// a node without RDMA devices (no ports, no error); a port whose files are missing or
/// unreadable is listed with what could be read (`unknown` state, no rate or counter).
pub(crate) fn read_ports(root: &Path) -> Result<Vec<NicPort>, NicError> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(NicError::Io {
                path: root.display().to_string(),
                source,
            });
        }
    };
    let mut ports = Vec::new();
    for entry in entries.flatten() {
        let device = entry.file_name().to_string_lossy().into_owned();
        let ports_dir = entry.path().join("ports");
        let Ok(port_entries) = std::fs::read_dir(&ports_dir) else {
            tracing::debug!(device, "no ports directory");
            continue;
        };
        for port_entry in port_entries.flatten() {
            let Ok(port) = port_entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            ports.push(read_port(&device, port, &port_entry.path()));
        }
    }
    ports.sort_by(|a, b| (&a.device, a.port).cmp(&(&b.device, b.port)));
    Ok(ports)
}

fn read_port(device: &str, port: u32, dir: &Path) -> NicPort {
    let text = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
    };
    let counter =
        |name: &str| text(&format!("counters/{name}")).and_then(|t| t.parse::<u64>().ok());
    NicPort {
        device: device.to_string(),
        port,
        link_layer: text("link_layer"),
        state: text("state")
            .map(|s| without_number(&s))
            .unwrap_or_else(|| "unknown".into()),
        phys_state: text("phys_state")
            .map(|s| without_number(&s))
            .unwrap_or_else(|| "unknown".into()),
        rate_gbps: text("rate").and_then(|r| parse_rate(&r)),
        errors: PortErrors {
            symbol_errors: counter("symbol_error"),
            link_downed: counter("link_downed"),
            rcv_errors: counter("port_rcv_errors"),
        },
    }
}

/// `4: ACTIVE` -> `ACTIVE`; a value without a number is kept as it is.
fn without_number(s: &str) -> String {
    match s.split_once(':') {
        Some((n, rest)) if n.trim().chars().all(|c| c.is_ascii_digit()) => rest.trim().to_string(),
        _ => s.trim().to_string(),
    }
}

/// `400 Gb/sec (4X NDR)` -> 400; `2.5 Gb/sec (1X SDR)` -> 2.5.
fn parse_rate(s: &str) -> Option<f64> {
    let number = s.split_whitespace().next()?;
    number
        .parse::<f64>()
        .ok()
        .filter(|r| r.is_finite() && *r >= 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::PathBuf;

    /// A sysfs-shaped fixture under a temporary directory.
    struct Fixture(tempfile::TempDir);

    impl Fixture {
        fn new() -> Fixture {
            Fixture(tempfile::tempdir().expect("temp dir"))
        }
        fn root(&self) -> PathBuf {
            self.0.path().join("infiniband")
        }
        fn port(&self, dev: &str, port: u32, files: &[(&str, &str)]) {
            let dir = self.root().join(dev).join("ports").join(port.to_string());
            fs::create_dir_all(dir.join("counters")).expect("mkdir");
            for (name, value) in files {
                fs::write(dir.join(name), format!("{value}\n")).expect("write");
            }
        }
        fn healthy(&self, dev: &str, rate: &str) {
            self.port(
                dev,
                1,
                &[
                    ("state", "4: ACTIVE"),
                    ("phys_state", "5: LinkUp"),
                    ("rate", rate),
                    ("link_layer", "InfiniBand"),
                    ("counters/symbol_error", "0"),
                    ("counters/link_downed", "1"),
                    ("counters/port_rcv_errors", "7"),
                ],
            );
        }
    }

    #[test]
    fn ports_are_read_with_state_rate_and_counters() {
        let f = Fixture::new();
        f.healthy("mlx5_1", "400 Gb/sec (4X NDR)");
        f.healthy("mlx5_0", "200 Gb/sec (4X HDR)");
        let ports = read_ports(&f.root()).expect("reads");
        assert_eq!(ports.len(), 2);
        let p = &ports[0];
        assert_eq!((p.device.as_str(), p.port), ("mlx5_0", 1));
        assert_eq!(p.state, "ACTIVE");
        assert_eq!(p.phys_state, "LinkUp");
        assert_eq!(p.link_layer.as_deref(), Some("InfiniBand"));
        assert_eq!(p.rate_gbps, Some(200.0));
        assert_eq!(
            (
                p.errors.symbol_errors,
                p.errors.link_downed,
                p.errors.rcv_errors
            ),
            (Some(0), Some(1), Some(7))
        );
        assert!(p.is_up());
        assert_eq!(ports[1].rate_gbps, Some(400.0));
    }

    #[test]
    fn a_node_without_rdma_devices_has_no_ports() {
        let f = Fixture::new();
        assert_eq!(read_ports(&f.root()).expect("no root is fine"), vec![]);
    }

    #[test]
    fn missing_and_garbled_files_leave_the_port_listed_with_what_was_readable() {
        let f = Fixture::new();
        f.port(
            "mlx5_2",
            2,
            &[
                ("state", "1: DOWN"),
                ("phys_state", "3: Disabled"),
                ("rate", "fast"),
                ("counters/symbol_error", "many"),
            ],
        );
        f.port("mlx5_3", 1, &[]);
        // Not a port: ignored.
        fs::create_dir_all(f.root().join("mlx5_3/ports/notaport")).expect("mkdir");
        // A device without a ports directory: ignored.
        fs::create_dir_all(f.root().join("bogus0")).expect("mkdir");
        let ports = read_ports(&f.root()).expect("reads");
        assert_eq!(ports.len(), 2);
        assert_eq!(ports[0].state, "DOWN");
        assert_eq!(ports[0].phys_state, "Disabled");
        assert_eq!(ports[0].rate_gbps, None);
        assert_eq!(ports[0].errors.symbol_errors, None);
        assert!(!ports[0].is_up());
        assert_eq!(
            (ports[1].state.as_str(), ports[1].rate_gbps),
            ("unknown", None)
        );
    }

    #[test]
    fn sysfs_values_are_parsed_as_the_kernel_writes_them() {
        assert_eq!(without_number("4: ACTIVE"), "ACTIVE");
        assert_eq!(without_number("5: LinkUp"), "LinkUp");
        assert_eq!(without_number("ACTIVE"), "ACTIVE");
        assert_eq!(parse_rate("2.5 Gb/sec (1X SDR)"), Some(2.5));
        assert_eq!(parse_rate("100 Gb/sec (4X EDR)"), Some(100.0));
        assert_eq!(parse_rate(""), None);
    }
}
