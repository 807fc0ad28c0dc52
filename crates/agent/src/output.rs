//! Where a result goes: tables and the full document (last line) on stdout, the full
//! document to `--json`, the compact document to the termination message.

use crate::verdict::Verdict;
use anyhow::Context;
use gpufabric_api::ResultDocument;
use gpufabric_api::keys;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// What the termination message holds now.
pub(crate) enum Message {
    /// Nothing yet.
    Empty,
    /// The latest progress line (its first line).
    Progress(String),
    /// The result or the reason the agent ended: nothing may replace it.
    Final,
}

/// The termination message's state; held while the message is written, so that a stop
/// and a progress line or a result never interleave.
static MESSAGE: Mutex<Message> = Mutex::new(Message::Empty);

fn message() -> MutexGuard<'static, Message> {
    MESSAGE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where the termination message goes: `$FABRIC_TERMINATION_LOG` when set (an error to
/// write it is reported), else `/dev/termination-log` when it exists and is writable
/// (Kubernetes creates it in every container; elsewhere it is quietly skipped).
enum Termination {
    Explicit(PathBuf),
    Default(PathBuf),
}

fn termination_target() -> Option<Termination> {
    match std::env::var_os(keys::ENV_TERMINATION_LOG) {
        Some(p) if !p.is_empty() => Some(Termination::Explicit(PathBuf::from(p))),
        _ => {
            let p = Path::new(keys::DEFAULT_TERMINATION_LOG);
            p.exists().then(|| Termination::Default(p.to_path_buf()))
        }
    }
}

pub(crate) fn write_termination(text: &str) {
    let mut state = message();
    write_termination_message(text, true);
    *state = Message::Final;
}

/// A progress line: on stderr, and kept as the termination message (see
/// [`write_progress`]).
pub(crate) fn progress(line: &str) {
    eprintln!("[fabric-agent] {line}");
    write_progress(line);
}

/// Keeps `line` as the termination message, behind [`keys::PROGRESS_PREFIX`], until the
/// result replaces it: an agent killed at its deadline then still says where it was. Quiet
/// when the message cannot be written (the result write says so).
pub(crate) fn write_progress(line: &str) {
    let first = line.lines().next().unwrap_or_default();
    let mut text = format!("{}{first}", keys::PROGRESS_PREFIX);
    cut_to_limit(&mut text);
    let mut state = message();
    if matches!(*state, Message::Final) {
        return;
    }
    write_termination_message(&text, false);
    *state = Message::Progress(first.to_string());
}

/// Says on stderr and in the termination message that the agent was stopped (SIGTERM),
/// and in which phase, in words ([`gpufabric_measure::activity`]: `NCCL sweep: all_gather,
/// 32 MiB`): the phase is the message's first line, behind the progress prefix, so that
/// whoever reads the message's first line reads the phase; the stop follows on a second
/// line with the last progress line the agent printed. A result already written is left as
/// it is. Returns holding the message, so that nothing replaces it before the process ends.
pub(crate) fn write_stopped(signal: &str) -> MutexGuard<'static, Message> {
    let state = message();
    let phase = gpufabric_measure::activity::current();
    if matches!(*state, Message::Final) {
        eprintln!("fabric-agent: stopped by {signal} after writing its result");
        return state;
    }
    let last = match &*state {
        Message::Progress(line) => Some(line.as_str()),
        _ => None,
    };
    let text = stopped_text(signal, phase.as_deref(), last);
    eprintln!("{}", text.lines().last().unwrap_or_default());
    write_termination_message(&text, true);
    state
}

/// The termination message of a stopped agent: the phase (or, before any phase was named,
/// the last progress line) first, then the stop in a sentence.
fn stopped_text(signal: &str, phase: Option<&str>, last: Option<&str>) -> String {
    let said = match (phase, last) {
        (Some(p), Some(l)) if l.trim() != p => {
            format!(
                "in phase \"{p}\" (its last progress line: \"{}\")",
                l.trim()
            )
        }
        (Some(p), _) => format!("in phase \"{p}\""),
        (None, Some(l)) => format!("after the progress line \"{}\"", l.trim()),
        (None, None) => "before its first phase".to_string(),
    };
    let stop = format!("fabric-agent: stopped by {signal} {said}");
    let mut text = match phase.or(last) {
        Some(first) => format!("{}{}\n{stop}", keys::PROGRESS_PREFIX, first.trim()),
        None => stop,
    };
    cut_to_limit(&mut text);
    text
}

/// Cuts `text` to Kubernetes' limit on a termination message, on a character boundary.
fn cut_to_limit(text: &mut String) {
    let end = gpufabric_api::text::prefix(text, keys::TERMINATION_MESSAGE_LIMIT).len();
    text.truncate(end);
}

fn write_termination_message(text: &str, warn: bool) {
    match termination_target() {
        None => {}
        Some(Termination::Explicit(path)) => {
            if let Err(e) = std::fs::write(&path, text)
                && warn
            {
                eprintln!(
                    "fabric-agent: warning: could not write the termination message to {}: {e}",
                    path.display()
                );
            }
        }
        Some(Termination::Default(path)) => {
            // Open without creating: only an existing, writable file is used.
            let written = std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&path)
                .and_then(|mut f| f.write_all(text.as_bytes()));
            if let Err(e) = written {
                tracing::debug!(path = %path.display(), error = %e, "termination log not writable; skipped");
            }
        }
    }
}

