//! Hand-built objects for the renderers' tests: the demo's nightly test and its manual run,
//! with a quarantined node, a node held back by the budget, a busy node skipped, node pairs
//! and the multi-node probe; a node's full result as the operator keeps it, and its trend.

use gpufabric_api::result::{
    Backend, CollectiveSweep, GpuInfo, NcclSweepResult, PairBandwidth, PairMatrix, SweepRow,
    Timing, Versions,
};
use gpufabric_api::shard::FabricTestRunShard;
use gpufabric_api::{Collective, DataType, FabricTest, FabricTestRun, ResultDocument};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use serde_json::json;
use std::collections::BTreeMap;

pub const RECORD: &str = r#"{"test":"nightly","run":"nightly-manual-1","reason":"NIC mlx5_0 port 1 slow to every partner","since":"2026-11-21T02:03:04Z","mode":"Cordon","cordoned":true,"labeled":true}"#;

pub fn test() -> FabricTest {
    serde_json::from_value(json!({
        "apiVersion": "gpufabric.io/v1alpha1",
        "kind": "FabricTest",
        "metadata": {"name": "nightly"},
        "spec": {"schedule": "0 2 * * *", "quarantine": {"mode": "Cordon", "failuresToQuarantine": 1, "passesToRelease": 2}},
        "status": {
            "activeRun": null,
            "lastRun": {"name": "nightly-manual-1", "phase": "Succeeded", "trigger": "Manual",
                        "passed": 12, "failed": 3, "errored": 0, "notMeasured": 1, "findings": 4},
            "nodes": [
                {"node": "h200-02", "verdict": "Failed", "consecutiveFailures": 1, "consecutivePasses": 0,
                 "quarantined": true, "quarantinedSince": "2026-11-21T02:03:04Z",
                 "standing": {"state": "Quarantined"},
                 "lastFinding": "slow NIC", "lastRun": "nightly-manual-1", "lastMeasured": "2026-11-21T02:03:00Z"},
                {"node": "h100-03", "verdict": "Failed", "consecutiveFailures": 1, "consecutivePasses": 0,
                 "heldBack": "would quarantine: the budget (maxQuarantined 10%) is spent",
                 "standing": {"state": "HeldBack", "why": "would quarantine: the budget (maxQuarantined 10%) is spent"},
                 "lastRun": "nightly-manual-1"},
                {"node": "h100-00", "verdict": "Passed", "consecutiveFailures": 0, "consecutivePasses": 3,
                 "standing": {"state": "Passing"},
                 "lastRun": "nightly-manual-1"}
            ],
            "quarantinedNodes": ["h200-02"],
            "quarantinedCount": 1,
            "targets": [{"node": "h200-02", "reason": "marked repaired (gpufabric.io/repaired: INC-1)", "attempts": 0}],
            "conditions": [{"type": "BreakerOpen", "status": "False", "reason": "Closed", "message": "",
                            "lastTransitionTime": "2026-11-21T02:00:00Z"}]
        }
    }))
    .expect("a FabricTest")
}

pub fn open_breaker(mut t: FabricTest) -> FabricTest {
    if let Some(c) = t
        .status
        .as_mut()
        .and_then(|s| s.conditions.iter_mut().find(|c| c.type_ == "BreakerOpen"))
    {
        c.status = "True".into();
        c.reason = "Storm".into();
        c.message = "run nightly-1: 14 of 16 measured nodes failed (more than 50%)".into();
    }
    t
}

/// `t` with GPUs taken out of service by DRA device taints, as the operator records them:
/// two of h100-03 (listed out of order) and one of h100-00, each node standing
/// `GpusOutOfService`.
pub fn with_tainted_gpus(mut t: FabricTest) -> FabricTest {
    let gpu = |node: &str, gpu: u32, rule: &str, reason: &str, since: &str| {
        serde_json::from_value(json!({
            "gpu": gpu,
            "device": format!("gpu.nvidia.com/{node}/gpu-{gpu}"),
            "rule": rule,
            "reason": reason,
            "since": since,
        }))
        .expect("a tainted GPU")
    };
    for h in t.status.iter_mut().flat_map(|s| s.nodes.iter_mut()) {
        match h.node.as_str() {
            "h100-03" => {
                h.tainted_gpus = vec![
                    gpu(
                        &h.node,
                        5,
                        "gpufabric-gpu-q9w4z",
                        "GPU 5 computes a step 1.5x slower than the node's other GPUs",
                        "2026-11-21T02:04:10Z",
                    ),
                    gpu(
                        &h.node,
                        2,
                        "gpufabric-gpu-8c2d1",
                        "GPU pair 2-5 copies at 95 GB/s",
                        "2026-11-21T02:04:10Z",
                    ),
                ]
            }
            "h100-00" => {
                h.tainted_gpus = vec![gpu(
                    &h.node,
                    6,
                    "gpufabric-gpu-m3k7v",
                    "GPU 6 memory bandwidth 2.10 TB/s, 38% under its peers",
                    "2026-11-20T02:05:00Z",
                )]
            }
            _ => continue,
        }
        let mut gpus: Vec<u32> = h.tainted_gpus.iter().map(|g| g.gpu).collect();
        gpus.sort();
        h.standing = gpufabric_api::standing::Standing::GpusOutOfService { gpus };
        h.held_back = None;
    }
    t
}

