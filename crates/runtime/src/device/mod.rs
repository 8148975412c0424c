//! The PMNet device over UDP.
//!
//! This file holds the options, the runtime and its turn of the loop; `open` checks the
//! configuration, binds the sockets and opens the log; `metrics` renders the report line and
//! the metrics.

mod datapath;
mod metrics;
mod open;
mod route;
pub(crate) use open::log_file_error;
mod workers;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
pub use workers::{stale_worker_logs, worker_log_path, WORKERS_MAX};

use pmnet_pm::{LogWork, MediumInfo, MmapOptions, MmapRegion, PmLog};
use pmnet_proto::{
    Device, DeviceConfig, DeviceCounters, DevicePipeline, DropCounts, FrontFunction, Persist,
    RegionExecutor, Transmit,
};

use crate::event_loop::{run_loop, LoopCounters, LoopSettings, Node, Ready, Turn};
use crate::metrics::Metrics;
use crate::peers::{wants_answer, PeerWatch};
use crate::udp::{BatchSocket, BATCH_LEN};
use crate::wait::Clock;
use crate::wait::PollFd;
use crate::{start_metrics, LoopOptions, MetricsBoard, RuntimeError, Shutdown};
use datapath::DataPath;
use open::{bind_sockets, check_follow, check_servers, open_device_log};

/// Echoed datagrams waiting to be sent at most.
pub const ECHO_MAX_QUEUED: usize = 4096;

/// The device's persistent log.
#[derive(Debug, Clone)]
pub struct LogOptions {
    pub path: PathBuf,
    /// Geometry of a new log; an existing log keeps its own (a warning says so if it differs).
    pub slot_count: u32,
    pub slot_size: u32,
    /// Erase the file and format a new, empty log even if it holds one.
    pub format: bool,
    pub mmap: MmapOptions,
}

/// Everything a device needs to start.
#[derive(Debug, Clone)]
pub struct DeviceOptions {
    /// Named in every PMNet-ACK.
    pub device_id: u16,
    /// Where clients (and servers) reach the device.
    pub listen: SocketAddr,
    /// The servers behind the device and their ids: one for the "NIC" deployment, several for
    /// the "switch".
    pub servers: Vec<(u16, SocketAddr)>,
    /// The devices before this one in chains, by server id: fill queries are passed on to
    /// them (`pmnet_proto::DeviceConfig::previous_devices`).
    pub previous_devices: Vec<(u16, SocketAddr)>,
    /// Follow the controllers (`--controller`): statuses to them, their routes taken by a
    /// restart in place (`route.rs`). `None`: no controller.
    pub follow: Option<pmnet_proto::route::FollowerConfig>,
    /// The log; `None` runs the device with logging off (a plain switch: nothing is acked).
    pub log: Option<LogOptions>,
    /// A second port that forwards to the same servers without logging, to measure the
    /// switch alone beside the PMNet function (the benchmark's `forward` mode).
    pub forward_listen: Option<SocketAddr>,
    /// A UDP echo port served by the same loop: the floor for any acknowledgement (the
    /// benchmark's `echo` mode).
    pub echo_listen: Option<SocketAddr>,
    /// Resent log entries out to one server at once (the paced replay's window); `None`
    /// keeps the state machine's default.
    pub max_resends_in_flight: Option<u32>,
    /// The shortest wait before a logged entry is resent to its server (the device waits
    /// longer for a server whose acks take longer); `None` keeps the state machine's default
    /// (20 ms).
    pub resend_timeout: Option<Duration>,
    /// Authenticate every datagram with these deployment keys (`None`: no authentication).
    pub keys: Option<pmnet_auth::KeySet>,
    /// Pack what a turn forwards to each server into batches (the servers answer in batches
    /// too). The forward port never batches: it stands for a plain switch.
    pub batch: bool,
    /// With `batch`: how long a batch of update requests (acked already: nothing waits on
    /// them) may wait for more before it goes to its server.
    pub batch_hold: Duration,
    pub loop_options: LoopOptions,
    /// Serve on AF_XDP sockets (in path or not) instead of the UDP socket alone.
    pub xdp: Option<crate::xdp_path::XdpOptions>,
}

