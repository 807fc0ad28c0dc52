//! The FabricTestRun controller: freezes the nodes, creates one benchmark pod per node in
//! bounded batches, reads each finished pod's result, ends the run when every pod ended or
//! the deadline passed, and judges the nodes. Everything it knows is re-read from the API
//! server, so a restarted operator resumes a run where it was.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::metrics::VerdictLabels;
use crate::names;
use crate::nodes;
use crate::pods::{self, allocatable_gpus};
use crate::results::{self, PodState};
use crate::status as st;
use crate::time::{now, to_chrono};
use chrono::Utc;
use futures::StreamExt;
use gpufabric_api::keys;
use gpufabric_api::outcome::{NodeOutcome, NotMeasuredReason};
use gpufabric_api::run::{
    FabricTestRun, FabricTestRunStatus, NodeRunResult, NodeVerdict, RunPhase,
};
use gpufabric_health::NodeInput;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "fabrictestrun";
/// Pods created at once.
pub const CREATE_CONCURRENCY: usize = 50;
/// Time a run waits past the pods' own deadline before it stops them.
pub const DEADLINE_MARGIN_SECONDS: i64 = 30;
/// Condition set when every pod of the run exists; the run deadline counts from it.
pub const CONDITION_PODS_CREATED: &str = "PodsCreated";

/// Reconciles one run.
#[tracing::instrument(skip_all, fields(run = %obj.name_any(), ns = obj.namespace().unwrap_or_default()))]
pub async fn reconcile(obj: Arc<FabricTestRun>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_timer(CONTROLLER);
    let action = reconcile_run(&obj, &ctx).await?;
    super::succeeded(&ctx, obj.as_ref());
    Ok(action)
}

async fn reconcile_run(obj: &Arc<FabricTestRun>, ctx: &Arc<Context>) -> Result<Action> {
    ctx.caches_ready().await;
    let ns = obj
        .namespace()
        .ok_or(Error::Missing("metadata.namespace"))?;
    let key = format!("{ns}/{}", obj.name_any());
    let api: Api<FabricTestRun> = Api::namespaced(ctx.client.clone(), &ns);
    // The cache may lag behind our own last status write: read the run itself.
    let Some(run) = api.get_opt(&obj.name_any()).await? else {
        ctx.metrics.set_active_pods(&key, 0);
        return Ok(Action::await_change());
    };
    if run.meta().deletion_timestamp.is_some() {
        ctx.metrics.set_active_pods(&key, 0);
        return Ok(Action::await_change());
    }
    let status = run.status.clone().unwrap_or_default();
    if status.phase.is_finished() {
        ctx.metrics.set_active_pods(&key, 0);
        return Ok(Action::await_change());
    }
    if status.nodes.is_empty() {
        return start(&run, &api, ctx).await;
    }
    progress(&run, status, &api, ctx, &key).await
}

