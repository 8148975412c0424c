//! Translation: a PMNet request becomes one Redis command (through the apply script for
//! writes), and Redis's answer becomes the request's reply; per-session flow control keeps at
//! most [`REPLY_RING`] requests of a session at Redis.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use pmnet_proto::{RequestKind, ServerEvent};

use crate::resp::{encode_bulk, error_reply, parse_command, parse_int, Limits, Value};
use crate::script::{self, REPLY_RING};
use crate::table::Run;

use super::connections::Conn;
use super::pending::{Expect, Op, Pending, SentAs};
use super::Adaptor;

/// What [`encode_request`] needs besides the request.
#[derive(Debug, Clone)]
pub(super) struct Encoding {
    pub(super) prefix: String,
    /// The record's TTL argument (seconds, 0 for none).
    pub(super) ttl: String,
    pub(super) apply_sha: String,
    pub(super) group_sha: String,
    pub(super) read_sha: String,
    pub(super) watch_sha: String,
    pub(super) record_db: u32,
}

/// The store of a script body under its SHA-1 in the records' database.
const STORE_SCRIPT: &str = "redis.call('SELECT', ARGV[1]) \
     redis.call('HSET', KEYS[1], ARGV[2], ARGV[3]) redis.call('SELECT', 0)";

/// The name of a transaction's payload through the gateway: `PMNET.EXEC watched [db key
/// fingerprint]… count [words word…]…`.
pub const EXEC_COMMAND: &[u8] = b"PMNET.EXEC";
/// The name of a watch's payload through the gateway: `PMNET.WATCH key…`; the reply is the
/// array of the keys' fingerprints.
pub const WATCH_COMMAND: &[u8] = b"PMNET.WATCH";
/// A transaction's element that is a reply the gateway computed (a connection command the
/// gateway answers, queued inside `MULTI`): `PMNET.REPLY <reply>`, put in its place as it is.
pub const REPLY_WORD: &[u8] = b"PMNET.REPLY";
/// A transaction's element that selects a database for the commands after it (a `SELECT`
/// queued inside `MULTI`, checked here): `PMNET.SELECT n`.
pub(super) const SELECT_WORD: &[u8] = b"PMNET.SELECT";
/// A transaction's element that runs a user's script (an `EVAL`/`EVALSHA`/`EVAL_RO`/
/// `EVALSHA_RO` queued inside `MULTI`): `PMNET.SCRIPT r|w <sha> <code> <numkeys> keys… args…`,
/// `r` for a script that must not write; the code with its shebang line emptied.
pub(super) const SCRIPT_WORD: &[u8] = b"PMNET.SCRIPT";
/// The words before a request of a client that selected another database than 0:
/// `PMNET.DB n <request…>` (the request as it would be sent from database 0: a command,
/// `PMNET.EXEC …` or `PMNET.WATCH …`).
pub const DB_COMMAND: &[u8] = b"PMNET.DB";

/// Whether clients may select database `db` of a Redis with `databases` whose records are in
/// `record_db`: one Redis has, and not the records' (unless they share database 0).
pub fn is_user_db(databases: u32, record_db: u32, db: i64) -> bool {
    let record_db = i64::from(record_db);
    (0..i64::from(databases)).contains(&db) && (db != record_db || record_db == 0)
}

/// A request's payload as a server side reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// A no-op fill (empty): recorded with this reply, nothing run.
    Fill(Vec<u8>),
    /// Not one RESP command, or a `PMNET.DB` prefix naming no database clients may use:
    /// answered with this error, nothing run.
    Bad(Vec<u8>),
    /// The command's words, in database `db` (the `PMNET.DB n` prefix taken off).
    Command { db: u32, args: Vec<Vec<u8>> },
}

