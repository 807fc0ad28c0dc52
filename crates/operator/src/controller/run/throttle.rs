//! At most one pass over a run per [`MIN_PASS_INTERVAL`]. The run controller has no
//! debounce: a debounce restarts with every new pod event, so while thousands of pods end
//! (an event every few milliseconds) the run would not be looked at until they all had, and
//! its results and verdict would all wait for the end. With this throttle a busy run gets a
//! pass every interval, and a quiet one at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The shortest time between the starts of two passes over one run.
pub const MIN_PASS_INTERVAL: Duration = Duration::from_secs(1);

/// When each run's last pass began, by run name.
#[derive(Default)]
pub struct PassThrottle {
    began: Mutex<HashMap<String, Instant>>,
}

impl PassThrottle {
    /// Whether a pass over `run` may begin at `now` (and then records it as begun), or how
    /// long until one may.
    pub fn begin(&self, run: &str, now: Instant) -> Result<(), Duration> {
        let mut began = self
            .began
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(last) = began.get(run) {
            let next = *last + MIN_PASS_INTERVAL;
            if now < next {
                return Err(next - now);
            }
        }
        began.insert(run.to_string(), now);
        Ok(())
    }

    /// Forgets a run that has ended or is gone.
    pub fn forget(&self, run: &str) {
        self.began
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(run);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_waits_out_the_interval_of_its_own_run_only() {
        let t = PassThrottle::default();
        let t0 = Instant::now();
        assert_eq!(t.begin("a", t0), Ok(()));
        assert_eq!(t.begin("b", t0), Ok(()), "another run is not held back");
        let soon = t0 + Duration::from_millis(300);
        assert_eq!(t.begin("a", soon), Err(Duration::from_millis(700)));
        // A refused pass does not move the clock: the wait shrinks.
        let later = t0 + Duration::from_millis(900);
        assert_eq!(t.begin("a", later), Err(Duration::from_millis(100)));
        assert_eq!(t.begin("a", t0 + MIN_PASS_INTERVAL), Ok(()));
        assert!(t.begin("a", t0 + MIN_PASS_INTERVAL).is_err());
        t.forget("a");
        assert_eq!(t.begin("a", t0 + MIN_PASS_INTERVAL), Ok(()), "forgotten");
    }
}