/// What the device found when it started.
#[derive(Debug, Clone)]
pub struct DeviceStartup {
    /// `None` when logging is off.
    pub medium: Option<MediumInfo>,
    pub log_path: Option<PathBuf>,
    pub slot_count: u32,
    pub slot_size: u32,
    /// The log file was created or erased and formatted now.
    pub formatted: bool,
    pub recovered_entry_count: usize,
    /// Torn or corrupt slots freed at open, never replayed.
    pub rejected_slot_count: u32,
}

impl DeviceStartup {
    /// The medium in words, for banners and reports.
    pub fn medium_text(&self) -> String {
        match &self.medium {
            Some(medium) => medium.to_string(),
            None => "none: logging off (a plain switch; nothing is acked early)".to_owned(),
        }
    }
}

/// Where the device's sockets are bound.
#[derive(Debug, Clone, Copy)]
pub struct DeviceAddresses {
    pub data: SocketAddr,
    pub forward: Option<SocketAddr>,
    pub echo: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
}

/// Carries out the device's log work: each batch with [`PmLog::persist_batch`] (one pair of
/// fences), the same executor the simulator runs.
#[derive(Debug, Default)]
struct LogExecutor {
    log: Option<PmLog<MmapRegion>>,
    batches: u64,
    writes: u64,
    invalidations: u64,
    fences: u64,
}

impl Persist<LogWork> for LogExecutor {
    fn persist(&mut self, work: Vec<LogWork>) {
        // A device without a log runs with logging off and asks for no log work; a batch
        // reaching here anyway is a bug, and acking its writes would break the promise.
        let log = self
            .log
            .as_mut()
            .expect("log work asked for by a device with no log");
        let stats = log.persist_batch(&work);
        tracing::trace!(
            writes = stats.writes,
            invalidations = stats.invalidations,
            "log batch persisted"
        );
        self.batches += 1;
        self.writes += stats.writes;
        self.invalidations += stats.invalidations;
        self.fences += stats.fences;
    }
}

/// Counters of the runtime itself (the state machine counts the protocol).
#[derive(Debug, Clone, Default)]
struct RuntimeCounters {
    echoed: u64,
    event_loop: LoopCounters,
}

/// Which of the device's sockets a turn receives on.
#[derive(Debug, Clone, Copy)]
struct SocketSet {
    data: bool,
    forward: bool,
    echo: bool,
}

impl SocketSet {
    const ALL: SocketSet = SocketSet {
        data: true,
        forward: true,
        echo: true,
    };
}

/// A running PMNet device: sockets, log, state machines. See the crate docs.
#[derive(Debug)]
pub struct DeviceRuntime {
    options: DeviceOptions,
    clock: Clock,
    /// The device's functions, the log last.
    pipeline: DevicePipeline,
    executor: LogExecutor,
    /// The regions of the functions in front of the log (a chain store's table), by place.
    front_executor: RegionExecutor<MmapRegion>,
    data: DataPath,
    /// How many descriptors the data path waits on (the first of [`DeviceRuntime::poll_fds`]).
    data_fd_count: usize,
    /// Why `--xdp` was asked for and the device serves on its UDP socket instead.
    xdp_unavailable: Option<String>,
    /// The forward port's plain switch (a pipeline whose log does not log).
    forward: Option<(DevicePipeline, BatchSocket)>,
    echo: Option<BatchSocket>,
    startup: DeviceStartup,
    addresses: DeviceAddresses,
    board: MetricsBoard,
    shutdown: Shutdown,
    counters: RuntimeCounters,
    /// Whether the servers answer what the device forwards them.
    servers: PeerWatch,
    /// Who the data socket last heard from, and when.
    peers: crate::peer_book::PeerBook,
    /// `device{id=..}`: every event of this device (its log's recovery, its loop) carries it.
    span: tracing::Span,
    /// The replay of the entries recovered from the log, while some wait for their server.
    replay: Option<ReplayProgress>,
    /// The metric names of the datagrams dropped: per reason, and all of them.
    drop_metrics: (&'static str, &'static str),
    /// What the process is: "device", or the function it serves as (`serve_as`).
    role: &'static str,
    /// Why the loop stopped on an error of its own (a restart in place that failed).
    failed: Option<String>,
    /// Restarts in place for the controllers' routes (`route.rs`).
    restarts_in_place: u64,
}

