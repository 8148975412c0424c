//! Chain members driven by hand: compare-and-set gives a lock one holder at a time, and a
//! member or the controller survives any datagram from anyone. (Histories of concurrent
//! clients under faults, checked for linearizability, are the simulator's chain-store world:
//! `crates/sim/src/chain.rs`.) Randomised: prints its seed; `PMNET_SEED=N` replays one.

use std::net::SocketAddr;
use std::time::Duration;

use pmnet_netchain::{group_of, ChainConfig, ChainNode, Geometry, Table, TableFile};
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
    let dropped = &node.counters().dropped;
    assert!(
        dropped.get("bad_payload").is_some_and(|&count| count > 0),
        "garbage is counted by its reason: {dropped:?}"
    );
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
        controller.handle(now, client_addr(rng.random_range(0..4)), &bytes);
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

/// The controller tells its operator what it changes, a line each: a silent member is
/// suspected, taken out of its chains once its lease ran out, and a spare starts copying a
/// group it left; a member heard again before that is back.
#[test]
fn the_controller_tells_of_each_change() {
    use pmnet_netchain::{Controller, ControllerConfig, ControllerEvent};
    use pmnet_wire::netchain::control::{MemberStatus, CHAIN_STATUS};
    // Three in chains and a spare.
    let members: Vec<SocketAddr> = (0..4).map(member).collect();
    let config = ControllerConfig {
        chain_length: 3,
        suspect_after: Duration::from_millis(100),
        lease: Duration::from_millis(300),
        ..ControllerConfig::default()
    };
    let (suspect_after, lease) = (config.suspect_after, config.lease);
    let mut controller = Controller::new(config, &members, GROUPS, Time::ZERO).unwrap();
    let status = |controller: &mut Controller, now: Time, index: usize| {
        let mut payload = Vec::new();
        MemberStatus {
            epoch: controller.layout().epoch,
            boot: index as u64 + 1,
            stamp: now.as_nanos(),
            reports: Vec::new(),
        }
        .emit(&mut payload);
        let bytes = Header::new(PacketType::Reserved(CHAIN_STATUS), 1, 0, 0).encode(&payload);
        controller.handle(now, members[index], &bytes);
    };
    let mut events = Vec::new();
    let mut now = Time::ZERO;
    let step = Duration::from_millis(10);
    // After the controller's start grace (1 s), member 1 falls silent past the suspicion
    // delay, not past its lease, and comes back; then member 0 falls silent for good.
    let silent_1 = (
        Time::ZERO + Duration::from_secs(2),
        Time::ZERO + Duration::from_secs(2) + suspect_after + step * 5,
    );
    let silent_0_from = silent_1.1 + step * 10;
    let end = silent_0_from + 4 * (suspect_after + lease);
    while now < end {
        for index in 0..members.len() {
            let quiet = (index == 1 && now >= silent_1.0 && now < silent_1.1)
                || (index == 0 && now >= silent_0_from);
            if !quiet {
                status(&mut controller, now, index);
            }
        }
        controller.handle_timeout(now);
        while controller.poll_transmit().is_some() {}
        let _ = controller.poll_save();
        while let Some(event) = controller.poll_event() {
            events.push(event);
        }
        now = now + step;
    }
    let lines: Vec<String> = events.iter().map(ToString::to_string).collect();
    eprintln!("{}", lines.join("\n"));
    let position = |wanted: &dyn Fn(&ControllerEvent) -> bool| {
        events
            .iter()
            .position(wanted)
            .unwrap_or_else(|| panic!("missing from {lines:#?}"))
    };
    let back_1 = position(&|event| *event == ControllerEvent::Back { member: members[1] });
    let suspected_1 = position(
        &|event| matches!(event, ControllerEvent::Suspected { member, .. } if *member == members[1]),
    );
    assert!(suspected_1 < back_1, "{lines:#?}");
    assert!(
        !events.iter().any(
            |event| matches!(event, ControllerEvent::Removed { member, .. } if *member == members[1])
        ),
        "member 1 came back within its lease: {lines:#?}"
    );
    let suspected_0 = position(
        &|event| matches!(event, ControllerEvent::Suspected { member, .. } if *member == members[0]),
    );
    let removed_0 = position(
        &|event| matches!(event, ControllerEvent::Removed { member, groups } if *member == members[0] && !groups.is_empty()),
    );
    let copying_3 = position(
        &|event| matches!(event, ControllerEvent::Copying { member, .. } if *member == members[3]),
    );
    assert!(
        suspected_0 < removed_0 && removed_0 < copying_3,
        "{lines:#?}"
    );
    assert!(
        lines[removed_0].starts_with(&format!("member {} removed from g", members[0])),
        "{}",
        lines[removed_0]
    );
    assert!(
        lines[copying_3].starts_with(&format!("member {} copying g", members[3])),
        "{}",
        lines[copying_3]
    );
}

