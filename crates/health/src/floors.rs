//! The floors a node's all_reduce and GPU-pair copies are held to, one source for the rules
//! that judge them and the report that draws them: a curve under a drawn floor has a
//! finding, and a floor no rule holds a node to is not drawn.

use crate::profiles::{self, Expectations};
use gpufabric_api::findings::ExpectationSource;
use gpufabric_api::policy::Thresholds;
use gpufabric_api::result::{BANDWIDTH_BYTES, COPY_BYTES, CompactResult};
use gpufabric_api::suite::Collective;

/// A floor and where it comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Floor {
    pub gbps: f64,
    /// The spec's threshold, or the GPU profile's floor.
    pub source: ExpectationSource,
}

/// The floor a node's peak all_reduce bus bandwidth is held to in a sweep whose largest size
/// is `largest` (`None`: an agent that did not say, judged as the default suite): the spec's
/// threshold, else the profile's floor times the share of it healthy nodes reach at that
/// size ([`profiles::size_profile`]). None for a sweep that ends below [`BANDWIDTH_BYTES`],
/// whose busbw says nothing of the links.
pub fn all_reduce(
    t: &Thresholds,
    exp: Option<&Expectations>,
    largest: Option<u64>,
) -> Option<Floor> {
    if largest.is_some_and(|b| b < BANDWIDTH_BYTES) {
        return None;
    }
    let profile = exp
        .and_then(|e| e.all_reduce_floor_gbps)
        .and_then(|floor| match largest {
            None => Some(floor),
            Some(b) => profiles::size_profile(Collective::AllReduce)
                .and_then(|p| p.share_at(b))
                .map(|share| floor * share),
        });
    of(t.nccl_bus_bw_gbps, profile)
}

/// The floor every GPU pair's one-way copy is held to when each copy moved `pair_bytes`
/// (`None`: an agent that did not say): the spec's threshold, else the profile's. None for
/// copies shorter than [`COPY_BYTES`], which do not show the links' bandwidth.
pub fn pair(t: &Thresholds, exp: Option<&Expectations>, pair_bytes: Option<u64>) -> Option<Floor> {
    if pair_bytes.is_some_and(|b| b < COPY_BYTES) {
        return None;
    }
    of(t.pair_bandwidth_gbps, exp.and_then(|e| e.pair_floor_gbps))
}

/// Both floors of a node from its compact result: its all_reduce's (at the sweep's largest
/// size) and its pairs' (at the copies' size), with the expectations the rules derive for
/// `product` from what the result reports.
pub fn of_node(t: &Thresholds, product: &str, r: &CompactResult) -> (Option<Floor>, Option<Floor>) {
    let exp = profiles::expectations_of(product, r);
    let largest = r
        .collectives
        .iter()
        .find(|c| c.collective == Collective::AllReduce)
        .and_then(|c| c.largest_bytes);
    (
        all_reduce(t, exp.as_ref(), largest),
        pair(t, exp.as_ref(), r.pair_bytes),
    )
}

/// The spec's threshold, else the profile's floor.
pub(crate) fn of(threshold: Option<f64>, profile: Option<f64>) -> Option<Floor> {
    threshold
        .map(|gbps| Floor {
            gbps,
            source: ExpectationSource::Threshold,
        })
        .or_else(|| {
            profile.map(|gbps| Floor {
                gbps,
                source: ExpectationSource::Profile,
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100x8() -> Option<Expectations> {
        profiles::expectations("NVIDIA H100 80GB HBM3", 8)
    }

    #[test]
    fn a_shorter_sweep_is_held_to_the_floor_at_its_own_size() {
        let t = Thresholds::default();
        let e = h100x8();
        let full = all_reduce(&t, e.as_ref(), Some(1 << 30)).map(|f| f.gbps);
        assert_eq!(full, Some(225.0));
        let at_256 = all_reduce(&t, e.as_ref(), Some(256 << 20)).map(|f| f.gbps);
        assert!(at_256.is_some_and(|g| g < 225.0 && g > 200.0), "{at_256:?}");
        assert_eq!(all_reduce(&t, e.as_ref(), Some(1 << 20)), None);
    }

    #[test]
    fn the_specs_threshold_wins_at_any_judged_size() {
        let t = Thresholds {
            nccl_bus_bw_gbps: Some(400.0),
            ..Thresholds::default()
        };
        let f = all_reduce(&t, h100x8().as_ref(), Some(128 << 20));
        assert_eq!(
            f,
            Some(Floor {
                gbps: 400.0,
                source: ExpectationSource::Threshold
            })
        );
    }

    #[test]
    fn short_copies_have_no_pair_floor() {
        let t = Thresholds::default();
        assert_eq!(
            pair(&t, h100x8().as_ref(), Some(256 << 20)).map(|f| f.gbps),
            Some(225.0)
        );
        assert_eq!(pair(&t, h100x8().as_ref(), Some(1 << 20)), None);
    }
}
