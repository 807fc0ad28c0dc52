//! Who owns which quarantine change on a Node, read with no client: what a Node shows
//! about quarantine seen from one FabricTest ([`NodeObservation`]), what of this operator's
//! quarantine someone else undid ([`undone`]), and whose cordon and taints are on it (the
//! managed fields, the operator's taint). `super::node` builds the patches from these.

use super::refusal::Refusal;
use gpufabric_api::keys::{ANNOTATION_REPAIRED, LABEL_QUARANTINED, MANAGER, TAINT_QUARANTINED};
use gpufabric_api::quarantine::QuarantineRecord;
use gpufabric_api::test::NodeHealth;
use gpufabric_health::quarantine::NodeFacts;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;

/// Effect of the operator's own taint.
pub const TAINT_EFFECT: &str = "NoSchedule";

/// What a Node shows about quarantine, seen from one FabricTest.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct NodeObservation {
    /// Node name.
    pub node: String,
    /// The Node object exists.
    pub exists: bool,
    /// The Node object has a deletionTimestamp.
    pub being_deleted: bool,
    /// The quarantine record on the node, when it has a readable one.
    pub record: Option<QuarantineRecord>,
    /// Why the annotation `gpufabric.io/quarantine` could not be read, when it could not.
    /// Such a node is left alone entirely.
    pub record_error: Option<String>,
    /// The record names this test.
    pub quarantined_by_us: bool,
    /// The record names another FabricTest: not ours to touch.
    pub quarantined_by_other_test: Option<String>,
    /// `spec.unschedulable` is true.
    pub unschedulable: bool,
    /// Unschedulable, and no record says this operator cordoned it.
    pub cordoned_by_others: bool,
    /// Carries a taint with the key `gpufabric.io/quarantined` that no record says this
    /// operator added. Other taints (e.g. `nvidia.com/gpu:NoSchedule`, which GPU pools
    /// commonly carry) are not quarantine and do not count.
    pub tainted_by_others: bool,
    /// Carries the label `gpufabric.io/quarantined` that no record says this operator set.
    pub labeled_by_others: bool,
    /// Carries the annotation `gpufabric.io/repaired`: a person says it is back from repair.
    pub repaired: bool,
}

impl NodeObservation {
    /// Observe `node` (None: the Node object does not exist) as the test `test_key`
    /// (its name) sees it.
    pub fn of(name: &str, node: Option<&Node>, test_key: &str) -> Self {
        let Some(node) = node else {
            return NodeObservation {
                node: name.to_string(),
                ..Default::default()
            };
        };
        let (record, record_error) =
            match QuarantineRecord::from_annotations(node.metadata.annotations.as_ref()) {
                Ok(r) => (r, None),
                Err(e) => (None, Some(e.to_string())),
            };
        // A record of any test (or an unreadable one) explains only the changes it names.
        let cordoned_by_record = record.as_ref().is_some_and(|r| r.cordoned);
        let tainted_by_record = record.as_ref().is_some_and(|r| r.tainted);
        let labeled_by_record = record.as_ref().is_some_and(|r| r.labeled);
        let unschedulable = is_unschedulable(node);
        let quarantined_by_us = record.as_ref().is_some_and(|r| r.is_owned_by(test_key));
        let quarantined_by_other_test = record
            .as_ref()
            .filter(|r| !r.is_owned_by(test_key))
            .map(|r| r.test.clone());
        NodeObservation {
            node: name.to_string(),
            exists: true,
            being_deleted: node.metadata.deletion_timestamp.is_some(),
            quarantined_by_us,
            quarantined_by_other_test,
            unschedulable,
            cordoned_by_others: unschedulable && !cordoned_by_record,
            tainted_by_others: has_our_taint_key(node) && !tainted_by_record,
            labeled_by_others: node
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(LABEL_QUARANTINED))
                && !labeled_by_record,
            repaired: node.annotations().contains_key(ANNOTATION_REPAIRED),
            record,
            record_error,
        }
    }

    /// Why this test must leave the node alone, if it must: a node that is gone or being
    /// deleted, an unreadable record, a quarantine by another FabricTest, a cordon or our
    /// taint key put there by someone else.
    pub fn refusal(&self) -> Option<Refusal> {
        if !self.exists {
            return Some(Refusal::Gone);
        }
        if self.being_deleted {
            return Some(Refusal::BeingDeleted);
        }
        if let Some(e) = &self.record_error {
            return Some(Refusal::UnreadableRecord(e.clone()));
        }
        if let Some(t) = &self.quarantined_by_other_test {
            return Some(Refusal::OtherTest(t.clone()));
        }
        if self.cordoned_by_others {
            return Some(Refusal::CordonedByOthers);
        }
        if self.tainted_by_others {
            return Some(Refusal::TaintedByOthers);
        }
        None
    }

    /// The planner's facts for this node. Everything that makes the node not ours to
    /// touch (another test's record, an unreadable record, a cordon or our taint key by
    /// someone else) is reported as `cordoned_by_others`/`tainted_by_others`, so the
    /// planner holds the node back instead of planning an action the executor would refuse.
    pub fn facts(&self, health: NodeHealth, tested: bool) -> NodeFacts {
        NodeFacts {
            node: self.node.clone(),
            health,
            quarantined_by_us: self.quarantined_by_us,
            cordoned_by_others: self.cordoned_by_others
                || self.quarantined_by_other_test.is_some()
                || self.record_error.is_some(),
            tainted_by_others: self.tainted_by_others,
            exists: self.exists,
            tested,
            gpus: Default::default(),
            confirmed: false,
            repaired: self.repaired && tested,
        }
    }
}

