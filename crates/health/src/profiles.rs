//! Built-in GPU profiles: what a healthy GPU of a known product, on a board of a known GPU
//! count, should measure. Used when the spec sets no explicit threshold for a metric.
//!
//! Every nominal number carries its public source. Floors are a conservative fraction,
//! [`FLOOR_FRACTION`] (50%), of the nominal peak: real copy-engine and NCCL numbers reach
//! 80-90% of nominal on a healthy 8-GPU NVSwitch board (nvbandwidth and nccl-tests on
//! HGX H100 measure about 370-390 GB/s one-way per pair and 450-480 GB/s all_reduce busbw),
//! so a node below half of nominal is broken, not unlucky. Finer degradations are left to
//! the fleet comparison, which knows what this cluster really measures.
//!
//! Bandwidth floors are given only for the board layouts whose topology is known (8 GPUs
//! on NVSwitch, where every pair gets a GPU's full NVLink bandwidth); on other GPU counts
//! the per-GPU expectations (NVLink link count, PCIe generation and width, host bandwidth)
//! still apply.

/// Fraction of the nominal peak that a bandwidth floor is set at.
pub const FLOOR_FRACTION: f64 = 0.5;

/// Usable bytes per second of one PCIe x16 link, in GB/s per direction, by generation:
/// transfer rate (GT/s) x 16 lanes x encoding efficiency / 8 bits (PCI-SIG base
/// specifications: Gen3 8 GT/s, Gen4 16 GT/s, Gen5 32 GT/s, 128b/130b encoding).
pub fn pcie_x16_gbps(generation: u32) -> Option<f64> {
    let gts = match generation {
        3 => 8.0,
        4 => 16.0,
        5 => 32.0,
        _ => return None,
    };
    Some(gts * 16.0 * (128.0 / 130.0) / 8.0)
}

/// A known GPU product.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Profile {
    /// Canonical name, as [`normalize`] writes it.
    pub product: &'static str,
    /// Other normalized spellings of the same product.
    pub aliases: &'static [&'static str],
    /// GPU counts of the boards this product ships on (HGX/DGX baseboards).
    pub board_gpus: &'static [u32],
    /// GPU count of the NVSwitch board whose bandwidth floors this profile gives.
    pub switched_gpus: u32,
    /// NVLink links per GPU.
    pub nvlinks: u32,
    /// NVLink bandwidth per GPU, one direction, GB/s (half the datasheet's bidirectional total).
    pub nvlink_gbps: f64,
    /// PCIe generation of the GPU's host link.
    pub pcie_gen: u32,
    /// PCIe width of the GPU's host link.
    pub pcie_width: u32,
}

/// The built-in profiles.
pub const PROFILES: &[Profile] = &[
    // NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): "NVLink: 900GB/s,
    // PCIe Gen5: 128GB/s"; NVIDIA Hopper architecture whitepaper: 18 fourth-generation
    // NVLink links per GPU; HGX H100 ships as 4-GPU and 8-GPU (NVSwitch) baseboards.
    Profile {
        product: "H100 80GB HBM3",
        aliases: &["H100 SXM5 80GB", "H100 SXM 80GB"],
        board_gpus: &[4, 8],
        switched_gpus: 8,
        nvlinks: 18,
        nvlink_gbps: 450.0,
        pcie_gen: 5,
        pcie_width: 16,
    },
    // NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column): 141GB HBM3e, "NVLink:
    // 900GB/s, PCIe Gen5: 128GB/s"; same 18-link NVLink 4 as H100; HGX H200 4- and 8-GPU.
    Profile {
        product: "H200",
        aliases: &["H200 141GB HBM3E", "H200 SXM 141GB"],
        board_gpus: &[4, 8],
        switched_gpus: 8,
        nvlinks: 18,
        nvlink_gbps: 450.0,
        pcie_gen: 5,
        pcie_width: 16,
    },
    // NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column): "NVLink: 600GB/s,
    // PCIe Gen4: 64GB/s"; NVIDIA Ampere architecture whitepaper: 12 third-generation
    // NVLink links per GPU; HGX A100 4-GPU and 8-GPU (NVSwitch) baseboards.
    Profile {
        product: "A100 SXM4 80GB",
        aliases: &["A100 80GB SXM4", "A100 SXM 80GB"],
        board_gpus: &[4, 8],
        switched_gpus: 8,
        nvlinks: 12,
        nvlink_gbps: 300.0,
        pcie_gen: 4,
        pcie_width: 16,
    },
    // NVIDIA HGX B200 / DGX B200 datasheets: 8 GPUs, fifth-generation NVLink at 1.8TB/s
    // per GPU (18 links of 100 GB/s), host link PCIe Gen5 x16 (the GPU itself can train
    // Gen6 on some hosts; Gen5 is the conservative expectation).
    Profile {
        product: "B200",
        aliases: &["B200 180GB HBM3E", "B200 SXM 180GB"],
        board_gpus: &[8],
        switched_gpus: 8,
        nvlinks: 18,
        nvlink_gbps: 900.0,
        pcie_gen: 5,
        pcie_width: 16,
    },
];

/// Normalizes a product name so that the label form (`NVIDIA-H100-80GB-HBM3`, as GPU
/// feature discovery writes `nvidia.com/gpu.product`) and NVML's form (`NVIDIA H100 80GB
/// HBM3`) compare equal: upper case, `-` and `_` as spaces, single spaces, no `NVIDIA`
/// prefix, and no `-SHARED` suffix (GPU feature discovery adds it under time-slicing).
pub fn normalize(product: &str) -> String {
    let spaced: String = product
        .chars()
        .map(|c| match c {
            '-' | '_' => ' ',
            c => c.to_ascii_uppercase(),
        })
        .collect();
    let mut words: Vec<&str> = spaced.split_whitespace().collect();
    if words.first() == Some(&"NVIDIA") {
        words.remove(0);
    }
    if words.last() == Some(&"SHARED") {
        words.pop();
    }
    words.join(" ")
}

