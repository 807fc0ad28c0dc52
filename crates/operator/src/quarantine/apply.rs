//! Applying a plan to Nodes: each release and quarantine the plan names, as one
//! resourceVersion-guarded patch per node, and a report for each node it holds back. The
//! plan is final: budget and mode were decided there, and only the node as read now can
//! still refuse a change (someone else cordoned it in between).

use super::QuarantineError;
use super::executor::{Applied, Executor};
use super::ledger::Ledger;
use super::metrics::QuarantineMetrics;
use super::node::{QuarantineStep, quarantine_step, release_step};
use super::observe::{records_of, test_key};
use super::outcome::{Action, Outcome};
use super::ownership::NodeObservation;
use super::refusal::{Change, NodeChangeError, Refusal};
use super::report::Report;
use crate::events::{EventType, Events};
use gpufabric_api::quarantine::QuarantineRecord;
use gpufabric_api::test::FabricTest;
use gpufabric_health::quarantine::{Enforcement, Hold, Plan};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use std::collections::BTreeMap;
use tracing::info;

/// Node changes [`execute`] keeps in flight at once: each a read, a guarded patch and its
/// Events, on a different node.
pub const CHANGE_CONCURRENCY: usize = 16;

/// Apply `plan` (from `gpufabric_health::quarantine::plan` for run `run` of `test`) to the
/// nodes: releases first, then quarantines, then each held-back node is reported. `reasons`
/// maps a node to why it is quarantined (the most severe finding, as a sentence); it goes
/// into the record and the Events.
///
/// Returns an error (and changes nothing) only when the nodes this test already holds
/// cannot be listed; per-node failures are in [`Outcome::errors`]. [`execute_held`] takes
/// them from a list read already.
pub async fn execute(
    client: &Client,
    events: &Events,
    metrics: &QuarantineMetrics,
    test: &FabricTest,
    run: &str,
    plan: &Plan,
    reasons: &BTreeMap<String, String>,
) -> Result<Outcome, QuarantineError> {
    let held = records_of(client, &test_key(test)?).await?;
    execute_held(
        client, events, metrics, test, run, plan, reasons, held, None,
    )
    .await
}

/// [`execute`] with the nodes this test holds (`held`, with their records) as listed for
/// the plan, under the same lock, so that the fold lists the cluster's nodes once. The plan
/// has counted the budget already; each phase (releases, then quarantines) changes
/// [`CHANGE_CONCURRENCY`] nodes at once, each under its own guarded read and patch, and its
/// outcome is counted once, whatever order the changes end in. A change that fails is
/// reported in [`Outcome::errors`] and leaves `held` as it was for that node. Each node
/// patched is noted in `ledger`, when given, for the next count from the node cache.
#[allow(clippy::too_many_arguments)]
pub async fn execute_held(
    client: &Client,
    events: &Events,
    metrics: &QuarantineMetrics,
    test: &FabricTest,
    run: &str,
    plan: &Plan,
    reasons: &BTreeMap<String, String>,
    held: BTreeMap<String, QuarantineRecord>,
    ledger: Option<&Ledger>,
) -> Result<Outcome, QuarantineError> {
    let mut exec = Executor::new(client, events, metrics, test)?;
    exec.ledger = ledger;
    let mut ours = held;

    if let Some(e) = &plan.budget_error {
        exec.invalid_budget(e).await;
    }
    for (name, released) in exec.release_each(&plan.release).await {
        if released {
            ours.remove(&name);
        }
    }
    if let Some(how) = plan.enforcement {
        let changes: Vec<(String, String)> = plan
            .quarantine
            .iter()
            .map(|name| {
                let reason = reasons
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| format!("failed run {run}"));
                (name.clone(), reason)
            })
            .collect();
        for (name, record) in exec.quarantine_each(&changes, how, run).await {
            if let Some(record) = record {
                ours.insert(name, record);
            }
        }
    }
    for (name, hold) in &plan.held_back {
        exec.hold(name, *hold, ours.len(), plan).await;
    }

    metrics.set_quarantined(&exec.key, ours.len());
    let mut outcome = exec.outcome;
    outcome.quarantined = ours.into_iter().map(|(n, r)| (n, r.since)).collect();
    Ok(outcome)
}

