//! Leader election with a coordination.k8s.io Lease, so that of several replicas only one
//! runs the controllers. The holder renews the Lease every `retry_every`; a follower takes
//! it over only after it has seen the same holder record, unchanged, for the Lease's
//! duration by its own clock (never by comparing the holder's `renewTime` with its own
//! clock: the two hosts' clocks may disagree). A leader that cannot renew within
//! `renew_deadline` stops acting; one that stops (SIGTERM) releases the Lease, so that a
//! follower takes over at its next retry instead of after the Lease expires.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use std::future::Future;
use std::time::{Duration, Instant};

/// Where the Lease lives and who we are.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (pod name or host name).
    pub identity: String,
    /// How long a holder record seen unchanged stays with its holder.
    pub lease_seconds: i32,
    /// How long the leader keeps acting without a successful renewal; shorter than the
    /// lease, so that it stops before a follower may take over.
    pub renew_deadline: Duration,
    /// How often the holder renews, and a follower retries.
    pub retry_every: Duration,
}

/// The Lease's name unless the operator is told otherwise.
pub const DEFAULT_LEASE_NAME: &str = "fabric-operator";

impl LeaderConfig {
    /// The defaults of client-go's leader election: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(namespace: String, identity: String) -> LeaderConfig {
        LeaderConfig {
            namespace,
            name: DEFAULT_LEASE_NAME.into(),
            identity,
            lease_seconds: 15,
            renew_deadline: Duration::from_secs(10),
            retry_every: Duration::from_secs(2),
        }
    }
}

/// The part of a Lease that changes each time its holder renews it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    holder: String,
    renew_time: Option<Timestamp>,
    acquire_time: Option<Timestamp>,
    transitions: Option<i32>,
    duration_seconds: Option<i32>,
}

/// What a follower last saw of another replica's Lease, and when it first saw it (by the
/// follower's own monotonic clock).
#[derive(Debug, Clone, Default)]
pub struct Observer {
    last: Option<(Record, Instant)>,
}

impl Observer {
    /// May `identity` take or keep the Lease whose spec is `spec`, observed at `now`?
    ///
    /// 1. No spec or no holder: yes (a free or released Lease).
    /// 2. Held by `identity`: yes.
    /// 3. Held by another: yes only when this observer has seen the same holder record
    ///    (holder, renew and acquire times, transitions, duration) unchanged for the
    ///    Lease's duration (15 s when unset), measured from when it first saw it.
    pub fn may_hold(&mut self, spec: Option<&LeaseSpec>, identity: &str, now: Instant) -> bool {
        let Some(spec) = spec else {
            self.last = None;
            return true;
        };
        let holder = match spec.holder_identity.as_deref() {
            None | Some("") => {
                self.last = None;
                return true;
            }
            Some(h) if h == identity => {
                self.last = None;
                return true;
            }
            Some(h) => h.to_string(),
        };
        let record = Record {
            holder,
            renew_time: spec.renew_time.as_ref().map(|t| t.0),
            acquire_time: spec.acquire_time.as_ref().map(|t| t.0),
            transitions: spec.lease_transitions,
            duration_seconds: spec.lease_duration_seconds,
        };
        let duration = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
        match &self.last {
            Some((seen, since)) if *seen == record => {
                now.saturating_duration_since(*since) >= duration
            }
            _ => {
                self.last = Some((record, now));
                false
            }
        }
    }
}

/// Tries once to take or renew the Lease; true when this replica holds it now.
pub async fn try_hold(
    api: &Api<Lease>,
    cfg: &LeaderConfig,
    observer: &mut Observer,
) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let current = api.get_opt(&cfg.name).await?;
    let Some(mut lease) = current else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.name.clone()),
                namespace: Some(cfg.namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(cfg.identity.clone()),
                lease_duration_seconds: Some(cfg.lease_seconds),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(0),
                ..Default::default()
            }),
        };
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        };
    };
    if !observer.may_hold(lease.spec.as_ref(), &cfg.identity, Instant::now()) {
        return Ok(false);
    }
    let spec = lease.spec.get_or_insert_with(Default::default);
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        spec.holder_identity = Some(cfg.identity.clone());
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    }
    spec.lease_duration_seconds = Some(cfg.lease_seconds);
    spec.renew_time = Some(MicroTime(now));
    // The resourceVersion in `lease` makes this a compare-and-swap: 409 when someone else
    // wrote the Lease since we read it.
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Waits until this replica holds the Lease. `on_contact` is called after each attempt
/// that reached the API server (the replica can follow), so readiness can say so while it
/// waits.
pub async fn acquire(client: &Client, cfg: &LeaderConfig, on_contact: impl Fn()) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let mut observer = Observer::default();
    let mut logged = false;
    loop {
        match try_hold(&api, cfg, &mut observer).await {
            Ok(true) => {
                on_contact();
                tracing::info!(lease = %cfg.name, identity = %cfg.identity, "became the leader");
                return;
            }
            Ok(false) => {
                on_contact();
                if !logged {
                    tracing::info!(lease = %cfg.name, "another replica leads; waiting");
                    logged = true;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "leader election: could not read or write the Lease")
            }
        }
        tokio::time::sleep(cfg.retry_every).await;
    }
}

