//! `node-check --verdict`: the node judged by the operator's health rules, on the compact
//! result the operator would read, so the agent can gate a job on its own.

use anyhow::Context;
use clap::Args;
use gpufabric_api::counters::CounterBaseline;
use gpufabric_api::findings::{Finding, Severity};
use gpufabric_api::keys;
use gpufabric_api::policy::Thresholds;
use gpufabric_api::run::NodeVerdict;
use gpufabric_api::trend::{NodeTrend, TrendPoint};
use gpufabric_api::{CompactResult, ResultDocument};
use gpufabric_health::evaluate::counters::next_baseline;
use gpufabric_health::{NodeInput, NodeOutcome, evaluate};
use serde::Serialize;
use std::fmt::Write;
use std::path::PathBuf;

/// Arguments of the verdict: the thresholds the rules apply on top of the built-in profile.
#[derive(Args, Debug, Clone, Default)]
pub struct VerdictArgs {
    /// Judge the node with the operator's health rules (the built-in GPU profile, and the
    /// thresholds of --thresholds and the flags below) and exit 3 with the findings printed
    /// when it fails: for a Slurm prolog, a CI step or an init container.
    #[arg(long)]
    pub verdict: bool,

    /// Thresholds file for --verdict (YAML or JSON, the `thresholds` of a FabricTest);
    /// the flags below override it.
    #[arg(long, value_name = "FILE", requires = "verdict")]
    pub thresholds: Option<PathBuf>,

    /// Floor on the peak all_reduce bus bandwidth (GB/s). Judged only when the sweep reaches
    /// 64 MiB (-e); below that busbw is set by latency, and an Info finding says so.
    #[arg(long, value_name = "GBPS", requires = "verdict")]
    pub min_busbw: Option<f64>,

    /// Ceiling on the fitted all_reduce latency (microseconds). It fails the node only with
    /// -G (CUDA graphs); host-launched small sizes also time the launching CPU, and over the
    /// ceiling they give an Info finding.
    #[arg(long, value_name = "US", requires = "verdict")]
    pub max_latency_us: Option<f64>,

    /// Floor on the one-way copy bandwidth of every GPU pair (GB/s).
    #[arg(long, value_name = "GBPS", requires = "verdict")]
    pub min_pair_gbps: Option<f64>,

    /// Floor on the bidirectional copy bandwidth of every GPU pair (GB/s).
    #[arg(long, value_name = "GBPS", requires = "verdict")]
    pub min_pair_bidir_gbps: Option<f64>,

    /// Floor on host-to-device and device-to-host bandwidth per GPU (GB/s).
    #[arg(long, value_name = "GBPS", requires = "verdict")]
    pub min_host_gbps: Option<f64>,

    /// Floor on DDP scaling efficiency at the largest GPU count (0..1).
    #[arg(long, value_name = "RATIO", requires = "verdict")]
    pub min_ddp_efficiency: Option<f64>,

    /// Ceiling on GPU temperature (degrees Celsius).
    #[arg(long, value_name = "C", requires = "verdict")]
    pub max_temperature_c: Option<f64>,

    /// Ceiling on the growth of one GPU's NVLink error counters since the previous check
    /// recorded in --counters-file; past it the node fails.
    #[arg(long, value_name = "N", requires = "verdict", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_nvlink_error_growth: Option<u64>,

    /// File that keeps the node's error counters between checks: read before the verdict
    /// (their growth since the previous check is judged) and rewritten after it. Created
    /// when missing; an unreadable file is reported and replaced.
    #[arg(long, value_name = "FILE", requires = "verdict")]
    pub counters_file: Option<PathBuf>,

    /// File that keeps the node's key numbers over its checks (all_reduce busbw, worst GPU
    /// pair, slowest host link, DDP step; the record the operator keeps in the node
    /// annotation gpufabric.io/trend): a passing node is judged against its own earlier
    /// checks with the same suite (a drift is a Warning, never a failure), and a passing,
    /// complete check adds its numbers. Created when missing; an unreadable file is
    /// reported and replaced.
    #[arg(long, value_name = "FILE", requires = "verdict")]
    pub trend_file: Option<PathBuf>,

    /// Write the verdict (node, verdict, findings) as JSON to this file, or `-` for stdout
    /// (the tables then go to stderr).
    #[arg(long, value_name = "PATH", requires = "verdict")]
    pub verdict_json: Option<PathBuf>,
}

