//! One gpufabric run per node at a time, against a real control plane: the real
//! `fabric-operator` binary, the process-kubelet (which refuses a pod whose GPUs another
//! pod holds, as a kubelet does) and the sim agents. Two FabricTests over the same nodes,
//! created at the same moment: a watch of every benchmark pod checks at each pod event that
//! no node holds pods of two runs, and both tests end up measuring every node.
//!
//! Build the binaries first: `cargo build -p gpufabric-agent -p gpufabric-operator`, then
//! `cargo test -p gpufabric-tests --test one_run_per_node`.

use futures::StreamExt;
use gpufabric_api::keys;
use gpufabric_api::run::{FabricTestRun, NodeVerdict, RunPhase};
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::operator::{OperatorEnv, last_run_name, sim_agent};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::watcher;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

/// What the watch of the benchmark pods saw.
#[derive(Debug, Default)]
struct PodsSeen {
    /// Every run that ever had a pod on each node.
    runs_by_node: BTreeMap<String, BTreeSet<String>>,
    /// Each moment a node held pods of more than one run: the node and those runs' pods.
    overlaps: Vec<(String, Vec<String>)>,
    /// Pods the kubelet refused (Failed before running: `OutOfnvidia.com/gpu`).
    refused: Vec<String>,
}

/// A pod the kubelet still counts on its node: not in a terminal phase.
fn holds_node(p: &Pod) -> bool {
    !matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref().and_then(|s| s.node_name.clone())
}

/// Watches the benchmark pods of `pods` and records, at every event, the nodes held by
/// pods of two runs at once.
fn watch_pods(pods: Api<Pod>) -> (Arc<Mutex<PodsSeen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(PodsSeen::default()));
    let out = seen.clone();
    let task = tokio::spawn(async move {
        // Pod name -> (node, run), while it holds its node.
        let mut holding: HashMap<String, (String, String)> = HashMap::new();
        let stream = watcher::watcher(pods, watcher::Config::default().labels(keys::LABEL_RUN));
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            let mut seen = out.lock().unwrap_or_else(|e| e.into_inner());
            match ev {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                    let (Some(node), Some(run)) = (node_of(&p), p.labels().get(keys::LABEL_RUN))
                    else {
                        continue;
                    };
                    seen.runs_by_node
                        .entry(node.clone())
                        .or_default()
                        .insert(run.clone());
                    let reason = p.status.as_ref().and_then(|s| s.reason.as_deref());
                    if reason.is_some_and(|r| r.starts_with("OutOf")) {
                        seen.refused.push(p.name_any());
                    }
                    if holds_node(&p) {
                        holding.insert(p.name_any(), (node, run.clone()));
                    } else {
                        holding.remove(&p.name_any());
                    }
                }
                Ok(watcher::Event::Delete(p)) => {
                    holding.remove(&p.name_any());
                }
                Ok(watcher::Event::Init | watcher::Event::InitDone) | Err(_) => continue,
            }
            let mut by_node: BTreeMap<&str, BTreeMap<&str, &str>> = BTreeMap::new();
            for (pod, (node, run)) in &holding {
                by_node
                    .entry(node)
                    .or_default()
                    .insert(run.as_str(), pod.as_str());
            }
            let overlaps: Vec<(String, Vec<String>)> = by_node
                .into_iter()
                .filter(|(_, runs)| runs.len() > 1)
                .map(|(node, runs)| {
                    let pods = runs.values().map(|p| p.to_string()).collect();
                    (node.to_string(), pods)
                })
                .collect();
            seen.overlaps.extend(overlaps);
        }
    });
    (seen, task)
}

/// Every status message each run had, by run.
type RunMessages = Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>;

