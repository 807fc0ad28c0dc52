//! A node's standing in one FabricTest as one type: what it is, how a run, a repair or a
//! person moves it, and how it reads on the node (label, condition), in metrics and to a
//! person. Decided once when a run is folded; every reader reads it and derives nothing.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A node's standing in one FabricTest (bottlerocket-update-operator's node state is the
/// model: the state and its transitions live on the type).
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(try_from = "StandingRecord", into = "StandingRecord")]
#[schemars(with = "StandingRecord")]
pub enum Standing {
    /// Measured and passed.
    Passing,
    /// Failed, not yet confirmed: fewer consecutive failures than `failuresToQuarantine`, a
    /// confirmation run retests it, or the breaker is open (a storm is not trusted).
    Suspect,
    /// Failed and confirmed; `hardware`: a fault the agent saw (a GPU missing, a link
    /// down, a hang).
    Failing { hardware: bool },
    /// Failing and confirmed, but not acted on, and why (the mode is Observe, the budget is
    /// spent, ...).
    HeldBack { why: String, hardware: bool },
    /// Quarantined by the test.
    Quarantined { hardware: bool },
    /// Quarantined again and again: passing runs no longer release it, a repair does.
    RepeatOffender,
    /// Its faulty GPUs (by index) are out of service, each by a DRA device taint of the
    /// test; the node itself is not held and stays schedulable: a node that fails as a node
    /// reads otherwise, one whose GPUs are all released reads as its runs say.
    GpusOutOfService { gpus: Vec<u32> },
    /// A person took the test's quarantine back, and what they did; tested again at once.
    TakenBack { what: String },
    /// Behind the validation gate, not yet measured.
    Gated,
    /// Never measured by the test, and why (the infrastructure, not the node).
    #[default]
    NotMeasured,
}

/// What the quarantine planner and the lifecycle said of a node in the run being folded:
/// the facts a transition reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Facts {
    /// Quarantined by the test after this run.
    pub quarantined: bool,
    /// A repeat offender after this run.
    pub repeat_offender: bool,
    /// Not acted on although confirmed, and why.
    pub held_back: Option<String>,
    /// The failure counts as confirmed (the streak reached `failuresToQuarantine`, no
    /// confirmation run retests it, the breaker is closed).
    pub confirmed: bool,
    /// The failure is a hardware fault the agent saw, or a crash or hang.
    pub hardware: bool,
    /// The node carries the validation gate.
    pub gated: bool,
    /// The node's GPUs the test holds out of service with DRA device taints after this run.
    pub gpus_out: Vec<u32>,
}

/// How a standing reads in the node's `GPUFabricDegraded` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConditionReading {
    /// `True`: a confirmed problem (what draino and NodeHealthCheck act on).
    pub status: &'static str,
    pub reason: &'static str,
}

impl Standing {
    /// After a run measured the node and it passed: quarantined nodes stay so until the
    /// planner releases them (a repeat offender until a repair does).
    pub fn on_pass(&self, f: &Facts) -> Standing {
        if f.repeat_offender && f.quarantined {
            Standing::RepeatOffender
        } else if f.quarantined {
            Standing::Quarantined {
                hardware: self.hardware(),
            }
        } else if !f.gpus_out.is_empty() {
            Standing::GpusOutOfService {
                gpus: f.gpus_out.clone(),
            }
        } else {
            Standing::Passing
        }
    }

    /// After a run measured the node and it failed.
    pub fn on_failure(&self, f: &Facts) -> Standing {
        if f.quarantined && f.repeat_offender {
            Standing::RepeatOffender
        } else if f.quarantined {
            Standing::Quarantined {
                hardware: f.hardware,
            }
        } else if !f.gpus_out.is_empty() {
            // The failure is acted on per GPU: the node is not held.
            Standing::GpusOutOfService {
                gpus: f.gpus_out.clone(),
            }
        } else if !f.confirmed {
            Standing::Suspect
        } else if let Some(why) = &f.held_back {
            Standing::HeldBack {
                why: why.clone(),
                hardware: f.hardware,
            }
        } else {
            Standing::Failing {
                hardware: f.hardware,
            }
        }
    }

