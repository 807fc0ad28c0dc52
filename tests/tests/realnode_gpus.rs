//! The GPU device plugin fixture (`tests/cluster/deviceplugin`, what `bench/gpu-e2e.sh` runs
//! with `E2E_NODE=real` on a GPU host) under the real kubelet, containerd and runc: the node
//! advertises one `nvidia.com/gpu` per device node, and each pod gets the device nodes and the
//! driver's libraries of the GPUs it was allocated and no other GPU's; the node-side faults
//! of the GPU end-to-end run (a GPU withheld from the pod, the SDC hook) reach the pod as
//! they would there. The GPUs here are character devices made for the test (the null
//! device's numbers under the names of /dev/nvidiaN) and the driver's libraries empty shared
//! objects with the driver's sonames: what the kubelet and runc hand a container does not
//! depend on what is behind them.
//!
//! The node runs DRA too (`RealNodeOptions::dra`): the GPU DRA kubelet plugin
//! (`tests/cluster/draplugin`) publishes the same GPUs as devices, the real scheduler
//! allocates a claim for them, the kubelet has the plugin prepare it, and containerd 1.7
//! gives the container the claim's GPUs through the CDI spec the plugin wrote; the operator's
//! benchmark pod, asking through its ResourceClaimTemplate, runs there. Needs root, the node
//! binaries (`tests/cluster/build-node.sh`, containerd 1.7 and the DRA plugin included), Go
//! (the device plugin is built from its module) and a C compiler (the libraries).

use gpufabric_operator::dra::slices::gpus_by_node;
use gpufabric_operator::pods::claim::{Gpus as ClaimGpus, benchmark_pod};
use gpufabric_operator::pods::{CONTAINER, node_check_pod};
use gpufabric_tests::dra::{self, DRIVER};
use gpufabric_tests::realnode::{self, BUSYBOX_IMAGE, Dra, RealNode, RealNodeOptions};
use gpufabric_tests::shared::TestEnv;
use gpufabric_tests::wait;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1beta1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, LogParams, PostParams};
use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);
const GPUS: usize = 4;

/// The stand-in GPUs (`dev`) and driver libraries (`lib`), made before the node starts (its
/// DRA plugin reads them) and kept as long as the test binary.
struct Fakes {
    dir: tempfile::TempDir,
    dev: PathBuf,
    lib: PathBuf,
    /// The node's fault file, read by both plugins.
    fault: PathBuf,
}

/// The device plugin's fault file and process, alive as long as the test binary (the plugin
/// dies with it: PR_SET_PDEATHSIG, from a thread that lives as long).
struct Gpus {
    fault: PathBuf,
    _plugin: Mutex<Child>,
}

static FAKES: OnceLock<Result<Fakes, String>> = OnceLock::new();
static GPU_PLUGIN: OnceLock<Result<Gpus, String>> = OnceLock::new();
/// The fault file is the node's: tests that allocate GPUs take turns.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Makes the fake GPUs and libraries under a temp dir.
fn make_fakes() -> Result<Fakes, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let (dev, lib) = (dir.path().join("dev"), dir.path().join("lib"));
    for d in [&dev, &lib] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let names = (0..GPUS)
        .map(|i| format!("nvidia{i}"))
        .chain(["nvidiactl".to_string(), "nvidia-uvm".to_string()]);
    for name in names {
        let path = std::ffi::CString::new(dev.join(&name).as_os_str().as_encoded_bytes())
            .map_err(|e| format!("{name}: {e}"))?;
        // SAFETY: a valid C string; the null device's numbers (1, 3).
        let rc = unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
        if rc != 0 {
            return Err(format!(
                "mknod {name}: {} (the test needs root)",
                std::io::Error::last_os_error()
            ));
        }
    }
    for (soname, file) in [
        ("libcuda.so.1", "libcuda.so.580.0"),
        ("libnvidia-ml.so.1", "libnvidia-ml.so.580.0"),
    ] {
        run(
            Command::new("cc")
                .args(["-shared", "-x", "c", "/dev/null"])
                .arg(format!("-Wl,-soname,{soname}"))
                .arg("-o")
                .arg(lib.join(file)),
            "cc, for the driver libraries' stand-ins",
        )?;
        std::os::unix::fs::symlink(file, lib.join(soname)).map_err(|e| format!("{soname}: {e}"))?;
    }
    let fault = dir.path().join("node-fault");
    std::fs::write(&fault, "").map_err(|e| format!("fault file: {e}"))?;
    Ok(Fakes {
        dir,
        dev,
        lib,
        fault,
    })
}

