//! Pure decisions on one Node: the single guarded patch that quarantines, releases or hands
//! back a quarantine. Who owns which change is read in `super::ownership`. No client here;
//! `super::apply` applies the steps.

use super::ownership::{
    NodeObservation, TAINT_EFFECT, cordon_is_ours, is_our_taint, is_unschedulable, taints_of,
    undone,
};
use super::refusal::Refusal;
use gpufabric_api::keys::{ANNOTATION_QUARANTINE, LABEL_QUARANTINED, TAINT_QUARANTINED};
use gpufabric_api::quarantine::QuarantineRecord;
use gpufabric_health::quarantine::Enforcement;
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use serde_json::{Map, Value, json};

/// What to do to one node.
#[derive(Clone, Debug, PartialEq)]
pub enum QuarantineStep {
    /// Send this JSON merge patch. It carries the resourceVersion it was computed from, so
    /// the API server rejects it (409 Conflict) if the node changed in between.
    Patch {
        patch: Value,
        /// The record the node has after the patch (None: removed).
        record: Option<QuarantineRecord>,
        /// The changes made, for Events and logs: "label", "cordon", "taint", "record".
        changes: Vec<&'static str>,
    },
    /// Already quarantined by this test: nothing changes; the record it has.
    AlreadyQuarantined(QuarantineRecord),
    /// No record of this test on the node: nothing to release.
    AlreadyReleased,
    /// Not ours to touch.
    Refuse(Refusal),
}

/// The step that quarantines `node` for the test `test_key`, changing what `enforcement`
/// names. Only what is missing is changed, and the record says exactly what that was.
pub fn quarantine_step(
    node: &Node,
    test_key: &str,
    enforcement: Enforcement,
    run: &str,
    reason: &str,
    now: Time,
) -> QuarantineStep {
    let name = node.metadata.name.clone().unwrap_or_default();
    let obs = NodeObservation::of(&name, Some(node), test_key);
    if let Some(r) = obs.record.as_ref().filter(|r| r.is_owned_by(test_key)) {
        return QuarantineStep::AlreadyQuarantined(r.clone());
    }
    if let Some(refusal) = obs.refusal() {
        return QuarantineStep::Refuse(refusal);
    }
    let Some(rv) = node.metadata.resource_version.clone() else {
        return QuarantineStep::Refuse(Refusal::NoResourceVersion);
    };
    let label_present = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_QUARANTINED));
    let (label, cordon, taint) = match enforcement {
        Enforcement::Label if label_present => {
            return QuarantineStep::Refuse(Refusal::LabeledByOthers);
        }
        Enforcement::Label => (true, false, false),
        Enforcement::Cordon => (!label_present, true, false),
        Enforcement::Taint => (!label_present, false, true),
    };
    let record = QuarantineRecord {
        test: test_key.to_string(),
        run: run.to_string(),
        reason: QuarantineRecord::short_reason(reason),
        since: now,
        mode: enforcement.mode(),
        cordoned: cordon,
        tainted: taint,
        labeled: label,
    };
    let mut metadata = Map::new();
    metadata.insert("resourceVersion".into(), json!(rv));
    metadata.insert(
        "annotations".into(),
        json!({ ANNOTATION_QUARANTINE: record.to_annotation() }),
    );
    let mut changes = vec!["record"];
    if label {
        metadata.insert("labels".into(), json!({ LABEL_QUARANTINED: "true" }));
        changes.push("label");
    }
    let mut patch = Map::new();
    patch.insert("metadata".into(), Value::Object(metadata));
    let mut spec = Map::new();
    if cordon {
        spec.insert("unschedulable".into(), json!(true));
        changes.push("cordon");
    }
    if taint {
        let mut taints = taints_of(node);
        taints.push(Taint {
            key: TAINT_QUARANTINED.to_string(),
            value: Some("true".to_string()),
            effect: TAINT_EFFECT.to_string(),
            time_added: None,
        });
        spec.insert("taints".into(), taints_json(&taints));
        changes.push("taint");
    }
    if !spec.is_empty() {
        patch.insert("spec".into(), Value::Object(spec));
    }
    QuarantineStep::Patch {
        patch: Value::Object(patch),
        record: Some(record),
        changes,
    }
}

