//! Kubernetes Events (events.k8s.io/v1): the one publisher of the controllers and the
//! quarantine executor, over kube's [`Recorder`] (which creates an Event and counts up its
//! series when it comes again within a few minutes). Publishing is best effort: a failed
//! Event is logged, never fails a reconcile.

use crate::names;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::events::Recorder;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub use kube::runtime::events::{Event, EventType, Reporter};

/// Longest object name the API server accepts (a DNS subdomain).
pub const MAX_EVENT_NAME: usize = 253;
/// Longest note the API server accepts is 1 kB; notes are cut a little below it.
pub const MAX_NOTE: usize = 1000;
/// How long a repeat counts up the first Event's series: kube's [`Recorder`] keeps a
/// published Event this long, and a recorder not used for as long is dropped.
const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);
/// Longest regarding name kube's [`Recorder`] can name an Event after:
/// `<name>.<nanoseconds in hex>` (at most 16 hex digits) must fit [`MAX_EVENT_NAME`].
const MAX_RECORDED_NAME: usize = MAX_EVENT_NAME - 17;
/// Namespace of the Events about cluster-scoped objects (Nodes, FabricTests, FabricTestRuns),
/// as kube's [`Recorder`] puts them. `kubectl describe` of a cluster-scoped object finds its
/// Events in every namespace.
const CLUSTER_EVENTS_NAMESPACE: &str = "default";

/// What makes two Events the same: repeats count up the first one's series. Kube's
/// [`Recorder`] leaves the note out of its key, so that a repeat with a new note would
/// only count up the first note; here each note is its own Event ("created run nightly-2"
/// is not "created run nightly-1" again).
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

/// Publishes Events on behalf of the operator: one kube [`Recorder`] per [`Key`], so that
/// kube counts each Event's repeats. Cheap to clone (the recorders are shared).
#[derive(Clone)]
pub struct Events {
    client: Client,
    reporter: Reporter,
    /// Each Event's recorder, and when it last published.
    recorders: Arc<Mutex<HashMap<Key, (Recorder, Timestamp)>>>,
}

impl Events {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Events {
            client,
            reporter,
            recorders: Arc::default(),
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
        let published = if on
            .name
            .as_ref()
            .is_some_and(|n| n.len() > MAX_RECORDED_NAME)
        {
            self.create_once(on, &ev).await
        } else {
            self.record(on, &ev).await
        };
        if let Err(e) = published {
            tracing::warn!(
                reason = %ev.reason,
                object = on.name.as_deref().unwrap_or_default(),
                error = %e,
                "could not publish an Event"
            );
        }
    }

    /// Publishes through the Event's own recorder; when the first Event is gone (expired
    /// or deleted) its series cannot be counted up, and a new recorder starts again.
    async fn record(&self, on: &ObjectReference, ev: &Event) -> Result<(), kube::Error> {
        let key = key_of(ev, on);
        let recorder = self.recorder(&key, false);
        match recorder.publish(ev, on).await {
            Err(kube::Error::Api(s)) if s.is_not_found() => {
                self.recorder(&key, true).publish(ev, on).await
            }
            published => published,
        }
    }

    /// The recorder of `key` (a new one when `fresh`), its use noted; recorders unused for
    /// [`SERIES_TTL`] are dropped.
    fn recorder(&self, key: &Key, fresh: bool) -> Recorder {
        let now = Timestamp::now();
        let mut recorders = self
            .recorders
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        recorders.retain(|_, (_, used)| *used + SERIES_TTL > now);
        if fresh {
            recorders.remove(key);
        }
        let (recorder, used) = recorders.entry(key.clone()).or_insert_with(|| {
            (
                Recorder::new(self.client.clone(), self.reporter.clone()),
                now,
            )
        });
        *used = now;
        recorder.clone()
    }

    /// An Event about an object whose name is too long for kube's naming, created on its
    /// own (a repeat is another Event), named by [`event_name`].
    async fn create_once(&self, on: &ObjectReference, ev: &Event) -> Result<(), kube::Error> {
        let built = build(&self.reporter, ev, on, Timestamp::now());
        let namespace = built.metadata.namespace.clone().unwrap_or_default();
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        api.create(&PostParams::default(), &built).await.map(|_| ())
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

/// The Event object for `ev` about `on` at `now`, as kube's [`Recorder`] builds it but
/// named by [`event_name`].
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
    fn a_name_kube_records_under_fits_and_a_longer_one_goes_the_bounded_way() {
        // kube names an Event `<regarding>.<nanoseconds in hex>`, as client-go does.
        let latest = i128::from(i64::MAX);
        let recorded = format!("{}.{latest:x}", "a".repeat(MAX_RECORDED_NAME));
        assert!(recorded.len() <= MAX_EVENT_NAME, "{}", recorded.len());
        let longer = format!("{}.{latest:x}", "a".repeat(MAX_RECORDED_NAME + 1));
        assert!(longer.len() > MAX_EVENT_NAME, "the limit is exact");
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
