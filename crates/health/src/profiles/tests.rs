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
fn every_profile_name_is_of_its_family() {
    for p in PROFILES {
        for name in std::iter::once(&p.product).chain(p.aliases) {
            assert_eq!(product::family(name), Some(p.family), "{name}");
            assert_eq!(find(name).map(|f| f.product), Some(p.product), "{name}");
        }
    }
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
    assert_eq!(e.profile.map(|p| p.nvlinks), Some(12));
}

fn result_with(g: u32, link_gbps: f64, switch: Option<bool>, pcie: (u32, u32)) -> CompactResult {
    use gpufabric_api::result::{Backend, COMPACT_VERSION, CompactGpuHealth};
    CompactResult {
        version: COMPACT_VERSION,
        node: "n".into(),
        backend: Backend::Sim,
        product: String::new(),
        gpus: g,
        duration_s: 1.0,
        collectives: Vec::new(),
        copy_uni: Vec::new(),
        copy_bidir: Vec::new(),
        host_to_device: Vec::new(),
        device_to_host: Vec::new(),
        corrupt_copies: 0,
        pair_bytes: None,
        ddp_points: Vec::new(),
        ddp_compute_ms: Vec::new(),
        health: (0..g)
            .map(|_| CompactGpuHealth {
                nvlinks: (18, 18),
                pcie: (pcie.0, pcie.0, pcie.1, pcie.1),
                nvlink_link_gbps: link_gbps,
                nvlink_switch: switch,
                ..Default::default()
            })
            .collect(),
        transport_fallbacks: Vec::new(),
        errors: Vec::new(),
        graph_launches: 0,
        compute: Vec::new(),
        compute_gemm_size: None,
        settings_not_chosen: Vec::new(),
        software: Default::default(),
    }
}

#[test]
fn any_slice_of_a_switched_board_gets_floors_from_its_links() {
    for g in [2, 4, 8] {
        let r = result_with(g, 25.0, Some(true), (5, 16));
        let e = expectations_of("NVIDIA H200", &r).expect("known");
        // 18 links x 25 GB/s = 450 GB/s one way; floors at half.
        assert_eq!(e.pair_floor_gbps, Some(225.0), "{g}");
        assert_eq!(e.pair_bidir_floor_gbps, Some(450.0));
        assert_eq!(e.all_reduce_floor_gbps, Some(225.0));
        assert!(e.switched && e.uniform_pairs);
    }
    // An unknown product is judged by its links as well.
    let r = result_with(4, 50.0, Some(true), (5, 16));
    let e = expectations_of("NVIDIA GB300 Future", &r).expect("topology alone");
    assert!(e.profile.is_none());
    assert_eq!(e.pair_floor_gbps, Some(450.0));
}

#[test]
fn links_straight_between_gpus_give_no_uniform_pair_floor() {
    let r = result_with(4, 25.0, Some(false), (4, 16));
    let e = expectations_of("NVIDIA A100-SXM4-80GB", &r).expect("known");
    assert_eq!(e.pair_floor_gbps, None);
    assert_eq!(e.all_reduce_floor_gbps, None);
    assert!(!e.switched);
    // A 4-GPU A100 board still has pairs alike by its product.
    assert!(e.uniform_pairs);
}

#[test]
fn a_switched_node_without_a_link_speed_takes_the_products() {
    let r = result_with(4, 0.0, Some(true), (5, 16));
    let e = expectations_of("NVIDIA H100 80GB HBM3", &r).expect("known");
    assert_eq!(e.pair_floor_gbps, Some(225.0));
    // Unknown product, unknown speed: no floor.
    assert_eq!(
        expectations_of("Mystery GPU", &r).and_then(|e| e.pair_floor_gbps),
        None
    );
}

#[test]
fn host_floors_follow_the_pcie_link_the_gpus_train_to() {
    let r = result_with(4, 25.0, Some(true), (4, 16));
    let host = expectations_of("NVIDIA H200", &r)
        .and_then(|e| e.host_floor_gbps)
        .expect("gen4 floor");
    assert!((host - 15.75).abs() < 0.01, "{host}");
    let r = result_with(4, 25.0, Some(true), (5, 8));
    let host = expectations_of("NVIDIA H200", &r)
        .and_then(|e| e.host_floor_gbps)
        .expect("gen5 x8 floor");
    assert!((host - 15.75).abs() < 0.01, "{host}");
}

