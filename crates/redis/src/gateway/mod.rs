//! The gateway: a RESP server for unmodified Redis clients, each connection a PMNet session.
//!
//! Commands are routed by [`crate::commands::route`]: answered locally, sent as PMNet updates
//! (answered with their fixed reply as soon as the device acks them: the update is then
//! durable in the device's log and will be applied by Redis in order), or sent as bypass
//! requests (answered with Redis's reply). Replies go back in request order, whatever order
//! the acks arrive in; pipelined clients keep up to `window` requests in flight.
//!
//! One thread runs every connection and one UDP socket shared by all sessions; datagrams are
//! handed to the session named in their header.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use pmnet_proto::{Client, ClientConfig, ClientLatency, Transmit};
use pmnet_runtime::metrics::{serve_metrics, Metrics, MetricsBoard};
use pmnet_runtime::udp::BatchSocket;
use pmnet_runtime::PeerWatch;
use pmnet_runtime::{
    poll, random_session_id, run_loop, Clock, LoopCounters, LoopSettings, Node, PollFd, Ready,
    RuntimeError, Shutdown, Turn, WaitMode,
};
use pmnet_wire::{Header, PacketType};

mod clients;
mod connection;
mod direct;
mod health;
mod info_text;
mod introspect;
mod metrics;
mod request;
mod scan;
mod slowlog;
mod then;

pub use connection::Auth;
use connection::ConnState;
pub use direct::{DirectOptions, DIRECT_ABOVE_WORDS, PMNET_REQUEST_MAX};
pub use slowlog::{DEFAULT_SLOWLOG_MAX_LEN, DEFAULT_SLOWLOG_SLOWER_THAN};

use crate::commands::Policy;
use crate::resp::{error_reply, parse_command_resumable, Limits, Progress};

/// Everything the gateway needs to start.
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    /// Where Redis clients connect (TCP).
    pub listen: SocketAddr,
    /// The PMNet device in front of the adaptor (or the adaptor itself: no early acks).
    pub device: SocketAddr,
    /// The other workers of a device run with `--workers`: each connection's session goes to
    /// one of `device` and these, by its id.
    pub more_devices: Vec<SocketAddr>,
    /// The adaptor's server id (the ID of `--server ID=ADDR` on the device).
    pub server_id: u16,
    /// Requests in flight per connection at most (the PMNet client window).
    pub window: u32,
    pub max_connections: usize,
    pub policy: Policy,
    pub wait: WaitMode,
    pub cpu: Option<usize>,
    pub report_interval: Option<Duration>,
    pub metrics_listen: Option<SocketAddr>,
    /// Authenticate every datagram with these deployment keys (`None`: no authentication).
    pub keys: Option<pmnet_proto::KeySet>,
    /// The password clients must give (`AUTH`), if any.
    pub auth: Auth,
    /// The device runs a read cache (`pmnet device --cache`): `GET key` goes as a cache read
    /// the device may answer, every write keyed or as a barrier (docs/cache.md).
    pub device_cache: bool,
    /// Devices in series whose PMNet-ACKs an update waits for (docs/replication.md).
    pub replicas: u8,
    /// Fan-out replication: devices besides the first every update goes to at once
    /// (`ClientConfig::fan_out`; docs/replication.md, "Fan-out").
    pub fan_out: Vec<SocketAddr>,
    /// The controllers of the chain of devices that starts at the device
    /// (`ClientConfig::controllers`; docs/replication.md, "Automatic failover"): each session
    /// asks them where the chain starts when its writes go unanswered, and follows.
    pub controllers: Vec<SocketAddr>,
    /// How long the path (device, adaptor, Redis) may leave the gateway's own `PING` unanswered
    /// before commands that need it are answered with an error naming the missing part, and
    /// new connections refused (`None`: never; see `health.rs`).
    pub down_after: Option<Duration>,
    /// Commands slower than this many µs (parsed to reply ready) enter the gateway's slow log
    /// (`SLOWLOG`); negative: none.
    pub slowlog_log_slower_than: i64,
    /// Entries the slow log keeps at most.
    pub slowlog_max_len: usize,
    /// The redis-server behind the adaptor, for commands that go direct (`--redis`; `None`:
    /// they are refused).
    pub direct: Option<DirectOptions>,
    /// Arguments of one command at most (`--max-request-args`).
    pub max_request_args: usize,
    /// Bytes of one command's arguments at most (`--max-request-bytes`).
    pub max_request_bytes: usize,
    /// Bytes read from clients and not yet parsed, across all connections, at most
    /// (`--max-input-bytes`); past it only the connection with the most is read on.
    pub max_input_bytes: usize,
}

