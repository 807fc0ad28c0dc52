//! Waiting with a deadline: poll a condition, or watch an object until a predicate holds.

use crate::{Error, Result, kube_err};
use kube::api::Api;
use kube::runtime::wait::await_condition;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

/// Calls `check` every `interval` until it returns `Some`, or fails after `timeout`.
/// An error from `check` ends the wait at once.
pub async fn poll<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    mut check: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if Instant::now() >= end {
            return Err(Error::Timeout {
                what: what.to_string(),
                seconds: timeout.as_secs(),
            });
        }
        tokio::time::sleep(interval).await;
    }
}

/// Watches `name` until `cond` holds for it (`None` means the object does not exist),
/// and returns the object as it was then.
pub async fn for_object<K, C>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
    cond: C,
) -> Result<Option<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + 'static,
    C: Fn(Option<&K>) -> bool + Send,
{
    let what = format!("{} {name}", K::kind(&()));
    match tokio::time::timeout(timeout, await_condition(api.clone(), name, cond)).await {
        Ok(Ok(obj)) => Ok(obj),
        Ok(Err(e)) => Err(Error::Invalid(format!("watching {what}: {e}"))),
        Err(_) => {
            // Say where it stood, so a failing test shows the state it ended in.
            let now = api
                .get_opt(name)
                .await
                .map_err(kube_err(format!("reading {what}")))?;
            Err(Error::Timeout {
                what: format!("{what} to reach the expected state (last seen: {now:?})"),
                seconds: timeout.as_secs(),
            })
        }
    }
}

/// Watches `name` until it no longer exists.
pub async fn for_deletion<K>(api: &Api<K>, name: &str, timeout: Duration) -> Result<()>
where
    K: kube::Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + 'static,
{
    for_object(api, name, timeout, |o: Option<&K>| o.is_none())
        .await
        .map(|_| ())
}
