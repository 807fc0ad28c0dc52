//! The arguments of one rank of a test over several nodes: its group, its node and its rendezvous.

use super::{BackendArg, Choice, FleetArgs, invalid, parse_seconds};
use clap::Args;
use gpufabric_api::keys;
use gpufabric_measure::fleet::Fleet;

/// How one rank of a test over several nodes meets the others (`node-pair`, `ddp-nodes`).
#[derive(Args, Debug, Clone)]
pub struct RendezvousArgs {
    /// `host:port` of the rendezvous: rank 0 listens on it, the others connect to it.
    #[arg(long, env = keys::ENV_RENDEZVOUS, value_name = "HOST:PORT")]
    pub rendezvous: String,

    /// Name of the rendezvous group, the same on every rank (e.g. `<run>/r0/p3`).
    #[arg(long, env = keys::ENV_GROUP, value_name = "NAME")]
    pub group: String,

    /// The run's rendezvous secret, hex (at least 32 digits).
    #[arg(long, env = keys::ENV_RENDEZVOUS_SECRET, hide_env_values = true, value_name = "HEX")]
    pub secret: String,

    /// Seconds to wait for the other ranks; then the test is "not measured", naming them.
    #[arg(long, default_value = "120", value_parser = parse_seconds, value_name = "SECS")]
    pub rendezvous_timeout: std::time::Duration,
}

impl RendezvousArgs {
    /// The rendezvous of rank `rank` among `names` (the nodes, by rank); a bad secret is
    /// invalid input.
    pub fn config(
        &self,
        rank: u32,
        names: Vec<String>,
    ) -> anyhow::Result<gpufabric_measure::rendezvous::Config> {
        let secret =
            gpufabric_measure::rendezvous::Secret::from_hex(&self.secret).map_err(|e| {
                anyhow::Error::new(gpufabric_measure::CheckError::InvalidInput(e.to_string()))
            })?;
        Ok(gpufabric_measure::rendezvous::Config {
            group: self.group.clone(),
            rank,
            names,
            addr: self.rendezvous.clone(),
            secret,
            timeout: self.rendezvous_timeout,
        })
    }
}

/// What a rank of a group (`node-pair`, `ddp-nodes`) is told about itself and where its
/// document goes, beside its rank and the rendezvous.
#[derive(Args, Debug, Clone)]
pub struct RankArgs {
    /// This node's name (default: the node of this rank in --nodes).
    #[arg(long, env = keys::ENV_NODE_NAME, value_name = "NAME")]
    pub node: Option<String>,

    #[command(flatten)]
    pub fleet: FleetArgs,

    /// Seed of the `sim` backend's noise (default: the fleet file's seed).
    #[arg(long)]
    pub seed: Option<u64>,

    /// Also write the document (pretty JSON) to this file.
    #[arg(long, value_name = "PATH")]
    pub json: Option<std::path::PathBuf>,

    /// Measure even when another process holds this node's GPUs (cuda backend). Without
    /// it, such a rank ends at once with exit code 14, before meeting the others, and the
    /// test is not measured; work that starts while the rank waits or measures makes it
    /// write its document as not measured (exit code 5). See node-check --shared-gpus.
    #[arg(long, env = "FABRIC_SHARED_GPUS")]
    pub shared_gpus: bool,
}

impl RankArgs {
    /// The backend of a rank of `group` as `backend` and these arguments say.
    pub fn choice<'a>(&'a self, backend: BackendArg, group: &'a [String]) -> Choice<'a> {
        Choice {
            backend,
            fleet: &self.fleet,
            seed: self.seed,
            group,
        }
    }

    /// Refuses a `--node` (or `FABRIC_NODE_NAME`) that is not `me`, the node of `rank` in
    /// `--nodes`: a pod on one node must not measure as another.
    pub fn check_node(&self, rank: u32, me: &str) -> anyhow::Result<()> {
        match self
            .node
            .as_deref()
            .map(str::trim)
            .filter(|n| !n.is_empty())
        {
            Some(node) if node != me => Err(invalid(format!(
                "this is node {node}, but rank {rank} of --nodes is {me}"
            ))),
            _ => Ok(()),
        }
    }
}

