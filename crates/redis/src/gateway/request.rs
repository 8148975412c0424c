//! Starting a client's command (answered here, queued in a transaction, or sent as a PMNet
//! update or bypass request) and turning its completion into the reply the client reads, in
//! the protocol version the client asked for.

use pmnet_proto::{ClientError, ClientEvent, Completion};
use pmnet_runtime::Clock;

use crate::commands::{cache_use, route, CacheUse, Route, OK};
use crate::resp::{error_reply, parse_value, Limits};

use super::connection::Action;
use super::direct::{self, Mode};
use super::health::{DownPart, Health};
use super::then::{ChangeShown, Then};
use super::{Conn, GatewayCounters, GatewayOptions, Slot};

/// Commands a client that has not authenticated may send.
fn allowed_before_auth(route: &Route) -> bool {
    matches!(
        route,
        Route::Connection("AUTH" | "HELLO" | "RESET") | Route::Quit
    )
}

/// Commands that act on a transaction being queued rather than being queued.
fn acts_on_transaction(route: &Route) -> bool {
    matches!(
        route,
        Route::Connection("EXEC" | "DISCARD" | "MULTI" | "WATCH" | "RESET") | Route::Quit
    )
}

pub(super) fn start_command(
    conn: &mut Conn,
    args: &[Vec<u8>],
    options: &GatewayOptions,
    clock: &Clock,
    counters: &mut GatewayCounters,
    down: Option<(DownPart, &str)>,
    table: Option<&crate::table::CommandTable>,
) {
    if conn.direct.is_sticky() {
        // Every command of a subscribed, monitoring or tracking client goes to Redis.
        direct::send_sticky(conn, args, options.device_cache, counters);
        return;
    }
    let route = direct::client_route(args, route(args, &options.policy));
    tracing::trace!(
        session = conn.client.session_id(),
        command = %String::from_utf8_lossy(&args[0]),
        route = ?route,
        "command routed"
    );
    if !conn.state.authenticated && !allowed_before_auth(&route) {
        counters.commands_rejected += 1;
        conn.slots
            .push_back(Slot::Ready(error_reply("NOAUTH Authentication required.")));
        return;
    }
    if args.len() > 1 && args[0].eq_ignore_ascii_case(b"EXEC") {
        // Redis rejects an EXEC of the wrong arity as an aborted EXEC: the transaction (if
        // any) and the watched keys are discarded.
        conn.state.abort_exec();
        counters.commands_rejected += 1;
        conn.slots.push_back(Slot::Ready(error_reply(
            "EXECABORT Transaction discarded because of: wrong number of arguments for 'exec' \
             command",
        )));
        return;
    }
    if conn.state.in_transaction() && !acts_on_transaction(&route) {
        let reply = conn.state.queue(args, &route, table);
        if reply.first() == Some(&b'-') {
            counters.commands_rejected += 1;
        } else {
            counters.commands_local += 1;
        }
        conn.slots.push_back(Slot::Ready(reply));
        return;
    }
    // The device's cache holds database 0's keys only.
    let db = conn.state.db;
    // The path behind is down: what needs it gets an error naming the missing part, and is
    // not sent (so never applied). Updates need only the device, which logs them.
    if let Some((part, why)) = down {
        let needs_path = match &route {
            Route::Bypass | Route::Direct { .. } => true,
            Route::Update { .. } => part == DownPart::Device,
            Route::Connection(name) => matches!(*name, "WATCH" | "EXEC" | "SELECT"),
            Route::Reply(_) | Route::Quit => false,
        };
        if needs_path {
            counters.commands_refused_down += 1;
            conn.slots.push_back(Slot::Ready(error_reply(&format!(
                "ERR pmnet: {why}; the command was not sent"
            ))));
            return;
        }
    }
    if options.device_cache && db == 0 && matches!(route, Route::Bypass) {
        if let CacheUse::Read(key) = cache_use(args) {
            let payload = crate::resp::command_bytes(args);
            match conn.client.cache_read(clock.now(), key, &payload) {
                Ok(id) => {
                    counters.commands_cache_read += 1;
                    conn.slots.push_back(Slot::Reading {
                        id,
                        args: Some(args.to_vec()),
                    });
                }
                Err(error) => {
                    counters.commands_rejected += 1;
                    conn.slots
                        .push_back(Slot::Ready(error_reply(&format!("ERR pmnet: {error}"))));
                }
            }
            return;
        }
    }
    // A write of its own to a watched key fails the next EXEC (connection.rs): an update at
    // once (Redis cannot refuse it), a bypass once Redis answered it without an error (the
    // connection starts nothing more meanwhile), a direct command at once.
    let touches = matches!(
        route,
        Route::Update { .. } | Route::Bypass | Route::Direct { .. }
    ) && conn.state.may_touch_watched(args, table);
    if touches && !matches!(route, Route::Bypass) {
        conn.state.touch_watched();
    }
    // With a device cache, every write reaches it keyed (or as a barrier): see
    // `commands::cache_use`.
    let mut shape = match (options.device_cache, cache_use(args)) {
        (false, _) => CacheUse::Nothing,
        (true, shape) if db == 0 => shape,
        // Another database's write of `key` may only invalidate database 0's `key` (never
        // tell the cache what database 0's `key` now holds); its reads are not the cache's.
        (true, CacheUse::Write { key, .. }) => CacheUse::Write {
            key,
            reply_after: None,
        },
        (true, CacheUse::Read(_)) => CacheUse::Nothing,
        (true, shape) => shape,
    };
    let (ack, update, payload, then) = match route {
        Route::Direct { sticky } => {
            let mode = if sticky { Mode::Sticky } else { Mode::OneShot };
            go_direct(conn, args, mode, options, counters);
            return;
        }
        Route::Reply(bytes) => {
            if bytes.first() == Some(&b'-') {
                counters.commands_rejected += 1;
            } else {
                counters.commands_local += 1;
            }
            conn.slots.push_back(Slot::Ready(bytes));
            return;
        }
        Route::Quit => {
            counters.commands_local += 1;
            conn.slots.push_back(Slot::Ready(OK.to_vec()));
            conn.closing = true;
            return;
        }
        Route::Connection(name) => match conn.state.handle(name, args, &options.auth) {
            Action::Reply(bytes) => {
                if bytes.first() == Some(&b'-') {
                    counters.commands_rejected += 1;
                } else {
                    counters.commands_local += 1;
                }
                conn.slots.push_back(Slot::Ready(bytes));
                return;
            }
            Action::Watch { payload, keys } => {
                shape = CacheUse::Nothing;
                (None, false, payload, Then::Watch(keys))
            }
            Action::Exec {
                payload,
                commands,
                after,
            } => {
                if exec_goes_direct(&payload, &commands, options) {
                    if options.direct.is_some() {
                        direct::queue_exec(conn, &payload, &commands);
                    } else {
                        counters.commands_rejected += 1;
                        conn.slots.push_back(Slot::Ready(error_reply(&format!(
                            "EXECABORT Transaction discarded: {}",
                            direct::NEEDS_REDIS
                        ))));
                    }
                    return;
                }
                if options.device_cache {
                    shape = CacheUse::Barrier;
                }
                (None, false, payload, Then::Exec(commands, after))
            }
            Action::Select { payload, db } => {
                shape = CacheUse::Nothing;
                (None, false, payload, Then::Select(db))
            }
        },
        Route::Update { .. } | Route::Bypass
            if direct::too_large(args, direct::encoded_len(args)) =>
        {
            // Too large for a PMNet request or the adaptor's scripts: Redis's own reply.
            go_direct(conn, args, Mode::OneShot, options, counters);
            return;
        }
        Route::Update { ack } => (
            Some(ack),
            true,
            crate::resp::command_bytes(args),
            Then::Plain(None),
        ),
        Route::Bypass => (
            None,
            false,
            crate::resp::command_bytes(args),
            // Kept for a RESP3 client (its reply's shape), and for a read (run again direct if
            // its reply is too large for PMNet).
            if touches {
                Then::Touching {
                    args: (conn.state.resp3).then(|| args.to_vec()),
                    shown: ChangeShown::of(args),
                }
            } else {
                Then::Plain((conn.state.resp3 || !direct::may_write(args)).then(|| args.to_vec()))
            },
        ),
    };
    let payload = if db == 0 {
        payload
    } else {
        in_database(db, &payload)
    };
    let now = clock.now();
    let started = match (shape, update) {
        (CacheUse::Write { key, reply_after }, true) => {
            conn.client
                .keyed_update(now, key, reply_after.as_deref(), &payload)
        }
        (CacheUse::Write { key, .. }, false) => conn.client.keyed_bypass(now, key, &payload),
        (CacheUse::Barrier, true) => conn.client.keyed_update(now, b"", None, &payload),
        (CacheUse::Barrier, false) => conn.client.keyed_bypass(now, b"", &payload),
        (_, true) => conn.client.update(now, &payload),
        (_, false) => conn.client.bypass(now, &payload),
    };
    match started {
        Ok(seq) => {
            if update {
                counters.commands_update += 1;
            } else {
                counters.commands_bypass += 1;
            }
            let waits = match &then {
                Then::Watch(_) | Then::Select(_) | Then::Touching { .. } => true,
                Then::Exec(_, after) => after.changes_connection(),
                Then::Plain(_) | Then::Barrier => false,
            };
            if waits {
                conn.watches_in_flight += 1;
            }
            if update {
                conn.direct.update_started(seq);
            }
            conn.last_started = conn.last_started.max(seq);
            conn.slots.push_back(Slot::Waiting { seq, ack, then });
        }
        Err(error) => {
            counters.commands_rejected += 1;
            let message = match error {
                ClientError::TooLarge => {
                    "ERR command too large for a PMNet request (at most 1 MiB)".to_owned()
                }
                ClientError::SessionExhausted => {
                    conn.closing = true;
                    "ERR this connection used every PMNet sequence number; reconnect".to_owned()
                }
                other => format!("ERR pmnet: {other}"),
            };
            conn.slots.push_back(Slot::Ready(error_reply(&message)));
        }
    }
}

