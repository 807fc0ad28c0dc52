//! `fabric-agent nccl-nodes`: one rank (node) of the multi-node NCCL sweep. The ranks meet
//! over TCP as a node pair's do (rank 0 serves, the others present the run's secret), then
//! run all_reduce, all_gather, reduce_scatter and alltoall over 2, 4, 8, ... of their nodes
//! and all of them, every GPU of each, at every size of the sweep, gather every node's rows,
//! and each writes the same document. The sequence is `gpufabric_measure::nccl_nodes::run`;
//! here are its arguments, the backend chosen for it, the table, the document and the exit
//! code.

use crate::args::{Choice, GroupArgs, RankArgs, invalid, parse_seconds, parse_size};
use crate::backend::{self, Chosen, Measures};
use crate::exit::Exit;
use crate::group_table;
use crate::output::progress;
use clap::Args;
use gpufabric_api::nccl_nodes::NcclNodesResult;
use gpufabric_api::pair::NicPort;
use gpufabric_api::suite::Collective;
use gpufabric_measure::cuda::nccl_nodes::CudaNcclNodes;
use gpufabric_measure::cuda::node_pair::PairSettings;
use gpufabric_measure::fleet::{Fleet, FleetNode};
use gpufabric_measure::nccl_nodes::{self, COLLECTIVES, NcclMeasure, NcclNodesRun, Sweep};
use gpufabric_measure::sim::nccl_nodes::SimNcclNodes;
use std::time::Duration;

/// Arguments of `fabric-agent nccl-nodes`.
#[derive(Args, Debug, Clone)]
pub struct NcclNodesArgs {
    /// The group: backend, nodes, rank, rendezvous.
    #[command(flatten)]
    pub group: GroupArgs,

    /// Node counts to measure, each at least 2 (default 2, 4, 8, ... and all of --nodes).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub node_counts: Option<Vec<u32>>,

    /// Collectives, by nccl-tests' names (all_reduce, all_gather, reduce_scatter,
    /// alltoall).
    #[arg(long, value_delimiter = ',', value_parser = parse_collective, value_name = "LIST",
          default_value = "all_reduce,all_gather,reduce_scatter,alltoall")]
    pub collectives: Vec<Collective>,

    /// Smallest size (nccl-tests' -b): one rank's buffer of all_reduce, the whole buffer of
    /// all_gather's output, reduce_scatter's input and alltoall's.
    #[arg(short = 'b', long, default_value = "1K", value_parser = parse_size, value_name = "SIZE")]
    pub min_bytes: u64,

    /// Largest size (nccl-tests' -e).
    #[arg(short = 'e', long, default_value = "256M", value_parser = parse_size, value_name = "SIZE")]
    pub max_bytes: u64,

    /// Each size is this many times the last (nccl-tests' -f).
    #[arg(short = 'f', long, default_value_t = 2, value_name = "N")]
    pub step_factor: u64,

    /// Sizes from this one up are the large ones whose busbw each node count's summary
    /// averages.
    #[arg(long, default_value = "64M", value_parser = parse_size, value_name = "SIZE")]
    pub large_bytes: u64,

    /// Untimed iterations of each collective at each size (nccl-tests' -w).
    #[arg(short = 'w', long, default_value_t = 5, value_name = "N")]
    pub warmup: u32,

    /// Timed iterations of each collective at each size (nccl-tests' -n).
    #[arg(short = 'n', long, default_value_t = 20, value_name = "N")]
    pub iters: u32,

    /// Watchdog of each collective's timed loop (cuda backend): a hung collective is
    /// aborted and the node count fails; one node count may take twice this on one node.
    #[arg(long, default_value = "120", value_parser = parse_seconds, value_name = "SECS")]
    pub timeout: Duration,

    /// This node, the sim fleet, the document file.
    #[command(flatten)]
    pub me: RankArgs,
}

