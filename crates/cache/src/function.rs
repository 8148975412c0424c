//! The read cache as an in-network function, in front of the log in a device's pipeline
//! (`Stack<CacheFunction, Device>`), with its controller.
//!
//! - **Reads** (type `0x10`): a read of a key the table may serve, from a session whose earlier
//!   requests are all accounted for ([`Sessions::may_serve`]), is answered here with a cache
//!   reply (type `0x11`, this device's id). Any other read is a miss: counted in the query
//!   statistics and passed on to the log function, which forwards it to the server (naming the
//!   keyed write it must follow).
//! - **Keyed writes**: seen on their way in (the item stops being served until the write is
//!   acked), and in the log's output ([`NetworkFunction::on_sent`]): its PMNet-ACK makes the
//!   write's reply-after the item's value (durable in this device's log), its not-logged notice
//!   drops the item. Server-ACKs, passing through, move items on. A keyed write in several
//!   fragments drops its key (only one-fragment values are cached).
//! - **The controller** runs on this function's timer, never per packet: each interval it takes
//!   the hot keys the statistics reported and admits at most `inserts_per_interval` of them;
//!   the next miss of an admitted key fetches it: the read goes to the server as any miss does
//!   (the log names the keyed write it must follow, so the server answers after every write the
//!   device acked), and its answer, passing back, is inserted unless a write to the key came in
//!   the meantime, evicting the least hit item when the table is full. Then a new interval
//!   starts (hit counts reset); the statistics start again once a hot window (1 s) has passed,
//!   so keys read by slow or one-shot clients add up too.
//!
//! - **Barriers** (a keyed write with no key: one that may change any key, such as a Redis
//!   `MSET` or a script): every item goes, every fetch is voided, and no fetch starts until the
//!   server's answer to the barrier has passed back (it is applied), or `barrier_timeout` (the
//!   request lifetime) has gone by.
//!
//! Nothing here is persistent: a restarted device starts with an empty cache.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::{NetworkFunction, PersistBatch, Time, Transmit, Verdict};
use pmnet_wire::cache::{
    ReadDescriptor, WriteDescriptor, CACHE_READ, CACHE_REPLY, KEYED, NOT_CACHEABLE,
};
use pmnet_wire::{Header, PacketType};

use crate::sessions::Sessions;
use crate::stats::{HotKeys, StatsConfig, StatsConfigError};
use crate::table::{CacheTable, FetchTicket, TableConfig};

/// Settings of a device's cache.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub table: TableConfig,
    pub stats: StatsConfig,
    /// This device's id (named in the replies it gives).
    pub device_id: u16,
    /// How often the controller runs (hot keys admitted, items' hit counts started again).
    pub interval: Duration,
    /// How long the statistics count misses before they start again (never shorter than
    /// `interval`): a key read `threshold` times within it, by any number of sessions, is
    /// hot. Longer than the controller's interval, so that keys read often but by slow or
    /// one-shot clients (a new process per read) become hot too.
    pub hot_window: Duration,
    /// Items the controller inserts per interval at most.
    pub inserts_per_interval: usize,
    /// A fetch unanswered this long is abandoned.
    pub fetch_timeout: Duration,
    /// No fetch starts this long after the cache starts: a read a client sent before (to a
    /// device that restarted since) may still be answered, on a state older than what this
    /// device acked. At least the clients' longest request lifetime.
    pub fetch_warmup: Duration,
    /// A barrier whose server answer has not passed back is let go after this long (then
    /// fetches start again): the clients' longest request lifetime, after which it can no
    /// longer be applied.
    pub barrier_timeout: Duration,
    /// The servers' addresses: only datagrams from them (server-ACKs, cache replies) move the
    /// cache on; anything else claiming to be a server's is left to the log, which drops it.
    /// Empty: any source (the simulator's tests).
    pub servers: Vec<SocketAddr>,
}

