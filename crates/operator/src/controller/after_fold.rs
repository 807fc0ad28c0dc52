//! What the FabricTest controller does after it folds a finished run, decided with no
//! client once the run's nodes are observed: the quarantine plan and why, whether the
//! run's node signals and trend points are written, and the confirmation run to create.
//! `super::fabrictest::fold` (`quarantine_after`) observes, asks [`plan`], and carries the plan out.

use crate::error::Result;
use crate::runs;
use crate::status as st;
use gpufabric_api::run::{FabricTestRun, NodeRunResult, NodeVerdict};
use gpufabric_api::test::{FabricTest, FabricTestStatus, NodeHealth};
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};

/// Everything that follows the observation of a folded run's nodes, in the order the
/// executor carries it out: open the breaker on a storm (`decision.plan.storm`), execute
/// the quarantine plan and write its outcome into the status, the lifecycle's steps, then
/// (when `publish`) the node signals and the trend points, and last the confirmation run.
/// The lifecycle's steps are planned from the quarantine's outcome, which only the
/// executor knows, by [`crate::lifecycle::after_run::plan`] (pure as well), and carried out
/// by [`crate::lifecycle::carry_out`], which decides nothing.
///
/// The node signals themselves are decided when they are written, not here: they are read
/// from the status after the quarantine outcome and the lifecycle changed it, and from the
/// node cache as it is then.
#[derive(Clone, Debug)]
pub struct AfterFold {
    pub decision: QuarantineDecision,
    /// Write the run's node signals and add its trend points. Not while the breaker is
    /// open: then nothing on a node changes, its signals included (a remediation tool that
    /// acts on `GPUFabricDegraded=True` must not act on a storm either), and a storm's run
    /// adds to no node's own record of its runs.
    pub publish: bool,
    /// The confirmation run that retests the plan's `confirm` nodes; None when there are
    /// none.
    pub confirm: Option<FabricTestRun>,
}

/// What is known of a folded run once its nodes are observed: what [`plan`] decides from.
pub struct Folded<'a> {
    pub test: &'a FabricTest,
    /// The run, already folded into `status`.
    pub run: &'a FabricTestRun,
    /// Every node's result (all of the run's shards).
    pub results: &'a [NodeRunResult],
    pub status: &'a FabricTestStatus,
    /// The nodes the plan may touch, as read now.
    pub observed: &'a [crate::quarantine::NodeObservation],
    /// The nodes the test selects and their GPUs: the bases of a percent budget.
    pub selected: gpufabric_health::Selected,
    pub guards: &'a gpufabric_health::Guards,
    /// What DRA says of the cluster: which nodes' GPUs are devices, the rules the test holds.
    pub dra: &'a crate::dra::DraView,
}

/// Plans what follows a folded run (see [`quarantine_decision`]). Fails only when the
/// confirmation run cannot be built: a test without a name or uid, which the controller has
/// refused before it folds any run.
pub fn plan(f: &Folded) -> Result<AfterFold> {
    let decision = quarantine_decision(f);
    let confirm = if decision.plan.confirm.is_empty() {
        None
    } else {
        Some(runs::confirmation_run(
            f.test,
            &f.run.name_any(),
            &decision.plan.confirm,
        )?)
    };
    Ok(AfterFold {
        publish: !decision.plan.breaker_open,
        confirm,
        decision,
    })
}

/// What a folded run means for quarantine, decided with no client: the plan, why each node
/// would be quarantined (its latest finding), and the repaired nodes the run measured
/// completely (every phase ran).
#[derive(Clone, Debug, PartialEq)]
pub struct QuarantineDecision {
    /// What acts on nodes.
    pub plan: gpufabric_health::Plan,
    /// What acts on single GPUs through DRA device taints.
    pub gpus: gpufabric_health::gpu_quarantine::GpuPlan,
    pub reasons: BTreeMap<String, String>,
    pub repaired: BTreeSet<String>,
}