/// Read a request's payload: the adaptor's and the Redis module's one reading of it.
pub fn read_payload(payload: &[u8], limits: &Limits, is_user_db: impl Fn(i64) -> bool) -> Payload {
    if payload.is_empty() {
        return Payload::Fill(error_reply(
            "ERR pmnet: no-op fill (the client gave up on this request)",
        ));
    }
    let mut args = match parse_command(payload, limits) {
        Ok(Some((args, used))) if used == payload.len() && !args.is_empty() => args,
        _ => {
            return Payload::Bad(error_reply(
                "ERR pmnet-redis: the request payload is not one RESP command",
            ))
        }
    };
    let mut db = 0;
    if args[0].eq_ignore_ascii_case(DB_COMMAND) {
        match args.get(1).and_then(|word| parse_int(word)) {
            Some(n) if args.len() > 2 && is_user_db(n) => {
                db = n as u32;
                args.drain(..2);
            }
            _ => return Payload::Bad(error_reply(DB_OUT_OF_RANGE)),
        }
    }
    Payload::Command { db, args }
}

/// `SELECT n` read as Redis reads it, by the adaptor and the Redis module (alone and inside a
/// transaction): the database, when clients may use it, else the error Redis gives.
pub fn check_select(arg: &[u8], is_user_db: impl Fn(i64) -> bool) -> Result<u32, &'static str> {
    match crate::resp::parse_redis_int(arg) {
        Some(n) if i32::try_from(n).is_ok() && is_user_db(n) => Ok(n as u32),
        Some(n) if i32::try_from(n).is_ok() => Err(DB_OUT_OF_RANGE),
        _ => Err("ERR value is not an integer or out of range"),
    }
}

/// The beginning of the error of a transaction the adaptor does not run.
pub const ABORT: &str = "EXECABORT Transaction discarded because of previous errors";

/// Redis's reply to a database number it does not have (`SELECT`, `MOVE`, …).
pub const DB_OUT_OF_RANGE: &str = "ERR DB index is out of range";

/// Writes in one group script call at most.
const GROUP_MAX: usize = 32;
/// Bytes of words in one group script call at most (a larger write closes the group).
const GROUP_BYTES_MAX: usize = 64 << 10;

/// Unsent bytes to Redis at most before the adaptor stops taking new requests.
const MAX_UNSENT_BYTES: usize = 16 << 20;

