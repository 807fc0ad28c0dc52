//! The key numbers of a measurement: peak all_reduce bus bandwidth, the slowest GPU-pair
//! copy and host link, and the DDP step time at the most GPUs, to four significant digits.
//! A node's run entry (`crate::run`) and its trend record (`crate::trend`) keep the same.

use super::CompactResult;
use crate::suite::Collective;

/// The key numbers of one measured run of a node. A number is None when its phase did not
/// run or measured nothing.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub(crate) struct KeyNumbers {
    /// Peak all_reduce bus bandwidth, GB/s.
    pub busbw_gbps: Option<f64>,
    /// Lowest one-way GPU-pair copy, GB/s.
    pub worst_pair_gbps: Option<f64>,
    /// Lowest host-to-device or device-to-host copy of any GPU, GB/s.
    pub host_gbps: Option<f64>,
    /// DDP step time at the largest GPU count, milliseconds.
    pub ddp_step_ms: Option<f64>,
}

impl KeyNumbers {
    /// The key numbers of a measured node's compact result, rounded.
    pub(crate) fn of(result: &CompactResult) -> KeyNumbers {
        KeyNumbers::exact(result).rounded()
    }

    /// Each number to four significant digits (and None unless positive and finite).
    pub(crate) fn rounded(self) -> KeyNumbers {
        KeyNumbers {
            busbw_gbps: self.busbw_gbps.and_then(round4),
            worst_pair_gbps: self.worst_pair_gbps.and_then(round4),
            host_gbps: self.host_gbps.and_then(round4),
            ddp_step_ms: self.ddp_step_ms.and_then(round4),
        }
    }

    /// The key numbers of a compact result as measured.
    fn exact(result: &CompactResult) -> KeyNumbers {
        let busbw = result
            .collectives
            .iter()
            .find(|c| c.collective == Collective::AllReduce)
            .map(|c| c.peak_busbw);
        let pair = (0..result.gpus)
            .flat_map(|a| (0..result.gpus).map(move |b| (a, b)))
            .filter_map(|(a, b)| result.pair_uni(a, b))
            .reduce(f64::min);
        let host = result
            .host_to_device
            .iter()
            .chain(&result.device_to_host)
            .copied()
            .filter(|v| v.is_finite() && *v > 0.0)
            .reduce(f64::min);
        let step = result
            .ddp_points
            .iter()
            .max_by_key(|p| p.gpus)
            .map(|p| p.step_ms);
        KeyNumbers {
            busbw_gbps: busbw,
            worst_pair_gbps: pair,
            host_gbps: host,
            ddp_step_ms: step,
        }
    }
}

/// A positive finite value rounded to four significant digits; None otherwise.
fn round4(v: f64) -> Option<f64> {
    if !v.is_finite() || v <= 0.0 {
        return None;
    }
    let digits = 3 - v.log10().floor() as i32;
    let scale = 10f64.powi(digits);
    Some((v * scale).round() / scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_keep_four_significant_digits() {
        assert_eq!(round4(371.2345), Some(371.2));
        assert_eq!(round4(0.123456), Some(0.1235));
        assert_eq!(round4(12345.6), Some(12350.0));
        assert_eq!(round4(0.0), None);
        assert_eq!(round4(f64::NAN), None);
        assert_eq!(round4(-3.0), None);
    }
}
