//! Full results kept in the background. A pass hands the nodes whose pods ended to the
//! keeper and goes on: reading a thousand logs must not hold back the next pass, nor the
//! verdict. Batches run one after another (each with [`KEEP_CONCURRENCY`] reads at once), so
//! the API server sees the same load however busy the run is. A node is claimed when its
//! batch starts and unclaimed if its result could not be kept, so a later pass (or the
//! keeping after the verdict) tries it again.
//!
//! [`KEEP_CONCURRENCY`]: crate::results::store::KEEP_CONCURRENCY

use crate::results;
use gpufabric_api::run::{FabricTestRun, NodeRunResult};
use kube::Client;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::task::JoinHandle;

/// The keeping of every run this process works on, by run uid.
pub struct Keeper {
    runs: Mutex<HashMap<String, RunKeeping>>,
    /// One batch at a time.
    turn: Arc<tokio::sync::Semaphore>,
}

#[derive(Default)]
struct RunKeeping {
    /// Nodes kept, or in a batch under way.
    claimed: HashSet<String>,
    /// Batches under way, with how many nodes each keeps.
    batches: Vec<(JoinHandle<Option<String>>, usize)>,
}

impl Default for Keeper {
    fn default() -> Self {
        Self::new()
    }
}

impl Keeper {
    pub fn new() -> Self {
        Keeper {
            runs: Mutex::default(),
            turn: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    /// Claims and returns the nodes of `entries` that have ended (`ended`: which; None: all),
    /// left a full result and are not claimed yet.
    pub fn claim(
        &self,
        uid: &str,
        entries: &[NodeRunResult],
        ended: Option<&[bool]>,
    ) -> Vec<NodeRunResult> {
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        let run = runs.entry(uid.to_string()).or_default();
        let todo: Vec<NodeRunResult> = entries
            .iter()
            .enumerate()
            .filter(|(i, _)| ended.is_none_or(|e| e.get(*i).copied().unwrap_or(false)))
            .filter(|(_, e)| to_keep(e, Some(&run.claimed)))
            .map(|(_, e)| e.clone())
            .collect();
        run.claimed.extend(todo.iter().map(|e| e.node.clone()));
        todo
    }

    /// How many nodes `claim` would return now.
    pub fn unclaimed(&self, uid: &str, entries: &[NodeRunResult]) -> usize {
        let runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        let claimed = runs.get(uid).map(|r| &r.claimed);
        entries.iter().filter(|e| to_keep(e, claimed)).count()
    }

    /// Nodes in the run's batches that have not ended yet.
    pub fn in_flight(&self, uid: &str) -> usize {
        let runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        runs.get(uid).map_or(0, |r| {
            r.batches
                .iter()
                .filter(|(b, _)| !b.is_finished())
                .map(|(_, n)| n)
                .sum()
        })
    }

    /// Keeps `todo` (claimed) now; what could not be kept is unclaimed. A note when some
    /// could not be kept.
    pub async fn keep(
        &self,
        client: &Client,
        namespace: &str,
        run: &FabricTestRun,
        uid: &str,
        todo: Vec<NodeRunResult>,
    ) -> Option<String> {
        if todo.is_empty() {
            return None;
        }
        let _turn = self.turn.acquire().await.ok();
        let kept = results::store::keep_all(client, namespace, run, &todo).await;
        self.unclaim_failed(uid, &todo, &kept.nodes);
        kept.note
    }

    /// Keeps `todo` (claimed) in the background, after the batches before it.
    pub fn spawn(
        self: &Arc<Self>,
        client: Client,
        namespace: String,
        run: FabricTestRun,
        uid: String,
        todo: Vec<NodeRunResult>,
    ) {
        if todo.is_empty() {
            return;
        }
        let keeper = self.clone();
        let key = uid.clone();
        let count = todo.len();
        let batch = tokio::spawn(async move {
            let note = keeper.keep(&client, &namespace, &run, &uid, todo).await;
            if let Some(n) = &note {
                tracing::warn!(note = %n, "full results not kept yet");
            }
            note
        });
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        let run = runs.entry(key).or_default();
        run.batches.retain(|(b, _)| !b.is_finished());
        run.batches.push((batch, count));
    }

    /// Waits until the run's batches under way have ended.
    pub async fn settle(&self, uid: &str) {
        let batches = {
            let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
            runs.get_mut(uid)
                .map(|r| std::mem::take(&mut r.batches))
                .unwrap_or_default()
        };
        for (b, _) in batches {
            let _ = b.await;
        }
    }

    /// Drops what is known of a run that has ended.
    pub fn forget(&self, uid: &str) {
        self.runs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
    }

    fn unclaim_failed(&self, uid: &str, todo: &[NodeRunResult], kept: &[String]) {
        let kept: HashSet<&str> = kept.iter().map(String::as_str).collect();
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(run) = runs.get_mut(uid) {
            for e in todo.iter().filter(|e| !kept.contains(e.node.as_str())) {
                run.claimed.remove(&e.node);
            }
        }
    }
}

/// Whether `e` left a full result that no batch has claimed yet.
fn to_keep(e: &NodeRunResult, claimed: Option<&HashSet<String>>) -> bool {
    results::store::worth_keeping(e) && !claimed.is_some_and(|c| c.contains(&e.node))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::run::NodeVerdict;

    fn entry(node: &str, verdict: NodeVerdict, pod: bool) -> NodeRunResult {
        NodeRunResult {
            node: node.into(),
            verdict,
            pod: pod.then(|| format!("pod-{node}")),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_is_claimed_once_and_again_only_when_its_keeping_failed() {
        let k = Keeper::new();
        let entries = vec![
            entry("a", NodeVerdict::Passed, true),
            entry("b", NodeVerdict::Failed, true),
            entry("c", NodeVerdict::NotMeasured, true),
            entry("d", NodeVerdict::Passed, false),
            entry("e", NodeVerdict::Passed, true),
        ];
        let ended = [true, true, true, true, false];
        let first: Vec<String> = k
            .claim("u", &entries, Some(&ended))
            .into_iter()
            .map(|e| e.node)
            .collect();
        assert_eq!(first, ["a", "b"], "ended, with a pod and a result");
        assert!(
            k.claim("u", &entries, Some(&ended)).is_empty(),
            "claimed once"
        );
        assert_eq!(k.unclaimed("u", &entries), 1, "e is left");
        // b could not be kept: it is claimed again by the next pass.
        k.unclaim_failed("u", &entries[..2], &["a".to_string()]);
        let again: Vec<String> = k
            .claim("u", &entries, None)
            .into_iter()
            .map(|e| e.node)
            .collect();
        assert_eq!(again, ["b", "e"]);
        assert_eq!(
            k.claim("v", &entries, None).len(),
            3,
            "another run claims its own"
        );
        k.forget("u");
        assert_eq!(k.unclaimed("u", &entries), 3);
    }
}
