//! Backend-neutral maths both backends share: nccl-tests' element counts and row shapes,
//! which collectives run in place, PyTorch DDP's gradient buckets and a DDP point's figures.

#![forbid(unsafe_code)]

use gpufabric_api::result::DdpPoint;
use gpufabric_api::suite::Collective;

/// nccl-tests' element counts of one collective of `bytes` over `n` ranks of `elem`-byte
/// elements: `(send count, receive count, bytes of the size column)`, at least one element
/// per rank.
pub(crate) fn counts(c: Collective, bytes: u64, elem: u64, n: u64) -> (u64, u64, u64) {
    let total = (bytes / elem.max(1)).max(1);
    let n = n.max(1);
    let per = (total / n).max(1);
    match c {
        Collective::AllReduce
        | Collective::Broadcast
        | Collective::Reduce
        | Collective::SendRecv => (total, total, total * elem),
        Collective::AllGather => (per, per * n, per * n * elem),
        Collective::ReduceScatter => (per * n, per, per * n * elem),
        Collective::AllToAll => (per * n, per * n, per * n * elem),
    }
}

/// The count column nccl-tests prints for a row: per rank, per peer for alltoall.
pub(crate) fn row_count(c: Collective, send: u64, recv: u64, n: u64) -> u64 {
    match c {
        Collective::ReduceScatter => recv,
        Collective::AllToAll => send / n.max(1),
        _ => send,
    }
}

/// A row of a sweep as nccl-tests shapes it: `(bytes, count)` for a requested size.
pub(crate) fn row_shape(c: Collective, requested: u64, elem: u64, n: u64) -> (u64, u64) {
    let (send, recv, bytes) = counts(c, requested, elem, n);
    (bytes, row_count(c, send, recv, n))
}

/// Whether a collective has an in-place run (not alltoall and sendrecv, as in nccl-tests).
pub(crate) fn has_in_place(c: Collective) -> bool {
    !matches!(c, Collective::AllToAll | Collective::SendRecv)
}

/// A gradient bucket: a byte range of the flat fp32 gradient buffer and the lowest layer
/// index whose gradients it holds (it is ready once that layer's backward is done).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bucket {
    pub offset: u64,
    pub bytes: u64,
    pub ready_after_layer: usize,
}

/// PyTorch DDP's bucket assignment for `layers` Linear(hidden, hidden) layers: parameters
/// in reverse registration order (bias then weight of the last layer first), each bucket
/// closed once it reaches its cap (the first cap for the first bucket). The gradient
/// buffer is laid out in that same order, so each bucket is contiguous.
pub(crate) fn buckets(hidden: u64, layers: usize, first_cap: u64, cap: u64) -> Vec<Bucket> {
    let mut out = Vec::new();
    let (mut start, mut size, mut lowest) = (0u64, 0u64, usize::MAX);
    let mut offset = 0u64;
    for l in (0..layers).rev() {
        for p in [hidden * 4, hidden * hidden * 4] {
            size += p;
            offset += p;
            lowest = lowest.min(l);
            let limit = if out.is_empty() { first_cap } else { cap };
            if size >= limit {
                out.push(Bucket {
                    offset: start,
                    bytes: size,
                    ready_after_layer: lowest,
                });
                start = offset;
                size = 0;
                lowest = usize::MAX;
            }
        }
    }
    if size > 0 {
        out.push(Bucket {
            offset: start,
            bytes: size,
            ready_after_layer: lowest,
        });
    }
    out
}

/// GEMMs of one step: forward one per layer, backward wgrad for every layer and dgrad for
/// all but the first.
pub(crate) fn gemms_per_step(layers: u64) -> u64 {
    (3 * layers).saturating_sub(1)
}

/// FLOPs of one step on one GPU of `batch` samples through `layers` square layers.
pub(crate) fn step_flops(hidden: u64, layers: u64, batch: u64) -> f64 {
    let gemm = 2.0 * batch as f64 * (hidden * hidden) as f64;
    gemm * gemms_per_step(layers) as f64
}

