//! The generator: a command is built from a short list of random choices (`u32`s) by plain
//! code, so proptest shrinks a sequence by dropping commands and by moving each choice
//! towards 0, which is always the simplest form (the first family, the first key, the first
//! option). Keys come from a small pool so that types collide (the `WRONGTYPE` paths), values
//! from a small pool with the edge cases (empty, binary, long, numbers at ±2^53 and ±2^63).
//!
//! Left out, because Redis itself answers them by the clock, by chance or by its hash tables'
//! order in a way that changes the data (each says why): `SPOP` without a count (removes a
//! random member), `XADD … *` (an id from the clock; `ms-*` is used instead), relative
//! expiries below 100 s (a key could expire between the two systems' runs), `OBJECT
//! IDLETIME`/`FREQ`, `TIME`, `INFO`, `LASTSAVE`, `DEBUG`; offsets that would make a string of
//! hundreds of megabytes (`SETRANGE k 536870911 x`; Redis's limit itself, 536870912, is
//! tried). Also left out: what docs/redis.md says the gateway refuses (blocking commands,
//! subscriptions, `WAIT`, administrative commands) and `HELLO 3` (a RESP3 connection:
//! tests/resp3_vs_redis.rs compares those replies).

use crate::gen_more as more;

/// Choices per command (more are read as 0).
pub const CHOICES: usize = 24;

/// The choices of one command, read in order.
#[derive(Debug)]
pub struct Gen<'a> {
    choices: &'a [u32],
    at: usize,
}

impl<'a> Gen<'a> {
    pub fn new(choices: &'a [u32]) -> Gen<'a> {
        Gen { choices, at: 0 }
    }

    /// A number below `bound` (0 once the choices run out).
    pub fn n(&mut self, bound: usize) -> usize {
        let choice = self.choices.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        choice as usize % bound.max(1)
    }

    /// True with probability `percent` (false at choice 0).
    pub fn chance(&mut self, percent: usize) -> bool {
        let roll = self.n(100);
        roll >= 100 - percent.min(100)
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.n(items.len())]
    }
}

pub(crate) type Cmd = Vec<Vec<u8>>;

/// A command under construction.
pub(crate) struct C(pub(crate) Cmd);

impl C {
    pub(crate) fn new(name: &str) -> C {
        C(vec![name.as_bytes().to_vec()])
    }
    pub(crate) fn a(mut self, word: impl AsRef<[u8]>) -> C {
        self.0.push(word.as_ref().to_vec());
        self
    }
    pub(crate) fn push(&mut self, word: impl AsRef<[u8]>) {
        self.0.push(word.as_ref().to_vec());
    }
    pub(crate) fn done(self) -> Cmd {
        self.0
    }
}

const KEYS: &[&str] = &["k0", "k1", "k2", "k3"];
const RARE_KEYS: &[&[u8]] = &[b"", b"k\x00\xff bin", b"{k0}x"];

pub(crate) fn key(g: &mut Gen) -> Vec<u8> {
    if g.chance(5) {
        return g.pick(RARE_KEYS).to_vec();
    }
    g.pick(KEYS).as_bytes().to_vec()
}

fn long_value() -> Vec<u8> {
    b"0123456789abcdef".repeat(20)
}

const VALUES: &[&str] = &[
    "v", "1", "", "-1", "0", "10", "3.5", "x y", "abc", "a", "b", "c", "aaa",
];
const EDGE_VALUES: &[&str] = &[
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "9223372036854775806",
    "9007199254740992",
    "9007199254740993",
    "-9007199254740993",
    "1e3",
    "nan",
    "inf",
    "-inf",
    " 1",
    "0x10",
    "+1",
    "01",
    "1.5e308",
    "-0",
    "\u{e9}t\u{e9}",
];

pub(crate) fn value(g: &mut Gen) -> Vec<u8> {
    match g.n(20) {
        0..=14 => g.pick(VALUES).as_bytes().to_vec(),
        15..=17 => g.pick(EDGE_VALUES).as_bytes().to_vec(),
        18 => b"\x00\xff\r\n\x01".to_vec(),
        _ => long_value(),
    }
}

