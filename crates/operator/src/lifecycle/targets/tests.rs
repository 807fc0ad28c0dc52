use super::*;
use gpufabric_api::test::TakenBack;
use serde_json::json;

fn time(s: &str) -> Time {
    Time(s.parse().expect("time"))
}

fn test(spec: serde_json::Value) -> FabricTest {
    serde_json::from_value(json!({
        "apiVersion": "gpufabric.io/v1alpha1", "kind": "FabricTest",
        "metadata": {"name": "t"}, "spec": spec
    }))
    .expect("a test")
}

fn node(name: &str, extra: serde_json::Value) -> Node {
    let mut v = json!({
        "metadata": {"name": name, "labels": {"pool": "a"},
            "creationTimestamp": "2026-11-27T01:00:00Z"},
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}}
    });
    crate::quarantine::node_merge_for_tests(&mut v, &extra);
    serde_json::from_value(v).expect("a node")
}

/// No node's GPUs are DRA devices.
fn none() -> BTreeMap<String, u32> {
    BTreeMap::new()
}

fn measured(node: &str, at: &str) -> NodeHealth {
    NodeHealth {
        node: node.into(),
        last_measured: Some(time(at)),
        ..Default::default()
    }
}

const GATE: &str =
    r#"{"spec": {"taints": [{"key": "gpufabric.io/validation", "effect": "NoSchedule"}]}}"#;

#[test]
fn a_gated_node_is_wanted_until_the_test_measures_it_after_it_joined() {
    let t = test(json!({"nodeSelector": {"pool": "a"}}));
    let gated = node("g", serde_json::from_str(GATE).expect("json"));
    assert!(why_now(&t, &gated, None, false).is_some_and(|w| w.contains("validation gate")));
    // Measured before it joined (the same name, an earlier machine): wanted.
    assert!(
        why_now(
            &t,
            &gated,
            Some(&measured("g", "2026-11-26T00:00:00Z")),
            false
        )
        .is_some()
    );
    // Measured since: a failure keeps the gate but is not retested at once.
    assert!(
        why_now(
            &t,
            &gated,
            Some(&measured("g", "2026-11-27T02:00:00Z")),
            false
        )
        .is_none()
    );
    // A node the test does not select is never wanted.
    let other = test(json!({"nodeSelector": {"pool": "b"}}));
    assert!(wanted(&other, [&gated], &none(), &[], false).now.is_empty());
    // Nor one without GPUs.
    let cpu = node(
        "c",
        json!({"status": {"allocatable": {"nvidia.com/gpu": "0"}}}),
    );
    assert!(!selects(&t, &cpu, &none()));
}

#[test]
fn repairs_lifted_quarantines_and_conditions_are_reasons() {
    let t = test(json!({"nodeLifecycle": {"testOnConditions": ["XidCriticalError"]}}));
    let repaired = node(
        "r",
        json!({"metadata": {"annotations": {"gpufabric.io/repaired": "INC-42",
            "gpufabric.io/quarantine": "{}"}}}),
    );
    assert_eq!(
        why_now(&t, &repaired, None, false).as_deref(),
        Some("marked repaired (gpufabric.io/repaired: INC-42)")
    );
    let mut h = measured("u", "2026-11-27T01:00:00Z");
    h.taken_back = Some(TakenBack {
        what: "uncordoned by someone else".into(),
        at: time("2026-11-27T02:00:00Z"),
        repair: true,
    });
    let plain = node("u", json!({}));
    assert!(why_now(&t, &plain, Some(&h), false).is_some_and(|w| w.contains("uncordoned")));
    h.last_measured = Some(time("2026-11-27T03:00:00Z"));
    assert!(
        why_now(&t, &plain, Some(&h), false).is_none(),
        "measured since"
    );
    // A cordon taken over by someone else is not a repair.
    h.last_measured = None;
    if let Some(tb) = h.taken_back.as_mut() {
        tb.repair = false;
    }
    assert!(why_now(&t, &plain, Some(&h), false).is_none());

    let xid = node(
        "x",
        json!({"status": {"conditions": [{"type": "XidCriticalError", "status": "True",
            "reason": "Xid79", "message": "GPU has fallen off the bus",
            "lastTransitionTime": "2026-11-27T04:00:00Z"}]}}),
    );
    assert_eq!(
        why_now(
            &t,
            &xid,
            Some(&measured("x", "2026-11-27T03:00:00Z")),
            false
        )
        .as_deref(),
        Some("condition XidCriticalError=True (Xid79: GPU has fallen off the bus)")
    );
    assert!(
        why_now(
            &t,
            &xid,
            Some(&measured("x", "2026-11-27T05:00:00Z")),
            false
        )
        .is_none()
    );
    // A condition the test does not name, or one that is False, is nothing.
    let untested = test(json!({}));
    assert!(why_now(&untested, &xid, None, false).is_none());
    let fine = node(
        "f",
        json!({"status": {"conditions": [{"type": "XidCriticalError", "status": "False"}]}}),
    );
    assert!(why_now(&t, &fine, None, false).is_none());
}

