//! What the gateway tells of itself, so that `INFO`, `CLIENT LIST`/`INFO`/`KILL` and `SLOWLOG`
//! describe the clients and their commands rather than the adaptor's plumbing behind it (its
//! pool of connections to Redis, its scripts, its session records):
//!
//! - every command a client sends is counted here, whatever path it takes (answered by the
//!   gateway, queued in a transaction, an update, a bypass request, a cache read): calls, time
//!   from the command being parsed to its reply being ready, refusals and errors, per command
//!   (`cmdstat_<name>`, subcommands as `client|list`), per error code (`errorstat_<code>`), and
//!   a latency histogram per command (`# Latencystats`); a command slower than
//!   `slowlog_log_slower_than` µs enters the gateway's slow log;
//! - `INFO` goes to Redis as `PMNET.INFO` (the adaptor adds what it knows: its records'
//!   database) and its reply is rewritten ([`super::info_text`]);
//! - `CLIENT LIST`, `INFO` and `KILL` are answered from the gateway's connections
//!   ([`super::clients`]); `SLOWLOG` from its slow log.
//!
//! The hooks: [`start`] for every parsed command, [`ready`] when a waiting reply completes,
//! [`reply_out`] when a reply leaves for the client.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use hdrhistogram::Histogram;

use crate::commands::Route;
use crate::resp::{encode_bulk, error_reply, parse_int, parse_value, Limits, Value};

use super::{clients, info_text, Conn, GatewayCounters, GatewayOptions, Slot};

/// Redis's default `slowlog-log-slower-than` (µs).
pub const DEFAULT_SLOWLOG_SLOWER_THAN: i64 = 10_000;
/// Redis's default `slowlog-max-len`.
pub const DEFAULT_SLOWLOG_MAX_LEN: usize = 128;