/// Builds the device plugin and starts it on `fakes` against `node`'s kubelet.
fn start_plugin(node: &RealNode, fakes: &Fakes) -> Result<Gpus, String> {
    let (dir, dev, lib) = (&fakes.dir, &fakes.dev, &fakes.lib);
    let root = gpufabric_tests::workspace_root();
    let bin = dir.path().join("gpu-device-plugin");
    run(
        Command::new("go")
            .args(["build", "-trimpath", "-o"])
            .arg(&bin)
            .arg(".")
            .current_dir(root.join("tests/cluster/deviceplugin"))
            .env("CGO_ENABLED", "0")
            .env("GOFLAGS", "-mod=mod"),
        "go build of tests/cluster/deviceplugin",
    )?;
    let fault = fakes.fault.clone();
    let log = std::fs::File::create(node.log_path("gpu-device-plugin"))
        .map_err(|e| format!("plugin log: {e}"))?;
    let mut cmd = Command::new(&bin);
    // The kubelet's device plugin directory is fixed, whatever its --root-dir.
    cmd.arg("-dev")
        .arg(dev)
        .arg("-driver-lib")
        .arg(lib)
        .arg("-fault-file")
        .arg(&fault)
        .stdout(log.try_clone().map_err(|e| format!("plugin log: {e}"))?)
        .stderr(log);
    // SAFETY: only prctl between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    // Spawned from a thread that never ends: PR_SET_PDEATHSIG fires when the spawning
    // *thread* exits, and a test's thread ends with the test.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("gpu-device-plugin".into())
        .spawn(move || {
            let _ = tx.send(cmd.spawn());
            loop {
                std::thread::park();
            }
        })
        .map_err(|e| format!("a thread for the plugin: {e}"))?;
    let plugin = rx
        .recv()
        .map_err(|_| "the plugin's thread ended".to_string())?
        .map_err(|e| format!("starting the plugin: {e}"))?;
    Ok(Gpus {
        fault,
        _plugin: Mutex::new(plugin),
    })
}

async fn env(name: &str) -> (TestEnv, &'static RealNode, Api<Pod>, &'static Gpus) {
    let fakes = match FAKES.get_or_init(make_fakes) {
        Ok(f) => f,
        Err(e) => panic!("the stand-in GPUs: {e}"),
    };
    let (env, node) = realnode::shared_env_with(
        name,
        realnode::dra_cluster_options(),
        RealNodeOptions {
            dra: Some(Dra {
                dev: fakes.dev.clone(),
                driver_lib: Some(fakes.lib.clone()),
                fault_file: Some(fakes.fault.clone()),
            }),
            ..RealNodeOptions::default()
        },
    )
    .await;
    let gpus = match GPU_PLUGIN.get_or_init(|| start_plugin(node, fakes)) {
        Ok(g) => g,
        Err(e) => panic!("the GPU device plugin: {e}"),
    };
    let nodes: Api<Node> = Api::all(env.client());
    wait::for_object(&nodes, node.name(), T, |n: Option<&Node>| {
        n.and_then(|n| n.status.as_ref())
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("nvidia.com/gpu"))
            .is_some_and(|q| q.0 == GPUS.to_string())
    })
    .await
    .expect("the node advertises the plugin's GPUs");
    let pods = Api::namespaced(env.client(), env.ns());
    (env, node, pods, gpus)
}

/// A pod of `gpus` GPUs that prints what it was given: its GPU device nodes, the control
/// node, the driver's libraries, and the plugin's environment; `hold` seconds so that pods
/// created together hold their GPUs at once.
fn gpu_pod(name: &str, node: &str, gpus: usize, hold: u32) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script(hold)],
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}},
            }],
        },
    }))
    .expect("a valid pod")
}

