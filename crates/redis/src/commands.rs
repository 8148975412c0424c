//! Which path each Redis command takes: answered by the gateway, sent as a PMNet update
//! (logged by the device and answered on its ack), or as a bypass request (answered with
//! Redis's reply); and, at the adaptor, whether a command only reads.
//!
//! The rule: a command goes as an update only when the gateway can tell from its arguments
//! that Redis's reply is fixed (`+OK`). When in doubt, it goes as a bypass request, so the
//! client sees Redis's own reply.

use crate::resp::{error_reply, parse_int};

/// How the gateway treats a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Answered by the gateway itself.
    Local,
    /// Redis always answers `+OK` when the arguments are well formed: a PMNet update, answered
    /// `+OK` once the device logged it. Ill-formed arguments go as bypass (Redis's error).
    Fixed,
    /// A write whose reply is a count or a new value: bypass by default; with
    /// `--ack-counting-writes` an update answered `+OK` (the count is not known then).
    Counting,
    /// The reply depends on server state (reads, conditional writes): bypass.
    Bypass,
    /// Refused with an error that says why.
    Refused(&'static str),
}

/// A command the gateway knows.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub name: &'static str,
    /// Redis's arity: `n` exactly n words (the name included), `-n` at least n.
    pub arity: i32,
    pub class: Class,
    /// Whether it only reads (the adaptor runs it without recording anything).
    pub read_only: bool,
}

const fn spec(name: &'static str, arity: i32, class: Class, read_only: bool) -> Spec {
    Spec {
        name,
        arity,
        class,
        read_only,
    }
}

const NO_FLUSH: &str = "FLUSHDB and FLUSHALL are refused through the pmnet gateway: they would \
                        also erase the adaptor's exactly-once session records";
const NO_TRANSACTIONS: &str = "transactions (MULTI/EXEC/WATCH) are not supported through the \
                               pmnet gateway";
const NO_BLOCKING: &str = "blocking and pub/sub commands are not supported through the pmnet \
                           gateway";
const NO_SCRIPTS: &str = "scripts are not supported through the pmnet gateway";

use Class::{Bypass, Counting, Fixed, Local, Refused};

/// Every command the gateway knows, in the order of the table in docs/redis.md.
pub const COMMANDS: &[Spec] = &[
    // Answered locally.
    spec("PING", -1, Local, true),
    spec("ECHO", 2, Local, true),
    spec("QUIT", -1, Local, true),
    spec("SELECT", 2, Local, true),
    spec("COMMAND", -1, Local, true),
    // Fixed reply: updates.
    spec("SET", -3, Fixed, false),
    spec("SETEX", 4, Fixed, false),
    spec("PSETEX", 4, Fixed, false),
    spec("MSET", -3, Fixed, false),
    spec("HMSET", -4, Fixed, false),
    // Counting writes: bypass, or updates answered +OK with --ack-counting-writes.
    spec("DEL", -2, Counting, false),
    spec("UNLINK", -2, Counting, false),
    spec("EXPIRE", -3, Counting, false),
    spec("PEXPIRE", -3, Counting, false),
    spec("INCR", 2, Counting, false),
    spec("DECR", 2, Counting, false),
    spec("INCRBY", 3, Counting, false),
    spec("DECRBY", 3, Counting, false),
    spec("APPEND", 3, Counting, false),
    spec("LPUSH", -3, Counting, false),
    spec("RPUSH", -3, Counting, false),
    spec("SADD", -3, Counting, false),
    spec("SREM", -3, Counting, false),
    spec("HSET", -4, Counting, false),
    spec("HDEL", -3, Counting, false),
    spec("ZADD", -4, Counting, false),
    spec("ZREM", -3, Counting, false),
    // Writes whose reply depends on state: bypass.
    spec("SETNX", 3, Bypass, false),
    spec("GETSET", 3, Bypass, false),
    spec("GETDEL", 2, Bypass, false),
    spec("MSETNX", -3, Bypass, false),
    spec("SETRANGE", 4, Bypass, false),
    spec("INCRBYFLOAT", 3, Bypass, false),
    spec("LPOP", -2, Bypass, false),
    spec("RPOP", -2, Bypass, false),
    spec("LSET", 4, Bypass, false),
    spec("LTRIM", 4, Bypass, false),
    spec("LREM", 4, Bypass, false),
    spec("HSETNX", 4, Bypass, false),
    spec("HINCRBY", 4, Bypass, false),
    spec("SPOP", -2, Bypass, false),
    spec("ZINCRBY", 4, Bypass, false),
    spec("PERSIST", 2, Bypass, false),
    spec("RENAME", 3, Bypass, false),
    // Reads: bypass.
    spec("GET", 2, Bypass, true),
    spec("MGET", -2, Bypass, true),
    spec("EXISTS", -2, Bypass, true),
    spec("STRLEN", 2, Bypass, true),
    spec("GETRANGE", 4, Bypass, true),
    spec("LLEN", 2, Bypass, true),
    spec("LRANGE", 4, Bypass, true),
    spec("LINDEX", 3, Bypass, true),
    spec("HGET", 3, Bypass, true),
    spec("HMGET", -3, Bypass, true),
    spec("HGETALL", 2, Bypass, true),
    spec("HLEN", 2, Bypass, true),
    spec("HEXISTS", 3, Bypass, true),
    spec("HKEYS", 2, Bypass, true),
    spec("HVALS", 2, Bypass, true),
    spec("SMEMBERS", 2, Bypass, true),
    spec("SISMEMBER", 3, Bypass, true),
    spec("SCARD", 2, Bypass, true),
    spec("ZRANGE", -4, Bypass, true),
    spec("ZRANGEBYSCORE", -4, Bypass, true),
    spec("ZSCORE", 3, Bypass, true),
    spec("ZCARD", 2, Bypass, true),
    spec("ZRANK", 3, Bypass, true),
    spec("TTL", 2, Bypass, true),
    spec("PTTL", 2, Bypass, true),
    spec("TYPE", 2, Bypass, true),
    spec("KEYS", 2, Bypass, true),
    spec("SCAN", -2, Bypass, true),
    spec("DBSIZE", 1, Bypass, true),
    spec("INFO", -1, Bypass, true),
    spec("CONFIG", -2, Bypass, true),
    // Refused, with the reason.
    spec("FLUSHDB", -1, Refused(NO_FLUSH), false),
    spec("FLUSHALL", -1, Refused(NO_FLUSH), false),
    spec("MULTI", 1, Refused(NO_TRANSACTIONS), false),
    spec("EXEC", 1, Refused(NO_TRANSACTIONS), false),
    spec("DISCARD", 1, Refused(NO_TRANSACTIONS), false),
    spec("WATCH", -2, Refused(NO_TRANSACTIONS), false),
    spec("BLPOP", -3, Refused(NO_BLOCKING), false),
    spec("BRPOP", -3, Refused(NO_BLOCKING), false),
    spec("SUBSCRIBE", -2, Refused(NO_BLOCKING), false),
    spec("PSUBSCRIBE", -2, Refused(NO_BLOCKING), false),
    spec("EVAL", -3, Refused(NO_SCRIPTS), false),
    spec("EVALSHA", -3, Refused(NO_SCRIPTS), false),
];