/// Release every node whose record names `test`: call it from the finalizer
/// [`gpufabric_api::keys::FINALIZER`] when the FabricTest is being deleted, and remove the
/// finalizer only when it returns `Ok`.
///
/// With `spec.quarantine.releaseOnDelete: false` nothing is released: the nodes keep their
/// label/cordon/taint and their records (which still name the test; a person releases
/// them by undoing what the record says and removing the annotation, or a new FabricTest
/// of the same name adopts them). An Event on the test lists them,
/// and `Ok` is returned so the finalizer can go.
pub async fn release_all(
    client: &Client,
    events: &Events,
    metrics: &QuarantineMetrics,
    test: &FabricTest,
) -> Result<Vec<String>, QuarantineError> {
    let mut exec = Executor::new(client, events, metrics, test)?;
    let ours = records_of(client, &exec.key).await?;
    if !test.spec.quarantine.release_on_delete {
        if !ours.is_empty() {
            let names: Vec<&str> = ours.keys().map(String::as_str).collect();
            info!(test = %exec.key, nodes = ?names, "FabricTest deleted; releaseOnDelete is false, its quarantines stay");
            exec.event_on_test(
                EventType::Normal,
                "QuarantineKept",
                format!(
                    "releaseOnDelete is false: {} node(s) stay quarantined with their records: {}",
                    names.len(),
                    names.join(", ")
                ),
                None,
            )
            .await;
        }
        metrics.forget(&exec.key);
        return Ok(Vec::new());
    }
    let names: Vec<String> = ours.into_keys().collect();
    exec.release_each(&names).await;
    if !exec.outcome.errors.is_empty() {
        return Err(QuarantineError::Release(exec.outcome.errors));
    }
    metrics.forget(&exec.key);
    Ok(exec.outcome.nodes_with(Action::Released))
}

