//! Which transport NCCL chose between each pair of GPUs, read from NCCL's own INFO log
//! (`Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read`).

use gpufabric_api::result::{Transport, TransportInfo};
use std::collections::BTreeMap;

/// Transport of one `via ...` word, before NVLink and PCIe P2P are told apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    P2p,
    Shm,
    Net,
    Other,
}

fn classify(via: &str) -> Via {
    let v = via.to_ascii_uppercase();
    if v.starts_with("P2P") {
        Via::P2p
    } else if v.starts_with("SHM") {
        Via::Shm
    } else if v.starts_with("NET") || v.starts_with("COLLNET") {
        Via::Net
    } else {
        Via::Other
    }
}

/// Parses the GPU pairs (ranks, unordered, a < b; in this single-process check rank r is
/// GPU r) and the transport
/// NCCL used between them. Where one pair shows several transports the worst wins (NET
/// over SHM over P2P).
pub(crate) fn parse(log: &str) -> BTreeMap<(u32, u32), Via> {
    let mut out: BTreeMap<(u32, u32), Via> = BTreeMap::new();
    for line in log.lines() {
        let Some(pos) = line.find("Channel ") else {
            continue;
        };
        let rest = &line[pos..];
        let Some(via_pos) = rest.find(" via ") else {
            continue;
        };
        let head = &rest[..via_pos];
        let via = rest[via_pos + 5..].split_whitespace().next().unwrap_or("");
        let Some(arrow) = head.find("->") else {
            continue;
        };
        let (Some(a), Some(b)) = (last_bracket(&head[..arrow]), first_bracket(&head[arrow..]))
        else {
            continue;
        };
        if a == b {
            continue;
        }
        let key = (a.min(b), a.max(b));
        let v = classify(via);
        let rank = |v: Via| match v {
            Via::P2p => 0,
            Via::Other => 1,
            Via::Shm => 2,
            Via::Net => 3,
        };
        let e = out.entry(key).or_insert(v);
        if rank(v) > rank(*e) {
            *e = v;
        }
    }
    out
}

/// The rank before the last `[...]` of `s` (`0[0]`, or `0[1b000]` in older NCCL, whose
/// brackets hold a bus id).
fn last_bracket(s: &str) -> Option<u32> {
    let open = s.rfind('[')?;
    rank_before(&s[..open])
}

/// The rank before the first `[...]` of `s`.
fn first_bracket(s: &str) -> Option<u32> {
    let open = s.find('[')?;
    rank_before(&s[..open])
}

fn rank_before(s: &str) -> Option<u32> {
    let digits: String = s
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().ok()
}

/// Turns parsed pairs into result entries; `nvlink(a, b)` says whether the two GPUs are
/// connected by NVLink (P2P over NVLink vs over PCIe).
pub(crate) fn to_infos(
    pairs: &BTreeMap<(u32, u32), Via>,
    nvlink: &dyn Fn(u32, u32) -> Option<bool>,
) -> Vec<TransportInfo> {
    pairs
        .iter()
        .map(|(&(a, b), via)| TransportInfo {
            a,
            b,
            transport: match via {
                Via::P2p => match nvlink(a, b) {
                    Some(true) => Transport::Nvlink,
                    Some(false) => Transport::Pcie,
                    None => Transport::Unknown,
                },
                Via::Shm => Transport::Shm,
                Via::Net => Transport::Net,
                Via::Other => Transport::Unknown,
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
host:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
host:123:456 [1] NCCL INFO Channel 00/0 : 1[1] -> 2[2] via P2P/CUMEM/read
host:123:456 [2] NCCL INFO Channel 01/0 : 2[2] -> 3[3] via SHM/direct/direct
host:123:456 [3] NCCL INFO Channel 00/1 : 3[3] -> 0[0] via P2P/CUMEM/read
host:123:456 [3] NCCL INFO Channel 02/1 : 3[3] -> 0[0] via NET/IB/0
host:123:456 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1
host:123:456 [0] NCCL INFO Channel 00/1 : 0[0] -> 2[2] via P2P/CUMEM
";

    #[test]
    fn pairs_and_transports_are_read_from_nccl_info_lines() {
        let p = parse(LOG);
        assert_eq!(p.get(&(0, 1)), Some(&Via::P2p));
        assert_eq!(p.get(&(1, 2)), Some(&Via::P2p));
        assert_eq!(p.get(&(2, 3)), Some(&Via::Shm));
        assert_eq!(p.get(&(0, 2)), Some(&Via::P2p));
        // The worst transport seen for a pair wins.
        assert_eq!(p.get(&(0, 3)), Some(&Via::Net));
        assert_eq!(p.len(), 5);
    }

    #[test]
    fn p2p_is_nvlink_only_where_nvml_says_so() {
        let p = parse(LOG);
        let infos = to_infos(&p, &|a, b| Some(!(a == 1 && b == 2)));
        let get = |a, b| {
            infos
                .iter()
                .find(|i| i.a == a && i.b == b)
                .map(|i| i.transport)
        };
        assert_eq!(get(0, 1), Some(Transport::Nvlink));
        assert_eq!(get(1, 2), Some(Transport::Pcie));
        assert_eq!(get(2, 3), Some(Transport::Shm));
        assert_eq!(get(0, 3), Some(Transport::Net));
    }

    #[test]
    fn older_nccl_bus_ids_in_brackets_still_give_ranks() {
        let p = parse("x NCCL INFO Channel 00/0 : 2[1b000] -> 3[1c000] via P2P/IPC/read\n");
        assert_eq!(p.get(&(2, 3)), Some(&Via::P2p));
    }

    #[test]
    fn lines_without_a_channel_connection_are_ignored() {
        assert!(parse("NCCL INFO Channel 00/24 : 0 1 2 3\nnothing here\n").is_empty());
    }
}