/// The step that releases `node` from the test `test_key`: it undoes exactly the changes
/// the record names, and removes the record. Nothing to do when there is no record;
/// refused when the record is unreadable or names another test.
///
/// A change the record names but that is already gone (a person uncordoned the node) is
/// not touched again. A cordon is undone only while this operator is still the one that
/// last set `spec.unschedulable` (the node's managed fields say who did): a person who
/// uncordoned the node and cordoned it again owns that cordon, and it stays. A second
/// `kubectl cordon` of a node that is already cordoned changes nothing on the node and
/// leaves no trace; it is undone with ours.
pub fn release_step(node: &Node, test_key: &str) -> QuarantineStep {
    let record = match our_record(node, test_key) {
        Ok(r) => r,
        Err(step) => return *step,
    };
    let Some(mut metadata) = record_removal(node) else {
        return QuarantineStep::Refuse(Refusal::NoResourceVersion);
    };
    let mut changes = vec!["record"];
    let label_present = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_QUARANTINED));
    if record.labeled && label_present {
        metadata.insert("labels".into(), json!({ LABEL_QUARANTINED: Value::Null }));
        changes.push("label");
    }
    let mut patch = Map::new();
    patch.insert("metadata".into(), Value::Object(metadata));
    let mut spec = Map::new();
    if record.cordoned && is_unschedulable(node) && cordon_is_ours(node) {
        spec.insert("unschedulable".into(), Value::Null);
        changes.push("cordon");
    }
    if record.tainted {
        let before = taints_of(node);
        let mut removed = false;
        let after: Vec<Taint> = before
            .into_iter()
            .filter(|t| {
                let ours = !removed && is_our_taint(t);
                removed |= ours;
                !ours
            })
            .collect();
        if removed {
            spec.insert("taints".into(), taints_json(&after));
            changes.push("taint");
        }
    }
    if !spec.is_empty() {
        patch.insert("spec".into(), Value::Object(spec));
    }
    QuarantineStep::Patch {
        patch: Value::Object(patch),
        record: None,
        changes,
    }
}

/// The metadata of a patch that removes the record, guarded by the node's resourceVersion
/// (None: the node has none, and cannot be changed safely).
fn record_removal(node: &Node) -> Option<Map<String, Value>> {
    let rv = node.metadata.resource_version.clone()?;
    let mut metadata = Map::new();
    metadata.insert("resourceVersion".into(), json!(rv));
    metadata.insert(
        "annotations".into(),
        json!({ ANNOTATION_QUARANTINE: Value::Null }),
    );
    Some(metadata)
}

/// This test's record on the node, or the step when there is none of its own: nothing to
/// release (no record), or a refusal (unreadable, or another test's).
fn our_record(node: &Node, test_key: &str) -> Result<QuarantineRecord, Box<QuarantineStep>> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let obs = NodeObservation::of(&name, Some(node), test_key);
    if let Some(e) = obs.record_error {
        return Err(Box::new(QuarantineStep::Refuse(Refusal::UnreadableRecord(
            e,
        ))));
    }
    let Some(record) = obs.record else {
        return Err(Box::new(QuarantineStep::AlreadyReleased));
    };
    if !record.is_owned_by(test_key) {
        return Err(Box::new(QuarantineStep::Refuse(Refusal::OtherTest(
            record.test,
        ))));
    }
    Ok(record)
}

/// The step that ends this test's claim on a node whose quarantine someone else undid
/// ([`undone`]): the record goes, and the label when the record names it and it is still
/// there. Nothing else on the node changes: what is on it now is theirs.
/// [`QuarantineStep::AlreadyQuarantined`] when nothing was undone after all (read again after a
/// conflict), [`QuarantineStep::AlreadyReleased`] when the record is gone.
pub fn hand_back_step(node: &Node, test_key: &str) -> QuarantineStep {
    let record = match our_record(node, test_key) {
        Ok(r) => r,
        Err(step) => return *step,
    };
    if undone(node, &record).is_none() {
        return QuarantineStep::AlreadyQuarantined(record);
    }
    let Some(mut metadata) = record_removal(node) else {
        return QuarantineStep::Refuse(Refusal::NoResourceVersion);
    };
    let mut changes = vec!["record"];
    if record.labeled && node.labels().contains_key(LABEL_QUARANTINED) {
        metadata.insert("labels".into(), json!({ LABEL_QUARANTINED: Value::Null }));
        changes.push("label");
    }
    QuarantineStep::Patch {
        patch: json!({ "metadata": Value::Object(metadata) }),
        record: None,
        changes,
    }
}

