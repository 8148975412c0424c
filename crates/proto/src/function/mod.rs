//! The one shape every in-network function has, and the pipeline that composes them.
//!
//! A device is a [`Pipeline`] of functions. The pipeline parses each datagram once and offers it
//! to its functions in order; the first to return [`Verdict::Consumed`] owns it, a function may
//! rewrite it and pass it on ([`Verdict::Rewritten`]), and a datagram that every function
//! passes on is counted and dropped. Each function has its own
//! persistence work ([`NetworkFunction::Work`]), emitted in numbered batches
//! ([`PersistBatch`]) and acknowledged "through n" (after raft-rs's `Ready`): the caller
//! carries out a whole batch with one [`Persist`] executor and reports its number, and a report
//! of `n` covers every batch up to `n`. [`Stack`] composes two functions into one; [`Fronts`]
//! composes any number of the functions that persist on regions of their own (a device's
//! cache, chain member, ABD coordinator) in a declared order, in front of the log
//! ([`crate::DevicePipeline`]).
//!
//! Why verdicts rather than routing by a table (quinn-proto's endpoint hands each datagram to
//! the one connection its id names): here the owner is a function of the packet type (each
//! function owns the types of its range in docs/protocol.md), and some functions act on
//! datagrams that are not theirs and pass them on — the cache orders keyed writes and reads
//! (writes their order into the datagram: [`Verdict::Rewritten`]) before the log logs them.
//! Offering in a declared order with three answers expresses both; a routing table expresses
//! only the first.

mod device;
mod pipeline;

pub use device::{FrontFunction, FrontWork, Fronts, RegionExecutor, RegionWrite};
pub use pipeline::Pipeline;

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;

use pmnet_wire::Header;

use crate::{CountDrop, DropCounts, DropReason, Time, Transmit};

/// What a function did with a datagram offered to it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum Verdict {
    /// The datagram was this function's: handled (or counted and dropped by it).
    Consumed,
    /// Not this function's: offer it to the next one.
    Pass,
    /// Not this function's, but changed by it (an order written in): offer these bytes, a
    /// whole datagram whose header still parses, to the next one instead.
    Rewritten(Vec<u8>),
}

impl Verdict {
    /// Whether a function took the datagram (no later function sees it).
    pub fn is_consumed(&self) -> bool {
        matches!(self, Verdict::Consumed)
    }
}

/// Offer `datagram` to `next` after a function's `verdict` on it: not at all when it was
/// consumed, rewritten when it was rewritten. The verdict of the two together: consumed if
/// either consumed it, rewritten if the first rewrote it and the second passed it on.
pub(crate) fn offer_next<F: NetworkFunction + ?Sized>(
    verdict: Verdict,
    next: &mut F,
    now: Time,
    from: SocketAddr,
    header: &Header,
    datagram: &[u8],
) -> Verdict {
    match verdict {
        Verdict::Consumed => Verdict::Consumed,
        Verdict::Pass => next.handle(now, from, header, datagram),
        Verdict::Rewritten(bytes) => match Header::parse(&bytes) {
            Ok((rewritten, _)) => match next.handle(now, from, &rewritten, &bytes) {
                Verdict::Pass => Verdict::Rewritten(bytes),
                verdict => verdict,
            },
            // A function's rewriting broke the header: a bug of that function. The datagram
            // goes no further (its sender sends it again).
            Err(error) => {
                debug_assert!(false, "a function rewrote a datagram into {error:?}");
                Verdict::Consumed
            }
        },
    }
}

/// Persistence work numbered for acknowledgement: carry out all of `work`, in order, then
/// report `number` with [`NetworkFunction::on_persisted`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistBatch<W> {
    pub number: u64,
    pub work: Vec<W>,
}

/// Persistence work numbered in batches, with what waits on each batch: the bookkeeping of
/// every state machine that persists (raft-rs's `Ready`). Work is pushed as it is asked for,
/// and what waits for it is noted; [`NumberedBatches::poll`] takes both as the next batch, and
/// [`NumberedBatches::durable_through`] gives back what waited on every batch up to a number.
#[derive(Debug)]
pub struct NumberedBatches<W, T> {
    work: Vec<W>,
    waiting: Vec<T>,
    in_flight: VecDeque<(u64, Vec<T>)>,
    next: u64,
}

impl<W, T> Default for NumberedBatches<W, T> {
    fn default() -> Self {
        NumberedBatches {
            work: Vec::new(),
            waiting: Vec::new(),
            in_flight: VecDeque::new(),
            next: 0,
        }
    }
}

impl<W, T> NumberedBatches<W, T> {
    /// Batches numbered from `first` on.
    pub fn starting_at(first: u64) -> Self {
        NumberedBatches {
            next: first,
            ..NumberedBatches::default()
        }
    }

