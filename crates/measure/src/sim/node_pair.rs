//! The sim backend's steps of a node pair ([`crate::node_pair`]): the pair from the fleet's
//! model of the network ([`crate::pairs::sim`]), this node's `gpusInUse` and `hang` faults
//! acting where the cuda backend would meet them.

use super::{gpu_use, hang};
use crate::fleet::{Fleet, FleetNode};
use crate::node_pair::{Met, PairBackend};
use crate::rendezvous::ID_BYTES;
use crate::{CheckError, Progress};
use gpufabric_api::pair::NodePairResult;
use gpufabric_api::result::{Backend, Phase};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// One rank of a node pair on the sim backend.
pub struct SimPair {
    fleet: Fleet,
    /// This rank's node in the fleet.
    node: FleetNode,
    seed: u64,
    /// How long a `hang` fault in phase `nodePair` waits, as the cuda backend's watchdog.
    timeout: Duration,
}

impl SimPair {
    /// The rank on `node` of `fleet`, with noise seeded by `seed`.
    pub fn new(fleet: Fleet, node: FleetNode, seed: u64, timeout: Duration) -> SimPair {
        SimPair {
            fleet,
            node,
            seed,
            timeout,
        }
    }
}

impl PairBackend for SimPair {
    fn kind(&self) -> Backend {
        Backend::Sim
    }

    /// The node's `gpusInUse` faults present from the start.
    fn prepare(&mut self, shared: bool, progress: Progress) -> Result<(), CheckError> {
        super::refuse_shared_gpus(&self.node, shared, progress)
    }

    /// The sim has no NCCL: random bytes take the unique id's place, so that the exchange is
    /// the one a real pair makes.
    fn make_id(&mut self) -> Result<[u8; ID_BYTES], CheckError> {
        crate::rendezvous::random_id().map_err(|e| CheckError::Other(e.to_string()))
    }

    /// The node's `gpusInUse` faults do not change while a rank waits: [`Self::prepare`]
    /// saw them.
    fn look_again(&mut self, _shared: bool) -> Result<(), CheckError> {
        Ok(())
    }

    /// The model's pair; a `hang` fault in phase `nodePair` waits the watchdog's timeout
    /// and leaves no collective (with `stuck: true`, it never returns).
    fn measure(&mut self, met: &mut Met, doc: &mut NodePairResult) -> Result<(), CheckError> {
        // No communicator to form.
        met.joined.store(true, Ordering::SeqCst);
        super::pace::spend("nodePair", &self.node.name, self.seed);
        crate::pairs::sim::measure(&self.fleet, met.opts, self.seed, doc)
            .map_err(|e| CheckError::InvalidInput(e.to_string()))?;
        if let Some(e) = hang(&self.node, Phase::NodePair, self.timeout, met.progress) {
            doc.collectives.clear();
            doc.errors.push(e);
        }
        Ok(())
    }

    /// The node's `gpusInUse` faults with `during: true` started while the pair measured.
    fn end_look(&mut self) -> Result<(), CheckError> {
        crate::gpu_use::refuse_after(&gpu_use(&self.node, false), &gpu_use(&self.node, true))
    }
}