impl GatewayOptions {
    /// The device worker session `session_id` goes to.
    pub fn device_for(&self, session_id: u64) -> SocketAddr {
        pmnet_runtime::steer_session(self.device, &self.more_devices, session_id)
    }

    pub fn new(listen: SocketAddr, device: SocketAddr) -> GatewayOptions {
        GatewayOptions {
            listen,
            device,
            more_devices: Vec::new(),
            server_id: 1,
            window: 64,
            max_connections: 1024,
            policy: Policy::default(),
            wait: WaitMode::Blocking,
            cpu: None,
            report_interval: Some(Duration::from_secs(10)),
            metrics_listen: None,
            keys: None,
            auth: Auth::default(),
            device_cache: false,
            replicas: 1,
            fan_out: Vec::new(),
            controllers: Vec::new(),
            down_after: Some(DEFAULT_DOWN_AFTER),
            slowlog_log_slower_than: DEFAULT_SLOWLOG_SLOWER_THAN,
            slowlog_max_len: DEFAULT_SLOWLOG_MAX_LEN,
            direct: None,
            max_request_args: crate::resp::GATEWAY_MAX_ARGS,
            max_request_bytes: crate::resp::REDIS_MAX_BULK_LEN,
            max_input_bytes: DEFAULT_MAX_INPUT_BYTES,
        }
    }
}

/// How long the path may leave the gateway's probe unanswered before it is taken for down.
pub const DEFAULT_DOWN_AFTER: Duration = Duration::from_secs(2);
/// The default of `--max-input-bytes`: 1 GiB.
pub const DEFAULT_MAX_INPUT_BYTES: usize = 1 << 30;

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("cannot bind {what} {addr}: {source}; choose another address or port")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Pin(String),
}

/// What the gateway counted; monotonically increasing.
#[derive(Debug, Clone, Default)]
pub struct GatewayCounters {
    pub connections_accepted: u64,
    /// Refused because `max_connections` were open.
    pub connections_refused: u64,
    /// Refused because the path behind the gateway was down (see `health.rs`).
    pub connections_refused_down: u64,
    /// Commands answered with an error, not sent, because the path was down.
    pub commands_refused_down: u64,
    pub connections_closed: u64,
    pub commands_local: u64,
    pub commands_update: u64,
    pub commands_bypass: u64,
    /// Unknown, unsupported, refused or ill-formed commands answered with an error.
    pub commands_rejected: u64,
    /// Connections closed for bad RESP input.
    pub protocol_errors: u64,
    /// Updates answered on the device's ack.
    pub updates_acked_by_device: u64,
    /// Updates answered by the server's reply first (not logged by the device).
    pub updates_answered_by_server: u64,
    /// Of those, updates fewer than `--replicas` devices had acked: a chain shorter than
    /// `--replicas`, or acks lost on the way (warned of, with the count).
    pub updates_short_of_replicas: u64,
    /// Requests that timed out (no ack or reply after every retransmission).
    pub requests_timed_out: u64,
    pub replies_unavailable: u64,
    /// Server replies that were not one RESP value (answered with an error).
    pub malformed_replies: u64,
    /// Datagrams for no open session (dropped).
    pub datagrams_unknown_session: u64,
    /// No-op fills sent for completed reads a restarted adaptor asked for (see
    /// [`fill_for_completed_read`]).
    pub noop_fills_for_reads: u64,
    /// `GET`s sent as cache reads (with a device cache).
    pub commands_cache_read: u64,
    /// Cache reads the device answered.
    pub cache_reads_from_device: u64,
    /// Commands sent on a direct connection to Redis.
    pub commands_direct: u64,
    /// Direct connections opened, closed, refused (too many open), failed under a command.
    pub direct_opened: u64,
    pub direct_closed: u64,
    pub direct_refused: u64,
    pub direct_failed: u64,
    /// Connections that went direct for good (pub/sub, MONITOR, CLIENT TRACKING).
    pub direct_sticky: u64,
    /// Barriers (bypass `PING`s) sent before a direct command or after a direct write.
    pub direct_barriers: u64,
    /// Turns in which a connection was not read because clients' unparsed input reached
    /// `--max-input-bytes`.
    pub input_paused: u64,
}

