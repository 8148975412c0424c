//! Direct connections: commands that need Redis's own connection semantics (blocking
//! commands, `WAIT`, pub/sub, `MONITOR`, client-side caching) or that are too large for a PMNet
//! request go to Redis on a TCP connection of the client connection's own, opened on demand
//! inside the gateway's event loop (docs/redis.md, "Direct connections").
//!
//! - **A barrier first.** A command goes direct only once every earlier command of the
//!   connection is applied at Redis: none is in flight, and if an update was acknowledged by
//!   the device since the last bypass reply, a bypass `PING` (a keyed barrier with a device
//!   cache) is sent and answered first — the adaptor applies a session in order, so its reply
//!   proves every earlier write applied. Later commands wait for the direct reply.
//! - **One-shot** (blocking commands, `WAIT`, `WAITAOF`, too-large commands and
//!   transactions): the command is sent, exactly one reply read (RESP3 pushes before it are
//!   passed on) and passed to the client in order; later commands take the PMNet path again.
//! - **Sticky** (`SUBSCRIBE`, `PSUBSCRIBE`, `SSUBSCRIBE`, `MONITOR`, `CLIENT TRACKING ON`):
//!   from then on every command of the client goes to Redis on its direct connection and
//!   every value Redis sends is passed on as it comes, until the client closes or sends
//!   `RESET` (then the direct connection is closed and the client is back on the PMNet path).
//!
//! The direct connection is set up to match the client's connection: `AUTH` (the gateway's
//! `--redis-password-file`), `HELLO 3` for a RESP3 client, `SELECT` of its database, `CLIENT
//! SETNAME` of its name; these set-up replies are checked and not passed on.

use std::net::SocketAddr;
use std::os::fd::RawFd;

use pmnet_runtime::Clock;

use crate::commands::{cache_use, CacheUse, Route};
use crate::resp::{encode_command, error_reply};

mod exec;
mod link;

pub(super) use exec::queue_exec;
use link::{open, pump, pump_out, Link};

use super::then::Then;
use super::{Conn, GatewayCounters, GatewayOptions, Slot};

/// How the gateway reaches the redis-server behind the adaptor (`--redis`).
#[derive(Debug, Clone)]
pub struct DirectOptions {
    pub redis: SocketAddr,
    /// `AUTH [user] password` for each direct connection (`--redis-password-file`).
    pub auth: Option<(Option<Vec<u8>>, Vec<u8>)>,
    /// Direct connections open at once at most (`--max-direct-connections`).
    pub max_connections: usize,
}

/// Words of a command above which it goes direct: the adaptor's scripts `unpack` a command's
/// words, and Redis's Lua takes at most 7 999 values (half of it, for a margin).
pub const DIRECT_ABOVE_WORDS: usize = 4096;
/// Bytes of one PMNet request at most (the PMNet client's `request_len_max`): a larger command
/// goes direct.
pub const PMNET_REQUEST_MAX: usize = 1 << 20;
/// Bytes of one value from Redis (a reply, a message) at most on a direct connection.
const MAX_VALUE: usize = 1 << 30;
/// Bytes written into a direct connection and not yet taken by Redis before the gateway stops
/// reading the client (sticky mode).
pub(super) const MAX_DIRECT_OUT: usize = 8 << 20;

/// How a command goes direct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One command, one reply; then back to the PMNet path.
    OneShot,
    /// Every later command too, and every value Redis sends passed on as it comes.
    Sticky,
}

