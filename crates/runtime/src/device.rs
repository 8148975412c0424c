//! The PMNet device over UDP.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use pmnet_pm::{LogWork, MediumInfo, MmapOptions, MmapRegion, PmLog};
use pmnet_proto::{
    Device, DeviceConfig, DeviceCounters, DevicePipeline, DropCounts, FrontFunction, NoPersistence,
    Nothing, Persist, Transmit,
};

use crate::event_loop::{run_loop, LoopCounters, LoopSettings, Node, Ready, Turn};
use crate::metrics::Metrics;
use crate::udp::{BatchSocket, BATCH_LEN};
use crate::wait::Clock;
use crate::wait::PollFd;
use crate::{
    socket_digest, socket_metrics, start_metrics, LoopOptions, MetricsBoard, RuntimeError, Shutdown,
};

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
    pub loop_options: LoopOptions,
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
    data: BatchSocket,
    /// The forward port's plain switch (a pipeline whose log does not log).
    forward: Option<(DevicePipeline, BatchSocket)>,
    echo: Option<BatchSocket>,
    startup: DeviceStartup,
    addresses: DeviceAddresses,
    board: MetricsBoard,
    shutdown: Shutdown,
    counters: RuntimeCounters,
}

/// Whether datagrams sent to `target` arrive at a socket bound to `own`.
fn reaches(target: SocketAddr, own: SocketAddr) -> bool {
    if target.port() != own.port() {
        return false;
    }
    let target_ip = target.ip().to_canonical();
    let own_ip = own.ip().to_canonical();
    let is_local = |ip: std::net::IpAddr| {
        // Binding succeeds only to an address of this host.
        ip.is_loopback()
            || ip.is_unspecified()
            || std::net::UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
    };
    match own.ip() {
        // Bound to every IPv4 address of the host.
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            target_ip.is_ipv4() && is_local(target_ip)
        }
        // Bound to every address of the host, IPv4 included (unless the host is IPv6-only).
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => is_local(target_ip),
        // Sending to the unspecified address reaches the host itself.
        _ => target_ip == own_ip || target_ip.is_unspecified(),
    }
}

fn bind(
    what: &'static str,
    addr: SocketAddr,
    max_queued: usize,
) -> Result<BatchSocket, RuntimeError> {
    BatchSocket::bind(addr, max_queued).map_err(|source| RuntimeError::Bind { what, addr, source })
}

/// Open the log at `options.path`: a new one when the file does not exist, erased when
/// `format` is set, otherwise recovered. An existing file that holds no usable log (empty,
/// short, blank or corrupt superblock) is an error: it may hold acknowledged entries.
fn open_log(
    options: &LogOptions,
) -> Result<(PmLog<MmapRegion>, pmnet_pm::LogRecovery, bool), RuntimeError> {
    let path = &options.path;
    let file_options = pmnet_pm::LogFileOptions {
        slot_count: options.slot_count,
        slot_size: options.slot_size,
        format: options.format,
        mmap: options.mmap,
    };
    let (log, recovery, opened) =
        pmnet_pm::open_log_file(path, &file_options).map_err(|error| match error {
            pmnet_pm::LogFileError::File(source) => RuntimeError::LogFile {
                path: path.clone(),
                source,
            },
            pmnet_pm::LogFileError::Format { error, .. } => RuntimeError::Log {
                path: path.clone(),
                source: error,
            },
            unusable @ pmnet_pm::LogFileError::Unusable { .. } => {
                RuntimeError::LogUnusable { problem: unusable }
            }
        })?;
    match opened {
        pmnet_pm::LogFileOpened::Created => tracing::info!(
            "device log {} did not exist: created it with {} slots of {} bytes",
            path.display(),
            log.slot_count(),
            log.slot_size()
        ),
        pmnet_pm::LogFileOpened::Erased => tracing::warn!(
            "--format: erased the device log {} (whatever it held is gone) and formatted {} \
             slots of {} bytes",
            path.display(),
            log.slot_count(),
            log.slot_size()
        ),
        pmnet_pm::LogFileOpened::Reopened => {}
    }
    log_damaged_slots(path, &recovery);
    let formatted = opened != pmnet_pm::LogFileOpened::Reopened;
    Ok((log, recovery, formatted))
}

