//! The FabricTestRun objects a FabricTest starts (on schedule, on creation, on run-now, and
//! the confirmation runs that retest suspects), built with no client.

use crate::error::{Error, Result};
use crate::names;
use gpufabric_api::keys::{ANNOTATION_CONFIRMS, LABEL_TEST, LABEL_TRIGGER};
use gpufabric_api::run::{FabricTestRun, FabricTestRunSpec, Trigger};
use gpufabric_api::test::FabricTest;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use std::collections::BTreeMap;

/// Suffix of a confirmation run's name.
const CONFIRM_SUFFIX: &str = "-confirm";

/// The run `name` of `test`: a frozen copy of the test's spec (see
/// [`FabricTestRunSpec::of_test`]), cluster-scoped as the test is, owned by the test,
/// carrying the test's labels (so an operator that watches a label selector sees the runs
/// of the tests it watches) and labeled with the test and the trigger.
pub fn new_run(
    test: &FabricTest,
    name: &str,
    trigger: Trigger,
    scheduled_time: Option<Time>,
    nodes: Option<Vec<String>>,
) -> Result<FabricTestRun> {
    let test_name = test
        .meta()
        .name
        .as_deref()
        .ok_or(Error::Missing("metadata.name"))?;
    let owner = test
        .controller_owner_ref(&())
        .ok_or(Error::Missing("metadata.uid"))?;
    let spec = FabricTestRunSpec::of_test(test_name, &test.spec, trigger, scheduled_time, nodes);
    let mut run = FabricTestRun::new(name, spec);
    run.metadata.owner_references = Some(vec![owner]);
    let mut labels: BTreeMap<String, String> = test.meta().labels.clone().unwrap_or_default();
    labels.insert(LABEL_TEST.to_string(), names::label_value(test_name));
    labels.insert(LABEL_TRIGGER.to_string(), trigger.as_str().to_string());
    run.metadata.labels = Some(labels);
    Ok(run)
}

/// The confirmation run that retests `suspects` of `parent_run` before they are
/// quarantined: trigger Confirmation, `spec.nodes` = the suspects (sorted, once each), the
/// test's current suite, thresholds and agent. Its name is derived from the parent's (see
/// [`confirmation_run_name`]), so creating it twice for one parent gets AlreadyExists
/// instead of a second run.
pub fn confirmation_run(
    test: &FabricTest,
    parent_run: &str,
    suspects: &[String],
) -> Result<FabricTestRun> {
    let mut nodes = suspects.to_vec();
    nodes.sort();
    nodes.dedup();
    let mut run = new_run(
        test,
        &confirmation_run_name(parent_run),
        Trigger::Confirmation,
        None,
        Some(nodes),
    )?;
    run.metadata.annotations = Some(BTreeMap::from([(
        ANNOTATION_CONFIRMS.to_string(),
        parent_run.to_string(),
    )]));
    Ok(run)
}

/// `<parent>-confirm`, at most 63 characters: a long parent name is cut and hashed the way
/// every other name is ([`names::bounded`]); the suffix stays.
pub fn confirmation_run_name(parent_run: &str) -> String {
    let parent = names::bounded(parent_run, names::MAX_NAME - CONFIRM_SUFFIX.len());
    format!("{parent}{CONFIRM_SUFFIX}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::test::FabricTestSpec;

    fn test() -> FabricTest {
        let mut t = FabricTest::new("nightly", FabricTestSpec::default());
        t.metadata.uid = Some("uid-1".into());
        t.metadata.labels = Some(BTreeMap::from([
            ("team".to_string(), "infra".to_string()),
            (LABEL_TRIGGER.to_string(), "set-by-a-user".to_string()),
        ]));
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
        assert_eq!(run.metadata.namespace, None);
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
        assert_eq!(labels[LABEL_TEST], "nightly");
        assert_eq!(labels["team"], "infra", "the test's own labels are carried");
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
        assert_ne!(name, confirmation_run_name(&"a".repeat(81)));
        let mut t = test();
        t.metadata.uid = None;
        assert!(matches!(
            confirmation_run(&t, "r", &[]),
            Err(Error::Missing("metadata.uid"))
        ));
    }

    #[test]
    fn scheduled_and_confirmation_runs_label_a_long_test_name_alike() {
        let mut t = test();
        t.metadata.name = Some(format!("{}-fleet", "x".repeat(70)));
        let scheduled =
            new_run(&t, "s", Trigger::Schedule, None, t.spec.nodes.clone()).expect("scheduled");
        let confirm = confirmation_run(&t, "s", &["n1".into()]).expect("confirmation");
        let label =
            |r: &FabricTestRun| r.metadata.labels.as_ref().expect("labels")[LABEL_TEST].clone();
        assert_eq!(label(&scheduled), label(&confirm));
        assert!(label(&scheduled).len() <= 63);
        assert_eq!(
            label(&scheduled),
            names::label_value(t.metadata.name.as_deref().unwrap_or_default())
        );
    }

    #[test]
    fn a_run_is_a_frozen_copy_of_the_test_spec() {
        let mut t = test();
        t.spec.nodes = Some(vec!["a".into()]);
        t.spec.node_selector = BTreeMap::from([("pool".to_string(), "train".to_string())]);
        let run =
            new_run(&t, "nightly-1", Trigger::Manual, None, t.spec.nodes.clone()).expect("run");
        assert_eq!(run.spec.nodes, t.spec.nodes);
        assert_eq!(run.spec.node_selector, t.spec.node_selector);
        assert_eq!(run.spec.suite, t.spec.suite);
        assert_eq!(run.spec.quarantine, t.spec.quarantine);
        assert_eq!(
            run.metadata.labels.expect("labels")[LABEL_TRIGGER],
            "manual"
        );
    }
}
