//! Full result documents kept after the pods are gone: the agent prints the full document
//! as the last line of its log, and the run controller copies it, before the run ends (so
//! before any pod of the run can be deleted), into one ConfigMap per node and FabricTest,
//! `gpufabric-result-<test>-<node hash>`, in the pods' namespace. Each holds the latest
//! run only, is labelled with test, run and node, and is owned by the FabricTest (deleted
//! with it). A document over [`PLAIN_LIMIT`] is stored gzipped in `binaryData`; one still
//! over the limit is not stored, with a message; a last line over [`MAX_LOG_BYTES`] is not
//! even read (see [`bounded`]). Storing is best effort: a failure is
//! reported and changes nothing else about the run.

use super::bounded::{self, MAX_LOG_BYTES, last_document};
use crate::names;
use flate2::Compression;
use flate2::write::GzEncoder;
use futures::StreamExt;
use gpufabric_api::keys::{
    ANNOTATION_RESULT_NODE, LABEL_NODE, LABEL_RUN, LABEL_TEST, MANAGER, RESULT_KEY, RESULT_KEY_GZIP,
};
use gpufabric_api::run::{FabricTestRun, NodeRunResult, NodeVerdict};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, LogParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;
use std::io::Write;

/// Largest document stored as it is, and largest gzipped one: a ConfigMap holds at most
/// 1 MiB, and the object's metadata needs some of it.
pub const PLAIN_LIMIT: usize = 900 * 1024;

/// How a document is stored.
#[derive(Clone, Debug, PartialEq)]
pub enum Payload {
    Plain(String),
    Gzip(Vec<u8>),
}

/// Why a document was not stored.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "the full result is {raw} bytes ({compressed} gzipped), over the {PLAIN_LIMIT}-byte limit of a ConfigMap: not kept"
    )]
    TooLarge { raw: usize, compressed: usize },
    #[error("compressing the full result: {0}")]
    Compress(#[source] std::io::Error),
    #[error("could not read the results of pod {pod}: {}", Answer(.source))]
    Log {
        pod: String,
        #[source]
        source: kube::Error,
    },
    #[error("could not read the results of pod {pod}: no answer within {}s", LOG_READ_TIMEOUT.as_secs())]
    LogTimeout { pod: String },
    #[error("the results of pod {pod} were not kept: {source}")]
    Refused {
        pod: String,
        #[source]
        source: bounded::Refused,
    },
    #[error("could not write ConfigMap {name}: {}", Answer(.source))]
    Write {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// A client error as a reader of a run's status takes it: what the API server answered
/// (`403 Forbidden: pods "x" is forbidden: ...`), not the client's debug text of it.
struct Answer<'a>(&'a kube::Error);

impl std::fmt::Display for Answer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kube::Error::Api(s) = self.0 else {
            return write!(f, "{}", self.0);
        };
        write!(f, "the API server answered {}", s.code)?;
        if !s.reason.is_empty() {
            write!(f, " {}", s.reason)?;
        }
        if !s.message.is_empty() {
            write!(f, ": {}", s.message)?;
        }
        Ok(())
    }
}

/// The ConfigMap name of `node`'s full result for FabricTest `test`.
pub fn config_map_name(test: &str, node: &str) -> String {
    let hash = format!("{:08x}", names::fnv1a(node.as_bytes()) as u32);
    names::bounded(&format!("gpufabric-result-{test}-{hash}"), 253)
}

/// The document as stored: as it is when it fits, else gzipped when that fits.
pub fn encode(doc: &str) -> Result<Payload, StoreError> {
    if doc.len() <= PLAIN_LIMIT {
        return Ok(Payload::Plain(doc.to_string()));
    }
    let mut gz = GzEncoder::new(Vec::new(), Compression::best());
    gz.write_all(doc.as_bytes()).map_err(StoreError::Compress)?;
    let bytes = gz.finish().map_err(StoreError::Compress)?;
    if bytes.len() > PLAIN_LIMIT {
        return Err(StoreError::TooLarge {
            raw: doc.len(),
            compressed: bytes.len(),
        });
    }
    Ok(Payload::Gzip(bytes))
}

/// Where one node's document goes.
#[derive(Clone, Debug)]
pub struct Target<'a> {
    pub namespace: &'a str,
    pub test: &'a str,
    pub run: &'a str,
    pub node: &'a str,
    /// The FabricTest, owner of the ConfigMap (None: not owned).
    pub owner: Option<OwnerReference>,
}

/// The ConfigMap that holds `payload` for `target`. Pure.
pub fn config_map(target: &Target<'_>, payload: Payload) -> ConfigMap {
    let labels = BTreeMap::from([
        (LABEL_TEST.to_string(), names::label_value(target.test)),
        (LABEL_RUN.to_string(), names::label_value(target.run)),
        (LABEL_NODE.to_string(), names::label_value(target.node)),
    ]);
    let (data, binary_data) = match payload {
        Payload::Plain(s) => (Some(BTreeMap::from([(RESULT_KEY.to_string(), s)])), None),
        Payload::Gzip(b) => (
            None,
            Some(BTreeMap::from([(
                RESULT_KEY_GZIP.to_string(),
                ByteString(b),
            )])),
        ),
    };
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(config_map_name(target.test, target.node)),
            namespace: Some(target.namespace.to_string()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                ANNOTATION_RESULT_NODE.to_string(),
                target.node.to_string(),
            )])),
            owner_references: target.owner.clone().map(|o| vec![o]),
            ..Default::default()
        },
        data,
        binary_data,
        ..Default::default()
    }
}

