//! The API server's own request counter (`apiserver_request_total` on its `/metrics`), by
//! verb and resource: what a run costs the control plane.

use crate::{Error, Result};
use kube::Client;
use std::collections::BTreeMap;

/// Requests by `(verb, resource)`; the resource carries its subresource as
/// `pods/status`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestCounts(pub BTreeMap<(String, String), f64>);

impl RequestCounts {
    /// Parses the Prometheus text the API server serves.
    pub fn parse(text: &str) -> RequestCounts {
        let mut out = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let label = |name: &str| {
                labels
                    .split("\",")
                    .filter_map(|kv| kv.split_once("=\""))
                    .find(|(k, _)| k.trim_start_matches(',') == name)
                    .map(|(_, v)| v.trim_end_matches('"').to_string())
                    .unwrap_or_default()
            };
            let (resource, sub) = (label("resource"), label("subresource"));
            let resource = if sub.is_empty() {
                resource
            } else {
                format!("{resource}/{sub}")
            };
            *out.entry((label("verb"), resource)).or_insert(0.0) += value;
        }
        RequestCounts(out)
    }

    /// Reads the counter now.
    pub async fn read(client: &Client) -> Result<RequestCounts> {
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| Error::Invalid(format!("building the /metrics request: {e}")))?;
        let text = client
            .request_text(req)
            .await
            .map_err(|e| Error::Invalid(format!("reading the API server's /metrics: {e}")))?;
        Ok(RequestCounts::parse(&text))
    }

    /// What happened between `before` and `self`, without the entries that did not change.
    pub fn since(&self, before: &RequestCounts) -> RequestCounts {
        RequestCounts(
            self.0
                .iter()
                .map(|(k, v)| (k.clone(), v - before.0.get(k).copied().unwrap_or(0.0)))
                .filter(|(_, v)| *v > 0.0)
                .collect(),
        )
    }

    /// Every request counted.
    pub fn total(&self) -> f64 {
        self.0.values().sum()
    }

    /// As `{"verb resource": count}`, largest first, for a report.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v: Vec<_> = self.0.iter().collect();
        v.sort_by(|a, b| b.1.total_cmp(a.1));
        serde_json::Value::Object(
            v.into_iter()
                .map(|((verb, res), n)| (format!("{verb} {res}"), serde_json::json!(n)))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_summed_by_verb_and_resource() {
        let text = r#"# HELP apiserver_request_total x
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 40
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="gpufabric.io",resource="fabrictestrunshards",scope="resource",subresource="status",verb="APPLY",version="v1alpha1"} 7
apiserver_request_latencies_total{verb="GET"} 9
"#;
        let c = RequestCounts::parse(text);
        assert_eq!(c.0[&("POST".into(), "pods".into())], 42.0);
        assert_eq!(
            c.0[&("APPLY".into(), "fabrictestrunshards/status".into())],
            7.0
        );
        assert_eq!(c.total(), 49.0);
        let later = RequestCounts::parse(&text.replace("} 40", "} 50"));
        assert_eq!(later.since(&c).total(), 10.0);
    }
}
