//! What the fleet comparison needs from one measured node: its values by series, and the
//! series its own rules already judged. The per-node rules fill it; `compare.rs` reads it.

use gpufabric_api::findings::Metric;
use gpufabric_api::suite::Collective;
use std::collections::{BTreeMap, BTreeSet};

/// A value of one node that the fleet comparison looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct SeriesKey {
    pub(super) metric: Metric,
    pub(super) collective: Option<Collective>,
    pub(super) gpu: Option<u32>,
    /// Second GPU, for a GPU pair compared across nodes.
    pub(super) peer: Option<u32>,
}

impl SeriesKey {
    /// The node-wide value of `metric` (no collective, GPU or peer).
    pub(super) fn of_node(metric: Metric) -> SeriesKey {
        SeriesKey {
            metric,
            collective: None,
            gpu: None,
            peer: None,
        }
    }
}

/// What the fleet comparison needs from one measured node.
#[derive(Debug)]
pub(super) struct NodeStats {
    pub(super) node: String,
    /// Normalized product and GPU count: nodes compare only within the same group.
    pub(super) group: (String, u32),
    pub(super) product: String,
    pub(super) values: BTreeMap<SeriesKey, f64>,
    /// Series already judged on this node by a threshold or a profile floor.
    pub(super) judged: BTreeSet<SeriesKey>,
    /// Whether the sweep's small sizes were timed with CUDA graphs (`graphLaunches` > 0),
    /// not host-launched calls that move with the launching CPU's speed.
    pub(super) graph_timed: bool,
}
