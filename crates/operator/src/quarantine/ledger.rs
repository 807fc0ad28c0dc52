//! The quarantine records this process wrote that its node cache may not show yet, read on
//! top of the cache so that the fold counts what the cluster holds without listing every
//! Node.

use super::QuarantineError;
use super::observe::{Holdings, test_key};
use gpufabric_api::keys::ANNOTATION_QUARANTINE;
use gpufabric_api::quarantine::QuarantineRecord;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a write the cache never showed is read on top of it: the cache lags by far
/// less, so after this a difference is a later change by someone else (the cache is right).
pub const LEDGER_TTL: Duration = Duration::from_secs(600);

/// The record annotation each node carried after this process's last patch of it, until
/// the node cache shows that annotation (or [`LEDGER_TTL`] passes).
#[derive(Debug, Default)]
pub struct Ledger {
    written: Mutex<BTreeMap<String, Written>>,
}

#[derive(Clone, Debug)]
struct Written {
    /// The record annotation as the patch left it (None: removed).
    annotation: Option<String>,
    /// The node's resourceVersion after the patch: a cached node at a later one was changed
    /// since (a release by a finalizer or a person), and the cache is believed.
    version: Option<u64>,
    at: Instant,
}

impl Ledger {
    /// Notes the record annotation `node` carries as the API server answered a patch of
    /// ours.
    pub fn wrote(&self, node: &Node) {
        let Some(name) = node.metadata.name.clone() else {
            return;
        };
        let annotation = node.annotations().get(ANNOTATION_QUARANTINE).cloned();
        self.lock().insert(
            name,
            Written {
                annotation,
                version: version_of(node),
                at: Instant::now(),
            },
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Written>> {
        self.written
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Each node's record annotation: the cache's (`cached`), or ours where we wrote one
    /// the cache does not show yet. Writes the cache shows are forgotten; so are those
    /// older than [`LEDGER_TTL`]. A node we wrote that the cache lacks counts as written.
    pub fn annotations<'n>(
        &self,
        cached: impl IntoIterator<Item = &'n Node>,
    ) -> BTreeMap<String, String> {
        let mut written = self.lock();
        written.retain(|_, w| w.at.elapsed() < LEDGER_TTL);
        let mut out = BTreeMap::new();
        for node in cached {
            let Some(name) = node.metadata.name.as_deref() else {
                continue;
            };
            let seen = node.annotations().get(ANNOTATION_QUARANTINE);
            let newer = written
                .get(name)
                .is_some_and(|w| matches!((w.version, version_of(node)), (Some(ours), Some(cached)) if cached > ours));
            let annotation = match written.get(name) {
                Some(w) if newer || w.annotation.as_ref() == seen => {
                    written.remove(name);
                    seen.cloned()
                }
                Some(w) => w.annotation.clone(),
                None => seen.cloned(),
            };
            if let Some(a) = annotation {
                out.insert(name.to_string(), a);
            }
        }
        for (name, w) in written.iter() {
            if let (false, Some(a)) = (out.contains_key(name), &w.annotation) {
                out.entry(name.clone()).or_insert_with(|| a.clone());
            }
        }
        out
    }
}

/// A node's resourceVersion as a number (an etcd revision); None when it is not one, and
/// then only the annotation or the TTL retires a write.
fn version_of(node: &Node) -> Option<u64> {
    node.metadata.resource_version.as_deref()?.parse().ok()
}

/// [`super::holdings`] from the node cache and this process's writes on top of it
/// ([`Ledger::annotations`]), without a request: every record written so far is counted,
/// whoever's test it names. A record someone removed may count until the cache shows it
/// gone (a budget counted high holds a quarantine back, never lets one more through).
pub fn holdings_cached<'n>(
    cached: impl IntoIterator<Item = &'n Node>,
    ledger: &Ledger,
    test: &gpufabric_api::test::FabricTest,
) -> Result<Holdings, QuarantineError> {
    let key = test_key(test)?;
    let mut out = Holdings::default();
    for (name, annotation) in ledger.annotations(cached) {
        match QuarantineRecord::parse(&annotation) {
            Ok(record) if record.is_owned_by(&key) => {
                out.ours.insert(name, record);
            }
            Ok(_) | Err(_) => out.others += 1,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::test::{FabricTest, FabricTestSpec};
    use serde_json::json;

    fn record(test: &str) -> String {
        json!({
            "test": test, "run": "r1", "reason": "slow", "since": "2026-11-25T02:00:00Z",
            "mode": "Cordon", "cordoned": true
        })
        .to_string()
    }

    fn node(name: &str, annotation: Option<String>) -> Node {
        let annotations = annotation
            .map(|a| json!({ ANNOTATION_QUARANTINE: a }))
            .unwrap_or(json!({}));
        serde_json::from_value(json!({
            "metadata": {"name": name, "resourceVersion": "7", "annotations": annotations}
        }))
        .expect("a node")
    }

    fn test() -> FabricTest {
        FabricTest::new("t", FabricTestSpec::default())
    }

    #[test]
    fn a_release_by_someone_else_after_our_cordon_is_believed_from_the_cache() {
        // Our cordon answered at resourceVersion 7; a finalizer's release (not ours) left the
        // node at 9 before any fold read the cache: the cache is newer, the write retires.
        let ledger = Ledger::default();
        ledger.wrote(&node("a", Some(record("t"))));
        let mut released = node("a", None);
        released.metadata.resource_version = Some("9".into());
        assert!(ledger.annotations([&released]).is_empty());
        // A cache still at an older version keeps our write.
        ledger.wrote(&node("a", Some(record("t"))));
        let mut older = node("a", None);
        older.metadata.resource_version = Some("5".into());
        assert_eq!(ledger.annotations([&older]).len(), 1);
    }

    #[test]
    fn a_cordon_the_cache_does_not_show_yet_still_counts() {
        let ledger = Ledger::default();
        // The patch's answer carries our record; the cache still has the node without it.
        ledger.wrote(&node("a", Some(record("t"))));
        ledger.wrote(&node("b", Some(record("other"))));
        let cache = [
            node("a", None),
            node("b", None),
            node("c", Some(record("t"))),
        ];
        let held = holdings_cached(&cache, &ledger, &test()).expect("counted");
        assert_eq!(held.ours.keys().collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(held.others, 1);
    }

    #[test]
    fn a_release_the_cache_does_not_show_yet_no_longer_counts() {
        let ledger = Ledger::default();
        ledger.wrote(&node("a", None));
        let cache = [node("a", Some(record("t")))];
        let held = holdings_cached(&cache, &ledger, &test()).expect("counted");
        assert!(held.ours.is_empty() && held.others == 0, "{held:?}");
    }

    #[test]
    fn a_write_the_cache_shows_is_forgotten_and_the_cache_read_after_it() {
        let ledger = Ledger::default();
        ledger.wrote(&node("a", Some(record("t"))));
        let caught_up = [node("a", Some(record("t")))];
        assert_eq!(
            holdings_cached(&caught_up, &ledger, &test())
                .expect("counted")
                .ours
                .len(),
            1
        );
        // A person removed the record later: the cache is right from now on.
        let removed = [node("a", None)];
        let held = holdings_cached(&removed, &ledger, &test()).expect("counted");
        assert!(held.ours.is_empty(), "{held:?}");
    }

    #[test]
    fn a_node_we_cordoned_that_the_cache_lacks_counts_and_an_unreadable_record_is_nobodys() {
        let ledger = Ledger::default();
        ledger.wrote(&node("new", Some(record("t"))));
        let cache = [node("x", Some("not json".into()))];
        let held = holdings_cached(&cache, &ledger, &test()).expect("counted");
        assert_eq!(held.ours.keys().collect::<Vec<_>>(), ["new"]);
        assert_eq!(held.others, 1);
    }
}