impl CacheConfig {
    /// Whether `from` may speak for a server.
    fn speaks_for_a_server(&self, from: SocketAddr) -> bool {
        self.servers.is_empty() || self.servers.contains(&from)
    }

    pub fn new(device_id: u16) -> CacheConfig {
        CacheConfig {
            table: TableConfig::default(),
            stats: StatsConfig::default(),
            device_id,
            interval: Duration::from_millis(100),
            hot_window: Duration::from_millis(1000),
            inserts_per_interval: 256,
            fetch_timeout: Duration::from_millis(500),
            fetch_warmup: Duration::from_millis(pmnet_wire::MAX_REQUEST_LIFETIME_MS),
            barrier_timeout: Duration::from_millis(pmnet_wire::MAX_REQUEST_LIFETIME_MS),
            servers: Vec::new(),
        }
    }
}

/// What the cache function counted (the table's counters are in [`CacheTable::counters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheCounters {
    pub reads: u64,
    pub served: u64,
    pub passed_on: u64,
    /// Misses because the reading session's earlier requests were not all accounted for.
    pub not_yet_servable: u64,
    pub keyed_writes_seen: u64,
    pub fetches_sent: u64,
    pub fetches_inserted: u64,
    pub fetches_abandoned: u64,
    /// Fetch answers a server marked not cacheable.
    pub not_cacheable: u64,
    /// Barriers seen (each drops the whole table).
    pub barriers: u64,
    pub intervals: u64,
}

/// A miss passed on to the server: its read-after, and the fetch it carries, if its key was
/// admitted (key, ticket, when).
#[derive(Debug)]
struct Miss {
    read_after: u32,
    fetch: Option<(Vec<u8>, FetchTicket, Time)>,
}

/// A keyed write on its way in: its key and the reply after it.
type SeenWrite = (Vec<u8>, Option<Vec<u8>>, u64);

/// The read cache of one device.
#[derive(Debug)]
pub struct CacheFunction {
    config: CacheConfig,
    pub table: CacheTable,
    pub hot: HotKeys,
    sessions: Sessions,
    /// Keyed writes seen on their way in and not yet acked or refused by the log:
    /// (session, seq) → (key, reply after).
    writes: HashMap<(u64, u32), SeenWrite>,
    /// Hot keys the controller admitted: their next miss fetches them.
    wanted: std::collections::HashSet<Vec<u8>>,
    /// Misses passed on, by (session, read id).
    misses: HashMap<(u64, u32), Miss>,
    next_interval: Option<Time>,
    /// When the statistics last started again (see [`CacheConfig::hot_window`]).
    hot_since: Option<Time>,
    /// Keyed writes received so far: the order of each (the log stamps them in this order).
    writes_received: u64,
    /// When the cache saw its first datagram (fetches wait for `fetch_warmup` after it).
    started: Option<Time>,
    /// Barriers seen whose server answer has not passed back yet, with when they came: no
    /// fetch starts while any is here (one older than `barrier_timeout` is let go).
    barriers: HashMap<(u64, u32), Time>,
    transmits: std::collections::VecDeque<Transmit>,
    pub counters: CacheCounters,
}

/// Keyed writes tracked on their way in at most (beyond, their keys are dropped instead).
const WRITES_MAX: usize = 65_536;
/// Misses remembered at most.
const MISSES_MAX: usize = 65_536;
/// Barriers awaiting their server's answer remembered at most (beyond, the oldest is kept
/// waiting in a longer quiet period: see [`CacheFunction::on_barrier`]).
const BARRIERS_MAX: usize = 4_096;

impl CacheFunction {
    pub fn new(config: CacheConfig) -> Result<CacheFunction, StatsConfigError> {
        Ok(CacheFunction {
            table: CacheTable::new(config.table),
            hot: HotKeys::new(config.stats)?,
            sessions: Sessions::default(),
            writes: HashMap::new(),
            wanted: std::collections::HashSet::new(),
            misses: HashMap::new(),
            next_interval: None,
            hot_since: None,
            writes_received: 0,
            started: None,
            barriers: HashMap::new(),
            transmits: std::collections::VecDeque::new(),
            counters: CacheCounters::default(),
            config,
        })
    }

