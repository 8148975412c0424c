//! The one network of every simulated world: a delivery queue in virtual time; the fault
//! knobs (loss, duplication, the delay model the world chooses, corruption in flight:
//! `faults.rs`); partitions both as blocked links (dropped when sent) and timed cuts (dropped
//! when due); drop rules of tests; the one attacker, which captures what is sent and replays
//! it (`attacker.rs`); a world's deployment keys, which its pipelines take and with which the
//! network seals and verifies for the endpoints that have none (`keys.rs`); the one trace
//! writer with its hash (`trace.rs`) and the counts of what it did.
//!
//! The network has no clock of its own: each call is given the world's `now`.

mod attacker;
mod faults;
mod keys;
mod trace;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::Time;
use pmnet_wire::Header;

pub use attacker::Attacker;
pub use faults::{Delay, Faults, NetworkCounters};
pub use keys::NetworkKeys;
pub use trace::{describe_datagram, describe_header, Trace, TracedRun};

/// The wall-clock time (Unix milliseconds) at which every simulated world starts.
pub const SIM_EPOCH_MS: u64 = 1_764_000_000_000;

/// One datagram put on the network, for assertions and traces.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Time,
    pub from: SocketAddr,
    pub to: SocketAddr,
    pub header: Header,
    pub dropped: bool,
}

/// A test's rule: drop the datagrams for which it returns true.
pub type DropRule = Box<dyn FnMut(&Seen) -> bool>;

/// A datagram in flight: delivery time, tie-breaking sequence, source, destination, bytes.
type InFlight = Reverse<(Time, u64, SocketAddr, SocketAddr, Vec<u8>)>;

/// A partition for a while: `side` cut off from `other`, or from everyone (`None`), until
/// `until`; checked when a datagram is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    pub side: SocketAddr,
    pub other: Option<SocketAddr>,
    pub until: Time,
}

/// A datagram the network delivers: from, to, the bytes as the receiver takes them (verified
/// by the network for a receiver without a pipeline, as sent for one with).
#[derive(Debug, Clone)]
pub struct Delivery {
    pub from: SocketAddr,
    pub to: SocketAddr,
    pub bytes: Vec<u8>,
}

#[allow(missing_debug_implementations)] // holds boxed drop rules
pub struct Network {
    queue: BinaryHeap<InFlight>,
    sequence: u64,
    /// How long a datagram takes.
    pub delay: Delay,
    /// The random faults, when on.
    pub faults: Option<Faults>,
    /// Links that deliver nothing: `(from, to)`; a symmetric partition blocks both directions.
    pub blocked: HashSet<(SocketAddr, SocketAddr)>,
    /// Timed partitions, checked when a datagram is due.
    pub cuts: Vec<Cut>,
    drop_rules: Vec<DropRule>,
    pub counters: NetworkCounters,
    /// Every datagram sent, when `record_seen` is on (tests); off in long swarms.
    pub seen: Vec<Seen>,
    pub record_seen: bool,
    /// The world's event log and its hash.
    pub trace: Trace,
    /// The world's deployment keys: its pipelines take theirs from here, and the network
    /// seals and verifies with them for the endpoints without a pipeline.
    pub keys: Option<NetworkKeys>,
    /// The attacker: it captures every datagram sent, and replays on its own schedule
    /// ([`Network::strike`], [`Network::restarted`]) or as the world drives it.
    pub attacker: Option<Attacker>,
    /// How traces name an address.
    names: fn(SocketAddr) -> String,
}

impl Network {
    /// A network with `delay`, no faults, naming addresses in its trace with `names`.
    pub fn new(delay: Delay, names: fn(SocketAddr) -> String) -> Network {
        Network {
            queue: BinaryHeap::new(),
            sequence: 0,
            delay,
            faults: None,
            blocked: HashSet::new(),
            cuts: Vec::new(),
            drop_rules: Vec::new(),
            counters: NetworkCounters::default(),
            seen: Vec::new(),
            record_seen: true,
            trace: Trace::new(),
            keys: None,
            attacker: None,
            names,
        }
    }