impl Executor<'_> {
    /// Quarantines each of `changes` (node, reason), [`CHANGE_CONCURRENCY`] at once, then
    /// notes each report in the plan's order; the record each node carries afterwards
    /// when it is ours.
    async fn quarantine_each(
        &mut self,
        changes: &[(String, String)],
        how: Enforcement,
        run: &str,
    ) -> Vec<(String, Option<QuarantineRecord>)> {
        use futures::StreamExt;
        let this = &*self;
        // Owned items: borrowed ones make the controller's future not Send.
        let done: Vec<Done<Option<QuarantineRecord>>> = futures::stream::iter(changes.to_vec())
            .map(|(name, reason)| async move { this.quarantine(&name, how, run, &reason).await })
            .buffered(CHANGE_CONCURRENCY)
            .collect()
            .await;
        changes
            .iter()
            .zip(done)
            .map(|((name, _), done)| (name.clone(), self.noted(done)))
            .collect()
    }

    /// Releases each of `names`, [`CHANGE_CONCURRENCY`] at once, then notes each report in
    /// order; for each node, true when it no longer carries this test's record.
    async fn release_each(&mut self, names: &[String]) -> Vec<(String, bool)> {
        use futures::StreamExt;
        let this = &*self;
        let done: Vec<Done<bool>> = futures::stream::iter(names.to_vec())
            .map(|name| async move { this.release(&name).await })
            .buffered(CHANGE_CONCURRENCY)
            .collect()
            .await;
        names
            .iter()
            .zip(done)
            .map(|(name, done)| (name.clone(), self.noted(done)))
            .collect()
    }

    /// Notes what a node change reported into the outcome; its result.
    fn noted<T>(&mut self, done: Done<T>) -> T {
        if let Some(report) = done.report {
            self.note(report);
        }
        done.result
    }

    /// Quarantines one node (its Events published); the record it carries afterwards when
    /// it is ours, and what to note.
    async fn quarantine(
        &self,
        name: &str,
        how: Enforcement,
        run: &str,
        reason: &str,
    ) -> Done<Option<QuarantineRecord>> {
        let key = &self.key;
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let applied = self
            .guarded(name, |n| {
                quarantine_step(n, key, how, run, reason, now.clone())
            })
            .await;
        match applied {
            Ok(Applied::Patched {
                node,
                record,
                changes,
            }) => {
                let message = format!(
                    "quarantined by FabricTest {key} (run {run}, mode {:?}; made: {}): {reason}",
                    how.mode(),
                    changes.join(", ")
                );
                let report = self
                    .report(name, Some(&node), Action::Quarantined, message)
                    .await;
                Done::reported(record, report)
            }
            // Already ours: nothing changes, and it stays counted.
            Ok(Applied::Unchanged {
                step: QuarantineStep::AlreadyQuarantined(record),
                ..
            }) => Done::silent(Some(record)),
            Ok(Applied::Unchanged {
                step: QuarantineStep::Refuse(refusal),
                node,
            }) => Done::reported(None, self.report_refusal(name, Some(&node), &refusal).await),
            Ok(Applied::Unchanged { .. }) => Done::silent(None),
            Ok(Applied::Gone) => {
                Done::reported(None, self.report_refusal(name, None, &Refusal::Gone).await)
            }
            Err(error) => Done::reported(
                None,
                self.report_failure(name, Change::Quarantine, error).await,
            ),
        }
    }

    /// Releases one node (its Events published); true when it no longer carries this
    /// test's record, and what to note.
    async fn release(&self, name: &str) -> Done<bool> {
        let key = &self.key;
        match self.guarded(name, |n| release_step(n, key)).await {
            Ok(Applied::Patched { node, changes, .. }) => {
                let message = format!(
                    "released by FabricTest {key} (undid: {})",
                    changes.join(", ")
                );
                let report = self
                    .report(name, Some(&node), Action::Released, message)
                    .await;
                Done::reported(true, report)
            }
            Ok(Applied::Unchanged {
                step: QuarantineStep::Refuse(refusal),
                node,
            }) => Done::reported(
                false,
                self.report_refusal(name, Some(&node), &refusal).await,
            ),
            Ok(Applied::Unchanged { .. }) => {
                info!(node = name, test = %key, "already released: the node has no record of this test");
                Done::silent(true)
            }
            Ok(Applied::Gone) => {
                let message = format!("released by FabricTest {key}: the node no longer exists");
                Done::reported(
                    true,
                    self.report(name, None, Action::Released, message).await,
                )
            }
            Err(error) => Done::reported(
                false,
                self.report_failure(name, Change::Release, error).await,
            ),
        }
    }

    /// Report a node the plan holds back. `held`: nodes this test holds after the plan.
    async fn hold(&mut self, name: &str, hold: Hold, held: usize, plan: &Plan) {
        match hold {
            Hold::OverBudget => {
                let message = format!("{hold}: {held} of {} node(s) held", plan.budget);
                self.act(name, None, Action::OverBudget, message).await;
            }
            Hold::OverGpuBudget => {
                let message = format!(
                    "{hold}: {} of {} GPU(s) held by device taints",
                    plan.gpus_held_after, plan.gpu_budget
                );
                self.act(name, None, Action::OverBudget, message).await;
            }
            Hold::ClusterCap => {
                let cap = plan
                    .cluster_cap
                    .map_or_else(|| "no".to_string(), |c| c.to_string());
                let message = format!(
                    "{hold}: gpufabric holds {} node(s) in the cluster, the cap is {cap}",
                    plan.held_in_cluster_after
                );
                self.act(name, None, Action::OverClusterCap, message).await;
            }
            Hold::ObserveMode => {
                self.act(name, None, Action::WouldQuarantine, hold.to_string())
                    .await;
            }
            Hold::ObserveModeRelease => {
                self.act(name, None, Action::WouldRelease, hold.to_string())
                    .await;
            }
            Hold::CordonedByOthers => {
                // Say precisely whose the node is, from the node as it is now.
                let refusal = match self.nodes.get_opt(name).await {
                    Ok(node) => NodeObservation::of(name, node.as_ref(), &self.key).refusal(),
                    Err(_) => None,
                };
                match refusal {
                    Some(r) => self.refused(name, None, &r).await,
                    None => {
                        self.act(name, None, Action::LeftAlone, hold.to_string())
                            .await
                    }
                }
            }
            // The breaker's one Event is on the test; a storm of many nodes is not an Event
            // on each of them.
            Hold::AwaitingConfirmation
            | Hold::NodeGone
            | Hold::NotTested
            | Hold::BreakerOpen
            | Hold::BreakerOpenRelease
            // Said once, with an Event, when the node became one.
            | Hold::RepeatOffender => {
                self.outcome
                    .held_back
                    .insert(name.to_string(), hold.to_string());
            }
        }
    }

    pub(super) async fn fail(&mut self, name: &str, change: Change, error: NodeChangeError) {
        let report = self.report_failure(name, change, error).await;
        self.note(report);
    }
}

/// What one node change came to: its result, and the report to note in the outcome (none
/// when nothing happened worth saying). Its Events are published already.
pub(super) struct Done<T> {
    result: T,
    report: Option<Report>,
}

