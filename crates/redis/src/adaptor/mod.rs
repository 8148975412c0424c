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

mod connections;
mod functions;
mod info;
mod metrics;
mod node;
mod pending;
mod recovery;
mod transactions;
mod translation;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pmnet_proto::{Server, ServerConfig};
use pmnet_runtime::metrics::{serve_metrics, MetricsBoard};
use pmnet_runtime::udp::BatchSocket;
use pmnet_runtime::{Clock, LoopCounters, PeerWatch, Shutdown, WaitMode};

use crate::resp::Limits;
use crate::script;

use connections::{Conn, RedisWatch};

/// How long Redis may be down before bypass requests are answered with an error naming it
/// (see [`AdaptorOptions::fail_fast_after`]).
pub const DEFAULT_FAIL_FAST_AFTER: Duration = Duration::from_secs(2);

/// How long Redis may leave the adaptor without an answer (refused, closed, silent) before a
/// warning naming its address.
pub(crate) const REDIS_SILENCE_WARNING: Duration = pmnet_runtime::SILENCE_WARNING;
pub use info::{info_request, INFO_COMMAND};
pub use recovery::{glob_escape, load_sessions, parse_record};
pub use transactions::{parse_exec, Exec};
use translation::Flow;
pub use translation::{
    check_select, is_user_db, read_payload, Payload, ABORT, DB_COMMAND, DB_OUT_OF_RANGE,
    EXEC_COMMAND, REPLY_WORD, WATCH_COMMAND,
};

/// Bytes of a reply at most: what one PMNet reply carries to the gateway (its PMNet client's
/// `request_len_max`).
pub const REPLY_MAX: usize = 1 << 20;
/// The start of the error that stands for a read's reply over [`REPLY_MAX`]: the gateway runs
/// the read again on a direct connection to Redis (`-PMNET-REPLY-TOO-LARGE <bytes>`).
pub const REPLY_TOO_LARGE: &[u8] = b"-PMNET-REPLY-TOO-LARGE ";

/// The start of the error that answers a request that may have written when its reply is over
/// [`REPLY_MAX`] (a read-only transaction's too: the gateway runs such a one again on a direct
/// connection).
pub const APPLIED_REPLY_TOO_LARGE: &str = "-ERR pmnet: the command was applied, but its reply (";

/// `reply` if it fits one PMNet reply; else, for a read, [`REPLY_TOO_LARGE`] with its length,
/// and for a request that wrote, an error saying it was applied.
pub fn fit_reply(reply: Vec<u8>, writes: bool) -> Vec<u8> {
    if reply.len() <= REPLY_MAX {
        return reply;
    }
    if writes {
        format!(
            "{APPLIED_REPLY_TOO_LARGE}{} bytes) is larger than one PMNet reply carries \
             ({REPLY_MAX} bytes)\r\n",
            reply.len()
        )
        .into_bytes()
    } else {
        let mut out = REPLY_TOO_LARGE.to_vec();
        out.extend_from_slice(format!("{}\r\n", reply.len()).as_bytes());
        out
    }
}

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
    /// `AUTH` to Redis with this user (`None`: the default user) and password.
    pub redis_auth: Option<(Option<Vec<u8>>, Vec<u8>)>,
    /// Pipelined connections to Redis (sessions are spread over them).
    pub connections: usize,
    /// Key prefix of the session records.
    pub record_prefix: String,
    /// The logical database of the session records (0: with the data, in the user's keyspace;
    /// [`script::RECORD_DB_LAST`], the default: the last database Redis has). Clients may
    /// select every other database.
    pub record_db: u32,
    /// Requests taken from the protocol and not yet answered by Redis, at most.
    pub max_outstanding: usize,
    /// How long to wait for Redis at start-up.
    pub startup_timeout: Duration,
    /// Record reads too (their sequence number and reply, through the script). Off, a read
    /// writes nothing to Redis; after an adaptor restart a session that ended with reads then
    /// needs its client to answer retransmission requests for them with no-op fills (the
    /// gateway does).
    pub record_reads: bool,
    /// How long Redis may be down before the adaptor answers new bypass requests (reads, and
    /// writes whose reply is Redis's) with an error naming it instead of holding them
    /// (`None`: hold them until Redis answers). Only requests of a session with nothing
    /// waiting ahead of them are answered so; updates (acked by a device) always wait and are
    /// applied when Redis answers again.
    pub fail_fast_after: Option<Duration>,
    /// A session record expires this long after its session's last write (`None`: never).
    /// A request redone after its record expired would be applied again, so this must
    /// exceed any outage of the adaptor or Redis during which a device keeps the request.
    pub session_ttl: Option<Duration>,
    pub wait: WaitMode,
    pub cpu: Option<usize>,
    pub report_interval: Option<Duration>,
    pub metrics_listen: Option<SocketAddr>,
    /// Authenticate every datagram with these deployment keys (`None`: no authentication).
    pub keys: Option<pmnet_proto::KeySet>,
}

