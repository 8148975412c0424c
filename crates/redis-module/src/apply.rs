//! One request applied inside Redis: its command run, and its session's record written in the
//! same execution unit, so that Redis puts both in its append-only file inside one
//! `MULTI … EXEC` (docs/redis.md, "The module"). The records have the adaptor's layout
//! (`crates/redis/src/script.rs`): the module and the adaptor take over from each other on the
//! same Redis with exactly-once kept.

use pmnet_redis::adaptor::Payload;
use pmnet_redis::resp::{error_reply, Limits};
use pmnet_redis::script;
use pmnet_redis::table::{CommandTable, Run};

use crate::call::{Mode, Redis};

/// What to do with a request.
#[derive(Debug)]
enum Op {
    /// This reply, running nothing.
    Literal(Vec<u8>),
    /// Run it; `writes`: it may change data (recorded, to the AOF).
    Run { args: Vec<Vec<u8>>, writes: bool },
    /// `EVALSHA`: a script Redis lost in a restart is loaded again from the records'
    /// database first.
    ScriptSha(Vec<Vec<u8>>),
    /// `SCRIPT LOAD body`: loaded, and the body kept in the records' database.
    ScriptLoad(Vec<Vec<u8>>),
    /// `FLUSHALL [mode]`: every database but the records'.
    FlushAll(Option<Vec<u8>>),
    /// `PMNET.EXEC …`: a transaction (`transaction.rs`).
    Exec(Vec<Vec<u8>>),
    /// `PMNET.WATCH key…`: the keys' fingerprints.
    Watch(Vec<Vec<u8>>),
}

/// The limits of a request's command: the adaptor's (a transaction through the gateway
/// carries every queued command's words); the server has bounded its length already.
pub(crate) fn request_limits() -> Limits {
    Limits {
        max_bulk_len: 512 << 20,
        max_args: 1 << 16,
        ..Limits::default()
    }
}

/// Sessions whose TTL refresh is tracked at most (past it the tracking starts over: each
/// session's next write sets its TTL again).
const TTL_TRACKED_MAX: usize = 1 << 20;

/// What the module counted of requests.
#[derive(Debug, Default, Clone)]
pub struct ApplyCounters {
    pub writes: u64,
    pub reads: u64,
    pub literals: u64,
    pub noop_fills: u64,
    pub bad_payloads: u64,
    pub record_errors: u64,
}

/// How requests are applied: what Redis is, and where the records go.
#[derive(Debug)]
pub struct Applier {
    pub(crate) table: CommandTable,
    pub databases: u32,
    pub record_db: u32,
    pub record_prefix: String,
    pub record_reads: bool,
    /// A record's time to live (`None`: records never expire).
    ttl: Option<std::time::Duration>,
    /// When each session's record last had its time to live set (this run): it is set again
    /// only once a quarter of it has passed, so a record lives at least three quarters of
    /// the TTL after its session's last write, for one `EXPIRE` per session and quarter-TTL
    /// instead of one per write.
    ttl_set_at: std::collections::HashMap<u64, std::time::Instant>,
    /// Records of this turn's requests, written together at its end ([`Applier::write_records`]).
    pending_records: Vec<(u64, u32, Vec<u8>)>,
    pub counters: ApplyCounters,
    limits: Limits,
}

impl Applier {
    pub fn new(
        table: CommandTable,
        databases: u32,
        record_db: u32,
        record_prefix: String,
        record_reads: bool,
        ttl_secs: Option<u64>,
    ) -> Applier {
        Applier {
            table,
            databases,
            record_db,
            record_prefix,
            record_reads,
            ttl: ttl_secs.map(std::time::Duration::from_secs),
            ttl_set_at: std::collections::HashMap::new(),
            pending_records: Vec::new(),
            counters: ApplyCounters::default(),
            limits: request_limits(),
        }
    }