/// Fill the slot of a completed or failed request.
pub(super) fn complete(
    conn: &mut Conn,
    event: ClientEvent,
    limits: &Limits,
    counters: &mut GatewayCounters,
    mut health: Option<&mut Health>,
) {
    let (seq, bytes) = match event {
        ClientEvent::Completed {
            seq, completion, ..
        } => {
            let ack = conn.slots.iter().find_map(|slot| match slot {
                Slot::Waiting {
                    seq: waiting, ack, ..
                } if *waiting == seq => Some(*ack),
                _ => None,
            });
            let bytes = match completion {
                Completion::Logged { .. } => {
                    counters.updates_acked_by_device += 1;
                    ack.flatten().unwrap_or(OK).to_vec()
                }
                Completion::Replied { reply, .. } => {
                    conn.direct.applied(seq);
                    if ack.flatten().is_some() {
                        counters.updates_answered_by_server += 1;
                        if let Some((short, acked)) = conn.client.short_of_replicas() {
                            if short == seq {
                                counters.updates_short_of_replicas += 1;
                                let count = counters.updates_short_of_replicas;
                                // The first, then every 1 024th: a chain shorter than
                                // --replicas makes every write short.
                                if count == 1 || count % 1024 == 0 {
                                    tracing::warn!(
                                        "a write was answered by Redis after only {acked} of the \
                                         {} devices --replicas asks for had acknowledged it ({count} \
                                         so far): is the chain of devices shorter than --replicas?",
                                        conn.client.config().replicas
                                    );
                                }
                            }
                        }
                    }
                    if let Some(health) = health.as_deref_mut() {
                        health.saw_reply(&reply);
                    }
                    one_value(reply, limits, counters)
                }
                Completion::ReplyUnavailable => {
                    conn.direct.applied(seq);
                    counters.replies_unavailable += 1;
                    error_reply(
                        "ERR pmnet: this request was applied exactly once, but its reply is no \
                         longer kept",
                    )
                }
            };
            (seq, bytes)
        }
        ClientEvent::Failed { seq, error, .. } => {
            counters.requests_timed_out += 1;
            let why = health
                .as_deref()
                .and_then(Health::down)
                .map(|(_, why)| format!(" ({why})"))
                .unwrap_or_default();
            let barrier = conn.slots.iter().any(|slot| {
                matches!(slot, Slot::Waiting { seq: waiting, then: Then::Barrier, .. } if *waiting == seq)
            });
            if barrier {
                conn.direct.barrier_done(Some(error.to_string()));
            }
            (
                seq,
                error_reply(&format!(
                    "ERR pmnet: {error}{why}; the command may or may not have been applied"
                )),
            )
        }
    };
    let Some(position) = conn
        .slots
        .iter()
        .position(|slot| matches!(slot, Slot::Waiting { seq: waiting, .. } if *waiting == seq))
    else {
        return;
    };
    let Slot::Waiting { then, .. } =
        std::mem::replace(&mut conn.slots[position], Slot::Ready(Vec::new()))
    else {
        return;
    };
    super::introspect::ready(conn, position);
    let resp3 = conn.state.resp3;
    if let Then::Plain(Some(args)) = &then {
        if let Some(slot) = direct::rerun_slot(conn, position, args, &bytes) {
            conn.slots[position] = slot;
            return;
        }
    }
    if let Then::Exec(commands, after) = &then {
        if !after.changes_connection() {
            if let Some(slot) = direct::rerun_exec_slot(conn, position, commands, &bytes) {
                conn.slots[position] = slot;
                return;
            }
        }
    }
    let reply = match then {
        Then::Plain(Some(args)) if resp3 => crate::resp3::to_resp3(&args, &bytes),
        Then::Plain(_) => bytes,
        Then::Touching { args, shown } => {
            conn.watches_in_flight = conn.watches_in_flight.saturating_sub(1);
            if shown.changed(&bytes) {
                conn.state.touch_watched();
            }
            match args {
                Some(args) if resp3 => crate::resp3::to_resp3(&args, &bytes),
                _ => bytes,
            }
        }
        Then::Watch(keys) => {
            conn.watches_in_flight = conn.watches_in_flight.saturating_sub(1);
            conn.state.watched(keys, &bytes)
        }
        Then::Exec(commands, after) => {
            if after.changes_connection() {
                conn.watches_in_flight = conn.watches_in_flight.saturating_sub(1);
                conn.state.executed(after, &bytes);
            }
            if conn.state.resp3 {
                crate::resp3::to_resp3_exec(&commands, &bytes)
            } else {
                bytes
            }
        }
        Then::Select(db) => {
            conn.watches_in_flight = conn.watches_in_flight.saturating_sub(1);
            conn.state.selected(db, bytes)
        }
        Then::Barrier => {
            conn.direct.barrier_done(None);
            Vec::new()
        }
    };
    conn.slots[position] = Slot::Ready(reply);
}

