//! The adaptor: the PMNet server side in front of a real `redis-server`.
//!
//! It runs [`pmnet_proto::Server`] on a UDP socket like `pmnet server` does, but applies each
//! request to Redis instead of the embedded store. The request payload is one RESP-encoded
//! command; the reply payload is Redis's RESP reply.
//!
//! - **Exactly once.** Every request that may write runs inside one Lua script call
//!   ([`crate::script`]) that checks the session's record, runs the command, and records the
//!   sequence number and the reply, atomically and durably (Redis writes the script's effects
//!   to its append-only file as one `MULTI … EXEC`). A request redone after a crash of Redis,
//!   the adaptor or the device finds its sequence number recorded and gets the stored reply.
//!   Reads run as they are (nothing to record).
//! - **The server-ACK waits for Redis.** `on_applied` (which sends the server-ACK) is called
//!   only when Redis's reply arrived; with `appendfsync always` Redis replies only after it
//!   wrote and fsynced the append-only file.
//! - **Order.** A session's requests always travel on the same pipelined connection, so Redis
//!   runs them, and answers them, in sequence order; sessions are spread over several
//!   connections. Everything pipelined in one Redis event-loop turn shares one fsync (group
//!   commit).
//! - **Lost connections.** Requests sent but unanswered stay queued; the connection is opened
//!   again (with back-off) and they are sent again, in order: the scripts recognise those that
//!   were applied. Transient errors (`LOADING`, `BUSY`, `OOM`, `MISCONF`, …) are handled the
//!   same way, so an acknowledged update is never dropped.
//! - **Start-up.** The session records are loaded from Redis and handed to the `Server`,
//!   which then polls its devices for logged requests before applying anything new.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use pmnet_proto::{RecoveredSession, RequestKind, Server, ServerConfig, ServerEvent};
use pmnet_runtime::metrics::{serve_metrics, Metrics, MetricsBoard};
use pmnet_runtime::udp::BatchSocket;
use pmnet_runtime::{pin_current_thread, Clock, Shutdown, WaitMode};

use crate::commands::{adaptor_class, lookup, AdaptorClass, Class};
use crate::poll::{wait, yield_cpu, PollFd};
use crate::resp::{
    self, encode_bulk, error_reply, parse_command, parse_value, Limits, SyncClient, Value,
};
use crate::script::{self, REPLY_RING};

/// Everything the adaptor needs to start.
#[derive(Debug, Clone)]
pub struct AdaptorOptions {
    pub server_id: u16,
    /// Where devices reach the adaptor (UDP).
    pub listen: SocketAddr,
    /// Devices polled for logged requests at start-up.
    pub devices: Vec<SocketAddr>,
    /// The Redis server.
    pub redis: SocketAddr,
    /// Pipelined connections to Redis (sessions are spread over them).
    pub connections: usize,
    /// Key prefix of the session records.
    pub record_prefix: String,
    /// Requests taken from the protocol and not yet answered by Redis, at most.
    pub max_outstanding: usize,
    /// How long to wait for Redis at start-up.
    pub startup_timeout: Duration,
    /// Record reads too (their sequence number and reply, through the script). Off, a read
    /// writes nothing to Redis; after an adaptor restart a session that ended with reads then
    /// needs its client to answer retransmission requests for them with no-op fills (the
    /// gateway does).
    pub record_reads: bool,
    /// A session record expires this long after its session's last write (`None`: never).
    /// A request redone after its record expired would be applied again, so this must
    /// exceed any outage of the adaptor or Redis during which a device keeps the request.
    pub session_ttl: Option<Duration>,
    pub wait: WaitMode,
    pub cpu: Option<usize>,
    pub report_interval: Option<Duration>,
    pub metrics_listen: Option<SocketAddr>,
}

impl AdaptorOptions {
    pub fn new(listen: SocketAddr, redis: SocketAddr) -> AdaptorOptions {
        AdaptorOptions {
            server_id: 1,
            listen,
            devices: Vec::new(),
            redis,
            connections: 4,
            record_prefix: script::DEFAULT_RECORD_PREFIX.to_owned(),
            max_outstanding: 16_384,
            startup_timeout: Duration::from_secs(30),
            record_reads: false,
            session_ttl: Some(Duration::from_secs(script::DEFAULT_SESSION_TTL_SECS)),
            wait: WaitMode::Blocking,
            cpu: None,
            report_interval: Some(Duration::from_secs(10)),
            metrics_listen: None,
        }
    }
}

/// Why the adaptor could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdaptorError {
    #[error(
        "cannot bind the adaptor's UDP socket to {addr}: {source}; choose another address or port"
    )]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error(
        "Redis at {addr} did not become ready within {waited:?}: {reason}; start redis-server \
         (with --appendonly yes --appendfsync always) or point --redis at it"
    )]
    RedisUnavailable {
        addr: SocketAddr,
        waited: Duration,
        reason: String,
    },
    #[error("Redis at {addr}: {reason}")]
    Redis { addr: SocketAddr, reason: String },
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Pin(String),
}

/// What the adaptor found when it started.
#[derive(Debug, Clone)]
pub struct AdaptorStartup {
    pub redis_version: String,
    pub appendonly: String,
    pub appendfsync: String,
    pub redis_dir: String,
    pub sessions_recovered: usize,
    /// Keys under the record prefix that are not session records (ignored).
    pub records_skipped: usize,
}

/// How durable Redis's replies are, from its configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// AOF, fsync before every reply: the promise PMNet's acks rely on.
    FsyncAlways,
    /// AOF, fsync once a second: a power loss or OS crash loses up to ~1 s of replied writes.
    FsyncEverySec,
    /// AOF, the kernel decides when to write back (tens of seconds at a power loss).
    FsyncNo,
    /// No AOF: a Redis crash loses replied writes and the exactly-once records.
    None,
}

