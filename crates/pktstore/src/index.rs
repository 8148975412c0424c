//! The ordered index: a skip list whose bottom level is persistent and lives in the records.
//!
//! Level 0 is a sorted singly linked list threaded through the records' metadata lines (the
//! `next0` field): in the packet store the received datagram's slot *is* the list node, as the
//! paper suggests ("a socket buffer is a linked list of packet metadata"), so inserting a key
//! allocates nothing and copies no key. The upper levels ("express lanes") are volatile, kept
//! here in DRAM together with the first 16 key bytes and the key length per node, so most
//! comparisons never touch persistent memory; recovery rebuilds them in one pass over level 0, which is already sorted.
//!
//! A DRAM hash table over the same nodes answers exact lookups — a read, and the overwrite of a
//! key that exists, the common write — without walking the towers: each node also knows its
//! level-0 predecessor, whose link is the one an overwrite changes. Only a new key (and a
//! removal, which unlinks the towers) searches the skip list. The table hashes the whole key with
//! a per-process random seed (foldhash), so keys chosen by a client cannot force collisions
//! cheaply; it affects no order, so stores behave the same whatever the seed.
//!
//! This structure owns no persistent memory. It keeps a DRAM mirror of level 0 and reports the
//! level-0 links that changed ([`Index::take_dirty`]); the store writes them to the records'
//! metadata after the batch that changed them has committed.

use std::cmp::Ordering;
use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};

pub const MAX_LEVEL: usize = 12;
const NIL: u32 = u32::MAX;
pub const HEAD: u32 = 0;

/// What an overwrite and a level-0 walk touch, 32 bytes, two to a cache line: the record, the
/// level-0 neighbours and the key prefix to compare with.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(32))]
struct Hot {
    record: u32,
    /// The level-0 predecessor (`HEAD` for the first key).
    prev0: u32,
    next0: u32,
    /// The key's length.
    len: u32,
    /// The first 16 key bytes, big-endian, zero-padded.
    high: u64,
    low: u64,
}

impl Hot {
    fn prefix(&self) -> Prefix {
        Prefix {
            high: self.high,
            low: self.low,
            len: self.len,
        }
    }
}

/// What only a search of the towers, a removal or a rehash needs.
#[derive(Debug, Clone)]
struct Cold {
    /// The hash of the whole key, for the exact-lookup table.
    hash: u64,
    /// Links at levels 1 and up.
    up: [u32; MAX_LEVEL - 1],
    height: u8,
    live: bool,
}

/// A level-0 link to write to persistent memory: `from` (a record id, or `None` for the list
/// head) now points at `to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkUpdate {
    pub from: Option<u32>,
    pub to: Option<u32>,
}

/// What [`Index::upsert`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upsert {
    /// The record that held the key before.
    pub displaced: Option<u32>,
    /// The record after the upserted one at level 0.
    pub successor: Option<u32>,
    /// The node now holding the key.
    pub node: u32,
}

/// The first 16 key bytes (big-endian words, zero-padded) and the key's length. Compared as a
/// tuple it orders like the keys, and decides completely for keys of at most 16 bytes; longer
/// keys that tie are compared in persistent memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Prefix {
    high: u64,
    low: u64,
    len: u32,
}

pub fn key_prefix(key: &[u8]) -> Prefix {
    // Loaded as whole words: copying the key into a zero-padded buffer and reading words back
    // stalls on store forwarding, which made this the most expensive step of an overwrite.
    let word = |bytes: &[u8]| -> u64 {
        let mut eight = [0u8; 8];
        eight.copy_from_slice(bytes);
        u64::from_be_bytes(eight)
    };
    let len = key.len();
    let (high, low) = match len {
        16.. => (word(&key[..8]), word(&key[8..16])),
        // The last eight bytes, shifted so that only those after the first eight remain.
        9..=15 => (word(&key[..8]), word(&key[len - 8..]) << (8 * (16 - len))),
        8 => (word(key), 0),
        _ => {
            let mut high = 0u64;
            for (position, &byte) in key.iter().enumerate() {
                high |= u64::from(byte) << (56 - 8 * position);
            }
            (high, 0)
        }
    };
    Prefix {
        high,
        low,
        len: len.min(u32::MAX as usize) as u32,
    }
}