/// Send `args` on the connection's direct connection to Redis, or refuse it without `--redis`.
fn go_direct(
    conn: &mut Conn,
    args: &[Vec<u8>],
    mode: Mode,
    options: &GatewayOptions,
    counters: &mut GatewayCounters,
) {
    if options.direct.is_none() {
        counters.commands_rejected += 1;
        conn.slots.push_back(Slot::Ready(error_reply(&format!(
            "ERR {} {}",
            String::from_utf8_lossy(&args[0]).to_ascii_uppercase(),
            direct::NEEDS_REDIS
        ))));
        return;
    }
    direct::queue(conn, args, mode);
}

/// Whether a transaction goes direct: too large for one PMNet request or the adaptor's
/// scripts, or holding a command that needs Redis's connection (`BLPOP` inside `MULTI` does not
/// block, as in Redis).
fn exec_goes_direct(payload: &[u8], commands: &[Vec<Vec<u8>>], options: &GatewayOptions) -> bool {
    payload.len() > direct::PMNET_REQUEST_MAX
        || commands.iter().any(|command| {
            command.len() > direct::DIRECT_ABOVE_WORDS
                || matches!(
                    direct::client_route(command, route(command, &options.policy)),
                    Route::Direct { .. }
                )
        })
}

/// A reply as the client gets it: one RESP value, or an error saying it was not.
fn one_value(reply: Vec<u8>, limits: &Limits, counters: &mut GatewayCounters) -> Vec<u8> {
    match parse_value(&reply, limits) {
        Ok(Some((_, used))) if used == reply.len() => reply,
        _ => {
            counters.malformed_replies += 1;
            error_reply("ERR pmnet gateway: the server's reply is not one RESP value")
        }
    }
}

