//! Network port findings of one node (InfiniBand / RoCE ports from sysfs): a port down, a
//! port trained below its siblings, error counters that grew since the previous run.
//!
//! # Rules
//! 1. A port that is not `ACTIVE` and `LinkUp` is Critical `NicDown`, unless its physical
//!    state is `Disabled` (switched off on purpose): Info.
//! 2. Among the up ports of one link layer (InfiniBand, Ethernet), a port whose active rate
//!    is below the highest is Critical `NicDegraded` (a cable or transceiver that trained
//!    down: NCCL's rings through it run at its rate).
//! 3. With the previous run's ports: `link_downed` grown is Critical `NicErrors` (the link
//!    went down and came back); `symbol_error` or `port_rcv_errors` grown by at least
//!    [`NicRules::errors_critical`] is Critical, by less Info. Counters that went backwards
//!    (driver reload) and ports new since the previous run give no finding. Without a
//!    previous run counters are not judged: they count since the driver loaded.

use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
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

/// The findings of one node's ports, by the rules above.
pub fn nic_findings(
    node: &str,
    ports: &[NicPort],
    previous: Option<&[NicPort]>,
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
        out.extend(grown_counters(node, ports, previous, rules));
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
                        num(rate),
                        num(best)
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
    previous: &[NicPort],
    rules: &NicRules,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for p in ports {
        let Some(before) = previous
            .iter()
            .find(|q| q.device == p.device && q.port == p.port)
        else {
            continue;
        };
        let grew = |now: Option<u64>, then: Option<u64>| match (now, then) {
            (Some(n), Some(t)) if n > t => Some(n - t),
            _ => None,
        };
        let counters = [
            ("link_downed", grew(p.link_downed, before.link_downed), 1),
            (
                "symbol_error",
                grew(p.symbol_errors, before.symbol_errors),
                rules.errors_critical,
            ),
            (
                "port_rcv_errors",
                grew(p.rcv_errors, before.rcv_errors),
                rules.errors_critical,
            ),
        ];
        for (name, delta, critical_from) in counters {
            let Some(delta) = delta else { continue };
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
                        "{} {name} grew by {delta} since the previous run: check the cable and the switch port",
                        p.name()
                    ),
                )
                .with_evidence(delta as f64, 0.0, "errors", ExpectationSource::Rule),
            );
        }
    }
    out
}

fn num(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(device: &str, rate: f64) -> NicPort {
        NicPort {
            device: device.into(),
            port: 1,
            link_layer: Some("InfiniBand".into()),
            state: "ACTIVE".into(),
            phys_state: "LinkUp".into(),
            rate_gbps: Some(rate),
            symbol_errors: Some(0),
            link_downed: Some(0),
            rcv_errors: Some(0),
        }
    }

    fn eight() -> Vec<NicPort> {
        (0..8).map(|i| port(&format!("mlx5_{i}"), 400.0)).collect()
    }

    #[test]
    fn healthy_ports_give_no_finding() {
        let ports = eight();
        assert!(nic_findings("n", &ports, Some(&ports), &NicRules::default()).is_empty());
    }

    #[test]
    fn a_port_down_is_critical_and_a_disabled_one_is_not() {
        let mut ports = eight();
        ports[3].state = "DOWN".into();
        ports[3].phys_state = "Polling".into();
        ports[5].state = "DOWN".into();
        ports[5].phys_state = "Disabled".into();
        let f = nic_findings("h200-05", &ports, None, &NicRules::default());
        assert_eq!(f.len(), 2, "{f:#?}");
        assert_eq!(f[0].kind, FindingKind::NicDown);
        assert_eq!(f[0].severity, Severity::Critical);
        assert_eq!(f[0].subject.to_string(), "h200-05 mlx5_3 port 1");
        assert_eq!(
            f[0].message,
            "mlx5_3 port 1 is DOWN (Polling): check the cable, the transceiver and the switch port"
        );
        assert_eq!(f[1].severity, Severity::Info);
        assert_eq!(f[1].subject.nic_port(), Some("mlx5_5 port 1"));
    }

    #[test]
    fn a_port_trained_below_its_siblings_is_named_with_both_rates() {
        let mut ports = eight();
        ports[2].rate_gbps = Some(200.0);
        let f = nic_findings("n", &ports, None, &NicRules::default());
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
        assert!(nic_findings("n", &ports, None, &NicRules::default()).is_empty());
    }

    #[test]
    fn a_single_port_has_no_sibling_to_be_slower_than() {
        let ports = vec![port("mlx5_0", 100.0)];
        assert!(nic_findings("n", &ports, None, &NicRules::default()).is_empty());
    }

    #[test]
    fn counters_that_grew_since_the_previous_run_are_found() {
        let before = eight();
        let mut now = eight();
        now[1].link_downed = Some(2);
        now[4].symbol_errors = Some(250);
        now[6].rcv_errors = Some(3);
        let f = nic_findings("n", &now, Some(&before), &NicRules::default());
        let seen: Vec<(String, Severity, Option<f64>)> = f
            .iter()
            .map(|f| {
                (
                    f.subject.nic_port().unwrap_or_default().to_string(),
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
        assert!(
            f[1].message.contains("symbol_error grew by 250"),
            "{}",
            f[1].message
        );
    }

    #[test]
    fn counters_are_not_judged_without_a_previous_run_or_when_they_reset() {
        let mut now = eight();
        now[0].symbol_errors = Some(5_000);
        assert!(nic_findings("n", &now, None, &NicRules::default()).is_empty());
        let mut before = eight();
        before[0].symbol_errors = Some(9_000);
        assert!(nic_findings("n", &now, Some(&before), &NicRules::default()).is_empty());
        // A port that was not there before is not compared.
        let mut later = now.clone();
        later.push(NicPort {
            symbol_errors: Some(77),
            ..port("mlx5_9", 400.0)
        });
        assert!(nic_findings("n", &later, Some(&now), &NicRules::default()).is_empty());
    }
}
