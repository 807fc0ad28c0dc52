//! `fabric-kubelet`: the process-kubelet as a program, for the demo and for manual runs
//! against a local control plane (see `gpufabric_tests::kubelet`).

#![forbid(unsafe_code)]

use anyhow::Context;
use clap::Parser;
use gpufabric_tests::fleet::SimFleet;
use gpufabric_tests::kubelet::{ENV_STALLED_NODES, Kubelet, KubeletOptions};
use std::path::PathBuf;

/// Registers the simulated GPU nodes of a fleet file and runs the pods bound to them as
/// local processes, until Ctrl-C.
#[derive(Parser, Debug)]
#[command(name = "fabric-kubelet", version, about)]
struct Cli {
    /// Kubeconfig of the cluster (admin credentials).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Fleet description (YAML), as `gpufabric_measure::fleet::Fleet` reads it.
    #[arg(long)]
    fleet: PathBuf,
    /// Directory holding `fabric-agent` (default: this program's dir).
    #[arg(long)]
    agent_bin_dir: Option<PathBuf>,
    /// Where pod dirs (logs, termination messages) go (default: a temp dir).
    #[arg(long)]
    root_dir: Option<PathBuf>,
    /// A node that stays Ready but never starts its pods (they stay Pending); repeatable.
    #[arg(long = "stalled-node", value_name = "NAME", env = ENV_STALLED_NODES, value_delimiter = ',')]
    stalled_nodes: Vec<String>,
    /// The IP every pod of NODE gets, as host-network pods get their node's address (for
    /// pods run in a network namespace standing for the node); repeatable.
    #[arg(long = "pod-ip", value_name = "NODE=IP", value_parser = parse_pod_ip)]
    pod_ips: Vec<(String, String)>,
}

fn parse_pod_ip(s: &str) -> Result<(String, String), String> {
    let (node, ip) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NODE=IP"))?;
    ip.parse::<std::net::IpAddr>()
        .map_err(|e| format!("{s:?}: {ip:?} is not an IP address: {e}"))?;
    Ok((node.to_string(), ip.to_string()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    let fleet = SimFleet::load(&cli.fleet)?;
    let kc = kube::config::Kubeconfig::read_from(&cli.kubeconfig)
        .with_context(|| format!("reading {}", cli.kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .with_context(|| format!("loading {}", cli.kubeconfig.display()))?;
    let client = kube::Client::try_from(config)?;
    let mut opts = KubeletOptions::default();
    if let Some(d) = cli.agent_bin_dir {
        opts.agent_bin_dir = d;
    }
    opts.root_dir = cli.root_dir;
    opts.stalled_nodes = cli.stalled_nodes.into_iter().collect();
    opts.pod_ips = cli.pod_ips.into_iter().collect();
    let mut kubelet = Kubelet::start(client, &fleet, opts).await?;
    tracing::info!(
        nodes = kubelet.node_names().len(),
        "fabric-kubelet running; Ctrl-C stops it"
    );
    tokio::signal::ctrl_c().await?;
    kubelet.shutdown();
    Ok(())
}