impl VerdictArgs {
    /// The thresholds: the file (or the defaults), then the flags.
    pub fn thresholds(&self) -> anyhow::Result<Thresholds> {
        let mut t = match &self.thresholds {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading thresholds file {}", path.display()))?;
                serde_yaml::from_str::<Thresholds>(&text).with_context(|| {
                    format!(
                        "thresholds file {} is not valid (the `thresholds` of a FabricTest, YAML or JSON)",
                        path.display()
                    )
                })?
            }
            None => Thresholds::default(),
        };
        let set = |slot: &mut Option<f64>, v: Option<f64>| {
            if v.is_some() {
                *slot = v;
            }
        };
        set(&mut t.nccl_bus_bw_gbps, self.min_busbw);
        set(&mut t.nccl_latency_us, self.max_latency_us);
        set(&mut t.pair_bandwidth_gbps, self.min_pair_gbps);
        set(&mut t.pair_bidir_bandwidth_gbps, self.min_pair_bidir_gbps);
        set(&mut t.host_bandwidth_gbps, self.min_host_gbps);
        set(&mut t.ddp_scaling_efficiency, self.min_ddp_efficiency);
        set(&mut t.max_temperature_c, self.max_temperature_c);
        if self.max_nvlink_error_growth.is_some() {
            t.nvlink_error_growth = self.max_nvlink_error_growth;
        }
        let negative = [
            t.nccl_bus_bw_gbps,
            t.nccl_latency_us,
            t.pair_bandwidth_gbps,
            t.pair_bidir_bandwidth_gbps,
            t.host_bandwidth_gbps,
            t.ddp_scaling_efficiency,
            t.max_temperature_c,
        ]
        .into_iter()
        .flatten()
        .any(|v| !(v.is_finite() && v >= 0.0));
        if negative {
            anyhow::bail!("thresholds must be finite and not negative");
        }
        if t.ddp_scaling_efficiency.is_some_and(|e| e > 1.0) {
            anyhow::bail!("the DDP efficiency floor is a ratio from 0 to 1");
        }
        Ok(t)
    }

    /// The counters of the previous check from --counters-file; None without the flag,
    /// before the first check, or when the file cannot be read (said on stderr: the file is
    /// then replaced after this check).
    pub fn previous_counters(&self) -> Option<CounterBaseline> {
        read_record(
            self.counters_file.as_deref()?,
            "counters",
            "counter growth",
            CounterBaseline::parse,
        )
    }

    /// The node's earlier checks from --trend-file, as [`Self::previous_counters`] reads
    /// its file.
    pub fn previous_trend(&self) -> Option<NodeTrend> {
        read_record(
            self.trend_file.as_deref()?,
            "trend",
            "drift",
            NodeTrend::parse,
        )
    }
}

/// A record kept in a file between checks; None when the file is missing, or unreadable
/// (said on stderr: what it judges is not judged this time, and the file is replaced).
fn read_record<T, E: std::fmt::Display>(
    path: &std::path::Path,
    what: &str,
    judged: &str,
    parse: fn(&str) -> Result<T, E>,
) -> Option<T> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            eprintln!(
                "fabric-agent: cannot read {what} file {}: {e}; {judged} is not judged this time",
                path.display()
            );
            return None;
        }
    };
    match parse(&text) {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!(
                "fabric-agent: {what} file {}: {e}; {judged} is not judged this time and the file is replaced",
                path.display()
            );
            None
        }
    }
}

/// The record --trend-file keeps: the node's checks under this name, per suite.
pub const TREND_TEST: &str = "node-check";

/// Adds this check's numbers to --trend-file when the node passed and every phase ran.
pub fn keep_trend(
    path: &std::path::Path,
    judged: &Judged,
    previous: Option<&NodeTrend>,
    suite: &str,
    window: usize,
) -> anyhow::Result<()> {
    let unmeasured = judged
        .compact
        .errors
        .iter()
        .any(|e| e.kind == gpufabric_api::result::ErrorKind::Unavailable);
    if judged.verdict.verdict != NodeVerdict::Passed || unmeasured {
        return Ok(());
    }
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let before = previous.cloned().unwrap_or_default();
    let after = before.with_point(
        TREND_TEST,
        suite,
        TrendPoint::of(&judged.compact, at),
        window,
    );
    std::fs::write(path, after.to_json() + "\n")
        .with_context(|| format!("writing trend file {}", path.display()))
}