pub fn run() -> FabricTestRun {
    serde_json::from_value(json!({
        "apiVersion": "gpufabric.io/v1alpha1",
        "kind": "FabricTestRun",
        "metadata": {"name": "nightly-manual-1"},
        "spec": {"test": "nightly", "trigger": "Manual"},
        "status": {
            "phase": "Succeeded",
            "nodeCount": 3, "passed": 1, "failed": 2, "notMeasured": 1,
            "nodes": [
                {"node": "h100-03", "verdict": "Failed", "product": "NVIDIA-H100-80GB-HBM3",
                 "allReduceBusBwGbps": 361.52, "minPairGbps": 95.0, "ddpEfficiency": 0.97, "findings": 1},
                {"node": "h200-02", "verdict": "Failed", "findings": 1},
                {"node": "h100-00", "verdict": "Passed", "allReduceBusBwGbps": 480.0},
                {"node": "h100-09", "verdict": "NotMeasured", "notMeasured": "Evicted", "reason": "evicted by the kubelet"}
            ],
            "skipped": [{"node": "h200-07", "reason": "Busy", "message": "8 of 8 GPUs in use"}],
            "findings": [
                {"kind": "Slow", "subject": {"kind": "GpuPair", "node": "h100-03", "gpu": 2, "peerGpu": 5},
                 "metric": "pairBandwidth", "measured": 95.0, "expected": 300.0, "deviation": -0.683,
                 "unit": "GB/s", "severity": "Critical", "message": "GPU pair 2-5 copies at 95 GB/s"},
                {"kind": "Slow", "subject": {"kind": "NodePair", "node": "h100-05", "peerNode": "h200-02"},
                 "metric": "nodePairBusBw", "severity": "Info", "message": "the path h100-05 <-> h200-02 is slow"}
            ],
            "findingCount": 3,
            "nodePairs": {"seed": 7, "candidates": 12, "round": 4, "rounds": 4, "confirmationRound": 4,
                          "retested": 1, "done": true, "pairs": 2, "measured": 2, "notMeasured": 0, "errored": 0,
                          "within": {"measured": 2, "medianGbps": 48.5}},
            "ddpNodes": {"nodes": ["h100-00", "h100-01"], "state": "Measured", "done": true,
                         "points": [{"nodes": 1, "gpus": 8, "stepMs": 20.0, "scalingEfficiency": 1.0, "commAloneMs": 1.0, "exposedCommMs": 0.5},
                                    {"nodes": 2, "gpus": 16, "stepMs": 21.0, "scalingEfficiency": 0.952, "commAloneMs": 2.0, "exposedCommMs": 1.0}],
                         "stragglers": [{"node": "h100-01", "computeMs": 26.0, "fastestMs": 20.0, "slowerPercent": 30.0}]}
        }
    }))
    .expect("a FabricTestRun")
}

pub fn shard() -> FabricTestRunShard {
    serde_json::from_value(json!({
        "apiVersion": "gpufabric.io/v1alpha1",
        "kind": "FabricTestRunShard",
        "metadata": {"name": "nightly-manual-1-0"},
        "spec": {"run": "nightly-manual-1", "index": 0, "nodes": ["h100-05", "h200-02"]},
        "status": {"nodeCount": 2, "done": 2, "passed": 1, "failed": 1, "nodes": [
            {"node": "h200-02", "verdict": "Failed", "pairs": [
                {"round": 4, "index": 0, "partner": "h100-00", "rank": 0, "confirmation": true,
                 "state": "Measured", "busbwGbps": 12.5, "transport": "ib"},
                {"round": 1, "index": 1, "partner": "h100-05", "rank": 1, "state": "Measured", "busbwGbps": 13.0}
            ]},
            {"node": "h100-05", "verdict": "Passed", "pairs": [
                {"round": 1, "index": 1, "partner": "h200-02", "rank": 0, "state": "Measured", "busbwGbps": 13.0, "transport": "ib"}
            ]}
        ]}
    }))
    .expect("a FabricTestRunShard")
}

