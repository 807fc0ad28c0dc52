//! The pods of a rendezvous group (the two of a node pair, the k of the multi-node DDP
//! probe), built without a client from the node-check pod (same pinning, GPUs,
//! tolerations, deadline, no credentials): the rank-0 pod listens on its own pod IP, the
//! others are created once that IP is known, and all read the run's rendezvous secret from
//! a Secret owned by the run.

use super::rounds::NodePair;
use crate::names;
use crate::pods::{BuildError, CONTAINER, node_check_pod};
use gpufabric_api::keys;
use gpufabric_api::run::FabricTestRun;
use k8s_openapi::api::core::v1::{
    EnvVar, EnvVarSource, ObjectFieldSelector, Pod, SecretKeySelector,
};
use kube::Resource;

/// Value of the `gpufabric.io/role` label on node-pair pods.
pub const ROLE_NODE_PAIR: &str = "node-pair";
/// Port the rank-0 pod listens on for the rendezvous.
pub const RENDEZVOUS_PORT: u16 = 29400;
/// Key of the rendezvous secret in the run's Secret.
pub const SECRET_KEY: &str = "rendezvous-secret";
/// Env the rank-0 pod reads its own IP from (downward API `status.podIP`).
const ENV_POD_IP: &str = "FABRIC_POD_IP";

/// Where a pair pod finds its peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rendezvous {
    /// Rank 0: listen on the pod's own IP.
    Listen,
    /// Rank 1: connect to rank 0's pod IP.
    Join { rank0_ip: String },
}

/// Name of the run's Secret holding the rendezvous secret; `run` is the run's
/// [`crate::names::run_base`].
pub fn secret_name(run: &str) -> String {
    names::bounded(&format!("{run}-rendezvous"), 253)
}

/// The rendezvous group of pair `index` of `round` in `run` (the same on both pods).
pub fn group_name(run: &str, round: usize, index: usize) -> String {
    format!("{run}/r{round}/p{index}")
}

/// Name of the pod of `rank` of pair `index` of `round` in the run whose
/// [`crate::names::run_base`] is `run`.
pub fn pod_name(run: &str, round: usize, index: usize, rank: u32) -> String {
    names::bounded(&format!("{run}-r{round}-p{index}-{rank}"), 63)
}

/// The pod of `rank` (0 or 1) of `pair`, in round `round` as pair `index`, on a node of
/// `gpus` GPUs; `bytes` is the message size of each collective, and `all_to_all` adds
/// all_to_all to all_reduce and sendrecv.
pub fn pair_pod(
    run: &FabricTestRun,
    pair: &NodePair,
    (round, index): (usize, usize),
    rendezvous: &Rendezvous,
    gpus: u32,
    bytes: u64,
    all_to_all: bool,
) -> Result<Pod, BuildError> {
    let rank = match rendezvous {
        Rendezvous::Listen => 0,
        Rendezvous::Join { .. } => 1,
    };
    let run_name = run.meta().name.clone().ok_or(BuildError::RunNotPersisted)?;
    let mut command: Vec<String> = vec![
        "fabric-agent".into(),
        "node-pair".into(),
        "--bytes".into(),
        bytes.to_string(),
        "--rendezvous-timeout".into(),
        rendezvous_timeout(run).to_string(),
    ];
    if all_to_all {
        command.extend(["--collectives".into(), "allReduce,sendRecv,allToAll".into()]);
    }
    rank_pod(
        run,
        RankPod {
            node: if rank == 0 { &pair.a } else { &pair.b },
            gpus,
            name: pod_name(&crate::pods::run_base(run)?, round, index, rank),
            role: ROLE_NODE_PAIR,
            rank,
            group: group_name(&run_name, round, index),
            rendezvous,
            command,
            env: vec![(keys::ENV_PAIR_NODES, format!("{},{}", pair.a, pair.b))],
        },
    )
}

/// How long a rank waits for the others (`--rendezvous-timeout`, seconds): the later ranks
/// start after rank 0 has an IP, and all wait at most a third of the pod's deadline.
pub fn rendezvous_timeout(run: &FabricTestRun) -> u64 {
    (u64::from(run.spec.agent.timeout_seconds) / 3).max(10)
}