async fn apply_status(
    api: &Api<FabricTestRun>,
    name: &str,
    status: &FabricTestRunStatus,
) -> Result<FabricTestRun> {
    let body = json!({
        "apiVersion": gpufabric_api::GROUP.to_string() + "/" + gpufabric_api::VERSION,
        "kind": "FabricTestRun",
        "status": status,
    });
    Ok(api
        .patch_status(
            name,
            &PatchParams::apply(keys::MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?)
}

/// Resolves and freezes the nodes, or fails the run when there are none.
async fn start(run: &FabricTestRun, api: &Api<FabricTestRun>, ctx: &Context) -> Result<Action> {
    let name = run.name_any();
    let all = ctx.nodes.state();
    let in_use = gpus_in_use(ctx).await?;
    let tolerations = pods::tolerations(&run.spec.agent);
    let (targets, skipped) = nodes::resolve(
        all.iter().map(|n| n.as_ref()),
        &nodes::Selection {
            selector: &run.spec.node_selector,
            names: run.spec.nodes.as_deref(),
            tolerations: &tolerations,
            gpus_in_use: &in_use,
            include_busy: include_busy_nodes(run, ctx).await?,
        },
    );
    let started = now();
    let skipped_text = skipped
        .iter()
        .take(10)
        .map(|s| format!("{} {}", s.node, s.message))
        .collect::<Vec<_>>()
        .join("; ");
    let run_ref = run.object_ref(&());
    let test_ref = Context::test_ref_of(run);
    if targets.is_empty() {
        let message = if skipped.is_empty() {
            "no node matches the nodeSelector and has allocatable nvidia.com/gpu".to_string()
        } else {
            format!(
                "no node can be tested ({} selected, none usable): {skipped_text}",
                skipped.len()
            )
        };
        let mut status = FabricTestRunStatus {
            phase: RunPhase::Failed,
            start_time: Some(started.clone()),
            completion_time: Some(started),
            duration: Some(st::duration_string(0)),
            message: Some(message.clone()),
            skipped: skipped.clone(),
            ..Default::default()
        };
        crate::signals::set_finished_conditions(&mut status, run.metadata.generation, &now());
        apply_status(api, &name, &status).await?;
        ctx.metrics.run_finished(run, RunPhase::Failed, 0);
        tracing::warn!(%message, "run failed: no nodes");
        ctx.events
            .warning(&run_ref, "RunFailed", "Resolve", message.clone())
            .await;
        if let Some(t) = &test_ref {
            ctx.events
                .warning(t, "RunFailed", "Resolve", format!("{name}: {message}"))
                .await;
        }
        return Ok(Action::await_change());
    }
    let status = FabricTestRunStatus {
        phase: RunPhase::Running,
        start_time: Some(started),
        node_count: targets.len() as u32,
        nodes: targets
            .iter()
            .map(|t| NodeRunResult {
                node: t.name.clone(),
                verdict: NodeVerdict::Pending,
                ..Default::default()
            })
            .collect(),
        message: (!skipped.is_empty()).then(|| {
            format!(
                "{} selected nodes not tested: {skipped_text}",
                skipped.len()
            )
        }),
        skipped,
        ..Default::default()
    };
    apply_status(api, &name, &status).await?;
    tracing::info!(nodes = targets.len(), "run started");
    let note = format!("testing {} nodes", targets.len());
    ctx.events
        .normal(&run_ref, "RunStarted", "Start", note.clone())
        .await;
    if let Some(t) = &test_ref {
        ctx.events
            .normal(t, "RunStarted", "Start", format!("{name}: {note}"))
            .await;
    }
    Ok(Action::requeue(Duration::from_millis(100)))
}

/// GPUs held by pods that are not gpufabric's, by node, read from the API server when a
/// run starts. Without the right to list pods cluster-wide, no node counts as busy.
async fn gpus_in_use(ctx: &Context) -> Result<std::collections::BTreeMap<String, u32>> {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let lp = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    match api.list(&lp).await {
        Ok(list) => Ok(nodes::gpus_in_use(&list.items)),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            tracing::warn!(error = %s.message, "cannot list pods cluster-wide: busy nodes are not skipped");
            Ok(Default::default())
        }
        Err(e) => Err(e.into()),
    }
}

/// The owning test's `includeBusyNodes`, read when the run starts (false without a test).
async fn include_busy_nodes(run: &FabricTestRun, ctx: &Context) -> Result<bool> {
    let ns = run.namespace().unwrap_or_default();
    let api: Api<gpufabric_api::test::FabricTest> = Api::namespaced(ctx.client.clone(), &ns);
    Ok(api
        .get_opt(&run.spec.test)
        .await?
        .is_some_and(|t| t.spec.include_busy_nodes))
}

fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        _ => true,
    }
}

/// Where each node's pod stands, which pods to create and which to stop.
struct Read {
    outcomes: Vec<PodState>,
    to_create: Vec<usize>,
    /// Pods that ended while the kubelet still holds them (an image that cannot be pulled, a
    /// missing Secret): deleted so that they stop holding the node's GPUs.
    to_stop: Vec<usize>,
}

