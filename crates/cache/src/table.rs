//! The table of cached items and its coherence with the log (docs/cache.md).
//!
//! An item is a key and *the reply a read of it gives* (the application's bytes: the cache
//! never interprets them). An item is served only while that reply is durable: in the server's
//! store (inserted by the controller from a read the server answered) or in this device's log
//! (the reply-after of a keyed write the device logged and acked). Events:
//!
//! - a keyed write logged and acked by this device ([`CacheTable::on_write_acked`]): a cached
//!   key takes the write's reply-after (or stops being served if the write carries none) and
//!   counts one more write waiting for its server-ACK; an uncached key being fetched voids the
//!   fetch (the value fetched may predate the write);
//! - a keyed write this device forwarded without logging it ([`CacheTable::on_write_unlogged`]):
//!   the key is dropped from the table (its new value is durable nowhere the device knows);
//! - a server-ACK of a logged keyed write ([`CacheTable::on_server_ack`]): one write fewer
//!   waiting; an item no longer served and with none waiting is dropped;
//! - the controller's insertions ([`CacheTable::begin_fetch`], [`CacheTable::complete_fetch`])
//!   and evictions of the least-hit items.
//!
//! Everything is bounded: items, reply bytes, writes awaiting their server-ACK, fetches in
//! flight. Nothing here does I/O or reads a clock.

use std::collections::HashMap;

/// Sessions whose writes to one item are remembered at most (see `Item::writers`).
pub const WRITERS_MAX: usize = 64;

/// The table's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableConfig {
    /// Items at most (NetCache: 10 000 in the switch).
    pub items_max: usize,
    /// Bytes of a cached reply at most; a larger reply is never cached.
    pub reply_max: usize,
    /// Keyed writes tracked until their server-ACK at most; a write beyond it drops its key
    /// from the table instead of being tracked.
    pub pending_max: usize,
    /// Controller fetches in flight at most.
    pub fetches_max: usize,
}

impl Default for TableConfig {
    fn default() -> Self {
        TableConfig {
            items_max: 10_000,
            // A 128-byte value and a reply's framing (`$128\r\n…\r\n` is 134 bytes).
            reply_max: 160,
            pending_max: 65_536,
            fetches_max: 1024,
        }
    }
}

/// A fetch the controller started: completing it inserts the item only if no write to the key
/// was seen since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchTicket(u64);

#[derive(Debug, Clone)]
struct Item {
    /// The reply served; `None` while a write with no reply-after is the latest.
    reply: Option<Vec<u8>>,
    /// Logged keyed writes to the key whose server-ACK has not come back.
    waiting: u32,
    /// The order (as the device received them) of the write whose reply this is, or of the
    /// fetch: an ack of an older write, coming later, does not replace it.
    order: u64,
    /// The order of the latest write to the key received (acked or not): until that write is
    /// settled, no older write's ack makes the item servable again.
    latest: u64,
    /// The highest number of each session's writes to the key seen since the item was made
    /// (at most [`WRITERS_MAX`] sessions; beyond, the item goes): a session's write that comes
    /// in after a later write of its own to the key is older than it, whatever the order.
    writers: HashMap<u64, u32>,
    /// Reads served since the last [`CacheTable::reset_hits`].
    hits: u64,
}

/// What the table counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableCounters {
    pub hits: u64,
    pub misses: u64,
    pub inserts: u64,
    pub evictions: u64,
    /// Items dropped by writes (unlogged, or over the pending bound) and by acks.
    pub invalidations: u64,
    /// Controller fetches voided by a write to their key.
    pub fetches_voided: u64,
}

/// The cached items of one device.
#[derive(Debug, Clone)]
pub struct CacheTable {
    config: TableConfig,
    items: HashMap<Vec<u8>, Item>,
    /// Logged keyed writes awaiting their server-ACK: `(session, seq)` → key.
    pending: HashMap<(u64, u32), Vec<u8>>,
    /// Keys being fetched by the controller, with their ticket.
    fetching: HashMap<Vec<u8>, u64>,
    next_ticket: u64,
    pub counters: TableCounters,
}

