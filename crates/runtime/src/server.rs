//! The PMNet server over UDP, with its application.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use pmnet_pm::{MediumInfo, MmapOptions, MmapRegion};
use pmnet_proto::{RecoveredSession, Server, ServerConfig, ServerCounters, ServerEvent};
use pmnet_store::{Application, IdealHandler, KvConfig, KvStore, SessionRecord};

use crate::metrics::Metrics;
use crate::udp::BatchSocket;
use crate::wait::{pin_current_thread, wait_for_sockets, yield_cpu, Clock, WaitMode, MAX_SLEEP};
use crate::{
    socket_digest, socket_metrics, start_metrics, LoopOptions, MetricsBoard, RuntimeError,
    Shutdown, METRICS_PUBLISH_INTERVAL,
};

/// The embedded key-value store's file.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub path: PathBuf,
    /// Size of a new data file; an existing store keeps its own.
    pub size_bytes: u64,
    /// Sessions whose exactly-once record a new store keeps.
    pub max_sessions: u32,
    /// Erase the file and start an empty store even if it holds one.
    pub format: bool,
    pub mmap: MmapOptions,
}

/// Everything a server needs to start.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub server_id: u16,
    pub listen: SocketAddr,
    /// Devices polled for logged requests at start-up; nothing new is applied until each has
    /// answered.
    pub devices: Vec<SocketAddr>,
    /// The key-value store; `None` runs the ideal handler (replies OK, keeps nothing).
    pub store: Option<StoreOptions>,
    pub loop_options: LoopOptions,
}

/// The application behind the server.
#[derive(Debug)]
pub enum ServerApp {
    Kv(Box<KvStore<MmapRegion>>),
    Ideal(IdealHandler),
}

impl ServerApp {
    fn as_application(&mut self) -> &mut dyn Application {
        match self {
            ServerApp::Kv(store) => store.as_mut(),
            ServerApp::Ideal(handler) => handler,
        }
    }

    fn sessions(&self) -> Vec<SessionRecord> {
        match self {
            ServerApp::Kv(store) => store.sessions(),
            ServerApp::Ideal(handler) => handler.sessions(),
        }
    }

    pub fn medium(&self) -> Option<MediumInfo> {
        match self {
            ServerApp::Kv(store) => store.medium(),
            ServerApp::Ideal(handler) => handler.medium(),
        }
    }

    /// The value of `key` in the store (the ideal handler keeps nothing).
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        match self {
            ServerApp::Kv(store) => store.get(key),
            ServerApp::Ideal(_) => None,
        }
    }
}

/// What the server found when it started.
#[derive(Debug, Clone)]
pub struct ServerStartup {
    pub medium: Option<MediumInfo>,
    pub data_path: Option<PathBuf>,
    pub formatted: bool,
    pub recovered_session_count: usize,
    pub recovered_key_count: usize,
    /// What store recovery reported, in words, when it is worth a warning.
    pub store_warning: Option<String>,
}

impl ServerStartup {
    pub fn medium_text(&self) -> String {
        match &self.medium {
            Some(medium) => medium.to_string(),
            None => "none: ideal handler (replies OK, keeps nothing, no exactly-once across \
                     restarts)"
                .to_owned(),
        }
    }
}

/// Where the server's sockets are bound.
#[derive(Debug, Clone, Copy)]
pub struct ServerAddresses {
    pub data: SocketAddr,
    pub metrics: Option<SocketAddr>,
}

#[derive(Debug, Clone, Default)]
struct RuntimeCounters {
    recoveries_completed: u64,
    recovery_entries_resent: u64,
    loop_iterations: u64,
    idle_waits: u64,
}

/// A running PMNet server. See the crate docs.
#[derive(Debug)]
pub struct ServerRuntime {
    options: ServerOptions,
    clock: Clock,
    server: Server,
    app: ServerApp,
    socket: BatchSocket,
    startup: ServerStartup,
    addresses: ServerAddresses,
    board: MetricsBoard,
    shutdown: Shutdown,
    counters: RuntimeCounters,
}

/// Open the store at `options.path`: a new one when the file is missing, empty or `format` is
/// set; otherwise recover it.
fn open_store(options: &StoreOptions) -> Result<(KvStore<MmapRegion>, bool), RuntimeError> {
    let path = &options.path;
    let file_error = |source| RuntimeError::DataFile {
        path: path.clone(),
        source,
    };
    let store_error = |source| RuntimeError::Store {
        path: path.clone(),
        source,
    };
    let is_new = std::fs::metadata(path).map_or(true, |metadata| metadata.len() == 0);
    if is_new || options.format {
        if options.format && !is_new {
            tracing::warn!("--format: erasing the store {}", path.display());
        }
        let len = usize::try_from(options.size_bytes).map_err(|_| {
            RuntimeError::Config(format!(
                "data size {} bytes does not fit this machine's address space; ask for less",
                options.size_bytes
            ))
        })?;
        let region = MmapRegion::create(path, len, options.mmap).map_err(file_error)?;
        let config = KvConfig {
            max_sessions: options.max_sessions,
        };
        return Ok((KvStore::format(region, config).map_err(store_error)?, true));
    }
    let region = MmapRegion::open(path, options.mmap).map_err(file_error)?;
    Ok((KvStore::open(region).map_err(store_error)?, false))
}

