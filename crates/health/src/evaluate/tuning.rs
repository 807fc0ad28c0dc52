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

use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity};

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
