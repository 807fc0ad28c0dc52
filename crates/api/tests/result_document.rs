//! The result document: compact form size, round trips, and refusal of broken input.

use gpufabric_api::result::*;
use gpufabric_api::suite::{Collective, NcclSweep, Suite};

/// A full document as an 8-GPU H200 node with the default suite produces it, with
/// realistic unrounded numbers and worst-case-long health entries.
fn eight_gpu_document() -> ResultDocument {
    let suite = Suite::default();
    let g = 8u32;
    let sizes = suite.nccl_sweep.sizes();
    let collectives = Collective::ALL
        .iter()
        .map(|&c| CollectiveSweep {
            collective: c,
            data_type: suite.nccl_sweep.data_type,
            ranks: g,
            rows: sizes
                .iter()
                .map(|&b| SweepRow {
                    bytes: b,
                    count: b / 4,
                    out_of_place: Timing {
                        time_us: 20.123456 + b as f64 / 355.0e3,
                        algbw: 123.456789,
                        busbw: 355.987654,
                        wrong: 0,
                    },
                    in_place: Some(Timing {
                        time_us: 20.654321 + b as f64 / 355.0e3,
                        algbw: 123.456789,
                        busbw: 354.123456,
                        wrong: 0,
                    }),
                })
                .collect(),
            fit: Some(AlphaBeta {
                alpha_us: 19.87654,
                beta_gbps: 361.23456,
            }),
        })
        .collect();
    let mut uni = Vec::new();
    let mut bi = Vec::new();
    for a in 0..g {
        for b in 0..g {
            if a != b {
                uni.push(PairBandwidth {
                    src: a,
                    dst: b,
                    gbps: 396.123456,
                });
                if a < b {
                    bi.push(PairBandwidth {
                        src: a,
                        dst: b,
                        gbps: 783.987654,
                    });
                }
            }
        }
    }
    ResultDocument {
        schema: FULL_SCHEMA.into(),
        node: "gpu-node-0123.us-east-2.compute.internal".into(),
        backend: Backend::Cuda,
        started_at: "2026-11-21T02:00:00Z".into(),
        duration_s: 41.23456,
        versions: Versions::default(),
        gpus: (0..g)
            .map(|i| GpuInfo {
                index: i,
                product: "NVIDIA H200".into(),
                uuid: None,
                pci_bus_id: None,
                memory_bytes: 150_754_820_096,
            })
            .collect(),
        nccl: Some(NcclSweepResult {
            collectives,
            graph_launches: 0,
        }),
        pairs: Some(PairMatrix {
            bytes: 256 << 20,
            unidirectional: uni,
            bidirectional: bi,
            host_to_device: (0..g)
                .map(|i| HostBandwidth {
                    gpu: i,
                    gbps: 55.123456,
                })
                .collect(),
            device_to_host: (0..g)
                .map(|i| HostBandwidth {
                    gpu: i,
                    gbps: 55.654321,
                })
                .collect(),
            corrupt_copies: 0,
        }),
        ddp: Some(DdpResult {
            hidden: 8192,
            layers: 8,
            batch_per_gpu: 4096,
            buckets: vec![1 << 20, 25 << 20],
            points: [1u32, 2, 4, 8]
                .iter()
                .map(|&n| DdpPoint {
                    gpus: n,
                    step_ms: 25.123456,
                    samples_per_s: 163_000.123,
                    scaling_efficiency: 0.883456,
                    comm_fraction: 0.123456,
                    overlap_efficiency: 0.876543,
                    tflops_per_gpu: 612.345678,
                    compute_ms: vec![22.123456; n as usize],
                    gpu_indices: (0..n).collect(),
                })
                .collect(),
        }),
        health: Some(HealthSnapshot {
            gpus: (0..g)
                .map(|i| GpuHealth {
                    index: i,
                    nvlink_active: 18,
                    nvlink_expected: 18,
                    nvlink_errors: 0,
                    nvlink_link_gbps: 0.0,
                    nvlink_switch: None,
                    pcie_gen: 5,
                    pcie_gen_max: 5,
                    pcie_width: 16,
                    pcie_width_max: 16,
                    xids: vec![],
                    ecc_uncorrected: 0,
                    remapped_pending: false,
                    remapped_failed: false,
                    throttle: vec!["sw_power_cap".into()],
                    temperature_c: 41.0,
                    power_w: 690.5,
                })
                .collect(),
        }),
        compute: Some(ComputeResult {
            gemm_size: Some(8192),
            memory_bytes: Some(1 << 30),
            sdc_size: Some(4096),
            gpus: (0..g)
                .map(|i| GpuCompute {
                    gpu: i,
                    gemm_bf16_tflops: Some(712.345678),
                    gemm_tf32_tflops: Some(401.987654),
                    memory_copy_gbps: Some(2712.3456),
                    memory_write_gbps: Some(3012.3456),
                    sdc: Some(SdcStatus {
                        outputs: 4,
                        wrong_outputs: 0,
                        wrong_lines: 0,
                        first_wrong: None,
                        checksum: "0123456789abcdef".into(),
                        differs_from_others: false,
                    }),
                    under_load: Some(LoadReading {
                        sm_clock_mhz: 1755,
                        max_sm_clock_mhz: 1980,
                        temperature_c: 61.0,
                        power_w: 699.6,
                        power_limit_w: 700.0,
                        throttle: vec!["sw_power_cap".into()],
                    }),
                })
                .collect(),
        }),
        transports: vec![],
        nics: vec![],
        errors: vec![],
        nccl_settings: vec![],
    }
}

