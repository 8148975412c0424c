//! An in-network function hosted as production hosts it (`pmnet device --chain-member`,
//! `pmnet device --abd-node`, `pmnet memnode`): in a device's pipeline, in front of a log
//! function that has no log and no servers (a plain switch, as the runtime builds it), its
//! region writes carried out by production's executor ([`RegionExecutor`], one fence per
//! batch) on a simulated persistent region. The pipeline is `DevicePipeline`'s shape with
//! the function unboxed, so that the worlds can look at its state. Given keys, the pipeline
//! seals what it sends and verifies what it receives, as production's does, and tells the
//! function each datagram's seal time and the host's start (`note_seal`).
//!
//! A crash in the middle of the executor's work (its records stored and flushed, the fence
//! not reached) is [`FunctionHost::crash`]: the region's crash image keeps, loses or tears
//! every line not fenced.

use std::net::SocketAddr;

use pmnet_pm::{LogWork, PmRegion, SimRegion};
use pmnet_proto::{
    Device, DeviceConfig, FrontFunction, Persist, PersistBatch, Pipeline, RegionExecutor,
    RegionWrite, Stack, StackWork, Time, Transmit,
};
use rand::Rng;

/// The log executor of a device with no log: it asks for no log work (logging off), and a
/// batch of it reaching here is a bug, as in the runtime.
struct NoLog;

impl Persist<LogWork> for NoLog {
    fn persist(&mut self, work: Vec<LogWork>) {
        assert!(
            work.is_empty(),
            "log work asked for by a device with no log"
        );
    }
}

/// A function in a device's pipeline, with its region.
#[derive(Debug)]
pub(crate) struct FunctionHost<F> {
    pipeline: Pipeline<Stack<F, Device>>,
    executor: RegionExecutor<SimRegion>,
}

impl<F: FrontFunction> FunctionHost<F> {
    /// `function` in front of a plain switch (no log, no servers), persisting on `region`
    /// (`None`: the function persists nothing), sealing and verifying with `auth` (its clock
    /// at the host's start, which the pipeline hands its functions for their replay floors).
    pub(crate) fn new(
        function: F,
        region: Option<SimRegion>,
        auth: Option<pmnet_auth::Authenticator>,
    ) -> FunctionHost<F> {
        let mut config = DeviceConfig::new(0, Vec::new(), 1, 0);
        config.logging = false;
        let device = Device::new(config, Time::ZERO, Vec::new());
        FunctionHost {
            pipeline: Pipeline::new(Stack::new(function, device)).with_auth(auth),
            executor: match region {
                Some(region) => RegionExecutor::on(region),
                None => RegionExecutor::default(),
            },
        }
    }

    /// The function, to look at its state.
    pub(crate) fn function(&self) -> &F {
        &self.pipeline.functions().front
    }

    /// The function's region (what a restart reopens).
    pub(crate) fn region(&self) -> Option<&SimRegion> {
        self.executor.region(0)
    }

    /// A datagram from the network, as sent: the pipeline verifies it (with keys) and tells
    /// the functions its seal time and the host's start, for their replay floors.
    pub(crate) fn handle(&mut self, now: Time, from: SocketAddr, datagram: &[u8]) {
        self.pipeline.handle(now, from, datagram);
    }

    /// Datagrams the pipeline dropped as sealed outside its replay window (replays).
    pub(crate) fn stale_dropped(&self) -> u64 {
        let drops = self.pipeline.drops();
        ["stale", "from_the_future"]
            .iter()
            .filter_map(|reason| drops.get(reason))
            .sum()
    }

    pub(crate) fn handle_timeout(&mut self, now: Time) {
        self.pipeline.handle_timeout(now);
    }

    pub(crate) fn poll_timeout(&self) -> Option<Time> {
        self.pipeline.poll_timeout()
    }

    pub(crate) fn poll_transmit(&mut self) -> Option<Transmit> {
        self.pipeline.poll_transmit()
    }

    /// Carry out every batch the functions ask for with production's executors, and report
    /// each durable.
    pub(crate) fn persist_all(&mut self, now: Time) {
        self.pipeline
            .persist_with(now, &mut (&mut self.executor, &mut NoLog));
    }

    /// The next batch of the function's region writes, to carry out later
    /// ([`FunctionHost::persist`]) or to cut by a crash.
    pub(crate) fn poll_persist(&mut self) -> Option<PersistBatch<RegionWrite>> {
        let batch = self.pipeline.poll_persist()?;
        let work = batch
            .work
            .into_iter()
            .map(|work| match work {
                StackWork::Front(write) => write,
                StackWork::Back(_) => panic!("log work asked for by a device with no log"),
            })
            .collect();
        Some(PersistBatch {
            number: batch.number,
            work,
        })
    }

    /// Carry out `batch` (from [`FunctionHost::poll_persist`], in order) and report it.
    pub(crate) fn persist(&mut self, now: Time, batch: PersistBatch<RegionWrite>) {
        self.executor.persist(batch.work);
        self.pipeline.on_persisted(now, batch.number);
    }

    /// The process crashes in the middle of the executor's work on `cut` (each write stored
    /// and flushed, no fence): the region becomes what the crash leaves, each line not fenced
    /// kept, lost or torn (`rng`). The function's state goes with the host.
    pub(crate) fn crash<'a>(
        &mut self,
        cut: impl IntoIterator<Item = &'a PersistBatch<RegionWrite>>,
        rng: &mut impl Rng,
    ) {
        let Some(region) = self.executor.regions.get_mut(0).and_then(Option::as_mut) else {
            return;
        };
        for write in cut.into_iter().flat_map(|batch| &batch.work) {
            region.write(write.offset, &write.bytes);
            region.flush(write.offset, write.bytes.len());
        }
        *region = region.crash(rng);
    }
}
