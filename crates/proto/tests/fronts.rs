//! Any number of functions in front of a device's log ([`Fronts`]): offered a datagram in
//! order, a function may consume it, pass it on, or rewrite it and pass the rewritten bytes
//! on; their region work goes out in one numbered batch that one executor carries out, each
//! write on its own function's region, and each function hears of its own batches.

use std::net::SocketAddr;

use pmnet_pm::{PmRegion, SimRegion};
use pmnet_proto::{
    Fronts, NetworkFunction, Persist, PersistBatch, RegionExecutor, RegionWrite, Time, Transmit,
    Verdict,
};
use pmnet_wire::{Header, PacketType};

const SERVER_ID: u16 = 1;

/// Owns one reserved type: writes each datagram's sequence number into its region (at
/// `seq * 4`) and answers once the write is durable. Rewrites datagrams of `rewrites`: their
/// sequence number plus 100, passed on.
#[derive(Debug)]
struct Recorder {
    code: u8,
    rewrites: Option<u8>,
    /// Sequence numbers seen, as offered (after any rewriting in front).
    seen: Vec<u32>,
    pending: Vec<u32>,
    in_flight: Vec<(u64, Vec<u32>)>,
    durable: Vec<u32>,
    sent_behind: usize,
    next_batch: u64,
}

impl Recorder {
    fn new(code: u8, rewrites: Option<u8>) -> Recorder {
        Recorder {
            code,
            rewrites,
            seen: Vec::new(),
            pending: Vec::new(),
            in_flight: Vec::new(),
            durable: Vec::new(),
            sent_behind: 0,
            next_batch: 1,
        }
    }
}

impl NetworkFunction for Recorder {
    type Work = RegionWrite;

    fn handle(&mut self, _: Time, _: SocketAddr, header: &Header, datagram: &[u8]) -> Verdict {
        if Some(header.packet_type) == self.rewrites.map(PacketType::Reserved) {
            let rewritten = Header {
                seq: header.seq + 100,
                ..*header
            };
            return Verdict::Rewritten(rewritten.encode(&datagram[pmnet_wire::HEADER_LEN..]));
        }
        if header.packet_type != PacketType::Reserved(self.code) {
            return Verdict::Pass;
        }
        self.seen.push(header.seq);
        self.pending.push(header.seq);
        Verdict::Consumed
    }
    fn handle_timeout(&mut self, _: Time) {}
    fn on_persisted(&mut self, _: Time, through: u64) {
        while self.in_flight.first().is_some_and(|(n, _)| *n <= through) {
            let (_, seqs) = self.in_flight.remove(0);
            self.durable.extend(seqs);
        }
    }
    fn poll_transmit(&mut self) -> Option<Transmit> {
        None
    }
    fn on_sent(&mut self, _: &Transmit) {
        self.sent_behind += 1;
    }
    fn poll_persist(&mut self) -> Option<PersistBatch<RegionWrite>> {
        if self.pending.is_empty() {
            return None;
        }
        let number = self.next_batch;
        self.next_batch += 1;
        let seqs = std::mem::take(&mut self.pending);
        self.in_flight.push((number, seqs.clone()));
        let work = seqs
            .iter()
            .map(|seq| RegionWrite {
                offset: *seq as usize % 64 * 4,
                bytes: seq.to_be_bytes().to_vec(),
            })
            .collect();
        Some(PersistBatch { number, work })
    }
    fn poll_timeout(&self) -> Option<Time> {
        None
    }
}

fn datagram(code: u8, seq: u32) -> Vec<u8> {
    Header::new(PacketType::Reserved(code), SERVER_ID, 1, seq).encode(&[7; 4])
}

fn offer(fronts: &mut Fronts, code: u8, seq: u32) -> Verdict {
    let bytes = datagram(code, seq);
    let (header, _) = Header::parse(&bytes).unwrap();
    let from: SocketAddr = "192.0.2.1:9".parse().unwrap();
    fronts.handle(Time::ZERO, from, &header, &bytes)
}

fn recorder(fronts: &Fronts, place: usize) -> String {
    format!("{:?}", fronts.iter().nth(place).unwrap())
}

