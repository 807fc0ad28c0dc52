use super::*;
use crate::quarantine::Enforcement;

fn devices(node: &str, gpus: u32) -> BTreeMap<u32, DeviceRef> {
    (0..gpus)
        .map(|g| {
            let d = DeviceRef {
                driver: "gpu.nvidia.com".into(),
                pool: node.into(),
                device: format!("gpu-{g}"),
            };
            (g, d)
        })
        .collect()
}

fn fault(word: &'static str) -> GpuFault {
    GpuFault {
        word,
        reason: format!("GPU is a {word}"),
    }
}

/// An 8-GPU node whose GPUs are DRA devices, with this run's faults on `faulty`.
fn dra_node(node: &str, faulty: &[u32]) -> GpuNode {
    GpuNode {
        node: node.into(),
        devices: devices(node, 8),
        gpus: 8,
        faults: Some(faulty.iter().map(|g| (*g, fault("straggler"))).collect()),
        failing: !faulty.is_empty(),
        ..GpuNode::default()
    }
}

fn node_plan(quarantine: &[&str], release: &[&str]) -> Plan {
    Plan {
        quarantine: quarantine.iter().map(|s| s.to_string()).collect(),
        release: release.iter().map(|s| s.to_string()).collect(),
        enforcement: Some(Enforcement::Cordon),
        budget: 100,
        gpu_budget: 100,
        ..Plan::default()
    }
}

#[test]
fn a_confirmed_straggler_on_a_dra_node_taints_that_gpu_and_spares_the_node() {
    let mut plan = node_plan(&["a"], &[]);
    let gpus = split(&mut plan, &[dra_node("a", &[3])]);
    assert!(plan.quarantine.is_empty(), "the node is not cordoned");
    assert_eq!(gpus.taint.len(), 1);
    assert_eq!(gpus.taint[0].gpu, 3);
    assert_eq!(gpus.taint[0].device.to_string(), "gpu.nvidia.com/a/gpu-3");
    assert_eq!(gpus.per_gpu, ["a"]);
    assert_eq!(gpus.tainted_after, 1);
}

#[test]
fn a_node_without_dra_devices_is_quarantined_as_a_node() {
    let mut plan = node_plan(&["a"], &[]);
    let mut n = dra_node("a", &[3]);
    n.devices.clear();
    let gpus = split(&mut plan, &[n]);
    assert_eq!(plan.quarantine, ["a"]);
    assert!(gpus.taint.is_empty());
    assert_eq!(gpus.per_node, ["a"]);
}

#[test]
fn a_fault_no_gpu_explains_quarantines_the_node() {
    let mut plan = node_plan(&["a"], &[]);
    let mut n = dra_node("a", &[]);
    n.faults = None;
    n.failing = true;
    let gpus = split(&mut plan, &[n]);
    assert_eq!(plan.quarantine, ["a"]);
    assert!(gpus.taint.is_empty());
}

#[test]
fn a_faulty_gpu_that_is_no_device_quarantines_the_node() {
    let mut plan = node_plan(&["a"], &[]);
    let mut n = dra_node("a", &[3]);
    n.devices.remove(&3);
    let gpus = split(&mut plan, &[n]);
    assert_eq!(plan.quarantine, ["a"]);
    assert!(gpus.taint.is_empty());
}

#[test]
fn half_the_gpus_are_tainted_but_more_than_half_quarantines_the_node() {
    let mut plan = node_plan(&["half", "more"], &[]);
    let gpus = split(
        &mut plan,
        &[
            dra_node("half", &[0, 1, 2, 3]),
            dra_node("more", &[0, 1, 2, 3, 4]),
        ],
    );
    assert_eq!(plan.quarantine, ["more"]);
    assert_eq!(gpus.taint.len(), 4);
    assert!(gpus.taint.iter().all(|t| t.node == "half"));
    assert_eq!(
        gpus.escalated,
        [(
            "more".to_string(),
            Escalation::MoreThanHalf {
                tainted: 5,
                gpus: 8
            }
        )]
    );
}

#[test]
fn a_release_of_a_node_held_per_gpu_removes_its_gpu_taints_and_nothing_on_the_node() {
    let mut plan = node_plan(&[], &["a", "b"]);
    let mut a = dra_node("a", &[]);
    a.tainted = BTreeSet::from([3]);
    let b = GpuNode {
        node: "b".into(),
        node_record: true,
        ..GpuNode::default()
    };
    let gpus = split(&mut plan, &[a, b]);
    assert_eq!(gpus.release, ["a"]);
    assert_eq!(plan.release, ["b"], "the node plan releases only node b");
    assert_eq!(gpus.tainted_after, 0);
}

