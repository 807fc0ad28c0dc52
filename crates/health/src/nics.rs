//! Network port findings of one node (InfiniBand / RoCE ports from sysfs): a port down, a
//! port trained below its siblings, error counters that grew since the node's previous
//! node-pair test.
//!
//! # Rules
//! 1. A port that is not `ACTIVE` and `LinkUp` is Critical `NicDown`, unless its physical
//!    state is `Disabled` (switched off on purpose): Info.
//! 2. Among the up ports of one link layer (InfiniBand, Ethernet), a port whose active rate
//!    is below the highest is Critical `NicDegraded` (a cable or transceiver that trained
//!    down: NCCL's rings through it run at its rate).
//! 3. Against the node's record of its previous pair test ([`NicCounters`], the node
//!    annotation `gpufabric.io/nic-counters`), ports matched by device and port:
//!    `link_downed` grown is Critical `NicErrors` (the link went down and came back);
//!    `symbol_error` or `port_rcv_errors` grown by at least [`NicRules::errors_critical`]
//!    is Critical, by less Info. The finding names the run and time it compares against.
//!    A counter that went down (driver reload) is not judged, nor is a port the record does
//!    not hold. Without a record counters are not judged: they count since the driver
//!    loaded. A node meets two or more partners a run, so its later pairs compare against
//!    its first pair's reading of the same run: growth during the run is a finding too, and
//!    its message says so.
//! 4. The record to keep after a pair test ([`next_record`]): this test's counters, unless
//!    a counter grew into a Critical finding; then the older record stays, so that a later
//!    pair or a confirmation compares against the same starting point and the growth is not
//!    forgotten (a driver reload, which lowers the counts, ends that).

use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::nic_counters::NicCounters;
use gpufabric_api::pair::NicPort;

/// Settings of the rules.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NicRules {
    /// Growth of symbol or receive errors between two runs that fails a node.
    pub errors_critical: u64,
}

impl Default for NicRules {
    fn default() -> Self {
        NicRules {
            errors_critical: 100,
        }
    }
}

/// The findings of one node's ports read in run `run`, by the rules above; `previous` is
/// the node's record of its previous pair test.
pub fn nic_findings(
    node: &str,
    ports: &[NicPort],
    previous: Option<&NicCounters>,
    run: &str,
    rules: &NicRules,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in ports.iter().filter(|p| !p.is_up()) {
        let disabled = p.phys_state.eq_ignore_ascii_case("Disabled");
        let (severity, advice) = if disabled {
            (Severity::Info, "switched off; not judged")
        } else {
            (
                Severity::Critical,
                "check the cable, the transceiver and the switch port",
            )
        };
        out.push(Finding::new(
            FindingKind::NicDown,
            Subject::nic(node, p.name()),
            Metric::NicLink,
            severity,
            format!("{} is {} ({}): {advice}", p.name(), p.state, p.phys_state),
        ));
    }
    out.extend(slow_ports(node, ports));
    if let Some(previous) = previous {
        out.extend(grown_counters(node, ports, previous, run, rules));
    }
    out
}

fn slow_ports(node: &str, ports: &[NicPort]) -> Vec<Finding> {
    let mut out = Vec::new();
    let up: Vec<&NicPort> = ports.iter().filter(|p| p.is_up()).collect();
    for p in &up {
        let (Some(rate), layer) = (p.rate_gbps, &p.link_layer) else {
            continue;
        };
        let siblings: Vec<&NicPort> = up
            .iter()
            .filter(|s| &s.link_layer == layer && !(s.device == p.device && s.port == p.port))
            .copied()
            .collect();
        let Some(best) = siblings
            .iter()
            .filter_map(|s| s.rate_gbps)
            .max_by(f64::total_cmp)
        else {
            continue;
        };
        if rate < best {
            let faster = siblings
                .iter()
                .filter(|s| s.rate_gbps == Some(best))
                .count();
            out.push(
                Finding::new(
                    FindingKind::NicDegraded,
                    Subject::nic(node, p.name()),
                    Metric::NicRate,
                    Severity::Critical,
                    format!(
                        "{} trained at {} Gb/s, {faster} of its sibling ports at {} Gb/s: reseat or replace the cable or transceiver",
                        p.name(),
                        tenths_unless_whole(rate),
                        tenths_unless_whole(best)
                    ),
                )
                .with_evidence(rate, best, "Gb/s", ExpectationSource::Node),
            );
        }
    }
    out
}

