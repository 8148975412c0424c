//! Which path each Redis command takes through the gateway: answered by the gateway (the
//! connection's own state: `HELLO`, `AUTH`, `CLIENT`, `MULTI`, …), sent as a PMNet update
//! (logged by the device and answered on its ack), or as a bypass request (answered with
//! Redis's reply).
//!
//! The rule: a command goes as an update only when the gateway can tell from its arguments
//! that Redis's reply is fixed (`+OK`). Everything else the gateway does not answer itself goes
//! as a bypass request, and the adaptor decides from Redis's own command table (`COMMAND`)
//! how to run it, or refuses it with a precise error ([`crate::table`]).

use crate::resp::{error_reply, parse_int};

/// How the gateway treats a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Answered by the gateway from nothing but its arguments.
    Local,
    /// Answered by the gateway from the connection's state (see `gateway::connection`).
    Connection,
    /// Redis always answers `+OK` when the arguments are well formed: a PMNet update, answered
    /// `+OK` once the device logged it. Ill-formed arguments go as bypass (Redis's error).
    Fixed,
    /// A write whose reply is a count or a new value: bypass by default; with
    /// `--ack-counting-writes` an update answered `+OK` (the count is not known then).
    Counting,
    /// Needs Redis's own connection semantics: sent on the client connection's direct
    /// connection to Redis (`gateway::direct`).
    Direct(DirectKind),
    /// Refused with an error that says why.
    Refused(&'static str),
}

/// How a command of [`Class::Direct`] goes direct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectKind {
    /// One command and its reply (blocking commands, `WAIT`, `WAITAOF`).
    OneShot,
    /// `XREAD`/`XREADGROUP`: one-shot with `BLOCK`, a bypass request without.
    StreamRead,
    /// The connection turns into a stream (pub/sub, `MONITOR`): every later command of the
    /// client goes direct too.
    Sticky,
}

/// A command the gateway knows.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub name: &'static str,
    /// Redis's arity: `n` exactly n words (the name included), `-n` at least n.
    pub arity: i32,
    pub class: Class,
}

const fn spec(name: &'static str, arity: i32, class: Class) -> Spec {
    Spec { name, arity, class }
}

const NO_REPLICATION: &str = "replication streams are not supported through the pmnet \
                              gateway: connect to Redis directly for them";

use Class::{Connection, Counting, Direct, Fixed, Local, Refused};
use DirectKind::{OneShot, Sticky, StreamRead};

