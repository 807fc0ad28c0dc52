use super::*;
use gpufabric_api::keys::PROGRESS_PREFIX;
use gpufabric_api::outcome::HardwareFault;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodCondition, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

const GOOD: &str = r#"{"v":1,"n":"gpu-1","b":"sim","p":"NVIDIA-H100-80GB-HBM3","g":2,"d":3.2,
    "nc":[{"c":"allReduce","pk":361.5,"bb":360.1,"lt":12.3}],
    "pu":[0,390.2,388.7,0],"dp":[{"g":1,"st":10.0,"e":1.0,"cf":0.0,"ov":1.0,"tf":500.0},{"g":2,"st":10.5,"e":0.95,"cf":0.05,"ov":0.9,"tf":480.0}]}"#;

fn time() -> Time {
    Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

fn pod(phase: &str, reason: Option<&str>, state: Option<ContainerState>) -> Pod {
    Pod {
        spec: Some(PodSpec {
            node_name: Some("gpu-1".into()),
            active_deadline_seconds: Some(30),
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some(phase.into()),
            reason: reason.map(str::to_string),
            container_statuses: state.map(|s| {
                vec![ContainerStatus {
                    name: "agent".into(),
                    state: Some(s),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn terminated_state(exit_code: i32, message: Option<&str>, reason: Option<&str>) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code,
            message: message.map(str::to_string),
            reason: reason.map(str::to_string),
            started_at: Some(time()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn terminated(exit_code: i32, message: Option<&str>, reason: Option<&str>) -> Pod {
    let phase = if exit_code == 0 {
        "Succeeded"
    } else {
        "Failed"
    };
    pod(
        phase,
        None,
        Some(terminated_state(exit_code, message, reason)),
    )
}

fn waiting(reason: &str, message: &str) -> Pod {
    pod(
        "Pending",
        None,
        Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: Some(message.into()),
            }),
            ..Default::default()
        }),
    )
}

fn running() -> Pod {
    pod(
        "Running",
        None,
        Some(ContainerState {
            running: Some(ContainerStateRunning {
                started_at: Some(time()),
            }),
            ..Default::default()
        }),
    )
}

fn ended(p: &Pod) -> NodeOutcome {
    match pod_state(p) {
        PodState::Ended(o) => o,
        other => panic!("expected an ended pod, got {other:?}"),
    }
}

fn not_measured(p: &Pod) -> (NotMeasuredReason, String) {
    match ended(p) {
        NodeOutcome::NotMeasured { reason, detail } => (reason, detail),
        other => panic!("expected NotMeasured, got {other:?}"),
    }
}

fn fault(p: &Pod) -> (HardwareFault, String) {
    match ended(p) {
        NodeOutcome::HardwareFault { fault, detail } => (fault, detail),
        other => panic!("expected a hardware fault, got {other:?}"),
    }
}

#[test]
fn exit_zero_with_a_result_is_measured() {
    let s = pod_state(&terminated(0, Some(GOOD), Some("Completed")));
    let PodState::Ended(NodeOutcome::Measured(c)) = &s else {
        panic!("expected Measured, got {s:?}")
    };
    assert_eq!(c.node, "gpu-1");
    let r = node_result("gpu-1", Some("p"), &s);
    assert_eq!(r.all_reduce_bus_bw_gbps, Some(361.5));
    assert_eq!(r.min_pair_gbps, Some(388.7));
    assert_eq!(r.ddp_efficiency, Some(0.95));
    assert_eq!(r.gpus, Some(2));
    assert_eq!(
        (r.hardware_fault, r.not_measured, r.reason),
        (None, None, None)
    );
    assert_eq!(
        r.verdict,
        NodeVerdict::Running,
        "judged only when the run ends"
    );
}

#[test]
fn wrong_values_and_a_failed_verdict_are_judged_on_the_document_they_come_with() {
    // The agent checks values by default and exits 4 on a wrong one (3: its own verdict
    // failed the node), its document written: the health rules judge it, as after a 0.
    for code in [3, 4] {
        let s = pod_state(&terminated(code, Some(GOOD), Some("Error")));
        let PodState::Ended(NodeOutcome::Measured(c)) = &s else {
            panic!("exit {code}: expected Measured, got {s:?}")
        };
        assert_eq!(c.node, "gpu-1");
    }
    // Without a readable document the agent is at fault, never the node.
    for code in [3, 4, 5] {
        let (reason, detail) = not_measured(&terminated(code, Some("not json"), Some("Error")));
        assert_eq!(reason, NotMeasuredReason::AgentBug, "exit {code}");
        assert!(detail.contains("no readable result"), "{detail}");
    }
}

#[test]
fn missing_truncated_or_malformed_results_are_an_agent_bug_not_the_node() {
    for msg in [
        None,
        Some(""),
        Some(&GOOD[..40]),
        Some("not json"),
        Some(r#"{"v":9}"#),
        Some(r#"{"v":1}"#),
    ] {
        let (reason, detail) = not_measured(&terminated(0, msg, None));
        assert_eq!(reason, NotMeasuredReason::AgentBug, "{msg:?}");
        assert!(detail.contains("unusable"), "{detail}");
    }
    let (reason, _) = not_measured(&pod("Succeeded", None, None));
    assert_eq!(reason, NotMeasuredReason::AgentBug);
}

#[test]
fn agent_exit_codes_separate_hardware_faults_from_agent_problems() {
    let (f, detail) = fault(&terminated(
        134,
        Some("CUDA error: an illegal memory access"),
        None,
    ));
    assert_eq!(f, HardwareFault::Crash);
    assert!(
        detail.contains("SIGABRT") && detail.contains("illegal memory access"),
        "{detail}"
    );
    // A crash after a progress line names the phase it crashed in.
    let progress = format!("{PROGRESS_PREFIX}gpuPairs: 0-1");
    let (f, detail) = fault(&terminated(134, Some(&progress), None));
    assert_eq!(f, HardwareFault::Crash);
    assert!(detail.ends_with("in phase \"gpuPairs: 0-1\""), "{detail}");
    assert_eq!(
        fault(&terminated(12, None, Some("Error"))).0,
        HardwareFault::GpuMissing
    );
    assert_eq!(
        fault(&terminated(10, None, None)).0,
        HardwareFault::GpuMissing
    );
    assert_eq!(
        fault(&terminated(13, None, None)).0,
        HardwareFault::GpuUnusable
    );
    let (r, detail) = not_measured(&terminated(11, None, Some("Error")));
    assert_eq!(r, NotMeasuredReason::AgentIncompatible);
    assert!(detail.contains("could not be loaded"), "{detail}");
    assert_eq!(
        not_measured(&terminated(2, None, None)).0,
        NotMeasuredReason::AgentIncompatible
    );
    assert_eq!(
        not_measured(&terminated(101, None, None)).0,
        NotMeasuredReason::AgentBug
    );
    // Exit 14: other work held the GPUs; the agent's reason is the termination message.
    let held = "the GPUs are in use by other work: GPU 2: 40.0 GiB of 140.4 GiB in use (no process of it is visible here) before the check started; ...";
    let (r, detail) = not_measured(&terminated(14, Some(held), Some("Error")));
    assert_eq!(r, NotMeasuredReason::GpusInUse);
    assert!(
        detail.starts_with("other work held the GPUs when the agent started (exit code 14): the GPUs are in use by other work: GPU 2: 40.0 GiB"),
        "{detail}"
    );
    assert_eq!(
        not_measured(&terminated(1, None, None)).0,
        NotMeasuredReason::AgentBug
    );
    let s = pod_state(&terminated(134, None, None));
    let r = node_result("gpu-1", None, &s);
    assert_eq!(r.verdict, NodeVerdict::Errored);
    assert_eq!(r.hardware_fault, Some(HardwareFault::Crash));
    assert!(r.reason.is_some_and(|r| r.contains("exit code 134")));
}

#[test]
fn out_of_memory_and_start_errors_are_not_the_node() {
    assert_eq!(
        not_measured(&terminated(137, None, Some("OOMKilled"))).0,
        NotMeasuredReason::OutOfMemory
    );
    let (r, detail) = not_measured(&terminated(
        128,
        Some("exec: \"fabric-agent\": not found"),
        Some("StartError"),
    ));
    assert_eq!(r, NotMeasuredReason::ContainerConfig);
    assert!(detail.contains("StartError"), "{detail}");
}

#[test]
fn a_deadline_kill_says_whether_the_agent_had_started() {
    // Started: the agent hung (its own watchdog could not stop it).
    let mut p = terminated(137, None, None);
    if let Some(s) = p.status.as_mut() {
        s.reason = Some("DeadlineExceeded".into());
    }
    let (f, detail) = fault(&p);
    assert_eq!(f, HardwareFault::Hang);
    assert!(
        detail.contains("had started")
            && detail.contains("30s")
            && detail.contains("phase unknown"),
        "{detail}"
    );
    assert_eq!(pod_state(&p).provisional_verdict(), NodeVerdict::Timeout);
    // Started, and its last progress line is the termination message: the phase is named.
    let progress = format!("{PROGRESS_PREFIX}ncclSweep: allReduce 64 MiB\n");
    let mut p = terminated(137, Some(&progress), None);
    if let Some(s) = p.status.as_mut() {
        s.reason = Some("DeadlineExceeded".into());
    }
    let (f, detail) = fault(&p);
    assert_eq!(f, HardwareFault::Hang);
    assert!(
        detail.contains("had started")
            && detail.contains("in phase \"ncclSweep: allReduce 64 MiB\""),
        "{detail}"
    );
    assert!(!detail.contains(PROGRESS_PREFIX), "{detail}");
    // Never started: no container ran before the deadline.
    let p = pod("Failed", Some("DeadlineExceeded"), None);
    let (r, detail) = not_measured(&p);
    assert_eq!(r, NotMeasuredReason::NeverStarted);
    assert!(detail.contains("no container ever ran"), "{detail}");
    // Never started, held back by an image pull: the pull is the reason.
    let mut p = waiting("ErrImagePull", "pull access denied");
    if let Some(s) = p.status.as_mut() {
        s.phase = Some("Failed".into());
        s.reason = Some("DeadlineExceeded".into());
    }
    let (r, detail) = not_measured(&p);
    assert_eq!(r, NotMeasuredReason::ImagePull);
    assert!(
        detail.contains("ErrImagePull: pull access denied"),
        "{detail}"
    );
}

#[test]
fn kubelet_admission_rejection_is_not_admitted() {
    let mut p = pod("Failed", Some("OutOfnvidia.com/gpu"), None);
    if let Some(s) = p.status.as_mut() {
        s.message = Some(
            "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 8, used: 8, capacity: 8"
                .into(),
        );
    }
    let (r, detail) = not_measured(&p);
    assert_eq!(r, NotMeasuredReason::NotAdmitted);
    assert!(
        detail.contains("OutOfnvidia.com/gpu") && detail.contains("used: 8"),
        "{detail}"
    );
    let s = pod_state(&p);
    let entry = node_result("gpu-1", Some("p"), &s);
    assert_eq!(entry.verdict, NodeVerdict::NotMeasured);
    assert_eq!(entry.not_measured, Some(NotMeasuredReason::NotAdmitted));
    assert!(!entry.verdict.is_bad());
}

#[test]
fn image_pull_and_config_errors_end_the_pod_only_once_final() {
    // ErrImagePull may still succeed on retry: keep waiting, remembering why.
    let s = pod_state(&waiting("ErrImagePull", "manifest unknown"));
    let PodState::Waiting(Some(b)) = &s else {
        panic!("expected waiting, got {s:?}")
    };
    assert_eq!(b.reason, NotMeasuredReason::ImagePull);
    assert_eq!(s.provisional_verdict(), NodeVerdict::Pending);
    for (reason, want) in [
        ("ImagePullBackOff", NotMeasuredReason::ImagePull),
        ("InvalidImageName", NotMeasuredReason::ImagePull),
        ("ErrImageNeverPull", NotMeasuredReason::ImagePull),
        (
            "CreateContainerConfigError",
            NotMeasuredReason::ContainerConfig,
        ),
    ] {
        let (r, detail) = not_measured(&waiting(reason, "secret \"x\" not found"));
        assert_eq!(r, want, "{reason}");
        assert!(detail.starts_with(reason), "{detail}");
    }
    // A pod failed with its container still waiting: the waiting reason, not admission.
    let mut p = waiting("CreateContainerConfigError", "secret \"x\" not found");
    if let Some(s) = p.status.as_mut() {
        s.phase = Some("Failed".into());
    }
    assert_eq!(not_measured(&p).0, NotMeasuredReason::ContainerConfig);
    // A container error the kubelet retries stays waiting, with its reason.
    let s = pod_state(&waiting(
        "CreateContainerError",
        "context deadline exceeded",
    ));
    assert!(
        matches!(&s, PodState::Waiting(Some(b)) if b.reason == NotMeasuredReason::ContainerConfig),
        "{s:?}"
    );
}

#[test]
fn evicted_and_preempted_pods_are_not_measured() {
    let mut p = pod("Failed", Some("Evicted"), None);
    if let Some(s) = p.status.as_mut() {
        s.message = Some("The node was low on resource: memory.".into());
    }
    let (r, detail) = not_measured(&p);
    assert_eq!(r, NotMeasuredReason::Evicted);
    assert!(detail.contains("memory"), "{detail}");
    // Preempted after it started: the disruption, not the exit code, says why.
    let mut p = terminated(143, None, None);
    if let Some(s) = p.status.as_mut() {
        s.conditions = Some(vec![PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("PreemptionByScheduler".into()),
            message: Some("preempted by a pod of priority 1000".into()),
            ..Default::default()
        }]);
    }
    let (r, detail) = not_measured(&p);
    assert_eq!(r, NotMeasuredReason::Preempted);
    assert!(detail.contains("priority 1000"), "{detail}");
    assert_eq!(
        not_measured(&terminated(143, None, None)).0,
        NotMeasuredReason::PodDeleted
    );
}

#[test]
fn running_and_pending_pods_are_not_final() {
    assert_eq!(pod_state(&running()), PodState::Running);
    assert!(!pod_state(&running()).is_final());
    let bound = pod("Pending", None, None);
    assert_eq!(pod_state(&bound), PodState::Waiting(None));
    let unbound = Pod::default();
    let s = pod_state(&unbound);
    assert!(
        matches!(&s, PodState::Waiting(Some(b)) if b.reason == NotMeasuredReason::NotScheduled),
        "{s:?}"
    );
}

#[test]
fn the_run_deadline_blames_a_started_agent_and_spares_a_pod_that_never_ran() {
    let o = PodState::Running.at_run_deadline(60, Some("ncclSweep: allReduce 64 MiB"));
    assert!(
        matches!(&o, NodeOutcome::HardwareFault { fault: HardwareFault::Hang, detail }
            if detail.contains("in phase \"ncclSweep: allReduce 64 MiB\"")),
        "{o:?}"
    );
    let o = PodState::Running.at_run_deadline(60, None);
    assert!(
        matches!(&o, NodeOutcome::HardwareFault { fault: HardwareFault::Hang, detail }
            if detail.contains("phase unknown")),
        "{o:?}"
    );
    let o = PodState::Waiting(None).at_run_deadline(60, None);
    assert!(
        matches!(&o, NodeOutcome::NotMeasured { reason: NotMeasuredReason::NeverStarted, detail } if detail.contains("60s")),
        "{o:?}"
    );
    let o = pod_state(&waiting("ErrImagePull", "x")).at_run_deadline(60, None);
    assert!(
        matches!(
            &o,
            NodeOutcome::NotMeasured {
                reason: NotMeasuredReason::ImagePull,
                ..
            }
        ),
        "{o:?}"
    );
}

#[test]
fn an_entry_in_the_status_gives_back_its_outcome() {
    for state in [
        pod_state(&terminated(134, None, None)),
        pod_state(&terminated(11, None, None)),
        pod_state(&pod("Failed", Some("OutOfnvidia.com/gpu"), None)),
        PodState::Ended(PodState::Running.at_run_deadline(30, None)),
        PodState::Ended(pod_gone()),
    ] {
        let entry = node_result("gpu-1", None, &state);
        let PodState::Ended(want) = state.clone() else {
            unreachable!("built ended")
        };
        assert_eq!(entry.outcome(), Some(want));
    }
}

#[test]
fn a_gone_pod_is_never_a_hang_and_never_started_only_if_it_was_last_seen_pending() {
    let reason = |o: &NodeOutcome| match o {
        NodeOutcome::NotMeasured { reason, .. } => Some(*reason),
        _ => None,
    };
    // Before the deadline: deleted.
    for last in [NodeVerdict::Pending, NodeVerdict::Running] {
        assert_eq!(
            reason(&gone_pod(last, false, 60)),
            Some(NotMeasuredReason::PodDeleted)
        );
    }
    // After it, last seen Pending: it never started.
    let o = gone_pod(NodeVerdict::Pending, true, 60);
    assert_eq!(reason(&o), Some(NotMeasuredReason::NeverStarted));
    // Last seen Running: it had started (stopped at the deadline, the status write after that
    // lost, or deleted); not measured, and the sentence says so.
    let o = gone_pod(NodeVerdict::Running, true, 60);
    assert_eq!(reason(&o), Some(NotMeasuredReason::PodDeleted), "{o:?}");
    let detail = o.detail().unwrap_or_default();
    assert!(
        detail.contains("had started") && !detail.contains("Pending"),
        "{detail}"
    );
    assert!(!o.counts_against_node());
}

#[test]
fn the_last_progress_line_of_a_log_names_the_phase() {
    let log = "[fabric-agent] node-check on gpu-1 with the cuda backend\n\
               some NCCL INFO line\n\
               [fabric-agent] ncclSweep: allGather 16 MiB\n\
               NCCL WARN something\n";
    assert_eq!(
        last_progress_in_log(log).as_deref(),
        Some("ncclSweep: allGather 16 MiB")
    );
    assert_eq!(last_progress_in_log("no progress here\n"), None);
    assert_eq!(last_progress_in_log(""), None);
    let long = format!("[fabric-agent] {}", "x".repeat(500));
    assert_eq!(last_progress_in_log(&long).map(|l| l.len()), Some(200));
}

#[test]
fn a_running_pod_on_a_node_that_stopped_reporting_is_not_measured_at_the_run_deadline() {
    let o = node_not_ready(60, "its Ready condition is Unknown");
    match &o {
        NodeOutcome::NotMeasured { reason, detail } => {
            assert_eq!(*reason, NotMeasuredReason::NodeNotReady);
            assert!(
                detail.starts_with("the node stopped reporting while the agent ran (its Ready condition is Unknown), and its pod still read Running when the run deadline (60s) passed"),
                "{detail}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(NodeVerdict::provisional(&o), NodeVerdict::NotMeasured);
}

#[test]
fn a_measured_entry_keeps_the_headline_numbers_and_no_outcome_to_give_back() {
    let s = pod_state(&terminated(0, Some(GOOD), Some("Completed")));
    let PodState::Ended(o) = &s else {
        panic!("expected ended, got {s:?}")
    };
    let mut e = NodeRunResult {
        node: "gpu-1".into(),
        hardware_fault: Some(HardwareFault::Crash),
        not_measured: Some(NotMeasuredReason::PodDeleted),
        reason: Some("an earlier pod".into()),
        ..Default::default()
    };
    e.record(o);
    assert_eq!(e, node_result("gpu-1", None, &s));
    assert_eq!(e.outcome(), None, "the document stays in the pod");
    for verdict in [NodeVerdict::Passed, NodeVerdict::Failed] {
        e.verdict = verdict;
        assert_eq!(e.outcome(), None);
    }
}

/// `p`, deleted at `asked` seconds after the epoch with a 30 s grace period, its container
/// finished at `finished`.
fn deleted_at(mut p: Pod, asked: i64, finished: i64) -> Pod {
    let at =
        |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).expect("a valid timestamp"));
    p.metadata.deletion_timestamp = Some(at(asked + 30));
    p.metadata.deletion_grace_period_seconds = Some(30);
    if let Some(t) = p
        .status
        .as_mut()
        .and_then(|s| s.container_statuses.as_mut())
        .and_then(|c| c.first_mut())
        .and_then(|c| c.state.as_mut())
        .and_then(|s| s.terminated.as_mut())
    {
        t.finished_at = Some(at(finished));
    }
    p
}

#[test]
fn an_agent_that_crashes_while_its_pod_is_deleted_is_never_the_nodes_fault() {
    let progress = format!("{PROGRESS_PREFIX}NCCL sweep: all_gather, 32 MiB\n");
    // A segmentation fault, a SIGKILL at the end of the grace period, an abort: each in or
    // after the second the deletion was asked for.
    for code in [139, 137, 134, 143, 1, 13] {
        let p = deleted_at(terminated(code, Some(&progress), None), 1_000, 1_002);
        let (r, detail) = not_measured(&p);
        assert_eq!(r, NotMeasuredReason::PodDeleted, "exit {code}: {detail}");
        assert!(
            detail.contains(&format!("exit code {code}"))
                && detail.contains("NCCL sweep: all_gather, 32 MiB")
                && detail.contains("says nothing of the node"),
            "{detail}"
        );
        let same_second = deleted_at(terminated(code, None, None), 1_000, 1_000);
        assert_eq!(not_measured(&same_second).0, NotMeasuredReason::PodDeleted);
        // The deletion's time is no witness: a kubelet's confirmation with a grace of 0 moves
        // the deletionTimestamp of a pod a finalizer holds to after the container's end.
        let moved = deleted_at(terminated(code, None, None), 1_005, 1_002);
        assert_eq!(not_measured(&moved).0, NotMeasuredReason::PodDeleted);
    }
}

#[test]
fn a_result_written_before_the_stop_is_still_read() {
    let p = deleted_at(terminated(0, Some(GOOD), None), 1_000, 1_001);
    assert!(matches!(ended(&p), NodeOutcome::Measured(_)));
    let p = deleted_at(terminated(3, Some(GOOD), None), 1_000, 1_001);
    assert!(matches!(ended(&p), NodeOutcome::Measured(_)));
}

#[test]
fn an_evicted_preempted_or_drained_agent_that_crashes_is_not_measured() {
    let disrupted = |reason: &str, phase: &str| {
        let mut p = terminated(139, None, None);
        if let Some(s) = p.status.as_mut() {
            s.phase = Some(phase.into());
            s.conditions = Some(vec![PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                reason: Some(reason.into()),
                message: Some(format!("{reason} by the test")),
                ..Default::default()
            }]);
        }
        p
    };
    // The condition is there before the phase turns Failed: a segfault on the way out reads
    // as the disruption in either phase.
    for phase in ["Running", "Failed"] {
        assert_eq!(
            not_measured(&disrupted("EvictionByEvictionAPI", phase)).0,
            NotMeasuredReason::Evicted
        );
        assert_eq!(
            not_measured(&disrupted("PreemptionByScheduler", phase)).0,
            NotMeasuredReason::Preempted
        );
        assert_eq!(
            not_measured(&disrupted("DeletionByTaintManager", phase)).0,
            NotMeasuredReason::Evicted
        );
    }
}

#[test]
fn an_agent_stopped_by_a_node_shutdown_is_not_measured() {
    // With the DisruptionTarget condition (Kubernetes 1.26 and later) ...
    let mut p = terminated(139, None, None);
    if let Some(s) = p.status.as_mut() {
        s.reason = Some("Terminated".into());
        s.message = Some("Pod was terminated in response to imminent node shutdown.".into());
        s.conditions = Some(vec![PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("TerminationByKubelet".into()),
            message: Some("Pod was terminated in response to imminent node shutdown.".into()),
            ..Default::default()
        }]);
    }
    let (r, detail) = not_measured(&p);
    assert_eq!(r, NotMeasuredReason::Evicted);
    assert!(detail.contains("node shutdown"), "{detail}");
    // ... and without it: the pod's reason says it.
    let mut p = terminated(137, None, None);
    if let Some(s) = p.status.as_mut() {
        s.phase = Some("Running".into());
        s.reason = Some("Terminated".into());
        s.message = Some("Pod was terminated in response to imminent node shutdown.".into());
    }
    let (r, detail) = not_measured(&p);
    assert_eq!(r, NotMeasuredReason::Evicted);
    assert!(
        detail.contains("shutting down") && detail.contains("exit code 137"),
        "{detail}"
    );
}

#[test]
fn the_pod_deadline_judges_a_started_agent_by_its_deadline_never_by_its_exit_code() {
    // Stopped at its activeDeadlineSeconds: the agent was still running past its own
    // watchdog, a hang; a segmentation fault on the way out changes nothing.
    for code in [139, 143, 137] {
        let mut p = terminated(code, None, None);
        if let Some(s) = p.status.as_mut() {
            s.reason = Some("DeadlineExceeded".into());
        }
        let (f, detail) = fault(&p);
        assert_eq!(f, HardwareFault::Hang, "exit {code}");
        assert!(!detail.contains("segmentation"), "{detail}");
    }
}

/// A pod the scheduler left unbound, with its `PodScheduled` condition saying `message`;
/// `claims`: it claims its GPUs through a ResourceClaim.
fn unschedulable(claims: bool, message: &str) -> Pod {
    let mut p = pod("Pending", None, None);
    if let Some(spec) = p.spec.as_mut() {
        spec.node_name = None;
        if claims {
            spec.resource_claims = Some(vec![k8s_openapi::api::core::v1::PodResourceClaim {
                name: "gpus".into(),
                resource_claim_template_name: Some("gpus".into()),
                ..Default::default()
            }]);
        }
    }
    if let Some(s) = p.status.as_mut() {
        s.conditions = Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some(message.into()),
            ..Default::default()
        }]);
    }
    p
}

#[test]
fn a_claim_the_scheduler_cannot_allocate_says_the_gpus_could_not_be_claimed() {
    let said = "0/4 nodes are available: 1 cannot allocate all claims, 3 node(s) didn't match Pod's node affinity/selector.";
    let o = pod_state(&unschedulable(true, said)).at_run_deadline(40, None);
    let NodeOutcome::NotMeasured { reason, detail } = &o else {
        panic!("not measured, never a fault of the node: {o:?}");
    };
    assert_eq!(*reason, NotMeasuredReason::NotScheduled);
    assert!(
        detail.starts_with("the node's GPUs could not be claimed ("),
        "{detail}"
    );
    assert!(
        detail.contains(
            "the scheduler: Unschedulable: 0/4 nodes are available: 1 cannot allocate all claims"
        ),
        "the scheduler's words: {detail}"
    );
    assert!(detail.contains("the run deadline (40s)"), "{detail}");
    // A pod that claims nothing, or one the scheduler refused for another reason, is not
    // said to have lost its GPUs: the scheduler's words alone.
    for p in [
        unschedulable(false, said),
        unschedulable(true, "0/4 nodes are available: 1 Insufficient cpu."),
    ] {
        let (r, detail) = match pod_state(&p).at_run_deadline(40, None) {
            NodeOutcome::NotMeasured { reason, detail } => (reason, detail),
            o => panic!("{o:?}"),
        };
        assert_eq!(r, NotMeasuredReason::NotScheduled);
        assert!(!detail.contains("could not be claimed"), "{detail}");
        assert!(
            detail.contains("never bound to its node (the scheduler: Unschedulable: 0/4"),
            "{detail}"
        );
    }
}