fn grown_counters(
    node: &str,
    ports: &[NicPort],
    previous: &NicCounters,
    run: &str,
    rules: &NicRules,
) -> Vec<Finding> {
    let since = since(previous, run);
    let mut out = Vec::new();
    for p in ports {
        let Some(before) = previous.port(&p.device, p.port) else {
            continue;
        };
        let (now, then) = (p.errors, before.errors);
        let counters = [
            ("link_downed", now.link_downed, then.link_downed, 1),
            (
                "symbol_error",
                now.symbol_errors,
                then.symbol_errors,
                rules.errors_critical,
            ),
            (
                "port_rcv_errors",
                now.rcv_errors,
                then.rcv_errors,
                rules.errors_critical,
            ),
        ];
        for (name, now, then, critical_from) in counters {
            let (Some(now), Some(then)) = (now, then) else {
                continue;
            };
            if now <= then {
                continue;
            }
            let delta = now - then;
            let severity = if delta >= critical_from {
                Severity::Critical
            } else {
                Severity::Info
            };
            out.push(
                Finding::new(
                    FindingKind::NicErrors,
                    Subject::nic(node, p.name()),
                    Metric::NicErrors,
                    severity,
                    format!(
                        "{} {name} grew by {delta} (from {then} to {now}) {since}: check the cable and the switch port",
                        p.name()
                    ),
                )
                .with_evidence(delta as f64, 0.0, "errors", ExpectationSource::Rule),
            );
        }
    }
    out
}

/// What a growth is measured from, for the message: the previous run's pair test, or an
/// earlier pair test of this same run.
fn since(previous: &NicCounters, run: &str) -> String {
    if previous.run == run {
        format!(
            "since an earlier pair test of this run ({run}){}: the counters grew during the run",
            crate::at_time(&previous.at)
        )
    } else {
        crate::since_run(&previous.run, &previous.at)
    }
}

/// The record to keep for `node` after its pair test of run `run` at `at` read `ports`
/// (rule 4): None when there is nothing new to keep (a counter grew into a Critical
/// finding in `findings`, the counts are those of `previous`, or the ports have no
/// counters).
pub fn next_record(
    node: &str,
    ports: &[NicPort],
    previous: Option<&NicCounters>,
    findings: &[Finding],
    run: &str,
    at: &str,
) -> Option<NicCounters> {
    let growing = findings.iter().any(|f| {
        f.kind == FindingKind::NicErrors
            && f.severity == Severity::Critical
            && f.subject.node_name() == node
    });
    if growing {
        return None;
    }
    let next = NicCounters::of(ports, run, at)?;
    match previous {
        Some(p) if p.same_counts(&next) => None,
        _ => Some(next),
    }
}

