//! The key-value table as a chain node's state machine sees it: each key's durable version
//! (on the medium), its latest (perhaps still being written), and the persistence work that
//! moves one to the other, in numbered batches. No I/O: [`crate::TableFile`] carries the work
//! out, the runtime on a mapped file, the simulator on a simulated region.
//!
//! A key has at most one write in flight: its record goes to the half of the key's bucket that
//! does not hold the durable version, and a later write waits until that one is durable (a
//! still later one replaces the waiting one: only the newest matters), so a crash never tears
//! the version a node acknowledged.

use std::collections::HashMap;

use pmnet_proto::{NumberedBatches, PersistBatch};

use crate::file::{Geometry, Recovered, TableWork, Version};

/// Buckets probed from a key's home bucket for a free one, at most.
pub const PROBE_LIMIT: u32 = 64;

/// What [`Table::write`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// The key holds this sequence number or a newer one already: nothing changes (a
    /// duplicate, or a write the network reordered behind a newer one).
    Stale,
    /// The version is the key's latest; it is durable once [`Table::on_persisted`] names it.
    Pending,
}

/// Why a write was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No free bucket near the key's home: the table is full there.
    Full,
    /// The key is empty or longer than the table's largest key.
    BadKey,
    /// The value is longer than the table's largest value.
    ValueTooLarge,
}

#[derive(Debug)]
struct Entry {
    bucket: u32,
    /// The half holding `durable` (the other one is written next).
    durable_half: u8,
    durable: Option<Version>,
    latest: Version,
    /// The version being written (`latest`, or an older one when `waiting`).
    in_flight: Option<Version>,
    /// A newer version waiting for the write in flight.
    waiting: bool,
}

/// A key and one of its sequence numbers.
pub type KeySeq = (Vec<u8>, u64);

/// The table's state machine side.
#[derive(Debug)]
pub struct Table {
    geometry: Geometry,
    keys: HashMap<Vec<u8>, Entry>,
    used: Vec<bool>,
    /// Work asked for and batches in flight, each with the keys (and versions) it writes.
    batches: NumberedBatches<TableWork, KeySeq>,
}

impl Table {
    /// An empty table of `geometry`.
    pub fn new(geometry: Geometry) -> Table {
        Table {
            geometry,
            keys: HashMap::new(),
            used: vec![false; geometry.buckets as usize],
            batches: NumberedBatches::default(),
        }
    }

    /// The table a reopened file holds.
    pub fn recover(geometry: Geometry, recovered: Recovered) -> Table {
        let mut table = Table::new(geometry);
        for (key, (bucket, half, version)) in recovered.keys {
            if let Some(used) = table.used.get_mut(bucket as usize) {
                *used = true;
            }
            table.keys.insert(
                key,
                Entry {
                    bucket,
                    durable_half: half,
                    durable: Some(version.clone()),
                    latest: version,
                    in_flight: None,
                    waiting: false,
                },
            );
        }
        table
    }

    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Keys held (deleted ones included: a deletion keeps the key's sequence number).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key's durable version on this node.
    pub fn durable(&self, key: &[u8]) -> Option<&Version> {
        self.keys.get(key).and_then(|entry| entry.durable.as_ref())
    }

    /// The key's latest version on this node, durable or not.
    pub fn latest(&self, key: &[u8]) -> Option<&Version> {
        self.keys.get(key).map(|entry| &entry.latest)
    }

    /// Whether the key's latest version is durable (no write of it in flight or waiting).
    pub fn is_clean(&self, key: &[u8]) -> bool {
        self.keys
            .get(key)
            .is_none_or(|entry| entry.in_flight.is_none() && !entry.waiting)
    }

    /// Make `version` the key's latest, if it is newer than what the key holds.
    pub fn write(&mut self, key: &[u8], version: Version) -> Result<Written, Refused> {
        if key.is_empty() || key.len() > usize::from(self.geometry.key_max) {
            return Err(Refused::BadKey);
        }
        if version
            .value
            .as_ref()
            .is_some_and(|value| value.len() > usize::from(self.geometry.value_max))
        {
            return Err(Refused::ValueTooLarge);
        }
        if let Some(entry) = self.keys.get_mut(key) {
            if version.seq <= entry.latest.seq {
                return Ok(Written::Stale);
            }
            entry.latest = version;
            if entry.in_flight.is_some() {
                entry.waiting = true;
            } else {
                self.issue(key.to_vec());
            }
            return Ok(Written::Pending);
        }
        let bucket = self.free_bucket(key).ok_or(Refused::Full)?;
        self.used[bucket as usize] = true;
        self.keys.insert(
            key.to_vec(),
            Entry {
                bucket,
                // Both halves are free: the first write goes to half 0.
                durable_half: 1,
                durable: None,
                latest: version,
                in_flight: None,
                waiting: false,
            },
        );
        self.issue(key.to_vec());
        Ok(Written::Pending)
    }

    /// Write the key's latest version to the half that does not hold its durable one.
    fn issue(&mut self, key: Vec<u8>) {
        let entry = self.keys.get_mut(&key).expect("issued for a held key");
        debug_assert!(entry.in_flight.is_none());
        entry.in_flight = Some(entry.latest.clone());
        entry.waiting = false;
        self.batches.push(TableWork {
            bucket: entry.bucket,
            half: 1 - entry.durable_half,
            key: key.clone(),
            version: entry.latest.clone(),
        });
        self.batches.wait((key, entry.latest.seq));
    }

    fn free_bucket(&self, key: &[u8]) -> Option<u32> {
        let buckets = self.geometry.buckets;
        let home = key_hash(key) % u64::from(buckets);
        (0..u64::from(PROBE_LIMIT.min(buckets)))
            .map(|probe| ((home + probe) % u64::from(buckets)) as u32)
            .find(|bucket| !self.used[*bucket as usize])
    }

    /// The work asked for since the last batch, if any.
    pub fn poll_persist(&mut self) -> Option<PersistBatch<TableWork>> {
        self.batches.poll()
    }

    /// Batches through `through` are durable: the (key, sequence number) pairs durable now,
    /// in the order written. A key with a newer version waiting has it written next.
    pub fn on_persisted(&mut self, through: u64) -> Vec<KeySeq> {
        let mut durable = Vec::new();
        for (key, seq) in self.batches.durable_through(through) {
            let entry = self.keys.get_mut(&key).expect("written for a held key");
            let written = entry.in_flight.take().expect("a write in flight");
            debug_assert_eq!(written.seq, seq);
            entry.durable_half = 1 - entry.durable_half;
            entry.durable = Some(written);
            let waiting = entry.waiting;
            durable.push((key.clone(), seq));
            if waiting {
                self.issue(key);
            }
        }
        durable
    }
}

/// FNV-1a of the key, then a final mix.
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^ (hash >> 33)
}
