//! The committed `crds/` must be exactly what the code generates.

use std::path::PathBuf;

fn crds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../crds")
}

#[test]
fn committed_crds_match_generated() {
    for (file, crd) in gpufabric_api::crds() {
        let generated = gpufabric_api::crd_yaml(&crd).expect("CRD serialises");
        let path = crds_dir().join(file);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "crds/{file} is stale or missing: regenerate it with `cargo run -p gpufabric-operator -- crdgen --out crds` and commit the result"
        );
        let chart = crds_dir().join("../charts/gpufabric/crds").join(file);
        let in_chart = std::fs::read_to_string(&chart).unwrap_or_default();
        assert!(
            in_chart == generated,
            "charts/gpufabric/crds/{file} differs from the generated CRD: `cargo run -p gpufabric-operator -- crdgen --out charts/gpufabric/crds`"
        );
    }
}

#[test]
fn crds_carry_printer_columns_and_short_names() {
    let crds = gpufabric_api::crds();
    let columns = |i: usize| -> Vec<String> {
        crds[i].1.spec.versions[0]
            .additional_printer_columns
            .as_ref()
            .map(|c| c.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default()
    };
    assert_eq!(
        columns(0),
        [
            "Ready",
            "Degraded",
            "Schedule",
            "Suspend",
            "Last Run",
            "Passed",
            "Failed",
            "Quarantined",
            "Breaker Open",
            "Next Run",
            "Age"
        ]
    );
    let run_columns = columns(1);
    for name in ["Phase", "Nodes", "Passed", "Failed", "Started", "Duration"] {
        assert!(
            run_columns.iter().any(|c| c == name),
            "FabricTestRun lacks column {name}"
        );
    }
    assert_eq!(
        crds[0].1.spec.names.short_names.as_deref(),
        Some(&["ft".to_string()][..])
    );
    assert_eq!(
        crds[1].1.spec.names.short_names.as_deref(),
        Some(&["ftr".to_string()][..])
    );
    for (_, crd) in &crds {
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.group, "gpufabric.io");
        assert!(
            crd.spec.versions[0]
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
    }
}

#[test]
fn schema_carries_each_validation_rule() {
    let yaml = gpufabric_api::crd_yaml(&gpufabric_api::crds()[0].1).expect("CRD serialises");
    for needle in [
        "schedule must be a cron expression",
        "ncclSweep.minBytes must not be larger than ncclSweep.maxBytes",
        "quarantine.maxQuarantined must be a count >= 0 or a percent from 0% to 100%",
        "ddpProbe.firstBucketBytes must not be larger than ddpProbe.bucketBytes",
        "- allReduce",
        "minItems: 1",
        "x-kubernetes-list-type: map",
    ] {
        assert!(
            yaml.contains(needle),
            "the FabricTest schema lacks {needle:?}"
        );
    }
}

/// YAML 1.1, which Helm and kubectl read CRDs in, takes these bare words for booleans.
const YAML11_BOOLEANS: [&str; 22] = [
    "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off",
    "OFF", "true", "True", "TRUE", "false", "False", "FALSE",
];

#[test]
fn no_generated_crd_holds_a_bare_word_that_yaml_1_1_reads_as_a_boolean() {
    for (file, crd) in gpufabric_api::crds() {
        let generated = gpufabric_api::crd_yaml(&crd).expect("CRD serialises");
        for (i, line) in generated.lines().enumerate() {
            let t = line.trim();
            let word = t.strip_prefix("- ").unwrap_or(t).trim_end_matches(':');
            assert!(
                !YAML11_BOOLEANS.contains(&word),
                "crds/{file} line {}: `{t}` is a boolean to Helm (YAML 1.1): rename the field",
                i + 1
            );
        }
    }
}
