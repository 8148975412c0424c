//! A device is a pipeline of functions: a second function in front of the log owns its own
//! packet type, while the log behind it keeps logging and acking as before.

use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::{
    ClientEvent, Completion, Counter, FrontFunction, NetworkFunction, Persist, PersistBatch,
    Pipeline, Stack, StackWork, Time, Transmit, Verdict, COUNTER_TYPE_CODE,
};
use pmnet_sim::{client_addr, device_addr, World, DEVICE_ID, SERVER_ID};
use pmnet_wire::{Header, PacketType};

const STEPS: usize = 100_000;

fn counter() -> Box<dyn FrontFunction> {
    Box::new(Counter::default())
}

fn ask(session: u64) -> Vec<u8> {
    Header::new(
        PacketType::Reserved(COUNTER_TYPE_CODE),
        SERVER_ID,
        session,
        1,
    )
    .encode(&[0; 8])
}

#[test]
fn a_function_in_front_of_the_log_owns_its_type_and_the_log_still_acks_updates() {
    let mut world = World::new(1, Some(64)).with_front(counter);
    world.run_for(Duration::from_secs(1));
    let session = world.session(0);
    world.inject(client_addr(0), device_addr(0), ask(session));
    world.inject(client_addr(0), device_addr(0), ask(session));
    let seq = world.update(0, b"x=1");
    world.drive_until(STEPS, |w| w.completion(0, seq).is_some());
    assert!(matches!(
        world.completion(0, seq),
        Some(ClientEvent::Completed {
            completion: Completion::Logged {
                device_id: DEVICE_ID
            },
            ..
        })
    ));
    world.run_for(Duration::from_secs(1));
    let answers = world
        .seen_of(PacketType::Reserved(COUNTER_TYPE_CODE))
        .iter()
        .filter(|seen| seen.from == device_addr(0) && seen.to == client_addr(0))
        .count();
    assert_eq!(answers, 2, "each ask answered once by the front function");
    let front = format!("{:?}", world.device(0).pipeline.fronts());
    assert!(front.contains("count: 2"), "{front}");
    assert_eq!(world.device(0).device().counters().updates_logged, 1);
    assert_eq!(world.device(0).device().live_entry_count(), 0);
}

#[test]
fn a_reserved_type_no_function_owns_is_counted_and_dropped() {
    let mut world = World::new(1, Some(64));
    world.run_for(Duration::from_secs(1));
    let session = world.session(0);
    // Without the counter in front, its type belongs to nobody.
    world.inject(client_addr(0), device_addr(0), ask(session));
    let chain = Header::new(PacketType::Reserved(0x20), SERVER_ID, session, 1).encode(b"x");
    world.inject(client_addr(0), device_addr(0), chain);
    world.run_for(Duration::from_secs(1));
    assert_eq!(
        world.device(0).pipeline.dropped().get("unknown_type"),
        Some(&2)
    );
    assert!(world
        .seen_of(PacketType::Reserved(COUNTER_TYPE_CODE))
        .iter()
        .all(|seen| seen.from != device_addr(0)));
}

/// A toy function that owns one reserved type and asks to persist each datagram's sequence
/// number; it records which of its batches were reported durable.
#[derive(Debug, Default)]
struct Journal {
    code: u8,
    pending: Vec<u32>,
    next_batch: u64,
    durable_through: u64,
}

impl Journal {
    fn new(code: u8) -> Journal {
        Journal {
            code,
            next_batch: 1,
            ..Journal::default()
        }
    }
}

impl NetworkFunction for Journal {
    type Work = u32;

    fn handle(&mut self, _: Time, _: SocketAddr, header: &Header, _: &[u8]) -> Verdict {
        if header.packet_type != PacketType::Reserved(self.code) {
            return Verdict::Pass;
        }
        self.pending.push(header.seq);
        Verdict::Consumed
    }
    fn handle_timeout(&mut self, _: Time) {}
    fn on_persisted(&mut self, _: Time, through: u64) {
        assert!(through >= self.durable_through && through < self.next_batch);
        self.durable_through = through;
    }
    fn poll_transmit(&mut self) -> Option<Transmit> {
        None
    }
    fn poll_persist(&mut self) -> Option<PersistBatch<u32>> {
        if self.pending.is_empty() {
            return None;
        }
        let number = self.next_batch;
        self.next_batch += 1;
        Some(PersistBatch {
            number,
            work: std::mem::take(&mut self.pending),
        })
    }
    fn poll_timeout(&self) -> Option<Time> {
        None
    }
}

