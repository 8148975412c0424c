//! The state machines together on a perfect in-memory network: the paths one by one. The
//! simulator (`crates/sim/src/abd/`) runs them under faults.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_pm::SimRegion;
use pmnet_pmtable::{Geometry, Table, TableFile};
use pmnet_proto::{NetworkFunction, Time, Transmit};
use pmnet_wire::abd::LINE;
use pmnet_wire::Header;

use crate::{
    AbdClient, AbdError, AbdFunction, ClientConfig, Coordinator, CoordinatorConfig, MemNode,
    NodeConfig, OpKind, LEARN_WAIT,
};

const LINES: u32 = 32;

/// The nodes' clock at their time zero: two days after the counters' epoch.
fn node_clock() -> u64 {
    crate::counter_floor_at((crate::COUNTER_EPOCH_UNIX_S + 2 * 86_400) * 1_000_000)
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn geometry() -> Geometry {
    Geometry {
        buckets: LINES + 1,
        key_max: 4,
        value_max: LINE as u16,
    }
}

struct Node {
    addr: SocketAddr,
    node: MemNode,
    file: TableFile<SimRegion>,
    up: bool,
}

/// Nodes on ports 1.., a device coordinator on 100, a client on 200, a direct coordinator on
/// 300; every datagram delivered at once unless its destination is down.
struct Net {
    now: Time,
    nodes: Vec<Node>,
    device: AbdFunction,
    client: AbdClient,
    direct: Coordinator,
    client_done: Vec<(u64, Result<Vec<u8>, AbdError>)>,
    direct_done: Vec<(u64, Result<Vec<u8>, AbdError>)>,
    delivered: u64,
}

fn fresh_node(addr_of: SocketAddr, peers: Vec<SocketAddr>, now: Time) -> Node {
    let region = SimRegion::new(geometry().region_len());
    let file = TableFile::format(region, geometry()).expect("formats");
    let node = MemNode::new(
        NodeConfig {
            peers,
            lines: LINES,
            counter_clock: Some(node_clock()),
        },
        Table::new_direct(geometry()),
        now,
    );
    Node {
        addr: addr_of,
        node,
        file,
        up: true,
    }
}

impl Net {
    fn new(n: u16) -> Net {
        let addrs: Vec<SocketAddr> = (1..=n).map(addr).collect();
        let now = Time::ZERO;
        let nodes = addrs
            .iter()
            .map(|me| {
                let peers = addrs.iter().filter(|a| *a != me).copied().collect();
                fresh_node(*me, peers, now)
            })
            .collect();
        let device = AbdFunction::new(Coordinator::new(CoordinatorConfig::new(
            addrs.clone(),
            LINES,
            1,
            0xD1,
        )));
        let client = AbdClient::new(ClientConfig::new(addr(100), 0xC1));
        let direct = Coordinator::new(CoordinatorConfig::new(addrs, LINES, 2, 0xD2));
        let mut net = Net {
            now,
            nodes,
            device,
            client,
            direct,
            client_done: Vec::new(),
            direct_done: Vec::new(),
            delivered: 0,
        };
        // A new group: every node learns that no other holds a line, and joins.
        net.advance(LEARN_WAIT + Duration::from_millis(50));
        assert!(net.nodes.iter().all(|node| node.node.is_member()));
        net
    }

    fn deliver(&mut self, from: SocketAddr, transmit: Transmit) {
        let Ok((header, _)) = Header::parse(&transmit.bytes) else {
            panic!("a state machine sent a datagram that does not parse");
        };
        let payload = &transmit.bytes[pmnet_wire::HEADER_LEN..];
        let to = transmit.destination;
        self.delivered += 1;
        if to == addr(100) {
            let _ = self.device.handle(self.now, from, &header, &transmit.bytes);
        } else if to == addr(200) {
            self.client.handle(self.now, &header, payload);
        } else if to == addr(300) {
            self.direct.handle(self.now, from, &header, payload);
        } else if let Some(node) = self.nodes.iter_mut().find(|node| node.addr == to) {
            if node.up {
                node.node.handle(self.now, from, &header, payload);
            }
        }
    }

    /// Run until nothing moves.
    fn settle(&mut self) {
        loop {
            let mut queue: VecDeque<(SocketAddr, Transmit)> = VecDeque::new();
            for node in &mut self.nodes {
                while let Some(batch) = node.node.poll_persist() {
                    node.file.persist_batch(&batch.work);
                    node.node.on_persisted(self.now, batch.number);
                }
                while let Some(t) = node.node.poll_transmit() {
                    queue.push_back((node.addr, t));
                }
            }
            while let Some(t) = self.device.poll_transmit() {
                queue.push_back((addr(100), t));
            }
            while let Some(t) = self.client.poll_transmit() {
                queue.push_back((addr(200), t));
            }
            while let Some(t) = self.direct.poll_transmit() {
                queue.push_back((addr(300), t));
            }
            while let Some(done) = self.client.poll_done() {
                self.client_done.push((done.token, done.result));
            }
            while let Some(done) = self.direct.poll_done() {
                self.direct_done.push((done.token, done.result));
            }
            if queue.is_empty() {
                return;
            }
            for (from, t) in queue {
                self.deliver(from, t);
            }
        }
    }

    fn advance(&mut self, by: Duration) {
        let end = self.now + by;
        loop {
            self.settle();
            let next = [
                self.device.poll_timeout(),
                self.client.poll_timeout(),
                self.direct.poll_timeout(),
            ]
            .into_iter()
            .chain(self.nodes.iter().map(|node| node.node.poll_timeout()))
            .flatten()
            .filter(|at| *at <= end)
            .min();
            let Some(at) = next else {
                self.now = end;
                self.settle();
                return;
            };
            self.now = self.now.max(at);
            self.device.handle_timeout(self.now);
            self.client.handle_timeout(self.now);
            self.direct.handle_timeout(self.now);
            for node in &mut self.nodes {
                node.node.handle_timeout(self.now);
            }
        }
    }

    fn client_op(&mut self, first: u32, count: u16, kind: OpKind) -> Result<Vec<u8>, AbdError> {
        let token = self.client_done.len() as u64 + 1000;
        self.client.start(self.now, token, first, count, kind)?;
        self.advance(Duration::from_secs(3));
        let (done, result) = self.client_done.pop().expect("an answer");
        assert_eq!(done, token);
        result
    }

    fn direct_op(&mut self, first: u32, count: u16, kind: OpKind) -> Result<Vec<u8>, AbdError> {
        let token = self.direct_done.len() as u64 + 1;
        self.direct.start(self.now, token, first, count, kind)?;
        self.advance(Duration::from_secs(1));
        let (done, result) = self.direct_done.pop().expect("an answer");
        assert_eq!(done, token);
        result
    }
}

fn lines(byte: u8, count: usize) -> Vec<u8> {
    vec![byte; count * LINE]
}

#[test]
fn a_write_through_the_device_is_read_back_by_the_device_and_by_a_direct_coordinator() {
    let mut net = Net::new(3);
    assert_eq!(net.client_op(4, 2, OpKind::Read), Ok(lines(0, 2)));
    assert_eq!(net.client_op(4, 2, OpKind::Write(lines(7, 2))), Ok(vec![]));
    assert_eq!(net.client_op(4, 2, OpKind::Read), Ok(lines(7, 2)));
    assert_eq!(net.direct_op(4, 2, OpKind::Read), Ok(lines(7, 2)));
    // A later writer's timestamp is higher: its value wins.
    assert_eq!(net.direct_op(5, 1, OpKind::Write(lines(9, 1))), Ok(vec![]));
    assert_eq!(
        net.client_op(4, 2, OpKind::Read),
        Ok([lines(7, 1), lines(9, 1)].concat())
    );
    assert_eq!(
        net.client_op(31, 2, OpKind::Read),
        Err(AbdError::OutOfRange)
    );
}

#[test]
fn a_minority_down_changes_nothing_and_a_majority_down_fails_the_operation() {
    let mut net = Net::new(3);
    net.nodes[0].up = false;
    assert_eq!(net.client_op(0, 1, OpKind::Write(lines(3, 1))), Ok(vec![]));
    assert_eq!(net.client_op(0, 1, OpKind::Read), Ok(lines(3, 1)));
    net.nodes[1].up = false;
    assert_eq!(
        net.client_op(0, 1, OpKind::Write(lines(4, 1))),
        Err(AbdError::Unavailable)
    );
    assert_eq!(
        net.direct_op(0, 1, OpKind::Read),
        Err(AbdError::Unavailable)
    );
}

#[test]
fn a_read_writes_back_a_value_that_only_a_minority_holds() {
    let mut net = Net::new(3);
    // Node 0 down: the write lands on nodes 1 and 2.
    net.nodes[0].up = false;
    assert_eq!(net.direct_op(1, 1, OpKind::Write(lines(5, 1))), Ok(vec![]));
    // Node 2 down, node 0 back: a read sees node 1's value beside node 0's older one, and
    // writes it back before answering.
    net.nodes[0].up = true;
    net.nodes[2].up = false;
    let before = net.direct.counters().write_backs;
    assert_eq!(net.direct_op(1, 1, OpKind::Read), Ok(lines(5, 1)));
    assert_eq!(net.direct.counters().write_backs, before + 1);
    assert_eq!(net.nodes[0].node.durable_line(1).1, lines(5, 1));
}

#[test]
fn a_node_that_lost_its_memory_learns_every_line_before_it_counts() {
    let mut net = Net::new(3);
    for line in 0..LINES {
        let value = lines(line as u8 + 1, 1);
        assert_eq!(net.direct_op(line, 1, OpKind::Write(value)), Ok(vec![]));
    }
    // Node 2 loses its memory: a new, empty table.
    let peers = vec![addr(1), addr(2)];
    net.nodes[2] = fresh_node(addr(3), peers, net.now);
    assert!(!net.nodes[2].node.is_member());
    // While it learns, its answers count in no quorum: with node 0 down, nothing completes.
    net.nodes[0].up = false;
    assert_eq!(
        net.direct_op(0, 1, OpKind::Read),
        Err(AbdError::Unavailable)
    );
    net.nodes[0].up = true;
    net.advance(LEARN_WAIT + Duration::from_millis(100));
    assert!(net.nodes[2].node.is_member());
    for line in 0..LINES {
        assert_eq!(
            net.nodes[2].node.durable_line(line).1,
            lines(line as u8 + 1, 1)
        );
    }
    // Now a majority of {1, 2} serves every line.
    net.nodes[0].up = false;
    assert_eq!(net.direct_op(7, 1, OpKind::Read), Ok(lines(8, 1)));
}

#[test]
fn a_write_sent_again_is_answered_not_applied_twice() {
    let mut net = Net::new(3);
    assert_eq!(net.client_op(2, 1, OpKind::Write(lines(1, 1))), Ok(vec![]));
    let writes = net.device.coordinator().counters().writes;
    // The same request again, flagged as retransmitted: answered from memory.
    let mut payload = Vec::new();
    pmnet_wire::abd::Request {
        op: pmnet_wire::abd::Op::Write,
        first: 2,
        count: 1,
        data: &lines(1, 1),
    }
    .emit(&mut payload);
    let mut header = Header::new(
        pmnet_wire::PacketType::Reserved(pmnet_wire::abd::ABD_REQUEST),
        0,
        0xC1,
        1,
    );
    header.flags = pmnet_wire::abd::RETRANSMITTED;
    let bytes = header.encode(&payload);
    let _ = net.device.handle(net.now, addr(200), &header, &bytes);
    net.settle();
    assert_eq!(net.device.coordinator().counters().writes, writes);
    assert_eq!(net.device.counters().answered_again, 1);
    // A write flagged as sent again from a session the device never saw: in doubt.
    header.session_id = 0xEE;
    let bytes = header.encode(&payload);
    let _ = net.device.handle(net.now, addr(201), &header, &bytes);
    net.settle();
    assert_eq!(net.device.counters().in_doubt, 1);
    assert_eq!(net.device.coordinator().counters().writes, writes);
}

#[test]
fn a_memory_of_one_node_writes_in_one_store_the_node_stamps() {
    let mut net = Net::new(1);
    assert_eq!(net.direct_op(3, 1, OpKind::Write(lines(1, 1))), Ok(vec![]));
    assert_eq!(net.client_op(3, 1, OpKind::Write(lines(2, 1))), Ok(vec![]));
    assert_eq!(net.direct_op(3, 1, OpKind::Read), Ok(lines(2, 1)));
    // Two writes, two stores, no query; the node's counter went up by one each.
    assert_eq!(net.nodes[0].node.counters().queries, 1);
    assert_eq!(net.nodes[0].node.counters().stores, 2);
    assert_eq!(net.nodes[0].node.durable_line(3).0 >> 16, 2);
}

/// The value a store of `line` at timestamp `ts` carries in the crash test: a line and its
/// timestamp belong together when the value is this one.
fn paired_value(line: u32, ts: u64) -> Vec<u8> {
    let mut value = Vec::with_capacity(LINE);
    let mut x = u64::from(line) << 40 ^ ts ^ 0x9e37_79b9_7f4a_7c15;
    while value.len() < LINE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        value.extend_from_slice(&x.to_le_bytes());
    }
    value
}