/// Plans quarantine after a folded run: the planner's facts for every observed node from
/// the test's history, what the run measured (a node not measured is never a suspect) and
/// confirmed itself (node pairs retested against a known-good partner), under the guards,
/// with budgets of the nodes the test selects (never fewer than the run measured) and of
/// their GPUs. A node with GPUs the test holds tainted counts as quarantined by it, in GPUs
/// of the GPU budget ([`gpufabric_health::GpuHold`]), and a candidate whose quarantine would
/// taint GPUs instead of the node counts those GPUs; the node plan is then split
/// ([`gpufabric_health::gpu_quarantine::split`]) into what acts on GPUs and on nodes.
pub fn quarantine_decision(f: &Folded) -> QuarantineDecision {
    let Folded {
        test,
        run,
        results,
        status,
        observed,
        selected,
        guards,
        dra,
    } = *f;
    let run_name = run.name_any();
    let tested: BTreeSet<&str> = st::measured_nodes(results);
    let confirmed: BTreeSet<&str> = results
        .iter()
        .filter(|r| r.confirmed)
        .map(|r| r.node.as_str())
        .collect();
    let complete: BTreeSet<&str> = results
        .iter()
        .filter(|r| r.complete())
        .map(|r| r.node.as_str())
        .collect();
    let history: BTreeMap<&str, &NodeHealth> =
        status.nodes.iter().map(|h| (h.node.as_str(), h)).collect();
    let mut facts: Vec<_> = observed
        .iter()
        .map(|o| {
            let health = history
                .get(o.node.as_str())
                .map(|h| (*h).clone())
                .unwrap_or_else(|| {
                    gpufabric_health::history::advance(
                        None,
                        &o.node,
                        NodeVerdict::Pending,
                        None,
                        &run_name,
                    )
                });
            let mut facts = o.facts(health, tested.contains(o.node.as_str()));
            let tainted = u32::try_from(dra.tainted(&o.node).len()).unwrap_or(u32::MAX);
            facts.gpus.tainted = tainted;
            facts.gpus.only = tainted > 0 && !o.quarantined_by_us;
            facts.quarantined_by_us |= tainted > 0;
            facts.confirmed = confirmed.contains(o.node.as_str());
            // A repair is proven only by a complete measurement.
            facts.repaired &= complete.contains(o.node.as_str());
            facts
        })
        .collect();
    let gpu_nodes = gpu_nodes(f, &facts);
    for (facts, gpu) in facts.iter_mut().zip(&gpu_nodes) {
        facts.gpus.instead = gpu.taints_instead();
    }
    let selected = gpufabric_health::Selected {
        nodes: selected.nodes.max(tested.len()),
        gpus: selected.gpus,
    };
    let mut plan = gpufabric_health::plan_guarded(
        &facts,
        &test.spec.quarantine,
        selected,
        run.spec.trigger,
        guards,
    );
    let gpus = gpufabric_health::gpu_quarantine::split(&mut plan, &gpu_nodes);
    let reasons = status
        .nodes
        .iter()
        .filter_map(|h| h.last_finding.clone().map(|f| (h.node.clone(), f)))
        .collect();
    let repaired = observed
        .iter()
        .filter(|o| o.repaired && complete.contains(o.node.as_str()))
        .map(|o| o.node.clone())
        .collect();
    QuarantineDecision {
        plan,
        gpus,
        reasons,
        repaired,
    }
}