impl ServerRuntime {
    /// Bind the socket, open the application, and start the server (which polls its devices).
    pub fn open(options: ServerOptions, shutdown: Shutdown) -> Result<ServerRuntime, RuntimeError> {
        let socket = BatchSocket::bind(options.listen, options.loop_options.max_queued).map_err(
            |source| RuntimeError::Bind {
                what: "server",
                addr: options.listen,
                source,
            },
        )?;
        let (app, formatted) = match &options.store {
            Some(store_options) => {
                let (store, formatted) = open_store(store_options)?;
                (ServerApp::Kv(Box::new(store)), formatted)
            }
            None => (ServerApp::Ideal(IdealHandler::new()), false),
        };
        let mut store_warning = None;
        let mut recovered_key_count = 0;
        if let ServerApp::Kv(store) = &app {
            recovered_key_count = store.len();
            if let Some(rejected) = store.recovery().rejected {
                store_warning = Some(if rejected.valid_record_follows {
                    format!(
                        "the store is CORRUPT at offset {}: replay stopped at a damaged record \
                         ({:?}) followed by valid ones; acknowledged requests after it are lost",
                        rejected.offset_bytes, rejected.reason
                    )
                } else {
                    format!(
                        "the store's last record was torn (offset {}, {:?}): a request that was \
                         never acknowledged; dropped",
                        rejected.offset_bytes, rejected.reason
                    )
                });
            }
        }
        let sessions: Vec<RecoveredSession> = app
            .sessions()
            .into_iter()
            .map(|record| RecoveredSession {
                session_id: record.session_id,
                last_seq: record.last_seq,
                last_reply: record.last_reply,
            })
            .collect();
        let startup = ServerStartup {
            medium: app.medium(),
            data_path: options.store.as_ref().map(|store| store.path.clone()),
            formatted,
            recovered_session_count: sessions.len(),
            recovered_key_count,
            store_warning,
        };
        let clock = Clock::new();
        let config = ServerConfig::new(options.server_id, options.devices.clone());
        let server = Server::new(config, clock.now(), sessions);
        let board = MetricsBoard::new();
        let metrics = start_metrics(&options.loop_options, &board, &shutdown)?;
        let addresses = ServerAddresses {
            data: socket.local_addr(),
            metrics,
        };
        let mut runtime = ServerRuntime {
            options,
            clock,
            server,
            app,
            socket,
            startup,
            addresses,
            board,
            shutdown,
            counters: RuntimeCounters::default(),
        };
        // The recovery polls to the devices go out now.
        runtime.drain();
        runtime.board.publish(&runtime.metrics());
        Ok(runtime)
    }

    pub fn startup(&self) -> &ServerStartup {
        &self.startup
    }

    pub fn addresses(&self) -> ServerAddresses {
        self.addresses
    }

    pub fn counters(&self) -> &ServerCounters {
        self.server.counters()
    }

    pub fn app(&self) -> &ServerApp {
        &self.app
    }

    /// Whether the start-up recovery poll still waits for a device.
    pub fn is_recovering(&self) -> bool {
        self.server.is_recovering()
    }