/// An executor that remembers what it carried out.
#[derive(Debug, Default)]
struct Recorded(Vec<u32>);

impl Persist<u32> for Recorded {
    fn persist(&mut self, work: Vec<u32>) {
        self.0.extend(work);
    }
}

#[test]
fn a_stack_numbers_its_batches_and_reports_each_function_through_its_own() {
    let from: SocketAddr = "192.0.2.1:9".parse().unwrap();
    let mut pipeline = Pipeline::new(Stack::new(Journal::new(0x10), Journal::new(0x11)));
    let datagram =
        |code: u8, seq: u32| Header::new(PacketType::Reserved(code), SERVER_ID, 1, seq).encode(&[]);
    pipeline.handle(Time::ZERO, from, &datagram(0x10, 1));
    pipeline.handle(Time::ZERO, from, &datagram(0x11, 2));
    pipeline.handle(Time::ZERO, from, &datagram(0x12, 3)); // nobody's
    let first = pipeline.poll_persist().unwrap();
    assert_eq!(first.number, 1);
    assert_eq!(first.work, vec![StackWork::Front(1), StackWork::Back(2)]);
    // A second batch before the first is reported: the back function alone.
    pipeline.handle(Time::ZERO, from, &datagram(0x11, 4));
    let second = pipeline.poll_persist().unwrap();
    assert_eq!(second.number, 2);
    assert_eq!(second.work, vec![StackWork::Back(4)]);
    assert!(pipeline.poll_persist().is_none());

    let mut executor = (Recorded::default(), Recorded::default());
    executor.persist(first.work);
    executor.persist(second.work);
    assert_eq!(
        (executor.0 .0.clone(), executor.1 .0.clone()),
        (vec![1], vec![2, 4])
    );
    // One report through batch 2 covers both: the front's batch 1 and the back's 1 and 2.
    pipeline.on_persisted(Time::ZERO, 2);
    let stack = pipeline.functions();
    assert_eq!(stack.front.durable_through, 1);
    assert_eq!(stack.back.durable_through, 2);
    assert_eq!(pipeline.drops().get("unknown_type"), Some(&1));

    // persist_with carries out and reports in one go.
    pipeline.handle(Time::ZERO, from, &datagram(0x10, 5));
    assert_eq!(pipeline.persist_with(Time::ZERO, &mut executor), 1);
    assert_eq!(executor.0 .0, vec![1, 5]);
    assert_eq!(pipeline.functions().front.durable_through, 2);
}

#[test]
#[should_panic(expected = "before it was emitted")]
fn reporting_a_batch_never_emitted_is_a_bug() {
    let mut stack = Stack::new(Journal::new(0x10), Journal::new(0x11));
    stack.on_persisted(Time::ZERO, 1);
}

/// Records the type of every datagram the functions behind it sent.
#[derive(Debug, Default)]
struct Witness {
    seen: Vec<PacketType>,
}

impl NetworkFunction for Witness {
    type Work = pmnet_proto::RegionWrite;

    fn handle(&mut self, _: Time, _: SocketAddr, _: &Header, _: &[u8]) -> Verdict {
        Verdict::Pass
    }
    fn handle_timeout(&mut self, _: Time) {}
    fn on_persisted(&mut self, _: Time, _: u64) {}
    fn poll_transmit(&mut self) -> Option<Transmit> {
        None
    }
    fn poll_persist(&mut self) -> Option<PersistBatch<pmnet_proto::RegionWrite>> {
        None
    }
    fn poll_timeout(&self) -> Option<Time> {
        None
    }
    fn on_sent(&mut self, transmit: &Transmit) {
        if let Ok((header, _)) = Header::parse(&transmit.bytes) {
            self.seen.push(header.packet_type);
        }
    }
}

#[test]
fn a_function_in_front_of_the_log_sees_what_the_log_sends() {
    let mut world = World::new(1, Some(64)).with_front(|| Box::new(Witness::default()));
    world.run_for(Duration::from_secs(1));
    let seq = world.update(0, b"x=1");
    world.drive_until(STEPS, |w| w.completion(0, seq).is_some());
    world.run_for(Duration::from_secs(1));
    let front = format!("{:?}", world.device(0).pipeline.fronts());
    // The log's PMNet-ACK to the client and its forward of the update to the server.
    assert!(front.contains("PmnetAck"), "{front}");
    assert!(
        front.contains("UpdateRequest") || front.contains("Batch"),
        "{front}"
    );
}