/// Renews the Lease; returns when it is lost (another replica took it, or it could not be
/// renewed within the renew deadline).
pub async fn hold(client: &Client, cfg: &LeaderConfig) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let mut observer = Observer::default();
    let mut last_renewed = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(cfg.retry_every).await;
        match try_hold(&api, cfg, &mut observer).await {
            Ok(true) => last_renewed = tokio::time::Instant::now(),
            Ok(false) => {
                tracing::error!(lease = %cfg.name, "lost the leader Lease to another replica");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not renew the leader Lease");
                if last_renewed.elapsed() >= cfg.renew_deadline {
                    tracing::error!("the leader Lease could not be renewed within its deadline");
                    return;
                }
            }
        }
    }
}

/// Gives the Lease up when this replica holds it: no holder, a one-second duration, so a
/// follower takes it at its next retry. Guarded by the resourceVersion read, so a Lease
/// another replica took meanwhile is left alone.
pub async fn release(client: &Client, cfg: &LeaderConfig) -> Result<bool, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        return Ok(false);
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(false);
    };
    if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
        return Ok(false);
    }
    let now = MicroTime(Timestamp::now());
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    spec.renew_time = Some(now.clone());
    spec.acquire_time = Some(now);
    match api.replace(&cfg.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Runs `work` while holding the Lease, then releases it when `work` ends on its own (the
/// controllers stopped on a signal). Returns false when the Lease was lost while `work` ran.
pub async fn lead<F: Future<Output = ()>>(client: &Client, cfg: &LeaderConfig, work: F) -> bool {
    let lost = tokio::select! {
        _ = work => false,
        _ = hold(client, cfg) => true,
    };
    if !lost {
        match release(client, cfg).await {
            Ok(true) => tracing::info!(lease = %cfg.name, "released the leader Lease"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "could not release the leader Lease"),
        }
    }
    !lost
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed: Timestamp) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(renewed)),
            ..Default::default()
        }
    }

    #[test]
    fn a_free_released_or_own_lease_may_be_held() {
        let now = Instant::now();
        let mut o = Observer::default();
        assert!(o.may_hold(None, "a", now));
        assert!(o.may_hold(Some(&spec("a", Timestamp::now())), "a", now));
        let released = LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            ..Default::default()
        };
        assert!(o.may_hold(Some(&released), "a", now));
    }

    #[test]
    fn another_holders_lease_is_taken_only_after_it_is_seen_unchanged_for_its_duration() {
        let t0 = Instant::now();
        let renewed = Timestamp::now();
        let mut o = Observer::default();
        assert!(!o.may_hold(Some(&spec("b", renewed)), "a", t0));
        assert!(!o.may_hold(Some(&spec("b", renewed)), "a", t0 + Duration::from_secs(14)));
        assert!(o.may_hold(Some(&spec("b", renewed)), "a", t0 + Duration::from_secs(15)));
    }

    #[test]
    fn a_renewal_restarts_the_wait() {
        let t0 = Instant::now();
        let renewed = Timestamp::now();
        let mut o = Observer::default();
        assert!(!o.may_hold(Some(&spec("b", renewed)), "a", t0));
        let later = renewed + k8s_openapi::jiff::SignedDuration::from_secs(10);
        assert!(!o.may_hold(Some(&spec("b", later)), "a", t0 + Duration::from_secs(10)));
        assert!(!o.may_hold(Some(&spec("b", later)), "a", t0 + Duration::from_secs(20)));
        assert!(o.may_hold(Some(&spec("b", later)), "a", t0 + Duration::from_secs(25)));
    }

    #[test]
    fn a_holder_clock_far_in_the_past_is_not_taken_as_expired() {
        // The holder's clock is an hour behind: its renewTime looks stale to us, but it
        // keeps changing, so the Lease is live.
        let t0 = Instant::now();
        let skewed = Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(3600);
        let mut o = Observer::default();
        assert!(!o.may_hold(Some(&spec("b", skewed)), "a", t0));
        let renewed = skewed + k8s_openapi::jiff::SignedDuration::from_secs(2);
        assert!(!o.may_hold(Some(&spec("b", renewed)), "a", t0 + Duration::from_secs(2)));
    }
}