#[test]
fn a_crash_never_tears_a_line_from_its_timestamp_nor_loses_an_acknowledged_store() {
    use rand::{Rng, SeedableRng};
    let seed = match std::env::var("PMNET_SEED") {
        Ok(text) => text.trim().parse().expect("PMNET_SEED is a u64"),
        Err(_) => rand::random(),
    };
    eprintln!("PMNET_SEED={seed}");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let coordinator = addr(100);
    let mut now = Time::ZERO;
    let new_node = |table: Table, now: Time| {
        MemNode::new(
            NodeConfig {
                peers: Vec::new(),
                lines: LINES,
                counter_clock: None,
            },
            table,
            now,
        )
    };
    let region = SimRegion::new(geometry().region_len());
    let mut file = TableFile::format(region, geometry()).expect("formats");
    let mut node = new_node(Table::new_direct(geometry()), now);
    // Alone, it forms the memory after the learning wait.
    now = now + LEARN_WAIT;
    node.handle_timeout(now);
    while let Some(batch) = node.poll_persist() {
        file.persist_batch(&batch.work);
        node.on_persisted(now, batch.number);
    }
    assert!(node.is_member());
    let mut counters = [0u64; LINES as usize];
    let mut acked = [0u64; LINES as usize];
    let mut sent = std::collections::HashMap::new();
    let mut crashes = 0;
    for step in 0..6000u32 {
        let first = rng.random_range(0..LINES - 2);
        let count = rng.random_range(1..=2u16);
        let mut lines = Vec::new();
        for line in first..first + u32::from(count) {
            let counter = &mut counters[line as usize];
            // Sometimes a late, older store.
            let ts = if *counter > 2 && rng.random_bool(0.1) {
                pmnet_wire::abd::timestamp(*counter - 1, 3)
            } else {
                *counter += 1;
                pmnet_wire::abd::timestamp(*counter, rng.random_range(1..4))
            };
            lines.push((ts, paired_value(line, ts)));
        }
        let encoded =
            pmnet_wire::abd::Store::encode_lines(lines.iter().map(|(ts, v)| (*ts, &v[..])));
        let mut payload = Vec::new();
        pmnet_wire::abd::Store {
            first,
            count,
            lines: &encoded,
        }
        .emit(&mut payload);
        let header = Header::new(
            pmnet_wire::PacketType::Reserved(pmnet_wire::abd::ABD_STORE),
            0,
            1,
            step,
        );
        sent.insert(
            step,
            (first..first + u32::from(count))
                .zip(lines.iter().map(|(ts, _)| *ts))
                .collect::<Vec<_>>(),
        );
        node.handle(now, coordinator, &header, &payload);
        let mut pending_acks: Vec<u32> = Vec::new();
        let drain = |node: &mut MemNode, pending_acks: &mut Vec<u32>| {
            while let Some(t) = node.poll_transmit() {
                let (header, payload) = Header::parse(&t.bytes).expect("parses");
                let ack = pmnet_wire::abd::StoreAck::parse(payload).expect("an ack");
                assert_eq!(ack.status, pmnet_wire::abd::NodeStatus::Ok);
                pending_acks.push(header.seq);
            }
        };
        drain(&mut node, &mut pending_acks);
        if rng.random_bool(0.5) {
            if let Some(batch) = node.poll_persist() {
                if rng.random_bool(0.05) {
                    // A crash in the middle of the batch: stored and flushed, no fence.
                    file.persist_batch_without_fence(&batch.work);
                    let crashed = file.region().crash(&mut rng);
                    let (reopened, recovered) = TableFile::open(crashed).expect("reopens");
                    file = reopened;
                    node = new_node(Table::recover_direct(geometry(), recovered), now);
                    assert!(node.is_member(), "seed {seed}: a crash cost the membership");
                    crashes += 1;
                    for line in 0..LINES {
                        let (ts, value) = node.durable_line(line);
                        if ts != 0 {
                            assert_eq!(
                                value,
                                paired_value(line, ts),
                                "seed {seed} step {step}: line {line} torn from its timestamp"
                            );
                        }
                        assert!(
                            ts >= acked[line as usize],
                            "seed {seed} step {step}: line {line} lost an acknowledged store"
                        );
                        counters[line as usize] =
                            counters[line as usize].max(pmnet_wire::abd::counter_of(ts));
                    }
                    continue;
                }
                file.persist_batch(&batch.work);
                node.on_persisted(now, batch.number);
                drain(&mut node, &mut pending_acks);
            }
        }
        // An ack promises the store's timestamps (or higher) durable.
        for step in pending_acks {
            for (line, ts) in sent.remove(&step).expect("an ack names a store sent") {
                acked[line as usize] = acked[line as usize].max(ts);
            }
        }
    }
    assert!(crashes > 5, "seed {seed}: only {crashes} crashes");
}

