//! The generator's second half: streams, bitmaps, geo and HyperLogLog, the keyspace,
//! transactions, scripts, the connection, invalid forms (see `gen.rs`).

use crate::gen::{field, int, key, member, value, Cmd, Gen, C};

const STREAM_IDS: &[&str] = &[
    "1-1",
    "2-0",
    "1-0",
    "3-5",
    "5-*",
    "0-0",
    "0-1",
    "3",
    "18446744073709551615-18446744073709551615",
    "18446744073709551615-*",
    "abc",
    "1-x",
];

fn stream_id(g: &mut Gen) -> &'static str {
    g.pick(STREAM_IDS)
}

fn range_id(g: &mut Gen) -> &'static str {
    g.pick(&["-", "+", "0", "1-1", "(1-1", "2", "3-5", "x"])
}

pub(crate) fn streams(g: &mut Gen) -> Cmd {
    let k = key(g);
    let group = |g: &mut Gen| g.pick(&["g1", "g2"]);
    let consumer = |g: &mut Gen| g.pick(&["c1", "c2"]);
    match g.n(22) {
        0..=3 => {
            let mut c = C::new("XADD").a(&k);
            if g.chance(10) {
                c.push("NOMKSTREAM");
            }
            if g.chance(15) {
                c.push(g.pick(&["MAXLEN", "MINID"]));
                if g.chance(30) {
                    c.push(g.pick(&["=", "~"]));
                }
                c.push(g.pick(&["1", "0", "2", "-1", "x", "2-0"]));
            }
            c.push(stream_id(g));
            c.push(field(g));
            c.push(value(g));
            if g.chance(20) {
                c.push(field(g));
                c.push(value(g));
            }
            if g.chance(5) {
                c.push(field(g));
            }
            c.done()
        }
        4 => {
            let mut c = C::new(g.pick(&["XRANGE", "XREVRANGE"]))
                .a(&k)
                .a(range_id(g))
                .a(range_id(g));
            if g.chance(30) {
                c.push("COUNT");
                c.push(int(g));
            }
            c.done()
        }
        5 => C::new("XLEN").a(&k).done(),
        6 => C::new("XDEL").a(&k).a(stream_id(g)).done(),
        7 => {
            let mut c = C::new("XTRIM").a(&k).a(g.pick(&["MAXLEN", "MINID", "LEN"]));
            if g.chance(20) {
                c.push(g.pick(&["=", "~"]));
            }
            c.push(g.pick(&["1", "0", "2-0", "-1", "x"]));
            c.done()
        }
        8 | 9 => {
            let mut c = C::new("XGROUP")
                .a("CREATE")
                .a(&k)
                .a(group(g))
                .a(g.pick(&["0", "$", "1-1", "x"]));
            if g.chance(50) {
                c.push("MKSTREAM");
            }
            if g.chance(15) {
                c.push("ENTRIESREAD");
                c.push(int(g));
            }
            c.done()
        }
        10 => match g.n(4) {
            0 => C::new("XGROUP")
                .a("SETID")
                .a(&k)
                .a(group(g))
                .a(g.pick(&["0", "$", "1-1"]))
                .done(),
            1 => C::new("XGROUP").a("DESTROY").a(&k).a(group(g)).done(),
            2 => C::new("XGROUP")
                .a("CREATECONSUMER")
                .a(&k)
                .a(group(g))
                .a(consumer(g))
                .done(),
            _ => C::new("XGROUP")
                .a("DELCONSUMER")
                .a(&k)
                .a(group(g))
                .a(consumer(g))
                .done(),
        },
        11..=13 => {
            let mut c = C::new("XREADGROUP").a("GROUP").a(group(g)).a(consumer(g));
            if g.chance(40) {
                c.push("COUNT");
                c.push(g.pick(&["1", "2", "0", "-1"]));
            }
            if g.chance(20) {
                c.push("NOACK");
            }
            c.push("STREAMS");
            c.push(&k);
            c.push(g.pick(&[">", "0", "1-1", "x"]));
            c.done()
        }
        14 => {
            let mut c = C::new("XREAD");
            if g.chance(40) {
                c.push("COUNT");
                c.push(g.pick(&["1", "2", "0"]));
            }
            c.push("STREAMS");
            c.push(&k);
            c.push(g.pick(&["0", "1-1", "$", "x"]));
            c.done()
        }
        15 => C::new("XACK")
            .a(&k)
            .a(group(g))
            .a(stream_id(g))
            .a(stream_id(g))
            .done(),
        16 => {
            let mut c = C::new("XPENDING").a(&k).a(group(g));
            if g.chance(60) {
                c.push("-");
                c.push("+");
                c.push(g.pick(&["10", "0", "-1"]));
                if g.chance(30) {
                    c.push(consumer(g));
                }
            }
            c.done()
        }
        17 => {
            let mut c = C::new("XCLAIM")
                .a(&k)
                .a(group(g))
                .a(consumer(g))
                .a("0")
                .a(stream_id(g));
            if g.chance(40) {
                c.push("JUSTID");
            }
            c.done()
        }
        18 => {
            let mut c = C::new("XAUTOCLAIM")
                .a(&k)
                .a(group(g))
                .a(consumer(g))
                .a("0")
                .a(g.pick(&["0-0", "0", "x"]));
            if g.chance(30) {
                c.push("COUNT");
                c.push(g.pick(&["10", "0", "-1"]));
            }
            if g.chance(30) {
                c.push("JUSTID");
            }
            c.done()
        }
        19 => match g.n(3) {
            0 => C::new("XINFO").a("STREAM").a(&k).done(),
            1 => C::new("XINFO").a("GROUPS").a(&k).done(),
            _ => C::new("XINFO").a("CONSUMERS").a(&k).a(group(g)).done(),
        },
        20 => C::new("XSETID").a(&k).a(stream_id(g)).done(),
        _ => C::new("XADD")
            .a(&k)
            .a(stream_id(g))
            .a(field(g))
            .a(value(g))
            .done(),
    }
}