/// Distinct command names counted at most (Redis's table has about 400 with subcommands).
const MAX_COMMAND_NAMES: usize = 1024;
/// Distinct error codes counted at most (as Redis).
const MAX_ERROR_CODES: usize = 128;
/// Redis's slow log keeps 32 arguments at most, each of 128 bytes at most.
const SLOWLOG_MAX_ARGC: usize = 32;
const SLOWLOG_MAX_STRING: usize = 128;
/// A command name longer than this is no command of Redis's (not counted).
const MAX_NAME_LEN: usize = 64;
/// Redis's commands with subcommands (7.0 and 7.2): counted as `name|sub`.
const CONTAINERS: &[&str] = &[
    "acl", "client", "cluster", "command", "config", "function", "latency", "memory", "module",
    "object", "pubsub", "script", "slowlog", "xgroup", "xinfo",
];
/// The span of `instantaneous_ops_per_sec`.
const OPS_WINDOW: Duration = Duration::from_millis(1600);
/// The percentiles of `# Latencystats` (Redis's `latency-tracking-info-percentiles`).
const PERCENTILES: [(&str, f64); 3] = [("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999)];

/// What became of a command, for counting it when its reply leaves.
#[derive(Debug)]
enum What {
    Plain,
    /// Queued in a transaction (`+QUEUED`): counted when `EXEC` runs it.
    Queued,
    /// `EXEC` of these queued commands.
    Exec(Vec<Box<str>>),
    /// `INFO`, sent as `PMNET.INFO`: its reply is rewritten.
    Info,
}

/// A command whose reply has not left yet.
#[derive(Debug)]
struct Pending {
    /// The number of its slot among every slot of the connection.
    ordinal: u64,
    name: Option<Box<str>>,
    started: Instant,
    ready: Option<Instant>,
    /// Its arguments as the slow log shows them (trimmed), if the slow log is on.
    argv: Option<Vec<Vec<u8>>>,
    what: What,
}

/// What a connection keeps for introspection.
#[derive(Debug)]
pub(super) struct ConnIntro {
    pending: VecDeque<Pending>,
    /// Slots whose reply left so far (the ordinal of the front slot).
    popped: u64,
    /// When the last command was parsed (`idle`).
    pub(super) last_command: Instant,
    /// The last command's name (`cmd`).
    pub(super) last_name: Option<Box<str>>,
    /// The most input buffered when a command was parsed (`rbp`).
    pub(super) peak_input: usize,
    /// The bytes of the command being started (`argv-mem`), 0 between commands.
    pub(super) argv_mem: usize,
    /// The names of the commands queued in the transaction being queued.
    queued: Vec<Box<str>>,
}

impl ConnIntro {
    pub(super) fn new() -> ConnIntro {
        ConnIntro {
            pending: VecDeque::new(),
            popped: 0,
            last_command: Instant::now(),
            last_name: None,
            peak_input: 0,
            argv_mem: 0,
            queued: Vec::new(),
        }
    }
}

#[derive(Debug)]
struct CommandStat {
    calls: u64,
    usec: u64,
    rejected: u64,
    failed: u64,
    /// Nanoseconds, as Redis's latency tracking.
    latency: Option<Box<Histogram<u64>>>,
}

/// One entry of the slow log.
#[derive(Debug)]
struct SlowEntry {
    id: u64,
    unix_seconds: u64,
    micros: u64,
    argv: Vec<Vec<u8>>,
    addr: String,
    name: Vec<u8>,
}

/// The gateway's own statistics and slow log.
#[derive(Debug)]
pub(super) struct Introspect {
    slower_than: i64,
    max_len: usize,
    commands: HashMap<Box<str>, CommandStat>,
    errors: HashMap<Box<str>, u64>,
    slowlog: VecDeque<SlowEntry>,
    next_slow_id: u64,
    total_commands: u64,
    total_error_replies: u64,
    /// (when, total_commands), 100 ms apart or more: those of the last 1.6 s and the newest
    /// one before.
    samples: VecDeque<(Instant, u64)>,
}

impl Introspect {
    pub(super) fn new(options: &GatewayOptions) -> Introspect {
        Introspect {
            slower_than: options.slowlog_log_slower_than,
            max_len: options.slowlog_max_len,
            commands: HashMap::new(),
            errors: HashMap::new(),
            slowlog: VecDeque::new(),
            next_slow_id: 0,
            total_commands: 0,
            total_error_replies: 0,
            samples: VecDeque::new(),
        }
    }

    fn slowlog_on(&self) -> bool {
        self.slower_than >= 0 && self.max_len > 0
    }

    fn stat(&mut self, name: &str) -> Option<&mut CommandStat> {
        if !self.commands.contains_key(name) {
            if self.commands.len() >= MAX_COMMAND_NAMES {
                return None;
            }
            self.commands.insert(
                name.into(),
                CommandStat {
                    calls: 0,
                    usec: 0,
                    rejected: 0,
                    failed: 0,
                    latency: None,
                },
            );
        }
        self.commands.get_mut(name)
    }

    fn call(&mut self, name: &str, elapsed: Duration, failed: bool) {
        self.total_commands += 1;
        let Some(stat) = self.stat(name) else {
            return;
        };
        stat.calls += 1;
        stat.usec += elapsed.as_micros() as u64;
        stat.failed += u64::from(failed);
        let latency = stat.latency.get_or_insert_with(|| {
            Box::new(
                Histogram::new_with_bounds(1, 1_000_000_000, 2)
                    .unwrap_or_else(|_| Histogram::new(2).expect("two significant figures")),
            )
        });
        latency.saturating_record((elapsed.as_nanos() as u64).max(1));
    }

    fn reject(&mut self, name: &str) {
        if let Some(stat) = self.stat(name) {
            stat.rejected += 1;
        }
    }

    fn error(&mut self, reply: &[u8]) {
        self.total_error_replies += 1;
        let code: String = reply[1..]
            .iter()
            .take_while(|&&b| b != b' ' && b != b'\r')
            .take(MAX_NAME_LEN)
            .map(|&b| b as char)
            .collect();
        if let Some(count) = self.errors.get_mut(code.as_str()) {
            *count += 1;
        } else if self.errors.len() < MAX_ERROR_CODES {
            self.errors.insert(code.into(), 1);
        }
    }

    /// Take a sample of the commands' total for `instantaneous_ops_per_sec`.
    fn sample(&mut self, now: Instant) {
        if self
            .samples
            .back()
            .is_some_and(|(at, _)| now.duration_since(*at) < Duration::from_millis(100))
        {
            return;
        }
        self.samples.push_back((now, self.total_commands));
        while self
            .samples
            .get(1)
            .is_some_and(|(at, _)| now.duration_since(*at) >= OPS_WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// Commands per second over the last 1.6 s, as Redis's `instantaneous_ops_per_sec`
    /// (which averages 16 samples 100 ms apart).
    fn ops_per_sec(&mut self) -> u64 {
        let now = Instant::now();
        self.sample(now);
        let Some((at, total)) = self.samples.front() else {
            return 0;
        };
        let span = now
            .duration_since(*at)
            .clamp(OPS_WINDOW, OPS_WINDOW + Duration::from_millis(200));
        ((self.total_commands - total) as f64 / span.as_secs_f64()).round() as u64
    }

    fn commandstats(&self) -> Vec<String> {
        let mut names: Vec<&Box<str>> = self.commands.keys().collect();
        names.sort();
        names
            .into_iter()
            .filter_map(|name| {
                let stat = &self.commands[name];
                (stat.calls + stat.rejected + stat.failed > 0).then(|| {
                    let per_call = if stat.calls == 0 {
                        0.0
                    } else {
                        stat.usec as f64 / stat.calls as f64
                    };
                    format!(
                        "cmdstat_{name}:calls={},usec={},usec_per_call={per_call:.2},\
                         rejected_calls={},failed_calls={}",
                        stat.calls, stat.usec, stat.rejected, stat.failed
                    )
                })
            })
            .collect()
    }

    fn errorstats(&self) -> Vec<String> {
        let mut codes: Vec<(&Box<str>, &u64)> = self.errors.iter().collect();
        codes.sort();
        codes
            .into_iter()
            .map(|(code, count)| format!("errorstat_{code}:count={count}"))
            .collect()
    }

    fn latencystats(&self) -> Vec<String> {
        let mut names: Vec<&Box<str>> = self.commands.keys().collect();
        names.sort();
        names
            .into_iter()
            .filter_map(|name| {
                let latency = self.commands[name].latency.as_ref()?;
                let values: Vec<String> = PERCENTILES
                    .iter()
                    .map(|(label, quantile)| {
                        let nanos = latency.value_at_quantile(*quantile);
                        format!("{label}={:.3}", nanos as f64 / 1000.0)
                    })
                    .collect();
                Some(format!(
                    "latency_percentiles_usec_{name}:{}",
                    values.join(",")
                ))
            })
            .collect()
    }

    /// `SLOWLOG …` (arity checked here: the gateway's table does not know it).
    fn slowlog_command(&mut self, args: &[Vec<u8>]) -> Vec<u8> {
        let Some(sub) = args.get(1) else {
            return error_reply("ERR wrong number of arguments for 'slowlog' command");
        };
        let upper = sub.to_ascii_uppercase();
        let arity = |ok: bool| {
            (!ok).then(|| {
                error_reply(&format!(
                    "ERR wrong number of arguments for 'slowlog|{}' command",
                    String::from_utf8_lossy(sub).to_ascii_lowercase()
                ))
            })
        };
        match upper.as_slice() {
            b"GET" => {
                if let Some(error) = arity(args.len() <= 3) {
                    return error;
                }
                let count = match args.get(2) {
                    None => 10,
                    Some(text) => match parse_int(text) {
                        Some(-1) => usize::MAX,
                        Some(count) if count >= 0 => usize::try_from(count).unwrap_or(usize::MAX),
                        _ => return error_reply("ERR count should be greater than or equal to -1"),
                    },
                };
                self.slowlog_get(count)
            }
            b"LEN" => arity(args.len() == 2)
                .unwrap_or_else(|| format!(":{}\r\n", self.slowlog.len()).into_bytes()),
            b"RESET" => arity(args.len() == 2).unwrap_or_else(|| {
                self.slowlog.clear();
                b"+OK\r\n".to_vec()
            }),
            b"HELP" => arity(args.len() == 2).unwrap_or_else(slowlog_help),
            _ => error_reply(&format!(
                "ERR unknown subcommand '{}'. Try SLOWLOG HELP.",
                String::from_utf8_lossy(sub)
            )),
        }
    }

    fn slowlog_get(&self, count: usize) -> Vec<u8> {
        let entries: Vec<&SlowEntry> = self.slowlog.iter().take(count).collect();
        let mut out = format!("*{}\r\n", entries.len()).into_bytes();
        for entry in entries {
            out.extend_from_slice(
                format!(
                    "*6\r\n:{}\r\n:{}\r\n:{}\r\n*{}\r\n",
                    entry.id,
                    entry.unix_seconds,
                    entry.micros,
                    entry.argv.len()
                )
                .as_bytes(),
            );
            for arg in &entry.argv {
                encode_bulk(arg, &mut out);
            }
            encode_bulk(entry.addr.as_bytes(), &mut out);
            encode_bulk(&entry.name, &mut out);
        }
        out
    }

    fn log_slow(&mut self, argv: Vec<Vec<u8>>, elapsed: Duration, conn: &Conn) {
        let micros = elapsed.as_micros() as u64;
        if !self.slowlog_on() || micros < self.slower_than as u64 {
            return;
        }
        let unix_seconds = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        self.slowlog.push_front(SlowEntry {
            id: self.next_slow_id,
            unix_seconds,
            micros,
            argv,
            addr: conn.state.peer.map(|a| a.to_string()).unwrap_or_default(),
            name: conn.state.name.clone().unwrap_or_default(),
        });
        self.next_slow_id += 1;
        self.slowlog.truncate(self.max_len);
    }

    /// Count a command whose reply leaves now.
    fn account(&mut self, pending: Pending, reply: &[u8], conn: &Conn) {
        let now = Instant::now();
        let elapsed = pending.ready.unwrap_or(now).duration_since(pending.started);
        let error = reply.first() == Some(&b'-');
        if error {
            self.error(reply);
        }
        // Not for a command Redis does not know, nor for one refused before authentication
        // (the gateway does not tell those apart: any name would do).
        let counted = !error || !(is_unknown(reply) || reply.starts_with(b"-NOAUTH"));
        match (pending.what, pending.name) {
            (_, None) => {}
            (What::Queued, Some(name)) => {
                if error && counted {
                    self.reject(&name);
                }
            }
            (_, Some(name)) if error && is_rejection(reply) => {
                if counted {
                    self.reject(&name);
                }
            }
            (What::Exec(queued), Some(name)) => {
                self.call(&name, elapsed, error);
                if reply.starts_with(b"*") && !queued.is_empty() {
                    let failed = failed_entries(reply, queued.len());
                    let share = elapsed / queued.len() as u32;
                    for (index, queued) in queued.iter().enumerate() {
                        self.call(queued, share, failed.get(index).copied().unwrap_or(false));
                    }
                }
            }
            (_, Some(name)) => {
                if counted {
                    self.call(&name, elapsed, error);
                }
            }
        }
        if let Some(argv) = pending.argv {
            self.log_slow(argv, elapsed, conn);
        }
        self.sample(now);
    }
}

fn slowlog_help() -> Vec<u8> {
    let lines: [&str; 12] = [
        "SLOWLOG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "GET [<count>]",
        "    Return top <count> entries from the slowlog (default: 10, -1 mean all).",
        "    Entries are made of:",
        "    id, timestamp, time in microseconds, arguments array, client IP and port,",
        "    client name",
        "LEN",
        "    Return the length of the slowlog.",
        "RESET",
        "    Reset the slowlog.",
        "HELP",
        "    Prints this help.",
    ];
    let mut out = format!("*{}\r\n", lines.len()).into_bytes();
    for line in lines {
        out.extend_from_slice(format!("+{line}\r\n").as_bytes());
    }
    out
}

/// Redis's errors for a command or subcommand it does not know: no `cmdstat_` for them.
fn is_unknown(reply: &[u8]) -> bool {
    reply.starts_with(b"-ERR unknown command") || reply.starts_with(b"-ERR unknown subcommand")
}

/// Errors that refuse a command before it runs (`rejected_calls`): Redis's, and the gateway's
/// and the adaptor's refusals.
fn is_rejection(reply: &[u8]) -> bool {
    const PREFIXES: [&[u8]; 9] = [
        b"-ERR wrong number of arguments",
        b"-NOAUTH",
        b"-NOPERM",
        b"-OOM",
        b"-READONLY",
        b"-MISCONF",
        b"-MASTERDOWN",
        b"-LOADING",
        b"-EXECABORT",
    ];
    PREFIXES.iter().any(|prefix| reply.starts_with(prefix))
        || reply.windows(13).any(|window| window == b"pmnet gateway")
}

/// Which entries of an `EXEC` reply (`count` of them) are errors.
fn failed_entries(reply: &[u8], count: usize) -> Vec<bool> {
    let limits = Limits {
        max_bulk_len: usize::MAX >> 1,
        ..Limits::default()
    };
    match parse_value(reply, &limits) {
        Ok(Some((Value::Array(Some(items)), _))) if items.len() == count => {
            items.iter().map(Value::is_error).collect()
        }
        _ => Vec::new(),
    }
}

fn is_word(bytes: &[u8]) -> bool {
    !bytes.is_empty() && bytes.len() <= MAX_NAME_LEN && bytes.iter().all(|b| b.is_ascii_graphic())
}

/// The name a command is counted under (`get`, `client|list`), if it looks like one.
fn stat_name(args: &[Vec<u8>]) -> Option<Box<str>> {
    let first = args.first()?;
    if !is_word(first) || first.contains(&b'|') {
        return None;
    }
    let name = String::from_utf8_lossy(first).to_ascii_lowercase();
    if CONTAINERS.contains(&name.as_str()) {
        if let Some(sub) = args
            .get(1)
            .filter(|sub| is_word(sub) && !sub.contains(&b'|'))
        {
            let sub = String::from_utf8_lossy(sub).to_ascii_lowercase();
            return Some(format!("{name}|{sub}").into_boxed_str());
        }
    }
    Some(name.into_boxed_str())
}

/// A command's arguments as Redis's slow log keeps them: at most 32 (the last one then says
/// how many more there were), each at most 128 bytes (then saying how many more bytes), and
/// passwords redacted.
fn slowlog_argv(args: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let shown = args.len().min(SLOWLOG_MAX_ARGC);
    let redacted = redacted_args(args);
    (0..shown)
        .map(|index| {
            if shown != args.len() && index == shown - 1 {
                format!("... ({} more arguments)", args.len() - shown + 1).into_bytes()
            } else if redacted.contains(&index) {
                b"(redacted)".to_vec()
            } else if args[index].len() > SLOWLOG_MAX_STRING {
                let mut arg = args[index][..SLOWLOG_MAX_STRING].to_vec();
                arg.extend_from_slice(
                    format!(
                        "... ({} more bytes)",
                        args[index].len() - SLOWLOG_MAX_STRING
                    )
                    .as_bytes(),
                );
                arg
            } else {
                args[index].clone()
            }
        })
        .collect()
}

/// The positions of passwords (as Redis redacts them: `AUTH`'s arguments, `HELLO … AUTH user
/// pass`).
fn redacted_args(args: &[Vec<u8>]) -> Vec<usize> {
    let name = args[0].to_ascii_uppercase();
    match name.as_slice() {
        b"AUTH" => (1..args.len()).collect(),
        b"HELLO" => args
            .iter()
            .position(|arg| arg.eq_ignore_ascii_case(b"AUTH"))
            .map(|at| vec![at + 1, at + 2])
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// A command the gateway answers here rather than through its usual paths.
enum Intercept {
    Client,
    Slowlog,
    Info,
    None,
}

fn intercept(args: &[Vec<u8>]) -> Intercept {
    let name = args[0].as_slice();
    if name.eq_ignore_ascii_case(b"INFO") {
        Intercept::Info
    } else if name.eq_ignore_ascii_case(b"SLOWLOG") {
        Intercept::Slowlog
    } else if name.eq_ignore_ascii_case(b"CLIENT")
        && args.get(1).is_some_and(|sub| {
            sub.eq_ignore_ascii_case(b"LIST")
                || sub.eq_ignore_ascii_case(b"INFO")
                || sub.eq_ignore_ascii_case(b"KILL")
        })
    {
        Intercept::Client
    } else {
        Intercept::None
    }
}

/// Start `args` (a non-empty command) on `conn`: answer it here if it is one of the
/// introspection commands, else hand it to `forward` (the gateway's usual start); remember it
/// for counting when its reply leaves. `others` are the gateway's other connections.
pub(super) fn start(
    conn: &mut Conn,
    args: &[Vec<u8>],
    intro: &mut Introspect,
    others: &mut [Option<Conn>],
    forward: impl FnOnce(&mut Conn, &[Vec<u8>]),
) {
    let now = Instant::now();
    let name = stat_name(args);
    let ordinal = conn.intro.popped + conn.slots.len() as u64;
    let in_transaction = conn.state.in_transaction();
    conn.intro.last_command = now;
    conn.intro.peak_input = conn.intro.peak_input.max(conn.input.len());
    conn.intro.argv_mem = args.iter().map(Vec::len).sum();
    if name.is_some() {
        conn.intro.last_name.clone_from(&name);
    }
    let mut what = What::Plain;
    let upper = args[0].to_ascii_uppercase();
    match upper.as_slice() {
        b"MULTI" if !in_transaction => conn.intro.queued.clear(),
        b"DISCARD" | b"RESET" => conn.intro.queued.clear(),
        b"EXEC" => what = What::Exec(std::mem::take(&mut conn.intro.queued)),
        _ => {}
    }
    let answered_here = conn.state.authenticated;
    match intercept(args) {
        Intercept::Client if answered_here && !in_transaction => {
            let reply = clients::client_command(conn, args, others);
            conn.slots.push_back(Slot::Ready(reply));
        }
        Intercept::Slowlog if answered_here && !in_transaction => {
            let reply = intro.slowlog_command(args);
            conn.slots.push_back(Slot::Ready(reply));
        }
        Intercept::Slowlog | Intercept::Info if answered_here && in_transaction => {
            let refusal = error_reply(&format!(
                "ERR {} inside MULTI is not supported through the pmnet gateway",
                String::from_utf8_lossy(&upper)
            ));
            let reply = conn.state.queue(args, &Route::Reply(refusal));
            conn.slots.push_back(Slot::Ready(reply));
        }
        Intercept::Info if answered_here => {
            what = What::Info;
            let mut words = Vec::with_capacity(args.len());
            words.push(crate::adaptor::INFO_COMMAND.to_vec());
            words.extend_from_slice(&args[1..]);
            forward(conn, &words);
        }
        _ => forward(conn, args),
    }
    conn.intro.argv_mem = 0;
    let pushed = conn.intro.popped + conn.slots.len() as u64;
    let ready_now = pushed == ordinal + 1 && matches!(conn.slots.back(), Some(Slot::Ready(_)));
    if in_transaction && ready_now {
        if let Some(Slot::Ready(reply)) = conn.slots.back() {
            if reply.as_slice() == b"+QUEUED\r\n" {
                if let Some(name) = &name {
                    conn.intro.queued.push(name.clone());
                }
                what = What::Queued;
            }
        }
    }
    let argv = intro.slowlog_on().then(|| slowlog_argv(args));
    conn.intro.pending.push_back(Pending {
        ordinal,
        name,
        started: now,
        ready: ready_now.then(Instant::now),
        argv,
        what,
    });
}

/// The slot at `position` of `conn` has its reply now.
pub(super) fn ready(conn: &mut Conn, position: usize) {
    let ordinal = conn.intro.popped + position as u64;
    // Ordinals increase along the queue (a slot without a command has no entry).
    if let Ok(index) = conn
        .intro
        .pending
        .binary_search_by_key(&ordinal, |pending| pending.ordinal)
    {
        conn.intro.pending[index]
            .ready
            .get_or_insert_with(Instant::now);
    }
}

/// The reply at the front of `conn`'s slots leaves for the client: count its command, and
/// rewrite it if it is `INFO`'s. `others` are the gateway's other connections.
pub(super) fn reply_out(
    conn: &mut Conn,
    reply: Vec<u8>,
    intro: &mut Introspect,
    others: &[Option<Conn>],
    options: &GatewayOptions,
    counters: &GatewayCounters,
) -> Vec<u8> {
    let ordinal = conn.intro.popped;
    conn.intro.popped += 1;
    while conn
        .intro
        .pending
        .front()
        .is_some_and(|pending| pending.ordinal < ordinal)
    {
        conn.intro.pending.pop_front();
    }
    if conn
        .intro
        .pending
        .front()
        .is_none_or(|pending| pending.ordinal != ordinal)
    {
        // A slot without a command (a protocol error).
        return reply;
    }
    let Some(pending) = conn.intro.pending.pop_front() else {
        return reply;
    };
    let reply = match pending.what {
        What::Info => info_reply(conn, reply, intro, others, options, counters),
        _ => reply,
    };
    intro.account(pending, &reply, conn);
    reply
}

/// The gateway's facts for `INFO`.
fn facts(
    conn: &Conn,
    intro: &mut Introspect,
    others: &[Option<Conn>],
    options: &GatewayOptions,
    counters: &GatewayCounters,
) -> info_text::Facts {
    let all = || {
        std::iter::once(conn)
            .chain(others.iter().flatten())
            .filter(|conn| clients::is_listed(conn))
    };
    let connected = all().count();
    let max_input = all().map(|conn| conn.input.capacity()).max().unwrap_or(0);
    let max_output = all().map(|conn| conn.out.capacity()).max().unwrap_or(0);
    let watching = all().filter(|conn| conn.state.watched_count() > 0).count();
    let watched: usize = all().map(|conn| conn.state.watched_count()).sum();
    let number = |value: usize| value.to_string();
    info_text::Facts {
        clients: vec![
            ("connected_clients", number(connected)),
            ("maxclients", number(options.max_connections)),
            ("client_recent_max_input_buffer", number(max_input)),
            ("client_recent_max_output_buffer", number(max_output)),
            ("blocked_clients", "0".to_owned()),
            ("tracking_clients", "0".to_owned()),
            ("clients_in_timeout_table", "0".to_owned()),
            ("pubsub_clients", "0".to_owned()),
            ("watching_clients", number(watching)),
            ("total_watched_keys", number(watched)),
            ("total_blocking_keys", "0".to_owned()),
            ("total_blocking_keys_on_nokey", "0".to_owned()),
        ],
        stats: vec![
            (
                "total_connections_received",
                counters.connections_accepted.to_string(),
            ),
            ("total_commands_processed", intro.total_commands.to_string()),
            ("instantaneous_ops_per_sec", intro.ops_per_sec().to_string()),
            (
                "rejected_connections",
                counters.connections_refused.to_string(),
            ),
            ("total_error_replies", intro.total_error_replies.to_string()),
        ],
        commandstats: intro.commandstats(),
        errorstats: intro.errorstats(),
        latencystats: intro.latencystats(),
        record_db: 0,
        record_keys: 0,
        record_expires: 0,
    }
}

/// The adaptor's answer to `PMNET.INFO` (`[text, records' database, pmnet keys, pmnet keys
/// with a TTL]`) as the client's `INFO` reply.
fn info_reply(
    conn: &Conn,
    reply: Vec<u8>,
    intro: &mut Introspect,
    others: &[Option<Conn>],
    options: &GatewayOptions,
    counters: &GatewayCounters,
) -> Vec<u8> {
    if reply.first() == Some(&b'-') {
        return reply;
    }
    let limits = Limits {
        max_bulk_len: usize::MAX >> 1,
        ..Limits::default()
    };
    let parts = match parse_value(&reply, &limits) {
        Ok(Some((Value::Array(Some(items)), used))) if used == reply.len() => items,
        _ => return error_reply("ERR pmnet gateway: unexpected answer to INFO"),
    };
    let (Some(Value::Bulk(Some(text))), Some(Value::Integer(db)), Some(keys), Some(expires)) =
        (parts.first(), parts.get(1), parts.get(2), parts.get(3))
    else {
        return error_reply("ERR pmnet gateway: unexpected answer to INFO");
    };
    let count = |value: &Value| match value {
        Value::Integer(n) => u64::try_from(*n).unwrap_or(0),
        _ => 0,
    };
    let mut facts = facts(conn, intro, others, options, counters);
    facts.record_db = u32::try_from(*db).unwrap_or(u32::MAX);
    facts.record_keys = count(keys);
    facts.record_expires = count(expires);
    let text = info_text::rewrite(text, &facts);
    if conn.state.resp3 {
        let mut out = format!("={}\r\ntxt:", text.len() + 4).into_bytes();
        out.extend_from_slice(&text);
        out.extend_from_slice(b"\r\n");
        out
    } else {
        let mut out = Vec::with_capacity(text.len() + 16);
        encode_bulk(&text, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn commands_are_counted_under_redis_names() {
        let name = |words: &[&str]| stat_name(&args(words)).map(String::from);
        assert_eq!(name(&["GET", "k"]).as_deref(), Some("get"));
        assert_eq!(name(&["client", "LIST"]).as_deref(), Some("client|list"));
        assert_eq!(name(&["CLIENT"]).as_deref(), Some("client"));
        assert_eq!(name(&["Config", "get", "x"]).as_deref(), Some("config|get"));
        assert_eq!(name(&["SET", "LIST"]).as_deref(), Some("set"));
        assert_eq!(name(&["a b"]), None);
        assert_eq!(name(&[&"x".repeat(65)]), None);
        assert_eq!(name(&["get|x"]), None);
    }

    #[test]
    fn the_slow_log_trims_arguments_as_redis_does() {
        let long = "v".repeat(130);
        let argv = slowlog_argv(&args(&["SET", "k", &long]));
        assert_eq!(argv.len(), 3);
        assert_eq!(
            argv[2],
            format!("{}... (2 more bytes)", "v".repeat(128)).into_bytes()
        );
        let many: Vec<String> = (0..40).map(|i| i.to_string()).collect();
        let words: Vec<&str> = std::iter::once("RPUSH")
            .chain(many.iter().map(String::as_str))
            .collect();
        let argv = slowlog_argv(&args(&words));
        assert_eq!(argv.len(), 32);
        assert_eq!(argv[30], b"29");
        assert_eq!(argv[31], b"... (10 more arguments)");
        assert_eq!(
            slowlog_argv(&args(&["AUTH", "user", "secret"])),
            args(&["AUTH", "(redacted)", "(redacted)"])
        );
        assert_eq!(
            slowlog_argv(&args(&["HELLO", "3", "AUTH", "u", "p", "SETNAME", "n"])),
            args(&[
                "HELLO",
                "3",
                "AUTH",
                "(redacted)",
                "(redacted)",
                "SETNAME",
                "n"
            ])
        );
    }

    fn introspect(slower_than: i64, max_len: usize) -> Introspect {
        let mut options = GatewayOptions::new(
            "127.0.0.1:0".parse().unwrap(),
            "127.0.0.1:1".parse().unwrap(),
        );
        options.slowlog_log_slower_than = slower_than;
        options.slowlog_max_len = max_len;
        Introspect::new(&options)
    }

    #[test]
    fn command_stats_take_redis_format() {
        let mut intro = introspect(10_000, 128);
        intro.call("set", Duration::from_micros(30), false);
        intro.call("set", Duration::from_micros(10), false);
        intro.call("get", Duration::from_micros(5), true);
        intro.reject("get");
        assert_eq!(
            intro.commandstats(),
            [
                "cmdstat_get:calls=1,usec=5,usec_per_call=5.00,rejected_calls=1,failed_calls=1",
                "cmdstat_set:calls=2,usec=40,usec_per_call=20.00,rejected_calls=0,failed_calls=0",
            ]
        );
        let latency = intro.latencystats();
        assert_eq!(latency.len(), 2);
        assert!(
            latency[1].starts_with("latency_percentiles_usec_set:p50=10.0"),
            "{latency:?}"
        );
        assert!(latency[1].contains(",p99=30.") && latency[1].contains(",p99.9=30."));
        intro.error(b"-WRONGTYPE Operation\r\n");
        intro.error(b"-ERR x\r\n");
        intro.error(b"-ERR y\r\n");
        assert_eq!(
            intro.errorstats(),
            ["errorstat_ERR:count=2", "errorstat_WRONGTYPE:count=1"]
        );
        assert_eq!(intro.total_commands, 3);
        assert_eq!(intro.total_error_replies, 3);
    }

    #[test]
    fn names_and_error_codes_are_bounded() {
        let mut intro = introspect(10_000, 128);
        for index in 0..MAX_COMMAND_NAMES + 10 {
            intro.call(&format!("c{index}"), Duration::ZERO, false);
        }
        assert_eq!(intro.commands.len(), MAX_COMMAND_NAMES);
        for index in 0..MAX_ERROR_CODES + 10 {
            intro.error(format!("-E{index} x\r\n").as_bytes());
        }
        assert_eq!(intro.errors.len(), MAX_ERROR_CODES);
    }

    #[test]
    fn slowlog_commands_answer_as_redis() {
        let mut intro = introspect(0, 2);
        let reply = |intro: &mut Introspect, words: &[&str]| {
            String::from_utf8(intro.slowlog_command(&args(words))).unwrap()
        };
        assert_eq!(reply(&mut intro, &["SLOWLOG", "LEN"]), ":0\r\n");
        assert_eq!(reply(&mut intro, &["SLOWLOG", "GET"]), "*0\r\n");
        for (index, micros) in [5u64, 7, 9].iter().enumerate() {
            intro.slowlog.push_front(SlowEntry {
                id: index as u64,
                unix_seconds: 1_700_000_000,
                micros: *micros,
                argv: args(&["GET", "k"]),
                addr: "127.0.0.1:5".to_owned(),
                name: b"app".to_vec(),
            });
            intro.slowlog.truncate(intro.max_len);
        }
        assert_eq!(reply(&mut intro, &["slowlog", "len"]), ":2\r\n");
        assert_eq!(
            reply(&mut intro, &["SLOWLOG", "GET", "1"]),
            "*1\r\n*6\r\n:2\r\n:1700000000\r\n:9\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n\
             $11\r\n127.0.0.1:5\r\n$3\r\napp\r\n"
        );
        assert!(reply(&mut intro, &["SLOWLOG", "GET", "-1"]).starts_with("*2\r\n"));
        assert_eq!(
            reply(&mut intro, &["SLOWLOG", "GET", "-2"]),
            "-ERR count should be greater than or equal to -1\r\n"
        );
        assert_eq!(
            reply(&mut intro, &["SLOWLOG", "GET", "x"]),
            "-ERR count should be greater than or equal to -1\r\n"
        );
        assert_eq!(
            reply(&mut intro, &["SLOWLOG", "LEN", "x"]),
            "-ERR wrong number of arguments for 'slowlog|len' command\r\n"
        );
        assert_eq!(
            reply(&mut intro, &["SLOWLOG"]),
            "-ERR wrong number of arguments for 'slowlog' command\r\n"
        );
        assert_eq!(
            reply(&mut intro, &["SLOWLOG", "nope"]),
            "-ERR unknown subcommand 'nope'. Try SLOWLOG HELP.\r\n"
        );
        assert!(reply(&mut intro, &["SLOWLOG", "HELP"]).starts_with("*12\r\n+SLOWLOG <sub"));
        assert_eq!(reply(&mut intro, &["SLOWLOG", "RESET"]), "+OK\r\n");
        assert_eq!(reply(&mut intro, &["SLOWLOG", "LEN"]), ":0\r\n");
    }

    #[test]
    fn instantaneous_ops_come_from_samples() {
        let mut intro = introspect(10_000, 128);
        assert_eq!(intro.ops_per_sec(), 0);
        let start = Instant::now();
        intro.samples.clear();
        intro
            .samples
            .push_back((start - Duration::from_millis(3000), 0));
        intro
            .samples
            .push_back((start - Duration::from_millis(1650), 100));
        intro
            .samples
            .push_back((start - Duration::from_millis(1000), 300));
        intro.total_commands = 595;
        let ops = intro.ops_per_sec();
        // 495 commands in 1.65 s.
        assert!((290..=310).contains(&ops), "{ops}");
        assert_eq!(intro.samples.front().map(|s| s.1), Some(100));
    }

    #[test]
    fn rejections_and_unknown_commands_are_told_apart() {
        assert!(is_rejection(
            b"-ERR wrong number of arguments for 'get' command\r\n"
        ));
        assert!(is_rejection(
            b"-ERR blocking commands (BLPOP) are not supported through the pmnet gateway\r\n"
        ));
        assert!(!is_rejection(b"-WRONGTYPE Operation against a key\r\n"));
        assert!(is_unknown(b"-ERR unknown command 'NOPE', with args\r\n"));
        assert!(!is_unknown(b"-ERR syntax error\r\n"));
        assert_eq!(
            failed_entries(b"*3\r\n+OK\r\n-ERR x\r\n:1\r\n", 3),
            [false, true, false]
        );
        assert!(failed_entries(b"-EXECABORT\r\n", 1).is_empty());
    }
}