impl AdaptorOptions {
    pub fn new(listen: SocketAddr, redis: SocketAddr) -> AdaptorOptions {
        AdaptorOptions {
            server_id: 1,
            listen,
            devices: Vec::new(),
            redis,
            redis_auth: None,
            connections: 4,
            record_prefix: script::DEFAULT_RECORD_PREFIX.to_owned(),
            record_db: script::RECORD_DB_LAST,
            max_outstanding: 16_384,
            startup_timeout: Duration::from_secs(30),
            record_reads: false,
            fail_fast_after: Some(DEFAULT_FAIL_FAST_AFTER),
            session_ttl: Some(Duration::from_secs(script::DEFAULT_SESSION_TTL_SECS)),
            wait: WaitMode::Blocking,
            cpu: None,
            report_interval: Some(Duration::from_secs(10)),
            metrics_listen: None,
            keys: None,
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
    /// How many databases Redis has (`databases`).
    pub databases: u32,
    /// The database the records are in.
    pub record_db: u32,
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
    /// Group script calls answered (several writes in one call each).
    pub groups: u64,
    /// Writes applied in those group calls.
    pub grouped_writes: u64,
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
    /// Bypass requests answered with an error, not applied, because Redis was down (see
    /// [`AdaptorOptions::fail_fast_after`]).
    pub failed_fast: u64,
    /// Recovery polls answered by every device.
    pub recoveries_completed: u64,
    pub recovery_entries_resent: u64,
}

/// A running adaptor. See the module docs.
#[derive(Debug)]
pub struct Adaptor {
    options: AdaptorOptions,
    clock: Clock,
    server: Server,
    socket: BatchSocket,
    conns: Vec<Conn>,
    /// Whether Redis answers on any connection (one warning per outage).
    redis_watch: RedisWatch,
    /// Whether the devices answer the adaptor's recovery polls and fill queries.
    devices: PeerWatch,
    /// `adaptor{id=..}`: every event of the adaptor (its wait for Redis, its loop) carries it.
    span: tracing::Span,
    flows: HashMap<u64, Flow>,
    /// Requests taken from the server and not yet answered (at Redis or held).
    outstanding: usize,
    /// The record prefix, TTL and script names every request is encoded with.
    encoding: translation::Encoding,
    /// Redis's command table (`COMMAND`).
    table: crate::table::CommandTable,
    /// How many databases Redis has.
    databases: u32,
    /// User scripts by SHA-1 (bounded by [`script::SCRIPTS_CACHED_MAX`]).
    scripts: HashMap<String, std::sync::Arc<[u8]>>,
    /// A blocking connection for the rare lookups the event loop cannot pipeline (a script
    /// `EVALSHA` names that is not in memory, function libraries, changes to them).
    lookup: Option<crate::resp::SyncClient>,
    /// A blocking connection in database 0 for cache reads (the read cache's misses).
    reader: Option<crate::resp::SyncClient>,
    /// The function libraries as last read from Redis (`FCALL`).
    functions: functions::Functions,
    startup: AdaptorStartup,
    counters: AdaptorCounters,
    limits: Limits,
    board: MetricsBoard,
    metrics_addr: Option<SocketAddr>,
    shutdown: Shutdown,
    /// Where Redis's replies are read into before they join a connection's input (kept, not
    /// zeroed anew for every read).
    scratch: Vec<u8>,
    /// When a stopping adaptor gives up waiting for Redis's outstanding replies.
    stop_by: Option<Instant>,
    event_loop: LoopCounters,
}

impl Adaptor {
    /// Wait for Redis, load the session records, bind the socket and start the server (which
    /// polls its devices).
    pub fn open(mut options: AdaptorOptions, shutdown: Shutdown) -> Result<Adaptor, AdaptorError> {
        let span = tracing::info_span!("adaptor", id = options.server_id);
        let _entered = span.clone().entered();
        if options.connections == 0 || options.connections > 256 {
            return Err(AdaptorError::Config(format!(
                "--redis-connections {} is out of range; use 1 to 256",
                options.connections
            )));
        }
        let redis = recovery::read_redis_state(&options, &shutdown)?;
        options.record_db = redis.record_db;
        let mut socket =
            BatchSocket::bind(options.listen, 1 << 16).map_err(|source| AdaptorError::Bind {
                addr: options.listen,
                source,
            })?;
        socket.report_unreachable();
        let devices = PeerWatch::new("device", "`pmnet device`", &options.devices);
        let clock = Clock::new();
        let mut config = ServerConfig::new(options.server_id, options.devices.clone());
        config.auth = options.keys.clone().map(pmnet_proto::Authenticator::new);
        config.boot_nonce = rand::random();
        let mut server = Server::new(config, clock.now(), redis.sessions);
        // Without keys: say so, at most once a minute, while other hosts send to it.
        server.warn_of_plain_traffic();
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
        let encoding = translation::Encoding {
            prefix: options.record_prefix.clone(),
            ttl: ttl_arg,
            apply_sha: redis.apply_sha,
            group_sha: redis.group_sha,
            read_sha: redis.read_sha,
            watch_sha: redis.watch_sha,
            record_db: options.record_db,
        };
        let mut adaptor = Adaptor {
            options,
            clock,
            server,
            socket,
            conns,
            redis_watch: RedisWatch::default(),
            devices,
            span,
            flows: HashMap::new(),
            outstanding: 0,
            encoding,
            table: redis.table,
            databases: redis.databases,
            scripts: redis
                .scripts
                .into_iter()
                .map(|(sha, body)| (sha, body.into()))
                .collect(),
            lookup: None,
            functions: functions::Functions::default(),
            reader: None,
            startup: redis.startup,
            counters: AdaptorCounters::default(),
            limits: Limits {
                max_bulk_len: 512 << 20,
                // A transaction through the gateway carries every queued command's words.
                max_args: 1 << 16,
                ..Limits::default()
            },
            board,
            metrics_addr,
            shutdown,
            scratch: vec![0; connections::READ_CHUNK],
            stop_by: None,
            event_loop: LoopCounters::default(),
        };
        for index in 0..adaptor.conns.len() {
            adaptor.try_connect(index);
        }
        // The recovery polls go out now.
        if adaptor.server.is_recovering() {
            tracing::debug!(
                devices = adaptor.options.devices.len(),
                "recovery: polling the devices for requests they logged while the adaptor was \
                 down; serving after every one has answered"
            );
        }
        adaptor.send_transmits();
        pmnet_runtime::publish_node(&adaptor, &adaptor.board);
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
}
