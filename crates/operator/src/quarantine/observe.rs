//! Reading what the nodes show about quarantine, as one FabricTest sees them: the facts
//! the planner needs, and the records of what this test holds.

use super::QuarantineError;
use super::ownership::NodeObservation;
use gpufabric_api::quarantine::{QuarantineRecord, RecordError};
use gpufabric_api::test::FabricTest;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store};
use std::collections::{BTreeMap, BTreeSet};

/// Node reads [`observe`] keeps in flight at once.
pub const OBSERVE_CONCURRENCY: usize = 16;

/// The name of a (cluster-scoped) FabricTest: what records and metrics name it by.
pub fn test_key(test: &FabricTest) -> Result<String, QuarantineError> {
    match test.metadata.name.as_deref() {
        Some(name) => Ok(QuarantineRecord::test_key(name)),
        None => Err(QuarantineError::Unnamed),
    }
}

/// Read the named nodes and say, for each, what this test may do with it. Call it before
/// planning; pass the result through [`NodeObservation::facts`] to the planner. A node that
/// does not exist comes back with `exists: false` (not an error). Names are read
/// [`OBSERVE_CONCURRENCY`] at a time; the result is in the order of `node_names`, without
/// repeats.
pub async fn observe(
    client: &Client,
    test: &FabricTest,
    node_names: &[String],
) -> Result<Vec<NodeObservation>, QuarantineError> {
    observe_with(client, None, test, node_names).await
}

/// [`observe`], reading each node from `cache` (the operator's node cache) and from the API
/// server only the nodes the cache has not seen. The plan needs no fresher view: the
/// executor reads every node it changes again, re-checks each refusal on that read and
/// writes under its resourceVersion. At thousands of nodes this saves a GET a node a run.
pub async fn observe_cached(
    client: &Client,
    cache: &Store<Node>,
    test: &FabricTest,
    node_names: &[String],
) -> Result<Vec<NodeObservation>, QuarantineError> {
    observe_with(client, Some(cache), test, node_names).await
}

async fn observe_with(
    client: &Client,
    cache: Option<&Store<Node>>,
    test: &FabricTest,
    node_names: &[String],
) -> Result<Vec<NodeObservation>, QuarantineError> {
    use futures::{StreamExt, TryStreamExt};
    let key = test_key(test)?;
    let nodes: Api<Node> = Api::all(client.clone());
    let mut seen = BTreeSet::new();
    let unique: Vec<String> = node_names
        .iter()
        .filter(|n| seen.insert(n.as_str()))
        .cloned()
        .collect();
    // Owned values in each future: borrowed ones make the controller's future not Send.
    futures::stream::iter(unique)
        .map(move |name| {
            let (nodes, key) = (nodes.clone(), key.clone());
            let cached = cache.and_then(|c| c.get(&ObjectRef::new(&name)));
            async move {
                if let Some(node) = cached {
                    return Ok(NodeObservation::of(&name, Some(&node), &key));
                }
                let node =
                    nodes
                        .get_opt(&name)
                        .await
                        .map_err(|source| QuarantineError::GetNode {
                            node: name.clone(),
                            source,
                        })?;
                Ok(NodeObservation::of(&name, node.as_ref(), &key))
            }
        })
        .buffered(OBSERVE_CONCURRENCY)
        .try_collect()
        .await
}

/// What gpufabric holds in quarantine in the whole cluster, seen from one FabricTest.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Holdings {
    /// The nodes whose record names this test, with the record.
    pub ours: BTreeMap<String, QuarantineRecord>,
    /// Nodes whose record names another FabricTest, or cannot be read (nobody can tell
    /// whose they are): they count against the cluster-wide cap.
    pub others: usize,
}

/// Every node held in quarantine in the cluster (read from the API server, see
/// [`each_record`]), split into this test's and the others'.
pub async fn holdings(client: &Client, test: &FabricTest) -> Result<Holdings, QuarantineError> {
    let key = test_key(test)?;
    let mut out = Holdings::default();
    each_record(client, |name, record| match record {
        Ok(None) => {}
        Ok(Some(record)) if record.is_owned_by(&key) => {
            out.ours.insert(name, record);
        }
        Ok(Some(_)) | Err(_) => out.others += 1,
    })
    .await?;
    Ok(out)
}

/// Every node in the cluster whose record names this test, with the record. Nodes with an
/// unreadable record are not included (they are nobody's until a person fixes them).
pub async fn quarantined_by(
    client: &Client,
    test: &FabricTest,
) -> Result<BTreeMap<String, QuarantineRecord>, QuarantineError> {
    let key = test_key(test)?;
    records_of(client, &key).await
}

pub(super) async fn records_of(
    client: &Client,
    key: &str,
) -> Result<BTreeMap<String, QuarantineRecord>, QuarantineError> {
    let mut out = BTreeMap::new();
    each_record(client, |name, record| {
        if let Ok(Some(record)) = record
            && record.is_owned_by(key)
        {
            out.insert(name, record);
        }
    })
    .await?;
    Ok(out)
}

/// What a node list keeps of each node: its name and annotations. Everything else in the
/// metadata (managed fields above all: most of a Node's metadata) is skipped while parsing.
#[derive(serde::Deserialize)]
struct NodeAnnotations {
    metadata: AnnotationsOnly,
}

