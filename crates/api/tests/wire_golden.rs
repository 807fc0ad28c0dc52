//! The wire form of the result documents, byte for byte: a document that sets every field
//! serialises to the committed text, and that text reads back to the same document. Rust
//! names may change; these bytes may not within a schema version.
//!
//! To regenerate after an intended change of the wire form (with a new version):
//! `GOLDEN_WRITE=1 cargo test -p gpufabric-api --test wire_golden`.

use gpufabric_api::result::*;
use gpufabric_api::suite::{Collective, DataType};
use std::path::PathBuf;

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

/// A 3-GPU document that exercises every field of both forms: an in-place run and a
/// collective without one, wrong elements, corrupt copies, every health counter, a
/// transport fallback and a phase error.
fn document() -> ResultDocument {
    let rows = |c: Collective| -> Vec<SweepRow> {
        [1024u64, 1 << 20]
            .iter()
            .map(|&b| {
                let t = 11.25 + b as f64 / 300.0e3;
                let measured_in_place = c != Collective::SendRecv;
                SweepRow {
                    bytes: b,
                    count: b / 4,
                    out_of_place: Timing {
                        time_us: t,
                        algbw: b as f64 / t / 1e3,
                        busbw: b as f64 / t / 1e3 * 1.3333,
                        wrong: if b == 1024 { 2 } else { 0 },
                    },
                    in_place: measured_in_place.then_some(Timing {
                        time_us: t * 1.01,
                        algbw: 90.5,
                        busbw: 120.25,
                        wrong: if b == 1024 { 1 } else { 0 },
                    }),
                }
            })
            .collect()
    };
    let collectives = [Collective::AllReduce, Collective::SendRecv]
        .iter()
        .map(|&c| CollectiveSweep {
            collective: c,
            data_type: DataType::Float32,
            ranks: 3,
            rows: rows(c),
            fit: (c == Collective::AllReduce).then_some(AlphaBeta {
                alpha_us: 10.987,
                beta_gbps: 301.234,
            }),
        })
        .collect();
    let mut unidirectional = Vec::new();
    let mut bidirectional = Vec::new();
    for a in 0..3u32 {
        for b in 0..3u32 {
            if a != b {
                unidirectional.push(PairBandwidth {
                    src: a,
                    dst: b,
                    gbps: 390.04 + f64::from(a * 3 + b),
                });
            }
            if a < b {
                bidirectional.push(PairBandwidth {
                    src: a,
                    dst: b,
                    gbps: 780.06 - f64::from(a + b),
                });
            }
        }
    }
    ResultDocument {
        schema: FULL_SCHEMA.into(),
        node: "gpu-node-7".into(),
        backend: Backend::Sim,
        started_at: "2026-11-21T02:00:00Z".into(),
        duration_s: 12.345,
        versions: Versions {
            agent: "0.1.0".into(),
            driver: Some("560.35.03".into()),
            cuda: Some("12.6".into()),
            nccl: Some("2.21.5".into()),
            ..Versions::default()
        },
        gpus: (0..3)
            .map(|i| GpuInfo {
                index: i,
                product: "NVIDIA H200".into(),
                uuid: Some(format!("GPU-{i:016x}")),
                pci_bus_id: Some(format!("00000000:{:02X}:00.0", 0x18 + i)),
                memory_bytes: 150_754_820_096,
            })
            .collect(),
        nccl: Some(NcclSweepResult {
            collectives,
            graph_launches: 0,
        }),
        pairs: Some(PairMatrix {
            bytes: 256 << 20,
            unidirectional,
            bidirectional,
            host_to_device: (0..3)
                .map(|i| HostBandwidth {
                    gpu: i,
                    gbps: 55.06,
                })
                .collect(),
            device_to_host: (0..3)
                .map(|i| HostBandwidth {
                    gpu: i,
                    gbps: 54.44,
                })
                .collect(),
            corrupt_copies: 1,
        }),
        ddp: Some(DdpResult {
            hidden: 8192,
            layers: 8,
            batch_per_gpu: 4096,
            buckets: vec![1 << 20, 25 << 20],
            points: [1u32, 3]
                .iter()
                .map(|&n| DdpPoint {
                    gpus: n,
                    step_ms: 20.5 + f64::from(n),
                    samples_per_s: 1000.0 * f64::from(n),
                    scaling_efficiency: 0.9123,
                    comm_fraction: 0.1234,
                    overlap_efficiency: 0.5678,
                    tflops_per_gpu: 610.06,
                    compute_ms: vec![20.456; n as usize],
                    gpu_indices: (0..n).collect(),
                })
                .collect(),
        }),
        health: Some(HealthSnapshot {
            gpus: (0..3)
                .map(|i| GpuHealth {
                    index: i,
                    nvlink_active: if i == 1 { 12 } else { 18 },
                    nvlink_expected: 18,
                    nvlink_errors: u64::from(i),
                    nvlink_link_gbps: 0.0,
                    nvlink_switch: None,
                    pcie_gen: 5,
                    pcie_gen_max: 5,
                    pcie_width: if i == 2 { 8 } else { 16 },
                    pcie_width_max: 16,
                    xids: if i == 0 { vec![79] } else { vec![] },
                    ecc_uncorrected: if i == 2 { 3 } else { 0 },
                    remapped_pending: i == 2,
                    remapped_failed: i == 1,
                    throttle: if i == 0 {
                        vec!["sw_power_cap".into()]
                    } else {
                        vec![]
                    },
                    temperature_c: 41.25,
                    power_w: 690.5,
                })
                .collect(),
        }),
        compute: Some(ComputeResult {
            gemm_size: Some(8192),
            memory_bytes: Some(1 << 30),
            sdc_size: Some(4096),
            gpus: (0..3)
                .map(|i| GpuCompute {
                    gpu: i,
                    gemm_bf16_tflops: Some(if i == 1 { 301.25 } else { 712.5 }),
                    gemm_tf32_tflops: (i != 2).then_some(401.75),
                    memory_copy_gbps: Some(2712.5),
                    memory_write_gbps: Some(3012.25),
                    sdc: Some(SdcStatus {
                        outputs: 4,
                        wrong_outputs: u32::from(i == 2),
                        wrong_lines: if i == 2 { 2 } else { 0 },
                        first_wrong: (i == 2).then_some((17, 4093)),
                        checksum: format!("{:016x}", 0xfeed_u64 + u64::from(i == 2)),
                        differs_from_others: i == 2,
                    }),
                    under_load: (i != 1).then(|| LoadReading {
                        sm_clock_mhz: 1755,
                        max_sm_clock_mhz: 1980,
                        temperature_c: 61.5,
                        power_w: 699.6,
                        power_limit_w: 700.0,
                        throttle: if i == 0 {
                            vec!["sw_power_cap".into()]
                        } else {
                            vec![]
                        },
                    }),
                })
                .collect(),
        }),
        transports: vec![
            TransportInfo {
                a: 0,
                b: 1,
                transport: Transport::Nvlink,
            },
            TransportInfo {
                a: 0,
                b: 2,
                transport: Transport::Shm,
            },
        ],
        nics: Vec::new(),
        errors: vec![PhaseError {
            phase: Phase::DdpProbe,
            kind: ErrorKind::Timeout,
            message: "ddpProbe did not finish within 30.0 s; the watchdog aborted it".into(),
        }],
        nccl_settings: vec![
            NcclSetting {
                name: "NCCL_ALGO".into(),
                value: "Ring".into(),
                source: SettingSource::Spec,
            },
            NcclSetting {
                name: "NCCL_P2P_DISABLE".into(),
                value: "1".into(),
                source: SettingSource::ConfFile("/etc/nccl/site.conf".into()),
            },
        ],
    }
}