#[test]
fn a_target_not_measured_waits_longer_each_time() {
    let now = time("2026-11-27T02:00:00Z");
    let wanted = BTreeMap::from([("a".to_string(), "gated".to_string())]);
    let (mut targets, due) = schedule(&[], &wanted, &now);
    assert_eq!(due, ["a"]);
    attempted(&mut targets, &due, &now);
    assert_eq!(targets[0].attempts, 1);
    // Right after the run: not due (the node cache may still show the old node).
    let (targets, due) = schedule(&targets, &wanted, &now);
    assert!(due.is_empty());
    let later = after(&now, FIRST_BACKOFF_SECONDS);
    let (mut targets, due) = schedule(&targets, &wanted, &later);
    assert_eq!(due, ["a"]);
    attempted(&mut targets, &due, &later);
    assert_eq!(
        targets[0]
            .next_attempt
            .as_ref()
            .map(|t| t.0.as_second() - later.0.as_second()),
        Some(2 * FIRST_BACKOFF_SECONDS)
    );
    assert_eq!(backoff_seconds(30), MAX_BACKOFF_SECONDS);
    // No longer wanted: dropped.
    let (targets, due) = schedule(&targets, &BTreeMap::new(), &later);
    assert!(targets.is_empty() && due.is_empty());
}

#[test]
fn a_gate_put_on_a_measured_node_is_a_request_once_per_time_it_appears() {
    let t = test(json!({}));
    let gated = node("g", serde_json::from_str(GATE).expect("json"));
    let mut history = vec![measured("g", "2026-11-27T02:00:00Z")];
    // Measured after it joined, then gated by hand at 03:00: wanted.
    let at = time("2026-11-27T03:00:00Z");
    assert!(note_gates(&t, [&gated], &none(), &mut history, &at));
    assert_eq!(history[0].gated_since, Some(at.clone()));
    assert!(why_now(&t, &gated, Some(&history[0]), false).is_some());
    // Seen again: the same appearance, the time stays.
    assert!(!note_gates(
        &t,
        [&gated],
        &none(),
        &mut history,
        &time("2026-11-27T03:05:00Z")
    ));
    // Measured since (it failed, the gate stays): not wanted again.
    history[0].last_measured = Some(time("2026-11-27T03:10:00Z"));
    assert!(why_now(&t, &gated, Some(&history[0]), false).is_none());
    // The gate goes, then comes back: a new request.
    let open = node("g", json!({}));
    assert!(note_gates(
        &t,
        [&open],
        &none(),
        &mut history,
        &time("2026-11-27T04:00:00Z")
    ));
    assert_eq!(history[0].gated_since, None);
    note_gates(
        &t,
        [&gated],
        &none(),
        &mut history,
        &time("2026-11-27T05:00:00Z"),
    );
    assert!(why_now(&t, &gated, Some(&history[0]), false).is_some());
}

#[test]
fn a_rejoined_machine_is_a_new_node() {
    // The Node was created at 01:00.
    let n = node("g", json!({}));
    let mut h = measured("g", "2026-11-26T00:00:00Z");
    h.consecutive_failures = 3;
    assert!(of_an_earlier_node(&h, &n));
    h.last_judged = Some(time("2026-11-27T01:30:00Z"));
    assert!(!of_an_earlier_node(&h, &n), "judged since it was created");
    // An entry with no time says nothing of which Node it was.
    assert!(!of_an_earlier_node(&NodeHealth::default(), &n));
}

