//! Ownership follows the node: whatever a person does to a node between this operator's
//! quarantine and its release, the release removes only what the operator still owns. The
//! node is modelled as the API server keeps it (spec, labels, annotations, and who set
//! `spec.unschedulable` last); the operator's steps are the executor's own pure steps.

use super::node::tests::merge;
use super::node::{QuarantineStep, hand_back_step, quarantine_step, release_step};
use super::ownership::{Undone, undone};
use gpufabric_api::keys::{ANNOTATION_QUARANTINE, LABEL_QUARANTINED, MANAGER, TAINT_QUARANTINED};
use gpufabric_api::quarantine::QuarantineRecord;
use gpufabric_health::quarantine::Enforcement;
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};
use kube::ResourceExt;
use proptest::prelude::*;
use serde_json::json;

const US: &str = "nightly";

/// One thing that happens to the node.
#[derive(Clone, Debug)]
enum Act {
    /// The operator quarantines it in this mode (the planner said so).
    Quarantine(Enforcement),
    /// The operator looks at the node (a watch event): it hands back what was undone.
    Look,
    /// `kubectl cordon` / `kubectl uncordon`.
    Cordon,
    Uncordon,
    /// `kubectl taint node n gpufabric.io/quarantined=true:NoSchedule` and its removal.
    Taint,
    Untaint,
    /// `kubectl label node n gpufabric.io/quarantined-`.
    Unlabel,
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        prop_oneof![
            Just(Enforcement::Label),
            Just(Enforcement::Cordon),
            Just(Enforcement::Taint)
        ]
        .prop_map(Act::Quarantine),
        Just(Act::Look),
        Just(Act::Cordon),
        Just(Act::Uncordon),
        Just(Act::Taint),
        Just(Act::Untaint),
        Just(Act::Unlabel),
    ]
}

/// What the person owns on the node, tracked beside it: the truth the property checks.
#[derive(Clone, Copy, Debug, Default)]
struct Theirs {
    cordon: bool,
    taint: bool,
}

fn blank() -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": "n1", "resourceVersion": "1"},
        "spec": {}
    }))
    .expect("a node")
}

fn now() -> Time {
    Time("2026-11-27T02:00:00Z".parse().expect("time"))
}

/// Applies a merge patch made by `manager`, keeping the managed field of
/// `spec.unschedulable` as the API server does for an update: whoever changes the value
/// owns it; a request that changes nothing changes no ownership.
fn patch(node: &Node, patch: &serde_json::Value, manager: &str) -> Node {
    let before = super::ownership::is_unschedulable(node);
    let mut v = serde_json::to_value(node).expect("node serializes");
    merge(&mut v, patch);
    let mut out: Node = serde_json::from_value(v).expect("node parses");
    let after = super::ownership::is_unschedulable(&out);
    if after != before {
        out.metadata.managed_fields = after.then(|| {
            vec![ManagedFieldsEntry {
                manager: Some(manager.to_string()),
                operation: Some("Update".into()),
                fields_type: Some("FieldsV1".into()),
                fields_v1: Some(FieldsV1(json!({"f:spec": {"f:unschedulable": {}}}))),
                ..Default::default()
            }]
        });
    }
    let rv: u64 = out
        .metadata
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    out.metadata.resource_version = Some((rv + 1).to_string());
    out
}

fn operator(node: &Node, step: &QuarantineStep) -> Node {
    match step {
        QuarantineStep::Patch { patch: p, .. } => patch(node, p, MANAGER),
        _ => node.clone(),
    }
}

fn has_taint(node: &Node) -> bool {
    super::ownership::taints_of(node)
        .iter()
        .any(|t| t.key == TAINT_QUARANTINED)
}

fn record(node: &Node) -> Option<QuarantineRecord> {
    QuarantineRecord::from_annotations(node.metadata.annotations.as_ref())
        .ok()
        .flatten()
}

/// Runs `acts` on a blank node; returns the node and what the person owns at the end.
fn play(acts: &[Act]) -> (Node, Theirs) {
    let mut node = blank();
    let mut theirs = Theirs::default();
    for a in acts {
        match a {
            Act::Quarantine(how) => {
                let step = quarantine_step(&node, US, *how, "r1", "slow", now());
                node = operator(&node, &step);
            }
            Act::Look => node = operator(&node, &hand_back_step(&node, US)),
            // kubectl refuses a cordon of a cordoned node ("already cordoned"): no request.
            Act::Cordon if !super::ownership::is_unschedulable(&node) => {
                node = patch(&node, &json!({"spec": {"unschedulable": true}}), "kubectl");
                theirs.cordon = true;
            }
            Act::Cordon => {}
            Act::Uncordon => {
                node = patch(&node, &json!({"spec": {"unschedulable": null}}), "kubectl");
                theirs.cordon = false;
            }
            Act::Taint if !has_taint(&node) => {
                let mut taints = super::ownership::taints_of(&node);
                taints.push(Taint {
                    key: TAINT_QUARANTINED.into(),
                    value: Some("true".into()),
                    effect: "NoSchedule".into(),
                    time_added: None,
                });
                node = patch(&node, &json!({"spec": {"taints": taints}}), "kubectl");
                theirs.taint = true;
            }
            Act::Taint => {}
            Act::Untaint => {
                node = patch(&node, &json!({"spec": {"taints": null}}), "kubectl");
                theirs.taint = false;
            }
            Act::Unlabel => {
                node = patch(
                    &node,
                    &json!({"metadata": {"labels": {LABEL_QUARANTINED: null}}}),
                    "kubectl",
                );
            }
        }
    }
    (node, theirs)
}