/// The first half of a text: what a writer killed mid-write leaves behind (never valid JSON
/// for an object).
fn truncated(text: &str) -> String {
    gpufabric_api::text::prefix(text, text.len() / 2).to_string()
}

/// Where the full document and the verdict go besides the termination message.
pub struct Outputs {
    /// The full document, pretty: a file, or stdout alone.
    json: Option<Target>,
    /// The verdict: a file, or stdout alone.
    verdict_json: Option<Target>,
}

enum Target {
    File(PathBuf),
    Stdout,
}

fn target(path: Option<&Path>) -> Option<Target> {
    path.map(|p| {
        if p == Path::new("-") {
            Target::Stdout
        } else {
            Target::File(p.to_path_buf())
        }
    })
}

impl Outputs {
    /// At most one JSON document may take stdout.
    pub fn new(json: Option<&Path>, verdict_json: Option<&Path>) -> anyhow::Result<Outputs> {
        let o = Outputs {
            json: target(json),
            verdict_json: target(verdict_json),
        };
        if matches!(o.json, Some(Target::Stdout)) && matches!(o.verdict_json, Some(Target::Stdout))
        {
            anyhow::bail!(
                "--json - and --verdict-json - both want stdout; send one of them to a file"
            );
        }
        Ok(o)
    }

    fn stdout_is_json(&self) -> bool {
        matches!(self.json, Some(Target::Stdout))
            || matches!(self.verdict_json, Some(Target::Stdout))
    }
}

fn write_to(target: &Target, text: &str) -> anyhow::Result<()> {
    match target {
        Target::File(path) => std::fs::write(path, text.as_bytes())
            .with_context(|| format!("writing {}", path.display())),
        Target::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .and_then(|()| out.write_all(b"\n"))
                .and_then(|()| out.flush())
                .context("writing to stdout")
        }
    }
}

/// Writes the document everywhere it goes: the compact form to the termination message,
/// the tables (and the verdict) with the full document on the last line to stdout, unless
/// stdout carries one JSON document alone, the tables then on stderr. With `garbage`,
/// every copy of the document is truncated (the sim's `garbage` fault: the operator must
/// refuse it).
pub fn emit(
    doc: &ResultDocument,
    verdict: Option<&Verdict>,
    outputs: &Outputs,
    garbage: bool,
) -> anyhow::Result<()> {
    let mut full = serde_json::to_string(doc).context("serialising the result document")?;
    let mut compact = doc.compact_within(keys::TERMINATION_MESSAGE_LIMIT);
    let mut pretty =
        serde_json::to_string_pretty(doc).context("serialising the result document")?;
    if garbage {
        full = truncated(&full);
        compact = truncated(&compact);
        pretty = truncated(&pretty);
    }
    write_termination(&compact);
    let mut tables = crate::tables::render(doc);
    if let Some(v) = verdict {
        tables.push('\n');
        tables.push_str(&v.render());
    }
    if outputs.stdout_is_json() {
        eprint!("{tables}");
    } else {
        let text = format!("{tables}\n{full}\n");
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .context("writing to stdout")?;
    }
    if let Some(t) = &outputs.json {
        write_to(t, &pretty)?;
    }
    if let (Some(t), Some(v)) = (&outputs.verdict_json, verdict) {
        let text = serde_json::to_string_pretty(v).context("serialising the verdict")?;
        write_to(t, &text)?;
    }
    Ok(())
}

/// A rank's document (node-pair, ddp-nodes): `termination` (or the document's line) to the
/// termination message, the document pretty to `json`, then `table` and the document as
/// the last line on stdout.
pub fn emit_rank<T: serde::Serialize>(
    doc: &T,
    termination: Option<&str>,
    json: Option<&Path>,
    table: String,
) -> anyhow::Result<()> {
    let line = serde_json::to_string(doc).context("serialising the document")?;
    write_termination(termination.unwrap_or(&line));
    if let Some(path) = json {
        let pretty = serde_json::to_string_pretty(doc).context("serialising the document")?;
        std::fs::write(path, pretty).with_context(|| format!("writing {}", path.display()))?;
    }
    let text = format!("{table}{line}\n");
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing to stdout")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_names_the_phase_in_words_before_the_last_table_row() {
        let text = stopped_text(
            "SIGTERM",
            Some("NCCL sweep: all_gather, 32 MiB"),
            Some("    all_gather  33554432  108.56 us"),
        );
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some("fabric-agent progress: NCCL sweep: all_gather, 32 MiB")
        );
        assert_eq!(
            lines.next(),
            Some(
                "fabric-agent: stopped by SIGTERM in phase \"NCCL sweep: all_gather, 32 MiB\" (its last progress line: \"all_gather  33554432  108.56 us\")"
            )
        );
    }

    #[test]
    fn a_stop_before_any_phase_says_so() {
        assert_eq!(
            stopped_text("SIGTERM", None, None),
            "fabric-agent: stopped by SIGTERM before its first phase"
        );
        let text = stopped_text("SIGTERM", None, Some("1 GPU(s): NVIDIA H200"));
        assert!(text.starts_with("fabric-agent progress: 1 GPU(s): NVIDIA H200\n"));
        assert!(text.ends_with("after the progress line \"1 GPU(s): NVIDIA H200\""));
    }

    #[test]
    fn a_stop_message_stays_within_the_termination_limit() {
        let long = "x".repeat(10_000);
        let text = stopped_text("SIGTERM", Some(&long), Some("row"));
        assert!(text.len() <= keys::TERMINATION_MESSAGE_LIMIT);
    }
}