    /// After a run that did not measure the node: the infrastructure is not the node's
    /// fault, so a standing a measurement gave is kept; a quarantine, of the node or of its
    /// GPUs, is what the planner kept or ended (read from `f`); a node never measured is
    /// gated or not measured.
    pub fn on_not_measured(&self, f: &Facts) -> Standing {
        if f.quarantined {
            return if f.repeat_offender {
                Standing::RepeatOffender
            } else {
                Standing::Quarantined {
                    hardware: self.hardware(),
                }
            };
        }
        if !f.gpus_out.is_empty() {
            return Standing::GpusOutOfService {
                gpus: f.gpus_out.clone(),
            };
        }
        match self {
            Standing::NotMeasured | Standing::Gated if f.gated => Standing::Gated,
            Standing::NotMeasured
            | Standing::Gated
            | Standing::Quarantined { .. }
            | Standing::RepeatOffender
            | Standing::GpusOutOfService { .. } => Standing::NotMeasured,
            kept => kept.clone(),
        }
    }

    /// A repair was proven by a complete measurement that passed: a clean record.
    pub fn on_repair(&self) -> Standing {
        Standing::Passing
    }

    /// A person undid the test's quarantine (`what` they did): the test no longer holds the
    /// node, and tests it again at once.
    pub fn on_taken_back(&self, what: &str) -> Standing {
        Standing::TakenBack {
            what: what.to_string(),
        }
    }

    /// Whether the test holds the node in quarantine.
    pub fn is_quarantined(&self) -> bool {
        matches!(
            self,
            Standing::Quarantined { .. } | Standing::RepeatOffender
        )
    }

    /// Whether the node is a repeat offender: quarantined again and again, so that only a
    /// repair releases it.
    pub fn is_repeat_offender(&self) -> bool {
        matches!(self, Standing::RepeatOffender)
    }

    /// Whether the standing's failure is a hardware fault.
    pub fn hardware(&self) -> bool {
        matches!(
            self,
            Standing::Failing { hardware: true }
                | Standing::HeldBack { hardware: true, .. }
                | Standing::Quarantined { hardware: true }
        )
    }

    /// The `gpufabric.io/result` label; None: the label is left as it is (nothing measured
    /// says anything new of the node). A node whose faulty GPUs are out of service passes as
    /// a node: workloads that select passing nodes keep using its other GPUs.
    pub fn label(&self) -> Option<&'static str> {
        match self {
            Standing::Passing | Standing::GpusOutOfService { .. } => Some("pass"),
            Standing::Suspect | Standing::TakenBack { .. } => Some("suspect"),
            Standing::Failing { .. }
            | Standing::HeldBack { .. }
            | Standing::Quarantined { .. }
            | Standing::RepeatOffender => Some("fail"),
            Standing::Gated | Standing::NotMeasured => None,
        }
    }

    /// Status and reason of the `GPUFabricDegraded` condition: `True` is a confirmed problem,
    /// as node-problem-detector's conditions are; a suspect is `Unknown`, not `True`, as
    /// remediation acts on confirmed failures only, as quarantine does. A node whose faulty
    /// GPUs are out of service is `False` (`GPUsOutOfService`): remediating the node would
    /// take its good GPUs too; the message names the GPUs and why.
    pub fn condition(&self) -> ConditionReading {
        let (status, reason) = match self {
            Standing::Passing => ("False", "Passed"),
            Standing::GpusOutOfService { .. } => ("False", "GPUsOutOfService"),
            Standing::Suspect => ("Unknown", "Suspect"),
            Standing::Failing { hardware: false }
            | Standing::HeldBack {
                hardware: false, ..
            }
            | Standing::Quarantined { hardware: false } => ("True", "Failed"),
            Standing::Failing { hardware: true }
            | Standing::HeldBack { hardware: true, .. }
            | Standing::Quarantined { hardware: true } => ("True", "HardwareFault"),
            Standing::RepeatOffender => ("True", "RepeatOffender"),
            Standing::TakenBack { .. } => ("Unknown", "TakenBack"),
            Standing::Gated => ("Unknown", "Gated"),
            Standing::NotMeasured => ("Unknown", "NotMeasured"),
        };
        ConditionReading { status, reason }
    }

    /// The `result` label of `gpufabric_node_last_result`: pass, suspect, fail or
    /// not_measured, the same as the node label where the node has one.
    pub fn metric(&self) -> &'static str {
        self.label().unwrap_or("not_measured")
    }

    /// The metric's values, in the order they are exported.
    pub const METRIC_VALUES: [&'static str; 4] = ["pass", "suspect", "fail", "not_measured"];

    /// How bad the standing is for the node's signals across tests: the node reads the
    /// worst standing of the tests that test it. A test that did not measure the node says
    /// least; a confirmed failure outranks a suspect, a quarantine a failure.
    pub fn severity(&self) -> u8 {
        match self {
            Standing::NotMeasured => 0,
            Standing::Gated => 1,
            Standing::Passing => 2,
            Standing::GpusOutOfService { .. } => 3,
            Standing::TakenBack { .. } => 4,
            Standing::Suspect => 5,
            Standing::Failing { .. } | Standing::HeldBack { .. } => 6,
            Standing::Quarantined { .. } => 7,
            Standing::RepeatOffender => 8,
        }
    }

    /// How soon a person should look at the node (lower first), for the bounded test
    /// status: quarantined nodes (releasing one needs its pass streak), then failing ones
    /// (their streak leads to a quarantine), then those not acted on, then not measured.
    pub fn attention(&self) -> u8 {
        match self {
            Standing::Quarantined { .. }
            | Standing::RepeatOffender
            | Standing::GpusOutOfService { .. } => 0,
            Standing::Suspect | Standing::Failing { .. } => 1,
            Standing::HeldBack { .. } | Standing::TakenBack { .. } | Standing::Gated => 2,
            Standing::NotMeasured => 3,
            Standing::Passing => 4,
        }
    }

    /// The state's name, as stored (`state`) and shown.
    pub fn name(&self) -> &'static str {
        self.state().name()
    }

    fn state(&self) -> State {
        match self {
            Standing::Passing => State::Passing,
            Standing::Suspect => State::Suspect,
            Standing::Failing { .. } => State::Failing,
            Standing::HeldBack { .. } => State::HeldBack,
            Standing::Quarantined { .. } => State::Quarantined,
            Standing::RepeatOffender => State::RepeatOffender,
            Standing::GpusOutOfService { .. } => State::GpusOutOfService,
            Standing::TakenBack { .. } => State::TakenBack,
            Standing::Gated => State::Gated,
            Standing::NotMeasured => State::NotMeasured,
        }
    }
}

