//! The quarantine executor: applies a [`Plan`] of `gpufabric_health::quarantine` to Nodes
//! (label, cordon, taint, release) under the ownership, budget and race rules, with an
//! Event, a metric and a status entry for every action.
//!
//! # How the controller uses it
//!
//! After a run of FabricTest `test` finishes and its results are read:
//!
//! 1. [`observe`] the nodes the plan is about: the nodes of the run, the nodes in
//!    `test.status.nodes`, and [`quarantined_by`] (every node whose record names the test,
//!    selected or not), so that gone and deselected nodes are released too.
//! 2. Build each node's `NodeFacts` with [`NodeObservation::facts`] (health from
//!    `gpufabric_health::history::advance`, `tested` = the node was in this run), and call
//!    `gpufabric_health::quarantine::plan(&facts, &test.spec.quarantine, selected, trigger)`.
//!    `selected` is the number of nodes the *test* selects, not the nodes of this run: a
//!    confirmation run tests only its suspects, and "25%" of 2 suspects is 1 node where
//!    25% of the 16 selected nodes is 4.
//! 3. Call [`execute`] with the plan and the reasons (node -> the most severe finding as a
//!    sentence). It re-reads every node it changes, so facts a few seconds old are safe.
//! 4. Write [`Outcome::apply_to_status`] into the FabricTest status.
//! 5. When `plan.confirm` is not empty, create [`confirmation_run`] (once per parent run:
//!    its name is derived from the parent's, so a second create gets AlreadyExists).
//!
//! On deletion of a FabricTest (finalizer [`gpufabric_api::keys::FINALIZER`]) call
//! [`release_all`]; remove the finalizer only when it returns `Ok`.
//!
//! # Safety rules enforced here
//!
//! - A node is changed only by one JSON merge patch that carries the resourceVersion it was
//!   decided from: if the node changed in between (someone cordoned it), the API server
//!   answers 409 Conflict and the node is re-read and decided again.
//! - The record (annotation `gpufabric.io/quarantine`) says which of label, cordon and taint
//!   this operator made; release undoes exactly those and nothing else.
//! - A node cordoned by someone else, carrying our taint key put there by someone else,
//!   quarantined by another FabricTest, or with an unreadable record is never touched.
//! - The budget is checked again against the nodes that carry this test's record in the
//!   whole cluster, so a stale plan cannot exceed it.
//! - The mode is the test's current `spec.quarantine.mode`. A node already quarantined by
//!   this test keeps the changes it got; a mode change applies to new quarantines. Switching
//!   to Observe stops new quarantines; the planner then holds releases back as well.
//!
//! # Events and metrics
//!
//! Every action leaves an Event on the node and on the FabricTest (reasons `Quarantined`,
//! `Released`, `OverBudget`, `WouldQuarantine`, `WouldRelease`, `LeftAlone`,
//! `QuarantineRecordUnreadable`, `QuarantineFailed`; `InvalidBudget` and `QuarantineKept`
//! on the FabricTest only), counts in `gpufabric_quarantine_actions_total{test,action}`,
//! and sets `gpufabric_quarantined_nodes{test}`.
//!
//! # Known limits
//!
//! - A cordon is one bit: if a person runs `kubectl cordon` on a node this operator already
//!   cordoned, releasing the node uncordons it (nothing on the node tells the two apart).
//! - A node whose record annotation a person removed is no longer this operator's: its
//!   label/cordon/taint stay until a person removes them.
//! - A node quarantined in Label mode gets no cordon if the mode later becomes Cordon; it
//!   keeps what it got until it is released.

mod metrics;
mod node;

pub use metrics::{ActionLabels, QuarantineMetrics, TestLabels};
pub use node::{
    NodeObservation, Step, TAINT_EFFECT, is_our_taint, is_unschedulable, quarantine_step,
    release_step, taints_of,
};

use gpufabric_api::keys::{LABEL_TEST, LABEL_TRIGGER};
use gpufabric_api::policy::QuarantineMode;
use gpufabric_api::quarantine::QuarantineRecord;
use gpufabric_api::run::{FabricTestRun, FabricTestRunSpec, Trigger};
use gpufabric_api::test::{FabricTest, FabricTestStatus};
use gpufabric_health::quarantine::{Hold, Plan};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};
use tracing::{info, warn};

