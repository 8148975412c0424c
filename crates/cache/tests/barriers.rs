//! The cache function's rules for barriers (a keyed write with no key: one that may change
//! any key) and for answers a server marks not cacheable, driven datagram by datagram: a
//! barrier empties the table, no fetch starts until the server's answer to it has passed back,
//! and an answer marked `NOT_CACHEABLE` is never inserted.

use std::net::SocketAddr;
use std::time::Duration;

use pmnet_cache::{CacheConfig, CacheFunction};
use pmnet_proto::{NetworkFunction, Time, Verdict};
use pmnet_wire::cache::{
    ReadDescriptor, WriteDescriptor, WriteOrder, CACHE_READ, CACHE_REPLY, KEYED, NOT_CACHEABLE,
};
use pmnet_wire::{Header, PacketType};

const SERVER: u16 = 1;
const READER: u64 = 0xAAAA;
const WRITER: u64 = 0xBBBB;

struct Rig {
    cache: CacheFunction,
    now: Time,
    client: SocketAddr,
    server: SocketAddr,
    next_read: u32,
}

impl Rig {
    fn new() -> Rig {
        let mut config = CacheConfig::new(7);
        config.stats.threshold = 1;
        config.interval = Duration::from_millis(1);
        config.fetch_warmup = Duration::ZERO;
        Rig {
            cache: CacheFunction::new(config).expect("valid statistics"),
            now: Time::from_nanos(1_000_000),
            client: "127.0.0.1:1000".parse().unwrap(),
            server: "127.0.0.1:2000".parse().unwrap(),
            next_read: 0,
        }
    }

    fn feed(&mut self, from: SocketAddr, bytes: &[u8]) -> Verdict {
        let (header, _) = Header::parse(bytes).expect("a valid datagram");
        self.cache.handle(self.now, from, &header, bytes)
    }

    /// A read of `key` from the reader (nothing before it); whether the device answered it.
    fn read(&mut self, key: &[u8]) -> (u32, bool) {
        self.next_read += 1;
        let mut payload = Vec::new();
        ReadDescriptor {
            read_after: 0,
            after_session: 0,
            after_seq: 0,
            key,
        }
        .emit(&mut payload);
        payload.extend_from_slice(b"GET");
        let header = Header::new(
            PacketType::Reserved(CACHE_READ),
            SERVER,
            READER,
            self.next_read,
        );
        let verdict = self.feed(self.client, &header.encode(&payload));
        let served = verdict == Verdict::Consumed;
        if served {
            assert!(self.cache.poll_transmit().is_some(), "an answer is sent");
        }
        (self.next_read, served)
    }

    /// The server's answer to read `id`, passing back.
    fn answer(&mut self, id: u32, reply: &[u8], flags: u16) {
        let mut header = Header::new(PacketType::Reserved(CACHE_REPLY), SERVER, READER, id);
        header.flags = flags;
        let _ = self.feed(self.server, &header.encode(reply));
    }

    fn controller(&mut self) {
        self.now = Time::from_nanos(self.now.as_nanos() + 2_000_000);
        self.cache.handle_timeout(self.now);
    }

    /// Miss, get admitted, fetch and insert `key` with `value`; then a read is served.
    fn cache_key(&mut self, key: &[u8], value: &[u8]) {
        let (id, served) = self.read(key);
        assert!(!served);
        self.answer(id, value, 0);
        self.controller();
        let fetches = self.cache.counters.fetches_sent;
        let (id, served) = self.read(key);
        assert!(!served);
        assert_eq!(
            self.cache.counters.fetches_sent,
            fetches + 1,
            "a fetch started"
        );
        self.answer(id, value, 0);
        assert!(self.read(key).1, "served once fetched");
    }

    fn barrier(&mut self, packet_type: PacketType, seq: u32) {
        let mut payload = Vec::new();
        WriteDescriptor {
            order: WriteOrder::default(),
            key: b"",
            reply_after: None,
            afters: &[],
        }
        .emit(&mut payload);
        payload.extend_from_slice(b"MSET a 1 b 2");
        let mut header = Header::new(packet_type, SERVER, WRITER, seq);
        header.flags = KEYED;
        assert_eq!(
            self.feed(self.client, &header.encode(&payload)),
            Verdict::Pass,
            "a barrier goes on to the log and the server"
        );
    }

