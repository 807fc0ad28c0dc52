//! Setting up: building what is missing, starting the control plane, registering the
//! simulated fleet's nodes with the process-kubelet, and showing kubectl's view of them.

use crate::Cli;
use crate::print::{info, step};
use anyhow::{Context, bail};
use gpufabric_api::keys;
use gpufabric_tests::cluster::{Cluster, ClusterOptions, ENV_BIN};
use gpufabric_tests::fleet::SimFleet;
use gpufabric_tests::kubelet::{Kubelet, KubeletOptions};
use gpufabric_tests::workspace_root;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Builds what is missing, starts the control plane and registers the simulated fleet's
/// nodes with the process-kubelet; returns once they are Ready.
pub(crate) async fn bring_up(
    cli: &Cli,
    bins: &Path,
) -> anyhow::Result<(Cluster, SimFleet, Kubelet)> {
    let control_plane = if cli.no_build { None } else { build(bins)? };

    step("starting the control plane (etcd, kube-apiserver, kube-controller-manager)");
    let cluster = Cluster::start_with(ClusterOptions {
        bin_dir: control_plane,
        ..Default::default()
    })
    .await
    .context("starting the control plane")?;
    info(format!(
        "up in {:.1}s at {}, dir {}",
        cluster.startup_time().as_secs_f64(),
        cluster.server(),
        cluster.dir().display()
    ));

    // The agents read a copy in the cluster's dir: the demo repairs a node by rewriting it,
    // and never changes the file it was given.
    let given = match cli.fleet.clone().or_else(SimFleet::shipped_demo_file) {
        Some(path) => SimFleet::load(&path)?.fleet().clone(),
        None => SimFleet::demo(),
    };
    let fleet = SimFleet::write_to(given, cluster.dir().join("fleet.yaml"))?;
    let faulty: Vec<String> = fleet
        .fleet()
        .nodes
        .iter()
        .filter(|n| !n.faults.is_empty())
        .map(|n| format!("{} {:?}", n.name, n.faults))
        .collect();
    step(format!(
        "registering {} simulated GPU nodes from {}",
        fleet.fleet().nodes.len(),
        fleet.path().display()
    ));
    for f in &faulty {
        info(format!("injected fault: {f}"));
    }
    let kubelet = Kubelet::start(
        cluster.client(),
        &fleet,
        KubeletOptions {
            agent_bin_dir: bins.to_path_buf(),
            ..Default::default()
        },
    )
    .await?;
    let nodes: Api<Node> = Api::all(cluster.client());
    let n = wait_nodes_ready(&nodes, kubelet.node_names().len()).await?;
    kubectl(
        &cluster,
        &[
            "get",
            "nodes",
            "-L",
            keys::LABEL_GPU_PRODUCT,
            "-L",
            keys::LABEL_GPU_COUNT,
        ],
    );
    step(format!("control plane up with {n} GPU nodes"));
    Ok((cluster, fleet, kubelet))
}

/// Builds the control-plane binaries and the programs of this workspace (the agent, the
/// operator, the kubectl plugin that writes the report) with `cargo build --workspace
/// --bins`, the command tests/run.sh builds them with: one feature set for every dependency,
/// the one this program was built with (tests/Cargo.toml), so nothing is compiled twice and a
/// second demo compiles nothing.
/// Returns the control-plane bin dir when it built (or found) it.
fn build(bins: &Path) -> anyhow::Result<Option<PathBuf>> {
    step("building (or reusing) the control-plane binaries: tests/cluster/build.sh");
    let mut control_plane = None;
    if std::env::var_os(ENV_BIN).is_none() {
        let out = Command::new("bash")
            .arg(workspace_root().join("tests/cluster/build.sh"))
            .stderr(Stdio::inherit())
            .output()
            .context("running tests/cluster/build.sh")?;
        if !out.status.success() {
            bail!("tests/cluster/build.sh failed");
        }
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
        info(format!("binaries in {dir}"));
        control_plane = Some(PathBuf::from(dir));
    }
    step("cargo build --workspace --bins (fabric-agent, fabric-operator, kubectl-gpufabric)");
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo
        .args(["build", "-q", "--workspace", "--bins"])
        .current_dir(workspace_root());
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_run) {
            cargo.env_remove(name);
        }
    }
    let status = cargo.status();
    match status {
        Ok(s) if s.success() => {}
        _ => info(format!(
            "the build failed; using what is in {} if anything",
            bins.display()
        )),
    }
    Ok(control_plane)
}

/// Whether `name` is a variable `cargo run` set for this program (its package's name, version,
/// manifest dir and the like). A nested build must not see them: build scripts that watch
/// them (ring's watches CARGO_PKG_NAME and CARGO_MANIFEST_DIR) would run again, and everything
/// above them be compiled again, in this build and in the next one from a shell. The user's
/// own settings (CARGO_TARGET_DIR, CARGO_HOME, CARGO_INCREMENTAL, ...) stay.
fn set_by_cargo_run(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "OUT_DIR"
        )
}

async fn wait_nodes_ready(nodes: &Api<Node>, want: usize) -> anyhow::Result<usize> {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let list = nodes.list(&ListParams::default()).await?;
        let ready = list
            .items
            .iter()
            .filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        if ready >= want {
            return Ok(ready);
        }
        if Instant::now() > end {
            bail!("only {ready} of {want} nodes Ready after 60s");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

pub(crate) fn kubectl(cluster: &Cluster, args: &[&str]) {
    match cluster.kubectl().args(args).output() {
        Ok(out) => {
            print!("{}", String::from_utf8_lossy(&out.stdout));
            let err = String::from_utf8_lossy(&out.stderr);
            if !err.trim().is_empty() {
                print!("{err}");
            }
        }
        Err(e) => info(format!("kubectl: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::set_by_cargo_run;

    #[test]
    fn a_nested_build_drops_what_cargo_run_set_and_keeps_the_users_cargo_settings() {
        for set in [
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_BIN_NAME",
        ] {
            assert!(set_by_cargo_run(set), "{set}");
        }
        for kept in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "CARGO_BUILD_JOBS",
            "RUSTFLAGS",
            "PATH",
        ] {
            assert!(!set_by_cargo_run(kept), "{kept}");
        }
    }
}