/// Annotation on a confirmation run: the run whose suspects it retests.
pub const ANNOTATION_CONFIRMS: &str = "gpufabric.io/confirms";

/// Node reads [`observe`] keeps in flight at once.
pub const OBSERVE_CONCURRENCY: usize = 16;

/// How often a node change is re-read and re-decided after a conflict before giving up.
const MAX_ATTEMPTS: usize = 5;

/// Errors that stop the executor from acting at all. Per-node problems do not stop it;
/// they are reported in [`Outcome::errors`].
#[derive(Debug, thiserror::Error)]
pub enum QuarantineError {
    #[error("listing nodes to count this test's quarantined nodes: {0}")]
    ListNodes(#[source] kube::Error),
    #[error("reading node {node}: {source}")]
    GetNode {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("the FabricTest has no namespace or name")]
    Unnamed,
    #[error("the FabricTest has no uid yet; a run cannot be owned by it")]
    NoUid,
    #[error("could not release {} node(s), the finalizer stays until they are: {}", .0.len(), .0.iter().map(|(n, e)| format!("{n}: {e}")).collect::<Vec<_>>().join("; "))]
    Release(Vec<(String, String)>),
}

/// What one node action was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// The node was labeled/cordoned/tainted and the record written.
    Quarantined,
    /// What the record named was undone and the record removed.
    Released,
    /// Would be quarantined, but the budget is spent.
    OverBudget,
    /// Would be quarantined, but the mode is Observe.
    WouldQuarantine,
    /// Would be released, but the mode is Observe.
    WouldRelease,
    /// Not ours to touch: cordoned or tainted by someone else, quarantined by another
    /// FabricTest, gone. Normal: a person's cordon is not a problem to warn about.
    LeftAlone,
    /// Left alone because its quarantine annotation is unreadable: nobody can tell what
    /// was done to the node, so a person has to look (a Warning).
    Unreadable,
    /// The API server refused or failed the change; retried on the next reconcile.
    Failed,
}

impl Action {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Quarantined => "quarantined",
            Action::Released => "released",
            Action::OverBudget => "over_budget",
            Action::WouldQuarantine => "would_quarantine",
            Action::WouldRelease => "would_release",
            Action::LeftAlone => "left_alone",
            Action::Unreadable => "unreadable_record",
            Action::Failed => "failed",
        }
    }

    /// The Event reason.
    pub fn reason(self) -> &'static str {
        match self {
            Action::Quarantined => "Quarantined",
            Action::Released => "Released",
            Action::OverBudget => "OverBudget",
            Action::WouldQuarantine => "WouldQuarantine",
            Action::WouldRelease => "WouldRelease",
            Action::LeftAlone => "LeftAlone",
            Action::Unreadable => "QuarantineRecordUnreadable",
            Action::Failed => "QuarantineFailed",
        }
    }

    fn event_type(self) -> EventType {
        match self {
            Action::Quarantined | Action::OverBudget | Action::Failed | Action::Unreadable => {
                EventType::Warning
            }
            _ => EventType::Normal,
        }
    }
}

/// One thing the executor did (or declined to do) to one node.
#[derive(Clone, Debug, PartialEq)]
pub struct ActionTaken {
    pub node: String,
    pub action: Action,
    /// A sentence for Events, logs and status.
    pub message: String,
}

/// What [`execute`] did, and what the FabricTest status should say.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Outcome {
    /// Every node this test holds in quarantine after the executor ran (in the whole
    /// cluster, not only the nodes of the plan), with when it was quarantined.
    pub quarantined: BTreeMap<String, Time>,
    /// Nodes not acted on, with why (for `NodeHealth.heldBack`).
    pub held_back: BTreeMap<String, String>,
    /// Every action, in the order taken.
    pub actions: Vec<ActionTaken>,
    /// Node changes that failed (API errors); the controller should requeue soon. The
    /// plan can be executed again safely: finished steps are no-ops the second time.
    pub errors: Vec<(String, String)>,
}

