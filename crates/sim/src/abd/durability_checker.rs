//! Replicated memory's world's durability check: each line's highest acknowledged timestamp
//! (or a higher one) is durable where a read or a learning node will find it — when a node
//! joins after learning, and at the end of the run.

use super::world::Node;

/// Whether each line's highest acknowledged timestamp (or a higher one) can still be found:
/// every majority of the nodes with memory — the members, and the nodes down with their memory
/// (a node that lost its memory, or learns, holds nothing that counts and answers in no
/// quorum) — includes one that holds it durably, i.e. fewer than a majority of them lack it.
/// Every quorum a read or a learning node gathers is such a majority. With every node a
/// member (the end of a run) this is "durable on a majority"; while nodes that lost their
/// memory learn, fewer may hold it (a write acked by three of five, two of which lose their
/// memory: the first to rejoin copied it from the one left, and the other still learns).
pub(super) fn durable_on_majority(nodes: &[Node], acked: &[u64]) -> Result<(), String> {
    let majority = nodes.len() / 2 + 1;
    let with_memory = |node: &Node| {
        if node.up {
            node.node().is_member()
        } else {
            // Down: what it held durably when it went down counts if it was a member.
            !node.restart_empty && node.was_member
        }
    };
    for (line, ts) in acked.iter().enumerate() {
        let holding: Vec<usize> = nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| with_memory(node) && node.node().durable_line(line as u32).0 >= *ts)
            .map(|(index, _)| index)
            .collect();
        let lacking = nodes.iter().filter(|node| with_memory(node)).count() - holding.len();
        if lacking >= majority {
            return Err(format!(
                "line {line}'s acknowledged timestamp {ts:#x} (or a later one) is durable on \
                 nodes {holding:?} only: a majority of the nodes with memory lacks it; each \
                 node's durable timestamp: {:?}",
                nodes
                    .iter()
                    .map(|node| node.node().durable_line(line as u32).0)
                    .collect::<Vec<_>>()
            ));
        }
    }
    Ok(())
}
