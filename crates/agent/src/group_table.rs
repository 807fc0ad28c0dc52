//! The lines every multi-node test's table (ddp-nodes, nccl-nodes) begins and ends with.

use gpufabric_api::group::GroupHeader;
use gpufabric_api::pair::NotMeasured;
use gpufabric_api::result::PhaseError;

/// The title line: `what` was measured over the group's nodes, with their GPUs, by this
/// rank, then `detail`.
pub fn title(what: &str, header: &GroupHeader, detail: &str) -> String {
    format!(
        "# {what}  {} nodes x {} GPUs  rank {}  {detail}\n",
        header.nodes.len(),
        header.gpus_per_node,
        header.rank
    )
}

/// The closing lines: each error, then why the test was not measured.
pub fn ending(errors: &[PhaseError], not_measured: Option<&NotMeasured>) -> String {
    let mut text: String = errors
        .iter()
        .map(|e| format!("# error: {}\n", e.message))
        .collect();
    if let Some(nm) = not_measured {
        text.push_str(&format!("# not measured: {}\n", nm.message));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::result::{Backend, ErrorKind, Phase};

    #[test]
    fn the_title_names_the_nodes_their_gpus_this_rank_and_the_detail() {
        let header = GroupHeader {
            gpus_per_node: 8,
            ..GroupHeader::new(
                "s",
                "g".into(),
                vec!["a".into(), "b".into(), "c".into()],
                2,
                Backend::Sim,
                "2026-11-29T00:00:00Z".into(),
            )
        };
        assert_eq!(
            title("multi-node NCCL sweep", &header, "group g"),
            "# multi-node NCCL sweep  3 nodes x 8 GPUs  rank 2  group g\n"
        );
    }

    #[test]
    fn the_ending_lists_every_error_then_why_not_measured() {
        let error = |message: &str| PhaseError {
            phase: Phase::DdpProbe,
            kind: ErrorKind::Failed,
            message: message.into(),
        };
        assert_eq!(ending(&[], None), "");
        assert_eq!(
            ending(
                &[error("2 nodes: lost"), error("4 nodes: lost")],
                Some(&NotMeasured::own_node("GPU 7 busy".into()))
            ),
            "# error: 2 nodes: lost\n# error: 4 nodes: lost\n# not measured: GPU 7 busy\n"
        );
    }
}