#[test]
fn compact_form_of_an_eight_gpu_node_fits_a_termination_message() {
    let doc = eight_gpu_document();
    let compact = CompactResult::from(&doc).to_json();
    assert!(
        compact.len() <= gpufabric_api::keys::TERMINATION_MESSAGE_LIMIT,
        "compact document is {} bytes, over 4096: {compact}",
        compact.len()
    );
    // And it keeps what the operator judges on: every pair, every collective, every GPU.
    let c = CompactResult::parse(&compact).expect("parses back");
    assert_eq!(c.copy_uni.len(), 64);
    assert_eq!(c.copy_bidir.len(), 28);
    assert_eq!(c.collectives.len(), 7);
    assert_eq!(c.ddp_compute_ms.len(), 8);
    assert_eq!(c.health.len(), 8);
    assert_eq!(c.pair_uni(3, 5), Some(396.1));
    assert_eq!(c.pair_bidir(5, 3), Some(784.0));
    println!("compact document of an 8-GPU node: {} bytes", compact.len());
}

#[test]
fn compact_within_never_exceeds_the_limit() {
    let mut doc = eight_gpu_document();
    // A node in bad shape: long XID lists and error messages on every GPU.
    for h in &mut doc.health.as_mut().expect("health").gpus {
        h.xids = (0..40).collect();
        h.throttle = vec![
            "hw_slowdown".into(),
            "hw_thermal_slowdown".into(),
            "sw_thermal_slowdown".into(),
        ];
    }
    doc.errors = (0..10)
        .map(|_| PhaseError {
            phase: Phase::NcclSweep,
            kind: ErrorKind::Failed,
            message: "x".repeat(500),
        })
        .collect();
    let text = doc.compact_within(4096);
    assert!(text.len() <= 4096, "{} bytes", text.len());
    assert!(CompactResult::parse(&text).is_ok());
}

#[test]
fn every_setting_nobody_chose_keeps_its_name_and_source_within_the_limit() {
    let mut doc = eight_gpu_document();
    // Twenty tuning settings from a config file with a long path and long values, beside a
    // node in bad shape.
    let path = format!("/opt/{}/nccl.conf", "site".repeat(30));
    doc.nccl_settings = (0..20)
        .map(|i| NcclSetting {
            name: format!("NCCL_TUNING_SETTING_{i:02}"),
            value: "v".repeat(300),
            source: SettingSource::ConfFile(path.clone()),
        })
        .chain(std::iter::once(NcclSetting {
            name: "NCCL_ALGO".into(),
            value: "Ring".into(),
            source: SettingSource::Spec,
        }))
        .collect();
    doc.errors = (0..10)
        .map(|_| PhaseError {
            phase: Phase::NcclSweep,
            kind: ErrorKind::Failed,
            message: "x".repeat(500),
        })
        .collect();
    let text = doc.compact_within(4096);
    assert!(text.len() <= 4096, "{} bytes", text.len());
    let c = CompactResult::parse(&text).expect("parses");
    // The spec's own setting is the operator's to know; the others are all carried.
    assert_eq!(c.settings_not_chosen.len(), 20);
    assert!(
        c.settings_not_chosen
            .iter()
            .all(|s| s.name.starts_with("NCCL_TUNING_SETTING_")
                && matches!(&s.source, SettingSource::ConfFile(p) if p.starts_with("/opt/site")))
    );
}

