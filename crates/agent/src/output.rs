//! Where a result goes: tables and the full document (last line) on stdout, the full
//! document to `--json`, the compact document to the termination message.

use anyhow::Context;
use gpufabric_api::ResultDocument;
use gpufabric_api::keys;
use std::io::Write;
use std::path::{Path, PathBuf};

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
    match termination_target() {
        None => {}
        Some(Termination::Explicit(path)) => {
            if let Err(e) = std::fs::write(&path, text) {
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
    let mut end = text.len() / 2;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Writes the document everywhere it goes. With `garbage`, every copy is truncated (the
/// sim's `garbage` fault: the operator must refuse it).
pub fn emit(doc: &ResultDocument, json: Option<&Path>, garbage: bool) -> anyhow::Result<()> {
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
    if let Some(path) = json {
        std::fs::write(path, pretty.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let text = format!("{}\n{full}\n", crate::tables::render(doc));
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing to stdout")?;
    Ok(())
}
