//! The module's state and its three moments in each turn of Redis's event loop
//! (docs/redis.md, "The module"):
//!
//! 1. **Datagrams arrive** (the socket's read handler): each goes to the protocol's
//!    [`Server`], which verifies, orders and batches; nothing is applied here.
//! 2. **Before Redis sleeps** (`EVENTLOOP_BEFORE_SLEEP`): every request the server hands on
//!    is applied — its command and its session's record — in this callback's execution unit;
//!    Redis then writes them to its append-only file as one `MULTI … EXEC` and, with
//!    `appendfsync always`, fsyncs it, in the same `beforeSleep`, after this callback.
//!    Whatever the server would send is kept back.
//! 3. **After Redis wakes** (`EVENTLOOP_AFTER_SLEEP`, the next turn): what was kept back is
//!    sent — the server-ACKs and replies of requests whose effects the fsync just made
//!    durable. An eventfd the module writes when it keeps something back wakes the loop at
//!    once, so no ACK waits for Redis's next timer.

use std::ffi::c_int;
use std::net::SocketAddr;
use std::time::Duration;

use pmnet_proto::{Server, ServerConfig, ServerEvent, Time, Transmit};
use pmnet_redis::resp::{parse_value, Limits, Value};
use pmnet_runtime::udp::BatchSocket;
use pmnet_runtime::Clock;

use crate::apply::Applier;
use crate::call::{Mode, Redis};
use crate::options::ModuleOptions;

/// Requests applied in one turn at most: Redis's own clients wait while the module works.
const APPLY_PER_TURN_MAX: usize = 4096;
/// Datagrams queued to send at most (a turn's ACKs and replies).
const SEND_QUEUE_MAX: usize = 1 << 16;

/// What the module found in Redis at its start.
#[derive(Debug, Clone)]
pub struct Startup {
    pub durability: String,
    pub sessions_recovered: usize,
    pub records_skipped: usize,
    pub record_db: u32,
    pub databases: u32,
}

/// The module: its socket, the protocol's server once Redis has loaded its data, and what
/// waits to be sent.
#[derive(Debug)]
pub struct Node {
    pub options: ModuleOptions,
    socket: BatchSocket,
    wake: c_int,
    clock: Clock,
    keys: Option<pmnet_proto::KeySet>,
    server: Option<Server>,
    applier: Option<Applier>,
    outbox: Vec<Transmit>,
    /// A request taken but left for the next turn (see `Applier::waits_for_next_turn`).
    deferred: Option<ServerEvent>,
    /// Datagrams that came before Redis had loaded its data (dropped: the devices resend).
    pub early_datagrams: u64,
    timer_at: Option<Time>,
    /// Redis's `appendfsync` as the module found it (`none`: no AOF).
    fsync: &'static str,
}