/// A figure for a sentence: whole when it is whole, else one decimal.
fn tenths_unless_whole(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::nic_counters::PortErrors;

    /// The network port a finding names, if it is about one.
    fn nic_port(subject: &Subject) -> Option<&str> {
        match subject {
            Subject::Nic { port, .. } => Some(port),
            _ => None,
        }
    }

    fn port(device: &str, rate: f64) -> NicPort {
        NicPort {
            device: device.into(),
            port: 1,
            link_layer: Some("InfiniBand".into()),
            state: "ACTIVE".into(),
            phys_state: "LinkUp".into(),
            rate_gbps: Some(rate),
            errors: PortErrors {
                symbol_errors: Some(0),
                link_downed: Some(0),
                rcv_errors: Some(0),
            },
        }
    }

    fn eight() -> Vec<NicPort> {
        (0..8).map(|i| port(&format!("mlx5_{i}"), 400.0)).collect()
    }

    const AT: &str = "2026-11-24T02:00:00Z";

    /// The record of `ports` as read by a pair test of run `run`.
    fn record(ports: &[NicPort], run: &str) -> NicCounters {
        NicCounters::of(ports, run, AT).expect("ports with counters")
    }

    fn findings(now: &[NicPort], before: Option<&NicCounters>) -> Vec<Finding> {
        nic_findings("n", now, before, "nightly-2", &NicRules::default())
    }

    #[test]
    fn healthy_ports_give_no_finding() {
        let ports = eight();
        assert!(findings(&ports, Some(&record(&ports, "nightly-1"))).is_empty());
    }

    #[test]
    fn a_port_down_is_critical_and_a_disabled_one_is_not() {
        let mut ports = eight();
        ports[3].state = "DOWN".into();
        ports[3].phys_state = "Polling".into();
        ports[5].state = "DOWN".into();
        ports[5].phys_state = "Disabled".into();
        let f = nic_findings("h200-05", &ports, None, "r", &NicRules::default());
        assert_eq!(f.len(), 2, "{f:#?}");
        assert_eq!(f[0].kind, FindingKind::NicDown);
        assert_eq!(f[0].severity, Severity::Critical);
        assert_eq!(f[0].subject.to_string(), "h200-05 mlx5_3 port 1");
        assert_eq!(
            f[0].message,
            "mlx5_3 port 1 is DOWN (Polling): check the cable, the transceiver and the switch port"
        );
        assert_eq!(f[1].severity, Severity::Info);
        assert_eq!(nic_port(&f[1].subject), Some("mlx5_5 port 1"));
    }

    #[test]
    fn a_port_trained_below_its_siblings_is_named_with_both_rates() {
        let mut ports = eight();
        ports[2].rate_gbps = Some(200.0);
        let f = findings(&ports, None);
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].kind, FindingKind::NicDegraded);
        assert_eq!((f[0].measured, f[0].expected), (Some(200.0), Some(400.0)));
        assert_eq!(f[0].deviation, Some(-0.5));
        assert_eq!(
            f[0].message,
            "mlx5_2 port 1 trained at 200 Gb/s, 7 of its sibling ports at 400 Gb/s: reseat or replace the cable or transceiver"
        );
    }

    #[test]
    fn rates_are_compared_within_one_link_layer_only() {
        let mut ports = eight();
        let mut eth = port("mlx5_bond_0", 100.0);
        eth.link_layer = Some("Ethernet".into());
        ports.push(eth);
        assert!(findings(&ports, None).is_empty());
    }

    #[test]
    fn a_single_port_has_no_sibling_to_be_slower_than() {
        let ports = vec![port("mlx5_0", 100.0)];
        assert!(findings(&ports, None).is_empty());
    }

    #[test]
    fn counters_that_grew_since_the_previous_run_are_found() {
        let before = record(&eight(), "nightly-1");
        let mut now = eight();
        now[1].errors.link_downed = Some(2);
        now[4].errors.symbol_errors = Some(250);
        now[6].errors.rcv_errors = Some(3);
        let f = findings(&now, Some(&before));
        let seen: Vec<(String, Severity, Option<f64>)> = f
            .iter()
            .map(|f| {
                (
                    nic_port(&f.subject).unwrap_or_default().to_string(),
                    f.severity,
                    f.measured,
                )
            })
            .collect();
        assert_eq!(
            seen,
            vec![
                ("mlx5_1 port 1".into(), Severity::Critical, Some(2.0)),
                ("mlx5_4 port 1".into(), Severity::Critical, Some(250.0)),
                ("mlx5_6 port 1".into(), Severity::Info, Some(3.0)),
            ]
        );
        assert!(f.iter().all(|f| f.kind == FindingKind::NicErrors));
        assert_eq!(
            f[1].message,
            "mlx5_4 port 1 symbol_error grew by 250 (from 0 to 250) since run nightly-1 at 2026-11-24T02:00:00Z: check the cable and the switch port"
        );
    }

    #[test]
    fn symbol_and_receive_errors_are_critical_from_the_rule_setting() {
        let before = record(&eight(), "nightly-1");
        let mut now = eight();
        now[0].errors.symbol_errors = Some(99);
        now[1].errors.rcv_errors = Some(100);
        let f = findings(&now, Some(&before));
        let severities: Vec<Severity> = f.iter().map(|f| f.severity).collect();
        assert_eq!(
            severities,
            vec![Severity::Info, Severity::Critical],
            "{f:#?}"
        );
        let strict = NicRules {
            errors_critical: 50,
        };
        let f = nic_findings("n", &now, Some(&before), "nightly-2", &strict);
        assert!(f.iter().all(|f| f.severity == Severity::Critical), "{f:#?}");
    }

    #[test]
    fn growth_during_the_run_says_so() {
        let mut first = eight();
        first[2].errors.symbol_errors = Some(1_000);
        let mut second = first.clone();
        second[2].errors.symbol_errors = Some(5_000);
        let f = findings(&second, Some(&record(&first, "nightly-2")));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(f[0].severity, Severity::Critical);
        assert_eq!(
            f[0].message,
            "mlx5_2 port 1 symbol_error grew by 4000 (from 1000 to 5000) since an earlier pair test of this run (nightly-2) at 2026-11-24T02:00:00Z: the counters grew during the run: check the cable and the switch port"
        );
    }

    #[test]
    fn counters_are_not_judged_without_a_previous_run_or_when_they_reset() {
        let mut now = eight();
        now[0].errors.symbol_errors = Some(5_000);
        assert!(findings(&now, None).is_empty());
        let mut before = eight();
        before[0].errors.symbol_errors = Some(9_000);
        assert!(findings(&now, Some(&record(&before, "nightly-1"))).is_empty());
        // A port that was not there before is not compared.
        let mut later = now.clone();
        let mut new_port = port("mlx5_9", 400.0);
        new_port.errors.symbol_errors = Some(77);
        later.push(new_port);
        assert!(findings(&later, Some(&record(&now, "nightly-1"))).is_empty());
        // Nor is a counter the record (or this reading) does not hold.
        let mut unknown = record(&eight(), "nightly-1");
        unknown.ports[0].errors.symbol_errors = None;
        assert!(findings(&now, Some(&unknown)).is_empty());
        let mut unread = eight();
        unread[0].errors.link_downed = None;
        let mut downed = record(&eight(), "nightly-1");
        downed.ports[0].errors.link_downed = Some(0);
        assert!(findings(&unread, Some(&downed)).is_empty());
    }

    #[test]
    fn ports_are_matched_by_device_and_port() {
        let mut two_ports = vec![port("mlx5_0", 400.0), port("mlx5_0", 400.0)];
        two_ports[1].port = 2;
        let before = record(&two_ports, "nightly-1");
        let mut now = two_ports.clone();
        now.reverse();
        now[0].errors.link_downed = Some(1);
        let f = findings(&now, Some(&before));
        assert_eq!(f.len(), 1, "{f:#?}");
        assert_eq!(nic_port(&f[0].subject), Some("mlx5_0 port 2"));
    }

    #[test]
    fn the_record_moves_on_unless_a_counter_grew_into_a_critical_finding() {
        let before = record(&eight(), "nightly-1");
        // Unchanged counts: nothing new to write.
        assert_eq!(
            next_record("n", &eight(), Some(&before), &[], "nightly-2", "t2"),
            None
        );
        // No record yet: this reading.
        let first = next_record("n", &eight(), None, &[], "nightly-2", "t2");
        assert_eq!(
            first.map(|r| (r.run, r.at)),
            Some(("nightly-2".into(), "t2".into()))
        );
        // Info growth: the new counts are kept.
        let mut now = eight();
        now[6].errors.rcv_errors = Some(3);
        let f = findings(&now, Some(&before));
        let next = next_record("n", &now, Some(&before), &f, "nightly-2", "t2");
        assert_eq!(
            next.and_then(|r| r.port("mlx5_6", 1).and_then(|p| p.errors.rcv_errors)),
            Some(3)
        );
        // Critical growth: the older record stays.
        now[4].errors.symbol_errors = Some(250);
        let f = findings(&now, Some(&before));
        assert_eq!(
            next_record("n", &now, Some(&before), &f, "nightly-2", "t2"),
            None
        );
        // ... but only for the node the finding is on.
        assert!(next_record("other", &now, None, &f, "nightly-2", "t2").is_some());
        // A driver reload (counts went down) ends it: the new counts are kept.
        let mut reloaded = eight();
        reloaded[4].errors.symbol_errors = Some(0);
        let high = record(&now, "nightly-1");
        let f = findings(&reloaded, Some(&high));
        assert!(f.is_empty(), "{f:#?}");
        assert_eq!(
            next_record("n", &reloaded, Some(&high), &f, "nightly-3", "t3").map(|r| r.run),
            Some("nightly-3".into())
        );
        // Ports without counters: nothing to keep.
        let bare: Vec<NicPort> = eight()
            .into_iter()
            .map(|p| NicPort {
                errors: PortErrors::default(),
                ..p
            })
            .collect();
        assert_eq!(next_record("n", &bare, None, &[], "r", "t"), None);
    }
}