impl fmt::Display for Standing {
    /// The standing as a person reads it (`kubectl gpufabric node`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hw = |h: bool| if h { " (hardware fault)" } else { "" };
        match self {
            Standing::Passing => write!(f, "passing"),
            Standing::Suspect => write!(f, "suspect: failed, not yet confirmed"),
            Standing::Failing { hardware } => write!(f, "failing{}", hw(*hardware)),
            Standing::HeldBack { why, hardware } => {
                write!(f, "failing{}, not acted on: {why}", hw(*hardware))
            }
            Standing::Quarantined { hardware } => write!(f, "quarantined{}", hw(*hardware)),
            Standing::RepeatOffender => write!(
                f,
                "quarantined, a repeat offender: passing runs no longer release it, a repair does"
            ),
            Standing::GpusOutOfService { gpus } => write!(
                f,
                "passing as a node; {} out of service by DRA device taints",
                gpu_list(gpus)
            ),
            Standing::TakenBack { what } => write!(
                f,
                "taken back by a person ({what}): what is on the node is theirs"
            ),
            Standing::Gated => write!(f, "gated: behind the validation gate, not yet measured"),
            Standing::NotMeasured => write!(f, "not measured: never held against the node"),
        }
    }
}

/// GPU indices as a person reads them: `GPU 3`, `GPUs 3, 6`.
pub fn gpu_list(gpus: &[u32]) -> String {
    let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
    match gpus.len() {
        1 => format!("GPU {}", list[0]),
        _ => format!("GPUs {}", list.join(", ")),
    }
}

/// The state names a standing is stored under.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum State {
    Passing,
    Suspect,
    Failing,
    HeldBack,
    Quarantined,
    RepeatOffender,
    GpusOutOfService,
    TakenBack,
    Gated,
    #[default]
    NotMeasured,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Passing => "Passing",
            State::Suspect => "Suspect",
            State::Failing => "Failing",
            State::HeldBack => "HeldBack",
            State::Quarantined => "Quarantined",
            State::RepeatOffender => "RepeatOffender",
            State::GpusOutOfService => "GpusOutOfService",
            State::TakenBack => "TakenBack",
            State::Gated => "Gated",
            State::NotMeasured => "NotMeasured",
        }
    }
}

/// A standing as it is stored (in a FabricTest's status and in the node's
/// `gpufabric.io/standing` record): the state, and what its variant carries.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StandingRecord {
    pub state: State,
    /// Held back or taken back: why, or what a person did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// A failure the agent saw as a hardware fault.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hardware: bool,
    /// GPUs out of service: their indices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
}

impl From<Standing> for StandingRecord {
    fn from(s: Standing) -> StandingRecord {
        let hardware = s.hardware();
        let state = s.state();
        let (why, gpus) = match s {
            Standing::HeldBack { why, .. } => (Some(why), Vec::new()),
            Standing::TakenBack { what } => (Some(what), Vec::new()),
            Standing::GpusOutOfService { gpus } => (None, gpus),
            _ => (None, Vec::new()),
        };
        StandingRecord {
            state,
            why,
            hardware,
            gpus,
        }
    }
}

