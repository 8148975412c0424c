//! Differential test: random command sequences run on a plain `redis-server` and through
//! `pmnet redis-up --start-redis DIR` (started as docs/redis.md shows a user), one connection
//! each, in the same order. Every reply must be the same byte for byte (normalized only where
//! Redis itself answers by chance, by the clock or in its hash tables' order:
//! `redis_differential/compare.rs` says where), and afterwards every database the sequence used
//! must hold the same keys, types, expiry (present or not), encodings and values.
//!
//! The generator (`redis_differential/gen.rs`) covers Redis 7's command table broadly —
//! strings, counters at ±2^53 and ±2^63, hashes, lists, sets, sorted sets, streams, bitmaps,
//! HyperLogLog, geo, the keyspace and expiries, transactions, scripts, the connection — and the
//! invalid forms of many (wrong arity, bad integers and floats, bad options, unknown commands
//! and subcommands), with keys from a small pool so that types collide.
//!
//! Knobs (environment):
//! - `PMNET_SEED=N`: the seed (printed at the start; case `i` runs with its own seed, printed
//!   with any difference: `PMNET_SEED=<case seed> PMNET_DIFF_CASES=1` replays that case);
//! - `PMNET_DIFF_SECONDS` (default 30): stop starting cases after this long;
//!   `PMNET_DIFF_CASES`: at most this many cases;
//! - `PMNET_DIFF_LENGTH` (default 24): commands per case at most;
//! - `PMNET_DIFF_SKIP=HMSET,SELECT,…`: leave these commands (names, or `NAME SUB`) out, to look
//!   past differences already known; the default leaves nothing out.
//!
//! Every distinct difference (by command and kind of reply) is shrunk with proptest and printed
//! with the seed, the shrunk sequence and both systems' replies; the test fails if there is any.
//! The long run, a benchmark command in docs/benchmarks.md:
//! `PMNET_DIFF_SECONDS=600 cargo test --release -p pmnet --test redis_differential -- --nocapture`

#[path = "redis_differential/compare.rs"]
mod compare;
#[path = "redis_differential/gen.rs"]
mod gen;
#[path = "redis_differential/gen_more.rs"]
mod gen_more;
mod redis_harness;

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use compare::{dump, name_of, same, show_command, Conn, Reply};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use redis_harness::{free_tcp_port, free_udp_port, poll_until, require_redis, Redis, BIN};

type Cmd = Vec<Vec<u8>>;

/// Longest wait for one reply: beyond the gateway's own give-up (about 13 s).
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|text| {
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, got {text:?}"))
    })
}

/// `pmnet redis-up --start-redis DIR` with ports of the test's own; stopped (SIGTERM) when
/// dropped, which stops everything it started.
struct RedisUp {
    child: Child,
    gateway: u16,
    redis_port: u16,
    _dir: tempfile::TempDir,
}

impl RedisUp {
    fn start() -> RedisUp {
        let dir = tempfile::tempdir().expect("temporary directory");
        let gateway = free_tcp_port();
        let log = dir.path().join("redis-up.out");
        let child = Command::new(BIN)
            .arg("redis-up")
            .arg("--start-redis")
            .arg(dir.path().join("redis"))
            .args(["--listen", &format!("127.0.0.1:{gateway}")])
            .args(["--device-listen", &format!("127.0.0.1:{}", free_udp_port())])
            .args([
                "--adaptor-listen",
                &format!("127.0.0.1:{}", free_udp_port()),
            ])
            .arg("--log-file")
            .arg(dir.path().join("device.log"))
            .stdout(std::fs::File::create(&log).expect("log file"))
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start pmnet redis-up");
        poll_until("redis-up says where clients connect", || {
            std::fs::read_to_string(&log).is_ok_and(|text| text.contains("clients connect to"))
        });
        let text = std::fs::read_to_string(&log).expect("redis-up's output");
        let redis_port = text
            .split("Redis at 127.0.0.1:")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("redis-up names its Redis:\n{text}"));
        RedisUp {
            child,
            gateway,
            redis_port,
            _dir: dir,
        }
    }
}

