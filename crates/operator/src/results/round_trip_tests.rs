//! Round-trip property tests: a node's outcome and its run entry give each other back
//! (`NodeRunResult::record` and `::outcome`), over every fault, reason and verdict.

use super::*;
use gpufabric_api::outcome::HardwareFault;
use proptest::prelude::*;

/// Every hardware fault; a fault added to the API fails to compile here until it is listed.
fn every_fault() -> Vec<HardwareFault> {
    let all = vec![
        HardwareFault::GpuMissing,
        HardwareFault::GpuUnusable,
        HardwareFault::Crash,
        HardwareFault::Hang,
    ];
    for f in &all {
        match f {
            HardwareFault::GpuMissing
            | HardwareFault::GpuUnusable
            | HardwareFault::Crash
            | HardwareFault::Hang => {}
        }
    }
    all
}

/// Every reason a node is not measured; one added to the API fails to compile here until
/// it is listed.
fn every_reason() -> Vec<NotMeasuredReason> {
    use NotMeasuredReason as R;
    let all = vec![
        R::NotAdmitted,
        R::NotScheduled,
        R::ImagePull,
        R::ContainerConfig,
        R::Evicted,
        R::Preempted,
        R::PodDeleted,
        R::OutOfMemory,
        R::AgentIncompatible,
        R::NeverStarted,
        R::GpusInUse,
        R::AgentBug,
        R::NodeNotReady,
        R::NameTaken,
        R::MaxDuration,
        R::Cancelled,
    ];
    for r in &all {
        match r {
            R::NotAdmitted
            | R::NotScheduled
            | R::ImagePull
            | R::ContainerConfig
            | R::Evicted
            | R::Preempted
            | R::PodDeleted
            | R::OutOfMemory
            | R::AgentIncompatible
            | R::NeverStarted
            | R::GpusInUse
            | R::AgentBug
            | R::NodeNotReady
            | R::NameTaken
            | R::MaxDuration
            | R::Cancelled => {}
        }
    }
    all
}

/// Every verdict; one added to the API fails to compile here until it is listed.
fn every_verdict() -> Vec<NodeVerdict> {
    use NodeVerdict as V;
    let all = vec![
        V::Pending,
        V::Running,
        V::Passed,
        V::Failed,
        V::Errored,
        V::Timeout,
        V::NotMeasured,
    ];
    for v in &all {
        match v {
            V::Pending
            | V::Running
            | V::Passed
            | V::Failed
            | V::Errored
            | V::Timeout
            | V::NotMeasured => {}
        }
    }
    all
}

/// An outcome the entry can hold whole: every hardware fault and every reason a node is
/// not measured, with any sentence (empty, long, not ASCII).
fn entry_outcome() -> impl Strategy<Value = NodeOutcome> {
    let detail = ".{0,80}";
    prop_oneof![
        (proptest::sample::select(every_fault()), detail)
            .prop_map(|(f, d)| NodeOutcome::hardware(f, d)),
        (proptest::sample::select(every_reason()), detail)
            .prop_map(|(r, d)| NodeOutcome::not_measured(r, d)),
    ]
}

/// Any entry a shard may hold, including combinations no operator writes (a verdict that
/// disagrees with its fault, a fault without a sentence), as old or hand-edited documents
/// can: what is not the node's outcome (node, pod, findings, confirmed) varies too.
fn any_entry() -> impl Strategy<Value = NodeRunResult> {
    (
        proptest::sample::select(every_verdict()),
        proptest::option::of(proptest::sample::select(every_fault())),
        proptest::option::of(proptest::sample::select(every_reason())),
        proptest::option::of(".{0,40}"),
        proptest::option::of("[a-z0-9-]{1,20}"),
        proptest::option::of(0.0f64..1000.0),
        0u32..5,
        any::<bool>(),
    )
        .prop_map(
            |(verdict, hardware_fault, not_measured, reason, pod, bw, findings, confirmed)| {
                NodeRunResult {
                    node: "gpu-1".into(),
                    verdict,
                    pod,
                    hardware_fault,
                    not_measured,
                    reason,
                    all_reduce_bus_bw_gbps: bw,
                    findings,
                    confirmed,
                    ..Default::default()
                }
            },
        )
}

/// What of an entry is not its node's outcome.
fn beside_outcome(e: &NodeRunResult) -> (String, Option<String>, u32, Option<String>, bool) {
    (
        e.node.clone(),
        e.pod.clone(),
        e.findings,
        e.finding.clone(),
        e.confirmed,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// outcome -> entry -> outcome, and entry -> outcome -> entry for every entry an
    /// outcome writes: the pair loses nothing the entry can hold.
    #[test]
    fn an_outcome_and_its_entry_give_each_other_back(
        o in entry_outcome(),
        start in any_entry(),
    ) {
        let mut e = start.clone();
        e.record(&o);
        prop_assert_eq!(e.outcome(), Some(o.clone()));
        prop_assert_eq!(e.verdict, NodeVerdict::provisional(&o));
        prop_assert_eq!(beside_outcome(&e), beside_outcome(&start));
        let Some(back) = e.outcome() else { unreachable!("checked above") };
        let mut again = e.clone();
        again.record(&back);
        prop_assert_eq!(again, e);
    }

    /// Any entry, also one no operator writes now, gives an outcome that a rewritten entry
    /// gives back unchanged; a measured node or a pod that has not ended gives none.
    #[test]
    fn any_entry_gives_an_outcome_its_rewrite_keeps(e in any_entry()) {
        match e.outcome() {
            None => prop_assert!(matches!(
                e.verdict,
                NodeVerdict::Pending | NodeVerdict::Running | NodeVerdict::Passed | NodeVerdict::Failed
            )),
            Some(o) => {
                let mut again = e.clone();
                again.record(&o);
                prop_assert_eq!(again.outcome(), Some(o));
                prop_assert_eq!(beside_outcome(&again), beside_outcome(&e));
                prop_assert_eq!(again.all_reduce_bus_bw_gbps, None);
            }
        }
    }
}
