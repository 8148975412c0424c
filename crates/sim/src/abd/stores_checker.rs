//! Replicated memory's world's record of every store a coordinator sent, and the checks on
//! it: a timestamp is never stored with two values of a line, and a node's durable line (after
//! every crash, when a node joins, at the end) is a (timestamp, value) some coordinator stored
//! — a line is never torn from its timestamp.

use std::collections::HashMap;

use pmnet_abd::{MemNode, LINE};
use pmnet_proto::Time;
use pmnet_wire::abd::{Store, ABD_STORE};
use pmnet_wire::{Header, PacketType};

use super::line::line_value;
use super::LINES;

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
    /// Datagrams a coordinator sent that the checker could not open (must stay 0).
    pub(super) unreadable: u64,
}

impl Stores {
    /// Whether the checker read every datagram the coordinators sent (sealed ones opened).
    pub(super) fn all_read(&self) -> Result<(), String> {
        match self.unreadable {
            0 => Ok(()),
            count => Err(format!(
                "{count} datagrams a coordinator sent could not be read"
            )),
        }
    }

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
