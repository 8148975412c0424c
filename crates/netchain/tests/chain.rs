//! Three chain members on a lossy, duplicating, reordering network, four virtual groups (each
//! member heads one or two), clients putting, deleting and reading a few keys — reads at any
//! member — with member processes crashing (each table reopened from what the crash left in
//! persistent memory). Every key's history of completed operations must be linearizable
//! (`pmnet-lincheck`), and compare-and-set must give a lock one holder at a time. Randomised:
//! prints its seed; `PMNET_SEED=N` replays one.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_lincheck::{check_by_key, Operation, Register, RegisterInput, RegisterOutput, PENDING};
use pmnet_netchain::{
    group_of, ChainClient, ChainConfig, ChainNode, ClientConfig, ClientOp, Geometry, Outcome,
    Table, TableFile,
};
use pmnet_pm::SimRegion;
use pmnet_proto::Time;
use pmnet_wire::netchain::{Op, Reply, Request, Status, CHAIN_REQUEST};
use pmnet_wire::{Header, PacketType};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const GROUPS: u16 = 4;
const MEMBERS: usize = 3;

fn seed() -> u64 {
    let seed = match std::env::var("PMNET_SEED") {
        Ok(text) => text.trim().parse().expect("PMNET_SEED is a u64"),
        Err(_) => rand::random(),
    };
    eprintln!("PMNET_SEED={seed}");
    seed
}

fn member(index: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 5, index as u8 + 1], 7600))
}

fn client_addr(index: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 6, index as u8 + 1], 40000))
}

fn geometry() -> Geometry {
    Geometry {
        buckets: 256,
        key_max: 16,
        value_max: 32,
    }
}

/// How long a client sends a request again: 10 tries 5 ms apart, and a margin.
const LIFETIME: Duration = Duration::from_millis(60);

fn config(index: usize) -> ChainConfig {
    let mut config = ChainConfig::new(
        member(index),
        1,
        (0..usize::from(GROUPS))
            .map(|group| {
                (0..MEMBERS)
                    .map(|at| member((group + at) % MEMBERS))
                    .collect()
            })
            .collect(),
    );
    config.request_lifetime = LIFETIME;
    config
}

struct Member {
    node: ChainNode,
    file: TableFile<SimRegion>,
    up: bool,
}

struct Net {
    now: Time,
    rng: ChaCha8Rng,
    queue: BTreeMap<(Time, u64), (SocketAddr, SocketAddr, Vec<u8>)>,
    next: u64,
    loss: f64,
    duplicate: f64,
}

impl Net {
    fn send(&mut self, from: SocketAddr, to: SocketAddr, bytes: Vec<u8>) {
        if self.rng.random_bool(self.loss) {
            return;
        }
        let copies = if self.rng.random_bool(self.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = Duration::from_micros(self.rng.random_range(10..400));
            self.next += 1;
            self.queue
                .insert((self.now + delay, self.next), (from, to, bytes.clone()));
        }
    }
}

/// A client and the operation it has in flight: (key, what it asked, when).
struct Client {
    session: ChainClient,
    current: Option<(Vec<u8>, ClientOp, u64)>,
}

type History = Vec<(
    Vec<u8>,
    Operation<RegisterInput<Vec<u8>>, RegisterOutput<Vec<u8>>>,
)>;

fn flush(members: &mut [Member], index: usize, net: &mut Net) {
    let now = net.now;
    let member = &mut members[index];
    while let Some(batch) = member.node.poll_persist() {
        member.file.persist_batch(&batch.work);
        member.node.on_persisted(now, batch.number);
    }
    while let Some(transmit) = member.node.poll_transmit() {
        net.send(member_addr_of(index), transmit.destination, transmit.bytes);
    }
}

fn member_addr_of(index: usize) -> SocketAddr {
    member(index)
}