#[test]
fn learning_nodes_without_a_majority_of_members_wait_without_spinning() {
    let mut net = Net::new(3);
    assert_eq!(net.direct_op(0, 1, OpKind::Write(lines(1, 1))), Ok(vec![]));
    // Two of three lose their memory: the lines are beyond what a majority can restore.
    for i in 1..3 {
        let peers = (1..=3u16)
            .filter(|p| *p != i as u16 + 1)
            .map(addr)
            .collect();
        net.nodes[i] = fresh_node(addr(i as u16 + 1), peers, net.now);
    }
    // A store reaches them (they take it, acknowledging nothing that counts): they hold lines.
    assert_eq!(
        net.direct_op(1, 1, OpKind::Write(lines(2, 1))),
        Err(AbdError::Unavailable)
    );
    let before = net.delivered;
    net.advance(Duration::from_secs(10));
    assert!(!net.nodes[1].node.is_member() && !net.nodes[2].node.is_member());
    // Each asks each other node at most once per resend interval.
    let bound = 2 * 2 * 2 * (10_000 / crate::SYNC_RESEND.as_millis() as u64 + 1);
    assert!(
        net.delivered - before <= bound,
        "{} datagrams in 10 s (at most {bound})",
        net.delivered - before
    );
}

#[test]
fn a_restarted_coordinator_stamps_above_its_previous_life() {
    let mut net = Net::new(3);
    assert_eq!(net.direct_op(0, 1, OpKind::Write(lines(1, 1))), Ok(vec![]));
    let before = net.nodes[1].node.durable_line(0).0;
    // The same writer id again, as a restarted process starts it: its floor from its clock.
    let later_micros = (crate::COUNTER_EPOCH_UNIX_S + 86_400) * 1_000_000;
    let mut config = CoordinatorConfig::new((1..=3).map(addr).collect(), LINES, 2, 0xD3);
    config.counter_floor = crate::counter_floor_at(later_micros);
    net.direct = Coordinator::new(config);
    assert_eq!(net.direct_op(0, 1, OpKind::Write(lines(2, 1))), Ok(vec![]));
    let after = net.nodes[1].node.durable_line(0).0;
    assert!(after > before);
    assert_eq!(
        pmnet_wire::abd::counter_of(after),
        crate::counter_floor_at(later_micros) + 1
    );
    // The floor grows with the clock, a tick every 4 µs.
    assert_eq!(
        crate::counter_floor_at(later_micros + 4) - crate::counter_floor_at(later_micros),
        1
    );
}