/// Reads the last line of `pod`'s log and, when it is a full document, stores it for
/// `target` (server-side apply: the ConfigMap holds the latest run only). Ok(false): the
/// log holds no document (nothing to keep).
pub async fn keep(
    pods: &Api<Pod>,
    config_maps: &Api<ConfigMap>,
    pod: &str,
    target: &Target<'_>,
) -> Result<bool, StoreError> {
    // Asked of the API server with one byte over the bound, so that a line the bound cuts
    // is told from one that fits; and never more read than that, whatever the answer.
    let lp = LogParams {
        container: Some(crate::pods::CONTAINER.to_string()),
        tail_lines: Some(1),
        limit_bytes: Some(MAX_LOG_BYTES as i64 + 1),
        ..Default::default()
    };
    let read = async {
        let stream = pods
            .log_stream(pod, &lp)
            .await
            .map_err(|source| StoreError::Log {
                pod: pod.to_string(),
                source,
            })?;
        bounded::read_bounded(Box::pin(stream), MAX_LOG_BYTES)
            .await
            .map_err(|source| StoreError::Refused {
                pod: pod.to_string(),
                source,
            })
    };
    let bytes = tokio::time::timeout(LOG_READ_TIMEOUT, read)
        .await
        .map_err(|_| StoreError::LogTimeout {
            pod: pod.to_string(),
        })??;
    let log = String::from_utf8_lossy(&bytes);
    let Some(doc) = last_document(&log) else {
        return Ok(false);
    };
    let cm = config_map(target, encode(doc)?);
    let name = config_map_name(target.test, target.node);
    config_maps
        .patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&cm),
        )
        .await
        .map_err(|source| StoreError::Write { name, source })?;
    Ok(true)
}

/// Longest wait for one pod's log (a node whose kubelet is gone may never answer).
pub const LOG_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Pod logs read at once.
pub const KEEP_CONCURRENCY: usize = 16;

/// What [`keep_all`] did.
#[derive(Debug, Default)]
pub struct Kept {
    /// Nodes whose document is now stored (or whose pod's log held none to keep).
    pub nodes: Vec<String>,
    /// A note for the run status when some could not be kept.
    pub note: Option<String>,
}

/// Whether a node's pod left a full result to keep: it ran, and the agent measured (or met a
/// hardware fault); a pod not measured or stopped at the deadline has none.
pub fn worth_keeping(e: &NodeRunResult) -> bool {
    e.pod.is_some() && !matches!(e.verdict, NodeVerdict::NotMeasured | NodeVerdict::Timeout)
}