fn run(seed: u64, crashes: bool) -> (History, u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut net = Net {
        now: Time::ZERO,
        rng: ChaCha8Rng::seed_from_u64(seed ^ 0x4e57),
        queue: BTreeMap::new(),
        next: 0,
        loss: rng.random_range(0.0..0.15),
        duplicate: rng.random_range(0.0..0.1),
    };
    let mut members: Vec<Member> = (0..MEMBERS)
        .map(|index| {
            let file = TableFile::format(SimRegion::new(geometry().region_len()), geometry())
                .expect("format");
            Member {
                node: ChainNode::new(config(index), Table::new(geometry()), Time::ZERO),
                file,
                up: true,
            }
        })
        .collect();
    let keys: Vec<Vec<u8>> = (0..4u8).map(|index| vec![b'k', index]).collect();
    let mut clients: Vec<Client> = (0..4)
        .map(|index| {
            let mut client_config = ClientConfig::new(0x5e55_0000 + index as u64, config(0).groups);
            // 10 sends or so within the members' idea of a request lifetime.
            client_config.retransmit_timeout_max = Duration::from_millis(5);
            client_config.request_lifetime = Duration::from_millis(50);
            Client {
                session: ChainClient::new(client_config),
                current: None,
            }
        })
        .collect();
    let mut history: History = Vec::new();
    let mut next_value = 0u32;
    let mut local_reads = 0;
    let mut issued = 0;
    let mut crash_count = 0;
    let nanos = |time: Time| time.as_nanos();
    for step in 0..100_000u32 {
        // Clients: issue, resend what timed out, record what ended.
        for (index, client) in clients.iter_mut().enumerate() {
            let now = net.now;
            if client.current.is_none() && issued < 600 && rng.random_bool(0.05) {
                let key = keys[rng.random_range(0..keys.len())].clone();
                let op = match rng.random_range(0..10) {
                    0..=4 => ClientOp::Get,
                    5..=8 => {
                        next_value += 1;
                        ClientOp::Put(next_value.to_be_bytes().to_vec())
                    }
                    _ => ClientOp::Delete,
                };
                client
                    .session
                    .start(now, &key, op.clone())
                    .expect("one request at a time");
                client.current = Some((key, op, nanos(now)));
                issued += 1;
            }
            client.session.handle_timeout(now);
            while let Some(transmit) = client.session.poll_transmit() {
                net.send(client_addr(index), transmit.destination, transmit.bytes);
            }
            while let Some((_, outcome)) = client.session.poll_outcome() {
                let (key, op, call) = client.current.take().expect("a request in flight");
                let input = match &op {
                    ClientOp::Get => RegisterInput::Read,
                    ClientOp::Put(value) => RegisterInput::Write(Some(value.clone())),
                    ClientOp::Delete => RegisterInput::Write(None),
                    ClientOp::CompareAndSet { .. } => unreachable!("not in this test"),
                };
                let (output, ret) = match outcome {
                    Outcome::Value { value, .. } => {
                        local_reads += 1;
                        (RegisterOutput::Value(value), nanos(now))
                    }
                    Outcome::Written { .. } => (RegisterOutput::Written, nanos(now)),
                    // Timed out, or in doubt after a head restart: applied or not.
                    Outcome::Unknown => (RegisterOutput::Unknown, PENDING),
                    other => panic!("seed {seed}: unexpected outcome {other:?}"),
                };
                history.push((
                    key,
                    Operation {
                        client: index as u64,
                        call,
                        ret,
                        input,
                        output,
                    },
                ));
            }
        }
        // Crashes and restarts of a member process.
        if crashes && step % 4_000 == 1_000 {
            let index = rng.random_range(0..MEMBERS);
            let member = &mut members[index];
            // A batch may be cut in the middle.
            if let Some(batch) = member.node.poll_persist() {
                member.file.persist_batch_without_fence(&batch.work);
            }
            let region = member.file.region().crash(&mut rng);
            let (file, recovered) = TableFile::open(region).expect("reopen");
            let table = Table::recover(file.geometry(), recovered);
            member.node = ChainNode::new(config(index), table, net.now);
            member.file = file;
            member.up = false;
            crash_count += 1;
        }
        if crashes && step % 4_000 == 1_300 {
            for member in &mut members {
                member.up = true;
            }
        }
        // The network: deliver what is due (advance to the next event if nothing is).
        let due = net.queue.first_key_value().map(|(key, _)| key.0);
        let wake = members
            .iter()
            .filter_map(|member| member.node.poll_timeout())
            .min();
        let next = [due, wake, Some(net.now + Duration::from_micros(50))]
            .into_iter()
            .flatten()
            .min()
            .expect("a time");
        net.now = next.max(net.now);
        while let Some((&(at, order), _)) = net.queue.first_key_value() {
            if at > net.now {
                break;
            }
            let (from, to, bytes) = net.queue.remove(&(at, order)).expect("present");
            if let Some(index) = (0..MEMBERS).find(|&index| member(index) == to) {
                if !members[index].up {
                    continue;
                }
                let Ok((header, payload)) = Header::parse(&bytes) else {
                    continue;
                };
                let now = net.now;
                members[index].node.handle(now, from, &header, payload);
                flush(&mut members, index, &mut net);
                continue;
            }
            // A client's reply.
            if let Some(index) = (0..clients.len()).find(|&index| client_addr(index) == to) {
                if !(0..MEMBERS).any(|index| member(index) == from) {
                    panic!("seed {seed}: a reply from {from}");
                }
                clients[index].session.handle(&bytes);
            }
        }
        for index in 0..MEMBERS {
            if members[index].up {
                let now = net.now;
                members[index].node.handle_timeout(now);
                flush(&mut members, index, &mut net);
            }
        }
        if issued >= 600 && clients.iter().all(|client| client.current.is_none()) {
            break;
        }
    }
    let total = |count: fn(&pmnet_netchain::ChainCounters) -> u64| {
        members
            .iter()
            .map(|member| count(member.node.counters()))
            .sum::<u64>()
    };
    eprintln!(
        "seed {seed}: loss {:.3}, duplication {:.3}; {} operations; members: {} writes \
         stamped, {} passed on, {} resent, {} reads answered where they came, {} relayed to \
         the tail, {} commits",
        net.loss,
        net.duplicate,
        history.len(),
        total(|c| c.writes_stamped),
        total(|c| c.writes_passed_on),
        total(|c| c.writes_resent),
        total(|c| c.reads_answered_here),
        total(|c| c.reads_relayed),
        total(|c| c.commits),
    );
    assert!(total(|c| c.reads_answered_here) > 0 && total(|c| c.commits) > 0);
    eprintln!("{crash_count} member crashes");
    assert!(
        !crashes || crash_count > 0,
        "seed {seed}: no crash happened"
    );
    (history, local_reads)
}

