//! Every node's result of a run lives in the run's FabricTestRunShards (at most
//! [`NODES_PER_SHARD`] nodes each): built here with no client, read from the shard cache
//! with this process's own latest writes on top (a watch may deliver them later than the
//! run's own change), and written back only where they changed.

use crate::error::{Error, Result};
use crate::names;
use futures::StreamExt;
use gpufabric_api::keys::{LABEL_RUN, LABEL_TEST, MANAGER};
use gpufabric_api::run::{FabricTestRun, NodeRunResult, NodeVerdict};
use gpufabric_api::shard::{
    FabricTestRunShard, FabricTestRunShardSpec, FabricTestRunShardStatus, NODES_PER_SHARD,
};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// Shard status writes in flight at once.
pub const WRITE_CONCURRENCY: usize = 16;

/// Name of shard `index` of `run`.
pub fn shard_name(run: &str, index: usize) -> String {
    names::bounded(&format!("{run}-s{index}"), names::MAX_NAME)
}

/// The shards of `run` over `nodes` (in the run's order): shard i holds nodes
/// `i * NODES_PER_SHARD ..`, cluster-scoped like the run, owned by it (deleted with it),
/// labelled with the run and the test.
pub fn build(run: &FabricTestRun, nodes: &[String]) -> Result<Vec<FabricTestRunShard>> {
    let owner = run
        .controller_owner_ref(&())
        .ok_or(Error::Missing("metadata.uid"))?;
    let run_name = run.name_any();
    Ok(nodes
        .chunks(NODES_PER_SHARD)
        .enumerate()
        .map(|(i, chunk)| {
            let mut s = FabricTestRunShard::new(
                &shard_name(&run_name, i),
                FabricTestRunShardSpec {
                    run: run_name.clone(),
                    index: i as u32,
                    nodes: chunk.to_vec(),
                },
            );
            s.metadata.namespace = run.namespace();
            s.metadata.owner_references = Some(vec![owner.clone()]);
            s.metadata.labels = Some(BTreeMap::from([
                (LABEL_RUN.to_string(), names::label_value(&run_name)),
                (LABEL_TEST.to_string(), names::label_value(&run.spec.test)),
            ]));
            s
        })
        .collect())
}

/// `entries` (every node of the run, in shard order) cut into one part per shard, each as
/// long as that shard's own node list (so shards made with another shard size still get
/// their own nodes back).
pub fn split(entries: &[NodeRunResult], shards: &[Shard]) -> Vec<Vec<NodeRunResult>> {
    let mut rest = entries;
    shards
        .iter()
        .map(|s| {
            let (part, tail) = rest.split_at(s.spec.nodes.len().min(rest.len()));
            rest = tail;
            part.to_vec()
        })
        .collect()
}

/// The entries of one shard: its status when it covers `spec.nodes`, else a Pending entry
/// per node.
pub fn entries(
    spec: &FabricTestRunShardSpec,
    status: Option<&FabricTestRunShardStatus>,
) -> Vec<NodeRunResult> {
    match status {
        Some(s)
            if s.nodes.len() == spec.nodes.len()
                && s.nodes.iter().zip(&spec.nodes).all(|(e, n)| &e.node == n) =>
        {
            s.nodes.clone()
        }
        _ => spec
            .nodes
            .iter()
            .map(|n| NodeRunResult {
                node: n.clone(),
                verdict: NodeVerdict::Pending,
                ..Default::default()
            })
            .collect(),
    }
}

/// The latest shard statuses this process wrote, by run uid and shard index. The operator
/// is the only writer of shard status (one leader), so its own write is never older than
/// what the cache holds.
#[derive(Default)]
pub struct ShardWrites(Mutex<HashMap<String, BTreeMap<u32, FabricTestRunShardStatus>>>);

impl ShardWrites {
    fn get(&self, run_uid: &str, index: u32) -> Option<FabricTestRunShardStatus> {
        let map = self.0.lock().ok()?;
        map.get(run_uid)?.get(&index).cloned()
    }

    fn put(&self, run_uid: &str, index: u32, status: FabricTestRunShardStatus) {
        if let Ok(mut map) = self.0.lock() {
            map.entry(run_uid.to_string())
                .or_default()
                .insert(index, status);
        }
    }

