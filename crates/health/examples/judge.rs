//! Judges result documents from files, as the operator would at the end of a run: one
//! compact document (a termination message) or full document (`fabric-agent --json`) per
//! node, all compared as one run.
//!
//!     cargo run -p gpufabric-health --example judge -- node-a.json node-b.compact ...

use gpufabric_api::outcome::NotMeasuredReason;
use gpufabric_api::result::{CompactResult, ResultDocument};
use gpufabric_health::{NodeInput, NodeOutcome, evaluate};

fn read(path: &str) -> Result<CompactResult, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    // The full document is what `--json` writes and the last line of stdout; else compact.
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    if let Ok(doc) = ResultDocument::parse(&text).or_else(|_| ResultDocument::parse(last)) {
        return Ok(CompactResult::from(&doc));
    }
    CompactResult::parse(&text).map_err(|e| format!("{path}: {e}"))
}

fn main() {
    let mut inputs = Vec::new();
    for (i, path) in std::env::args().skip(1).enumerate() {
        let outcome = match read(&path) {
            Ok(r) => NodeOutcome::Measured(Box::new(r)),
            Err(reason) => NodeOutcome::not_measured(NotMeasuredReason::AgentBug, reason),
        };
        // Files of one host all carry its name; number them so each is its own node.
        let node = match &outcome {
            NodeOutcome::Measured(r) => format!("{}#{i}", r.node),
            _ => format!("file#{i}"),
        };
        inputs.push(NodeInput {
            baseline: None,
            history: Vec::new(),
            nccl_tuning: Vec::new(),
            node,
            product_label: None,
            expected_gpus: None,
            outcome,
        });
    }
    if inputs.is_empty() {
        eprintln!("usage: judge FILE...  (compact or full result documents)");
        std::process::exit(2);
    }
    let e = evaluate(&inputs, &Default::default());
    for (node, verdict) in &e.verdicts {
        println!("{node}: {verdict:?}");
    }
    for f in &e.findings {
        println!(
            "{:?} {:?} {} [{:?}, {:?}]: {}",
            f.severity, f.kind, f.subject, f.metric, f.source, f.message
        );
    }
}