/// What one GPU count of the DDP probe measured (times in ms; slowest GPU unless per GPU).
/// The multi-node probe's ranks send theirs to each other as JSON.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PointTimes {
    /// Mean overlapped step (forward, backward, all-reduces, copy-back).
    pub step_ms: f64,
    /// Mean forward + backward per GPU, in the overlapped steps.
    pub compute_ms: Vec<f64>,
    /// Mean step without all-reduces.
    pub compute_alone_ms: f64,
    /// Mean time of all buckets' all-reduces without compute.
    pub comm_alone_ms: f64,
}

impl PointTimes {
    /// The times of GPUs (or nodes) that stepped together, in order: the slowest step,
    /// compute alone and communication alone, and every part's compute per GPU.
    pub(crate) fn together(parts: impl IntoIterator<Item = PointTimes>) -> PointTimes {
        let empty = PointTimes {
            step_ms: 0.0,
            compute_ms: Vec::new(),
            compute_alone_ms: 0.0,
            comm_alone_ms: 0.0,
        };
        parts.into_iter().fold(empty, |mut t, p| {
            t.step_ms = t.step_ms.max(p.step_ms);
            t.compute_ms.extend(p.compute_ms);
            t.compute_alone_ms = t.compute_alone_ms.max(p.compute_alone_ms);
            t.comm_alone_ms = t.comm_alone_ms.max(p.comm_alone_ms);
            t
        })
    }
}