const SMALL_INTS: &[&str] = &["1", "0", "2", "-1", "5", "3", "-2", "10", "100", "-100"];
const EDGE_INTS: &[&str] = &[
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "-9223372036854775809",
    "9007199254740991",
    "9007199254740992",
    "9007199254740993",
    "-9007199254740993",
    "4611686018427387904",
    "abc",
    "1.5",
    "",
    " 1",
    "1e3",
    "0x1",
];

/// An integer argument: mostly small, sometimes at the edges or not an integer at all.
pub(crate) fn int(g: &mut Gen) -> Vec<u8> {
    if g.chance(20) {
        g.pick(EDGE_INTS).as_bytes().to_vec()
    } else {
        g.pick(SMALL_INTS).as_bytes().to_vec()
    }
}

const FLOATS: &[&str] = &[
    "1.5",
    "0",
    "-2.25",
    "10",
    "1e10",
    "3",
    "-1",
    "0.1",
    "inf",
    "-inf",
    "+inf",
    "nan",
    "abc",
    "1e400",
    "5e-324",
    "1.7976931348623157e308",
    "",
    "9007199254740993",
];

pub(crate) fn float(g: &mut Gen) -> Vec<u8> {
    g.pick(FLOATS).as_bytes().to_vec()
}

/// A relative expiry in seconds (no small positive value: see the module's note).
const SECONDS: &[&str] = &[
    "100",
    "1000",
    "0",
    "-1",
    "abc",
    "9223372036854775807",
    "9223372036854775806",
    "9223372036854775",
    "9223372036854776",
    "-9223372036854775808",
    "9223372036854775808",
    "1.5",
    "",
    "4611686018427387",
    "100000000000",
];
const MILLIS: &[&str] = &[
    "100000",
    "1000000",
    "0",
    "-5",
    "9223372036854775807",
    "9223372036854775806",
    "-9223372036854775808",
    "9223372036854775808",
    "x",
    "9223370000000000000",
    "100000000000000",
];
/// Absolute expiries of `SET` and `GETEX`: no time in the past but the invalid ones, since a
/// key set to expire in the past is kept until Redis reclaims it, which `DBSIZE` shows at a
/// moment of Redis's own choosing (`EXPIREAT` with a past time deletes at once: tried there).
const AT_SECONDS: &[&str] = &[
    "4102444800",
    "0",
    "-1",
    "9223372036854775807",
    "9223372036854775",
    "9223372036854776",
    "abc",
    "4102444800000",
];
const AT_MILLIS: &[&str] = &[
    "4102444800000",
    "0",
    "-1",
    "9223372036854775807",
    "9223372036854775806",
    "abc",
];

pub(crate) fn seconds(g: &mut Gen) -> &'static str {
    g.pick(SECONDS)
}
pub(crate) fn millis(g: &mut Gen) -> &'static str {
    g.pick(MILLIS)
}

/// An expiry option and its argument, as `SET` and `GETEX` take them.
fn expiry(g: &mut Gen, c: &mut C) {
    match g.n(4) {
        0 => {
            c.push("EX");
            c.push(seconds(g));
        }
        1 => {
            c.push("PX");
            c.push(millis(g));
        }
        2 => {
            c.push("EXAT");
            c.push(g.pick(AT_SECONDS));
        }
        _ => {
            c.push("PXAT");
            c.push(g.pick(AT_MILLIS));
        }
    }
}

const FIELDS: &[&str] = &["f0", "f1", "f2", "f3"];
const MEMBERS: &[&str] = &["m0", "m1", "m2", "m3", "a", "b"];

pub(crate) fn field(g: &mut Gen) -> Vec<u8> {
    if g.chance(5) {
        return value(g);
    }
    g.pick(FIELDS).as_bytes().to_vec()
}

pub(crate) fn member(g: &mut Gen) -> Vec<u8> {
    if g.chance(8) {
        return value(g);
    }
    g.pick(MEMBERS).as_bytes().to_vec()
}