/// One rank's pod of a rendezvous group (a node pair, the multi-node DDP probe).
pub struct RankPod<'a> {
    pub node: &'a str,
    pub gpus: u32,
    pub name: String,
    /// Value of the `gpufabric.io/role` label.
    pub role: &'a str,
    pub rank: u32,
    pub group: String,
    pub rendezvous: &'a Rendezvous,
    /// The agent's command line.
    pub command: Vec<String>,
    /// Further variables for the agent.
    pub env: Vec<(&'a str, String)>,
}

/// The pod of one rank, built from the node-check pod (same pinning, GPUs, tolerations,
/// deadline, no credentials; on a node whose GPUs are DRA devices it claims them as that pod
/// does, through [`crate::pods::claim::benchmark_pod`]): rank 0 listens on its own pod IP,
/// the others join it there, and every rank reads the run's rendezvous secret from the
/// Secret the run owns.
pub fn rank_pod(run: &FabricTestRun, r: RankPod<'_>) -> Result<Pod, BuildError> {
    let mut pod = node_check_pod(run, r.node, r.gpus)?;
    pod.metadata.name = Some(r.name);
    if let Some(labels) = pod.metadata.labels.as_mut() {
        labels.insert(keys::LABEL_ROLE.into(), r.role.into());
    }
    let Some(container) = pod
        .spec
        .as_mut()
        .and_then(|s| s.containers.iter_mut().find(|c| c.name == CONTAINER))
    else {
        return Err(BuildError::RunNotPersisted);
    };
    container.command = Some(r.command);
    let env = container.env.get_or_insert_with(Vec::new);
    let extra: Vec<&str> = r.env.iter().map(|(k, _)| *k).collect();
    let ours = [
        keys::ENV_RANK,
        keys::ENV_GROUP,
        keys::ENV_RENDEZVOUS,
        keys::ENV_RENDEZVOUS_SECRET,
        ENV_POD_IP,
    ];
    env.retain(|e| !ours.contains(&e.name.as_str()) && !extra.contains(&e.name.as_str()));
    let value = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        ..Default::default()
    };
    env.push(value(keys::ENV_RANK, r.rank.to_string()));
    for (k, v) in r.env {
        env.push(value(k, v));
    }
    env.push(value(keys::ENV_GROUP, r.group));
    match r.rendezvous {
        Rendezvous::Listen => {
            env.push(EnvVar {
                name: ENV_POD_IP.into(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "status.podIP".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
            // Kubernetes expands $(VAR) of an env defined before it.
            env.push(value(
                keys::ENV_RENDEZVOUS,
                format!("$({ENV_POD_IP}):{RENDEZVOUS_PORT}"),
            ));
        }
        Rendezvous::Join { rank0_ip } => {
            env.push(value(
                keys::ENV_RENDEZVOUS,
                format!("{}:{RENDEZVOUS_PORT}", bracketed(rank0_ip)),
            ));
        }
    }
    env.push(EnvVar {
        name: keys::ENV_RENDEZVOUS_SECRET.into(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret_name(&crate::pods::run_base(run)?),
                key: SECRET_KEY.into(),
                optional: Some(false),
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    Ok(pod)
}

/// An IPv6 address in brackets, so that `:port` can follow it.
fn bracketed(ip: &str) -> String {
    if ip.contains(':') && !ip.starts_with('[') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::run::FabricTestRunSpec;

    fn run() -> FabricTestRun {
        let spec: FabricTestRunSpec = serde_json::from_value(serde_json::json!({
            "test": "nightly",
            "trigger": "Schedule",
            "nodes": ["a", "b"],
        }))
        .unwrap_or_else(|e| panic!("a minimal run spec parses: {e}"));
        let mut run = FabricTestRun::new("nightly-0200", spec);
        run.metadata.uid = Some("uid-1".into());
        run
    }

    fn pair() -> NodePair {
        NodePair {
            a: "h200-01".into(),
            b: "h200-02".into(),
        }
    }

    fn env_of(pod: &Pod) -> Vec<EnvVar> {
        pod.spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.env.clone())
            .unwrap_or_default()
    }

    fn value(env: &[EnvVar], name: &str) -> Option<String> {
        env.iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value.clone())
    }

    #[test]
    fn rank_0_listens_on_its_pod_ip_and_runs_on_the_first_node() {
        let pod = pair_pod(
            &run(),
            &pair(),
            (1, 3),
            &Rendezvous::Listen,
            8,
            1 << 30,
            false,
        )
        .expect("builds");
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some("h200-01"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        let base = crate::pods::run_base(&run()).expect("persisted");
        assert!(base.starts_with("nightly-0200-"), "{base}");
        assert_eq!(pod.metadata.name, Some(format!("{base}-r1-p3-0")));
        assert_eq!(
            pod.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(keys::LABEL_ROLE))
                .map(String::as_str),
            Some(ROLE_NODE_PAIR)
        );
        let env = env_of(&pod);
        assert_eq!(value(&env, keys::ENV_RANK).as_deref(), Some("0"));
        assert_eq!(
            value(&env, keys::ENV_PAIR_NODES).as_deref(),
            Some("h200-01,h200-02")
        );
        assert_eq!(
            value(&env, keys::ENV_GROUP).as_deref(),
            Some("nightly-0200/r1/p3")
        );
        assert_eq!(
            value(&env, keys::ENV_RENDEZVOUS).as_deref(),
            Some("$(FABRIC_POD_IP):29400")
        );
        let ip = env.iter().position(|e| e.name == ENV_POD_IP);
        let rv = env.iter().position(|e| e.name == keys::ENV_RENDEZVOUS);
        assert!(ip < rv, "the pod IP is defined before it is expanded");
        let secret = env
            .iter()
            .find(|e| e.name == keys::ENV_RENDEZVOUS_SECRET)
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.secret_key_ref.as_ref())
            .expect("secret from a Secret");
        assert_eq!(secret.name, format!("{base}-rendezvous"));
        assert_eq!(secret.key, SECRET_KEY);
        assert!(
            value(&env, keys::ENV_RENDEZVOUS_SECRET).is_none(),
            "never inline"
        );
        let command = spec.containers[0].command.clone().unwrap_or_default();
        assert_eq!(&command[..2], &["fabric-agent", "node-pair"]);
    }

    #[test]
    fn rank_1_joins_rank_0_by_ip_on_the_second_node() {
        let join = Rendezvous::Join {
            rank0_ip: "10.1.2.3".into(),
        };
        let pod = pair_pod(&run(), &pair(), (0, 0), &join, 8, 1 << 20, true).expect("builds");
        assert_eq!(
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some("h200-02")
        );
        let env = env_of(&pod);
        assert_eq!(value(&env, keys::ENV_RANK).as_deref(), Some("1"));
        assert_eq!(
            value(&env, keys::ENV_RENDEZVOUS).as_deref(),
            Some("10.1.2.3:29400")
        );
        assert!(env.iter().all(|e| e.name != ENV_POD_IP));
        let command = pod.spec.as_ref().map(|s| s.containers[0].command.clone());
        assert!(
            command
                .flatten()
                .is_some_and(|c| c
                    .ends_with(&["--collectives".into(), "allReduce,sendRecv,allToAll".into()])),
            "all_to_all asked for"
        );
        let v6 = Rendezvous::Join {
            rank0_ip: "fd00::7".into(),
        };
        let pod = pair_pod(&run(), &pair(), (0, 0), &v6, 8, 1 << 20, false).expect("builds");
        assert_eq!(
            value(&env_of(&pod), keys::ENV_RENDEZVOUS).as_deref(),
            Some("[fd00::7]:29400")
        );
    }

    #[test]
    fn a_node_without_gpus_gets_no_pair_pod() {
        let err = pair_pod(&run(), &pair(), (0, 0), &Rendezvous::Listen, 0, 8, false)
            .expect_err("no GPUs");
        assert!(matches!(err, BuildError::NoGpus(ref n) if n == "h200-01"));
    }
}
