//! The gateway's RESP3 replies against a real Redis answering in RESP3.
//!
//! Two fresh redis-servers get the same commands: one on a RESP2 connection (as the adaptor
//! talks to Redis), one after `HELLO 3`. The RESP2 reply, converted by
//! `pmnet_redis::resp3::to_resp3`, must equal the RESP3 reply byte for byte; where a reply
//! depends on randomness, time or the order of Redis's hash tables, the two must have the same
//! shape (types and lengths at every depth). Needs `redis-server` (Debian `redis-server`).

mod redis_harness;

use std::io::{Read, Write};
use std::net::TcpStream;

use pmnet_redis::resp::{command_bytes, parse_value, Limits};
use pmnet_redis::resp3::{to_resp3, to_resp3_exec};
use redis_harness::*;

/// Where the RESP3 value starting at `pos` ends, or `None` if `buf` does not hold it all.
fn resp3_end(buf: &[u8], pos: usize) -> Option<usize> {
    let line_end = pos + buf.get(pos..)?.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&buf[pos + 1..line_end]).ok()?;
    let after = line_end + 2;
    match *buf.get(pos)? {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Some(after),
        b'$' | b'=' | b'!' => {
            let len: i64 = line.parse().ok()?;
            if len < 0 {
                return Some(after);
            }
            let end = after + len as usize + 2;
            (buf.len() >= end).then_some(end)
        }
        kind @ (b'*' | b'~' | b'%' | b'>' | b'|') => {
            let count: i64 = line.parse().ok()?;
            let items = if kind == b'%' || kind == b'|' {
                count * 2
            } else {
                count
            };
            let mut next = after;
            for _ in 0..items.max(0) {
                next = resp3_end(buf, next)?;
            }
            Some(next)
        }
        other => panic!("not a RESP3 type byte: {:?}", char::from(other)),
    }
}

/// The value's types and aggregate lengths at every depth, without the contents of scalars.
/// Below `depth` levels only the types show, not the lengths or the items.
fn shape(buf: &[u8], pos: usize, depth: usize, out: &mut String) -> usize {
    let line_end = pos + buf[pos..].windows(2).position(|w| w == b"\r\n").unwrap();
    let kind = buf[pos];
    let line = std::str::from_utf8(&buf[pos + 1..line_end]).unwrap();
    let after = line_end + 2;
    match kind {
        b'*' | b'~' | b'%' => {
            let count: i64 = line.parse().unwrap();
            if depth == 0 {
                out.push(char::from(kind));
                return resp3_end(buf, pos).unwrap();
            }
            out.push_str(&format!("{}{}[", char::from(kind), count));
            let items = if kind == b'%' { count * 2 } else { count };
            let mut next = after;
            for _ in 0..items.max(0) {
                next = shape(buf, next, depth - 1, out);
                out.push(' ');
            }
            out.push(']');
            next
        }
        _ => {
            out.push(char::from(kind));
            resp3_end(buf, pos).unwrap()
        }
    }
}

fn shape_of(reply: &[u8], depth: usize) -> String {
    let mut out = String::new();
    let end = shape(reply, 0, depth, &mut out);
    assert_eq!(end, reply.len(), "one value");
    out
}

struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    resp3: bool,
}

impl Conn {
    fn open(redis: &Redis, resp3: bool) -> Conn {
        let stream = TcpStream::connect(redis.addr()).expect("connect to redis-server");
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut conn = Conn {
            stream,
            buf: Vec::new(),
            resp3,
        };
        if resp3 {
            let hello = conn.send(&["HELLO", "3"]);
            assert_eq!(hello[0], b'%', "HELLO 3 answers a map");
        }
        conn
    }