/// Commands the adaptor runs directly even when resending after a lost connection: their
/// reply does not depend on the session's data.
const STATELESS: &[&str] = &["PING", "ECHO", "INFO", "CONFIG", "TIME"];

/// The spec of a command name (any case).
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    COMMANDS
        .iter()
        .find(|spec| spec.name.as_bytes().eq_ignore_ascii_case(name))
}

/// How the adaptor runs a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdaptorClass {
    /// Recorded with its session's sequence number in one script call.
    Write,
    /// Read-only: run as is (resent after a lost connection through the checked read).
    Read,
    /// Read-only and independent of the data: always run as is.
    StatelessRead,
}

/// How the adaptor runs `args` (anything it does not know is treated as a write).
pub fn adaptor_class(args: &[Vec<u8>]) -> AdaptorClass {
    let Some(name) = args.first() else {
        return AdaptorClass::Write;
    };
    if name.eq_ignore_ascii_case(b"CONFIG") {
        // Only CONFIG GET reads; anything else goes through the script (which refuses it).
        return match args.get(1) {
            Some(sub) if sub.eq_ignore_ascii_case(b"GET") => AdaptorClass::StatelessRead,
            _ => AdaptorClass::Write,
        };
    }
    if STATELESS
        .iter()
        .any(|stateless| stateless.as_bytes().eq_ignore_ascii_case(name))
    {
        return AdaptorClass::StatelessRead;
    }
    match lookup(name) {
        Some(spec) if spec.read_only => AdaptorClass::Read,
        _ => AdaptorClass::Write,
    }
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
        let shown: String = String::from_utf8_lossy(name).chars().take(64).collect();
        return Route::Reply(error_reply(&format!(
            "ERR unknown or unsupported command '{shown}' (the pmnet gateway forwards the \
             commands listed in docs/redis.md)"
        )));
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
        Fixed if fixed_reply_is_certain(spec.name, args) => Route::Update { ack: OK },
        Fixed => Route::Bypass,
        Counting if policy.ack_counting_writes && counting_args_are_valid(spec.name, args) => {
            Route::Update { ack: OK }
        }
        Counting | Bypass => {
            if spec.name == "CONFIG" && !args[1].eq_ignore_ascii_case(b"GET") {
                return Route::Reply(error_reply(
                    "ERR only CONFIG GET is supported through the pmnet gateway",
                ));
            }
            Route::Bypass
        }
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
        "QUIT" => Route::Quit,
        "SELECT" => {
            if args[1] == b"0" {
                Route::Reply(OK.to_vec())
            } else {
                Route::Reply(error_reply("ERR the pmnet gateway serves database 0 only"))
            }
        }
        // redis-cli asks for command docs at start-up; an empty list is a valid answer.
        _ => Route::Reply(b"*0\r\n".to_vec()),
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
        for words in [
            &["NOPE"][..],
            &["GET"],
            &["FLUSHALL"],
            &["CONFIG", "SET", "a", "b"],
        ] {
            match route_of(words) {
                Route::Reply(bytes) => assert!(bytes.starts_with(b"-ERR "), "{words:?}"),
                other => panic!("{words:?} routed {other:?}"),
            }
        }
        assert_eq!(route_of(&["CONFIG", "GET", "save"]), Route::Bypass);
    }

    #[test]
    fn the_adaptor_records_everything_but_reads() {
        assert_eq!(adaptor_class(&args(&["get", "k"])), AdaptorClass::Read);
        assert_eq!(
            adaptor_class(&args(&["SET", "k", "v"])),
            AdaptorClass::Write
        );
        assert_eq!(
            adaptor_class(&args(&["CONFIG", "GET", "x"])),
            AdaptorClass::StatelessRead
        );
        assert_eq!(
            adaptor_class(&args(&["CONFIG", "SET", "x", "y"])),
            AdaptorClass::Write
        );
        assert_eq!(adaptor_class(&args(&["WHATEVER"])), AdaptorClass::Write);
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