/// A reply owed to a client, in request order.
#[derive(Debug)]
enum Slot {
    Ready(Vec<u8>),
    Waiting {
        seq: u32,
        /// The fixed reply of an update (on the device's ack).
        ack: Option<&'static [u8]>,
        /// What the reply becomes.
        then: then::Then,
    },
    /// A cache read (`GET`), by its id; the command, for a RESP3 client.
    Reading {
        id: u32,
        args: Option<Vec<Vec<u8>>>,
    },
    /// A read (or a read-only transaction: `MULTI`, its commands, `EXEC`) whose reply was too
    /// large for PMNet, run again on the direct connection once every earlier reply is out
    /// (`direct.rs`); the client gets the last command's reply.
    Direct(Vec<Vec<Vec<u8>>>),
}

#[derive(Debug)]
struct Conn {
    state: ConnState,
    /// What `CLIENT LIST`, `INFO` and `SLOWLOG` tell of it.
    intro: introspect::ConnIntro,
    /// `WATCH`es waiting for their fingerprints: nothing more is started until they arrive
    /// (an `EXEC` behind them must carry them).
    watches_in_flight: usize,
    stream: TcpStream,
    fd: RawFd,
    client: Client,
    input: Vec<u8>,
    out: Vec<u8>,
    out_sent: usize,
    slots: VecDeque<Slot>,
    /// The highest sequence number started on this session.
    last_started: u32,
    /// The peer closed its side (or reading failed): parse what is buffered, read no more.
    read_closed: bool,
    /// QUIT or a protocol error: answer what came before, then close.
    closing: bool,
    /// Writing failed: replies are discarded; the session lingers until nothing is in flight.
    broken: bool,
    /// The last wait (or look) found it readable.
    readable: bool,
    /// Not read on: clients' unparsed input is over `--max-input-bytes`.
    paused: bool,
    /// How far the parser got into an incomplete command at the front of `input`.
    progress: Progress,
    /// The connection's direct connection to Redis and what waits for it.
    direct: direct::DirectState,
}

/// Bytes of replies not yet written before the gateway stops reading a client.
const MAX_OUTPUT: usize = 8 << 20;
/// Replies owed to one client at most (beyond the window: local replies and errors).
const MAX_SLOTS: usize = 4096;

impl Conn {
    fn unsent(&self) -> usize {
        self.out.len() - self.out_sent
    }

    /// What to wait for on this connection (read, write), if anything; `max_input`: bytes of
    /// unparsed input it may hold.
    fn interest(&self, max_input: usize) -> Option<(bool, bool)> {
        let read =
            !self.read_closed && !self.closing && !self.paused && self.input.len() < max_input;
        let write = self.unsent() > 0 && !self.broken;
        (read || write).then_some((read, write))
    }

    /// What to wait for on its direct connection, if it has one.
    fn direct_interest(&self) -> Option<(RawFd, bool, bool)> {
        self.direct.interest(self.unsent() < MAX_OUTPUT)
    }

    fn is_done(&self) -> bool {
        let direct_idle = self.broken || self.direct.is_idle();
        (self.read_closed || self.closing || self.broken)
            && self.client.in_flight_count() == 0
            && direct_idle
            && (self.broken || (self.slots.is_empty() && self.unsent() == 0))
    }
}

/// A running gateway. See the module docs.
#[derive(Debug)]
pub struct Gateway {
    options: GatewayOptions,
    clock: Clock,
    listener: TcpListener,
    socket: BatchSocket,
    conns: Vec<Option<Box<Conn>>>,
    free: Vec<usize>,
    sessions: HashMap<u64, usize>,
    counters: GatewayCounters,
    limits: Limits,
    board: MetricsBoard,
    metrics_addr: Option<SocketAddr>,
    shutdown: Shutdown,
    listener_readable: bool,
    /// The id of the next connection (`CLIENT ID`).
    next_client_id: u64,
    /// Where a turn not preceded by a wait looks at what is ready.
    probe: Vec<PollFd>,
    event_loop: LoopCounters,
    /// Where clients' bytes are read into before they join a connection's input (kept, not
    /// zeroed anew for every read).
    scratch: Vec<u8>,
    /// Whether the device (or its workers) answers.
    devices: PeerWatch,
    /// The request latencies of the sessions closed so far.
    latency_of_closed: ClientLatency,
    /// Whether the path behind answers (the gateway's own probe).
    health: Option<health::Health>,
    /// The probe's datagrams, between its turn and the socket.
    probe_out: Vec<Transmit>,
    /// `gateway`: every event of the gateway's loop carries it.
    span: tracing::Span,
    /// The clients' commands counted, and the slow log.
    intro: introspect::Introspect,
    /// Direct connections to Redis open.
    direct_open: usize,
    /// Bytes of unparsed input a connection may hold (a whole command of the limits).
    max_conn_input: usize,
    /// Without keys: warnings of connections from other hosts (at most one a minute).
    plain_warnings: Option<pmnet_proto::PlainTrafficWarnings>,
}