fn bit_type(g: &mut Gen) -> &'static str {
    g.pick(&["i8", "u8", "i64", "u63", "i16", "u1", "i65", "u64", "x"])
}

pub(crate) fn bits(g: &mut Gen) -> Cmd {
    let k = key(g);
    let offset = |g: &mut Gen| {
        g.pick(&[
            "0",
            "7",
            "100",
            "1",
            "-1",
            "4294967296",
            "x",
            "#1",
            "9223372036854775807",
        ])
    };
    match g.n(9) {
        0 | 1 => C::new("SETBIT")
            .a(&k)
            .a(offset(g))
            .a(g.pick(&["1", "0", "2", "x"]))
            .done(),
        2 => C::new("GETBIT").a(&k).a(offset(g)).done(),
        3 => {
            let mut c = C::new("BITCOUNT").a(&k);
            if g.chance(60) {
                c.push(int(g));
                c.push(int(g));
                if g.chance(40) {
                    c.push(g.pick(&["BYTE", "BIT", "WORD"]));
                }
            }
            c.done()
        }
        4 => {
            let mut c = C::new("BITPOS").a(&k).a(g.pick(&["1", "0", "2"]));
            if g.chance(60) {
                c.push(int(g));
                if g.chance(60) {
                    c.push(int(g));
                    if g.chance(40) {
                        c.push(g.pick(&["BYTE", "BIT"]));
                    }
                }
            }
            c.done()
        }
        5 => {
            let op = g.pick(&["AND", "OR", "XOR", "NOT", "NAND"]);
            let mut c = C::new("BITOP").a(op).a(&k).a(key(g));
            if op != "NOT" || g.chance(20) {
                c.push(key(g));
            }
            c.done()
        }
        6 | 7 => {
            let ro = g.chance(15);
            let mut c = C::new(if ro { "BITFIELD_RO" } else { "BITFIELD" }).a(&k);
            for _ in 0..1 + g.n(3) {
                match g.n(if ro { 1 } else { 4 }) {
                    0 => {
                        c.push("GET");
                        c.push(bit_type(g));
                        c.push(offset(g));
                    }
                    1 => {
                        c.push("SET");
                        c.push(bit_type(g));
                        c.push(offset(g));
                        c.push(int(g));
                    }
                    2 => {
                        c.push("INCRBY");
                        c.push(bit_type(g));
                        c.push(offset(g));
                        c.push(int(g));
                    }
                    _ => {
                        c.push("OVERFLOW");
                        c.push(g.pick(&["WRAP", "SAT", "FAIL", "NOPE"]));
                    }
                }
            }
            c.done()
        }
        _ => C::new("BITFIELD")
            .a(&k)
            .a("SET")
            .a(g.pick(&["i64", "u63", "i62"]))
            .a("0")
            .a(g.pick(&[
                "9223372036854775807",
                "-9223372036854775808",
                "9007199254740993",
                "4611686018427387905",
            ]))
            .a("GET")
            .a(g.pick(&["i64", "u63"]))
            .a("0")
            .done(),
    }
}