/// Compares `text` with the committed file, or writes it when `GOLDEN_WRITE` is set.
fn golden(name: &str, text: &str) {
    let path = data(name);
    if std::env::var_os("GOLDEN_WRITE").is_some() {
        std::fs::write(&path, text).expect("write golden file");
    }
    let want = std::fs::read_to_string(&path).expect("golden file present");
    assert_eq!(
        text, want,
        "{name} changed; the wire form must stay byte for byte"
    );
}

#[test]
fn compact_form_is_byte_for_byte_the_committed_text() {
    let text = CompactResult::from(&document()).to_json();
    golden("golden.compact.json", &text);
    let back = CompactResult::parse(&text).expect("parses");
    assert_eq!(back.to_json(), text, "reads back to the same document");
}

#[test]
fn full_form_is_byte_for_byte_the_committed_text() {
    let doc = document();
    let text = serde_json::to_string(&doc).expect("serialises");
    golden("golden.full.json", &text);
    let back = ResultDocument::parse(&text).expect("parses");
    assert_eq!(back, doc, "reads back to the same document");
}

#[test]
fn a_compact_form_from_an_agent_that_did_not_give_its_sizes_still_reads() {
    // An older agent's form: no "mx" nor "pz". It reads, the sizes unknown (judged as before).
    let text = r#"{"v":1,"n":"gpu-node-7","b":"sim","p":"NVIDIA H200","g":2,"d":1.0,"nc":[{"c":"allReduce","pk":94.8,"bb":94.8,"lt":11.3}]}"#;
    let c = CompactResult::parse(text).expect("an older compact form reads");
    assert_eq!(c.collectives[0].largest_bytes, None);
    assert_eq!(c.pair_bytes, None);
    // This agent's form carries both.
    let now = CompactResult::from(&document());
    assert_eq!(now.collectives[0].largest_bytes, Some(1 << 20));
    assert!(now.pair_bytes.is_some_and(|b| b > 0));
}

/// The committed document `name` reads as a `T` and writes back byte for byte.
fn reads_and_writes_back<T: serde::Serialize + serde::de::DeserializeOwned>(name: &str) -> T {
    let text = std::fs::read_to_string(data(name)).expect("golden file present");
    let doc: T = serde_json::from_str(&text).expect("parses");
    assert_eq!(
        serde_json::to_string(&doc).expect("serialises"),
        text,
        "{name}: the wire form must stay byte for byte"
    );
    doc
}

#[test]
fn the_multi_node_documents_of_the_agent_read_and_write_back_byte_for_byte() {
    // Every field present, the group's header first, in the order the operator and the
    // kept results read.
    let ddp: gpufabric_api::ddp_nodes::DdpNodesResult = reads_and_writes_back("ddp-nodes.json");
    assert_eq!((ddp.header.rank, ddp.header.gpus_per_node), (1, 8));
    assert_eq!(ddp.points[0].node_compute_ms, vec![10.0, 12.0]);
    assert_eq!(ddp.stragglers[0].node, "h200-02");
    let nccl: gpufabric_api::nccl_nodes::NcclNodesResult = reads_and_writes_back("nccl-nodes.json");
    assert_eq!(nccl.header.nodes, ["h200-01", "h200-02"]);
    assert_eq!((nccl.wrong(), nccl.points[0].ranks), (3, 16));
}