/// A store with the maximum timestamp, forged (no keys) to one node: without a bound that
/// line would refuse every later write (each quorum holding the node sees a timestamp the
/// coordinator cannot go above). The node refuses a timestamp no coordinator can have issued,
/// and the line goes on taking writes.
#[test]
fn a_store_with_a_timestamp_no_coordinator_issued_is_refused() {
    let mut net = Net::new(3);
    assert_eq!(net.direct_op(0, 1, OpKind::Write(lines(1, 1))), Ok(vec![]));
    // The highest counter, and one above what a coordinator's clock can have reached in the
    // seconds the test runs (an hour of ticks beyond the lead).
    let ceiling = node_clock() + crate::COUNTER_LEAD_MAX + (1 << 30);
    for ts in [u64::MAX, pmnet_wire::abd::timestamp(ceiling, 9)] {
        let mut payload = Vec::new();
        pmnet_wire::abd::Store {
            first: 0,
            count: 1,
            lines: &pmnet_wire::abd::Store::encode_lines([(ts, &lines(0xEE, 1)[..])]),
        }
        .emit(&mut payload);
        let header = Header::new(
            pmnet_wire::PacketType::Reserved(pmnet_wire::abd::ABD_STORE),
            0,
            66,
            66,
        );
        net.deliver(
            addr(666),
            Transmit {
                destination: addr(1),
                bytes: header.encode(&payload),
            },
        );
        net.settle();
    }
    assert_eq!(net.nodes[0].node.counters().timestamps_refused, 2);
    assert_eq!(
        net.nodes[0].node.counters().acks,
        1,
        "the forgeries got no ack"
    );
    for round in 2..5u8 {
        assert_eq!(
            net.direct_op(0, 1, OpKind::Write(lines(round, 1))),
            Ok(vec![])
        );
        assert_eq!(net.direct_op(0, 1, OpKind::Read), Ok(lines(round, 1)));
    }
}