pub fn node(name: &str, record: Option<&str>) -> Node {
    let mut annotations = serde_json::Map::new();
    let mut labels = serde_json::Map::new();
    let mut spec = json!({});
    if let Some(r) = record {
        annotations.insert("gpufabric.io/quarantine".into(), json!(r));
        annotations.insert("gpufabric.io/repaired".into(), json!("INC-1"));
        labels.insert("gpufabric.io/quarantined".into(), json!("true"));
        labels.insert("gpufabric.io/result".into(), json!("fail"));
        spec = json!({"unschedulable": true, "taints": [
            {"key": "gpufabric.io/quarantined", "value": "true", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]});
    }
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": annotations, "labels": labels},
        "spec": spec,
    }))
    .expect("a Node")
}

/// A node's full result: 8 GPUs copying at 370 GB/s a pair one way, `slow` at 148 both
/// ways, and an all_reduce and all_gather sweep from 8 B to 256 MiB peaking at `peak` GB/s.
pub fn document(node: &str, slow: (u32, u32), peak: f64) -> ResultDocument {
    let gpus = (0..8)
        .map(|index| GpuInfo {
            index,
            product: "NVIDIA H100 80GB HBM3".into(),
            uuid: None,
            pci_bus_id: None,
            memory_bytes: 81_559 << 20,
        })
        .collect();
    let mut doc = ResultDocument::unmeasured(
        node.into(),
        Backend::Sim,
        "2026-11-21T02:00:00Z".into(),
        Versions::default(),
        gpus,
    );
    let unidirectional = (0..8)
        .flat_map(|src| (0..8).filter(move |d| *d != src).map(move |dst| (src, dst)))
        .map(|(src, dst)| PairBandwidth {
            src,
            dst,
            gbps: if (src, dst) == slow || (dst, src) == slow {
                148.0
            } else {
                370.0
            },
        })
        .collect();
    doc.pairs = Some(PairMatrix {
        bytes: 256 << 20,
        unidirectional,
        bidirectional: Vec::new(),
        host_to_device: Vec::new(),
        device_to_host: Vec::new(),
        corrupt_copies: 0,
    });
    let sweep = |collective, peak: f64| CollectiveSweep {
        collective,
        data_type: DataType::Float32,
        ranks: 8,
        rows: (3..=28)
            .map(|k| {
                let bytes = 1u64 << k;
                let busbw = peak * bytes as f64 / (bytes as f64 + 4e6);
                SweepRow {
                    bytes,
                    count: bytes / 4,
                    out_of_place: Timing {
                        time_us: bytes as f64 / busbw.max(1e-3) / 1e3,
                        algbw: busbw,
                        busbw,
                        wrong: 0,
                    },
                    in_place: None,
                }
            })
            .collect(),
        fit: None,
    };
    doc.nccl = Some(NcclSweepResult {
        collectives: vec![
            sweep(Collective::AllReduce, peak),
            sweep(Collective::AllGather, peak * 0.9),
        ],
        graph_launches: 0,
    });
    doc
}

/// The ConfigMap the operator keeps `doc` in for `node`, of `run`: as it is, or gzipped.
pub fn kept(node: &str, run: &str, doc: &ResultDocument, gzip: bool) -> ConfigMap {
    use std::io::Write;
    let text = serde_json::to_string(doc).expect("a document serializes");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(format!("gpufabric-result-nightly-{node}"));
    cm.metadata.labels = Some(BTreeMap::from([
        ("gpufabric.io/test".to_string(), "nightly".to_string()),
        ("gpufabric.io/run".to_string(), run.to_string()),
        ("gpufabric.io/node".to_string(), node.to_string()),
    ]));
    cm.metadata.annotations = Some(BTreeMap::from([(
        "gpufabric.io/node".to_string(),
        node.to_string(),
    )]));
    if gzip {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(text.as_bytes()).expect("gzip");
        cm.binary_data = Some(BTreeMap::from([(
            "result.json.gz".to_string(),
            ByteString(gz.finish().expect("gzip")),
        )]));
    } else {
        cm.data = Some(BTreeMap::from([("result.json".to_string(), text)]));
    }
    cm
}

