//! A pod log's last line read within a byte bound, and checked as one JSON object without
//! building it: what a benchmark pod prints can never make the operator hold more than
//! [`MAX_LOG_BYTES`] of it.

use futures::{AsyncRead, AsyncReadExt};
use serde::de::IgnoredAny;

/// Most bytes of a pod log read for its last line: the API server is asked for no more,
/// and no more is read from its answer whatever it sends.
pub const MAX_LOG_BYTES: usize = 1024 * 1024;

/// Why a log's last line is not a document the operator keeps.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Refused {
    #[error(
        "the last line of the log is over the {MAX_LOG_BYTES}-byte bound on a result: not read"
    )]
    TooLong,
    #[error("could not read the log: {0}")]
    Read(String),
}

/// At most `limit` bytes of `log`, read as they come: Err(TooLong) as soon as one more is
/// there (the line was cut by the bound, or the server sent more than asked), without
/// reading further. Holds at most `limit + 1` bytes.
pub async fn read_bounded<R: AsyncRead + Unpin>(log: R, limit: usize) -> Result<Vec<u8>, Refused> {
    let mut buf = Vec::with_capacity(limit.min(64 * 1024) + 1);
    log.take(limit as u64 + 1)
        .read_to_end(&mut buf)
        .await
        .map_err(|e| Refused::Read(e.to_string()))?;
    if buf.len() > limit {
        return Err(Refused::TooLong);
    }
    Ok(buf)
}

/// The full document in a log: its last non-empty line, when that is one JSON object. The
/// line is checked by a parse that builds nothing (every value skipped as it is read), so
/// checking costs no memory beyond the line itself, however its values nest or repeat.
pub fn last_document(log: &str) -> Option<&str> {
    let line = log.lines().rev().find(|l| !l.trim().is_empty())?.trim();
    if !line.starts_with('{') {
        return None;
    }
    serde_json::from_str::<IgnoredAny>(line).ok().map(|_| line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Context, Poll};

    /// A log of `len` bytes of one line, made as it is read (never held), counting what
    /// the reader pulled from it.
    struct Flood {
        left: usize,
        pulled: Arc<AtomicUsize>,
    }

    impl AsyncRead for Flood {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut [u8],
        ) -> Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.left);
            buf[..n].fill(b'7');
            if n > 0 && self.left == n {
                buf[n - 1] = b'\n';
            }
            self.left -= n;
            self.pulled.fetch_add(n, Ordering::Relaxed);
            Poll::Ready(Ok(n))
        }
    }

    const FLOOD: usize = 64 * 1024 * 1024;

    #[tokio::test]
    async fn a_64_mib_log_line_is_refused_after_reading_at_most_the_bound() {
        let pulled = Arc::new(AtomicUsize::new(0));
        let flood = Flood {
            left: FLOOD,
            pulled: pulled.clone(),
        };
        assert_eq!(
            read_bounded(flood, MAX_LOG_BYTES).await,
            Err(Refused::TooLong)
        );
        let read = pulled.load(Ordering::Relaxed);
        assert!(read <= MAX_LOG_BYTES + 1, "read {read} bytes of the flood");
    }

    #[tokio::test]
    async fn sixteen_floods_at_once_hold_at_most_sixteen_bounds() {
        let pulled = Arc::new(AtomicUsize::new(0));
        let reads = (0..16).map(|_| {
            let flood = Flood {
                left: FLOOD,
                pulled: pulled.clone(),
            };
            read_bounded(flood, MAX_LOG_BYTES)
        });
        let all = futures::future::join_all(reads).await;
        assert!(all.iter().all(|r| *r == Err(Refused::TooLong)));
        let read = pulled.load(Ordering::Relaxed);
        assert!(
            read <= 16 * (MAX_LOG_BYTES + 1),
            "read {read} bytes of 16 x 64 MiB"
        );
    }

    #[tokio::test]
    async fn a_log_within_the_bound_is_read_whole() {
        let doc = b"progress\n{\"node\":\"a\"}\n".to_vec();
        let got = read_bounded(&doc[..], MAX_LOG_BYTES).await;
        assert_eq!(got, Ok(doc));
        let exact = [b'x'; 100];
        assert_eq!(
            read_bounded(&exact[..], 100).await.map(|v| v.len()),
            Ok(100)
        );
        assert_eq!(read_bounded(&exact[..], 99).await, Err(Refused::TooLong));
    }

    #[test]
    fn the_document_is_the_last_json_object_line_of_the_log() {
        let log = "table\n  size  busbw\n{\"node\":\"a\",\"gpus\":8}\n\n";
        assert_eq!(last_document(log), Some("{\"node\":\"a\",\"gpus\":8}"));
        assert_eq!(last_document("tables only\n"), None);
        assert_eq!(last_document("{\"cut\": "), None, "a truncated document");
        assert_eq!(last_document(""), None);
        assert_eq!(last_document("[1,2]"), None, "not a document");
        assert_eq!(last_document("{} trailing"), None, "not one object");
    }

    #[test]
    fn a_deeply_nested_document_is_checked_without_overflowing_the_stack() {
        let line = format!("{{\"a\":{}1{}}}", "[".repeat(100_000), "]".repeat(100_000));
        assert_eq!(last_document(&line), Some(line.as_str()));
        let cut = format!("{{\"a\":{}1", "[".repeat(100_000));
        assert_eq!(last_document(&cut), None);
    }
}