/// Commands of the families below, by weight; 0 is the simplest.
pub fn command(g: &mut Gen) -> Cmd {
    let mut cmd = match g.n(100) {
        0..=13 => strings(g),
        14..=21 => counters(g),
        22..=30 => hashes(g),
        31..=38 => lists(g),
        39..=45 => sets(g),
        46..=54 => zsets(g),
        55..=62 => more::streams(g),
        63..=67 => more::bits(g),
        68..=71 => more::geo_hll(g),
        72..=83 => more::keyspace(g),
        84..=90 => more::transactions(g),
        91..=94 => more::scripts(g),
        95..=96 => more::connection(g),
        _ => more::invalid(g),
    };
    // Command names are case-insensitive: sometimes lower-case.
    if g.chance(10) {
        cmd[0] = cmd[0].to_ascii_lowercase();
    }
    cmd
}

fn strings(g: &mut Gen) -> Cmd {
    let k = key(g);
    match g.n(20) {
        0 => {
            let mut c = C::new("SET").a(&k).a(value(g));
            for _ in 0..g.n(4) {
                match g.n(5) {
                    0 => expiry(g, &mut c),
                    1 => c.push("NX"),
                    2 => c.push("XX"),
                    3 => c.push("GET"),
                    _ => c.push("KEEPTTL"),
                }
            }
            c.done()
        }
        1 => C::new("GET").a(&k).done(),
        2 => C::new("SETEX").a(&k).a(seconds(g)).a(value(g)).done(),
        3 => C::new("PSETEX").a(&k).a(millis(g)).a(value(g)).done(),
        4 => C::new("SETNX").a(&k).a(value(g)).done(),
        5 | 6 => {
            let mut c = C::new(if g.chance(30) { "MSETNX" } else { "MSET" });
            c.push(&k);
            c.push(value(g));
            for _ in 0..g.n(3) {
                c.push(key(g));
                c.push(value(g));
            }
            if g.chance(10) {
                c.push(key(g));
            }
            c.done()
        }
        7 => C::new("GETSET").a(&k).a(value(g)).done(),
        8 => C::new("GETDEL").a(&k).done(),
        9 => {
            let mut c = C::new("GETEX").a(&k);
            match g.n(3) {
                0 => {}
                1 => expiry(g, &mut c),
                _ => c.push("PERSIST"),
            }
            if g.chance(10) {
                c.push("PERSIST");
            }
            c.done()
        }
        10 => C::new("APPEND").a(&k).a(value(g)).done(),
        11 => {
            let offset = g.pick(&["0", "1", "5", "-1", "536870912", "x", "100"]);
            C::new("SETRANGE").a(&k).a(offset).a(value(g)).done()
        }
        12 => C::new(if g.chance(20) { "SUBSTR" } else { "GETRANGE" })
            .a(&k)
            .a(int(g))
            .a(int(g))
            .done(),
        13 => C::new("STRLEN").a(&k).done(),
        14 => {
            let mut c = C::new("MGET").a(&k);
            for _ in 0..g.n(3) {
                c.push(key(g));
            }
            c.done()
        }
        15 => {
            let mut c = C::new("LCS").a(&k).a(key(g));
            for _ in 0..g.n(3) {
                match g.n(5) {
                    0 => c.push("LEN"),
                    1 => c.push("IDX"),
                    2 => {
                        c.push("MINMATCHLEN");
                        c.push(int(g));
                    }
                    3 => c.push("WITHMATCHLEN"),
                    _ => c.push("BOGUS"),
                }
            }
            c.done()
        }
        16 => C::new("SET").a(&k).a(value(g)).done(),
        17 => {
            let unit = g.pick(&["EX", "PX", "EXAT", "PXAT"]);
            // A small expiry that is neither past (see `AT_SECONDS`) nor so close that the
            // slower of the two runs reaches it first.
            let small = match unit {
                "EX" => "100",
                "PX" => "100000",
                "EXAT" => "4102444800",
                _ => "4102444800000",
            };
            C::new("SET")
                .a(&k)
                .a(value(g))
                .a(unit)
                .a(g.pick(&[
                    "9223372036854775807",
                    "9223372036854775806",
                    "9223372036854775",
                    "4611686018427387904",
                    small,
                ]))
                .done()
        }
        _ => C::new("GET").a(&k).done(),
    }
}