fn check(seed: u64, crashes: bool) {
    let (history, reads) = run(seed, crashes);
    let completed = history
        .iter()
        .filter(|(_, operation)| operation.ret != PENDING)
        .count();
    assert!(completed > 100, "seed {seed}: only {completed} completed");
    assert!(reads > 0);
    let verdict = check_by_key(&Register::default(), &history, 5_000_000);
    assert!(
        verdict.is_linearizable(),
        "seed {seed}: {verdict:?} ({} operations)",
        history.len()
    );
}

#[test]
fn every_key_s_history_through_the_chain_is_linearizable() {
    let seed = seed();
    check(seed, false);
}

#[test]
fn every_key_s_history_stays_linearizable_when_members_crash() {
    let seed = seed();
    check(seed, true);
}

#[test]
fn compare_and_set_gives_a_lock_one_holder_at_a_time() {
    let members: Vec<ChainNode> = (0..MEMBERS)
        .map(|index| ChainNode::new(config(index), Table::new(geometry()), Time::ZERO))
        .collect();
    let mut files: Vec<TableFile<SimRegion>> = (0..MEMBERS)
        .map(|_| {
            TableFile::format(SimRegion::new(geometry().region_len()), geometry()).expect("format")
        })
        .collect();
    let mut members = members;
    let key = b"lock".to_vec();
    let head = config(0).groups[usize::from(group_of(&key, GROUPS))][0];
    let head_index = (0..MEMBERS).find(|&index| member(index) == head).unwrap();
    // Drive messages to completion on a perfect network; returns the replies per client.
    let mut deliver = |members: &mut Vec<ChainNode>,
                       first: (SocketAddr, SocketAddr, Vec<u8>)|
     -> Vec<(SocketAddr, Vec<u8>)> {
        let mut queue = std::collections::VecDeque::from([first]);
        let mut replies = Vec::new();
        while let Some((from, to, bytes)) = queue.pop_front() {
            let Some(index) = (0..MEMBERS).find(|&index| member(index) == to) else {
                replies.push((to, bytes));
                continue;
            };
            let (header, payload) = Header::parse(&bytes).unwrap();
            members[index].handle(Time::ZERO, from, &header, payload);
            while let Some(batch) = members[index].poll_persist() {
                files[index].persist_batch(&batch.work);
                members[index].on_persisted(Time::ZERO, batch.number);
            }
            while let Some(transmit) = members[index].poll_transmit() {
                queue.push_back((member(index), transmit.destination, transmit.bytes));
            }
        }
        replies
    };
    let cas = |client: usize, request: u32, expected: u64, value: &[u8]| {
        let mut payload = Vec::new();
        Request {
            op: Op::CompareAndSet { expected },
            group: group_of(b"lock", GROUPS),
            key: b"lock",
            value,
        }
        .emit(&mut payload);
        (
            client_addr(client),
            head,
            Header::new(
                PacketType::Reserved(CHAIN_REQUEST),
                1,
                client as u64,
                request,
            )
            .encode(&payload),
        )
    };
    let status = |replies: &[(SocketAddr, Vec<u8>)]| {
        let (_, bytes) = replies.last().expect("a reply");
        let (_, payload) = Header::parse(bytes).unwrap();
        let reply = Reply::parse(payload).unwrap();
        (reply.status, reply.version)
    };
    // Both clients try to take the free lock (expected 0: absent): one gets it.
    let first = deliver(&mut members, cas(0, 1, 0, b"A"));
    let second = deliver(&mut members, cas(1, 1, 0, b"B"));
    assert_eq!(status(&first), (Status::Ok, 1), "A holds the lock");
    assert_eq!(
        status(&second),
        (Status::CompareFailed, 1),
        "B sees A's version"
    );
    // A releases it (compare-and-set to empty at its version), then B takes it.
    let release = deliver(&mut members, cas(0, 2, 1, b""));
    assert_eq!(status(&release), (Status::Ok, 2));
    let take = deliver(&mut members, cas(1, 2, 2, b"B"));
    assert_eq!(status(&take), (Status::Ok, 3));
    for member in &members {
        assert_eq!(
            member.table().durable(b"lock").map(|v| v.seq),
            Some(3),
            "every member holds the lock's latest version"
        );
    }
    assert_eq!(
        members[head_index].counters().writes_stamped,
        3,
        "the head stamped the three that held"
    );
}