    fn on_read(&mut self, now: Time, from: SocketAddr, header: &Header, payload: &[u8]) -> Verdict {
        let Ok((read, _)) = ReadDescriptor::parse(payload) else {
            return Verdict::Pass; // the log counts and forwards what it can
        };
        self.counters.reads += 1;
        self.next_interval.get_or_insert(now + self.config.interval);
        // Only a read newer than every read of its session seen here may fetch (below).
        let newest = self.sessions.read_is_new(header.session_id, header.seq);
        if !self.sessions.may_serve(header.session_id, read.read_after) {
            self.counters.not_yet_servable += 1;
            self.pass_miss(now, header, read.read_after, None);
            return Verdict::Pass;
        }
        if let Some(reply) = self.table.lookup(read.key) {
            let mut answer = Header::new(
                PacketType::Reserved(CACHE_REPLY),
                header.server_id,
                header.session_id,
                header.seq,
            );
            answer.device_id = self.config.device_id;
            let bytes = answer.encode(reply);
            self.counters.served += 1;
            self.transmits.push_back(Transmit {
                destination: from,
                bytes: pmnet_wire::to_sendable(&bytes),
            });
            return Verdict::Consumed;
        }
        self.hot.record_miss(read.key);
        // Only the first transmission of a read this device sees carries a fetch: the answer
        // to an earlier transmission (with an older order) must never be taken for it.
        // Nor may a read older than one this device saw of its session: a replay, whose old
        // answer could be replayed too.
        let first_seen = !self.misses.contains_key(&(header.session_id, header.seq)) && newest;
        let warm = self
            .started
            .is_some_and(|at| now.saturating_duration_since(at) >= self.config.fetch_warmup);
        let quiet = !self.barriers.is_empty();
        let fetch = if first_seen && warm && !quiet && self.wanted.remove(read.key) {
            self.table
                .begin_fetch(read.key)
                .map(|ticket| (read.key.to_vec(), ticket, now))
        } else {
            None
        };
        self.pass_miss(now, header, read.read_after, fetch);
        Verdict::Pass
    }

    fn pass_miss(
        &mut self,
        _now: Time,
        header: &Header,
        read_after: u32,
        fetch: Option<(Vec<u8>, FetchTicket, Time)>,
    ) {
        self.counters.passed_on += 1;
        if fetch.is_some() {
            self.counters.fetches_sent += 1;
        }
        if self.misses.len() >= MISSES_MAX {
            for (_, miss) in self.misses.drain() {
                if let Some((key, ticket, _)) = miss.fetch {
                    self.table.abandon_fetch(&key, ticket);
                }
            }
        }
        // A retransmitted read keeps what its first transmission recorded.
        self.misses
            .entry((header.session_id, header.seq))
            .or_insert(Miss { read_after, fetch });
    }

    /// A cache reply from a server passing through: a fetch's answer, or a miss's, which
    /// vouches that its session's requests up to its read-after are applied.
    fn on_reply(&mut self, header: &Header, payload: &[u8]) -> Verdict {
        if header.device_id != 0 {
            return Verdict::Pass;
        }
        let Some(miss) = self.misses.remove(&(header.session_id, header.seq)) else {
            return Verdict::Pass;
        };
        self.sessions
            .applied_through(header.session_id, miss.read_after);
        if let Some((key, ticket, _)) = miss.fetch {
            let order = self.writes_received;
            if header.has_flag(NOT_CACHEABLE) {
                self.counters.not_cacheable += 1;
                self.table.abandon_fetch(&key, ticket);
            } else if header.fragment_count == 1
                && self.table.complete_fetch(&key, ticket, payload, order)
            {
                self.counters.fetches_inserted += 1;
            } else {
                self.table.abandon_fetch(&key, ticket);
            }
        }
        Verdict::Pass
    }

