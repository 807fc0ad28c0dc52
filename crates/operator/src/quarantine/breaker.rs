//! The breaker of one FabricTest: opened by a storm (too many measured nodes of one run
//! failing at once, `gpufabric_health::quarantine::storm`), closed only by a person with the
//! annotation [`ANNOTATION_RESET_BREAKER`]. Its state is the `BreakerOpen` condition of the
//! FabricTest, so it lives in the API server and survives operator restarts.
//!
//! Runs are folded (and their plans made) before a reset is applied, so a run that finished
//! while the breaker was open is judged with it open, even when the reset is already there.

use crate::events::Events;
use crate::status as st;
use gpufabric_api::keys::ANNOTATION_RESET_BREAKER;
use gpufabric_api::test::FabricTest;
use gpufabric_health::quarantine::Storm;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

/// Condition type on a FabricTest: True while its breaker is open.
pub const CONDITION_BREAKER_OPEN: &str = "BreakerOpen";
/// Condition reason (and Event reason) when a storm opened the breaker.
pub const REASON_OPEN: &str = "BreakerOpen";
/// Condition reason (and Event reason) when a person reset the breaker.
pub const REASON_RESET: &str = "BreakerReset";
/// Condition reason of a breaker that never opened.
pub const REASON_CLOSED: &str = "NoStorm";

/// The breaker as this reconcile sees it, changed by the runs it folds and by a reset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Breaker {
    pub open: bool,
    pub reason: String,
    pub message: String,
}

impl Breaker {
    /// The breaker its `BreakerOpen` condition describes; closed when there is none.
    pub fn from_conditions(conditions: &[Condition]) -> Breaker {
        match conditions
            .iter()
            .find(|c| c.type_ == CONDITION_BREAKER_OPEN)
        {
            Some(c) => Breaker {
                open: c.status == "True",
                reason: c.reason.clone(),
                message: c.message.clone(),
            },
            None => Breaker {
                open: false,
                reason: REASON_CLOSED.into(),
                message: "no storm seen: quarantine acts as spec.quarantine says".into(),
            },
        }
    }

    /// Opens the breaker for `storm` in run `run` of the test `test`. True when it was
    /// closed (the caller publishes one Event); an open breaker keeps its first message.
    pub fn open(&mut self, test: &str, run: &str, storm: &Storm) -> bool {
        if self.open {
            return false;
        }
        self.open = true;
        self.reason = REASON_OPEN.into();
        self.message = format!(
            "run {run}: {}: the environment is suspect (a driver rollout, a bad image), not \
             the nodes; nothing is quarantined or released by this test until a person \
             resets the breaker: kubectl annotate fabrictest {test} {ANNOTATION_RESET_BREAKER}=now",
            storm.describe()
        );
        true
    }

    /// Closes the breaker on a person's reset (`value`: the annotation's value). True when
    /// it was open (the caller publishes one Event); a closed breaker stays as it is.
    pub fn reset(&mut self, value: &str) -> bool {
        if !self.open {
            return false;
        }
        self.open = false;
        self.reason = REASON_RESET.into();
        self.message = format!(
            "reset by the annotation {ANNOTATION_RESET_BREAKER}={value:?}; runs folded from \
             now on act again (the breaker had said: {})",
            self.message
        );
        true
    }

    /// The `BreakerOpen` condition (keeping the transition time of `previous`).
    pub fn condition(
        &self,
        previous: &[Condition],
        generation: Option<i64>,
        now: &Time,
    ) -> Condition {
        st::condition(
            previous,
            CONDITION_BREAKER_OPEN,
            self.open,
            &self.reason,
            self.message.clone(),
            generation,
            now,
        )
    }
}

/// The value of the reset annotation, when a person set it.
pub fn reset_requested(test: &FabricTest) -> Option<String> {
    test.annotations().get(ANNOTATION_RESET_BREAKER).cloned()
}

/// A storm in run `run` of `test`: opens the breaker, and says so once (an Event on the
/// test and a log line) when it was closed.
pub async fn open_on_storm(
    breaker: &mut Breaker,
    test: &FabricTest,
    run: &str,
    storm: &Storm,
    events: &Events,
) {
    if breaker.open(&test.name_any(), run, storm) {
        tracing::warn!(test = %test.name_any(), run, "breaker opened: {}", breaker.message);
        events
            .warning(
                &test.object_ref(&()),
                REASON_OPEN,
                "Quarantine",
                breaker.message.clone(),
            )
            .await;
    }
}

/// Applies a person's reset, when the annotation asks for one: closes the breaker (one
/// Event when it was open). True when the annotation is there: the caller removes it with
/// [`clear_reset`] once the status that records the reset is written.
pub async fn take_reset(breaker: &mut Breaker, test: &FabricTest, events: &Events) -> bool {
    let Some(value) = reset_requested(test) else {
        return false;
    };
    if breaker.reset(&value) {
        tracing::info!(test = %test.name_any(), "breaker reset");
        events
            .normal(
                &test.object_ref(&()),
                REASON_RESET,
                "Quarantine",
                format!("breaker reset by the annotation {ANNOTATION_RESET_BREAKER}={value:?}; runs folded from now on act again"),
            )
            .await;
    }
    true
}

/// Removes the reset annotation from the FabricTest `name` (in `api`).
pub async fn clear_reset(api: &Api<FabricTest>, name: &str) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {"annotations": {ANNOTATION_RESET_BREAKER: null}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn storm() -> Storm {
        Storm {
            failed: 4,
            measured: 4,
            threshold_percent: 50,
            window_hours: None,
        }
    }

    fn now() -> Time {
        Time("2026-11-23T18:00:00Z".parse().expect("time"))
    }

    #[test]
    fn a_storm_opens_the_breaker_once_and_only_a_reset_closes_it() {
        let mut b = Breaker::from_conditions(&[]);
        assert!(!b.open);
        assert!(!b.reset("now"), "a closed breaker has nothing to reset");
        assert!(b.open("nightly", "nightly-1", &storm()));
        assert!(
            b.message
                .contains("run nightly-1: 4 of 4 measured nodes failed")
        );
        assert!(
            b.message
                .contains("kubectl annotate fabrictest nightly gpufabric.io/reset-breaker=now")
        );
        let first = b.message.clone();
        assert!(!b.open("nightly", "nightly-2", &storm()), "already open");
        assert_eq!(
            b.message, first,
            "the first storm is what the condition names"
        );

        let c = b.condition(&[], Some(3), &now());
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("BreakerOpen", "True", "BreakerOpen")
        );
        assert_eq!(c.observed_generation, Some(3));
        // What the API server keeps is what a restarted operator reads back.
        assert_eq!(Breaker::from_conditions(std::slice::from_ref(&c)), b);

        assert!(b.reset("x"));
        let closed = b.condition(std::slice::from_ref(&c), Some(3), &now());
        assert_eq!(
            (closed.status.as_str(), closed.reason.as_str()),
            ("False", "BreakerReset")
        );
        assert!(closed.message.contains("\"x\"") && closed.message.contains("nightly-1"));
        assert!(!Breaker::from_conditions(&[closed]).open);
    }

    #[test]
    fn the_transition_time_is_kept_while_the_state_does_not_change() {
        let mut b = Breaker::from_conditions(&[]);
        b.open("t", "r", &storm());
        let earlier = Time("2026-11-01T00:00:00Z".parse().expect("time"));
        let mut previous = b.condition(&[], None, &earlier);
        previous.last_transition_time = earlier.clone();
        assert_eq!(
            b.condition(&[previous], None, &now()).last_transition_time,
            earlier
        );
    }
}
