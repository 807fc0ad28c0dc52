//! Each invalid FabricTest is refused with a message that names the field and the fix.
//! The same inputs are refused by the real API server in tests/ (harness tests).

use gpufabric_api::test::CRON_PATTERN;
use gpufabric_api::validate::{estimate, warnings};
use gpufabric_api::{FabricTest, validate};

const HEADER: &str =
    "apiVersion: gpufabric.io/v1alpha1\nkind: FabricTest\nmetadata:\n  name: t\nspec:\n";

/// Parses a spec body (indented under `spec:`) and validates it; returns the error text.
fn refuse(spec: &str) -> String {
    let text = format!("{HEADER}{spec}");
    match serde_yaml::from_str::<FabricTest>(&text) {
        Err(e) => format!("parse: {e}"),
        Ok(t) => match validate(&t.spec) {
            Ok(()) => panic!("accepted an invalid spec:\n{spec}"),
            Err(e) => e.to_string(),
        },
    }
}

fn accept(spec: &str) {
    let text = format!("{HEADER}{spec}");
    let t: FabricTest =
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("does not parse: {e}\n{spec}"));
    if let Err(e) = validate(&t.spec) {
        panic!("refused a valid spec: {e}\n{spec}");
    }
}

#[test]
fn malformed_cron_is_refused() {
    for bad in [
        "not a cron",
        "* * * *",
        "61 * * * *",
        "0 25 * * *",
        "0 2 * * * *",
        "@sometimes",
    ] {
        let msg = refuse(&format!("  schedule: \"{bad}\"\n"));
        assert!(
            msg.contains("schedule: schedule must be a cron expression of 5 fields"),
            "{bad}: {msg}"
        );
    }
}

#[test]
fn unknown_time_zone_is_refused() {
    let msg = refuse("  schedule: \"0 2 * * *\"\n  timeZone: Mars/Olympus\n");
    assert!(
        msg.contains("timeZone \"Mars/Olympus\" is not a known IANA time zone"),
        "{msg}"
    );
}

#[test]
fn min_bytes_over_max_bytes_is_refused() {
    let msg = refuse("  suite:\n    ncclSweep:\n      minBytes: 4096\n      maxBytes: 1024\n");
    assert!(
        msg.contains("ncclSweep.minBytes must not be larger than ncclSweep.maxBytes (4096 > 1024)"),
        "{msg}"
    );
}

#[test]
fn a_busbw_threshold_with_a_sweep_that_ends_below_the_bandwidth_sizes_is_refused() {
    let msg = refuse(
        "  thresholds:\n    ncclBusBwGbps: 300\n  suite:\n    ncclSweep:\n      maxBytes: 1048576\n",
    );
    assert!(
        msg.contains("thresholds.ncclBusBwGbps: needs a sweep that reaches 64 MiB")
            && msg.contains("ends at 1048576 bytes"),
        "{msg}"
    );
    // Without the threshold a latency test is fine (its busbw is reported, not judged), and
    // so is the threshold with a sweep to 64 MiB.
    accept("  suite:\n    ncclSweep:\n      maxBytes: 1048576\n");
    accept(
        "  thresholds:\n    ncclBusBwGbps: 300\n  suite:\n    ncclSweep:\n      maxBytes: 67108864\n",
    );
}

#[test]
fn a_copy_threshold_with_copies_too_short_to_show_the_links_is_refused() {
    let msg = refuse(
        "  thresholds:\n    pairBandwidthGbps: 300\n    hostBandwidthGbps: 40\n  suite:\n    gpuPairs:\n      bytes: 1048576\n",
    );
    for field in [
        "thresholds.pairBandwidthGbps",
        "thresholds.hostBandwidthGbps",
    ] {
        assert!(
            msg.contains(&format!("{field}: needs copies of at least 16 MiB")),
            "{msg}"
        );
    }
    assert!(!msg.contains("pairBidirBandwidthGbps"), "{msg}");
    accept("  suite:\n    gpuPairs:\n      bytes: 1048576\n");
    accept(
        "  thresholds:\n    pairBandwidthGbps: 300\n  suite:\n    gpuPairs:\n      bytes: 16777216\n",
    );
}