/// Every command the gateway itself knows, in the order of the table in docs/redis.md.
/// Anything else goes to the adaptor as a bypass request.
pub const COMMANDS: &[Spec] = &[
    // Answered from the arguments.
    spec("PING", -1, Local),
    spec("ECHO", 2, Local),
    spec("QUIT", -1, Local),
    // Answered from the connection's state.
    spec("HELLO", -1, Connection),
    spec("AUTH", -2, Connection),
    spec("CLIENT", -2, Connection),
    spec("SELECT", 2, Connection),
    spec("RESET", 1, Connection),
    spec("MULTI", 1, Connection),
    spec("EXEC", 1, Connection),
    spec("DISCARD", 1, Connection),
    spec("WATCH", -2, Connection),
    spec("UNWATCH", 1, Connection),
    // Fixed reply: updates.
    spec("SET", -3, Fixed),
    spec("SETEX", 4, Fixed),
    spec("PSETEX", 4, Fixed),
    spec("MSET", -3, Fixed),
    spec("HMSET", -4, Fixed),
    // Counting writes: bypass, or updates answered +OK with --ack-counting-writes.
    spec("DEL", -2, Counting),
    spec("UNLINK", -2, Counting),
    spec("EXPIRE", -3, Counting),
    spec("PEXPIRE", -3, Counting),
    spec("INCR", 2, Counting),
    spec("DECR", 2, Counting),
    spec("INCRBY", 3, Counting),
    spec("DECRBY", 3, Counting),
    spec("APPEND", 3, Counting),
    spec("LPUSH", -3, Counting),
    spec("RPUSH", -3, Counting),
    spec("SADD", -3, Counting),
    spec("SREM", -3, Counting),
    spec("HSET", -4, Counting),
    spec("HDEL", -3, Counting),
    spec("ZADD", -4, Counting),
    spec("ZREM", -3, Counting),
    // Direct, one-shot: they block, or wait for Redis's replicas or fsync.
    spec("BLPOP", -3, Direct(OneShot)),
    spec("BRPOP", -3, Direct(OneShot)),
    spec("BRPOPLPUSH", 4, Direct(OneShot)),
    spec("BLMOVE", 6, Direct(OneShot)),
    spec("BLMPOP", -5, Direct(OneShot)),
    spec("BZPOPMIN", -3, Direct(OneShot)),
    spec("BZPOPMAX", -3, Direct(OneShot)),
    spec("BZMPOP", -5, Direct(OneShot)),
    spec("XREAD", -4, Direct(StreamRead)),
    spec("XREADGROUP", -7, Direct(StreamRead)),
    spec("WAIT", 3, Direct(OneShot)),
    spec("WAITAOF", 4, Direct(OneShot)),
    // Direct, sticky: they turn the connection into a stream.
    spec("SUBSCRIBE", -2, Direct(Sticky)),
    spec("PSUBSCRIBE", -2, Direct(Sticky)),
    spec("SSUBSCRIBE", -2, Direct(Sticky)),
    spec("UNSUBSCRIBE", -1, Direct(Sticky)),
    spec("PUNSUBSCRIBE", -1, Direct(Sticky)),
    spec("SUNSUBSCRIBE", -1, Direct(Sticky)),
    spec("MONITOR", 1, Direct(Sticky)),
    // Refused.
    spec("SYNC", 1, Refused(NO_REPLICATION)),
    spec("PSYNC", -3, Refused(NO_REPLICATION)),
];

/// The spec of a command name (any case).
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    COMMANDS
        .iter()
        .find(|spec| spec.name.as_bytes().eq_ignore_ascii_case(name))
}

