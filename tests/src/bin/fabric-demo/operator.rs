//! The operator as its own process: started against the demo's control plane, stopped
//! with its process group at the end.

use crate::NAMESPACE;
use crate::print::{info, step};
use anyhow::{Context, bail};
use gpufabric_tests::cluster::{Cluster, log_tail};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Starts `fabric-operator run` against `cluster`, with `args` beside the demo's own (the
/// webhook's).
pub(crate) async fn start_operator(
    cluster: &Cluster,
    bin: &Path,
    args: &[String],
) -> anyhow::Result<std::process::Child> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let log = cluster.dir().join("fabric-operator.log");
    step(format!(
        "starting the operator: fabric-operator run --kubeconfig {} (log {})",
        cluster.kubeconfig_path().display(),
        log.display()
    ));
    let out = std::fs::File::create(&log)?;
    let mut cmd = Command::new(bin);
    cmd.args(["run", "--pod-namespace", NAMESPACE, "--kubeconfig"])
        .arg(cluster.kubeconfig_path())
        .args(["--admin-addr", &format!("127.0.0.1:{port}")])
        // The demo's metrics are on loopback, for the person at the terminal.
        .args(["--metrics-auth", "none"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    gpufabric_tests::process::harden(&mut cmd);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    // Give it a moment to fail fast (bad flags, no such subcommand).
    tokio::time::sleep(Duration::from_secs(2)).await;
    if let Some(status) = child.try_wait()? {
        bail!(
            "exited with {status}; last lines of {}:\n{}",
            log.display(),
            log_tail(&log, 20)
        );
    }
    info(format!(
        "running (pid {}), metrics on http://127.0.0.1:{port}/metrics",
        child.id()
    ));
    Ok(child)
}

pub(crate) fn stop(child: &mut std::process::Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}
