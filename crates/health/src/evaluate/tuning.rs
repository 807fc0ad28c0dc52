//! NCCL settings that change what NCCL reaches. A test whose agent environment caps NCCL
//! (fewer channels, a forced algorithm or protocol, a transport turned off) makes every
//! node's collectives slower for a reason outside its hardware: such a node must not fail
//! on them.
//!
//! # Rule
//! With any of [`NCCL_TUNING`] set, a Slow finding on a collective that a fixed expectation
//! gave (the profile's floor, the spec's threshold, the relation to the node's own copies)
//! is Info and says which setting spared it. The comparison with the fleet, whose nodes run
//! with the same settings, still fails a node slower than its peers; copies, compute and
//! hardware are judged as always.
//!
//! Only the spec's settings spare a node. A tuning setting in effect that the test did not
//! choose (a pod env the spec did not set, NCCL's config files: the agent reports each with
//! its source) is a finding on the node that names the setting and its source: Critical when
//! the node's collectives fall below its own links (the own-links rule of `perf.rs`),
//! Warning otherwise.

use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::result::CompactSetting;

/// The variables that change NCCL's speed without making it refuse.
pub const NCCL_TUNING: &[&str] = &[
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_CTAS",
    "NCCL_MIN_CTAS",
    "NCCL_NTHREADS",
    "NCCL_BUFFSIZE",
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_P2P_NVL_CHUNKSIZE",
    "NCCL_SHM_DISABLE",
    "NCCL_NET_GDR_LEVEL",
    "NCCL_NET_GDR_READ",
    "NCCL_IB_DISABLE",
    "NCCL_CROSS_NIC",
    "NCCL_CUMEM_ENABLE",
    "NCCL_GRAPH_FILE",
    "NCCL_TOPO_FILE",
    "NCCL_TUNER_PLUGIN",
];

/// The variables among [`NCCL_TUNING`] that choose NCCL's transport between GPUs: with one
/// set, NCCL taking another transport than NVLink is the setting's doing (a link that is
/// down is still found by NVML's health).
const ROUTING: &[&str] = &[
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_SHM_DISABLE",
    "NCCL_TOPO_FILE",
    "NCCL_GRAPH_FILE",
];

