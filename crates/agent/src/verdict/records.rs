//! The records `node-check --verdict` keeps in files between checks: the node's trend and
//! its error counters, and how an unreadable one is said.

use super::Judged;
use anyhow::Context;
use gpufabric_api::counters::CounterBaseline;
use gpufabric_api::run::NodeVerdict;
use gpufabric_api::trend::{NodeTrend, TrendPoint};
use gpufabric_health::evaluate::counters::next_baseline;

/// A record kept in a file between checks; None when the file is missing, or unreadable
/// (said on stderr: what it judges is not judged this time, and the file is replaced).
pub(super) fn read_record<T, E: std::fmt::Display>(
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
    let at = gpufabric_api::rfc3339::now();
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