/// Keeps this check's counters in --counters-file for the next check (unless a GPU's
/// counters grew too fast: then the previous record stays, so the next check still sees
/// the growth).
pub fn keep_counters(
    path: &std::path::Path,
    judged: &Judged,
    previous: Option<&CounterBaseline>,
) -> anyhow::Result<()> {
    let at = gpufabric_measure::rfc3339(std::time::SystemTime::now());
    let node = &judged.verdict.node;
    let Some(next) = next_baseline(
        node,
        &judged.compact,
        previous,
        &judged.verdict.findings,
        &format!("node-check on {node}"),
        &at,
    ) else {
        return Ok(());
    };
    std::fs::write(path, next.to_json() + "\n")
        .with_context(|| format!("writing counters file {}", path.display()))
}

/// The node's verdict and the findings behind it.
#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub node: String,
    pub verdict: NodeVerdict,
    pub findings: Vec<Finding>,
}

impl Verdict {
    pub fn failed(&self) -> bool {
        self.verdict != NodeVerdict::Passed
    }

    /// The verdict as lines under the tables.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let critical = self
            .findings
            .iter()
            .filter(|f| f.severity == Severity::Critical)
            .count();
        let word = if self.failed() { "FAILED" } else { "PASSED" };
        let _ = writeln!(
            out,
            "# Verdict: {word} ({critical} critical, {} other finding(s)) by the operator's health rules",
            self.findings.len() - critical
        );
        for f in &self.findings {
            let _ = writeln!(
                out,
                "#  {:<8} {:<18} {}",
                format!("{:?}", f.severity).to_ascii_lowercase(),
                format!("{:?}", f.kind),
                f.message
            );
        }
        out
    }
}

/// A verdict and the compact result it was reached on.
#[derive(Debug, Clone)]
pub struct Judged {
    pub verdict: Verdict,
    pub compact: CompactResult,
}

/// Judges `doc` as the operator would: its compact form (the termination message) through
/// the health rules, with `expected_gpus` as the GPUs the node should have and `previous`
/// the counters of the previous check.
pub fn judge(
    doc: &ResultDocument,
    thresholds: &Thresholds,
    expected_gpus: Option<u32>,
    previous: Option<&CounterBaseline>,
    history: &[TrendPoint],
) -> anyhow::Result<Judged> {
    let compact = CompactResult::parse(&doc.compact_within(keys::TERMINATION_MESSAGE_LIMIT))
        .context("reading back the compact result")?;
    let input = NodeInput {
        baseline: previous.cloned(),
        history: history.to_vec(),
        nccl_tuning: gpufabric_health::evaluate::tuning::tuning_of(
            std::env::vars().map(|(k, _)| k),
        ),
        node: doc.node.clone(),
        product_label: None,
        expected_gpus,
        outcome: NodeOutcome::Measured(Box::new(compact.clone())),
    };
    let evaluation = evaluate(&[input], thresholds);
    let verdict = evaluation
        .verdicts
        .get(&doc.node)
        .copied()
        .unwrap_or(NodeVerdict::Errored);
    Ok(Judged {
        verdict: Verdict {
            node: doc.node.clone(),
            verdict,
            findings: evaluation.findings,
        },
        compact,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_thresholds_file_and_bad_values_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("t.yaml");
        std::fs::write(&file, "ncclBusBwGbps: 300\npairBandwidthGbps: 350\n").expect("write");
        let args = VerdictArgs {
            verdict: true,
            thresholds: Some(file),
            min_busbw: Some(320.0),
            ..Default::default()
        };
        let t = args.thresholds().expect("valid");
        assert_eq!(t.nccl_bus_bw_gbps, Some(320.0));
        assert_eq!(t.pair_bandwidth_gbps, Some(350.0));
        assert_eq!(t.straggler_ratio, Thresholds::default().straggler_ratio);

        let bad = VerdictArgs {
            min_ddp_efficiency: Some(1.5),
            ..Default::default()
        };
        assert!(bad.thresholds().is_err());
        let negative = VerdictArgs {
            min_pair_gbps: Some(-1.0),
            ..Default::default()
        };
        assert!(negative.thresholds().is_err());
    }
}
