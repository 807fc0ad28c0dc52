//! Software drift: each node's driver, CUDA, NCCL, NCCL config files, VBIOS and fabric
//! manager state against what most nodes of its run have.
//!
//! # Rules
//! 1. Each field ([`SoftwareField`]) is compared among the nodes whose agent reported it; a
//!    node that did not (an older agent, NVML could not read it) is neither judged nor
//!    counted. VBIOS and fabric manager state are compared only among nodes of the same GPU
//!    product and count ([`SoftwareField::per_board`]).
//! 2. The majority is the value more than half of the compared nodes have, when at least
//!    [`MIN_NODES`] were compared. Each node with another value gets a Warning naming the
//!    difference ("driver 550.54.15 where 41 of 44 nodes have 550.90.07"). A Warning never
//!    fails or cordons a node.
//! 3. Where the compared nodes differ and no majority exists (fewer than [`MIN_NODES`], or
//!    no value held by more than half), each of them gets an Info that says so and lists
//!    the values: nothing singles out which node is off.
//! 4. Nodes that all agree, and a run of one node, get nothing.

use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::result::{CompactSoftware, SoftwareField};
use std::collections::BTreeMap;

/// Fewest nodes reporting a field for their majority to judge one of them.
pub const MIN_NODES: usize = 3;

/// A GPU product (normalized) and GPU count: what per-board fields are compared within.
type Board<'a> = (&'a str, u32);

/// One node's software, with the board it is compared within for per-board fields.
#[derive(Clone, Copy, Debug)]
pub struct NodeSoftware<'a> {
    pub node: &'a str,
    /// Normalized GPU product and GPU count.
    pub board: Board<'a>,
    pub software: &'a CompactSoftware,
}

/// The findings of rules 1-4 over the measured nodes of a run.
pub fn drift(nodes: &[NodeSoftware<'_>]) -> Vec<Finding> {
    let mut out = Vec::new();
    for field in SoftwareField::ALL {
        // Per board or run-wide: each node's (name, value).
        let mut groups: BTreeMap<Option<Board<'_>>, Vec<(&str, &str)>> = BTreeMap::new();
        for n in nodes {
            if let Some(value) = field.of(n.software) {
                let key = field.per_board().then_some(n.board);
                groups.entry(key).or_default().push((n.node, value));
            }
        }
        for (board, group) in &groups {
            compare(field, *board, group, &mut out);
        }
    }
    out
}

/// Rules 2-4 for one field among `group` (node, value).
fn compare(
    field: SoftwareField,
    board: Option<Board<'_>>,
    group: &[(&str, &str)],
    out: &mut Vec<Finding>,
) {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, v) in group {
        *counts.entry(v).or_default() += 1;
    }
    if counts.len() < 2 {
        return;
    }
    let total = group.len();
    let among = match board {
        Some((product, gpus)) => format!(" of {gpus} x {product}"),
        None => String::new(),
    };
    let majority = counts
        .iter()
        .find(|(_, n)| 2 * **n > total)
        .filter(|_| total >= MIN_NODES)
        .map(|(v, n)| (*v, *n));
    match majority {
        Some((usual, held)) => {
            for (node, value) in group.iter().filter(|(_, v)| *v != usual) {
                out.push(finding(
                    node,
                    Severity::Warning,
                    format!(
                        "{field} {value} on {node} where {held} of {total} nodes{among} in this run have {usual}; {}",
                        advice(field)
                    ),
                ));
            }
        }
        None => {
            let mut by_count: Vec<(&str, usize)> = counts.into_iter().collect();
            by_count.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            let listed: Vec<String> = by_count
                .iter()
                .take(4)
                .map(|(v, n)| format!("{v} on {n}"))
                .collect();
            let more = by_count.len().saturating_sub(4);
            let why = if total < MIN_NODES {
                format!("{total} nodes are too few for a majority ({MIN_NODES} needed)")
            } else {
                "no value is on more than half of them".to_string()
            };
            for (node, value) in group {
                out.push(finding(
                    node,
                    Severity::Info,
                    format!(
                        "{field} differs among the {total} nodes{among} of this run that report it ({}{}), {node} has {value}: {why}, so none is called off; compare them with the version your fleet should run.",
                        listed.join(", "),
                        if more > 0 {
                            format!(" and {more} more")
                        } else {
                            String::new()
                        }
                    ),
                ));
            }
        }
    }
}

/// What to do about a node whose `field` differs.
fn advice(field: SoftwareField) -> &'static str {
    match field {
        SoftwareField::Driver | SoftwareField::Cuda => {
            "nodes of one run should share a driver; update it or check which is intended."
        }
        SoftwareField::Nccl => "check the agent image and any NCCL the node's host mounts in.",
        SoftwareField::NcclConf => {
            "compare /etc/nccl.conf, ~/.nccl.conf and the file NCCL_CONF_FILE names with another node's."
        }
        SoftwareField::Vbios => "check nvidia-smi -q on the node and update its firmware.",
        SoftwareField::FabricManager => {
            "check nvidia-fabricmanager on the node (systemctl status nvidia-fabricmanager)."
        }
    }
}

