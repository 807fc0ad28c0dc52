//! Scale of one run over simulated nodes, one pod each: how long the operator takes to
//! create every pod (and at what rate), to reach the verdict after the last agent, how
//! large its objects get, its peak memory, and what the run costs the API server
//! (`apiserver_request_total` by verb and resource). A watch counts the nodes that hold a
//! benchmark pod at every pod event: with waves (`spec.rollout`), never more than a wave.
//!
//! `a_run_in_waves_never_holds_more_than_its_share_of_nodes` runs with the other tests;
//! the measurement over 1000+ nodes is `#[ignore]`d: run it with `bench/operator-scale.sh`
//! (`SCALE_NODES`, `SCALE_WAVE`), which builds the binaries and records the numbers.

use futures::StreamExt;
use gpufabric_api::run::{FabricTestRun, RunPhase};
use gpufabric_api::shard::FabricTestRunShard;
use gpufabric_api::{FabricTest, keys};
use gpufabric_tests::apimetrics::RequestCounts;
use gpufabric_tests::cluster::{Cluster, ClusterOptions};
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::kubelet::{Kubelet, KubeletOptions, default_agent_bin_dir};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const NS: &str = "scale";

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The pod holds its node: it exists and has not reached a terminal phase (a pod being
/// deleted still holds it until it is gone).
fn holds_node(p: &Pod) -> bool {
    !matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

/// Watches the benchmark pods and keeps the largest number of nodes that held one at the
/// same moment, checked at every event.
fn watch_pods_under_test(
    pods: Api<Pod>,
) -> (Arc<AtomicUsize>, LastEnd, tokio::task::JoinHandle<()>) {
    let peak = Arc::new(AtomicUsize::new(0));
    let seen = peak.clone();
    let last_end = LastEnd::default();
    let ended = last_end.clone();
    let task = tokio::spawn(async move {
        let mut holding: HashMap<String, bool> = HashMap::new();
        let stream = watcher::watcher(pods, watcher::Config::default().labels(keys::LABEL_RUN));
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                    let holds = holds_node(&p);
                    if holding.insert(p.name_any(), holds) != Some(false) && !holds {
                        *ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                    }
                }
                Ok(watcher::Event::Delete(p)) => {
                    holding.remove(&p.name_any());
                }
                Ok(watcher::Event::Init | watcher::Event::InitDone) | Err(_) => continue,
            }
            let now = holding.values().filter(|h| **h).count();
            seen.fetch_max(now, Ordering::SeqCst);
        }
    });
    (peak, last_end, task)
}

/// When this test's watch last saw a benchmark pod end (its phase terminal), close to when
/// the operator's own pod watch saw it: the end of the agents as the operator learns it.
type LastEnd = Arc<std::sync::Mutex<Option<Instant>>>;