/// What one value from Redis on a direct connection is.
#[derive(Debug)]
enum Expect {
    /// The reply to the gateway's own set-up command (`AUTH`, `HELLO`, `SELECT`, `CLIENT
    /// SETNAME`): an error fails the connection.
    Setup(&'static str),
    /// A reply not passed on (`+OK` to a transaction's `MULTI`, `+QUEUED`, `UNWATCH`).
    Drop,
    /// The client's reply.
    Client,
    /// The check of a transaction's watched keys: `:1` sends `then` (expecting `expects`);
    /// anything else answers the client as Redis answers a transaction a watched key aborted.
    Check { then: Vec<u8>, expects: Vec<Expect> },
}

/// A command waiting to go direct.
#[derive(Debug)]
pub(super) struct Pending {
    /// What is sent (the command, or a transaction's commands).
    bytes: Vec<u8>,
    expects: Vec<Expect>,
    mode: Mode,
    /// It may write: with a device cache, a barrier follows its reply.
    writes: bool,
    /// Sent; waiting for its reply.
    sent: bool,
    /// The command (sticky mode: how Redis answers it is counted).
    first: Vec<Vec<u8>>,
}

/// A client connection's direct side.
#[derive(Debug, Default)]
pub(super) struct DirectState {
    /// The gateway has `--redis`.
    enabled: bool,
    link: Option<Link>,
    /// Reads whose reply was too large for PMNet waiting among the slots to run direct, and
    /// whether the first of them is at Redis.
    reruns: usize,
    rerun_in_flight: bool,
    pending: Option<Pending>,
    /// The highest sequence number of an update started on the PMNet session, and the highest
    /// a reply proved applied at Redis (with every earlier one).
    last_update: u32,
    applied_through: u32,
    /// A barrier (bypass `PING`) is in flight, and why it failed if it did.
    barrier_in_flight: bool,
    barrier_failed: Option<String>,
    /// Every command goes direct (after SUBSCRIBE, MONITOR, CLIENT TRACKING ON).
    sticky: bool,
    /// `RESET` was sent on a sticky connection: nothing more goes until its `+RESET`.
    reset_sent: bool,
    /// Sticky with a device cache: commands sent that Redis has not answered yet (pushes
    /// excluded), and the position of the last that may write; a barrier follows its reply.
    sent_count: u64,
    answered_count: u64,
    write_at: Option<u64>,
    /// The connection subscribed, or monitors.
    subscribed: bool,
    monitor: bool,
}

impl DirectState {
    pub(super) fn new(enabled: bool) -> DirectState {
        DirectState {
            enabled,
            ..DirectState::default()
        }
    }

    /// Whether no further command of the client may start now.
    pub(super) fn holds(&self) -> bool {
        self.pending.is_some()
            || self.reruns > 0
            || self.reset_sent
            || self
                .link
                .as_ref()
                .is_some_and(|link| self.sticky && link.out.len() - link.out_sent > MAX_DIRECT_OUT)
    }

    pub(super) fn is_sticky(&self) -> bool {
        self.sticky
    }

    /// An update started on the PMNet session.
    pub(super) fn update_started(&mut self, seq: u32) {
        self.last_update = self.last_update.max(seq);
    }

    /// A request's reply came from Redis: it, and every earlier request, is applied.
    pub(super) fn applied(&mut self, seq: u32) {
        self.applied_through = self.applied_through.max(seq);
    }

    /// The barrier completed (`failure`: it did not).
    pub(super) fn barrier_done(&mut self, failure: Option<String>) {
        self.barrier_in_flight = false;
        if failure.is_some() {
            self.barrier_failed = failure;
        }
    }

    /// The descriptor of the direct connection and what to wait for on it.
    pub(super) fn interest(&self, output_room: bool) -> Option<(RawFd, bool, bool)> {
        let link = self.link.as_ref()?;
        let write = !link.connected || link.out_sent < link.out.len();
        let read = link.connected && output_room;
        (read || write).then_some((link.fd, read, write))
    }

    pub(super) fn set_readable(&mut self, readable: bool) {
        if let Some(link) = self.link.as_mut() {
            link.readable = readable;
        }
    }

    /// Whether no direct command waits or runs (a sticky connection's stream is idle).
    pub(super) fn is_idle(&self) -> bool {
        self.pending.is_none() && !self.reset_sent
    }