/// Nodes are numbered; node `HEAD` is the list head and holds no key. A node's fields are
/// split over `hot`, `cold` and `dirty`, all indexed by the node's number.
pub struct Index {
    hot: Vec<Hot>,
    cold: Vec<Cold>,
    /// Whether the node's level-0 link changed since the last [`Index::take_dirty`].
    dirty: Vec<bool>,
    /// Live nodes by key hash.
    table: HashTable<u32>,
    hasher: DefaultHashBuilder,
    free_nodes: Vec<u32>,
    dirty_list: Vec<u32>,
    len: usize,
    rng_state: u64,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("len", &self.len)
            .field("nodes", &self.hot.len())
            .field("dirty", &self.dirty_list.len())
            .finish_non_exhaustive()
    }
}

impl Index {
    pub fn new(seed: u64) -> Index {
        let mut index = Index {
            hot: Vec::new(),
            cold: Vec::new(),
            dirty: Vec::new(),
            table: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            free_nodes: Vec::new(),
            dirty_list: Vec::new(),
            len: 0,
            rng_state: seed | 1,
        };
        index.push_node(u32::MAX, &[], 0, MAX_LEVEL as u8);
        index
    }

    /// Keys in the index.
    pub fn len(&self) -> usize {
        self.len
    }

    /// A new unlinked node (reusing a free one), its number.
    fn push_node(&mut self, record: u32, key: &[u8], hash: u64, height: u8) -> u32 {
        let prefix = key_prefix(key);
        let hot = Hot {
            record,
            prev0: NIL,
            next0: NIL,
            len: prefix.len,
            high: prefix.high,
            low: prefix.low,
        };
        let cold = Cold {
            hash,
            up: [NIL; MAX_LEVEL - 1],
            height,
            live: true,
        };
        match self.free_nodes.pop() {
            Some(node) => {
                self.hot[node as usize] = hot;
                self.cold[node as usize] = cold;
                node
            }
            None => {
                self.hot.push(hot);
                self.cold.push(cold);
                self.dirty.push(false);
                (self.hot.len() - 1) as u32
            }
        }
    }

    fn next(&self, node: u32, level: usize) -> u32 {
        match level {
            0 => self.hot[node as usize].next0,
            _ => self.cold[node as usize].up[level - 1],
        }
    }

    fn set_next(&mut self, node: u32, level: usize, to: u32) {
        match level {
            0 => self.hot[node as usize].next0 = to,
            _ => self.cold[node as usize].up[level - 1] = to,
        }
    }

    fn random_height(&mut self) -> u8 {
        // xorshift64: the heights need no cryptographic quality, only independence.
        let mut x = self.rng_state;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng_state = x;
        // One level more per two zero bits: p = 1/4.
        let height = 1 + (x.trailing_zeros() / 2) as usize;
        height.min(MAX_LEVEL) as u8
    }

