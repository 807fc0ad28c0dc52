//! Statuses that stay small at any fleet size: the run lists the nodes most worth a look
//! (every node's result is in its shards), the FabricTest the nodes that need attention,
//! each capped, the most important first.

use gpufabric_api::run::{NodeRunResult, NodeVerdict};
use gpufabric_api::shard::{MAX_REASON, cut};
use gpufabric_api::test::{FabricTestStatus, NodeHealth};

/// Most nodes a run status lists.
pub const MAX_NODES_IN_RUN_STATUS: usize = 100;
/// Most nodes (and most quarantined node names) a FabricTest status lists.
pub const MAX_NODES_IN_TEST_STATUS: usize = 200;
/// Most skipped nodes a run status lists.
pub const MAX_SKIPPED_IN_STATUS: usize = 100;

/// Lower is more worth a look: bad verdicts, then not measured, then unfinished, then passed.
fn run_rank(n: &NodeRunResult) -> u8 {
    match n.verdict {
        NodeVerdict::Failed | NodeVerdict::Errored | NodeVerdict::Timeout => 0,
        NodeVerdict::NotMeasured => 1,
        NodeVerdict::Running => 2,
        NodeVerdict::Pending => 3,
        NodeVerdict::Passed => 4,
    }
}

/// The nodes a run status lists: at most [`MAX_NODES_IN_RUN_STATUS`], the worst first
/// (ties in the run's order), listed in the run's order. Every node of a smaller run.
/// Texts are cut as in the shards.
pub fn nodes_for_run_status(nodes: &[NodeRunResult]) -> Vec<NodeRunResult> {
    let mut kept = keep_in_order(nodes, MAX_NODES_IN_RUN_STATUS, run_rank);
    for n in &mut kept {
        for text in [&mut n.reason, &mut n.finding].into_iter().flatten() {
            cut(text, MAX_REASON);
        }
        // Node-pair records stay in the shards.
        n.pairs.clear();
    }
    kept
}

/// Lower needs attention sooner: the node's standing says
/// ([`gpufabric_api::standing::Standing::attention`]).
fn health_rank(h: &NodeHealth) -> u8 {
    h.standing.attention()
}

/// Cuts a FabricTest status to its bounds: at most [`MAX_NODES_IN_TEST_STATUS`] node
/// histories, those that need attention first, with `nodesNotListed` counting the rest, and
/// at most as many quarantined names (`quarantinedCount` stays exact). Dropping a failing
/// node's streak only delays its cordon; quarantined nodes are dropped last.
pub fn bound_test_status(status: &mut FabricTestStatus) {
    let total = status.nodes.len();
    status.nodes = keep_in_order(&status.nodes, MAX_NODES_IN_TEST_STATUS, health_rank);
    for h in &mut status.nodes {
        for text in [&mut h.held_back, &mut h.last_finding]
            .into_iter()
            .flatten()
        {
            cut(text, MAX_REASON);
        }
    }
    status.nodes_not_listed = (total - status.nodes.len()) as u32;
    status.quarantined_nodes.truncate(MAX_NODES_IN_TEST_STATUS);
}

/// The `max` items of lowest rank (ties by position), in their original order.
fn keep_in_order<T: Clone>(items: &[T], max: usize, rank: impl Fn(&T) -> u8) -> Vec<T> {
    if items.len() <= max {
        return items.to_vec();
    }
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (rank(&items[i]), i));
    order.truncate(max);
    order.sort_unstable();
    order.into_iter().map(|i| items[i].clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(i: usize, v: NodeVerdict) -> NodeRunResult {
        NodeRunResult {
            node: format!("n{i:05}"),
            verdict: v,
            ..Default::default()
        }
    }

    #[test]
    fn a_small_run_lists_every_node_in_its_order() {
        let nodes: Vec<_> = (0..50).map(|i| node(i, NodeVerdict::Passed)).collect();
        assert_eq!(nodes_for_run_status(&nodes), nodes);
    }

    #[test]
    fn a_large_run_lists_its_bad_nodes_before_passing_ones() {
        let mut nodes: Vec<_> = (0..5000).map(|i| node(i, NodeVerdict::Passed)).collect();
        for i in [4999, 17, 2500] {
            nodes[i].verdict = NodeVerdict::Failed;
        }
        nodes[3000].verdict = NodeVerdict::NotMeasured;
        let kept = nodes_for_run_status(&nodes);
        assert_eq!(kept.len(), MAX_NODES_IN_RUN_STATUS);
        let names: Vec<&str> = kept.iter().map(|n| n.node.as_str()).collect();
        for bad in ["n04999", "n00017", "n02500", "n03000"] {
            assert!(names.contains(&bad), "{bad} missing");
        }
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted, "kept in the run's order");
    }

    use gpufabric_api::standing::Standing;

    fn health(i: usize, verdict: NodeVerdict, quarantined: bool) -> NodeHealth {
        NodeHealth {
            node: format!("n{i:05}"),
            verdict,
            consecutive_failures: u32::from(verdict.is_bad()),
            consecutive_passes: u32::from(verdict == NodeVerdict::Passed),
            standing: if quarantined {
                Standing::Quarantined { hardware: false }
            } else if verdict.is_bad() {
                Standing::Suspect
            } else {
                Standing::Passing
            },
            quarantined_since: None,
            held_back: None,
            last_finding: None,
            last_run: None,
            ..Default::default()
        }
    }

    #[test]
    fn the_test_status_keeps_quarantined_then_failing_nodes() {
        let mut status = FabricTestStatus {
            nodes: (0..10_000)
                .map(|i| health(i, NodeVerdict::Passed, false))
                .collect(),
            ..Default::default()
        };
        // 150 failing, 100 quarantined (passing again): 250 need attention, 200 fit.
        for i in 0..150 {
            status.nodes[i * 7] = health(i * 7, NodeVerdict::Failed, false);
        }
        for i in 0..100 {
            status.nodes[5000 + i] = health(5000 + i, NodeVerdict::Passed, true);
            status.quarantined_nodes.push(format!("n{:05}", 5000 + i));
        }
        bound_test_status(&mut status);
        assert_eq!(status.nodes.len(), MAX_NODES_IN_TEST_STATUS);
        assert_eq!(status.nodes_not_listed, 10_000 - 200);
        assert_eq!(
            status
                .nodes
                .iter()
                .filter(|h| h.standing.is_quarantined())
                .count(),
            100
        );
        assert_eq!(
            status.nodes.iter().filter(|h| h.verdict.is_bad()).count(),
            100
        );
        assert_eq!(status.quarantined_nodes.len(), 100);
    }
}