impl Outcome {
    /// Nodes this test holds in quarantine, sorted.
    pub fn quarantined_nodes(&self) -> Vec<String> {
        self.quarantined.keys().cloned().collect()
    }

    /// The nodes an action of `kind` was taken on.
    pub fn nodes_with(&self, kind: Action) -> Vec<String> {
        self.actions
            .iter()
            .filter(|a| a.action == kind)
            .map(|a| a.node.clone())
            .collect()
    }

    /// Write the quarantine part of the status: `quarantinedNodes`, `quarantinedCount`,
    /// and each `nodes[]` entry's `quarantined`, `quarantinedSince` and `heldBack` (which
    /// is replaced: a node not held back in this execution has none).
    pub fn apply_to_status(&self, status: &mut FabricTestStatus) {
        status.quarantined_nodes = self.quarantined_nodes();
        status.quarantined_count = u32::try_from(self.quarantined.len()).unwrap_or(u32::MAX);
        for n in &mut status.nodes {
            let since = self.quarantined.get(&n.node);
            n.quarantined = since.is_some();
            n.quarantined_since = since.cloned();
            n.held_back = self.held_back.get(&n.node).cloned();
        }
    }
}

/// `<namespace>/<name>` of a FabricTest: what records and metrics name it by.
pub fn test_key(test: &FabricTest) -> Result<String, QuarantineError> {
    match (
        test.metadata.namespace.as_deref(),
        test.metadata.name.as_deref(),
    ) {
        (Some(ns), Some(name)) => Ok(QuarantineRecord::test_key(ns, name)),
        _ => Err(QuarantineError::Unnamed),
    }
}

/// Read the named nodes and say, for each, what this test may do with it. Call it before
/// planning; pass the result through [`NodeObservation::facts`] to the planner. A node that
/// does not exist comes back with `exists: false` (not an error). Names are read
/// [`OBSERVE_CONCURRENCY`] at a time; the result is in the order of `node_names`, without
/// repeats.
pub async fn observe(
    client: &Client,
    test: &FabricTest,
    node_names: &[String],
) -> Result<Vec<NodeObservation>, QuarantineError> {
    use futures::{StreamExt, TryStreamExt};
    let key = test_key(test)?;
    let nodes: Api<Node> = Api::all(client.clone());
    let mut seen = BTreeSet::new();
    let unique: Vec<String> = node_names
        .iter()
        .filter(|n| seen.insert(n.as_str()))
        .cloned()
        .collect();
    // Owned values in each future: borrowed ones make the controller's future not Send.
    futures::stream::iter(unique)
        .map(move |name| {
            let (nodes, key) = (nodes.clone(), key.clone());
            async move {
                let node =
                    nodes
                        .get_opt(&name)
                        .await
                        .map_err(|source| QuarantineError::GetNode {
                            node: name.clone(),
                            source,
                        })?;
                Ok(NodeObservation::of(&name, node.as_ref(), &key))
            }
        })
        .buffered(OBSERVE_CONCURRENCY)
        .try_collect()
        .await
}

/// Every node in the cluster whose record names this test, with the record. Nodes with an
/// unreadable record are not included (they are nobody's until a person fixes them).
pub async fn quarantined_by(
    client: &Client,
    test: &FabricTest,
) -> Result<BTreeMap<String, QuarantineRecord>, QuarantineError> {
    let key = test_key(test)?;
    records_of(client, &key).await
}

async fn records_of(
    client: &Client,
    key: &str,
) -> Result<BTreeMap<String, QuarantineRecord>, QuarantineError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes
        .list_metadata(&Default::default())
        .await
        .map_err(QuarantineError::ListNodes)?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|m| {
            let record =
                QuarantineRecord::from_annotations(m.metadata.annotations.as_ref()).ok()??;
            let name = m.metadata.name?;
            record.is_owned_by(key).then_some((name, record))
        })
        .collect())
}