impl From<StandingRecord> for Standing {
    fn from(r: StandingRecord) -> Standing {
        let why = r.why.unwrap_or_default();
        match r.state {
            State::Passing => Standing::Passing,
            State::Suspect => Standing::Suspect,
            State::Failing => Standing::Failing {
                hardware: r.hardware,
            },
            State::HeldBack => Standing::HeldBack {
                why,
                hardware: r.hardware,
            },
            State::Quarantined => Standing::Quarantined {
                hardware: r.hardware,
            },
            State::RepeatOffender => Standing::RepeatOffender,
            State::GpusOutOfService => Standing::GpusOutOfService { gpus: r.gpus },
            State::TakenBack => Standing::TakenBack { what: why },
            State::Gated => Standing::Gated,
            State::NotMeasured => Standing::NotMeasured,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every() -> Vec<Standing> {
        vec![
            Standing::Passing,
            Standing::Suspect,
            Standing::Failing { hardware: false },
            Standing::Failing { hardware: true },
            Standing::HeldBack {
                why: "mode Observe".into(),
                hardware: false,
            },
            Standing::HeldBack {
                why: "over budget".into(),
                hardware: true,
            },
            Standing::Quarantined { hardware: false },
            Standing::Quarantined { hardware: true },
            Standing::RepeatOffender,
            Standing::TakenBack {
                what: "uncordoned by kubectl".into(),
            },
            Standing::Gated,
            Standing::NotMeasured,
            Standing::GpusOutOfService { gpus: vec![3] },
        ]
    }

    /// Every standing, and how it reads: label, condition status and reason, metric.
    #[test]
    fn every_standing_reads_the_same_label_condition_and_metric() {
        let table: Vec<(Option<&str>, &str, &str, &str)> = vec![
            (Some("pass"), "False", "Passed", "pass"),
            (Some("suspect"), "Unknown", "Suspect", "suspect"),
            (Some("fail"), "True", "Failed", "fail"),
            (Some("fail"), "True", "HardwareFault", "fail"),
            (Some("fail"), "True", "Failed", "fail"),
            (Some("fail"), "True", "HardwareFault", "fail"),
            (Some("fail"), "True", "Failed", "fail"),
            (Some("fail"), "True", "HardwareFault", "fail"),
            (Some("fail"), "True", "RepeatOffender", "fail"),
            (Some("suspect"), "Unknown", "TakenBack", "suspect"),
            (None, "Unknown", "Gated", "not_measured"),
            (None, "Unknown", "NotMeasured", "not_measured"),
            (Some("pass"), "False", "GPUsOutOfService", "pass"),
        ];
        for (s, (label, status, reason, metric)) in every().iter().zip(table) {
            let c = s.condition();
            assert_eq!(
                (s.label(), c.status, c.reason, s.metric()),
                (label, status, reason, metric),
                "{s:?}"
            );
            // One rule: the condition is True exactly when the label says fail, and the
            // metric is the label wherever there is one.
            assert_eq!(c.status == "True", s.label() == Some("fail"), "{s:?}");
            assert_eq!(s.metric(), s.label().unwrap_or("not_measured"));
            assert!(Standing::METRIC_VALUES.contains(&s.metric()));
        }
    }

    #[test]
    fn a_standing_is_stored_and_read_back_without_loss() {
        for s in every() {
            let json = serde_json::to_value(&s).expect("serializes");
            let back: Standing = serde_json::from_value(json.clone()).expect("reads back");
            assert_eq!(back, s, "{json}");
        }
        let stored = serde_json::to_value(Standing::HeldBack {
            why: "over budget".into(),
            hardware: true,
        })
        .expect("serializes");
        assert_eq!(
            stored,
            serde_json::json!({"state": "HeldBack", "why": "over budget", "hardware": true})
        );
    }

    #[test]
    fn a_failure_is_suspect_until_confirmed_then_failing_held_back_or_quarantined() {
        let s = Standing::Passing;
        let mut f = Facts {
            hardware: true,
            ..Facts::default()
        };
        assert_eq!(s.on_failure(&f), Standing::Suspect);
        f.confirmed = true;
        assert_eq!(s.on_failure(&f), Standing::Failing { hardware: true });
        f.held_back = Some("over budget".into());
        assert_eq!(
            s.on_failure(&f),
            Standing::HeldBack {
                why: "over budget".into(),
                hardware: true
            }
        );
        f.quarantined = true;
        assert_eq!(s.on_failure(&f), Standing::Quarantined { hardware: true });
        f.repeat_offender = true;
        assert_eq!(s.on_failure(&f), Standing::RepeatOffender);
    }

    #[test]
    fn a_pass_releases_only_what_the_planner_released() {
        let q = Standing::Quarantined { hardware: true };
        let held = Facts {
            quarantined: true,
            ..Facts::default()
        };
        assert_eq!(
            q.on_pass(&held),
            q,
            "the pass streak is not long enough yet"
        );
        assert_eq!(q.on_pass(&Facts::default()), Standing::Passing);
        assert_eq!(
            Standing::RepeatOffender.on_pass(&Facts {
                quarantined: true,
                repeat_offender: true,
                ..Facts::default()
            }),
            Standing::RepeatOffender
        );
        assert_eq!(Standing::RepeatOffender.on_repair(), Standing::Passing);
    }

    #[test]
    fn a_node_not_measured_keeps_what_a_measurement_said() {
        let f = Facts::default();
        for kept in [
            Standing::Passing,
            Standing::Suspect,
            Standing::Failing { hardware: false },
        ] {
            assert_eq!(kept.on_not_measured(&f), kept);
        }
        let held = Facts {
            quarantined: true,
            ..Facts::default()
        };
        let q = Standing::Quarantined { hardware: true };
        assert_eq!(q.on_not_measured(&held), q);
        assert_eq!(
            Standing::NotMeasured.on_not_measured(&Facts {
                gated: true,
                ..Facts::default()
            }),
            Standing::Gated
        );
        assert_eq!(
            Standing::Gated.on_not_measured(&f),
            Standing::NotMeasured,
            "the gate was opened by hand"
        );
    }

    #[test]
    fn a_person_taking_the_quarantine_back_is_its_own_standing() {
        let s = Standing::Quarantined { hardware: false }.on_taken_back("uncordoned");
        assert_eq!(
            s,
            Standing::TakenBack {
                what: "uncordoned".into()
            }
        );
        assert_eq!(s.label(), Some("suspect"));
    }

    #[test]
    fn across_tests_a_confirmed_failure_outranks_a_pass_and_a_pass_outranks_not_measured() {
        let order = [
            Standing::NotMeasured,
            Standing::Gated,
            Standing::Passing,
            Standing::GpusOutOfService { gpus: vec![3] },
            Standing::TakenBack { what: "x".into() },
            Standing::Suspect,
            Standing::Failing { hardware: false },
            Standing::Quarantined { hardware: false },
            Standing::RepeatOffender,
        ];
        for w in order.windows(2) {
            assert!(w[0].severity() < w[1].severity(), "{:?} < {:?}", w[0], w[1]);
        }
    }

    #[test]
    fn a_node_whose_faulty_gpus_are_out_of_service_is_not_a_failed_node() {
        let f = Facts {
            confirmed: true,
            gpus_out: vec![3],
            ..Facts::default()
        };
        let s = Standing::Passing.on_failure(&f);
        assert_eq!(s, Standing::GpusOutOfService { gpus: vec![3] });
        assert_eq!(s.condition().status, "False");
        assert_eq!(s.label(), Some("pass"));
        assert!(!s.is_quarantined());
        // Still held after a pass (the release needs its streak), and while not measured.
        assert_eq!(s.on_pass(&f), s);
        assert_eq!(s.on_not_measured(&f), s);
        // Released: it reads as its runs say.
        assert_eq!(s.on_pass(&Facts::default()), Standing::Passing);
        assert_eq!(s.on_not_measured(&Facts::default()), Standing::NotMeasured);
        // Quarantined as a node (more than half its GPUs, a node-level fault): the node's
        // quarantine is what it reads.
        let node = Facts {
            quarantined: true,
            ..f.clone()
        };
        assert_eq!(
            s.on_failure(&node),
            Standing::Quarantined { hardware: false }
        );
        assert_eq!(
            s.to_string(),
            "passing as a node; GPU 3 out of service by DRA device taints"
        );
        let stored =
            serde_json::to_value(&Standing::GpusOutOfService { gpus: vec![3, 6] }).expect("stored");
        assert_eq!(
            stored,
            serde_json::json!({"state": "GpusOutOfService", "gpus": [3, 6]})
        );
        let back: Standing = serde_json::from_value(stored).expect("read back");
        assert_eq!(back, Standing::GpusOutOfService { gpus: vec![3, 6] });
    }
}
