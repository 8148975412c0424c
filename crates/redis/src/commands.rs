//! Which path each Redis command takes through the gateway: answered by the gateway (the
//! connection's own state: `HELLO`, `AUTH`, `CLIENT`, `MULTI`, …), sent as a PMNet update
//! (logged by the device and answered on its ack), or as a bypass request (answered with
//! Redis's reply).
//!
//! The rule: a command goes as an update only when the gateway can tell from its arguments
//! that Redis's reply is fixed (`+OK`). Everything else the gateway does not answer itself goes
//! as a bypass request, and the adaptor decides from Redis's own command table (`COMMAND`)
//! how to run it, or refuses it with a precise error ([`crate::table`]).

use crate::resp::{error_reply, parse_redis_int};

/// How the gateway treats a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Answered by the gateway from nothing but its arguments.
    Local,
    /// Answered by the gateway from the connection's state (see `gateway::connection`).
    Connection,
    /// Redis answers `+OK` whatever the data holds when the arguments are well formed: a
    /// PMNet update, answered `+OK` once the device logged it. Arguments the gateway cannot
    /// prove Redis accepts (syntax, integer ranges, expiry overflow) go as bypass: Redis's
    /// own reply, error included.
    Fixed,
    /// A write whose reply is a count or a new value: bypass by default; with
    /// `--ack-counting-writes` an update answered `+OK` (the count is not known then) — but
    /// only for the forms Redis cannot reject whatever the data holds (`DEL`, `UNLINK`, plain
    /// `EXPIRE`/`PEXPIRE` with an expiry that cannot overflow). A command that may fail on
    /// the data (`WRONGTYPE`, not an integer, overflow) always goes as bypass.
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
    // Answered from the arguments. (`PING` is not: Redis answers it through the whole path,
    // so that a health check fails when any part is down.)
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

/// Whether `args` is `OBJECT REFCOUNT …`: its reply counts the references Redis holds to a
/// value, which a write's propagation holds one more of until its execution unit ends (a
/// script, a transaction, a module's turn); run it after the writes' unit, never inside it.
pub fn counts_references(args: &[Vec<u8>]) -> bool {
    args.len() > 1
        && args[0].eq_ignore_ascii_case(b"OBJECT")
        && args[1].eq_ignore_ascii_case(b"REFCOUNT")
}

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
        Counting if policy.ack_counting_writes && counting_write_cannot_fail(spec.name, args) => {
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
        "ECHO" => Route::Reply(bulk(&args[1])),
        _ => Route::Quit,
    }
}

/// Milliseconds kept free above "now" when the gateway checks that a relative expiry cannot
/// overflow when Redis adds its clock to it (Redis answers "invalid expire time" when
/// `now + ms` overflows a signed 64-bit integer): the command may be applied long after the
/// gateway checked it (a device holds it through an outage), and clocks differ. 100 years.
const EXPIRY_MARGIN_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

/// The current time in Unix milliseconds, as Redis's clock would read it.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

/// The largest relative expiry, in milliseconds, that Redis certainly accepts.
fn max_relative_ms() -> i64 {
    i64::MAX - now_ms().saturating_add(EXPIRY_MARGIN_MS)
}

/// Whether Redis accepts `bytes` as the expiry of `SET … EX/PX/EXAT/PXAT`, `SETEX` or
/// `PSETEX` (`unit` is `EX`, `PX`, `EXAT` or `PXAT`), whenever it applies the command: an
/// integer as Redis parses them, positive, and not overflowing once converted to absolute
/// milliseconds (Redis 7's `getExpireMillisecondsOrReply`).
fn expiry_is_valid(unit: &[u8], bytes: &[u8]) -> bool {
    let Some(value) = parse_redis_int(bytes).filter(|value| *value > 0) else {
        return false;
    };
    match unit {
        b"EX" => value <= max_relative_ms() / 1000,
        b"PX" => value <= max_relative_ms(),
        b"EXAT" => value <= i64::MAX / 1000,
        b"PXAT" => true,
        _ => false,
    }
}

/// Whether Redis is certain to answer `+OK` to this command (of the right arity), whatever the
/// data holds.
fn fixed_reply_is_certain(name: &str, args: &[Vec<u8>]) -> bool {
    match name {
        "SET" => set_options_are_plain(&args[3..]),
        "SETEX" => expiry_is_valid(b"EX", &args[2]),
        "PSETEX" => expiry_is_valid(b"PX", &args[2]),
        "MSET" => (args.len() - 1) % 2 == 0,
        _ => false,
    }
}

