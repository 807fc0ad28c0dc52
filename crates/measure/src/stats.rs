//! Pure numeric helpers shared by both backends: nccl-tests' algbw and busbw, the
//! alpha-beta fit of a sweep, median and median absolute deviation.
//!
//! Size convention (the same as nccl-tests, doc/PERFORMANCE.md): the `bytes` of a sweep
//! row is nccl-tests' `size` column, the size of the *largest* buffer of the operation:
//! for all_reduce, broadcast, reduce and sendrecv the buffer every rank sends; for
//! all_gather the gathered output (count * nranks * elemsize, each rank contributes
//! bytes / nranks); for reduce_scatter the input (each rank keeps bytes / nranks); for
//! alltoall the whole send buffer of one rank (bytes / nranks to each peer). algbw is
//! that size over the time, busbw is algbw times [`Collective::busbw_factor`].

#![forbid(unsafe_code)]

use gpufabric_api::result::{AlphaBeta, Timing};
use gpufabric_api::suite::Collective;

/// Algorithm bandwidth in GB/s (10^9 bytes/s): `bytes / time`. Zero for a non-positive or
/// non-finite time.
pub(crate) fn algbw_gbps(bytes: u64, time_us: f64) -> f64 {
    if !(time_us.is_finite() && time_us > 0.0) {
        return 0.0;
    }
    // bytes per microsecond = 10^6 bytes/s; divide by 10^3 for 10^9 bytes/s.
    bytes as f64 / time_us / 1e3
}

/// Bus bandwidth in GB/s as nccl-tests defines it: algbw times the collective's factor for
/// `ranks` ranks (all_reduce 2(n-1)/n; all_gather, reduce_scatter, alltoall (n-1)/n;
/// broadcast, reduce, sendrecv 1).
pub(crate) fn busbw_gbps(collective: Collective, ranks: u32, bytes: u64, time_us: f64) -> f64 {
    algbw_gbps(bytes, time_us) * collective.busbw_factor(ranks as usize)
}

/// The timing of one run of `collective` over `ranks` at `bytes` taking `time_us`.
pub(crate) fn timing(
    collective: Collective,
    ranks: u32,
    bytes: u64,
    time_us: f64,
    wrong: u64,
) -> Timing {
    Timing {
        time_us,
        algbw: algbw_gbps(bytes, time_us),
        busbw: busbw_gbps(collective, ranks, bytes, time_us),
        wrong,
    }
}

/// Least-squares fit of `time_us = alpha + bytes / beta` to `(bytes, time_us)` points.
///
/// Each point is weighted by `1 / time^2`, so the fit minimises the *relative* error: a
/// sweep from 8 B to 1 GiB spans seven decades of time, and an unweighted fit would let
/// the largest sizes decide alpha too. `alpha_us` is clamped at zero; `beta_gbps` is in
/// GB/s of whatever bytes were given (pass bus bytes, see [`fit_sweep`], for bus
/// bandwidth). `None` for fewer than two usable points (positive finite time), a single
/// distinct size, or a fit whose slope is not positive (time that does not grow with size
/// says nothing about bandwidth).
pub(crate) fn fit_alpha_beta(points: &[(u64, f64)]) -> Option<AlphaBeta> {
    let usable: Vec<(f64, f64)> = points
        .iter()
        .filter(|(_, t)| t.is_finite() && *t > 0.0)
        .map(|&(b, t)| (b as f64, t))
        .collect();
    if usable.len() < 2 {
        return None;
    }
    let (mut sw, mut swx, mut swy, mut swxx, mut swxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x, y) in &usable {
        let w = 1.0 / (y * y);
        sw += w;
        swx += w * x;
        swy += w * y;
        swxx += w * x * x;
        swxy += w * x * y;
    }
    let det = sw * swxx - swx * swx;
    if !(det.is_finite() && det > 0.0) {
        return None;
    }
    // Guard against all sizes being equal up to rounding.
    let first = usable[0].0;
    if usable.iter().all(|&(x, _)| x == first) {
        return None;
    }
    let slope = (sw * swxy - swx * swy) / det; // microseconds per byte
    let intercept = (swy - slope * swx) / sw;
    if !(slope.is_finite() && slope > 0.0 && intercept.is_finite()) {
        return None;
    }
    Some(AlphaBeta {
        alpha_us: intercept.max(0.0),
        // 1/slope bytes per microsecond = 1e6/slope bytes/s = 1e-3/slope GB/s.
        beta_gbps: 1e-3 / slope,
    })
}