#[test]
fn one_gpu_gets_no_pair_or_collective_floor() {
    let r = result_with(1, 25.0, Some(true), (5, 16));
    let e = expectations_of("NVIDIA H200", &r).expect("known");
    assert_eq!(e.pair_floor_gbps, None);
    assert!(!e.switched);
}

/// A spec of every default but the sweep's largest size, on the product `label` names.
fn spec(max_bytes: u64, label: Option<&str>) -> FabricTestSpec {
    let mut s = FabricTestSpec::default();
    s.suite.nccl_sweep.max_bytes = max_bytes;
    if let Some(label) = label {
        s.node_selector
            .insert(LABEL_GPU_PRODUCT.into(), label.into());
    }
    s
}

#[test]
fn a_suite_is_held_against_the_product_the_node_selector_names() {
    let s = spec(1 << 40, Some("NVIDIA-H100-80GB-HBM3"));
    let gpu = suite_gpu(&s);
    assert_eq!(gpu.product, "H100 80GB HBM3");
    assert_eq!(gpu.chosen, Chosen::NodeSelector);
    let msg = validate(&s).expect_err("1 TiB cannot fit").to_string();
    assert!(
        msg.contains("suite.ncclSweep.maxBytes: needs 3.0 TiB on each GPU")
            && msg.contains("79.6 GiB of one H100 80GB HBM3 GPU"),
        "{msg}"
    );
    // 32 GiB fits an H200 (3 x 32 of 140 GiB) but not an H100.
    assert!(validate(&spec(32 << 30, Some("NVIDIA-H100-80GB-HBM3"))).is_err());
    assert_eq!(validate(&spec(32 << 30, Some("NVIDIA-H200"))), Ok(()));
}

#[test]
fn a_test_naming_no_known_product_is_refused_only_what_no_known_gpu_holds() {
    for label in [None, Some("NVIDIA-GeForce-RTX-4090")] {
        let s = spec(48 << 30, label);
        let gpu = suite_gpu(&s);
        assert_eq!((gpu.product, gpu.chosen), ("B200", Chosen::LargestKnown));
        assert_eq!(validate(&s), Ok(()), "fits a B200");
        let msg = validate(&spec(1 << 40, label))
            .expect_err("fits no GPU")
            .to_string();
        assert!(msg.contains("more than any known GPU holds"), "{msg}");
    }
}

#[test]
fn the_default_suite_fits_every_known_product() {
    for p in PROFILES {
        let mut s = FabricTestSpec::default();
        s.suite.node_pairs.enabled = true;
        let label = format!("NVIDIA-{}", p.product.replace(' ', "-"));
        s.node_selector.insert(LABEL_GPU_PRODUCT.into(), label);
        assert_eq!(suite_gpu(&s).bytes, p.memory_bytes);
        assert_eq!(validate(&s), Ok(()), "{}", p.product);
    }
}

#[test]
fn a_longer_sweep_is_never_held_to_less_than_a_shorter_one() {
    for c in &Collective::ALL {
        let p = size_profile(*c).expect("every collective has a size profile");
        assert!(
            p.points
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1),
            "{c:?}"
        );
        assert_eq!(p.share_at(PROFILE_BYTES), Some(1.0), "{c:?}");
    }
}

#[test]
fn a_sweep_is_held_to_the_profile_point_at_or_below_its_largest_size() {
    let p = size_profile(Collective::SendRecv).expect("known");
    assert_eq!(p.share_at(32 << 20), None);
    assert_eq!(p.share_at(64 << 20), Some(0.425));
    // 100 MiB (a sweep of factor 3, say) is held to the 64 MiB point.
    assert_eq!(p.share_at(100 << 20), Some(0.425));
    assert_eq!(p.share_at(8 << 30), Some(1.0));
    let full = collective_to_copy_floor(Collective::SendRecv, Some(1 << 30)).expect("known");
    assert_eq!(
        collective_to_copy_floor(Collective::SendRecv, None),
        Some(full)
    );
    let quick = collective_to_copy_floor(Collective::SendRecv, Some(64 << 20)).expect("known");
    assert!((quick / full - 0.425).abs() < 1e-9, "{quick} {full}");
    assert_eq!(
        collective_to_copy_floor(Collective::SendRecv, Some(1 << 20)),
        None
    );
}

#[test]
fn pcie_rates_match_the_base_specifications() {
    assert!((pcie_x16_gbps(5).expect("gen5") - 63.015).abs() < 0.01);
    assert!((pcie_x16_gbps(4).expect("gen4") - 31.508).abs() < 0.01);
    assert_eq!(pcie_x16_gbps(7), None);
}