/// What the GPU planner knows of each node the node plan knows: its GPUs as DRA devices,
/// those the test holds tainted, and this run's GPU-level faults.
fn gpu_nodes(
    f: &Folded,
    facts: &[gpufabric_health::NodeFacts],
) -> Vec<gpufabric_health::gpu_quarantine::GpuNode> {
    let findings = f
        .run
        .status
        .as_ref()
        .map(|s| s.findings.as_slice())
        .unwrap_or_default();
    let results: BTreeMap<&str, &NodeRunResult> =
        f.results.iter().map(|r| (r.node.as_str(), r)).collect();
    let needed = f.test.spec.quarantine.failures_to_quarantine.max(1);
    let records: BTreeSet<&str> = f
        .observed
        .iter()
        .filter(|o| o.quarantined_by_us)
        .map(|o| o.node.as_str())
        .collect();
    // Label mode only marks nodes: a GPU's taint would act where the test asks for no action.
    let label_only = f.test.spec.quarantine.mode == gpufabric_api::policy::QuarantineMode::Label;
    facts
        .iter()
        .map(|n| {
            let devices = if label_only {
                BTreeMap::new()
            } else {
                f.dra.devices(&n.node)
            };
            let result = results.get(n.node.as_str());
            let gpus = result
                .and_then(|r| r.gpus)
                .unwrap_or(0)
                .max(devices.len() as u32);
            gpufabric_health::gpu_quarantine::GpuNode {
                tainted: f.dra.tainted(&n.node),
                faults: result.and_then(|r| gpu_faults(r, findings)),
                failing: n.tested && n.health.consecutive_failures >= needed,
                node_record: records.contains(n.node.as_str()),
                node: n.node.clone(),
                devices,
                gpus,
            }
        })
        .collect()
}