#[test]
fn unknown_collective_is_refused() {
    let msg = refuse("  suite:\n    ncclSweep:\n      collectives: [allReduce, allreduce2]\n");
    assert!(
        msg.contains("unknown variant `allreduce2`, expected one of `allReduce`"),
        "{msg}"
    );
}

#[test]
fn percent_over_100_is_refused() {
    let msg = refuse("  quarantine:\n    maxQuarantined: \"150%\"\n");
    assert!(
        msg.contains("quarantine.maxQuarantined must be a count >= 0 or a percent from 0% to 100%"),
        "{msg}"
    );
    let msg = refuse("  quarantine:\n    maxQuarantined: \"ten\"\n");
    assert!(
        msg.contains("quarantine.maxQuarantined must be a count >= 0"),
        "{msg}"
    );
}

#[test]
fn a_malformed_gpu_budget_is_refused_by_its_own_name() {
    let msg = refuse("  quarantine:\n    maxQuarantinedGpus: \"150%\"\n");
    assert!(
        msg.contains(
            "quarantine.maxQuarantinedGpus must be a count >= 0 or a percent from 0% to 100%"
        ),
        "{msg}"
    );
    assert!(!msg.contains("quarantine.maxQuarantined must"), "{msg}");
    let msg = refuse("  quarantine:\n    maxQuarantinedGpus: -2\n");
    assert!(msg.contains("maxQuarantinedGpus is negative (-2)"), "{msg}");
    accept("  quarantine:\n    maxQuarantinedGpus: 4\n");
}

#[test]
fn negative_budget_is_refused() {
    let msg = refuse("  quarantine:\n    maxQuarantined: -1\n");
    assert!(msg.contains("maxQuarantined is negative (-1)"), "{msg}");
}

#[test]
fn zero_counts_are_refused() {
    let cases = [
        (
            "  suite:\n    ncclSweep:\n      iters: 0\n",
            "suite.ncclSweep.iters: must be at least 1",
        ),
        (
            "  suite:\n    ddpProbe:\n      layers: 0\n",
            "suite.ddpProbe.layers: must be at least 1",
        ),
        (
            "  suite:\n    ddpProbe:\n      batchPerGpu: 0\n",
            "suite.ddpProbe.batchPerGpu: must be at least 1",
        ),
        (
            "  suite:\n    ddpProbe:\n      gpuCounts: [2, 0]\n",
            "every GPU count must be at least 1",
        ),
        (
            "  suite:\n    gpuPairs:\n      bytes: 0\n",
            "suite.gpuPairs.bytes: must be at least 1",
        ),
        (
            "  quarantine:\n    failuresToQuarantine: 0\n",
            "quarantine.failuresToQuarantine: must be at least 1",
        ),
        (
            "  quarantine:\n    passesToRelease: 0\n",
            "quarantine.passesToRelease: must be at least 1",
        ),
        (
            "  quarantine:\n    stormMinNodes: 0\n",
            "quarantine.stormMinNodes: must be at least 1",
        ),
        (
            "  quarantine:\n    stormThresholdPercent: 0\n",
            "quarantine.stormThresholdPercent: must be between 1 and 100",
        ),
        (
            "  agent:\n    timeoutSeconds: 0\n",
            "agent.timeoutSeconds: must be between 10 and 86400 (got 0)",
        ),
    ];
    for (spec, expected) in cases {
        let msg = refuse(spec);
        assert!(msg.contains(expected), "{spec}: {msg}");
    }
}