/// Keeps the full document of every node of `entries` whose pod ended with a result
/// (measured or a hardware fault; pods stopped at the deadline are gone), in `namespace`
/// (the benchmark pods'; the run itself is cluster-scoped). Never fails the run.
pub async fn keep_all(
    client: &Client,
    namespace: &str,
    run: &FabricTestRun,
    entries: &[NodeRunResult],
) -> Kept {
    let ns = namespace.to_string();
    let owner = run
        .owner_references()
        .iter()
        .find(|o| o.kind == "FabricTest" && o.controller == Some(true))
        .map(|o| OwnerReference {
            block_owner_deletion: None,
            controller: None,
            ..o.clone()
        });
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let run_name = run.name_any();
    let jobs: Vec<_> = entries
        .iter()
        .filter(|e| worth_keeping(e))
        .filter_map(|e| e.pod.clone().map(|p| (e.node.clone(), p)))
        .map(|(node, pod)| {
            let (pods, config_maps) = (pods.clone(), config_maps.clone());
            let (ns, test, run_name, owner) = (
                ns.clone(),
                run.spec.test.clone(),
                run_name.clone(),
                owner.clone(),
            );
            async move {
                let target = Target {
                    namespace: &ns,
                    test: &test,
                    run: &run_name,
                    node: &node,
                    owner,
                };
                match keep(&pods, &config_maps, &pod, &target).await {
                    Ok(_) => Ok(node),
                    Err(e) => Err(format!("{node}: {e}")),
                }
            }
        })
        .collect();
    let done: Vec<Result<String, String>> = futures::stream::iter(jobs)
        .buffer_unordered(KEEP_CONCURRENCY)
        .collect()
        .await;
    let (nodes, failures): (Vec<_>, Vec<_>) = done.into_iter().partition(Result::is_ok);
    let nodes = nodes.into_iter().flatten().collect();
    let failures: Vec<String> = failures.into_iter().filter_map(Result::err).collect();
    if failures.is_empty() {
        return Kept { nodes, note: None };
    }
    for f in &failures {
        tracing::warn!(failure = %f, "full result not kept");
    }
    let note = format!(
        "full results not kept for {} node(s): {}",
        failures.len(),
        failures
            .iter()
            .take(3)
            .cloned()
            .collect::<Vec<_>>()
            .join("; ")
    );
    Kept {
        nodes,
        note: Some(note),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::read::GzDecoder;
    use std::io::Read;

    #[test]
    fn small_documents_are_kept_as_they_are() {
        assert_eq!(encode("{}").ok(), Some(Payload::Plain("{}".into())));
    }

    #[test]
    fn large_documents_are_gzipped_and_read_back_whole() {
        let doc = format!("{{\"x\":\"{}\"}}", "abc".repeat(PLAIN_LIMIT));
        let Ok(Payload::Gzip(bytes)) = encode(&doc) else {
            panic!("gzipped");
        };
        assert!(bytes.len() <= PLAIN_LIMIT);
        let mut back = String::new();
        GzDecoder::new(&bytes[..])
            .read_to_string(&mut back)
            .expect("gunzip");
        assert_eq!(back, doc);
    }

    #[test]
    fn documents_too_large_even_gzipped_are_refused_with_their_sizes() {
        // Incompressible: distinct pseudo-random characters.
        let mut x: u64 = 1;
        let doc: String = (0..2 * PLAIN_LIMIT)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                char::from(b'!' + (x >> 58) as u8 + (x >> 60) as u8)
            })
            .collect();
        match encode(&doc) {
            Err(e @ StoreError::TooLarge { .. }) => {
                assert!(e.to_string().contains("not kept"), "{e}")
            }
            other => panic!("refused: {other:?}"),
        }
    }

    #[test]
    fn the_config_map_is_named_labelled_and_owned_per_test_and_node() {
        let owner = OwnerReference {
            api_version: "gpufabric.io/v1alpha1".into(),
            kind: "FabricTest".into(),
            name: "nightly".into(),
            uid: "u1".into(),
            ..Default::default()
        };
        let long_node = format!("node-{}", "x".repeat(240));
        let t = Target {
            namespace: "gpufabric",
            test: "nightly",
            run: "nightly-1",
            node: &long_node,
            owner: Some(owner),
        };
        let cm = config_map(&t, Payload::Plain("{}".into()));
        let name = cm.metadata.name.clone().unwrap_or_default();
        assert!(
            name.starts_with("gpufabric-result-nightly-") && name.len() <= 253,
            "{name}"
        );
        assert_ne!(name, config_map_name("nightly", "node-other"));
        let labels = cm.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels[LABEL_RUN], "nightly-1");
        assert!(labels[LABEL_NODE].len() <= 63);
        assert_eq!(
            cm.metadata.annotations.unwrap_or_default()[ANNOTATION_RESULT_NODE],
            long_node
        );
        assert_eq!(
            cm.metadata.owner_references.map(|o| o[0].uid.clone()),
            Some("u1".into())
        );
        assert_eq!(cm.data.map(|d| d[RESULT_KEY].clone()), Some("{}".into()));
        let gz = config_map(&t, Payload::Gzip(vec![1, 2]));
        assert!(gz.data.is_none());
        assert_eq!(
            gz.binary_data.map(|d| d[RESULT_KEY_GZIP].0.clone()),
            Some(vec![1, 2])
        );
    }

    #[tokio::test]
    async fn a_log_the_api_server_refuses_is_noted_as_its_answer_in_a_sentence() {
        use crate::controller::fake_api::{self, Expect};
        use http::{Method, StatusCode};
        let (client, handle) = fake_api::client();
        let mut refusal = fake_api::status(403, "Forbidden");
        refusal["message"] = serde_json::json!(
            "pods \"nightly-1-gpu-01\" is forbidden: User \"op\" cannot get resource \"pods/log\""
        );
        let server = fake_api::serve(
            handle,
            vec![Expect::new(
                Method::GET,
                "/api/v1/namespaces/gpufabric/pods/nightly-1-gpu-01/log",
                StatusCode::FORBIDDEN,
                refusal,
            )],
        );
        let run = FabricTestRun::new(
            "nightly-1",
            gpufabric_api::run::FabricTestRunSpec::of_test(
                "nightly",
                &Default::default(),
                gpufabric_api::run::Trigger::Schedule,
                None,
                None,
            ),
        );
        let entry = NodeRunResult {
            node: "gpu-01".into(),
            verdict: NodeVerdict::Passed,
            pod: Some("nightly-1-gpu-01".into()),
            ..Default::default()
        };
        let kept = keep_all(&client, "gpufabric", &run, &[entry]).await;
        drop(client);
        assert!(server.await.expect("server").missing.is_empty());
        assert!(kept.nodes.is_empty());
        assert_eq!(
            kept.note.as_deref(),
            Some(
                "full results not kept for 1 node(s): gpu-01: could not read the results of pod \
                 nightly-1-gpu-01: the API server answered 403 Forbidden: pods \"nightly-1-gpu-01\" \
                 is forbidden: User \"op\" cannot get resource \"pods/log\""
            )
        );
    }
}