    /// Whether a direct connection is open (counted against `--max-direct-connections`).
    pub(super) fn is_open(&self) -> bool {
        self.link.is_some()
    }
}

/// Send this command direct (as `mode`) once every earlier one is applied.
pub(super) fn queue(conn: &mut Conn, args: &[Vec<u8>], mode: Mode) {
    let mut bytes = Vec::new();
    encode_command(args, &mut bytes);
    conn.direct.pending = Some(Pending {
        bytes,
        expects: vec![Expect::Client],
        mode,
        writes: may_write(args),
        sent: false,
        first: if mode == Mode::Sticky {
            args.to_vec()
        } else {
            Vec::new()
        },
    });
}

/// Whether `args` may change a key (a device's cache must then hear of it).
pub(super) fn may_write(args: &[Vec<u8>]) -> bool {
    const CONNECTION: &[&[u8]] = &[
        b"SUBSCRIBE",
        b"PSUBSCRIBE",
        b"SSUBSCRIBE",
        b"UNSUBSCRIBE",
        b"PUNSUBSCRIBE",
        b"SUNSUBSCRIBE",
        b"MONITOR",
        b"CLIENT",
        b"HELLO",
        b"AUTH",
        b"RESET",
        b"QUIT",
        b"SELECT",
        b"PUBSUB",
        b"WAIT",
        b"WAITAOF",
    ];
    let Some(name) = args.first() else {
        return false;
    };
    if CONNECTION
        .iter()
        .any(|known| known.eq_ignore_ascii_case(name))
    {
        return false;
    }
    !matches!(cache_use(args), CacheUse::Nothing | CacheUse::Read(_))
}

/// What goes to Redis instead of a write on a subscribed or monitoring connection when the
/// device caches: Redis answers it with an error, in order with the other replies (the
/// gateway cannot tell when such a connection's write is applied, to drop the cache then).
const WRITE_REFUSED: &[u8] = b"PMNET-DEVICE-CACHE:WRITE-ON-A-SUBSCRIBED-OR-MONITOR-CONNECTION";

/// A command of a client whose commands all go direct (sticky): sent at once.
pub(super) fn send_sticky(
    conn: &mut Conn,
    args: &[Vec<u8>],
    device_cache: bool,
    counters: &mut GatewayCounters,
) {
    counters.commands_direct += 1;
    let resp3 = conn.state.resp3;
    let direct = &mut conn.direct;
    let writes = device_cache && may_write(args);
    let refused = writes && !direct.countable(resp3);
    let Some(link) = direct.link.as_mut() else {
        return;
    };
    if refused {
        encode_command(&[WRITE_REFUSED], &mut link.out);
        direct.sent_count += 1;
        return;
    }
    encode_command(args, &mut link.out);
    direct.note_sent(args, resp3);
    if writes {
        direct.write_at = Some(direct.sent_count);
    }
}

impl DirectState {
    /// Whether the values Redis sends on this sticky connection can be counted as replies:
    /// not while it monitors, nor while subscribed in RESP2 (messages are arrays then).
    fn countable(&self, resp3: bool) -> bool {
        !self.monitor && (resp3 || !self.subscribed)
    }

    /// Count a command sent on a sticky connection by the replies (not pushes) it gets.
    fn note_sent(&mut self, args: &[Vec<u8>], resp3: bool) {
        let name = args.first().map(|name| name.to_ascii_uppercase());
        match name.as_deref() {
            Some(b"RESET") => {
                self.reset_sent = true;
                self.sent_count += 1;
            }
            Some(b"MONITOR") => {
                self.monitor = true;
                self.sent_count += 1;
            }
            Some(
                b"SUBSCRIBE" | b"PSUBSCRIBE" | b"SSUBSCRIBE" | b"UNSUBSCRIBE" | b"PUNSUBSCRIBE"
                | b"SUNSUBSCRIBE",
            ) => {
                self.subscribed = true;
                // In RESP3 their confirmations are pushes.
                if !resp3 {
                    self.sent_count += 1;
                }
            }
            _ => self.sent_count += 1,
        }
    }
}

/// What driving the direct side needs of the gateway.
pub(super) struct Ctx<'a> {
    pub options: &'a GatewayOptions,
    pub clock: &'a Clock,
    pub counters: &'a mut GatewayCounters,
    /// Direct connections open across the gateway.
    pub open: &'a mut usize,
}

/// Start what waits, move bytes both ways, pass replies on. Whether anything happened.
pub(super) fn drive(conn: &mut Conn, ctx: &mut Ctx<'_>) -> bool {
    let mut busy = false;
    busy |= start_pending(conn, ctx);
    if conn.direct.link.is_none() {
        return busy;
    }
    if let Err(why) = pump(conn) {
        fail(conn, ctx, &why);
        return true;
    }
    match take_values(conn, ctx) {
        Ok(progressed) => busy |= progressed,
        Err(why) => {
            fail(conn, ctx, &why);
            return true;
        }
    }
    if let Err(why) = pump_out(conn) {
        fail(conn, ctx, &why);
        return true;
    }
    if conn.direct.link.as_ref().is_some_and(|link| link.eof) {
        fail(conn, ctx, "Redis closed the connection");
        return true;
    }
    busy
}