    fn server_ack(&mut self, seq: u32) {
        let header = Header::new(PacketType::ServerAck, SERVER, WRITER, seq);
        let _ = self.feed(self.server, &header.encode(b"+OK\r\n"));
    }
}

#[test]
fn a_barrier_empties_the_table_and_fetches_wait_for_its_server_answer() {
    for packet_type in [PacketType::UpdateRequest, PacketType::BypassRequest] {
        let mut rig = Rig::new();
        rig.cache_key(b"a", b"$1\r\n0\r\n");
        rig.cache_key(b"b", b"$1\r\n0\r\n");
        rig.barrier(packet_type, 1);
        assert_eq!(rig.cache.table.len(), 0, "{packet_type:?}: every item goes");
        assert_eq!(rig.cache.counters.barriers, 1);
        // Hot again, admitted again: but no fetch while the barrier is not applied.
        let fetches = rig.cache.counters.fetches_sent;
        for _ in 0..3 {
            let (id, served) = rig.read(b"a");
            assert!(!served);
            rig.answer(id, b"$1\r\n1\r\n", 0);
            rig.controller();
        }
        assert_eq!(rig.cache.counters.fetches_sent, fetches, "{packet_type:?}");
        assert_eq!(rig.cache.table.len(), 0);
        // The server's answer to the barrier passes back: the key, still admitted, is
        // fetched by its next miss.
        rig.server_ack(1);
        let (fetch, served) = rig.read(b"a");
        assert!(!served);
        assert_eq!(
            rig.cache.counters.fetches_sent,
            fetches + 1,
            "{packet_type:?}"
        );
        rig.answer(fetch, b"$1\r\n1\r\n", 0);
        assert!(rig.read(b"a").1, "{packet_type:?}: served once fetched");
    }
}

#[test]
fn a_barrier_voids_a_fetch_under_way() {
    let mut rig = Rig::new();
    let (id, _) = rig.read(b"a");
    rig.answer(id, b"$1\r\n0\r\n", 0);
    rig.controller();
    let (fetch, served) = rig.read(b"a");
    assert!(!served);
    rig.barrier(PacketType::UpdateRequest, 1);
    rig.server_ack(1);
    // The fetch's answer may have been computed before the barrier was applied.
    rig.answer(fetch, b"$1\r\n0\r\n", 0);
    assert_eq!(rig.cache.table.len(), 0);
    assert!(!rig.read(b"a").1);
}

#[test]
fn a_barrier_the_server_never_answers_quiets_fetches_for_a_request_lifetime() {
    let mut rig = Rig::new();
    let mut config = CacheConfig::new(7);
    config.stats.threshold = 1;
    config.interval = Duration::from_millis(1);
    config.fetch_warmup = Duration::ZERO;
    config.barrier_timeout = Duration::from_millis(50);
    rig.cache = CacheFunction::new(config).unwrap();
    rig.barrier(PacketType::BypassRequest, 1);
    let (id, _) = rig.read(b"a");
    rig.answer(id, b"$1\r\n0\r\n", 0);
    rig.controller();
    let fetches = rig.cache.counters.fetches_sent;
    rig.read(b"a");
    assert_eq!(rig.cache.counters.fetches_sent, fetches);
    // A request lifetime (`barrier_timeout`) later, the barrier is let go: the key, still
    // admitted, is fetched by its next miss.
    rig.now = Time::from_nanos(rig.now.as_nanos() + 60_000_000);
    rig.controller();
    let (fetch, served) = rig.read(b"a");
    assert!(!served);
    assert_eq!(rig.cache.counters.fetches_sent, fetches + 1);
    rig.answer(fetch, b"$1\r\n0\r\n", 0);
    assert!(rig.read(b"a").1);
}

#[test]
fn an_answer_marked_not_cacheable_is_never_inserted() {
    let mut rig = Rig::new();
    let (id, _) = rig.read(b"brief");
    rig.answer(id, b"$1\r\nv\r\n", 0);
    rig.controller();
    let (fetch, _) = rig.read(b"brief");
    rig.answer(fetch, b"$1\r\nv\r\n", NOT_CACHEABLE);
    assert_eq!(rig.cache.table.len(), 0);
    assert_eq!(rig.cache.counters.not_cacheable, 1);
    assert!(!rig.read(b"brief").1);
}
