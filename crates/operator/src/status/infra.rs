//! Many nodes of one run not measured for one reason: the environment is at fault, not
//! the nodes (the `InfrastructureDegraded` condition and its message).

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

/// The most common reason of a run's not-measured nodes, when at least half of its nodes
/// (and at least two) share it.
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
    if hit.len() < INFRASTRUCTURE_MIN_NODES
        || (hit.len() as f64) < INFRASTRUCTURE_SHARE * total as f64
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::not_measured;

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
        assert_eq!(
            infrastructure_issue(&[pull("a")]),
            None,
            "one node is no pattern"
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