impl CacheTable {
    pub fn new(config: TableConfig) -> CacheTable {
        CacheTable {
            config,
            items: HashMap::new(),
            pending: HashMap::new(),
            fetching: HashMap::new(),
            next_ticket: 1,
            counters: TableCounters::default(),
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        self.items.contains_key(key)
    }

    /// The reply to serve for a read of `key`, if the table may serve one (counted as a hit;
    /// otherwise a miss).
    pub fn lookup(&mut self, key: &[u8]) -> Option<&[u8]> {
        match self.items.get_mut(key) {
            Some(item) if item.reply.is_some() => {
                item.hits += 1;
                self.counters.hits += 1;
                item.reply.as_deref()
            }
            _ => {
                self.counters.misses += 1;
                None
            }
        }
    }

    /// Keyed write `(session, seq)` to `key`, the `order`-th the device received, is durable
    /// in this device's log and acked. Acks may come out of the order the writes came in (a
    /// later write's log batch first): only a write newer than the item's value replaces it.
    pub fn on_write_acked(
        &mut self,
        session: u64,
        seq: u32,
        key: &[u8],
        reply_after: Option<&[u8]>,
        order: u64,
    ) {
        if self.fetching.remove(key).is_some() {
            self.counters.fetches_voided += 1;
        }
        if !self.items.contains_key(key) {
            return;
        }
        if self.pending.len() >= self.config.pending_max
            && !self.pending.contains_key(&(session, seq))
        {
            // Untracked, its ack could not move the item on: drop the item instead.
            self.invalidate(key);
            return;
        }
        let reply = reply_after
            .filter(|reply| reply.len() <= self.config.reply_max)
            .map(<[u8]>::to_vec);
        let item = self.items.get_mut(key).expect("checked");
        // A fetched value has the order of the last write received before it was answered,
        // and reflects every write to its key received before its read was sent: a write of
        // that order (or older) is in it already, or older than a write it reflects.
        if order > item.order && order >= item.latest {
            item.reply = reply;
            item.order = order;
        }
        if self.pending.insert((session, seq), key.to_vec()).is_none() {
            item.waiting += 1;
        }
    }

    /// Keyed write `seq` of `session` to `key` came in and is not yet acked by the log: until
    /// it is (or is refused), the item is not served (its value is about to change). `true`
    /// if the write is *late*: the session's own later write to the key came in before it, so
    /// it is older than the item's value and must not replace it (nor stop it being served).
    pub fn on_write_received(&mut self, key: &[u8], session: u64, seq: u32, order: u64) -> bool {
        if self.fetching.remove(key).is_some() {
            self.counters.fetches_voided += 1;
        }
        let Some(item) = self.items.get_mut(key) else {
            return false;
        };
        match item.writers.get(&session) {
            Some(&latest) if latest > seq => return true,
            _ => {}
        }
        if item.writers.len() >= WRITERS_MAX && !item.writers.contains_key(&session) {
            self.invalidate(key);
            return false;
        }
        item.writers.insert(session, seq);
        item.reply = None;
        item.latest = item.latest.max(order);
        false
    }

    /// A keyed write to `key` went to its server without this device logging it.
    pub fn on_write_unlogged(&mut self, key: &[u8]) {
        if self.fetching.remove(key).is_some() {
            self.counters.fetches_voided += 1;
        }
        self.invalidate(key);
    }

    /// The server acknowledged `(session, seq)`: if it was a logged keyed write to a cached
    /// key, one write fewer is waiting.
    pub fn on_server_ack(&mut self, session: u64, seq: u32) {
        let Some(key) = self.pending.remove(&(session, seq)) else {
            return;
        };
        let Some(item) = self.items.get_mut(&key) else {
            return;
        };
        item.waiting = item.waiting.saturating_sub(1);
        if item.waiting == 0 && item.reply.is_none() {
            self.invalidate(&key);
        }
    }

    /// The controller is about to fetch `key` from its server (with a read the server orders
    /// after every write it was sent before). `None` if it is cached or fetched already, or too
    /// many fetches are in flight.
    pub fn begin_fetch(&mut self, key: &[u8]) -> Option<FetchTicket> {
        if self.items.contains_key(key)
            || self.fetching.contains_key(key)
            || self.fetching.len() >= self.config.fetches_max
        {
            return None;
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.fetching.insert(key.to_vec(), ticket);
        Some(FetchTicket(ticket))
    }

    /// The fetch of `key` came back with `reply` (durable in the server's store). Inserts the
    /// item unless a write to the key was seen since the fetch began or the reply is too large;
    /// a full table first evicts its least-hit item. Whether it was inserted.
    pub fn complete_fetch(
        &mut self,
        key: &[u8],
        ticket: FetchTicket,
        reply: &[u8],
        order: u64,
    ) -> bool {
        if self.fetching.get(key) != Some(&ticket.0) {
            return false;
        }
        self.fetching.remove(key);
        if reply.len() > self.config.reply_max || self.config.items_max == 0 {
            return false;
        }
        if self.items.len() >= self.config.items_max {
            self.evict_coldest();
        }
        self.items.insert(
            key.to_vec(),
            Item {
                reply: Some(reply.to_vec()),
                waiting: 0,
                hits: 0,
                order,
                latest: order,
                writers: HashMap::new(),
            },
        );
        self.counters.inserts += 1;
        true
    }

    /// A fetch that will not complete (its read failed).
    pub fn abandon_fetch(&mut self, key: &[u8], ticket: FetchTicket) {
        if self.fetching.get(key) == Some(&ticket.0) {
            self.fetching.remove(key);
        }
    }

    /// Evict the item with the fewest hits (one with no write waiting if there is one). A scan
    /// of the table: the controller's work, never the packet path's.
    pub fn evict_coldest(&mut self) -> Option<Vec<u8>> {
        let coldest = self
            .items
            .iter()
            .min_by_key(|(_, item)| (item.waiting > 0, item.hits))
            .map(|(key, _)| key.clone())?;
        self.items.remove(&coldest);
        self.counters.evictions += 1;
        Some(coldest)
    }

    /// The least hit items, coldest first, at most `count` (the controller compares them with
    /// the hot keys it was told of).
    pub fn coldest(&self, count: usize) -> Vec<(Vec<u8>, u64)> {
        let mut all: Vec<(Vec<u8>, u64)> = self
            .items
            .iter()
            .map(|(key, item)| (key.clone(), item.hits))
            .collect();
        all.sort_by_key(|(_, hits)| *hits);
        all.truncate(count);
        all
    }

    /// Start a new statistics interval: every item's hits back to 0.
    pub fn reset_hits(&mut self) {
        for item in self.items.values_mut() {
            item.hits = 0;
        }
    }

    /// A barrier (a write that may change any key) came in: every item goes, and every fetch
    /// under way is voided.
    pub fn invalidate_all(&mut self) {
        self.counters.invalidations += self.items.len() as u64;
        self.counters.fetches_voided += self.fetching.len() as u64;
        self.items.clear();
        self.fetching.clear();
    }

    fn invalidate(&mut self, key: &[u8]) {
        if self.items.remove(key).is_some() {
            self.counters.invalidations += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> CacheTable {
        CacheTable::new(TableConfig {
            items_max: 3,
            reply_max: 16,
            pending_max: 4,
            fetches_max: 2,
        })
    }

    fn insert(table: &mut CacheTable, key: &[u8], reply: &[u8]) {
        let ticket = table.begin_fetch(key).expect("a fetch");
        assert!(table.complete_fetch(key, ticket, reply, 1));
    }

    #[test]
    fn a_fetched_item_is_served_and_hits_are_counted() {
        let mut table = table();
        assert_eq!(table.lookup(b"k"), None);
        insert(&mut table, b"k", b"v1");
        assert_eq!(table.lookup(b"k"), Some(&b"v1"[..]));
        assert_eq!((table.counters.hits, table.counters.misses), (1, 1));
        assert!(table.begin_fetch(b"k").is_none(), "cached already");
    }

    #[test]
    fn an_acked_write_is_served_at_once_and_stays_after_its_server_ack() {
        let mut table = table();
        insert(&mut table, b"k", b"v1");
        table.on_write_acked(7, 1, b"k", Some(b"v2"), 101);
        assert_eq!(
            table.lookup(b"k"),
            Some(&b"v2"[..]),
            "the device's log holds v2"
        );
        table.on_write_acked(8, 1, b"k", Some(b"v3"), 102);
        assert_eq!(table.lookup(b"k"), Some(&b"v3"[..]));
        table.on_server_ack(7, 1);
        table.on_server_ack(8, 1);
        assert_eq!(table.lookup(b"k"), Some(&b"v3"[..]));
        table.on_server_ack(8, 1);
        assert_eq!(
            table.lookup(b"k"),
            Some(&b"v3"[..]),
            "a repeated ack changes nothing"
        );
    }

    #[test]
    fn a_write_without_a_reply_after_stops_the_item_until_its_ack_drops_it() {
        let mut table = table();
        insert(&mut table, b"k", b"v1");
        table.on_write_acked(7, 1, b"k", None, 103);
        assert_eq!(table.lookup(b"k"), None);
        assert!(table.contains(b"k"));
        table.on_server_ack(7, 1);
        assert!(!table.contains(b"k"));
        // A reply too large to cache is the same as none.
        insert(&mut table, b"k", b"v1");
        table.on_write_acked(7, 2, b"k", Some(&[0; 17]), 107);
        assert_eq!(table.lookup(b"k"), None);
    }

    #[test]
    fn an_unlogged_write_drops_the_item_and_voids_a_fetch() {
        let mut table = table();
        insert(&mut table, b"k", b"v1");
        table.on_write_unlogged(b"k");
        assert!(!table.contains(b"k"));
        let ticket = table.begin_fetch(b"j").unwrap();
        table.on_write_unlogged(b"j");
        assert!(!table.complete_fetch(b"j", ticket, b"old", 1));
        assert_eq!(table.counters.fetches_voided, 1);
    }

    #[test]
    fn a_write_during_a_fetch_voids_it() {
        let mut table = table();
        let ticket = table.begin_fetch(b"k").unwrap();
        table.on_write_acked(7, 1, b"k", Some(b"v2"), 104);
        assert!(
            !table.complete_fetch(b"k", ticket, b"v1", 1),
            "v1 may predate v2"
        );
        assert!(!table.contains(b"k"));
        // A new fetch begun after the write is good.
        insert(&mut table, b"k", b"v2");
    }

    #[test]
    fn writes_beyond_the_pending_bound_drop_their_item() {
        let mut table = table();
        insert(&mut table, b"k", b"v");
        for seq in 1..=4 {
            table.on_write_acked(1, seq, b"k", Some(b"w"), 105);
        }
        assert!(table.contains(b"k"));
        table.on_write_acked(1, 5, b"k", Some(b"x"), 106);
        assert!(!table.contains(b"k"), "an untracked write drops the item");
    }

    #[test]
    fn a_full_table_evicts_its_least_hit_item_and_fetches_are_bounded() {
        let mut table = table();
        for key in [&b"a"[..], b"b", b"c"] {
            insert(&mut table, key, b"v");
        }
        for _ in 0..3 {
            table.lookup(b"a");
            table.lookup(b"c");
        }
        table.lookup(b"b");
        insert(&mut table, b"d", b"v");
        assert_eq!(table.len(), 3);
        assert!(!table.contains(b"b"), "b had the fewest hits");
        assert_eq!(table.counters.evictions, 1);
        assert_eq!(table.coldest(1)[0].0, b"d".to_vec());
        table.reset_hits();
        assert!(table.coldest(3).iter().all(|(_, hits)| *hits == 0));
        let first = table.begin_fetch(b"x").unwrap();
        let _second = table.begin_fetch(b"y").unwrap();
        assert!(table.begin_fetch(b"z").is_none(), "two fetches at most");
        table.abandon_fetch(b"x", first);
        assert!(table.begin_fetch(b"z").is_some());
    }

    #[test]
    fn an_older_write_acked_after_a_newer_one_does_not_replace_its_value() {
        let mut table = table();
        insert(&mut table, b"k", b"v1");
        assert!(!table.on_write_received(b"k", 1, 1, 2));
        assert!(!table.on_write_received(b"k", 1, 2, 3));
        // The second write (order 3) is acked before the first (order 2).
        table.on_write_acked(1, 2, b"k", Some(b"new"), 3);
        table.on_write_acked(1, 1, b"k", Some(b"old"), 2);
        assert_eq!(table.lookup(b"k"), Some(&b"new"[..]));
    }

    #[test]
    fn a_write_that_comes_in_after_a_later_one_of_its_session_is_late() {
        let mut table = table();
        insert(&mut table, b"k", b"v1");
        assert!(!table.on_write_received(b"k", 1, 5, 2));
        assert!(
            table.on_write_received(b"k", 1, 4, 3),
            "older than the session's 5"
        );
        assert!(!table.on_write_received(b"k", 2, 1, 4), "another session's");
    }

    #[test]
    fn an_older_write_acked_while_a_newer_one_is_unsettled_does_not_make_the_item_servable() {
        let mut table = table();
        insert(&mut table, b"k", b"v1");
        assert!(!table.on_write_received(b"k", 1, 9, 2));
        assert!(!table.on_write_received(b"k", 1, 10, 3));
        table.on_write_acked(1, 9, b"k", Some(b"nine"), 2);
        assert_eq!(table.lookup(b"k"), None, "10 may be complete already");
        table.on_write_acked(1, 10, b"k", Some(b"ten"), 3);
        assert_eq!(table.lookup(b"k"), Some(&b"ten"[..]));
    }
}