    /// Apply request `seq` of `session_id` and return its reply (recorded when it wrote).
    pub fn apply(&mut self, redis: &Redis, session_id: u64, seq: u32, payload: &[u8]) -> Vec<u8> {
        let (db, op) = self.decode(payload);
        let (reply, record) = match op {
            Op::Literal(reply) => {
                self.counters.literals += 1;
                (reply, true)
            }
            Op::Run { args, writes } => {
                redis.select(db);
                let mode = if writes { Mode::Request } else { Mode::Read };
                let reply = redis.call(mode, &args);
                if writes {
                    self.counters.writes += 1;
                } else {
                    self.counters.reads += 1;
                }
                (reply, writes || self.record_reads)
            }
            Op::ScriptSha(args) => {
                redis.select(db);
                let mut reply = redis.call(Mode::Request, &args);
                if reply.starts_with(b"-NOSCRIPT") && self.reload_script(redis, &args[1]) {
                    redis.select(db);
                    reply = redis.call(Mode::Request, &args);
                }
                self.counters.writes += 1;
                (reply, true)
            }
            Op::ScriptLoad(args) => {
                let reply = redis.call(Mode::Request, &args);
                if !reply.starts_with(b"-") {
                    redis.select(self.record_db);
                    let sha = script::script_sha(&args[2]);
                    redis.call(
                        Mode::Record,
                        &[
                            b"HSET".as_slice(),
                            script::SCRIPTS_KEY.as_bytes(),
                            sha.as_bytes(),
                            &args[2],
                        ],
                    );
                }
                self.counters.writes += 1;
                (reply, true)
            }
            Op::Exec(args) => {
                self.counters.writes += 1;
                (self.transaction(redis, db, &args), true)
            }
            Op::Watch(keys) => {
                self.counters.reads += 1;
                (self.watch(redis, db, &keys), self.record_reads)
            }
            Op::FlushAll(mode) => {
                for db in (0..self.databases).filter(|&db| db != self.record_db) {
                    redis.select(db);
                    let mut args = vec![b"FLUSHDB".to_vec()];
                    args.extend(mode.clone());
                    redis.call(Mode::Request, &args);
                }
                self.counters.writes += 1;
                (pmnet_redis::commands::OK.to_vec(), true)
            }
        };
        let reply = pmnet_redis::adaptor::fit_reply(reply, record);
        if record {
            self.pending_records.push((session_id, seq, reply.clone()));
        }
        reply
    }

    /// A script body kept by `SCRIPT LOAD` (here or by the adaptor), loaded into Redis again.
    pub(crate) fn reload_script(&mut self, redis: &Redis, sha: &[u8]) -> bool {
        redis.select(self.record_db);
        let body = redis.call(
            Mode::Read,
            &[b"HGET".as_slice(), script::SCRIPTS_KEY.as_bytes(), sha],
        );
        let Ok(Some((pmnet_redis::resp::Value::Bulk(Some(body)), _))) =
            pmnet_redis::resp::parse_value(&body, &self.limits)
        else {
            return false;
        };
        !redis
            .call(Mode::Read, &[b"SCRIPT".as_slice(), b"LOAD", &body])
            .starts_with(b"-")
    }

    /// The records of the requests applied since the last call, one `HSET` per session: its
    /// last number, and each reply in the ring of the last [`script::REPLY_RING`] (as the
    /// adaptor's scripts write them). Called in the same execution unit as the requests, so
    /// Redis writes records and effects in one `MULTI … EXEC`.
    /// Whether request `payload` waits for the next turn: `OBJECT REFCOUNT` counts the
    /// references Redis holds to a value, and each request applied this turn holds one more to
    /// the values it wrote until the turn ends (its propagation to the AOF and replicas), which
    /// no client of Redis ever counts.
    pub fn waits_for_next_turn(&self, payload: &[u8]) -> bool {
        if self.pending_records.is_empty()
            || !payload
                .windows(8)
                .any(|word| word.eq_ignore_ascii_case(b"REFCOUNT"))
        {
            return false;
        }
        let read = pmnet_redis::adaptor::read_payload(payload, &self.limits, |_| true);
        matches!(read, Payload::Command { args, .. } if pmnet_redis::commands::counts_references(&args))
    }

    pub fn write_records(&mut self, redis: &Redis) {
        if self.pending_records.is_empty() {
            return;
        }
        let mut records = std::mem::take(&mut self.pending_records);
        // Stable: each session's requests stay in the order applied.
        records.sort_by_key(|&(session_id, ..)| session_id);
        redis.select(self.record_db);
        for session in records.chunk_by(|a, b| a.0 == b.0) {
            self.write_record(redis, session);
        }
    }

