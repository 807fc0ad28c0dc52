//! Unit tests of the evaluation rules, on synthetic nodes shaped like the agent's compact result:
//! the fixtures here, the tests by topic in the files below.

mod baseline;
mod compute;
mod fleet;
mod hardware;
mod outcomes;
mod pairs;
mod sizes;
mod topology;
mod trend;
mod tuning;

use super::*;
use gpufabric_api::SubjectKind;
use gpufabric_api::outcome::NotMeasuredReason;
use gpufabric_api::result::ErrorKind;
use gpufabric_api::result::{
    COMPACT_VERSION, CompactCollective, CompactDdpPoint, CompactGpuHealth, PhaseError,
};
use gpufabric_api::suite::Collective;
use std::collections::BTreeSet;

const H100: &str = "NVIDIA H100 80GB HBM3";

/// Deterministic noise in [-amp, +amp].
struct Noise(u64, f64);

impl Noise {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let unit = (self.0 >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
        (unit * 2.0 - 1.0) * self.1
    }
    fn scale(&mut self, x: f64) -> f64 {
        x * (1.0 + self.next())
    }
}

/// A healthy 8-GPU H100 node as the agent reports it, with +-`noise` relative jitter.
fn healthy(name: &str, seed: u64, noise: f64) -> CompactResult {
    node_of(name, H100, 8, seed, noise)
}

fn node_of(name: &str, product: &str, g: u32, seed: u64, noise: f64) -> CompactResult {
    let mut n = Noise(seed.wrapping_add(17), noise);
    let gu = g as usize;
    let mut pu = vec![0.0; gu * gu];
    for a in 0..gu {
        for b in 0..gu {
            if a != b {
                pu[a * gu + b] = n.scale(390.0);
            }
        }
    }
    let pb = (0..gu * gu.saturating_sub(1) / 2)
        .map(|_| n.scale(760.0))
        .collect();
    let nc = [
        (Collective::AllReduce, 460.0, 22.0),
        (Collective::AllGather, 360.0, 15.0),
        (Collective::ReduceScatter, 360.0, 15.0),
    ]
    .iter()
    .map(|(c, pk, lt)| CompactCollective {
        collective: *c,
        peak_busbw: n.scale(*pk),
        largest_busbw: n.scale(*pk * 0.98),
        smallest_time_us: n.scale(*lt),
        alpha_beta: None,
        wrong: 0,
        largest_bytes: Some(1 << 30),
    })
    .collect();
    let dp = [1u32, 2, 4, 8]
        .iter()
        .filter(|x| **x <= g)
        .map(|x| CompactDdpPoint {
            gpus: *x,
            step_ms: n.scale(12.0),
            scaling_efficiency: if *x == 1 { 1.0 } else { n.scale(0.93) },
            comm_fraction: 0.08,
            overlap_efficiency: 0.9,
            tflops_per_gpu: 400.0,
        })
        .collect();
    let dc = (0..gu).map(|_| n.scale(10.0)).collect();
    let h = (0..gu)
        .map(|_| CompactGpuHealth {
            nvlinks: (18, 18),
            nvlink_errors: 0,
            pcie: (5, 5, 16, 16),
            xids: Vec::new(),
            ecc_uncorrected: 0,
            row_remap: 0,
            temperature_c: 45.0,
            throttle: Vec::new(),
            ..Default::default()
        })
        .collect();
    CompactResult {
        version: COMPACT_VERSION,
        node: name.to_string(),
        backend: gpufabric_api::result::Backend::Sim,
        product: product.to_string(),
        gpus: g,
        duration_s: 120.0,
        collectives: nc,
        copy_uni: pu,
        copy_bidir: pb,
        host_to_device: (0..gu).map(|_| n.scale(55.0)).collect(),
        device_to_host: (0..gu).map(|_| n.scale(52.0)).collect(),
        corrupt_copies: 0,
        pair_bytes: Some(256 << 20),
        ddp_points: dp,
        ddp_compute_ms: dc,
        health: h,
        transport_fallbacks: Vec::new(),
        errors: Vec::new(),
        graph_launches: 0,
        compute: Vec::new(),
        compute_gemm_size: None,
        settings_not_chosen: Vec::new(),
        software: Default::default(),
    }
}

fn slow_pair(r: &mut CompactResult, a: u32, b: u32, factor: f64) {
    let g = r.gpus as usize;
    let (a, b) = (a as usize, b as usize);
    r.copy_uni[a * g + b] *= factor;
    r.copy_uni[b * g + a] *= factor;
    let i = upper(r.gpus, a as u32, b as u32);
    r.copy_bidir[i] *= factor;
}

fn upper(g: u32, a: u32, b: u32) -> usize {
    gpufabric_api::result::upper_index(g, a.min(b), a.max(b))
}

fn all_reduce(r: &mut CompactResult) -> &mut CompactCollective {
    r.collectives
        .iter_mut()
        .find(|c| c.collective == Collective::AllReduce)
        .expect("every synthetic node has all_reduce")
}

fn fleet_of(n: usize, noise: f64) -> Vec<CompactResult> {
    (0..n)
        .map(|i| healthy(&format!("node-{i:02}"), i as u64, noise))
        .collect()
}

fn inputs(results: Vec<CompactResult>) -> Vec<NodeInput> {
    results.into_iter().map(NodeInput::measured).collect()
}

fn run(results: Vec<CompactResult>) -> Evaluation {
    evaluate(&inputs(results), &Thresholds::default())
}

fn on<'a>(e: &'a Evaluation, node: &'a str) -> Vec<&'a Finding> {
    e.findings_of(node).collect()
}

fn check_evidence(f: &Finding) {
    assert!(!f.message.is_empty());
    if let (Some(m), Some(x)) = (f.measured, f.expected)
        && x != 0.0
    {
        let d = f
            .deviation
            .expect("deviation when measured and expected are known");
        assert!((d - (m - x) / x).abs() < 1e-9, "{f:?}");
    }
}