    /// Forgets a run that is gone.
    pub fn forget(&self, run_uid: &str) {
        if let Ok(mut map) = self.0.lock() {
            map.remove(run_uid);
        }
    }
}

/// One shard of a run as this process knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Shard {
    pub spec: FabricTestRunShardSpec,
    pub entries: Vec<NodeRunResult>,
}

/// The shards of `run` from `store` (each with this process's latest write on top), by
/// index; None when the cache has fewer than the run's `status.shards`.
pub fn cached(
    store: &Store<FabricTestRunShard>,
    writes: &ShardWrites,
    run: &FabricTestRun,
) -> Option<Vec<Shard>> {
    let uid = run.uid()?;
    let want = run.status.as_ref().map_or(0, |s| s.shards) as usize;
    let mut found: Vec<(u32, Shard)> = store
        .state()
        .iter()
        .filter(|s| s.namespace() == run.namespace())
        .filter(|s| s.owner_references().iter().any(|o| o.uid == uid))
        .map(|s| {
            let own = writes.get(&uid, s.spec.index);
            let status = own.as_ref().or(s.status.as_ref());
            (
                s.spec.index,
                Shard {
                    spec: s.spec.clone(),
                    entries: entries(&s.spec, status),
                },
            )
        })
        .collect();
    found.sort_by_key(|(i, _)| *i);
    found.dedup_by_key(|(i, _)| *i);
    (found.len() >= want).then(|| found.into_iter().map(|(_, s)| s).collect())
}

/// The shards of `run` read from the API server (one list), with this process's latest
/// writes on top: when the cache has not caught up yet.
pub async fn listed(
    api: &Api<FabricTestRunShard>,
    writes: &ShardWrites,
    run: &FabricTestRun,
) -> Result<Vec<Shard>> {
    let uid = run.uid().ok_or(Error::Missing("metadata.uid"))?;
    let lp = ListParams::default().labels(&format!(
        "{LABEL_RUN}={}",
        names::label_value(&run.name_any())
    ));
    let mut found: Vec<Shard> = api
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|s| s.owner_references().iter().any(|o| o.uid == uid))
        .map(|s| {
            let own = writes.get(&uid, s.spec.index);
            let entries = entries(&s.spec, own.as_ref().or(s.status.as_ref()));
            Shard {
                spec: s.spec,
                entries,
            }
        })
        .collect();
    found.sort_by_key(|s| s.spec.index);
    Ok(found)
}

/// Every node's result of a run, in the run's order: from its shards, or from its status
/// for a run that has none (a run that failed before it froze any node).
pub fn results(shards: &[Shard]) -> Vec<NodeRunResult> {
    shards
        .iter()
        .flat_map(|s| s.entries.iter().cloned())
        .collect()
}

/// Every node's result of a finished run, for folding into its test's history: from its
/// shards, or from its status for a run without any (one that failed before it froze a
/// node). None while the cache lacks a shard or holds one from before the run's final
/// write.
pub fn finished_results(
    store: &Store<FabricTestRunShard>,
    writes: &ShardWrites,
    run: &FabricTestRun,
) -> Option<Vec<NodeRunResult>> {
    let status = run.status.as_ref()?;
    if status.shards == 0 {
        return Some(status.nodes.clone());
    }
    let found = results(&cached(store, writes, run)?);
    (found.len() == status.node_count as usize && found.iter().all(|e| e.verdict.is_final()))
        .then_some(found)
}