/// Waits until `count` nodes are Ready and the node lifecycle controller has taken its
/// `not-ready` taint off them, so that the run selects every one of them.
async fn wait_until_ready(cluster: &Cluster, count: usize) {
    let api: Api<Node> = Api::all(cluster.client());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ready = api
            .list(&ListParams::default())
            .await
            .expect("nodes")
            .items
            .iter()
            .filter(|n| {
                let tainted = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| t.iter().any(|t| t.key.starts_with("node.kubernetes.io/")));
                !tainted
                    && n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        if ready >= count {
            return;
        }
        if Instant::now() >= deadline {
            // A loaded machine lets some heartbeats lapse: the run skips those nodes and
            // the report counts the nodes it tested.
            eprintln!("{ready} of {count} nodes Ready and untainted; starting anyway");
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn size<T: serde::Serialize>(v: &T) -> usize {
    serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX)
}

/// When the node-pair phase began and when each of its rounds was first seen, as the
/// test's polling sees the run's status.
#[derive(Default)]
struct PairTimes {
    began: Option<Duration>,
    rounds: BTreeMap<u32, Duration>,
}

impl PairTimes {
    fn observe(&mut self, status: Option<&gpufabric_api::run::FabricTestRunStatus>, at: Duration) {
        if let Some(np) = status.and_then(|s| s.node_pairs.as_ref()) {
            self.began.get_or_insert(at);
            self.rounds.entry(np.round).or_insert(at);
        }
    }
}

/// The node-pair phase of a finished run: its counts from the run status, and per round
/// the pods created and the server-side time from the first pod created to the last
/// agent finished (1 s resolution).
fn pair_report(
    status: &gpufabric_api::run::FabricTestRunStatus,
    pair_pods: &[Pod],
    times: &PairTimes,
    succeeded: Option<Duration>,
) -> serde_json::Value {
    let Some(np) = status.node_pairs.as_ref() else {
        return serde_json::Value::Null;
    };
    let ts = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| t.0.as_second();
    // round -> (pods, first created, last finished)
    let mut rounds: BTreeMap<u32, (usize, Option<i64>, Option<i64>)> = BTreeMap::new();
    for p in pair_pods {
        let name = p.name_any();
        let Some(round) = name
            .rsplit_once("-r")
            .and_then(|(_, rest)| rest.split_once("-p"))
            .and_then(|(r, _)| r.parse::<u32>().ok())
        else {
            continue;
        };
        let e = rounds.entry(round).or_insert((0, None, None));
        e.0 += 1;
        if let Some(c) = p.metadata.creation_timestamp.as_ref().map(ts) {
            e.1 = Some(e.1.map_or(c, |v: i64| v.min(c)));
        }
        let finished = gpufabric_tests::fixtures::container_state(Some(p))
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.finished_at.as_ref())
            .map(ts);
        if let Some(f) = finished {
            e.2 = Some(e.2.map_or(f, |v: i64| v.max(f)));
        }
    }
    // A round lasts from when it is first seen to when the next one is (the last: to the
    // run's success), at the polling's resolution (200 ms).
    let round_s = |r: u32| {
        let start = times.rounds.get(&r)?;
        let end = times
            .rounds
            .range(r + 1..)
            .next()
            .map(|(_, t)| *t)
            .or(succeeded)?;
        Some(end.saturating_sub(*start).as_secs_f64())
    };
    let per_round: Vec<serde_json::Value> = rounds
        .iter()
        .map(|(r, (pods, first, last))| {
            json!({
                "round": r,
                "pods": pods,
                "round_s": round_s(*r),
                "server_first_created_to_last_finished_s": first.zip(*last).map(|(a, b)| b - a),
                "seen_s": times.rounds.get(r).map(|d| d.as_secs_f64()),
            })
        })
        .collect();
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64()).unwrap_or(f64::NAN);
    json!({
        "candidates": np.candidates,
        "seed": np.seed,
        "rounds": np.rounds,
        "confirmation_round": np.confirmation_round,
        "retested": np.retested,
        "pairs": np.pairs,
        "measured": np.measured,
        "not_measured": np.not_measured,
        "errored": np.errored,
        "median_gbps": np.within.as_ref().and_then(|w| w.median_gbps),
        "pair_pods": pair_pods.len(),
        "per_round": per_round,
        "phase_began_s": secs(times.began),
        "phase_s": secs(succeeded) - secs(times.began),
    })
}

