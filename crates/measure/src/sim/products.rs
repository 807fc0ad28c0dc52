//! What a healthy GPU of each known product measures in the sim backend's model.

#![forbid(unsafe_code)]

use gpufabric_api::product::{ProductFamily, family};

/// What a healthy GPU of one product measures in the model. Figures are per GPU on an
/// 8-GPU NVSwitch board.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ProductModel {
    /// Short name (`H100`, `H200`, ...).
    pub name: &'static str,
    pub memory_bytes: u64,
    /// NVLink links per GPU (0: PCIe only).
    pub nvlinks: u32,
    /// Copy-engine peer copy, one direction, GB/s.
    pub copy_uni_gbps: f64,
    /// Copy-engine peer copy, both directions at once (sum), GB/s.
    pub copy_bidir_gbps: f64,
    /// NCCL all_reduce bus bandwidth at large sizes, all GPUs of the board, GB/s.
    pub all_reduce_busbw_gbps: f64,
    /// NCCL all_reduce latency at the smallest sizes, 8 ranks, microseconds.
    pub alpha_us: f64,
    /// Pinned host<->device copy, GB/s.
    pub host_gbps: f64,
    pub pcie_gen: u32,
    pub pcie_width: u32,
    /// Achieved dense bf16 GEMM throughput, TFLOP/s.
    pub tflops: f64,
    /// Power draw of an idle GPU, W.
    pub idle_power_w: f64,
    /// The compute check: square bf16 GEMMs of 8192 and TF32 GEMMs, TFLOP/s at the loaded
    /// plateau; device-to-device copies within the GPU (read and write counted), GB/s.
    pub gemm_bf16_tflops: f64,
    pub gemm_tf32_tflops: f64,
    pub hbm_copy_gbps: f64,
    /// SM clock under load and its maximum (MHz), and the power limit (W).
    pub sm_clock_mhz: u32,
    pub max_sm_clock_mhz: u32,
    pub power_limit_w: f64,
}

/// NVIDIA H100 SXM5 80GB. Copy bandwidth: nvbandwidth on HGX H100 measures about
/// 370-390 GB/s one way and 740-780 GB/s both ways per pair (18 NVLink 4 links, 450 GB/s
/// nominal per direction). all_reduce busbw: nccl-tests on 8 GPUs without NVLS about
/// 360 GB/s. Host: PCIe Gen5 x16, about 55 GB/s pinned. Latency: the same NVLink 4 and
/// NVSwitch as H200, so H200's measured value (see [`H200`]). TFLOP/s: model value, a
/// little under H200's measured 616 (same GH100 compute, slower HBM3).
pub(crate) const H100: ProductModel = ProductModel {
    name: "H100",
    memory_bytes: 81_559 << 20,
    nvlinks: 18,
    copy_uni_gbps: 370.0,
    copy_bidir_gbps: 740.0,
    all_reduce_busbw_gbps: 360.0,
    alpha_us: 12.5,
    host_gbps: 55.0,
    pcie_gen: 5,
    pcie_width: 16,
    tflops: 600.0,
    idle_power_w: 115.0,
    gemm_bf16_tflops: 700.0,
    gemm_tf32_tflops: 380.0,
    hbm_copy_gbps: 2_700.0,
    sm_clock_mhz: 1_755,
    max_sm_clock_mhz: 1_980,
    power_limit_w: 700.0,
};