/// A function of a device's pipeline, in front of its log, and the region it persists on, if
/// any (opened by the caller).
#[derive(Debug)]
pub struct DeviceFunction {
    pub function: Box<dyn FrontFunction>,
    pub region: Option<MmapRegion>,
}

impl DeviceFunction {
    /// A function that persists nothing (a read cache, an ABD coordinator).
    pub fn new(function: Box<dyn FrontFunction>) -> DeviceFunction {
        DeviceFunction {
            function,
            region: None,
        }
    }

    /// A function persisting on `region` (a chain member's table, a memory node's lines).
    pub fn on(function: Box<dyn FrontFunction>, region: MmapRegion) -> DeviceFunction {
        DeviceFunction {
            function,
            region: Some(region),
        }
    }
}

/// How far the replay of the entries recovered at start-up has got.
#[derive(Debug, Clone, Copy)]
struct ReplayProgress {
    recovered: usize,
    started: std::time::Instant,
    next_report: std::time::Instant,
}

/// How often the replay's progress is looked at (and said, at debug).
const REPLAY_REPORT_INTERVAL: Duration = Duration::from_secs(1);

impl DeviceRuntime {
    /// Bind the sockets, open (or format) the log and rebuild the device from it.
    pub fn open(options: DeviceOptions, shutdown: Shutdown) -> Result<DeviceRuntime, RuntimeError> {
        DeviceRuntime::open_with_functions(options, shutdown, Vec::new())
    }

    /// [`DeviceRuntime::open`] with `front` in the pipeline in front of the log: it is offered
    /// every datagram first, and the log gets what it passes on.
    pub fn open_with_front(
        options: DeviceOptions,
        shutdown: Shutdown,
        front: Box<dyn FrontFunction>,
    ) -> Result<DeviceRuntime, RuntimeError> {
        DeviceRuntime::open_with_functions(options, shutdown, vec![DeviceFunction::new(front)])
    }

