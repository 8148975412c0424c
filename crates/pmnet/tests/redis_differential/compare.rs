//! Talking to both systems and comparing what they say: a raw RESP2 connection that keeps each
//! reply's bytes, the normalizations (only where Redis itself answers by chance, by the clock
//! or in its hash tables' order), and a canonical dump of a database.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use pmnet_redis::resp::{command_bytes, parse_value, Limits, Value};

/// One reply: its bytes and its value, or what happened instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Value {
        raw: Vec<u8>,
        value: Value,
    },
    /// The connection closed (or failed) before a whole reply came.
    Closed(String),
}

impl Reply {
    pub fn show(&self) -> String {
        match self {
            Reply::Value { raw, .. } => show_bytes(raw),
            Reply::Closed(why) => format!("<no reply: {why}>"),
        }
    }
}

pub fn show_bytes(bytes: &[u8]) -> String {
    let text: String = bytes.escape_ascii().to_string();
    if text.len() > 600 {
        format!("{}… ({} bytes)", &text[..600], bytes.len())
    } else {
        text
    }
}

pub fn show_command(cmd: &[Vec<u8>]) -> String {
    cmd.iter()
        .map(|word| {
            let text = word.escape_ascii().to_string();
            if text.is_empty() || text.contains(' ') || text.contains('\\') {
                format!("\"{text}\"")
            } else {
                text
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A RESP2 connection that keeps the bytes of every reply.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    buffer: Vec<u8>,
    limits: Limits,
    closed: Option<String>,
}

impl Conn {
    /// `timeout` bounds every read: longer than the gateway's own give-up (about 13 s).
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Conn {
        let stream = TcpStream::connect_timeout(&addr, timeout).expect("connect");
        stream.set_read_timeout(Some(timeout)).expect("timeout");
        stream.set_write_timeout(Some(timeout)).expect("timeout");
        stream.set_nodelay(true).expect("nodelay");
        Conn {
            stream,
            buffer: Vec::new(),
            limits: Limits {
                max_bulk_len: 64 << 20,
                max_depth: 64,
                ..Limits::default()
            },
            closed: None,
        }
    }

    pub fn call(&mut self, cmd: &[Vec<u8>]) -> Reply {
        if let Some(why) = &self.closed {
            return Reply::Closed(why.clone());
        }
        if let Err(error) = self.stream.write_all(&command_bytes(cmd)) {
            return self.close(format!("write: {error}"));
        }
        loop {
            match parse_value(&self.buffer, &self.limits) {
                Ok(Some((value, used))) => {
                    let raw = self.buffer.drain(..used).collect();
                    return Reply::Value { raw, value };
                }
                Ok(None) => {}
                Err(error) => return self.close(format!("bad reply: {error}")),
            }
            let mut chunk = [0u8; 16 << 10];
            match self.stream.read(&mut chunk) {
                Ok(0) => return self.close("closed".to_owned()),
                Ok(count) => self.buffer.extend_from_slice(&chunk[..count]),
                Err(error) => return self.close(format!("read: {error}")),
            }
        }
    }

    fn close(&mut self, why: String) -> Reply {
        self.closed = Some(why.clone());
        Reply::Closed(why)
    }

    /// A command of the test's own (not of a generated sequence): its value.
    pub fn value(&mut self, words: &[&str]) -> Value {
        let cmd: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        match self.call(&cmd) {
            Reply::Value { value, .. } => value,
            Reply::Closed(why) => Value::Error(format!("<no reply: {why}>").into_bytes()),
        }
    }
}

fn upper(word: &[u8]) -> String {
    String::from_utf8_lossy(word).to_ascii_uppercase()
}

/// The command's name, with its subcommand for container commands (`XINFO CONSUMERS`).
pub fn name_of(cmd: &[Vec<u8>]) -> String {
    let name = upper(&cmd[0]);
    let containers = ["OBJECT", "XGROUP", "XINFO", "CLIENT", "SCRIPT", "COMMAND"];
    match cmd.get(1) {
        Some(sub) if containers.contains(&name.as_str()) => format!("{name} {}", upper(sub)),
        _ => name,
    }
}

fn sort_items(items: &mut [Value]) {
    items.sort_by_key(Value::to_bytes);
}

/// Sort an array of pairs by pair (`HGETALL`, `HSCAN`'s items).
fn sort_pairs(items: Vec<Value>) -> Vec<Value> {
    let mut pairs: Vec<Vec<Value>> = items.chunks(2).map(<[Value]>::to_vec).collect();
    pairs.sort_by_key(|pair| pair.iter().flat_map(Value::to_bytes).collect::<Vec<u8>>());
    pairs.into_iter().flatten().collect()
}

/// The value's types and lengths, without scalars' contents.
fn shape(value: &Value) -> Value {
    match value {
        Value::Array(Some(items)) => Value::Array(Some(items.iter().map(shape).collect())),
        Value::Array(None) => Value::Array(None),
        Value::Bulk(Some(_)) => Value::Bulk(Some(b"<any>".to_vec())),
        Value::Bulk(None) => Value::Bulk(None),
        Value::Integer(_) => Value::Integer(0),
        Value::Simple(_) => Value::Simple(b"<any>".to_vec()),
        Value::Error(text) => Value::Error(text.clone()),
    }
}

/// Every array sorted, from the innermost out: the order of Redis's command table (`COMMAND`,
/// `COMMAND INFO`'s subcommands, `COMMAND DOCS`, `COMMAND LIST`) is its dict's, which depends on
/// the process's hash seed.
fn sorted_deep(value: &Value) -> Value {
    match value {
        Value::Array(Some(items)) => {
            let mut items: Vec<Value> = items.iter().map(sorted_deep).collect();
            sort_items(&mut items);
            Value::Array(Some(items))
        }
        other => other.clone(),
    }
}

/// Whether a `SORT` may leave elements in the key's own order: `BY` a pattern without `*`
/// does not sort, and `BY` a pattern with one leaves elements of equal weight (missing weights
/// too) in it.
fn sort_may_keep_order(cmd: &[Vec<u8>]) -> bool {
    cmd.iter().any(|word| word.eq_ignore_ascii_case(b"BY"))
}

fn count_arg(cmd: &[Vec<u8>], index: usize) -> Option<i64> {
    cmd.get(index)
        .and_then(|word| std::str::from_utf8(word).ok())
        .and_then(|text| text.parse().ok())
}

/// Zero the value after each `idle` key of a flat key/value array (`XINFO CONSUMERS`).
fn zero_idle(items: &mut [Value]) {
    for at in 0..items.len().saturating_sub(1) {
        if matches!(&items[at], Value::Bulk(Some(k)) if k == b"idle" || k == b"inactive") {
            items[at + 1] = Value::Integer(0);
        }
    }
}

/// The reply as compared: Redis's reply itself but where Redis answers by chance, by the
/// clock or in the order of its hash tables (each case says which). An error reply is
/// never normalized.
pub fn normalize(cmd: &[Vec<u8>], value: &Value) -> Value {
    if value.is_error() {
        return value.clone();
    }
    let name = name_of(cmd);
    match (name.as_str(), value.clone()) {
        // Sets and hashes in hash-table encoding answer in their table's order, which depends
        // on the process's hash seed: compared as sorted.
        (
            "KEYS" | "SMEMBERS" | "SUNION" | "SINTER" | "SDIFF" | "HKEYS" | "HVALS" | "SPOP",
            Value::Array(Some(mut items)),
        ) => {
            sort_items(&mut items);
            Value::Array(Some(items))
        }
        ("HGETALL", Value::Array(Some(items))) => Value::Array(Some(sort_pairs(items))),
        // SORT … BY a pattern without `*` (`nosort`, a plain key) does not sort, and BY one
        // with it leaves equal weights unsorted: a set's come in its hash table's order, all
        // of it compared sorted, a LIMIT of it by shape.
        ("SORT" | "SORT_RO", Value::Array(Some(mut items))) if sort_may_keep_order(cmd) => {
            if cmd.iter().any(|word| word.eq_ignore_ascii_case(b"LIMIT")) {
                shape(&Value::Array(Some(items)))
            } else {
                sort_items(&mut items);
                Value::Array(Some(items))
            }
        }
        // The command table in its dict's order (the process's hash seed).
        ("COMMAND" | "COMMAND INFO" | "COMMAND DOCS" | "COMMAND LIST", other) => {
            sorted_deep(&other)
        }
        // A count >= 0 takes distinct members (all of a small set, in table order): sorted. A
        // negative count or none picks at random: shape only.
        ("SRANDMEMBER", Value::Array(Some(mut items))) if count_arg(cmd, 2).unwrap_or(-1) >= 0 => {
            sort_items(&mut items);
            Value::Array(Some(items))
        }
        // Random picks: compared by shape (types and lengths).
        ("SRANDMEMBER" | "HRANDFIELD" | "ZRANDMEMBER" | "RANDOMKEY", other) => shape(&other),
        // A SCAN's cursor and the order of its items depend on the hash table: a finished
        // scan (cursor 0) is compared sorted, an unfinished one by shape.
        ("SCAN" | "SSCAN" | "HSCAN" | "ZSCAN", Value::Array(Some(parts))) if parts.len() == 2 => {
            let finished = parts[0] == Value::Bulk(Some(b"0".to_vec()));
            match (&parts[1], finished) {
                (Value::Array(Some(items)), true) => {
                    let items = if name == "HSCAN" || name == "ZSCAN" {
                        sort_pairs(items.clone())
                    } else {
                        let mut items = items.clone();
                        sort_items(&mut items);
                        items
                    };
                    Value::Array(Some(vec![parts[0].clone(), Value::Array(Some(items))]))
                }
                _ => shape(&Value::Array(Some(parts))),
            }
        }
        // The connection's id and the server's description differ by nature. A DUMP of a set
        // or hash in hash-table encoding lists its members in the table's order.
        ("CLIENT ID" | "HELLO" | "DUMP", other) => shape(&other),
        // How long ago a consumer was seen or an entry delivered: the clock.
        ("XINFO CONSUMERS", Value::Array(Some(consumers))) => Value::Array(Some(
            consumers
                .into_iter()
                .map(|consumer| match consumer {
                    Value::Array(Some(mut fields)) => {
                        zero_idle(&mut fields);
                        Value::Array(Some(fields))
                    }
                    other => other,
                })
                .collect(),
        )),
        ("XPENDING", Value::Array(Some(entries))) if cmd.len() > 3 => Value::Array(Some(
            entries
                .into_iter()
                .map(|entry| match entry {
                    Value::Array(Some(mut fields)) if fields.len() == 4 => {
                        fields[2] = Value::Integer(0);
                        Value::Array(Some(fields))
                    }
                    other => other,
                })
                .collect(),
        )),
        (_, other) => other,
    }
}

/// Commands whose positive integer reply is a time to live or an expiry time, compared within
/// a bound (the two systems ran the command moments apart): -2 (no key) and -1 (no expiry)
/// exactly.
fn time_tolerance(name: &str) -> Option<i64> {
    match name {
        "TTL" | "EXPIRETIME" => Some(5),
        "PTTL" | "PEXPIRETIME" => Some(5000),
        _ => None,
    }
}

/// Whether two replies to `cmd` are the same (after normalization). `queued`: the commands a
/// transaction queued, when `cmd` is its `EXEC` (its replies compared one by one).
pub fn same(cmd: &[Vec<u8>], queued: Option<&[Vec<Vec<u8>>]>, a: &Reply, b: &Reply) -> bool {
    let (
        Reply::Value {
            raw: raw_a,
            value: a,
        },
        Reply::Value {
            raw: raw_b,
            value: b,
        },
    ) = (a, b)
    else {
        // Both closed the connection (QUIT, a protocol error): the same, whatever the cause.
        return matches!((a, b), (Reply::Closed(_), Reply::Closed(_)));
    };
    if raw_a == raw_b {
        return true;
    }
    same_value(cmd, queued, a, b)
}

fn same_value(cmd: &[Vec<u8>], queued: Option<&[Vec<Vec<u8>>]>, a: &Value, b: &Value) -> bool {
    if let (Some(queued), Value::Array(Some(xs)), Value::Array(Some(ys))) = (queued, a, b) {
        return xs.len() == ys.len()
            && xs.len() == queued.len()
            && queued
                .iter()
                .zip(xs.iter().zip(ys))
                .all(|(cmd, (x, y))| same_value(cmd, None, x, y));
    }
    if let (Some(bound), Value::Integer(x), Value::Integer(y)) =
        (time_tolerance(&name_of(cmd)), a, b)
    {
        return x == y || (*x > 0 && *y > 0 && (x - y).abs() <= bound);
    }
    normalize(cmd, a) == normalize(cmd, b)
}

/// A canonical description of one database (the connection has selected it): every key with
/// its type, whether it expires, its encoding and its value in a form that does not depend on
/// the hash tables' order. `XINFO CONSUMERS`' idle times are left out (the clock).
pub fn dump(conn: &mut Conn) -> String {
    let mut out = String::new();
    let Value::Array(Some(keys)) = conn.value(&["KEYS", "*"]) else {
        return format!("KEYS * failed: {:?}\n", conn.value(&["PING"]));
    };
    let mut keys: Vec<Vec<u8>> = keys
        .into_iter()
        .filter_map(|key| key.as_bytes().map(<[u8]>::to_vec))
        .collect();
    keys.sort();
    for key in keys {
        let call = |conn: &mut Conn, words: &[&[u8]]| -> Value {
            let cmd: Vec<Vec<u8>> = words.iter().map(|w| w.to_vec()).collect();
            match conn.call(&cmd) {
                Reply::Value { value, .. } => normalize(&cmd, &value),
                Reply::Closed(why) => Value::Error(why.into_bytes()),
            }
        };
        let kind = call(conn, &[b"TYPE", &key]);
        let kind_name = String::from_utf8_lossy(kind.as_bytes().unwrap_or(b"?")).into_owned();
        let ttl = match call(conn, &[b"PTTL", &key]) {
            Value::Integer(ms) if ms > 0 => "expires".to_owned(),
            Value::Integer(-1) => "persistent".to_owned(),
            other => format!("{other:?}"),
        };
        let encoding = call(conn, &[b"OBJECT", b"ENCODING", &key]);
        let mut values = Vec::new();
        match kind_name.as_str() {
            "string" => values.push(call(conn, &[b"GET", &key])),
            "list" => values.push(call(conn, &[b"LRANGE", &key, b"0", b"-1"])),
            "set" => values.push(call(conn, &[b"SMEMBERS", &key])),
            "hash" => values.push(call(conn, &[b"HGETALL", &key])),
            "zset" => values.push(call(conn, &[b"ZRANGE", &key, b"0", b"-1", b"WITHSCORES"])),
            "stream" => {
                values.push(call(conn, &[b"XRANGE", &key, b"-", b"+"]));
                values.push(call(conn, &[b"XINFO", b"STREAM", &key]));
                let groups = call(conn, &[b"XINFO", b"GROUPS", &key]);
                if let Value::Array(Some(groups)) = &groups {
                    for group in groups {
                        let Value::Array(Some(fields)) = group else {
                            continue;
                        };
                        let Some(name) = fields.get(1).and_then(Value::as_bytes) else {
                            continue;
                        };
                        values.push(call(conn, &[b"XINFO", b"CONSUMERS", &key, name]));
                        values.push(call(conn, &[b"XPENDING", &key, name, b"-", b"+", b"1000"]));
                    }
                }
                values.push(groups);
            }
            _ => {}
        }
        out.push_str(&format!(
            "{} {kind_name} {ttl} {} {}\n",
            show_bytes(&key),
            show_bytes(&encoding.to_bytes()),
            values
                .iter()
                .map(|value| show_bytes(&value.to_bytes()))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    out
}
