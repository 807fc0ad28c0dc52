//! The suite's checks: collectives, sizes, steps and iterations, and the compute tests' sizes.

use super::Checker;
use super::estimate::{FASTEST, estimate, seconds};
use super::labels;
use crate::test::FabricTestSpec;
use std::collections::BTreeSet;

/// Most graph launches per size (`suite.ncclSweep.graphLaunches`), as the CRD's schema says.
pub const MAX_GRAPH_LAUNCHES: u32 = 1000;

pub(super) fn check_suite(c: &mut Checker, spec: &FabricTestSpec) {
    let nccl = &spec.suite.nccl_sweep;
    c.check(
        !nccl.collectives.is_empty(),
        "suite.ncclSweep.collectives",
        || "must name at least one collective".into(),
    );
    let unique: BTreeSet<_> = nccl.collectives.iter().collect();
    c.check(
        unique.len() == nccl.collectives.len(),
        "suite.ncclSweep.collectives",
        || "names a collective twice".into(),
    );
    c.check(nccl.min_bytes >= 1, "suite.ncclSweep.minBytes", || {
        "must be at least 1".into()
    });
    c.check(
        nccl.min_bytes <= nccl.max_bytes,
        "suite.ncclSweep.minBytes",
        || {
            format!(
                "ncclSweep.minBytes must not be larger than ncclSweep.maxBytes ({} > {})",
                nccl.min_bytes, nccl.max_bytes
            )
        },
    );
    c.check(nccl.step_factor >= 2, "suite.ncclSweep.stepFactor", || {
        format!("must be at least 2 (got {})", nccl.step_factor)
    });
    c.check(nccl.iters >= 1, "suite.ncclSweep.iters", || {
        "must be at least 1".into()
    });
    c.check(
        nccl.graph_launches <= MAX_GRAPH_LAUNCHES,
        "suite.ncclSweep.graphLaunches",
        || {
            format!(
                "must be at most {MAX_GRAPH_LAUNCHES} (got {}): each size runs iters times this many iterations",
                nccl.graph_launches
            )
        },
    );

    let pairs = &spec.suite.gpu_pairs;
    c.check(pairs.bytes >= 1, "suite.gpuPairs.bytes", || {
        "must be at least 1".into()
    });
    c.check(
        spec.suite.node_pairs.bytes >= 1,
        "suite.nodePairs.bytes",
        || "must be at least 1".into(),
    );
    let partners = spec.suite.node_pairs.partners;
    c.check(
        (1..=2).contains(&partners),
        "suite.nodePairs.partners",
        || format!("must be 1 or 2 (got {partners})"),
    );
    c.check(
        partners == 2 || spec.suite.node_pairs.pairing != crate::suite::Pairing::All,
        "suite.nodePairs.partners",
        || "1 is for pairing ring or random: pairing all meets every partner".into(),
    );
    if let Some(key) = &spec.suite.node_pairs.topology_key
        && let Some(problem) = labels::label_key_problem(key)
    {
        c.check(false, "suite.nodePairs.topologyKey", || {
            format!("{key:?} is not a label key: {problem}")
        });
    }

    let max_nodes = spec.suite.ddp_nodes.max_nodes;
    c.check(
        (2..=16).contains(&max_nodes),
        "suite.ddpNodes.maxNodes",
        || format!("must be 2 to 16 (got {max_nodes})"),
    );

    check_nccl_nodes(c, &spec.suite.nccl_nodes);

    let ddp = &spec.suite.ddp_probe;
    c.check(ddp.hidden >= 1, "suite.ddpProbe.hidden", || {
        "must be at least 1".into()
    });
    c.check(ddp.layers >= 1, "suite.ddpProbe.layers", || {
        "must be at least 1".into()
    });
    c.check(ddp.batch_per_gpu >= 1, "suite.ddpProbe.batchPerGpu", || {
        "must be at least 1".into()
    });
    c.check(ddp.steps >= 1, "suite.ddpProbe.steps", || {
        "must be at least 1".into()
    });
    if let Some(counts) = &ddp.gpu_counts {
        c.check(!counts.is_empty(), "suite.ddpProbe.gpuCounts", || {
            "must list at least one GPU count; remove it for 1, 2, 4, ... all GPUs".into()
        });
        c.check(
            counts.iter().all(|&n| n >= 1),
            "suite.ddpProbe.gpuCounts",
            || "every GPU count must be at least 1".into(),
        );
    }
    c.check(
        ddp.first_bucket_bytes >= 1,
        "suite.ddpProbe.firstBucketBytes",
        || "must be at least 1".into(),
    );
    c.check(
        ddp.first_bucket_bytes <= ddp.bucket_bytes,
        "suite.ddpProbe.firstBucketBytes",
        || "ddpProbe.firstBucketBytes must not be larger than ddpProbe.bucketBytes".into(),
    );

    check_compute(c, &spec.suite.compute);

    let timeout = spec.agent.timeout_seconds;
    let least = estimate(&spec.suite, &FASTEST);
    c.check(least.total_s() <= f64::from(timeout), "suite", || {
        format!(
            "cannot finish within agent.timeoutSeconds ({timeout} s): even {} needs at least {} ({}); lower the sizes, iterations or steps, or raise agent.timeoutSeconds",
            FASTEST.name,
            seconds(least.total_s()),
            least.breakdown()
        )
    });
}