/// Per-session flow control: at most [`REPLY_RING`] requests of a session at Redis.
#[derive(Debug, Default)]
pub(super) struct Flow {
    at_redis: u32,
    held: VecDeque<(u32, u32, Op)>,
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

impl Adaptor {
    /// Take requests from the server while there is room, and send them (or hold them).
    pub(super) fn take_requests(&mut self) -> bool {
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
                    let (db, op) = self.decode(&request);
                    if kind == RequestKind::Bypass && !self.flows.contains_key(&session_id) {
                        if let Some(why) = self.redis_down() {
                            // Nothing of this session waits ahead of it: answer now, applied
                            // never (the client learns it was not), instead of holding it.
                            self.counters.failed_fast += 1;
                            let reply = error_reply(&format!(
                                "ERR pmnet: {why}; the command was not applied"
                            ));
                            self.server
                                .on_applied(self.clock.now(), session_id, seq, reply);
                            continue;
                        }
                    }
                    self.outstanding += 1;
                    let flow = self.flows.entry(session_id).or_default();
                    if flow.at_redis >= REPLY_RING || !flow.held.is_empty() {
                        flow.held.push_back((seq, db, op));
                        self.counters.held_back += 1;
                    } else {
                        flow.at_redis += 1;
                        self.dispatch(session_id, seq, db, op);
                    }
                }
                ServerEvent::Read {
                    session_id,
                    id,
                    request,
                } => {
                    let (reply, cacheable) = self.cache_read(&request);
                    self.server
                        .on_read_reply_with(session_id, id, &reply, cacheable);
                }
                ServerEvent::ReadWaitsForRoom { session_id, id } => {
                    // Redis has no fixed room: the adaptor never defers a write, so no read
                    // waits for one; answered for completeness.
                    let reply = error_reply(&format!("ERR pmnet: {}", pmnet_proto::WAITS_FOR_ROOM));
                    self.server
                        .on_read_reply_with(session_id, id, &reply, false);
                }
                ServerEvent::RecoveryComplete(report) => {
                    self.counters.recoveries_completed += 1;
                    self.counters.recovery_entries_resent += report.entries_resent;
                    tracing::info!(
                        "recovery complete: every device answered; {} logged requests were \
                         resent, and every request received is applied ({} sequence numbers \
                         skipped that no device held and no client could send any more) {:.1} \
                         ms after the last device answered",
                        report.entries_resent,
                        report.numbers_skipped,
                        report.took.as_secs_f64() * 1e3
                    );
                }
            }
        }
        any
    }

    /// Why Redis is taken for down (silent for [`super::AdaptorOptions::fail_fast_after`]).
    fn redis_down(&self) -> Option<String> {
        let after = self.options.fail_fast_after?;
        self.redis_watch
            .down_for(self.options.redis, std::time::Instant::now(), after)
    }

    /// While Redis is down (see [`Adaptor::redis_down`]), answer the reads waiting for it
    /// with an error naming it, where nothing of their session waits ahead of them: a read
    /// changes nothing, so answering it now and running it never keeps every promise. Writes
    /// keep waiting (one may have reached Redis before it went away). Only connections that
    /// are closed are looked at: what waits there is not at Redis.
    pub(super) fn fail_fast_waiting_reads(&mut self) {
        let Some(why) = self.redis_down() else {
            return;
        };
        let reply = error_reply(&format!("ERR pmnet: {why}; the command was not applied"));
        let mut answered = Vec::new();
        for conn in self.conns.iter_mut().filter(|conn| conn.stream.is_none()) {
            let mut blocked = std::collections::HashSet::new();
            let mut index = 0;
            while index < conn.pending.len() {
                let pending = &conn.pending[index];
                let session = pending.session_id;
                if !blocked.contains(&session)
                    && matches!(
                        pending.op,
                        Op::Read(_) | Op::StatelessRead(_) | Op::Watch(_)
                    )
                {
                    if let Some(pending) = conn.pending.remove(index) {
                        answered.push((pending.session_id, pending.seq));
                    }
                    continue;
                }
                blocked.insert(session);
                index += 1;
            }
        }
        let now = self.clock.now();
        for (session_id, seq) in answered {
            self.counters.failed_fast += 1;
            self.server.on_applied(now, session_id, seq, reply.clone());
            self.finish(session_id);
        }
    }

    /// Whether clients may select database `db`: one Redis has, and not the records'.
    pub(super) fn is_user_db(&self, db: i64) -> bool {
        is_user_db(self.databases, self.options.record_db, db)
    }

    /// The database a request runs in and what to do with it.
    fn decode(&mut self, payload: &[u8]) -> (u32, Op) {
        let (databases, record_db) = (self.databases, self.options.record_db);
        match read_payload(payload, &self.limits, |db| {
            is_user_db(databases, record_db, db)
        }) {
            Payload::Fill(reply) => {
                self.counters.noop_fills += 1;
                (0, Op::Literal(reply))
            }
            Payload::Bad(reply) => {
                self.counters.bad_payloads += 1;
                (0, Op::Literal(reply))
            }
            Payload::Command { db, args } => (db, self.decode_command(args)),
        }
    }

    /// What to do with a request's command (its database's prefix removed).
    fn decode_command(&mut self, args: Vec<Vec<u8>>) -> Op {
        let refuse = |counters: &mut super::AdaptorCounters, message: &str| {
            counters.refused += 1;
            Op::Literal(error_reply(message))
        };
        if args[0].eq_ignore_ascii_case(b"SELECT") && args.len() == 2 {
            // Answered here, as Redis answers it (the gateway then sends the client's later
            // requests with `PMNET.DB n`); recorded like any reply, in order.
            return match check_select(&args[1], |db| self.is_user_db(db)) {
                Ok(_) => Op::Literal(crate::commands::OK.to_vec()),
                Err(message) => refuse(&mut self.counters, message),
            };
        }
        if args[0].eq_ignore_ascii_case(EXEC_COMMAND) {
            return match self.transaction(&args) {
                Ok(op) => op,
                Err(message) => refuse(&mut self.counters, &message),
            };
        }
        if args[0].eq_ignore_ascii_case(WATCH_COMMAND) {
            return Op::Watch(args[1..].to_vec());
        }
        if args[0].eq_ignore_ascii_case(super::INFO_COMMAND) {
            // Introspection: never recorded, whatever `--record-reads` says.
            return Op::StatelessRead(super::info::info_request(
                self.options.record_db,
                &args[1..],
            ));
        }
        if args[0].eq_ignore_ascii_case(b"EVAL_RO") && args.len() > 2 {
            // Redis caches an EVAL_RO'd script as it caches an EVAL'd one: a later EVALSHA of
            // it must find it.
            self.load_script(&args[1]);
        }
        match self.table.classify(&args, self.options.record_db) {
            Run::Refuse(message) => refuse(&mut self.counters, &message),
            Run::Direct if !self.options.record_reads => Op::StatelessRead(args),
            Run::Read if !self.options.record_reads => Op::Read(args),
            Run::Direct | Run::Read | Run::Write => Op::Write(args),
            Run::FlushAll => {
                let mut words = vec![b"f".to_vec(), self.databases.to_string().into_bytes()];
                words.extend(args.get(1).cloned());
                Op::Apply(words)
            }
            Run::ScriptLoad => {
                // A script Redis cannot compile is not kept (by Redis or by the adaptor): its
                // error is the reply, and an EVALSHA of it is answered NOSCRIPT, as by Redis.
                let body = args[2].clone();
                let load = [b"SCRIPT".to_vec(), b"LOAD".to_vec(), body.clone()];
                match self.lookup_command(&load) {
                    Ok(error @ Value::Error(_)) => Op::Literal(error.to_bytes()),
                    Ok(_) | Err(_) => {
                        self.remember_script(&body);
                        Op::ScriptLoad(body)
                    }
                }
            }
            Run::Script => match self.user_script(args) {
                Ok(op) => op,
                Err(message) => refuse(&mut self.counters, &message),
            },
            Run::Function => match self.function_call(args) {
                Ok(op) => op,
                Err(message) => refuse(&mut self.counters, &message),
            },
            Run::FunctionChange => match self.change_functions(&args) {
                Ok(op) => op,
                Err(message) => refuse(&mut self.counters, &message),
            },
        }
    }

    /// A cache read (the read cache's miss), answered on the reader connection (database 0)
    /// now: the server hands it over only once what it must see is applied at Redis.
    /// Answer a cache read on what Redis holds now (the server hands it over once what it
    /// must follow is applied), and whether a cache may keep the answer: not for a key with a
    /// time to live (Redis expires it without a write the device would see). A `GET` asks
    /// `PTTL` in the same round trip.
    fn cache_read(&mut self, request: &[u8]) -> (Vec<u8>, bool) {
        let args = match parse_command(request, &self.limits) {
            Ok(Some((args, used))) if used == request.len() && !args.is_empty() => args,
            _ => {
                return (
                    error_reply("ERR pmnet-redis: the cache read is not one RESP command"),
                    false,
                )
            }
        };
        if self.table.classify(&args, self.options.record_db) != Run::Read {
            return (
                error_reply("ERR pmnet-redis: a cache read must be a command that only reads"),
                false,
            );
        }
        if self.reader.is_none() {
            self.reader = super::recovery::connect(&self.options).ok();
        }
        let unanswered = || {
            (
                error_reply("ERR pmnet-redis: Redis did not answer the read (try again)"),
                false,
            )
        };
        let Some(reader) = self.reader.as_mut() else {
            return unanswered();
        };
        let is_get = args.len() == 2 && args[0].eq_ignore_ascii_case(b"GET");
        let answer = if is_get {
            // PTTL first: a key that gains a time to live after it does so by a write, which
            // passes the device and voids the fetch this read may be.
            let pttl = vec![b"PTTL".to_vec(), args[1].clone()];
            reader.pipeline(&[pttl, args.clone()]).map(|mut values| {
                let value = values.pop().unwrap_or(Value::Bulk(None));
                // -2: no key (its absence is cacheable); -1: no time to live.
                let lasting = matches!(values.first(), Some(Value::Integer(-1 | -2)));
                (value.to_bytes(), lasting)
            })
        } else {
            reader.command(&args).map(|value| (value.to_bytes(), false))
        };
        match answer {
            Ok((reply, cacheable)) => {
                let fitted = super::fit_reply(reply, false);
                let whole = !fitted.starts_with(super::REPLY_TOO_LARGE);
                (fitted, cacheable && whole)
            }
            Err(_) => {
                self.reader = None;
                unanswered()
            }
        }
    }

    /// The blocking connection for lookups, opened (in the records' database) if need be.
    fn lookup_client(&mut self) -> Option<&mut crate::resp::SyncClient> {
        if self.lookup.is_none() {
            let mut client = super::recovery::connect(&self.options).ok()?;
            let db = self.options.record_db.to_string();
            client.command(&["SELECT", db.as_str()]).ok()?;
            self.lookup = Some(client);
        }
        self.lookup.as_mut()
    }

    /// Run `args` on the lookup connection now; the connection is dropped if it failed.
    pub(super) fn lookup_command(&mut self, args: &[Vec<u8>]) -> Result<Value, String> {
        let failed = || {
            format!(
                "ERR pmnet-redis: Redis did not answer {} (try again)",
                String::from_utf8_lossy(&args[0]).to_ascii_uppercase()
            )
        };
        let client = self.lookup_client().ok_or_else(failed)?;
        match client.command(args) {
            Ok(value) => Ok(value),
            Err(_) => {
                self.lookup = None;
                Err(failed())
            }
        }
    }

    /// `FCALL`/`FCALL_RO name numkeys keys… args…`: the function's library in the
    /// exactly-once wrapper (see `functions.rs`), or Redis's error.
    fn function_call(&mut self, args: Vec<Vec<u8>>) -> Result<Op, String> {
        let count = key_count(&args)?;
        let name = String::from_utf8_lossy(&args[1]).into_owned();
        let now = std::time::Instant::now();
        if self.functions.cached(&name, now).is_none() {
            let list = self.lookup_command(&[
                b"FUNCTION".to_vec(),
                b"LIST".to_vec(),
                b"WITHCODE".to_vec(),
            ])?;
            self.functions
                .refresh(&list, now)
                .map_err(|why| format!("ERR pmnet-redis: FUNCTION LIST: {why}"))?;
        }
        let function = self
            .functions
            .get(&name)
            .ok_or_else(|| "ERR Function not found".to_owned())?;
        if args[0].eq_ignore_ascii_case(b"FCALL_RO") && !function.no_writes {
            return Err(
                "ERR Can not execute a script with write flag using *_ro command.".to_owned(),
            );
        }
        let wrapper: Arc<[u8]> =
            script::function_script(self.options.record_db, &function.code, &name).into();
        Ok(Op::UserScript {
            wrapper,
            keys: args[3..3 + count].to_vec(),
            args: args[3 + count..].to_vec(),
        })
    }

    /// `FUNCTION LOAD/DELETE/FLUSH/RESTORE`: run now, so that every `FCALL` translated after
    /// it reads the libraries it left; its reply is recorded like a fixed reply.
    fn change_functions(&mut self, args: &[Vec<u8>]) -> Result<Op, String> {
        self.functions.invalidate();
        let mut reply = Vec::new();
        self.lookup_command(args)?.encode(&mut reply);
        Ok(Op::Literal(reply))
    }

    /// Keep a script body for `EVALSHA` (bounded: beyond, it is read back from Redis).
    pub(super) fn remember_script(&mut self, body: &[u8]) -> String {
        let sha = script::script_sha(body);
        if self.scripts.len() >= script::SCRIPTS_CACHED_MAX {
            self.scripts.clear();
        }
        self.scripts.insert(sha.clone(), body.into());
        sha
    }

    /// An `EVAL`'d script body, the first time the adaptor sees it: loaded into Redis's script
    /// cache as Redis's own `EVAL` would (the adaptor runs it inside its wrapper), so that
    /// `SCRIPT EXISTS` and `EVALSHA_RO` (sent to Redis as they are) find it, and remembered
    /// for `EVALSHA` — unless Redis cannot compile it: Redis keeps no such script, and an
    /// `EVALSHA` of it is answered `NOSCRIPT`, as by Redis.
    pub(super) fn load_script(&mut self, body: &[u8]) {
        if self.scripts.contains_key(&script::script_sha(body)) {
            return;
        }
        let load = [b"SCRIPT".to_vec(), b"LOAD".to_vec(), body.to_vec()];
        match self.lookup_command(&load) {
            Ok(Value::Error(_)) => {}
            // Loaded, or Redis did not answer now: remembered (the wrapper runs it anyway).
            Ok(_) | Err(_) => {
                self.remember_script(body);
            }
        }
    }

    /// A script body by SHA-1: in memory, else in the records' database.
    pub(super) fn find_script(&mut self, sha: &str) -> Option<Arc<[u8]>> {
        if let Some(body) = self.scripts.get(sha) {
            return Some(body.clone());
        }
        let words = [b"HGET".to_vec(), script::SCRIPTS_KEY.into(), sha.into()];
        match self.lookup_command(&words) {
            Ok(Value::Bulk(Some(body))) => {
                self.remember_script(&body);
                self.scripts.get(sha).cloned()
            }
            _ => None,
        }
    }

    /// `EVAL body numkeys keys… args…` or `EVALSHA sha …`: the wrapped script, or Redis's error.
    fn user_script(&mut self, args: Vec<Vec<u8>>) -> Result<Op, String> {
        let count = key_count(&args)?;
        let body: Arc<[u8]> = if args[0].eq_ignore_ascii_case(b"EVALSHA") {
            let sha = String::from_utf8_lossy(&args[1]).to_ascii_lowercase();
            self.find_script(&sha)
                .ok_or_else(|| "NOSCRIPT No matching script. Please use EVAL.".to_owned())?
        } else {
            self.load_script(&args[1]);
            args[1].as_slice().into()
        };
        let (code, read_only) = script::strip_shebang(&body);
        if read_only && !self.options.record_reads {
            // Declared `no-writes`: Redis runs it as a read; so does the adaptor.
            let mut read = args.clone();
            read[0] = b"EVAL".to_vec();
            read[1] = body.to_vec();
            return Ok(Op::Read(read));
        }
        let sha = script::script_sha(&body);
        let wrapper: Arc<[u8]> = script::user_script(self.options.record_db, code, &sha).into();
        Ok(Op::UserScript {
            wrapper,
            keys: args[3..3 + count].to_vec(),
            args: args[3 + count..].to_vec(),
        })
    }

    fn dispatch(&mut self, session_id: u64, seq: u32, db: u32, op: Op) {
        let index = self.conn_of(session_id);
        let mut pending = Pending {
            session_id,
            seq,
            db,
            op,
            sent_as: SentAs::Direct,
        };
        let conn = &mut self.conns[index];
        let joins =
            matches!(&pending.op, Op::Write(args) if !crate::commands::counts_references(args));
        if let (Op::Write(args), Some(_), true) = (&pending.op, &conn.stream, joins) {
            // Joins the connection's open group, sent as one script call when the turn sends
            // (`OBJECT REFCOUNT` never does: the group's writes hold references until it ends).
            pending.sent_as = SentAs::Script;
            conn.ungrouped += 1;
            conn.ungrouped_bytes += args.iter().map(|word| word.len() + 16).sum::<usize>();
            conn.pending.push_back(pending);
            let conn = &self.conns[index];
            if conn.ungrouped >= GROUP_MAX || conn.ungrouped_bytes >= GROUP_BYTES_MAX {
                self.close_group(index);
            }
            return;
        }
        self.close_group(index);
        let conn = &mut self.conns[index];
        if conn.stream.is_some() {
            pending.sent_as = encode_request(
                &mut conn.out,
                &mut conn.expect,
                &self.encoding,
                &pending,
                None,
            );
        }
        conn.pending.push_back(pending);
    }

    /// Encode the connection's open group of writes: one group script call, or the update
    /// script's for a group of one.
    pub(super) fn close_group(&mut self, index: usize) {
        let conn = &mut self.conns[index];
        let count = std::mem::take(&mut conn.ungrouped);
        conn.ungrouped_bytes = 0;
        if count == 0 || conn.stream.is_none() {
            return;
        }
        let first = conn.pending.len() - count;
        if count == 1 {
            let pending = &conn.pending[first];
            encode_request(
                &mut conn.out,
                &mut conn.expect,
                &self.encoding,
                pending,
                None,
            );
            return;
        }
        let group = conn.pending.range(first..);
        encode_group(&mut conn.out, &self.encoding, group, count);
        conn.expect.push_back(Expect::Group(count));
    }

    /// A request of `session_id` was answered: let the next held one go.
    pub(super) fn finish(&mut self, session_id: u64) {
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
        for (seq, db, op) in release {
            self.dispatch(session_id, seq, db, op);
        }
    }

    /// Turn Redis's answer into the request's reply; `Err` when it must be sent again.
    pub(super) fn interpret(&mut self, pending: &Pending, value: Value) -> Result<Vec<u8>, String> {
        if let Value::Error(message) = &value {
            // A user's EVALSHA_RO of an unknown script is answered NOSCRIPT for good; only our
            // own scripts come back after a reload.
            let ours = pending.sent_as == SentAs::Script || !message.starts_with(b"NOSCRIPT");
            if ours && is_transient(message) {
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
                            if pending.op.reads() {
                                self.counters.reads += 1;
                            } else {
                                self.counters.writes_applied += 1;
                            }
                            if reply.first() == Some(&b'-') && pending.op.writes() {
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
}

impl Adaptor {
    /// Send connection `index`'s unanswered requests again (after it opened again); returns
    /// how many. A read resent while a later write of its session may already be applied must
    /// not see that write: it goes through the checked read, bounded by that write's number.
    pub(super) fn resend_pending(&mut self, index: usize) -> u64 {
        let conn = &mut self.conns[index];
        let mut later_write: HashMap<u64, u32> = HashMap::new();
        let mut bounds = vec![None; conn.pending.len()];
        for (position, pending) in conn.pending.iter().enumerate().rev() {
            if pending.op.writes() {
                later_write.insert(pending.session_id, pending.seq);
            } else if pending.op.reads() {
                bounds[position] = later_write.get(&pending.session_id).copied();
            }
        }
        let resent = conn.pending.len() as u64;
        for (pending, bound) in conn.pending.iter_mut().zip(bounds) {
            pending.sent_as = encode_request(
                &mut conn.out,
                &mut conn.expect,
                &self.encoding,
                pending,
                bound,
            );
        }
        resent
    }
}

/// Append the command that carries `pending` to `out`, and what its replies answer to
/// `expect`; returns how its reply will look.
pub(super) fn encode_request(
    out: &mut Vec<u8>,
    expect: &mut VecDeque<Expect>,
    encoding: &Encoding,
    pending: &Pending,
    read_bound: Option<u32>,
) -> SentAs {
    let key = script::record_key(&encoding.prefix, pending.session_id);
    let seq = pending.seq.to_string();
    let db = pending.db.to_string();
    let apply: [&[u8]; 7] = [
        b"EVALSHA",
        encoding.apply_sha.as_bytes(),
        b"1",
        &key,
        seq.as_bytes(),
        encoding.ttl.as_bytes(),
        db.as_bytes(),
    ];
    let direct = matches!(
        (&pending.op, read_bound),
        (Op::Read(_), None) | (Op::StatelessRead(_), _)
    );
    if direct && pending.db != 0 {
        // A read as it is, in its client's database: the connection goes back to database 0
        // after it (the scripts rely on starting there).
        encode_parts(out, &[b"SELECT", db.as_bytes()], &[]);
        expect.push_back(Expect::Ignore);
    }
    expect.push_back(Expect::Request);
    if direct && pending.db != 0 {
        let (Op::Read(args) | Op::StatelessRead(args)) = &pending.op else {
            unreachable!("a direct read");
        };
        encode_parts(out, &[], args);
        encode_parts(out, &[b"SELECT", b"0"], &[]);
        expect.push_back(Expect::Ignore);
        return SentAs::Direct;
    }
    match &pending.op {
        Op::Write(args) => {
            let mut head = apply.to_vec();
            head.push(b"c");
            encode_parts(out, &head, args);
            SentAs::Script
        }
        Op::Literal(reply) => {
            let mut head = apply.to_vec();
            head.extend([b"r".as_slice(), reply]);
            encode_parts(out, &head, &[]);
            SentAs::Script
        }
        Op::Apply(words) => {
            encode_parts(out, &apply, words);
            SentAs::Script
        }
        Op::UserScript {
            wrapper,
            keys,
            args,
        } => {
            let count = (1 + keys.len()).to_string();
            out.extend_from_slice(format!("*{}\r\n", 7 + keys.len() + args.len()).as_bytes());
            for part in [b"EVAL".as_slice(), wrapper, count.as_bytes(), &key] {
                encode_bulk(part, out);
            }
            for word in keys {
                encode_bulk(word, out);
            }
            encode_bulk(seq.as_bytes(), out);
            encode_bulk(encoding.ttl.as_bytes(), out);
            encode_bulk(db.as_bytes(), out);
            for word in args {
                encode_bulk(word, out);
            }
            SentAs::Script
        }
        Op::Watch(keys) => {
            let bound = read_bound.unwrap_or(0).to_string();
            encode_parts(
                out,
                &[
                    b"EVALSHA",
                    encoding.watch_sha.as_bytes(),
                    b"1",
                    &key,
                    bound.as_bytes(),
                    db.as_bytes(),
                ],
                keys,
            );
            SentAs::Script
        }
        Op::ScriptLoad(body) => {
            encode_parts(out, &[b"SCRIPT", b"LOAD", body], &[]);
            let sha = script::script_sha(body);
            let db = encoding.record_db.to_string();
            encode_parts(
                out,
                &[
                    b"EVAL",
                    STORE_SCRIPT.as_bytes(),
                    b"1",
                    script::SCRIPTS_KEY.as_bytes(),
                    db.as_bytes(),
                    sha.as_bytes(),
                    body,
                ],
                &[],
            );
            expect.push_back(Expect::Ignore);
            SentAs::Direct
        }
        Op::Read(args) => match read_bound {
            Some(bound) => {
                let bound = bound.to_string();
                encode_parts(
                    out,
                    &[
                        b"EVALSHA",
                        encoding.read_sha.as_bytes(),
                        b"1",
                        &key,
                        bound.as_bytes(),
                        db.as_bytes(),
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

/// The number of keys of `EVAL`/`EVALSHA`/`FCALL` (`args[2]`), checked as Redis checks it.
pub(super) fn key_count(args: &[Vec<u8>]) -> Result<usize, String> {
    let count = parse_int(&args[2])
        .ok_or_else(|| "ERR value is not an integer or out of range".to_owned())?;
    if count < 0 {
        return Err("ERR Number of keys can't be negative".to_owned());
    }
    let count = count as usize;
    if count > args.len() - 3 {
        return Err("ERR Number of keys can't be greater than number of args".to_owned());
    }
    Ok(count)
}

/// `EVALSHA group count record… ttl [seq words word…]…` for `count` writes (`Op::Write`).
fn encode_group<'a>(
    out: &mut Vec<u8>,
    encoding: &Encoding,
    group: impl Iterator<Item = &'a Pending> + Clone,
    count: usize,
) {
    let words: usize = group
        .clone()
        .map(|pending| match &pending.op {
            Op::Write(args) => 3 + args.len(),
            _ => unreachable!("only writes are grouped"),
        })
        .sum();
    out.extend_from_slice(format!("*{}\r\n", 4 + count + words).as_bytes());
    encode_bulk(b"EVALSHA", out);
    encode_bulk(encoding.group_sha.as_bytes(), out);
    encode_bulk(count.to_string().as_bytes(), out);
    for pending in group.clone() {
        encode_bulk(
            &script::record_key(&encoding.prefix, pending.session_id),
            out,
        );
    }
    encode_bulk(encoding.ttl.as_bytes(), out);
    for pending in group {
        let Op::Write(args) = &pending.op else {
            unreachable!("only writes are grouped");
        };
        encode_bulk(pending.seq.to_string().as_bytes(), out);
        encode_bulk(pending.db.to_string().as_bytes(), out);
        encode_bulk(args.len().to_string().as_bytes(), out);
        for word in args {
            encode_bulk(word, out);
        }
    }
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
}