#[test]
fn negative_counts_are_refused() {
    let msg = refuse("  suite:\n    ncclSweep:\n      iters: -5\n");
    assert!(msg.contains("integer `-5`, expected u32"), "{msg}");
    let msg = refuse("  startingDeadlineSeconds: -3\n");
    assert!(
        msg.contains("startingDeadlineSeconds: must be at least 1 (got -3)"),
        "{msg}"
    );
}

#[test]
fn waiting_for_busy_nodes_takes_a_bounded_wait_and_not_with_include() {
    accept("  waitForBusyNodesSeconds: 1800\n");
    let msg = refuse("  waitForBusyNodesSeconds: 0\n");
    assert!(
        msg.contains("waitForBusyNodesSeconds: must be 1 to 86400 (got 0)"),
        "{msg}"
    );
    let msg = refuse("  waitForBusyNodesSeconds: 600\n  includeBusyNodes: true\n");
    assert!(
        msg.contains("waitForBusyNodesSeconds: has no effect with includeBusyNodes"),
        "{msg}"
    );
}

#[test]
fn empty_gpu_counts_is_refused() {
    let msg = refuse("  suite:\n    ddpProbe:\n      gpuCounts: []\n");
    assert!(
        msg.contains("suite.ddpProbe.gpuCounts: must list at least one GPU count"),
        "{msg}"
    );
}

#[test]
fn step_factor_under_two_is_refused() {
    let msg = refuse("  suite:\n    ncclSweep:\n      stepFactor: 1\n");
    assert!(
        msg.contains("suite.ncclSweep.stepFactor: must be at least 2 (got 1)"),
        "{msg}"
    );
}

#[test]
fn more_graph_launches_than_the_bound_are_refused() {
    let msg = refuse("  suite:\n    ncclSweep:\n      graphLaunches: 1001\n");
    assert!(
        msg.contains("suite.ncclSweep.graphLaunches: must be at most 1000 (got 1001)"),
        "{msg}"
    );
}

#[test]
fn a_multi_node_probe_of_one_node_or_over_sixteen_is_refused() {
    for n in [1, 17] {
        let msg = refuse(&format!("  suite:\n    ddpNodes:\n      maxNodes: {n}\n"));
        assert!(
            msg.contains(&format!(
                "suite.ddpNodes.maxNodes: must be 2 to 16 (got {n})"
            )),
            "{msg}"
        );
    }
}