#[test]
fn a_repair_acts_only_on_a_held_node_and_waits_for_an_open_breaker() {
    let marked = json!({"gpufabric.io/repaired": "INC-7"});
    let foreign = node(
        "f",
        json!({"metadata": {"annotations": marked}, "spec": {"unschedulable": true}}),
    );
    assert_eq!(repair(&foreign, false), Repair::NotHeld);
    let held = node(
        "h",
        json!({"metadata": {"annotations": {"gpufabric.io/repaired": "INC-7",
            "gpufabric.io/quarantine": "{}"}}}),
    );
    assert!(matches!(repair(&held, false), Repair::Test(_)));
    assert!(matches!(repair(&held, true), Repair::WaitsForReset(_)));
    let t = test(json!({}));
    assert!(why_now(&t, &held, None, true).is_none());
    let w = wanted(&t, [&held, &foreign], &none(), &[], true);
    assert!(w.now.is_empty());
    assert_eq!(w.waiting.keys().collect::<Vec<_>>(), ["h"]);
    assert_eq!(w.not_held, ["f"]);
    assert_eq!(repair(&node("p", json!({})), false), Repair::None);
}

#[test]
fn a_node_whose_gpus_are_only_dra_devices_is_a_gate_and_repair_target() {
    let t = test(json!({"nodeSelector": {"pool": "a"}}));
    // No nvidia.com/gpu: its four GPUs are devices of the GPU driver.
    let dra_only = |name: &str, extra: &str| {
        let mut n = node(name, serde_json::from_str(extra).expect("json"));
        if let Some(s) = n.status.as_mut() {
            s.allocatable = None;
        }
        n
    };
    let gated = dra_only("g", GATE);
    let repaired = dra_only(
        "r",
        r#"{"metadata": {"annotations": {"gpufabric.io/repaired": "INC-9",
            "gpufabric.io/quarantine": "{}"}}}"#,
    );
    let devices = BTreeMap::from([("g".to_string(), 4), ("r".to_string(), 4)]);
    assert_eq!(gpu_count(&gated, &devices), 4);
    assert!(selects(&t, &gated, &devices));
    // The devices are read only where a named node offers no nvidia.com/gpu.
    assert!(needs_devices(&t, [&gated]));
    assert!(!needs_devices(&t, [&node("p", json!({}))]));
    let mut history = Vec::new();
    let at = time("2026-11-27T03:00:00Z");
    assert!(note_gates(
        &t,
        [&gated, &repaired],
        &devices,
        &mut history,
        &at
    ));
    assert_eq!(history.len(), 1, "the gate is noted on the gated node");
    let w = wanted(&t, [&gated, &repaired], &devices, &history, false);
    assert_eq!(w.now.keys().collect::<Vec<_>>(), ["g", "r"]);
    assert!(w.now["g"].contains("validation gate"));
    assert!(w.now["r"].contains("marked repaired"));
    // Without its devices published (or with none), it has no GPU: not a target.
    for published in [none(), BTreeMap::from([("g".to_string(), 0)])] {
        assert!(!selects(&t, &gated, &published));
        assert!(
            wanted(&t, [&gated, &repaired], &published, &[], false)
                .now
                .is_empty()
        );
    }
}

#[test]
fn a_flapping_condition_starts_one_run_per_rise_and_a_bounded_number_per_window() {
    let t = test(json!({"nodeLifecycle": {"testOnConditions": ["Xid"]}}));
    let risen = |at: &str| {
        node(
            "x",
            json!({"status": {"conditions": [{"type": "Xid", "status": "True",
                "lastTransitionTime": at}]}}),
        )
    };
    let mut h = NodeHealth {
        node: "x".into(),
        ..NodeHealth::default()
    };
    let mut runs = 0;
    for minute in 0..20 {
        let at = format!("2026-11-27T02:{minute:02}:00Z");
        let n = risen(&at);
        let rise = condition_rise(&t, &n, Some(&h)).expect("a new rise");
        if admit_rise(&mut h, &rise, &time(&at)) {
            runs += 1;
        }
        // Served: the same rise asks nothing more, run or not.
        assert!(condition_rise(&t, &n, Some(&h)).is_none());
        assert!(why_now(&t, &n, Some(&h), false).is_none());
    }
    // 20 rises in 20 minutes: 3 in the first ten, 3 in the next.
    assert_eq!(runs, 2 * CONDITION_RUNS_PER_WINDOW);
    assert_eq!(h.condition_rises_dropped, 20 - runs as u32);
    assert!(h.condition_runs.len() <= CONDITION_RUNS_PER_WINDOW);
}