#[test]
fn how_the_sweep_was_timed_reaches_the_compact_form_and_only_when_graphs_were_used() {
    let mut doc = eight_gpu_document();
    let host = CompactResult::from(&doc).to_json();
    assert!(
        !host.contains("\"gl\""),
        "host-launched adds nothing: {host}"
    );
    assert!(
        !serde_json::to_string(&doc)
            .expect("json")
            .contains("graphLaunches")
    );
    if let Some(n) = doc.nccl.as_mut() {
        n.graph_launches = 10;
    }
    let full = serde_json::to_string(&doc).expect("json");
    assert!(full.contains("\"graphLaunches\":10"), "{full}");
    let graphs = CompactResult::from(&doc).to_json();
    let c = CompactResult::parse(&graphs).expect("parses back");
    assert_eq!(c.graph_launches, 10);
    assert_eq!(
        CompactResult::parse(&host).expect("parses").graph_launches,
        0
    );
}

#[test]
fn broken_documents_are_refused_with_a_reason() {
    assert_eq!(CompactResult::parse(""), Err(ParseError::Empty));
    assert_eq!(CompactResult::parse("   \n"), Err(ParseError::Empty));
    let full = CompactResult::from(&eight_gpu_document()).to_json();
    let truncated = &full[..full.len() / 2];
    assert!(matches!(
        CompactResult::parse(truncated),
        Err(ParseError::Malformed(_))
    ));
    assert!(matches!(
        CompactResult::parse("{\"v\":1}"),
        Err(ParseError::Malformed(_))
    ));
    assert_eq!(
        CompactResult::parse("{\"v\":7,\"n\":\"x\"}"),
        Err(ParseError::Version {
            found: 7,
            expected: 1
        })
    );
    assert!(matches!(
        CompactResult::parse("Segmentation fault"),
        Err(ParseError::Malformed(_))
    ));
    assert!(matches!(
        ResultDocument::parse("{\"schema\":\"other\"}"),
        Err(ParseError::Malformed(_))
    ));
}

#[test]
fn full_document_round_trips() {
    let doc = eight_gpu_document();
    let text = serde_json::to_string(&doc).expect("serialises");
    assert_eq!(ResultDocument::parse(&text).expect("parses"), doc);
}

#[test]
fn sweep_sizes_go_from_min_to_max_by_the_factor() {
    let s = NcclSweep {
        min_bytes: 8,
        max_bytes: 1 << 30,
        step_factor: 2,
        ..Default::default()
    };
    let sizes = s.sizes();
    assert_eq!(sizes.first(), Some(&8));
    assert_eq!(sizes.last(), Some(&(1 << 30)));
    assert_eq!(sizes.len(), 28);
    let s = NcclSweep {
        min_bytes: 1,
        max_bytes: 100,
        step_factor: 4,
        ..Default::default()
    };
    // float32: sizes round down to whole elements, at least one element.
    assert_eq!(s.sizes(), vec![4, 16, 64]);
}

#[test]
fn busbw_factors_are_those_of_nccl_tests() {
    let n = 8;
    assert!((Collective::AllReduce.busbw_factor(n) - 1.75).abs() < 1e-12);
    assert!((Collective::AllGather.busbw_factor(n) - 0.875).abs() < 1e-12);
    assert!((Collective::ReduceScatter.busbw_factor(n) - 0.875).abs() < 1e-12);
    assert!((Collective::AllToAll.busbw_factor(n) - 0.875).abs() < 1e-12);
    assert_eq!(Collective::Broadcast.busbw_factor(n), 1.0);
    assert_eq!(Collective::Reduce.busbw_factor(n), 1.0);
    assert_eq!(Collective::SendRecv.busbw_factor(n), 1.0);
}

#[test]
fn ddp_gpu_counts_default_to_powers_of_two_and_all() {
    let p = gpufabric_api::suite::DdpProbe::default();
    assert_eq!(p.counts_for(8), vec![1, 2, 4, 8]);
    assert_eq!(p.counts_for(6), vec![1, 2, 4, 6]);
    assert_eq!(p.counts_for(1), vec![1]);
    let p = gpufabric_api::suite::DdpProbe {
        gpu_counts: Some(vec![8, 2, 16]),
        ..Default::default()
    };
    assert_eq!(p.counts_for(8), vec![2, 8]);
}

#[test]
fn upper_triangle_indexes_every_pair_once() {
    let g = 8;
    let mut seen = std::collections::BTreeSet::new();
    for a in 0..g {
        for b in a + 1..g {
            assert!(seen.insert(upper_index(g, a, b)));
        }
    }
    assert_eq!(seen.len(), 28);
    assert_eq!(seen.iter().max(), Some(&27));
}
