//! What a benchmark pod takes from the operator's flags (the chart's `benchmarkPods`) where
//! its FabricTest's `spec.agent` leaves the field empty: priority class, runtime class and
//! image pull secrets. The FabricTest's own value always wins.

use k8s_openapi::api::core::v1::{LocalObjectReference, Pod};

/// The installation's defaults for benchmark pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodDefaults {
    /// `--agent-priority-class`.
    pub priority_class_name: Option<String>,
    /// `--agent-runtime-class`.
    pub runtime_class_name: Option<String>,
    /// `--agent-image-pull-secret`, in the pods' namespace.
    pub image_pull_secrets: Vec<String>,
}

impl PodDefaults {
    /// Fills each field of `pod` that its FabricTest left empty: a priority or runtime class
    /// it names none of, the pull secrets when it lists none.
    pub fn fill(&self, pod: &mut Pod) {
        let Some(spec) = pod.spec.as_mut() else {
            return;
        };
        if spec.priority_class_name.is_none() {
            spec.priority_class_name = self.priority_class_name.clone();
        }
        if spec.runtime_class_name.is_none() {
            spec.runtime_class_name = self.runtime_class_name.clone();
        }
        let listed = spec
            .image_pull_secrets
            .as_ref()
            .is_some_and(|s| !s.is_empty());
        if !listed && !self.image_pull_secrets.is_empty() {
            spec.image_pull_secrets = Some(
                self.image_pull_secrets
                    .iter()
                    .map(|name| LocalObjectReference { name: name.clone() })
                    .collect(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn defaults() -> PodDefaults {
        PodDefaults {
            priority_class_name: Some("gpu-test".into()),
            runtime_class_name: Some("nvidia".into()),
            image_pull_secrets: vec!["regcred".into()],
        }
    }

    fn pod(spec: PodSpec) -> Pod {
        Pod {
            spec: Some(spec),
            ..Default::default()
        }
    }

    #[test]
    fn a_test_that_names_nothing_gets_the_installations_defaults() {
        let mut p = pod(PodSpec::default());
        defaults().fill(&mut p);
        let s = p.spec.expect("spec");
        assert_eq!(s.priority_class_name.as_deref(), Some("gpu-test"));
        assert_eq!(s.runtime_class_name.as_deref(), Some("nvidia"));
        assert_eq!(
            s.image_pull_secrets,
            Some(vec![LocalObjectReference {
                name: "regcred".into()
            }])
        );
    }

    #[test]
    fn what_a_test_names_overrides_each_default() {
        let mut p = pod(PodSpec {
            priority_class_name: Some("urgent".into()),
            runtime_class_name: Some("kata".into()),
            image_pull_secrets: Some(vec![LocalObjectReference {
                name: "team-cred".into(),
            }]),
            ..Default::default()
        });
        let before = p.clone();
        defaults().fill(&mut p);
        assert_eq!(p, before);
    }

    #[test]
    fn no_defaults_leave_the_pod_as_built() {
        let mut p = pod(PodSpec::default());
        PodDefaults::default().fill(&mut p);
        assert_eq!(p, pod(PodSpec::default()));
    }
}
