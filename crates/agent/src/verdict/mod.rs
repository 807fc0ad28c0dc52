//! `node-check --verdict`: the node judged by the operator's health rules, on the compact
//! result the operator would read, so the agent can gate a job on its own.

use anyhow::Context;
use clap::Args;
use gpufabric_api::baseline::FleetBaseline;
use gpufabric_api::counters::CounterBaseline;
use gpufabric_api::findings::{Finding, Severity};
use gpufabric_api::keys;
use gpufabric_api::policy::Thresholds;
use gpufabric_api::result::{ErrorKind, Phase};
use gpufabric_api::run::NodeVerdict;
use gpufabric_api::suite::Collective;
use gpufabric_api::trend::{NodeTrend, TrendPoint};
use gpufabric_api::{CompactResult, ResultDocument};
use gpufabric_health::{NodeInput, NodeOutcome};
use serde::Serialize;
use std::fmt::Write;
use std::path::PathBuf;

mod records;
use records::read_record;
pub use records::{TREND_TEST, keep_counters, keep_trend};

/// Arguments of the verdict: the thresholds the rules apply on top of the built-in profile.
#[derive(Args, Debug, Clone, Default)]
pub struct VerdictArgs {
    /// Judge the node with the operator's health rules (the built-in GPU profile, and the
    /// thresholds of --thresholds and the flags below) and exit 3 with the findings printed
    /// when it fails, 5 when nothing failed it but a phase asked for could not run (NCCL
    /// refused the test's settings, a library is missing; the phases are named), 0 only when
    /// it passed measured in full: for a Slurm prolog, a CI step or an init container.
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

    /// Judge against this baseline (`kubectl gpufabric baseline export TEST --file FILE`):
    /// what the test's passing nodes of the same GPU product, suite and spec NCCL settings
    /// measured. Alone, this node has no peers: far below the baseline fails it. A file
    /// without this node's product, suite and settings judges nothing, and an Info says so.
    #[arg(long, value_name = "FILE", requires = "verdict")]
    pub baseline: Option<PathBuf>,

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