#[test]
fn a_multi_node_nccl_sweep_of_one_node_or_of_a_collective_it_cannot_run_is_refused() {
    let msg = refuse("  suite:\n    ncclNodes:\n      enabled: true\n      maxNodes: 1\n");
    assert!(
        msg.contains("suite.ncclNodes.maxNodes: must be 2 to 1024 (got 1)"),
        "{msg}"
    );
    let msg = refuse(
        "  suite:\n    ncclNodes:\n      enabled: true\n      collectives: [allReduce, broadcast]\n",
    );
    assert!(
        msg.contains(
            "suite.ncclNodes.collectives: broadcast is not run over nodes; use allReduce, allGather, reduceScatter or allToAll"
        ),
        "{msg}"
    );
    let msg = refuse(
        "  suite:\n    ncclNodes:\n      minBytes: 1048576\n      maxBytes: 1024\n      stepFactor: 1\n",
    );
    assert!(
        msg.contains(
            "suite.ncclNodes.minBytes: must be between 1 and maxBytes (1024), got 1048576"
        ) && msg.contains("suite.ncclNodes.stepFactor: must be at least 2 (got 1)"),
        "{msg}"
    );
    let msg =
        refuse("  suite:\n    ncclNodes:\n      enabled: true\n      topologyKey: \"my rack\"\n");
    assert!(
        msg.contains("suite.ncclNodes.topologyKey: \"my rack\" is not a label key"),
        "{msg}"
    );
    accept(
        "  suite:\n    ncclNodes:\n      enabled: true\n      maxNodes: 64\n      collectives: [allGather]\n      topologyKey: nvidia.com/gpu.clique\n",
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let msg = refuse(
        "  schedule: \"bad\"\n  suite:\n    ncclSweep:\n      stepFactor: 1\n      iters: 0\n",
    );
    for field in [
        "schedule:",
        "suite.ncclSweep.stepFactor:",
        "suite.ncclSweep.iters:",
    ] {
        assert!(msg.contains(field), "{field} missing from {msg}");
    }
}

#[test]
fn valid_edge_cases_are_accepted() {
    accept("  schedule: \"@daily\"\n");
    accept("  schedule: \"*/15 0-6,22,23 * jan-mar MON-FRI\"\n  timeZone: America/New_York\n");
    accept("  quarantine:\n    maxQuarantined: \"0%\"\n");
    accept("  quarantine:\n    maxQuarantined: \"100%\"\n");
    accept("  quarantine:\n    maxQuarantined: 0\n");
    accept(
        "  suite:\n    ncclSweep:\n      minBytes: 1024\n      maxBytes: 1024\n      warmupIters: 0\n",
    );
}

/// The schema's RE2 pattern and validate()'s parser agree on these schedules.
#[test]
fn schema_cron_pattern_agrees_with_validate() {
    let re = regex::Regex::new(CRON_PATTERN).expect("the pattern compiles as RE2 syntax");
    let good = [
        "0 2 * * *",
        "@hourly",
        "*/5 * * * *",
        "0 0 1,15 * ?",
        "30 1 * * 1-5",
        "0 0 * JAN,jul sun",
    ];
    let bad = [
        "not a cron",
        "* * * *",
        "61 * * * *",
        "0 24 * * *",
        "0 0 32 * *",
        "0 0 * 13 *",
        "0 0 * * 8",
        "0 2 * * * *",
    ];
    for s in good {
        assert!(re.is_match(s), "schema refuses {s:?}");
        assert!(
            gpufabric_api::validate::parse_schedule(s).is_ok(),
            "validate refuses {s:?}"
        );
    }
    for s in bad {
        assert!(!re.is_match(s), "schema accepts {s:?}");
        assert!(
            gpufabric_api::validate::parse_schedule(s).is_err(),
            "validate accepts {s:?}"
        );
    }
}

fn parse(spec: &str) -> FabricTest {
    let text = format!("{HEADER}{spec}");
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("does not parse: {e}\n{spec}"))
}

#[test]
fn schedules_that_never_fire_are_refused() {
    for never in [
        "0 0 31 2 *",
        "0 0 30 2 *",
        "0 0 30,31 feb ?",
        "15 3 31 4,6,9,11 *",
    ] {
        let msg = refuse(&format!("  schedule: \"{never}\"\n"));
        assert!(
            msg.contains(&format!("schedule: schedule \"{never}\" never fires")),
            "{never}: {msg}"
        );
        assert!(msg.contains("e.g. 31 February"), "{msg}");
    }
}

#[test]
fn rare_schedules_that_do_fire_are_accepted() {
    for rare in [
        "0 0 29 2 *",   // leap days only
        "0 0 31 * *",   // the months that have a 31st
        "0 0 31 1-2 *", // January has one
        "0 0 30 2 MON", // either day field fires when both are restricted: Mondays of February
    ] {
        accept(&format!("  schedule: \"{rare}\"\n"));
    }
}

#[test]
fn node_selectors_no_label_can_match_are_refused() {
    let msg = refuse("  nodeSelector:\n    \"gpu type\": h100\n");
    assert!(
        msg.contains("nodeSelector: label key \"gpu type\" is not a valid label key"),
        "{msg}"
    );
    let msg = refuse("  nodeSelector:\n    Example.COM/pool: a\n");
    assert!(
        msg.contains("has an invalid prefix \"Example.COM\""),
        "{msg}"
    );
    let msg = refuse("  nodeSelector:\n    pool: \"-training\"\n");
    assert!(
        msg.contains("nodeSelector[pool]: label value \"-training\" is not a valid label value"),
        "{msg}"
    );
    accept("  nodeSelector:\n    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3\n    pool: \"\"\n");
}

