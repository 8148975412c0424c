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
//!   ([`super::clients`]); `SLOWLOG` from its slow log ([`super::slowlog`]).
//!
//! The hooks: [`start`] for every parsed command, [`ready`] when a waiting reply completes,
//! [`reply_out`] when a reply leaves for the client.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use crate::commands::Route;
use crate::resp::{encode_bulk, error_reply, parse_value, Limits, Value};

use super::slowlog::{self, SlowLog};
use super::{clients, info_text, Conn, GatewayCounters, GatewayOptions, Slot};

/// Distinct command names counted at most (Redis's table has about 400 with subcommands).
const MAX_COMMAND_NAMES: usize = 1024;
/// Distinct error codes counted at most (as Redis).
const MAX_ERROR_CODES: usize = 128;
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

/// A command's name as it is counted (shared by the connection's `cmd` and its entry).
type Name = std::sync::Arc<str>;

/// What became of a command, for counting it when its reply leaves.
#[derive(Debug)]
enum What {
    Plain,
    /// Queued in a transaction (`+QUEUED`): counted when `EXEC` runs it.
    Queued,
    /// `EXEC` of these queued commands.
    Exec(Vec<Name>),
    /// `INFO`, sent as `PMNET.INFO`: its reply is rewritten.
    Info,
}

/// A command whose reply has not left yet.
#[derive(Debug)]
struct Pending {
    /// The number of its slot among every slot of the connection.
    ordinal: u64,
    name: Option<Name>,
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
    pub(super) last_name: Option<Name>,
    /// The most input buffered when a command was parsed (`rbp`).
    pub(super) peak_input: usize,
    /// The bytes of the command being started (`argv-mem`), 0 between commands.
    pub(super) argv_mem: usize,
    /// The names of the commands queued in the transaction being queued.
    queued: Vec<Name>,
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

/// The gateway's own statistics and slow log.
#[derive(Debug)]
pub(super) struct Introspect {
    slowlog: SlowLog,
    commands: HashMap<Box<str>, CommandStat>,
    errors: HashMap<Box<str>, u64>,
    total_commands: u64,
    total_error_replies: u64,
    /// (when, total_commands), 100 ms apart or more: those of the last 1.6 s and the newest
    /// one before.
    samples: VecDeque<(Instant, u64)>,
}

impl Introspect {
    pub(super) fn new(options: &GatewayOptions) -> Introspect {
        Introspect {
            slowlog: SlowLog::new(options.slowlog_log_slower_than, options.slowlog_max_len),
            commands: HashMap::new(),
            errors: HashMap::new(),
            total_commands: 0,
            total_error_replies: 0,
            samples: VecDeque::new(),
        }
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
            self.slowlog.log(argv, elapsed, conn);
        }
        self.sample(now);
    }
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
fn stat_name(args: &[Vec<u8>]) -> Option<Name> {
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
            return Some(format!("{name}|{sub}").into());
        }
    }
    Some(name.into())
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
    others: &mut [Option<Box<Conn>>],
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
    let is = |word: &[u8]| args[0].eq_ignore_ascii_case(word);
    if (is(b"MULTI") && !in_transaction) || is(b"DISCARD") || is(b"RESET") {
        conn.intro.queued.clear();
    } else if is(b"EXEC") {
        what = What::Exec(std::mem::take(&mut conn.intro.queued));
    }
    let answered_here = conn.state.authenticated;
    match intercept(args) {
        Intercept::Client if answered_here && !in_transaction => {
            let reply = clients::client_command(conn, args, others);
            conn.slots.push_back(Slot::Ready(reply));
        }
        Intercept::Slowlog if answered_here && !in_transaction => {
            let reply = intro.slowlog.command(args);
            conn.slots.push_back(Slot::Ready(reply));
        }
        Intercept::Slowlog | Intercept::Info if answered_here && in_transaction => {
            let refusal = error_reply(&format!(
                "ERR {} inside MULTI is not supported through the pmnet gateway",
                String::from_utf8_lossy(&args[0]).to_ascii_uppercase()
            ));
            let reply = conn.state.queue(args, &Route::Reply(refusal), None);
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
    let argv = intro.slowlog.on().then(|| slowlog::argv(args));
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
    others: &[Option<Box<Conn>>],
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
    others: &[Option<Box<Conn>>],
    options: &GatewayOptions,
    counters: &GatewayCounters,
) -> info_text::Facts {
    let all = || {
        std::iter::once(conn)
            .chain(others.iter().flatten().map(|other| &**other))
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
    others: &[Option<Box<Conn>>],
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
        let name = |words: &[&str]| stat_name(&args(words)).map(|name| name.to_string());
        assert_eq!(name(&["GET", "k"]).as_deref(), Some("get"));
        assert_eq!(name(&["client", "LIST"]).as_deref(), Some("client|list"));
        assert_eq!(name(&["CLIENT"]).as_deref(), Some("client"));
        assert_eq!(name(&["Config", "get", "x"]).as_deref(), Some("config|get"));
        assert_eq!(name(&["SET", "LIST"]).as_deref(), Some("set"));
        assert_eq!(name(&["a b"]), None);
        assert_eq!(name(&[&"x".repeat(65)]), None);
        assert_eq!(name(&["get|x"]), None);
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