/// Whether the person touched a quarantine change of ours since the last look (the watch
/// sees each of their changes, so the operator looks after each).
fn looks_after_each(acts: &[Act]) -> Vec<Act> {
    acts.iter()
        .flat_map(|a| match a {
            Act::Quarantine(_) | Act::Look => vec![a.clone()],
            _ => vec![a.clone(), Act::Look],
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Whatever a person did, and whether or not the operator looked in between, the
    /// release never removes a cordon the person made.
    #[test]
    fn a_release_never_removes_a_persons_cordon(acts in proptest::collection::vec(act(), 0..12)) {
        let (node, theirs) = play(&acts);
        let released = operator(&node, &release_step(&node, US));
        if theirs.cordon {
            prop_assert!(super::ownership::is_unschedulable(&released), "{acts:?}\n{node:?}");
        }
    }

    /// With the operator looking after each change a person makes (its watch), a release
    /// removes nothing of theirs at all: cordon and taint both stay, and once the claim is
    /// handed back the node carries no record of ours.
    #[test]
    fn looked_after_a_release_removes_only_what_is_still_ours(acts in proptest::collection::vec(act(), 0..12)) {
        let acts = looks_after_each(&acts);
        let (node, theirs) = play(&acts);
        let released = operator(&node, &release_step(&node, US));
        if theirs.cordon {
            prop_assert!(super::ownership::is_unschedulable(&released), "{acts:?}");
        }
        if theirs.taint {
            prop_assert!(has_taint(&released), "{acts:?}");
        }
        prop_assert!(!released.annotations().contains_key(ANNOTATION_QUARANTINE));
        // A record that is still there describes exactly what is on the node.
        if let Some(r) = record(&node) {
            prop_assert!(undone(&node, &r).is_none(), "{acts:?}: a look leaves no undone record");
        }
    }
}

#[test]
fn an_uncordon_is_handed_back_and_the_cordon_after_it_is_kept() {
    let (node, theirs) = play(&[
        Act::Quarantine(Enforcement::Cordon),
        Act::Uncordon,
        Act::Cordon,
    ]);
    assert!(theirs.cordon);
    let r = record(&node).expect("the record is still there: nobody looked");
    assert_eq!(
        undone(&node, &r),
        Some(Undone::CordonedAgain {
            by: "kubectl".into()
        })
    );
    let handed = operator(&node, &hand_back_step(&node, US));
    assert!(record(&handed).is_none());
    assert!(!handed.labels().contains_key(LABEL_QUARANTINED));
    assert!(
        super::ownership::is_unschedulable(&handed),
        "the person's cordon stays"
    );
    // Released afterwards: nothing of ours is left, so nothing is changed.
    assert_eq!(release_step(&handed, US), QuarantineStep::AlreadyReleased);
}

#[test]
fn an_untouched_quarantine_is_not_handed_back_and_is_released_whole() {
    let (node, _) = play(&[Act::Quarantine(Enforcement::Cordon), Act::Look]);
    assert!(record(&node).is_some());
    assert!(matches!(
        hand_back_step(&node, US),
        QuarantineStep::AlreadyQuarantined(_)
    ));
    let released = operator(&node, &release_step(&node, US));
    assert!(!super::ownership::is_unschedulable(&released));
    assert!(record(&released).is_none());
}

#[test]
fn what_was_undone_says_whether_it_reads_as_a_repair() {
    let cases = [
        (
            vec![Act::Quarantine(Enforcement::Cordon), Act::Uncordon],
            Undone::Uncordoned,
            true,
        ),
        (
            vec![Act::Quarantine(Enforcement::Taint), Act::Untaint],
            Undone::TaintRemoved,
            true,
        ),
        (
            vec![Act::Quarantine(Enforcement::Label), Act::Unlabel],
            Undone::LabelRemoved,
            true,
        ),
    ];
    for (acts, want, repair) in cases {
        let (node, _) = play(&acts);
        let r = record(&node).expect("record");
        let got = undone(&node, &r).expect("undone");
        assert_eq!(got, want);
        assert_eq!(got.is_repair(), repair);
    }
    assert!(!Undone::CordonedAgain { by: "x".into() }.is_repair());
}

#[test]
fn a_cordon_written_before_patches_named_their_manager_is_still_ours() {
    // The API server records `unknown` for an update that names no manager and sends no
    // user agent, as the operator's patches did before they named one.
    let (node, _) = play(&[Act::Quarantine(Enforcement::Cordon)]);
    let mut legacy = node.clone();
    if let Some(fields) = legacy.metadata.managed_fields.as_mut() {
        fields[0].manager = Some("unknown".into());
    }
    let r = record(&legacy).expect("record");
    assert_eq!(undone(&legacy, &r), None);
    let released = operator(&legacy, &release_step(&legacy, US));
    assert!(!super::ownership::is_unschedulable(&released));
}