/// Apply `plan` (from `gpufabric_health::quarantine::plan` for run `run` of `test`) to the
/// nodes. Releases first, then quarantines, then held-back nodes are reported. `reasons`
/// maps a node to why it is quarantined (the most severe finding, as a sentence); it goes
/// into the record and the Events.
///
/// Returns an error (and changes nothing) only when the nodes this test already holds
/// cannot be counted; per-node failures are in [`Outcome::errors`].
pub async fn execute(
    client: &Client,
    recorder: &Recorder,
    metrics: &QuarantineMetrics,
    test: &FabricTest,
    run: &str,
    plan: &Plan,
    reasons: &BTreeMap<String, String>,
) -> Result<Outcome, QuarantineError> {
    let mut exec = Executor::new(client, recorder, metrics, test)?;
    let key = exec.key.clone();
    let mode = test.spec.quarantine.mode;
    let mut ours = records_of(client, &key).await?;

    if let Some(e) = &plan.budget_error {
        warn!(test = %key, "{e}; nothing new is quarantined");
        exec.event_on_test(
            EventType::Warning,
            "InvalidBudget",
            format!(
                "{e}; nothing new is quarantined until spec.quarantine.maxQuarantined is fixed"
            ),
            None,
        )
        .await;
    }

    for name in &plan.release {
        if exec.release(name, None).await {
            ours.remove(name);
        }
    }

    for name in &plan.quarantine {
        let reason = reasons
            .get(name)
            .cloned()
            .unwrap_or_else(|| format!("failed run {run}"));
        if ours.contains_key(name) {
            continue;
        }
        if mode == QuarantineMode::Observe {
            exec.report(
                name,
                Action::WouldQuarantine,
                format!("would quarantine ({reason}), but the quarantine mode is Observe"),
            )
            .await;
            continue;
        }
        if ours.len() >= plan.budget {
            exec.report(
                name,
                Action::OverBudget,
                format!(
                    "would quarantine ({reason}), but this test already holds {} node(s), its budget (maxQuarantined) is {}",
                    ours.len(),
                    plan.budget
                ),
            )
            .await;
            continue;
        }
        if let Some(record) = exec.quarantine(name, None, mode, run, &reason).await {
            ours.insert(name.clone(), record);
        }
    }

    for (name, hold) in &plan.held_back {
        let (action, message) = match hold {
            Hold::OverBudget => (
                Some(Action::OverBudget),
                format!(
                    "{}: {} of {} node(s) held",
                    hold.describe(),
                    ours.len(),
                    plan.budget
                ),
            ),
            Hold::ObserveMode if ours.contains_key(name) => (
                Some(Action::WouldRelease),
                "would release: the quarantine mode is Observe".to_string(),
            ),
            Hold::ObserveMode => (Some(Action::WouldQuarantine), hold.describe().to_string()),
            Hold::CordonedByOthers => {
                // Say precisely why, from the node as it is now.
                let obs = match exec.nodes.get_opt(name).await {
                    Ok(n) => Some(NodeObservation::of(name, n.as_ref(), &key)),
                    Err(_) => None,
                };
                let action = match &obs {
                    Some(o) if o.record_error.is_some() => Action::Unreadable,
                    _ => Action::LeftAlone,
                };
                let why = obs.and_then(|o| o.why_left_alone());
                (
                    Some(action),
                    why.unwrap_or_else(|| hold.describe().to_string()),
                )
            }
            Hold::AwaitingConfirmation | Hold::NodeGone | Hold::NotTested => {
                (None, hold.describe().to_string())
            }
        };
        match action {
            Some(a) => exec.report(name, a, message).await,
            None => {
                exec.outcome.held_back.insert(name.clone(), message);
            }
        }
    }

    metrics.set_quarantined(&key, ours.len());
    exec.outcome.quarantined = ours.into_iter().map(|(n, r)| (n, r.since)).collect();
    Ok(exec.outcome)
}

