//! GPUs as DRA devices: whether the cluster serves DeviceTaintRules, which node's GPUs are
//! which devices, the rules a FabricTest holds, and the thin writer that creates and deletes
//! them as [`gpufabric_health::gpu_quarantine::split`] planned.
//!
//! Discovery decides, on every folded run: a cluster without `resource.k8s.io`, without
//! DeviceTaintRule (before 1.33, or the alpha gate off) or without the GPU driver's
//! ResourceSlices for a node handles that node per node, as before. A rule is the test's
//! only by its controller owner and its record, both naming the test's UID
//! ([`rules::held`]); it is deleted with that UID as a precondition, so a rule someone else
//! made (or made again under the same name) is never touched. The owner reference also
//! lets the garbage collector remove the rules of a test that is gone.

mod apply;
pub mod cache;
pub mod claims;
pub mod rules;
pub mod slices;

pub use apply::{GpuOutcome, carry_out, release_all};

use gpufabric_api::FabricTest;
use gpufabric_api::device_taint::GPU_DRIVER;
use gpufabric_api::keys;
use gpufabric_health::gpu_quarantine::DeviceRef;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::discovery::ApiGroup;
use kube::{Client, ResourceExt};
use rules::HeldRule;
use std::collections::{BTreeMap, BTreeSet};

/// The API group of DRA.
pub const GROUP: &str = "resource.k8s.io";