pub(crate) fn geo_hll(g: &mut Gen) -> Cmd {
    let k = key(g);
    let coord = |g: &mut Gen| {
        g.pick(&[
            "13.361389 38.115556",
            "15.087269 37.502669",
            "0 0",
            "-180 -85.05112878",
            "181 0",
            "x 1",
            "2.35 48.85",
        ])
    };
    match g.n(12) {
        0..=2 => {
            let mut c = C::new("GEOADD").a(&k);
            if g.chance(20) {
                c.push(g.pick(&["NX", "XX", "CH"]));
            }
            for _ in 0..1 + g.n(2) {
                for part in coord(g).split(' ') {
                    c.push(part);
                }
                c.push(member(g));
            }
            c.done()
        }
        3 => C::new("GEODIST")
            .a(&k)
            .a(member(g))
            .a(member(g))
            .a(g.pick(&["km", "m", "mi", "ft", "parsec"]))
            .done(),
        4 => C::new(g.pick(&["GEOPOS", "GEOHASH"]))
            .a(&k)
            .a(member(g))
            .a(member(g))
            .done(),
        5 | 6 => {
            let store = g.chance(30);
            let mut c = if store {
                C::new("GEOSEARCHSTORE").a(key(g)).a(&k)
            } else {
                C::new("GEOSEARCH").a(&k)
            };
            if g.chance(50) {
                c.push("FROMMEMBER");
                c.push(member(g));
            } else {
                c.push("FROMLONLAT");
                for part in coord(g).split(' ') {
                    c.push(part);
                }
            }
            if g.chance(60) {
                c.push("BYRADIUS");
                c.push(g.pick(&["200", "1000", "0", "-1"]));
            } else {
                c.push("BYBOX");
                c.push(g.pick(&["400", "5000", "0"]));
                c.push(g.pick(&["400", "5000"]));
            }
            c.push(g.pick(&["km", "m", "parsec"]));
            if g.chance(50) {
                c.push(g.pick(&["ASC", "DESC"]));
            }
            if g.chance(30) {
                c.push("COUNT");
                c.push(g.pick(&["1", "2", "0"]));
            }
            if !store {
                for option in ["WITHCOORD", "WITHDIST", "WITHHASH"] {
                    if g.chance(30) {
                        c.push(option);
                    }
                }
            } else if g.chance(30) {
                c.push("STOREDIST");
            }
            c.done()
        }
        7 => C::new("GEORADIUS")
            .a(&k)
            .a("15")
            .a("37")
            .a(g.pick(&["200", "0"]))
            .a("km")
            .a(g.pick(&["ASC", "STORE", "WITHDIST"]))
            .a(key(g))
            .done(),
        8 | 9 => {
            let mut c = C::new("PFADD").a(&k);
            for _ in 0..g.n(4) {
                c.push(member(g));
            }
            c.done()
        }
        10 => C::new("PFCOUNT").a(&k).a(key(g)).done(),
        _ => C::new("PFMERGE").a(&k).a(key(g)).done(),
    }
}

