//! `validate()`: every rule of the CRD schema again (so a test created before a schema change
//! still gets a clear error), plus what the schema cannot express: schedules that never
//! fire, time zones, node selectors no node can carry, duplicate collectives, and suites
//! that cannot finish within the agent's timeout. The operator calls it before it acts on a
//! FabricTest, and its admission webhook before the API server stores one; `warnings()`
//! says what is allowed but likely to go wrong.

mod agent;
pub mod estimate;
pub mod labels;
pub mod memory;
mod schedule;
mod suite;
mod thresholds;

pub use agent::ANNOTATIONS_MAX_BYTES;
pub use schedule::{ScheduleError, parse_schedule, parse_time_zone};
pub use suite::MAX_GRAPH_LAUNCHES;

use crate::test::FabricTestSpec;
use agent::check_quarantine_and_agent;
use estimate::{TYPICAL, estimate, seconds};
use suite::check_suite;
use thresholds::{check_bandwidth_reach, check_copy_reach, check_thresholds};

/// One problem with a FabricTest spec: the field (as a JSON path under `spec`) and what is
/// wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub field: String,
    pub message: String,
}

/// All problems found in a spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid FabricTest: {}", .problems.iter().map(|p| format!("{}: {}", p.field, p.message)).collect::<Vec<_>>().join("; "))]
pub struct ValidationError {
    pub problems: Vec<Problem>,
}

struct Checker {
    problems: Vec<Problem>,
}

impl Checker {
    fn check(&mut self, ok: bool, field: &str, message: impl FnOnce() -> String) {
        if !ok {
            self.problems.push(Problem {
                field: field.to_string(),
                message: message(),
            });
        }
    }
}

/// Checks a FabricTest spec. Returns every problem at once, each with its field.
pub fn validate(spec: &FabricTestSpec) -> Result<(), ValidationError> {
    let mut c = Checker {
        problems: Vec::new(),
    };
    check_when_and_where(&mut c, spec);
    check_suite(&mut c, spec);
    check_thresholds(&mut c, &spec.thresholds);
    check_bandwidth_reach(&mut c, spec);
    check_copy_reach(&mut c, spec);
    check_quarantine_and_agent(&mut c, spec);
    check_limits(&mut c, spec);
    if c.problems.is_empty() {
        Ok(())
    } else {
        Err(ValidationError {
            problems: c.problems,
        })
    }
}

/// What is allowed but likely to go wrong, one sentence each: a suite whose typical time
/// on a node comes close to `agent.timeoutSeconds` (see [`estimate`]).
pub fn warnings(spec: &FabricTestSpec) -> Vec<String> {
    let mut said = suite_warnings(spec);
    if let Some(d) = spec.limits.max_duration_seconds
        && d < spec.agent.timeout_seconds
    {
        said.push(format!(
            "limits.maxDurationSeconds ({d} s) is below agent.timeoutSeconds ({} s): a run may stop before its slowest node is done, and that node is not measured",
            spec.agent.timeout_seconds
        ));
    }
    said
}

fn suite_warnings(spec: &FabricTestSpec) -> Vec<String> {
    let timeout = f64::from(spec.agent.timeout_seconds);
    let typical = estimate(&spec.suite, &TYPICAL);
    let total = typical.total_s();
    let said = format!(
        "suite: estimated at {} on {} ({})",
        seconds(total),
        TYPICAL.name,
        typical.breakdown()
    );
    if total > timeout {
        vec![format!(
            "{said}, more than agent.timeoutSeconds ({timeout} s): the benchmark pods will likely time out; lower the suite's sizes, iterations or steps, or raise agent.timeoutSeconds"
        )]
    } else if total > timeout / 2.0 {
        vec![format!(
            "{said}, over half of agent.timeoutSeconds ({timeout} s): a slow pod start or a slower node may time out"
        )]
    } else {
        Vec::new()
    }
}

fn check_when_and_where(c: &mut Checker, spec: &FabricTestSpec) {
    if let Some(schedule) = &spec.schedule
        && let Err(e) = parse_schedule(schedule)
    {
        c.check(false, "schedule", || e.to_string());
    }
    if let Err(e) = parse_time_zone(spec.time_zone.as_deref()) {
        c.check(false, "timeZone", || e.to_string());
    }
    for (key, value) in &spec.node_selector {
        if let Some(p) = labels::label_key_problem(key) {
            c.check(false, "nodeSelector", || p);
        }
        if let Some(p) = labels::label_value_problem(value) {
            c.check(false, &format!("nodeSelector[{key}]"), || p);
        }
    }
    if let Some(nodes) = &spec.nodes {
        c.check(!nodes.is_empty(), "nodes", || {
            "nodes must not be empty when set; remove it to use the nodeSelector alone".into()
        });
        c.check(nodes.iter().all(|n| !n.trim().is_empty()), "nodes", || {
            "node names must not be empty".into()
        });
        for name in nodes.iter().filter(|n| !n.trim().is_empty()) {
            if let Some(p) = labels::node_name_problem(name) {
                c.check(false, "nodes", || p);
            }
        }
    }
    if let Some(d) = spec.starting_deadline_seconds {
        c.check(d >= 1, "startingDeadlineSeconds", || {
            format!("must be at least 1 (got {d})")
        });
    }
    if let Some(w) = spec.wait_for_busy_nodes_seconds {
        c.check((1..=86_400).contains(&w), "waitForBusyNodesSeconds", || {
            format!("must be 1 to 86400 (got {w})")
        });
        c.check(!spec.include_busy_nodes, "waitForBusyNodesSeconds", || {
            "has no effect with includeBusyNodes (busy nodes are then tested at once): set one of the two".into()
        });
    }
}

/// `spec.limits`: a run tests at least one node and runs 10 s to a week.
fn check_limits(c: &mut Checker, spec: &FabricTestSpec) {
    if let Some(n) = spec.limits.max_nodes {
        c.check(n >= 1, "limits.maxNodes", || {
            format!("must be at least 1 (got {n}); remove it for no limit")
        });
    }
    if let Some(d) = spec.limits.max_duration_seconds {
        c.check(
            (10..=604_800).contains(&d),
            "limits.maxDurationSeconds",
            || format!("must be 10 to 604800 (a week; got {d}); remove it for no limit"),
        );
    }
}
