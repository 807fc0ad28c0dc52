//! The full results the operator keeps, one ConfigMap per node and test
//! (`operator/results/store.rs`), read back: the document of a node for a run, or why the
//! page has none (a later run's, none kept, not readable).

use gpufabric_api::result::ParseError;
use gpufabric_api::{ResultDocument, keys};
use k8s_openapi::api::core::v1::ConfigMap;
use std::collections::BTreeMap;
use std::io::Read;

/// Largest document read back from a gzipped ConfigMap (a ConfigMap holds 1 MiB of gzip).
pub const MAX_DOCUMENT_BYTES: u64 = 64 << 20;

/// Why a kept ConfigMap gives no document.
#[derive(Debug, thiserror::Error)]
pub enum KeptError {
    #[error("the kept document could not be unzipped: {0}")]
    Unzip(std::io::Error),
    #[error("it has neither {} nor {}", keys::RESULT_KEY, keys::RESULT_KEY_GZIP)]
    NoDocument,
    #[error(transparent)]
    Parse(#[from] ParseError),
}

/// A node's full result, or why the page has none.
#[derive(Clone, Debug, PartialEq)]
pub enum Kept {
    Document {
        doc: Box<ResultDocument>,
        /// The run that measured it: this run, or the confirmation run that retested it.
        run: String,
        confirmation: bool,
    },
    NotKept(String),
}

/// The ConfigMap keeping `node`'s full result: by its node annotation, else its label.
fn kept_for<'a>(kept: &'a [ConfigMap], node: &str) -> Option<&'a ConfigMap> {
    let names = |map: &Option<BTreeMap<String, String>>, key: &str| {
        map.as_ref().and_then(|m| m.get(key)).map(String::as_str) == Some(node)
    };
    kept.iter()
        .find(|cm| names(&cm.metadata.annotations, keys::ANNOTATION_RESULT_NODE))
        .or_else(|| {
            kept.iter()
                .find(|cm| names(&cm.metadata.labels, keys::LABEL_NODE))
        })
}

/// The full result a ConfigMap keeps, read back (gunzipped when stored so).
pub fn read_kept(cm: &ConfigMap) -> Result<ResultDocument, KeptError> {
    let text = if let Some(s) = cm.data.as_ref().and_then(|d| d.get(keys::RESULT_KEY)) {
        s.clone()
    } else if let Some(b) = cm
        .binary_data
        .as_ref()
        .and_then(|d| d.get(keys::RESULT_KEY_GZIP))
    {
        let mut out = String::new();
        flate2::read::GzDecoder::new(&b.0[..])
            .take(MAX_DOCUMENT_BYTES)
            .read_to_string(&mut out)
            .map_err(KeptError::Unzip)?;
        out
    } else {
        return Err(KeptError::NoDocument);
    };
    Ok(ResultDocument::parse(&text)?)
}

/// `node`'s full result of `run` (or of the run that confirmed it), or why there is none.
pub fn kept(kept: &[ConfigMap], node: &str, run: &str, confirmation: Option<&str>) -> Kept {
    let Some(cm) = kept_for(kept, node) else {
        return Kept::NotKept(
            "full result not kept: no ConfigMap holds this node's document (the operator keeps each node's latest one per test)"
                .into(),
        );
    };
    let of = cm
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(keys::LABEL_RUN))
        .cloned()
        .unwrap_or_default();
    let confirms = confirmation == Some(of.as_str());
    if of != run && !confirms {
        return Kept::NotKept(format!(
            "full result not kept: the node's kept document is of run {of}, not of {run} (each node keeps its latest run's only)"
        ));
    }
    match read_kept(cm) {
        Ok(doc) => Kept::Document {
            doc: Box::new(doc),
            run: of,
            confirmation: confirms,
        },
        Err(e) => Kept::NotKept(format!(
            "full result not readable: ConfigMap {}: {e}",
            cm.metadata.name.clone().unwrap_or_default()
        )),
    }
}