fn counters(g: &mut Gen) -> Cmd {
    let k = key(g);
    match g.n(9) {
        0 => C::new("INCR").a(&k).done(),
        1 => C::new("DECR").a(&k).done(),
        2 => C::new("INCRBY").a(&k).a(int(g)).done(),
        3 => C::new("DECRBY").a(&k).a(int(g)).done(),
        4 => C::new("INCRBYFLOAT").a(&k).a(float(g)).done(),
        // A counter near the edges, then a step over it.
        5 | 6 => C::new("SET")
            .a(&k)
            .a(g.pick(&[
                "9223372036854775806",
                "-9223372036854775807",
                "9007199254740992",
                "9007199254740991",
                "-9007199254740992",
                "4611686018427387904",
                "1.5",
                "1e308",
            ]))
            .done(),
        7 => C::new(if g.chance(50) { "INCRBY" } else { "DECRBY" })
            .a(&k)
            .a(g.pick(&[
                "1",
                "9223372036854775807",
                "-9223372036854775808",
                "9007199254740993",
                "4611686018427387904",
                "2",
            ]))
            .done(),
        _ => C::new("GET").a(&k).done(),
    }
}

fn hashes(g: &mut Gen) -> Cmd {
    let k = key(g);
    match g.n(18) {
        0 | 1 => {
            let mut c = C::new(if g.chance(40) { "HMSET" } else { "HSET" }).a(&k);
            c.push(field(g));
            c.push(value(g));
            for _ in 0..g.n(3) {
                c.push(field(g));
                c.push(value(g));
            }
            if g.chance(8) {
                c.push(field(g));
            }
            c.done()
        }
        2 => C::new("HSETNX").a(&k).a(field(g)).a(value(g)).done(),
        3 => C::new("HGET").a(&k).a(field(g)).done(),
        4 => {
            let mut c = C::new("HMGET").a(&k).a(field(g));
            for _ in 0..g.n(3) {
                c.push(field(g));
            }
            c.done()
        }
        5 => C::new("HGETALL").a(&k).done(),
        6 => {
            let mut c = C::new("HDEL").a(&k).a(field(g));
            for _ in 0..g.n(2) {
                c.push(field(g));
            }
            c.done()
        }
        7 => C::new("HLEN").a(&k).done(),
        8 => C::new("HEXISTS").a(&k).a(field(g)).done(),
        9 => C::new(g.pick(&["HKEYS", "HVALS"])).a(&k).done(),
        10 => C::new("HSTRLEN").a(&k).a(field(g)).done(),
        11 | 12 => C::new("HINCRBY").a(&k).a(field(g)).a(int(g)).done(),
        13 => C::new("HINCRBYFLOAT").a(&k).a(field(g)).a(float(g)).done(),
        14 => {
            let mut c = C::new("HRANDFIELD").a(&k);
            if g.chance(60) {
                // Not a large negative count: Redis would answer that many fields (and run
                // out of memory trying).
                c.push(g.pick(&[
                    "100",
                    "-3",
                    "0",
                    "x",
                    "1.5",
                    "9223372036854775807",
                    "-9223372036854775808",
                ]));
                if g.chance(50) {
                    c.push("WITHVALUES");
                }
            }
            c.done()
        }
        15 => {
            // Not a cursor other than 0: where a scan of a hash table resumes depends on the
            // hash seed each Redis process draws.
            let mut c = C::new("HSCAN").a(&k).a(g.pick(&["0", "abc", "1.5"]));
            if g.chance(30) {
                c.push("MATCH");
                c.push(g.pick(&["f*", "*", "[f"]));
            }
            if g.chance(50) {
                c.push("COUNT");
                c.push(g.pick(&["1000", "0", "-1", "x"]));
            }
            c.done()
        }
        16 => C::new("HSET")
            .a(&k)
            .a(field(g))
            .a(g.pick(&[
                "9223372036854775806",
                "9007199254740992",
                "-9223372036854775807",
                "1.5",
            ]))
            .done(),
        _ => C::new("HINCRBY")
            .a(&k)
            .a(field(g))
            .a(g.pick(&[
                "1",
                "9223372036854775807",
                "9007199254740993",
                "-9223372036854775808",
            ]))
            .done(),
    }
}