/// Fill the slot of a completed or failed cache read (a `GET` a device may answer).
pub(super) fn complete_read(
    conn: &mut Conn,
    event: pmnet_proto::ReadEvent,
    limits: &Limits,
    counters: &mut GatewayCounters,
) {
    let Some(position) = conn
        .slots
        .iter()
        .position(|slot| matches!(slot, Slot::Reading { id, .. } if *id == event.id))
    else {
        return;
    };
    let Slot::Reading { args, .. } =
        std::mem::replace(&mut conn.slots[position], Slot::Ready(Vec::new()))
    else {
        return;
    };
    super::introspect::ready(conn, position);
    let bytes = match event.outcome {
        Ok((reply, device)) => {
            if device != 0 {
                counters.cache_reads_from_device += 1;
            }
            one_value(reply, limits, counters)
        }
        Err(error) => {
            counters.requests_timed_out += 1;
            error_reply(&format!("ERR pmnet: {error}"))
        }
    };
    if let Some(args) = &args {
        if let Some(slot) = direct::rerun_slot(conn, position, args, &bytes) {
            conn.slots[position] = slot;
            return;
        }
    }
    conn.slots[position] = Slot::Ready(match args {
        Some(args) if conn.state.resp3 => crate::resp3::to_resp3(&args, &bytes),
        _ => bytes,
    });
}