/// The figures of one DDP point: throughput from `batch` samples per GPU and `flops` per
/// step, efficiency against `base` (the first point measured, or this one), exposed
/// communication as the step beyond compute alone, and overlap as the share of the
/// all-reduce time that exposed communication does not account for.
pub(crate) fn ddp_point(
    t: &PointTimes,
    batch: u64,
    flops: f64,
    base: Option<&DdpPoint>,
    gpu_indices: Vec<u32>,
) -> DdpPoint {
    let count = gpu_indices.len().max(1);
    let step_ms = t.step_ms;
    let exposed = (step_ms - t.compute_alone_ms).max(0.0);
    let samples_per_s = if step_ms > 0.0 {
        (count as u64 * batch) as f64 / (step_ms / 1e3)
    } else {
        0.0
    };
    let base = base
        .map(|p| p.samples_per_s / f64::from(p.gpus.max(1)))
        .unwrap_or(samples_per_s / count as f64);
    DdpPoint {
        gpus: count as u32,
        step_ms,
        samples_per_s,
        scaling_efficiency: if base > 0.0 {
            samples_per_s / count as f64 / base
        } else {
            0.0
        },
        comm_fraction: if step_ms > 0.0 {
            exposed / step_ms
        } else {
            0.0
        },
        overlap_efficiency: if t.comm_alone_ms > 0.0 && count > 1 {
            (1.0 - exposed / t.comm_alone_ms).clamp(0.0, 1.0)
        } else {
            1.0
        },
        tflops_per_gpu: if step_ms > 0.0 {
            flops / (step_ms / 1e3) / 1e12
        } else {
            0.0
        },
        compute_ms: t.compute_ms.clone(),
        gpu_indices,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_shape_follows_nccl_tests_sizes() {
        assert_eq!(
            row_shape(Collective::AllReduce, 1 << 20, 4, 8),
            (1 << 20, 1 << 18)
        );
        assert_eq!(
            row_shape(Collective::AllGather, 1 << 20, 4, 8),
            (1 << 20, 1 << 15)
        );
        assert_eq!(
            row_shape(Collective::ReduceScatter, 1 << 20, 4, 8),
            (1 << 20, 1 << 15)
        );
        assert_eq!(row_shape(Collective::AllToAll, 8, 4, 8), (32, 1));
        assert_eq!(row_shape(Collective::SendRecv, 6, 4, 8), (4, 1));
    }

    #[test]
    fn counts_are_per_rank_for_gather_and_scatter() {
        assert_eq!(
            counts(Collective::AllGather, 1 << 20, 4, 4),
            (1 << 16, 1 << 18, 1 << 20)
        );
        assert_eq!(
            counts(Collective::ReduceScatter, 1 << 20, 4, 4),
            (1 << 18, 1 << 16, 1 << 20)
        );
        assert_eq!(counts(Collective::AllReduce, 8, 4, 4), (2, 2, 8));
        assert_eq!(counts(Collective::AllGather, 8, 4, 4), (1, 4, 16));
    }

    #[test]
    fn buckets_follow_pytorch_ddp_for_the_default_mlp() {
        // 8 x Linear(8192, 8192): each weight (256 MiB fp32) overflows any cap, so each
        // layer's bias and weight form one bucket, last layer first.
        let bks = buckets(8192, 8, 1 << 20, 25 << 20);
        assert_eq!(bks.len(), 8);
        let layer = 8192 * 4 + 8192 * 8192 * 4;
        for (k, b) in bks.iter().enumerate() {
            assert_eq!(b.bytes, layer);
            assert_eq!(b.offset, k as u64 * layer);
            assert_eq!(b.ready_after_layer, 7 - k);
        }
    }

    #[test]
    fn small_layers_share_buckets_and_the_first_bucket_is_smaller() {
        // 64 x 64 layers: 16 KiB weight + 256 B bias each. First cap 20 KiB, then 40 KiB.
        let bks = buckets(64, 10, 20 << 10, 40 << 10);
        let total: u64 = bks.iter().map(|b| b.bytes).sum();
        assert_eq!(total, 10 * (64 * 4 + 64 * 64 * 4));
        assert!(
            bks[0].bytes >= 20 << 10 && bks[0].bytes < 40 << 10,
            "{bks:?}"
        );
        assert!(bks[1].bytes >= 40 << 10, "{bks:?}");
        // Contiguous, in order, each ready after the lowest layer it holds.
        let mut off = 0;
        for b in &bks {
            assert_eq!(b.offset, off);
            off += b.bytes;
        }
        assert_eq!(bks.last().map(|b| b.ready_after_layer), Some(0));
        assert_eq!(bks[0].ready_after_layer, 8);
    }

    #[test]
    fn step_flops_count_three_gemms_per_layer_less_one() {
        assert_eq!(
            step_flops(8192, 8, 4096),
            2.0 * 4096.0 * 8192.0 * 8192.0 * 23.0
        );
    }

    #[test]
    fn a_point_scales_against_the_first_and_splits_exposed_communication() {
        let one = ddp_point(
            &PointTimes {
                step_ms: 20.0,
                compute_ms: vec![20.0],
                compute_alone_ms: 20.0,
                comm_alone_ms: 0.0,
            },
            100,
            1e12,
            None,
            vec![0],
        );
        assert_eq!(one.scaling_efficiency, 1.0);
        assert_eq!((one.comm_fraction, one.overlap_efficiency), (0.0, 1.0));
        assert_eq!(one.samples_per_s, 5000.0);
        assert_eq!(one.tflops_per_gpu, 50.0);
        let four = ddp_point(
            &PointTimes {
                step_ms: 25.0,
                compute_ms: vec![21.0; 4],
                compute_alone_ms: 20.0,
                comm_alone_ms: 10.0,
            },
            100,
            1e12,
            Some(&one),
            vec![0, 1, 2, 3],
        );
        assert_eq!(four.gpus, 4);
        assert!((four.scaling_efficiency - 0.8).abs() < 1e-12);
        assert!((four.comm_fraction - 0.2).abs() < 1e-12);
        assert!((four.overlap_efficiency - 0.5).abs() < 1e-12);
    }
}