/// The script of a pod that prints what it was given ([`Given`]), then sleeps `hold` seconds.
fn script(hold: u32) -> String {
    format!(
        "echo gpus: $(cd /dev && ls -d nvidia[0-9]* | tr '\\n' ' '); \
         test -c /dev/nvidiactl && echo ctl: yes; \
         for l in libcuda.so.1 libnvidia-ml.so.1; do test -f /usr/lib/x86_64-linux-gnu/$l && echo lib: $l; done; \
         echo visible: $NVIDIA_VISIBLE_DEVICES; echo sdc: ${{FABRIC_TEST_FLIP_SDC_BIT:-none}}; \
         echo dra: $GPUFABRIC_DRA_DEVICES; sleep {hold}"
    )
}

/// What a pod of [`gpu_pod`] was given, read from its log once it has ended.
#[derive(Debug, Default)]
struct Given {
    gpus: BTreeSet<String>,
    ctl: bool,
    libs: Vec<String>,
    visible: String,
    sdc: String,
    /// The DRA plugin's devices (GPUFABRIC_DRA_DEVICES), comma-separated.
    dra: String,
}

async fn given(pods: &Api<Pod>, name: &str) -> Given {
    let pod = wait::for_object(pods, name, T, |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
    })
    .await
    .expect("pod ends")
    .expect("pod exists");
    // The kubelet serves a container's log a moment after its status says it ended.
    let mut log = Err(String::new());
    for _ in 0..10 {
        log = pods
            .logs(name, &LogParams::default())
            .await
            .map_err(|e| e.to_string());
        if log.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let log = log.unwrap_or_else(|e| panic!("the log of {name}: {e}; the pod: {:?}", pod.status));
    let mut g = Given::default();
    for line in log.lines() {
        let (key, value) = line.split_once(": ").unwrap_or((line, ""));
        match key {
            "gpus" => g.gpus = value.split_whitespace().map(str::to_string).collect(),
            "ctl" => g.ctl = true,
            "lib" => g.libs.push(value.to_string()),
            "visible" => g.visible = value.trim().to_string(),
            "sdc" => g.sdc = value.trim().to_string(),
            "dra" => g.dra = value.trim().to_string(),
            _ => {}
        }
    }
    g
}

async fn create(pods: &Api<Pod>, pod: &Pod) {
    pods.create(&PostParams::default(), pod)
        .await
        .expect("pod created");
}

fn set_fault(gpus: &Gpus, fault: &str) {
    std::fs::write(&gpus.fault, fault).expect("fault written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_at_once_each_get_the_device_nodes_of_their_own_gpus_only() {
    let (_env, node, pods, gpus) = env("own-gpus").await;
    let _turn = TURN.lock().await;
    set_fault(gpus, "");
    create(&pods, &gpu_pod("half-a", node.name(), GPUS / 2, 3)).await;
    create(&pods, &gpu_pod("half-b", node.name(), GPUS / 2, 3)).await;
    let (a, b) = (given(&pods, "half-a").await, given(&pods, "half-b").await);
    for g in [&a, &b] {
        assert_eq!(g.gpus.len(), GPUS / 2, "{g:?}");
        assert!(g.ctl, "the control device node: {g:?}");
        assert_eq!(g.libs, ["libcuda.so.1", "libnvidia-ml.so.1"], "{g:?}");
        assert_eq!(g.visible.split(',').count(), GPUS / 2, "{g:?}");
    }
    assert!(a.gpus.is_disjoint(&b.gpus), "{a:?} and {b:?} share a GPU");
    let all: BTreeSet<String> = (0..GPUS).map(|i| format!("nvidia{i}")).collect();
    assert_eq!(a.gpus.union(&b.gpus).cloned().collect::<BTreeSet<_>>(), all);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_side_faults_reach_the_pod_as_on_the_gpu_host() {
    let (_env, node, pods, gpus) = env("gpu-faults").await;
    let _turn = TURN.lock().await;
    set_fault(gpus, "hidden-gpu");
    create(&pods, &gpu_pod("hidden", node.name(), GPUS, 0)).await;
    let hidden = given(&pods, "hidden").await;
    assert_eq!(
        hidden.gpus.len(),
        GPUS - 1,
        "all {GPUS} allocated, one withheld: {hidden:?}"
    );
    assert_eq!(hidden.sdc, "none");

    set_fault(gpus, "sdc");
    create(&pods, &gpu_pod("sdc", node.name(), GPUS, 0)).await;
    let sdc = given(&pods, "sdc").await;
    assert_eq!(sdc.gpus.len(), GPUS, "{sdc:?}");
    assert_eq!(sdc.sdc, (GPUS - 1).to_string(), "the last GPU's SDC hook");

    set_fault(gpus, "");
    create(&pods, &gpu_pod("clean", node.name(), GPUS, 0)).await;
    let clean = given(&pods, "clean").await;
    assert_eq!((clean.gpus.len(), clean.sdc.as_str()), (GPUS, "none"));
}

/// A ResourceClaim `name` for `count` of the DRA plugin's GPUs, and a pod that prints what
/// it was given ([`script`]) and holds it `hold` seconds, kept to `node` by affinity: the scheduler allocates the claim.
fn claim_and_pod(name: &str, node: &str, count: usize, hold: u32) -> (ResourceClaim, Pod) {
    let claim = serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{
            "name": "gpus",
            "deviceClassName": dra::DEVICE_CLASS,
            "allocationMode": "ExactCount",
            "count": count,
        }]}},
    }))
    .expect("a valid claim");
    let pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
            "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script(hold)],
                "resources": {"claims": [{"name": "gpus"}]},
            }],
        },
    }))
    .expect("a valid pod");
    (claim, pod)
}