    /// A barrier on its way in: the table is emptied and fetches wait until the server's
    /// answer to it passes back. Every write of any key the device acked before it is then
    /// either applied or ordered before the key's next fetch (`keyed.rs`), and the barrier is
    /// applied: a fetch started after it reads what the store holds.
    fn on_barrier(&mut self, now: Time, header: &Header) {
        self.sessions.passed(header.session_id, header.seq, false);
        self.counters.barriers += 1;
        self.table.invalidate_all();
        if self.barriers.len() >= BARRIERS_MAX {
            // Too many to follow one by one: keep the cache quiet a whole request lifetime
            // from now (any of them may still be applied until then).
            self.barriers.clear();
            self.barriers.insert((0, 0), now);
        }
        self.barriers.insert((header.session_id, header.seq), now);
    }

    fn on_update(&mut self, now: Time, header: &Header, payload: &[u8]) {
        let keyed = header.has_flag(KEYED);
        if !keyed {
            self.sessions.passed(header.session_id, header.seq, false);
            return;
        }
        if header.fragment_index != 0 {
            return;
        }
        let Ok((descriptor, _)) = WriteDescriptor::parse(payload) else {
            self.sessions.passed(header.session_id, header.seq, false);
            return;
        };
        if descriptor.is_barrier() {
            self.on_barrier(now, header);
            return;
        }
        if !self.sessions.passed(header.session_id, header.seq, true) {
            return; // a duplicate: it changes nothing it has not changed already
        }
        self.counters.keyed_writes_seen += 1;
        let key = descriptor.key;
        if header.fragment_count != 1 || self.writes.len() >= WRITES_MAX {
            self.table.on_write_unlogged(key);
            self.sessions.settled(header.session_id, header.seq);
            return;
        }
        let order = self.writes_received + 1;
        if self
            .table
            .on_write_received(key, header.session_id, header.seq, order)
        {
            // Older than what the item holds: its ack changes nothing here.
            self.sessions.settled(header.session_id, header.seq);
            return;
        }
        self.writes_received += 1;
        self.writes.insert(
            (header.session_id, header.seq),
            (
                key.to_vec(),
                descriptor.reply_after.map(<[u8]>::to_vec),
                self.writes_received,
            ),
        );
    }

    /// Keyed write `seq` of `session`, seen on its way in, is settled: durable (`applied`:
    /// its reply-after may become the item's value) or not to be (the item goes).
    fn settle(&mut self, session: u64, seq: u32, applied: bool) {
        let Some((key, reply_after, order)) = self.writes.remove(&(session, seq)) else {
            return;
        };
        if applied {
            self.table
                .on_write_acked(session, seq, &key, reply_after.as_deref(), order);
        } else {
            self.table.on_write_unlogged(&key);
        }
        self.sessions.settled(session, seq);
    }

    /// The controller's turn: abandon fetches that went unanswered, admit the hot keys
    /// reported, start a new interval.
    fn run_controller(&mut self, now: Time) {
        self.counters.intervals += 1;
        let lifetime = self.config.barrier_timeout;
        self.barriers
            .retain(|_, at| now.saturating_duration_since(*at) < lifetime);
        let timeout = self.config.fetch_timeout;
        for miss in self.misses.values_mut() {
            let stale = miss
                .fetch
                .as_ref()
                .is_some_and(|(_, _, at)| now.saturating_duration_since(*at) >= timeout);
            if stale {
                let (key, ticket, _) = miss.fetch.take().expect("checked");
                self.table.abandon_fetch(&key, ticket);
                self.counters.fetches_abandoned += 1;
            }
        }
        // Admitted keys wait for their next miss across intervals; a backlog of keys nobody
        // reads again is dropped whole rather than grown.
        if self.wanted.len() >= 4 * self.config.inserts_per_interval.max(1) {
            self.wanted.clear();
        }
        for key in self
            .hot
            .take_reports()
            .into_iter()
            .filter(|key| !self.table.contains(key))
            .take(self.config.inserts_per_interval)
        {
            self.wanted.insert(key);
        }
        let window = self.config.hot_window.max(self.config.interval);
        if self
            .hot_since
            .is_none_or(|since| now.saturating_duration_since(since) >= window)
        {
            self.hot.reset();
            self.hot_since = Some(now);
        } else {
            // The counts go on over the window; a key hot in it is reported again at its next
            // miss (cached since, then dropped by a write, it is admitted again at once).
            self.hot.new_reports();
        }
        self.table.reset_hits();
    }
}