fn parse_collective(s: &str) -> Result<Collective, String> {
    COLLECTIVES
        .into_iter()
        .find(|c| c.nccl_tests_name() == s || c.api_name() == s)
        .ok_or_else(|| {
            format!("{s:?} is not one of all_reduce, all_gather, reduce_scatter, alltoall")
        })
}

impl NcclNodesArgs {
    fn check(&self) -> anyhow::Result<()> {
        self.group.check(&self.me, 2)?;
        if self
            .node_counts
            .as_ref()
            .is_some_and(|c| c.iter().any(|k| *k < 2))
        {
            return Err(invalid(
                "--node-counts must be at least 2 (one node is node-check's sweep)".into(),
            ));
        }
        if self.iters == 0 || self.min_bytes == 0 || self.min_bytes > self.max_bytes {
            return Err(invalid(
                "--iters must be at least 1 and --min-bytes between 1 and --max-bytes".into(),
            ));
        }
        if self.step_factor < 2 {
            return Err(invalid("--step-factor must be at least 2".into()));
        }
        Ok(())
    }

    fn sweep(&self) -> Sweep {
        Sweep {
            collectives: self.collectives.clone(),
            sizes: nccl_nodes::sizes(self.min_bytes, self.max_bytes, self.step_factor),
            iters: (self.warmup, self.iters),
        }
    }
}

/// Runs one rank; returns the exit code.
pub fn run(args: NcclNodesArgs) -> anyhow::Result<i32> {
    args.check()?;
    let sweep = NcclNodesRun {
        config: args.group.config()?,
        sweep: args.sweep(),
        large_bytes: args.large_bytes,
        node_counts: args.node_counts.clone(),
        timeout: args.timeout,
        shared_gpus: args.me.shared_gpus,
    };
    let me = args.group.check(&args.me, 1)?;
    let mut m = match backend::choose(&args, me)? {
        Chosen::Measure { backend, .. } => backend,
        Chosen::Crashed(code) => return Ok(code),
    };
    let mut end = nccl_nodes::run(m.as_mut(), &sweep, &progress)?;
    set_links(&mut end.doc, &end.ports);
    crate::output::emit_rank(
        &end.doc,
        Some(&end.doc.termination_text()),
        args.me.json.as_deref(),
        table(&end.doc),
    )?;
    if let Some(e) = &end.unmet {
        return Ok(GroupArgs::unmet_exit("multi-node NCCL sweep", e));
    }
    Ok(exit(&end.doc).code())
}

/// Each point's links (`gpufabric_health::links::bound` over its nodes' ports, by rank),
/// when the ranks exchanged their ports.
fn set_links(doc: &mut NcclNodesResult, ports: &[Option<Vec<NicPort>>]) {
    if ports.is_empty() {
        return;
    }
    let nodes: Vec<(&str, Option<&[NicPort]>)> = doc
        .header
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), ports.get(i).and_then(|p| p.as_deref())))
        .collect();
    for p in &mut doc.points {
        p.links = nodes
            .get(..p.nodes as usize)
            .and_then(gpufabric_health::links::bound);
    }
}

/// The exit code of a document: not measured, wrong values, a node count that failed, or
/// success.
fn exit(doc: &NcclNodesResult) -> Exit {
    if let Some(nm) = &doc.not_measured {
        eprintln!(
            "fabric-agent: multi-node NCCL sweep not measured: {}",
            nm.message
        );
        return Exit::NotMeasured;
    }
    let wrong = doc.wrong();
    if wrong > 0 {
        eprintln!("fabric-agent: {wrong} wrong value(s) in the sweep's collectives (#wrong)");
        return Exit::WrongValues;
    }
    for e in &doc.errors {
        eprintln!("fabric-agent: multi-node NCCL sweep failed: {}", e.message);
    }
    if doc.errors.is_empty() {
        Exit::Success
    } else {
        Exit::CheckFailed
    }
}

impl Measures for NcclNodesArgs {
    type Backend = dyn NcclMeasure;
    const NAME: &'static str = "nccl-nodes";
    const NODES_FLAG: &'static str = "--nodes";