fn end(g: &mut Gen) -> &'static str {
    g.pick(&["LEFT", "RIGHT"])
}

fn lists(g: &mut Gen) -> Cmd {
    let k = key(g);
    match g.n(19) {
        0 | 1 => {
            let mut c = C::new(g.pick(&["RPUSH", "LPUSH", "RPUSHX", "LPUSHX"])).a(&k);
            c.push(value(g));
            for _ in 0..g.n(3) {
                c.push(value(g));
            }
            c.done()
        }
        2 => {
            let mut c = C::new(g.pick(&["LPOP", "RPOP"])).a(&k);
            if g.chance(50) {
                c.push(int(g));
            }
            c.done()
        }
        3 => C::new("LRANGE").a(&k).a(int(g)).a(int(g)).done(),
        4 => C::new("LLEN").a(&k).done(),
        5 => C::new("LINDEX").a(&k).a(int(g)).done(),
        6 => C::new("LSET").a(&k).a(int(g)).a(value(g)).done(),
        7 => C::new("LREM").a(&k).a(int(g)).a(value(g)).done(),
        8 => C::new("LTRIM").a(&k).a(int(g)).a(int(g)).done(),
        9 => C::new("LINSERT")
            .a(&k)
            .a(g.pick(&["BEFORE", "AFTER", "MIDDLE"]))
            .a(value(g))
            .a(value(g))
            .done(),
        10 => {
            let mut c = C::new("LPOS").a(&k).a(value(g));
            for _ in 0..g.n(3) {
                c.push(g.pick(&["RANK", "COUNT", "MAXLEN"]));
                c.push(int(g));
            }
            c.done()
        }
        11 => C::new("LMOVE")
            .a(&k)
            .a(key(g))
            .a(end(g))
            .a(g.pick(&["LEFT", "RIGHT", "UP"]))
            .done(),
        12 => C::new("RPOPLPUSH").a(&k).a(key(g)).done(),
        13 => {
            let count = g.n(3);
            let mut c = C::new("LMPOP").a(g.pick(&["1", "2", "0", "-1", "x"]));
            c.push(&k);
            for _ in 0..count {
                c.push(key(g));
            }
            c.push(g.pick(&["LEFT", "RIGHT", "UP"]));
            if g.chance(50) {
                c.push("COUNT");
                c.push(int(g));
            }
            c.done()
        }
        14 => C::new("LRANGE").a(&k).a("0").a("-1").done(),
        _ => C::new("RPUSH").a(&k).a(value(g)).done(),
    }
}

