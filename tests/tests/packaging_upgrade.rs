//! A rolling upgrade of two operator replicas finishes: a follower is ready while it waits,
//! the leader gives the Lease up on SIGTERM, and the follower takes over within the lease
//! time and runs the controllers. Real `fabric-operator` binaries against a real
//! kube-apiserver.
//!
//! Build the binaries first: `cargo build --bins`.

use gpufabric_api::keys;
use gpufabric_api::run::FabricTestRun;
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::operator::{OperatorEnv, OperatorProcess, sim_agent};
use gpufabric_tests::wait;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use serde_json::json;
use std::time::{Duration, Instant};

const NS: &str = "gpufabric-system";
/// The operator's default lease duration (`leader::LeaderConfig::new`).
const LEASE: Duration = Duration::from_secs(15);

fn holder(l: Option<&Lease>) -> Option<String> {
    l.and_then(|l| l.spec.as_ref())
        .and_then(|s| s.holder_identity.clone())
}

async fn wait_ready(op: &OperatorProcess, who: &str) {
    let r = wait::poll(
        &format!("{who} /ready to answer 200"),
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { Ok(matches!(op.get("/ready").await, Some((200, _))).then_some(())) },
    )
    .await;
    if let Err(e) = r {
        panic!("{e}\n{}", op.log_tail(40));
    }
}

#[tokio::test]
async fn sigterm_hands_the_lease_to_the_ready_follower_within_the_lease_time() {
    let mut env = OperatorEnv::start(SimFleet::uniform("gpu", 1, H100, 8), NS).await;
    env.operator.kill();
    let mut lease_args = env.operator_args();
    lease_args.extend(["--leader-elect", "--lease-namespace", NS]);
    let log = |n: &str| env.dir.path().join(format!("operator-{n}.log"));
    let mut a =
        OperatorProcess::start_with(&env.cluster, log("a"), &lease_args, &[("POD_NAME", "op-a")]);
    let leases: Api<Lease> = Api::namespaced(env.cluster.client(), NS);
    wait::for_object(&leases, "fabric-operator", Duration::from_secs(30), |l| {
        holder(l).as_deref() == Some("op-a")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", a.log_tail(60)));
    let b =
        OperatorProcess::start_with(&env.cluster, log("b"), &lease_args, &[("POD_NAME", "op-b")]);

    // Both are ready: the leader with synced caches, the follower because it reached the
    // Lease. A Deployment rolling with maxUnavailable 0 needs the new (follower) pod ready.
    wait_ready(&a, "leader").await;
    wait_ready(&b, "follower").await;
    let metrics = b.metrics().await;
    assert!(
        metrics.contains("gpufabric_leader 0"),
        "the follower says it does not lead:\n{metrics}"
    );
    let transitions_before = leases
        .get("fabric-operator")
        .await
        .expect("lease")
        .spec
        .and_then(|s| s.lease_transitions)
        .unwrap_or(0);

    let sigterm = Instant::now();
    let exited = a.terminate(Duration::from_secs(20));
    let exit_time =
        exited.unwrap_or_else(|| panic!("the leader did not exit on SIGTERM\n{}", a.log_tail(40)));
    assert!(
        a.log_tail(20).contains("released the leader Lease"),
        "the leader released its Lease on SIGTERM:\n{}",
        a.log_tail(20)
    );
    wait::for_object(&leases, "fabric-operator", LEASE, |l| {
        holder(l).as_deref() == Some("op-b")
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "the follower did not lead within the lease time: {e}\n{}",
            b.log_tail(60)
        )
    });
    let takeover = sigterm.elapsed();
    eprintln!(
        "leader exited {:.2}s after SIGTERM; follower led {:.2}s after SIGTERM (lease {}s)",
        exit_time.as_secs_f64(),
        takeover.as_secs_f64(),
        LEASE.as_secs()
    );
    assert!(takeover < LEASE, "takeover took {takeover:?}");
    let lease = leases.get("fabric-operator").await.expect("lease");
    let spec = lease.spec.expect("lease spec");
    assert_eq!(spec.lease_transitions, Some(transitions_before + 1));
    assert_eq!(spec.lease_duration_seconds, Some(LEASE.as_secs() as i32));

    // The new leader runs the controllers: a new FabricTest gets a run that finishes.
    env.create_test(
        "after-upgrade",
        json!({
            "nodeSelector": {"pool": "training"},
            "suite": {"ncclSweep": {"collectives": ["allReduce"]}},
            "agent": sim_agent(60)
        }),
    )
    .await;
    let runs: Api<FabricTestRun> = env.runs_api();
    let selector = format!("{}=after-upgrade", keys::LABEL_TEST);
    let finished = wait::poll(
        "a finished run of after-upgrade",
        Duration::from_secs(90),
        Duration::from_millis(500),
        || async {
            let list = runs
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| gpufabric_tests::Error::Invalid(e.to_string()))?;
            Ok(list
                .items
                .into_iter()
                .find(|r| r.status.as_ref().is_some_and(|s| s.phase.is_finished())))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", b.log_tail(60)));
    eprintln!(
        "run {} finished under the new leader",
        kube::ResourceExt::name_any(&finished)
    );
    let metrics = b.metrics().await;
    assert!(metrics.contains("gpufabric_leader 1"), "{metrics}");
}
