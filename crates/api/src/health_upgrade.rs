//! A node's health as an earlier version stored it: the quarantine flags the standing
//! replaced, read once when a FabricTest's status is read, and never written again.

use crate::standing::Standing;
use crate::test::{EarlierFlags, NodeHealth};
use serde::{Deserialize, Deserializer};

/// `status.nodes` as stored, each entry brought up to date ([`upgrade`]).
pub(crate) fn nodes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<NodeHealth>, D::Error> {
    let stored: Vec<NodeHealth> = Vec::deserialize(d)?;
    Ok(stored.into_iter().map(upgrade).collect())
}

/// The one place the earlier flags are read. A node an earlier version marked quarantined
/// (the flag was what the executor left, so it is believed) is quarantined, a repeat
/// offender when it was marked so, whatever standing was stored beside the flags or none
/// (an object written before the standing existed reads `NotMeasured`). Otherwise the
/// stored standing stands. The flags are dropped.
pub fn upgrade(mut h: NodeHealth) -> NodeHealth {
    let EarlierFlags {
        quarantined,
        repeat_offender,
    } = std::mem::take(&mut h.earlier);
    if quarantined == Some(true) {
        h.standing = if repeat_offender == Some(true) {
            Standing::RepeatOffender
        } else if h.standing.is_quarantined() {
            h.standing
        } else {
            Standing::Quarantined {
                hardware: h.standing.hardware(),
            }
        };
    }
    h
}

#[cfg(test)]
mod tests {
    use crate::standing::Standing;
    use crate::test::FabricTestStatus;

    /// A status as the release before the standing wrote it (no `standing`), and as the one
    /// after it wrote it (the flags beside the standing).
    const EARLIER: &str = r#"{
        "quarantinedCount": 3,
        "quarantinedNodes": ["cordoned", "again", "lagging"],
        "repeatOffenders": ["again"],
        "nodes": [
            {"node": "cordoned", "verdict": "Failed", "consecutiveFailures": 2,
             "consecutivePasses": 0, "quarantined": true,
             "quarantinedSince": "2026-01-02T03:04:05Z"},
            {"node": "again", "verdict": "Passed", "consecutiveFailures": 0,
             "consecutivePasses": 1, "quarantined": true, "repeatOffender": true,
             "quarantineTimes": ["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"]},
            {"node": "held", "verdict": "Failed", "consecutiveFailures": 2,
             "consecutivePasses": 0, "quarantined": false, "heldBack": "over budget",
             "standing": {"state": "HeldBack", "why": "over budget"}},
            {"node": "lagging", "verdict": "NotMeasured", "consecutiveFailures": 2,
             "consecutivePasses": 0, "quarantined": true,
             "standing": {"state": "Failing", "hardware": true}},
            {"node": "fine", "verdict": "Passed", "consecutiveFailures": 0,
             "consecutivePasses": 4, "quarantined": false, "standing": {"state": "Passing"}}
        ]
    }"#;

    #[test]
    fn a_status_an_earlier_version_wrote_reads_the_same_quarantines_as_standings() {
        let status: FabricTestStatus = serde_json::from_str(EARLIER).expect("an earlier status");
        let read: Vec<(&str, &Standing)> = status
            .nodes
            .iter()
            .map(|h| (h.node.as_str(), &h.standing))
            .collect();
        assert_eq!(
            read,
            [
                ("cordoned", &Standing::Quarantined { hardware: false }),
                ("again", &Standing::RepeatOffender),
                (
                    "held",
                    &Standing::HeldBack {
                        why: "over budget".into(),
                        hardware: false
                    }
                ),
                ("lagging", &Standing::Quarantined { hardware: true }),
                ("fine", &Standing::Passing),
            ]
        );
        // Every node the status lists as quarantined reads quarantined, and no other.
        for h in &status.nodes {
            assert_eq!(
                h.standing.is_quarantined(),
                status.quarantined_nodes.contains(&h.node),
                "{}",
                h.node
            );
        }
    }

    #[test]
    fn the_earlier_flags_are_never_written_back() {
        let status: FabricTestStatus = serde_json::from_str(EARLIER).expect("an earlier status");
        let written = serde_json::to_value(&status).expect("serializes");
        for n in written["nodes"].as_array().expect("nodes") {
            assert!(n.get("quarantined").is_none(), "{n}");
            assert!(n.get("repeatOffender").is_none(), "{n}");
        }
        let again: FabricTestStatus = serde_json::from_value(written).expect("reads back");
        assert_eq!(again, status);
    }
}