    /// The network of the chain store's and replicated memory's worlds: each copy of a
    /// datagram 10–400 µs on its way, lost or duplicated at the rates given, from a generator
    /// seeded with `seed`; no corruption.
    pub fn uniform(
        seed: u64,
        loss: f64,
        duplicate: f64,
        names: fn(SocketAddr) -> String,
    ) -> Network {
        let delay = Delay::Uniform {
            min: Duration::from_micros(10),
            max: Duration::from_micros(400),
        };
        let mut network = Network::new(delay, names);
        let rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed);
        network.faults = Some(Faults::lossy(rng, loss, duplicate));
        network
    }

    /// The authenticator of `addr`'s pipeline, started at `now`, when the network has keys:
    /// from then on `addr` seals and verifies itself.
    pub(crate) fn pipeline_keys(
        &mut self,
        now: Time,
        addr: SocketAddr,
    ) -> Option<pmnet_auth::Authenticator> {
        self.keys.as_mut().map(|keys| keys.for_pipeline(now, addr))
    }

    /// A datagram as sent at `now`, as the simulation's checkers read it: opened with the
    /// network's keys when a pipeline sealed it.
    pub fn observe(&mut self, now: Time, bytes: &[u8]) -> Option<Vec<u8>> {
        match self.keys.as_mut() {
            Some(keys) => keys.observe(now, bytes),
            None => Some(bytes.to_vec()),
        }
    }

    /// How traces name `addr`.
    pub fn name(&self, addr: SocketAddr) -> String {
        (self.names)(addr)
    }

    /// Drop every datagram for which `rule` returns true (rules stay until cleared).
    pub fn drop_when(&mut self, rule: impl FnMut(&Seen) -> bool + 'static) {
        self.drop_rules.push(Box::new(rule));
    }

    pub fn clear_drop_rules(&mut self) {
        self.drop_rules.clear();
    }

    /// Put a datagram `from` sends at `now` on the network, with its faults: drop rules,
    /// blocked links, the random faults; sealed first with the network's keys, and captured
    /// by the attacker. Its `send` line notes what happened to it, and
    /// `note` after (`[checked durable]`, ...). A datagram whose header does not parse is a
    /// bug of its sender.
    pub fn send(&mut self, now: Time, from: SocketAddr, to: SocketAddr, bytes: Vec<u8>) {
        self.send_noted(now, from, to, bytes, "");
    }

    /// [`Network::send`], with `note` at the end of its trace line.
    pub fn send_noted(
        &mut self,
        now: Time,
        from: SocketAddr,
        to: SocketAddr,
        mut bytes: Vec<u8>,
        note: &str,
    ) {
        let header = match Header::parse(pmnet_auth::without_trailer(&bytes)) {
            Ok((header, _)) => header,
            Err(error) => panic!("invariant: {from} sent an invalid datagram: {error}"),
        };
        if let Some(keys) = self.keys.as_mut() {
            keys.seal(now, from, &mut bytes);
        }
        if let Some(attacker) = self.attacker.as_mut() {
            attacker.capture(now, from, to, &bytes);
        }
        self.counters.sent += 1;
        let mut seen = Seen {
            at: now,
            from,
            to,
            header,
            dropped: false,
        };
        // What happened to the datagram, for the trace.
        let mut fate = String::new();
        seen.dropped = self.drop_rules.iter_mut().any(|rule| rule(&seen));
        if seen.dropped {
            fate.push_str(" [dropped by a test rule]");
        }
        if self.blocked.contains(&(from, to)) {
            seen.dropped = true;
            self.counters.partitioned += 1;
            fate.push_str(" [cut by a partition]");
        }
        let mut copies = 1;
        let mut delays = [self.delay.base(); 2];
        if let Some(faults) = self.faults.as_mut() {
            copies = faults.strike(
                self.delay,
                &mut self.counters,
                &mut seen.dropped,
                &mut bytes,
                &mut delays,
                &mut fate,
            );
        }
        fate.push_str(note);
        let dropped = seen.dropped;
        let names = self.names;
        self.trace.note_datagram(now, &names(from), || {
            format!("send {} -> {}{fate}", describe_header(&header), names(to))
        });
        if self.record_seen {
            self.seen.push(seen);
        }
        if dropped {
            return;
        }
        for delay in &delays[..copies] {
            self.push(now + *delay, from, to, bytes.clone());
        }
    }

    /// Put bytes on the network as they are (malformed-input tests, the attacker's), delivered
    /// after the delay without faults.
    pub fn inject(&mut self, now: Time, from: SocketAddr, to: SocketAddr, bytes: Vec<u8>) {
        self.push(now + self.delay.base(), from, to, bytes);
    }

    fn push(&mut self, at: Time, from: SocketAddr, to: SocketAddr, bytes: Vec<u8>) {
        self.sequence += 1;
        self.queue
            .push(Reverse((at, self.sequence, from, to, bytes)));
    }

    /// When the next datagram is due.
    pub fn next_due(&self) -> Option<Time> {
        self.queue.peek().map(|Reverse((at, ..))| *at)
    }

    /// Datagrams on their way.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// Forget every datagram on its way.
    pub fn clear(&mut self) {
        self.queue.clear();
    }

    /// The next datagram, whenever it is due: (due at, from, to, bytes), as sent (the main
    /// world's step: the earlier of it and the next timer).
    pub fn pop_next(&mut self) -> Option<(Time, SocketAddr, SocketAddr, Vec<u8>)> {
        let Reverse((at, _, from, to, bytes)) = self.queue.pop()?;
        Some((at, from, to, bytes))
    }

    /// Whether a timed cut separates `from` and `to` at `now`.
    pub fn cut_off(&self, now: Time, from: SocketAddr, to: SocketAddr) -> bool {
        self.cuts.iter().any(|cut| {
            now < cut.until
                && match cut.other {
                    Some(other) => {
                        (from == cut.side && to == other) || (from == other && to == cut.side)
                    }
                    None => from == cut.side || to == cut.side,
                }
        })
    }

    /// Whether `side` is cut off from everyone at `now`.
    pub fn isolated(&self, now: Time, side: SocketAddr) -> bool {
        (self.cuts.iter()).any(|cut| cut.side == side && cut.other.is_none() && now < cut.until)
    }

    /// Whether `side` is cut off, from anyone, at `now`.
    pub fn partly_cut(&self, now: Time, side: SocketAddr) -> bool {
        (self.cuts.iter()).any(|cut| cut.side == side && now < cut.until)
    }

    /// The attacker replays what it chose to replay at `now`.
    pub fn strike(&mut self, now: Time) {
        if let Some(attacker) = self.attacker.as_mut() {
            let replays = attacker.strike(now);
            self.replay(now, replays);
        }
    }

    /// `restarted` restarted at `now`: the attacker replays what was sent to it.
    pub fn restarted(&mut self, now: Time, restarted: SocketAddr) {
        if let Some(attacker) = self.attacker.as_mut() {
            let replays = attacker.after_restart(now, restarted);
            self.replay(now, replays);
        }
    }

    /// Put the attacker's replays on the network, each noted in the trace.
    fn replay(&mut self, now: Time, replays: Vec<(Time, SocketAddr, SocketAddr, Vec<u8>)>) {
        let names = self.names;
        for (at, from, to, bytes) in replays {
            self.trace.note(now, "attacker", || {
                let what = describe_datagram(&bytes);
                format!(
                    "replays a {what}, from {} to {} at {at}",
                    names(from),
                    names(to)
                )
            });
            self.push(at, from, to, bytes);
        }
    }

    /// Set the wall clock of the network's keys (and of the pipelines that took theirs from
    /// it) to `now`: call as the world's time moves.
    pub fn set_wall(&self, now: Time) {
        if let Some(keys) = self.keys.as_ref() {
            keys.sync(now);
        }
    }

    /// The next datagram due by `now` that no timed cut drops and that the network's keys
    /// verify, if it has keys and the receiver has no pipeline (what is dropped is taken off
    /// the queue on the way, counted and noted as received and dropped).
    pub fn deliver_due(&mut self, now: Time) -> Option<Delivery> {
        while self.next_due().is_some_and(|at| at <= now) {
            let (_, from, to, bytes) = self.pop_next().expect("peeked");
            if self.cut_off(now, from, to) {
                self.counters.partitioned += 1;
                let what = describe_datagram(&bytes);
                self.note_recv_of(now, from, to, what, " [cut by a partition]");
                continue;
            }
            let Some(keys) = self.keys.as_mut() else {
                return Some(Delivery { from, to, bytes });
            };
            let what = describe_datagram(&bytes);
            match keys.verify_for_receiver(now, to, bytes) {
                Ok(bytes) => return Some(Delivery { from, to, bytes }),
                Err(reason) => {
                    self.counters.unverified += 1;
                    let fate = format!(" [dropped by the receiver's keys: {reason}]");
                    self.note_recv_of(now, from, to, what, &fate);
                }
            }
        }
        None
    }

    /// Note in the trace that `to` received a datagram the network delivered (verified by
    /// its keys, if it has keys), with what became of it.
    pub fn note_recv(
        &mut self,
        now: Time,
        from: SocketAddr,
        to: SocketAddr,
        bytes: &[u8],
        fate: &str,
    ) {
        let names = self.names;
        let plain = self
            .keys
            .as_ref()
            .is_some_and(|keys| keys.verified_here(to));
        self.trace.note_datagram(now, &names(to), || {
            let what = if plain {
                match Header::parse(bytes) {
                    Ok((header, _)) => describe_header(&header),
                    Err(error) => format!("a datagram that does not parse ({error})"),
                }
            } else {
                describe_datagram(bytes)
            };
            format!("recv {what} from {}{fate}", names(from))
        });
    }

    fn note_recv_of(
        &mut self,
        now: Time,
        from: SocketAddr,
        to: SocketAddr,
        what: String,
        fate: &str,
    ) {
        let names = self.names;
        self.trace.note_datagram(now, &names(to), || {
            format!("recv {what} from {}{fate}", names(from))
        });
    }
}
