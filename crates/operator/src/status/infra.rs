//! Many nodes of one run not measured for one reason: the environment is at fault, not
//! the nodes (the `InfrastructureDegraded` condition and its message); and one phase that
//! could not run on every measured node: the test's settings are (the `PhasesNotRun`
//! condition).

use super::condition;
use gpufabric_api::outcome::NotMeasuredReason;
use gpufabric_api::run::{NodeRunResult, NodeVerdict};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use std::collections::BTreeMap;

/// Many nodes of one run not measured for the same reason: the environment is at fault
/// (an image, a Secret, busy GPUs), which a person should hear about once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfrastructureIssue {
    pub reason: NotMeasuredReason,
    /// What Kubernetes called it, e.g. `ImagePullBackOff`, when the nodes agree.
    pub label: String,
    pub nodes: usize,
    pub total: usize,
}

impl InfrastructureIssue {
    /// E.g. `ImagePullBackOff on 16 of 16 nodes: check agent.image and agent.imagePullSecrets`.
    pub fn message(&self) -> String {
        format!(
            "{} on {} of {} nodes: {}",
            self.label,
            self.nodes,
            self.total,
            self.reason.advice()
        )
    }
}

/// The Kubernetes reason a not-measured detail starts with (`ImagePullBackOff: ...`), or
/// the one inside a kubelet refusal (`the kubelet refused the pod: OutOfnvidia.com/gpu: ...`).
fn kube_reason(detail: &str) -> Option<&str> {
    let rest = detail
        .strip_prefix("the kubelet refused the pod: ")
        .unwrap_or(detail);
    let word = rest.split([':', ';']).next()?.trim();
    (!word.is_empty() && !word.contains(' ') && word.starts_with(|c: char| c.is_ascii_uppercase()))
        .then_some(word)
}

/// Nodes of this share of a run (and at least [`INFRASTRUCTURE_MIN_NODES`]) not measured
/// for one reason make an [`InfrastructureIssue`].
pub const INFRASTRUCTURE_SHARE: f64 = 0.5;
pub const INFRASTRUCTURE_MIN_NODES: usize = 2;

/// Reasons that name the test's own settings, the same for every node it runs on: its image
/// and pull Secrets, the Secrets and ConfigMaps its env reads. When every node of a run has
/// one, the test is at fault, even in a run of one node.
const SETTINGS_REASONS: [NotMeasuredReason; 2] = [
    NotMeasuredReason::ImagePull,
    NotMeasuredReason::ContainerConfig,
];

/// The most common reason of a run's not-measured nodes, when at least half of its nodes
/// (and at least two) share it, or every node for a reason of the test's settings.
pub fn infrastructure_issue(nodes: &[NodeRunResult]) -> Option<InfrastructureIssue> {
    let mut by_reason: BTreeMap<NotMeasuredReason, Vec<&NodeRunResult>> = BTreeMap::new();
    for n in nodes {
        if let Some(r) = n
            .not_measured
            .filter(|_| n.verdict == NodeVerdict::NotMeasured)
        {
            by_reason.entry(r).or_default().push(n);
        }
    }
    let (reason, hit) = by_reason
        .into_iter()
        .max_by_key(|(r, v)| (v.len(), std::cmp::Reverse(*r)))?;
    let total = nodes.len();
    let everywhere = hit.len() == total && SETTINGS_REASONS.contains(&reason);
    if !everywhere
        && (hit.len() < INFRASTRUCTURE_MIN_NODES
            || (hit.len() as f64) < INFRASTRUCTURE_SHARE * total as f64)
    {
        return None;
    }
    let labels: std::collections::BTreeSet<&str> = hit
        .iter()
        .map(|n| {
            n.reason
                .as_deref()
                .and_then(kube_reason)
                .unwrap_or(reason.as_str())
        })
        .collect();
    let label = match labels.len() {
        1 => labels
            .into_iter()
            .next()
            .unwrap_or(reason.as_str())
            .to_string(),
        _ => reason.as_str().to_string(),
    };
    Some(InfrastructureIssue {
        reason,
        label,
        nodes: hit.len(),
        total,
    })
}

/// Condition type on a FabricTest whose latest run left many nodes unmeasured for one reason.
pub const CONDITION_INFRASTRUCTURE_DEGRADED: &str = "InfrastructureDegraded";