#[test]
fn functions_in_front_consume_pass_or_rewrite_in_their_order() {
    // The first rewrites type 0x21 into a higher sequence number; the second owns 0x21.
    let mut fronts = Fronts::new(vec![
        Box::new(Recorder::new(0x20, Some(0x21))),
        Box::new(Recorder::new(0x21, None)),
    ]);
    assert_eq!(offer(&mut fronts, 0x20, 1), Verdict::Consumed);
    assert_eq!(offer(&mut fronts, 0x21, 2), Verdict::Consumed);
    // Nobody's: passed on as it came.
    assert_eq!(offer(&mut fronts, 0x22, 3), Verdict::Pass);
    // The second saw the rewritten datagram, not the original.
    assert!(recorder(&fronts, 1).contains("seen: [102]"), "{fronts:?}");
    assert!(recorder(&fronts, 0).contains("seen: [1]"), "{fronts:?}");
}

#[test]
fn a_rewritten_datagram_nobody_consumes_is_passed_on_rewritten() {
    let mut fronts = Fronts::new(vec![
        Box::new(Recorder::new(0x20, Some(0x23))),
        Box::new(Recorder::new(0x21, None)),
    ]);
    match offer(&mut fronts, 0x23, 5) {
        Verdict::Rewritten(bytes) => assert_eq!(Header::parse(&bytes).unwrap().0.seq, 105),
        other => panic!("expected the rewritten datagram, got {other:?}"),
    }
}

#[test]
fn one_batch_one_executor_each_write_on_its_function_s_region() {
    let mut fronts = Fronts::new(vec![
        Box::new(Recorder::new(0x20, None)),
        Box::new(Recorder::new(0x21, None)),
        Box::new(Recorder::new(0x22, None)),
    ]);
    let _ = offer(&mut fronts, 0x20, 1);
    let _ = offer(&mut fronts, 0x22, 2);
    let first = fronts.poll_persist().expect("work");
    assert_eq!(
        first
            .work
            .iter()
            .map(|work| work.function)
            .collect::<Vec<_>>(),
        vec![0, 2]
    );
    let _ = offer(&mut fronts, 0x22, 3);
    let second = fronts.poll_persist().expect("work");
    assert!(fronts.poll_persist().is_none());

    // The second function has no region, and asked for nothing.
    let mut executor = RegionExecutor::new(vec![
        Some(SimRegion::new(256)),
        None,
        Some(SimRegion::new(256)),
    ]);
    executor.persist(first.work);
    executor.persist(second.work);
    assert_eq!((executor.batches, executor.writes), (2, 3));
    let read = |executor: &RegionExecutor<SimRegion>, place: usize, seq: u32| {
        let bytes = executor.region(place).unwrap().bytes();
        let at = seq as usize * 4;
        u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap())
    };
    assert_eq!(read(&executor, 0, 1), 1);
    assert_eq!(read(&executor, 2, 2), 2);
    assert_eq!(read(&executor, 2, 3), 3);
    assert_eq!(
        read(&executor, 0, 2),
        0,
        "a write went to another function's region"
    );

    // The first report covers the first batch only: the third function's second batch waits.
    fronts.on_persisted(Time::ZERO, first.number);
    assert!(recorder(&fronts, 0).contains("durable: [1]"), "{fronts:?}");
    assert!(recorder(&fronts, 2).contains("durable: [2]"), "{fronts:?}");
    fronts.on_persisted(Time::ZERO, second.number);
    assert!(
        recorder(&fronts, 2).contains("durable: [2, 3]"),
        "{fronts:?}"
    );
}

#[test]
fn each_function_sees_what_the_functions_behind_it_send() {
    let mut fronts = Fronts::new(vec![
        Box::new(Recorder::new(0x20, None)),
        Box::new(pmnet_proto::Counter::default()),
    ]);
    let ask = Header::new(
        PacketType::Reserved(pmnet_proto::COUNTER_TYPE_CODE),
        SERVER_ID,
        1,
        1,
    )
    .encode(&[0; 8]);
    let (header, _) = Header::parse(&ask).unwrap();
    let from: SocketAddr = "192.0.2.1:9".parse().unwrap();
    assert_eq!(
        fronts.handle(Time::ZERO, from, &header, &ask),
        Verdict::Consumed
    );
    assert!(fronts.poll_transmit().is_some());
    assert!(
        recorder(&fronts, 0).contains("sent_behind: 1"),
        "{fronts:?}"
    );
}
