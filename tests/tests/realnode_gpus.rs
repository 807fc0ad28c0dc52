//! The GPU device plugin fixture (`tests/cluster/deviceplugin`, what `bench/gpu-e2e.sh` runs
//! with `E2E_NODE=real` on a GPU host) under the real kubelet, containerd and runc: the node
//! advertises one `nvidia.com/gpu` per device node, and each pod gets the device nodes and the
//! driver's libraries of the GPUs it was allocated and no other GPU's; the node-side faults
//! of the GPU end-to-end run (a GPU withheld from the pod, the SDC hook) reach the pod as
//! they would there. The GPUs here are character devices made for the test (the null
//! device's numbers under the names of /dev/nvidiaN) and the driver's libraries empty shared
//! objects with the driver's sonames: what the kubelet and runc hand a container does not
//! depend on what is behind them. Needs root, the node binaries
//! (`tests/cluster/build-node.sh`), Go (the fixture is built from its module) and a C
//! compiler (the libraries).

use gpufabric_tests::realnode::{self, BUSYBOX_IMAGE, RealNode};
use gpufabric_tests::shared::TestEnv;
use gpufabric_tests::wait;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, LogParams, PostParams};
use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);
const GPUS: usize = 4;

/// The fake GPUs, the plugin's fault file, and the plugin process, alive as long as the test
/// binary (the plugin dies with it: PR_SET_PDEATHSIG, from a thread that lives as long).
struct Gpus {
    _dir: tempfile::TempDir,
    fault: PathBuf,
    _plugin: Mutex<Child>,
}

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

/// Builds the fixture, makes the fake GPUs and libraries under a temp dir, and starts the
/// plugin against `node`'s kubelet.
fn start_plugin(node: &RealNode) -> Result<Gpus, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let (dev, lib) = (dir.path().join("dev"), dir.path().join("lib"));
    for d in [&dev, &lib] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
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
    let log = std::fs::File::create(node.log_path("gpu-device-plugin"))
        .map_err(|e| format!("plugin log: {e}"))?;
    let mut cmd = Command::new(&bin);
    // The kubelet's device plugin directory is fixed, whatever its --root-dir.
    cmd.arg("-dev")
        .arg(&dev)
        .arg("-driver-lib")
        .arg(&lib)
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
        _dir: dir,
        fault,
        _plugin: Mutex::new(plugin),
    })
}

async fn env(name: &str) -> (TestEnv, &'static RealNode, Api<Pod>, &'static Gpus) {
    let (env, node) = realnode::shared_env(name).await;
    let gpus = match GPU_PLUGIN.get_or_init(|| start_plugin(node)) {
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
    let script = format!(
        "echo gpus: $(cd /dev && ls -d nvidia[0-9]* | tr '\\n' ' '); \
         test -c /dev/nvidiactl && echo ctl: yes; \
         for l in libcuda.so.1 libnvidia-ml.so.1; do test -f /usr/lib/x86_64-linux-gnu/$l && echo lib: $l; done; \
         echo visible: $NVIDIA_VISIBLE_DEVICES; echo sdc: ${{FABRIC_TEST_FLIP_SDC_BIT:-none}}; sleep {hold}"
    );
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
                "command": ["/bin/sh", "-c", script],
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}},
            }],
        },
    }))
    .expect("a valid pod")
}

/// What a pod of [`gpu_pod`] was given, read from its log once it has ended.
#[derive(Debug, Default)]
struct Given {
    gpus: BTreeSet<String>,
    ctl: bool,
    libs: Vec<String>,
    visible: String,
    sdc: String,
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
