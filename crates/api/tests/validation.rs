//! Each invalid FabricTest is refused with a message that names the field and the fix.
//! The same inputs are refused by the real API server in tests/ (harness tests).

use gpufabric_api::test::CRON_PATTERN;
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