/// The slot for a read whose reply (`reply`) is the adaptor's "too large for PMNet" (`None`
/// for any other reply): run it again direct, in its place, when the gateway has `--redis`
/// and no later command of the connection that may write has started (the read would see its
/// effect); else an error saying why it cannot be answered.
pub(super) fn rerun_slot(
    conn: &mut Conn,
    position: usize,
    args: &[Vec<u8>],
    reply: &[u8],
) -> Option<Slot> {
    if !reply.starts_with(crate::adaptor::REPLY_TOO_LARGE) {
        return None;
    }
    let size = String::from_utf8_lossy(&reply[crate::adaptor::REPLY_TOO_LARGE.len()..])
        .trim()
        .to_owned();
    if !conn.direct.enabled {
        return Some(Slot::Ready(error_reply(&format!(
            "ERR pmnet: the reply ({size} bytes) is larger than one PMNet reply carries \
             ({} bytes); a gateway started with --redis reads it from Redis directly",
            crate::adaptor::REPLY_MAX
        ))));
    }
    Some(rerun_or_refuse(conn, position, &size, vec![args.to_vec()]))
}

/// The slot for a transaction of reads only (`commands`) whose reply (`reply`) was too large
/// for PMNet (`None` for any other reply, or a transaction that may write): run it again,
/// whole (`MULTI`, its commands, `EXEC`), on the direct connection, as [`rerun_slot`] does a
/// read. It changed nothing, so running it again is as if it ran then.
pub(super) fn rerun_exec_slot(
    conn: &mut Conn,
    position: usize,
    commands: &[Vec<Vec<u8>>],
    reply: &[u8],
) -> Option<Slot> {
    let prefix = crate::adaptor::APPLIED_REPLY_TOO_LARGE.as_bytes();
    if !reply.starts_with(prefix) || commands.iter().any(|command| may_write(command)) {
        return None;
    }
    let size = String::from_utf8_lossy(&reply[prefix.len()..])
        .split(' ')
        .next()
        .unwrap_or("")
        .to_owned();
    if !conn.direct.enabled {
        return Some(Slot::Ready(error_reply(&format!(
            "ERR pmnet: the transaction's reply ({size} bytes) is larger than one PMNet reply \
             carries ({} bytes); a gateway started with --redis reads it from Redis directly",
            crate::adaptor::REPLY_MAX
        ))));
    }
    let mut sequence = vec![vec![b"MULTI".to_vec()]];
    sequence.extend(commands.iter().cloned());
    sequence.push(vec![b"EXEC".to_vec()]);
    Some(rerun_or_refuse(conn, position, &size, sequence))
}

/// Run `sequence` again direct in the slot at `position`, unless a later command of the
/// connection that may write has started (the reads would see its effect).
fn rerun_or_refuse(
    conn: &mut Conn,
    position: usize,
    size: &str,
    sequence: Vec<Vec<Vec<u8>>>,
) -> Slot {
    let later_write = conn.slots.iter().skip(position + 1).any(|slot| match slot {
        Slot::Ready(_) | Slot::Reading { .. } | Slot::Direct(_) => false,
        Slot::Waiting { then, .. } => match then {
            Then::Plain(Some(args)) => may_write(args),
            Then::Watch(_) | Then::Select(_) | Then::Barrier => false,
            Then::Plain(None) | Then::Exec(..) | Then::Touching { .. } => true,
        },
    });
    if later_write {
        return Slot::Ready(error_reply(&format!(
            "ERR pmnet: the reply ({size} bytes) is larger than one PMNet reply carries, and a \
             later command of this connection that may write had already started: send the \
             read again to have it read from Redis directly"
        )));
    }
    conn.direct.reruns += 1;
    Slot::Direct(sequence)
}

/// Open the direct connection if it is not: `Err(reply)` to answer instead.
fn ensure_link(conn: &mut Conn, ctx: &mut Ctx<'_>) -> Result<(), Vec<u8>> {
    if conn.direct.link.is_some() {
        return Ok(());
    }
    let Some(direct) = ctx.options.direct.as_ref() else {
        return Err(error_reply(&format!("ERR {NEEDS_REDIS}")));
    };
    if *ctx.open >= direct.max_connections {
        ctx.counters.direct_refused += 1;
        return Err(error_reply("ERR max number of clients reached"));
    }
    match open(direct) {
        Ok(link) => {
            *ctx.open += 1;
            ctx.counters.direct_opened += 1;
            conn.direct.link = Some(link);
            Ok(())
        }
        Err(error) => Err(error_reply(&format!(
            "ERR pmnet gateway: cannot connect to Redis at {}: {error}",
            direct.redis
        ))),
    }
}