async fn read_states(
    name: &str,
    entries: &[NodeRunResult],
    pods: &HashMap<String, Arc<Pod>>,
    pods_api: &Api<Pod>,
    past_deadline: bool,
    run_seconds: u64,
) -> Result<Read> {
    let mut read = Read {
        outcomes: Vec::with_capacity(entries.len()),
        to_create: Vec::new(),
        to_stop: Vec::new(),
    };
    for (i, e) in entries.iter().enumerate() {
        let pod_name = names::pod_name(name, &e.node);
        let live = match pods.get(&pod_name) {
            Some(p) => Some(p.as_ref().clone()),
            // Created before; the cache may lag, so ask the API server.
            None if e.pod.is_some() => pods_api.get_opt(&pod_name).await?,
            None => None,
        };
        let o = if let Some(p) = live {
            let state = results::pod_state(&p);
            if state.is_final() && holds_node(&p) {
                read.to_stop.push(i);
            }
            state
        } else if e.verdict.is_final() {
            // Ended earlier (a blocked pod this controller deleted): the status remembers why.
            PodState::Ended(results::outcome_from_entry(e))
        } else if e.pod.is_some() {
            if past_deadline {
                PodState::Ended(results::never_started(&format!(
                    "the run deadline ({run_seconds}s)"
                )))
            } else {
                PodState::Ended(results::pod_gone())
            }
        } else {
            read.to_create.push(i);
            PodState::Waiting(None)
        };
        read.outcomes.push(o);
    }
    Ok(read)
}

/// Creates, reads and finishes.
async fn progress(
    run: &FabricTestRun,
    status: FabricTestRunStatus,
    api: &Api<FabricTestRun>,
    ctx: &Context,
    key: &str,
) -> Result<Action> {
    let name = run.name_any();
    let ns = run.namespace().unwrap_or_default();
    let uid = run.uid().ok_or(Error::Missing("metadata.uid"))?;
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let timeout = i64::from(run.spec.agent.timeout_seconds);
    let now_t = Utc::now();

    let pods: HashMap<String, Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()))
        .filter(|p| p.owner_references().iter().any(|o| o.uid == uid))
        .map(|p| (p.name_any(), p))
        .collect();

    let pods_created_at = status
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_PODS_CREATED && c.status == "True")
        .map(|c| to_chrono(&c.last_transition_time));
    let base = pods_created_at
        .or_else(|| status.start_time.as_ref().map(to_chrono))
        .unwrap_or(now_t);
    let deadline = base + chrono::Duration::seconds(timeout + DEADLINE_MARGIN_SECONDS);
    let past_deadline = now_t >= deadline;

    let mut entries = status.nodes.clone();
    let run_seconds = (timeout + DEADLINE_MARGIN_SECONDS) as u64;
    let Read {
        mut outcomes,
        to_create,
        to_stop,
    } = read_states(
        &name,
        &entries,
        &pods,
        &pods_api,
        past_deadline,
        run_seconds,
    )
    .await?;
    for i in to_stop {
        let pod_name = names::pod_name(&name, &entries[i].node);
        match pods_api
            .delete(&pod_name, &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }

    let mut transient = None;
    if !to_create.is_empty() && !past_deadline {
        let created = create_pods(run, &entries, &to_create, ctx, &pods_api).await;
        for (i, res) in created {
            match res {
                Ok(()) => entries[i].pod = Some(names::pod_name(&name, &entries[i].node)),
                Err(CreateError::Permanent(reason)) => {
                    outcomes[i] = PodState::Ended(NodeOutcome::not_measured(
                        NotMeasuredReason::NotAdmitted,
                        reason,
                    ))
                }
                Err(CreateError::Transient(e)) => transient = Some(e),
            }
        }
    } else if past_deadline {
        for i in &to_create {
            outcomes[*i] = PodState::Ended(results::never_started(&format!(
                "the run deadline ({run_seconds}s)"
            )));
        }
    }

    // Past the deadline: stop what is still running.
    let mut stopped = 0;
    if past_deadline {
        for (i, o) in outcomes.iter_mut().enumerate() {
            if o.is_final() {
                continue;
            }
            let pod_name = names::pod_name(&name, &entries[i].node);
            match pods_api
                .delete(&pod_name, &DeleteParams::background())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            *o = PodState::Ended(
                std::mem::replace(o, PodState::Running).at_run_deadline(run_seconds),
            );
            stopped += 1;
        }
    }

    for (e, o) in entries.iter_mut().zip(&outcomes) {
        let pod = e.pod.clone();
        *e = results::node_result(&e.node, pod.as_deref(), o);
    }
    let active = outcomes.iter().filter(|o| !o.is_final()).count();
    ctx.metrics.set_active_pods(key, active as i64);

    let mut next = status.clone();
    next.nodes = entries;
    let all_created = next
        .nodes
        .iter()
        .all(|e| e.pod.is_some() || e.verdict.is_final());
    if all_created && pods_created_at.is_none() {
        let c = st::condition(
            &status.conditions,
            CONDITION_PODS_CREATED,
            true,
            "AllPodsCreated",
            format!("{} benchmark pods created", next.nodes.len()),
            run.metadata.generation,
            &now(),
        );
        next.conditions
            .retain(|c| c.type_ != CONDITION_PODS_CREATED);
        next.conditions.push(c);
        tracing::info!(pods = next.nodes.len(), "all pods created");
    }

    if active == 0 && transient.is_none() {
        return finish(run, next, &outcomes, stopped, api, &pods_api, ctx).await;
    }
    st::set_counts(&mut next);
    if next != status {
        apply_status(api, &name, &next).await?;
    }
    if let Some(e) = transient {
        return Err(e.into());
    }
    let wait = (deadline - Utc::now()).num_milliseconds().max(100) as u64;
    Ok(Action::requeue(Duration::from_millis(
        wait.min(60_000) + 50,
    )))
}

