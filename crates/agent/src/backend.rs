//! The one place `--backend` is read: each measuring subcommand gets its backend (the cuda
//! backend, or the sim backend of the fleet file's node) once, before it runs, and a
//! simulated node's process faults act here.

use crate::args::{BackendArg, Choice, FleetArgs, invalid};
use crate::output::progress;
use gpufabric_api::ResultDocument;
use gpufabric_api::pair::NodePairResult;
use gpufabric_measure::fleet::{Fleet, FleetNode};
use gpufabric_measure::sim::{self, ProcessFault};

/// A subcommand that measures: what it needs to build its backend either way.
pub trait Measures {
    /// What it measures with (the measure crate's backend trait).
    type Backend: ?Sized;
    /// The subcommand, as the progress line names it.
    const NAME: &'static str;
    /// The flag that names the nodes, for a node the fleet lacks.
    const NODES_FLAG: &'static str;

    /// What the command line says of the backend.
    fn choice(&self) -> Choice<'_>;
    /// The cuda backend.
    fn cuda(&self) -> anyhow::Result<Box<Self::Backend>>;
    /// The sim backend of `node` in `fleet`.
    fn sim(&self, fleet: Fleet, node: FleetNode, seed: u64) -> anyhow::Result<Box<Self::Backend>>;
}

/// The backend a subcommand runs on, as `--backend` chose it.
pub enum Chosen<B: ?Sized> {
    /// Measure with `backend`; with `garbage` (a sim fault, node-check's to act on), write a
    /// truncated document.
    Measure { backend: Box<B>, garbage: bool },
    /// A simulated crash: the exit code, nothing written.
    Crashed(i32),
}

/// The backend of `cmd` on `node`: the cuda backend, or the sim backend of the fleet
/// file's `node` (the group's nodes must be in the fleet too), unless a process fault of
/// that node acts first.
pub fn choose<M: Measures>(cmd: &M, node: &str) -> anyhow::Result<Chosen<M::Backend>> {
    let choice = cmd.choice();
    if choice.backend == BackendArg::Cuda {
        progress(&format!("{} on {node} with the cuda backend", M::NAME));
        return Ok(Chosen::Measure {
            backend: cmd.cuda()?,
            garbage: false,
        });
    }
    let (source, fleet) = choice.fleet.load()?;
    let missing = std::iter::once(node)
        .chain(choice.group.iter().map(String::as_str))
        .find(|n| fleet.node(n).is_none());
    let fleet_node = match (missing, fleet.node(node)) {
        (None, Some(found)) => found.clone(),
        (missing, _) => {
            let known: Vec<&str> = fleet.nodes.iter().map(|n| n.name.as_str()).collect();
            return Err(invalid(format!(
                "node {:?} is not in {source} (it has: {}); pass {} with them",
                missing.unwrap_or(node),
                known.join(", "),
                M::NODES_FLAG
            )));
        }
    };
    if let Some(code) = sim::stop_fault(&fleet_node) {
        crate::stop::crash_on_stop(code);
    }
    let garbage = match sim::process_fault(&fleet_node) {
        Some(ProcessFault::Crash { exit_code }) => {
            eprintln!(
                "fabric-agent: simulated crash of node {node} (fault in {source}): exiting with code {exit_code}"
            );
            return Ok(Chosen::Crashed(exit_code));
        }
        Some(ProcessFault::Garbage) => true,
        None => false,
    };
    let seed = choice.seed.unwrap_or(fleet.seed);
    if let Some(text) = &choice.fleet.sim_pace {
        let pace = sim::pace::Pace::parse(text).map_err(|e| invalid(e.to_string()))?;
        sim::pace::set(pace);
    }
    progress(&format!(
        "{} on {node} with the sim backend ({source}, seed {seed})",
        M::NAME
    ));
    Ok(Chosen::Measure {
        backend: cmd.sim(fleet, fleet_node, seed)?,
        garbage,
    })
}

/// The wrong elements the hidden `--sim-wrong-elements` asks the sim backend for; none with
/// the cuda backend, whose values are what the GPUs computed.
fn sim_wrong_elements(fleet: &FleetArgs, backend: BackendArg) -> Option<u64> {
    fleet
        .sim_wrong_elements
        .filter(|n| backend == BackendArg::Sim && *n > 0)
}

/// Adds the sim's wrong elements (`--sim-wrong-elements`) to the first size of the node
/// check's first collective, as a corrupting link would show them.
pub fn add_sim_wrong_elements(fleet: &FleetArgs, backend: BackendArg, doc: &mut ResultDocument) {
    let Some(n) = sim_wrong_elements(fleet, backend) else {
        return;
    };
    if let Some(row) = doc
        .nccl
        .as_mut()
        .and_then(|s| s.collectives.first_mut())
        .and_then(|c| c.rows.first_mut())
    {
        row.out_of_place.wrong += n;
    }
}

/// Adds the sim's wrong elements (`--sim-wrong-elements`) to a node pair's first collective.
pub fn add_sim_wrong_elements_to_pair(
    fleet: &FleetArgs,
    backend: BackendArg,
    doc: &mut NodePairResult,
) {
    if let (Some(n), Some(c)) = (
        sim_wrong_elements(fleet, backend),
        doc.collectives.first_mut(),
    ) {
        c.wrong += n;
    }
}
