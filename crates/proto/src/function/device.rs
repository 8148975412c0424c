//! A device's pipeline: the functions in front of the log ([`Fronts`], any of them in a declared
//! order, each persisting on a region of its own) and the log behind them; the one executor of
//! their region work ([`RegionExecutor`]).

use std::collections::VecDeque;
use std::net::SocketAddr;

use pmnet_wire::Header;

use super::{offer_next, NetworkFunction, Persist, PersistBatch, Verdict};
use crate::{CountDrop, DropCounts, DropReason, Time, Transmit};

/// A front function's persistence work: `bytes` stored at `offset` of the function's own
/// persistent region and flushed; a batch ends with one fence ([`RegionExecutor`], the one
/// executor the runtime and the simulator share). The function lays its region out itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionWrite {
    pub offset: usize,
    pub bytes: Vec<u8>,
}

/// A [`RegionWrite`] of one of a device's [`Fronts`]: `function` is its place in the pipeline,
/// which is also the place of its region in the [`RegionExecutor`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontWork {
    pub function: usize,
    pub write: RegionWrite,
}

/// Carries out the [`RegionWrite`]s of a device's functions, each on its function's region:
/// every write stored and flushed, then one fence per region written in the batch. A function
/// with no region (a read cache) must ask for no work.
#[derive(Debug)]
pub struct RegionExecutor<R> {
    /// Each function's region, by its place in the pipeline (`None`: it has none).
    pub regions: Vec<Option<R>>,
    pub batches: u64,
    pub writes: u64,
}

impl<R> Default for RegionExecutor<R> {
    fn default() -> Self {
        RegionExecutor {
            regions: Vec::new(),
            batches: 0,
            writes: 0,
        }
    }
}

impl<R> RegionExecutor<R> {
    /// The executor of functions persisting on `regions`, by place.
    pub fn new(regions: Vec<Option<R>>) -> RegionExecutor<R> {
        RegionExecutor {
            regions,
            batches: 0,
            writes: 0,
        }
    }

    /// The executor of one function (the first), persisting on `region`.
    pub fn on(region: R) -> RegionExecutor<R> {
        RegionExecutor::new(vec![Some(region)])
    }

    /// The region of the function at `place`, if it has one.
    pub fn region(&self, place: usize) -> Option<&R> {
        self.regions.get(place).and_then(Option::as_ref)
    }

    /// The first region of any function (the medium a device without a log reports).
    pub fn first_region(&self) -> Option<&R> {
        self.regions.iter().flatten().next()
    }
}

impl<R: pmnet_pm::PmRegion> Persist<FrontWork> for RegionExecutor<R> {
    fn persist(&mut self, work: Vec<FrontWork>) {
        if work.is_empty() {
            return;
        }
        let mut written = Vec::new();
        for FrontWork { function, write } in &work {
            // A function that asks for persistence without a region is a bug: what it
            // acknowledges after this would not be durable.
            let region = self
                .regions
                .get_mut(*function)
                .and_then(Option::as_mut)
                .expect("region work asked for by a function with no region");
            region.write(write.offset, &write.bytes);
            region.flush(write.offset, write.bytes.len());
            if !written.contains(function) {
                written.push(*function);
            }
        }
        for function in written {
            if let Some(region) = self.regions[function].as_mut() {
                region.fence();
            }
        }
        self.batches += 1;
        self.writes += work.len() as u64;
    }
}

/// The writes of one function (the first: an executor made with [`RegionExecutor::on`]), as
/// a pipeline of that function alone asks for them.
impl<R: pmnet_pm::PmRegion> Persist<RegionWrite> for RegionExecutor<R> {
    fn persist(&mut self, work: Vec<RegionWrite>) {
        let work = work
            .into_iter()
            .map(|write| FrontWork { function: 0, write })
            .collect();
        Persist::<FrontWork>::persist(self, work);
    }
}

/// A function that sits in front of a device's log (a read cache, a chain store's member, an
/// ABD coordinator, a counter in a test), persisting on a region of its own if it persists
/// anything.
pub trait FrontFunction: NetworkFunction<Work = RegionWrite> + std::fmt::Debug + Send {}

impl<F: NetworkFunction<Work = RegionWrite> + std::fmt::Debug + Send> FrontFunction for F {}