#[test]
fn node_names_that_no_node_can_have_are_refused() {
    let msg = refuse("  nodes: [gpu-01, GPU_02]\n");
    assert!(
        msg.contains("nodes: \"GPU_02\" is not a valid node name"),
        "{msg}"
    );
    accept("  nodes: [gpu-01, rack3.gpu-02]\n");
}

#[test]
fn a_suite_that_cannot_finish_within_the_timeout_is_refused() {
    // 1 GiB to 8 GiB all-reduce, a million iterations: days even on the fastest GPU.
    let msg = refuse(
        "  suite:\n    ncclSweep:\n      collectives: [allReduce]\n      minBytes: 1073741824\n      maxBytes: 8589934592\n      iters: 1000000\n  agent:\n    timeoutSeconds: 600\n",
    );
    assert!(
        msg.contains("suite: cannot finish within agent.timeoutSeconds (600 s): even one GPU at rates no GPU reaches today needs at least"),
        "{msg}"
    );
    assert!(msg.contains("NCCL sweep"), "{msg}");
    // A DDP probe of 100 000 steps of a 65536-wide, 256-layer model.
    let msg = refuse(
        "  suite:\n    ddpProbe:\n      hidden: 65536\n      layers: 256\n      steps: 100000\n",
    );
    assert!(msg.contains("DDP probe"), "{msg}");
}

#[test]
fn a_suite_close_to_its_timeout_is_allowed_with_a_warning() {
    let quiet = parse("  schedule: \"@daily\"\n");
    assert!(validate(&quiet.spec).is_ok());
    assert_eq!(warnings(&quiet.spec), Vec::<String>::new());

    let tight = parse("  agent:\n    timeoutSeconds: 20\n");
    assert!(validate(&tight.spec).is_ok());
    let said = warnings(&tight.spec);
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].starts_with("suite: estimated at ")
            && said[0].contains("on an 8-GPU H100/H200 node")
            && said[0].contains(
                "more than agent.timeoutSeconds (20 s): the benchmark pods will likely time out"
            ),
        "{said:?}"
    );

    let typical = estimate::estimate(&tight.spec.suite, &estimate::TYPICAL).total_s();
    let close = parse(&format!(
        "  agent:\n    timeoutSeconds: {}\n",
        (typical * 1.5).ceil() as u32
    ));
    let said = warnings(&close.spec);
    assert!(
        said.len() == 1 && said[0].contains("over half of agent.timeoutSeconds"),
        "{said:?}"
    );
}

#[test]
fn runtime_priority_and_pull_secret_names_must_be_object_names() {
    let msg = refuse("  agent:\n    runtimeClassName: NVIDIA\n");
    assert!(
        msg.contains("agent.runtimeClassName: \"NVIDIA\" is not a valid object name"),
        "{msg}"
    );
    let msg = refuse("  agent:\n    priorityClassName: \"gpu tests\"\n");
    assert!(
        msg.contains("agent.priorityClassName: \"gpu tests\" is not a valid object name"),
        "{msg}"
    );
    let msg = refuse("  agent:\n    imagePullSecrets: [{name: regcred}, {name: Reg_Cred}]\n");
    assert!(
        msg.contains("agent.imagePullSecrets: entry 1 (\"Reg_Cred\") is not a valid Secret name"),
        "{msg}"
    );
    accept(
        "  agent:\n    runtimeClassName: nvidia\n    priorityClassName: gpu-tests\n    imagePullSecrets: [{name: regcred}]\n",
    );
}