/// NVIDIA H200 SXM 141GB: the same NVLink 4 as H100 with faster HBM3e. Calibrated on this
/// project's own cuda-backend run on a 4 x H200 host, NVLS off
/// (`crates/health/tests/data/h200x4-full.compact`): one-way copy 394.8 GB/s, both ways
/// 779 GB/s, host copies 55.5 GB/s, all_reduce busbw 354 GB/s at 4 GPUs (nccl-tests on 8
/// GPUs without NVLS: 355-370), all_reduce latency 10.2 µs at 4 GPUs (12.5 µs at 8 by
/// this model's log2 scaling), DDP probe 616 TFLOP/s on one GPU.
pub(crate) const H200: ProductModel = ProductModel {
    name: "H200",
    memory_bytes: 143_771 << 20,
    nvlinks: 18,
    copy_uni_gbps: 396.0,
    copy_bidir_gbps: 783.0,
    all_reduce_busbw_gbps: 362.0,
    alpha_us: 12.5,
    host_gbps: 55.0,
    pcie_gen: 5,
    pcie_width: 16,
    tflops: 620.0,
    idle_power_w: 120.0,
    gemm_bf16_tflops: 720.0,
    gemm_tf32_tflops: 390.0,
    hbm_copy_gbps: 4_000.0,
    sm_clock_mhz: 1_755,
    max_sm_clock_mhz: 1_980,
    power_limit_w: 700.0,
};

/// NVIDIA A100 SXM4 80GB: 12 NVLink 3 links (300 GB/s nominal per direction); model
/// values of about 180 GB/s one-way copy and 230 GB/s all_reduce busbw. Host PCIe Gen4
/// x16, about 25 GB/s. TFLOP/s: 312 dense bf16 peak, about 80% achieved. Latency: model
/// value, a little above H100's.
pub(crate) const A100: ProductModel = ProductModel {
    name: "A100",
    memory_bytes: 81_920 << 20,
    nvlinks: 12,
    copy_uni_gbps: 180.0,
    copy_bidir_gbps: 360.0,
    all_reduce_busbw_gbps: 230.0,
    alpha_us: 15.0,
    host_gbps: 25.0,
    pcie_gen: 4,
    pcie_width: 16,
    tflops: 250.0,
    idle_power_w: 60.0,
    gemm_bf16_tflops: 280.0,
    gemm_tf32_tflops: 140.0,
    hbm_copy_gbps: 1_700.0,
    sm_clock_mhz: 1_410,
    max_sm_clock_mhz: 1_410,
    power_limit_w: 400.0,
};

/// NVIDIA B200: NVLink 5 at twice H100's bandwidth (900 GB/s nominal per direction);
/// model values of about double H100's bandwidths and compute, latency a little lower.
/// Host PCIe Gen5 x16.
pub(crate) const B200: ProductModel = ProductModel {
    name: "B200",
    memory_bytes: 183_359 << 20,
    nvlinks: 18,
    copy_uni_gbps: 740.0,
    copy_bidir_gbps: 1480.0,
    all_reduce_busbw_gbps: 720.0,
    alpha_us: 11.0,
    host_gbps: 55.0,
    pcie_gen: 5,
    pcie_width: 16,
    tflops: 1300.0,
    idle_power_w: 140.0,
    gemm_bf16_tflops: 1_400.0,
    gemm_tf32_tflops: 700.0,
    hbm_copy_gbps: 6_400.0,
    sm_clock_mhz: 1_965,
    max_sm_clock_mhz: 1_965,
    power_limit_w: 1_000.0,
};

/// A product the model does not know: a PCIe-only GPU (model values of a PCIe Gen4 card;
/// NCCL and copies go over PCIe).
pub(crate) const GENERIC_PCIE: ProductModel = ProductModel {
    name: "generic PCIe GPU",
    memory_bytes: 49_140 << 20,
    nvlinks: 0,
    copy_uni_gbps: 24.0,
    copy_bidir_gbps: 40.0,
    all_reduce_busbw_gbps: 20.0,
    alpha_us: 30.0,
    host_gbps: 25.0,
    pcie_gen: 4,
    pcie_width: 16,
    tflops: 180.0,
    idle_power_w: 35.0,
    gemm_bf16_tflops: 180.0,
    gemm_tf32_tflops: 90.0,
    hbm_copy_gbps: 700.0,
    sm_clock_mhz: 1_700,
    max_sm_clock_mhz: 2_100,
    power_limit_w: 300.0,
};