/// Watches the runs of FabricTests `tests` and keeps every status message each run had.
fn watch_run_messages(
    runs: Api<FabricTestRun>,
    tests: &[&str],
) -> (RunMessages, tokio::task::JoinHandle<()>) {
    let messages = RunMessages::default();
    let out = messages.clone();
    let selector = format!("{} in ({})", keys::LABEL_TEST, tests.join(","));
    let task = tokio::spawn(async move {
        let stream = watcher::watcher(runs, watcher::Config::default().labels(&selector));
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            if let Ok(watcher::Event::Apply(r) | watcher::Event::InitApply(r)) = ev
                && let Some(m) = r.status.as_ref().and_then(|s| s.message.clone())
            {
                out.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(r.name_any())
                    .or_default()
                    .insert(m);
            }
        }
    });
    (messages, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tests_over_the_same_nodes_at_once_never_share_a_node_and_both_measure_every_node() {
    const NODES: usize = 4;
    let env = OperatorEnv::shared(SimFleet::uniform("gpu", NODES, H100, 8), "one-run").await;
    let (pods_seen, pod_watch) = watch_pods(env.pods_api());
    let names = ["one-run-a", "one-run-b"];
    let (messages, run_watch) = watch_run_messages(env.runs_api(), &names);
    let spec = json!({
        "nodeSelector": env.node_selector(),
        "suite": {"ncclSweep": {"collectives": ["allReduce"]}},
        "agent": sim_agent(60)
    });
    tokio::join!(
        env.create_test(names[0], spec.clone()),
        env.create_test(names[1], spec.clone())
    );

    let mut runs = BTreeMap::new();
    for name in names {
        let run = last_run_name(&env.wait_folded(name, None).await);
        runs.insert(name, run);
    }
    pod_watch.abort();
    run_watch.abort();

    let seen = std::mem::take(&mut *pods_seen.lock().unwrap_or_else(|e| e.into_inner()));
    let log = env.operator.log_tail(80);
    assert!(
        seen.overlaps.is_empty(),
        "nodes held pods of two runs at once: {:?}\n{log}",
        seen.overlaps
    );
    assert!(
        seen.refused.is_empty(),
        "the kubelet refused pods: {:?}",
        seen.refused
    );
    let every_run: BTreeSet<String> = runs.values().cloned().collect();
    let all_nodes: BTreeSet<String> = env.fleet.node_names().into_iter().collect();
    assert_eq!(
        seen.runs_by_node.keys().cloned().collect::<BTreeSet<_>>(),
        all_nodes
    );
    for (node, node_runs) in &seen.runs_by_node {
        assert_eq!(node_runs, &every_run, "{node}: a pod of each run, in turn");
    }

    for (test, run) in &runs {
        let status = env.run_status(run).await;
        assert_eq!(status.phase, RunPhase::Succeeded, "{test}: {status:#?}");
        assert_eq!(status.node_count as usize, NODES, "{test}: {status:#?}");
        assert_eq!(status.skipped_count, 0, "{test}: no node left out");
        let verdicts: BTreeMap<String, NodeVerdict> = status
            .nodes
            .iter()
            .map(|n| (n.node.clone(), n.verdict))
            .collect();
        let passed: BTreeMap<String, NodeVerdict> = all_nodes
            .iter()
            .map(|n| (n.clone(), NodeVerdict::Passed))
            .collect();
        assert_eq!(verdicts, passed, "{test}: every node measured");
    }

    // One of the two waited, saying for which nodes, for which run, and why.
    let messages = messages.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let waited: Vec<(&String, &String)> = messages
        .iter()
        .flat_map(|(run, ms)| ms.iter().map(move |m| (run, m)))
        .filter(|(_, m)| m.contains("is testing (one run at a time)"))
        .collect();
    assert!(
        !waited.is_empty(),
        "a run said it waited for the other: {messages:#?}"
    );
    for (run, m) in waited {
        assert!(all_nodes.iter().all(|n| m.contains(n.as_str())), "{m}");
        let named = m
            .split("gpufabric run ")
            .nth(1)
            .and_then(|rest| rest.split(" is testing").next())
            .unwrap_or_default();
        assert!(
            !named.is_empty() && named != run.as_str(),
            "{run} names the run it waits for: {m}"
        );
        env.runs_api()
            .get(named)
            .await
            .unwrap_or_else(|e| panic!("{run} waits for {named}, which is no run: {e}"));
    }
}