/// The node's ResourceSlices of the GPU driver, once they hold `GPUS` devices.
async fn published(client: &kube::Client, node: &str) -> Vec<ResourceSlice> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let end = std::time::Instant::now() + T;
    loop {
        let mine: Vec<ResourceSlice> = slices
            .list(&ListParams::default())
            .await
            .expect("slices listed")
            .items
            .into_iter()
            .filter(|s| s.spec.driver == DRIVER && s.spec.node_name.as_deref() == Some(node))
            .collect();
        let devices: usize = mine
            .iter()
            .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
            .sum();
        if devices == GPUS {
            return mine;
        }
        assert!(
            std::time::Instant::now() < end,
            "the DRA plugin published {devices} of {GPUS} GPUs of {node}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the plugin has removed the CDI spec of claim `uid` (the kubelet unprepared it).
async fn unprepared(node: &RealNode, uid: &str) {
    let spec = node.cdi_specs().join(format!("gpufabric-claim-{uid}.json"));
    let end = std::time::Instant::now() + T;
    while spec.exists() {
        assert!(
            std::time::Instant::now() < end,
            "{} still there after its pod was deleted",
            spec.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_the_dra_plugins_gpus_reaches_its_container_and_the_operators_benchmark_pod_runs()
 {
    let (env, node, pods, gpus) = env("dra-claim").await;
    let _turn = TURN.lock().await;
    set_fault(gpus, "");
    let t0 = std::time::Instant::now();
    let client = env.client();

    // The plugin's slice reads as the simulated fixture's does: GPU i is device gpu-i of the
    // node's pool.
    let slices = published(&client, node.name()).await;
    let values: Vec<serde_json::Value> = slices
        .iter()
        .map(|s| serde_json::to_value(s).expect("slice as JSON"))
        .collect();
    let by_index = gpus_by_node(&values);
    let found = by_index.get(node.name()).expect("the node's GPUs read");
    assert_eq!(found.len(), GPUS, "{found:?}");
    for (i, d) in found {
        assert_eq!(
            (d.pool.as_str(), d.device.clone()),
            (node.name(), format!("gpu-{i}"))
        );
    }
    dra::create_device_class(&client)
        .await
        .expect("device class");

    // A claim of half the GPUs: allocated by the scheduler, prepared by the plugin, its GPUs
    // and only those given to the container through CDI.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), env.ns());
    let (claim, pod) = claim_and_pod("half", node.name(), GPUS / 2, 2);
    claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("claim created");
    create(&pods, &pod).await;
    // Read while the pod holds it: the claim is deallocated once its pod has ended.
    let claim = wait::for_object(&claims, "half", T, |c: Option<&ResourceClaim>| {
        c.and_then(|c| c.status.as_ref())
            .and_then(|s| s.allocation.as_ref())
            .is_some()
    })
    .await
    .expect("the scheduler allocates the claim")
    .expect("claim exists");
    let g = given(&pods, "half").await;
    let uid = claim.metadata.uid.clone().expect("claim uid");
    let allocated: Vec<String> = claim
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .unwrap_or_default()
        .into_iter()
        .map(|r| {
            assert_eq!((r.driver.as_str(), r.pool.as_str()), (DRIVER, node.name()));
            r.device
        })
        .collect();
    assert_eq!(allocated.len(), GPUS / 2, "the scheduler's allocation");
    let mut seen: Vec<String> = g.dra.split(',').map(str::to_string).collect();
    let mut want = allocated.clone();
    seen.sort();
    want.sort();
    assert_eq!(seen, want, "the container sees the claim's devices: {g:?}");
    let nodes: BTreeSet<String> = want.iter().map(|d| d.replace("gpu-", "nvidia")).collect();
    assert_eq!(
        g.gpus, nodes,
        "the device nodes of the claim's GPUs only: {g:?}"
    );
    assert!(g.ctl, "the control device node: {g:?}");
    assert_eq!(g.libs, ["libcuda.so.1", "libnvidia-ml.so.1"], "{g:?}");
    pods.delete("half", &DeleteParams::default().grace_period(0))
        .await
        .expect("pod deleted");
    unprepared(node, &uid).await;

    // The operator's benchmark pod of the node (the node check), asking for all GPUs through
    // its ResourceClaimTemplate; its agent replaced by the printing script, run as the agent
    // image's user. The run is not made here, so the pod and template go without its owner
    // reference (the garbage collector would take them).
    let mut run = gpufabric_api::run::FabricTestRun::new(
        "dra-run",
        gpufabric_api::run::FabricTestRunSpec::of_test(
            "dra",
            &gpufabric_api::test::FabricTestSpec::default(),
            gpufabric_api::run::Trigger::Schedule,
            None,
            None,
        ),
    );
    run.metadata.uid = Some("dra-run-uid".into());
    let built = benchmark_pod(
        &run,
        node.name(),
        ClaimGpus::Devices {
            count: GPUS as u32,
            version: "v1beta1",
        },
        |n| node_check_pod(&run, node.name(), n),
    )
    .expect("benchmark pod built");
    let mut template = built.template.expect("a claim template");
    template["metadata"]
        .as_object_mut()
        .expect("template metadata")
        .remove("ownerReferences");
    let mut pod = built.pod;
    pod.metadata.owner_references = None;
    let name = pod.metadata.name.clone().expect("pod name");
    let spec = pod.spec.as_mut().expect("pod spec");
    let agent = spec
        .containers
        .iter_mut()
        .find(|c| c.name == CONTAINER)
        .expect("the agent container");
    agent.image = Some(BUSYBOX_IMAGE.into());
    agent.image_pull_policy = Some("Never".into());
    agent.command = Some(vec!["/bin/sh".into(), "-c".into(), script(0)]);
    agent.args = None;
    // The agent image's user; busybox's image names none.
    if let Some(security) = agent.security_context.as_mut() {
        security.run_as_user = Some(65532);
    }
    let resource = ApiResource {
        group: "resource.k8s.io".into(),
        version: "v1beta1".into(),
        api_version: "resource.k8s.io/v1beta1".into(),
        kind: "ResourceClaimTemplate".into(),
        plural: "resourceclaimtemplates".into(),
    };
    let templates: Api<DynamicObject> = Api::namespaced_with(client.clone(), env.ns(), &resource);
    let template: DynamicObject = serde_json::from_value(template).expect("template as object");
    templates
        .create(&PostParams::default(), &template)
        .await
        .expect("template created");
    // With the node's SDC fault on, as the GPU end-to-end run makes it.
    set_fault(gpus, "sdc");
    create(&pods, &pod).await;
    let g = given(&pods, &name).await;
    set_fault(gpus, "");
    assert_eq!(
        g.sdc,
        (GPUS - 1).to_string(),
        "the last GPU's SDC hook: {g:?}"
    );
    assert_eq!(
        g.dra.split(',').count(),
        GPUS,
        "every GPU of the node: {g:?}"
    );
    assert_eq!(g.gpus.len(), GPUS, "{g:?}");
    let placed = pods.get(&name).await.expect("pod read");
    assert_eq!(
        placed.spec.and_then(|s| s.node_name).as_deref(),
        Some(node.name()),
        "placed by the scheduler on the node"
    );
    tracing::info!(seconds = t0.elapsed().as_secs_f64(), "the DRA case");
    eprintln!("the DRA case took {:.1} s", t0.elapsed().as_secs_f64());
}