/// A node that missed writes of a line (it was cut off) still takes the next one: the bound
/// leaves room for what a coordinator can have issued meanwhile.
#[test]
fn a_node_that_missed_writes_takes_the_next_one() {
    let mut net = Net::new(3);
    net.nodes[0].up = false;
    for round in 1..20u8 {
        assert_eq!(
            net.direct_op(0, 1, OpKind::Write(lines(round, 1))),
            Ok(vec![])
        );
    }
    net.nodes[0].up = true;
    assert_eq!(net.direct_op(0, 1, OpKind::Write(lines(99, 1))), Ok(vec![]));
    assert_eq!(net.nodes[0].node.durable_line(0).1, lines(99, 1));
    assert_eq!(net.nodes[0].node.counters().timestamps_refused, 0);
}

/// A request to the device from client session 0xC1, sealed at `sealed_ms` (the device
/// started at `started_ms`), as its pipeline hands it over with keys.
fn sealed_request(
    net: &mut Net,
    seq: u32,
    op: pmnet_wire::abd::Op,
    data: &[u8],
    (sealed_ms, started_ms): (u64, u64),
) -> Vec<u8> {
    let mut payload = Vec::new();
    pmnet_wire::abd::Request {
        op,
        first: 2,
        count: 1,
        data,
    }
    .emit(&mut payload);
    let header = Header::new(
        pmnet_wire::PacketType::Reserved(pmnet_wire::abd::ABD_REQUEST),
        0,
        0xC1,
        seq,
    );
    let bytes = header.encode(&payload);
    net.device.note_seal(sealed_ms, started_ms);
    let _ = net.device.handle(net.now, addr(200), &header, &bytes);
    net.advance(Duration::from_secs(1));
    bytes
}