impl Drop for RedisUp {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child's pid with SIGTERM; no memory is involved.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The two systems.
struct Systems {
    redis: Redis,
    up: RedisUp,
    _dir: tempfile::TempDir,
}

impl Systems {
    fn start() -> Systems {
        require_redis();
        let dir = tempfile::tempdir().expect("temporary directory");
        let redis = Redis::start(dir.path());
        let up = RedisUp::start();
        Systems {
            redis,
            up,
            _dir: dir,
        }
    }

    fn plain(&self) -> Conn {
        Conn::connect(self.redis.addr(), REPLY_TIMEOUT)
    }

    fn gateway(&self) -> Conn {
        Conn::connect(
            std::net::SocketAddr::from(([127, 0, 0, 1], self.up.gateway)),
            REPLY_TIMEOUT,
        )
    }

    /// The redis-server behind the gateway, directly.
    fn behind(&self) -> Conn {
        Conn::connect(
            std::net::SocketAddr::from(([127, 0, 0, 1], self.up.redis_port)),
            REPLY_TIMEOUT,
        )
    }
}

/// What differed in a run.
#[derive(Debug, Clone)]
enum Difference {
    Reply {
        index: usize,
        redis: Reply,
        pmnet: Reply,
    },
    Keyspace {
        db: u32,
        redis: String,
        pmnet: String,
    },
}

/// A run of a sequence: each command's replies, and the first difference.
#[derive(Debug)]
struct Run {
    replies: Vec<(Reply, Reply)>,
    difference: Option<Difference>,
}

fn kind(reply: &Reply) -> String {
    match reply {
        Reply::Value { raw, .. } if raw.first() == Some(&b'-') => {
            let text = String::from_utf8_lossy(&raw[1..]);
            format!("-{}", text.split_whitespace().next().unwrap_or(""))
        }
        Reply::Value { raw, .. } => String::from_utf8_lossy(&raw[..1]).into_owned(),
        Reply::Closed(_) => "<closed>".to_owned(),
    }
}

/// An error reply's first words (up to a quoted one, at most four), or the reply's kind.
fn detail(reply: &Reply) -> String {
    match reply {
        Reply::Value { raw, .. } if raw.first() == Some(&b'-') => {
            let text = String::from_utf8_lossy(&raw[1..]);
            let words: Vec<&str> = text
                .split_whitespace()
                .take_while(|word| !word.contains('\''))
                .take(4)
                .collect();
            format!("-{}", words.join(" "))
        }
        Reply::Value { raw, .. } if raw == b"+QUEUED\r\n" => "+QUEUED".to_owned(),
        other => kind(other),
    }
}

/// What makes two differences the same: the command and the kinds of the two replies, or
/// the database whose keyspace differed. A command queued by one system and refused by the
/// other in a transaction, and the text of Redis's unknown-command error, are one difference
/// whatever the command.
fn signature(sequence: &[Cmd], difference: &Difference) -> String {
    match difference {
        Difference::Reply {
            index,
            redis,
            pmnet,
        } => {
            let (a, b) = (detail(redis), detail(pmnet));
            if (a == "+QUEUED") != (b == "+QUEUED") {
                return format!("inside MULTI: pmnet {b}, Redis {a}");
            }
            if a.starts_with("-ERR unknown command") {
                return format!("unknown command: pmnet {b}, Redis {a}");
            }
            let (a, b) = (kind(redis), kind(pmnet));
            let how = if a == b {
                format!("different {a} replies")
            } else {
                format!("pmnet {b}, Redis {a}")
            };
            format!("{}: {how}", name_of(&sequence[*index]))
        }
        Difference::Keyspace { db, .. } => format!("keyspace of database {db}"),
    }
}

fn upper_name(cmd: &Cmd) -> String {
    String::from_utf8_lossy(&cmd[0]).to_ascii_uppercase()
}

/// Run `sequence` on both systems from empty databases, and compare.
fn run(systems: &Systems, sequence: &[Cmd]) -> Run {
    // Empty both (through the gateway, as a user would: its FLUSHALL keeps the records).
    for mut conn in [systems.plain(), systems.gateway()] {
        let reply = conn.value(&["FLUSHALL"]);
        assert_eq!(reply.to_bytes(), b"+OK\r\n", "FLUSHALL");
    }
    let (mut plain, mut gateway) = (systems.plain(), systems.gateway());
    let outcome = compare(systems, &mut plain, &mut gateway, sequence);
    // The gateway acks an update once the device has logged it; a read on the same connection
    // is answered after every earlier write of the connection is applied. So before the next
    // case's FLUSHALL (another connection, another session), every write of this one is in.
    gateway.value(&["RESET"]);
    gateway.value(&["EXISTS", "k0"]);
    outcome
}

fn compare(systems: &Systems, plain: &mut Conn, gateway: &mut Conn, sequence: &[Cmd]) -> Run {
    let mut replies = Vec::new();
    let mut queued: Option<Vec<Cmd>> = None;
    for (index, cmd) in sequence.iter().enumerate() {
        let redis = plain.call(cmd);
        let pmnet = gateway.call(cmd);
        let name = upper_name(cmd);
        let ok =
            |reply: &Reply, text: &[u8]| matches!(reply, Reply::Value { raw, .. } if raw == text);
        let exec_of = match name.as_str() {
            "EXEC" | "DISCARD" | "RESET" => queued.take(),
            _ => None,
        };
        let equal = same(
            cmd,
            exec_of.as_deref().filter(|_| name == "EXEC"),
            &redis,
            &pmnet,
        );
        if name == "MULTI" && ok(&redis, b"+OK\r\n") {
            queued = Some(Vec::new());
        } else if let Some(queue) = queued.as_mut() {
            if ok(&redis, b"+QUEUED\r\n") {
                queue.push(cmd.clone());
            }
        }
        let closed = matches!(redis, Reply::Closed(_));
        replies.push((redis.clone(), pmnet.clone()));
        if !equal {
            return Run {
                replies,
                difference: Some(Difference::Reply {
                    index,
                    redis,
                    pmnet,
                }),
            };
        }
        if closed {
            break;
        }
    }
    // The keyspaces: on fresh connections of the same sessions' order (the gateway's reads
    // come after every write of its connection, so RESET and read on the same connection).
    let reset = ["RESET"].map(|w| w.as_bytes().to_vec());
    plain.call(&reset);
    gateway.call(&reset);
    for db in gen_more::databases(sequence) {
        let select = vec![b"SELECT".to_vec(), db.to_string().into_bytes()];
        let (a, b) = (plain.call(&select), gateway.call(&select));
        let (redis, pmnet) = (
            format!("SELECT {db}: {}\n{}", a.show(), dump(plain)),
            format!("SELECT {db}: {}\n{}", b.show(), dump(gateway)),
        );
        if redis != pmnet {
            return Run {
                replies,
                difference: Some(Difference::Keyspace { db, redis, pmnet }),
            };
        }
    }
    // Database 0 of the Redis behind the gateway, read directly: the same again.
    plain.call(&["SELECT", "0"].map(|w| w.as_bytes().to_vec()));
    let (redis, pmnet) = (dump(plain), dump(&mut systems.behind()));
    if redis != pmnet {
        return Run {
            replies,
            difference: Some(Difference::Keyspace {
                db: 0,
                redis,
                pmnet: format!("(read at the Redis behind the gateway)\n{pmnet}"),
            }),
        };
    }
    Run {
        replies,
        difference: None,
    }
}

/// The sequence a case's choices make, without the commands `skip` names.
fn sequence_of(choices: &[Vec<u32>], skip: &[String]) -> Vec<Cmd> {
    choices
        .iter()
        .map(|choices| gen::command(&mut gen::Gen::new(choices)))
        .filter(|cmd| {
            let (name, full) = (upper_name(cmd), name_of(cmd));
            !skip.iter().any(|s| *s == name || *s == full)
        })
        .collect()
}

fn case_seed(master: u64, case: u64) -> u64 {
    if case == 0 {
        return master;
    }
    // splitmix64 of the master seed and the case number.
    let mut z = master.wrapping_add(case.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn runner_for(seed: u64) -> TestRunner {
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&case_seed(seed, i as u64 + 1).to_le_bytes());
    }
    TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    )
}