/// One run over `nodes` simulated nodes, `wave` as `spec.rollout.maxUnavailable` (all at
/// once when None), with the node-pair phase (ring) when `pairs`; the measurements as JSON.
async fn measure(nodes: usize, wave: Option<&str>, pairs: bool) -> serde_json::Value {
    gpufabric_tests::init_tracing();
    // The process-kubelet renews each Lease every 30 s; on a loaded machine a renewal can
    // come late, which must not turn nodes NotReady (and so untested) mid-measurement.
    let cluster = Cluster::start_with(ClusterOptions {
        // The node lifecycle controller takes the not-ready taint off each new node with a
        // PATCH; at its default 20 requests/s (shared with every other controller) a
        // thousand nodes were still tainted after two minutes, and the run skipped them.
        controller_manager_args: vec![
            "--node-monitor-grace-period=300s".into(),
            "--kube-api-qps=300".into(),
            "--kube-api-burst=600".into(),
        ],
        ..Default::default()
    })
    .await
    .expect("control plane");
    // SCALE_BAD=N: the last N nodes have a slow GPU pair, fail and are cordoned at the
    // first fold (one failure quarantines, no confirmation run).
    let bad: usize = std::env::var("SCALE_BAD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut described = SimFleet::uniform("gpu", nodes, H100, 8);
    for n in described.nodes.iter_mut().rev().take(bad) {
        // With the node-pair phase a slow network (found by the pairs, retested); without
        // it a slow GPU pair (found by the node check).
        n.faults.push(if pairs {
            gpufabric_measure::fleet::Fault::SlowNic { factor: 0.3 }
        } else {
            gpufabric_measure::fleet::Fault::SlowPair {
                gpus: [2, 3],
                factor: 0.3,
            }
        });
    }
    // SCALE_CONFIRM=1: the failing nodes are retested in a confirmation run and cordoned
    // when they fail again (`confirmRetest`), as a nightly does by default.
    let confirm = std::env::var("SCALE_CONFIRM").is_ok_and(|v| v == "1");
    let fleet = SimFleet::write(described).expect("fleet");
    let dir = tempfile::tempdir().expect("dir");
    let t = Instant::now();
    let _kubelet = Kubelet::start(
        cluster.client(),
        &fleet,
        KubeletOptions {
            root_dir: Some(dir.path().join("kubelet")),
            heartbeat: Duration::from_secs(30),
            status_interval: Duration::from_secs(120),
            ..Default::default()
        },
    )
    .await
    .expect("kubelet");
    eprintln!(
        "{nodes} nodes registered in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    cluster.create_namespace(NS).await.expect("namespace");
    wait_until_ready(&cluster, nodes).await;
    let pods: Api<Pod> = Api::namespaced(cluster.client(), NS);
    let (peak, last_end, watch) = watch_pods_under_test(pods.clone());
    let requests_before = RequestCounts::read(&cluster.client())
        .await
        .expect("API server metrics");

    let bin = default_agent_bin_dir().join("fabric-operator");
    let log = std::fs::File::create(dir.path().join("operator.log")).expect("log");
    let mut cmd = Command::new(&bin);
    gpufabric_tests::process::harden(&mut cmd);
    let mut op = cmd
        .args([
            "run",
            "--admin-addr",
            "off",
            "--pod-namespace",
            NS,
            "--kubeconfig",
        ])
        .arg(cluster.kubeconfig_path())
        .env(
            "RUST_LOG",
            "info,kube=warn,gpufabric_operator::controller::run=debug,gpufabric_operator::controller::fabrictest=debug",
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("operator starts");
    let pid = op.id();

    let tests: Api<FabricTest> = Api::all(cluster.client());
    let mut spec = json!({
        "nodeSelector": {"pool": "training"},
        "suite": {"ncclSweep": {"collectives": ["allReduce"]}},
        "agent": {"timeoutSeconds": 600, "env": [{"name": "FABRIC_BACKEND", "value": "sim"}]}
    });
    if let Some(w) = wave {
        spec["rollout"] = json!({"maxUnavailable": w});
    }
    if bad > 0 {
        spec["quarantine"] = json!({"mode": "Cordon", "failuresToQuarantine": 1,
            "confirmRetest": confirm, "maxQuarantined": "10%"});
    }
    // How long the sim agents' work lasts (`h200`: a node check of 22-27 s, as on GPUs).
    if let Ok(pace) = std::env::var("SCALE_PACE")
        && !pace.is_empty()
        && let Some(env) = spec["agent"]["env"].as_array_mut()
    {
        env.push(json!({"name": keys::ENV_SIM_PACE, "value": pace}));
    }
    // SCALE_FULL=1: the node checks as a nightly runs them (the default suite) before the
    // pairs; otherwise they go as light as they can and the phase under measurement is the
    // pairs'.
    let full = std::env::var("SCALE_FULL").is_ok_and(|v| v == "1");
    if pairs && full {
        spec["suite"]["nodePairs"] =
            json!({"enabled": true, "pairing": "ring", "bytes": 268435456});
    } else if pairs {
        spec["suite"] = json!({
            "ncclSweep": {"enabled": false},
            "ddpProbe": {"enabled": false},
            "nodePairs": {"enabled": true, "pairing": "ring", "bytes": 268435456}
        });
    }
    // SCALE_PARTNERS=1: one partner a node a night (suite.nodePairs.partners).
    if pairs
        && let Ok(partners) = std::env::var("SCALE_PARTNERS")
        && let Ok(partners) = partners.parse::<u32>()
    {
        spec["suite"]["nodePairs"]["partners"] = json!(partners);
    }
    // SCALE_PROBE=1: the multi-node DDP probe after the node checks (16 nodes that passed).
    if std::env::var("SCALE_PROBE").is_ok_and(|v| v == "1") {
        spec["suite"]["ddpNodes"] = json!({"enabled": true, "maxNodes": 16});
    }
    let test: FabricTest = serde_json::from_value(json!({
        "apiVersion": "gpufabric.io/v1alpha1", "kind": "FabricTest",
        "metadata": {"name": "fleet"},
        "spec": spec,
    }))
    .expect("test");
    let created = Instant::now();
    tests
        .create(&PostParams::default(), &test)
        .await
        .expect("create test");

    let runs: Api<FabricTestRun> = Api::all(cluster.client());
    let lp = ListParams::default().labels(keys::LABEL_RUN);
    let (mut run_seen, mut all_pods, mut succeeded, mut run_obj) = (None, None, None, None);
    let mut pair_times = PairTimes::default();
    let deadline = Instant::now() + Duration::from_secs(2700);
    while Instant::now() < deadline {
        let list = runs.list(&ListParams::default()).await.expect("runs").items;
        if let Some(r) = list.first() {
            run_seen.get_or_insert(created.elapsed());
            pair_times.observe(r.status.as_ref(), created.elapsed());
            if r.status
                .as_ref()
                .is_some_and(|s| s.phase == RunPhase::Succeeded)
            {
                succeeded = Some(created.elapsed());
                run_obj = Some(r.clone());
                break;
            }
        }
        if all_pods.is_none() && pods.list_metadata(&lp).await.expect("pods").items.len() >= nodes {
            all_pods = Some(created.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(if pairs { 200 } else { 500 })).await;
    }
    // The test's status: the run folded into the history (and handed to quarantine).
    let mut folded = None;
    let mut test_obj = None;
    while Instant::now() < deadline && succeeded.is_some() {
        let t = tests.get("fleet").await.expect("test");
        if t.status
            .as_ref()
            .and_then(|s| s.last_run.as_ref())
            .is_some()
        {
            folded = Some(created.elapsed());
            test_obj = Some(t);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The node signals follow the status: the operator logs when they are written.
    let operator_log = dir.path().join("operator.log");
    let signals = signals_written(&operator_log, 1, deadline, created).await;
    // The confirmation run the first fold made for the failing nodes, to its fold (and the
    // cordons it carries out).
    let confirmation = match (confirm && bad > 0, folded, run_obj.as_ref()) {
        (true, Some(_), Some(first)) => {
            Some(confirmation_run(&tests, &runs, &first.name_any(), deadline, created).await)
        }
        _ => None,
    };
    let cordoned = Api::<Node>::all(cluster.client())
        .list_metadata(&ListParams::default().labels(keys::LABEL_QUARANTINED))
        .await
        .map_or(0, |l| l.items.len());
    let requests = RequestCounts::read(&cluster.client())
        .await
        .expect("API server metrics")
        .since(&requests_before);
    // A second run over the same nodes (SCALE_RUNS=2), as the next night's: its signals,
    // counters and conditions are already on the nodes, so its fold writes only what changes.
    let second = match std::env::var("SCALE_RUNS").ok().as_deref() {
        Some("2") if folded.is_some() => {
            let first = run_obj.as_ref().map(|r| r.name_any()).unwrap_or_default();
            Some(second_run(&tests, &runs, &first, deadline, &operator_log).await)
        }
        _ => None,
    };
    let hwm = vm_hwm_kib(pid);
    let last_end_seen = last_end
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .map(|t| t.saturating_duration_since(created));
    if let Ok(out) = std::env::var("SCALE_OUT") {
        // The operator's log beside the numbers, to break the times down.
        let _ = std::fs::copy(
            dir.path().join("operator.log"),
            format!("{out}.operator.log"),
        );
    }
    let _ = op.kill();
    let _ = op.wait();
    watch.abort();
    let run = run_obj.expect("the run succeeded within 25 minutes");
    let status = run.status.clone().expect("status");
    // The first run's shards (a second run has its own).
    let of_run = format!("{}={}", keys::LABEL_RUN, run.name_any());
    let shards: Vec<FabricTestRunShard> = Api::all(cluster.client())
        .list(&ListParams::default().labels(&of_run))
        .await
        .expect("shards")
        .items;
    let results: usize = shards
        .iter()
        .map(|s| s.status.as_ref().map_or(0, |s| s.nodes.len()))
        .sum();
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64()).unwrap_or(f64::NAN);
    // Server-side times (whole seconds): run start, all pods created (condition), the last
    // agent to finish (container finishedAt), run completion.
    let ts = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| t.0.as_second();
    let start = status.start_time.as_ref().map(ts).unwrap_or_default();
    let pods_created = status
        .conditions
        .iter()
        .find(|c| c.type_ == "PodsCreated")
        .map(|c| ts(&c.last_transition_time) - start);
    let (pair_pods, node_pods): (Vec<Pod>, Vec<Pod>) = pods
        .list(&lp)
        .await
        .expect("pods")
        .items
        .into_iter()
        .partition(|p| p.labels().get(keys::LABEL_ROLE).map(String::as_str) == Some("node-pair"));
    let last_finished = node_pods
        .iter()
        .filter_map(|p| {
            gpufabric_tests::fixtures::container_state(Some(p))?
                .terminated
                .as_ref()?
                .finished_at
                .as_ref()
                .map(ts)
        })
        .max();
    let completion = status.completion_time.as_ref().map(ts);
    let by_role = role_timeline(pair_pods.iter().chain(&node_pods), start);
    let largest_shard = shards.iter().map(size).max().unwrap_or(0);
    let objects = [size(&run), largest_shard, test_obj.as_ref().map_or(0, size)];
    let wave_size = status
        .progress
        .as_ref()
        .map_or(nodes, |p| p.wave_size as usize);
    let report = json!({
        "nodes": nodes,
        "wave": wave,
        "wave_size": wave_size,
        "waves": status.progress.as_ref().map(|p| p.waves),
        "most_nodes_under_test_at_once": peak.load(Ordering::SeqCst),
        "run_created_s": secs(run_seen),
        "all_pods_created_s": secs(all_pods),
        "run_succeeded_s": secs(succeeded),
        "server_pods_created_after_start_s": pods_created,
        "pods_created_per_s": pods_created.filter(|s| *s > 0 && wave.is_none()).map(|s| status.node_count as f64 / s as f64),
        "server_last_agent_finished_after_start_s": last_finished.map(|t| t - start),
        "server_run_completed_after_last_agent_s": completion.zip(last_finished).map(|(c, l)| c - l),
        "last_pod_end_seen_s": secs(last_end_seen),
        "run_succeeded_after_last_pod_end_seen_s": secs(succeeded) - secs(last_end_seen),
        "test_status_folded_s": secs(folded),
        "fold_into_test_after_run_succeeded_s": secs(folded) - secs(succeeded),
        "signals_written_s": secs(signals),
        "signals_written_after_run_succeeded_s": secs(signals) - secs(succeeded),
        "bad_nodes": bad,
        "quarantined_nodes": cordoned,
        "run_object_bytes": objects[0],
        "largest_shard_bytes": objects[1],
        "test_object_bytes": objects[2],
        "largest_object_bytes": objects.iter().max(),
        "shards": shards.len(),
        "findings": status.finding_count,
        "operator_peak_rss_kib": hwm,
        "api_requests": requests.total(),
        "api_requests_per_node_tested": requests.total() / status.node_count.max(1) as f64,
        "api_requests_by_verb_resource": requests.to_json(),
        "run": run.name_any(),
        "tested": status.node_count,
        "skipped": status.skipped_count,
        "message": status.message.as_deref().map(|m| m.chars().take(300).collect::<String>()),
        "duration": status.duration,
        "node_pairs": pair_report(&status, &pair_pods, &pair_times, succeeded),
        "server_pods_by_role_after_start": by_role,
        "server_run_completed_after_start_s": completion.map(|c| c - start),
        "confirmation": confirmation,
        "second_run": second,
    });
    println!("SCALE {report}");
    if pairs {
        let np = status.node_pairs.as_ref().expect("a node-pair phase");
        assert!(np.done && np.pairs > 0, "{np:?}");
        assert_eq!(np.measured, np.pairs, "every pair measured: {np:?}");
    }
    let tested = status.node_count as usize;
    assert_eq!(results, tested, "every node's result is in a shard");
    assert_eq!(
        status.passed as usize + status.failed as usize,
        tested,
        "{:?}",
        status.message
    );
    report
}

/// Per pod role (node check, node pair, the probe): how many pods, and, in whole seconds
/// of the server's clock after the run's start (`start`), when the first was created and
/// the last agent finished.
fn role_timeline<'a>(pods: impl Iterator<Item = &'a Pod>, start: i64) -> serde_json::Value {
    let ts = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| t.0.as_second() - start;
    let mut roles: BTreeMap<String, (usize, Option<i64>, Option<i64>)> = BTreeMap::new();
    for p in pods {
        let role = p
            .labels()
            .get(keys::LABEL_ROLE)
            .cloned()
            .unwrap_or_default();
        let e = roles.entry(role).or_insert((0, None, None));
        e.0 += 1;
        if let Some(c) = p.metadata.creation_timestamp.as_ref().map(ts) {
            e.1 = Some(e.1.map_or(c, |v: i64| v.min(c)));
        }
        let finished = gpufabric_tests::fixtures::container_state(Some(p))
            .and_then(|s| s.terminated.as_ref())
            .and_then(|t| t.finished_at.as_ref())
            .map(ts);
        if let Some(f) = finished {
            e.2 = Some(e.2.map_or(f, |v: i64| v.max(f)));
        }
    }
    roles
        .into_iter()
        .map(|(role, (pods, first, last))| {
            let times = json!({"pods": pods, "first_created_s": first, "last_finished_s": last});
            (role, times)
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Waits for the confirmation run that the fold of `first` made, for its end and for the
/// test's status to fold it; times from `since` (the test's creation), its counts, and the
/// nodes it found failing again.
async fn confirmation_run(
    tests: &Api<FabricTest>,
    runs: &Api<FabricTestRun>,
    first: &str,
    deadline: Instant,
    since: Instant,
) -> serde_json::Value {
    let (mut seen, mut ended, mut folded, mut run) = (None, None, None, None::<FabricTestRun>);
    // The fold makes it at once, or not at all (failures already confirmed within the run).
    let made_by = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && folded.is_none() {
        if seen.is_none() && Instant::now() > made_by {
            break;
        }
        if ended.is_none() {
            let list = runs.list(&ListParams::default()).await.expect("runs").items;
            if let Some(r) = list.into_iter().find(|r| {
                r.name_any() != first
                    && r.spec.trigger == gpufabric_api::run_state::Trigger::Confirmation
            }) {
                seen.get_or_insert(since.elapsed());
                if r.status.as_ref().is_some_and(|s| s.phase.is_finished()) {
                    ended = Some(since.elapsed());
                    run = Some(r);
                }
            }
        } else {
            let t = tests.get("fleet").await.expect("test");
            let last = t.status.as_ref().and_then(|s| s.last_run.as_ref());
            if last.is_some_and(|l| Some(l.name.clone()) == run.as_ref().map(|r| r.name_any())) {
                folded = Some(since.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64()).unwrap_or(f64::NAN);
    let status = run
        .as_ref()
        .and_then(|r| r.status.clone())
        .unwrap_or_default();
    json!({
        "run": run.as_ref().map(|r| r.name_any()),
        "seen_s": secs(seen),
        "succeeded_s": secs(ended),
        "test_status_folded_s": secs(folded),
        "fold_after_succeeded_s": secs(folded) - secs(ended),
        "tested": status.node_count,
        "failed": status.failed,
        "duration": status.duration,
    })
}

/// Asks the test `fleet` for a run now, and times it: from the ask to its success, and from
/// its success to the test's status folding it.
async fn second_run(
    tests: &Api<FabricTest>,
    runs: &Api<FabricTestRun>,
    first: &str,
    deadline: Instant,
    operator_log: &std::path::Path,
) -> serde_json::Value {
    let asked = Instant::now();
    let now = json!({"metadata": {"annotations": {keys::ANNOTATION_RUN_NOW: "scale"}}});
    tests
        .patch(
            "fleet",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&now),
        )
        .await
        .expect("run-now");
    let (mut name, mut succeeded, mut folded) = (None, None, None);
    while Instant::now() < deadline && folded.is_none() {
        if succeeded.is_none() {
            let list = runs.list(&ListParams::default()).await.expect("runs").items;
            // A run that failed at its start (no node usable) ends the wait as well.
            if let Some(r) = list.iter().find(|r| r.name_any() != first)
                && r.status.as_ref().is_some_and(|s| s.phase.is_finished())
            {
                succeeded = Some(asked.elapsed());
                name = Some(r.name_any());
            }
        } else {
            let t = tests.get("fleet").await.expect("test");
            let last = t.status.as_ref().and_then(|s| s.last_run.as_ref());
            if last.is_some_and(|l| Some(&l.name) == name.as_ref()) {
                folded = Some(asked.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let signals = match folded {
        Some(_) => signals_written(operator_log, 2, deadline, asked).await,
        None => None,
    };
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64()).unwrap_or(f64::NAN);
    json!({
        "run": name,
        "run_succeeded_s": secs(succeeded),
        "test_status_folded_s": secs(folded),
        "fold_into_test_after_run_succeeded_s": secs(folded) - secs(succeeded),
        "signals_written_s": secs(signals),
        "signals_written_after_run_succeeded_s": secs(signals) - secs(succeeded),
    })
}

/// When the operator's log (`log`) says the node signals of the `nth` folded run were
/// written, measured from `since`; None past `deadline`.
async fn signals_written(
    log: &std::path::Path,
    nth: usize,
    deadline: Instant,
    since: Instant,
) -> Option<Duration> {
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.matches("node signals written").count() >= nth {
            return Some(since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

#[tokio::test]
#[ignore = "scale measurement; run bench/operator-scale.sh"]
async fn a_run_over_many_nodes() {
    let nodes: usize = std::env::var("SCALE_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let wave = std::env::var("SCALE_WAVE").ok().filter(|w| !w.is_empty());
    let pairs = std::env::var("SCALE_PAIRS").is_ok_and(|v| v == "1");
    let report = measure(nodes, wave.as_deref(), pairs).await;
    let largest = report["largest_object_bytes"].as_u64().unwrap_or(u64::MAX);
    assert!(largest < 256 * 1024, "an object of {largest} bytes");
    if let Ok(out) = std::env::var("SCALE_OUT") {
        std::fs::write(out, report.to_string()).expect("write report");
    }
}

#[tokio::test]
async fn a_run_in_waves_never_holds_more_than_its_share_of_nodes() {
    let report = measure(30, Some("10%"), false).await;
    assert_eq!(report["wave_size"], 3);
    assert_eq!(report["waves"], 10);
    let peak = report["most_nodes_under_test_at_once"]
        .as_u64()
        .unwrap_or(u64::MAX);
    assert!(
        (1..=3).contains(&peak),
        "{peak} nodes held a benchmark pod at once; the wave is 3 (10% of 30): {report}"
    );
}
