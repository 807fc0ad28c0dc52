//! Each node's standing in the test, decided once when a run is folded, after the
//! quarantine plan was carried out and the lifecycle ran: what every reader reads.

use gpufabric_api::run::{NodeRunResult, NodeVerdict};
use gpufabric_api::standing::Facts;
use gpufabric_api::test::{FabricTestStatus, NodeHealth};
use std::collections::{BTreeMap, BTreeSet};

/// What a folded run's plan said beyond the status: the nodes a confirmation run retests,
/// whether the breaker is open, and which nodes carry the validation gate.
pub struct Settle<'a> {
    pub failures_to_quarantine: u32,
    pub confirm: &'a [String],
    pub breaker_open: bool,
    pub gated: &'a dyn Fn(&str) -> bool,
}

/// The test's own lists the executor and the lifecycle wrote in this fold: the nodes it
/// holds in quarantine and the repeat offenders among them.
struct Held<'a> {
    quarantined: BTreeSet<&'a str>,
    repeat_offenders: BTreeSet<&'a str>,
}

impl Settle<'_> {
    fn facts(&self, h: &NodeHealth, held: &Held, hardware: bool) -> Facts {
        let quarantined = held.quarantined.contains(h.node.as_str());
        Facts {
            quarantined,
            repeat_offender: held.repeat_offenders.contains(h.node.as_str()),
            held_back: h.held_back.clone(),
            confirmed: !self.breaker_open
                && !self.confirm.contains(&h.node)
                && (quarantined || h.consecutive_failures >= self.failures_to_quarantine.max(1)),
            hardware,
            gated: (self.gated)(&h.node),
            gpus_out: h.tainted_gpus.iter().map(|g| g.gpu).collect(),
        }
    }
}

/// Sets the standing of every node in `status` from the run's `results` and the test's
/// `quarantinedNodes` and `repeatOffenders` as the executor and the lifecycle left them (a
/// node the run did not measure, or did not test, keeps what a measurement said; a
/// quarantine the plan ended ends). Pure.
pub fn settle(status: &mut FabricTestStatus, results: &[NodeRunResult], s: &Settle) {
    let verdicts: BTreeMap<&str, &NodeRunResult> =
        results.iter().map(|r| (r.node.as_str(), r)).collect();
    let held = Held {
        quarantined: status
            .quarantined_nodes
            .iter()
            .map(String::as_str)
            .collect(),
        repeat_offenders: status.repeat_offenders.iter().map(String::as_str).collect(),
    };
    for h in &mut status.nodes {
        let entry = verdicts.get(h.node.as_str()).copied();
        let verdict = entry.map_or(NodeVerdict::NotMeasured, |r| r.verdict);
        let hardware = entry.is_some_and(|r| {
            r.hardware_fault.is_some()
                || matches!(r.verdict, NodeVerdict::Errored | NodeVerdict::Timeout)
        });
        let facts = s.facts(h, &held, hardware);
        h.standing = match verdict {
            NodeVerdict::Passed => h.standing.on_pass(&facts),
            v if v.is_bad() => h.standing.on_failure(&facts),
            _ => h.standing.on_not_measured(&facts),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::standing::Standing;

    fn health(node: &str, failures: u32) -> NodeHealth {
        NodeHealth {
            node: node.into(),
            consecutive_failures: failures,
            ..Default::default()
        }
    }

    fn result(node: &str, verdict: NodeVerdict) -> NodeRunResult {
        NodeRunResult {
            node: node.into(),
            verdict,
            ..Default::default()
        }
    }

    #[test]
    fn a_fold_decides_each_nodes_standing_once_from_the_plan_and_the_run() {
        let mut status = FabricTestStatus {
            nodes: vec![
                health("passed", 0),
                health("first-failure", 1),
                health("confirmed", 2),
                health("awaiting", 2),
                health("cordoned", 2),
                health("busy", 2),
                health("gated", 0),
            ],
            quarantined_nodes: vec!["cordoned".into()],
            ..Default::default()
        };
        status.nodes[5].standing = Standing::Failing { hardware: false };
        let mut hung = result("confirmed", NodeVerdict::Timeout);
        hung.reason = Some("hung in all_reduce".into());
        let results = [
            result("passed", NodeVerdict::Passed),
            result("first-failure", NodeVerdict::Failed),
            hung,
            result("awaiting", NodeVerdict::Failed),
            result("cordoned", NodeVerdict::Failed),
            result("busy", NodeVerdict::NotMeasured),
            result("gated", NodeVerdict::NotMeasured),
        ];
        let confirm = vec!["awaiting".to_string()];
        settle(
            &mut status,
            &results,
            &Settle {
                failures_to_quarantine: 2,
                confirm: &confirm,
                breaker_open: false,
                gated: &|n: &str| n == "gated",
            },
        );
        let got: Vec<(&str, Standing)> = status
            .nodes
            .iter()
            .map(|h| (h.node.as_str(), h.standing.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("passed", Standing::Passing),
                ("first-failure", Standing::Suspect),
                ("confirmed", Standing::Failing { hardware: true }),
                ("awaiting", Standing::Suspect),
                ("cordoned", Standing::Quarantined { hardware: false }),
                ("busy", Standing::Failing { hardware: false }),
                ("gated", Standing::Gated),
            ]
        );
    }

    #[test]
    fn a_node_the_test_holds_reads_quarantined_whatever_the_run_said_of_it() {
        let mut status = FabricTestStatus {
            nodes: vec![health("kept", 2), health("again", 2), health("freed", 0)],
            quarantined_nodes: vec!["kept".into(), "again".into()],
            repeat_offenders: vec!["again".into()],
            ..Default::default()
        };
        status.nodes[0].standing = Standing::Failing { hardware: true };
        status.nodes[2].standing = Standing::Quarantined { hardware: false };
        let not_measured = |n: &str| result(n, NodeVerdict::NotMeasured);
        settle(
            &mut status,
            &[not_measured("kept"), result("again", NodeVerdict::Passed)],
            &Settle {
                failures_to_quarantine: 2,
                confirm: &[],
                breaker_open: false,
                gated: &|_: &str| false,
            },
        );
        let got: Vec<&Standing> = status.nodes.iter().map(|h| &h.standing).collect();
        assert_eq!(
            got,
            [
                &Standing::Quarantined { hardware: true },
                &Standing::RepeatOffender,
                &Standing::NotMeasured,
            ]
        );
    }

    #[test]
    fn with_the_breaker_open_no_failure_is_confirmed() {
        let mut status = FabricTestStatus {
            nodes: vec![health("n", 5)],
            ..Default::default()
        };
        settle(
            &mut status,
            &[result("n", NodeVerdict::Failed)],
            &Settle {
                failures_to_quarantine: 1,
                confirm: &[],
                breaker_open: true,
                gated: &|_: &str| false,
            },
        );
        assert_eq!(status.nodes[0].standing, Standing::Suspect);
    }
}