/// A restarted coordinating device learns a session again from its next request; a write of
/// that session sent before the restart, replayed verbatim, is refused: it may have run.
#[test]
fn a_restarted_device_refuses_a_write_sealed_before_it_learned_the_session() {
    use pmnet_wire::abd::Op;
    let mut net = Net::new(3);
    sealed_request(&mut net, 1, Op::Write, &lines(1, 1), (1_000, 500));
    let second = sealed_request(&mut net, 2, Op::Write, &lines(2, 1), (2_000, 500));
    assert_eq!(net.direct_op(2, 1, OpKind::Read), Ok(lines(2, 1)));

    let mut config = CoordinatorConfig::new((1..=3).map(addr).collect(), LINES, 1, 0xD1);
    config.counter_floor =
        crate::counter_floor_at((crate::COUNTER_EPOCH_UNIX_S + 86_400) * 1_000_000);
    net.device = AbdFunction::new(Coordinator::new(config));
    sealed_request(&mut net, 3, Op::Read, &[], (5_000, 4_000));
    let writes = net.device.coordinator().counters().writes;

    // Request 2 again, verbatim: refused, not run.
    let (header, _) = Header::parse(&second).expect("parses");
    net.device.note_seal(2_000, 4_000);
    let _ = net.device.handle(net.now, addr(200), &header, &second);
    net.advance(Duration::from_secs(1));
    assert_eq!(net.device.counters().replays_refused, 1);
    assert_eq!(net.device.coordinator().counters().writes, writes);

    // A later write of the session, sealed now, runs.
    sealed_request(&mut net, 4, Op::Write, &lines(4, 1), (5_002, 4_000));
    assert_eq!(net.direct_op(2, 1, OpKind::Read), Ok(lines(4, 1)));
}
