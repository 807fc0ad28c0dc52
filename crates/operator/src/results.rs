//! What a finished benchmark pod says about its node: the compact result from the
//! termination message, or why there is none (crash, deadline, unreadable result, pod gone).
//! Never panics on what a pod holds.

use gpufabric_api::result::CompactResult;
use gpufabric_api::run::{NodeRunResult, NodeVerdict};
use gpufabric_api::suite::Collective;
use k8s_openapi::api::core::v1::Pod;

/// The state of one node's pod, as far as the run is concerned.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Created, not running yet.
    Pending,
    /// The agent is running.
    Running,
    /// The agent measured and wrote a readable result.
    Measured(Box<CompactResult>),
    /// The agent exited non-zero (or was killed) without a usable result.
    Crashed { exit_code: i32, reason: String },
    /// The pod ran past its deadline.
    TimedOut { reason: String },
    /// No usable result for another reason (missing, truncated, malformed; pod gone or evicted).
    Errored { reason: String },
}

impl Outcome {
    /// The pod has ended: nothing more will come from it.
    pub fn is_final(&self) -> bool {
        !matches!(self, Outcome::Pending | Outcome::Running)
    }

    /// The node's verdict before the fleet is judged: measured nodes stay `Running` until
    /// the run's evaluation gives them Passed or Failed.
    pub fn provisional_verdict(&self) -> NodeVerdict {
        match self {
            Outcome::Pending => NodeVerdict::Pending,
            Outcome::Running | Outcome::Measured(_) => NodeVerdict::Running,
            Outcome::Crashed { .. } | Outcome::Errored { .. } => NodeVerdict::Errored,
            Outcome::TimedOut { .. } => NodeVerdict::Timeout,
        }
    }

    /// Why the node has no result, when it has none.
    pub fn reason(&self) -> Option<String> {
        match self {
            Outcome::Crashed { reason, .. }
            | Outcome::TimedOut { reason }
            | Outcome::Errored { reason } => Some(reason.clone()),
            _ => None,
        }
    }

    /// The outcome of a pod that was created but is no longer there.
    pub fn pod_gone() -> Outcome {
        Outcome::Errored {
            reason: "the benchmark pod was deleted before it finished".into(),
        }
    }

    /// The outcome of a pod the run had to stop at its deadline.
    pub fn run_deadline(seconds: u64) -> Outcome {
        Outcome::TimedOut {
            reason: format!("the run deadline ({seconds}s) passed before the pod finished"),
        }
    }
}

/// What the agent's exit code means (see `CheckError::exit_code` in the bench crate).
pub fn exit_code_meaning(code: i32) -> &'static str {
    match code {
        1 => "agent failed unexpectedly",
        2 => "invalid input",
        10 => "no GPU found",
        11 => "a GPU library (CUDA, NCCL or NVML) could not be loaded",
        12 => "fewer GPUs than the node advertises",
        13 => "the check could not run",
        134 => "aborted (SIGABRT)",
        137 => "killed (SIGKILL, often out of memory)",
        139 => "segmentation fault",
        143 => "terminated (SIGTERM)",
        _ => "agent exited with an error",
    }
}

