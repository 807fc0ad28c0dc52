//! Kubernetes Events (events.k8s.io/v1): the one publisher of the controllers and the
//! quarantine executor. Publishing is best effort: a failed Event is logged, never fails a
//! reconcile. The same Event again within a few minutes counts up its series instead of
//! creating another object.

use crate::names;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub use kube::runtime::events::{Event, EventType, Reporter};

/// Longest object name the API server accepts (a DNS subdomain).
pub const MAX_EVENT_NAME: usize = 253;
/// Longest note the API server accepts is 1 kB; notes are cut a little below it.
pub const MAX_NOTE: usize = 1000;
/// How long a published Event is counted up instead of created again.
const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);
/// Namespace of the Events about cluster-scoped objects (Nodes, FabricTests, FabricTestRuns).
/// `kubectl describe` of a cluster-scoped object finds its Events in every namespace.
const CLUSTER_EVENTS_NAMESPACE: &str = "default";

/// What makes two Events the same: repeats update the first one's series.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    warning: bool,
    reason: String,
    action: String,
    note: Option<String>,
    regarding: RefKey,
    related: Option<RefKey>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RefKey {
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
}

impl From<&ObjectReference> for RefKey {
    fn from(r: &ObjectReference) -> Self {
        RefKey {
            kind: r.kind.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
        }
    }
}

/// Publishes Events on behalf of the operator. Cheap to clone (the series cache is shared).
#[derive(Clone)]
pub struct Events {
    client: Client,
    reporter: Reporter,
    published: Arc<Mutex<HashMap<Key, K8sEvent>>>,
}

impl Events {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Events {
            client,
            reporter,
            published: Arc::default(),
        }
    }

    /// Publishes a Normal Event about `on`.
    pub async fn normal(&self, on: &ObjectReference, reason: &str, action: &str, note: String) {
        self.publish(on, event(EventType::Normal, reason, action, note, None))
            .await;
    }

    /// Publishes a Warning Event about `on`.
    pub async fn warning(&self, on: &ObjectReference, reason: &str, action: &str, note: String) {
        self.publish(on, event(EventType::Warning, reason, action, note, None))
            .await;
    }

    /// Publishes `ev` about `on` (its note cut to [`MAX_NOTE`]); logs instead of failing.
    pub async fn publish(&self, on: &ObjectReference, mut ev: Event) {
        ev.note = ev.note.map(|n| truncate_note(&n));
        let reason = ev.reason.clone();
        if let Err(e) = self.try_publish(on, &ev).await {
            tracing::warn!(
                reason = %reason,
                object = on.name.as_deref().unwrap_or_default(),
                error = %e,
                "could not publish an Event"
            );
        }
    }

    async fn try_publish(&self, on: &ObjectReference, ev: &Event) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = key_of(ev, on);
        let seen = {
            let mut published = self
                .published
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            published.retain(|_, e| last_seen(e).is_some_and(|t| t + SERIES_TTL > now));
            published.get(&key).cloned()
        };
        let namespace = on
            .namespace
            .clone()
            .unwrap_or_else(|| CLUSTER_EVENTS_NAMESPACE.to_string());
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let sent = match seen {
            Some(mut repeat) => {
                repeat.series = Some(EventSeries {
                    count: repeat.series.as_ref().map_or(2, |s| s.count + 1),
                    last_observed_time: MicroTime(now),
                });
                let name = repeat.metadata.name.clone().unwrap_or_default();
                match api
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&repeat))
                    .await
                {
                    Ok(_) => repeat,
                    // The first one is gone (expired or deleted): start again.
                    Err(kube::Error::Api(s)) if s.is_not_found() => {
                        let fresh = build(&self.reporter, ev, on, now);
                        api.create(&PostParams::default(), &fresh).await?;
                        fresh
                    }
                    Err(e) => return Err(e),
                }
            }
            None => {
                let fresh = build(&self.reporter, ev, on, now);
                api.create(&PostParams::default(), &fresh).await?;
                fresh
            }
        };
        self.published
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(key, sent);
        Ok(())
    }
}

/// An Event of `type_` with no related object.
pub fn event(
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
    related: Option<ObjectReference>,
) -> Event {
    Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: action.to_string(),
        secondary: related,
    }
}

fn key_of(ev: &Event, on: &ObjectReference) -> Key {
    Key {
        warning: ev.type_ == EventType::Warning,
        reason: ev.reason.clone(),
        action: ev.action.clone(),
        note: ev.note.clone(),
        regarding: on.into(),
        related: ev.secondary.as_ref().map(RefKey::from),
    }
}

fn last_seen(e: &K8sEvent) -> Option<Timestamp> {
    e.series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
}