/// A device's functions in front of its log, in a declared order: a datagram is offered to
/// each in turn (rewritten, when one rewrote it) until one consumes it; each sees what the
/// functions behind it send ([`NetworkFunction::on_sent`]); their region work goes out in one
/// numbered batch, each write tagged with its function's place ([`FrontWork`]).
#[derive(Debug)]
pub struct Fronts {
    functions: Vec<Box<dyn FrontFunction>>,
    next_batch: u64,
    /// Batches emitted and not yet reported: this one's number and each function's.
    in_flight: VecDeque<(u64, Vec<(usize, u64)>)>,
}

impl Fronts {
    /// `functions`, first offered first.
    pub fn new(functions: Vec<Box<dyn FrontFunction>>) -> Fronts {
        Fronts {
            functions,
            next_batch: 1,
            in_flight: VecDeque::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.functions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }

    /// The functions, in order.
    pub fn iter(&self) -> impl Iterator<Item = &dyn FrontFunction> {
        self.functions.iter().map(|function| &**function)
    }
}

impl NetworkFunction for Fronts {
    type Work = FrontWork;

    fn handle(&mut self, now: Time, from: SocketAddr, header: &Header, datagram: &[u8]) -> Verdict {
        let Some((first, rest)) = self.functions.split_first_mut() else {
            return Verdict::Pass;
        };
        let mut verdict = first.handle(now, from, header, datagram);
        for function in rest {
            if verdict.is_consumed() {
                break;
            }
            verdict = offer_next(verdict, function, now, from, header, datagram);
        }
        verdict
    }

    fn handle_timeout(&mut self, now: Time) {
        for function in &mut self.functions {
            if function.poll_timeout().is_some_and(|at| at <= now) {
                function.handle_timeout(now);
            }
        }
    }

    fn on_persisted(&mut self, now: Time, through: u64) {
        assert!(
            through < self.next_batch,
            "batch {through} reported persisted before it was emitted"
        );
        let mut reported: Vec<Option<u64>> = vec![None; self.functions.len()];
        while self
            .in_flight
            .front()
            .is_some_and(|(number, _)| *number <= through)
        {
            let (_, numbers) = self.in_flight.pop_front().expect("checked");
            for (place, number) in numbers {
                reported[place] = Some(number);
            }
        }
        for (function, through) in self.functions.iter_mut().zip(reported) {
            if let Some(through) = through {
                function.on_persisted(now, through);
            }
        }
    }

    fn poll_transmit(&mut self) -> Option<Transmit> {
        for place in 0..self.functions.len() {
            if let Some(transmit) = self.functions[place].poll_transmit() {
                // Every function in front of the one that sent it sees it.
                for function in &mut self.functions[..place] {
                    function.on_sent(&transmit);
                }
                return Some(transmit);
            }
        }
        None
    }

    fn poll_persist(&mut self) -> Option<PersistBatch<FrontWork>> {
        let mut numbers = Vec::new();
        let mut work = Vec::new();
        for (place, function) in self.functions.iter_mut().enumerate() {
            if let Some(batch) = function.poll_persist() {
                numbers.push((place, batch.number));
                work.extend(batch.work.into_iter().map(|write| FrontWork {
                    function: place,
                    write,
                }));
            }
        }
        if numbers.is_empty() {
            return None;
        }
        let number = self.next_batch;
        self.next_batch += 1;
        self.in_flight.push_back((number, numbers));
        Some(PersistBatch { number, work })
    }

    fn poll_timeout(&self) -> Option<Time> {
        self.functions
            .iter()
            .filter_map(|function| function.poll_timeout())
            .min()
    }

    fn on_sent(&mut self, transmit: &Transmit) {
        for function in &mut self.functions {
            function.on_sent(transmit);
        }
    }

    fn note_seal(&mut self, sealed_at_ms: u64, started_ms: u64) {
        for function in &mut self.functions {
            function.note_seal(sealed_at_ms, started_ms);
        }
    }

    fn on_unverified(&mut self, now: Time, from: SocketAddr, reason: DropReason) {
        for function in &mut self.functions {
            function.on_unverified(now, from, reason);
        }
    }

    fn counter_samples(&self) -> Vec<(&'static str, &'static str, u64)> {
        self.functions
            .iter()
            .flat_map(|function| function.counter_samples())
            .collect()
    }

    fn dropped(&self) -> DropCounts {
        self.functions
            .iter()
            .fold(DropCounts::new(), |all, function| {
                all.merged(&function.dropped())
            })
    }

    fn report(&self) -> Option<String> {
        let reports: Vec<String> = self
            .functions
            .iter()
            .filter_map(|function| function.report())
            .collect();
        (!reports.is_empty()).then(|| reports.join("; "))
    }
}