fn first_line(text: &str, max: usize) -> String {
    let line = text.trim().lines().next().unwrap_or("").trim();
    if line.len() <= max {
        return line.to_string();
    }
    let mut end = max;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

/// Reads a pod's outcome from its status.
pub fn outcome(pod: &Pod) -> Outcome {
    let Some(status) = pod.status.as_ref() else {
        return Outcome::Pending;
    };
    if status.reason.as_deref() == Some("DeadlineExceeded") {
        let limit = pod
            .spec
            .as_ref()
            .and_then(|s| s.active_deadline_seconds)
            .map(|s| format!(" ({s}s)"))
            .unwrap_or_default();
        return Outcome::TimedOut {
            reason: format!("the agent ran past the pod deadline{limit}"),
        };
    }
    let terminated = status
        .container_statuses
        .as_ref()
        .and_then(|cs| cs.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref());
    if let Some(t) = terminated {
        let message = t.message.as_deref().unwrap_or("");
        if t.exit_code == 0 {
            return match CompactResult::parse(message) {
                Ok(result) => Outcome::Measured(Box::new(result)),
                Err(e) => Outcome::Errored {
                    reason: format!("the agent exited 0 but its result is unusable: {e}"),
                },
            };
        }
        let mut reason = format!(
            "{} (exit code {})",
            exit_code_meaning(t.exit_code),
            t.exit_code
        );
        if let Some(r) = t
            .reason
            .as_deref()
            .filter(|r| !r.is_empty() && *r != "Error")
        {
            reason.push_str(&format!(", {r}"));
        }
        let detail = first_line(message, 200);
        if !detail.is_empty() && !detail.starts_with('{') {
            reason.push_str(&format!(": {detail}"));
        }
        return Outcome::Crashed {
            exit_code: t.exit_code,
            reason,
        };
    }
    match status.phase.as_deref() {
        Some("Failed") => Outcome::Errored {
            reason: format!(
                "the pod failed without running the agent to the end: {}{}",
                status.reason.as_deref().unwrap_or("unknown reason"),
                status
                    .message
                    .as_deref()
                    .map(|m| format!(" ({})", first_line(m, 200)))
                    .unwrap_or_default()
            ),
        },
        Some("Succeeded") => Outcome::Errored {
            reason: "the pod succeeded but reports no container state".into(),
        },
        Some("Running") => Outcome::Running,
        _ => Outcome::Pending,
    }
}

/// The compact per-node summary the run status keeps.
pub fn node_result(node: &str, pod: Option<&str>, outcome: &Outcome) -> NodeRunResult {
    let mut r = NodeRunResult {
        node: node.to_string(),
        verdict: outcome.provisional_verdict(),
        pod: pod.map(str::to_string),
        reason: outcome.reason(),
        ..Default::default()
    };
    if let Outcome::Measured(c) = outcome {
        summarise(&mut r, c);
    }
    r
}

/// Fills the headline numbers of a measured node.
pub fn summarise(r: &mut NodeRunResult, c: &CompactResult) {
    r.product = (!c.product.is_empty()).then(|| c.product.clone());
    r.gpus = Some(c.gpus);
    r.all_reduce_bus_bw_gbps = c
        .collectives
        .iter()
        .find(|x| x.collective == Collective::AllReduce)
        .map(|x| x.peak_busbw);
    r.min_pair_gbps = (0..c.gpus)
        .flat_map(|a| (0..c.gpus).map(move |b| (a, b)))
        .filter_map(|(a, b)| c.pair_uni(a, b))
        .reduce(f64::min);
    r.ddp_efficiency = c
        .ddp_points
        .iter()
        .max_by_key(|p| p.gpus)
        .map(|p| p.scaling_efficiency);
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, PodSpec,
        PodStatus,
    };

    const GOOD: &str = r#"{"v":1,"n":"gpu-1","b":"sim","p":"NVIDIA-H100-80GB-HBM3","g":2,"d":3.2,
        "nc":[{"c":"allReduce","pk":361.5,"bb":360.1,"lt":12.3}],
        "pu":[0,390.2,388.7,0],"dp":[{"g":1,"st":10.0,"e":1.0,"cf":0.0,"ov":1.0,"tf":500.0},{"g":2,"st":10.5,"e":0.95,"cf":0.05,"ov":0.9,"tf":480.0}]}"#;

    fn terminated(exit_code: i32, message: Option<&str>, reason: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                active_deadline_seconds: Some(30),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some(
                    if exit_code == 0 {
                        "Succeeded"
                    } else {
                        "Failed"
                    }
                    .into(),
                ),
                container_statuses: Some(vec![ContainerStatus {
                    name: "agent".into(),
                    state: Some(ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code,
                            message: message.map(str::to_string),
                            reason: reason.map(str::to_string),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn exit_zero_with_a_result_is_measured() {
        let o = outcome(&terminated(0, Some(GOOD), Some("Completed")));
        let Outcome::Measured(c) = &o else {
            panic!("expected Measured, got {o:?}")
        };
        assert_eq!(c.node, "gpu-1");
        let r = node_result("gpu-1", Some("p"), &o);
        assert_eq!(r.all_reduce_bus_bw_gbps, Some(361.5));
        assert_eq!(r.min_pair_gbps, Some(388.7));
        assert_eq!(r.ddp_efficiency, Some(0.95));
        assert_eq!(r.gpus, Some(2));
        assert_eq!(
            r.verdict,
            NodeVerdict::Running,
            "judged only when the run ends"
        );
    }

    #[test]
    fn missing_truncated_or_malformed_results_are_errored_not_panics() {
        for msg in [
            None,
            Some(""),
            Some(&GOOD[..40]),
            Some("not json"),
            Some(r#"{"v":9}"#),
            Some(r#"{"v":1}"#),
        ] {
            let o = outcome(&terminated(0, msg, None));
            assert!(matches!(o, Outcome::Errored { .. }), "{msg:?} -> {o:?}");
            assert_eq!(o.provisional_verdict(), NodeVerdict::Errored);
            assert!(o.reason().is_some_and(|r| r.contains("unusable")));
        }
    }

    #[test]
    fn non_zero_exit_is_a_crash_with_the_reason() {
        let o = outcome(&terminated(
            134,
            Some("CUDA error: an illegal memory access"),
            None,
        ));
        let Outcome::Crashed { exit_code, reason } = &o else {
            panic!("expected Crashed, got {o:?}")
        };
        assert_eq!(*exit_code, 134);
        assert!(
            reason.contains("SIGABRT") && reason.contains("illegal memory access"),
            "{reason}"
        );
        assert_eq!(o.provisional_verdict(), NodeVerdict::Errored);
        let o = outcome(&terminated(11, None, Some("Error")));
        assert!(
            o.reason()
                .is_some_and(|r| r.contains("could not be loaded"))
        );
    }

    #[test]
    fn deadline_exceeded_is_a_timeout() {
        let mut p = terminated(137, None, None);
        if let Some(s) = p.status.as_mut() {
            s.reason = Some("DeadlineExceeded".into());
        }
        let o = outcome(&p);
        assert!(matches!(o, Outcome::TimedOut { .. }), "{o:?}");
        assert_eq!(o.provisional_verdict(), NodeVerdict::Timeout);
        assert!(o.reason().is_some_and(|r| r.contains("30s")));
    }

    #[test]
    fn running_and_pending_pods_are_not_final() {
        let running = Pod {
            status: Some(PodStatus {
                phase: Some("Running".into()),
                container_statuses: Some(vec![ContainerStatus {
                    state: Some(ContainerState {
                        running: Some(ContainerStateRunning::default()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(outcome(&running), Outcome::Running);
        assert!(!outcome(&running).is_final());
        assert_eq!(outcome(&Pod::default()), Outcome::Pending);
    }

    #[test]
    fn evicted_pod_is_errored_with_the_kubelet_reason() {
        let p = Pod {
            status: Some(PodStatus {
                phase: Some("Failed".into()),
                reason: Some("Evicted".into()),
                message: Some("The node was low on resource: memory.".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let o = outcome(&p);
        assert!(
            o.reason()
                .is_some_and(|r| r.contains("Evicted") && r.contains("memory")),
            "{o:?}"
        );
        assert_eq!(o.provisional_verdict(), NodeVerdict::Errored);
    }

    #[test]
    fn a_deleted_pod_is_errored() {
        let o = Outcome::pod_gone();
        assert!(o.is_final());
        assert_eq!(o.provisional_verdict(), NodeVerdict::Errored);
        let o = Outcome::run_deadline(60);
        assert_eq!(o.provisional_verdict(), NodeVerdict::Timeout);
    }
}
