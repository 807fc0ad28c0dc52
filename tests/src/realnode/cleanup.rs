//! Teardown of a real node, leaving nothing on the machine: its containers and their
//! shims, every process that names the node's directory, the mounts under it (container
//! root filesystems, `/dev/shm`s, volumes, network namespaces), the pod cgroups, the CNI
//! bridge and the CNI library's cached results, kube-proxy's iptables chains, the links the
//! kubelet made in `/var/log/containers`, and the directories they created for these. The
//! same steps clean up after a node whose test process was killed (found by its
//! directory's name, at the next node's start).

use crate::process::processes_mentioning;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Prefix of every node directory's name (in the temp dir).
pub(crate) const DIR_PREFIX: &str = "gpufabric-realnode-";
/// The kubelet's `cgroupRoot`: a directory of that name in each cgroup hierarchy holds the
/// cgroups of every pod (and nothing else).
pub(crate) const CGROUP_ROOT: &str = "gpufabric-realnode";
/// The CNI bridge: the pods' gateway.
pub const BRIDGE: &str = "gpufabric0";
/// Directory where the kubelet links each container's log (hard-coded in the kubelet).
const CONTAINER_LOG_LINKS: &str = "/var/log/containers";

/// Runs a command with a deadline: its stdout when it succeeded, `None` otherwise (why is
/// logged). The output is read while it runs, so a large one cannot stall it.
fn run_quiet(cmd: &mut Command, timeout: Duration) -> Option<String> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .ok()?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(out)) if out.status.success() => {
            Some(String::from_utf8_lossy(&out.stdout).into_owned())
        }
        Ok(Ok(out)) => {
            tracing::debug!(command = ?cmd, stderr = %String::from_utf8_lossy(&out.stderr).trim(), "failed");
            None
        }
        Ok(Err(e)) => {
            tracing::debug!(command = ?cmd, error = %e, "cannot run");
            None
        }
        Err(_) => {
            if let Ok(raw) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(raw),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            tracing::warn!(command = ?cmd, "timed out");
            None
        }
    }
}

/// Deletes every container task of a running containerd (SIGKILL, then delete, so each
/// shim exits and removes its socket) and every container.
pub(crate) fn delete_containers(ctr: &Path, socket: &Path) {
    let ctr_cmd = |args: &[&str]| {
        let mut c = Command::new(ctr);
        c.arg("--address")
            .arg(socket)
            .args(["--namespace", "k8s.io"]);
        c.args(args);
        c
    };
    let list = |what: &str| -> Vec<String> {
        run_quiet(&mut ctr_cmd(&[what, "ls", "-q"]), Duration::from_secs(5))
            .map(|out| out.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default()
    };
    let tasks = list("tasks");
    if !tasks.is_empty() {
        let mut cmd = ctr_cmd(&["tasks", "delete", "--force"]);
        cmd.args(&tasks);
        run_quiet(&mut cmd, Duration::from_secs(20));
    }
    let containers = list("containers");
    if !containers.is_empty() {
        let mut cmd = ctr_cmd(&["containers", "delete"]);
        cmd.args(&containers);
        run_quiet(&mut cmd, Duration::from_secs(20));
    }
}

/// The cgroup hierarchies' mount points (`/sys/fs/cgroup/<controller>`, or
/// `/sys/fs/cgroup` itself on a cgroup v2 host).
fn cgroup_mounts() -> Vec<PathBuf> {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return Vec::new();
    };
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, point, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "cgroup" || fstype == "cgroup2").then(|| PathBuf::from(unescape(point)))
        })
        .collect()
}

/// Every cgroup at and below `root`, parents before children.
fn cgroup_tree(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
        out.push(dir);
    }
    out.sort_by_key(|p| p.components().count());
    out
}

/// Creates the kubelet's cgroup root in every hierarchy (the kubelet refuses to start
/// without it); a new cpuset cgroup gets its parent's CPUs and memory nodes.
pub(crate) fn create_cgroup_root() -> std::io::Result<()> {
    for mount in cgroup_mounts() {
        let dir = mount.join(CGROUP_ROOT);
        std::fs::create_dir_all(&dir)?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(v) = std::fs::read_to_string(mount.join(file))
                && std::fs::read_to_string(dir.join(file)).is_ok_and(|c| c.trim().is_empty())
            {
                std::fs::write(dir.join(file), v.trim())?;
            }
        }
    }
    Ok(())
}

