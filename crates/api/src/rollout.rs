//! `spec.rollout`: how many of a run's nodes are under test (hold a benchmark pod) at once.
//! A run over more nodes proceeds in waves of that size, so a nightly test never takes the
//! whole fleet away from training at the same moment.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};

/// How a run's nodes are taken out of service for testing.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{"rule": "!has(self.maxUnavailable) || (type(self.maxUnavailable) == int ? self.maxUnavailable >= 1 : self.maxUnavailable.matches('^(100|[1-9][0-9]?)%$'))", "message": "rollout.maxUnavailable must be a count >= 1 or a percent from 1% to 100%"}]))]
pub struct Rollout {
    /// Most nodes under test at once: a count (`50`) or a percent of the run's nodes
    /// (`"10%"`, rounded down, at least 1). Absent: every node at once. The run tests its
    /// nodes in waves of this size; a wave starts when every node of the one before has
    /// finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
}

/// Why `spec.rollout.maxUnavailable` gives no wave size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RolloutError {
    #[error("rollout.maxUnavailable must be at least 1, not {0}")]
    BelowOne(i32),
    #[error(
        "rollout.maxUnavailable must be a count (e.g. 50) or a percent from 1% to 100% (e.g. \"10%\"), not {0:?}"
    )]
    NotACountOrPercent(String),
}

impl Rollout {
    /// Nodes per wave for a run over `total` nodes: between 1 and `total` (for `total`
    /// above 0). An error says what is wrong with a value that is neither a positive count
    /// nor a percent from 1% to 100%.
    pub fn wave_size(&self, total: usize) -> Result<usize, RolloutError> {
        let Some(v) = &self.max_unavailable else {
            return Ok(total.max(1));
        };
        let n = match v {
            IntOrString::Int(n) if *n >= 1 => *n as usize,
            IntOrString::Int(n) => return Err(RolloutError::BelowOne(*n)),
            IntOrString::String(s) => {
                let pct = s
                    .strip_suffix('%')
                    .and_then(|p| p.trim().parse::<u32>().ok())
                    .filter(|p| (1..=100).contains(p))
                    .ok_or_else(|| RolloutError::NotACountOrPercent(s.clone()))?;
                total * pct as usize / 100
            }
        };
        Ok(n.clamp(1, total.max(1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(v: IntOrString) -> Rollout {
        Rollout {
            max_unavailable: Some(v),
        }
    }

    #[test]
    fn a_percent_rounds_down_and_never_reaches_zero() {
        let pct = |s: &str| r(IntOrString::String(s.into()));
        assert_eq!(pct("10%").wave_size(10_000), Ok(1000));
        assert_eq!(pct("10%").wave_size(25), Ok(2));
        assert_eq!(pct("10%").wave_size(5), Ok(1));
        assert_eq!(pct("100%").wave_size(7), Ok(7));
        assert!(pct("0%").wave_size(10).is_err());
        assert!(pct("150%").wave_size(10).is_err());
        assert!(pct("ten").wave_size(10).is_err());
    }

    #[test]
    fn a_count_is_capped_by_the_run_and_absent_means_all_at_once() {
        assert_eq!(r(IntOrString::Int(50)).wave_size(20), Ok(20));
        assert_eq!(r(IntOrString::Int(50)).wave_size(500), Ok(50));
        assert!(r(IntOrString::Int(0)).wave_size(5).is_err());
        assert_eq!(Rollout::default().wave_size(300), Ok(300));
    }
}
