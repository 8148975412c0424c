//! The ordered index: a skip list whose bottom level is persistent and lives in the records.
//!
//! Level 0 is a sorted singly linked list threaded through the records' metadata lines (the
//! `next0` field): in the packet store the received datagram's slot *is* the list node, as the
//! paper suggests ("a socket buffer is a linked list of packet metadata"), so inserting a key
//! allocates nothing and copies no key. The upper levels ("express lanes") are volatile, kept
//! here in DRAM together with the first 16 key bytes and the key length per node, so most
//! comparisons never touch persistent memory; recovery rebuilds them in one pass over level 0, which is already sorted.
//!
//! This structure owns no persistent memory. It keeps a DRAM mirror of level 0 and reports the
//! level-0 links that changed ([`Index::take_dirty`]); the store writes them to the records'
//! metadata after the batch that changed them has committed.

use std::cmp::Ordering;

pub const MAX_LEVEL: usize = 12;
const NIL: u32 = u32::MAX;
pub const HEAD: u32 = 0;

#[derive(Debug, Clone)]
struct Node {
    record: u32,
    prefix: Prefix,
    height: u8,
    live: bool,
    dirty: bool,
    next: [u32; MAX_LEVEL],
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
    let mut bytes = [0u8; 16];
    let len = key.len().min(16);
    bytes[..len].copy_from_slice(&key[..len]);
    let mut high = [0u8; 8];
    let mut low = [0u8; 8];
    high.copy_from_slice(&bytes[..8]);
    low.copy_from_slice(&bytes[8..]);
    Prefix {
        high: u64::from_be_bytes(high),
        low: u64::from_be_bytes(low),
        len: key.len().min(u32::MAX as usize) as u32,
    }
}

#[derive(Debug)]
pub struct Index {
    nodes: Vec<Node>,
    free_nodes: Vec<u32>,
    dirty: Vec<u32>,
    len: usize,
    rng_state: u64,
}

impl Index {
    pub fn new(seed: u64) -> Index {
        let head = Node {
            record: u32::MAX,
            prefix: key_prefix(&[]),
            height: MAX_LEVEL as u8,
            live: true,
            dirty: false,
            next: [NIL; MAX_LEVEL],
        };
        Index {
            nodes: vec![head],
            free_nodes: Vec::new(),
            dirty: Vec::new(),
            len: 0,
            rng_state: seed | 1,
        }
    }