    /// [`DeviceRuntime::open`] with `functions` in front of the log, in order: each is offered
    /// every datagram the ones before it pass on, and the log gets what they all pass on. A
    /// function that persists on a region of its own (a chain store's table, opened by the
    /// caller) has its [`pmnet_proto::RegionWrite`]s carried out there, each batch ending with
    /// one fence per region, before it hears they are durable.
    pub fn open_with_functions(
        options: DeviceOptions,
        shutdown: Shutdown,
        functions: Vec<DeviceFunction>,
    ) -> Result<DeviceRuntime, RuntimeError> {
        let (fronts, regions): (Vec<_>, Vec<_>) = functions
            .into_iter()
            .map(|function| (function.function, function.region))
            .unzip();
        let span = tracing::info_span!("device", id = options.device_id);
        let _entered = span.clone().entered();
        // A device with neither servers nor a log runs its front function alone (a memory
        // node, an ABD coordinator).
        if !options.servers.is_empty() || options.log.is_some() {
            check_servers(&options)?;
        }
        if options.follow.is_some() {
            check_follow(&options, fronts.len())?;
        }
        let sockets = bind_sockets(&options)?;
        let clock = Clock::new();
        let now = clock.now();
        let (log, mut startup) = open_device_log(&options)?;
        if startup.medium.is_none() {
            // No log: the medium to report is a function's (a memory node's lines).
            startup.medium = regions
                .iter()
                .flatten()
                .next()
                .map(pmnet_pm::PmRegion::medium);
        }
        let (device, log) = match log {
            Some((log, entries)) => {
                let config = open::log_device_config(&options, &log);
                (Device::new(config, now, entries), Some(log))
            }
            None => (
                Device::new(plain_switch_config(&options), now, Vec::new()),
                None,
            ),
        };
        let forward = sockets.forward.map(|socket| {
            let switch = Device::new(plain_switch_config(&options), now, Vec::new());
            (
                DevicePipeline::with_fronts(Vec::new(), switch)
                    .with_auth(options.keys.clone().map(pmnet_proto::Authenticator::new))
                    .with_plain_traffic_warnings(options.keys.is_none()),
                socket,
            )
        });
        let board = MetricsBoard::new();
        let metrics = start_metrics(&options.loop_options, &board, &shutdown)?;
        let addresses = DeviceAddresses {
            data: sockets.data.local_addr(),
            forward: forward.as_ref().map(|(_, socket)| socket.local_addr()),
            echo: sockets.echo.as_ref().map(BatchSocket::local_addr),
            metrics,
        };
        let pipeline = open::make_pipeline(&options, fronts, device);
        let server_addrs: Vec<SocketAddr> = options.servers.iter().map(|(_, addr)| *addr).collect();
        let servers = PeerWatch::new(
            "server",
            "`pmnet server` (or `pmnet redis-adaptor`)",
            &server_addrs,
        );
        let mut socket = sockets.data;
        socket.report_unreachable();
        let mut xdp_unavailable = None;
        let data = match &options.xdp {
            Some(xdp) => match crate::xdp_path::xdp_available() {
                Ok(()) => {
                    let path = crate::xdp_path::XdpPath::open(xdp, socket, &options.servers)
                        .map_err(|error| RuntimeError::Config(format!("--xdp: {error}")))?;
                    DataPath::Xdp(Box::new(path))
                }
                Err(why) => {
                    // No XDP here at all (not built in, no privileges, no AF_XDP in the
                    // kernel): serve on the UDP socket, and say so. A mistake in the
                    // configuration (an interface that is not there) is an error instead.
                    tracing::warn!(
                        "AF_XDP is not available ({why}): serving on the UDP socket instead{}",
                        if xdp.in_path {
                            "; NOT in the path: clients that address the servers reach them \
                             through the kernel's routing, past this device"
                        } else {
                            ""
                        }
                    );
                    xdp_unavailable = Some(why);
                    DataPath::Udp(socket)
                }
            },
            None => DataPath::Udp(socket),
        };
        let recovered = startup.recovered_entry_count;
        if recovered > 0 {
            tracing::info!(
                "replay: resending the {recovered} entries recovered from the log to their \
                 servers (in order, at each server's pace)"
            );
        }
        let started = std::time::Instant::now();
        let replay = (recovered > 0).then_some(ReplayProgress {
            recovered,
            started,
            next_report: started + REPLAY_REPORT_INTERVAL,
        });
        let mut runtime = DeviceRuntime {
            servers,
            span,
            replay,
            options,
            clock,
            pipeline,
            executor: LogExecutor {
                log,
                ..LogExecutor::default()
            },
            front_executor: RegionExecutor::new(regions),
            data_fd_count: data.raw_fds().len(),
            data,
            xdp_unavailable,
            forward,
            echo: sockets.echo,
            startup,
            addresses,
            board,
            shutdown,
            counters: RuntimeCounters::default(),
            peers: crate::peer_book::PeerBook::default(),
            drop_metrics: (
                "pmnet_device_dropped_total",
                "pmnet_device_dropped_all_total",
            ),
            role: "device",
            failed: None,
            restarts_in_place: 0,
        };
        // Recovered entries are resent to their servers right away, and rejected slots freed.
        runtime.drain();
        crate::publish_node(&runtime, &runtime.board);
        Ok(runtime)
    }

    /// Count the datagrams dropped under `per_reason` (labelled by port and reason) and `all`
    /// instead of the device's names: a process that is no PMNet device (a memory node) counts
    /// its drops under its own.
    pub fn name_drops_as(&mut self, per_reason: &'static str, all: &'static str) {
        self.drop_metrics = (per_reason, all);
    }

    /// What the process is, when it is not a PMNet device but a function on the device's
    /// loop without a log (a memory node): its report line names it and gives the function's
    /// report instead of a log's counters.
    pub fn serve_as(&mut self, role: &'static str) {
        self.role = role;
        // Its log lines are named after it too, by its address (it has no device id).
        self.span = tracing::info_span!("node", role, addr = %self.addresses.data);
    }

    pub fn startup(&self) -> &DeviceStartup {
        &self.startup
    }

    /// What the device serves on, for its banner: the UDP socket, or the AF_XDP datapath.
    pub fn datapath_text(&self) -> String {
        match self.data.xdp() {
            None => match &self.xdp_unavailable {
                None => "UDP socket (recvmmsg/sendmmsg)".to_owned(),
                Some(why) => format!(
                    "UDP socket (recvmmsg/sendmmsg): --xdp asked for, but AF_XDP is not \
                     available here: {why}"
                ),
            },
            Some(path) => path.describe(),
        }
    }