    fn choice(&self) -> Choice<'_> {
        self.me.choice(self.group.backend, &self.group.nodes)
    }

    /// This node's GPUs in this process, one thread of NCCL calls over all of them.
    fn cuda(&self) -> anyhow::Result<Box<dyn NcclMeasure>> {
        Ok(Box::new(CudaNcclNodes::new(
            self.group.rank,
            PairSettings {
                iters: (self.warmup, self.iters),
                timeout: self.timeout,
            },
        )))
    }

    fn sim(
        &self,
        fleet: Fleet,
        _node: FleetNode,
        seed: u64,
    ) -> anyhow::Result<Box<dyn NcclMeasure>> {
        let nodes = self.group.fleet_nodes(&fleet);
        Ok(Box::new(SimNcclNodes {
            nodes,
            rank: self.group.rank,
            seed,
        }))
    }
}

/// The table on stdout: per node count, nccl-tests' rows of each collective (size, count
/// of f32 elements, time, algbw, busbw, wrong values), then a summary of every count.
fn table(doc: &NcclNodesResult) -> String {
    let mut text = group_table::title(
        "multi-node NCCL sweep",
        &doc.header,
        &format!("group {}", doc.header.group),
    );
    for p in &doc.points {
        text.push_str(&format!(
            "#\n# {} nodes, {} ranks: {}\n",
            p.nodes,
            p.ranks,
            p.node_names.join(" ")
        ));
        text.push_str("#  collective              size         count     time(us)  algbw(GB/s)  busbw(GB/s)  #wrong\n");
        for r in &p.rows {
            text.push_str(&format!(
                "  {:<16} {:>12} {:>13} {:>12.1} {:>12.2} {:>12.2} {:>7}\n",
                r.collective.nccl_tests_name(),
                r.bytes,
                r.bytes / 4,
                r.time_us,
                r.algbw,
                r.busbw,
                r.wrong
            ));
        }
    }
    if !doc.points.is_empty() {
        let small = doc.sizes.first().copied().unwrap_or(0);
        text.push_str(&format!(
            "#\n# summary: busbw averaged over sizes >= {} bytes, time at {} bytes\n",
            doc.large_bytes, small
        ));
        text.push_str(
            "#  nodes  ranks  collective        busbw(GB/s)  small time(us)  links' ceiling(GB/s)\n",
        );
        for p in &doc.points {
            let gbps = p.links.as_ref().and_then(|l| l.gbps);
            for s in &p.summary {
                let ceiling = gbps
                    .and_then(|g| {
                        gpufabric_health::links::ceiling(
                            s.collective,
                            p.nodes,
                            doc.header.gpus_per_node,
                            g,
                        )
                    })
                    .map(|c| format!("{c:.2}"))
                    .unwrap_or_else(|| "-".into());
                text.push_str(&format!(
                    "  {:>5} {:>6}  {:<16} {:>12.2} {:>15.1} {:>21}\n",
                    p.nodes,
                    p.ranks,
                    s.collective.nccl_tests_name(),
                    s.large_busbw,
                    s.small_time_us,
                    ceiling
                ));
            }
            if let Some(l) = &p.links {
                text.push_str(&format!(
                    "#  {} nodes: links bounded by {}\n",
                    p.nodes,
                    l.describe()
                ));
            }
        }
    }
    text.push_str(&group_table::ending(&doc.errors, doc.not_measured.as_ref()));
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::group::GroupHeader;
    use gpufabric_api::nccl_nodes::{NCCL_NODES_SCHEMA, NcclNodesPoint, NcclNodesSummary};
    use gpufabric_api::pair::PairCollective;
    use gpufabric_api::result::Backend;

    fn doc() -> NcclNodesResult {
        let rows = vec![
            PairCollective {
                collective: Collective::AllGather,
                bytes: 1024,
                time_us: 41.25,
                algbw: 0.02,
                busbw: 0.02,
                wrong: 0,
            },
            PairCollective {
                collective: Collective::AllGather,
                bytes: 256 << 20,
                time_us: 812.5,
                algbw: 330.38,
                busbw: 309.73,
                wrong: 3,
            },
        ];
        NcclNodesResult {
            header: GroupHeader {
                duration_s: 1.0,
                gpus_per_node: 8,
                ..GroupHeader::new(
                    NCCL_NODES_SCHEMA,
                    "g".into(),
                    vec!["a".into(), "b".into()],
                    1,
                    Backend::Sim,
                    "2026-11-29T00:00:00Z".into(),
                )
            },
            sizes: vec![1024, 256 << 20],
            large_bytes: 64 << 20,
            points: vec![NcclNodesPoint {
                nodes: 2,
                node_names: vec!["a".into(), "b".into()],
                ranks: 16,
                summary: vec![
                    NcclNodesSummary::of(Collective::AllGather, &rows, 64 << 20).expect("summary"),
                ],
                links: None,
                rows,
            }],
            not_measured: None,
            errors: Vec::new(),
        }
    }

    #[test]
    fn the_table_has_nccl_tests_columns_per_row_and_a_summary_per_count() {
        let text = table(&doc());
        let row = text
            .lines()
            .find(|l| l.trim_start().starts_with("all_gather") && l.contains("268435456"))
            .expect("the large row");
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cols,
            [
                "all_gather",
                "268435456",
                "67108864",
                "812.5",
                "330.38",
                "309.73",
                "3"
            ]
        );
        assert!(text.contains("# 2 nodes, 16 ranks: a b"), "{text}");
        let summary = text
            .lines()
            .skip_while(|l| !l.starts_with("# summary"))
            .nth(2)
            .expect("a summary row");
        assert_eq!(
            summary.split_whitespace().collect::<Vec<_>>(),
            ["2", "16", "all_gather", "309.73", "41.2", "-"]
        );
    }

    fn ports(up: u32) -> Vec<NicPort> {
        (0..8)
            .map(|i| NicPort {
                device: format!("mlx5_{i}"),
                port: 1,
                link_layer: Some("InfiniBand".into()),
                state: if i < up { "ACTIVE" } else { "DOWN" }.into(),
                phys_state: if i < up { "LinkUp" } else { "Polling" }.into(),
                rate_gbps: Some(400.0),
                errors: Default::default(),
            })
            .collect()
    }

    #[test]
    fn each_point_is_bounded_by_its_slowest_nodes_links_and_the_table_shows_the_ceiling() {
        let mut d = doc();
        set_links(&mut d, &[Some(ports(8)), Some(ports(6))]);
        let links = d.points[0].links.as_ref().expect("links");
        assert_eq!((links.node.as_str(), links.gbps), ("b", Some(300.0)));
        let text = table(&d);
        let summary = text
            .lines()
            .skip_while(|l| !l.starts_with("# summary"))
            .nth(2)
            .expect("a summary row");
        assert_eq!(summary.split_whitespace().last(), Some("300.00"), "{text}");
        assert!(
            text.contains("#  2 nodes: links bounded by b (6 rails, 300.0 GB/s)"),
            "{text}"
        );
        // Ranks that never exchanged their ports leave the points as they were.
        let mut d = doc();
        set_links(&mut d, &[]);
        assert_eq!(d.points[0].links, None);
    }

    #[test]
    fn wrong_values_outrank_a_failed_count_and_not_measured_outranks_both() {
        let mut d = doc();
        assert_eq!(exit(&d), Exit::WrongValues);
        d.points[0].summary[0].wrong = 0;
        assert_eq!(exit(&d), Exit::Success);
        d.errors.push(gpufabric_api::result::PhaseError {
            phase: gpufabric_api::result::Phase::NcclSweep,
            kind: gpufabric_api::result::ErrorKind::Failed,
            message: "4 node(s): c: NCCL said no".into(),
        });
        assert_eq!(exit(&d), Exit::CheckFailed);
        d.not_measured = Some(gpufabric_api::pair::NotMeasured::own_node("busy".into()));
        assert_eq!(exit(&d), Exit::NotMeasured);
    }
}