/// The Event object for `ev` about `on`, first seen at `now`.
fn build(reporter: &Reporter, ev: &Event, on: &ObjectReference, now: Timestamp) -> K8sEvent {
    let regarding = on.name.as_deref().unwrap_or(&reporter.controller);
    K8sEvent {
        action: Some(ev.action.clone()),
        reason: Some(ev.reason.clone()),
        event_time: Some(MicroTime(now)),
        regarding: Some(on.clone()),
        related: ev.secondary.clone(),
        note: ev.note.clone(),
        metadata: ObjectMeta {
            namespace: Some(
                on.namespace
                    .clone()
                    .unwrap_or_else(|| CLUSTER_EVENTS_NAMESPACE.to_string()),
            ),
            name: Some(event_name(regarding, now.as_nanosecond())),
            ..Default::default()
        },
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        type_: Some(
            match ev.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .to_string(),
        ),
        ..Default::default()
    }
}

/// `<regarding>.<nanoseconds in hex>`, as client-go names Events, but never longer than
/// [`MAX_EVENT_NAME`]: a long object name is cut and a hash of the whole name keeps two
/// long names apart, so that Events about an object with a 253-character name publish.
pub fn event_name(regarding: &str, nanos: i128) -> String {
    let suffix = format!(".{nanos:x}");
    let base = names::bounded(regarding, MAX_EVENT_NAME - suffix.len());
    format!("{base}{suffix}")
}

/// `note` cut to [`MAX_NOTE`] bytes (on a character boundary), marked with "..." when cut.
pub fn truncate_note(note: &str) -> String {
    gpufabric_api::text::cut(note, MAX_NOTE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The API server's rule for object names: a DNS-1123 subdomain.
    fn is_dns_subdomain(name: &str) -> bool {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        name.len() <= 253 && name.split('.').all(label_ok)
    }

    const NANOS: i128 = 1_795_000_000_123_456_789;

    #[test]
    fn a_short_name_is_kept_as_client_go_writes_it() {
        assert_eq!(event_name("nightly", NANOS), format!("nightly.{NANOS:x}"));
    }

    #[test]
    fn events_about_a_253_character_name_get_a_valid_name() {
        let long = format!("{}.{}", "a".repeat(126), "b".repeat(126));
        assert_eq!(long.len(), 253);
        let name = event_name(&long, NANOS);
        assert!(name.len() <= MAX_EVENT_NAME, "{} chars", name.len());
        assert!(is_dns_subdomain(&name), "{name}");
        assert!(name.ends_with(&format!(".{NANOS:x}")), "{name}");
        assert_eq!(name, event_name(&long, NANOS), "deterministic");
    }

    #[test]
    fn two_long_names_with_one_prefix_stay_apart() {
        let a = format!("{}-a", "x".repeat(251));
        let b = format!("{}-b", "x".repeat(251));
        assert_ne!(event_name(&a, NANOS), event_name(&b, NANOS));
    }

    #[test]
    fn notes_are_cut_below_one_kilobyte_on_a_character_boundary() {
        let note = "é".repeat(800);
        let cut = truncate_note(&note);
        assert!(
            cut.len() <= MAX_NOTE && cut.ends_with("..."),
            "{}",
            cut.len()
        );
        assert_eq!(truncate_note("short"), "short");
    }

    #[test]
    fn a_built_event_names_its_object_reporter_and_type() {
        let reporter = Reporter {
            controller: "gpufabric".into(),
            instance: Some("op-0".into()),
        };
        let on = ObjectReference {
            kind: Some("FabricTest".into()),
            name: Some("x".repeat(253)),
            namespace: Some("gpu".into()),
            ..Default::default()
        };
        let ev = event(
            EventType::Warning,
            "OverBudget",
            "Quarantine",
            "n".into(),
            None,
        );
        let built = build(&reporter, &ev, &on, Timestamp::UNIX_EPOCH);
        assert!(built.metadata.name.as_deref().is_some_and(is_dns_subdomain));
        assert_eq!(built.metadata.namespace.as_deref(), Some("gpu"));
        assert_eq!(built.regarding.as_ref(), Some(&on));
        assert_eq!(built.type_.as_deref(), Some("Warning"));
        assert_eq!(built.reporting_instance.as_deref(), Some("op-0"));
        let node = ObjectReference {
            kind: Some("Node".into()),
            name: Some("n1".into()),
            ..Default::default()
        };
        let built = build(&reporter, &ev, &node, Timestamp::UNIX_EPOCH);
        assert_eq!(built.metadata.namespace.as_deref(), Some("default"));
    }

    #[test]
    fn the_same_event_again_is_the_same_key_and_a_new_note_is_not() {
        let on = ObjectReference {
            name: Some("t".into()),
            ..Default::default()
        };
        let a = event(
            EventType::Normal,
            "RunCreated",
            "Schedule",
            "run 1".into(),
            None,
        );
        let b = event(
            EventType::Normal,
            "RunCreated",
            "Schedule",
            "run 1".into(),
            None,
        );
        let c = event(
            EventType::Normal,
            "RunCreated",
            "Schedule",
            "run 2".into(),
            None,
        );
        assert_eq!(key_of(&a, &on), key_of(&b, &on));
        assert_ne!(key_of(&a, &on), key_of(&c, &on));
    }
}