/// Three members under a controller on a network of the test's own: every datagram delivered
/// at once, in order, except to members that are down and replies the client does not hear.
struct ControlledChain {
    controller: pmnet_netchain::Controller,
    nodes: Vec<ChainNode>,
    files: Vec<TableFile<SimRegion>>,
    queue: std::collections::VecDeque<(SocketAddr, SocketAddr, Vec<u8>)>,
    /// What reached the client: (from, status, version).
    replies: Vec<(SocketAddr, Status, u64)>,
    down: Vec<bool>,
    drop_replies: bool,
    now: Time,
}

const CONTROLLER: SocketAddr = SocketAddr::new(
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 7, 1)),
    7700,
);

impl ControlledChain {
    /// Three members, in chains of three.
    fn new() -> ControlledChain {
        ControlledChain::with_members(3)
    }

    /// `count` members, chains of three over the first three (the others spares).
    fn with_members(count: usize) -> ControlledChain {
        use pmnet_netchain::{Controller, ControllerConfig};
        let addrs: Vec<SocketAddr> = (0..count).map(member).collect();
        let config = ControllerConfig {
            chain_length: 3,
            suspect_after: Duration::from_millis(50),
            lease: Duration::from_millis(100),
            ..ControllerConfig::default()
        };
        ControlledChain {
            controller: Controller::new(config, &addrs, 1, Time::ZERO).expect("a controller"),
            nodes: addrs
                .iter()
                .map(|addr| {
                    let mut config = ChainConfig::controlled(*addr, 1, CONTROLLER);
                    config.request_lifetime = Duration::from_secs(2);
                    ChainNode::new(config, Table::new(geometry()), Time::ZERO)
                })
                .collect(),
            files: (0..count)
                .map(|_| {
                    TableFile::format(SimRegion::new(geometry().region_len()), geometry())
                        .expect("format")
                })
                .collect(),
            queue: Default::default(),
            replies: Vec::new(),
            down: vec![false; count],
            drop_replies: false,
            now: Time::ZERO,
        }
    }

    /// Deliver until nothing is in flight, then let time pass to `until` in 5 ms steps.
    fn settle_for(&mut self, duration: Duration) {
        let until = self.now + duration;
        while self.now < until {
            self.controller.handle_timeout(self.now);
            for (index, node) in self.nodes.iter_mut().enumerate() {
                if !self.down[index] {
                    node.handle_timeout(self.now);
                }
            }
            self.deliver();
            self.now = self.now + Duration::from_millis(5);
        }
    }

    fn deliver(&mut self) {
        let now = self.now;
        loop {
            while let Some(transmit) = self.controller.poll_transmit() {
                self.queue
                    .push_back((CONTROLLER, transmit.destination, transmit.bytes));
            }
            let _ = self.controller.poll_save();
            for (index, node) in self.nodes.iter_mut().enumerate() {
                while let Some(batch) = node.poll_persist() {
                    self.files[index].persist_batch(&batch.work);
                    node.on_persisted(now, batch.number);
                }
                while let Some(transmit) = node.poll_transmit() {
                    if !self.down[index] {
                        self.queue
                            .push_back((member(index), transmit.destination, transmit.bytes));
                    }
                }
            }
            let Some((from, to, bytes)) = self.queue.pop_front() else {
                return;
            };
            if to == CONTROLLER {
                self.controller.handle(now, from, &bytes);
            } else if let Some(index) = (0..self.nodes.len()).find(|index| member(*index) == to) {
                if !self.down[index] {
                    let (header, payload) = Header::parse(&bytes).unwrap();
                    self.nodes[index].handle(now, from, &header, payload);
                }
            } else if !self.drop_replies {
                let (_, payload) = Header::parse(&bytes).unwrap();
                let reply = Reply::parse(payload).unwrap();
                self.replies.push((from, reply.status, reply.version));
            }
        }
    }

    /// A request of `session` to `to` about key `lock` (group 0 of 1).
    fn send(&mut self, to: usize, session: u64, seq: u32, op: Op, value: &[u8], flags: u16) {
        let mut payload = Vec::new();
        Request {
            op,
            group: 0,
            key: b"lock",
            value,
        }
        .emit(&mut payload);
        let mut header = Header::new(PacketType::Reserved(CHAIN_REQUEST), 1, session, seq);
        header.flags = flags;
        self.queue.push_back((
            client_addr(session as usize),
            member(to),
            header.encode(&payload),
        ));
        self.settle_for(Duration::from_millis(50));
    }
}