    fn compare<'k>(
        &self,
        node: u32,
        key: &[u8],
        prefix: Prefix,
        key_of: &impl Fn(u32) -> &'k [u8],
    ) -> Ordering {
        let hot = &self.hot[node as usize];
        let (a, b) = (hot.prefix(), prefix);
        match (a.high, a.low).cmp(&(b.high, b.low)) {
            Ordering::Equal if a.len <= 16 && b.len <= 16 => a.len.cmp(&b.len),
            Ordering::Equal => key_of(hot.record).cmp(key),
            other => other,
        }
    }

    /// The predecessors of `key` at every level and the node holding it, if any.
    fn search<'k>(
        &self,
        key: &[u8],
        key_of: &impl Fn(u32) -> &'k [u8],
    ) -> ([u32; MAX_LEVEL], Option<u32>) {
        let prefix = key_prefix(key);
        let mut preds = [HEAD; MAX_LEVEL];
        let mut current = HEAD;
        let mut found = None;
        for level in (0..MAX_LEVEL).rev() {
            loop {
                let next = self.next(current, level);
                if next == NIL {
                    break;
                }
                match self.compare(next, key, prefix, key_of) {
                    Ordering::Less => current = next,
                    Ordering::Equal => {
                        found = Some(next);
                        break;
                    }
                    Ordering::Greater => break,
                }
            }
            preds[level] = current;
        }
        (preds, found)
    }

    fn hash_of(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The node holding `key`, by the hash table; `hash` is `hash_of(key)`.
    fn find<'k>(&self, key: &[u8], hash: u64, key_of: &impl Fn(u32) -> &'k [u8]) -> Option<u32> {
        let prefix = key_prefix(key);
        self.table
            .find(hash, |&node| {
                self.compare(node, key, prefix, key_of) == Ordering::Equal
            })
            .copied()
    }

    /// Enter a new live node in the hash table.
    fn table_insert(&mut self, node: u32) {
        let cold = &self.cold;
        self.table
            .insert_unique(cold[node as usize].hash, node, |&other| {
                cold[other as usize].hash
            });
    }

    /// The record holding `key`.
    pub fn get<'k>(&self, key: &[u8], key_of: impl Fn(u32) -> &'k [u8]) -> Option<u32> {
        let found = self.find(key, self.hash_of(key), &key_of);
        found.map(|node| self.hot[node as usize].record)
    }

    pub(crate) fn mark_dirty(&mut self, node: u32) {
        let dirty = &mut self.dirty[node as usize];
        if !*dirty {
            *dirty = true;
            self.dirty_list.push(node);
        }
    }

    /// Make `key` map to `record`; returns the record it replaced and the record that now
    /// follows `record` at level 0.
    ///
    /// The predecessor's link is marked dirty; `record`'s own link is not: the caller writes
    /// `successor` into the record it is creating (the store, into the metadata line it flushes
    /// before the commit), so the link is not written twice. A later change of the batch that
    /// gives `record` another successor marks it then. [`Index::mark_dirty`] the returned node
    /// where the record's link may be stale (redoing a batch at recovery).
    pub fn upsert<'k>(
        &mut self,
        key: &[u8],
        record: u32,
        key_of: impl Fn(u32) -> &'k [u8],
    ) -> Upsert {
        let hash = self.hash_of(key);
        if let Some(node) = self.find(key, hash, &key_of) {
            let hot = &mut self.hot[node as usize];
            let old = std::mem::replace(&mut hot.record, record);
            let prev = hot.prev0;
            // The predecessor's link now names the new record. The new record's own link is
            // the caller's to write (see above).
            self.mark_dirty(prev);
            return Upsert {
                displaced: Some(old),
                successor: self.successor(node),
                node,
            };
        }
        let (preds, _) = self.search(key, &key_of);
        let height = self.random_height();
        let node = self.push_node(record, key, hash, height);
        for (level, &pred) in preds.iter().enumerate().take(usize::from(height)) {
            self.set_next(node, level, self.next(pred, level));
            self.set_next(pred, level, node);
        }
        let next = self.hot[node as usize].next0;
        self.hot[node as usize].prev0 = preds[0];
        if next != NIL {
            self.hot[next as usize].prev0 = node;
        }
        self.table_insert(node);
        self.mark_dirty(preds[0]);
        self.len += 1;
        Upsert {
            displaced: None,
            successor: self.successor(node),
            node,
        }
    }

    fn successor(&self, node: u32) -> Option<u32> {
        let next = self.hot[node as usize].next0;
        (next != NIL).then(|| self.hot[next as usize].record)
    }

    /// Remove `key`; returns the record that held it.
    pub fn remove<'k>(&mut self, key: &[u8], key_of: impl Fn(u32) -> &'k [u8]) -> Option<u32> {
        let (preds, found) = self.search(key, &key_of);
        let node = found?;
        let height = usize::from(self.cold[node as usize].height);
        for (level, &pred) in preds.iter().enumerate().take(height) {
            if self.next(pred, level) == node {
                self.set_next(pred, level, self.next(node, level));
            }
        }
        let next = self.hot[node as usize].next0;
        if next != NIL {
            self.hot[next as usize].prev0 = preds[0];
        }
        let hash = self.cold[node as usize].hash;
        if let Ok(entry) = self.table.find_entry(hash, |&other| other == node) {
            entry.remove();
        }
        self.mark_dirty(preds[0]);
        self.cold[node as usize].live = false;
        if !self.dirty[node as usize] {
            self.free_nodes.push(node);
        }
        self.len -= 1;
        Some(self.hot[node as usize].record)
    }

    /// The level-0 links changed since the last call, as they are now.
    pub fn take_dirty(&mut self, out: &mut Vec<LinkUpdate>) {
        out.clear();
        // By index, so the list keeps its capacity (no allocation per batch).
        for position in 0..self.dirty_list.len() {
            let node = self.dirty_list[position];
            self.dirty[node as usize] = false;
            if !self.cold[node as usize].live {
                // Removed after it was marked: its record left the list, its link is moot.
                self.free_nodes.push(node);
                continue;
            }
            let from = (node != HEAD).then_some(self.hot[node as usize].record);
            out.push(LinkUpdate {
                from,
                to: self.successor(node),
            });
        }
        self.dirty_list.clear();
    }

    /// The records in key order from the first key ≥ `start`.
    pub fn records_from<'k>(
        &self,
        start: &[u8],
        key_of: impl Fn(u32) -> &'k [u8],
    ) -> impl Iterator<Item = u32> + '_ {
        let (preds, found) = self.search(start, &key_of);
        self.walk(found.unwrap_or(self.hot[preds[0] as usize].next0))
    }

    /// Every record, in key order.
    pub fn records(&self) -> impl Iterator<Item = u32> + '_ {
        self.walk(self.hot[HEAD as usize].next0)
    }

    fn walk(&self, first: u32) -> impl Iterator<Item = u32> + '_ {
        let mut current = first;
        std::iter::from_fn(move || {
            if current == NIL {
                return None;
            }
            let hot = &self.hot[current as usize];
            current = hot.next0;
            Some(hot.record)
        })
    }
}

