//! Which Pod Security level each agent setting needs, against a real kube-apiserver's
//! PodSecurity admission: the benchmark pod the operator builds is created (server-side dry
//! run) in namespaces enforcing `restricted`, `baseline` and `privileged`. The default agent
//! meets `restricted`; `ipcLock` (root with IPC_LOCK) and `hostNetwork` need `privileged`,
//! as docs/install.md's table says.

use gpufabric_api::run::{FabricTestRun, FabricTestRunSpec, Trigger};
use gpufabric_api::test::{AgentSpec, DEFAULT_AGENT_IMAGE, FabricTestSpec};
use gpufabric_operator::pods::node_check_pod;
use gpufabric_tests::shared::TestEnv;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ObjectMeta, PostParams};

const LEVELS: [&str; 3] = ["restricted", "baseline", "privileged"];

/// The node-check pod of a run whose agent spec `agent` gives.
fn benchmark_pod(mut agent: AgentSpec) -> Pod {
    // The operator resolves an empty image to its --agent-image when it builds a run.
    agent.image = DEFAULT_AGENT_IMAGE.into();
    let spec = FabricTestSpec {
        agent,
        ..Default::default()
    };
    let mut run = FabricTestRun::new(
        "podsecurity-1",
        FabricTestRunSpec::of_test("podsecurity", &spec, Trigger::Manual, None, None),
    );
    run.metadata.uid = Some("00000000-0000-0000-0000-000000000001".into());
    node_check_pod(&run, "gpu-node-1", 8).expect("pod builds")
}

/// Whether `pod` is admitted in `ns` (a dry run: nothing is stored); the refusal's message
/// otherwise.
async fn admitted(client: &kube::Client, ns: &str, pod: &Pod) -> Result<(), String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match pods.create(&pp, pod).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) => Err(e.message),
        Err(e) => panic!("creating the pod in {ns} failed for another reason: {e}"),
    }
}

#[tokio::test]
async fn each_agent_setting_is_admitted_at_the_level_readme_gives() {
    let env = TestEnv::new("pod-security")
        .await
        .expect("test environment");
    let client = env.client();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for level in LEVELS {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(format!("{}-{level}", env.ns())),
                labels: Some(
                    [(
                        "pod-security.kubernetes.io/enforce".to_string(),
                        level.to_string(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .expect("namespace");
    }

    // (setting, the most restrictive level that admits it)
    let settings: [(&str, AgentSpec, &str); 3] = [
        ("default", AgentSpec::default(), "restricted"),
        (
            "ipcLock",
            AgentSpec {
                ipc_lock: true,
                ..Default::default()
            },
            "privileged",
        ),
        (
            "hostNetwork",
            AgentSpec {
                host_network: true,
                ..Default::default()
            },
            "privileged",
        ),
    ];
    for (setting, agent, needs) in settings {
        let pod = benchmark_pod(agent);
        let needed = LEVELS
            .iter()
            .position(|l| *l == needs)
            .expect("a known level");
        for (i, level) in LEVELS.iter().enumerate() {
            let ns = format!("{}-{level}", env.ns());
            let got = admitted(&client, &ns, &pod).await;
            if i >= needed {
                assert_eq!(got, Ok(()), "{setting} must be admitted under {level}");
            } else {
                let msg = got.expect_err(&format!("{setting} must be refused under {level}"));
                assert!(
                    msg.contains("violates PodSecurity"),
                    "{setting} under {level}: {msg}"
                );
            }
        }
    }
    for level in LEVELS {
        let _ = namespaces
            .delete(&format!("{}-{level}", env.ns()), &Default::default())
            .await;
    }
}
