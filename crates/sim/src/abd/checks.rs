//! The replicated memory's world's checks besides linearizability: every store a coordinator
//! sent (a timestamp never stored with two values; a node's durable line is one some
//! coordinator stored) and acknowledged writes durable on a majority.

use std::collections::HashMap;

use pmnet_abd::{MemNode, LINE};
use pmnet_proto::Time;
use pmnet_wire::abd::{Store, ABD_STORE};
use pmnet_wire::{Header, PacketType};

use super::{line_value, Node, LINES};

/// The world's record of every store a coordinator sent: (line, timestamp) → the values stored
/// with it (one, unless timestamps clash: a multi-line write stamps each of its lines with one
/// timestamp).
#[derive(Default)]
pub(super) struct Stores {
    by_ts: HashMap<(u32, u64), Vec<[u8; LINE]>>,
    /// Each written value's timestamps (a value is one write's, of one line).
    ts_of_value: HashMap<u64, Vec<u64>>,
    /// A timestamp stored with two different values (the first seen).
    pub(super) clash: Option<String>,
}

impl Stores {
    /// Note the stores in a datagram a coordinator sends.
    pub(super) fn note(&mut self, now: Time, bytes: &[u8]) {
        let Ok((header, payload)) = Header::parse(bytes) else {
            return;
        };
        if header.packet_type != PacketType::Reserved(ABD_STORE) {
            return;
        }
        let Ok(store) = Store::parse(payload) else {
            return;
        };
        for i in 0..usize::from(store.count) {
            let (ts, value) = store.line(i);
            let value: [u8; LINE] = value.try_into().expect("64 bytes");
            let line = store.first + i as u32;
            let values = self.by_ts.entry((line, ts)).or_default();
            if !values.contains(&value) {
                if !values.is_empty() && self.clash.is_none() {
                    self.clash = Some(format!(
                        "{now}: line {line}: timestamp {ts:#x} (counter {}, writer {}) stored \
                         with two values, {:?} and {:?}",
                        ts >> 16,
                        ts as u16,
                        line_value(&values[0]),
                        line_value(&value),
                    ));
                }
                values.push(value);
                if let Some(v) = line_value(&value) {
                    self.ts_of_value.entry(v).or_default().push(ts);
                }
            }
        }
    }

    /// The timestamp a written value was stored with (the first, if stored with several).
    pub(super) fn ts_of(&self, value: u64) -> Option<u64> {
        self.ts_of_value.get(&value)?.iter().min().copied()
    }

    /// Whether every durable line of `node` is a (timestamp, value) some coordinator stored.
    pub(super) fn check_node(&self, node: &MemNode, what: &str) -> Result<(), String> {
        for line in 0..LINES {
            let (ts, value) = node.durable_line(line);
            if ts == 0 {
                if value.iter().any(|byte| *byte != 0) {
                    return Err(format!("{what}: line {line} holds bytes at timestamp 0"));
                }
                continue;
            }
            let stored = self
                .by_ts
                .get(&(line, ts))
                .is_some_and(|values| values.iter().any(|v| v[..] == value[..]));
            if !stored {
                return Err(format!(
                    "{what}: line {line} holds timestamp {ts:#x} with {:?}, which no \
                     coordinator stored with it (stored with it: {:?})",
                    line_value(&value),
                    self.by_ts
                        .get(&(line, ts))
                        .map(|values| values.iter().map(|v| line_value(v)).collect::<Vec<_>>())
                ));
            }
        }
        Ok(())
    }
}

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