impl AdaptorStartup {
    pub fn durability(&self) -> Durability {
        if !self.appendonly.eq_ignore_ascii_case("yes") {
            return Durability::None;
        }
        match self.appendfsync.to_ascii_lowercase().as_str() {
            "always" => Durability::FsyncAlways,
            "everysec" => Durability::FsyncEverySec,
            _ => Durability::FsyncNo,
        }
    }

    /// The persistence medium and its promise, in words.
    pub fn durability_text(&self) -> String {
        match self.durability() {
            Durability::FsyncAlways => format!(
                "disk: Redis append-only file in {} with appendfsync always (each reply, and \
                 so each server-ACK, after write + fsync; survives process crash and power loss)",
                self.redis_dir
            ),
            Durability::FsyncEverySec => format!(
                "WEAKER THAN PMNET PROMISES: Redis append-only file in {} with appendfsync \
                 everysec (replies before fsync; a power loss or OS crash loses up to ~1 s of \
                 replied writes; a process crash loses none)",
                self.redis_dir
            ),
            Durability::FsyncNo => format!(
                "WEAKER THAN PMNET PROMISES: Redis append-only file in {} with appendfsync no \
                 (the kernel writes back when it likes; a power loss or OS crash loses replied \
                 writes; a process crash loses none)",
                self.redis_dir
            ),
            Durability::None => "NOT DURABLE: Redis runs without an append-only file; a Redis \
                                 crash loses replied writes and the exactly-once records"
                .to_owned(),
        }
    }
}

/// What the adaptor counted; monotonically increasing.
#[derive(Debug, Clone, Default)]
pub struct AdaptorCounters {
    /// Writes applied now (the script ran the command and recorded it).
    pub writes_applied: u64,
    /// Reads answered.
    pub reads: u64,
    /// Requests Redis had applied before (redone after a crash): answered with the stored reply.
    pub redone_recognised: u64,
    /// Redone requests whose reply was no longer kept (or checked reads that came too late).
    pub replies_gone: u64,
    /// Commands Redis answered with an error (WRONGTYPE and the like); recorded as the reply.
    pub command_errors: u64,
    /// No-op fills recorded.
    pub noop_fills: u64,
    /// Payloads that are not one RESP command; recorded with an error reply.
    pub bad_payloads: u64,
    /// Commands refused by the adaptor (FLUSHALL, MULTI, …); recorded with an error reply.
    pub refused: u64,
    /// Script calls Redis failed for good (answered with Redis's error, not recorded).
    pub script_failures: u64,
    /// Transient errors (LOADING, BUSY, OOM, …): the connection was reopened and requests resent.
    pub transient_errors: u64,
    /// Connections to Redis lost or refused.
    pub connection_failures: u64,
    /// Connections to Redis (re)established after the first.
    pub reconnects: u64,
    /// Requests sent to Redis again after a lost connection.
    pub resent: u64,
    /// Requests held back because 64 of their session were already at Redis.
    pub held_back: u64,
    /// Recovery polls answered by every device.
    pub recoveries_completed: u64,
    pub recovery_entries_resent: u64,
}

/// What the adaptor does with a request.
#[derive(Debug, Clone)]
enum Op {
    /// Run through the apply script.
    Write(Vec<Vec<u8>>),
    /// Record this reply through the apply script, run nothing.
    Literal(Vec<u8>),
    /// Run as is (resent through the checked read when a later write may have been applied).
    Read(Vec<Vec<u8>>),
    /// Run as is, always.
    StatelessRead(Vec<Vec<u8>>),
}

/// How a request was last sent: how to read its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SentAs {
    Script,
    Direct,
}

#[derive(Debug)]
struct Pending {
    session_id: u64,
    seq: u32,
    op: Op,
    sent_as: SentAs,
}

#[derive(Debug, Clone, Copy)]
enum Expect {
    ScriptLoad,
    Request,
}

/// One pipelined connection to Redis.
#[derive(Debug)]
struct Conn {
    stream: Option<TcpStream>,
    out: Vec<u8>,
    out_sent: usize,
    input: Vec<u8>,
    expect: VecDeque<Expect>,
    /// Requests at Redis or about to be, oldest first; kept across reconnections.
    pending: VecDeque<Pending>,
    retry_at: Option<Instant>,
    backoff: Duration,
    failures_in_a_row: u32,
}

const MIN_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
/// Unsent bytes to Redis at most before the adaptor stops taking new requests.
const MAX_UNSENT_BYTES: usize = 16 << 20;
/// Bytes read from one connection per turn at most (fairness).
const READ_PER_TURN: usize = 1 << 20;
/// How often the metrics are rendered for the endpoint.
const PUBLISH_INTERVAL: Duration = Duration::from_millis(100);
/// Longest sleep without looking at the shutdown flag.
const MAX_SLEEP: Duration = Duration::from_millis(50);
/// How long a stopping adaptor waits for Redis's outstanding replies.
const STOP_GRACE: Duration = Duration::from_secs(2);

impl Conn {
    fn new() -> Conn {
        Conn {
            stream: None,
            out: Vec::new(),
            out_sent: 0,
            input: Vec::new(),
            expect: VecDeque::new(),
            pending: VecDeque::new(),
            retry_at: Some(Instant::now()),
            backoff: MIN_BACKOFF,
            failures_in_a_row: 0,
        }
    }

    fn unsent(&self) -> usize {
        self.out.len() - self.out_sent
    }
}

/// Per-session flow control: at most [`REPLY_RING`] requests of a session at Redis.
#[derive(Debug, Default)]
struct Flow {
    at_redis: u32,
    held: VecDeque<(u32, Op)>,
}

/// Errors of a script call (or a direct read) that say "not now": retry later.
fn is_transient(message: &[u8]) -> bool {
    const PREFIXES: [&[u8]; 10] = [
        b"LOADING",
        b"BUSY",
        b"NOSCRIPT",
        b"OOM",
        b"MISCONF",
        b"READONLY",
        b"MASTERDOWN",
        b"TRYAGAIN",
        b"NOREPLICAS",
        b"CLUSTERDOWN",
    ];
    PREFIXES.iter().any(|prefix| message.starts_with(prefix))
}

