//! Leader election with a coordination.k8s.io Lease, so that of several replicas only one
//! runs the controllers. The holder renews the Lease; another replica takes it over only
//! after it has not been renewed for `lease_seconds`. A replica that loses the Lease stops
//! (and is restarted by its Deployment to wait as a follower).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use std::time::Duration;

/// Where the Lease lives and who we are.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    pub namespace: String,
    pub name: String,
    /// This replica's identity (pod name or host name).
    pub identity: String,
    /// How long a Lease not renewed stays with its holder.
    pub lease_seconds: i32,
    /// How often the holder renews, and a follower retries.
    pub renew_every: Duration,
}

impl LeaderConfig {
    pub fn new(namespace: String, identity: String) -> LeaderConfig {
        LeaderConfig {
            namespace,
            name: "fabric-operator".into(),
            identity,
            lease_seconds: 15,
            renew_every: Duration::from_secs(5),
        }
    }
}

/// What a Lease says to `identity` at `now`: may it take or keep it?
pub fn may_hold(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> bool {
    let Some(spec) = spec else { return true };
    match spec.holder_identity.as_deref() {
        None | Some("") => true,
        Some(h) if h == identity => true,
        Some(_) => {
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
            match &spec.renew_time {
                Some(t) => t.0 + SignedDuration::from_secs(duration) < now,
                None => true,
            }
        }
    }
}

/// Tries once to take or renew the Lease; true when this replica holds it now.
pub async fn try_hold(api: &Api<Lease>, cfg: &LeaderConfig) -> Result<bool, kube::Error> {
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
    if !may_hold(lease.spec.as_ref(), &cfg.identity, now) {
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

/// Waits until this replica holds the Lease.
pub async fn acquire(client: &Client, cfg: &LeaderConfig) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let mut logged = false;
    loop {
        match try_hold(&api, cfg).await {
            Ok(true) => {
                tracing::info!(lease = %cfg.name, identity = %cfg.identity, "became the leader");
                return;
            }
            Ok(false) if !logged => {
                tracing::info!(lease = %cfg.name, "another replica leads; waiting");
                logged = true;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "leader election: could not read or write the Lease")
            }
        }
        tokio::time::sleep(cfg.renew_every).await;
    }
}

/// Renews the Lease; returns when it is lost (another replica took it, or it could not be
/// renewed before it expired).
pub async fn hold(client: &Client, cfg: &LeaderConfig) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let mut last_renewed = tokio::time::Instant::now();
    let expiry = Duration::from_secs(cfg.lease_seconds.max(1) as u64);
    loop {
        tokio::time::sleep(cfg.renew_every).await;
        match try_hold(&api, cfg).await {
            Ok(true) => last_renewed = tokio::time::Instant::now(),
            Ok(false) => {
                tracing::error!(lease = %cfg.name, "lost the leader Lease to another replica");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not renew the leader Lease");
                if last_renewed.elapsed() >= expiry {
                    tracing::error!("the leader Lease expired before it could be renewed");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed_secs_ago: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(
                Timestamp::now() - SignedDuration::from_secs(renewed_secs_ago),
            )),
            ..Default::default()
        }
    }

    #[test]
    fn a_free_or_own_lease_may_be_held() {
        let now = Timestamp::now();
        assert!(may_hold(None, "a", now));
        assert!(may_hold(Some(&spec("a", 1)), "a", now));
    }

    #[test]
    fn another_holders_lease_is_taken_only_after_it_expires() {
        let now = Timestamp::now();
        assert!(!may_hold(Some(&spec("b", 5)), "a", now));
        assert!(may_hold(Some(&spec("b", 30)), "a", now));
    }
}
