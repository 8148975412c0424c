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
    /// The half holding `durable` (the other one is written next), and its generation.
    durable_half: u8,
    generation: u64,
    durable: Option<Version>,
    latest: Version,
    /// The version being written (`latest`, or an older one when `waiting`).
    in_flight: Option<Version>,
    /// A newer version waiting for the write in flight.
    waiting: bool,
    /// The table's change number when a version of this key last became durable (0: before
    /// this table was opened).
    changed: u64,
}

/// A key and one of its sequence numbers.
pub type KeySeq = (Vec<u8>, u64);

/// The table's state machine side.
#[derive(Debug)]
pub struct Table {
    geometry: Geometry,
    keys: HashMap<Vec<u8>, Entry>,
    /// Each bucket's key, if it holds one.
    owners: Vec<Option<Vec<u8>>>,
    /// Counts versions made durable since the table was opened (volatile: a sync that
    /// began before a restart starts again).
    change: u64,
    /// Work asked for and batches in flight, each with the keys (and versions) it writes.
    batches: NumberedBatches<TableWork, KeySeq>,
    /// Direct-mapped: a key is a bucket's number (4 bytes, big-endian) and lives in that
    /// bucket, with no probing (the memory node's lines).
    direct: bool,
}

impl Table {
    /// An empty table of `geometry`.
    pub fn new(geometry: Geometry) -> Table {
        Table {
            geometry,
            keys: HashMap::new(),
            owners: vec![None; geometry.buckets as usize],
            change: 0,
            batches: NumberedBatches::default(),
            direct: false,
        }
    }

    /// An empty direct-mapped table: the key of bucket `b` is `b` as 4 big-endian bytes
    /// ([`direct_key`]), and no other key is taken.
    pub fn new_direct(geometry: Geometry) -> Table {
        Table {
            direct: true,
            ..Table::new(geometry)
        }
    }

    /// The direct-mapped table a reopened file holds. A record found in a bucket that is not
    /// its key's (damage) is left out.
    pub fn recover_direct(geometry: Geometry, mut recovered: Recovered) -> Table {
        recovered
            .keys
            .retain(|key, (bucket, ..)| direct_bucket(key) == Some(*bucket));
        Table {
            direct: true,
            ..Table::recover(geometry, recovered)
        }
    }

    /// The table a reopened file holds.
    pub fn recover(geometry: Geometry, recovered: Recovered) -> Table {
        let mut table = Table::new(geometry);
        for (key, (bucket, half, version, generation)) in recovered.keys {
            if let Some(owner) = table.owners.get_mut(bucket as usize) {
                *owner = Some(key.clone());
            }
            table.keys.insert(
                key,
                Entry {
                    bucket,
                    durable_half: half,
                    generation,
                    durable: Some(version.clone()),
                    latest: version,
                    in_flight: None,
                    waiting: false,
                    changed: 0,
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
        self.put(key, version, false)
    }

    /// Make `version` the key's latest whatever the key holds (a joining member takes its
    /// source's version, older or not): `Stale` only if the key holds exactly it already.
    pub fn replace(&mut self, key: &[u8], version: Version) -> Result<Written, Refused> {
        self.put(key, version, true)
    }

    fn put(&mut self, key: &[u8], version: Version, any_seq: bool) -> Result<Written, Refused> {
        if key.is_empty()
            || key.len() > usize::from(self.geometry.key_max)
            || self.direct
                && direct_bucket(key).is_none_or(|bucket| bucket >= self.geometry.buckets)
        {
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
            let stale = if any_seq {
                version == entry.latest
            } else {
                version.seq <= entry.latest.seq
            };
            if stale {
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
        self.owners[bucket as usize] = Some(key.to_vec());
        self.keys.insert(
            key.to_vec(),
            Entry {
                bucket,
                // Both halves are free: the first write goes to half 0.
                durable_half: 1,
                generation: 0,
                durable: None,
                latest: version,
                in_flight: None,
                waiting: false,
                changed: 0,
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
            generation: entry.generation + 1,
            key: key.clone(),
            version: entry.latest.clone(),
        });
        self.batches.wait((key, entry.latest.seq));
    }

    fn free_bucket(&self, key: &[u8]) -> Option<u32> {
        let buckets = self.geometry.buckets;
        if self.direct {
            return direct_bucket(key)
                .filter(|bucket| *bucket < buckets && self.owners[*bucket as usize].is_none());
        }
        let home = key_hash(key) % u64::from(buckets);
        (0..u64::from(PROBE_LIMIT.min(buckets)))
            .map(|probe| ((home + probe) % u64::from(buckets)) as u32)
            .find(|bucket| self.owners[*bucket as usize].is_none())
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
            entry.generation += 1;
            entry.durable = Some(written);
            self.change += 1;
            entry.changed = self.change;
            let waiting = entry.waiting;
            durable.push((key.clone(), seq));
            if waiting {
                self.issue(key);
            }
        }
        durable
    }
}

/// A page of a table's durable versions, for a joining member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// (key, durable version), in bucket order.
    pub entries: Vec<(Vec<u8>, Version)>,
    /// The bucket to look at next (`None`: the table's end).
    pub next: Option<u32>,
    /// The table's change number when the page was read.
    pub change: u64,
}

/// Buckets a page looks at, at most (bounds the work one sync request costs).
pub const PAGE_SCAN: u32 = 4096;

impl Table {
    /// The durable versions of the keys `select` picks that changed after change number
    /// `since` (0: every one), from bucket `cursor` on, until their keys and values would
    /// take more than `budget` bytes (at least one entry fits), or [`PAGE_SCAN`] buckets.
    pub fn page(
        &self,
        select: impl Fn(&[u8]) -> bool,
        since: u64,
        cursor: u32,
        budget: usize,
    ) -> Page {
        let mut entries = Vec::new();
        let mut used = 0;
        let buckets = self.geometry.buckets;
        let mut at = cursor;
        while at < buckets && at - cursor < PAGE_SCAN {
            if let Some(key) = &self.owners[at as usize] {
                let entry = &self.keys[key];
                if let Some(durable) = entry
                    .durable
                    .as_ref()
                    .filter(|_| (since == 0 || entry.changed > since) && select(key))
                {
                    let cost = 16 + key.len() + durable.value.as_ref().map_or(0, Vec::len);
                    if !entries.is_empty() && used + cost > budget {
                        break;
                    }
                    used += cost;
                    entries.push((key.clone(), durable.clone()));
                }
            }
            at += 1;
        }
        Page {
            entries,
            next: (at < buckets).then_some(at),
            change: self.change,
        }
    }

    /// The keys `select` picks (deleted ones included).
    pub fn keys_where(&self, select: impl Fn(&[u8]) -> bool) -> Vec<Vec<u8>> {
        self.keys
            .keys()
            .filter(|key| select(key))
            .cloned()
            .collect()
    }
}

/// The key of bucket `bucket` in a direct-mapped table.
pub fn direct_key(bucket: u32) -> [u8; 4] {
    bucket.to_be_bytes()
}

/// The bucket a direct-mapped table keeps `key` in, if it is a bucket's key.
pub fn direct_bucket(key: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(key.try_into().ok()?))
}

/// FNV-1a of the key, then a final mix.
pub fn key_hash(key: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^ (hash >> 33)
}