/// `n` with the trend annotation `text`.
pub fn with_trend(mut n: Node, text: &str) -> Node {
    n.metadata
        .annotations
        .get_or_insert_default()
        .insert("gpufabric.io/trend".into(), text.into());
    n
}

/// A multi-node NCCL sweep over four nodes of 8 GPUs: all_reduce at 45.5 GB/s on 2 nodes and
/// 14.0 on 4 (a knee), alltoall flat at 38.0; the links (h100-01: 8 rails of 50 GB/s) allow
/// all_reduce 400 GB/s, so both counts are far below them.
pub fn nccl_nodes() -> gpufabric_api::nccl_nodes::NcclNodesStatus {
    use gpufabric_api::link_ceiling::{NcclNodesCeiling, NcclNodesLinks};
    use gpufabric_api::nccl_nodes::{
        NcclNodesCurvePoint, NcclNodesKnee, NcclNodesStatus, NcclNodesSummary, NcclNodesSweep,
    };
    let summary = |c, busbw| NcclNodesSummary {
        collective: c,
        large_busbw: busbw,
        small_time_us: 41.25,
        wrong: 0,
    };
    NcclNodesStatus {
        sweep: NcclNodesSweep {
            nodes: ["h100-00", "h100-01", "h100-02", "h100-03"]
                .map(String::from)
                .to_vec(),
            state: gpufabric_api::pair::PairState::Measured,
            points: [(2, 45.5), (4, 14.0)]
                .map(|(nodes, ar)| NcclNodesCurvePoint {
                    nodes,
                    ranks: nodes * 8,
                    summary: vec![
                        summary(Collective::AllReduce, ar),
                        summary(Collective::AllToAll, 38.0),
                    ],
                    links: Some(NcclNodesLinks {
                        node: "h100-01".into(),
                        rails: 8,
                        gbps: Some(400.0),
                        unknown: None,
                    }),
                    ceilings: vec![NcclNodesCeiling {
                        collective: Collective::AllReduce,
                        busbw: 400.0,
                        share: ar / 400.0,
                    }],
                })
                .to_vec(),
            gpus_per_node: 8,
            knees: vec![NcclNodesKnee {
                collective: Collective::AllReduce,
                from_nodes: 2,
                at_nodes: 4,
                busbw: 14.0,
                previous_busbw: 45.5,
                message: "all_reduce loses 69% of its bus bandwidth from 2 to 4 nodes".into(),
            }],
            done: true,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// `p` split by `example.com/rack`: its sweep is the one across blocks, and block rack-b
/// (h100-02, h100-03: all_reduce 9.5 GB/s on 2 nodes) is named slow.
pub fn in_blocks(
    mut p: gpufabric_api::nccl_nodes::NcclNodesStatus,
) -> gpufabric_api::nccl_nodes::NcclNodesStatus {
    use gpufabric_api::nccl_nodes::{NcclNodesBlock, NcclNodesSlowBlock, NcclNodesSweep};
    let mut point = p.sweep.points[0].clone();
    point.summary[0].large_busbw = 9.5;
    p.topology_key = Some("example.com/rack".into());
    p.blocks = vec![NcclNodesBlock {
        value: "rack-b".into(),
        sweep: NcclNodesSweep {
            nodes: vec!["h100-02".into(), "h100-03".into()],
            state: gpufabric_api::pair::PairState::Measured,
            points: vec![point],
            done: true,
            ..Default::default()
        },
    }];
    p.slow_blocks = vec![NcclNodesSlowBlock {
        key: "example.com/rack".into(),
        value: "rack-b".into(),
        collective: Collective::AllReduce,
        nodes: 2,
        busbw: 9.5,
        median: 45.0,
        blocks: 3,
        message: "all_reduce over 2 nodes of block example.com/rack=rack-b reached 9.5 GB/s".into(),
    }];
    p
}

/// [`nccl_nodes`] with its 4-node all_reduce far below its links' 400 GB/s ceiling.
pub fn nccl_nodes_far_below_links() -> gpufabric_api::nccl_nodes::NcclNodesStatus {
    let mut p = nccl_nodes();
    p.link_gaps = vec![gpufabric_api::link_ceiling::NcclNodesLinkGap {
        kind: gpufabric_api::link_ceiling::LinkGapKind::Below,
        block: None,
        collective: gpufabric_api::suite::Collective::AllReduce,
        nodes: 4,
        busbw: 14.0,
        ceiling: 400.0,
        message: "all_reduce over 4 nodes reached 14.0 GB/s, 4% of the 400.0 GB/s the links allow"
            .into(),
    }];
    p
}