/// What the gateway does with a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Answer with these bytes now (in order with earlier replies).
    Reply(Vec<u8>),
    /// Send as a PMNet update; answer `ack` when the device has logged it.
    Update { ack: &'static [u8] },
    /// Send as a PMNet bypass request; answer with Redis's reply.
    Bypass,
    /// Answer `+OK` and close the connection.
    Quit,
    /// Answered from the connection's state (named by the spec).
    Connection(&'static str),
    /// Sent on the connection's direct connection to Redis (`sticky`: and every later
    /// command too).
    Direct { sticky: bool },
}

/// The gateway's choices.
#[derive(Debug, Clone, Copy, Default)]
pub struct Policy {
    /// Send counting writes as updates answered `+OK` (see [`Class::Counting`]).
    pub ack_counting_writes: bool,
}

pub const OK: &[u8] = b"+OK\r\n";

fn bulk(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    crate::resp::encode_bulk(bytes, &mut out);
    out
}

fn lower(name: &[u8]) -> String {
    String::from_utf8_lossy(name).to_ascii_lowercase()
}

/// Where `args` (a non-empty command) goes.
pub fn route(args: &[Vec<u8>], policy: &Policy) -> Route {
    let Some(name) = args.first() else {
        return Route::Reply(error_reply("ERR empty command"));
    };
    let Some(spec) = lookup(name) else {
        // The adaptor knows Redis's whole table: arity, unknown commands and refusals there.
        return Route::Bypass;
    };
    let count = args.len() as i64;
    let arity = i64::from(spec.arity);
    if (arity > 0 && count != arity) || (arity < 0 && count < -arity) {
        return Route::Reply(error_reply(&format!(
            "ERR wrong number of arguments for '{}' command",
            lower(name)
        )));
    }
    match spec.class {
        Local => local(spec.name, args),
        Connection => Route::Connection(spec.name),
        Fixed if fixed_reply_is_certain(spec.name, args) => Route::Update { ack: OK },
        Fixed => Route::Bypass,
        Counting if policy.ack_counting_writes && counting_args_are_valid(spec.name, args) => {
            Route::Update { ack: OK }
        }
        Counting => Route::Bypass,
        Direct(OneShot) => Route::Direct { sticky: false },
        Direct(StreamRead) if args.iter().any(|arg| arg.eq_ignore_ascii_case(b"BLOCK")) => {
            Route::Direct { sticky: false }
        }
        Direct(StreamRead) => Route::Bypass,
        Direct(Sticky) => Route::Direct { sticky: true },
        Refused(reason) => Route::Reply(error_reply(&format!("ERR {reason}"))),
    }
}

fn local(name: &str, args: &[Vec<u8>]) -> Route {
    match name {
        "PING" => match args.len() {
            1 => Route::Reply(b"+PONG\r\n".to_vec()),
            2 => Route::Reply(bulk(&args[1])),
            _ => Route::Reply(error_reply(
                "ERR wrong number of arguments for 'ping' command",
            )),
        },
        "ECHO" => Route::Reply(bulk(&args[1])),
        _ => Route::Quit,
    }
}

fn positive_int(bytes: &[u8]) -> bool {
    parse_int(bytes).is_some_and(|value| value > 0)
}

/// Whether Redis is certain to answer `+OK` to this well-formed fixed-reply command.
fn fixed_reply_is_certain(name: &str, args: &[Vec<u8>]) -> bool {
    match name {
        "SET" => set_options_are_plain(&args[3..]),
        "SETEX" | "PSETEX" => positive_int(&args[2]),
        "MSET" => (args.len() - 1) % 2 == 0,
        // HMSET also fails with WRONGTYPE when the key holds another type: documented.
        "HMSET" => (args.len() - 2) % 2 == 0,
        _ => false,
    }
}

/// SET options that never change the reply: at most one expiry, KEEPTTL. NX, XX and GET make
/// the reply depend on the data; anything unknown goes to Redis for its error.
fn set_options_are_plain(options: &[Vec<u8>]) -> bool {
    let mut expiry = false;
    let mut index = 0;
    while index < options.len() {
        let option = options[index].to_ascii_uppercase();
        match option.as_slice() {
            b"EX" | b"PX" | b"EXAT" | b"PXAT" => {
                if expiry || !options.get(index + 1).is_some_and(|n| positive_int(n)) {
                    return false;
                }
                expiry = true;
                index += 2;
            }
            b"KEEPTTL" => {
                if expiry {
                    return false;
                }
                expiry = true;
                index += 1;
            }
            _ => return false,
        }
    }
    true
}

/// Arguments of a counting write that Redis cannot reject for their form (it may still answer
/// WRONGTYPE: documented).
fn counting_args_are_valid(name: &str, args: &[Vec<u8>]) -> bool {
    match name {
        "INCRBY" | "DECRBY" => parse_int(&args[2]).is_some(),
        "EXPIRE" | "PEXPIRE" => args.len() == 3 && parse_int(&args[2]).is_some(),
        "HSET" => (args.len() - 2) % 2 == 0,
        "ZADD" => {
            // Plain `ZADD key score member [score member …]` only: options change the reply.
            let pairs = &args[2..];
            pairs.len() % 2 == 0
                && pairs.chunks(2).all(|pair| {
                    std::str::from_utf8(&pair[0])
                        .is_ok_and(|s| s.parse::<f64>().is_ok_and(|f| !f.is_nan()))
                })
        }
        _ => true,
    }
}

/// What a command does to the keys a device's read cache may hold (docs/cache.md, "Through
/// the Redis gateway"). Every command that may write reaches the device keyed, or as a
/// barrier, so that no cached value outlives a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheUse<'a> {
    /// `GET key`: a cache read.
    Read(&'a [u8]),
    /// A write of this one key (a keyed update or bypass); `reply_after`, for a plain
    /// `SET key value`, is what a `GET` of the key answers after it.
    Write {
        key: &'a [u8],
        reply_after: Option<Vec<u8>>,
    },
    /// A write that may change several keys, or any (a barrier: the cache drops everything).
    Barrier,
    /// Changes no key.
    Nothing,
}

/// Commands whose only key is their first argument and that may write it.
const ONE_KEY_WRITES: &[&str] = &[
    "SET",
    "SETEX",
    "PSETEX",
    "SETNX",
    "GETSET",
    "GETDEL",
    "GETEX",
    "APPEND",
    "SETRANGE",
    "INCR",
    "DECR",
    "INCRBY",
    "DECRBY",
    "INCRBYFLOAT",
    "EXPIRE",
    "PEXPIRE",
    "EXPIREAT",
    "PEXPIREAT",
    "PERSIST",
    "HSET",
    "HSETNX",
    "HMSET",
    "HDEL",
    "HINCRBY",
    "HINCRBYFLOAT",
    "LPUSH",
    "RPUSH",
    "LPUSHX",
    "RPUSHX",
    "LPOP",
    "RPOP",
    "LSET",
    "LREM",
    "LTRIM",
    "LINSERT",
    "SADD",
    "SREM",
    "SPOP",
    "ZADD",
    "ZREM",
    "ZINCRBY",
    "ZPOPMIN",
    "ZPOPMAX",
    "ZREMRANGEBYSCORE",
    "ZREMRANGEBYRANK",
    "ZREMRANGEBYLEX",
    "PFADD",
    "SETBIT",
    "BITFIELD",
    "XADD",
    "XDEL",
    "XTRIM",
    "GEOADD",
    "RESTORE",
];

/// Commands that write no key (they read, or act outside the data).
const NO_WRITES: &[&str] = &[
    "GET",
    "MGET",
    "STRLEN",
    "GETRANGE",
    "SUBSTR",
    "EXISTS",
    "TTL",
    "PTTL",
    "EXPIRETIME",
    "PEXPIRETIME",
    "TYPE",
    "HGET",
    "HMGET",
    "HGETALL",
    "HKEYS",
    "HVALS",
    "HLEN",
    "HEXISTS",
    "HSTRLEN",
    "HRANDFIELD",
    "HSCAN",
    "LRANGE",
    "LLEN",
    "LINDEX",
    "LPOS",
    "SMEMBERS",
    "SISMEMBER",
    "SMISMEMBER",
    "SCARD",
    "SRANDMEMBER",
    "SSCAN",
    "SINTER",
    "SUNION",
    "SDIFF",
    "SINTERCARD",
    "ZRANGE",
    "ZRANGEBYSCORE",
    "ZRANGEBYLEX",
    "ZREVRANGE",
    "ZREVRANGEBYSCORE",
    "ZREVRANGEBYLEX",
    "ZSCORE",
    "ZMSCORE",
    "ZCARD",
    "ZCOUNT",
    "ZLEXCOUNT",
    "ZRANK",
    "ZREVRANK",
    "ZSCAN",
    "ZRANDMEMBER",
    "ZINTER",
    "ZUNION",
    "ZDIFF",
    "ZINTERCARD",
    "KEYS",
    "SCAN",
    "RANDOMKEY",
    "DBSIZE",
    "DUMP",
    "OBJECT",
    "GETBIT",
    "BITCOUNT",
    "BITPOS",
    "BITFIELD_RO",
    "XRANGE",
    "XREVRANGE",
    "XLEN",
    "LCS",
    "SORT_RO",
    "GEOPOS",
    "GEODIST",
    "GEOHASH",
    "GEOSEARCH",
    "GEORADIUS_RO",
    "GEORADIUSBYMEMBER_RO",
    "TOUCH",
    "INFO",
    "TIME",
    "LASTSAVE",
    "PING",
    "ECHO",
    "COMMAND",
    "PUBLISH",
    "EVAL_RO",
    "EVALSHA_RO",
    "FCALL_RO",
    "MEMORY",
    "PFCOUNT",
];

fn named(list: &[&str], name: &[u8]) -> bool {
    list.iter()
        .any(|entry| entry.as_bytes().eq_ignore_ascii_case(name))
}

/// What `args` (a command the gateway sends on, not answered by itself) does to the keys a
/// cache may hold. Unknown commands are barriers: a command must be known to write nothing,
/// or one key, to be sent otherwise.
pub fn cache_use(args: &[Vec<u8>]) -> CacheUse<'_> {
    let Some(name) = args.first() else {
        return CacheUse::Nothing;
    };
    if name.eq_ignore_ascii_case(b"GET") && args.len() == 2 && !args[1].is_empty() {
        return CacheUse::Read(&args[1]);
    }
    if named(NO_WRITES, name) {
        return CacheUse::Nothing;
    }
    let key = args
        .get(1)
        .filter(|key| !key.is_empty() && key.len() <= 255);
    // DEL and UNLINK of one key write it; of several, they are barriers.
    let one_key_delete = (name.eq_ignore_ascii_case(b"DEL")
        || name.eq_ignore_ascii_case(b"UNLINK"))
        && args.len() == 2;
    match key {
        Some(key) if one_key_delete || named(ONE_KEY_WRITES, name) => {
            // A plain `SET key value`: the value a GET answers after it (an option such as
            // an expiry or a condition makes the write only invalidate).
            let reply_after =
                (name.eq_ignore_ascii_case(b"SET") && args.len() == 3).then(|| bulk(&args[2]));
            CacheUse::Write { key, reply_after }
        }
        _ => CacheUse::Barrier,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|word| word.as_bytes().to_vec()).collect()
    }

    fn route_of(words: &[&str]) -> Route {
        route(&args(words), &Policy::default())
    }

    #[test]
    fn plain_sets_are_updates_and_conditional_ones_bypass() {
        assert_eq!(route_of(&["set", "k", "v"]), Route::Update { ack: OK });
        assert_eq!(
            route_of(&["SET", "k", "v", "EX", "10"]),
            Route::Update { ack: OK }
        );
        assert_eq!(route_of(&["SET", "k", "v", "NX"]), Route::Bypass);
        assert_eq!(route_of(&["SET", "k", "v", "GET"]), Route::Bypass);
        assert_eq!(route_of(&["SET", "k", "v", "EX", "0"]), Route::Bypass);
        assert_eq!(
            route_of(&["SET", "k", "v", "EX", "1", "PX", "1"]),
            Route::Bypass
        );
        assert_eq!(route_of(&["MSET", "a", "1", "b"]), Route::Bypass);
        assert_eq!(
            route_of(&["MSET", "a", "1", "b", "2"]),
            Route::Update { ack: OK }
        );
        assert_eq!(route_of(&["GET", "k"]), Route::Bypass);
    }

    #[test]
    fn counting_writes_follow_the_policy() {
        assert_eq!(route_of(&["LPUSH", "l", "x"]), Route::Bypass);
        let policy = Policy {
            ack_counting_writes: true,
        };
        assert_eq!(
            route(&args(&["LPUSH", "l", "x"]), &policy),
            Route::Update { ack: OK }
        );
        assert_eq!(route(&args(&["INCRBY", "n", "x"]), &policy), Route::Bypass);
        assert_eq!(
            route(&args(&["ZADD", "z", "NX", "1", "m"]), &policy),
            Route::Bypass
        );
        assert_eq!(
            route(&args(&["ZADD", "z", "1.5", "m"]), &policy),
            Route::Update { ack: OK }
        );
    }

    #[test]
    fn local_unknown_and_refused_commands_are_answered_at_once() {
        assert_eq!(route_of(&["ping"]), Route::Reply(b"+PONG\r\n".to_vec()));
        assert_eq!(
            route_of(&["ECHO", "hi"]),
            Route::Reply(b"$2\r\nhi\r\n".to_vec())
        );
        assert_eq!(route_of(&["QUIT"]), Route::Quit);
        for words in [&["SET", "k"][..], &["SYNC"], &["ECHO"], &["BLPOP", "l"]] {
            match route_of(words) {
                Route::Reply(bytes) => assert!(bytes.starts_with(b"-ERR "), "{words:?}"),
                other => panic!("{words:?} routed {other:?}"),
            }
        }
        assert_eq!(route_of(&["CONFIG", "GET", "save"]), Route::Bypass);
        // Unknown here: the adaptor answers from Redis's table.
        assert_eq!(route_of(&["NOPE"]), Route::Bypass);
        assert_eq!(route_of(&["ZREVRANGE", "z", "0", "-1"]), Route::Bypass);
        assert_eq!(route_of(&["multi"]), Route::Connection("MULTI"));
        assert_eq!(route_of(&["hello", "3"]), Route::Connection("HELLO"));
    }

    #[test]
    fn blocking_and_streaming_commands_go_direct() {
        let one_shot = Route::Direct { sticky: false };
        let sticky = Route::Direct { sticky: true };
        assert_eq!(route_of(&["blpop", "l", "0"]), one_shot);
        assert_eq!(
            route_of(&["BLMOVE", "a", "b", "LEFT", "RIGHT", "0"]),
            one_shot
        );
        assert_eq!(route_of(&["WAIT", "0", "0"]), one_shot);
        assert_eq!(
            route_of(&["XREAD", "BLOCK", "0", "STREAMS", "s", "$"]),
            one_shot
        );
        assert_eq!(route_of(&["XREAD", "STREAMS", "s", "0"]), Route::Bypass);
        assert_eq!(route_of(&["SUBSCRIBE", "c"]), sticky);
        assert_eq!(route_of(&["UNSUBSCRIBE"]), sticky);
        assert_eq!(route_of(&["MONITOR"]), sticky);
    }

    #[test]
    fn every_write_reaches_a_cache_keyed_or_as_a_barrier() {
        let uses = |words: &[&str]| {
            let args = args(words);
            let shape = match cache_use(&args) {
                CacheUse::Read(key) => format!("read {}", String::from_utf8_lossy(key)),
                CacheUse::Write { key, reply_after } => format!(
                    "write {} {:?}",
                    String::from_utf8_lossy(key),
                    reply_after.map(|reply| String::from_utf8_lossy(&reply).into_owned())
                ),
                CacheUse::Barrier => "barrier".to_owned(),
                CacheUse::Nothing => "nothing".to_owned(),
            };
            shape
        };
        assert_eq!(uses(&["get", "k"]), "read k");
        assert_eq!(
            uses(&["SET", "k", "hello"]),
            "write k Some(\"$5\\r\\nhello\\r\\n\")"
        );
        assert_eq!(uses(&["SET", "k", "v", "EX", "10"]), "write k None");
        assert_eq!(uses(&["incr", "n"]), "write n None");
        assert_eq!(uses(&["DEL", "k"]), "write k None");
        assert_eq!(uses(&["DEL", "a", "b"]), "barrier");
        assert_eq!(uses(&["MSET", "a", "1", "b", "2"]), "barrier");
        assert_eq!(uses(&["RENAME", "a", "b"]), "barrier");
        assert_eq!(uses(&["FLUSHALL"]), "barrier");
        assert_eq!(uses(&["EVAL", "return 1", "0"]), "barrier");
        assert_eq!(uses(&["NOT-A-COMMAND", "k"]), "barrier");
        assert_eq!(uses(&["PMNET.EXEC", "0", "0"]), "barrier");
        assert_eq!(uses(&["MGET", "a", "b"]), "nothing");
        assert_eq!(uses(&["GET", "a", "b"]), "nothing");
        assert_eq!(uses(&["PTTL", "k"]), "nothing");
        assert_eq!(uses(&["PMNET.WATCH", "k"]), "barrier");
    }

    #[test]
    fn every_command_is_in_the_documentation() {
        let docs = include_str!("../../../docs/redis.md");
        for spec in COMMANDS {
            assert!(
                docs.contains(&format!("`{}`", spec.name)),
                "docs/redis.md does not list {}",
                spec.name
            );
        }
    }
}
