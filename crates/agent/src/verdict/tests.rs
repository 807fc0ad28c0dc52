use super::*;
use gpufabric_api::result::PhaseError;
use gpufabric_measure::fleet::Fleet;
use gpufabric_measure::{CheckOptions, sim};

/// The sim's clean 8 x H100 node, measured by the default suite.
fn clean_document() -> ResultDocument {
    let fleet = Fleet::parse(
        "seed: 3\nnodes:\n  - {name: clean, product: NVIDIA-H100-80GB-HBM3, gpus: 8}\n",
        "test",
    )
    .expect("fleet");
    let node = fleet.nodes.first().expect("one node");
    let opts = CheckOptions {
        node: "clean".into(),
        suite: gpufabric_api::Suite::default(),
        quick: false,
        expect_gpus: None,
        phase_timeout: std::time::Duration::from_secs(5),
        shared_gpus: false,
    };
    sim::node_check(&opts, node, fleet.seed, &|_| {}).expect("sim measures")
}

/// `doc` as NCCL leaves it when it refuses the test's settings for all but three
/// collectives (an NCCL_ALGO that four collectives lack): those four not run, each an
/// unavailable phase error.
fn refused(mut doc: ResultDocument) -> ResultDocument {
    let refusal = "ncclGroupEnd was refused: invalid usage (ncclInvalidUsage): NCCL refused its settings, so the node was not measured on it";
    if let Some(n) = doc.nccl.as_mut() {
        n.collectives.retain(|c| {
            matches!(
                c.collective,
                Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter
            )
        });
    }
    for _ in 0..4 {
        doc.errors.push(PhaseError {
            phase: Phase::NcclSweep,
            kind: ErrorKind::Unavailable,
            message: refusal.into(),
        });
    }
    doc
}

fn judged(doc: &ResultDocument) -> Judged {
    judge(
        doc,
        &Collective::ALL,
        &Thresholds::default(),
        None,
        None,
        &[],
        None,
    )
    .expect("judged")
}

/// The baseline three nodes like `doc` make, their collectives at `k` times its own.
fn baseline_of(doc: &ResultDocument, k: f64) -> FleetBaseline {
    let compact = CompactResult::parse(&doc.compact_within(keys::TERMINATION_MESSAGE_LIMIT))
        .expect("compact");
    let inputs: Vec<NodeInput> = (0..3)
        .map(|i| {
            let mut r = compact.clone();
            r.node = format!("peer-{i}");
            for c in r.collectives.iter_mut() {
                c.peak_busbw *= k;
                c.largest_busbw *= k;
            }
            NodeInput::measured(r)
        })
        .collect();
    let e = gpufabric_health::evaluate(&inputs, &Thresholds::default());
    let sample = gpufabric_health::evaluate::baseline::sample(
        "nightly-1",
        "suite",
        &spec_settings(doc),
        e.series.values(),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    FleetBaseline::default().with_run(&sample, now)
}

#[test]
fn a_node_alone_is_judged_against_the_baseline_file() {
    let doc = clean_document();
    let judge_with = |b: &FleetBaseline| {
        judge(
            &doc,
            &Collective::ALL,
            &Thresholds::default(),
            None,
            None,
            &[],
            Some((b, "suite")),
        )
        .expect("judged")
    };
    let alike = judge_with(&baseline_of(&doc, 1.0));
    assert_eq!(
        alike.verdict.verdict,
        NodeVerdict::Passed,
        "{:#?}",
        alike.verdict
    );
    // Its peers reached twice its busbw: it is half of what its fleet measures.
    let faster = judge_with(&baseline_of(&doc, 2.0));
    assert_eq!(
        faster.verdict.verdict,
        NodeVerdict::Failed,
        "{:#?}",
        faster.verdict
    );
    assert!(faster.verdict.findings.iter().any(|f| {
        f.source == Some(gpufabric_api::findings::ExpectationSource::Baseline)
            && f.message
                .contains("50% below the 3 nodes of this test run alike")
    }));
}

#[test]
fn a_node_measured_in_full_passes() {
    let j = judged(&clean_document());
    assert_eq!(j.verdict.verdict, NodeVerdict::Passed, "{:#?}", j.verdict);
    assert!(j.verdict.not_run.is_empty());
    assert!(j.verdict.render().contains("# Verdict: PASSED"));
}

#[test]
fn settings_nccl_refuses_leave_the_node_not_measured_with_the_collectives_named() {
    let j = judged(&refused(clean_document()));
    assert_eq!(
        j.verdict.verdict,
        NodeVerdict::NotMeasured,
        "{:#?}",
        j.verdict
    );
    let [n] = j.verdict.not_run.as_slice() else {
        panic!("one phase not run: {:#?}", j.verdict.not_run);
    };
    assert_eq!(n.phase, Phase::NcclSweep);
    assert_eq!(
        n.collectives,
        [
            Collective::Broadcast,
            Collective::Reduce,
            Collective::AllToAll,
            Collective::SendRecv
        ]
    );
    assert_eq!(n.reasons.len(), 1, "each reason once: {:?}", n.reasons);
    let text = j.verdict.render();
    assert!(text.contains("# Verdict: NOT MEASURED"), "{text}");
    assert!(
        text.contains(
            "ncclSweep could not run (4 of 7 collectives not run: broadcast, reduce, alltoall, sendrecv): ncclGroupEnd was refused"
        ),
        "{text}"
    );
    let json = serde_json::to_value(&j.verdict).expect("json");
    assert_eq!(json["verdict"], "NotMeasured");
    assert_eq!(json["notRun"][0]["collectives"][3], "sendRecv");
}

#[test]
fn a_failing_node_fails_even_with_a_phase_not_run() {
    let mut doc = refused(clean_document());
    if let Some(p) = doc.pairs.as_mut() {
        for e in &mut p.unidirectional {
            e.gbps *= 0.3;
        }
    }
    let j = judged(&doc);
    assert_eq!(j.verdict.verdict, NodeVerdict::Failed, "{:#?}", j.verdict);
    assert!(!j.verdict.not_run.is_empty());
}

#[test]
fn flags_override_the_thresholds_file_and_bad_values_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("t.yaml");
    std::fs::write(&file, "ncclBusBwGbps: 300\npairBandwidthGbps: 350\n").expect("write");
    let args = VerdictArgs {
        verdict: true,
        thresholds: Some(file),
        min_busbw: Some(320.0),
        ..Default::default()
    };
    let t = args.thresholds().expect("valid");
    assert_eq!(t.nccl_bus_bw_gbps, Some(320.0));
    assert_eq!(t.pair_bandwidth_gbps, Some(350.0));
    assert_eq!(t.straggler_ratio, Thresholds::default().straggler_ratio);

    let bad = VerdictArgs {
        min_ddp_efficiency: Some(1.5),
        ..Default::default()
    };
    assert!(bad.thresholds().is_err());
    let negative = VerdictArgs {
        min_pair_gbps: Some(-1.0),
        ..Default::default()
    };
    assert!(negative.thresholds().is_err());
}
