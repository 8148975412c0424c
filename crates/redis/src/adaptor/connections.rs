//! The pipelined connections to Redis: opening them (with back-off), sending again what a lost
//! connection owed, writing, and reading Redis's replies in order.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::resp::{self, parse_value, Value};
use crate::script;

use super::pending::{Expect, Pending};
use super::Adaptor;

/// One pipelined connection to Redis.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) stream: Option<TcpStream>,
    pub(super) out: Vec<u8>,
    out_sent: usize,
    input: Vec<u8>,
    pub(super) expect: VecDeque<Expect>,
    /// Requests at Redis or about to be, oldest first; kept across reconnections.
    pub(super) pending: VecDeque<Pending>,
    /// The last this many of `pending` are writes not yet encoded: they go to Redis as one
    /// group script call when the turn sends (see `Adaptor::close_group`).
    pub(super) ungrouped: usize,
    /// Bytes of words of the ungrouped writes.
    pub(super) ungrouped_bytes: usize,
    pub(super) retry_at: Option<Instant>,
    backoff: Duration,
    failures_in_a_row: u32,
}

/// Bytes read from Redis at once.
pub(super) const READ_CHUNK: usize = 64 << 10;
const MIN_BACKOFF: Duration = Duration::from_millis(10);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
/// Bytes read from one connection per turn at most (fairness).
const READ_PER_TURN: usize = 1 << 20;

/// Whether Redis answers, over all the connections: an outage (no connection getting replies)
/// is reported once, naming Redis's address, after [`super::REDIS_SILENCE_WARNING`], and its
/// end once, at info.
#[derive(Debug, Default)]
pub(super) struct RedisWatch {
    /// Since when no connection has had a good reply, and why the last attempt failed.
    down_since: Option<Instant>,
    why: String,
    /// The outage was reported.
    reported: bool,
}

impl RedisWatch {
    /// A connection failed (refused, lost, a transient error).
    pub(super) fn failed(&mut self, now: Instant, why: &str) {
        self.down_since.get_or_insert(now);
        if !self.reported {
            why.clone_into(&mut self.why);
        }
    }

    #[inline]
    pub(super) fn is_down(&self) -> bool {
        self.down_since.is_some()
    }

    /// Why Redis has not answered for `after` or longer by `now`, in words naming it at
    /// `addr`; `None` while it answers (or has not been silent that long).
    pub(super) fn down_for(
        &self,
        addr: std::net::SocketAddr,
        now: Instant,
        after: Duration,
    ) -> Option<String> {
        let since = self.down_since?;
        let down = now.saturating_duration_since(since);
        (down >= after).then(|| {
            format!(
                "redis-server at {addr} does not answer ({}, for {:.1} s; is it running there?)",
                self.why,
                down.as_secs_f64()
            )
        })
    }

    /// Redis answered on some connection.
    #[inline]
    pub(super) fn answered(&mut self, addr: std::net::SocketAddr, waiting: usize) {
        let Some(since) = self.down_since.take() else {
            return;
        };
        if self.reported {
            tracing::info!(
                "Redis at {addr} answers again after {:.1} s; {waiting} requests that waited \
                 are sent again",
                since.elapsed().as_secs_f64()
            );
        }
        self.reported = false;
    }

    /// Warn once if the outage has lasted [`super::REDIS_SILENCE_WARNING`].
    #[inline]
    pub(super) fn check(&mut self, addr: std::net::SocketAddr, now: Instant, waiting: usize) {
        let Some(since) = self.down_since else {
            return;
        };
        let down = now.saturating_duration_since(since);
        if self.reported || down < super::REDIS_SILENCE_WARNING {
            return;
        }
        self.reported = true;
        tracing::warn!(
            "Redis at {addr} does not answer ({}) for {} s; is redis-server running there? \
             {waiting} requests wait; still trying",
            self.why,
            down.as_secs()
        );
    }

    /// When [`RedisWatch::check`] has something to say, if an outage is not yet reported.
    pub(super) fn deadline(&self) -> Option<Instant> {
        match self.down_since {
            Some(since) if !self.reported => Some(since + super::REDIS_SILENCE_WARNING),
            _ => None,
        }
    }
}

impl Conn {
    pub(super) fn new() -> Conn {
        Conn {
            stream: None,
            out: Vec::new(),
            out_sent: 0,
            input: Vec::new(),
            expect: VecDeque::new(),
            pending: VecDeque::new(),
            ungrouped: 0,
            ungrouped_bytes: 0,
            retry_at: Some(Instant::now()),
            backoff: MIN_BACKOFF,
            failures_in_a_row: 0,
        }
    }

    pub(super) fn unsent(&self) -> usize {
        self.out.len() - self.out_sent
    }
}

impl Adaptor {
    pub(super) fn conn_of(&self, session_id: u64) -> usize {
        // Session ids are random; fold the high bits in anyway.
        ((session_id ^ (session_id >> 32)) % self.conns.len() as u64) as usize
    }