/// Any datagram, from anyone, of NetChain's types: a member never panics, and what it keeps
/// stays bounded by the table.
#[test]
fn a_member_survives_any_datagram_from_anyone() {
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // A member with a controller (one of the sources), so configurations and grants count.
    let mut controlled = config(1);
    controlled.controller = Some(client_addr(1));
    let mut node = ChainNode::new(controlled, Table::new(geometry()), Time::ZERO);
    let mut file =
        TableFile::format(SimRegion::new(geometry().region_len()), geometry()).expect("format");
    let sources = [
        member(0),
        member(1),
        member(2),
        client_addr(0),
        client_addr(1),
    ];
    let mut now = Time::ZERO;
    for round in 0..50_000u32 {
        // The chain's types and the controller's.
        let packet_type = 0x20 + rng.random_range(0..10u8);
        let len = rng.random_range(0..80);
        let mut payload: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        if round % 3 == 0 && payload.len() >= 12 {
            // Mostly well-formed shapes: small codes, short keys.
            payload[0] = rng.random_range(0..5);
            payload[1] = 0;
            payload[2] = rng.random_range(0..GROUPS as u8);
        }
        let header = Header::new(
            PacketType::Reserved(packet_type),
            1,
            rng.random_range(0..4),
            rng.random(),
        );
        let bytes = header.encode(&payload);
        let (header, payload) = Header::parse(&bytes).expect("a header we made");
        let from = sources[rng.random_range(0..sources.len())];
        node.handle(now, from, &header, payload);
        while let Some(batch) = node.poll_persist() {
            file.persist_batch(&batch.work);
            node.on_persisted(now, batch.number);
        }
        while node.poll_transmit().is_some() {}
        now = now + Duration::from_micros(rng.random_range(0..2_000));
        node.handle_timeout(now);
    }
    assert!(node.table().len() <= geometry().buckets as usize);
    assert!(node.counters().dropped > 0);
}

/// Any datagram, from anyone, at the controller: it never panics, never takes a stranger as
/// a member, and answers configuration requests at a bounded rate.
#[test]
fn the_controller_survives_any_datagram_from_anyone() {
    use pmnet_netchain::{Controller, ControllerConfig};
    use pmnet_wire::netchain::control::{Fetch, CHAIN_FETCH};
    let seed = seed();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let members: Vec<SocketAddr> = (0..MEMBERS).map(member).collect();
    let mut controller =
        Controller::new(ControllerConfig::default(), &members, GROUPS, Time::ZERO).unwrap();
    let mut now = Time::ZERO;
    let mut sent = 0u64;
    for round in 0..50_000u32 {
        // Half of them well-formed requests for the configuration: a flood.
        let packet_type = if round % 2 == 0 {
            CHAIN_FETCH
        } else {
            0x20 + rng.random_range(0..10u8)
        };
        let len = rng.random_range(0..60);
        let payload: Vec<u8> = if packet_type == CHAIN_FETCH && round % 4 == 0 {
            let mut out = Vec::new();
            Fetch { epoch: 0 }.emit(&mut out);
            out
        } else {
            (0..len).map(|_| rng.random()).collect()
        };
        let bytes = Header::new(PacketType::Reserved(packet_type), 1, 0, 0).encode(&payload);
        let (header, payload) = Header::parse(&bytes).expect("a header we made");
        controller.handle(now, client_addr(rng.random_range(0..4)), &header, payload);
        while controller.poll_transmit().is_some() {
            sent += 1;
        }
        let _ = controller.poll_save();
        now = now + Duration::from_micros(rng.random_range(0..100));
    }
    assert_eq!(controller.layout().members, members, "no stranger joined");
    let seconds = now.as_nanos() as f64 / 1e9;
    let bound = ControllerConfig::default().fetches_per_second as f64 * seconds + 300.0;
    assert!(
        (sent as f64) <= bound,
        "{sent} datagrams sent in {seconds:.2} s (bound {bound:.0})"
    );
    assert!(controller.counters().fetches_answered > 0);
    assert!(controller.counters().fetches_refused > 0);
    assert!(controller.counters().dropped > 0);
}