#[cfg(any(test, debug_assertions))]
impl Index {
    /// Every level-0 node's predecessor is the node linking to it, and the hash table holds
    /// exactly the live nodes.
    pub(crate) fn check_links(&self) -> Result<(), String> {
        let mut previous = HEAD;
        let mut current = self.hot[HEAD as usize].next0;
        let mut count = 0;
        while current != NIL {
            let node = &self.hot[current as usize];
            if node.prev0 != previous {
                return Err(format!(
                    "node {current}: prev0 {} not {previous}",
                    node.prev0
                ));
            }
            let hash = self.cold[current as usize].hash;
            let in_table = self.table.find(hash, |&other| other == current).is_some();
            if !in_table {
                return Err(format!("node {current} missing from the hash table"));
            }
            count += 1;
            previous = current;
            current = node.next0;
        }
        if count != self.len || self.table.len() != self.len {
            return Err(format!(
                "{count} nodes at level 0, {} in the table, len {}",
                self.table.len(),
                self.len
            ));
        }
        Ok(())
    }
}

/// Builds an index from records given in increasing key order.
#[derive(Debug)]
pub struct Builder {
    tails: [u32; MAX_LEVEL],
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            tails: [HEAD; MAX_LEVEL],
        }
    }
}

impl Builder {
    pub fn push(&mut self, index: &mut Index, key: &[u8], record: u32) {
        let height = index.random_height();
        let hash = index.hash_of(key);
        let node = index.push_node(record, key, hash, height);
        index.hot[node as usize].prev0 = self.tails[0];
        for level in 0..usize::from(height) {
            index.set_next(self.tails[level], level, node);
            self.tails[level] = node;
        }
        index.table_insert(node);
        index.len += 1;
    }

    /// The last node pushed must have its level-0 link rewritten (recovery skipped records
    /// after it).
    pub fn mark_tail_dirty(&self, index: &mut Index) {
        index.mark_dirty(self.tails[0]);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn behaves_like_a_sorted_map(ops in proptest::collection::vec((0u8..3, 0u16..64), 0..300)) {
            // Record i holds key keys[i]; a key's bytes are its number in decimal, so many
            // share prefixes and lengths differ.
            let mut keys: Vec<Vec<u8>> = Vec::new();
            let mut index = Index::new(7);
            let mut model: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
            // The persistent level 0 as the store writes it: a new record's link from
            // `Upsert::successor`, every other change from the dirty links.
            let mut persistent: BTreeMap<Option<u32>, Option<u32>> = BTreeMap::new();
            let mut links = Vec::new();
            for (op, number) in ops {
                // Short keys decide on the DRAM prefix alone; long ones share 16 bytes and
                // are compared in full.
                let key = if number % 2 == 0 {
                    format!("k{number}").into_bytes()
                } else {
                    format!("shared-prefix-of-16k{number}").into_bytes()
                };
                if op < 2 {
                    keys.push(key.clone());
                    let record = (keys.len() - 1) as u32;
                    let old = index.upsert(&key, record, |r| keys[r as usize].as_slice());
                    prop_assert_eq!(old.displaced, model.insert(key.clone(), record));
                    let next = model.range(key.clone()..).nth(1).map(|(_, r)| *r);
                    prop_assert_eq!(old.successor, next);
                    persistent.insert(Some(record), old.successor);
                } else {
                    let old = index.remove(&key, |r| keys[r as usize].as_slice());
                    prop_assert_eq!(old, model.remove(&key));
                }
                // Commit after some operations only, so a batch changes a record's successor
                // after its own link was written.
                if number % 3 == 0 {
                    index.take_dirty(&mut links);
                    for link in &links {
                        persistent.insert(link.from, link.to);
                    }
                    let mut walked = Vec::new();
                    let mut at = persistent.get(&None).copied().flatten();
                    while let Some(record) = at {
                        prop_assert!(walked.len() <= model.len(), "the persistent list loops");
                        walked.push(record);
                        at = persistent.get(&Some(record)).copied().flatten();
                    }
                    let expected: Vec<u32> = model.values().copied().collect();
                    prop_assert_eq!(walked, expected);
                }
                prop_assert_eq!(index.check_links(), Ok(()));
            }
            let in_order: Vec<u32> = index.records().collect();
            let expected: Vec<u32> = model.values().copied().collect();
            prop_assert_eq!(in_order, expected);
            prop_assert_eq!(index.len(), model.len());
            for (key, record) in &model {
                prop_assert_eq!(index.get(key, |r| keys[r as usize].as_slice()), Some(*record));
            }
            let from: Vec<u32> = index.records_from(b"k3", |r| keys[r as usize].as_slice()).collect();
            let expected_from: Vec<u32> = model.range(b"k3".to_vec()..).map(|(_, r)| *r).collect();
            prop_assert_eq!(from, expected_from);
        }
    }