    /// Open connection `index` and send again what it owes. Returns whether it connected.
    pub(super) fn try_connect(&mut self, index: usize) -> bool {
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
        let record_db = self.options.record_db;
        let conn = &mut self.conns[index];
        conn.stream = Some(stream);
        conn.retry_at = None;
        conn.out.clear();
        conn.out_sent = 0;
        conn.input.clear();
        conn.expect.clear();
        conn.ungrouped = 0;
        conn.ungrouped_bytes = 0;
        if let Some((user, password)) = &self.options.redis_auth {
            let mut words: Vec<&[u8]> = vec![b"AUTH"];
            words.extend(user.as_deref());
            words.push(password);
            resp::encode_command(&words, &mut conn.out);
            conn.expect.push_back(Expect::Setup("AUTH"));
        }
        // Load the scripts again: Redis may have restarted.
        for text in [
            script::apply_script(record_db),
            script::apply_group_script(record_db),
            script::checked_read_script(record_db),
            script::watch_script(record_db),
        ] {
            resp::encode_command(
                &[b"SCRIPT".as_slice(), b"LOAD", text.as_bytes()],
                &mut conn.out,
            );
            conn.expect.push_back(Expect::Setup("SCRIPT LOAD"));
        }
        let resent = self.resend_pending(index);
        if !first {
            self.counters.resent += resent;
            tracing::debug!(
                "connection {index} to Redis at {addr} open again; {resent} unanswered requests \
                 sent again"
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
        conn.ungrouped = 0;
        conn.ungrouped_bytes = 0;
        conn.failures_in_a_row += 1;
        let backoff = conn.backoff;
        conn.retry_at = Some(Instant::now() + backoff);
        conn.backoff = (backoff * 2).min(MAX_BACKOFF);
        // One warning per outage, by the watch; each connection's failures only at debug.
        tracing::debug!(
            "Redis at {} (connection {index}): {why}; {} requests wait; retrying in {backoff:?}",
            self.options.redis,
            conn.pending.len()
        );
        self.redis_watch.failed(Instant::now(), why);
    }

    /// Requests waiting at (or for) Redis, over every connection.
    pub(super) fn waiting_for_redis(&self) -> usize {
        self.conns.iter().map(|conn| conn.pending.len()).sum()
    }

    pub(super) fn write_out(&mut self, index: usize) -> bool {
        self.close_group(index);
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
    pub(super) fn read_replies(&mut self, index: usize) -> bool {
        let mut read_any = false;
        let mut failure: Option<String> = None;
        {
            let conn = &mut self.conns[index];
            let Some(stream) = conn.stream.as_mut() else {
                return false;
            };
            let chunk = &mut self.scratch;
            let mut total = 0;
            while total < READ_PER_TURN {
                match stream.read(chunk) {
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
        let mut completed: Vec<(u64, u32, Vec<u8>, bool)> = Vec::new();
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
            if self.redis_watch.is_down() && !matches!(value, Value::Error(_)) {
                let waiting = self.waiting_for_redis();
                self.redis_watch.answered(self.options.redis, waiting);
            }
            let conn = &mut self.conns[index];
            match conn.expect.pop_front() {
                None => {
                    failure = Some("a reply nobody asked for".to_owned());
                }
                Some(Expect::Setup(what)) => {
                    if let Value::Error(message) = &value {
                        self.counters.transient_errors += 1;
                        failure = Some(format!(
                            "{what} failed: {}",
                            String::from_utf8_lossy(message)
                        ));
                    }
                }
                Some(Expect::Ignore) => {
                    if let Value::Error(message) = &value {
                        tracing::warn!(
                            "Redis refused to remember a script body: {}",
                            String::from_utf8_lossy(message)
                        );
                    }
                }
                Some(Expect::Group(count)) => {
                    let replies = match value {
                        Value::Array(Some(items)) if items.len() == count => items,
                        other => {
                            // Not one answer per request (a transient error, or the script
                            // itself failed): send them again, each on its own.
                            if let Value::Error(_) = other {
                                self.counters.transient_errors += 1;
                            }
                            failure = Some(format!("the group script answered {other:?}"));
                            continue;
                        }
                    };
                    self.counters.groups += 1;
                    self.counters.grouped_writes += count as u64;
                    for value in replies {
                        let Some(pending) = self.conns[index].pending.pop_front() else {
                            failure = Some("a reply without a request".to_owned());
                            break;
                        };
                        match self.interpret(&pending, value) {
                            Ok(reply) => completed.push((
                                pending.session_id,
                                pending.seq,
                                reply,
                                pending.op.writes(),
                            )),
                            Err(why) => {
                                self.conns[index].pending.push_front(pending);
                                failure = Some(why);
                                break;
                            }
                        }
                    }
                }
                Some(Expect::Request) => {
                    let Some(pending) = conn.pending.pop_front() else {
                        failure = Some("a reply without a request".to_owned());
                        continue;
                    };
                    match self.interpret(&pending, value) {
                        Ok(reply) => completed.push((
                            pending.session_id,
                            pending.seq,
                            reply,
                            pending.op.writes(),
                        )),
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
        for (session_id, seq, reply, writes) in completed {
            let reply = super::fit_reply(reply, writes);
            tracing::trace!(
                session = session_id,
                seq,
                connection = index,
                reply_len = reply.len(),
                "applied at Redis"
            );
            self.server.on_applied(now, session_id, seq, reply);
            self.finish(session_id);
        }
        if let Some(why) = failure {
            self.note_failure(index, &why);
        }
        any
    }
}