#[test]
fn compute_sizes_off_the_tile_or_too_small_are_refused_and_a_check_turned_off_is_not_judged() {
    let msg = refuse(
        "  suite:\n    compute:\n      gemm:\n        size: 1000\n      memory:\n        bytes: 1048576\n      sdc:\n        repeats: 0\n",
    );
    for want in [
        "suite.compute.gemm.size: must be a multiple of 256 from 256 to 32768 (got 1000)",
        "suite.compute.memory.bytes: must be at least 64 MiB",
        "suite.compute.sdc.repeats: must be at least 1",
    ] {
        assert!(msg.contains(want), "{want}: {msg}");
    }
    accept("  suite:\n    compute:\n      gemm:\n        enabled: false\n        size: 1000\n");
    accept(
        "  suite:\n    compute:\n      gemm:\n        size: 4096\n        tf32: false\n      sdc:\n        size: 16384\n",
    );
}

#[test]
fn a_drift_rule_that_could_never_judge_is_refused() {
    let msg = refuse("  thresholds:\n    trend:\n      window: 5\n      minRuns: 8\n");
    assert!(
        msg.contains("thresholds.trend.minRuns: must be at least 2 and at most window (5)"),
        "{msg}"
    );
    let msg = refuse("  thresholds:\n    trend:\n      driftPercent: 0.5\n");
    assert!(msg.contains("thresholds.trend.driftPercent"), "{msg}");
    let msg = refuse("  thresholds:\n    trend:\n      window: 40\n");
    assert!(
        msg.contains("thresholds.trend.window: must be from 2 to 20"),
        "{msg}"
    );
    accept(
        "  thresholds:\n    trend:\n      window: 14\n      minRuns: 2\n      sustainedRuns: 2\n",
    );
    accept("  thresholds:\n    trend:\n      enabled: false\n");
}

#[test]
fn rdma_pods_take_multus_annotations_and_rdma_devices_and_refuse_what_the_api_server_would() {
    accept(
        "  agent:\n    podAnnotations:\n      k8s.v1.cni.cncf.io/networks: rdma-net-a,rdma-net-b\n    resources:\n      limits: {rdma/rdma_shared_device_a: \"1\", memory: 8Gi}\n      requests: {rdma/rdma_shared_device_a: \"1\", memory: 4Gi}\n",
    );
    let msg = refuse(
        "  agent:\n    podAnnotations:\n      gpufabric.io/run: spoofed\n      \"bad key!\": x\n    resources:\n      limits: {nvidia.com/gpu: \"4\", rdma/hca: \"2\", example.com/nic: \"0.5\"}\n      requests: {rdma/hca: \"1\"}\n",
    );
    for want in [
        "agent.podAnnotations: \"gpufabric.io/run\" is the operator's",
        "agent.podAnnotations: annotation key \"bad key!\" is not a valid",
        "agent.resources[nvidia.com/gpu]: nvidia.com/gpu is always every GPU of the node",
        "agent.resources[rdma/hca]: request 1 differs from limit 2",
        "agent.resources[example.com/nic]: \"0.5\" is not a whole number",
    ] {
        assert!(msg.contains(want), "{want}: {msg}");
    }
}

#[test]
fn limits_of_no_node_or_under_ten_seconds_are_refused() {
    let err = refuse("  limits:\n    maxNodes: 0\n");
    assert!(err.contains("limits.maxNodes"), "{err}");
    let err = refuse("  limits:\n    maxDurationSeconds: 5\n");
    assert!(
        err.contains("limits.maxDurationSeconds") && err.contains("10 to 604800"),
        "{err}"
    );
    accept("  limits:\n    maxNodes: 100\n    maxDurationSeconds: 3600\n");
}

#[test]
fn a_longest_duration_below_the_agent_timeout_is_warned_of() {
    let t: FabricTest = serde_yaml::from_str(&format!(
        "{HEADER}  limits:\n    maxDurationSeconds: 30\n  agent:\n    timeoutSeconds: 600\n"
    ))
    .expect("parses");
    let said = warnings(&t.spec);
    assert!(
        said.iter()
            .any(|w| w.contains("limits.maxDurationSeconds (30 s)")),
        "{said:?}"
    );
}