/// Why what DRA says of the cluster could not be read (the fold is tried again).
#[derive(Debug, thiserror::Error)]
pub enum DraError {
    #[error("discovering the {GROUP} API group: {0}")]
    Discover(#[source] kube::Error),
    #[error("listing the ResourceSlices of {GPU_DRIVER}: {0}")]
    Slices(#[source] kube::Error),
    #[error("listing the ResourceClaims of every namespace: {0}")]
    Claims(#[source] kube::Error),
    #[error("listing the DeviceTaintRules of FabricTest {test}: {source}")]
    Rules {
        test: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting DeviceTaintRule {rule} of FabricTest {test}: {source}")]
    Delete {
        test: String,
        rule: String,
        #[source]
        source: kube::Error,
    },
}

impl DraError {
    /// The API server's error underneath, for a caller that retries on it.
    pub fn into_kube(self) -> kube::Error {
        match self {
            DraError::Discover(e) | DraError::Slices(e) | DraError::Claims(e) => e,
            DraError::Rules { source, .. } | DraError::Delete { source, .. } => source,
        }
    }
}

/// What DRA says of the cluster for one test, as read before a plan.
#[derive(Clone, Debug, Default)]
pub struct DraView {
    /// DeviceTaintRule in its most stable served version; None: not served.
    pub taint_rules: Option<ApiResource>,
    /// Each node's GPUs as devices (empty when DeviceTaintRules are not served).
    pub gpus: BTreeMap<String, BTreeMap<u32, DeviceRef>>,
    /// The rules the test holds, by node.
    pub held: BTreeMap<String, Vec<HeldRule>>,
}

impl DraView {
    /// The served version of DeviceTaintRule.
    pub fn version(&self) -> Option<&str> {
        self.taint_rules.as_ref().map(|r| r.version.as_str())
    }

    /// `node`'s GPUs as devices; empty when it is handled per node.
    pub fn devices(&self, node: &str) -> BTreeMap<u32, DeviceRef> {
        self.gpus.get(node).cloned().unwrap_or_default()
    }

    /// How many GPUs each node publishes as devices ([`crate::nodes::gpu_count`]).
    pub fn gpu_counts(&self) -> BTreeMap<String, u32> {
        self.gpus
            .iter()
            .map(|(node, g)| (node.clone(), u32::try_from(g.len()).unwrap_or(u32::MAX)))
            .collect()
    }

    /// The GPUs of `node` the test holds tainted.
    pub fn tainted(&self, node: &str) -> BTreeSet<u32> {
        self.held
            .get(node)
            .map(|r| r.iter().map(|h| h.record.gpu).collect())
            .unwrap_or_default()
    }
}

/// DeviceTaintRule and ResourceSlice in their most stable served versions, each None when
/// not served; both None when the cluster has no `resource.k8s.io`.
pub async fn discover(
    client: &Client,
) -> Result<(Option<ApiResource>, Option<ApiResource>), DraError> {
    let group = match kube::discovery::group(client, GROUP).await {
        Ok(g) => g,
        Err(kube::Error::Discovery(kube::error::DiscoveryError::MissingApiGroup(_))) => {
            return Ok((None, None));
        }
        Err(e) => return Err(DraError::Discover(e)),
    };
    Ok((
        kind(&group, "DeviceTaintRule"),
        kind(&group, "ResourceSlice"),
    ))
}

pub(super) fn kind(group: &ApiGroup, kind: &str) -> Option<ApiResource> {
    group
        .resources_by_stability()
        .into_iter()
        .find(|(r, _)| r.kind == kind)
        .map(|(r, _)| r)
}

/// Reads what DRA says of the cluster for `test`: discovery, the GPU driver's slices and
/// the test's rules. Without DeviceTaintRules served, nothing else is read. When the
/// operator may not read the slices or the rules (a ClusterRole without them), every node is
/// handled per node, with a warning, rather than no node judged at all.
pub async fn observe(client: &Client, test: &FabricTest) -> Result<DraView, DraError> {
    match observe_served(client, test).await {
        Err(
            DraError::Slices(kube::Error::Api(s))
            | DraError::Rules {
                source: kube::Error::Api(s),
                ..
            },
        ) if s.code == 403 => {
            tracing::warn!(reason = %s.message, "no right to read DRA ResourceSlices or DeviceTaintRules: every node is handled per node (grant list on resourceslices and list, create, delete on devicetaintrules)");
            Ok(DraView::default())
        }
        other => other,
    }
}

async fn observe_served(client: &Client, test: &FabricTest) -> Result<DraView, DraError> {
    let (taint_rules, slice_api) = discover(client).await?;
    let (Some(taint_rules), Some(slice_api)) = (taint_rules, slice_api) else {
        return Ok(DraView::default());
    };
    let gpus = slices::gpus_by_node(&list_slices(client, &slice_api).await?);
    let held = held_rules(client, &taint_rules, test).await?;
    Ok(DraView {
        taint_rules: Some(taint_rules),
        gpus,
        held,
    })
}

/// The ResourceSlices of [`GPU_DRIVER`], as JSON.
pub(super) async fn list_slices(
    client: &Client,
    slice_api: &ApiResource,
) -> Result<Vec<serde_json::Value>, DraError> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), slice_api);
    let mut slices = Vec::new();
    let mut pages = crate::paging::Pages::default();
    while let Some(lp) = pages.next_params() {
        let page = api
            .list(&lp.fields(&format!("spec.driver={GPU_DRIVER}")))
            .await
            .map_err(DraError::Slices)?;
        slices.extend(page.items.into_iter().map(|o| o.data));
        pages.read(page.metadata.continue_);
    }
    Ok(slices)
}

/// The rules `test` holds, by node: those labelled with its UID that [`rules::held`] reads
/// as its own.
pub(crate) async fn held_rules(
    client: &Client,
    ar: &ApiResource,
    test: &FabricTest,
) -> Result<BTreeMap<String, Vec<HeldRule>>, DraError> {
    let Some(uid) = test.metadata.uid.as_deref() else {
        return Ok(BTreeMap::new());
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
    let lp = kube::api::ListParams::default().labels(&format!("{}={uid}", keys::LABEL_TEST_UID));
    let list = api.list(&lp).await.map_err(|source| DraError::Rules {
        test: test.name_any(),
        source,
    })?;
    let mut out: BTreeMap<String, Vec<HeldRule>> = BTreeMap::new();
    for h in list.items.iter().filter_map(|r| rules::held(r, uid)) {
        out.entry(h.record.node.clone()).or_default().push(h);
    }
    Ok(out)
}