/// A difference found, shrunk.
struct Found {
    /// The case's seed (none for a fixed sequence).
    seed: Option<u64>,
    sequence: Vec<Cmd>,
    run: Run,
    /// Cases that showed it (the first one's seed is `seed`).
    cases: u64,
}

fn report(signature: &str, found: &Found) -> String {
    let replay = found.seed.map_or_else(String::new, |seed| {
        format!("; replay: PMNET_SEED={seed} PMNET_DIFF_CASES=1")
    });
    let mut out = format!("\n=== {signature} ({} case(s){replay})\n", found.cases);
    out.push_str("shrunk sequence (reply from Redis | through pmnet):\n");
    for (cmd, (redis, pmnet)) in found.sequence.iter().zip(&found.run.replies) {
        out.push_str(&format!("  {}\n", show_command(cmd)));
        if redis.show() == pmnet.show() {
            out.push_str(&format!("      both:  {}\n", redis.show()));
        } else {
            out.push_str(&format!("      Redis: {}\n", redis.show()));
            out.push_str(&format!("      pmnet: {}\n", pmnet.show()));
        }
    }
    if let Some(Difference::Keyspace { db, redis, pmnet }) = &found.run.difference {
        out.push_str(&format!(
            "  database {db} afterwards:\n    Redis:\n{}    pmnet:\n{}",
            indent(redis),
            indent(pmnet)
        ));
    }
    out
}