/// The processes in the pod cgroups (every container of the node).
fn cgroup_pids() -> Vec<i32> {
    let mut pids: Vec<i32> = cgroup_mounts()
        .iter()
        .flat_map(|m| cgroup_tree(&m.join(CGROUP_ROOT)))
        .filter_map(|cg| std::fs::read_to_string(cg.join("cgroup.procs")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Kills every process in the pod cgroups and removes the cgroups.
pub(crate) fn remove_pod_cgroups() {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = cgroup_pids();
        if pids.is_empty() || Instant::now() > end {
            if !pids.is_empty() {
                tracing::warn!(?pids, "processes left in the pod cgroups");
            }
            break;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for mount in cgroup_mounts() {
        let root = mount.join(CGROUP_ROOT);
        if !root.exists() {
            continue;
        }
        let tree = cgroup_tree(&root);
        let end = Instant::now() + Duration::from_secs(5);
        // Children first; a cgroup whose last process is still exiting is busy a moment.
        for cg in tree.iter().rev() {
            while let Err(e) = std::fs::remove_dir(cg) {
                if e.kind() == std::io::ErrorKind::NotFound {
                    break;
                }
                if Instant::now() > end {
                    tracing::warn!(cgroup = %cg.display(), error = %e, "cannot remove a pod cgroup");
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// SIGKILLs every process whose command line names `dir` (containerd, its shims, the
/// kubelet, kube-proxy and kube-scheduler of a node), and waits for them to go.
pub(crate) fn kill_processes_naming(dir: &Path) {
    let needle = dir.display().to_string();
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let procs = processes_mentioning(&needle);
        if procs.is_empty() {
            return;
        }
        if Instant::now() > end {
            tracing::warn!(?procs, "processes of the node did not exit");
            return;
        }
        for (pid, _) in &procs {
            if let Ok(raw) = i32::try_from(*pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(raw),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A mount point as `/proc/self/mountinfo` writes it (`\040` for a space).
fn unescape(field: &str) -> String {
    let mut out = Vec::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(v) = u8::from_str_radix(&field[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount points at or under `dir`, deepest first.
pub(crate) fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points
}

/// Unmounts everything at or under `dir` (lazily: a mount still in use goes when its last
/// user does; network namespaces go with their last process).
pub(crate) fn unmount_under(dir: &Path) {
    for _ in 0..8 {
        let points = mounts_under(dir);
        if points.is_empty() {
            return;
        }
        for p in points {
            let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // SAFETY: umount2 with a valid NUL-terminated path.
            let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            if rc != 0 {
                tracing::debug!(mount = %p.display(), error = %std::io::Error::last_os_error(), "umount");
            }
        }
    }
    let left = mounts_under(dir);
    if !left.is_empty() {
        tracing::warn!(?left, "mounts left under the node's directory");
    }
}

/// Deletes the CNI bridge (the pods' veth ends went with their network namespaces).
pub(crate) fn delete_bridge(ip: &Path) {
    if Path::new("/sys/class/net").join(BRIDGE).exists() {
        run_quiet(
            Command::new(ip).args(["link", "delete", BRIDGE]),
            Duration::from_secs(5),
        );
    }
}

/// The chains kube-proxy makes (and the kubelet, were its chains on).
const KUBE_CHAIN_PREFIX: &str = "KUBE-";

/// `iptables-restore --noflush` input that removes every `KUBE-` chain of the ruleset
/// `save` (`iptables-save` output): per table, the jumps to them from other chains, then
/// their rules, then the chains. Empty when there are none.
pub(crate) fn kube_chain_removal(save: &str) -> String {
    let mut out = String::new();
    let mut table: Option<&str> = None;
    let (mut jumps, mut chains): (Vec<String>, Vec<&str>) = (Vec::new(), Vec::new());
    let mut flush = |table: Option<&str>, jumps: &mut Vec<String>, chains: &mut Vec<&str>| {
        if let Some(t) = table
            && !chains.is_empty()
        {
            out.push_str(&format!("*{t}\n"));
            for j in jumps.iter() {
                out.push_str(&format!("{j}\n"));
            }
            for c in chains.iter() {
                out.push_str(&format!("-F {c}\n"));
            }
            for c in chains.iter() {
                out.push_str(&format!("-X {c}\n"));
            }
            out.push_str("COMMIT\n");
        }
        jumps.clear();
        chains.clear();
    };
    for line in save.lines() {
        if let Some(t) = line.strip_prefix('*') {
            flush(table, &mut jumps, &mut chains);
            table = Some(t.trim());
        } else if let Some(rest) = line.strip_prefix(':') {
            if let Some(chain) = rest.split_whitespace().next()
                && chain.starts_with(KUBE_CHAIN_PREFIX)
            {
                chains.push(chain);
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let chain = rule.split_whitespace().next().unwrap_or_default();
            let jumps_to_kube = rule
                .split_whitespace()
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| (w[0] == "-j" || w[0] == "-g") && w[1].starts_with(KUBE_CHAIN_PREFIX));
            if !chain.starts_with(KUBE_CHAIN_PREFIX) && jumps_to_kube {
                jumps.push(format!("-D {rule}"));
            }
        }
    }
    flush(table, &mut jumps, &mut chains);
    out
}

/// Removes every `KUBE-` iptables chain (IPv4 and IPv6) and the jumps to them: what
/// kube-proxy made. (`kube-proxy --cleanup` leaves KUBE-FIREWALL, KUBE-MARK-MASQ and its
/// canaries, which it shares with the kubelet.)
pub(crate) fn remove_iptables() {
    for (save, restore) in [
        ("iptables-save", "iptables-restore"),
        ("ip6tables-save", "ip6tables-restore"),
    ] {
        let Some(text) = run_quiet(&mut Command::new(save), Duration::from_secs(10)) else {
            continue;
        };
        let removal = kube_chain_removal(&text);
        if removal.is_empty() {
            continue;
        }
        let applied = Command::new(restore)
            .arg("--noflush")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                if let Some(mut stdin) = child.stdin.take() {
                    stdin.write_all(removal.as_bytes())?;
                }
                child.wait_with_output()
            });
        match applied {
            Ok(out) if out.status.success() => {}
            Ok(out) => tracing::warn!(
                tool = restore,
                stderr = %String::from_utf8_lossy(&out.stderr).trim(),
                "cannot remove kube-proxy's iptables chains"
            ),
            Err(e) => tracing::warn!(tool = restore, error = %e, "cannot run"),
        }
    }
}

/// Removes the links the kubelet made in `/var/log/containers` to logs under `dir`.
pub(crate) fn remove_log_links(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(CONTAINER_LOG_LINKS) {
        for e in entries.flatten() {
            if std::fs::read_link(e.path()).is_ok_and(|target| target.starts_with(dir)) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Where the CNI library caches each attachment's result (hard-coded in containerd 1.6):
/// `<network>-<container id>-<interface>`, removed by a CNI DEL, which a killed sandbox
/// never gets.
const CNI_RESULTS: &str = "/var/lib/cni/results";

/// Removes the cached CNI results of the node's pods: those of its network
/// ([`super::config::CNI_NETWORK`]) and the loopback results of the same containers.
pub(crate) fn remove_cni_results() {
    let Ok(entries) = std::fs::read_dir(CNI_RESULTS) else {
        return;
    };
    let names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let ours = format!("{}-", super::config::CNI_NETWORK);
    let containers: Vec<&str> = names
        .iter()
        .filter_map(|n| n.strip_prefix(&ours))
        .filter_map(|rest| rest.split('-').next())
        .collect();
    for name in &names {
        let loopback_of_ours = name
            .strip_prefix("cni-loopback-")
            .and_then(|rest| rest.split('-').next())
            .is_some_and(|id| containers.contains(&id));
        if name.starts_with(&ours) || loopback_of_ours {
            let _ = std::fs::remove_file(Path::new(CNI_RESULTS).join(name));
        }
    }
}

/// Directories outside the node's own that its components create at fixed paths: the
/// kubelet's log links, the CNI library's cache, containerd's shim sockets. Deepest first.
const HOST_DIRS: [&str; 5] = [
    CONTAINER_LOG_LINKS,
    CNI_RESULTS,
    "/var/lib/cni",
    "/run/containerd/s",
    "/run/containerd",
];

/// The [`HOST_DIRS`] that did not exist before the node started: teardown removes them
/// once they are empty again.
#[derive(Debug, Clone, Default)]
pub(crate) struct NewHostDirs(Vec<&'static str>);

impl NewHostDirs {
    pub fn before_start() -> NewHostDirs {
        NewHostDirs(
            HOST_DIRS
                .iter()
                .copied()
                .filter(|d| !Path::new(d).exists())
                .collect(),
        )
    }

    /// Removes those that are empty (one something else wrote to stays).
    pub fn remove_empty(&self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Node directories in the temp dir, with whether each was kept on purpose (`kept` in it).
pub(crate) fn node_dirs() -> Vec<(PathBuf, bool)> {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(DIR_PREFIX))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .map(|p| {
            let kept = p.join(KEPT_MARK).exists();
            (p, kept)
        })
        .collect()
}

/// File in a node directory kept for a post-mortem (`GPUFABRIC_KEEP_CLUSTER=1`).
pub(crate) const KEPT_MARK: &str = "kept";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_with_spaces_are_decoded() {
        assert_eq!(unescape(r"/tmp/a\040b/c"), "/tmp/a b/c");
        assert_eq!(unescape("/plain"), "/plain");
    }

    #[test]
    fn kube_chains_and_the_jumps_to_them_are_removed_per_table() {
        let save = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n\
                    *filter\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\n\
                    :CNI-X - [0:0]\n-A INPUT -j KUBE-FIREWALL\n-A OUTPUT -j CNI-X\n\
                    -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
                    -A KUBE-FIREWALL -j DROP\nCOMMIT\n*raw\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n";
        assert_eq!(
            kube_chain_removal(save),
            "*mangle\n-F KUBE-PROXY-CANARY\n-X KUBE-PROXY-CANARY\nCOMMIT\n\
             *filter\n-D INPUT -j KUBE-FIREWALL\n\
             -D OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
             -F KUBE-FIREWALL\n-X KUBE-FIREWALL\nCOMMIT\n"
        );
        assert_eq!(
            kube_chain_removal("*nat\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n"),
            ""
        );
    }
}