/// The model of a product, by its label (`NVIDIA-H100-80GB-HBM3`) or NVML name, by its
/// [`family`]: PCIe and NVL variants get their family's model too; unknown products get
/// [`GENERIC_PCIE`].
pub(crate) fn product_model(product: &str) -> ProductModel {
    match family(product) {
        Some(ProductFamily::H200) => H200,
        Some(ProductFamily::H100) => H100,
        Some(ProductFamily::A100) => A100,
        Some(ProductFamily::B200) => B200,
        Some(ProductFamily::B300 | ProductFamily::H20) | None => GENERIC_PCIE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::health::expected_links;
    use crate::pairs::sim::port_rate_gbps;

    /// `product_model` as it matched products before it took their family.
    fn model_before(product: &str) -> ProductModel {
        let p = product.to_ascii_uppercase();
        if p.contains("H200") {
            H200
        } else if p.contains("H100") {
            H100
        } else if p.contains("A100") {
            A100
        } else if p.contains("B200") {
            B200
        } else {
            GENERIC_PCIE
        }
    }

    /// `port_rate_gbps` before.
    fn port_rate_before(product: &str) -> f64 {
        let p = product.to_ascii_uppercase();
        if p.contains("H100") || p.contains("H200") || p.contains("B200") {
            400.0
        } else if p.contains("A100") {
            200.0
        } else {
            100.0
        }
    }

    /// `expected_links` before.
    fn links_before(product: &str) -> Option<u32> {
        let p = product.to_ascii_uppercase();
        if p.contains("H100") && !p.contains("PCIE") && !p.contains("NVL") {
            return Some(18);
        }
        if p.contains("H200") && !p.contains("NVL") {
            return Some(18);
        }
        if p.contains("H20") && !p.contains("H200") {
            return Some(18);
        }
        if p.contains("A100") && p.contains("SXM") {
            return Some(12);
        }
        if p.contains("B200") || p.contains("B300") || p.contains("GB200") {
            return Some(18);
        }
        None
    }

    #[test]
    fn every_site_gives_the_answer_it_gave_before_it_took_the_family() {
        for s in [
            "NVIDIA-H100-80GB-HBM3",
            "NVIDIA H100 80GB HBM3",
            "nvidia-h100-80gb-hbm3",
            "NVIDIA-H100-80GB-HBM3-SHARED",
            "NVIDIA H100 SXM5 80GB",
            "NVIDIA H100 PCIe",
            "NVIDIA-H100-PCIe",
            "nvidia-h100-pcie-shared",
            "NVIDIA H100 NVL",
            "NVIDIA-H200",
            "NVIDIA H200",
            "nvidia-h200",
            "NVIDIA-H200-SHARED",
            "NVIDIA H200 141GB HBM3e",
            "NVIDIA H200 NVL",
            "NVIDIA-A100-SXM4-80GB",
            "NVIDIA A100-SXM4-80GB",
            "nvidia-a100-sxm4-40gb-shared",
            "NVIDIA A100 80GB PCIe",
            "NVIDIA A100-PCIE-40GB",
            "NVIDIA-B200",
            "nvidia-b200",
            "NVIDIA B200",
            "NVIDIA-GB200",
            "NVIDIA GB200",
            "NVIDIA B300",
            "NVIDIA GB300",
            "NVIDIA H20",
            "NVIDIA-H20-SHARED",
            "NVIDIA H800",
            "NVIDIA L40S",
            "NVIDIA GeForce RTX 4090",
            "Tesla T4",
            "Mystery GPU",
            "",
        ] {
            assert_eq!(product_model(s), model_before(s), "{s:?}");
            assert_eq!(port_rate_gbps(s), port_rate_before(s), "{s:?}");
            assert_eq!(expected_links(s), links_before(s), "{s:?}");
        }
    }
}