/// Say at WARN what each damaged slot held (the first [`pmnet_pm::REJECTED_SLOTS_DESCRIBED`])
/// and how many entries were lost.
fn log_damaged_slots(path: &std::path::Path, recovery: &pmnet_pm::LogRecovery) {
    if recovery.rejected_slot_count == 0 {
        return;
    }
    for slot in &recovery.rejected_slots {
        tracing::warn!(
            "device log {}: damaged entry lost: {slot}; the slot was freed",
            path.display()
        );
    }
    let unlisted = recovery.rejected_slot_count as usize - recovery.rejected_slots.len();
    tracing::warn!(
        "device log {}: {} logged entries were damaged and are lost{} (torn writes or \
         corruption at rest; their slots were freed and nothing of them is replayed)",
        path.display(),
        recovery.rejected_slot_count,
        if unlisted > 0 {
            format!(" ({unlisted} not listed above)")
        } else {
            String::new()
        }
    );
}

/// The sockets a device serves on.
struct Sockets {
    data: BatchSocket,
    forward: Option<BatchSocket>,
    echo: Option<BatchSocket>,
}

/// Refuse a configuration a device cannot serve: no server, or an id given twice.
fn check_servers(options: &DeviceOptions) -> Result<(), RuntimeError> {
    if options.servers.is_empty() {
        return Err(RuntimeError::Config(
            "a device needs at least one server: pass --server ID=ADDR (for example \
             --server 1=127.0.0.1:7500)"
                .into(),
        ));
    }
    for (index, (id, _)) in options.servers.iter().enumerate() {
        if options.servers[..index]
            .iter()
            .any(|(other, _)| other == id)
        {
            return Err(RuntimeError::Config(format!(
                "server id {id} is given twice; every server behind a device needs its own id"
            )));
        }
    }
    Ok(())
}

/// Bind the device's sockets, refusing a server at one of their addresses.
fn bind_sockets(options: &DeviceOptions) -> Result<Sockets, RuntimeError> {
    let max_queued = options.loop_options.max_queued;
    let data = bind("device", options.listen, max_queued)?;
    let forward = match options.forward_listen {
        Some(addr) => Some(bind("forward", addr, max_queued)?),
        None => None,
    };
    let echo = match options.echo_listen {
        Some(addr) => Some(bind("echo", addr, ECHO_MAX_QUEUED)?),
        None => None,
    };
    let own_sockets = [
        ("listen", Some(&data)),
        ("forward", forward.as_ref()),
        ("echo", echo.as_ref()),
    ];
    for (what, own) in own_sockets
        .into_iter()
        .filter_map(|(what, socket)| Some((what, socket?.local_addr())))
    {
        for (id, server) in &options.servers {
            if reaches(*server, own) {
                return Err(RuntimeError::Config(format!(
                    "server {id} at {server} is this device's own {what} address ({own}): \
                     the device would forward to itself, acking updates that no server \
                     stores; give --server the address of the server behind the device"
                )));
            }
        }
    }
    Ok(Sockets {
        data,
        forward,
        echo,
    })
}

/// Open the log the options name (if any): the log, the entries it held, and what to say of
/// it at start-up.
type OpenedLog = (
    Option<(PmLog<MmapRegion>, Vec<pmnet_pm::RecoveredEntry>)>,
    DeviceStartup,
);