/// Release every node whose record names `test`: call it from the finalizer
/// [`gpufabric_api::keys::FINALIZER`] when the FabricTest is being deleted, and remove the
/// finalizer only when it returns `Ok`.
///
/// With `spec.quarantine.releaseOnDelete: false` nothing is released: the nodes keep their
/// label/cordon/taint and their records (which still name `<namespace>/<name>`; a person
/// releases them by undoing what the record says and removing the annotation, or a new
/// FabricTest of the same namespace and name adopts them). An Event on the test lists them,
/// and `Ok` is returned so the finalizer can go.
pub async fn release_all(
    client: &Client,
    recorder: &Recorder,
    metrics: &QuarantineMetrics,
    test: &FabricTest,
) -> Result<Vec<String>, QuarantineError> {
    let mut exec = Executor::new(client, recorder, metrics, test)?;
    let key = exec.key.clone();
    let ours = records_of(client, &key).await?;
    if !test.spec.quarantine.release_on_delete {
        if !ours.is_empty() {
            let names: Vec<&str> = ours.keys().map(String::as_str).collect();
            info!(test = %key, nodes = ?names, "FabricTest deleted; releaseOnDelete is false, its quarantines stay");
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
        metrics.forget(&key);
        return Ok(Vec::new());
    }
    for name in ours.keys() {
        exec.release(name, None).await;
    }
    if !exec.outcome.errors.is_empty() {
        return Err(QuarantineError::Release(exec.outcome.errors));
    }
    metrics.forget(&key);
    Ok(exec.outcome.nodes_with(Action::Released))
}

/// Quarantine one node now, starting from `snapshot` (the node as last read) instead of
/// reading it first. [`execute`] is what the controller calls; this exists so the race
/// handling can be exercised with a snapshot that is already stale.
pub async fn quarantine_node(
    client: &Client,
    recorder: &Recorder,
    metrics: &QuarantineMetrics,
    test: &FabricTest,
    snapshot: Node,
    run: &str,
    reason: &str,
) -> Result<Outcome, QuarantineError> {
    let key = test_key(test)?;
    let mut exec = Executor {
        nodes: Api::all(client.clone()),
        recorder,
        metrics,
        test,
        key,
        outcome: Outcome::default(),
    };
    let name = snapshot.name_any();
    if let Some(r) = exec
        .quarantine(
            &name,
            Some(snapshot),
            test.spec.quarantine.mode,
            run,
            reason,
        )
        .await
    {
        exec.outcome.quarantined.insert(name, r.since);
    }
    Ok(exec.outcome)
}

/// The confirmation run that retests `suspects` of `parent_run` before they are
/// quarantined: trigger Confirmation, `spec.nodes` = the suspects (sorted), the test's
/// current suite, thresholds, policy and agent, owned by the test. Its name is
/// `<parent_run>-confirm` (cut to 63 characters), so creating it twice for the same parent
/// gets AlreadyExists instead of a second run.
pub fn confirmation_run(
    test: &FabricTest,
    parent_run: &str,
    suspects: &[String],
) -> Result<FabricTestRun, QuarantineError> {
    let (Some(namespace), Some(test_name)) =
        (test.metadata.namespace.clone(), test.metadata.name.clone())
    else {
        return Err(QuarantineError::Unnamed);
    };
    let owner = test
        .controller_owner_ref(&())
        .ok_or(QuarantineError::NoUid)?;
    let mut nodes: Vec<String> = suspects.to_vec();
    nodes.sort();
    nodes.dedup();
    let spec = &test.spec;
    let mut run = FabricTestRun::new(
        &confirmation_run_name(parent_run),
        FabricTestRunSpec {
            test: test_name.clone(),
            trigger: Trigger::Confirmation,
            scheduled_time: None,
            node_selector: spec.node_selector.clone(),
            nodes: Some(nodes),
            suite: spec.suite.clone(),
            thresholds: spec.thresholds.clone(),
            quarantine: spec.quarantine.clone(),
            agent: spec.agent.clone(),
        },
    );
    run.metadata = ObjectMeta {
        namespace: Some(namespace),
        owner_references: Some(vec![owner]),
        labels: Some(BTreeMap::from([
            (LABEL_TEST.to_string(), label_value(&test_name)),
            (
                LABEL_TRIGGER.to_string(),
                Trigger::Confirmation.as_str().to_string(),
            ),
        ])),
        annotations: Some(BTreeMap::from([(
            ANNOTATION_CONFIRMS.to_string(),
            parent_run.to_string(),
        )])),
        ..run.metadata
    };
    Ok(run)
}

/// `<parent>-confirm`, at most 63 characters (the parent cut, never the suffix).
pub fn confirmation_run_name(parent_run: &str) -> String {
    const SUFFIX: &str = "-confirm";
    let keep = 63 - SUFFIX.len();
    let mut end = parent_run.len().min(keep);
    while !parent_run.is_char_boundary(end) {
        end -= 1;
    }
    let prefix = parent_run[..end].trim_end_matches(['-', '.']);
    format!("{prefix}{SUFFIX}")
}

/// A label value (at most 63 characters, alphanumeric at both ends).
fn label_value(text: &str) -> String {
    let mut end = text.len().min(63);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end]
        .trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// One execution's state: what it has done so far, and how to report it.
struct Executor<'a> {
    nodes: Api<Node>,
    recorder: &'a Recorder,
    metrics: &'a QuarantineMetrics,
    test: &'a FabricTest,
    key: String,
    outcome: Outcome,
}