/// The compute checks' sizes: square sizes in whole tiles of 256, memory copies larger than
/// any GPU's caches, and at least one timed iteration each.
fn check_compute(c: &mut Checker, compute: &crate::suite::Compute) {
    let square = |c: &mut Checker, n: u32, max: u32, field: &str| {
        c.check(
            (256..=max).contains(&n) && n.is_multiple_of(256),
            field,
            || format!("must be a multiple of 256 from 256 to {max} (got {n})"),
        );
    };
    let g = &compute.gemm;
    if g.enabled {
        square(c, g.size, 32768, "suite.compute.gemm.size");
        c.check(g.iters >= 1, "suite.compute.gemm.iters", || {
            "must be at least 1".into()
        });
    }
    let m = &compute.memory;
    if m.enabled {
        c.check(m.bytes >= 64 << 20, "suite.compute.memory.bytes", || {
            format!(
                "must be at least 64 MiB (67108864), larger than any GPU's caches (got {})",
                m.bytes
            )
        });
        c.check(m.iters >= 1, "suite.compute.memory.iters", || {
            "must be at least 1".into()
        });
    }
    let d = &compute.sdc;
    if d.enabled {
        square(c, d.size, 16384, "suite.compute.sdc.size");
        c.check(d.repeats >= 1, "suite.compute.sdc.repeats", || {
            "must be at least 1".into()
        });
    }
}

/// `suite.ncclNodes`: a node count the termination message can carry, the collectives the
/// multi-node sweep runs, and a range of sizes.
fn check_nccl_nodes(c: &mut Checker, n: &crate::suite::NcclNodes) {
    use crate::suite::NcclNodes;
    c.check(
        (2..=MAX_NCCL_NODES).contains(&n.max_nodes),
        "suite.ncclNodes.maxNodes",
        || {
            format!(
                "must be 2 to {MAX_NCCL_NODES} (got {}): each rank's document carries every node count's summaries",
                n.max_nodes
            )
        },
    );
    c.check(
        !n.collectives.is_empty(),
        "suite.ncclNodes.collectives",
        || "must name at least one collective".into(),
    );
    if let Some(other) = n
        .collectives
        .iter()
        .find(|c| !NcclNodes::COLLECTIVES.contains(c))
    {
        c.check(false, "suite.ncclNodes.collectives", || {
            format!(
                "{} is not run over nodes; use allReduce, allGather, reduceScatter or allToAll",
                other.api_name()
            )
        });
    }
    c.check(
        n.min_bytes >= 1 && n.min_bytes <= n.max_bytes,
        "suite.ncclNodes.minBytes",
        || {
            format!(
                "must be between 1 and maxBytes ({}), got {}",
                n.max_bytes, n.min_bytes
            )
        },
    );
    c.check(n.step_factor >= 2, "suite.ncclNodes.stepFactor", || {
        format!("must be at least 2 (got {})", n.step_factor)
    });
    c.check(n.large_bytes >= 1, "suite.ncclNodes.largeBytes", || {
        "must be at least 1".into()
    });
    c.check(n.iters >= 1, "suite.ncclNodes.iters", || {
        "must be at least 1".into()
    });
    if let Some(key) = &n.topology_key
        && let Some(problem) = labels::label_key_problem(key)
    {
        c.check(false, "suite.ncclNodes.topologyKey", || {
            format!("{key:?} is not a label key: {problem}")
        });
    }
}

/// Most nodes of the multi-node NCCL sweep: its document, with every node count's summaries,
/// still fits a termination message at this many.
pub const MAX_NCCL_NODES: u32 = 1024;