/// Send the read at the front of the slots again on the direct connection.
fn start_rerun(conn: &mut Conn, ctx: &mut Ctx<'_>) -> bool {
    let Some(Slot::Direct(sequence)) = conn.slots.front() else {
        return false;
    };
    if conn.direct.rerun_in_flight {
        return false;
    }
    let sequence = sequence.clone();
    if let Err(reply) = ensure_link(conn, ctx) {
        ctx.counters.commands_rejected += 1;
        conn.direct.reruns = conn.direct.reruns.saturating_sub(1);
        conn.slots[0] = Slot::Ready(reply);
        return true;
    }
    let (resp3, db, name) = (conn.state.resp3, conn.state.db, conn.state.name.clone());
    let Some(link) = conn.direct.link.as_mut() else {
        return false;
    };
    link.set_up(resp3, db, name);
    for (index, args) in sequence.iter().enumerate() {
        encode_command(args, &mut link.out);
        link.expect.push_back(if index + 1 == sequence.len() {
            Expect::Client
        } else {
            Expect::Drop
        });
    }
    conn.direct.rerun_in_flight = true;
    ctx.counters.commands_direct += 1;
    true
}

/// Start the barrier, open the connection, or send the pending command, as far as it can.
fn start_pending(conn: &mut Conn, ctx: &mut Ctx<'_>) -> bool {
    if start_rerun(conn, ctx) {
        return true;
    }
    let Some(pending) = conn.direct.pending.as_ref() else {
        return false;
    };
    if pending.sent || !conn.slots.is_empty() || conn.direct.barrier_in_flight {
        return false;
    }
    if let Some(why) = conn.direct.barrier_failed.take() {
        conn.direct.pending = None;
        ctx.counters.commands_rejected += 1;
        conn.slots.push_back(Slot::Ready(error_reply(&format!(
            "ERR pmnet: {why}; the command was not sent"
        ))));
        return true;
    }
    if conn.direct.last_update > conn.direct.applied_through {
        start_barrier(conn, ctx);
        return true;
    }
    if let Err(reply) = ensure_link(conn, ctx) {
        conn.direct.pending = None;
        ctx.counters.commands_rejected += 1;
        conn.slots.push_back(Slot::Ready(reply));
        return true;
    }
    let resp3 = conn.state.resp3;
    let db = conn.state.db;
    let name = conn.state.name.clone();
    let Some(link) = conn.direct.link.as_mut() else {
        return false;
    };
    let Some(pending) = conn.direct.pending.as_mut() else {
        return false;
    };
    link.set_up(resp3, db, name);
    link.out.extend_from_slice(&pending.bytes);
    pending.bytes = Vec::new();
    pending.sent = true;
    ctx.counters.commands_direct += 1;
    if pending.mode == Mode::OneShot {
        link.expect.extend(pending.expects.drain(..));
        return true;
    }
    // Sticky: every value after the set-up replies (and a transaction's dropped ones) goes
    // to the client as it comes.
    link.expect.extend(
        pending
            .expects
            .drain(..)
            .filter(|expect| !matches!(expect, Expect::Client)),
    );
    let first = std::mem::take(&mut pending.first);
    conn.direct.pending = None;
    conn.direct.sticky = true;
    conn.direct.sent_count = 0;
    conn.direct.answered_count = 0;
    conn.direct.note_sent(&first, resp3);
    ctx.counters.direct_sticky += 1;
    true
}

/// A bypass `PING` on the session (a keyed barrier with a device cache): its reply proves
/// every earlier request of the session applied at Redis.
fn start_barrier(conn: &mut Conn, ctx: &mut Ctx<'_>) {
    let payload = crate::resp::command_bytes(&["PING"]);
    let now = ctx.clock.now();
    let started = if ctx.options.device_cache {
        conn.client.keyed_bypass(now, b"", &payload)
    } else {
        conn.client.bypass(now, &payload)
    };
    match started {
        Ok(seq) => {
            ctx.counters.direct_barriers += 1;
            conn.last_started = conn.last_started.max(seq);
            conn.direct.barrier_in_flight = true;
            conn.slots.push_back(Slot::Waiting {
                seq,
                ack: None,
                then: Then::Barrier,
            });
        }
        Err(error) => conn.direct.barrier_failed = Some(error.to_string()),
    }
}