    #[test]
    fn dirty_links_describe_level_zero() {
        let keys: Vec<&[u8]> = vec![b"b", b"a", b"c"];
        let mut index = Index::new(1);
        let mut links = Vec::new();
        let mut successors = Vec::new();
        for record in 0..3u32 {
            let upsert = index.upsert(keys[record as usize], record, |r| keys[r as usize]);
            successors.push(upsert.successor);
        }
        // Each new record's successor when it was linked: b had none, a had b, c has none.
        assert_eq!(successors, vec![None, Some(0), None]);
        index.take_dirty(&mut links);
        // Head -> a(1) -> b(0) -> c(2): the head and b changed after their records' links
        // were written; a's and c's did not.
        let mut map: BTreeMap<Option<u32>, Option<u32>> = BTreeMap::new();
        for link in &links {
            map.insert(link.from, link.to);
        }
        assert_eq!(map.len(), 2, "{links:?}");
        assert_eq!(map[&None], Some(1));
        assert_eq!(map[&Some(0)], Some(2));
        index.remove(b"b", |r| keys[r as usize]);
        index.take_dirty(&mut links);
        assert_eq!(
            links,
            vec![LinkUpdate {
                from: Some(1),
                to: Some(2)
            }]
        );
    }

    proptest! {
        #[test]
        fn key_prefix_is_the_zero_padded_first_sixteen_bytes(
            a in proptest::collection::vec(any::<u8>(), 0..40),
            b in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let mut padded = [0u8; 16];
            let len = a.len().min(16);
            padded[..len].copy_from_slice(&a[..len]);
            let prefix = key_prefix(&a);
            prop_assert_eq!(prefix.high, u64::from_be_bytes(padded[..8].try_into().unwrap()));
            prop_assert_eq!(prefix.low, u64::from_be_bytes(padded[8..].try_into().unwrap()));
            prop_assert_eq!(prefix.len as usize, a.len());
            // They order like the keys (with the lengths, for keys of at most 16 bytes).
            let other = key_prefix(&b);
            match (prefix.high, prefix.low).cmp(&(other.high, other.low)) {
                std::cmp::Ordering::Equal if a.len() <= 16 && b.len() <= 16 => {
                    prop_assert_eq!(a.len().cmp(&b.len()), a.cmp(&b));
                }
                std::cmp::Ordering::Equal => {}
                order => prop_assert_eq!(order, a.cmp(&b)),
            }
        }
    }

    #[test]
    fn builder_matches_inserts() {
        let keys: Vec<Vec<u8>> = (0..500u32)
            .map(|i| format!("{i:05}").into_bytes())
            .collect();
        let mut index = Index::new(3);
        let mut builder = Builder::default();
        for (record, key) in keys.iter().enumerate() {
            builder.push(&mut index, key, record as u32);
        }
        assert_eq!(index.len(), 500);
        for (record, key) in keys.iter().enumerate() {
            assert_eq!(
                index.get(key, |r| keys[r as usize].as_slice()),
                Some(record as u32)
            );
        }
        assert_eq!(index.get(b"x", |r| keys[r as usize].as_slice()), None);
        assert_eq!(index.check_links(), Ok(()));
        // Overwrites and removals after a build keep level 0 and the table in step.
        let mut records: Vec<Vec<u8>> = keys.clone();
        for number in (0..500u32).step_by(3) {
            records.push(keys[number as usize].clone());
            let record = (records.len() - 1) as u32;
            let upsert = index.upsert(&keys[number as usize], record, |r| {
                records[r as usize].as_slice()
            });
            assert_eq!(upsert.displaced, Some(number));
        }
        for number in (1..500u32).step_by(7) {
            assert!(index
                .remove(&keys[number as usize], |r| records[r as usize].as_slice())
                .is_some());
        }
        assert_eq!(index.check_links(), Ok(()));
    }
}
