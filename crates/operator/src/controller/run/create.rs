//! Benchmark pods created with bounded concurrency, each one's UID recorded as it is made; a
//! pod the API server refuses for good ends its node as not admitted, a name someone else
//! holds as `NameTaken` (see [`crate::identity`]). Also the pods of a rendezvous group's ranks
//! (node pairs, the multi-node DDP probe), their deadline and the run's rendezvous secret.

use super::common::{CREATE_CONCURRENCY, DEADLINE_MARGIN_SECONDS, publish};
use crate::controller::run::context::RunContext;
use crate::error::{Error, Result};
use crate::pairs::pods::{SECRET_KEY, secret_name};
use crate::pods;
use crate::results::PodState;
use crate::time::to_chrono;
use chrono::Utc;
use futures::StreamExt;
use gpufabric_api::keys;
use gpufabric_api::outcome::{NodeOutcome, NotMeasuredReason};
use gpufabric_api::run::{FabricTestRun, NodeRunResult};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

pub(super) fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        _ => true,
    }
}

/// Why the pod of a rank could not be made, for good: the group's ranks are then not
/// measured, with this reason.
#[derive(Debug, thiserror::Error)]
pub(super) enum NotAdmitted {
    #[error("node {0} no longer exists")]
    NodeGone(String),
    #[error(transparent)]
    Build(#[from] pods::BuildError),
    /// The API server refused the pod for good (not a transient error).
    #[error(transparent)]
    Refused(kube::Error),
    /// Someone else's pod holds the name.
    #[error(transparent)]
    NameTaken(NameTaken),
    /// The run's rendezvous Secret is not the one it made.
    #[error(transparent)]
    Secret(SecretRefused),
    /// The ResourceClaimTemplate of a pod that claims its GPUs could not be made.
    #[error("{0}")]
    Template(String),
}

/// What became of a rank's pod.
#[derive(Debug)]
pub(super) enum RankMade {
    /// Made, with the UID to record.
    Made(String),
    /// A pod the run controls but never recorded held the name: deleted, made again later.
    Later,
    /// Not made, for good.
    Not(NotAdmitted),
}

/// Creates the pod of one rank of a rendezvous group on `node`, built by `build` from the
/// node's GPU count and asking for them as every benchmark pod does ([`super::gpus`]; see
/// [`RankMade`]); Err on a transient error (retried). A name already taken is never taken
/// for a pod made (see [`on_conflict`]).
pub(super) async fn create_rank_pod(
    run: &FabricTestRun,
    node: &str,
    build: impl FnOnce(u32) -> std::result::Result<Pod, pods::BuildError>,
    ctx: &RunContext,
    run_uid: &str,
    pods_api: &Api<Pod>,
) -> Result<RankMade> {
    let Some(n) = ctx.nodes.get(&ObjectRef::new(node)) else {
        return Ok(RankMade::Not(NotAdmitted::NodeGone(node.to_string())));
    };
    let devices = super::gpus::devices(ctx).await?;
    let pod = match super::gpus::prepare(run, &n, devices.as_ref(), build, ctx, run_uid).await {
        Ok(p) => p,
        Err(CreateError::Build(e)) => return Ok(RankMade::Not(e.into())),
        Err(CreateError::NameTaken(t)) => return Ok(RankMade::Not(NotAdmitted::NameTaken(t))),
        Err(CreateError::Permanent(why)) => return Ok(RankMade::Not(NotAdmitted::Template(why))),
        Err(CreateError::Unrecorded) => return Ok(RankMade::Later),
        Err(CreateError::Transient(e)) => return Err(e.into()),
    };
    let name = pod.name_any();
    match pods_api.create(&PostParams::default(), &pod).await {
        Ok(p) => Ok(match p.uid() {
            Some(uid) => RankMade::Made(uid),
            None => RankMade::Later,
        }),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            match on_conflict(pods_api, &ctx.pod_namespace, &name, run_uid).await? {
                CreateError::NameTaken(t) => Ok(RankMade::Not(NotAdmitted::NameTaken(t))),
                _ => Ok(RankMade::Later),
            }
        }
        Err(e) if is_transient(&e) => Err(e.into()),
        Err(e) => Ok(RankMade::Not(NotAdmitted::Refused(e))),
    }
}

/// One rank of a rendezvous group as the run made it: its pod's name, the node it is for,
/// and the UID recorded when it was made (None: not made, or not recorded).
pub(super) struct RankOf<'a> {
    pub name: String,
    pub node: &'a str,
    pub made: Option<&'a str>,
}

