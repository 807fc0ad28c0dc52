//! A container's environment as the kubelet builds it: `envFrom` (Secrets, ConfigMaps),
//! then `env` (literal values with `$(VAR)` expansion, the downward API, and keys of
//! Secrets and ConfigMaps read from the API server). A source that does not exist is a
//! `CreateContainerConfigError` with the kubelet's message (`secret "x" not found`).

use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVar, Pod, Secret};
use kube::Client;
use kube::api::Api;
use std::collections::BTreeMap;

/// Expands `$(VAR)` from `env` as the kubelet does; `$$(VAR)` stays literal `$(VAR)`, and
/// unknown references are left as they are.
pub fn expand(s: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(j) => {
                    let var = &body[..j];
                    match env.get(var) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(var);
                            out.push(')');
                        }
                    }
                    rest = &body[j + 1..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn field_ref(pod: &Pod, path: &str, pod_ip: &str) -> Option<String> {
    let spec = pod.spec.as_ref();
    match path {
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "metadata.name" => pod.metadata.name.clone(),
        "metadata.namespace" => pod.metadata.namespace.clone(),
        "metadata.uid" => pod.metadata.uid.clone(),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.podIP" => Some(pod_ip.to_string()),
        "status.hostIP" => Some("127.0.0.1".to_string()),
        _ => None,
    }
}

/// The string keys of a Secret or ConfigMap, as env values.
type Data = BTreeMap<String, String>;

/// Reads Secrets and ConfigMaps of the pod's namespace for its env.
struct Sources<'a> {
    client: &'a Client,
    namespace: &'a str,
}

impl Sources<'_> {
    /// The data of a Secret, `None` if it does not exist; errors carry the kubelet's words.
    async fn secret(&self, name: &str) -> Result<Option<Data>, String> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), self.namespace);
        let secret = api
            .get_opt(name)
            .await
            .map_err(|e| format!("reading secret {name:?}: {e}"))?;
        Ok(secret.map(|s| {
            s.data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                .collect()
        }))
    }

    /// The data (and binary data) of a ConfigMap, `None` if it does not exist.
    async fn config_map(&self, name: &str) -> Result<Option<Data>, String> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), self.namespace);
        let cm = api
            .get_opt(name)
            .await
            .map_err(|e| format!("reading configmap {name:?}: {e}"))?;
        Ok(cm.map(|cm| {
            let mut data = cm.data.unwrap_or_default();
            for (k, v) in cm.binary_data.unwrap_or_default() {
                data.insert(k, String::from_utf8_lossy(&v.0).into_owned());
            }
            data
        }))
    }

    /// Looks up `kind` (`secret` or `configmap`) `name`: missing and not optional is the
    /// kubelet's `<kind> "<name>" not found`; missing and optional is `None`.
    async fn source(&self, kind: Kind, name: &str, optional: bool) -> Result<Option<Data>, String> {
        let data = match kind {
            Kind::Secret => self.secret(name).await?,
            Kind::ConfigMap => self.config_map(name).await?,
        };
        match data {
            Some(d) => Ok(Some(d)),
            None if optional => Ok(None),
            None => Err(format!("{} {name:?} not found", kind.lower())),
        }
    }

    /// One key of a Secret or ConfigMap; `None` when the source or key is optional and absent.
    async fn key(
        &self,
        kind: Kind,
        name: &str,
        key: &str,
        optional: bool,
    ) -> Result<Option<String>, String> {
        let Some(data) = self.source(kind, name, optional).await? else {
            return Ok(None);
        };
        match data.get(key) {
            Some(v) => Ok(Some(v.clone())),
            None if optional => Ok(None),
            None => Err(format!(
                "couldn't find key {key} in {} {}/{name}",
                kind.title(),
                self.namespace
            )),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    Secret,
    ConfigMap,
}

impl Kind {
    /// As the kubelet's object caches name the resource in a not-found error.
    fn lower(self) -> &'static str {
        match self {
            Kind::Secret => "secret",
            Kind::ConfigMap => "configmap",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Kind::Secret => "Secret",
            Kind::ConfigMap => "ConfigMap",
        }
    }
}

/// Adds the env of container `c` of `pod` to `env` in the kubelet's order (`envFrom`, then
/// `env`). An error is the message of the `CreateContainerConfigError` the kubelet reports.
pub(super) async fn container_env(
    client: &Client,
    pod: &Pod,
    c: &Container,
    pod_ip: &str,
    env: &mut BTreeMap<String, String>,
) -> Result<(), String> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let sources = Sources {
        client,
        namespace: &namespace,
    };
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let data = if let Some(s) = &from.secret_ref {
            let optional = s.optional.unwrap_or(false);
            sources.source(Kind::Secret, &s.name, optional).await?
        } else if let Some(cm) = &from.config_map_ref {
            let optional = cm.optional.unwrap_or(false);
            sources.source(Kind::ConfigMap, &cm.name, optional).await?
        } else {
            None
        };
        for (k, v) in data.unwrap_or_default() {
            env.insert(format!("{prefix}{k}"), v);
        }
    }
    for e in c.env.iter().flatten() {
        if let Some(value) = env_value(&sources, pod, e, pod_ip, env).await? {
            env.insert(e.name.clone(), value);
        }
    }
    Ok(())
}

/// The value of one `env` entry; `None` for an optional key that is absent.
async fn env_value(
    sources: &Sources<'_>,
    pod: &Pod,
    e: &EnvVar,
    pod_ip: &str,
    env: &BTreeMap<String, String>,
) -> Result<Option<String>, String> {
    let Some(from) = &e.value_from else {
        return Ok(Some(expand(e.value.as_deref().unwrap_or_default(), env)));
    };
    if let Some(f) = &from.field_ref {
        return field_ref(pod, &f.field_path, pod_ip)
            .map(Some)
            .ok_or_else(|| {
                format!(
                    "env {}: fieldRef {} is not supported by the process-kubelet",
                    e.name, f.field_path
                )
            });
    }
    if let Some(s) = &from.secret_key_ref {
        let optional = s.optional.unwrap_or(false);
        return sources.key(Kind::Secret, &s.name, &s.key, optional).await;
    }
    if let Some(cm) = &from.config_map_key_ref {
        let optional = cm.optional.unwrap_or(false);
        return sources
            .key(Kind::ConfigMap, &cm.name, &cm.key, optional)
            .await;
    }
    Err(format!(
        "env {}: resourceFieldRef is not supported by the process-kubelet",
        e.name
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_references_to_defined_variables_only() {
        let env = BTreeMap::from([("NODE".to_string(), "n1".to_string())]);
        assert_eq!(expand("--node=$(NODE)", &env), "--node=n1");
        assert_eq!(expand("$(MISSING)/x", &env), "$(MISSING)/x");
        assert_eq!(expand("$$(NODE) $5", &env), "$(NODE) $5");
        assert_eq!(expand("tail $(", &env), "tail $(");
    }
}