#[test]
fn a_node_held_per_gpu_that_fails_on_another_gpu_has_that_gpu_tainted_too() {
    let mut plan = node_plan(&[], &[]);
    let mut a = dra_node("a", &[3, 5]);
    a.tainted = BTreeSet::from([3]);
    let gpus = split(&mut plan, &[a]);
    assert_eq!(
        gpus.taint.iter().map(|t| t.gpu).collect::<Vec<_>>(),
        [5],
        "GPU 3 is tainted already"
    );
    assert_eq!(gpus.tainted_after, 2);
    assert!(plan.quarantine.is_empty());
}

#[test]
fn a_node_held_per_gpu_that_fails_beyond_half_or_as_a_node_is_quarantined_as_a_node() {
    let mut plan = node_plan(&[], &[]);
    let mut beyond = dra_node("beyond", &[4, 5]);
    beyond.tainted = BTreeSet::from([0, 1, 2, 3]);
    let mut node_level = dra_node("node-level", &[]);
    node_level.tainted = BTreeSet::from([0]);
    node_level.faults = None;
    node_level.failing = true;
    let gpus = split(&mut plan, &[beyond, node_level]);
    assert_eq!(plan.quarantine, ["beyond", "node-level"]);
    assert_eq!(gpus.release, ["beyond", "node-level"]);
    assert!(gpus.taint.is_empty());
    assert_eq!(
        gpus.escalated[1],
        ("node-level".into(), Escalation::NodeLevel)
    );
}

#[test]
fn with_nothing_to_enforce_a_held_node_failing_again_changes_nothing() {
    let mut plan = node_plan(&[], &[]);
    plan.enforcement = None;
    let mut a = dra_node("a", &[5]);
    a.tainted = BTreeSet::from([3]);
    let gpus = split(&mut plan, &[a]);
    assert!(gpus.taint.is_empty());
    assert!(plan.quarantine.is_empty());
    assert_eq!(gpus.tainted_after, 1);
}

#[test]
fn a_candidate_taints_instead_only_its_faulty_devices_up_to_half_the_node() {
    assert_eq!(dra_node("a", &[3]).taints_instead(), Some(1));
    assert_eq!(dra_node("a", &[0, 1, 2, 3]).taints_instead(), Some(4));
    assert_eq!(
        dra_node("a", &[0, 1, 2, 3, 4]).taints_instead(),
        None,
        "more than half: the node"
    );
    let mut plain = dra_node("a", &[3]);
    plain.devices.clear();
    assert_eq!(plain.taints_instead(), None, "no devices: the node");
    let mut node_level = dra_node("a", &[]);
    node_level.faults = None;
    assert_eq!(node_level.taints_instead(), None);
}

#[test]
fn a_held_node_failing_on_more_gpus_than_the_gpu_budget_has_left_is_refused_not_tainted() {
    let mut plan = node_plan(&[], &[]);
    plan.gpu_budget = 2;
    plan.gpus_held_after = 1;
    let mut a = dra_node("a", &[3, 5, 6]);
    a.tainted = BTreeSet::from([3]);
    let gpus = split(&mut plan, &[a]);
    assert!(gpus.taint.is_empty(), "GPUs 5 and 6 need two, one is left");
    assert_eq!(plan.hold_of("a"), Some(Hold::OverGpuBudget));
    assert_eq!(gpus.tainted_after, 1, "GPU 3 stays tainted");
    assert_eq!(plan.gpus_held_after, 1);

    // With room for both, both are tainted and counted.
    let mut plan = node_plan(&[], &[]);
    plan.gpu_budget = 3;
    plan.gpus_held_after = 1;
    let mut a = dra_node("a", &[3, 5, 6]);
    a.tainted = BTreeSet::from([3]);
    let gpus = split(&mut plan, &[a]);
    assert_eq!(gpus.taint.len(), 2);
    assert_eq!(plan.gpus_held_after, 3);
    assert!(plan.held_back.is_empty());
}

#[test]
fn a_held_node_that_would_become_a_node_over_the_node_budget_keeps_its_gpus_and_is_refused() {
    let mut plan = node_plan(&[], &[]);
    plan.budget = 1;
    plan.quarantined_after = 1;
    plan.gpus_held_after = 4;
    let mut beyond = dra_node("beyond", &[4, 5]);
    beyond.tainted = BTreeSet::from([0, 1, 2, 3]);
    let gpus = split(&mut plan, &[beyond.clone()]);
    assert!(plan.quarantine.is_empty());
    assert!(gpus.release.is_empty(), "its four GPUs stay tainted");
    assert_eq!(plan.hold_of("beyond"), Some(Hold::OverBudget));
    assert_eq!(gpus.tainted_after, 4);

    // With a node free, it is quarantined as a node: a node more, its GPUs no longer held.
    let mut plan = node_plan(&[], &[]);
    plan.budget = 2;
    plan.quarantined_after = 1;
    plan.gpus_held_after = 4;
    let gpus = split(&mut plan, &[beyond]);
    assert_eq!(plan.quarantine, ["beyond"]);
    assert_eq!(gpus.release, ["beyond"]);
    assert_eq!((plan.quarantined_after, plan.gpus_held_after), (2, 0));
}
