//! Command-line arguments of `fabric-agent`: the backend and sim fleet every subcommand shares.

mod group;
mod node_check;
mod parse;

pub use group::{GroupArgs, RankArgs, RendezvousArgs};
pub use node_check::NodeCheckArgs;
pub use parse::{
    parse_blocking, parse_collective, parse_data_type, parse_op, parse_seconds, parse_size,
    parse_switch,
};

use clap::{Args, ValueEnum};
use gpufabric_api::keys;
use gpufabric_measure::fleet::{Fleet, FleetSource};
use std::path::PathBuf;

/// Which backend measures.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendArg {
    /// Real GPUs through CUDA, NCCL, cuBLAS and NVML.
    Cuda,
    /// A model of a node described in a fleet file (for machines without GPUs).
    Sim,
}

/// What a subcommand's command line says of its backend.
pub struct Choice<'a> {
    /// `--backend`.
    pub backend: BackendArg,
    /// Where the sim fleet comes from.
    pub fleet: &'a FleetArgs,
    /// The seed that overrides the fleet's own.
    pub seed: Option<u64>,
    /// The other nodes the sim fleet must hold (a group's nodes; none for one node).
    pub group: &'a [String],
}

/// The fleet the `sim` backend simulates: a file, or the document itself.
#[derive(Args, Debug, Clone, Default)]
pub struct FleetArgs {
    /// Fleet description (YAML or JSON) the `sim` backend simulates; `sim` needs it or
    /// --fleet-doc.
    #[arg(long, env = keys::ENV_SIM_FLEET, value_name = "PATH")]
    pub fleet: Option<PathBuf>,

    /// The fleet description itself (YAML or JSON) instead of a file: how a benchmark pod
    /// gets one, from a ConfigMap key through the FabricTest's spec.agent.env.
    #[arg(
        long,
        env = keys::ENV_SIM_FLEET_DOC,
        value_name = "YAML",
        conflicts_with = "fleet",
        hide_env_values = true
    )]
    pub fleet_doc: Option<String>,

    /// Sim backend only: wrong elements to add to the first collective measured, whose
    /// values the sim otherwise always gets right (to see what wrong values do: exit code
    /// 4, the #wrong column, the findings).
    #[arg(long, env = "FABRIC_SIM_WRONG_ELEMENTS", hide = true, value_name = "N")]
    pub sim_wrong_elements: Option<u64>,

    /// Sim backend only: how long the simulated work lasts, slept in real time: `h200` (the
    /// default suite's times on a 4 x H200 node: a node check of 22-27 s), `none`, or a
    /// document, e.g. `{phases: {ncclSweep: 10}, nodePair: 13, ddpNodes: 12, spread: 0.1}`.
    /// Absent: every phase ends at once.
    #[arg(long, env = keys::ENV_SIM_PACE, value_name = "PROFILE|YAML")]
    pub sim_pace: Option<String>,
}

impl FleetArgs {
    /// Where the fleet comes from; an input error when neither is given.
    pub fn source(&self) -> anyhow::Result<FleetSource> {
        match (&self.fleet, &self.fleet_doc) {
            (Some(path), _) => Ok(FleetSource::File(path.clone())),
            (None, Some(doc)) => Ok(FleetSource::Document(doc.clone())),
            (None, None) => Err(anyhow::Error::new(
                gpufabric_measure::CheckError::InvalidInput(format!(
                    "the sim backend needs a fleet: pass --fleet PATH (or set {}) or --fleet-doc YAML (or set {})",
                    keys::ENV_SIM_FLEET,
                    keys::ENV_SIM_FLEET_DOC
                )),
            )),
        }
    }

    /// The fleet, read and checked.
    pub fn load(&self) -> anyhow::Result<(FleetSource, Fleet)> {
        let source = self.source()?;
        let fleet = source.load().map_err(|e| {
            anyhow::Error::new(gpufabric_measure::CheckError::InvalidInput(e.to_string()))
        })?;
        Ok((source, fleet))
    }
}

/// An error of the arguments (exit code 2).
pub fn invalid(message: String) -> anyhow::Error {
    anyhow::Error::new(gpufabric_measure::CheckError::InvalidInput(message))
}