/// The tuning variables among `names` (an environment's variable names), sorted.
pub fn tuning_of<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Vec<String> {
    let mut v: Vec<String> = names
        .into_iter()
        .filter(|n| NCCL_TUNING.contains(&n.as_ref()))
        .map(|n| n.as_ref().to_string())
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The words a spared finding's message carries, before the settings.
const SPARED: &str = " Not acted on: the test's agent env sets ";

/// Whether a finding was spared by the rule: the fleet comparison still judges its series.
pub(super) fn spared(f: &Finding) -> bool {
    f.severity == Severity::Info && f.message.contains(SPARED)
}

/// Applies the rule to one node's own findings.
pub(super) fn spare_tuned(findings: &mut [Finding], tuning: &[String]) {
    if tuning.is_empty() {
        return;
    }
    let routes = tuning.iter().any(|t| ROUTING.contains(&t.as_str()));
    for f in findings.iter_mut() {
        let collective = matches!(f.metric, Metric::NcclBusBw | Metric::NcclLatency);
        let fixed = !matches!(f.source, Some(ExpectationSource::Fleet));
        let slow = f.kind == FindingKind::Slow && collective && fixed;
        let rerouted = f.kind == FindingKind::TransportFallback && routes;
        if (slow || rerouted) && f.severity == Severity::Critical {
            f.severity = Severity::Info;
            f.message.push_str(&format!(
                "{SPARED}{}, which changes what NCCL reaches; only the comparison with nodes run alike can fail a node on its collectives.",
                tuning.join(", ")
            ));
        }
    }
}

/// The findings of the settings the test did not choose, judged on the node's own findings
/// before any is spared: Critical when a collective fell below the node's own links,
/// Warning otherwise.
pub(super) fn not_chosen(node: &str, settings: &[CompactSetting], own: &[Finding]) -> Vec<Finding> {
    let below_links = own.iter().find(|f| {
        f.kind == FindingKind::Slow
            && f.metric == Metric::NcclBusBw
            && f.source == Some(ExpectationSource::Node)
            && f.severity == Severity::Critical
    });
    settings
        .iter()
        .filter(|s| NCCL_TUNING.contains(&s.name.as_str()))
        .map(|s| {
            let (severity, consequence) = match below_links {
                Some(b) => (
                    Severity::Critical,
                    format!(
                        "and {} on it falls below what its own links carry: the node fails until the setting goes",
                        b.collective.map_or("a collective", |c| c.nccl_tests_name())
                    ),
                ),
                None => (
                    Severity::Warning,
                    "and changes what NCCL reaches on it; its collectives still reach its links".to_string(),
                ),
            };
            let mut f = Finding::new(
                FindingKind::Slow,
                Subject::node(node),
                Metric::NcclBusBw,
                severity,
                format!(
                    "{s} is in effect on {node} although the test did not choose it, {consequence}. Remove it there, or set it in spec.agent.env if the test means it."
                ),
            );
            f.source = Some(ExpectationSource::Rule);
            if let Some(b) = below_links {
                f.measured = b.measured;
                f.expected = b.expected;
                f.deviation = b.deviation;
                f.unit = b.unit.clone();
                f.source = b.source;
            }
            f
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::findings::Subject;

    fn slow(metric: Metric, source: ExpectationSource) -> Finding {
        let mut f = Finding::new(
            FindingKind::Slow,
            Subject::node("n"),
            metric,
            Severity::Critical,
            "slow.".into(),
        );
        f.source = Some(source);
        f
    }

    #[test]
    fn only_tuning_variables_count() {
        let env = [
            "NCCL_DEBUG",
            "NCCL_MAX_NCHANNELS",
            "NCCL_IB_HCA",
            "NCCL_ALGO",
            "PATH",
        ];
        assert_eq!(tuning_of(env), ["NCCL_ALGO", "NCCL_MAX_NCHANNELS"]);
        assert!(tuning_of(["NCCL_SOCKET_IFNAME", "NCCL_NVLS_ENABLE"]).is_empty());
    }

    #[test]
    fn fixed_expectations_on_collectives_are_spared_and_the_rest_is_not() {
        let mut f = vec![
            slow(Metric::NcclBusBw, ExpectationSource::Profile),
            slow(Metric::NcclBusBw, ExpectationSource::Node),
            slow(Metric::NcclLatency, ExpectationSource::Threshold),
            slow(Metric::NcclBusBw, ExpectationSource::Fleet),
            slow(Metric::PairBandwidth, ExpectationSource::Profile),
            Finding::new(
                FindingKind::TransportFallback,
                Subject::gpu_pair("n", 0, 1),
                Metric::NcclTransport,
                Severity::Critical,
                "fell back.".into(),
            ),
        ];
        spare_tuned(&mut f, &[]);
        assert!(f.iter().all(|f| f.severity == Severity::Critical));
        spare_tuned(&mut f, &["NCCL_MAX_NCHANNELS".to_string()]);
        let sev: Vec<Severity> = f.iter().map(|f| f.severity).collect();
        let c = Severity::Critical;
        let i = Severity::Info;
        // A transport NCCL was not told to avoid stays a fault.
        assert_eq!(sev, [i, i, i, c, c, c]);
        assert!(
            f[0].message.contains("sets NCCL_MAX_NCHANNELS"),
            "{}",
            f[0].message
        );
        let mut f = vec![f[5].clone()];
        spare_tuned(&mut f, &["NCCL_P2P_DISABLE".to_string()]);
        assert_eq!(f[0].severity, i);
    }
}
