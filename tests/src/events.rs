//! The Events the operator published about one object, as the tests read them.

use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};

/// `(reason, note)` of every Event in namespace `ns` about the object named `name`
/// (FabricTests and runs are cluster-scoped: their Events are in `default`), in the order
/// the API server lists them.
pub async fn about(client: &kube::Client, ns: &str, name: &str) -> Vec<(String, String)> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    api.list(&ListParams::default())
        .await
        .expect("events listed")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// The reasons of the Events about `name` (one entry per Event object).
pub async fn reasons(client: &kube::Client, ns: &str, name: &str) -> Vec<String> {
    about(client, ns, name)
        .await
        .into_iter()
        .map(|(reason, _)| reason)
        .collect()
}