/// A running adaptor. See the module docs.
#[derive(Debug)]
pub struct Adaptor {
    options: AdaptorOptions,
    clock: Clock,
    server: Server,
    socket: BatchSocket,
    conns: Vec<Conn>,
    flows: HashMap<u64, Flow>,
    /// Requests taken from the server and not yet answered (at Redis or held).
    outstanding: usize,
    apply_sha: String,
    read_sha: String,
    /// The update script's TTL argument: `options.session_ttl` in seconds, `0` for none.
    ttl_arg: String,
    startup: AdaptorStartup,
    counters: AdaptorCounters,
    limits: Limits,
    board: MetricsBoard,
    metrics_addr: Option<SocketAddr>,
    shutdown: Shutdown,
    loop_iterations: u64,
    idle_waits: u64,
}

fn redis_error(addr: SocketAddr, what: &str, error: impl std::fmt::Display) -> AdaptorError {
    AdaptorError::Redis {
        addr,
        reason: format!("{what}: {error}"),
    }
}

/// Connect to Redis and wait until it answers PING (not LOADING), or `timeout` passes.
fn connect_when_ready(
    addr: SocketAddr,
    timeout: Duration,
    shutdown: &Shutdown,
) -> Result<SyncClient, AdaptorError> {
    let started = Instant::now();
    loop {
        let reason = match SyncClient::connect(addr, Duration::from_secs(5)) {
            Ok(mut client) => match client.command(&["PING"]) {
                Ok(Value::Simple(_)) => return Ok(client),
                Ok(Value::Error(message)) => String::from_utf8_lossy(&message).into_owned(),
                Ok(other) => format!("unexpected reply to PING: {other:?}"),
                Err(error) => error.to_string(),
            },
            Err(error) => error.to_string(),
        };
        if started.elapsed() >= timeout || shutdown.is_requested() {
            return Err(AdaptorError::RedisUnavailable {
                addr,
                waited: started.elapsed(),
                reason,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn config_get(
    client: &mut SyncClient,
    addr: SocketAddr,
    name: &str,
) -> Result<String, AdaptorError> {
    let value = client
        .command(&["CONFIG", "GET", name])
        .map_err(|error| redis_error(addr, "CONFIG GET", error))?;
    match value {
        Value::Array(Some(items)) if items.len() == 2 => Ok(items[1]
            .as_bytes()
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
            .unwrap_or_default()),
        _ => Ok(String::from("?")),
    }
}

fn script_load(
    client: &mut SyncClient,
    addr: SocketAddr,
    text: &str,
) -> Result<String, AdaptorError> {
    match client
        .command(&["SCRIPT", "LOAD", text])
        .map_err(|error| redis_error(addr, "SCRIPT LOAD", error))?
    {
        Value::Bulk(Some(sha)) => Ok(String::from_utf8_lossy(&sha).into_owned()),
        other => Err(redis_error(
            addr,
            "SCRIPT LOAD",
            format!("unexpected reply {other:?}"),
        )),
    }
}

/// Escape glob characters for SCAN MATCH.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for character in text.chars() {
        if matches!(character, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(character);
    }
    out
}

/// Read every session record under `prefix`. Returns the sessions and how many keys under the
/// prefix were not valid records.
pub fn load_sessions(
    client: &mut SyncClient,
    addr: SocketAddr,
    prefix: &str,
) -> Result<(Vec<RecoveredSession>, usize), AdaptorError> {
    let pattern = format!("{}*", glob_escape(prefix));
    let mut cursor = b"0".to_vec();
    let mut sessions = Vec::new();
    let mut skipped = 0;
    loop {
        let reply = client
            .command(&[
                b"SCAN".as_slice(),
                &cursor,
                b"MATCH",
                pattern.as_bytes(),
                b"COUNT",
                b"1000",
            ])
            .map_err(|error| redis_error(addr, "SCAN", error))?;
        let Value::Array(Some(mut parts)) = reply else {
            return Err(redis_error(
                addr,
                "SCAN",
                format!("unexpected reply {reply:?}"),
            ));
        };
        if parts.len() != 2 {
            return Err(redis_error(addr, "SCAN", "unexpected reply shape"));
        }
        let keys = parts.pop();
        let next = parts.pop();
        let (Some(Value::Bulk(Some(next))), Some(Value::Array(Some(keys)))) = (next, keys) else {
            return Err(redis_error(addr, "SCAN", "unexpected reply shape"));
        };
        let keys: Vec<Vec<u8>> = keys
            .into_iter()
            .filter_map(|key| key.as_bytes().map(<[u8]>::to_vec))
            .collect();
        let commands: Vec<Vec<Vec<u8>>> = keys
            .iter()
            .map(|key| vec![b"HGETALL".to_vec(), key.clone()])
            .collect();
        let replies = if commands.is_empty() {
            Vec::new()
        } else {
            client
                .pipeline(&commands)
                .map_err(|error| redis_error(addr, "HGETALL", error))?
        };
        for (key, reply) in keys.iter().zip(replies) {
            match parse_record(prefix, key, reply) {
                Some(session) => sessions.push(session),
                None => skipped += 1,
            }
        }
        if next == b"0" {
            break;
        }
        cursor = next;
    }
    Ok((sessions, skipped))
}

fn parse_record(prefix: &str, key: &[u8], reply: Value) -> Option<RecoveredSession> {
    let session_id = script::session_of_key(prefix, key)?;
    let Value::Array(Some(items)) = reply else {
        return None;
    };
    let mut fields: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut items = items.into_iter();
    while let (Some(field), Some(value)) = (items.next(), items.next()) {
        if let (Some(field), Some(value)) = (field.as_bytes(), value.as_bytes()) {
            fields.insert(field.to_vec(), value.to_vec());
        }
    }
    let seq_text = fields.get(b"seq".as_slice())?;
    let last_seq: u32 = std::str::from_utf8(seq_text).ok()?.parse().ok()?;
    let last_reply = fields
        .remove(script::reply_field(last_seq).as_bytes())
        .unwrap_or_default();
    Some(RecoveredSession {
        session_id,
        last_seq,
        last_reply,
    })
}

/// Append `*N` and bulk strings: the fixed parts, then the arguments.
fn encode_parts(out: &mut Vec<u8>, head: &[&[u8]], args: &[Vec<u8>]) {
    out.extend_from_slice(format!("*{}\r\n", head.len() + args.len()).as_bytes());
    for part in head {
        encode_bulk(part, out);
    }
    for arg in args {
        encode_bulk(arg, out);
    }
}

impl Adaptor {
    /// Wait for Redis, load the session records, bind the socket and start the server (which
    /// polls its devices).
    pub fn open(options: AdaptorOptions, shutdown: Shutdown) -> Result<Adaptor, AdaptorError> {
        if options.connections == 0 || options.connections > 256 {
            return Err(AdaptorError::Config(format!(
                "--redis-connections {} is out of range; use 1 to 256",
                options.connections
            )));
        }
        let addr = options.redis;
        let mut client = connect_when_ready(addr, options.startup_timeout, &shutdown)?;
        let info = client
            .command(&["INFO", "server"])
            .map_err(|error| redis_error(addr, "INFO", error))?;
        let redis_version = info
            .as_bytes()
            .and_then(|text| {
                String::from_utf8_lossy(text)
                    .lines()
                    .find_map(|line| line.strip_prefix("redis_version:").map(str::to_owned))
            })
            .unwrap_or_else(|| "?".to_owned());
        let appendonly = config_get(&mut client, addr, "appendonly")?;
        let appendfsync = config_get(&mut client, addr, "appendfsync")?;
        let redis_dir = config_get(&mut client, addr, "dir")?;
        let apply_sha = script_load(&mut client, addr, &script::apply_script())?;
        let read_sha = script_load(&mut client, addr, &script::checked_read_script())?;
        let (sessions, records_skipped) = load_sessions(&mut client, addr, &options.record_prefix)?;
        drop(client);
        let socket =
            BatchSocket::bind(options.listen, 1 << 16).map_err(|source| AdaptorError::Bind {
                addr: options.listen,
                source,
            })?;
        let startup = AdaptorStartup {
            redis_version,
            appendonly,
            appendfsync,
            redis_dir,
            sessions_recovered: sessions.len(),
            records_skipped,
        };
        let clock = Clock::new();
        let config = ServerConfig::new(options.server_id, options.devices.clone());
        let server = Server::new(config, clock.now(), sessions);
        let board = MetricsBoard::new();
        let metrics_addr = match options.metrics_listen {
            Some(addr) => Some(
                serve_metrics(addr, board.clone(), shutdown.clone())
                    .map_err(|source| AdaptorError::Metrics { addr, source })?,
            ),
            None => None,
        };
        let conns = (0..options.connections).map(|_| Conn::new()).collect();
        let ttl_arg = options
            .session_ttl
            .map_or(0, |ttl| ttl.as_secs().max(1))
            .to_string();
        let mut adaptor = Adaptor {
            options,
            clock,
            server,
            socket,
            conns,
            flows: HashMap::new(),
            outstanding: 0,
            apply_sha,
            read_sha,
            ttl_arg,
            startup,
            counters: AdaptorCounters::default(),
            limits: Limits {
                max_bulk_len: 512 << 20,
                ..Limits::default()
            },
            board,
            metrics_addr,
            shutdown,
            loop_iterations: 0,
            idle_waits: 0,
        };
        for index in 0..adaptor.conns.len() {
            adaptor.try_connect(index);
        }
        // The recovery polls go out now.
        adaptor.send_transmits();
        adaptor.board.publish(&adaptor.metrics());
        Ok(adaptor)
    }

    pub fn startup(&self) -> &AdaptorStartup {
        &self.startup
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.socket.local_addr()
    }

    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    pub fn counters(&self) -> &AdaptorCounters {
        &self.counters
    }

    pub fn is_recovering(&self) -> bool {
        self.server.is_recovering()
    }

    /// Run until the shutdown flag is set; then wait (briefly) for Redis's outstanding replies
    /// so their server-ACKs go out, and return.
    pub fn run(&mut self) -> Result<(), AdaptorError> {
        if let Some(cpu) = self.options.cpu {
            pin_current_thread(cpu).map_err(AdaptorError::Pin)?;
        }
        let report_interval = self.options.report_interval;
        let publish = self.metrics_addr.is_some();
        let mut next_publish = Instant::now() + PUBLISH_INTERVAL;
        let mut next_report = report_interval.map(|interval| Instant::now() + interval);
        let mut stop_by: Option<Instant> = None;
        loop {
            self.loop_iterations += 1;
            if stop_by.is_none() && self.shutdown.is_requested() {
                stop_by = Some(Instant::now() + STOP_GRACE);
                tracing::info!(
                    "stopping: waiting up to {STOP_GRACE:?} for {} requests at Redis",
                    self.outstanding
                );
            }
            let busy = self.poll_once(stop_by.is_none());
            let wall = Instant::now();
            if let Some(deadline) = stop_by {
                let at_redis: usize = self.conns.iter().map(|conn| conn.pending.len()).sum();
                if (at_redis == 0 && self.socket.queued_len() == 0) || wall >= deadline {
                    break;
                }
            }
            if publish && wall >= next_publish {
                self.board.publish(&self.metrics());
                next_publish = wall + PUBLISH_INTERVAL;
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
            self.idle_waits += 1;
            match self.options.wait {
                WaitMode::BusyPoll => yield_cpu(),
                WaitMode::Blocking => {
                    let mut timeout = MAX_SLEEP;
                    if let Some(deadline) = self.server.poll_timeout() {
                        timeout = timeout.min(self.clock.until(deadline));
                    }
                    for conn in &self.conns {
                        if conn.stream.is_none() {
                            if let Some(at) = conn.retry_at {
                                timeout = timeout.min(at.saturating_duration_since(wall));
                            }
                        }
                    }
                    if publish {
                        timeout = timeout.min(next_publish.saturating_duration_since(wall));
                    }
                    if let Some(at) = next_report {
                        timeout = timeout.min(at.saturating_duration_since(wall));
                    }
                    let mut fds = vec![PollFd::new(
                        self.socket.raw_fd(),
                        true,
                        self.socket.is_write_blocked(),
                    )];
                    for conn in &self.conns {
                        if let Some(stream) = &conn.stream {
                            fds.push(PollFd::new(
                                std::os::fd::AsRawFd::as_raw_fd(stream),
                                true,
                                conn.unsent() > 0,
                            ));
                        }
                    }
                    if wait(&mut fds, timeout).is_err() {
                        std::thread::sleep(timeout.min(Duration::from_millis(1)));
                    }
                }
            }
        }
        self.board.publish(&self.metrics());
        tracing::info!("adaptor stopped: {}", self.report_line());
        Ok(())
    }

    /// One turn: reconnect, receive, fire timers, read Redis's replies, hand new requests to
    /// Redis, send. Returns whether anything happened.
    pub fn poll_once(&mut self, accept_input: bool) -> bool {
        let mut busy = false;
        let wall = Instant::now();
        for index in 0..self.conns.len() {
            let conn = &self.conns[index];
            if conn.stream.is_none() && conn.retry_at.is_some_and(|at| at <= wall) {
                busy |= self.try_connect(index);
            }
        }
        if accept_input {
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
        for index in 0..self.conns.len() {
            busy |= self.read_replies(index);
        }
        busy |= self.take_requests();
        for index in 0..self.conns.len() {
            busy |= self.write_out(index);
        }
        busy |= self.send_transmits();
        busy
    }

    fn send_transmits(&mut self) -> bool {
        let mut any = false;
        while let Some(transmit) = self.server.poll_transmit() {
            any = true;
            self.socket.enqueue(transmit);
        }
        if self.socket.queued_len() > 0 {
            self.socket.flush();
        }
        any
    }

    fn conn_of(&self, session_id: u64) -> usize {
        // Session ids are random; fold the high bits in anyway.
        ((session_id ^ (session_id >> 32)) % self.conns.len() as u64) as usize
    }

    /// Take requests from the server while there is room, and send them (or hold them).
    fn take_requests(&mut self) -> bool {
        let mut any = false;
        loop {
            let unsent: usize = self.conns.iter().map(Conn::unsent).sum();
            if self.outstanding >= self.options.max_outstanding || unsent >= MAX_UNSENT_BYTES {
                break;
            }
            let Some(event) = self.server.poll_event() else {
                break;
            };
            any = true;
            match event {
                ServerEvent::Apply {
                    session_id,
                    seq,
                    kind,
                    request,
                } => {
                    let op = self.decode(kind, &request);
                    self.outstanding += 1;
                    let flow = self.flows.entry(session_id).or_default();
                    if flow.at_redis >= REPLY_RING || !flow.held.is_empty() {
                        flow.held.push_back((seq, op));
                        self.counters.held_back += 1;
                    } else {
                        flow.at_redis += 1;
                        self.dispatch(session_id, seq, op);
                    }
                }
                ServerEvent::RecoveryComplete { entries_resent } => {
                    self.counters.recoveries_completed += 1;
                    self.counters.recovery_entries_resent += entries_resent;
                    tracing::info!(
                        "recovery complete: every device answered; {entries_resent} logged \
                         requests were resent and are applied in order"
                    );
                }
            }
        }
        any
    }

    /// What to do with a request payload.
    fn decode(&mut self, kind: RequestKind, payload: &[u8]) -> Op {
        if payload.is_empty() {
            self.counters.noop_fills += 1;
            return Op::Literal(error_reply(
                "ERR pmnet: no-op fill (the client gave up on this request)",
            ));
        }
        let args = match parse_command(payload, &self.limits) {
            Ok(Some((args, used))) if used == payload.len() && !args.is_empty() => args,
            _ => {
                self.counters.bad_payloads += 1;
                return Op::Literal(error_reply(
                    "ERR pmnet-redis: the request payload is not one RESP command",
                ));
            }
        };
        if let Some(spec) = lookup(&args[0]) {
            if let Class::Refused(reason) = spec.class {
                self.counters.refused += 1;
                return Op::Literal(error_reply(&format!("ERR {reason}")));
            }
        }
        let _ = kind;
        match adaptor_class(&args) {
            AdaptorClass::StatelessRead if !self.options.record_reads => Op::StatelessRead(args),
            AdaptorClass::Read if !self.options.record_reads => Op::Read(args),
            _ => Op::Write(args),
        }
    }

    fn dispatch(&mut self, session_id: u64, seq: u32, op: Op) {
        let index = self.conn_of(session_id);
        let mut pending = Pending {
            session_id,
            seq,
            op,
            sent_as: SentAs::Direct,
        };
        let prefix = self.options.record_prefix.clone();
        let conn = &mut self.conns[index];
        if conn.stream.is_some() {
            pending.sent_as = encode_request(
                &mut conn.out,
                &prefix,
                &self.ttl_arg,
                &self.apply_sha,
                &self.read_sha,
                &pending,
                None,
            );
            conn.expect.push_back(Expect::Request);
        }
        conn.pending.push_back(pending);
    }

    /// Open connection `index` and send again what it owes. Returns whether it connected.
    fn try_connect(&mut self, index: usize) -> bool {
        let addr = self.options.redis;
        let connected = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).and_then(|stream| {
            stream.set_nodelay(true)?;
            stream.set_nonblocking(true)?;
            Ok(stream)
        });
        let stream = match connected {
            Ok(stream) => stream,
            Err(error) => {
                self.note_failure(index, &format!("cannot connect: {error}"));
                return false;
            }
        };
        let first =
            self.conns[index].failures_in_a_row == 0 && self.counters.connection_failures == 0;
        if !first {
            self.counters.reconnects += 1;
        }
        let prefix = self.options.record_prefix.clone();
        let conn = &mut self.conns[index];
        conn.stream = Some(stream);
        conn.retry_at = None;
        conn.out.clear();
        conn.out_sent = 0;
        conn.input.clear();
        conn.expect.clear();
        // Load the scripts again: Redis may have restarted.
        for text in [script::apply_script(), script::checked_read_script()] {
            resp::encode_command(
                &[b"SCRIPT".as_slice(), b"LOAD", text.as_bytes()],
                &mut conn.out,
            );
            conn.expect.push_back(Expect::ScriptLoad);
        }
        // A read resent while a later write of its session may already be applied must not
        // see that write: resend it through the checked read, bounded by that write's number.
        let mut later_write: HashMap<u64, u32> = HashMap::new();
        let mut bounds = vec![None; conn.pending.len()];
        for (position, pending) in conn.pending.iter().enumerate().rev() {
            match pending.op {
                Op::Write(_) | Op::Literal(_) => {
                    later_write.insert(pending.session_id, pending.seq);
                }
                Op::Read(_) => bounds[position] = later_write.get(&pending.session_id).copied(),
                Op::StatelessRead(_) => {}
            }
        }
        let resent = conn.pending.len() as u64;
        for (pending, bound) in conn.pending.iter_mut().zip(bounds) {
            pending.sent_as = encode_request(
                &mut conn.out,
                &prefix,
                &self.ttl_arg,
                &self.apply_sha,
                &self.read_sha,
                pending,
                bound,
            );
            conn.expect.push_back(Expect::Request);
        }
        if !first {
            self.counters.resent += resent;
            tracing::info!(
                "connection {index} to Redis {addr} open again; {resent} unanswered requests sent \
                 again"
            );
        }
        self.conns[index].failures_in_a_row = 0;
        self.conns[index].backoff = MIN_BACKOFF;
        true
    }

    /// Close connection `index` and schedule a new attempt.
    fn note_failure(&mut self, index: usize, why: &str) {
        self.counters.connection_failures += 1;
        let conn = &mut self.conns[index];
        conn.stream = None;
        conn.out.clear();
        conn.out_sent = 0;
        conn.input.clear();
        conn.expect.clear();
        conn.failures_in_a_row += 1;
        let backoff = conn.backoff;
        conn.retry_at = Some(Instant::now() + backoff);
        conn.backoff = (backoff * 2).min(MAX_BACKOFF);
        // Say it the first time and then about every ten seconds.
        if conn.failures_in_a_row == 1 || conn.failures_in_a_row % 16 == 0 {
            tracing::warn!(
                "Redis {} (connection {index}): {why}; {} requests wait; retrying in {backoff:?}",
                self.options.redis,
                conn.pending.len()
            );
        }
    }

    fn write_out(&mut self, index: usize) -> bool {
        let conn = &mut self.conns[index];
        let Some(stream) = conn.stream.as_mut() else {
            return false;
        };
        let mut wrote = false;
        let mut failure = None;
        while conn.out_sent < conn.out.len() {
            match stream.write(&conn.out[conn.out_sent..]) {
                Ok(0) => {
                    failure = Some("connection closed while writing".to_owned());
                    break;
                }
                Ok(count) => {
                    conn.out_sent += count;
                    wrote = true;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    failure = Some(format!("write failed: {error}"));
                    break;
                }
            }
        }
        if conn.out_sent == conn.out.len() {
            conn.out.clear();
            conn.out_sent = 0;
        }
        if let Some(why) = failure {
            self.note_failure(index, &why);
        }
        wrote
    }

    /// Read and handle Redis's replies on connection `index`.
    fn read_replies(&mut self, index: usize) -> bool {
        let mut read_any = false;
        let mut failure: Option<String> = None;
        {
            let conn = &mut self.conns[index];
            let Some(stream) = conn.stream.as_mut() else {
                return false;
            };
            let mut chunk = [0u8; 64 << 10];
            let mut total = 0;
            while total < READ_PER_TURN {
                match stream.read(&mut chunk) {
                    Ok(0) => {
                        failure = Some("Redis closed the connection".to_owned());
                        break;
                    }
                    Ok(count) => {
                        conn.input.extend_from_slice(&chunk[..count]);
                        total += count;
                        read_any = true;
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                    Err(error) => {
                        failure = Some(format!("read failed: {error}"));
                        break;
                    }
                }
            }
        }
        // Replies that arrived before a failure are still good.
        let mut consumed = 0;
        let mut completed: Vec<(u64, u32, Vec<u8>)> = Vec::new();
        while failure.is_none() {
            let parsed = parse_value(&self.conns[index].input[consumed..], &self.limits);
            let (value, used) = match parsed {
                Ok(Some(parsed)) => parsed,
                Ok(None) => break,
                Err(error) => {
                    failure = Some(format!("unreadable reply: {error}"));
                    break;
                }
            };
            consumed += used;
            let conn = &mut self.conns[index];
            match conn.expect.pop_front() {
                None => {
                    failure = Some("a reply nobody asked for".to_owned());
                }
                Some(Expect::ScriptLoad) => {
                    if let Value::Error(message) = &value {
                        self.counters.transient_errors += 1;
                        failure = Some(format!(
                            "SCRIPT LOAD failed: {}",
                            String::from_utf8_lossy(message)
                        ));
                    }
                }
                Some(Expect::Request) => {
                    let Some(pending) = conn.pending.pop_front() else {
                        failure = Some("a reply without a request".to_owned());
                        continue;
                    };
                    match self.interpret(&pending, value) {
                        Ok(reply) => completed.push((pending.session_id, pending.seq, reply)),
                        Err(why) => {
                            self.conns[index].pending.push_front(pending);
                            failure = Some(why);
                        }
                    }
                }
            }
        }
        if consumed > 0 {
            self.conns[index].input.drain(..consumed);
        }
        let any = read_any || !completed.is_empty();
        let now = self.clock.now();
        for (session_id, seq, reply) in completed {
            self.server.on_applied(now, session_id, seq, reply);
            self.finish(session_id);
        }
        if let Some(why) = failure {
            self.note_failure(index, &why);
        }
        any
    }

    /// A request of `session_id` was answered: let the next held one go.
    fn finish(&mut self, session_id: u64) {
        self.outstanding = self.outstanding.saturating_sub(1);
        let Some(flow) = self.flows.get_mut(&session_id) else {
            return;
        };
        flow.at_redis = flow.at_redis.saturating_sub(1);
        let mut release = Vec::new();
        while flow.at_redis < REPLY_RING {
            let Some(held) = flow.held.pop_front() else {
                break;
            };
            flow.at_redis += 1;
            release.push(held);
        }
        if flow.at_redis == 0 && flow.held.is_empty() {
            self.flows.remove(&session_id);
        }
        for (seq, op) in release {
            self.dispatch(session_id, seq, op);
        }
    }

    /// Turn Redis's answer into the request's reply; `Err` when it must be sent again.
    fn interpret(&mut self, pending: &Pending, value: Value) -> Result<Vec<u8>, String> {
        if let Value::Error(message) = &value {
            if is_transient(message) {
                self.counters.transient_errors += 1;
                return Err(format!(
                    "Redis answered {} (will retry)",
                    String::from_utf8_lossy(message)
                ));
            }
        }
        match pending.sent_as {
            SentAs::Direct => {
                self.counters.reads += 1;
                if value.is_error() {
                    self.counters.command_errors += 1;
                }
                Ok(value.to_bytes())
            }
            SentAs::Script => match value {
                Value::Array(Some(items)) if items.len() == 2 => {
                    let (status, reply) = (&items[0], &items[1]);
                    let reply = reply.as_bytes().unwrap_or_default().to_vec();
                    match status {
                        Value::Integer(script::STATUS_APPLIED) => {
                            if matches!(pending.op, Op::Read(_)) {
                                self.counters.reads += 1;
                            } else {
                                self.counters.writes_applied += 1;
                            }
                            if reply.first() == Some(&b'-') && matches!(pending.op, Op::Write(_)) {
                                self.counters.command_errors += 1;
                            }
                            Ok(reply)
                        }
                        Value::Integer(script::STATUS_ALREADY_APPLIED) => {
                            self.counters.redone_recognised += 1;
                            Ok(reply)
                        }
                        _ => {
                            self.counters.replies_gone += 1;
                            Ok(error_reply(
                                "ERR pmnet: this request was applied exactly once, but its \
                                 reply was lost in a crash",
                            ))
                        }
                    }
                }
                Value::Error(message) => {
                    // Not transient: the script itself failed (for example too many
                    // arguments for Lua). Nothing was recorded; pass Redis's error on.
                    self.counters.script_failures += 1;
                    let mut reply = vec![b'-'];
                    reply.extend_from_slice(&message);
                    reply.extend_from_slice(b"\r\n");
                    Ok(reply)
                }
                other => Err(format!("unexpected answer from the script: {other:?}")),
            },
        }
    }

    pub fn report_line(&self) -> String {
        let counters = &self.counters;
        let server = self.server.counters();
        let socket = self.socket.counters();
        let up = self
            .conns
            .iter()
            .filter(|conn| conn.stream.is_some())
            .count();
        let mut line = format!(
            "redis-adaptor {}: udp in {} out {}; writes {} reads {} redone-recognised {} \
             replies-gone {} command-errors {} noop-fills {} bad-payloads {} refused {}; \
             make-up acks {}; outstanding {} held {}; redis connections up {}/{} \
             reconnects {} transient-errors {} resent {}{}; dropped {}",
            self.options.server_id,
            socket.received_total(),
            socket.sent_total(),
            counters.writes_applied,
            counters.reads,
            counters.redone_recognised,
            counters.replies_gone,
            counters.command_errors,
            counters.noop_fills,
            counters.bad_payloads,
            counters.refused,
            server.makeup_acks_sent,
            self.outstanding,
            counters.held_back,
            up,
            self.conns.len(),
            counters.reconnects,
            counters.transient_errors,
            counters.resent,
            if self.server.is_recovering() {
                "; RECOVERING (waiting for devices)"
            } else {
                ""
            },
            server.dropped.values().sum::<u64>(),
        );
        for (reason, count) in &server.dropped {
            line.push_str(&format!(" {reason}={count}"));
        }
        line
    }

    /// Every counter, in the Prometheus text format's model.
    pub fn metrics(&self) -> Metrics {
        let mut out = Metrics::new();
        out.gauge(
            "pmnet_redis_adaptor_info",
            "The adaptor's Redis and its durability (value always 1).",
            &[
                ("server_id", &self.options.server_id.to_string()),
                ("redis", &self.options.redis.to_string()),
                ("appendonly", &self.startup.appendonly),
                ("appendfsync", &self.startup.appendfsync),
                ("wait", self.options.wait.name()),
            ],
            1.0,
        );
        let counters = &self.counters;
        for (name, help, value) in [
            (
                "pmnet_redis_writes_applied_total",
                "Writes applied and recorded.",
                counters.writes_applied,
            ),
            ("pmnet_redis_reads_total", "Reads answered.", counters.reads),
            (
                "pmnet_redis_redone_recognised_total",
                "Redone requests Redis had applied before, answered with the stored reply.",
                counters.redone_recognised,
            ),
            (
                "pmnet_redis_replies_gone_total",
                "Redone requests whose reply was no longer kept.",
                counters.replies_gone,
            ),
            (
                "pmnet_redis_command_errors_total",
                "Commands Redis answered with an error.",
                counters.command_errors,
            ),
            (
                "pmnet_redis_noop_fills_total",
                "No-op fills recorded.",
                counters.noop_fills,
            ),
            (
                "pmnet_redis_bad_payloads_total",
                "Payloads that are not one RESP command.",
                counters.bad_payloads,
            ),
            (
                "pmnet_redis_refused_total",
                "Commands refused by the adaptor.",
                counters.refused,
            ),
            (
                "pmnet_redis_script_failures_total",
                "Script calls Redis failed for good.",
                counters.script_failures,
            ),
            (
                "pmnet_redis_transient_errors_total",
                "Transient Redis errors (retried).",
                counters.transient_errors,
            ),
            (
                "pmnet_redis_connection_failures_total",
                "Connections to Redis lost or refused.",
                counters.connection_failures,
            ),
            (
                "pmnet_redis_reconnects_total",
                "Connections to Redis opened again.",
                counters.reconnects,
            ),
            (
                "pmnet_redis_resent_total",
                "Requests sent to Redis again after a lost connection.",
                counters.resent,
            ),
            (
                "pmnet_redis_held_back_total",
                "Requests held back by the per-session limit.",
                counters.held_back,
            ),
            (
                "pmnet_server_requests_applied_total",
                "Requests applied (each exactly once).",
                self.server.counters().requests_applied,
            ),
            (
                "pmnet_server_makeup_acks_sent_total",
                "Duplicates answered with the stored reply.",
                self.server.counters().makeup_acks_sent,
            ),
            (
                "pmnet_loop_iterations_total",
                "Turns of the event loop.",
                self.loop_iterations,
            ),
            (
                "pmnet_loop_idle_waits_total",
                "Turns that found nothing to do.",
                self.idle_waits,
            ),
        ] {
            out.counter(name, help, &[], value);
        }
        out.gauge(
            "pmnet_redis_outstanding",
            "Requests taken from the protocol and not yet answered by Redis.",
            &[],
            self.outstanding as f64,
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
        for (reason, value) in &self.server.counters().dropped {
            out.counter(
                "pmnet_server_dropped_total",
                "Datagrams the server dropped, by reason.",
                &[("reason", reason)],
                *value,
            );
        }
        let socket = self.socket.counters();
        out.counter(
            "pmnet_packets_received_total",
            "Datagrams received.",
            &[("socket", "adaptor")],
            socket.received_total(),
        );
        out.counter(
            "pmnet_packets_sent_total",
            "Datagrams sent.",
            &[("socket", "adaptor")],
            socket.sent_total(),
        );
        for (reason, value) in [
            ("truncated", socket.truncated),
            ("unknown_source", socket.unknown_source),
            ("send_error", socket.send_errors),
            ("send_queue_full", socket.send_queue_full),
            ("receive_error", socket.receive_errors),
        ] {
            out.counter(
                "pmnet_socket_dropped_total",
                "Datagrams the runtime dropped, by reason.",
                &[("socket", "adaptor"), ("reason", reason)],
                value,
            );
        }
        out
    }
}

/// Append the command that carries `pending` to `out`; returns how its reply will look.
fn encode_request(
    out: &mut Vec<u8>,
    prefix: &str,
    ttl: &str,
    apply_sha: &str,
    read_sha: &str,
    pending: &Pending,
    read_bound: Option<u32>,
) -> SentAs {
    let key = script::record_key(prefix, pending.session_id);
    let seq = pending.seq.to_string();
    match &pending.op {
        Op::Write(args) => {
            encode_parts(
                out,
                &[
                    b"EVALSHA",
                    apply_sha.as_bytes(),
                    b"1",
                    &key,
                    seq.as_bytes(),
                    ttl.as_bytes(),
                    b"c",
                ],
                args,
            );
            SentAs::Script
        }
        Op::Literal(reply) => {
            encode_parts(
                out,
                &[
                    b"EVALSHA",
                    apply_sha.as_bytes(),
                    b"1",
                    &key,
                    seq.as_bytes(),
                    ttl.as_bytes(),
                    b"r",
                    reply,
                ],
                &[],
            );
            SentAs::Script
        }
        Op::Read(args) => match read_bound {
            Some(bound) => {
                let bound = bound.to_string();
                encode_parts(
                    out,
                    &[
                        b"EVALSHA",
                        read_sha.as_bytes(),
                        b"1",
                        &key,
                        bound.as_bytes(),
                    ],
                    args,
                );
                SentAs::Script
            }
            None => {
                encode_parts(out, &[], args);
                SentAs::Direct
            }
        },
        Op::StatelessRead(args) => {
            encode_parts(out, &[], args);
            SentAs::Direct
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_errors_are_recognised() {
        assert!(is_transient(
            b"LOADING Redis is loading the dataset in memory"
        ));
        assert!(is_transient(b"NOSCRIPT No matching script"));
        assert!(!is_transient(b"ERR wrong number of arguments"));
        assert!(!is_transient(b"WRONGTYPE Operation against a key"));
    }

    #[test]
    fn records_parse_or_are_skipped() {
        let prefix = script::DEFAULT_RECORD_PREFIX;
        let key = script::record_key(prefix, 7);
        let reply = Value::Array(Some(vec![
            Value::Bulk(Some(b"seq".to_vec())),
            Value::Bulk(Some(b"65".to_vec())),
            Value::Bulk(Some(b"r1".to_vec())),
            Value::Bulk(Some(b"+OK\r\n".to_vec())),
        ]));
        let session = parse_record(prefix, &key, reply).unwrap();
        assert_eq!(session.session_id, 7);
        assert_eq!(session.last_seq, 65);
        assert_eq!(session.last_reply, b"+OK\r\n");
        assert!(parse_record(prefix, &key, Value::Array(Some(vec![]))).is_none());
        assert!(parse_record(prefix, b"pmnet:session:zz", Value::Array(None)).is_none());
    }

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