    pub fn addresses(&self) -> DeviceAddresses {
        self.addresses
    }

    pub fn counters(&self) -> &DeviceCounters {
        self.pipeline.device().counters()
    }

    /// Every datagram the device's pipeline dropped, by reason (the log's drops and the
    /// pipeline's own: unparseable, or of a type no function owns).
    pub fn dropped(&self) -> DropCounts {
        self.pipeline.dropped()
    }

    /// Log entries the servers have not yet acknowledged.
    pub fn live_entry_count(&self) -> usize {
        self.pipeline.device().live_entry_count()
    }

    /// Run until the shutdown flag is set; then finish the batch in hand, send what is owed,
    /// and return.
    pub fn run(&mut self) -> Result<(), RuntimeError> {
        let _entered = self.span.clone().entered();
        let settings = LoopSettings::from(&self.options.loop_options);
        let board = self.addresses.metrics.map(|_| self.board.clone());
        let shutdown = self.shutdown.clone();
        run_loop(self, settings, board.as_ref(), &shutdown)?;
        match self.failed.take() {
            Some(why) => Err(RuntimeError::Config(why)),
            None => Ok(()),
        }
    }

    /// Restarts in place for the controllers' routes so far.
    pub fn restarts_in_place(&self) -> u64 {
        self.restarts_in_place
    }

    /// One turn of the loop: receive a batch on every socket, handle it, fire due timers,
    /// persist, send. Returns whether anything happened.
    pub fn poll_once(&mut self) -> bool {
        self.receive_and_handle(SocketSet::ALL).busy
    }

    /// A turn that receives on the sockets in `ready` only.
    fn receive_and_handle(&mut self, ready: SocketSet) -> Turn {
        let mut turn = Turn::default();
        let count = if ready.data {
            self.data.receive_batch()
        } else {
            0
        };
        turn.more |= count >= BATCH_LEN;
        if count > 0 {
            // Look once more at the data socket (only) before sleeping: the server's ACK of
            // what was just forwarded often arrives within microseconds, and taking it now
            // saves a sleep and a wake-up on the vCPU the clients may share.
            turn.again = true;
            turn.busy = true;
            let now = self.clock.now();
            let tracing_on = crate::trace::enabled();
            for index in 0..count {
                if let Some((from, datagram)) = self.data.received(index) {
                    // Only a datagram that verified says its sender is there: one that did
                    // not is anyone's (and must not fill the status page's list of peers).
                    let unverified = self.pipeline.unverified_total();
                    if tracing_on {
                        crate::trace::received(from, datagram);
                        let drops = self.pipeline.dropped();
                        let live = self.pipeline.device().live_entry_count();
                        self.pipeline.handle(now, from, datagram);
                        crate::trace::dropped(from, datagram, &drops, &self.pipeline.dropped());
                        let freed = live.saturating_sub(self.pipeline.device().live_entry_count());
                        if freed > 0 {
                            tracing::trace!(
                                %from,
                                kind = %crate::trace::kind(datagram),
                                freed,
                                live = live - freed,
                                "server-ACK: log entries freed"
                            );
                        }
                    } else {
                        self.pipeline.handle(now, from, datagram);
                    }
                    if self.pipeline.unverified_total() == unverified {
                        self.servers.heard(from);
                        self.peers.heard(from, now);
                    }
                }
            }
        }
        if self.data.has_unreachable() {
            let reports = self.data.take_unreachable();
            self.servers.unreachable(&reports);
        }
        if let Some((forward, socket)) = self.forward.as_mut().filter(|_| ready.forward) {
            let count = socket.receive_batch();
            turn.more |= count == BATCH_LEN;
            if count > 0 {
                turn.busy = true;
                let now = self.clock.now();
                for index in 0..count {
                    if let Some((from, datagram)) = socket.received(index) {
                        forward.handle(now, from, datagram);
                    }
                }
            }
        }
        if let Some(socket) = self.echo.as_mut().filter(|_| ready.echo) {
            let count = socket.receive_batch();
            turn.more |= count == BATCH_LEN;
            if count > 0 {
                turn.busy = true;
                let mut echoes: [Option<Transmit>; BATCH_LEN] = Default::default();
                for (index, echo) in echoes.iter_mut().enumerate().take(count) {
                    *echo = socket.received(index).map(|(from, datagram)| Transmit {
                        destination: from,
                        bytes: datagram.to_vec(),
                    });
                }
                for echo in echoes.into_iter().flatten() {
                    self.counters.echoed += 1;
                    socket.enqueue(echo);
                }
            }
        }
        let now = self.clock.now();
        if self
            .pipeline
            .poll_timeout()
            .is_some_and(|deadline| deadline <= now)
        {
            turn.busy = true;
            turn.more = true;
            self.pipeline.handle_timeout(now);
        }
        let wall = std::time::Instant::now();
        self.servers.check(wall);
        if self.replay.is_some_and(|replay| wall >= replay.next_report) {
            self.report_replay(wall);
        }
        if let Some((forward, _)) = self.forward.as_mut() {
            if forward
                .poll_timeout()
                .is_some_and(|deadline| deadline <= now)
            {
                turn.busy = true;
                turn.more = true;
                forward.handle_timeout(now);
            }
        }
        self.drain();
        self.follow_route();
        turn
    }

