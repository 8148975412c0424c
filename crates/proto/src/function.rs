//! The one shape every in-network function has, and the pipeline that composes them.
//!
//! A device is a [`Pipeline`] of functions. The pipeline parses each datagram once and offers it
//! to its functions in order; the first to return [`Verdict::Consumed`] owns it, and a
//! datagram that every function passes on is counted and dropped. Each function has its own
//! persistence work ([`NetworkFunction::Work`]), emitted in numbered batches
//! ([`PersistBatch`]) and acknowledged "through n" (after raft-rs's `Ready`): the caller
//! carries out a whole batch with one [`Persist`] executor and reports its number, and a report
//! of `n` covers every batch up to `n`. [`Stack`] composes two functions into one, so a pipeline
//! of any length is `Stack<A, Stack<B, C>>`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::net::SocketAddr;

use pmnet_wire::{Header, PacketType};

use crate::{CountDrop, DropCounts, DropReason, Time, Transmit};

/// What a function did with a datagram offered to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Verdict {
    /// The datagram was this function's: handled (or counted and dropped by it).
    Consumed,
    /// Not this function's: offer it to the next one.
    Pass,
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

    fn handle(&mut self, now: Time, from: SocketAddr, header: &Header, datagram: &[u8]) -> Verdict {
        match self.front.handle(now, from, header, datagram) {
            Verdict::Consumed => Verdict::Consumed,
            Verdict::Pass => self.back.handle(now, from, header, datagram),
        }
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

/// Verified requests whose trailers a pipeline keeps for forwarding them: the last few of a
/// receive batch (each seal looks through them, so few; what goes out in a batch to a server
/// is sealed afresh anyway).
const FORWARDED_TRAILERS_KEPT: usize = 8;

/// A device's functions behind one parser: each datagram is parsed once and offered to the
/// functions in order; what none of them consumes is counted and dropped here.
#[derive(Debug)]
pub struct Pipeline<F> {
    functions: F,
    drops: DropCounts,
    /// Warnings of datagrams that failed authentication (rate-limited).
    auth_warnings: crate::AuthWarnings,
    /// With keys configured: every datagram verified before it is parsed, every datagram
    /// sent sealed (what a device forwards is sealed again, which reproduces its tag).
    auth: Option<pmnet_auth::Authenticator>,
    /// Without keys, and asked to: warnings of datagrams from other hosts (rate-limited).
    plain_warnings: Option<crate::PlainTrafficWarnings>,
    /// When the pipeline was given its keys (Unix ms, by its authenticator's clock): the
    /// device's start, for the replay floors of its functions.
    started_ms: u64,
    /// With peers to batch for: what a turn sends each of them, packed (see `batch.rs`).
    batcher: Option<crate::Batcher>,
}

impl<F: NetworkFunction> Pipeline<F> {
    pub fn new(functions: F) -> Pipeline<F> {
        Pipeline {
            functions,
            drops: DropCounts::default(),
            auth_warnings: crate::AuthWarnings::default(),
            auth: None,
            plain_warnings: None,
            started_ms: 0,
            batcher: None,
        }
    }

    /// Pack what a turn sends each of `peers` into batches of at most `datagram_len_max` bytes
    /// (trailer included), with `device_id` in their headers. Call after [`Pipeline::with_auth`].
    pub fn with_batching(
        mut self,
        peers: &[SocketAddr],
        datagram_len_max: usize,
        device_id: u16,
    ) -> Pipeline<F> {
        let mut batcher = crate::Batcher::new(
            crate::unsealed_len_max(datagram_len_max, &self.auth),
            device_id,
        );
        for peer in peers {
            batcher.add_peer(*peer);
        }
        self.batcher = Some(batcher);
        self
    }

    /// Let a batch of update requests for a server wait up to `hold` for more (call after
    /// [`Pipeline::with_batching`]; docs/protocol.md, "Batches").
    pub fn with_batch_hold(mut self, hold: std::time::Duration) -> Pipeline<F> {
        self.batcher = self.batcher.map(|batcher| batcher.with_hold(hold));
        self
    }

    /// What batching did (`None`: off).
    pub fn batch_counters(&self) -> Option<crate::BatchCounters> {
        self.batcher.as_ref().map(|batcher| batcher.counters)
    }

    /// Authenticate every datagram in and out with `auth`.
    pub fn with_auth(mut self, auth: Option<pmnet_auth::Authenticator>) -> Pipeline<F> {
        // What a device forwards is what it just verified: reuse the trailer rather than
        // compute the MAC again (a receive batch's worth).
        self.auth = auth.map(|auth| auth.remember_verified(FORWARDED_TRAILERS_KEPT));
        self.started_ms = self
            .auth
            .as_ref()
            .map_or(0, pmnet_auth::Authenticator::now_ms);
        self
    }

    /// Without keys (`on`): warn, at most once a minute, of unauthenticated datagrams from
    /// peers off this host (a device started with `--insecure` on an address others reach).
    pub fn with_plain_traffic_warnings(mut self, on: bool) -> Pipeline<F> {
        self.plain_warnings = on.then(crate::PlainTrafficWarnings::default);
        self
    }

    /// Whether datagrams are authenticated.
    pub fn is_authenticated(&self) -> bool {
        self.auth.is_some()
    }

    /// The seals of what this pipeline sent (`None`: not authenticated).
    pub fn seal_counts(&self) -> Option<pmnet_auth::SealCounts> {
        self.auth
            .as_ref()
            .map(pmnet_auth::Authenticator::seal_counts)
    }

    pub fn functions(&self) -> &F {
        &self.functions
    }

    pub fn functions_mut(&mut self) -> &mut F {
        &mut self.functions
    }

    /// Datagrams that could not be verified (failed authentication, or sealed at a pipeline
    /// without keys), in all: a caller that notes who it hears from counts only the others.
    pub fn unverified_total(&self) -> u64 {
        self.auth_warnings.total()
    }

    /// Datagrams the pipeline itself dropped: unparseable, or of a type no function owns.
    pub fn drops(&self) -> &DropCounts {
        &self.drops
    }

    /// Process a datagram from the network. Never panics on its contents.
    pub fn handle(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        if let Some(batcher) = self.batcher.as_mut() {
            batcher.set_now(now);
        }
        let verified = match crate::drop::verify_datagram(self.auth.as_mut(), datagram) {
            Ok(inner) => {
                match self.auth.as_ref() {
                    Some(auth) => self.functions.note_seal(auth.sealed_at(), self.started_ms),
                    None => {
                        if let Some(warnings) = self.plain_warnings.as_mut() {
                            warnings.received(now, "device", from);
                        }
                    }
                }
                inner
            }
            Err(reason) => {
                self.auth_warnings.failed(now, "device", from, reason);
                self.drops.record(reason);
                // A function that waits on a peer's answers learns why none came.
                self.functions.on_unverified(now, from, reason);
                return;
            }
        };
        let datagram: &[u8] = &verified;
        let (header, payload) = match Header::parse(datagram) {
            Ok(parsed) => parsed,
            Err(error) => {
                self.drops.record(DropReason::Parse(error));
                return;
            }
        };
        if header.packet_type == PacketType::Batch {
            // Covered by the batch's trailer: each entry is parsed and handled on its own.
            for entry in pmnet_wire::batch_entries(payload) {
                match entry.and_then(Header::parse) {
                    Ok((inner, _)) if inner.packet_type == PacketType::Batch => {
                        self.drops.record(DropReason::NestedBatch);
                    }
                    Ok((inner, _)) => {
                        let bytes = entry.expect("parsed above");
                        self.dispatch(now, from, &inner, bytes);
                    }
                    Err(error) => {
                        self.drops.record(DropReason::Parse(error));
                        break;
                    }
                }
            }
            return;
        }
        self.dispatch(now, from, &header, datagram);
    }

    /// Hand a parsed datagram to the functions; one none of them takes is counted and dropped.
    fn dispatch(&mut self, now: Time, from: SocketAddr, header: &Header, datagram: &[u8]) {
        if self.functions.handle(now, from, header, datagram) == Verdict::Pass {
            self.drops.record(match header.packet_type {
                PacketType::Reserved(_) => DropReason::Parse(pmnet_wire::ParseError::UnknownType),
                _ => DropReason::UnexpectedType,
            });
        }
    }

    pub fn handle_timeout(&mut self, now: Time) {
        self.functions.handle_timeout(now);
        if let Some(batcher) = self.batcher.as_mut() {
            batcher.handle_timeout(now);
        }
    }

    pub fn on_persisted(&mut self, now: Time, through: u64) {
        if let Some(batcher) = self.batcher.as_mut() {
            batcher.set_now(now);
        }
        self.functions.on_persisted(now, through)
    }

    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let mut transmit = match self.batcher.as_mut() {
            Some(batcher) => match batcher.pop() {
                Some(transmit) => transmit,
                None => {
                    let functions = &mut self.functions;
                    batcher.fill(|| functions.poll_transmit());
                    batcher.pop()?
                }
            },
            None => self.functions.poll_transmit()?,
        };
        if let Some(auth) = self.auth.as_mut() {
            auth.seal(&mut transmit.bytes);
        }
        Some(transmit)
    }

    #[must_use]
    pub fn poll_persist(&mut self) -> Option<PersistBatch<F::Work>> {
        self.functions.poll_persist()
    }

    #[must_use]
    pub fn poll_timeout(&self) -> Option<Time> {
        let held = self.batcher.as_ref().and_then(crate::Batcher::poll_timeout);
        match (self.functions.poll_timeout(), held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Carry out every batch of persistence work with `executor` and report it, until the
    /// functions ask for no more. Returns how many batches there were.
    pub fn persist_with<E: Persist<F::Work>>(&mut self, now: Time, executor: &mut E) -> u64 {
        let mut batches = 0;
        while let Some(batch) = self.functions.poll_persist() {
            executor.persist(batch.work);
            self.functions.on_persisted(now, batch.number);
            batches += 1;
        }
        batches
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

/// A front function's persistence work: `bytes` stored at `offset` of the function's own
/// persistent region and flushed; a batch ends with one fence ([`RegionExecutor`], the one
/// executor the runtime and the simulator share). The function lays its region out itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionWrite {
    pub offset: usize,
    pub bytes: Vec<u8>,
}

/// Carries out a front function's [`RegionWrite`]s on its region: every write stored and
/// flushed, then one fence per batch. `None`: the front function has no region (a read cache)
/// and must ask for no work.
#[derive(Debug)]
pub struct RegionExecutor<R> {
    pub region: Option<R>,
    pub batches: u64,
    pub writes: u64,
}

impl<R> Default for RegionExecutor<R> {
    fn default() -> Self {
        RegionExecutor {
            region: None,
            batches: 0,
            writes: 0,
        }
    }
}

impl<R> RegionExecutor<R> {
    /// The executor of a front function persisting on `region`.
    pub fn on(region: R) -> RegionExecutor<R> {
        RegionExecutor {
            region: Some(region),
            batches: 0,
            writes: 0,
        }
    }
}

impl<R: pmnet_pm::PmRegion> Persist<RegionWrite> for RegionExecutor<R> {
    fn persist(&mut self, work: Vec<RegionWrite>) {
        if work.is_empty() {
            return;
        }
        // A front function that asks for persistence without a region is a bug: what it
        // acknowledges after this would not be durable.
        let region = self
            .region
            .as_mut()
            .expect("region work asked for by a front function with no region");
        for write in &work {
            region.write(write.offset, &write.bytes);
            region.flush(write.offset, write.bytes.len());
        }
        region.fence();
        self.batches += 1;
        self.writes += work.len() as u64;
    }
}

/// A function that sits in front of a device's log (a read cache, a chain store's member, a
/// counter in a test), persisting on a region of its own if it persists anything. The runtime
/// and the simulator host one in every device, in front of the log: [`Nothing`] unless told
/// otherwise.
pub trait FrontFunction: NetworkFunction<Work = RegionWrite> + std::fmt::Debug + Send {}

impl<F: NetworkFunction<Work = RegionWrite> + std::fmt::Debug + Send> FrontFunction for F {}

/// The pipeline of a device: a front function, then the log ([`crate::Device`]), which forwards
/// requests to their servers.
pub type DevicePipeline = Pipeline<Stack<Box<dyn FrontFunction>, crate::Device>>;

impl DevicePipeline {
    /// A pipeline of `front` and then `device`.
    pub fn with_front(front: Box<dyn FrontFunction>, device: crate::Device) -> DevicePipeline {
        Pipeline::new(Stack::new(front, device))
    }

    /// The front function's counters (see [`NetworkFunction::counter_samples`]).
    pub fn front_samples(&self) -> Vec<(&'static str, &'static str, u64)> {
        self.functions.front.counter_samples()
    }

    /// The log function.
    pub fn device(&self) -> &crate::Device {
        &self.functions.back
    }

    pub fn device_mut(&mut self) -> &mut crate::Device {
        &mut self.functions.back
    }

    /// Every datagram the device dropped, by reason: the pipeline's own drops (unparseable,
    /// no function for the type), the front function's and the log's.
    pub fn dropped(&self) -> DropCounts {
        self.drops.clone().merged(&self.functions.dropped())
    }

    /// The front function's report (see [`NetworkFunction::report`]).
    pub fn front_report(&self) -> Option<String> {
        self.functions.front.report()
    }

    /// The front function.
    pub fn front(&self) -> &dyn FrontFunction {
        &*self.functions.front
    }
}
