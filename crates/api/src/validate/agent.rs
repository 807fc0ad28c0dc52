//! The quarantine's and the agent's checks: counts, image, names, annotations, resources.

use super::Checker;
use super::labels;
use crate::test::FabricTestSpec;
use std::collections::{BTreeMap, BTreeSet};

pub(super) fn check_quarantine_and_agent(c: &mut Checker, spec: &FabricTestSpec) {
    let q = &spec.quarantine;
    if let Err(e) = q.budget(0) {
        c.check(false, "quarantine.maxQuarantined", || {
            format!(
                "quarantine.maxQuarantined must be a count >= 0 or a percent from 0% to 100% ({e})"
            )
        });
    }
    if let Err(e) = q.gpu_budget(0) {
        c.check(false, "quarantine.maxQuarantinedGpus", || {
            format!(
                "quarantine.maxQuarantinedGpus must be a count >= 0 or a percent from 0% to 100% ({e})"
            )
        });
    }
    c.check(
        q.failures_to_quarantine >= 1,
        "quarantine.failuresToQuarantine",
        || "must be at least 1".into(),
    );
    c.check(
        q.passes_to_release >= 1,
        "quarantine.passesToRelease",
        || "must be at least 1".into(),
    );
    c.check(
        (1..=100).contains(&q.storm_threshold_percent),
        "quarantine.stormThresholdPercent",
        || {
            format!(
                "must be between 1 and 100 (100 turns the storm rule off; got {})",
                q.storm_threshold_percent
            )
        },
    );
    c.check(q.storm_min_nodes >= 1, "quarantine.stormMinNodes", || {
        "must be at least 1".into()
    });

    let agent = &spec.agent;
    c.check(agent.image.trim() == agent.image, "agent.image", || {
        "must not start or end with spaces (leave it out for the operator's --agent-image)".into()
    });
    let names = [
        (
            "agent.runtimeClassName",
            agent.runtime_class_name.as_deref(),
        ),
        (
            "agent.priorityClassName",
            agent.priority_class_name.as_deref(),
        ),
    ];
    for (field, name) in names {
        if let Some(name) = name {
            c.check(labels::is_dns_subdomain(name), field, || {
                format!("{name:?} is not a valid object name (a DNS subdomain: lowercase letters, digits, '-' and '.', at most 253)")
            });
        }
    }
    for (i, secret) in agent.image_pull_secrets.iter().enumerate() {
        c.check(
            labels::is_dns_subdomain(&secret.name),
            "agent.imagePullSecrets",
            || {
                format!(
                    "entry {i} ({:?}) is not a valid Secret name (a DNS subdomain)",
                    secret.name
                )
            },
        );
    }
    check_pod_annotations(c, &agent.pod_annotations);
    if let Some(resources) = &agent.resources {
        check_resources(c, resources);
    }
    c.check(
        (10..=86400).contains(&agent.timeout_seconds),
        "agent.timeoutSeconds",
        || {
            format!(
                "must be between 10 and 86400 (got {})",
                agent.timeout_seconds
            )
        },
    );
}

/// Most bytes of a pod's annotations, keys and values together (the API server's limit).
pub const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

/// `agent.podAnnotations`: keys the API server accepts, none of the operator's own, within
/// the API server's size limit.
fn check_pod_annotations(c: &mut Checker, annotations: &BTreeMap<String, String>) {
    let field = "agent.podAnnotations";
    for key in annotations.keys() {
        if let Some(p) = labels::label_key_problem(key) {
            c.check(false, field, || {
                p.replacen("label key", "annotation key", 1)
            });
        }
        let ours = key.split_once('/').is_some_and(|(prefix, _)| {
            prefix == "gpufabric.io" || prefix.ends_with(".gpufabric.io")
        });
        c.check(!ours, field, || {
            format!(
                "{key:?} is the operator's: keys under gpufabric.io/ are set by the operator only"
            )
        });
    }
    let size: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    c.check(size <= ANNOTATIONS_MAX_BYTES, field, || {
        format!(
            "{size} bytes in all, more than the {ANNOTATIONS_MAX_BYTES} a pod's annotations may hold"
        )
    });
}

/// Whether `name` is an extended resource (a device plugin's, e.g. `rdma/hca` or
/// `nvidia.com/gpu`), as the API server tells them from the built-in ones.
fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.starts_with("kubernetes.io/") && !name.starts_with("requests.")
}

/// `agent.resources`: no GPUs (the operator requests all of the node's), and extended
/// resources (RDMA devices) as the API server admits them: whole numbers, the request
/// equal to the limit. Refused here, a pod the API server would refuse never gets made.
fn check_resources(c: &mut Checker, r: &k8s_openapi::api::core::v1::ResourceRequirements) {
    let empty = BTreeMap::new();
    let requests = r.requests.as_ref().unwrap_or(&empty);
    let limits = r.limits.as_ref().unwrap_or(&empty);
    let names: BTreeSet<&String> = requests.keys().chain(limits.keys()).collect();
    for name in names {
        let field = format!("agent.resources[{name}]");
        if name == crate::keys::RESOURCE_GPU {
            c.check(false, &field, || {
                format!(
                    "{name} is always every GPU of the node, requested by the operator; remove it"
                )
            });
            continue;
        }
        if let Some(p) = labels::label_key_problem(name) {
            c.check(false, &field, || {
                p.replacen("label key", "resource name", 1)
            });
            continue;
        }
        if !is_extended_resource(name) {
            continue;
        }
        let (req, lim) = (requests.get(name), limits.get(name));
        for q in [req, lim].into_iter().flatten() {
            c.check(
                !q.0.is_empty() && q.0.bytes().all(|b| b.is_ascii_digit()),
                &field,
                || format!("{:?} is not a whole number: an extended resource is counted in whole devices (e.g. 1)", q.0),
            );
        }
        if let (Some(req), Some(lim)) = (req, lim) {
            c.check(req.0 == lim.0, &field, || {
                format!(
                    "request {} differs from limit {}: an extended resource cannot be overcommitted; set the limit alone (the request follows it)",
                    req.0, lim.0
                )
            });
        }
    }
}