    /// Ask for `work` in the next batch.
    pub fn push(&mut self, work: W) {
        self.work.push(work);
    }

    /// `item` waits for the next batch to be durable.
    pub fn wait(&mut self, item: T) {
        self.waiting.push(item);
    }

    /// The batch that will hold (or holds) the last work asked for, while it is not known to
    /// be durable: wait for it to be durable to be sure of everything asked for so far.
    /// `None`: everything asked for is durable.
    pub fn pushed_through(&self) -> Option<u64> {
        if !self.work.is_empty() {
            return Some(self.next);
        }
        self.in_flight.back().map(|(number, _)| *number)
    }

    /// The work asked for since the last batch, if any, as the next numbered batch.
    pub fn poll(&mut self) -> Option<PersistBatch<W>> {
        if self.work.is_empty() {
            return None;
        }
        let number = self.next;
        self.next += 1;
        self.in_flight
            .push_back((number, std::mem::take(&mut self.waiting)));
        Some(PersistBatch {
            number,
            work: std::mem::take(&mut self.work),
        })
    }

    /// Batches through `through` are durable: what waited on them, in order. Panics on a
    /// number not emitted yet (a bug of the executor).
    pub fn durable_through(&mut self, through: u64) -> Vec<T> {
        assert!(
            through < self.next,
            "batch {through} reported durable before it was emitted"
        );
        let mut durable = Vec::new();
        while self
            .in_flight
            .front()
            .is_some_and(|(number, _)| *number <= through)
        {
            durable.extend(self.in_flight.pop_front().expect("checked").1);
        }
        durable
    }
}

/// Answers that may go only once the persistence work asked for before them is durable (a
/// hold reply after the invalidations it vouches for): each waits for the batch
/// [`NumberedBatches::pushed_through`] named when it was made — unlike
/// [`NumberedBatches::wait`], which waits for a batch not yet emitted. At most `max` wait.
#[derive(Debug)]
pub struct AfterDurable<T> {
    waiting: VecDeque<(u64, T)>,
    max: usize,
}

impl<T> AfterDurable<T> {
    pub fn new(max: usize) -> Self {
        AfterDurable {
            waiting: VecDeque::new(),
            max,
        }
    }

    /// `item` waits until batch `needed` is durable. Returns it when `max` wait already (the
    /// caller drops it and counts the drop).
    pub fn hold(&mut self, needed: u64, item: T) -> Result<(), T> {
        if self.waiting.len() >= self.max {
            return Err(item);
        }
        self.waiting.push_back((needed, item));
        Ok(())
    }

    /// Batches through `through` are durable: the items that may go now, oldest first.
    pub fn durable_through(&mut self, through: u64) -> Vec<T> {
        let mut ready = Vec::new();
        while self
            .waiting
            .front()
            .is_some_and(|(needed, _)| *needed <= through)
        {
            ready.extend(self.waiting.pop_front().map(|(_, item)| item));
        }
        ready
    }
}

/// An in-network function: fed parsed datagrams, time and persistence completions; emits
/// datagrams and persistence work.
///
/// The caller's loop: `handle` each received datagram (and `handle_timeout` when
/// `poll_timeout` passes), then drain `poll_persist` (carrying out each batch and reporting it
/// with `on_persisted`) and `poll_transmit`, repeating until both are empty. Any output that
/// depends on durability waits for the report.
pub trait NetworkFunction {
    /// The persistence work this function asks for ([`Infallible`] for none).
    type Work;

    /// Offer a datagram that verified (when keys are configured) and whose header parsed.
    /// Never panics on its contents.
    fn handle(&mut self, now: Time, from: SocketAddr, header: &Header, datagram: &[u8]) -> Verdict;
    fn handle_timeout(&mut self, now: Time);
    /// Every batch up to and including `through` is durable.
    fn on_persisted(&mut self, now: Time, through: u64);
    #[must_use]
    fn poll_transmit(&mut self) -> Option<Transmit>;
    /// The work asked for since the last batch, if any, as the next numbered batch.
    #[must_use]
    fn poll_persist(&mut self) -> Option<PersistBatch<Self::Work>>;
    #[must_use]
    fn poll_timeout(&self) -> Option<Time>;
    /// A datagram a function behind this one emitted: in a [`Stack`], the front function sees
    /// everything the back one sends (a read cache in front of the log learns from the log's
    /// PMNet-ACKs which updates are durable). Nothing by default.
    fn on_sent(&mut self, _transmit: &Transmit) {}