    fn send(&mut self, args: &[&str]) -> Vec<u8> {
        self.stream.write_all(&command_bytes(args)).unwrap();
        loop {
            let end = if self.resp3 {
                resp3_end(&self.buf, 0)
            } else {
                let limits = Limits {
                    max_bulk_len: 64 << 20,
                    ..Limits::default()
                };
                parse_value(&self.buf, &limits)
                    .expect("a RESP2 reply")
                    .map(|(_, used)| used)
            };
            if let Some(end) = end {
                return self.buf.drain(..end).collect();
            }
            let mut chunk = [0u8; 65536];
            let read = self.stream.read(&mut chunk).expect("read a reply");
            assert!(read > 0, "redis-server closed the connection");
            self.buf.extend_from_slice(&chunk[..read]);
        }
    }
}

/// How a command's replies on the two servers are compared.
#[derive(Clone, Copy, PartialEq)]
enum Compare {
    Bytes,
    Shape,
    /// The shape of the outer levels: what lies deeper depends on timing.
    Outline,
}
use Compare::*;

fn owned(args: &[&str]) -> Vec<Vec<u8>> {
    args.iter().map(|arg| arg.as_bytes().to_vec()).collect()
}

#[test]
fn the_gateways_resp3_replies_are_the_ones_redis_gives() {
    require_redis();
    let dir = tempfile::tempdir().unwrap();
    let (dir2, dir3) = (dir.path().join("two"), dir.path().join("three"));
    std::fs::create_dir_all(&dir2).unwrap();
    std::fs::create_dir_all(&dir3).unwrap();
    let (redis2, redis3) = (Redis::start(&dir2), Redis::start(&dir3));
    let mut two = Conn::open(&redis2, false);
    let mut three = Conn::open(&redis3, true);

    let library = "#!lua name=lib\nredis.register_function{function_name='f', \
                   callback=function(keys, args) return 1 end, flags={'no-writes'}}";
    let commands: &[(Compare, &[&str])] = &[
        (Bytes, &["SET", "s1", "v"]),
        (Bytes, &["GET", "s1"]),
        (Bytes, &["GET", "missing"]),
        (Bytes, &["MGET", "s1", "missing"]),
        (Bytes, &["INCRBYFLOAT", "f", "1.5"]),
        (Bytes, &["HSET", "h", "a", "1", "b", "2"]),
        (Bytes, &["HGETALL", "h"]),
        (Bytes, &["HGETALL", "missing"]),
        (Bytes, &["HINCRBYFLOAT", "h", "a", "0.5"]),
        (Bytes, &["HMGET", "h", "a", "zz"]),
        (Shape, &["HRANDFIELD", "h", "2", "WITHVALUES"]),
        (Bytes, &["HRANDFIELD", "missing", "2", "WITHVALUES"]),
        (Bytes, &["HSCAN", "h", "0"]),
        (Bytes, &["SADD", "iset", "1", "2", "3"]),
        (Bytes, &["SADD", "iset2", "2", "3", "4"]),
        (Bytes, &["SADD", "words", "a", "b", "c"]),
        (Bytes, &["SMEMBERS", "iset"]),
        (Shape, &["SMEMBERS", "words"]),
        (Bytes, &["SMEMBERS", "missing"]),
        (Bytes, &["SINTER", "iset", "iset2"]),
        (Bytes, &["SUNION", "iset", "iset2"]),
        (Bytes, &["SDIFF", "iset", "iset2"]),
        (Bytes, &["SMISMEMBER", "iset", "1", "9"]),
        (Shape, &["SRANDMEMBER", "iset", "2"]),
        (Shape, &["SPOP", "iset2", "2"]),
        (Bytes, &["SPOP", "missing", "2"]),
        (Bytes, &["SPOP", "missing"]),
        (Bytes, &["ZADD", "z", "1", "a", "2.5", "b", "3", "c"]),
        (Bytes, &["ZSCORE", "z", "b"]),
        (Bytes, &["ZSCORE", "z", "missing"]),
        (Bytes, &["ZINCRBY", "z", "1", "a"]),
        (Bytes, &["ZADD", "z", "INCR", "2", "c"]),
        (Bytes, &["ZADD", "z", "NX", "INCR", "2", "c"]),
        (Bytes, &["ZMSCORE", "z", "a", "nope"]),
        (Bytes, &["ZRANGE", "z", "0", "-1", "WITHSCORES"]),
        (Bytes, &["ZRANGE", "z", "0", "-1"]),
        (Bytes, &["ZRANGEBYSCORE", "z", "-inf", "+inf", "WITHSCORES"]),
        (Bytes, &["ZREVRANGE", "z", "0", "-1", "withscores"]),
        (
            Bytes,
            &[
                "ZREVRANGEBYSCORE",
                "z",
                "+inf",
                "-inf",
                "WITHSCORES",
                "LIMIT",
                "0",
                "2",
            ],
        ),
        (Bytes, &["ZADD", "z2", "1", "a", "5", "d"]),
        (Bytes, &["ZUNION", "2", "z", "z2", "WITHSCORES"]),
        (Bytes, &["ZINTER", "2", "z", "z2", "WITHSCORES"]),
        (Bytes, &["ZDIFF", "2", "z", "z2", "WITHSCORES"]),
        (Shape, &["ZRANDMEMBER", "z", "2", "WITHSCORES"]),
        (Bytes, &["ZSCAN", "z", "0"]),
        (Bytes, &["ZPOPMIN", "z"]),
        (Bytes, &["ZPOPMAX", "z", "2"]),
        (Bytes, &["ZPOPMIN", "missing"]),
        (Bytes, &["ZPOPMIN", "missing", "2"]),
        (Bytes, &["ZADD", "z3", "1", "x", "2", "y", "3", "w"]),
        (Bytes, &["BZPOPMIN", "z3", "1"]),
        (Bytes, &["ZMPOP", "1", "z3", "MIN", "COUNT", "2"]),
        (Bytes, &["ZMPOP", "1", "missing", "MIN"]),
        (Bytes, &["ZADD", "zinf", "1", "x"]),
        (Bytes, &["ZINCRBY", "zinf", "inf", "x"]),
        (Bytes, &["ZSCORE", "zinf", "x"]),
        (Bytes, &["ZRANK", "z2", "a"]),
        (
            Bytes,
            &[
                "GEOADD",
                "g",
                "13.361389",
                "38.115556",
                "Palermo",
                "15.087269",
                "37.502669",
                "Catania",
            ],
        ),
        (Bytes, &["GEOPOS", "g", "Palermo", "nope"]),
        (Bytes, &["GEODIST", "g", "Palermo", "Catania"]),
        (Bytes, &["GEOHASH", "g", "Palermo", "nope"]),
        (
            Bytes,
            &[
                "GEOSEARCH",
                "g",
                "FROMLONLAT",
                "15",
                "37",
                "BYRADIUS",
                "200",
                "km",
                "ASC",
                "WITHCOORD",
                "WITHDIST",
            ],
        ),
        (
            Bytes,
            &[
                "GEOSEARCH",
                "g",
                "FROMLONLAT",
                "15",
                "37",
                "BYRADIUS",
                "200",
                "km",
                "ASC",
                "WITHDIST",
            ],
        ),
        (
            Bytes,
            &[
                "GEORADIUS",
                "g",
                "15",
                "37",
                "200",
                "km",
                "WITHCOORD",
                "ASC",
            ],
        ),
        (Bytes, &["XADD", "st", "1-1", "f", "v"]),
        (Bytes, &["XADD", "st", "2-1", "g", "w"]),
        (Bytes, &["XRANGE", "st", "-", "+"]),
        (Bytes, &["XREAD", "COUNT", "1", "STREAMS", "st", "0"]),
        (Bytes, &["XREAD", "STREAMS", "st", "9-9"]),
        (Bytes, &["XGROUP", "CREATE", "st", "grp", "0"]),
        (
            Bytes,
            &[
                "XREADGROUP",
                "GROUP",
                "grp",
                "c1",
                "COUNT",
                "1",
                "STREAMS",
                "st",
                ">",
            ],
        ),
        (Bytes, &["XINFO", "STREAM", "st"]),
        (Shape, &["XINFO", "STREAM", "st", "FULL"]),
        (Bytes, &["XINFO", "GROUPS", "st"]),
        (Shape, &["XINFO", "CONSUMERS", "st", "grp"]),
        (Bytes, &["XPENDING", "st", "grp"]),
        (Bytes, &["SET", "l1", "ohmytext"]),
        (Bytes, &["SET", "l2", "mynewtext"]),
        (Bytes, &["LCS", "l1", "l2", "IDX"]),
        (Bytes, &["LCS", "l1", "l2"]),
        (Bytes, &["CONFIG", "GET", "maxmemory"]),
        (Shape, &["CONFIG", "GET", "maxmemory-*"]),
        (Shape, &["INFO", "server"]),
        (Shape, &["LOLWUT"]),
        (Shape, &["MEMORY", "DOCTOR"]),
        (Shape, &["LATENCY", "DOCTOR"]),
        (Shape, &["MEMORY", "STATS"]),
        (
            Bytes,
            &["COMMAND", "INFO", "get", "zadd", "xadd", "nosuchcommand"],
        ),
        (Bytes, &["COMMAND", "DOCS", "get", "zadd", "geosearch"]),
        (Bytes, &["COMMAND", "GETKEYSANDFLAGS", "set", "a", "b"]),
        (Bytes, &["ACL", "GETUSER", "default"]),
        (Bytes, &["AUTH", "nobody", "wrong"]),
        (Shape, &["ACL", "LOG"]),
        (Bytes, &["FUNCTION", "LOAD", library]),
        (Bytes, &["FUNCTION", "LIST"]),
        (Shape, &["FUNCTION", "STATS"]),
        (Bytes, &["MODULE", "LIST"]),
        (Outline, &["LATENCY", "HISTOGRAM", "set"]),
        (Shape, &["TIME"]),
        (Bytes, &["EVAL", "return {1, false, 'x'}", "0"]),
        (Bytes, &["EVAL", "return redis.call('hgetall', 'h')", "0"]),
        (Bytes, &["OBJECT", "ENCODING", "s1"]),
        (Bytes, &["DBSIZE"]),
        (Shape, &["KEYS", "*"]),
        (Bytes, &["WRONGCOMMAND"]),
    ];
    for (compare, args) in commands {
        let resp2 = two.send(args);
        let expected = three.send(args);
        let converted = to_resp3(&owned(args), &resp2);
        match compare {
            Bytes => assert_eq!(
                String::from_utf8_lossy(&converted),
                String::from_utf8_lossy(&expected),
                "{args:?}: the conversion of Redis's RESP2 reply differs from its RESP3 reply"
            ),
            Shape | Outline => assert_eq!(
                shape_of(&converted, if *compare == Shape { usize::MAX } else { 2 }),
                shape_of(&expected, if *compare == Shape { usize::MAX } else { 2 }),
                "{args:?}: the converted reply's shape differs from Redis's RESP3 reply"
            ),
        }
    }

    // A transaction: each entry shaped by its own command.
    let queued: &[&[&str]] = &[
        &["HGETALL", "h"],
        &["GET", "missing"],
        &["ZSCORE", "z2", "d"],
        &["SMEMBERS", "iset"],
    ];
    for conn in [&mut two, &mut three] {
        assert_eq!(conn.send(&["MULTI"]), b"+OK\r\n");
        for args in queued {
            assert_eq!(conn.send(args), b"+QUEUED\r\n");
        }
    }
    let resp2 = two.send(&["EXEC"]);
    let expected = three.send(&["EXEC"]);
    let commands: Vec<Vec<Vec<u8>>> = queued.iter().map(|args| owned(args)).collect();
    assert_eq!(
        String::from_utf8_lossy(&to_resp3_exec(&commands, &resp2)),
        String::from_utf8_lossy(&expected)
    );
}