/// Alpha-beta fit of one collective's sweep with beta as *bus* bandwidth (the fit on bus
/// bytes = bytes * busbw factor), so `beta_gbps` compares with
/// the busbw column and with other collectives.
pub(crate) fn fit_sweep(
    collective: Collective,
    ranks: u32,
    points: &[(u64, f64)],
) -> Option<AlphaBeta> {
    let factor = collective.busbw_factor(ranks as usize);
    if !(factor.is_finite() && factor > 0.0) {
        return None;
    }
    // time = alpha + bytes/beta_alg = alpha + (bytes*factor)/(beta_alg*factor): fitting on
    // bus bytes is fitting on bytes and scaling beta, without rounding bus bytes to integers.
    let fit = fit_alpha_beta(points)?;
    Some(AlphaBeta {
        alpha_us: fit.alpha_us,
        beta_gbps: fit.beta_gbps * factor,
    })
}

/// Median of the finite values; `None` when there are none.
pub(crate) fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn algbw_is_bytes_over_time_in_gbps() {
        // 1 GB in 10 ms = 100 GB/s.
        assert!(close(algbw_gbps(1_000_000_000, 10_000.0), 100.0));
        assert!(close(algbw_gbps(8, 1.0), 0.008));
        assert_eq!(algbw_gbps(1024, 0.0), 0.0);
        assert_eq!(algbw_gbps(1024, -3.0), 0.0);
        assert_eq!(algbw_gbps(1024, f64::NAN), 0.0);
    }

    #[test]
    fn busbw_uses_nccl_tests_factors() {
        let (bytes, t) = (800_000_000, 8_000.0); // algbw 100 GB/s
        assert!(close(busbw_gbps(Collective::AllReduce, 8, bytes, t), 175.0));
        assert!(close(busbw_gbps(Collective::AllGather, 8, bytes, t), 87.5));
        assert!(close(
            busbw_gbps(Collective::ReduceScatter, 8, bytes, t),
            87.5
        ));
        assert!(close(busbw_gbps(Collective::AllToAll, 4, bytes, t), 75.0));
        assert!(close(busbw_gbps(Collective::Broadcast, 8, bytes, t), 100.0));
        assert!(close(busbw_gbps(Collective::Reduce, 8, bytes, t), 100.0));
        assert!(close(busbw_gbps(Collective::SendRecv, 8, bytes, t), 100.0));
        // One rank moves nothing over the bus.
        assert!(close(busbw_gbps(Collective::AllReduce, 1, bytes, t), 0.0));
    }

    #[test]
    fn fit_recovers_exact_alpha_and_beta() {
        // time = 25 us + bytes / (200 GB/s) ; 200 GB/s = 200_000 bytes/us.
        let pts: Vec<(u64, f64)> = [8u64, 1 << 10, 1 << 20, 1 << 26, 1 << 30]
            .iter()
            .map(|&b| (b, 25.0 + b as f64 / 200_000.0))
            .collect();
        let fit = fit_alpha_beta(&pts).expect("fit of exact data");
        assert!((fit.alpha_us - 25.0).abs() < 1e-6, "{fit:?}");
        assert!((fit.beta_gbps - 200.0).abs() < 1e-6, "{fit:?}");
    }

    #[test]
    fn fit_sweep_reports_bus_bandwidth() {
        // algbw asymptote 200 GB/s, 8 ranks all_reduce: busbw 350 GB/s.
        let pts: Vec<(u64, f64)> = (3..31)
            .map(|p| {
                let b = 1u64 << p;
                (b, 20.0 + b as f64 / 200_000.0)
            })
            .collect();
        let fit = fit_sweep(Collective::AllReduce, 8, &pts).expect("fit");
        assert!((fit.alpha_us - 20.0).abs() < 1e-6, "{fit:?}");
        assert!((fit.beta_gbps - 350.0).abs() < 1e-6, "{fit:?}");
        assert!(fit_sweep(Collective::AllReduce, 1, &pts).is_none());
    }

    #[test]
    fn fit_refuses_degenerate_input() {
        assert!(fit_alpha_beta(&[]).is_none());
        assert!(fit_alpha_beta(&[(1024, 10.0)]).is_none());
        // Same size twice: no slope.
        assert!(fit_alpha_beta(&[(1024, 10.0), (1024, 12.0)]).is_none());
        // Time falls with size: no bandwidth.
        assert!(fit_alpha_beta(&[(1024, 10.0), (2048, 9.0)]).is_none());
        // Flat: slope zero.
        assert!(fit_alpha_beta(&[(1024, 10.0), (2048, 10.0), (4096, 10.0)]).is_none());
        // Non-positive or non-finite times are skipped, leaving one point.
        assert!(fit_alpha_beta(&[(1024, 10.0), (2048, 0.0), (4096, f64::NAN)]).is_none());
    }

    #[test]
    fn fit_clamps_negative_alpha_to_zero() {
        // time = -5 + bytes/1000 per us for these sizes: negative intercept.
        let pts = [(10_000u64, 5.0), (20_000, 15.0), (40_000, 35.0)];
        let fit = fit_alpha_beta(&pts).expect("fit");
        assert_eq!(fit.alpha_us, 0.0);
        assert!((fit.beta_gbps - 1.0).abs() < 1e-9, "{fit:?}");
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN, 5.0, f64::INFINITY]), Some(5.0));
    }
}