/// What someone else did to a quarantine whose record names this test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Undone {
    /// The node was uncordoned.
    Uncordoned,
    /// The node was uncordoned and cordoned again by `by` (a field manager: `kubectl`, a
    /// drain controller): the cordon on it is theirs now.
    CordonedAgain { by: String },
    /// The quarantine taint was removed.
    TaintRemoved,
    /// The quarantine label was removed.
    LabelRemoved,
}

impl Undone {
    /// Whether it reads as "back from repair": the quarantine was lifted (not taken over
    /// by another cordon), so the node is tested at once.
    pub fn is_repair(&self) -> bool {
        !matches!(self, Undone::CordonedAgain { .. })
    }
}

impl std::fmt::Display for Undone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Undone::Uncordoned => f.write_str("uncordoned by someone else"),
            Undone::CordonedAgain { by } => write!(f, "uncordoned and cordoned again by {by}"),
            Undone::TaintRemoved => {
                write!(f, "the taint {TAINT_QUARANTINED} removed by someone else")
            }
            Undone::LabelRemoved => {
                write!(f, "the label {LABEL_QUARANTINED} removed by someone else")
            }
        }
    }
}

/// What of `record`'s quarantine (which this operator made) someone else has undone since,
/// judged from the node as it is now: a change the record names that is gone, or a cordon
/// that another field manager set last. None: the quarantine is as this operator left it.
pub fn undone(node: &Node, record: &QuarantineRecord) -> Option<Undone> {
    if record.cordoned {
        if !is_unschedulable(node) {
            return Some(Undone::Uncordoned);
        }
        if let Some(by) = cordon_manager(node).filter(|m| !is_our_manager(m)) {
            return Some(Undone::CordonedAgain { by: by.to_string() });
        }
    }
    if record.tainted && !taints_of(node).iter().any(is_our_taint) {
        return Some(Undone::TaintRemoved);
    }
    let labeled = node.labels().contains_key(LABEL_QUARANTINED);
    if record.labeled && !labeled {
        return Some(Undone::LabelRemoved);
    }
    None
}

/// The field manager that last set `spec.unschedulable` (from the node's managed fields),
/// when the node says.
pub fn cordon_manager(node: &Node) -> Option<&str> {
    node.metadata
        .managed_fields
        .as_ref()?
        .iter()
        .filter(|m| manages_cordon(m))
        .map(|m| m.manager.as_deref().unwrap_or(""))
        .next()
}

/// This managed-fields entry owns `spec.unschedulable`.
pub fn manages_cordon(
    m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry,
) -> bool {
    m.fields_v1
        .as_ref()
        .and_then(|f| f.0.get("f:spec"))
        .and_then(|s| s.get("f:unschedulable"))
        .is_some()
}

/// A field manager that is this operator: [`MANAGER`], which its node patches name, or
/// `unknown`, which the API server records for a request that names no manager and sends no
/// user agent: how quarantines were written before the patches named one. Every kubectl
/// sends its user agent (`kubectl`), so a person's cordon is never `unknown`.
fn is_our_manager(manager: &str) -> bool {
    manager == MANAGER || manager == LEGACY_MANAGER || manager.is_empty()
}

/// The field manager the API server records for an update that names none and sends no
/// user agent.
const LEGACY_MANAGER: &str = "unknown";

/// The cordon on the node is this operator's as far as the managed fields tell: no other
/// field manager set `spec.unschedulable` last. A node whose managed fields say nothing
/// (they were stripped) is taken at its record's word.
pub(super) fn cordon_is_ours(node: &Node) -> bool {
    cordon_manager(node).is_none_or(is_our_manager)
}

/// `spec.unschedulable` is true.
pub fn is_unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// The node's taints (empty when none).
pub fn taints_of(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

/// The taint this operator adds: key `gpufabric.io/quarantined`, effect NoSchedule.
pub fn is_our_taint(t: &Taint) -> bool {
    t.key == TAINT_QUARANTINED && t.effect == TAINT_EFFECT
}

fn has_our_taint_key(node: &Node) -> bool {
    taints_of(node).iter().any(|t| t.key == TAINT_QUARANTINED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_node_is_reported_not_acted_on() {
        let obs = NodeObservation::of("gone", None, "nightly");
        assert!(!obs.exists);
        assert_eq!(obs.refusal(), Some(Refusal::Gone));
        assert_eq!(Refusal::Gone.to_string(), "the node does not exist");
    }
}
