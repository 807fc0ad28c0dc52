//! Prometheus metrics of the quarantine executor: nodes held per test, actions taken.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Label set `{test="<name>"}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TestLabels {
    pub test: String,
}

/// Label set `{test="<name>", action="..."}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub test: String,
    pub action: String,
}

/// The quarantine metrics. Cheap to clone (the families are shared handles).
#[derive(Clone, Debug, Default)]
pub struct QuarantineMetrics {
    /// `gpufabric_quarantined_nodes{test}`: nodes this FabricTest holds in quarantine now.
    pub quarantined_nodes: Family<TestLabels, Gauge>,
    /// `gpufabric_quarantine_actions_total{test,action}`: actions by kind
    /// (`quarantined`, `released`, `over_budget`, `over_cluster_cap`, `would_quarantine`, `would_release`,
    /// `left_alone`, `failed`, `taken_back`).
    pub actions: Family<ActionLabels, Counter>,
    /// `gpufabric_repeat_offender_nodes{test}`: nodes this FabricTest quarantined too often
    /// to release on passes; each waits for a repair.
    pub repeat_offenders: Family<TestLabels, Gauge>,
}

impl QuarantineMetrics {
    /// Register both metrics under their full names. The registry must have no prefix of
    /// its own (the names already start with `gpufabric_`); prometheus-client adds the
    /// `_total` suffix of the counter.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "gpufabric_quarantined_nodes",
            "Nodes a FabricTest holds in quarantine now",
            self.quarantined_nodes.clone(),
        );
        registry.register(
            "gpufabric_quarantine_actions",
            "Quarantine actions by FabricTest and kind",
            self.actions.clone(),
        );
        registry.register(
            "gpufabric_repeat_offender_nodes",
            "Nodes a FabricTest quarantined too often to release on passes (they wait for a repair)",
            self.repeat_offenders.clone(),
        );
    }

    /// Set the number of repeat offenders of `test`.
    pub fn set_repeat_offenders(&self, test: &str, count: usize) {
        self.repeat_offenders
            .get_or_create(&TestLabels {
                test: test.to_string(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Set the number of nodes `test` holds.
    pub fn set_quarantined(&self, test: &str, count: usize) {
        self.quarantined_nodes
            .get_or_create(&TestLabels {
                test: test.to_string(),
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Forget `test` (it was deleted).
    pub fn forget(&self, test: &str) {
        self.quarantined_nodes.remove(&TestLabels {
            test: test.to_string(),
        });
        self.repeat_offenders.remove(&TestLabels {
            test: test.to_string(),
        });
    }

    /// Count one action of `test`.
    pub fn count(&self, test: &str, action: &str) {
        self.actions
            .get_or_create(&ActionLabels {
                test: test.to_string(),
                action: action.to_string(),
            })
            .inc();
    }

    /// The current count of `action` for `test` (for tests and logs).
    pub fn action_count(&self, test: &str, action: &str) -> u64 {
        self.actions
            .get_or_create(&ActionLabels {
                test: test.to_string(),
                action: action.to_string(),
            })
            .get()
    }

    /// The current gauge for `test` (for tests and logs).
    pub fn quarantined(&self, test: &str) -> i64 {
        self.quarantined_nodes
            .get_or_create(&TestLabels {
                test: test.to_string(),
            })
            .get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_exposed_under_their_documented_names() {
        let m = QuarantineMetrics::default();
        let mut r = Registry::default();
        m.register(&mut r);
        m.set_quarantined("nightly", 2);
        m.count("nightly", "quarantined");
        m.set_repeat_offenders("nightly", 1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encodes");
        assert!(
            text.contains(r#"gpufabric_quarantined_nodes{test="nightly"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"gpufabric_quarantine_actions_total{test="nightly",action="quarantined"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"gpufabric_repeat_offender_nodes{test="nightly"} 1"#),
            "{text}"
        );
    }
}