/// The group a rank of a multi-node test (`ddp-nodes`, `nccl-nodes`) belongs to: its
/// backend, the nodes by rank, this rank and how it meets the others.
#[derive(Args, Debug, Clone)]
pub struct GroupArgs {
    /// Backend. `sim` is only used when asked for by name.
    #[arg(long, value_enum, ignore_case = true, default_value_t = BackendArg::Cuda, env = keys::ENV_BACKEND)]
    pub backend: BackendArg,

    /// The nodes of the test, by rank, comma-separated. Node count k uses the first k.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "NODE0,NODE1,...",
        required = true
    )]
    pub nodes: Vec<String>,

    /// This process's rank: its node's position in --nodes; 0 serves the rendezvous.
    #[arg(long, env = keys::ENV_RANK, value_name = "N")]
    pub rank: u32,

    /// How this rank meets the others.
    #[command(flatten)]
    pub meet: RendezvousArgs,
}

impl GroupArgs {
    /// Refuses fewer than `least` nodes, an empty or repeated name, a rank past the list and
    /// a `--node` of `me` that is not this rank's; returns this rank's node.
    pub fn check(&self, me: &RankArgs, least: usize) -> anyhow::Result<&str> {
        if self.nodes.len() < least || self.nodes.iter().any(|n| n.trim().is_empty()) {
            return Err(invalid(format!("--nodes takes {least} or more node names")));
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(dup) = self.nodes.iter().find(|n| !seen.insert(n.as_str())) {
            return Err(invalid(format!("--nodes names {dup} twice")));
        }
        let node = self.nodes.get(self.rank as usize).ok_or_else(|| {
            invalid(format!(
                "--rank {} is past the last of the {} nodes in --nodes",
                self.rank,
                self.nodes.len()
            ))
        })?;
        me.check_node(self.rank, node)?;
        Ok(node)
    }

    /// The rendezvous settings of this rank.
    pub fn config(&self) -> anyhow::Result<gpufabric_measure::rendezvous::Config> {
        self.meet.config(self.rank, self.nodes.clone())
    }

    /// The group's nodes in the sim's `fleet`, by rank (those it has).
    pub fn fleet_nodes(&self, fleet: &Fleet) -> Vec<gpufabric_measure::fleet::FleetNode> {
        self.nodes
            .iter()
            .filter_map(|n| fleet.node(n).cloned())
            .collect()
    }

    /// The exit code of a rank that did not meet the others (saying so, `what` named): a
    /// rendezvous this rank could not set up is a usage error, a rank that never came is
    /// not measured.
    pub fn unmet_exit(what: &str, e: &gpufabric_measure::rendezvous::RendezvousError) -> i32 {
        use gpufabric_measure::rendezvous::RendezvousError;
        eprintln!("fabric-agent: {what} not measured: {e}");
        match e {
            RendezvousError::Config(_) | RendezvousError::Listen { .. } => crate::exit::Exit::Usage,
            _ => crate::exit::Exit::NotMeasured,
        }
        .code()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_refuses_to_measure_as_another_node() {
        let me = |node: Option<&str>| RankArgs {
            node: node.map(String::from),
            fleet: FleetArgs::default(),
            seed: None,
            json: None,
            shared_gpus: false,
        };
        assert!(me(None).check_node(1, "gpu-02").is_ok());
        assert!(
            me(Some("  ")).check_node(1, "gpu-02").is_ok(),
            "unset downward API"
        );
        assert!(me(Some("gpu-02")).check_node(1, "gpu-02").is_ok());
        let err = me(Some("gpu-01"))
            .check_node(1, "gpu-02")
            .expect_err("another node");
        assert_eq!(
            err.to_string(),
            "invalid input: this is node gpu-01, but rank 1 of --nodes is gpu-02"
        );
    }
}