    /// Run until the shutdown flag is set; then finish the batch in hand and return.
    pub fn run(&mut self) -> Result<(), RuntimeError> {
        if let Some(cpu) = self.options.loop_options.cpu {
            pin_current_thread(cpu).map_err(RuntimeError::Pin)?;
        }
        let report_interval = self.options.loop_options.report_interval;
        let wait = self.options.loop_options.wait;
        let publish = self.addresses.metrics.is_some();
        let mut next_publish = Instant::now() + METRICS_PUBLISH_INTERVAL;
        let mut next_report = report_interval.map(|interval| Instant::now() + interval);
        loop {
            let stopping = self.shutdown.is_requested();
            self.counters.loop_iterations += 1;
            let busy = self.poll_once();
            if stopping {
                break;
            }
            let wall = Instant::now();
            if publish && wall >= next_publish {
                self.board.publish(&self.metrics());
                next_publish = wall + METRICS_PUBLISH_INTERVAL;
            }
            if let (Some(at), Some(interval)) = (next_report, report_interval) {
                if wall >= at {
                    tracing::info!("{}", self.report_line());
                    next_report = Some(wall + interval);
                }
            }
            if busy {
                continue;
            }
            self.counters.idle_waits += 1;
            match wait {
                WaitMode::BusyPoll => yield_cpu(),
                WaitMode::Blocking => {
                    let mut timeout = MAX_SLEEP;
                    if let Some(deadline) = self.server.poll_timeout() {
                        timeout = timeout.min(self.clock.until(deadline));
                    }
                    if publish {
                        timeout = timeout.min(next_publish.saturating_duration_since(wall));
                    }
                    if let Some(at) = next_report {
                        timeout = timeout.min(at.saturating_duration_since(wall));
                    }
                    let fds = [(self.socket.raw_fd(), self.socket.is_write_blocked())];
                    if wait_for_sockets(&fds, timeout).is_err() {
                        std::thread::sleep(timeout.min(Duration::from_millis(1)));
                    }
                }
            }
        }
        for _ in 0..100 {
            if self.socket.queued_len() == 0 {
                break;
            }
            let _ = wait_for_sockets(&[(self.socket.raw_fd(), true)], Duration::from_millis(10));
            self.socket.flush();
        }
        self.board.publish(&self.metrics());
        tracing::info!("server stopped: {}", self.report_line());
        Ok(())
    }

    /// One turn of the loop: receive a batch, handle it, fire due timers, apply, send.
    /// Returns whether anything happened.
    pub fn poll_once(&mut self) -> bool {
        let mut busy = false;
        let count = self.socket.receive_batch();
        if count > 0 {
            busy = true;
            let now = self.clock.now();
            for index in 0..count {
                if let Some((from, datagram)) = self.socket.received(index) {
                    self.server.handle(now, from, datagram);
                }
            }
        }
        let now = self.clock.now();
        if self
            .server
            .poll_timeout()
            .is_some_and(|deadline| deadline <= now)
        {
            busy = true;
            self.server.handle_timeout(now);
        }
        self.drain();
        busy
    }

    /// Apply what the server hands over, in order, and send what it emits. The server-ACK of a
    /// request is emitted by `on_applied`, called only after `apply` returned (the store made
    /// the effect, the session's sequence number and the reply durable before returning).
    fn drain(&mut self) {
        loop {
            let mut progressed = false;
            while let Some(event) = self.server.poll_event() {
                progressed = true;
                match event {
                    ServerEvent::Apply {
                        session_id,
                        seq,
                        request,
                        ..
                    } => {
                        let reply = self.app.as_application().apply(session_id, seq, &request);
                        self.server
                            .on_applied(self.clock.now(), session_id, seq, reply);
                    }
                    ServerEvent::RecoveryComplete { entries_resent } => {
                        self.counters.recoveries_completed += 1;
                        self.counters.recovery_entries_resent += entries_resent;
                        tracing::info!(
                            "recovery complete: every device answered; {entries_resent} logged \
                             entries were resent and are applied in order"
                        );
                    }
                }
            }
            while let Some(transmit) = self.server.poll_transmit() {
                progressed = true;
                self.socket.enqueue(transmit);
            }
            if !progressed {
                break;
            }
        }
        self.socket.flush();
    }

    pub fn report_line(&self) -> String {
        let counters = self.server.counters();
        let mut line = format!(
            "server {}: {}; applied {} acks {} make-up {} reordered {} retransmit-requests {}{}; \
             dropped {}",
            self.options.server_id,
            socket_digest(self.socket.counters()),
            counters.requests_applied,
            counters.server_acks_sent,
            counters.makeup_acks_sent,
            counters.requests_reordered,
            counters.retransmit_requests_sent,
            if self.server.is_recovering() {
                "; RECOVERING (waiting for devices)"
            } else {
                ""
            },
            counters.dropped.values().sum::<u64>(),
        );
        for (reason, count) in &counters.dropped {
            line.push_str(&format!(" {reason}={count}"));
        }
        if let ServerApp::Kv(store) = &self.app {
            let stats = store.stats();
            line.push_str(&format!(
                "; store keys {} records {} compactions {}",
                store.len(),
                stats.records_appended,
                stats.compactions
            ));
        }
        line.push_str(&format!("; medium {}", self.startup.medium_text()));
        line
    }