/// The pods of a rendezvous group's ranks, from the pod cache; a pod the cache does not
/// hold yet is read from the API server once the group has any pod (`created`), so that a
/// pod just created is not taken for one that is gone. Only the pod each rank recorded, on
/// its node, is one (see [`crate::identity`]); any other at its name is None.
pub(super) async fn rank_pods(
    ranks: &[RankOf<'_>],
    run_uid: &str,
    cached: &HashMap<String, Arc<Pod>>,
    created: bool,
    pods_api: &Api<Pod>,
) -> Result<Vec<Option<Pod>>> {
    let mut pods = Vec::with_capacity(ranks.len());
    for r in ranks {
        let Some(made) = r.made else {
            pods.push(None);
            continue;
        };
        let found = match cached.get(&r.name) {
            Some(p) => Some(p.as_ref().clone()),
            None if created => pods_api.get_opt(&r.name).await?,
            None => None,
        };
        pods.push(found.filter(|p| {
            let ours = crate::identity::pod_made_by(p, run_uid, made, r.node);
            if let Err(why) = &ours {
                tracing::warn!(%why, "a rank pod not made by this run is not read");
            }
            ours.is_ok()
        }));
    }
    Ok(pods)
}

/// A rendezvous group against its deadline: the agent timeout and the operator's margin,
/// from the creation of its rank-0 pod.
pub(super) struct GroupDeadline {
    /// The deadline has passed.
    pub past: bool,
    /// How long until it passes (and 50 ms), while it has not.
    pub until: Option<Duration>,
}

pub(super) fn group_deadline(run: &FabricTestRun, rank0: Option<&Pod>) -> GroupDeadline {
    let timeout = i64::from(run.spec.agent.timeout_seconds) + DEADLINE_MARGIN_SECONDS;
    let deadline = rank0
        .and_then(|p| p.metadata.creation_timestamp.as_ref())
        .map(|t| to_chrono(t) + chrono::Duration::seconds(timeout));
    let now_t = Utc::now();
    GroupDeadline {
        past: deadline.is_some_and(|d| now_t >= d),
        until: deadline
            .filter(|d| *d > now_t)
            .map(|d| (d - now_t).to_std().unwrap_or_default() + Duration::from_millis(50)),
    }
}

/// Creates the pods of this step, recording each one's name and UID in its node's entry; a
/// pod the API server refuses for good ends its node as not admitted, a name someone else
/// holds as not measured (`NameTaken`, with an Event). Returns the last transient error
/// (the pass is retried), if any.
pub(super) async fn create_step(
    run: &FabricTestRun,
    entries: &mut [NodeRunResult],
    outcomes: &mut [PodState],
    create: &[usize],
    ctx: &RunContext,
    pods_api: &Api<Pod>,
) -> Option<kube::Error> {
    let mut transient = None;
    for (i, res) in create_pods(run, entries, create, ctx, pods_api).await {
        match res {
            Ok(made) => {
                entries[i].pod = Some(made.name);
                entries[i].pod_uid = Some(made.uid);
            }
            Err(CreateError::Build(e)) => {
                outcomes[i] = PodState::Ended(NodeOutcome::not_measured(
                    NotMeasuredReason::NotAdmitted,
                    e.to_string(),
                ))
            }
            Err(CreateError::Permanent(reason)) => {
                outcomes[i] = PodState::Ended(NodeOutcome::not_measured(
                    NotMeasuredReason::NotAdmitted,
                    reason,
                ))
            }
            Err(CreateError::NameTaken(taken)) => {
                let note = format!("node {}: {taken}", entries[i].node);
                tracing::warn!(node = %entries[i].node, %taken, "a benchmark pod's name is taken");
                publish(ctx, run, true, "NameTaken", "CreatePod", &note).await;
                outcomes[i] = PodState::Ended(NodeOutcome::not_measured(
                    NotMeasuredReason::NameTaken,
                    taken.to_string(),
                ))
            }
            // Deleted (see `crate::identity`): made again by a later pass.
            Err(CreateError::Unrecorded) => {}
            Err(CreateError::Transient(e)) => transient = Some(e),
        }
    }
    transient
}

/// A pod this run made: its name and the UID the API server gave it.
pub(super) struct Made {
    pub name: String,
    pub uid: String,
}

pub(super) enum CreateError {
    /// The pod could not be built (its node has no GPUs, the run is not read yet).
    Build(pods::BuildError),
    Permanent(String),
    /// The name is held by an object this run does not control.
    NameTaken(NameTaken),
    /// The name is held by a pod this run controls but never recorded: deleted, not read.
    Unrecorded,
    Transient(kube::Error),
}

/// An object with the name of one this run makes, not made by it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{kind} {namespace}/{name} was there before this run made it, and is not this run's: never read"
)]
pub struct NameTaken {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
}