fn indent(text: &str) -> String {
    text.lines().map(|line| format!("      {line}\n")).collect()
}

#[test]
fn pmnet_answers_and_stores_exactly_as_redis() {
    let master = redis_harness::seed("redis_differential");
    let seconds = env_number("PMNET_DIFF_SECONDS").unwrap_or(30);
    let max_cases = env_number("PMNET_DIFF_CASES").unwrap_or(u64::MAX);
    let length = env_number("PMNET_DIFF_LENGTH").unwrap_or(24).max(1) as usize;
    let shrink_budget = Duration::from_secs(env_number("PMNET_DIFF_SHRINK_SECONDS").unwrap_or(10));
    let skip: Vec<String> = std::env::var("PMNET_DIFF_SKIP")
        .unwrap_or_default()
        .split(',')
        .map(|name| name.trim().to_ascii_uppercase())
        .filter(|name| !name.is_empty())
        .collect();
    let systems = Systems::start();
    let strategy = proptest::collection::vec(
        proptest::collection::vec(proptest::num::u32::ANY, gen::CHOICES),
        1..=length,
    );

    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut found: BTreeMap<String, Found> = BTreeMap::new();
    let (mut cases, mut commands, mut failing) = (0u64, 0u64, 0u64);
    while cases < max_cases && (cases == 0 || Instant::now() < deadline) {
        let seed = case_seed(master, cases);
        cases += 1;
        let mut runner = runner_for(seed);
        let mut tree = strategy.new_tree(&mut runner).expect("a sequence");
        let sequence = sequence_of(&tree.current(), &skip);
        if sequence.is_empty() {
            continue;
        }
        commands += sequence.len() as u64;
        let outcome = run(&systems, &sequence);
        let Some(difference) = &outcome.difference else {
            continue;
        };
        failing += 1;
        let sig = signature(&sequence, difference);
        if let Some(known) = found.get_mut(&sig) {
            known.cases += 1;
            continue;
        }
        eprintln!("redis_differential: case {cases} (PMNET_SEED={seed}): {sig}; shrinking");
        // Shrink (proptest's own loop): keep the smallest sequence with the same signature.
        // Choices a command does not read change nothing: each distinct sequence runs once.
        let mut tried: HashMap<Vec<Cmd>, bool> = HashMap::new();
        tried.insert(sequence.clone(), true);
        let mut best = (sequence, outcome);
        let shrink_started = Instant::now();
        if tree.simplify() {
            while shrink_started.elapsed() < shrink_budget {
                let candidate = sequence_of(&tree.current(), &skip);
                let still = match tried.get(&candidate) {
                    Some(still) => *still,
                    None if candidate.is_empty() => false,
                    None => {
                        let outcome = run(&systems, &candidate);
                        let still = matches!(
                            &outcome.difference,
                            Some(d) if signature(&candidate, d) == sig
                        );
                        tried.insert(candidate.clone(), still);
                        if still && candidate.len() <= best.0.len() {
                            best = (candidate, outcome);
                        }
                        still
                    }
                };
                let more = if still {
                    tree.simplify()
                } else {
                    tree.complicate()
                };
                if !more {
                    break;
                }
            }
        }
        let entry = Found {
            seed: Some(seed),
            sequence: best.0,
            run: best.1,
            cases: 1,
        };
        eprintln!("{}", report(&sig, &entry));
        found.insert(sig, entry);
    }

    eprintln!(
        "redis_differential: PMNET_SEED={master}: {cases} cases, {commands} commands in {:.0?}; \
         {failing} case(s) differed, {} distinct difference(s){}",
        started.elapsed(),
        found.len(),
        if skip.is_empty() {
            String::new()
        } else {
            format!(" (left out: {})", skip.join(","))
        }
    );
    if !found.is_empty() {
        let mut summary = String::new();
        for (sig, entry) in &found {
            summary.push_str(&report(sig, entry));
        }
        panic!(
            "pmnet differs from Redis in {} way(s) (PMNET_SEED={master}):{summary}",
            found.len()
        );
    }
}

