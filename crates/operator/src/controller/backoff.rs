//! Retry of failed reconciles, per object: exponential from [`FIRST`] to [`MAX`], and one
//! Warning Event per change of error rather than one per retry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Wait after the first failure.
pub const FIRST: Duration = Duration::from_secs(5);
/// Longest wait between retries of a persistently failing object.
pub const MAX: Duration = Duration::from_secs(300);

/// The wait before retry number `failures` (1 for the first failure): [`FIRST`] doubled
/// for each failure in a row, at most [`MAX`].
pub fn delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    FIRST.saturating_mul(1 << doublings).min(MAX)
}

/// What to do about one failed reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retry {
    /// Reconcile the object again after this long.
    pub after: Duration,
    /// The error is new for this object (first failure, or a different error than the
    /// last one): worth an Event. A repeat of the same error is only logged and counted.
    pub report: bool,
}

#[derive(Debug)]
struct Failing {
    failures: u32,
    last_error: String,
}

/// Failures in a row per object (`kind/namespace/name`). Cheap to clone (shared state).
#[derive(Clone, Debug, Default)]
pub struct ErrorBackoff {
    failing: Arc<Mutex<HashMap<String, Failing>>>,
}

impl ErrorBackoff {
    /// Records a failed reconcile of `object` with `error` and says when to retry.
    pub fn failed(&self, object: &str, error: &str) -> Retry {
        let mut failing = self.failing.lock().unwrap_or_else(|p| p.into_inner());
        let entry = failing.entry(object.to_string()).or_insert(Failing {
            failures: 0,
            last_error: String::new(),
        });
        entry.failures = entry.failures.saturating_add(1);
        let report = entry.failures == 1 || entry.last_error != error;
        entry.last_error = error.to_string();
        Retry {
            after: delay(entry.failures),
            report,
        }
    }

    /// Records a successful reconcile of `object`: its next failure starts from [`FIRST`]
    /// and is reported again.
    pub fn succeeded(&self, object: &str) {
        self.failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(object);
    }

    /// Failures in a row of `object` (0 when it is not failing).
    pub fn failures(&self, object: &str) -> u32 {
        self.failing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(object)
            .map_or(0, |f| f.failures)
    }
}

/// The key [`ErrorBackoff`] knows an object by.
pub fn object_key<K: kube::Resource<DynamicType = ()>>(obj: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        obj.meta().namespace.as_deref().unwrap_or_default(),
        obj.meta().name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_from_five_seconds_up_to_five_minutes() {
        let secs: Vec<u64> = (1..=9).map(|n| delay(n).as_secs()).collect();
        assert_eq!(secs, vec![5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(delay(u32::MAX), MAX);
        assert_eq!(delay(0), FIRST);
    }

    #[test]
    fn a_persistent_error_is_reported_once_and_backs_off() {
        let b = ErrorBackoff::default();
        let first = b.failed("FabricTest/gpu/a", "forbidden");
        assert_eq!((first.after, first.report), (FIRST, true));
        let second = b.failed("FabricTest/gpu/a", "forbidden");
        assert_eq!((second.after.as_secs(), second.report), (10, false));
        let third = b.failed("FabricTest/gpu/a", "forbidden");
        assert_eq!((third.after.as_secs(), third.report), (20, false));
    }

    #[test]
    fn a_different_error_is_reported_and_keeps_backing_off() {
        let b = ErrorBackoff::default();
        b.failed("k", "forbidden");
        let changed = b.failed("k", "timeout");
        assert_eq!((changed.after.as_secs(), changed.report), (10, true));
    }

    #[test]
    fn success_resets_the_object_and_only_that_object() {
        let b = ErrorBackoff::default();
        b.failed("a", "e");
        b.failed("a", "e");
        b.failed("b", "e");
        b.succeeded("a");
        assert_eq!(b.failures("a"), 0);
        assert_eq!(b.failures("b"), 1);
        let again = b.failed("a", "e");
        assert_eq!((again.after, again.report), (FIRST, true));
    }
}