/// The pod is not in a terminal phase: the kubelet still holds it (and its GPUs).
fn holds_node(p: &Pod) -> bool {
    !matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    ) && p.meta().deletion_timestamp.is_none()
}

enum CreateError {
    Permanent(String),
    Transient(kube::Error),
}

/// Creates the missing pods, at most [`CREATE_CONCURRENCY`] at once. A pod that already
/// exists counts as created.
async fn create_pods(
    run: &FabricTestRun,
    entries: &[NodeRunResult],
    which: &[usize],
    ctx: &Context,
    pods_api: &Api<Pod>,
) -> Vec<(usize, Result<(), CreateError>)> {
    let jobs: Vec<_> = which
        .iter()
        .copied()
        .map(|i| {
            let node_name = entries[i].node.clone();
            let node: Option<Arc<Node>> = ctx.nodes.get(&ObjectRef::new(&node_name));
            async move {
                let Some(node) = node else {
                    return (
                        i,
                        Err(CreateError::Permanent(format!(
                            "node {node_name} no longer exists"
                        ))),
                    );
                };
                let gpus = allocatable_gpus(&node);
                let mut pod = match pods::node_check_pod(run, &node_name, gpus) {
                    Ok(p) => p,
                    Err(e) => return (i, Err(CreateError::Permanent(e.to_string()))),
                };
                ctx.resolve_agent_image(&mut pod);
                match pods_api.create(&PostParams::default(), &pod).await {
                    Ok(_) => (i, Ok(())),
                    Err(kube::Error::Api(s)) if s.code == 409 => (i, Ok(())),
                    Err(e) if is_transient(&e) => (i, Err(CreateError::Transient(e))),
                    Err(e) => (
                        i,
                        Err(CreateError::Permanent(format!(
                            "the benchmark pod could not be created: {e}"
                        ))),
                    ),
                }
            }
        })
        .collect();
    futures::stream::iter(jobs)
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect()
        .await
}