/// Taints as a merge-patch value: the whole list (merge patch replaces lists), or null.
fn taints_json(taints: &[Taint]) -> Value {
    if taints.is_empty() {
        Value::Null
    } else {
        serde_json::to_value(taints).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use gpufabric_api::test::NodeHealth;
    use k8s_openapi::api::core::v1::NodeSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    const US: &str = "nightly";

    fn now() -> Time {
        Time("2026-11-21T02:00:00Z".parse().expect("timestamp"))
    }

    fn node() -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                resource_version: Some("42".into()),
                labels: Some(BTreeMap::from([(
                    "nvidia.com/gpu.product".to_string(),
                    "NVIDIA-H200".to_string(),
                )])),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: Some(vec![Taint {
                    key: "nvidia.com/gpu".into(),
                    effect: "NoSchedule".into(),
                    value: Some("present".into()),
                    time_added: None,
                }]),
                ..Default::default()
            }),
            status: None,
        }
    }

    /// Apply a merge patch the way the API server does (RFC 7386), for checking steps.
    pub(crate) fn merge(target: &mut Value, patch: &Value) {
        if let Value::Object(p) = patch {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            if let Value::Object(t) = target {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
        } else {
            *target = patch.clone();
        }
    }

    fn apply(node: &Node, step: &QuarantineStep) -> Node {
        let QuarantineStep::Patch { patch, .. } = step else {
            panic!("expected a patch, got {step:?}");
        };
        let mut v = serde_json::to_value(node).expect("node serializes");
        merge(&mut v, patch);
        let mut out: Node = serde_json::from_value(v).expect("patched node parses");
        out.metadata.resource_version = Some("43".into());
        out
    }

    fn quarantine(node: &Node, how: Enforcement) -> QuarantineStep {
        quarantine_step(node, US, how, "nightly-1", "GPU 3 straggler", now())
    }

    #[test]
    fn cordon_mode_labels_cordons_and_records_exactly_that() {
        let n = node();
        let step = quarantine(&n, Enforcement::Cordon);
        let QuarantineStep::Patch {
            patch,
            record,
            changes,
        } = &step
        else {
            panic!("{step:?}")
        };
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert_eq!(changes, &vec!["record", "label", "cordon"]);
        let r = record.as_ref().expect("record");
        assert!(r.cordoned && r.labeled && !r.tainted);
        let after = apply(&n, &step);
        assert!(is_unschedulable(&after));
        assert_eq!(
            taints_of(&after),
            taints_of(&n),
            "cordon mode adds no taint"
        );
        let obs = NodeObservation::of("n1", Some(&after), US);
        assert!(obs.quarantined_by_us && !obs.cordoned_by_others && !obs.labeled_by_others);
    }

    #[test]
    fn taint_mode_adds_only_our_taint_and_release_removes_only_it() {
        let n = node();
        let q = quarantine(&n, Enforcement::Taint);
        let after = apply(&n, &q);
        let taints = taints_of(&after);
        assert_eq!(taints.len(), 2);
        assert_eq!(taints[0].key, "nvidia.com/gpu");
        assert!(is_our_taint(&taints[1]));
        assert!(!is_unschedulable(&after));
        let released = apply(&after, &release_step(&after, US));
        assert_eq!(taints_of(&released), taints_of(&n));
        assert_eq!(released.metadata.labels, n.metadata.labels);
        assert!(released.metadata.annotations.unwrap_or_default().is_empty());
    }

    #[test]
    fn a_node_cordoned_by_someone_else_is_never_claimed() {
        let mut n = node();
        n.spec.as_mut().expect("spec").unschedulable = Some(true);
        for how in [Enforcement::Label, Enforcement::Cordon, Enforcement::Taint] {
            assert_eq!(
                quarantine(&n, how),
                QuarantineStep::Refuse(Refusal::CordonedByOthers),
                "{how:?}"
            );
        }
        let obs = NodeObservation::of("n1", Some(&n), US);
        assert!(obs.cordoned_by_others);
        assert!(
            obs.facts(NodeHealth::default_for("n1"), true)
                .cordoned_by_others
        );
    }

    #[test]
    fn release_leaves_a_cordon_the_record_does_not_name() {
        // Quarantined in Label mode, then a person cordoned the node.
        let n = node();
        let mut after = apply(&n, &quarantine(&n, Enforcement::Label));
        after.spec.as_mut().expect("spec").unschedulable = Some(true);
        let released = apply(&after, &release_step(&after, US));
        assert!(is_unschedulable(&released), "the person's cordon stays");
        assert!(
            !released
                .metadata
                .labels
                .unwrap_or_default()
                .contains_key(LABEL_QUARANTINED)
        );
    }

    #[test]
    fn another_tests_quarantine_is_neither_claimed_nor_released() {
        let n = node();
        let theirs = apply(
            &n,
            &quarantine_step(&n, "team-b/other", Enforcement::Cordon, "r", "x", now()),
        );
        assert_eq!(
            release_step(&theirs, US),
            QuarantineStep::Refuse(Refusal::OtherTest("team-b/other".into()))
        );
        assert!(matches!(
            quarantine(&theirs, Enforcement::Cordon),
            QuarantineStep::Refuse(_)
        ));
        let obs = NodeObservation::of("n1", Some(&theirs), US);
        assert_eq!(
            obs.quarantined_by_other_test.as_deref(),
            Some("team-b/other")
        );
        assert!(!obs.quarantined_by_us);
        assert!(
            obs.facts(NodeHealth::default_for("n1"), true)
                .cordoned_by_others
        );
    }

    #[test]
    fn a_node_quarantined_by_the_namespaced_form_of_the_test_is_ours_and_released() {
        // Quarantined while FabricTest was namespaced: the record says `<namespace>/<name>`.
        let n = node();
        let old = apply(
            &n,
            &quarantine_step(&n, "gpu/nightly", Enforcement::Cordon, "r", "x", now()),
        );
        let obs = NodeObservation::of("n1", Some(&old), US);
        assert!(obs.quarantined_by_us && obs.quarantined_by_other_test.is_none());
        assert!(matches!(
            quarantine(&old, Enforcement::Cordon),
            QuarantineStep::AlreadyQuarantined(_)
        ));
        let released = apply(&old, &release_step(&old, US));
        assert!(!is_unschedulable(&released));
        assert_eq!(released.metadata.labels, n.metadata.labels);
        assert!(released.metadata.annotations.unwrap_or_default().is_empty());
    }

    #[test]
    fn an_unreadable_record_leaves_the_node_alone() {
        let mut n = node();
        n.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_QUARANTINE.to_string(),
            "{not json".to_string(),
        )]));
        assert!(matches!(
            quarantine(&n, Enforcement::Cordon),
            QuarantineStep::Refuse(Refusal::UnreadableRecord(_))
        ));
        assert!(matches!(
            release_step(&n, US),
            QuarantineStep::Refuse(Refusal::UnreadableRecord(_))
        ));
        let obs = NodeObservation::of("n1", Some(&n), US);
        assert!(obs.record_error.is_some());
        assert!(
            obs.facts(NodeHealth::default_for("n1"), true)
                .cordoned_by_others
        );
    }

    #[test]
    fn a_foreign_quarantine_taint_is_kept_and_blocks_quarantine() {
        let mut n = node();
        n.spec
            .as_mut()
            .and_then(|s| s.taints.as_mut())
            .expect("taints")
            .push(Taint {
                key: TAINT_QUARANTINED.into(),
                effect: "NoSchedule".into(),
                value: None,
                time_added: None,
            });
        assert_eq!(
            quarantine(&n, Enforcement::Taint),
            QuarantineStep::Refuse(Refusal::TaintedByOthers)
        );
        assert!(NodeObservation::of("n1", Some(&n), US).tainted_by_others);
    }

    #[test]
    fn quarantining_twice_changes_nothing() {
        let n = node();
        let after = apply(&n, &quarantine(&n, Enforcement::Cordon));
        assert!(matches!(
            quarantine(&after, Enforcement::Cordon),
            QuarantineStep::AlreadyQuarantined(r) if r.run == "nightly-1"
        ));
        let released = apply(&after, &release_step(&after, US));
        assert_eq!(release_step(&released, US), QuarantineStep::AlreadyReleased);
    }

    trait DefaultFor {
        fn default_for(node: &str) -> Self;
    }
    impl DefaultFor for NodeHealth {
        fn default_for(node: &str) -> Self {
            NodeHealth {
                node: node.into(),
                verdict: Default::default(),
                consecutive_failures: 1,
                consecutive_passes: 0,
                quarantined_since: None,
                held_back: None,
                last_finding: None,
                last_run: None,
                ..Default::default()
            }
        }
    }
}