impl Gateway {
    pub fn open(options: GatewayOptions, shutdown: Shutdown) -> Result<Gateway, GatewayError> {
        if options.window == 0 {
            return Err(GatewayError::Config(
                "--window must be at least 1".to_owned(),
            ));
        }
        let listener = TcpListener::bind(options.listen).map_err(|source| GatewayError::Bind {
            what: "the gateway's TCP listener to",
            addr: options.listen,
            source,
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| GatewayError::Bind {
                what: "the gateway's TCP listener to",
                addr: options.listen,
                source,
            })?;
        let bind: SocketAddr = if options.device.is_ipv4() {
            SocketAddr::from(([0, 0, 0, 0], 0))
        } else {
            SocketAddr::from(([0u16; 8], 0))
        };
        let mut socket = BatchSocket::bind(bind, 1 << 16).map_err(|source| GatewayError::Bind {
            what: "the gateway's UDP socket to",
            addr: bind,
            source,
        })?;
        socket.report_unreachable();
        let mut device_addrs = vec![options.device];
        device_addrs.extend(&options.more_devices);
        let devices = PeerWatch::new("device", "`pmnet device`", &device_addrs);
        // The probe's session also fetches Redis's command table (with `--down-after 0` too).
        let health = {
            let session_id = random_session_id();
            let mut config = ClientConfig::new(
                session_id,
                options.server_id,
                options.device_for(session_id),
            );
            config.auth = options.keys.clone().map(pmnet_proto::Authenticator::new);
            Some(health::Health::new(config, options.down_after))
        };
        let board = MetricsBoard::new();
        let metrics_addr = match options.metrics_listen {
            Some(addr) => Some(
                serve_metrics(addr, board.clone(), shutdown.clone()).map_err(|source| {
                    GatewayError::Bind {
                        what: "the metrics endpoint to",
                        addr,
                        source,
                    }
                })?,
            ),
            None => None,
        };
        let intro = introspect::Introspect::new(&options);
        let limits = Limits::gateway(options.max_request_args, options.max_request_bytes);
        let max_conn_input = limits.max_wire_len();
        let plain_warnings = options
            .keys
            .is_none()
            .then(|| pmnet_proto::PlainTrafficWarnings::counting("connection"));
        let gateway = Gateway {
            plain_warnings,
            options,
            clock: Clock::new(),
            listener,
            socket,
            conns: Vec::new(),
            free: Vec::new(),
            sessions: HashMap::new(),
            counters: GatewayCounters::default(),
            limits,
            board,
            metrics_addr,
            shutdown,
            listener_readable: true,
            next_client_id: 1,
            probe: Vec::new(),
            event_loop: LoopCounters::default(),
            scratch: vec![0; READ_CHUNK],
            devices,
            latency_of_closed: ClientLatency::default(),
            health,
            probe_out: Vec::new(),
            span: tracing::info_span!("gateway"),
            intro,
            direct_open: 0,
            max_conn_input,
        };
        pmnet_runtime::publish_node(&gateway, &gateway.board);
        Ok(gateway)
    }

    /// The TCP address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.options.listen)
    }

    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    pub fn counters(&self) -> &GatewayCounters {
        &self.counters
    }

    fn open_count(&self) -> usize {
        self.conns.len() - self.free.len()
    }

    /// Run until the shutdown flag is set.
    pub fn run(&mut self) -> Result<(), GatewayError> {
        let _entered = self.span.clone().entered();
        let settings = LoopSettings {
            wait: self.options.wait,
            cpu: self.options.cpu,
            report_interval: self.options.report_interval,
            report_at_stop: true,
        };
        let board = self.metrics_addr.map(|_| self.board.clone());
        let shutdown = self.shutdown.clone();
        run_loop(self, settings, board.as_ref(), &shutdown).map_err(|error| match error {
            RuntimeError::Pin(why) => GatewayError::Pin(why),
            other => GatewayError::Config(other.to_string()),
        })
    }