/// A request payload (one RESP array) of a client in database `db`: `PMNET.DB db` put before
/// its words (see the adaptor's `DB_COMMAND`).
fn in_database(db: u32, payload: &[u8]) -> Vec<u8> {
    let header_end = payload
        .windows(2)
        .position(|pair| pair == b"\r\n")
        .unwrap_or(payload.len());
    let count = payload
        .get(1..header_end)
        .and_then(crate::resp::parse_int)
        .unwrap_or(0);
    let mut out = Vec::with_capacity(payload.len() + 32);
    out.extend_from_slice(format!("*{}\r\n", count + 2).as_bytes());
    crate::resp::encode_bulk(crate::adaptor::DB_COMMAND, &mut out);
    crate::resp::encode_bulk(db.to_string().as_bytes(), &mut out);
    out.extend_from_slice(payload.get(header_end + 2..).unwrap_or_default());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_in_another_database_carries_it_first() {
        let payload = crate::resp::command_bytes(&[b"SET".to_vec(), b"k".to_vec(), b"v".to_vec()]);
        let wrapped = in_database(3, &payload);
        let parsed = crate::resp::parse_command(&wrapped, &Limits::default())
            .unwrap()
            .unwrap();
        assert_eq!(parsed.1, wrapped.len());
        let words: Vec<&[u8]> = parsed.0.iter().map(Vec::as_slice).collect();
        assert_eq!(words, [&b"PMNET.DB"[..], b"3", b"SET", b"k", b"v"]);
    }

    #[test]
    fn a_write_changed_a_watched_key_when_its_answer_says_so() {
        let changed = |name: &[u8], reply: &[u8]| ChangeShown::of(&[name.to_vec()]).changed(reply);
        // Did nothing: SPOP of a missing set, DEL of a missing key, SET NX that did not set,
        // LINSERT without its pivot, a refused write.
        assert!(!changed(b"SPOP", b"*0\r\n"));
        assert!(!changed(b"del", b":0\r\n"));
        assert!(!changed(b"SET", b"$-1\r\n"));
        assert!(!changed(b"LINSERT", b":-1\r\n"));
        assert!(!changed(
            b"LPUSH",
            b"-WRONGTYPE Operation against a key\r\n"
        ));
        // Did something.
        assert!(changed(b"RPUSH", b":1\r\n"));
        assert!(changed(b"SET", b"+OK\r\n"));
        assert!(
            changed(b"hset", b":0\r\n"),
            "a field that existed, a new value"
        );
        assert!(changed(b"INCRBY", b":0\r\n"), "to 0");
        assert!(
            changed(b"EVAL", b"$-1\r\n"),
            "a script may write and answer nil"
        );
        assert!(!changed(b"EVAL", b"-ERR boom\r\n"));
    }

    #[test]
    fn a_write_redis_marks_only_when_the_value_moved_is_left_to_the_fingerprint() {
        let changed = |words: &[&str], reply: &[u8]| {
            let args: Vec<Vec<u8>> = words.iter().map(|word| word.as_bytes().to_vec()).collect();
            ChangeShown::of(&args).changed(reply)
        };
        // `ZADD k XX 1 m` of a missing key, or of the score m had: Redis leaves the key
        // unmarked; a new score answers 0 too and moves the fingerprint.
        assert!(!changed(&["ZADD", "k", "XX", "1", "m"], b":0\r\n"));
        assert!(!changed(&["zadd", "k", "INCR", "0", "m"], b"$1\r\n1\r\n"));
        assert!(changed(&["ZADD", "k", "1", "m"], b":1\r\n"));
        assert!(changed(
            &["ZADD", "k", "CH", "1", "m", "2", "n"],
            b":12\r\n"
        ));
        assert!(!changed(&["SETBIT", "k", "0", "0"], b":0\r\n"));
        assert!(!changed(&["ZINCRBY", "k", "0", "m"], b"$1\r\n1\r\n"));
        assert!(!changed(&["SETRANGE", "k", "0", ""], b":3\r\n"));
        assert!(changed(&["SETRANGE", "k", "0", "a"], b":3\r\n"));
        assert!(!changed(&["RENAME", "k", "k"], b"+OK\r\n"));
        assert!(changed(&["RENAME", "k", "j"], b"+OK\r\n"));
        assert!(!changed(&["SMOVE", "k", "k", "m"], b":1\r\n"));
        assert!(changed(&["SMOVE", "k", "j", "m"], b":1\r\n"));
    }
}