pub(crate) fn keyspace(g: &mut Gen) -> Cmd {
    let k = key(g);
    let several = |g: &mut Gen, name: &str, first: &[u8]| {
        let mut c = C::new(name).a(first);
        for _ in 0..g.n(3) {
            c.push(key(g));
        }
        c.done()
    };
    let expire_flag = |g: &mut Gen, c: &mut C| {
        if g.chance(40) {
            c.push(g.pick(&["NX", "XX", "GT", "LT", "ZZ"]));
        }
        if g.chance(5) {
            c.push(g.pick(&["NX", "XX", "GT", "LT"]));
        }
    };
    match g.n(30) {
        0 | 1 => {
            let name = g.pick(&["DEL", "UNLINK"]);
            several(g, name, &k)
        }
        2 => several(g, "EXISTS", &k),
        3 => C::new("TYPE").a(&k).done(),
        4 => C::new(g.pick(&["RENAME", "RENAMENX"]))
            .a(&k)
            .a(key(g))
            .done(),
        5 => {
            let mut c = C::new("COPY").a(&k).a(key(g));
            if g.chance(20) {
                c.push("DB");
                c.push(g.pick(&["0", "2", "1", "16", "x"]));
            }
            if g.chance(40) {
                c.push("REPLACE");
            }
            c.done()
        }
        6 | 7 => {
            let mut c = C::new(g.pick(&["EXPIRE", "PEXPIRE"])).a(&k).a(g.pick(&[
                "1000",
                "100000",
                "0",
                "-1",
                "9223372036854775807",
                "9223372036854775",
                "9223372036854776",
                "-9223372036854775808",
                "x",
                "9223372036854775806",
            ]));
            expire_flag(g, &mut c);
            c.done()
        }
        8 => {
            let mut c = C::new(g.pick(&["EXPIREAT", "PEXPIREAT"])).a(&k).a(g.pick(&[
                "4102444800",
                "4102444800000",
                "1",
                "0",
                "-1",
                "9223372036854775807",
                "9223372036854775",
                "x",
            ]));
            expire_flag(g, &mut c);
            c.done()
        }
        9 => C::new("PERSIST").a(&k).done(),
        10 | 11 => C::new(g.pick(&["TTL", "PTTL", "EXPIRETIME", "PEXPIRETIME"]))
            .a(&k)
            .done(),
        12 => C::new("OBJECT")
            .a(g.pick(&["ENCODING", "ENCODING", "REFCOUNT", "NOPE"]))
            .a(&k)
            .done(),
        13 | 14 => {
            let ro = g.chance(20);
            let mut c = C::new(if ro { "SORT_RO" } else { "SORT" }).a(&k);
            if g.chance(20) {
                c.push("BY");
                c.push(g.pick(&["nosort", "w_*", "k*->f0", "k1"]));
            }
            if g.chance(20) {
                c.push("LIMIT");
                c.push(int(g));
                c.push(int(g));
            }
            if g.chance(20) {
                c.push("GET");
                c.push(g.pick(&["#", "k*", "k*->f0"]));
            }
            if g.chance(30) {
                c.push(g.pick(&["ASC", "DESC"]));
            }
            if g.chance(40) {
                c.push("ALPHA");
            }
            if !ro && g.chance(30) {
                c.push("STORE");
                c.push(key(g));
            }
            c.done()
        }
        15 => C::new("KEYS")
            .a(g.pick(&["*", "k*", "k[01]", "nope*"]))
            .done(),
        16 => {
            let mut c = C::new("SCAN").a(g.pick(&["0", "0", "x"]));
            c.push("COUNT");
            c.push("1000");
            if g.chance(30) {
                c.push("MATCH");
                c.push("k*");
            }
            if g.chance(30) {
                c.push("TYPE");
                c.push(g.pick(&["string", "hash", "zset", "nope"]));
            }
            c.done()
        }
        17 => C::new("DBSIZE").done(),
        18 => several(g, "TOUCH", &k),
        19 => C::new("RANDOMKEY").done(),
        20 => C::new("DUMP").a(&k).done(),
        21 => C::new("RESTORE")
            .a(&k)
            .a(g.pick(&["0", "-1", "100000", "x"]))
            .a(g.pick(&[
                // A DUMP of the string "v" (Redis 7.0, RDB 10).
                &b"\x00\x01v\n\x00\x91\x08\xce\xb2\x198\x8a\xce"[..],
                b"garbage",
                b"",
            ]))
            .a(g.pick(&["REPLACE", "ABSTTL", "IDLETIME", "FREQ"]))
            .done(),
        22 => C::new("MOVE")
            .a(&k)
            .a(g.pick(&["2", "0", "1", "16", "x"]))
            .done(),
        23 => C::new("SWAPDB")
            .a(g.pick(&["0", "2"]))
            .a(g.pick(&["2", "3", "1", "x"]))
            .done(),
        24 | 25 => C::new("SELECT")
            .a(g.pick(&["0", "2", "3", "1", "16", "-1", "x"]))
            .done(),
        26 => C::new("FLUSHDB").done(),
        _ => C::new("EXISTS").a(&k).done(),
    }
}