    /// Take in what `ready` found readable, numbered as [`Node::wait_fds`] pushed them: the
    /// listener, the UDP socket, then each connection that waits for something, in order.
    /// Returns whether the UDP socket is readable.
    fn note_ready(&mut self, ready: Ready<'_>) -> bool {
        self.listener_readable = ready.is_readable(0);
        let mut entry = 2;
        for conn in self.conns.iter_mut().flatten() {
            if conn.interest(self.max_conn_input).is_some() {
                conn.readable = ready.is_readable(entry);
                entry += 1;
            }
            if conn.direct_interest().is_some() {
                conn.direct.set_readable(ready.is_readable(entry));
                entry += 1;
            }
        }
        ready.is_readable(1)
    }

    /// Look, without waiting, at what is ready: one `ppoll` rather than an accept and a read on
    /// every connection. Returns whether the UDP socket is readable.
    fn look(&mut self) -> bool {
        let mut fds = std::mem::take(&mut self.probe);
        fds.clear();
        self.wait_fds(&mut fds);
        if poll(&mut fds, Duration::ZERO).is_err() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let udp_readable = self.note_ready(Ready::Polled(&fds));
        self.probe = fds;
        udp_readable
    }

    /// One turn after a wait or a look. Returns whether anything happened.
    fn turn_on(&mut self, udp_readable: bool) -> bool {
        let mut busy = false;
        if self.listener_readable {
            busy |= self.accept();
        }
        if udp_readable || self.options.wait == WaitMode::BusyPoll {
            busy |= self.receive();
        }
        let now = self.clock.now();
        for index in 0..self.conns.len() {
            let Some(conn) = self.conns[index].as_mut() else {
                continue;
            };
            if conn.client.poll_timeout().is_some_and(|at| at <= now) {
                conn.client.handle_timeout(now);
                busy = true;
            }
            if conn.readable {
                conn.readable = false;
                busy |= read_client(conn, &mut self.scratch, self.max_conn_input);
            }
            busy |= self.service(index);
        }
        if let Some(health) = self.health.as_mut() {
            busy |= health.tick(&self.clock, &self.devices, &mut self.probe_out);
            let mut now = None;
            for transmit in self.probe_out.drain(..) {
                self.devices
                    .sent_datagram(transmit.destination, &transmit.bytes, &mut now);
                self.socket.enqueue(transmit);
            }
        }
        self.pause_input();
        if self.socket.queued_len() > 0 {
            self.socket.flush();
        }
        if self.socket.has_unreachable() {
            let reports = self.socket.take_unreachable();
            self.devices.unreachable(&reports);
        }
        self.devices.check(std::time::Instant::now());
        // Close what is finished.
        for index in 0..self.conns.len() {
            if self.conns[index].as_deref().is_some_and(Conn::is_done) {
                if let Some(mut conn) = self.conns[index].take() {
                    if conn.direct.is_open() {
                        self.direct_open = self.direct_open.saturating_sub(1);
                        self.counters.direct_closed += 1;
                    }
                    conn.direct = direct::DirectState::default();
                    tracing::trace!(
                        session = conn.client.session_id(),
                        "client connection closed"
                    );
                    self.sessions.remove(&conn.client.session_id());
                    self.latency_of_closed.merge(conn.client.latency());
                    self.free.push(index);
                    self.counters.connections_closed += 1;
                }
            }
        }
        busy
    }

    /// Past `--max-input-bytes` of unparsed input across the clients, read on only the
    /// connection that has the most (the one whose command is nearest complete): the others
    /// wait until memory frees, rather than being refused.
    fn pause_input(&mut self) {
        let mut total = 0usize;
        let mut largest: Option<(usize, usize)> = None;
        for (index, conn) in self.conns.iter().enumerate() {
            let Some(conn) = conn else { continue };
            let len = conn.input.len();
            total = total.saturating_add(len);
            if largest.is_none_or(|(_, most)| len > most) {
                largest = Some((index, len));
            }
        }
        let over = total >= self.options.max_input_bytes;
        let largest = largest.map(|(index, _)| index);
        for (index, conn) in self.conns.iter_mut().enumerate() {
            let Some(conn) = conn else { continue };
            let paused = over && Some(index) != largest;
            if paused && !conn.paused {
                self.counters.input_paused += 1;
            }
            conn.paused = paused;
        }
    }