/// The `InfrastructureDegraded` condition from the latest folded run (its name and every
/// node's result); without that run (deleted by the history limits) the previous
/// condition stays.
pub fn infrastructure_condition(
    previous: &[Condition],
    last_run: Option<(&str, &[NodeRunResult])>,
    generation: Option<i64>,
    now: &Time,
) -> Option<Condition> {
    let Some((run, nodes)) = last_run else {
        return previous
            .iter()
            .find(|c| c.type_ == CONDITION_INFRASTRUCTURE_DEGRADED)
            .cloned();
    };
    Some(match infrastructure_issue(nodes) {
        Some(issue) => condition(
            previous,
            CONDITION_INFRASTRUCTURE_DEGRADED,
            true,
            issue.reason.as_str(),
            format!("{run}: {}", issue.message()),
            generation,
            now,
        ),
        None => condition(
            previous,
            CONDITION_INFRASTRUCTURE_DEGRADED,
            false,
            "NodesMeasured",
            format!("{run}: most nodes were measured"),
            generation,
            now,
        ),
    })
}

/// Condition type on a FabricTest whose latest run could not run a phase of its suite on any
/// measured node: NCCL refused the test's settings, or the suite asks for what no node does.
pub const CONDITION_PHASES_NOT_RUN: &str = "PhasesNotRun";

/// The phases that could not run on every measured node of a run (at least
/// [`INFRASTRUCTURE_MIN_NODES`] of them), and how many nodes that is: the same refusal
/// everywhere is the test's, said once, not a matter of each node.
pub fn phases_not_run_everywhere(nodes: &[NodeRunResult]) -> Option<(Vec<String>, usize)> {
    // Nodes with a result: a hardware fault without one says nothing of the phases.
    let measured: Vec<&NodeRunResult> = nodes
        .iter()
        .filter(|n| matches!(n.verdict, NodeVerdict::Passed | NodeVerdict::Failed))
        .collect();
    if measured.len() < INFRASTRUCTURE_MIN_NODES {
        return None;
    }
    let first = measured.first()?;
    let common: Vec<String> = first
        .unmeasured
        .iter()
        .filter(|p| measured.iter().all(|n| n.unmeasured.contains(p)))
        .cloned()
        .collect();
    (!common.is_empty()).then_some((common, measured.len()))
}