/// What a guarded node change came to.
enum Applied {
    /// The patch went through; the node as it is now.
    Patched {
        node: Box<Node>,
        record: Option<QuarantineRecord>,
        changes: Vec<&'static str>,
    },
    /// Nothing to change, or not ours to change.
    NotPatched { step: Step, node: Box<Node> },
    /// The Node object does not exist.
    Gone,
}

impl<'a> Executor<'a> {
    fn new(
        client: &Client,
        recorder: &'a Recorder,
        metrics: &'a QuarantineMetrics,
        test: &'a FabricTest,
    ) -> Result<Executor<'a>, QuarantineError> {
        Ok(Executor {
            nodes: Api::all(client.clone()),
            recorder,
            metrics,
            test,
            key: test_key(test)?,
            outcome: Outcome::default(),
        })
    }

    /// Decide on the node as read, patch with its resourceVersion, and on a conflict read
    /// it again and decide again.
    async fn guarded(
        &self,
        name: &str,
        mut snapshot: Option<Node>,
        decide: impl Fn(&Node) -> Step,
    ) -> Result<Applied, String> {
        for attempt in 1..=MAX_ATTEMPTS {
            let node = match snapshot.take() {
                Some(n) => n,
                None => match self.nodes.get_opt(name).await {
                    Ok(Some(n)) => n,
                    Ok(None) => return Ok(Applied::Gone),
                    Err(e) => return Err(format!("reading the node: {e}")),
                },
            };
            match decide(&node) {
                Step::Patch {
                    patch,
                    record,
                    changes,
                } => {
                    match self
                        .nodes
                        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        Ok(node) => {
                            return Ok(Applied::Patched {
                                node: Box::new(node),
                                record,
                                changes,
                            });
                        }
                        Err(kube::Error::Api(s)) if s.is_conflict() => {
                            info!(
                                node = name,
                                attempt, "node changed while deciding; reading it again"
                            );
                        }
                        Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(Applied::Gone),
                        Err(e) => return Err(format!("patching the node: {e}")),
                    }
                }
                step => {
                    return Ok(Applied::NotPatched {
                        step,
                        node: Box::new(node),
                    });
                }
            }
        }
        Err(format!(
            "the node kept changing ({MAX_ATTEMPTS} conflicts in a row); left as it is, retried later"
        ))
    }

    async fn quarantine(
        &mut self,
        name: &str,
        snapshot: Option<Node>,
        mode: QuarantineMode,
        run: &str,
        reason: &str,
    ) -> Option<QuarantineRecord> {
        let key = self.key.clone();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let applied = self
            .guarded(name, snapshot, |n| {
                quarantine_step(n, &key, mode, run, reason, now.clone())
            })
            .await;
        match applied {
            Ok(Applied::Patched {
                node,
                record,
                changes,
            }) => {
                let message = format!(
                    "quarantined by FabricTest {key} (run {run}, mode {mode:?}; made: {}): {reason}",
                    changes.join(", ")
                );
                self.act(name, Some(&node), Action::Quarantined, message)
                    .await;
                record
            }
            Ok(Applied::NotPatched {
                step: Step::Nothing(_),
                node,
            }) => {
                // Already ours: nothing changes, and it stays counted.
                QuarantineRecord::from_annotations(node.metadata.annotations.as_ref())
                    .ok()
                    .flatten()
            }
            Ok(Applied::NotPatched { step, node }) => {
                self.act(name, Some(&node), left_alone(&node), step.into_reason())
                    .await;
                None
            }
            Ok(Applied::Gone) => {
                self.act(
                    name,
                    None,
                    Action::LeftAlone,
                    "the node does not exist".into(),
                )
                .await;
                None
            }
            Err(e) => {
                self.fail(name, format!("could not quarantine: {e}")).await;
                None
            }
        }
    }

    /// Release one node; true when it no longer carries this test's record.
    async fn release(&mut self, name: &str, snapshot: Option<Node>) -> bool {
        let key = self.key.clone();
        match self
            .guarded(name, snapshot, |n| release_step(n, &key))
            .await
        {
            Ok(Applied::Patched { node, changes, .. }) => {
                let message = format!(
                    "released by FabricTest {key} (undid: {})",
                    changes.join(", ")
                );
                self.act(name, Some(&node), Action::Released, message).await;
                true
            }
            Ok(Applied::NotPatched {
                step: Step::Nothing(why),
                ..
            }) => {
                info!(node = name, test = %key, "{why}");
                true
            }
            Ok(Applied::NotPatched { step, node }) => {
                self.act(name, Some(&node), left_alone(&node), step.into_reason())
                    .await;
                false
            }
            Ok(Applied::Gone) => {
                let message = format!("released by FabricTest {key}: the node no longer exists");
                self.act(name, None, Action::Released, message).await;
                true
            }
            Err(e) => {
                self.fail(name, format!("could not release: {e}")).await;
                false
            }
        }
    }

    /// Report an action on a node that is not read here (held back, over budget, observe).
    async fn report(&mut self, name: &str, action: Action, message: String) {
        self.act(name, None, action, message).await;
    }

    async fn fail(&mut self, name: &str, message: String) {
        self.outcome
            .errors
            .push((name.to_string(), message.clone()));
        self.act(name, None, Action::Failed, message).await;
    }

    /// Record one action: outcome, metric, log, and an Event on the node and on the test.
    async fn act(&mut self, name: &str, node: Option<&Node>, action: Action, message: String) {
        match action.event_type() {
            EventType::Normal => {
                info!(node = name, test = %self.key, action = action.as_str(), "{message}")
            }
            EventType::Warning => {
                warn!(node = name, test = %self.key, action = action.as_str(), "{message}")
            }
        }
        self.metrics.count(&self.key, action.as_str());
        if !matches!(action, Action::Quarantined | Action::Released) {
            self.outcome
                .held_back
                .insert(name.to_string(), message.clone());
        }
        self.outcome.actions.push(ActionTaken {
            node: name.to_string(),
            action,
            message: message.clone(),
        });
        let node_ref = match node {
            Some(n) => Some(n.object_ref(&())),
            // Not read here: read it for its uid, so `kubectl describe node` shows the Event.
            None => match self.nodes.get_opt(name).await {
                Ok(Some(n)) => Some(n.object_ref(&())),
                _ => None,
            },
        };
        let test_ref = self.test.object_ref(&());
        let note = truncate_note(&message);
        if let Some(r) = &node_ref {
            let ev = Event {
                type_: action.event_type(),
                reason: action.reason().into(),
                note: Some(note.clone()),
                action: action.reason().into(),
                secondary: Some(test_ref.clone()),
            };
            if let Err(e) = self.recorder.publish(&ev, r).await {
                warn!(node = name, "could not publish an Event on the node: {e}");
            }
        }
        self.event_on_test(
            action.event_type(),
            action.reason(),
            format!("node {name}: {note}"),
            node_ref,
        )
        .await;
    }

    async fn event_on_test(
        &self,
        type_: EventType,
        reason: &str,
        note: String,
        secondary: Option<ObjectReference>,
    ) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate_note(&note)),
            action: reason.into(),
            secondary,
        };
        if let Err(e) = self.recorder.publish(&ev, &self.test.object_ref(&())).await {
            warn!(test = %self.key, "could not publish an Event on the FabricTest: {e}");
        }
    }
}