    /// The baseline of --baseline; an error when the file cannot be read (a gate that asked
    /// for a baseline is never judged without it unawares).
    pub fn fleet_baseline(&self) -> anyhow::Result<Option<FleetBaseline>> {
        let Some(path) = self.baseline.as_deref() else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading baseline file {}", path.display()))?;
        FleetBaseline::parse(&text).map(Some).with_context(|| {
            format!(
                "baseline file {} is not a baseline `kubectl gpufabric baseline export` wrote",
                path.display()
            )
        })
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

/// The node's verdict and the findings behind it.
#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    pub node: String,
    /// `NotMeasured` where nothing failed the node but a phase it was asked for could not run.
    pub verdict: NodeVerdict,
    pub findings: Vec<Finding>,
    /// The phases asked for that could not run, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_run: Vec<NotRun>,
}

/// A phase of the check that could not run here (an `unavailable` phase error): NCCL refused
/// the test's settings, a library is missing, other work took the GPUs' memory. The node is
/// then not measured on it, and a gate must not take that for a pass.
#[derive(Serialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NotRun {
    pub phase: Phase,
    /// The collectives of the sweep asked for that did not run (the NCCL sweep only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub collectives: Vec<Collective>,
    /// How many collectives the sweep was asked for.
    #[serde(skip_serializing_if = "is_zero")]
    pub collectives_asked: usize,
    /// Why, as the phase said it (each distinct reason once).
    pub reasons: Vec<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl NotRun {
    /// The phases of `doc` that could not run; `asked` the collectives the sweep was asked for.
    pub fn of(doc: &ResultDocument, asked: &[Collective]) -> Vec<NotRun> {
        let mut out: Vec<NotRun> = Vec::new();
        for e in doc
            .errors
            .iter()
            .filter(|e| e.kind == ErrorKind::Unavailable)
        {
            let at = match out.iter().position(|n| n.phase == e.phase) {
                Some(i) => i,
                None => {
                    out.push(NotRun {
                        phase: e.phase,
                        collectives: Vec::new(),
                        collectives_asked: 0,
                        reasons: Vec::new(),
                    });
                    out.len() - 1
                }
            };
            if let Some(n) = out.get_mut(at)
                && !n.reasons.contains(&e.message)
            {
                n.reasons.push(e.message.clone());
            }
        }
        let ran: Vec<Collective> = doc
            .nccl
            .as_ref()
            .map(|n| n.collectives.iter().map(|c| c.collective).collect())
            .unwrap_or_default();
        if let Some(n) = out.iter_mut().find(|n| n.phase == Phase::NcclSweep) {
            n.collectives = asked.iter().filter(|c| !ran.contains(c)).copied().collect();
            n.collectives_asked = asked.len();
        }
        out
    }

    /// One line: the phase, the collectives that did not run of those asked, and why.
    fn line(&self) -> String {
        let what = if self.collectives.is_empty() {
            String::new()
        } else {
            let names: Vec<&str> = self
                .collectives
                .iter()
                .map(|c| c.nccl_tests_name())
                .collect();
            format!(
                " ({} of {} collectives not run: {})",
                self.collectives.len(),
                self.collectives_asked,
                names.join(", ")
            )
        };
        format!(
            "{} could not run{what}: {}",
            self.phase.api_name(),
            self.reasons.join("; ")
        )
    }
}

impl Verdict {
    /// The verdict as lines under the tables.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let critical = self
            .findings
            .iter()
            .filter(|f| f.severity == Severity::Critical)
            .count();
        let word = match self.verdict {
            NodeVerdict::Passed => "PASSED",
            NodeVerdict::NotMeasured => "NOT MEASURED",
            _ => "FAILED",
        };
        let _ = writeln!(
            out,
            "# Verdict: {word} ({critical} critical, {} other finding(s)) by the operator's health rules",
            self.findings.len() - critical
        );
        for n in &self.not_run {
            let _ = writeln!(out, "#  not run  {}", n.line());
        }
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

/// The fingerprint of the NCCL tuning settings the spec chose, as the operator makes it of
/// a test's `agent.env` ([`gpufabric_api::baseline::settings_fingerprint`]).
fn spec_settings(doc: &ResultDocument) -> String {
    gpufabric_api::baseline::settings_fingerprint(
        doc.nccl_settings
            .iter()
            .filter(|s| s.source.chosen())
            .filter(|s| gpufabric_health::evaluate::tuning::NCCL_TUNING.contains(&s.name.as_str()))
            .map(|s| (s.name.as_str(), Some(s.value.as_str()))),
    )
}

/// Judges `doc` as the operator would: its compact form (the termination message) through
/// the health rules, with `expected_gpus` as the GPUs the node should have, `previous`
/// the counters of the previous check and `asked` the collectives the sweep was asked for.
/// The NCCL settings the document reports from the spec spare the node as the operator's
/// would; every other setting in effect is judged as one the test did not choose.
pub fn judge(
    doc: &ResultDocument,
    asked: &[Collective],
    thresholds: &Thresholds,
    expected_gpus: Option<u32>,
    previous: Option<&CounterBaseline>,
    history: &[TrendPoint],
    baseline: Option<(&FleetBaseline, &str)>,
) -> anyhow::Result<Judged> {
    let compact = CompactResult::parse(&doc.compact_within(keys::TERMINATION_MESSAGE_LIMIT))
        .context("reading back the compact result")?;
    let input = NodeInput {
        baseline: previous.cloned(),
        history: history.to_vec(),
        // Only the spec's settings are the test's own; the others reach the rules in the
        // compact result, with their sources.
        nccl_tuning: gpufabric_health::evaluate::tuning::tuning_of(
            doc.nccl_settings
                .iter()
                .filter(|s| s.source.chosen())
                .map(|s| s.name.as_str()),
        ),
        node: doc.node.clone(),
        product_label: None,
        expected_gpus,
        outcome: NodeOutcome::Measured(Box::new(compact.clone())),
    };
    let settings = spec_settings(doc);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let against = baseline.map(|(b, suite)| gpufabric_health::evaluate::Against {
        baseline: b,
        suite,
        settings: &settings,
        now,
    });
    let evaluation =
        gpufabric_health::evaluate::evaluate_against(&[input], thresholds, against.as_ref());
    let judged = evaluation
        .verdicts
        .get(&doc.node)
        .copied()
        .unwrap_or(NodeVerdict::Errored);
    let not_run = NotRun::of(doc, asked);
    Ok(Judged {
        verdict: Verdict {
            node: doc.node.clone(),
            verdict: standalone(judged, &not_run),
            findings: evaluation.findings,
            not_run,
        },
        compact,
    })
}

/// The verdict of a node judged alone: what the rules said, except that a node nothing failed
/// is not measured, never passed, when a phase it was asked for could not run (in a run the
/// operator sees every node and says so once for the test).
fn standalone(judged: NodeVerdict, not_run: &[NotRun]) -> NodeVerdict {
    if judged == NodeVerdict::Passed && !not_run.is_empty() {
        NodeVerdict::NotMeasured
    } else {
        judged
    }
}

#[cfg(test)]
mod tests;