/// The `PhasesNotRun` condition from the latest folded run, naming the test's own NCCL
/// settings (`nccl_settings`, the `NCCL_*` names of `spec.agent.env`) as the likely cause;
/// without that run the previous condition stays.
pub fn phases_not_run_condition(
    previous: &[Condition],
    last_run: Option<(&str, &[NodeRunResult])>,
    nccl_settings: &[String],
    generation: Option<i64>,
    now: &Time,
) -> Option<Condition> {
    let Some((run, nodes)) = last_run else {
        return previous
            .iter()
            .find(|c| c.type_ == CONDITION_PHASES_NOT_RUN)
            .cloned();
    };
    Some(match phases_not_run_everywhere(nodes) {
        Some((phases, count)) => {
            let cause = if nccl_settings.is_empty() {
                "check the suite, and NCCL settings the nodes bring (an image, a host's /etc/nccl.conf)".to_string()
            } else {
                format!(
                    "NCCL refuses settings of spec.agent.env ({}) or the suite: change them",
                    nccl_settings.join(", ")
                )
            };
            condition(
                previous,
                CONDITION_PHASES_NOT_RUN,
                true,
                "SettingsRefused",
                format!(
                    "{run}: {} could not run on any of the {count} measured nodes; no node is at fault: {cause}",
                    phases.join(", ")
                ),
                generation,
                now,
            )
        }
        None => condition(
            previous,
            CONDITION_PHASES_NOT_RUN,
            false,
            "PhasesRan",
            format!("{run}: every phase ran on some node"),
            generation,
            now,
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::not_measured;

    fn measured(node: &str, unmeasured: &[&str]) -> NodeRunResult {
        NodeRunResult {
            node: node.into(),
            verdict: NodeVerdict::Passed,
            unmeasured: unmeasured.iter().map(|p| p.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_phase_refused_on_every_node_is_one_condition_naming_the_tests_setting() {
        let nodes: Vec<_> = (0..16)
            .map(|i| measured(&format!("n{i}"), &["ncclSweep"]))
            .collect();
        let at = crate::time::to_time(chrono::Utc::now());
        let c = phases_not_run_condition(
            &[],
            Some(("t-1", &nodes)),
            &["NCCL_ALGO".into()],
            Some(1),
            &at,
        )
        .expect("condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "SettingsRefused")
        );
        assert!(
            c.message
                .contains("ncclSweep could not run on any of the 16 measured nodes")
                && c.message.contains("spec.agent.env (NCCL_ALGO)"),
            "{}",
            c.message
        );
        // One node that ran it: the phase is that node's matter, not the test's.
        let mut mixed = nodes.clone();
        mixed.push(measured("ok", &[]));
        let c = phases_not_run_condition(&[], Some(("t-2", &mixed)), &[], Some(1), &at)
            .expect("condition");
        assert_eq!(c.status, "False");
        // Nodes not measured at all say nothing of the phases.
        let mut with_absent = nodes[..2].to_vec();
        with_absent.push(not_measured(
            "x",
            NotMeasuredReason::ImagePull,
            "ImagePullBackOff",
        ));
        assert_eq!(
            phases_not_run_everywhere(&with_absent),
            Some((vec!["ncclSweep".to_string()], 2))
        );
        assert_eq!(
            phases_not_run_everywhere(&nodes[..1]),
            None,
            "one node is no pattern"
        );
    }

    #[test]
    fn many_nodes_unmeasured_for_one_reason_are_an_infrastructure_issue() {
        let pull = |n: &str| {
            not_measured(
                n,
                NotMeasuredReason::ImagePull,
                "ImagePullBackOff: Back-off pulling image \"does-not-exist\"",
            )
        };
        let nodes: Vec<_> = (0..16).map(|i| pull(&format!("n{i}"))).collect();
        let issue = infrastructure_issue(&nodes).expect("an issue");
        assert_eq!(
            issue.message(),
            "ImagePullBackOff on 16 of 16 nodes: check agent.image and agent.imagePullSecrets"
        );
        // Half of the nodes, and at least two.
        let mut mixed = vec![pull("a"), pull("b")];
        mixed.extend((0..2).map(|i| NodeRunResult {
            node: format!("ok{i}"),
            verdict: NodeVerdict::Passed,
            ..Default::default()
        }));
        assert_eq!(infrastructure_issue(&mixed).map(|i| i.nodes), Some(2));
        mixed.push(NodeRunResult {
            node: "ok9".into(),
            verdict: NodeVerdict::Failed,
            ..Default::default()
        });
        assert_eq!(infrastructure_issue(&mixed), None, "2 of 5 is not half");
        // One node is no pattern, but the test's own image is the test's on every node.
        assert_eq!(
            infrastructure_issue(&[pull("a")]).map(|i| i.message()),
            Some(
                "ImagePullBackOff on 1 of 1 nodes: check agent.image and agent.imagePullSecrets"
                    .into()
            ),
            "a run of one node that cannot pull the test's image"
        );
        let passed = |n: &str| NodeRunResult {
            node: n.into(),
            verdict: NodeVerdict::Passed,
            ..Default::default()
        };
        assert_eq!(
            infrastructure_issue(&[pull("a"), passed("b")]),
            None,
            "one node of two that cannot pull is that node's matter"
        );
        let preempted = not_measured("a", NotMeasuredReason::Preempted, "Preempted");
        assert_eq!(
            infrastructure_issue(&[preempted]),
            None,
            "a run of one node preempted is no pattern"
        );
        // The kubelet's refusal names the resource; different details fall back to the kind.
        let busy = |n: &str, r: &str| {
            not_measured(
                n,
                NotMeasuredReason::NotAdmitted,
                &format!("the kubelet refused the pod: {r}: Pod was rejected"),
            )
        };
        let same = [
            busy("a", "OutOfnvidia.com/gpu"),
            busy("b", "OutOfnvidia.com/gpu"),
        ];
        assert_eq!(
            infrastructure_issue(&same).map(|i| i.label),
            Some("OutOfnvidia.com/gpu".into())
        );
        let differ = [busy("a", "OutOfnvidia.com/gpu"), busy("b", "NodeAffinity")];
        assert_eq!(
            infrastructure_issue(&differ).map(|i| i.label),
            Some("NotAdmitted".into())
        );
    }
}