fn finding(node: &str, severity: Severity, message: String) -> Finding {
    Finding {
        source: Some(ExpectationSource::Fleet),
        ..Finding::new(
            FindingKind::SoftwareDrift,
            Subject::node(node),
            Metric::Software,
            severity,
            message,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sw(driver: Option<&str>) -> CompactSoftware {
        CompactSoftware {
            driver: driver.map(str::to_string),
            ..CompactSoftware::default()
        }
    }

    fn run(drivers: &[Option<&str>]) -> Vec<Finding> {
        let names: Vec<String> = (0..drivers.len()).map(|i| format!("n{i}")).collect();
        let software: Vec<CompactSoftware> = drivers.iter().map(|d| sw(*d)).collect();
        let nodes: Vec<NodeSoftware<'_>> = names
            .iter()
            .zip(&software)
            .map(|(node, software)| NodeSoftware {
                node,
                board: ("H100 80GB HBM3", 8),
                software,
            })
            .collect();
        drift(&nodes)
    }

    #[test]
    fn a_node_off_the_majority_gets_a_warning_naming_both_versions() {
        let mut drivers = vec![Some("550.90.07"); 41];
        drivers.extend([Some("550.54.15"), Some("550.54.15"), Some("535.161.08")]);
        let f = run(&drivers);
        assert_eq!(f.len(), 3, "{f:#?}");
        assert!(f.iter().all(|f| f.severity == Severity::Warning));
        assert!(f.iter().all(|f| f.kind == FindingKind::SoftwareDrift));
        assert_eq!(f[0].subject, Subject::node("n41"));
        assert!(
            f[0].message.starts_with(
                "driver 550.54.15 on n41 where 41 of 44 nodes in this run have 550.90.07"
            ),
            "{}",
            f[0].message
        );
    }

    #[test]
    fn nodes_that_agree_and_a_run_of_one_say_nothing() {
        assert!(run(&[Some("550.90.07"); 5]).is_empty());
        assert!(run(&[Some("550.90.07")]).is_empty());
        assert!(run(&[]).is_empty());
    }

    #[test]
    fn two_nodes_that_differ_name_no_one_and_say_the_run_is_too_small() {
        let f = run(&[Some("550.90.07"), Some("550.54.15")]);
        assert_eq!(f.len(), 2);
        assert!(f.iter().all(|f| f.severity == Severity::Info));
        assert!(
            f[0].message
                .contains("2 nodes are too few for a majority (3 needed)"),
            "{}",
            f[0].message
        );
        assert!(f[0].message.contains("550.54.15 on 1, 550.90.07 on 1"));
    }

    #[test]
    fn a_tie_has_no_majority_and_calls_no_node_off() {
        let f = run(&[
            Some("550.90.07"),
            Some("550.90.07"),
            Some("550.54.15"),
            Some("550.54.15"),
        ]);
        assert_eq!(f.len(), 4);
        assert!(f.iter().all(|f| f.severity == Severity::Info));
        assert!(f[0].message.contains("no value is on more than half"));
    }

    #[test]
    fn three_nodes_have_a_majority_of_two() {
        let f = run(&[Some("550.90.07"), Some("550.54.15"), Some("550.90.07")]);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].severity, Severity::Warning);
        assert_eq!(f[0].subject, Subject::node("n1"));
        assert!(f[0].message.contains("2 of 3 nodes"), "{}", f[0].message);
    }

    #[test]
    fn a_node_that_did_not_report_is_neither_judged_nor_counted() {
        // An older agent on n3: the three that report agree.
        assert!(
            run(&[
                Some("550.90.07"),
                Some("550.90.07"),
                Some("550.90.07"),
                None
            ])
            .is_empty()
        );
        // Two of the four report and differ: too few to call either off.
        let f = run(&[Some("550.90.07"), None, Some("550.54.15"), None]);
        assert_eq!(f.len(), 2);
        assert!(f.iter().all(|f| f.severity == Severity::Info));
        assert!(f.iter().all(|f| f.subject != Subject::node("n1")));
    }

    #[test]
    fn vbios_is_compared_only_among_nodes_of_one_board() {
        let h100 = CompactSoftware {
            vbios: Some("96.00.74.00.01".into()),
            ..CompactSoftware::default()
        };
        let a100 = CompactSoftware {
            vbios: Some("92.00.45.00.06".into()),
            ..CompactSoftware::default()
        };
        let node = |node, board, software| NodeSoftware {
            node,
            board,
            software,
        };
        let nodes = [
            node("h1", ("H100 80GB HBM3", 8), &h100),
            node("h2", ("H100 80GB HBM3", 8), &h100),
            node("h3", ("H100 80GB HBM3", 8), &h100),
            node("a1", ("A100 SXM4 80GB", 8), &a100),
        ];
        assert!(drift(&nodes).is_empty());
        let nodes = [
            node("h1", ("H100 80GB HBM3", 8), &h100),
            node("h2", ("H100 80GB HBM3", 8), &h100),
            node("h3", ("H100 80GB HBM3", 8), &a100),
        ];
        let f = drift(&nodes);
        assert_eq!(f.len(), 1);
        assert!(
            f[0].message
                .starts_with("VBIOS 92.00.45.00.06 on h3 where 2 of 3 nodes of 8 x H100 80GB HBM3 in this run have 96.00.74.00.01"),
            "{}",
            f[0].message
        );
    }

    #[test]
    fn each_field_is_judged_on_its_own() {
        let usual = CompactSoftware {
            driver: Some("550.90.07".into()),
            nccl: Some("2.21.5".into()),
            nccl_conf: Some("none".into()),
            ..CompactSoftware::default()
        };
        let odd = CompactSoftware {
            nccl_conf: Some("3f2a9c0d11e4b7a8".into()),
            ..usual.clone()
        };
        let node = |node, software| NodeSoftware {
            node,
            board: ("H200", 8),
            software,
        };
        let f = drift(&[node("a", &usual), node("b", &usual), node("c", &odd)]);
        assert_eq!(f.len(), 1);
        assert!(
            f[0].message
                .starts_with("NCCL config files digest 3f2a9c0d11e4b7a8 on c where 2 of 3"),
            "{}",
            f[0].message
        );
    }
}
