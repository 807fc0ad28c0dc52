//! A test whose agent env caps NCCL: every node's collectives slow for the same reason
//! outside its hardware.

use super::*;
use gpufabric_api::result::{CompactSetting, SettingSource};

fn capped_fleet() -> Vec<NodeInput> {
    let mut fleet = fleet_of(6, 0.0);
    for r in fleet.iter_mut() {
        for c in r.collectives.iter_mut() {
            c.peak_busbw *= 0.3;
            c.largest_busbw *= 0.3;
        }
    }
    inputs(fleet)
}

#[test]
fn collectives_capped_by_the_agent_env_fail_no_node() {
    // Without the setting known, the capped collectives fail every node.
    let e = evaluate(&capped_fleet(), &Thresholds::default());
    assert!(
        e.verdicts.values().all(|v| *v == NodeVerdict::Failed),
        "{:#?}",
        e.findings
    );
    let mut nodes = capped_fleet();
    for n in nodes.iter_mut() {
        n.nccl_tuning = vec!["NCCL_MAX_NCHANNELS".into()];
    }
    let e = evaluate(&nodes, &Thresholds::default());
    assert!(
        e.verdicts.values().all(|v| *v == NodeVerdict::Passed),
        "{:#?}",
        e.findings
    );
    let spared: Vec<_> = e
        .findings
        .iter()
        .filter(|f| f.message.contains("sets NCCL_MAX_NCHANNELS"))
        .collect();
    assert!(!spared.is_empty());
    assert!(spared.iter().all(|f| f.severity == Severity::Info));
}

#[test]
fn a_node_slower_than_its_peers_run_alike_still_fails() {
    let mut fleet = fleet_of(8, 0.01);
    for (i, r) in fleet.iter_mut().enumerate() {
        let k = if i == 3 { 0.3 * 0.6 } else { 0.3 };
        for c in r.collectives.iter_mut() {
            c.peak_busbw *= k;
            c.largest_busbw *= k;
        }
    }
    let mut nodes = inputs(fleet);
    for n in nodes.iter_mut() {
        n.nccl_tuning = vec!["NCCL_ALGO".into()];
    }
    let e = evaluate(&nodes, &Thresholds::default());
    assert_eq!(
        e.verdicts.get("node-03"),
        Some(&NodeVerdict::Failed),
        "{:#?}",
        e.findings
    );
    assert!(
        on(&e, "node-03")
            .iter()
            .any(|f| f.severity == Severity::Critical && f.source == Some(ExpectationSource::Fleet))
    );
    let others = e.verdicts.iter().filter(|(n, _)| n.as_str() != "node-03");
    assert!(others.into_iter().all(|(_, v)| *v == NodeVerdict::Passed));
}

/// One node, its collectives at 0.3 of healthy: below what its own links carry.
fn capped_node() -> NodeInput {
    let mut n = capped_fleet();
    n.truncate(1);
    n.remove(0)
}

fn with_setting(mut n: NodeInput, name: &str, source: SettingSource) -> NodeInput {
    if let NodeOutcome::Measured(r) = &mut n.outcome {
        r.settings_not_chosen.push(CompactSetting {
            name: name.into(),
            value: "1".into(),
            source,
        });
    }
    n
}

fn not_chosen(e: &Evaluation) -> Vec<&Finding> {
    e.findings
        .iter()
        .filter(|f| f.message.contains("the test did not choose"))
        .collect()
}

fn each_source() -> [(SettingSource, &'static str); 4] {
    [
        (SettingSource::PodEnv, "from pod env not set by the spec"),
        (
            SettingSource::ConfFile("/opt/site/nccl.conf".into()),
            "from NCCL_CONF_FILE /opt/site/nccl.conf",
        ),
        (SettingSource::UserConf, "from ~/.nccl.conf"),
        (SettingSource::SystemConf, "from /etc/nccl.conf"),
    ]
}

#[test]
fn a_setting_nobody_chose_fails_a_node_below_its_own_links_naming_its_source() {
    for (source, words) in each_source() {
        let n = with_setting(capped_node(), "NCCL_P2P_DISABLE", source);
        let e = evaluate(&[n], &Thresholds::default());
        assert_eq!(
            e.verdicts.values().next(),
            Some(&NodeVerdict::Failed),
            "{:#?}",
            e.findings
        );
        let found = not_chosen(&e);
        assert_eq!(found.len(), 1, "{:#?}", e.findings);
        assert_eq!(found[0].severity, Severity::Critical);
        assert!(
            found[0]
                .message
                .contains(&format!("NCCL_P2P_DISABLE=1 {words}")),
            "{}",
            found[0].message
        );
        assert_eq!(found[0].source, Some(ExpectationSource::Node));
        assert!(found[0].measured.is_some() && found[0].expected.is_some());
    }
}

#[test]
fn a_setting_nobody_chose_on_a_node_at_its_links_is_a_warning() {
    for (source, words) in each_source() {
        let n = with_setting(inputs(fleet_of(1, 0.0)).remove(0), "NCCL_ALGO", source);
        let e = evaluate(&[n], &Thresholds::default());
        assert_eq!(e.verdicts.values().next(), Some(&NodeVerdict::Passed));
        let found = not_chosen(&e);
        assert_eq!(found.len(), 1, "{:#?}", e.findings);
        assert_eq!(found[0].severity, Severity::Warning);
        assert!(found[0].message.contains(words), "{}", found[0].message);
    }
}

#[test]
fn the_same_setting_from_the_spec_spares_the_node() {
    let mut n = capped_node();
    n.nccl_tuning = vec!["NCCL_P2P_DISABLE".into()];
    let e = evaluate(&[n], &Thresholds::default());
    assert_eq!(
        e.verdicts.values().next(),
        Some(&NodeVerdict::Passed),
        "{:#?}",
        e.findings
    );
    assert!(not_chosen(&e).is_empty());
}

#[test]
fn a_spec_setting_does_not_spare_a_node_from_a_setting_nobody_chose() {
    let mut n = with_setting(capped_node(), "NCCL_P2P_DISABLE", SettingSource::SystemConf);
    n.nccl_tuning = vec!["NCCL_ALGO".into()];
    let e = evaluate(&[n], &Thresholds::default());
    assert_eq!(e.verdicts.values().next(), Some(&NodeVerdict::Failed));
    let found = not_chosen(&e);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].severity, Severity::Critical);
}