    /// Every counter of the server, its socket and its store.
    pub fn metrics(&self) -> Metrics {
        let mut out = Metrics::new();
        let medium = self.startup.medium;
        out.gauge(
            "pmnet_server_info",
            "The server's identity and persistence medium (value always 1).",
            &[
                ("server_id", &self.options.server_id.to_string()),
                (
                    "application",
                    match self.app {
                        ServerApp::Kv(_) => "kv",
                        ServerApp::Ideal(_) => "ideal",
                    },
                ),
                ("medium", medium.map_or("none", |m| m.medium.name())),
                ("flush", medium.map_or("none", |m| m.flush.name())),
                (
                    "guarantee",
                    medium.map_or("nothing kept", |m| m.medium.guarantee()),
                ),
                ("wait", self.options.loop_options.wait.name()),
            ],
            1.0,
        );
        out.gauge(
            "pmnet_server_recovering",
            "1 while the start-up recovery poll waits for a device.",
            &[],
            if self.server.is_recovering() {
                1.0
            } else {
                0.0
            },
        );
        let counters = self.server.counters();
        for (name, help, value) in [
            (
                "pmnet_server_request_fragments_received_total",
                "Request datagrams received.",
                counters.request_fragments_received,
            ),
            (
                "pmnet_server_requests_applied_total",
                "Requests applied (each exactly once).",
                counters.requests_applied,
            ),
            (
                "pmnet_server_acks_sent_total",
                "Server-ACK datagrams sent.",
                counters.server_acks_sent,
            ),
            (
                "pmnet_server_makeup_acks_sent_total",
                "Duplicates of applied requests answered with the stored reply.",
                counters.makeup_acks_sent,
            ),
            (
                "pmnet_server_makeup_acks_without_reply_total",
                "Make-up ACKs whose reply was no longer kept.",
                counters.makeup_acks_without_reply,
            ),
            (
                "pmnet_server_duplicates_in_progress_total",
                "Duplicates of requests being applied, ignored.",
                counters.duplicates_in_progress,
            ),
            (
                "pmnet_server_requests_reordered_total",
                "Requests that arrived ahead of a gap and waited.",
                counters.requests_reordered,
            ),
            (
                "pmnet_server_retransmit_requests_sent_total",
                "Retransmission requests sent for gaps.",
                counters.retransmit_requests_sent,
            ),
            (
                "pmnet_server_recovery_polls_sent_total",
                "Recovery polls sent to devices.",
                counters.recovery_polls_sent,
            ),
            (
                "pmnet_server_recovery_entries_resent_total",
                "Logged entries the devices said they resent at recovery.",
                self.counters.recovery_entries_resent,
            ),
            (
                "pmnet_server_sessions_evicted_total",
                "Sessions forgotten to make room.",
                counters.sessions_evicted,
            ),
            (
                "pmnet_server_noop_fills_received_total",
                "No-op fills for sequence numbers clients gave up on.",
                counters.noop_fills_received,
            ),
            (
                "pmnet_loop_iterations_total",
                "Turns of the event loop.",
                self.counters.loop_iterations,
            ),
            (
                "pmnet_loop_idle_waits_total",
                "Turns that found nothing to do and waited (or yielded).",
                self.counters.idle_waits,
            ),
        ] {
            out.counter(name, help, &[], value);
        }
        for (reason, value) in &counters.dropped {
            out.counter(
                "pmnet_server_dropped_total",
                "Datagrams the server dropped, by reason.",
                &[("reason", reason)],
                *value,
            );
        }
        if let ServerApp::Kv(store) = &self.app {
            let stats = store.stats();
            out.gauge(
                "pmnet_store_keys",
                "Live keys in the store.",
                &[],
                store.len() as f64,
            );
            out.gauge(
                "pmnet_store_sessions",
                "Sessions with an exactly-once record in the store.",
                &[],
                store.session_count() as f64,
            );
            out.gauge(
                "pmnet_store_used_bytes",
                "Bytes of live data in the store.",
                &[],
                store.used_bytes() as f64,
            );
            out.gauge(
                "pmnet_store_capacity_bytes",
                "Bytes of live data the store admits.",
                &[],
                store.capacity_bytes() as f64,
            );
            for (name, help, value) in [
                (
                    "pmnet_store_records_appended_total",
                    "Requests applied by appending one record.",
                    stats.records_appended,
                ),
                (
                    "pmnet_store_compactions_total",
                    "Compactions (each also applied one request).",
                    stats.compactions,
                ),
                (
                    "pmnet_store_evicted_sessions_total",
                    "Sessions evicted from the store to admit new ones.",
                    stats.evicted_sessions,
                ),
                (
                    "pmnet_store_full_replies_total",
                    "Requests answered \"store full\".",
                    stats.store_full_replies,
                ),
                (
                    "pmnet_store_recovered_records_total",
                    "Records replayed when the store was opened.",
                    stats.recovered_records,
                ),
                (
                    "pmnet_store_rejected_tail_records_total",
                    "Torn records found at the end of the log when opened.",
                    stats.rejected_tail_records,
                ),
            ] {
                out.counter(name, help, &[], value);
            }
        }
        socket_metrics(&mut out, "server", self.socket.counters());
        out
    }
}