/// LeftAlone, or Unreadable when the node's quarantine annotation cannot be read.
fn left_alone(node: &Node) -> Action {
    match QuarantineRecord::from_annotations(node.metadata.annotations.as_ref()) {
        Err(_) => Action::Unreadable,
        Ok(_) => Action::LeftAlone,
    }
}

/// Event notes are limited to 1 kB.
fn truncate_note(note: &str) -> String {
    if note.len() <= 1000 {
        return note.to_string();
    }
    let mut end = 997;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &note[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::run::NodeVerdict;
    use gpufabric_api::test::{FabricTestSpec, NodeHealth};

    fn test() -> FabricTest {
        let mut t = FabricTest::new("nightly", FabricTestSpec::default());
        t.metadata.namespace = Some("gpu".into());
        t.metadata.uid = Some("uid-1".into());
        t
    }

    #[test]
    fn confirmation_run_retests_only_the_suspects_and_is_owned_by_the_test() {
        let run = confirmation_run(
            &test(),
            "nightly-29001",
            &["n3".into(), "n1".into(), "n3".into()],
        )
        .expect("builds");
        assert_eq!(run.metadata.name.as_deref(), Some("nightly-29001-confirm"));
        assert_eq!(run.metadata.namespace.as_deref(), Some("gpu"));
        assert_eq!(run.spec.trigger, Trigger::Confirmation);
        assert_eq!(
            run.spec.nodes,
            Some(vec!["n1".to_string(), "n3".to_string()])
        );
        assert_eq!(run.spec.test, "nightly");
        let owner = &run.metadata.owner_references.expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("FabricTest", "uid-1")
        );
        assert_eq!(owner.controller, Some(true));
        let labels = run.metadata.labels.expect("labels");
        assert_eq!(labels[LABEL_TRIGGER], "confirmation");
        assert_eq!(
            run.metadata.annotations.expect("annotations")[ANNOTATION_CONFIRMS],
            "nightly-29001"
        );
    }

    #[test]
    fn confirmation_run_name_fits_a_label_value() {
        let long = "a".repeat(80);
        let name = confirmation_run_name(&long);
        assert!(name.len() <= 63 && name.ends_with("-confirm"), "{name}");
        let mut t = test();
        t.metadata.uid = None;
        assert!(matches!(
            confirmation_run(&t, "r", &[]),
            Err(QuarantineError::NoUid)
        ));
    }

    #[test]
    fn status_shows_what_is_quarantined_and_what_is_held_back() {
        let since = Time("2026-11-21T02:00:00Z".parse().expect("time"));
        let outcome = Outcome {
            quarantined: BTreeMap::from([("n1".to_string(), since.clone())]),
            held_back: BTreeMap::from([("n2".to_string(), "over budget".to_string())]),
            ..Default::default()
        };
        let health = |n: &str| NodeHealth {
            node: n.into(),
            verdict: NodeVerdict::Failed,
            consecutive_failures: 2,
            consecutive_passes: 0,
            quarantined: true,
            quarantined_since: None,
            held_back: Some("stale".into()),
            last_finding: None,
            last_run: None,
        };
        let mut status = FabricTestStatus {
            nodes: vec![health("n1"), health("n2"), health("n3")],
            ..Default::default()
        };
        outcome.apply_to_status(&mut status);
        assert_eq!(status.quarantined_nodes, vec!["n1".to_string()]);
        assert_eq!(status.quarantined_count, 1);
        assert!(status.nodes[0].quarantined && status.nodes[0].quarantined_since == Some(since));
        assert_eq!(status.nodes[0].held_back, None);
        assert!(!status.nodes[1].quarantined);
        assert_eq!(status.nodes[1].held_back.as_deref(), Some("over budget"));
        assert!(!status.nodes[2].quarantined && status.nodes[2].held_back.is_none());
    }
}