/// The run's faults of `r`'s node by GPU, when the node failed and every one of its
/// critical findings is a GPU-level fault the run lists ([`gpufabric_api::Finding::faulty_gpu`]);
/// None otherwise (a node-level fault, a pair, an error, or findings the run did not list).
pub fn gpu_faults(
    r: &NodeRunResult,
    findings: &[gpufabric_api::Finding],
) -> Option<BTreeMap<u32, gpufabric_health::gpu_quarantine::GpuFault>> {
    if r.verdict != NodeVerdict::Failed || r.findings == 0 {
        return None;
    }
    let critical: Vec<&gpufabric_api::Finding> = findings
        .iter()
        .filter(|f| f.severity == gpufabric_api::Severity::Critical)
        .filter(|f| f.subject.node_name() == r.node)
        .collect();
    if critical.len() != r.findings as usize {
        return None;
    }
    let mut out = BTreeMap::new();
    for f in critical {
        let gpu = f.faulty_gpu()?;
        out.entry(gpu)
            .or_insert_with(|| gpufabric_health::gpu_quarantine::GpuFault {
                word: f.fault_word(),
                reason: f.message.clone(),
            });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::decide::tests::{at, run};
    use gpufabric_api::keys;
    use gpufabric_api::run::Trigger;
    use gpufabric_api::test::FabricTestSpec;

    fn test() -> FabricTest {
        let mut t = FabricTest::new("nightly", FabricTestSpec::default());
        t.metadata.uid = Some("uid-1".into());
        t
    }

    fn result(node: &str, verdict: NodeVerdict) -> NodeRunResult {
        serde_json::from_value(serde_json::json!({"node": node, "verdict": verdict}))
            .expect("a node result")
    }

    fn node(name: &str, annotations: serde_json::Value) -> k8s_openapi::api::core::v1::Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "resourceVersion": "1", "annotations": annotations}
        }))
        .expect("a node")
    }

    /// The quarantine decision after `r` over `nodes` as test "nightly" observes them, in a
    /// selection of 10 nodes, with a closed breaker and no cluster cap.
    fn decide_over(
        t: &FabricTest,
        r: &FabricTestRun,
        results: &[NodeRunResult],
        status: &FabricTestStatus,
        nodes: &[k8s_openapi::api::core::v1::Node],
    ) -> QuarantineDecision {
        let observed: Vec<_> = nodes
            .iter()
            .map(|n| crate::quarantine::NodeObservation::of(&n.name_any(), Some(n), "nightly"))
            .collect();
        quarantine_decision(&Folded {
            test: t,
            run: r,
            results,
            status,
            observed: &observed,
            selected: gpufabric_health::Selected {
                nodes: 10,
                gpus: 80,
            },
            guards: &gpufabric_health::Guards::default(),
            dra: &crate::dra::DraView::default(),
        })
    }

    #[test]
    fn the_quarantine_decision_judges_only_what_the_run_measured() {
        use gpufabric_api::policy::QuarantineMode;
        let mut t = test();
        t.spec.quarantine.mode = QuarantineMode::Cordon;
        t.spec.quarantine.confirm_retest = false;
        t.spec.quarantine.max_quarantined =
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(5);
        let r = run("nightly-1");
        let results = [
            result("bad", NodeVerdict::Failed),
            result("fixed", NodeVerdict::Passed),
            result("busy", NodeVerdict::NotMeasured),
        ];
        let mut status = FabricTestStatus::default();
        status.nodes = crate::status::fold_history(&[], &r, &results);
        // "busy" failed before; this run did not measure it.
        if let Some(h) = status.nodes.iter_mut().find(|h| h.node == "busy") {
            h.consecutive_failures = 2;
            h.last_finding = Some("slow".into());
        }
        if let Some(h) = status.nodes.iter_mut().find(|h| h.node == "bad") {
            h.last_finding = Some("GPU 3 straggler".into());
        }
        let repaired = serde_json::json!({ keys::ANNOTATION_REPAIRED: "INC-1" });
        let nodes = [
            node("bad", serde_json::json!({})),
            node("fixed", repaired.clone()),
            node("busy", repaired),
        ];
        let d = decide_over(&t, &r, &results, &status, &nodes);
        assert_eq!(d.plan.quarantine, ["bad"]);
        assert_eq!(
            d.plan.hold_of("busy"),
            Some(gpufabric_health::Hold::NotTested)
        );
        assert_eq!(d.reasons["bad"], "GPU 3 straggler");
        // Only a repaired node the run measured counts as tested after its repair.
        assert_eq!(d.repaired.into_iter().collect::<Vec<_>>(), ["fixed"]);
    }

    #[test]
    fn a_repair_measured_in_part_releases_nothing_and_is_tried_again() {
        use gpufabric_api::policy::QuarantineMode;
        let mut t = test();
        t.spec.quarantine.mode = QuarantineMode::Cordon;
        t.spec.quarantine.passes_to_release = 3;
        let mut r = run("nightly-2");
        if let Some(st) = r.status.as_mut() {
            st.completion_time = Some(crate::time::to_time(at(2, 0)));
        }
        let mut partial = result("partial", NodeVerdict::Passed);
        partial.unmeasured = vec!["ncclSweep".into()];
        let results = [partial, result("whole", NodeVerdict::Passed)];
        let mut status = FabricTestStatus::default();
        status.nodes = crate::status::fold_history(&[], &r, &results);
        // A partial measurement is no measurement for the targets: they are tried again.
        let measured: Vec<&str> = status
            .nodes
            .iter()
            .filter(|h| h.last_measured.is_some())
            .map(|h| h.node.as_str())
            .collect();
        assert_eq!(measured, ["whole"]);
        let held = |name: &str| {
            let record = serde_json::json!({"test": "nightly", "run": "r0", "reason": "slow",
                "since": "2026-11-27T00:00:00Z", "mode": "Cordon", "cordoned": true});
            node(
                name,
                serde_json::json!({
                    keys::ANNOTATION_REPAIRED: "INC-2",
                    keys::ANNOTATION_QUARANTINE: record.to_string(),
                }),
            )
        };
        let d = decide_over(&t, &r, &results, &status, &[held("partial"), held("whole")]);
        assert_eq!(
            d.plan.release,
            ["whole"],
            "one complete pass releases a repair"
        );
        assert_eq!(d.repaired.into_iter().collect::<Vec<_>>(), ["whole"]);
    }

    /// What follows `r` over `nodes` (all passing unless `failed`), in cordon mode with
    /// confirmation retests, under `guards`.
    fn plan_over(failed: &[&str], passed: &[&str], guards: gpufabric_health::Guards) -> AfterFold {
        use gpufabric_api::policy::QuarantineMode;
        let mut t = test();
        t.spec.quarantine.mode = QuarantineMode::Cordon;
        t.spec.quarantine.confirm_retest = true;
        t.spec.quarantine.storm_threshold_percent = 100;
        let r = run("nightly-3");
        let results: Vec<NodeRunResult> = failed
            .iter()
            .map(|n| result(n, NodeVerdict::Failed))
            .chain(passed.iter().map(|n| result(n, NodeVerdict::Passed)))
            .collect();
        let mut status = FabricTestStatus::default();
        status.nodes = crate::status::fold_history(&[], &r, &results);
        let observed: Vec<_> = results
            .iter()
            .map(|res| {
                let n = node(&res.node, serde_json::json!({}));
                crate::quarantine::NodeObservation::of(&res.node, Some(&n), "nightly")
            })
            .collect();
        plan(&Folded {
            test: &t,
            run: &r,
            results: &results,
            status: &status,
            observed: &observed,
            selected: gpufabric_health::Selected {
                nodes: 10,
                gpus: 80,
            },
            guards: &guards,
            dra: &crate::dra::DraView::default(),
        })
        .expect("plans")
    }

    #[test]
    fn with_the_breaker_open_no_signal_or_trend_is_written_and_nothing_confirmed() {
        let after = plan_over(
            &["bad"],
            &["good"],
            gpufabric_health::Guards {
                breaker_open: true,
                ..Default::default()
            },
        );
        assert!(after.decision.plan.breaker_open);
        assert!(!after.publish);
        assert!(after.confirm.is_none());
        assert!(after.decision.plan.quarantine.is_empty());
    }

    #[test]
    fn suspects_get_one_confirmation_run_that_retests_only_them() {
        let after = plan_over(&["bad-2", "bad-1"], &["good"], Default::default());
        assert!(after.publish);
        assert_eq!(after.decision.plan.confirm, ["bad-1", "bad-2"]);
        let confirm = after.confirm.expect("a confirmation run");
        assert_eq!(confirm.name_any(), runs::confirmation_run_name("nightly-3"));
        assert_eq!(confirm.spec.trigger, Trigger::Confirmation);
        assert_eq!(
            confirm.spec.nodes,
            Some(vec!["bad-1".to_string(), "bad-2".to_string()])
        );
        assert_eq!(
            confirm
                .annotations()
                .get(gpufabric_api::keys::ANNOTATION_CONFIRMS),
            Some(&"nightly-3".to_string())
        );
    }

    fn finding(
        kind: gpufabric_api::FindingKind,
        subject: gpufabric_api::Subject,
    ) -> gpufabric_api::Finding {
        gpufabric_api::Finding::new(
            kind,
            subject,
            gpufabric_api::Metric::DdpComputeTime,
            gpufabric_api::Severity::Critical,
            "GPU 3 computes 1.5x slower than its node's median".into(),
        )
    }

    #[test]
    fn only_a_node_whose_every_critical_finding_is_one_gpus_fault_is_handled_per_gpu() {
        use gpufabric_api::{FindingKind, Subject};
        let mut r = result("a", NodeVerdict::Failed);
        r.findings = 1;
        let straggler = finding(FindingKind::Straggler, Subject::gpu("a", 3));
        let faults = gpu_faults(&r, std::slice::from_ref(&straggler)).expect("per GPU");
        assert_eq!(faults.keys().collect::<Vec<_>>(), [&3]);
        assert_eq!(faults[&3].word, "straggler");
        // A node-level finding beside it: the node's.
        r.findings = 2;
        let node = finding(FindingKind::Slow, Subject::node("a"));
        assert!(gpu_faults(&r, &[straggler.clone(), node]).is_none());
        // A finding the run did not list (the count says 2, one is listed): the node's.
        assert!(gpu_faults(&r, std::slice::from_ref(&straggler)).is_none());
        // A GPU pair is two GPUs: the node's.
        r.findings = 1;
        let pair = finding(FindingKind::Slow, Subject::gpu_pair("a", 2, 3));
        assert!(gpu_faults(&r, &[pair]).is_none());
        // An errored node is never handled per GPU.
        let mut errored = result("a", NodeVerdict::Errored);
        errored.findings = 1;
        assert!(gpu_faults(&errored, &[straggler]).is_none());
    }

    /// The decision after a run in which "dra" (8 GPUs, DRA devices) failed on GPU 3 alone
    /// and "plain" (no devices) failed as a node, both confirmed, under `quarantine`.
    fn gpu_budget_decision(quarantine: serde_json::Value) -> QuarantineDecision {
        use gpufabric_api::{FindingKind, Subject};
        let mut t = test();
        t.spec.quarantine = serde_json::from_value(quarantine).expect("a policy");
        let mut r = run("nightly-4");
        if let Some(st) = r.status.as_mut() {
            st.findings = vec![
                finding(FindingKind::Straggler, Subject::gpu("dra", 3)),
                finding(FindingKind::Slow, Subject::node("plain")),
            ];
        }
        let results: Vec<NodeRunResult> = ["dra", "plain"]
            .iter()
            .map(|n| {
                let mut res = result(n, NodeVerdict::Failed);
                res.findings = 1;
                res.gpus = Some(8);
                res.confirmed = true;
                res
            })
            .collect();
        let mut status = FabricTestStatus::default();
        status.nodes = crate::status::fold_history(&[], &r, &results);
        let observed: Vec<_> = results
            .iter()
            .map(|res| {
                let n = node(&res.node, serde_json::json!({}));
                crate::quarantine::NodeObservation::of(&res.node, Some(&n), "nightly")
            })
            .collect();
        let devices = (0..8)
            .map(|g| {
                let d = gpufabric_health::gpu_quarantine::DeviceRef {
                    driver: "gpu.nvidia.com".into(),
                    pool: "dra".into(),
                    device: format!("gpu-{g}"),
                };
                (g, d)
            })
            .collect();
        let dra = crate::dra::DraView {
            gpus: [("dra".to_string(), devices)].into(),
            ..Default::default()
        };
        quarantine_decision(&Folded {
            test: &t,
            run: &r,
            results: &results,
            status: &status,
            observed: &observed,
            selected: gpufabric_health::Selected { nodes: 2, gpus: 16 },
            guards: &gpufabric_health::Guards::default(),
            dra: &dra,
        })
    }

    #[test]
    fn a_gpu_taint_takes_the_gpu_budget_and_the_cordon_the_node_budget() {
        let d = gpu_budget_decision(serde_json::json!({"mode": "Cordon",
            "maxQuarantined": 1, "maxQuarantinedGpus": 1, "stormThresholdPercent": 100}));
        assert_eq!(d.plan.quarantine, ["plain"], "one node of one: the cordon");
        assert_eq!(d.gpus.taint.len(), 1, "one GPU of one: the taint");
        assert_eq!(
            (d.gpus.taint[0].node.as_str(), d.gpus.taint[0].gpu),
            ("dra", 3)
        );
        assert_eq!((d.plan.quarantined_after, d.plan.gpus_held_after), (1, 1));
        assert_eq!(d.gpus.budget, 1);
        assert!(d.plan.held_back.is_empty(), "{:?}", d.plan.held_back);
    }

    #[test]
    fn a_gpu_taint_over_the_gpu_budget_is_refused_and_the_node_is_not_cordoned_instead() {
        let d = gpu_budget_decision(serde_json::json!({"mode": "Cordon",
            "maxQuarantined": 1, "maxQuarantinedGpus": 0, "stormThresholdPercent": 100}));
        assert!(d.gpus.taint.is_empty());
        assert_eq!(d.plan.quarantine, ["plain"]);
        assert_eq!(
            d.plan.hold_of("dra"),
            Some(gpufabric_health::Hold::OverGpuBudget)
        );
    }

    #[test]
    fn with_no_suspect_there_is_no_confirmation_run_and_the_signals_are_written() {
        let after = plan_over(&[], &["good-1", "good-2"], Default::default());
        assert!(after.publish);
        assert!(after.decision.plan.confirm.is_empty());
        assert!(after.confirm.is_none());
    }
}