/// Writes the status of each shard whose entries differ from `before` (same order as
/// `shards`), at most [`WRITE_CONCURRENCY`] at once, and remembers each write.
pub async fn write_changed(
    api: &Api<FabricTestRunShard>,
    writes: &ShardWrites,
    run_uid: &str,
    before: &[Shard],
    after: &[Vec<NodeRunResult>],
) -> Result<usize> {
    let jobs: Vec<_> = before
        .iter()
        .zip(after)
        .filter(|(b, a)| &b.entries != *a)
        .map(|(b, a)| {
            let name = shard_name(&b.spec.run, b.spec.index as usize);
            let status = FabricTestRunShardStatus::of(a.clone());
            let index = b.spec.index;
            async move {
                // A merge patch, not server-side apply: the status is this operator's alone
                // and written whole (the node list replaces the stored one), and apply's
                // field tracking over a list of a hundred nodes costs the API server most of
                // a write; at the verdict every shard is written at once.
                let body = json!({ "status": &status });
                let pp = PatchParams {
                    field_manager: Some(MANAGER.to_string()),
                    ..Default::default()
                };
                api.patch_status(&name, &pp, &Patch::Merge(&body))
                    .await
                    .map(|_| (index, status))
            }
        })
        .collect();
    let n = jobs.len();
    let done: Vec<_> = futures::stream::iter(jobs)
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    for r in done {
        let (index, status) = r?;
        writes.put(run_uid, index, status);
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::run::FabricTestRunSpec;

    fn run() -> FabricTestRun {
        let mut r = FabricTestRun::new(
            "nightly-2026",
            FabricTestRunSpec::of_test(
                "nightly",
                &Default::default(),
                gpufabric_api::run::Trigger::Schedule,
                None,
                None,
            ),
        );
        r.metadata.namespace = Some("gpu".into());
        r.metadata.uid = Some("run-uid".into());
        r
    }

    #[test]
    fn shards_split_the_nodes_in_order_and_are_owned_by_the_run() {
        // Two full shards and a part of one.
        let n = 2 * NODES_PER_SHARD + NODES_PER_SHARD / 2;
        let nodes: Vec<String> = (0..n).map(|i| format!("gpu-{i:04}")).collect();
        let shards = build(&run(), &nodes).expect("shards");
        assert_eq!(shards.len(), 3);
        assert_eq!(
            shards
                .iter()
                .map(|s| s.spec.nodes.len())
                .collect::<Vec<_>>(),
            [NODES_PER_SHARD, NODES_PER_SHARD, NODES_PER_SHARD / 2]
        );
        let back: Vec<String> = shards.iter().flat_map(|s| s.spec.nodes.clone()).collect();
        assert_eq!(back, nodes);
        assert_eq!(shards[2].name_any(), "nightly-2026-s2");
        assert_eq!(shards[0].owner_references()[0].uid, "run-uid");
        assert_eq!(shards[0].owner_references()[0].controller, Some(true));
        assert_eq!(shards[0].labels()[LABEL_RUN], "nightly-2026");
        assert!(build(&FabricTestRun::new("x", run().spec), &nodes).is_err());
    }

    #[test]
    fn results_go_back_to_each_shard_by_its_own_size() {
        // A run whose shards were made 200 nodes each keeps them after the size changed.
        let shard = |index: u32, n: usize| Shard {
            spec: FabricTestRunShardSpec {
                run: "r".into(),
                index,
                nodes: (0..n).map(|i| format!("s{index}-{i}")).collect(),
            },
            entries: Vec::new(),
        };
        let shards = [shard(0, 200), shard(1, 30)];
        let entries: Vec<NodeRunResult> = shards
            .iter()
            .flat_map(|s| s.spec.nodes.clone())
            .map(|node| NodeRunResult {
                node,
                ..Default::default()
            })
            .collect();
        let parts = split(&entries, &shards);
        assert_eq!(parts.len(), 2);
        for (part, s) in parts.iter().zip(&shards) {
            let names: Vec<&String> = part.iter().map(|e| &e.node).collect();
            assert_eq!(names, s.spec.nodes.iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_shard_without_a_matching_status_reads_as_pending() {
        let spec = FabricTestRunShardSpec {
            run: "r".into(),
            index: 0,
            nodes: vec!["a".into(), "b".into()],
        };
        let pending = entries(&spec, None);
        assert!(pending.iter().all(|e| e.verdict == NodeVerdict::Pending));
        let mut done = pending.clone();
        done[1].verdict = NodeVerdict::Passed;
        let status = FabricTestRunShardStatus::of(done.clone());
        assert_eq!(entries(&spec, Some(&status)), done);
        let other = FabricTestRunShardStatus::of(vec![done[0].clone()]);
        assert_eq!(entries(&spec, Some(&other)), pending);
    }

    #[test]
    fn the_latest_own_write_is_remembered_per_run() {
        let w = ShardWrites::default();
        let s = FabricTestRunShardStatus::of(vec![]);
        w.put("u", 3, s.clone());
        assert_eq!(w.get("u", 3), Some(s));
        assert_eq!(w.get("u", 2), None);
        w.forget("u");
        assert_eq!(w.get("u", 3), None);
    }
}