    fn accept(&mut self) -> bool {
        let mut any = false;
        loop {
            let (stream, peer) = match self.listener.accept() {
                Ok(accepted) => accepted,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    // Out of descriptors and the like: try again next turn.
                    tracing::warn!("accept failed: {error}");
                    break;
                }
            };
            any = true;
            if let Some(warnings) = self.plain_warnings.as_mut() {
                warnings.received(self.clock.now(), "gateway", peer);
            }
            if self.open_count() >= self.options.max_connections {
                self.counters.connections_refused += 1;
                let mut stream = stream;
                let _ = stream.set_nonblocking(true);
                let _ = stream.write(b"-ERR max number of clients reached\r\n");
                continue;
            }
            if let Some((_, why)) = self.health.as_ref().and_then(health::Health::down) {
                // As Redis refuses a client it cannot serve: one error, then the close.
                self.counters.connections_refused_down += 1;
                let mut stream = stream;
                let _ = stream.set_nonblocking(true);
                let _ = stream.write(&error_reply(&format!("ERR pmnet: {why}")));
                continue;
            }
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            let _ = stream.set_nodelay(true);
            let mut session_id = random_session_id();
            while self.sessions.contains_key(&session_id) {
                session_id = random_session_id();
            }
            let mut config = ClientConfig::new(
                session_id,
                self.options.server_id,
                self.options.device_for(session_id),
            );
            config.window = self.options.window;
            config.replicas = self.options.replicas.clamp(1, pmnet_proto::REPLICAS_MAX);
            config.fan_out = self.options.fan_out.clone();
            config.controllers = self.options.controllers.clone();
            config.auth = self
                .options
                .keys
                .clone()
                .map(pmnet_proto::Authenticator::new);
            let state = ConnState::new(
                self.next_client_id,
                stream.peer_addr().ok(),
                stream.local_addr().ok(),
                &self.options.auth,
            );
            self.next_client_id += 1;
            // Boxed: a connection is moved out of the table while it is served, every turn.
            let conn = Box::new(Conn {
                state,
                intro: introspect::ConnIntro::new(),
                watches_in_flight: 0,
                fd: stream.as_raw_fd(),
                stream,
                client: Client::new(config),
                input: Vec::new(),
                out: Vec::new(),
                out_sent: 0,
                slots: VecDeque::new(),
                last_started: 0,
                read_closed: false,
                closing: false,
                broken: false,
                readable: true,
                paused: false,
                progress: Progress::default(),
                direct: direct::DirectState::new(self.options.direct.is_some()),
            });
            let index = match self.free.pop() {
                Some(index) => {
                    self.conns[index] = Some(conn);
                    index
                }
                None => {
                    self.conns.push(Some(conn));
                    self.conns.len() - 1
                }
            };
            self.sessions.insert(session_id, index);
            self.counters.connections_accepted += 1;
            tracing::trace!(
                session = session_id,
                client = ?self.conns[index].as_ref().and_then(|conn| conn.state.peer),
                "client connection accepted"
            );
        }
        any
    }

    fn receive(&mut self) -> bool {
        let mut any = false;
        let mut fills = Vec::new();
        loop {
            let count = self.socket.receive_batch();
            if count == 0 {
                break;
            }
            any = true;
            let now = self.clock.now();
            for index in 0..count {
                let Some((from, datagram)) = self.socket.received(index) else {
                    continue;
                };
                self.devices.heard(from);
                let session = datagram
                    .get(pmnet_wire::field::SESSION_ID)
                    .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
                    .map(u64::from_be_bytes);
                if let Some(health) = self.health.as_mut() {
                    if session == Some(health.session_id()) {
                        health.handle(&self.clock, from, datagram);
                        continue;
                    }
                }
                let target = session.and_then(|id| self.sessions.get(&id)).copied();
                match target.and_then(|index| self.conns[index].as_mut()) {
                    Some(conn) => {
                        if let Some(fill) = fill_for_completed_read(conn, datagram) {
                            fills.push((conn.client.config().peer, fill));
                        }
                        conn.client.handle(now, from, datagram);
                    }
                    None => self.counters.datagrams_unknown_session += 1,
                }
            }
            if count < pmnet_runtime::udp::BATCH_LEN {
                break;
            }
        }
        for (destination, bytes) in fills {
            self.counters.noop_fills_for_reads += 1;
            self.socket.enqueue(Transmit { destination, bytes });
        }
        any
    }

    /// Parse and start commands, collect completions, queue replies in order, write.
    fn service(&mut self, index: usize) -> bool {
        // Out of the table while it is served: `CLIENT LIST`, `KILL` and `INFO` see the others.
        let Some(mut conn) = self.conns[index].take() else {
            return false;
        };
        let busy = self.service_conn(&mut conn);
        self.conns[index] = Some(conn);
        busy
    }

    fn service_conn(&mut self, conn: &mut Conn) -> bool {
        let mut busy = false;
        // Commands queued inside MULTI are checked against Redis's command table: wait for it.
        let table_pending = self
            .health
            .as_ref()
            .is_some_and(health::Health::table_pending);
        let table = self
            .health
            .as_ref()
            .and_then(health::Health::table)
            .cloned();
        loop {
            let mut progressed = false;
            // Start what the window allows.
            let mut consumed = 0;
            // (A transaction waits for Redis's command table: its commands are checked
            // against it.)
            while !conn.closing
                && conn.watches_in_flight == 0
                && !conn.direct.holds()
                && (!table_pending || !conn.state.in_transaction())
                && conn.client.can_send()
                && conn.slots.len() < MAX_SLOTS
                && conn.unsent() < MAX_OUTPUT
            {
                match parse_command_resumable(
                    &conn.input[consumed..],
                    &self.limits,
                    &mut conn.progress,
                ) {
                    Ok(None) => break,
                    Err(error) => {
                        self.counters.protocol_errors += 1;
                        conn.slots
                            .push_back(Slot::Ready(error_reply(&format!("ERR {error}"))));
                        conn.closing = true;
                        consumed = conn.input.len();
                        progressed = true;
                        break;
                    }
                    Ok(Some((args, used))) => {
                        consumed += used;
                        progressed = true;
                        if !args.is_empty() {
                            let down = self.health.as_ref().and_then(health::Health::down);
                            introspect::start(
                                conn,
                                &args,
                                &mut self.intro,
                                &mut self.conns,
                                |conn, args| {
                                    request::start_command(
                                        conn,
                                        args,
                                        &self.options,
                                        &self.clock,
                                        &mut self.counters,
                                        down,
                                        table.as_deref(),
                                    )
                                },
                            );
                        }
                    }
                }
            }
            if consumed > 0 {
                conn.input.drain(..consumed);
            }
            let mut now = None;
            while let Some(transmit) = conn.client.poll_transmit() {
                self.devices
                    .sent_datagram(transmit.destination, &transmit.bytes, &mut now);
                self.socket.enqueue(transmit);
            }
            while let Some(event) = conn.client.poll_event() {
                progressed = true;
                request::complete(
                    conn,
                    event,
                    &self.limits,
                    &mut self.counters,
                    self.health.as_mut(),
                );
            }
            while let Some(event) = conn.client.poll_read_event() {
                progressed = true;
                request::complete_read(conn, event, &self.limits, &mut self.counters);
            }
            progressed |= direct::drive(
                conn,
                &mut direct::Ctx {
                    options: &self.options,
                    clock: &self.clock,
                    counters: &mut self.counters,
                    open: &mut self.direct_open,
                },
            );
            while let Some(Slot::Ready(_)) = conn.slots.front() {
                if let Some(Slot::Ready(bytes)) = conn.slots.pop_front() {
                    let bytes = introspect::reply_out(
                        conn,
                        bytes,
                        &mut self.intro,
                        &self.conns,
                        &self.options,
                        &self.counters,
                    );
                    if !conn.broken {
                        conn.out.extend_from_slice(&bytes);
                    }
                }
                progressed = true;
            }
            if !progressed {
                break;
            }
            busy = true;
        }
        busy |= write_client(conn);
        busy
    }
}