/// Take the complete values Redis sent: check set-up replies, pass the client's on.
fn take_values(conn: &mut Conn, ctx: &mut Ctx<'_>) -> Result<bool, String> {
    let mut consumed = 0;
    let mut busy = false;
    let mut reset_done = false;
    let mut one_shot_done = false;
    let mut rerun_done = false;
    let mut sticky_answered = 0u64;
    {
        let Some(link) = conn.direct.link.as_mut() else {
            return Ok(false);
        };
        loop {
            let rest = &link.input[consumed..];
            let Some(end) = link
                .scan
                .next(rest, MAX_VALUE)
                .map_err(|error| format!("Redis sent {error}"))?
            else {
                break;
            };
            let kind = rest.first().copied().unwrap_or(b'+');
            let value = &link.input[consumed..consumed + end];
            consumed += end;
            busy = true;
            if kind == b'>' {
                // A RESP3 push (a message, an invalidation): the client's, whenever it comes.
                if !conn.broken {
                    conn.out.extend_from_slice(value);
                }
                continue;
            }
            match link.expect.pop_front() {
                Some(Expect::Setup(what)) => {
                    if kind == b'-' {
                        return Err(format!(
                            "{what} failed: {}",
                            String::from_utf8_lossy(&value[1..value.len().saturating_sub(2)])
                        ));
                    }
                }
                Some(Expect::Drop) => {}
                Some(Expect::Check { then, expects }) => {
                    if kind == b'-' {
                        // The check could not run: Redis's error is the transaction's reply.
                        encode_command(&[b"UNWATCH".as_slice()], &mut link.out);
                        link.expect.push_back(Expect::Drop);
                        if !conn.broken {
                            conn.out.extend_from_slice(value);
                        }
                        one_shot_done = true;
                    } else if value == b":1\r\n" {
                        link.out.extend_from_slice(&then);
                        link.expect.extend(expects);
                    } else {
                        // A watched key changed: no transaction, as Redis answers then.
                        encode_command(&[b"UNWATCH".as_slice()], &mut link.out);
                        link.expect.push_back(Expect::Drop);
                        if !conn.broken {
                            conn.out.extend_from_slice(if link.resp3 {
                                b"_\r\n"
                            } else {
                                b"*-1\r\n"
                            });
                        }
                        one_shot_done = true;
                    }
                }
                Some(Expect::Client) => {
                    if !conn.broken {
                        conn.out.extend_from_slice(value);
                    }
                    if conn.direct.rerun_in_flight {
                        rerun_done = true;
                    } else if link.expect.is_empty() && !conn.direct.sticky {
                        one_shot_done = true;
                    }
                    sticky_answered += 1;
                }
                None if conn.direct.sticky => {
                    if !conn.broken {
                        conn.out.extend_from_slice(value);
                    }
                    sticky_answered += 1;
                    if conn.direct.reset_sent && value == b"+RESET\r\n" {
                        reset_done = true;
                        break;
                    }
                }
                None => return Err("Redis sent a reply nobody asked for".to_owned()),
            }
        }
        link.input.drain(..consumed);
    }
    if sticky_answered > 0 && conn.direct.sticky {
        conn.direct.answered_count += sticky_answered;
        if ctx.options.device_cache
            && conn
                .direct
                .write_at
                .is_some_and(|at| conn.direct.answered_count >= at)
            && !conn.direct.barrier_in_flight
        {
            // The write is applied at Redis: a barrier drops what the device's cache holds.
            conn.direct.write_at = None;
            start_barrier(conn, ctx);
        }
    }
    if rerun_done {
        conn.direct.rerun_in_flight = false;
        conn.direct.reruns = conn.direct.reruns.saturating_sub(1);
        if matches!(conn.slots.front(), Some(Slot::Direct(_))) {
            conn.slots.pop_front();
        }
    }
    if one_shot_done {
        let writes = conn
            .direct
            .pending
            .take()
            .is_some_and(|pending| pending.writes);
        if writes && ctx.options.device_cache {
            start_barrier(conn, ctx);
        }
    }
    if reset_done {
        close(conn, ctx);
        conn.direct.sticky = false;
        conn.direct.reset_sent = false;
        conn.direct.subscribed = false;
        conn.direct.monitor = false;
        conn.direct.write_at = None;
        // The client is back with a fresh connection's state, as Redis's RESET leaves it.
        let _ = conn
            .state
            .handle("RESET", &[b"RESET".to_vec()], &ctx.options.auth);
        if ctx.options.auth.password.is_some() {
            // Redis's RESET does not log the client out of the gateway's own password: the
            // direct connection was authenticated, so keep it so.
            conn.state.authenticated = true;
        }
    }
    Ok(busy)
}