/// A compare-and-set is decided once, whichever member answers it. The head decides a
/// failure; its answer is lost; the head is lost for good and the controller makes the next
/// member head; the client's retransmission reaches the new head, which answers "compare
/// failed" as the first head did — not "in doubt", and never by applying it: the key is
/// changed meanwhile so that a second decision would succeed.
#[test]
fn a_failed_compare_and_set_is_decided_once_across_a_change_of_head() {
    use pmnet_wire::netchain::RETRANSMITTED;
    let mut chain = ControlledChain::new();
    // Past the controller's start grace: every member serving under its lease.
    chain.settle_for(Duration::from_millis(1500));
    let layout = chain.controller.layout().chains()[0].clone();
    assert_eq!(layout.len(), 3, "{layout:?}");
    let index_of = |addr: SocketAddr| (0..3).find(|index| member(*index) == addr).unwrap();
    let (head, second) = (index_of(layout[0]), index_of(layout[1]));
    // Session 1 puts the lock (version 1).
    chain.send(head, 1, 1, Op::Put, b"A", 0);
    // Session 2's compare-and-set expects the lock absent: it fails on version 1. Its answer
    // is lost.
    chain.drop_replies = true;
    chain.send(head, 2, 1, Op::CompareAndSet { expected: 0 }, b"B", 0);
    chain.drop_replies = false;
    // Session 1 deletes the lock: a second decision of the compare-and-set would now find it
    // absent and succeed.
    chain.send(head, 1, 2, Op::Delete, b"", 0);
    chain.replies.clear();
    // The head is lost for good; the controller takes it out and the next member heads.
    chain.down[head] = true;
    chain.settle_for(Duration::from_millis(500));
    assert_eq!(
        chain.controller.layout().chains()[0].first(),
        Some(&member(second)),
        "the next member heads the group"
    );
    // Session 2 sends the compare-and-set again, to the new head.
    chain.send(
        second,
        2,
        1,
        Op::CompareAndSet { expected: 0 },
        b"B",
        RETRANSMITTED,
    );
    let answers: Vec<(Status, u64)> = chain
        .replies
        .iter()
        .map(|(_, status, version)| (*status, *version))
        .collect();
    assert_eq!(
        answers,
        vec![(Status::CompareFailed, 1)],
        "decided once: the first head's answer, again"
    );
    for (index, node) in chain.nodes.iter().enumerate() {
        if index != head {
            assert!(
                node.table()
                    .durable(b"lock")
                    .is_some_and(|v| v.value.is_none()),
                "the lock stays deleted at {}",
                member(index)
            );
        }
    }
}

/// NetChain's placement: a member brought into a chain takes the place of the one taken out.
/// The middle member of the group is lost for good; the spare is copied in and takes its place
/// between the head and the tail (not the tail's place), and the chain serves writes and reads
/// through it. (A lost head's place goes to the member after it: a new head would answer
/// retransmissions "in doubt".)
#[test]
fn a_member_brought_in_takes_the_place_of_the_one_taken_out() {
    let mut chain = ControlledChain::with_members(4);
    chain.settle_for(Duration::from_millis(1500));
    let before = chain.controller.layout().chains()[0].clone();
    assert_eq!(before, vec![member(0), member(1), member(2)]);
    chain.send(0, 1, 1, Op::Put, b"A", 0);
    chain.down[1] = true;
    let mut waited = Duration::ZERO;
    while chain.controller.layout().chains()[0] != [member(0), member(3), member(2)] {
        assert!(
            waited < Duration::from_secs(10),
            "the spare never took the lost member's place: {:?}",
            chain.controller.layout().groups
        );
        chain.settle_for(Duration::from_millis(100));
        waited += Duration::from_millis(100);
    }
    let said: Vec<String> = std::iter::from_fn(|| chain.controller.poll_event())
        .map(|event| event.to_string())
        .collect();
    assert!(
        said.iter().any(|line| line
            == &format!(
                "member {} joined g0 at position 2 of 3, where the member taken out was",
                member(3)
            )),
        "{said:#?}"
    );
    // Writes resume once every member runs the new chain: through the new middle member.
    chain.settle_for(Duration::from_millis(200));
    chain.replies.clear();
    chain.send(0, 1, 2, Op::Put, b"B", 0);
    let answers: Vec<(SocketAddr, Status, u64)> = chain.replies.clone();
    assert_eq!(
        answers,
        vec![(member(2), Status::Ok, 2)],
        "the tail answers version 2"
    );
    for index in [0, 2, 3] {
        assert_eq!(
            chain.nodes[index]
                .table()
                .durable(b"lock")
                .and_then(|v| v.value.clone()),
            Some(b"B".to_vec()),
            "{}",
            member(index)
        );
    }
}