impl Node for Gateway {
    fn turn(&mut self, ready: Ready<'_>) -> Turn {
        let udp_readable = match ready {
            Ready::Polled(_) => self.note_ready(ready),
            // Not after a wait (the turn before was busy, or the loop busy-polls): look first.
            Ready::All | Ready::First => self.look(),
        };
        let busy = self.turn_on(udp_readable);
        // A turn that did anything is followed by another before any wait: a command started
        // or completed may let the next one start without a descriptor becoming ready.
        Turn {
            busy,
            more: busy,
            again: false,
        }
    }

    fn wait_fds(&self, fds: &mut Vec<PollFd>) {
        fds.push(PollFd::new(self.listener.as_raw_fd(), true, false));
        fds.push(PollFd::new(
            self.socket.raw_fd(),
            true,
            self.socket.is_write_blocked(),
        ));
        for conn in self.conns.iter().flatten() {
            if let Some((read, write)) = conn.interest(self.max_conn_input) {
                fds.push(PollFd::new(conn.fd, read, write));
            }
            if let Some((fd, read, write)) = conn.direct_interest() {
                fds.push(PollFd::new(fd, read, write));
            }
        }
    }

    fn next_timer(&self) -> Option<Duration> {
        let probe = self
            .health
            .as_ref()
            .map(|health| health.next_timer(&self.clock));
        self.conns
            .iter()
            .flatten()
            .filter_map(|conn| conn.client.poll_timeout())
            .map(|at| self.clock.until(at))
            .chain(probe)
            .min()
    }

