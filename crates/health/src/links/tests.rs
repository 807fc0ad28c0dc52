use super::*;
use gpufabric_api::nic::PortErrors;

fn port(i: u32, rate: Option<f64>, up: bool) -> NicPort {
    NicPort {
        device: format!("mlx5_{i}"),
        port: 1,
        link_layer: Some("InfiniBand".into()),
        state: if up { "ACTIVE" } else { "DOWN" }.into(),
        phys_state: if up { "LinkUp" } else { "Polling" }.into(),
        rate_gbps: rate,
        errors: PortErrors::default(),
    }
}

fn eight_ndr() -> Vec<NicPort> {
    (0..8).map(|i| port(i, Some(400.0), true)).collect()
}

#[test]
fn eight_ports_of_400_gbits_allow_400_gbytes_of_ring_busbw() {
    let ports = eight_ndr();
    let nodes = [("a", Some(ports.as_slice())), ("b", Some(ports.as_slice()))];
    let b = bound(&nodes).expect("a bound");
    assert_eq!((b.rails, b.gbps, b.unknown), (8, Some(400.0), None));
    for c in [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
    ] {
        assert_eq!(ceiling(c, 2, 8, 400.0), Some(400.0), "{c}");
        assert_eq!(ceiling(c, 1024, 8, 400.0), Some(400.0), "{c}");
    }
}

#[test]
fn alltoall_is_bounded_by_the_share_of_its_traffic_that_crosses_nodes() {
    // 2 nodes of 8: half of each rank's peers are remote; a node sends 4 buffers across.
    // algbw <= 400 / 4 = 100 GB/s, busbw = 100 x 15/16.
    let two = ceiling(Collective::AllToAll, 2, 8, 400.0).expect("a ceiling");
    assert!((two - 93.75).abs() < 1e-9, "{two}");
    // Many nodes: almost all traffic crosses, one rail per GPU: 400 / 8 = 50 GB/s.
    let many = ceiling(Collective::AllToAll, 1024, 8, 400.0).expect("a ceiling");
    assert!((many - 50.0).abs() < 0.1, "{many}");
    assert!(many < two);
    // Without the GPUs per node there is nothing to say.
    assert_eq!(ceiling(Collective::AllToAll, 4, 0, 400.0), None);
}

#[test]
fn one_node_with_a_port_down_lowers_every_count_it_takes_part_in() {
    let full = eight_ndr();
    let mut one_down = eight_ndr();
    one_down[3] = port(3, Some(400.0), false);
    let nodes = [
        ("a", Some(full.as_slice())),
        ("b", Some(full.as_slice())),
        ("c", Some(one_down.as_slice())),
        ("d", Some(full.as_slice())),
    ];
    assert_eq!(bound(&nodes[..2]).and_then(|b| b.gbps), Some(400.0));
    let four = bound(&nodes).expect("a bound");
    assert_eq!(
        (four.node.as_str(), four.rails, four.gbps),
        ("c", 7, Some(350.0))
    );
    assert_eq!(
        ceiling(Collective::AllReduce, 4, 8, 350.0),
        Some(350.0),
        "the slowest node bounds the ring"
    );
}

#[test]
fn unknown_links_give_no_ceiling_and_say_why() {
    let full = eight_ndr();
    let mut no_rate = eight_ndr();
    no_rate[0].rate_gbps = None;
    let all_down: Vec<NicPort> = (0..8).map(|i| port(i, Some(400.0), false)).collect();
    let veth: Vec<NicPort> = Vec::new();
    for (ports, why) in [
        (Some(no_rate.as_slice()), LinksUnknown::NoRate),
        (Some(all_down.as_slice()), LinksUnknown::NoneUp),
        (Some(veth.as_slice()), LinksUnknown::NoPorts),
        (None, LinksUnknown::NotReported),
    ] {
        let b = bound(&[("a", Some(full.as_slice())), ("x", ports)]).expect("a bound");
        assert_eq!((b.node.as_str(), b.gbps, b.unknown), ("x", None, Some(why)));
        let m = Measured {
            nodes: 2,
            gpus: 8,
            links: Some(&b),
            busbw: vec![(Collective::AllReduce, 300.0)],
        };
        assert!(ceilings(&m).is_empty());
        assert!(gaps(&[m], None).is_empty());
    }
    // The emulated bed: sockets over veth.
    let bed = bound(&[
        ("bed-0", Some(veth.as_slice())),
        ("bed-1", Some(veth.as_slice())),
    ])
    .expect("a bound");
    assert!(
        bed.describe().contains("NCCL runs over sockets (a veth"),
        "{}",
        bed.describe()
    );
}

fn point(nodes: u32, links: &NcclNodesLinks, busbw: f64) -> Measured<'_> {
    Measured {
        nodes,
        gpus: 8,
        links: Some(links),
        busbw: vec![(Collective::AllReduce, busbw)],
    }
}

#[test]
fn a_count_far_below_its_links_or_above_them_is_a_gap_and_one_near_them_is_not() {
    let links = NcclNodesLinks {
        node: "n1".into(),
        rails: 8,
        gbps: Some(400.0),
        unknown: None,
    };
    let points = [
        point(2, &links, 368.0),
        point(4, &links, 150.0),
        point(8, &links, 480.0),
        point(16, &links, 205.0),
    ];
    let c = ceilings(&points[0]);
    assert_eq!(c.len(), 1);
    assert!((c[0].share - 0.92).abs() < 1e-9);
    let g = gaps(&points, Some("rack-a"));
    let found: Vec<(LinkGapKind, u32)> = g.iter().map(|g| (g.kind, g.nodes)).collect();
    assert_eq!(
        found,
        [(LinkGapKind::Below, 4), (LinkGapKind::Above, 8)],
        "{g:#?}"
    );
    assert!(
        g[0].message.starts_with(
            "all_reduce over 4 nodes in block rack-a reached 150.0 GB/s, 38% of the 400.0 GB/s the links allow (slowest node n1 (8 rails, 400.0 GB/s))"
        ),
        "{}",
        g[0].message
    );
    assert!(
        g[1].message.contains("cannot be trusted"),
        "{}",
        g[1].message
    );
    // alltoall above its ceiling is no gap (its bound assumes even traffic); far below is.
    let mut all_to_all = point(8, &links, 480.0);
    all_to_all.busbw = vec![(Collective::AllToAll, 480.0)];
    assert!(gaps(std::slice::from_ref(&all_to_all), None).is_empty());
    all_to_all.busbw = vec![(Collective::AllToAll, 10.0)];
    let below: Vec<LinkGapKind> = gaps(&[all_to_all], None).iter().map(|g| g.kind).collect();
    assert_eq!(below, [LinkGapKind::Below]);
}