impl NetworkFunction for CacheFunction {
    type Work = pmnet_proto::RegionWrite;

    fn handle(&mut self, now: Time, from: SocketAddr, header: &Header, datagram: &[u8]) -> Verdict {
        let payload = datagram.get(pmnet_wire::HEADER_LEN..).unwrap_or_default();
        self.started.get_or_insert(now);
        let server_only = matches!(
            header.packet_type,
            PacketType::ServerAck | PacketType::Reserved(CACHE_REPLY)
        );
        if header.has_flag(pmnet_wire::replication::REPLICA) {
            // Between a primary and its replicas: the log drops it.
            return Verdict::Pass;
        }
        if server_only && !self.config.speaks_for_a_server(from) {
            return Verdict::Pass; // the log drops it (unexpected source)
        }
        match header.packet_type {
            PacketType::Reserved(CACHE_READ) => self.on_read(now, from, header, payload),
            PacketType::Reserved(CACHE_REPLY) => self.on_reply(header, payload),
            PacketType::UpdateRequest => {
                self.on_update(now, header, payload);
                Verdict::Pass
            }
            PacketType::BypassRequest => {
                // A keyed bypass writes its key with a reply only the server knows: the item
                // goes (and any fetch of it), and the key's next fetch is ordered after it.
                if header.has_flag(KEYED) && header.fragment_index == 0 {
                    match WriteDescriptor::parse(payload) {
                        Ok((descriptor, _)) if descriptor.is_barrier() => {
                            self.on_barrier(now, header);
                            return Verdict::Pass;
                        }
                        Ok((descriptor, _)) => {
                            self.counters.keyed_writes_seen += 1;
                            self.table.on_write_unlogged(descriptor.key);
                        }
                        Err(_) => {}
                    }
                }
                self.sessions.passed(header.session_id, header.seq, false);
                Verdict::Pass
            }
            PacketType::ServerAck => {
                // A keyed write the server applied before the log acked it (its client has
                // the server's reply): settled here, as an ack would have (or dropped, if
                // the server skipped its number).
                self.settle(
                    header.session_id,
                    header.seq,
                    !header.has_flag(pmnet_wire::flags::SKIPPED),
                );
                self.table.on_server_ack(header.session_id, header.seq);
                self.barriers.remove(&(header.session_id, header.seq));
                // A server applies a session's requests in order: everything up to this one
                // is applied, and a copy of an earlier one coming in later is a duplicate.
                self.sessions.applied_through(header.session_id, header.seq);
                Verdict::Pass
            }
            _ => Verdict::Pass,
        }
    }

    fn handle_timeout(&mut self, now: Time) {
        if self.next_interval.is_some_and(|at| at <= now) {
            self.run_controller(now);
            self.next_interval = Some(now + self.config.interval);
        }
    }

    fn on_persisted(&mut self, _now: Time, _through: u64) {}

    fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    fn poll_persist(&mut self) -> Option<PersistBatch<Self::Work>> {
        None
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.next_interval
    }