impl<T> Done<T> {
    fn reported(result: T, report: Report) -> Self {
        Done {
            result,
            report: Some(report),
        }
    }

    fn silent(result: T) -> Self {
        Done {
            result,
            report: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::guarded::MAX_ATTEMPTS;
    use super::*;
    use crate::controller::fake_api::{Expect, client, serve, status};
    use crate::events::Reporter;
    use gpufabric_api::test::FabricTestSpec;
    use http::{Method, StatusCode};
    use serde_json::{Value, json};

    fn test() -> FabricTest {
        let mut t = FabricTest::new("nightly", FabricTestSpec::default());
        t.metadata.uid = Some("uid-1".into());
        t
    }

    fn node(rv: &str, unschedulable: bool) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1", "uid": "node-uid", "resourceVersion": rv},
            "spec": {"unschedulable": unschedulable},
        })
    }

    #[tokio::test]
    async fn a_cordon_between_read_and_patch_is_read_again_and_left_alone() {
        let (client, handle) = client();
        let path = "/api/v1/nodes/n1";
        let server = serve(
            handle,
            vec![
                Expect::new(Method::GET, path, StatusCode::OK, node("1", false)),
                // A person cordoned n1 after our read: the guarded patch is refused.
                Expect::new(
                    Method::PATCH,
                    path,
                    StatusCode::CONFLICT,
                    status(409, "Conflict"),
                ),
                Expect::new(Method::GET, path, StatusCode::OK, node("2", true)),
            ],
        );
        let events = Events::new(client.clone(), Reporter::from("gpufabric"));
        let metrics = QuarantineMetrics::default();
        let t = test();
        let mut exec = Executor::new(&client, &events, &metrics, &t).expect("executor");
        let done = exec
            .quarantine("n1", Enforcement::Cordon, "run-1", "GPU 3 straggler")
            .await;
        let record = exec.noted(done);
        let outcome = std::mem::take(&mut exec.outcome);
        drop(exec);
        drop((client, events));
        let seen = server.await.expect("server");

        assert!(record.is_none());
        assert!(
            seen.unexpected.is_empty() && seen.missing.is_empty(),
            "{seen:?}"
        );
        assert_eq!(
            seen.requests[1].body["metadata"]["resourceVersion"], "1",
            "the patch carries the resourceVersion it was decided from"
        );
        assert_eq!(
            outcome.nodes_with(Action::LeftAlone),
            vec!["n1".to_string()]
        );
        assert!(outcome.errors.is_empty());
        assert!(
            outcome.held_back["n1"].contains("cordoned by someone else"),
            "{outcome:?}"
        );
        assert_eq!(seen.event_reasons(), vec!["LeftAlone", "LeftAlone"]);
    }

    #[tokio::test]
    async fn a_node_that_keeps_changing_is_a_failure_not_a_quarantine() {
        let (client, handle) = client();
        let path = "/api/v1/nodes/n1";
        let mut script = Vec::new();
        for _ in 0..MAX_ATTEMPTS {
            script.push(Expect::new(
                Method::GET,
                path,
                StatusCode::OK,
                node("1", false),
            ));
            script.push(Expect::new(
                Method::PATCH,
                path,
                StatusCode::CONFLICT,
                status(409, "Conflict"),
            ));
        }
        // The failure's Event reads the node for its uid.
        script.push(Expect::new(
            Method::GET,
            path,
            StatusCode::OK,
            node("1", false),
        ));
        let server = serve(handle, script);
        let events = Events::new(client.clone(), Reporter::from("gpufabric"));
        let metrics = QuarantineMetrics::default();
        let t = test();
        let mut exec = Executor::new(&client, &events, &metrics, &t).expect("executor");
        let done = exec
            .quarantine("n1", Enforcement::Taint, "run-1", "GPU 3 straggler")
            .await;
        let record = exec.noted(done);
        assert!(record.is_none());
        let outcome = std::mem::take(&mut exec.outcome);
        drop(exec);
        drop((client, events));
        let seen = server.await.expect("server");
        assert!(
            seen.unexpected.is_empty() && seen.missing.is_empty(),
            "{seen:?}"
        );
        assert_eq!(outcome.errors.len(), 1);
        assert!(matches!(
            outcome.errors[0].error,
            NodeChangeError::KeptChanging(MAX_ATTEMPTS)
        ));
        assert_eq!(outcome.nodes_with(Action::Failed), vec!["n1".to_string()]);
        assert_eq!(metrics.action_count("nightly", "failed"), 1);
    }
}