    /// Say how far the replay of the recovered entries has got: at debug while some wait for
    /// their server's ACK, at info when none does.
    fn report_replay(&mut self, wall: std::time::Instant) {
        let Some(replay) = self.replay.as_mut() else {
            return;
        };
        let waiting = self.pipeline.device().recovered_live_count();
        if waiting == 0 {
            tracing::info!(
                "replay done: the {} entries recovered from the log are acknowledged by their \
                 servers ({:.1} s)",
                replay.recovered,
                replay.started.elapsed().as_secs_f64()
            );
            self.replay = None;
        } else {
            tracing::debug!(
                waiting,
                recovered = replay.recovered,
                resent = self.pipeline.device().counters().replay_sent,
                "replay: recovered entries still wait for their server's ACK"
            );
            replay.next_report = wall + REPLAY_REPORT_INTERVAL;
        }
    }

    /// The sockets a turn may receive on, numbered as `poll_fds` lists them.
    fn readable(&self, ready: Ready<'_>) -> SocketSet {
        let mut index = 0;
        let mut next = || {
            let set = ready.is_readable(index);
            index += 1;
            set
        };
        // The data path may wait on several descriptors (AF_XDP: one per interface, and the
        // kernel's socket): any of them readable makes a turn receive on all.
        let data = (0..self.data_fd_count).fold(false, |any, _| next() || any);
        let forward = self.forward.is_some() && next();
        let echo = self.echo.is_some() && next();
        SocketSet {
            data,
            forward,
            echo,
        }
    }

    /// Carry out persistence work in order, then send everything the state machines emitted.
    fn drain(&mut self) {
        loop {
            self.carry_out_persist_work();
            let mut emitted = false;
            let mut now = None;
            while let Some(transmit) = self.pipeline.poll_transmit() {
                emitted = true;
                crate::trace::sent(transmit.destination, &transmit.bytes);
                if wants_answer(&transmit.bytes) {
                    let now = *now.get_or_insert_with(std::time::Instant::now);
                    self.servers.sent(transmit.destination, now);
                }
                self.data.enqueue(transmit);
            }
            if let Some((forward, socket)) = self.forward.as_mut() {
                while let Some(transmit) = forward.poll_transmit() {
                    emitted = true;
                    socket.enqueue(transmit);
                }
            }
            if !emitted {
                break;
            }
        }
        self.data.flush();
        if let Some((_, socket)) = self.forward.as_mut() {
            socket.flush();
        }
        if let Some(socket) = self.echo.as_mut() {
            socket.flush();
        }
    }

    /// The device's persistence work, batch by batch in the order emitted: each batch is
    /// durable (one pair of fences, [`PmLog::persist_batch`]) before it is reported, and only
    /// the report lets the log send the PMNet-ACKs of its writes. The forward port's switch
    /// logs nothing and asks for no work.
    fn carry_out_persist_work(&mut self) {
        let now = self.clock.now();
        self.pipeline
            .persist_with(now, &mut (&mut self.front_executor, &mut self.executor));
    }

