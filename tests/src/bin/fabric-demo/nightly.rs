//! The demo's run: deploy/examples/nightly.yaml applied (after a training job takes one
//! node's GPUs), waited on until it settles, then reported.

use crate::NAMESPACE;
use crate::print::{info, step};
use crate::report::{not_measured, print_quarantine, print_run};
use crate::setup::kubectl;
use anyhow::{Context, bail};
use gpufabric_api::{FabricTest, FabricTestRun, keys};
use gpufabric_tests::cluster::Cluster;
use gpufabric_tests::fixtures;
use gpufabric_tests::workspace_root;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use std::time::{Duration, Instant};

pub(crate) async fn run_nightly(
    cluster: &Cluster,
    timeout: u64,
    operator: &mut std::process::Child,
    busy: Option<&str>,
) -> anyhow::Result<String> {
    let name = apply_nightly(cluster, busy).await?;
    let tests: Api<FabricTest> = Api::all(cluster.client());
    let runs: Api<FabricTestRun> = Api::all(cluster.client());
    let lp = ListParams::default().labels(&format!("{}={name}", keys::LABEL_TEST));
    wait_settled(&tests, &runs, &lp, &name, timeout, operator).await?;
    step("kubectl get ft,ftr -o wide");
    kubectl(cluster, &["get", "ft,ftr", "-o", "wide"]);
    for r in runs.list(&lp).await?.items {
        print_run(cluster, &r).await?;
    }
    let ft = tests.get(&name).await?;
    print_quarantine(cluster, &ft).await?;
    not_measured(&runs.list(&lp).await?.items);
    Ok(name)
}

/// Applies deploy/examples/nightly.yaml (run now, sim backend, the training pool), after
/// a training job takes every GPU of `busy`. Returns the FabricTest's name.
async fn apply_nightly(cluster: &Cluster, busy: Option<&str>) -> anyhow::Result<String> {
    cluster.create_namespace(NAMESPACE).await?;
    if let Some(node) = busy {
        step(format!(
            "a training job holds every GPU of {node} (pod {NAMESPACE}/{}): gpufabric must not test it, nor blame it",
            fixtures::gpu_holder_name(node)
        ));
        fixtures::hold_gpus(&cluster.client(), NAMESPACE, node, 8)
            .await
            .with_context(|| format!("holding the GPUs of {node}"))?;
    }
    let path = workspace_root().join("deploy/examples/nightly.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut obj: DynamicObject = serde_yaml::from_str(&text)?;
    let name = obj
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| "nightly".into());
    obj.metadata.annotations.get_or_insert_default().insert(
        keys::ANNOTATION_RUN_NOW.into(),
        chrono::Utc::now().to_rfc3339(),
    );
    let spec = obj
        .data
        .get_mut("spec")
        .and_then(|s| s.as_object_mut())
        .context("nightly.yaml has no spec")?;
    spec.insert(
        "nodeSelector".into(),
        serde_json::json!({"pool": "training"}),
    );
    // Node pairs over the nodes that pass their own check, in a ring, then a retest round;
    // then the multi-node DDP probe over 4 of the nodes that passed both.
    spec.insert(
        "suite".into(),
        serde_json::json!({
            "nodePairs": {"enabled": true, "pairing": "ring"},
            "ddpNodes": {"enabled": true, "maxNodes": 4},
        }),
    );
    spec.insert(
        "agent".into(),
        serde_json::json!({
            "env": [{"name": keys::ENV_BACKEND, "value": "sim"}],
            "timeoutSeconds": 120,
        }),
    );
    let dynamic: Api<DynamicObject> = Api::all_with(
        cluster.client(),
        &kube::api::ApiResource::erase::<FabricTest>(&()),
    );
    step(format!(
        "applying deploy/examples/nightly.yaml as FabricTest {name} (cluster-scoped; pods in {NAMESPACE}) with {}, FABRIC_BACKEND=sim, nodeSelector pool=training, suite.nodePairs in a ring, suite.ddpNodes over 4 nodes",
        keys::ANNOTATION_RUN_NOW
    ));
    dynamic.create(&PostParams::default(), &obj).await?;

    Ok(name)
}

/// Waits until the test's runs (and any confirmation run) have finished and nothing has
/// changed for 5 s, printing each change of their progress; gives up after `timeout` s.
async fn wait_settled(
    tests: &Api<FabricTest>,
    runs: &Api<FabricTestRun>,
    lp: &ListParams,
    name: &str,
    timeout: u64,
    operator: &mut std::process::Child,
) -> anyhow::Result<()> {
    step("waiting for the run(s) to finish");
    let end = Instant::now() + Duration::from_secs(timeout);
    let mut last_line = String::new();
    let mut settled_since: Option<Instant> = None;
    loop {
        if let Ok(Some(status)) = operator.try_wait() {
            bail!("the operator exited with {status}");
        }
        let list = runs.list(lp).await?;
        let ft = tests.get(name).await?;
        let active = ft.status.as_ref().and_then(|s| s.active_run.clone());
        let mut parts = Vec::new();
        for r in &list.items {
            let st = r.status.clone().unwrap_or_default();
            parts.push(format!(
                "{} ({}) {:?}: {}/{} nodes passed, {} failed, {} errored",
                r.metadata.name.clone().unwrap_or_default(),
                r.spec.trigger.as_str(),
                st.phase,
                st.passed,
                st.node_count,
                st.failed,
                st.errored
            ));
        }
        let line = if parts.is_empty() {
            "no run yet".to_string()
        } else {
            parts.join("; ")
        };
        if line != last_line {
            info(&line);
            last_line = line;
        }
        let all_done = !list.items.is_empty()
            && active.is_none()
            && list
                .items
                .iter()
                .all(|r| r.status.as_ref().is_some_and(|s| s.phase.is_finished()));
        // A finished run may be followed by a confirmation run: wait until nothing changes.
        match (all_done, settled_since) {
            (true, Some(t)) if t.elapsed() > Duration::from_secs(5) => break,
            (true, None) => settled_since = Some(Instant::now()),
            (false, _) => settled_since = None,
            _ => {}
        }
        if Instant::now() > end {
            info(format!(
                "no finished run after {timeout}s; showing what there is"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    Ok(())
}