/// What a 409 on creating pod `name` means: a pod this run controls is one it made and did
/// not record (deleted, with its UID as precondition, and made again later); anything else
/// is someone else's.
pub(super) async fn on_conflict(
    pods_api: &Api<Pod>,
    namespace: &str,
    name: &str,
    run_uid: &str,
) -> std::result::Result<CreateError, kube::Error> {
    let taken = || {
        CreateError::NameTaken(NameTaken {
            kind: "pod",
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    };
    let Some(p) = pods_api.get_opt(name).await? else {
        // Gone since: made by a later pass.
        return Ok(CreateError::Unrecorded);
    };
    if !crate::identity::controlled_by(&p.metadata, run_uid) {
        return Ok(taken());
    }
    if let Some(uid) = p.metadata.uid.as_deref() {
        match super::deadline::delete_unrecorded(pods_api, name, uid).await {
            Ok(()) => {}
            Err(crate::error::Error::Kube(e)) => return Err(e),
            Err(e) => tracing::warn!(pod = %name, error = %e, "unrecorded pod not deleted"),
        }
    }
    Ok(CreateError::Unrecorded)
}

/// Creates the missing pods, at most [`CREATE_CONCURRENCY`] at once. A name already taken
/// is never taken for a pod made (see [`on_conflict`]).
pub(super) async fn create_pods(
    run: &FabricTestRun,
    entries: &[NodeRunResult],
    which: &[usize],
    ctx: &RunContext,
    pods_api: &Api<Pod>,
) -> Vec<(usize, Result<Made, CreateError>)> {
    let run_uid = run.uid().unwrap_or_default();
    // Which nodes' GPUs are DRA devices, read once for the pods made now.
    let devices = if which.is_empty() {
        None
    } else {
        match super::gpus::devices(ctx).await {
            Ok(v) => v,
            Err(e) => {
                return which
                    .iter()
                    .map(|&i| (i, Err(CreateError::Transient(clone_error(&e)))))
                    .collect();
            }
        }
    };
    let devices = devices.as_ref();
    let jobs: Vec<_> = which
        .iter()
        .copied()
        .map(|i| {
            let node_name = entries[i].node.clone();
            let node: Option<Arc<Node>> = ctx.nodes.get(&ObjectRef::new(&node_name));
            let run_uid = run_uid.clone();
            async move {
                let Some(node) = node else {
                    return (
                        i,
                        Err(CreateError::Permanent(format!(
                            "node {node_name} no longer exists"
                        ))),
                    );
                };
                let build = |gpus| pods::node_check_pod(run, &node_name, gpus);
                let pod =
                    match super::gpus::prepare(run, &node, devices, build, ctx, &run_uid).await {
                        Ok(p) => p,
                        Err(e) => return (i, Err(e)),
                    };
                let name = pod.name_any();
                let res = match pods_api.create(&PostParams::default(), &pod).await {
                    Ok(p) => match p.uid() {
                        Some(uid) => Ok(Made { name, uid }),
                        None => Err(CreateError::Permanent(
                            "the API server gave the benchmark pod no UID".to_string(),
                        )),
                    },
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        Err(on_conflict(pods_api, &ctx.pod_namespace, &name, &run_uid)
                            .await
                            .unwrap_or_else(CreateError::Transient))
                    }
                    Err(e) if is_transient(&e) => Err(CreateError::Transient(e)),
                    Err(e) => Err(CreateError::Permanent(format!(
                        "the benchmark pod could not be created: {e}"
                    ))),
                };
                (i, res)
            }
        })
        .collect();
    futures::stream::iter(jobs)
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect()
        .await
}

/// A kube error again, for each pod it stops (kube's error is not `Clone`).
fn clone_error(e: &kube::Error) -> kube::Error {
    match e {
        kube::Error::Api(s) => kube::Error::Api(s.clone()),
        other => kube::Error::Service(other.to_string().into()),
    }
}

/// Why the run's rendezvous Secret is not used: the phase that needs it fails closed (its
/// groups not measured), for a secret someone else chose would let them into the
/// rendezvous.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(super) enum SecretRefused {
    #[error(transparent)]
    NameTaken(NameTaken),
}

/// The run's rendezvous secret (random, 32 bytes as hex), in a Secret the run owns, and its
/// UID to record; `made`: the UID recorded, when the run made it before (kept as it is).
/// The operator may only create Secrets, never read one: a Secret at the name that this
/// run has not recorded making, whoever made it, is never used (an operator that made it and
/// stopped before it recorded it loses the phase of this run, never its secrecy).
pub(super) async fn ensure_secret(
    run: &FabricTestRun,
    ctx: &RunContext,
    made: Option<&str>,
) -> Result<std::result::Result<String, SecretRefused>> {
    if let Some(made) = made {
        return Ok(Ok(made.to_string()));
    }
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.pod_namespace);
    let base = pods::run_base(run).map_err(|_| Error::Missing("metadata.uid"))?;
    let name = secret_name(&base);
    let bytes: [u8; 32] = rand::random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let owner = pods::owner_reference(run).map_err(|_| Error::Missing("metadata.uid"))?;
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ctx.pod_namespace.clone()),
            owner_references: Some(vec![owner]),
            labels: Some(BTreeMap::from([(
                keys::LABEL_RUN.to_string(),
                run.name_any(),
            )])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            SECRET_KEY.to_string(),
            ByteString(hex.into_bytes()),
        )])),
        ..Default::default()
    };
    match api.create(&PostParams::default(), &secret).await {
        Ok(s) => Ok(Ok(s
            .uid()
            .ok_or(Error::Missing("the rendezvous Secret's UID"))?)),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Err(SecretRefused::NameTaken(NameTaken {
            kind: "Secret",
            namespace: ctx.pod_namespace.clone(),
            name,
        }))),
        Err(e) => Err(e.into()),
    }
}