    fn counter_samples(&self) -> Vec<(&'static str, &'static str, u64)> {
        let c = &self.counters;
        let t = &self.table.counters;
        vec![
            (
                "pmnet_cache_reads_total",
                "Cache reads that reached the device.",
                c.reads,
            ),
            (
                "pmnet_cache_hits_total",
                "Cache reads answered by the device.",
                c.served,
            ),
            (
                "pmnet_cache_misses_total",
                "Cache reads passed on to their server.",
                c.passed_on,
            ),
            (
                "pmnet_cache_not_yet_servable_total",
                "Misses because the reading session's earlier requests were not all accounted for.",
                c.not_yet_servable,
            ),
            (
                "pmnet_cache_keyed_writes_total",
                "Keyed writes seen.",
                c.keyed_writes_seen,
            ),
            (
                "pmnet_cache_fetches_total",
                "Hot keys fetched (on their next miss).",
                c.fetches_sent,
            ),
            ("pmnet_cache_inserts_total", "Items inserted.", t.inserts),
            (
                "pmnet_cache_evictions_total",
                "Items evicted (least hit).",
                t.evictions,
            ),
            (
                "pmnet_cache_invalidations_total",
                "Items dropped by writes the device did not log, or by acks.",
                t.invalidations,
            ),
            (
                "pmnet_cache_fetches_voided_total",
                "Fetches voided by a write.",
                t.fetches_voided,
            ),
            (
                "pmnet_cache_barriers_total",
                "Barriers seen (writes that may change any key: the table is emptied).",
                c.barriers,
            ),
            (
                "pmnet_cache_not_cacheable_total",
                "Fetch answers the server marked not cacheable.",
                c.not_cacheable,
            ),
            (
                "pmnet_cache_items",
                "Items in the table now.",
                self.table.len() as u64,
            ),
            (
                "pmnet_cache_intervals_total",
                "Controller turns.",
                c.intervals,
            ),
        ]
    }

    /// The log's output: a PMNet-ACK settles a keyed write (its reply-after becomes the
    /// item's value), a not-logged notice drops its key.
    fn on_sent(&mut self, transmit: &Transmit) {
        let Ok((header, _)) = Header::parse(&transmit.bytes) else {
            return;
        };
        let acked = match header.packet_type {
            PacketType::PmnetAck => true,
            PacketType::NotLogged => false,
            _ => return,
        };
        self.settle(header.session_id, header.seq, acked);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A first read of `key` by a session of its own (a one-shot client: a new process each).
    fn one_shot_read(cache: &mut CacheFunction, now: Time, session: u64, key: &[u8]) {
        let mut payload = Vec::new();
        ReadDescriptor {
            read_after: 0,
            after_session: 0,
            after_seq: 0,
            key,
        }
        .emit(&mut payload);
        let header = Header::new(PacketType::Reserved(CACHE_READ), 1, session, 1);
        let datagram = header.encode(&payload);
        let from: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let _ = cache.handle(now, from, &header, &datagram);
        // The controller's turns fall due as time passes.
        cache.handle_timeout(now);
    }

    /// Whether `key` becomes hot (admitted) when one-shot clients read it `per_second` times a
    /// second for two seconds, with statistics over `window`.
    fn admitted(window: Duration, per_second: u64) -> bool {
        let mut config = CacheConfig::new(1);
        config.stats.threshold = 16;
        config.hot_window = window;
        let mut cache = CacheFunction::new(config).unwrap();
        let step = Duration::from_millis(1000 / per_second);
        let mut now = Time::ZERO;
        for session in 1..=2 * per_second {
            one_shot_read(&mut cache, now, session, b"hot-key");
            now = now + step;
            if cache.wanted.contains(&b"hot-key"[..]) {
                return true;
            }
        }
        false
    }

    #[test]
    fn a_key_read_by_many_one_shot_clients_at_a_slow_rate_becomes_hot() {
        // 20 reads a second, each from a new session: 2 per 100 ms interval, 20 in a second.
        assert!(admitted(Duration::from_secs(1), 20));
        // Counted per controller interval alone, they never reach the threshold.
        assert!(!admitted(Duration::from_millis(100), 20));
        // Too rare for the window either way.
        assert!(!admitted(Duration::from_secs(1), 5));
    }
}