pub(crate) fn transactions(g: &mut Gen) -> Cmd {
    match g.n(8) {
        0 | 1 => C::new("MULTI").done(),
        2 | 3 => C::new("EXEC").done(),
        4 => C::new("DISCARD").done(),
        5 | 6 => {
            let mut c = C::new("WATCH").a(key(g));
            if g.chance(30) {
                c.push(key(g));
            }
            c.done()
        }
        _ => C::new("UNWATCH").done(),
    }
}

const SCRIPTS: &[&str] = &[
    "return 1",
    "return redis.call('SET', KEYS[1], ARGV[1])",
    "return redis.call('INCRBY', KEYS[1], ARGV[1])",
    "return redis.call('GET', KEYS[1])",
    "return {1, 2, {3, 'x'}, false}",
    "return redis.status_reply('FINE')",
    "return redis.error_reply('MY err')",
    "return {err = 'boom'}",
    "error('raw')",
    "return redis.pcall('HSET', KEYS[1], 'f')",
    "return redis.call('HSET', KEYS[1], 'f')",
    "return redis.call('LPUSH', KEYS[1], 'a')",
    "return 3.99",
    "return nil",
    "return true",
    "return false",
    "return tostring(redis.call('INCR', KEYS[1]))",
    "retur 1",
    "#!lua flags=no-writes\nreturn redis.call('GET', KEYS[1])",
    "#!lua flags=no-writes\nreturn redis.call('SET', KEYS[1], 'x')",
    "return redis.call('EVAL', 'return 1', 0)",
    "return 9007199254740993",
    "return redis.call('INCRBY', KEYS[1], '9007199254740993')",
    "return {ARGV[1], KEYS[1]}",
    "return redis.call('NOPE')",
    "return redis.call('SELECT', 2)",
    "local t = redis.call('HGETALL', KEYS[1]) return #t",
    "return redis.call('LPOP', KEYS[1], 2)",
    "return redis.sha1hex('')",
];

pub(crate) fn scripts(g: &mut Gen) -> Cmd {
    match g.n(8) {
        0..=3 => {
            let mut c = C::new(g.pick(&["EVAL", "EVAL", "EVAL", "EVAL_RO"])).a(g.pick(SCRIPTS));
            match g.n(10) {
                0..=6 => {
                    c.push("1");
                    c.push(key(g));
                }
                7 => c.push("0"),
                8 => c.push(g.pick(&["-1", "x", "5"])),
                _ => {
                    c.push("2");
                    c.push(key(g));
                    c.push(key(g));
                }
            }
            for _ in 0..g.n(3) {
                c.push(int(g));
            }
            c.done()
        }
        4 => {
            // A script of the pool (known once EVAL'd or loaded), or none.
            let sha = match g.n(4) {
                3 => "ffffffffffffffffffffffffffffffffffffffff".to_owned(),
                _ => pmnet_redis::script::script_sha(g.pick(SCRIPTS).as_bytes()),
            };
            C::new(g.pick(&["EVALSHA", "EVALSHA_RO"]))
                .a(sha)
                .a("1")
                .a(key(g))
                .done()
        }
        5 => C::new("SCRIPT").a("LOAD").a(g.pick(SCRIPTS)).done(),
        6 => C::new("SCRIPT")
            .a("EXISTS")
            .a("e0e1f9fabfc9d4800c877a703b823ac0578ff8db")
            .a("ffffffffffffffffffffffffffffffffffffffff")
            .done(),
        _ => C::new("EVAL")
            .a("return redis.call('INCRBY', KEYS[1], ARGV[1])")
            .a("1")
            .a(key(g))
            .a(g.pick(&["9007199254740993", "9223372036854775807", "1"]))
            .done(),
    }
}