impl Node {
    pub fn new(options: ModuleOptions) -> Result<Node, String> {
        let keys = match &options.key_file {
            Some(path) => Some(
                pmnet_runtime::load_key_file(path)
                    .map_err(|error| format!("argument `key-file`: {error}"))?,
            ),
            None => None,
        };
        let socket = BatchSocket::bind(options.listen, SEND_QUEUE_MAX).map_err(|error| {
            format!(
                "cannot bind the module's UDP socket to {}: {error}; choose another address \
                 with `listen HOST:PORT`",
                options.listen
            )
        })?;
        // SAFETY: eventfd with valid flags.
        let wake = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if wake < 0 {
            return Err(format!(
                "cannot make an eventfd: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Node {
            options,
            socket,
            wake,
            clock: Clock::new(),
            keys,
            server: None,
            applier: None,
            outbox: Vec::new(),
            deferred: None,
            early_datagrams: 0,
            timer_at: None,
            fsync: "unknown",
        })
    }

    pub fn socket_fd(&self) -> c_int {
        self.socket.raw_fd()
    }

    pub fn wake_fd(&self) -> c_int {
        self.wake
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.socket.local_addr()
    }

    /// The socket is readable: hand every datagram to the server.
    pub fn on_readable(&mut self) {
        loop {
            let count = self.socket.receive_batch();
            if count == 0 {
                return;
            }
            let now = self.clock.now();
            for index in 0..count {
                let Some((from, datagram)) = self.socket.received(index) else {
                    continue;
                };
                match self.server.as_mut() {
                    Some(server) => server.handle(now, from, datagram),
                    None => self.early_datagrams += 1,
                }
            }
        }
    }

    /// The eventfd woke the loop: empty it.
    pub fn on_wake(&mut self) {
        let mut value = 0u64;
        // SAFETY: an 8-byte read from our eventfd.
        unsafe { libc::read(self.wake, (&mut value as *mut u64).cast(), 8) };
    }

    /// Before Redis sleeps: start if Redis has loaded its data, apply what the server hands
    /// on, keep back what it would send. Returns the start-up report the first time.
    pub fn before_sleep(&mut self, redis: &Redis) -> Result<Option<Startup>, String> {
        let mut started = None;
        if self.server.is_none() {
            started = Some(self.start(redis)?);
        }
        let (Some(server), Some(applier)) = (self.server.as_mut(), self.applier.as_mut()) else {
            return Ok(started);
        };
        let now = self.clock.now();
        if server.poll_timeout().is_some_and(|at| at <= now) {
            server.handle_timeout(now);
        }
        let mut more = false;
        for taken in 0.. {
            if taken == APPLY_PER_TURN_MAX {
                more = true;
                break;
            }
            let Some(event) = self.deferred.take().or_else(|| server.poll_event()) else {
                break;
            };
            match event {
                ServerEvent::Apply { ref request, .. }
                    if taken > 0 && applier.waits_for_next_turn(request) =>
                {
                    self.deferred = Some(event);
                    more = true;
                    break;
                }
                ServerEvent::Apply {
                    session_id,
                    seq,
                    request,
                    ..
                } => {
                    let reply = applier.apply(redis, session_id, seq, &request);
                    server.on_applied(now, session_id, seq, reply);
                }
                ServerEvent::Read {
                    session_id,
                    id,
                    request,
                } => {
                    let (reply, cacheable) = cache_read(redis, &request);
                    server.on_read_reply_with(session_id, id, &reply, cacheable);
                }
                ServerEvent::ReadWaitsForRoom { session_id, id } => {
                    let reply = pmnet_redis::resp::error_reply(pmnet_proto::WAITS_FOR_ROOM);
                    server.on_read_reply_with(session_id, id, &reply, false);
                }
                ServerEvent::RecoveryComplete(report) => {
                    crate::ffi::log(
                        redis.ctx(),
                        c"notice",
                        &format!(
                            "pmnet: recovery complete: {} logged entries resent by the devices, \
                             {} sequence numbers skipped, {:?} after the last device answered",
                            report.entries_resent, report.numbers_skipped, report.took
                        ),
                    );
                }
            }
        }
        applier.write_records(redis);
        while let Some(transmit) = server.poll_transmit() {
            self.outbox.push(transmit);
        }
        if more || !self.outbox.is_empty() {
            self.wake_next_turn();
        }
        self.arm_timer(redis, now);
        Ok(started)
    }

    /// After Redis woke: send what the last `beforeSleep` made durable.
    pub fn after_sleep(&mut self) {
        for transmit in self.outbox.drain(..) {
            self.socket.enqueue(transmit);
        }
        if self.socket.queued_len() > 0 {
            self.socket.flush();
        }
    }

    /// Make the loop's next wait return at once.
    fn wake_next_turn(&self) {
        let one = 1u64;
        // SAFETY: an 8-byte write to our eventfd.
        unsafe { libc::write(self.wake, (&one as *const u64).cast(), 8) };
    }

    /// A Redis timer for the server's next deadline, when it is sooner than one armed.
    fn arm_timer(&mut self, redis: &Redis, now: Time) {
        let Some(deadline) = self.server.as_ref().and_then(Server::poll_timeout) else {
            return;
        };
        if self.timer_at.is_some_and(|at| at <= deadline && now < at) {
            return;
        }
        let wait = deadline
            .saturating_duration_since(now)
            .max(Duration::from_millis(1));
        let millis = i64::try_from(wait.as_millis())
            .unwrap_or(i64::MAX)
            .min(1000);
        self.timer_at = Some(now + Duration::from_millis(millis as u64));
        crate::create_timer(redis, millis);
    }

    /// A timer fired.
    pub fn on_timer(&mut self) {
        self.timer_at = None;
    }

    /// Redis has loaded its data: read its settings and the session records, and start the
    /// protocol's server.
    fn start(&mut self, redis: &Redis) -> Result<Startup, String> {
        let limits = Limits::default();
        let config = |name: &str| -> String {
            let reply = redis.call(Mode::Read, &[b"CONFIG".as_slice(), b"GET", name.as_bytes()]);
            match parse_value(&reply, &limits) {
                Ok(Some((Value::Array(Some(items)), _))) => items
                    .get(1)
                    .and_then(Value::as_bytes)
                    .map(|value| String::from_utf8_lossy(value).into_owned())
                    .unwrap_or_default(),
                _ => String::new(),
            }
        };
        let databases: u32 = config("databases").parse().unwrap_or(16);
        let record_db = if self.options.record_db == pmnet_redis::script::RECORD_DB_LAST {
            databases.saturating_sub(1)
        } else {
            self.options.record_db
        };
        if record_db >= databases {
            return Err(format!(
                "argument `record-db`: Redis has {databases} databases (0–{}), not {record_db}",
                databases.saturating_sub(1)
            ));
        }
        let startup = pmnet_redis::AdaptorStartup {
            redis_version: String::new(),
            appendonly: config("appendonly"),
            appendfsync: config("appendfsync"),
            redis_dir: config("dir"),
            sessions_recovered: 0,
            records_skipped: 0,
            databases,
            record_db,
        };
        let durability = startup.durability_text();
        let fsync = match startup.durability() {
            pmnet_redis::Durability::FsyncAlways => "always",
            pmnet_redis::Durability::FsyncEverySec => "everysec",
            pmnet_redis::Durability::FsyncNo => "no",
            pmnet_redis::Durability::None => "none",
        };
        self.fsync = fsync;
        let command = redis.call(Mode::Read, &[b"COMMAND".as_slice()]);
        let table = match parse_value(&command, &Limits::gateway(1 << 20, 64 << 20)) {
            Ok(Some((value, _))) => pmnet_redis::table::CommandTable::from_reply(&value),
            _ => None,
        }
        .ok_or("Redis's COMMAND reply could not be read")?;
        let (sessions, skipped) = load_records(redis, record_db, &self.options.record_prefix);
        let recovered = sessions.len();
        let mut config = ServerConfig::new(self.options.server_id, self.options.devices.clone());
        config.auth = self.keys.clone().map(pmnet_proto::Authenticator::new);
        config.boot_nonce = rand::random();
        let mut server = Server::new(config, self.clock.now(), sessions);
        server.warn_of_plain_traffic();
        self.server = Some(server);
        self.applier = Some(Applier::new(
            table,
            databases,
            record_db,
            self.options.record_prefix.clone(),
            self.options.record_reads,
            self.options.session_ttl.map(|ttl| ttl.as_secs().max(1)),
        ));
        Ok(Startup {
            durability,
            sessions_recovered: recovered,
            records_skipped: skipped,
            record_db,
            databases,
        })
    }

    /// Whether datagrams are authenticated, in words.
    pub fn traffic_text(&self) -> String {
        match &self.options.key_file {
            Some(path) => format!("authenticated with the key in {}", path.display()),
            None => "NOT authenticated (no key-file): anyone on the path can forge writes and \
                     acks"
                .to_owned(),
        }
    }

    /// What `INFO pmnet` shows (each name gets Redis's `pmnet_` prefix).
    pub fn status_fields(&self) -> Vec<(String, String)> {
        let mut fields = vec![
            ("listen".to_owned(), self.local_addr().to_string()),
            ("durability".to_owned(), self.fsync.to_owned()),
            (
                "authenticated".to_owned(),
                if self.keys.is_some() { "yes" } else { "no" }.to_owned(),
            ),
            ("server_id".to_owned(), self.options.server_id.to_string()),
            (
                "devices".to_owned(),
                (self.options.devices.iter().map(ToString::to_string))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            (
                "early_datagrams".to_owned(),
                self.early_datagrams.to_string(),
            ),
        ];
        let Some(server) = &self.server else {
            fields.push(("state".to_owned(), "starting".to_owned()));
            return fields;
        };
        let state = if server.is_recovering() {
            "recovering"
        } else {
            "serving"
        };
        fields.push(("state".to_owned(), state.to_owned()));
        fields.push(("sessions".to_owned(), server.session_count().to_string()));
        fields.push((
            "requests_applied".to_owned(),
            server.counters().requests_applied.to_string(),
        ));
        if let Some(applier) = &self.applier {
            let counters = &applier.counters;
            for (name, value) in [
                ("writes", counters.writes),
                ("reads", counters.reads),
                ("literals", counters.literals),
                ("noop_fills", counters.noop_fills),
                ("bad_payloads", counters.bad_payloads),
                ("record_errors", counters.record_errors),
            ] {
                fields.push((name.to_owned(), value.to_string()));
            }
        }
        fields
    }
}

/// A cache read (the read cache's miss) answered on what Redis holds now, and whether a
/// cache may keep the answer: not for a key with a time to live (Redis expires it without a
/// write the device would see).
fn cache_read(redis: &Redis, request: &[u8]) -> (Vec<u8>, bool) {
    let limits = crate::apply::request_limits();
    let args = match pmnet_redis::resp::parse_command(request, &limits) {
        Ok(Some((args, used))) if used == request.len() && !args.is_empty() => args,
        _ => {
            return (
                pmnet_redis::resp::error_reply(
                    "ERR pmnet-redis: the cache read is not one RESP command",
                ),
                false,
            )
        }
    };
    redis.select(0);
    let reply = redis.call(Mode::Read, &args);
    let cacheable = args[0].eq_ignore_ascii_case(b"GET") && args.len() == 2 && {
        let ttl = redis.call(Mode::Read, &[b"PTTL".as_slice(), &args[1]]);
        ttl == b":-1\r\n".as_slice() || ttl == b":-2\r\n".as_slice()
    };
    (reply, cacheable)
}

/// The session records in `record_db` (keys under `prefix`), and how many keys there were not
/// records.
fn load_records(
    redis: &Redis,
    record_db: u32,
    prefix: &str,
) -> (Vec<pmnet_proto::RecoveredSession>, usize) {
    let limits = Limits::gateway(1 << 20, 64 << 20);
    redis.select(record_db);
    let pattern = pmnet_redis::adaptor::glob_escape(prefix) + "*";
    let mut cursor = b"0".to_vec();
    let mut sessions = Vec::new();
    let mut skipped = 0;
    loop {
        let page = redis.call(
            Mode::Read,
            &[
                b"SCAN".as_slice(),
                &cursor,
                b"MATCH",
                pattern.as_bytes(),
                b"COUNT",
                b"1000",
            ],
        );
        let Ok(Some((Value::Array(Some(items)), _))) = parse_value(&page, &limits) else {
            break;
        };
        let mut items = items.into_iter();
        let (Some(next), Some(Value::Array(Some(keys)))) = (items.next(), items.next()) else {
            break;
        };
        for key in keys.iter().filter_map(Value::as_bytes) {
            let all = redis.call(Mode::Read, &[b"HGETALL".as_slice(), key]);
            let parsed = parse_value(&all, &limits)
                .ok()
                .flatten()
                .map(|(value, _)| value);
            match parsed.and_then(|value| pmnet_redis::adaptor::parse_record(prefix, key, value)) {
                Some(session) => sessions.push(session),
                None => skipped += 1,
            }
        }
        cursor = next.as_bytes().unwrap_or(b"0").to_vec();
        if cursor == b"0" {
            break;
        }
    }
    (sessions, skipped)
}