/// SET options that never change the reply: at most one expiry (valid, see
/// [`expiry_is_valid`]) or KEEPTTL. NX, XX and GET make the reply depend on the data;
/// anything else goes to Redis for its error.
fn set_options_are_plain(options: &[Vec<u8>]) -> bool {
    let mut expiry = false;
    let mut index = 0;
    while index < options.len() {
        let option = options[index].to_ascii_uppercase();
        match option.as_slice() {
            b"EX" | b"PX" | b"EXAT" | b"PXAT" => {
                if expiry
                    || !options
                        .get(index + 1)
                        .is_some_and(|n| expiry_is_valid(&option, n))
                {
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

/// Counting writes Redis cannot reject whatever the data holds: `DEL` and `UNLINK` of any
/// keys, and `EXPIRE`/`PEXPIRE key n` without options whose `n` cannot overflow (Redis 7's
/// `expireGenericCommand`: `n` seconds must fit in milliseconds, and `now + ms` must not
/// overflow; a negative or zero `n` deletes the key, which never fails). Every other counting
/// write fails on some data (`WRONGTYPE`, a value that is not an integer, an overflow).
fn counting_write_cannot_fail(name: &str, args: &[Vec<u8>]) -> bool {
    let bounded = |bytes: &[u8], unit_ms: i64| {
        parse_redis_int(bytes).is_some_and(|value| {
            value
                .checked_mul(unit_ms)
                .is_some_and(|ms| ms.saturating_abs() <= max_relative_ms())
        })
    };
    match name {
        "DEL" | "UNLINK" => true,
        "EXPIRE" => args.len() == 3 && bounded(&args[2], 1000),
        "PEXPIRE" => args.len() == 3 && bounded(&args[2], 1),
        _ => false,
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
    // The gateway's `INFO` (gateway/introspect.rs).
    "PMNET.INFO",
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
    fn counting_writes_are_updates_only_where_redis_cannot_reject_them() {
        assert_eq!(route_of(&["LPUSH", "l", "x"]), Route::Bypass);
        assert_eq!(route_of(&["DEL", "k"]), Route::Bypass);
        let policy = Policy {
            ack_counting_writes: true,
        };
        let routed = |words: &[&str]| route(&args(words), &policy);
        for update in [
            &["DEL", "a", "b"][..],
            &["UNLINK", "a"],
            &["EXPIRE", "k", "10"],
            &["EXPIRE", "k", "-5"],
            &["PEXPIRE", "k", "1000"],
        ] {
            assert_eq!(routed(update), Route::Update { ack: OK }, "{update:?}");
        }
        // Each of these fails on some data or some clock: Redis's reply, not an early +OK.
        for bypass in [
            &["LPUSH", "l", "x"][..],
            &["SADD", "s", "m"],
            &["INCR", "n"],
            &["INCRBY", "n", "5"],
            &["APPEND", "k", "v"],
            &["HSET", "h", "f", "v"],
            &["ZADD", "z", "1.5", "m"],
            &["EXPIRE", "k", "10", "NX"],
            &["EXPIRE", "k", "9223372036854775807"],
            &["EXPIRE", "k", "9223372036854775"],
            &["PEXPIRE", "k", "9223372036854775807"],
            &["EXPIRE", "k", "010"],
            &["EXPIRE", "k", "ten"],
        ] {
            assert_eq!(routed(bypass), Route::Bypass, "{bypass:?}");
        }
    }

    #[test]
    fn writes_redis_may_reject_are_never_acked_early() {
        // HMSET fails with WRONGTYPE on a key of another type.
        assert_eq!(route_of(&["HMSET", "h", "f", "v"]), Route::Bypass);
        // Expiries Redis rejects: zero, negative, not integers as Redis reads them, and
        // those that overflow once converted to absolute milliseconds.
        for words in [
            &["SETEX", "k", "9223372036854775807", "v"][..],
            &["PSETEX", "k", "9223372036854775807", "v"],
            &["SET", "k", "v", "EX", "9223372036854775807"],
            &["SET", "k", "v", "PX", "9223372036854775807"],
            &["SET", "k", "v", "EX", "9223372036854775"],
            &["SET", "k", "v", "EXAT", "9223372036854776"],
            &["SETEX", "k", "0", "v"],
            &["SETEX", "k", "-1", "v"],
            &["SETEX", "k", "01", "v"],
            &["SETEX", "k", "+1", "v"],
            &["SETEX", "k", "1.5", "v"],
            &["SET", "k", "v", "PX", "-0"],
            &["SET", "k", "v", "EX", ""],
            &["SET", "k", "v", "KEEPTTL", "EX", "1"],
            &["SET", "k", "v", "XX"],
            &["SET", "k", "v", "EX"],
            &["SET", "k", "v", "FOO"],
        ] {
            assert_eq!(route_of(words), Route::Bypass, "{words:?}");
        }
        for words in [
            &["SETEX", "k", "100", "v"][..],
            &["PSETEX", "k", "100", "v"],
            &["SET", "k", "v", "ex", "1000000"],
            &["SET", "k", "v", "EXAT", "9223372036854775"],
            &["SET", "k", "v", "PXAT", "9223372036854775807"],
            &["SET", "k", "v", "pxat", "1"],
            &["SET", "k", "v", "KEEPTTL"],
        ] {
            assert_eq!(route_of(words), Route::Update { ack: OK }, "{words:?}");
        }
    }

    #[test]
    fn integers_are_read_as_redis_reads_them() {
        assert_eq!(parse_redis_int(b"0"), Some(0));
        assert_eq!(parse_redis_int(b"-12"), Some(-12));
        assert_eq!(parse_redis_int(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b"01"[..],
            b"-0",
            b"+1",
            b"",
            b"-",
            b" 1",
            b"1 ",
            b"9223372036854775808",
        ] {
            assert_eq!(
                parse_redis_int(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn local_unknown_and_refused_commands_are_answered_at_once() {
        // Redis answers PING through the whole path.
        assert_eq!(route_of(&["ping"]), Route::Bypass);
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
        assert_eq!(uses(&["PMNET.INFO", "keyspace"]), "nothing");
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