/// Judges every node and ends the run.
async fn finish(
    run: &FabricTestRun,
    mut next: FabricTestRunStatus,
    outcomes: &[PodState],
    stopped: usize,
    api: &Api<FabricTestRun>,
    pods_api: &Api<Pod>,
    ctx: &Context,
) -> Result<Action> {
    let name = run.name_any();
    let inputs: Vec<NodeInput> = next
        .nodes
        .iter()
        .zip(outcomes)
        .filter_map(|(e, o)| {
            let node = ctx.nodes.get(&ObjectRef::new(&e.node));
            let product_label = node
                .as_ref()
                .and_then(|n| n.labels().get(keys::LABEL_GPU_PRODUCT).cloned());
            let expected_gpus = node.as_ref().and_then(|n| {
                n.labels()
                    .get(keys::LABEL_GPU_COUNT)
                    .and_then(|c| c.parse().ok())
                    .or_else(|| Some(allocatable_gpus(n)).filter(|g| *g > 0))
            });
            let PodState::Ended(outcome) = o else {
                return None;
            };
            Some(NodeInput {
                node: e.node.clone(),
                product_label,
                expected_gpus,
                outcome: outcome.clone(),
            })
        })
        .collect();
    let evaluation = gpufabric_health::evaluate(&inputs, &run.spec.thresholds);
    for e in &mut next.nodes {
        if let Some(v) = evaluation.verdicts.get(&e.node) {
            e.verdict = *v;
        }
        e.findings = evaluation.critical_count(&e.node);
    }
    let (kept, dropped) = st::findings_for_status(evaluation.findings.clone());
    next.findings = kept;
    st::set_counts(&mut next);
    let (p, f, er, nm) = (next.passed, next.failed, next.errored, next.not_measured);
    let completion = now();
    let started = next
        .start_time
        .clone()
        .unwrap_or_else(|| completion.clone());
    next.duration = Some(st::duration_string(
        (to_chrono(&completion) - to_chrono(&started)).num_seconds(),
    ));
    next.completion_time = Some(completion);
    let mut notes = Vec::new();
    if let Some(m) = &next.message {
        notes.push(m.clone());
    }
    if stopped > 0 {
        next.phase = RunPhase::Failed;
        notes.push(format!(
            "the run deadline passed: {stopped} pods that had not finished were stopped"
        ));
    } else {
        next.phase = RunPhase::Succeeded;
    }
    // Before the run ends, so before the history limits can delete its pods.
    notes.extend(results::store::keep_all(pods_api, run, &next.nodes).await);
    if dropped > 0 {
        notes.push(format!(
            "{dropped} more findings are not listed (status size limit)"
        ));
    }
    next.message = (!notes.is_empty()).then(|| notes.join("; "));
    crate::signals::set_finished_conditions(&mut next, run.metadata.generation, &now());
    apply_status(api, &name, &next).await?;

    ctx.metrics.run_finished(run, next.phase, f + er);
    for n in &next.nodes {
        ctx.metrics
            .nodes_tested
            .get_or_create(&VerdictLabels {
                verdict: format!("{:?}", n.verdict),
            })
            .inc();
    }
    let summary = format!(
        "{} nodes: {p} passed, {f} failed, {er} errored or timed out, {nm} not measured; {} findings",
        next.nodes.len(),
        next.findings.len() + dropped
    );
    tracing::info!(phase = ?next.phase, %summary, "run finished");
    let bad = f + er > 0 || next.phase == RunPhase::Failed;
    let reason = if next.phase == RunPhase::Failed {
        "RunFailed"
    } else if bad {
        "NodesFailed"
    } else {
        "RunSucceeded"
    };
    let run_ref = run.object_ref(&());
    let test_ref = Context::test_ref_of(run);
    if let Some(issue) = st::infrastructure_issue(&next.nodes) {
        // One Event for the pattern, on the test: the nodes are not at fault.
        let note = format!("{name}: {}", issue.message());
        tracing::warn!(%note, "many nodes not measured for one reason");
        if let Some(t) = &test_ref {
            ctx.events
                .warning(t, st::CONDITION_INFRASTRUCTURE_DEGRADED, "Finish", note)
                .await;
        }
    }
    if bad {
        ctx.events
            .warning(&run_ref, reason, "Finish", summary.clone())
            .await;
        if let Some(t) = &test_ref {
            ctx.events
                .warning(t, reason, "Finish", format!("{name}: {summary}"))
                .await;
        }
    } else {
        ctx.events
            .normal(&run_ref, reason, "Finish", summary.clone())
            .await;
        if let Some(t) = &test_ref {
            ctx.events
                .normal(t, reason, "Finish", format!("{name}: {summary}"))
                .await;
        }
    }
    Ok(Action::await_change())
}
