//! Benchmark pods created with bounded concurrency; a pod the API server refuses for good
//! ends its node as not admitted. Also the pods of a rendezvous group's ranks (node pairs,
//! the multi-node DDP probe), their deadline and the run's rendezvous secret.

use super::common::{CREATE_CONCURRENCY, DEADLINE_MARGIN_SECONDS};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::names;
use crate::pairs::pods::{SECRET_KEY, secret_name};
use crate::pods::{self, allocatable_gpus};
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
}

/// Creates the pod of one rank of a rendezvous group on `node`, built by `build` from the
/// node's GPU count; Ok(Err(why)) when it cannot be made or the API server refuses it for
/// good (the node is gone, a pod it rejects), Err on a transient error (retried). A pod that
/// exists already (a retried pass) counts as created.
pub(super) async fn create_rank_pod(
    node: &str,
    build: impl FnOnce(u32) -> std::result::Result<Pod, pods::BuildError>,
    ctx: &Context,
    pods_api: &Api<Pod>,
) -> Result<std::result::Result<(), NotAdmitted>> {
    let Some(n) = ctx.nodes.get(&ObjectRef::new(node)) else {
        return Ok(Err(NotAdmitted::NodeGone(node.to_string())));
    };
    let mut pod = match build(allocatable_gpus(&n)) {
        Ok(p) => p,
        Err(e) => return Ok(Err(e.into())),
    };
    ctx.resolve_agent_image(&mut pod);
    match pods_api.create(&PostParams::default(), &pod).await {
        Ok(_) => Ok(Ok(())),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Ok(())),
        Err(e) if is_transient(&e) => Err(e.into()),
        Err(e) => Ok(Err(NotAdmitted::Refused(e))),
    }
}

/// The pods of a rendezvous group's ranks (`names`, by rank), from the pod cache; a pod
/// the cache does not hold yet is read from the API server once the group has any pod
/// (`created`), so that a pod just created is not taken for one that is gone.
pub(super) async fn rank_pods(
    names: &[String],
    cached: &HashMap<String, Arc<Pod>>,
    created: bool,
    pods_api: &Api<Pod>,
) -> Result<Vec<Option<Pod>>> {
    let mut pods = Vec::with_capacity(names.len());
    for n in names {
        pods.push(match cached.get(n) {
            Some(p) => Some(p.as_ref().clone()),
            None if created => pods_api.get_opt(n).await?,
            None => None,
        });
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

/// Creates the pods of this step; a pod the API server refuses for good ends its node as
/// not admitted. Returns the last transient error (the pass is retried), if any.
pub(super) async fn create_step(
    run: &FabricTestRun,
    entries: &mut [NodeRunResult],
    outcomes: &mut [PodState],
    create: &[usize],
    ctx: &Context,
    pods_api: &Api<Pod>,
) -> Option<kube::Error> {
    let name = run.name_any();
    let mut transient = None;
    for (i, res) in create_pods(run, entries, create, ctx, pods_api).await {
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
    transient
}

pub(super) enum CreateError {
    Permanent(String),
    Transient(kube::Error),
}

/// Creates the missing pods, at most [`CREATE_CONCURRENCY`] at once. A pod that already
/// exists counts as created.
pub(super) async fn create_pods(
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

/// The run's rendezvous secret (random, 32 bytes as hex), in a Secret the run owns; one
/// that exists already is kept (a restarted operator, a retried pass).
pub(super) async fn ensure_secret(run: &FabricTestRun, ctx: &Context) -> Result<()> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.pod_namespace);
    let name = secret_name(&run.name_any());
    let bytes: [u8; 32] = rand::random();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let owner = pods::owner_reference(run).map_err(|_| Error::Missing("metadata.uid"))?;
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name),
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
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