    fn timer_deadlines(&self) -> impl Iterator<Item = pmnet_proto::Time> + '_ {
        self.pipeline.poll_timeout().into_iter().chain(
            self.forward
                .as_ref()
                .and_then(|(forward, _)| forward.poll_timeout()),
        )
    }

    /// The sockets to wait on, in the order [`DeviceRuntime::readable`] reads the mask:
    /// data, then forward and echo where they exist.
    fn poll_fds(&self) -> Vec<(std::os::fd::RawFd, bool)> {
        let blocked = self.data.is_write_blocked();
        let mut fds: Vec<_> = self
            .data
            .raw_fds()
            .into_iter()
            .map(|fd| (fd, blocked))
            .collect();
        if let Some((_, socket)) = &self.forward {
            fds.push((socket.raw_fd(), socket.is_write_blocked()));
        }
        if let Some(socket) = &self.echo {
            fds.push((socket.raw_fd(), socket.is_write_blocked()));
        }
        fds
    }
}

impl Node for DeviceRuntime {
    fn turn(&mut self, ready: Ready<'_>) -> Turn {
        let sockets = self.readable(ready);
        self.receive_and_handle(sockets)
    }

    fn wait_fds(&self, fds: &mut Vec<PollFd>) {
        for (fd, write) in self.poll_fds() {
            fds.push(PollFd::new(fd, true, write));
        }
    }

    fn next_timer(&self) -> Option<Duration> {
        let now = self.clock.now();
        self.timer_deadlines()
            .map(|deadline| deadline.saturating_duration_since(now))
            .min()
    }

    fn queued_len(&self) -> usize {
        self.data.queued_len()
            + self.forward.as_ref().map_or(0, |(_, s)| s.queued_len())
            + self.echo.as_ref().map_or(0, BatchSocket::queued_len)
    }

    fn flush(&mut self) {
        self.data.flush();
        if let Some((_, socket)) = self.forward.as_mut() {
            socket.flush();
        }
        if let Some(socket) = self.echo.as_mut() {
            socket.flush();
        }
    }

    fn metrics(&self) -> Metrics {
        DeviceRuntime::metrics(self)
    }

    fn status(&self) -> Option<serde_json::Value> {
        Some(DeviceRuntime::status(self))
    }

    fn report_line(&self) -> String {
        DeviceRuntime::report_line(self)
    }

    fn kind(&self) -> &'static str {
        self.role
    }

    fn loop_counters(&mut self) -> &mut LoopCounters {
        &mut self.counters.event_loop
    }
}

fn plain_switch_config(options: &DeviceOptions) -> DeviceConfig {
    let mut config = DeviceConfig::new(options.device_id, options.servers.clone(), 1, 0);
    config.logging = false;
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn device_options(listen: SocketAddr, servers: Vec<(u16, SocketAddr)>) -> DeviceOptions {
        DeviceOptions {
            device_id: 1,
            listen,
            servers,
            previous_devices: Vec::new(),
            follow: None,
            log: None,
            forward_listen: None,
            echo_listen: None,
            max_resends_in_flight: None,
            resend_timeout: None,
            loop_options: LoopOptions {
                report_interval: None,
                ..LoopOptions::default()
            },
            keys: None,
            batch: true,
            batch_hold: Duration::ZERO,
            xdp: None,
        }
    }

    #[test]
    fn a_device_refuses_to_forward_to_itself() {
        // The port is known only once bound: take a free one and use it for both.
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let listen = SocketAddr::from(([127, 0, 0, 1], port));
        let error = DeviceRuntime::open(device_options(listen, vec![(1, listen)]), Shutdown::new())
            .unwrap_err()
            .to_string();
        assert!(error.contains("own listen address"), "{error}");
        assert!(error.contains(&listen.to_string()), "{error}");

        let any = SocketAddr::from(([0, 0, 0, 0], port));
        let servers = vec![(1, addr("127.0.0.1:9")), (2, listen)];
        let error = DeviceRuntime::open(device_options(any, servers), Shutdown::new())
            .unwrap_err()
            .to_string();
        assert!(error.contains("server 2"), "{error}");

        let twice = vec![(1, addr("127.0.0.1:9")), (1, addr("127.0.0.1:10"))];
        let error = DeviceRuntime::open(device_options(listen, twice), Shutdown::new())
            .unwrap_err()
            .to_string();
        assert!(error.contains("given twice"), "{error}");
    }
}
