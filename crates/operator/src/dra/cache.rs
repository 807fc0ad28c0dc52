//! The last read of the nodes' DRA devices, shared by both controllers: the pods a run makes,
//! the nodes a FabricTest tests now, and the node watch's choice of tests to wake.

use super::claims::ClaimView;
use std::collections::BTreeMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// How long a read of the nodes' DRA devices serves what follows it: a pair round of a
/// thousand nodes makes a thousand rank pods within seconds, and each would otherwise read
/// discovery and every ResourceSlice again.
pub const DEVICES_FRESH: Duration = Duration::from_secs(5);

/// The last read of which nodes' GPUs are DRA devices and when it was made, and the GPU
/// counts it gave (for a caller that cannot wait on the API server).
#[derive(Default)]
pub struct DeviceCache {
    last: tokio::sync::Mutex<Option<(Instant, Option<ClaimView>)>>,
    counts: RwLock<BTreeMap<String, u32>>,
}

impl DeviceCache {
    /// Which nodes' GPUs are DRA devices (None: the cluster serves no claims), read at most
    /// once every [`DEVICES_FRESH`]; an error is the API server's.
    pub async fn read(&self, client: &kube::Client) -> Result<Option<ClaimView>, kube::Error> {
        let mut last = self.last.lock().await;
        if let Some((at, view)) = last.as_ref()
            && at.elapsed() < DEVICES_FRESH
        {
            return Ok(view.clone());
        }
        let view = super::claims::observe(client)
            .await
            .map_err(super::DraError::into_kube)?;
        let counts = view.as_ref().map(ClaimView::gpu_counts).unwrap_or_default();
        if let Ok(mut c) = self.counts.write() {
            *c = counts;
        }
        *last = Some((Instant::now(), view.clone()));
        Ok(view)
    }

    /// Each node's GPUs published as DRA devices, by node name (empty where the cluster
    /// serves no claims), read as [`DeviceCache::read`] does: with
    /// [`crate::nodes::gpu_count`], the GPUs a node has whichever way it offers them.
    pub async fn counts(
        &self,
        client: &kube::Client,
    ) -> Result<BTreeMap<String, u32>, kube::Error> {
        Ok(self
            .read(client)
            .await?
            .as_ref()
            .map(ClaimView::gpu_counts)
            .unwrap_or_default())
    }

    /// [`DeviceCache::counts`] when `needed` (else none, and nothing is read), or where the
    /// API server could not be read the counts of the last read (with a warning): for a
    /// caller that goes on either way.
    pub async fn counts_if(&self, needed: bool, client: &kube::Client) -> BTreeMap<String, u32> {
        if !needed {
            return BTreeMap::new();
        }
        match self.counts(client).await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "DRA devices not read: the GPUs of nodes whose GPUs are only devices are those of the last read");
                self.last_counts()
            }
        }
    }

    /// The counts of the last read, without reading (empty before the first).
    pub fn last_counts(&self) -> BTreeMap<String, u32> {
        self.counts.read().map(|c| c.clone()).unwrap_or_default()
    }
}