fn sets(g: &mut Gen) -> Cmd {
    let k = key(g);
    let several = |g: &mut Gen, name: &str, first: &[u8]| {
        let mut c = C::new(name).a(first);
        for _ in 0..g.n(3) {
            c.push(key(g));
        }
        c.done()
    };
    match g.n(18) {
        0..=2 => {
            let mut c = C::new("SADD").a(&k).a(member(g));
            for _ in 0..g.n(4) {
                c.push(member(g));
            }
            c.done()
        }
        3 => C::new("SREM").a(&k).a(member(g)).a(member(g)).done(),
        4 => C::new("SMEMBERS").a(&k).done(),
        5 => C::new("SISMEMBER").a(&k).a(member(g)).done(),
        6 => C::new("SMISMEMBER").a(&k).a(member(g)).a(member(g)).done(),
        7 => C::new("SCARD").a(&k).done(),
        8 => C::new("SMOVE").a(&k).a(key(g)).a(member(g)).done(),
        9 => {
            let name = g.pick(&["SINTER", "SUNION", "SDIFF"]);
            several(g, name, &k)
        }
        10 => {
            let name = g.pick(&["SINTERSTORE", "SUNIONSTORE", "SDIFFSTORE"]);
            let mut c = C::new(name).a(&k).a(key(g));
            for _ in 0..g.n(2) {
                c.push(key(g));
            }
            c.done()
        }
        11 => {
            let mut c = C::new("SINTERCARD").a(g.pick(&["1", "2", "0", "3", "x"]));
            c.push(&k);
            c.push(key(g));
            if g.chance(40) {
                c.push("LIMIT");
                c.push(int(g));
            }
            c.done()
        }
        12 => {
            // Without a count, or with a negative one, the reply is random (compared by shape).
            let mut c = C::new("SRANDMEMBER").a(&k);
            if g.chance(70) {
                c.push(g.pick(&["100", "-3", "0", "x", "-9223372036854775808"]));
            }
            c.done()
        }
        // SPOP with a count beyond the set's size takes every member: deterministic.
        13 => C::new("SPOP")
            .a(&k)
            .a(g.pick(&["100", "0", "-1", "x"]))
            .done(),
        14 => {
            let mut c = C::new("SSCAN").a(&k).a("0");
            if g.chance(50) {
                c.push("COUNT");
                c.push("1000");
            }
            c.done()
        }
        _ => C::new("SADD")
            .a(&k)
            .a(g.pick(&["1", "2", "3", "-5", "100"]))
            .done(),
    }
}

pub(crate) fn score(g: &mut Gen) -> Vec<u8> {
    if g.chance(25) {
        float(g)
    } else {
        g.pick(&["1", "2", "0", "-1", "1.5", "3"])
            .as_bytes()
            .to_vec()
    }
}

fn score_bound(g: &mut Gen) -> &'static str {
    g.pick(&[
        "-inf", "+inf", "0", "1", "(1", "2", "(2", "x", "nan", "1.5", "-1",
    ])
}

fn lex_bound(g: &mut Gen) -> &'static str {
    g.pick(&["-", "+", "[a", "(a", "[m1", "(m2", "m", "[", ""])
}

