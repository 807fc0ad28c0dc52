//! The compute checks of a simulated node: each GPU's GEMM and memory rates from the
//! product's model, a straggler's and a slow memory's factors; the silent-data-corruption
//! check runs for real on a small product computed on the host, with a bit flipped in the
//! output of a GPU that has an `sdc` fault.

#![forbid(unsafe_code)]

use super::node_model::NodeModel;
use crate::compute::{OutputCheck, SdcReference, check_output, exact_output, flip_bit};
use crate::{CheckOptions, Progress};
use gpufabric_api::result::{ComputeResult, GpuCompute, LoadReading};

/// Largest SDC product the model computes on the host (the suite's size stands for itself
/// in the document).
const SIM_SDC_SIZE: usize = 64;

pub(super) fn compute_phase(
    m: &NodeModel,
    opts: &CheckOptions,
    progress: Progress,
) -> ComputeResult {
    let c = opts.compute();
    let mut rng = m.rng("compute");
    let p = &m.product;
    let sdc = c.sdc.enabled.then(|| {
        let n = (c.sdc.size as usize).min(SIM_SDC_SIZE);
        let reference = SdcReference::new(n);
        let exact = exact_output(n);
        let checks: Vec<(u32, Vec<OutputCheck>)> = (0..m.gpus())
            .map(|gpu| {
                let mut out = exact.clone();
                if m.corrupts(gpu) {
                    flip_bit(&mut out, n, n / 3, n / 2, 12);
                }
                let check = check_output(&reference, &out);
                (gpu, vec![check; c.sdc.repeats.max(1) as usize])
            })
            .collect();
        crate::compute::sdc_statuses(&checks)
    });
    let gpus = (0..m.gpus())
        .map(|gpu| {
            let slow = m.straggler(gpu);
            let compute = m.compute_bias / slow;
            let memory = m.bw_bias * m.memory_factor(gpu);
            let round = |x: f64| (x * 10.0).round() / 10.0;
            let mut throttle = vec!["swPowerCap".to_string()];
            if slow > 1.0 {
                throttle.push("hwSlowdown".into());
            }
            GpuCompute {
                gpu,
                gemm_bf16_tflops: c
                    .gemm
                    .enabled
                    .then(|| round(p.gemm_bf16_tflops * compute * rng.jitter(0.004))),
                gemm_tf32_tflops: (c.gemm.enabled && c.gemm.tf32)
                    .then(|| round(p.gemm_tf32_tflops * compute * rng.jitter(0.004))),
                memory_copy_gbps: c
                    .memory
                    .enabled
                    .then(|| round(p.hbm_copy_gbps * memory * rng.jitter(0.003))),
                memory_write_gbps: c
                    .memory
                    .enabled
                    .then(|| round(p.hbm_copy_gbps * 1.1 * memory * rng.jitter(0.003))),
                sdc: sdc
                    .as_ref()
                    .and_then(|s| s.iter().find(|(g, _)| *g == gpu).map(|(_, st)| st.clone())),
                under_load: c.gemm.enabled.then(|| LoadReading {
                    sm_clock_mhz: (f64::from(p.sm_clock_mhz) / slow).round() as u32,
                    max_sm_clock_mhz: p.max_sm_clock_mhz,
                    temperature_c: (58.0 + 3.0 * rng.normal()).round(),
                    power_w: (p.power_limit_w * rng.jitter(0.01))
                        .min(p.power_limit_w)
                        .round(),
                    power_limit_w: p.power_limit_w,
                    throttle,
                }),
            }
        })
        .collect::<Vec<_>>();
    progress(&format!("compute: {} GPUs", gpus.len()));
    ComputeResult {
        gemm_size: c.gemm.enabled.then_some(c.gemm.size),
        memory_bytes: c.memory.enabled.then_some(c.memory.bytes),
        sdc_size: c.sdc.enabled.then_some(c.sdc.size),
        gpus,
    }
}