#[derive(serde::Deserialize)]
struct AnnotationsOnly {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(serde::Deserialize)]
struct NodePage {
    #[serde(default)]
    items: Vec<NodeAnnotations>,
    #[serde(default)]
    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta,
}

/// Calls `f` with every node's name and quarantine record (`Err` for one that cannot be
/// read), from the API server itself rather than the node cache: budgets and releases must
/// see every record written so far. Lists node metadata a page at a time ([`crate::paging`]) and keeps
/// only names and annotations, so that memory does not grow with the fleet.
async fn each_record(
    client: &Client,
    mut f: impl FnMut(String, Result<Option<QuarantineRecord>, RecordError>),
) -> Result<(), QuarantineError> {
    let request = kube::core::Request::new("/api/v1/nodes");
    let mut pages = crate::paging::Pages::default();
    while let Some(lp) = pages.next_params() {
        let mut req = request
            .list_metadata(&lp)
            .map_err(|e| QuarantineError::ListNodes(kube::Error::BuildRequest(e)))?;
        req.extensions_mut().insert("list_metadata");
        let page: NodePage = client
            .request(req)
            .await
            .map_err(QuarantineError::ListNodes)?;
        for node in page.items {
            let record = QuarantineRecord::from_annotations(node.metadata.annotations.as_ref());
            if let Some(name) = node.metadata.name {
                f(name, record);
            }
        }
        pages.read(page.metadata.continue_);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fake_api::{self, Expect};
    use http::{Method, StatusCode};
    use kube::runtime::watcher;
    use serde_json::json;

    fn node(name: &str, unschedulable: bool) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "resourceVersion": "7"},
            "spec": {"unschedulable": unschedulable}
        }))
        .expect("a node")
    }

    #[tokio::test]
    async fn cached_nodes_are_not_read_again_and_the_others_are() {
        let (cache, mut writer) = kube::runtime::reflector::store::<Node>();
        writer.apply_watcher_event(&watcher::Event::Apply(node("a", true)));
        let (client, handle) = fake_api::client();
        let server = fake_api::serve(
            handle,
            vec![Expect::new(
                Method::GET,
                "/api/v1/nodes/b",
                StatusCode::OK,
                serde_json::to_value(node("b", false)).expect("json"),
            )],
        );
        let test: FabricTest = serde_json::from_value(json!({
            "apiVersion": "gpufabric.io/v1alpha1", "kind": "FabricTest",
            "metadata": {"name": "t"}, "spec": {}
        }))
        .expect("a test");
        let names = ["a".to_string(), "b".to_string(), "a".to_string()];
        let seen = observe_cached(&client, &cache, &test, &names)
            .await
            .expect("observed");
        drop(client);
        let transcript = server.await.expect("server");
        assert_eq!(transcript.requests.len(), 1, "{transcript:?}");
        assert!(transcript.unexpected.is_empty() && transcript.missing.is_empty());
        let by_name: Vec<(&str, bool, bool)> = seen
            .iter()
            .map(|o| (o.node.as_str(), o.exists, o.cordoned_by_others))
            .collect();
        assert_eq!(by_name, [("a", true, true), ("b", true, false)]);
    }

    fn record(test: &str) -> String {
        json!({
            "test": test, "run": "r1", "reason": "slow", "since": "2026-11-25T02:00:00Z",
            "mode": "Cordon", "cordoned": true
        })
        .to_string()
    }

    /// Node metadata as the API server lists it, managed fields and all.
    fn nodes(nodes: &[(&str, Option<String>)]) -> Vec<serde_json::Value> {
        nodes
            .iter()
            .map(|(name, rec)| {
                let annotations = rec
                    .as_ref()
                    .map(|r| json!({ gpufabric_api::keys::ANNOTATION_QUARANTINE: r }))
                    .unwrap_or(json!({}));
                json!({
                    "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                    "metadata": {"name": name, "annotations": annotations,
                        "managedFields": [{"manager": "kubelet", "operation": "Update",
                            "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]}
                })
            })
            .collect()
    }

    #[tokio::test]
    async fn records_are_read_from_every_page_of_the_node_list() {
        let (client, handle) = fake_api::client();
        let server = fake_api::serve(
            handle,
            fake_api::paged_list(
                "/api/v1/nodes",
                "meta.k8s.io/v1",
                "PartialObjectMetadataList",
                vec![
                    nodes(&[("a", Some(record("t"))), ("b", None)]),
                    nodes(&[
                        ("c", Some(record("other"))),
                        ("d", Some("not json".into())),
                        ("e", Some(record("ns/t"))),
                    ]),
                ],
                &["next-page"],
            ),
        );
        let test: FabricTest = serde_json::from_value(json!({
            "apiVersion": "gpufabric.io/v1alpha1", "kind": "FabricTest",
            "metadata": {"name": "t"}, "spec": {}
        }))
        .expect("a test");
        let held = holdings(&client, &test).await.expect("listed");
        drop(client);
        server.await.expect("server").assert_paged(&["next-page"]);
        assert_eq!(held.ours.keys().collect::<Vec<_>>(), ["a", "e"]);
        // Another test's record and an unreadable one count against the cluster cap.
        assert_eq!(held.others, 2);
    }
}