fn zsets(g: &mut Gen) -> Cmd {
    let k = key(g);
    match g.n(24) {
        0..=2 => {
            let mut c = C::new("ZADD").a(&k);
            for _ in 0..g.n(3) {
                c.push(g.pick(&["NX", "XX", "GT", "LT", "CH", "INCR"]));
            }
            c.push(score(g));
            c.push(member(g));
            for _ in 0..g.n(3) {
                c.push(score(g));
                c.push(member(g));
            }
            if g.chance(5) {
                c.push(score(g));
            }
            c.done()
        }
        3 => C::new("ZINCRBY").a(&k).a(score(g)).a(member(g)).done(),
        4 => C::new("ZREM").a(&k).a(member(g)).a(member(g)).done(),
        5 => C::new("ZSCORE").a(&k).a(member(g)).done(),
        6 => C::new("ZMSCORE").a(&k).a(member(g)).a(member(g)).done(),
        7 => C::new("ZCARD").a(&k).done(),
        8 => C::new("ZCOUNT")
            .a(&k)
            .a(score_bound(g))
            .a(score_bound(g))
            .done(),
        9 => C::new("ZLEXCOUNT")
            .a(&k)
            .a(lex_bound(g))
            .a(lex_bound(g))
            .done(),
        10 => {
            let mut c = C::new(g.pick(&["ZRANK", "ZREVRANK"])).a(&k).a(member(g));
            if g.chance(10) {
                c.push("WITHSCORE");
            }
            c.done()
        }
        11 | 12 => {
            let store = g.chance(20);
            let mut c = if store {
                C::new("ZRANGESTORE").a(key(g)).a(&k)
            } else {
                C::new("ZRANGE").a(&k)
            };
            match g.n(3) {
                0 => {
                    c.push(int(g));
                    c.push(int(g));
                }
                1 => {
                    c.push(score_bound(g));
                    c.push(score_bound(g));
                    c.push("BYSCORE");
                }
                _ => {
                    c.push(lex_bound(g));
                    c.push(lex_bound(g));
                    c.push("BYLEX");
                }
            }
            if g.chance(30) {
                c.push("REV");
            }
            if g.chance(30) {
                c.push("LIMIT");
                c.push(int(g));
                c.push(int(g));
            }
            if !store && g.chance(40) {
                c.push("WITHSCORES");
            }
            c.done()
        }
        13 => {
            let mut c = C::new(g.pick(&["ZRANGEBYSCORE", "ZREVRANGEBYSCORE"]))
                .a(&k)
                .a(score_bound(g))
                .a(score_bound(g));
            if g.chance(30) {
                c.push("WITHSCORES");
            }
            if g.chance(20) {
                c.push("LIMIT");
                c.push(int(g));
                c.push(int(g));
            }
            c.done()
        }
        14 => C::new(g.pick(&["ZRANGEBYLEX", "ZREVRANGEBYLEX"]))
            .a(&k)
            .a(lex_bound(g))
            .a(lex_bound(g))
            .done(),
        15 => {
            let mut c = C::new("ZREVRANGE").a(&k).a(int(g)).a(int(g));
            if g.chance(40) {
                c.push("WITHSCORES");
            }
            c.done()
        }
        16 => {
            let mut c = C::new(g.pick(&["ZPOPMIN", "ZPOPMAX"])).a(&k);
            if g.chance(50) {
                c.push(int(g));
            }
            c.done()
        }
        17 => match g.n(3) {
            0 => C::new("ZREMRANGEBYSCORE")
                .a(&k)
                .a(score_bound(g))
                .a(score_bound(g))
                .done(),
            1 => C::new("ZREMRANGEBYRANK").a(&k).a(int(g)).a(int(g)).done(),
            _ => C::new("ZREMRANGEBYLEX")
                .a(&k)
                .a(lex_bound(g))
                .a(lex_bound(g))
                .done(),
        },
        18 | 19 => {
            let store = g.chance(50);
            let name = g.pick(&["ZUNION", "ZINTER", "ZDIFF"]);
            let mut c = if store {
                C::new(&format!("{name}STORE")).a(key(g))
            } else {
                C::new(name)
            };
            let count = 1 + g.n(3);
            c.push(if g.chance(10) {
                "x".to_owned()
            } else {
                count.to_string()
            });
            c.push(&k);
            for _ in 1..count {
                c.push(key(g));
            }
            if name != "ZDIFF" && g.chance(30) {
                c.push("WEIGHTS");
                for _ in 0..count {
                    c.push(score(g));
                }
            }
            if name != "ZDIFF" && g.chance(30) {
                c.push("AGGREGATE");
                c.push(g.pick(&["SUM", "MIN", "MAX", "AVG"]));
            }
            if !store && g.chance(40) {
                c.push("WITHSCORES");
            }
            c.done()
        }
        20 => {
            let mut c = C::new("ZMPOP").a(g.pick(&["1", "2", "0"])).a(&k);
            c.push(g.pick(&["MIN", "MAX", "MID"]));
            if g.chance(50) {
                c.push("COUNT");
                c.push(int(g));
            }
            c.done()
        }
        21 => C::new("ZINTERCARD").a("2").a(&k).a(key(g)).done(),
        22 => {
            let mut c = C::new("ZRANDMEMBER").a(&k);
            if g.chance(60) {
                c.push(g.pick(&["100", "-3", "0", "x"]));
                if g.chance(40) {
                    c.push("WITHSCORES");
                }
            }
            c.done()
        }
        _ => {
            let mut c = C::new("ZSCAN").a(&k).a("0");
            if g.chance(50) {
                c.push("COUNT");
                c.push("1000");
            }
            c.done()
        }
    }
}