    /// When keys are configured: the seal time of the datagram offered next to
    /// [`NetworkFunction::handle`] and the time the device started (Unix ms: when its
    /// pipeline was made, before it received anything). A function that keeps per-session
    /// state refuses, with it, replays of sessions it forgot or knew before it started
    /// (`pmnet_auth::ReplayFloor`). Nothing by default.
    fn note_seal(&mut self, _sealed_at_ms: u64, _started_ms: u64) {}

    /// The client's address the device before this one in a chain carried in the update
    /// offered next to [`NetworkFunction::handle`] (flag `CLIENT_ADDRESS`, stripped before the
    /// update is offered: docs/protocol.md, "Devices in series"); `None` once it was offered.
    /// Whether to believe it is the function's to decide. Nothing by default.
    fn note_client_address(&mut self, _client: Option<SocketAddr>) {}

    /// A datagram from `from` could not be verified (`reason`: an authentication failure, or
    /// sealed at a pipeline without keys) and was dropped before any function saw it. A
    /// function waiting on `from`'s answers learns why none came. Nothing by default.
    fn on_unverified(&mut self, _now: Time, _from: SocketAddr, _reason: DropReason) {}

    /// The function's counters for a metrics endpoint: (name, help, value); a name that does
    /// not end in `_total` is a gauge (a level now). None by default.
    fn counter_samples(&self) -> Vec<(&'static str, &'static str, u64)> {
        Vec::new()
    }

    /// The datagrams the function dropped, by reason (one vocabulary: [`DropReason`]); the
    /// pipeline reports them with its own. None by default.
    fn dropped(&self) -> DropCounts {
        DropCounts::new()
    }

    /// What the function did, in a few words, for its process's report line (a process that
    /// is the function, such as a memory node, reports this instead of a log's counters).
    /// None by default.
    fn report(&self) -> Option<String> {
        None
    }
}

/// Carries out persistence work of type `W`: all of it durable when `persist` returns.
pub trait Persist<W> {
    fn persist(&mut self, work: Vec<W>);
}

/// The executor of a function that persists nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPersistence;

impl Persist<Infallible> for NoPersistence {
    fn persist(&mut self, work: Vec<Infallible>) {
        if let Some(never) = work.into_iter().next() {
            match never {}
        }
    }
}

/// Work of a [`Stack`]: its front function's or the rest's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StackWork<A, B> {
    Front(A),
    Back(B),
}

/// Two executors side by side carry out a [`Stack`]'s work, each its own part (in order) with
/// its own fences.
impl<A, B, X: Persist<A>, Y: Persist<B>> Persist<StackWork<A, B>> for (X, Y) {
    fn persist(&mut self, work: Vec<StackWork<A, B>>) {
        let mut front = Vec::new();
        let mut back = Vec::new();
        for item in work {
            match item {
                StackWork::Front(item) => front.push(item),
                StackWork::Back(item) => back.push(item),
            }
        }
        if !front.is_empty() {
            self.0.persist(front);
        }
        if !back.is_empty() {
            self.1.persist(back);
        }
    }
}

/// Two functions as one: a datagram goes to `front` first and to `back` if `front` passes it.
#[derive(Debug)]
pub struct Stack<A, B> {
    pub front: A,
    pub back: B,
    next_batch: u64,
    /// Batches emitted and not yet reported: (this stack's number, front's, back's).
    in_flight: VecDeque<(u64, Option<u64>, Option<u64>)>,
}

impl<A, B> Stack<A, B> {
    pub fn new(front: A, back: B) -> Stack<A, B> {
        Stack {
            front,
            back,
            next_batch: 1,
            in_flight: VecDeque::new(),
        }
    }
}

impl<A: NetworkFunction, B: NetworkFunction> NetworkFunction for Stack<A, B> {
    type Work = StackWork<A::Work, B::Work>;

    fn note_seal(&mut self, sealed_at_ms: u64, started_ms: u64) {
        self.front.note_seal(sealed_at_ms, started_ms);
        self.back.note_seal(sealed_at_ms, started_ms);
    }

    fn note_client_address(&mut self, client: Option<SocketAddr>) {
        self.front.note_client_address(client);
        self.back.note_client_address(client);
    }

    fn handle(&mut self, now: Time, from: SocketAddr, header: &Header, datagram: &[u8]) -> Verdict {
        let verdict = self.front.handle(now, from, header, datagram);
        offer_next(verdict, &mut self.back, now, from, header, datagram)
    }

    fn handle_timeout(&mut self, now: Time) {
        if self.front.poll_timeout().is_some_and(|at| at <= now) {
            self.front.handle_timeout(now);
        }
        if self.back.poll_timeout().is_some_and(|at| at <= now) {
            self.back.handle_timeout(now);
        }
    }