fn close(conn: &mut Conn, ctx: &mut Ctx<'_>) {
    if conn.direct.link.take().is_some() {
        *ctx.open = ctx.open.saturating_sub(1);
        ctx.counters.direct_closed += 1;
    }
}

/// The direct connection failed (or Redis closed it, as it does after `QUIT`).
fn fail(conn: &mut Conn, ctx: &mut Ctx<'_>, why: &str) {
    let redis = ctx
        .options
        .direct
        .as_ref()
        .map(|direct| direct.redis.to_string())
        .unwrap_or_default();
    close(conn, ctx);
    if conn.direct.rerun_in_flight {
        conn.direct.rerun_in_flight = false;
        conn.direct.reruns = conn.direct.reruns.saturating_sub(1);
        if matches!(conn.slots.front(), Some(Slot::Direct(_))) {
            conn.slots[0] = Slot::Ready(error_reply(&format!(
                "ERR pmnet gateway: the connection to Redis at {redis} failed ({why})"
            )));
        }
    }
    let waiting = conn.direct.pending.take();
    if conn.direct.sticky {
        // The client's connection to Redis, as it sees it, is gone: close it (after what was
        // passed on already).
        tracing::debug!("direct connection to Redis at {redis} ended: {why}");
        conn.direct.sticky = false;
        conn.closing = true;
        conn.read_closed = true;
        return;
    }
    let Some(pending) = waiting else {
        return;
    };
    ctx.counters.direct_failed += 1;
    let message = if pending.sent {
        conn.closing = true;
        format!(
            "ERR pmnet gateway: the connection to Redis at {redis} failed ({why}); the command \
             may or may not have been applied"
        )
    } else {
        format!("ERR pmnet gateway: no connection to Redis at {redis} ({why})")
    };
    if !conn.broken {
        conn.out.extend_from_slice(&error_reply(&message));
    }
}

/// Why a command that goes direct is refused by a gateway started without `--redis`.
pub(super) const NEEDS_REDIS: &str = "needs the pmnet gateway started with --redis ADDR (the \
                                      redis-server behind the adaptor; pmnet redis-up passes \
                                      it): it is sent to Redis on a connection of its own";

/// Where `CLIENT TRACKING`, `CACHING` and `TRACKINGINFO` go: direct (`TRACKING ON`: for
/// good); every other command keeps `route`.
pub(super) fn client_route(args: &[Vec<u8>], route: Route) -> Route {
    if route != Route::Connection("CLIENT") {
        return route;
    }
    let sub = args.get(1).map(|sub| sub.to_ascii_uppercase());
    match sub.as_deref() {
        Some(b"TRACKING") => Route::Direct {
            sticky: args.get(2).is_some_and(|on| on.eq_ignore_ascii_case(b"ON")),
        },
        Some(b"CACHING" | b"TRACKINGINFO") => Route::Direct { sticky: false },
        _ => route,
    }
}

/// Bytes of `args` encoded as a command.
pub(super) fn encoded_len(args: &[Vec<u8>]) -> usize {
    let digits = |n: usize| n.checked_ilog10().unwrap_or(0) as usize + 1;
    args.iter()
        .map(|arg| arg.len() + digits(arg.len()) + 5)
        .fold(digits(args.len()) + 3, usize::saturating_add)
}

/// Whether `args` (with its PMNet payload of `payload_len` bytes) is too large for a PMNet
/// request or for the adaptor's scripts.
pub(super) fn too_large(args: &[Vec<u8>], payload_len: usize) -> bool {
    args.len() > DIRECT_ABOVE_WORDS || payload_len > PMNET_REQUEST_MAX
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_over_the_pmnet_limits_are_too_large() {
        let small = vec![b"SET".to_vec(), b"k".to_vec(), b"v".to_vec()];
        assert!(!too_large(&small, 30));
        assert!(too_large(&small, PMNET_REQUEST_MAX + 1));
        let many = vec![b"x".to_vec(); DIRECT_ABOVE_WORDS + 1];
        assert!(too_large(&many, 100));
        for args in [small, many, vec![vec![7u8; 12_345]; 3]] {
            assert_eq!(encoded_len(&args), crate::resp::command_bytes(&args).len());
        }
    }
}