fn open_device_log(options: &DeviceOptions) -> Result<OpenedLog, RuntimeError> {
    let Some(log_options) = &options.log else {
        let startup = DeviceStartup {
            medium: None,
            log_path: None,
            slot_count: 0,
            slot_size: 0,
            formatted: false,
            recovered_entry_count: 0,
            rejected_slot_count: 0,
        };
        return Ok((None, startup));
    };
    let (log, recovery, formatted) = open_log(log_options)?;
    if !formatted
        && (log.slot_count() != log_options.slot_count || log.slot_size() != log_options.slot_size)
    {
        tracing::warn!(
            "device log {} has {} slots of {} bytes, not the {} of {} asked for; \
             using the log as it is (pass --format to erase it and use the new \
             geometry)",
            log_options.path.display(),
            log.slot_count(),
            log.slot_size(),
            log_options.slot_count,
            log_options.slot_size
        );
    }
    let startup = DeviceStartup {
        medium: Some(log.medium()),
        log_path: Some(log_options.path.clone()),
        slot_count: log.slot_count(),
        slot_size: log.slot_size(),
        formatted,
        recovered_entry_count: recovery.entries.len(),
        rejected_slot_count: recovery.rejected_slot_count,
    };
    Ok((Some((log, recovery.entries)), startup))
}

impl DeviceRuntime {
    /// Bind the sockets, open (or format) the log and rebuild the device from it.
    pub fn open(options: DeviceOptions, shutdown: Shutdown) -> Result<DeviceRuntime, RuntimeError> {
        DeviceRuntime::open_with_front(options, shutdown, Box::new(Nothing))
    }

