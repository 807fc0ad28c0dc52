//! What a real node needs of the machine: root, Debian's container runtime and network
//! tools, one node at a time (a lock), and the kernel settings it changes and gives back.

use crate::{Error, Result, io_err};
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The Debian packages a real node runs on (installed with `apt-get install`).
pub const APT_PACKAGES: &str = "containerd runc containernetworking-plugins iptables conntrack";

/// Where Debian's containernetworking-plugins puts the CNI plugins.
pub(crate) const CNI_BIN_DIR: &str = "/usr/lib/cni";

/// A program the node runs, from `PATH` (or the absolute path given).
pub(crate) fn which(program: &str) -> Option<PathBuf> {
    let p = Path::new(program);
    if p.is_absolute() {
        return p.is_file().then(|| p.to_path_buf());
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|c| c.is_file())
}

/// The host programs a node needs, found: containerd, its runc shim, runc, ctr, iptables
/// (kube-proxy), conntrack (kube-proxy), `ip` and `mount` (kubelet), and the CNI plugins.
#[derive(Debug, Clone)]
pub(crate) struct HostTools {
    pub containerd: PathBuf,
    pub ctr: PathBuf,
    pub iptables: PathBuf,
    pub ip: PathBuf,
}

impl HostTools {
    pub fn find() -> Result<HostTools> {
        let mut missing = Vec::new();
        let mut find = |name: &str| {
            which(name).unwrap_or_else(|| {
                missing.push(name.to_string());
                PathBuf::new()
            })
        };
        let tools = HostTools {
            containerd: find("containerd"),
            ctr: find("ctr"),
            iptables: find("iptables"),
            ip: find("ip"),
        };
        for extra in [
            "containerd-shim-runc-v2",
            "runc",
            "conntrack",
            "iptables-save",
            "iptables-restore",
            "mount",
            "umount",
        ] {
            find(extra);
        }
        for plugin in ["bridge", "host-local", "portmap", "loopback"] {
            let path = Path::new(CNI_BIN_DIR).join(plugin);
            if !path.is_file() {
                missing.push(path.display().to_string());
            }
        }
        if !missing.is_empty() {
            return Err(Error::Invalid(format!(
                "a real node needs {} (missing: {}): `apt-get install {APT_PACKAGES}`",
                "containerd, runc, the CNI plugins, iptables and conntrack",
                missing.join(", ")
            )));
        }
        Ok(tools)
    }
}

/// Fails unless the process runs as root: containerd, the kubelet and kube-proxy manage
/// mounts, cgroups, network namespaces and iptables.
pub(crate) fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        Ok(())
    } else {
        Err(Error::Invalid(
            "a real node (containerd, kubelet, kube-proxy) needs root: run the test as root \
             (CI does)"
                .into(),
        ))
    }
}

/// The machine-wide lock of the real node: one at a time, because the bridge, the cgroup
/// root, kube-proxy's iptables chains and the pod CIDR are the machine's. Held until
/// dropped (the kernel releases it when the process dies).
#[derive(Debug)]
pub(crate) struct MachineLock {
    _file: File,
}

/// The lock file, beside the node directories.
pub(crate) fn lock_path() -> PathBuf {
    std::env::temp_dir().join("gpufabric-realnode.lock")
}

impl MachineLock {
    /// Takes the lock, or returns `Err(holder)` (the holder's process id, as it wrote it)
    /// while another node holds it.
    pub fn try_acquire() -> Result<std::result::Result<MachineLock, String>> {
        let path = lock_path();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io_err(format!("opening {}", path.display())))?;
        // SAFETY: flock on a file descriptor this function owns.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            return Ok(Err(holder.trim().to_string()));
        }
        let _ = file.set_len(0);
        let _ = std::fs::write(&path, format!("{}\n", std::process::id()));
        Ok(Ok(MachineLock { _file: file }))
    }

    /// Waits up to `timeout` for the lock (another test's node on this machine).
    pub async fn acquire(timeout: Duration) -> Result<MachineLock> {
        let end = Instant::now() + timeout;
        let mut logged = false;
        loop {
            let holder = match MachineLock::try_acquire()? {
                Ok(lock) => return Ok(lock),
                Err(holder) => holder,
            };
            if Instant::now() >= end {
                return Err(Error::Timeout {
                    what: format!(
                        "the real-node lock {} (held by process {holder}): one real node runs \
                         on a machine at a time",
                        lock_path().display()
                    ),
                    seconds: timeout.as_secs(),
                });
            }
            if !logged {
                tracing::info!(lock = %lock_path().display(), %holder, "waiting for another real node to stop");
                logged = true;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Kernel settings the node needs or its components change, read before and written back
/// at teardown: the kubelet sets the first six (its "kernel defaults"), the node forwards
/// pod traffic that a Service sends back out of the bridge, and kube-proxy needs bridged
/// traffic to pass iptables.
const SYSCTLS: [&str; 8] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/bridge/bridge-nf-call-iptables",
];

/// The values of [`SYSCTLS`] before the node started, also kept in a file beside the lock
/// ([`sysctls_path`]) so that a node whose test process was killed gives them back at the
/// next node's start.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sysctls(Vec<(String, String)>);

fn sysctls_path() -> PathBuf {
    std::env::temp_dir().join("gpufabric-realnode.sysctls")
}

impl Sysctls {
    /// Reads the current values (unless a killed node left its saved ones, which are the
    /// machine's own), then sets what the node needs (forwarding, bridged traffic through
    /// iptables).
    pub fn save_and_set() -> Sysctls {
        let saved = Sysctls::left_by_a_killed_node().unwrap_or_else(|| {
            Sysctls(
                SYSCTLS
                    .iter()
                    .filter_map(|k| {
                        let v = std::fs::read_to_string(Path::new("/proc/sys").join(k)).ok()?;
                        Some((k.to_string(), v.trim().to_string()))
                    })
                    .collect(),
            )
        });
        let text: String = saved.0.iter().map(|(k, v)| format!("{k}={v}\n")).collect();
        if let Err(e) = std::fs::write(sysctls_path(), text) {
            tracing::warn!(error = %e, "cannot save the kernel settings");
        }
        for (k, v) in [
            ("net/ipv4/ip_forward", "1"),
            ("net/bridge/bridge-nf-call-iptables", "1"),
        ] {
            if let Err(e) = std::fs::write(Path::new("/proc/sys").join(k), v) {
                tracing::warn!(sysctl = k, error = %e, "cannot set a kernel setting the node needs");
            }
        }
        saved
    }

    /// The values a node saved and did not give back (its process was killed).
    pub fn left_by_a_killed_node() -> Option<Sysctls> {
        let text = std::fs::read_to_string(sysctls_path()).ok()?;
        Some(Sysctls(
            text.lines()
                .filter_map(|l| l.split_once('='))
                .filter(|(k, _)| SYSCTLS.contains(k))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ))
    }

    /// Writes the saved values back and forgets them.
    pub fn restore(&self) {
        for (k, v) in &self.0 {
            let path = Path::new("/proc/sys").join(k);
            if std::fs::read_to_string(&path).is_ok_and(|now| now.trim() == v) {
                continue;
            }
            if let Err(e) = std::fs::write(&path, v) {
                tracing::warn!(sysctl = %k, error = %e, "cannot restore a kernel setting");
            }
        }
        let _ = std::fs::remove_file(sysctls_path());
    }
}