    fn on_persisted(&mut self, now: Time, through: u64) {
        assert!(
            through < self.next_batch,
            "batch {through} reported persisted before it was emitted"
        );
        let (mut front, mut back) = (None, None);
        while self
            .in_flight
            .front()
            .is_some_and(|(number, _, _)| *number <= through)
        {
            let (_, a, b) = self.in_flight.pop_front().expect("checked");
            front = a.or(front);
            back = b.or(back);
        }
        if let Some(through) = front {
            self.front.on_persisted(now, through);
        }
        if let Some(through) = back {
            self.back.on_persisted(now, through);
        }
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        if let Some(transmit) = self.front.poll_transmit() {
            return Some(transmit);
        }
        let transmit = self.back.poll_transmit()?;
        self.front.on_sent(&transmit);
        Some(transmit)
    }

    fn on_sent(&mut self, transmit: &Transmit) {
        // Both are in front of whatever sent it.
        self.front.on_sent(transmit);
        self.back.on_sent(transmit);
    }

    fn dropped(&self) -> DropCounts {
        self.front.dropped().merged(&self.back.dropped())
    }
    fn on_unverified(&mut self, now: Time, from: SocketAddr, reason: DropReason) {
        self.front.on_unverified(now, from, reason);
        self.back.on_unverified(now, from, reason);
    }

    fn poll_persist(&mut self) -> Option<PersistBatch<Self::Work>> {
        let front = self.front.poll_persist();
        let back = self.back.poll_persist();
        if front.is_none() && back.is_none() {
            return None;
        }
        let number = self.next_batch;
        self.next_batch += 1;
        self.in_flight.push_back((
            number,
            front.as_ref().map(|batch| batch.number),
            back.as_ref().map(|batch| batch.number),
        ));
        let mut work = Vec::new();
        if let Some(batch) = front {
            work.extend(batch.work.into_iter().map(StackWork::Front));
        }
        if let Some(batch) = back {
            work.extend(batch.work.into_iter().map(StackWork::Back));
        }
        Some(PersistBatch { number, work })
    }

    fn poll_timeout(&self) -> Option<Time> {
        match (self.front.poll_timeout(), self.back.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// A function that owns nothing and passes every datagram on: the front of a pipeline with a
/// single function.
#[derive(Debug, Clone, Copy, Default)]
pub struct Nothing;

impl NetworkFunction for Nothing {
    type Work = RegionWrite;

    fn handle(&mut self, _: Time, _: SocketAddr, _: &Header, _: &[u8]) -> Verdict {
        Verdict::Pass
    }
    fn handle_timeout(&mut self, _: Time) {}
    fn on_persisted(&mut self, _: Time, _: u64) {}
    fn poll_transmit(&mut self) -> Option<Transmit> {
        None
    }
    fn poll_persist(&mut self) -> Option<PersistBatch<RegionWrite>> {
        None
    }
    fn poll_timeout(&self) -> Option<Time> {
        None
    }
}

impl<B> StackWork<Infallible, B> {
    /// The work of a stack whose front persists nothing: all of it is the back's.
    pub fn into_back(self) -> B {
        match self {
            StackWork::Front(never) => match never {},
            StackWork::Back(work) => work,
        }
    }
}

impl<W, P: Persist<W> + ?Sized> Persist<W> for &mut P {
    fn persist(&mut self, work: Vec<W>) {
        (**self).persist(work)
    }
}

impl<F: NetworkFunction + ?Sized> NetworkFunction for Box<F> {
    type Work = F::Work;

    fn handle(&mut self, now: Time, from: SocketAddr, header: &Header, datagram: &[u8]) -> Verdict {
        (**self).handle(now, from, header, datagram)
    }
    fn handle_timeout(&mut self, now: Time) {
        (**self).handle_timeout(now)
    }
    fn on_persisted(&mut self, now: Time, through: u64) {
        (**self).on_persisted(now, through)
    }
    fn poll_transmit(&mut self) -> Option<Transmit> {
        (**self).poll_transmit()
    }
    fn poll_persist(&mut self) -> Option<PersistBatch<F::Work>> {
        (**self).poll_persist()
    }
    fn poll_timeout(&self) -> Option<Time> {
        (**self).poll_timeout()
    }
    fn on_sent(&mut self, transmit: &Transmit) {
        (**self).on_sent(transmit)
    }
    fn note_seal(&mut self, sealed_at_ms: u64, started_ms: u64) {
        (**self).note_seal(sealed_at_ms, started_ms)
    }
    fn on_unverified(&mut self, now: Time, from: SocketAddr, reason: DropReason) {
        (**self).on_unverified(now, from, reason)
    }
    fn counter_samples(&self) -> Vec<(&'static str, &'static str, u64)> {
        (**self).counter_samples()
    }
    fn dropped(&self) -> DropCounts {
        (**self).dropped()
    }
    fn report(&self) -> Option<String> {
        (**self).report()
    }
}