    /// Keys in the index.
    pub fn len(&self) -> usize {
        self.len
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
        let node = &self.nodes[node as usize];
        let (a, b) = (node.prefix, prefix);
        match (a.high, a.low).cmp(&(b.high, b.low)) {
            Ordering::Equal if a.len <= 16 && b.len <= 16 => a.len.cmp(&b.len),
            Ordering::Equal => key_of(node.record).cmp(key),
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
                let next = self.nodes[current as usize].next[level];
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

    /// The record holding `key`.
    pub fn get<'k>(&self, key: &[u8], key_of: impl Fn(u32) -> &'k [u8]) -> Option<u32> {
        let (_, found) = self.search(key, &key_of);
        found.map(|node| self.nodes[node as usize].record)
    }

    pub(crate) fn mark_dirty(&mut self, node: u32) {
        let entry = &mut self.nodes[node as usize];
        if !entry.dirty {
            entry.dirty = true;
            self.dirty.push(node);
        }
    }

    /// Make `key` map to `record`; returns the record it replaced and the record that now
    /// follows `record` at level 0.
    pub fn upsert<'k>(
        &mut self,
        key: &[u8],
        record: u32,
        key_of: impl Fn(u32) -> &'k [u8],
    ) -> Upsert {
        let (preds, found) = self.search(key, &key_of);
        if let Some(node) = found {
            let old = std::mem::replace(&mut self.nodes[node as usize].record, record);
            // The predecessor's link now names the new record, and the new record's own link
            // must name the successor.
            self.mark_dirty(preds[0]);
            self.mark_dirty(node);
            return Upsert {
                displaced: Some(old),
                successor: self.successor(node),
            };
        }
        let height = self.random_height();
        let node = Node {
            record,
            prefix: key_prefix(key),
            height,
            live: true,
            dirty: false,
            next: [NIL; MAX_LEVEL],
        };
        let index = match self.free_nodes.pop() {
            Some(index) => {
                self.nodes[index as usize] = node;
                index
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        for (level, &pred) in preds.iter().enumerate().take(usize::from(height)) {
            self.nodes[index as usize].next[level] = self.nodes[pred as usize].next[level];
            self.nodes[pred as usize].next[level] = index;
        }
        self.mark_dirty(preds[0]);
        self.mark_dirty(index);
        self.len += 1;
        Upsert {
            displaced: None,
            successor: self.successor(index),
        }
    }

    fn successor(&self, node: u32) -> Option<u32> {
        let next = self.nodes[node as usize].next[0];
        (next != NIL).then(|| self.nodes[next as usize].record)
    }

    /// Remove `key`; returns the record that held it.
    pub fn remove<'k>(&mut self, key: &[u8], key_of: impl Fn(u32) -> &'k [u8]) -> Option<u32> {
        let (preds, found) = self.search(key, &key_of);
        let node = found?;
        let height = usize::from(self.nodes[node as usize].height);
        for (level, &pred) in preds.iter().enumerate().take(height) {
            if self.nodes[pred as usize].next[level] == node {
                self.nodes[pred as usize].next[level] = self.nodes[node as usize].next[level];
            }
        }
        self.mark_dirty(preds[0]);
        let entry = &mut self.nodes[node as usize];
        entry.live = false;
        let record = entry.record;
        if !entry.dirty {
            self.free_nodes.push(node);
        }
        self.len -= 1;
        Some(record)
    }

    /// The level-0 links changed since the last call, as they are now.
    pub fn take_dirty(&mut self, out: &mut Vec<LinkUpdate>) {
        out.clear();
        for node in std::mem::take(&mut self.dirty) {
            let entry = &mut self.nodes[node as usize];
            entry.dirty = false;
            if !entry.live {
                // Removed after it was marked: its record left the list, its link is moot.
                self.free_nodes.push(node);
                continue;
            }
            let next = entry.next[0];
            let from = (node != HEAD).then_some(entry.record);
            let to = (next != NIL).then(|| self.nodes[next as usize].record);
            out.push(LinkUpdate { from, to });
        }
    }

    /// The records in key order from the first key ≥ `start`.
    pub fn records_from<'k>(
        &self,
        start: &[u8],
        key_of: impl Fn(u32) -> &'k [u8],
    ) -> impl Iterator<Item = u32> + '_ {
        let (preds, found) = self.search(start, &key_of);
        let first = found.unwrap_or(self.nodes[preds[0] as usize].next[0]);
        let mut current = first;
        std::iter::from_fn(move || {
            if current == NIL {
                return None;
            }
            let node = &self.nodes[current as usize];
            current = node.next[0];
            Some(node.record)
        })
    }

    /// Every record, in key order.
    pub fn records(&self) -> impl Iterator<Item = u32> + '_ {
        let mut current = self.nodes[HEAD as usize].next[0];
        std::iter::from_fn(move || {
            if current == NIL {
                return None;
            }
            let node = &self.nodes[current as usize];
            current = node.next[0];
            Some(node.record)
        })
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
        index.nodes.push(Node {
            record,
            prefix: key_prefix(key),
            height,
            live: true,
            dirty: false,
            next: [NIL; MAX_LEVEL],
        });
        let node = (index.nodes.len() - 1) as u32;
        for level in 0..usize::from(height) {
            let tail = self.tails[level];
            index.nodes[tail as usize].next[level] = node;
            self.tails[level] = node;
        }
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
                } else {
                    let old = index.remove(&key, |r| keys[r as usize].as_slice());
                    prop_assert_eq!(old, model.remove(&key));
                }
                let mut links = Vec::new();
                index.take_dirty(&mut links);
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
        for record in 0..3u32 {
            index.upsert(keys[record as usize], record, |r| keys[r as usize]);
        }
        index.take_dirty(&mut links);
        // Head -> a(1) -> b(0) -> c(2).
        let mut map: BTreeMap<Option<u32>, Option<u32>> = BTreeMap::new();
        for link in &links {
            map.insert(link.from, link.to);
        }
        assert_eq!(map[&None], Some(1));
        assert_eq!(map[&Some(1)], Some(0));
        assert_eq!(map[&Some(0)], Some(2));
        assert_eq!(map[&Some(2)], None);
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
    }
}