    /// One session's record, with the replies of `records` (its requests, in the order
    /// applied): the last number and an entry per request (`script::entry_value`).
    fn write_record(&mut self, redis: &Redis, records: &[(u64, u32, Vec<u8>)]) {
        let Some(&(session_id, seq, _)) = records.last() else {
            return;
        };
        let key = script::record_key(&self.record_prefix, session_id);
        let mut args: Vec<Vec<u8>> = Vec::with_capacity(4 + 2 * records.len());
        args.extend([
            b"HSET".to_vec(),
            key,
            b"seq".to_vec(),
            seq.to_string().into_bytes(),
        ]);
        for (_, seq, reply) in records.iter() {
            args.push(script::entry_field(*seq).into_bytes());
            args.push(script::entry_value(*seq, reply));
        }
        let written = redis.call(Mode::Record, &args);
        let mut failed = written.starts_with(b"-");
        let now = std::time::Instant::now();
        let refresh = self.ttl.is_some_and(|ttl| {
            self.ttl_set_at
                .get(&session_id)
                .is_none_or(|&at| now.duration_since(at) >= ttl / 4)
        });
        if let (Some(ttl), true) = (self.ttl, refresh) {
            if self.ttl_set_at.len() >= TTL_TRACKED_MAX {
                self.ttl_set_at.clear();
            }
            self.ttl_set_at.insert(session_id, now);
            failed |= redis
                .call(
                    Mode::Record,
                    &[
                        b"EXPIRE".as_slice(),
                        &args[1],
                        ttl.as_secs().to_string().as_bytes(),
                    ],
                )
                .starts_with(b"-");
        }
        if failed {
            self.counters.record_errors += 1;
            crate::ffi::log(
                redis.ctx(),
                c"warning",
                &format!(
                    "pmnet: the record of session {session_id:016x} (number {seq}) could not be \
                     written: {}",
                    String::from_utf8_lossy(&written).trim_end()
                ),
            );
        }
    }

    /// Whether clients may select `db`: one Redis has, and not the records'.
    pub(crate) fn is_user_db(&self, db: i64) -> bool {
        pmnet_redis::adaptor::is_user_db(self.databases, self.record_db, db)
    }

    /// The database a request runs in and what to do with it (the adaptor's reading of a
    /// payload).
    fn decode(&mut self, payload: &[u8]) -> (u32, Op) {
        let (databases, record_db) = (self.databases, self.record_db);
        let read = pmnet_redis::adaptor::read_payload(payload, &self.limits, |db| {
            pmnet_redis::adaptor::is_user_db(databases, record_db, db)
        });
        match read {
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

    fn decode_command(&mut self, args: Vec<Vec<u8>>) -> Op {
        if args[0].eq_ignore_ascii_case(b"SELECT") && args.len() == 2 {
            return Op::Literal(
                match pmnet_redis::adaptor::check_select(&args[1], |db| self.is_user_db(db)) {
                    Ok(_) => pmnet_redis::commands::OK.to_vec(),
                    Err(message) => error_reply(message),
                },
            );
        }
        if args[0].eq_ignore_ascii_case(pmnet_redis::adaptor::EXEC_COMMAND) {
            return Op::Exec(args);
        }
        if args[0].eq_ignore_ascii_case(pmnet_redis::adaptor::WATCH_COMMAND) {
            return Op::Watch(args[1..].to_vec());
        }
        if args[0].eq_ignore_ascii_case(pmnet_redis::adaptor::INFO_COMMAND) {
            return Op::Run {
                args: pmnet_redis::adaptor::info_request(self.record_db, &args[1..]),
                writes: false,
            };
        }
        match self.table.classify(&args, self.record_db) {
            Run::Refuse(message) => Op::Literal(error_reply(&message)),
            Run::Direct | Run::Read => Op::Run {
                args,
                writes: false,
            },
            Run::Write | Run::Function | Run::FunctionChange => Op::Run { args, writes: true },
            Run::Script if args[0].eq_ignore_ascii_case(b"EVALSHA") => Op::ScriptSha(args),
            Run::Script => Op::Run { args, writes: true },
            Run::ScriptLoad => Op::ScriptLoad(args),
            Run::FlushAll => Op::FlushAll(args.get(1).cloned()),
        }
    }
}