fn words(line: &str) -> Cmd {
    line.split('|')
        .map(|word| word.as_bytes().to_vec())
        .collect()
}

/// Replies that pass through the adaptor's Lua scripts come out as Redis sends them: integers
/// beyond ±2^53 exact, nil arrays as nil arrays (also inside a transaction), a script's table
/// read as Redis reads it, and a failing script's error named as Redis names it (its SHA-1 and
/// the line in the user's code). Each sequence is compared with a plain Redis, as above.
#[test]
fn replies_through_the_scripts_are_exact() {
    let systems = Systems::start();
    let sequences: &[&[&str]] = &[
        &[
            "SET|c|9223372036854775806",
            "INCR|c",
            "DECRBY|c|9007199254740993",
            "INCRBY|c|9007199254740993",
            "DECR|c",
            "SET|d|-9007199254740990",
            "DECRBY|d|9",
            "HINCRBY|h|f|9223372036854775807",
            "HINCRBY|h|f|-9007199254740993",
            "MULTI",
            "INCRBY|e|9007199254740993",
            "HINCRBY|h|g|-9223372036854775808",
            "EXEC",
        ],
        &[
            "LPOP|missing|5",
            "RPOP|missing|3",
            "LPOP|missing",
            "LMPOP|1|missing|LEFT",
            "ZMPOP|1|missing|MIN",
            "XGROUP|CREATE|s|g|$|MKSTREAM",
            "XREADGROUP|GROUP|g|c|STREAMS|s|>",
            "XADD|s|1-1|f|v",
            "XREADGROUP|GROUP|g|c|STREAMS|s|>",
            "XDEL|s|1-1",
            "XREADGROUP|GROUP|g|c|STREAMS|s|0",
            "GEOADD|geo|13.36|38.11|a",
            "MULTI",
            "XREAD|STREAMS|missing|0",
            "GEOPOS|geo|a|b",
            "LPOP|missing|2",
            "EXEC",
        ],
        &[
            "SET|str|v",
            "EVAL|return {ARGV[1], KEYS[1]}|1|k",
            "EVAL|return {1, false, 'x'}|0",
            "EVAL|retur 1|0",
            "EVAL|return redis.call('INCR', KEYS[1])|1|str",
            "EVAL|local a = 1\nreturn redis.call('LPUSH', KEYS[1], 'x')|1|str",
            "EVAL|error('raw')|0",
            "EVAL|error({err='tab x'})|0",
            "EVAL|local x = nil\nreturn x.y|0",
            "EVAL|return redis.call('NOPE')|0",
            "EVAL|return 9007199254740993|0",
            "EVAL|return 3.99|0",
            "EVAL|return redis.pcall('HSET', KEYS[1], 'f')|1|str",
            "EVAL|#!lua\nreturn redis.call('INCR', KEYS[1])|1|str",
        ],
        // BITFIELD's 64-bit fields: exact beyond ±2^53, the data as Redis leaves it.
        &[
            "BITFIELD|b|SET|i64|0|4611686018427387905|GET|i64|0",
            "BITFIELD|b|INCRBY|i64|0|4611686018427387905|GET|u63|1|SET|i64|#1|-9007199254740993",
            "BITFIELD|b|OVERFLOW|FAIL|INCRBY|i64|0|9223372036854775807|GET|i64|#1|GET|i8|3",
            "BITFIELD|b|OVERFLOW|SAT|INCRBY|i64|0|9223372036854775807|SET|u63|5|1",
            "BITFIELD|b|SET|i64|100|-9223372036854775808|GET|i64|100|GET|i60|101",
            "GET|b",
            "SET|n|12345678",
            "BITFIELD|n|GET|i64|0|GET|u62|3",
            "OBJECT|ENCODING|n",
            "MULTI",
            "BITFIELD|c|SET|i64|8|-4611686018427387905|GET|i64|8",
            "EXEC",
        ],
        // Scripts inside MULTI run at EXEC as Redis runs them.
        &[
            "MULTI",
            "EVAL|return 1|1|k0",
            "EVAL|return redis.call('SET', KEYS[1], ARGV[1])|1|k0|v",
            "EVAL|retur 1|0",
            "EVAL|local a = 1\nerror('raw')|0",
            "EVAL_RO|return redis.call('SET', KEYS[1], 'x')|1|k0",
            "EVAL_RO|return redis.pcall('LPUSH', KEYS[1], 'x')|1|k0",
            "EVAL_RO|return redis.call('GET', KEYS[1])|1|k0",
            "EVAL|#!lua flags=no-writes\nreturn redis.call('SET', KEYS[1], 'x')|1|k0",
            "EVAL|#!lua flags=no-writes\nreturn redis.call('SET', KEYS[1], 'x')|0",
            "EVAL_RO|return redis.pcall('SET', KEYS[1])|0",
            "EVAL|return redis.call('SELECT', 2)|0",
            "GET|k0",
            "EVAL|return 1|x",
            "EVAL|return 1|-1",
            "EVAL|return 1|5",
            "EVALSHA|ffffffffffffffffffffffffffffffffffffffff|0",
            "EVALSHA_RO|e0e1f9fabfc9d4800c877a703b823ac0578ff8db|0",
            "EVAL|return redis.call('EVAL', 'return 1', 0)|0",
            "EXEC",
            "GET|k0",
        ],
        // Connection commands inside MULTI are queued and run in their place; errors Redis
        // finds while queueing abort the transaction.
        &[
            "MULTI",
            "CLIENT|SETNAME|me",
            "CLIENT|GETNAME",
            "CLIENT|ID",
            "SET|k|0",
            "SELECT|2",
            "SET|k|2",
            "SELECT|16",
            "SELECT|x",
            "UNWATCH",
            "HELLO|2",
            "EXEC",
            "GET|k",
            "CLIENT|GETNAME",
            "MULTI",
            "client|k2",
            "NOPE|k",
            "GET|a|b",
            "SET|k|3",
            "EXEC",
            "GET|k",
            "COMMAND",
            "COMMAND|LIST",
            "COMMAND|INFO|get|client",
        ],
        // An EXEC of the wrong arity aborts (and forgets) the transaction; a database Redis
        // does not have is an error in EXEC's array.
        &[
            "MULTI",
            "SET|k|1",
            "EXEC|k",
            "EXEC",
            "WATCH|k",
            "exec|x",
            "MULTI",
            "MOVE|k|16",
            "SWAPDB|0|16",
            "SET|k|2",
            "EXEC",
            "GET|k",
        ],
        // A watched key is looked at in the database it was watched in.
        &[
            "WATCH|w",
            "SET|w|1",
            "SELECT|2",
            "MULTI",
            "EXEC",
            "WATCH|w",
            "SELECT|0",
            "SET|w|2",
            "MULTI",
            "SET|x|1",
            "EXEC",
            "SELECT|2",
            "GET|x",
        ],
        // SORT without STORE runs as Redis runs it for a client (a script sorts a set even
        // BY nosort); SCRIPT inside MULTI; an EVAL_RO'd script is cached; a subcommand's name
        // shown as Redis shows it.
        &[
            "SADD|s|m3|m0|m1|m2|m10|m11|m12|m13|m14|m15|m16|m17|m18|m19|m20",
            "SORT|s|BY|nosort|LIMIT|0|3",
            "SORT|s|BY|k1",
            "SORT|s|BY|nosort|STORE|d",
            "LRANGE|d|0|-1",
            "MULTI",
            "SCRIPT|LOAD|return 'in multi'",
            "SCRIPT|LOAD|retur 4",
            "SCRIPT|EXISTS|e0e1f9fabfc9d4800c877a703b823ac0578ff8db|ffffffffffffffffffffffffffffffffffffffff",
            "EXEC",
            "EVALSHA|b9c81d25cab28c8a6bdc01f2d9d28d3a7d3267b4|0",
            "EVAL_RO|return 'read only'|0",
            "EVALSHA|8deb5fcb1c339c8a5cbc1028a23f7c5e81d7d7e6|0",
            "CLIENT|k\u{0}x bin",
        ],
    ];
    // EVAL'd scripts are in Redis's script cache as after Redis's own EVAL; one that does not
    // compile is not.
    let sha = |body: &str| pmnet_redis::script::script_sha(body.as_bytes());
    let cache = [
        "EVAL|return 'cached'|0".to_owned(),
        format!(
            "SCRIPT|EXISTS|{}|{}",
            sha("return 'cached'"),
            sha("retur 2")
        ),
        format!("EVALSHA_RO|{}|0", sha("return 'cached'")),
        format!("EVALSHA|{}|0", sha("return 'cached'")),
        "EVAL|retur 2|0".to_owned(),
        format!("EVALSHA|{}|0", sha("retur 2")),
        format!("SCRIPT|EXISTS|{}", sha("retur 2")),
        "SCRIPT|LOAD|retur 3".to_owned(),
        format!("EVALSHA|{}|0", sha("retur 3")),
        "EVAL_RO|return 'read'|0".to_owned(),
        format!("EVALSHA|{}|0", sha("return 'read'")),
        "COMMAND|COUNT".to_owned(),
        "NOPE|k\0ignored|v".to_owned(),
    ];
    let cache: Vec<&str> = cache.iter().map(String::as_str).collect();
    let mut problems = Vec::new();
    for sequence in sequences.iter().chain([&cache[..]].iter()) {
        let sequence: Vec<Cmd> = sequence.iter().map(|line| words(line)).collect();
        let outcome = run(&systems, &sequence);
        if let Some(difference) = &outcome.difference {
            let sig = signature(&sequence, difference);
            let found = Found {
                seed: None,
                sequence: sequence.clone(),
                run: outcome,
                cases: 1,
            };
            problems.push(report(&sig, &found));
        }
    }
    assert!(problems.is_empty(), "{}", problems.concat());
}