    fn queued_len(&self) -> usize {
        self.socket.queued_len()
    }

    fn flush(&mut self) {
        self.socket.flush();
    }

    fn metrics(&self) -> Metrics {
        Gateway::metrics(self)
    }

    fn report_line(&self) -> String {
        Gateway::report_line(self)
    }

    fn kind(&self) -> &'static str {
        "gateway"
    }

    fn loop_counters(&mut self) -> &mut LoopCounters {
        &mut self.event_loop
    }
}

/// Bytes read from a client at once.
const READ_CHUNK: usize = 64 << 10;

fn read_client(conn: &mut Conn, chunk: &mut [u8], max_input: usize) -> bool {
    if conn.read_closed || conn.closing || conn.paused {
        return false;
    }
    let mut any = false;
    while conn.input.len() < max_input {
        match conn.stream.read(chunk) {
            Ok(0) => {
                conn.read_closed = true;
                any = true;
                break;
            }
            Ok(count) => {
                conn.input.extend_from_slice(&chunk[..count]);
                any = true;
                if count < chunk.len() {
                    break;
                }
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                conn.read_closed = true;
                conn.broken = true;
                any = true;
                break;
            }
        }
    }
    any
}

fn write_client(conn: &mut Conn) -> bool {
    if conn.broken {
        conn.out.clear();
        conn.out_sent = 0;
        return false;
    }
    let mut any = false;
    while conn.out_sent < conn.out.len() {
        match conn.stream.write(&conn.out[conn.out_sent..]) {
            Ok(0) => {
                conn.broken = true;
                break;
            }
            Ok(count) => {
                conn.out_sent += count;
                any = true;
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                conn.broken = true;
                break;
            }
        }
    }
    if conn.out_sent == conn.out.len() || conn.broken {
        conn.out.clear();
        conn.out_sent = 0;
    }
    any
}

/// The adaptor records writes but not reads (a read changes nothing, and recording it would
/// cost Redis an fsync). After the adaptor restarts, a session whose last applied requests
/// were reads therefore resumes from the last recorded write, and the adaptor asks for the
/// missing numbers with retransmission requests. Those reads completed here and are in no
/// device log (a device answers for what it logged), and the protocol's client ignores
/// requests for completed numbers; so the gateway answers with a no-op fill, which the
/// adaptor records in the read's place. A retransmission request for a number this session
/// started and no longer waits for can only be such a read: a completed update is either in
/// the device's log (the device answers) or recorded by the adaptor (no gap).
fn fill_for_completed_read(conn: &Conn, datagram: &[u8]) -> Option<Vec<u8>> {
    if datagram.get(3) != Some(&PacketType::RetransmitRequest.code()) {
        return None;
    }
    let (header, _) = Header::parse(datagram).ok()?;
    if header.packet_type != PacketType::RetransmitRequest
        || header.seq == 0
        || header.seq > conn.last_started
        || conn
            .slots
            .iter()
            .any(|slot| matches!(slot, Slot::Waiting { seq, .. } if *seq == header.seq))
    {
        return None;
    }
    Some(pmnet_wire::encode_noop_fill(
        header.server_id,
        header.session_id,
        header.seq,
    ))
}