pub(crate) fn connection(g: &mut Gen) -> Cmd {
    match g.n(8) {
        0 => C::new("PING").done(),
        1 => C::new("PING").a(value(g)).done(),
        2 => C::new("ECHO").a(value(g)).done(),
        3 => C::new("CLIENT")
            .a("SETNAME")
            .a(g.pick(&["me", "with space", ""]))
            .done(),
        4 => C::new("CLIENT").a("GETNAME").done(),
        5 => C::new("HELLO").a("2").done(),
        6 => C::new("RESET").done(),
        _ => C::new("CLIENT").a("ID").done(),
    }
}

const NAMES: &[&str] = &[
    "GET",
    "SET",
    "HSET",
    "HMSET",
    "HGET",
    "LPUSH",
    "SADD",
    "ZADD",
    "XADD",
    "INCRBY",
    "EXPIRE",
    "SETEX",
    "PSETEX",
    "MSET",
    "GETEX",
    "OBJECT",
    "XGROUP",
    "CLIENT",
    "SCRIPT",
    "COMMAND",
    "XINFO",
    "EVAL",
    "BITFIELD",
    "SORT",
    "LMPOP",
    "ZRANGESTORE",
    "GEOSEARCH",
    "SELECT",
    "MULTI",
    "EXEC",
    "WATCH",
    "PING",
    "ECHO",
    "HELLO",
    "SETRANGE",
    "LCS",
    "COPY",
    "RENAME",
];

pub(crate) fn invalid(g: &mut Gen) -> Cmd {
    match g.n(4) {
        0 => C::new(g.pick(&["NOPE", "GETT", "HSETX"]))
            .a(key(g))
            .a(value(g))
            .done(),
        1 => {
            let name = g.pick(NAMES);
            let mut c = C::new(name);
            for _ in 0..g.n(3) {
                c.push(key(g));
            }
            c.done()
        }
        2 => C::new(g.pick(&[
            "OBJECT", "XGROUP", "CLIENT", "SCRIPT", "COMMAND", "XINFO", "CONFIG", "MEMORY",
        ]))
        .a("NOPE")
        .a(key(g))
        .done(),
        _ => match g.n(3) {
            0 => C::new("COMMAND").a("COUNT").done(),
            1 => C::new("COMMAND").a("INFO").a("get").a("nope").done(),
            _ => C::new("COMMAND")
                .a("GETKEYS")
                .a("SET")
                .a(key(g))
                .a(value(g))
                .done(),
        },
    }
}

/// The databases a sequence may use (`SELECT`, `MOVE`, `COPY … DB`, `SWAPDB`): 0 to 3.
pub fn databases(sequence: &[Cmd]) -> Vec<u32> {
    let mut dbs = vec![0];
    for cmd in sequence {
        let name = cmd[0].to_ascii_uppercase();
        let candidates: &[Vec<u8>] = match name.as_slice() {
            b"SELECT" | b"MOVE" | b"SWAPDB" | b"COPY" => &cmd[1..],
            _ => &[],
        };
        for word in candidates {
            if let Some(db) = std::str::from_utf8(word)
                .ok()
                .and_then(|text| text.parse::<u32>().ok())
                .filter(|db| *db < 4)
            {
                if !dbs.contains(&db) {
                    dbs.push(db);
                }
            }
        }
    }
    dbs.sort_unstable();
    dbs
}