/// The profile of a product, by any spelling.
pub fn find(product: &str) -> Option<&'static Profile> {
    let n = normalize(product);
    PROFILES
        .iter()
        .find(|p| p.product == n || p.aliases.contains(&n.as_str()))
}

/// What a node of `gpus` GPUs of this profile should measure.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Expectations {
    pub profile: &'static Profile,
    pub gpus: u32,
    /// Floor on one-way copy bandwidth of every GPU pair (GB/s); NVSwitch boards only.
    pub pair_floor_gbps: Option<f64>,
    /// Floor on bidirectional copy bandwidth of every GPU pair (GB/s); NVSwitch boards only.
    pub pair_bidir_floor_gbps: Option<f64>,
    /// Floor on peak all_reduce bus bandwidth (GB/s); NVSwitch boards only.
    pub all_reduce_floor_gbps: Option<f64>,
    /// Floor on host-to-device and device-to-host copy bandwidth per GPU (GB/s).
    pub host_floor_gbps: Option<f64>,
}

impl Profile {
    /// The expectations for a node with `gpus` GPUs of this product.
    pub fn expectations(&'static self, gpus: u32) -> Expectations {
        let switched = gpus == self.switched_gpus;
        let nominal_pair = self.nvlink_gbps;
        Expectations {
            profile: self,
            gpus,
            pair_floor_gbps: switched.then_some(nominal_pair * FLOOR_FRACTION),
            pair_bidir_floor_gbps: switched.then_some(2.0 * nominal_pair * FLOOR_FRACTION),
            // all_reduce busbw on an NVSwitch board is bounded by a GPU's one-way NVLink
            // bandwidth (nccl-tests' PERFORMANCE.md: busbw reflects the slowest link).
            all_reduce_floor_gbps: switched.then_some(nominal_pair * FLOOR_FRACTION),
            host_floor_gbps: pcie_x16_gbps(self.pcie_gen)
                .filter(|_| self.pcie_width == 16)
                .map(|g| g * FLOOR_FRACTION),
        }
    }

    /// Whether `gpus` is a GPU count this product ships with on one board.
    pub fn is_board_count(&self, gpus: u32) -> bool {
        self.board_gpus.contains(&gpus)
    }
}

/// The expectations for a product and GPU count, if the product is known.
pub fn expectations(product: &str, gpus: u32) -> Option<Expectations> {
    find(product).map(|p| p.expectations(gpus))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_and_nvml_spellings_are_the_same_product() {
        assert_eq!(
            normalize("NVIDIA-H100-80GB-HBM3"),
            normalize("NVIDIA H100 80GB HBM3")
        );
        assert_eq!(
            find("NVIDIA-H100-80GB-HBM3").map(|p| p.product),
            Some("H100 80GB HBM3")
        );
        assert_eq!(
            find("NVIDIA A100-SXM4-80GB").map(|p| p.product),
            find("NVIDIA-A100-SXM4-80GB").map(|p| p.product)
        );
        assert!(find("NVIDIA-A100-SXM4-80GB").is_some());
    }

    #[test]
    fn h200_and_b200_are_known_by_label_and_nvml_names() {
        assert_eq!(find("NVIDIA-H200").map(|p| p.product), Some("H200"));
        assert_eq!(find("NVIDIA H200").map(|p| p.product), Some("H200"));
        assert_eq!(find("nvidia-b200").map(|p| p.product), Some("B200"));
        assert_eq!(
            find("NVIDIA-H100-80GB-HBM3-SHARED").map(|p| p.product),
            Some("H100 80GB HBM3")
        );
    }

    #[test]
    fn unknown_products_have_no_profile() {
        assert!(find("NVIDIA GeForce RTX 4090").is_none());
        assert!(find("").is_none());
        // The PCIe H100 is a different product (no NVSwitch board, PCIe Gen5 only).
        assert!(find("NVIDIA H100 PCIe").is_none());
    }

    #[test]
    fn bandwidth_floors_only_for_the_switched_board() {
        let e8 = expectations("NVIDIA-H100-80GB-HBM3", 8).expect("known product");
        assert_eq!(e8.pair_floor_gbps, Some(225.0));
        assert_eq!(e8.pair_bidir_floor_gbps, Some(450.0));
        assert_eq!(e8.all_reduce_floor_gbps, Some(225.0));
        let e4 = expectations("NVIDIA-H100-80GB-HBM3", 4).expect("known product");
        assert_eq!(e4.pair_floor_gbps, None);
        assert_eq!(e4.all_reduce_floor_gbps, None);
        // Host bandwidth does not depend on the board: half of PCIe Gen5 x16 (63 GB/s).
        let host = e4.host_floor_gbps.expect("gen5 floor");
        assert!((host - 31.5).abs() < 0.1, "{host}");
    }

    #[test]
    fn a100_floors_follow_nvlink3_and_gen4() {
        let e = expectations("NVIDIA A100-SXM4-80GB", 8).expect("known product");
        assert_eq!(e.pair_floor_gbps, Some(150.0));
        let host = e.host_floor_gbps.expect("gen4 floor");
        assert!((host - 15.75).abs() < 0.1, "{host}");
        assert_eq!(e.profile.nvlinks, 12);
    }

    #[test]
    fn pcie_rates_match_the_base_specifications() {
        assert!((pcie_x16_gbps(5).expect("gen5") - 63.015).abs() < 0.01);
        assert!((pcie_x16_gbps(4).expect("gen4") - 31.508).abs() < 0.01);
        assert_eq!(pcie_x16_gbps(7), None);
    }
}