    /// [`DeviceRuntime::open`] with `front` in the pipeline in front of the log: it is offered
    /// every datagram first, and the log gets what it passes on.
    pub fn open_with_front(
        options: DeviceOptions,
        shutdown: Shutdown,
        front: Box<dyn FrontFunction>,
    ) -> Result<DeviceRuntime, RuntimeError> {
        check_servers(&options)?;
        let sockets = bind_sockets(&options)?;
        let clock = Clock::new();
        let now = clock.now();
        let (log, startup) = open_device_log(&options)?;
        let (device, log) = match log {
            Some((log, entries)) => {
                let mut config = DeviceConfig::new(
                    options.device_id,
                    options.servers.clone(),
                    log.slot_count(),
                    log.max_packet_len(),
                );
                if let Some(window) = options.max_resends_in_flight {
                    config.resends_in_flight_max = window;
                }
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
                DevicePipeline::with_front(Box::new(Nothing), switch),
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
        let mut runtime = DeviceRuntime {
            options,
            clock,
            pipeline: DevicePipeline::with_front(front, device),
            executor: LogExecutor {
                log,
                ..LogExecutor::default()
            },
            data: sockets.data,
            forward,
            echo: sockets.echo,
            startup,
            addresses,
            board,
            shutdown,
            counters: RuntimeCounters::default(),
        };
        // Recovered entries are resent to their servers right away, and rejected slots freed.
        runtime.drain();
        runtime.board.publish(&runtime.metrics());
        Ok(runtime)
    }

    pub fn startup(&self) -> &DeviceStartup {
        &self.startup
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
        let settings = LoopSettings::from(&self.options.loop_options);
        let board = self.addresses.metrics.map(|_| self.board.clone());
        let shutdown = self.shutdown.clone();
        run_loop(self, settings, board.as_ref(), &shutdown)
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
        turn.more |= count == BATCH_LEN;
        if count > 0 {
            // Look once more at the data socket (only) before sleeping: the server's ACK of
            // what was just forwarded often arrives within microseconds, and taking it now
            // saves a sleep and a wake-up on the vCPU the clients may share.
            turn.again = true;
            turn.busy = true;
            let now = self.clock.now();
            for index in 0..count {
                if let Some((from, datagram)) = self.data.received(index) {
                    self.pipeline.handle(now, from, datagram);
                }
            }
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
        turn
    }

    /// The sockets a turn may receive on, numbered as `poll_fds` lists them.
    fn readable(&self, ready: Ready<'_>) -> SocketSet {
        let mut index = 0;
        let mut next = || {
            let set = ready.is_readable(index);
            index += 1;
            set
        };
        let data = next();
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
            while let Some(transmit) = self.pipeline.poll_transmit() {
                emitted = true;
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
            .persist_with(now, &mut (NoPersistence, &mut self.executor));
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
        let mut fds = vec![(self.data.raw_fd(), self.data.is_write_blocked())];
        if let Some((_, socket)) = &self.forward {
            fds.push((socket.raw_fd(), socket.is_write_blocked()));
        }
        if let Some(socket) = &self.echo {
            fds.push((socket.raw_fd(), socket.is_write_blocked()));
        }
        fds
    }

    /// A line of the most telling counters.
    pub fn report_line(&self) -> String {
        let counters = self.pipeline.device().counters();
        let dropped = self.pipeline.dropped();
        let mut line = format!(
            "device {}: {}; log {}/{} live; updates {} logged {} acked {}; server-acks \
             forwarded {} absorbed {}; collisions {} log-full {} forwarded-without-log {}; \
             resends {} (timeout) {} (asked); dropped {}",
            self.options.device_id,
            socket_digest(self.data.counters()),
            self.pipeline.device().live_entry_count(),
            self.startup.slot_count,
            counters.updates_received,
            counters.updates_logged,
            counters.pmnet_acks_sent,
            counters.server_acks_forwarded,
            counters.server_acks_absorbed,
            counters.log_collisions,
            counters.log_full,
            counters.forwarded_without_log,
            counters.resend_timeouts,
            counters.resent_from_log,
            dropped.values().sum::<u64>(),
        );
        for (reason, count) in &dropped {
            line.push_str(&format!(" {reason}={count}"));
        }
        if let Some((_, socket)) = &self.forward {
            line.push_str(&format!(
                "; forward port {}",
                socket_digest(socket.counters())
            ));
        }
        if self.echo.is_some() {
            line.push_str(&format!("; echoed {}", self.counters.echoed));
        }
        if self.executor.log.is_some() {
            line.push_str(&format!(
                "; log batches {} fences {}",
                self.executor.batches, self.executor.fences
            ));
        }
        line.push_str(&format!("; medium {}", self.startup.medium_text()));
        line
    }

    /// Every counter of the device, its sockets and its log.
    pub fn metrics(&self) -> Metrics {
        let mut out = Metrics::new();
        let medium = self.startup.medium;
        out.gauge(
            "pmnet_device_info",
            "The device's identity and persistence medium (value always 1).",
            &[
                ("device_id", &self.options.device_id.to_string()),
                ("medium", medium.map_or("none", |m| m.medium.name())),
                ("flush", medium.map_or("none", |m| m.flush.name())),
                (
                    "guarantee",
                    medium.map_or("logging off", |m| m.medium.guarantee()),
                ),
                ("wait", self.options.loop_options.wait.name()),
            ],
            1.0,
        );
        out.gauge(
            "pmnet_device_log_slots",
            "Slots of the persistent log.",
            &[],
            f64::from(self.startup.slot_count),
        );
        out.gauge(
            "pmnet_device_log_live_entries",
            "Log entries the server has not acknowledged yet (log occupancy).",
            &[],
            self.pipeline.device().live_entry_count() as f64,
        );
        out.gauge(
            "pmnet_device_log_recovered_entries",
            "Entries found in the log at start-up (and resent to their servers).",
            &[],
            self.startup.recovered_entry_count as f64,
        );
        out.gauge(
            "pmnet_device_log_rejected_slots",
            "Torn or corrupt slots freed at start-up, never replayed.",
            &[],
            f64::from(self.startup.rejected_slot_count),
        );
        device_counter_metrics(&mut out, "pmnet", &self.pipeline);
        if let Some((forward, _)) = &self.forward {
            device_counter_metrics(&mut out, "forward", forward);
        }
        for (name, help, value) in [
            (
                "pmnet_device_log_writes_total",
                "Log writes carried out (each persisted before its ack).",
                self.executor.writes,
            ),
            (
                "pmnet_device_log_invalidations_total",
                "Log slots freed after the server's ACK.",
                self.executor.invalidations,
            ),
            (
                "pmnet_device_log_batches_total",
                "Batches of log work carried out (each durable before it is reported).",
                self.executor.batches,
            ),
            (
                "pmnet_device_log_fences_total",
                "Fences issued for log batches: two per batch with writes (three when it \
                 reuses a slot it frees), one per batch of invalidations only.",
                self.executor.fences,
            ),
            (
                "pmnet_echo_datagrams_total",
                "Datagrams answered by the echo port.",
                self.counters.echoed,
            ),
            (
                "pmnet_loop_iterations_total",
                "Turns of the event loop.",
                self.counters.event_loop.iterations,
            ),
            (
                "pmnet_loop_idle_waits_total",
                "Turns that found nothing to do and waited (or yielded).",
                self.counters.event_loop.idle_waits,
            ),
        ] {
            out.counter(name, help, &[], value);
        }
        socket_metrics(&mut out, "device", self.data.counters());
        if let Some((_, socket)) = &self.forward {
            socket_metrics(&mut out, "forward", socket.counters());
        }
        if let Some(socket) = &self.echo {
            socket_metrics(&mut out, "echo", socket.counters());
        }
        out
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

    fn report_line(&self) -> String {
        DeviceRuntime::report_line(self)
    }

    fn kind(&self) -> &'static str {
        "device"
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

/// The state machine's counters, labelled with the port they belong to.
fn device_counter_metrics(out: &mut Metrics, port: &str, pipeline: &DevicePipeline) {
    let counters = pipeline.device().counters();
    let dropped = pipeline.dropped();
    let labels = [("port", port)];
    for (name, help, value) in [
        (
            "pmnet_device_updates_received_total",
            "Update requests received.",
            counters.updates_received,
        ),
        (
            "pmnet_device_updates_logged_total",
            "Update requests written to the log.",
            counters.updates_logged,
        ),
        (
            "pmnet_device_log_collisions_total",
            "Updates forwarded without logging: every probed slot was taken.",
            counters.log_collisions,
        ),
        (
            "pmnet_device_log_full_total",
            "Updates forwarded without logging: the live-entry limit was reached.",
            counters.log_full,
        ),
        (
            "pmnet_device_forwarded_without_log_total",
            "Updates forwarded without logging: too large for a slot, or logging off.",
            counters.forwarded_without_log,
        ),
        (
            "pmnet_device_duplicate_updates_total",
            "Retransmitted updates already logged (re-acked, not forwarded again).",
            counters.duplicate_updates,
        ),
        (
            "pmnet_device_bypass_forwarded_total",
            "Bypass requests forwarded.",
            counters.bypass_forwarded,
        ),
        (
            "pmnet_device_pmnet_acks_sent_total",
            "PMNet-ACKs sent (each after its log write was durable).",
            counters.pmnet_acks_sent,
        ),
        (
            "pmnet_device_server_acks_forwarded_total",
            "Server-ACKs forwarded to clients.",
            counters.server_acks_forwarded,
        ),
        (
            "pmnet_device_server_acks_absorbed_total",
            "Server-ACKs of updates this device had PMNet-acked in full: not forwarded.",
            counters.server_acks_absorbed,
        ),
        (
            "pmnet_device_entries_invalidated_total",
            "Log entries dropped after the server's ACK.",
            counters.entries_invalidated,
        ),
        (
            "pmnet_device_retransmit_requests_received_total",
            "Retransmission requests from servers.",
            counters.retransmit_requests_received,
        ),
        (
            "pmnet_device_resent_from_log_total",
            "Entries resent from the log on a server's retransmission request.",
            counters.resent_from_log,
        ),
        (
            "pmnet_device_retransmit_requests_passed_to_client_total",
            "Retransmission requests passed on to clients (not in the log).",
            counters.retransmit_requests_passed_to_client,
        ),
        (
            "pmnet_device_resend_timeouts_total",
            "Entries resent to their server because it had not acknowledged them in time.",
            counters.resend_timeouts,
        ),
        (
            "pmnet_device_recovery_polls_total",
            "Recovery polls received from restarting servers.",
            counters.recovery_polls,
        ),
        (
            "pmnet_device_recovery_entries_resent_total",
            "Entries resent in answer to recovery polls.",
            counters.recovery_entries_resent,
        ),
        (
            "pmnet_device_entries_recovered_total",
            "Entries rebuilt from the log at start-up.",
            counters.entries_recovered,
        ),
        (
            "pmnet_device_replay_queued_total",
            "Entries queued to be resent at the server's pace (timeouts, recovery polls).",
            counters.replay_queued,
        ),
        (
            "pmnet_device_replay_sent_total",
            "Entries resent from the replay queue.",
            counters.replay_sent,
        ),
        (
            "pmnet_device_not_logged_notices_sent_total",
            "Notices to clients that an update was forwarded without logging (log full, \
             collision, too large).",
            counters.not_logged_notices_sent,
        ),
        (
            "pmnet_device_fill_queries_total",
            "Fill queries answered for servers about to skip a gap.",
            counters.fill_queries,
        ),
        (
            "pmnet_device_fill_queries_held_total",
            "Fill queries that found a request held whole (resent; the server skips nothing).",
            counters.fill_queries_held,
        ),
    ] {
        out.counter(name, help, &labels, value);
    }
    for (reason, value) in &dropped {
        out.counter(
            "pmnet_device_dropped_total",
            "Datagrams the device dropped, by port and reason.",
            &[("port", port), ("reason", reason)],
            *value,
        );
    }
    out.counter(
        "pmnet_device_dropped_all_total",
        "Datagrams the device dropped, all reasons.",
        &labels,
        dropped.values().sum(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_server_at_the_devices_own_address_is_recognised() {
        // The same address, written either way.
        assert!(reaches(addr("127.0.0.1:7400"), addr("127.0.0.1:7400")));
        assert!(reaches(
            addr("[::ffff:127.0.0.1]:7400"),
            addr("127.0.0.1:7400")
        ));
        assert!(reaches(addr("0.0.0.0:7400"), addr("127.0.0.1:7400")));
        // A device bound to every address is reached through any address of the host.
        assert!(reaches(addr("127.0.0.1:7400"), addr("0.0.0.0:7400")));
        assert!(reaches(addr("127.0.0.2:7400"), addr("0.0.0.0:7400")));
        assert!(reaches(addr("127.0.0.1:7400"), addr("[::]:7400")));
        // Another port, another loopback address than the one bound, an address of another
        // host (TEST-NET-3, never local), or IPv6 towards an IPv4-only socket: no loop.
        assert!(!reaches(addr("127.0.0.1:7500"), addr("127.0.0.1:7400")));
        assert!(!reaches(addr("127.0.0.2:7400"), addr("127.0.0.1:7400")));
        assert!(!reaches(addr("203.0.113.9:7400"), addr("0.0.0.0:7400")));
        assert!(!reaches(addr("[::1]:7400"), addr("0.0.0.0:7400")));
    }

    fn device_options(listen: SocketAddr, servers: Vec<(u16, SocketAddr)>) -> DeviceOptions {
        DeviceOptions {
            device_id: 1,
            listen,
            servers,
            log: None,
            forward_listen: None,
            echo_listen: None,
            max_resends_in_flight: None,
            loop_options: LoopOptions {
                report_interval: None,
                ..LoopOptions::default()
            },
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
