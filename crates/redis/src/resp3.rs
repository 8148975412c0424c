//! RESP3 replies for connections that asked for them (`HELLO 3`).
//!
//! The adaptor talks RESP2 to Redis (its scripts and records are RESP2), so the gateway turns
//! each reply into the shape Redis itself gives a RESP3 client for the same command: nulls
//! become `_`, field/value lists become maps (`HGETALL`, `CONFIG GET`, `XINFO`, ...), member
//! lists of sets become sets (`SMEMBERS`, `SINTER`, ...), scores become doubles (`ZSCORE`,
//! `ZINCRBY`, ...), `WITHSCORES` lists become pairs, and text reports become verbatim strings
//! (`INFO`, `LOLWUT`, ...). `tests/resp3_vs_redis.rs` (in the `pmnet` crate) checks every rule
//! byte for byte against a real Redis answering in RESP3.
//!
//! Nothing here panics: a reply that does not have the shape a rule expects is passed on with
//! only its nulls converted.

use crate::resp::{parse_value, Limits, Value};

/// `reply` (one RESP2 value) as Redis would have answered `args` on a RESP3 connection.
pub fn to_resp3(args: &[Vec<u8>], reply: &[u8]) -> Vec<u8> {
    // The common replies need no change: statuses, errors, integers, strings.
    let unchanged = match reply.first() {
        Some(b'+' | b'-' | b':') => true,
        Some(b'$') => {
            !reply.starts_with(b"$-") && !is_verbatim_command(args) && !is_double_command(args)
        }
        _ => false,
    };
    if unchanged {
        return reply.to_vec();
    }
    let Some(value) = parse_whole(reply) else {
        return reply.to_vec();
    };
    let mut out = Vec::with_capacity(reply.len() + 16);
    command_reply(args, &value, &mut out);
    out
}

/// The reply of `EXEC` for the queued `commands`, each entry shaped by its own command.
pub fn to_resp3_exec(commands: &[Vec<Vec<u8>>], reply: &[u8]) -> Vec<u8> {
    let Some(value) = parse_whole(reply) else {
        return reply.to_vec();
    };
    let mut out = Vec::with_capacity(reply.len() + 16);
    match &value {
        Value::Array(Some(items)) if items.len() == commands.len() => {
            header(b'*', items.len(), &mut out);
            for (command, item) in commands.iter().zip(items) {
                command_reply(command, item, &mut out);
            }
        }
        other => plain(other, &mut out),
    }
    out
}

fn parse_whole(reply: &[u8]) -> Option<Value> {
    let limits = Limits {
        max_bulk_len: usize::MAX >> 1,
        ..Limits::default()
    };
    match parse_value(reply, &limits) {
        Ok(Some((value, used))) if used == reply.len() => Some(value),
        _ => None,
    }
}

fn lower(arg: Option<&Vec<u8>>) -> Vec<u8> {
    arg.map(|arg| arg.to_ascii_lowercase()).unwrap_or_default()
}

fn has_option(args: &[Vec<u8>], option: &[u8]) -> bool {
    args.iter()
        .skip(1)
        .any(|arg| arg.eq_ignore_ascii_case(option))
}

fn is_double_command(args: &[Vec<u8>]) -> bool {
    let name = lower(args.first());
    matches!(name.as_slice(), b"zscore" | b"zincrby")
        || (name == b"zadd" && has_option(args, b"incr"))
}

fn is_verbatim_command(args: &[Vec<u8>]) -> bool {
    let name = lower(args.first());
    let sub = lower(args.get(1));
    match name.as_slice() {
        b"info" | b"lolwut" => true,
        b"client" => matches!(sub.as_slice(), b"info" | b"list"),
        b"latency" | b"memory" => sub == b"doctor",
        b"cluster" => matches!(sub.as_slice(), b"info" | b"nodes"),
        _ => false,
    }
}

/// One command's reply in RESP3.
fn command_reply(args: &[Vec<u8>], value: &Value, out: &mut Vec<u8>) {
    if is_verbatim_command(args) {
        return verbatim(value, out);
    }
    let name = lower(args.first());
    let sub = lower(args.get(1));
    let scores = has_option(args, b"withscores");
    match name.as_slice() {
        b"hgetall" => map(value, out, |_, value, out| plain(value, out)),
        b"config" if sub == b"get" => map(value, out, |_, value, out| plain(value, out)),
        b"smembers" | b"sinter" | b"sunion" | b"sdiff" => set(value, out, plain),
        b"spop" if args.len() >= 3 => set(value, out, plain),
        b"zscore" | b"zincrby" => double(value, out),
        b"zadd" if has_option(args, b"incr") => double(value, out),
        b"zmscore" => array(value, out, double),
        b"zrange" | b"zrangebyscore" | b"zrevrange" | b"zrevrangebyscore" | b"zunion"
        | b"zinter" | b"zdiff" | b"zrandmember"
            if scores =>
        {
            pairs(value, out, double)
        }
        b"zpopmin" | b"zpopmax" if args.len() >= 3 => pairs(value, out, double),
        b"zpopmin" | b"zpopmax" => tuple(value, out, &[plain, double]),
        b"bzpopmin" | b"bzpopmax" => tuple(value, out, &[plain, plain, double]),
        b"zmpop" | b"bzmpop" => tuple(value, out, &[plain, scored_pairs]),
        b"zrank" | b"zrevrank" if has_option(args, b"withscore") => {
            tuple(value, out, &[plain, double])
        }
        b"hrandfield" if has_option(args, b"withvalues") => pairs(value, out, plain),
        b"geopos" => array(value, out, coordinates),
        b"georadius"
        | b"georadius_ro"
        | b"georadiusbymember"
        | b"georadiusbymember_ro"
        | b"geosearch"
            if has_option(args, b"withcoord") =>
        {
            array(value, out, |item, out| match item {
                Value::Array(Some(fields)) if !fields.is_empty() => {
                    header(b'*', fields.len(), out);
                    let last = fields.len() - 1;
                    for field in &fields[..last] {
                        plain(field, out);
                    }
                    coordinates(&fields[last], out);
                }
                other => plain(other, out),
            })
        }
        b"xread" | b"xreadgroup" => stream_map(value, out),
        b"xinfo" => match sub.as_slice() {
            b"stream" if has_option(args, b"full") => map(value, out, xinfo_full_field),
            b"stream" => map(value, out, |_, value, out| plain(value, out)),
            b"groups" | b"consumers" => array(value, out, flat_map),
            _ => plain(value, out),
        },
        b"lcs" if has_option(args, b"idx") => flat_map(value, out),
        b"memory" if sub == b"stats" => map(value, out, |key, value, out| {
            // Its ratios and percentages are doubles; every other figure an integer.
            if key.starts_with(b"db.") {
                flat_map(value, out)
            } else {
                double(value, out)
            }
        }),
        b"command" => match sub.as_slice() {
            b"docs" => map(value, out, |_, value, out| command_doc(value, out)),
            b"" | b"info" => array(value, out, command_info),
            b"getkeysandflags" => array(value, out, |item, out| {
                tuple(item, out, &[plain, |flags, out| set(flags, out, plain)])
            }),
            _ => plain(value, out),
        },
        b"acl" => match sub.as_slice() {
            b"getuser" => map(value, out, acl_user_field),
            b"log" if !has_option(args, b"reset") => array(value, out, |entry, out| {
                map(entry, out, |key, value, out| {
                    if key == b"age-seconds" {
                        double(value, out)
                    } else {
                        plain(value, out)
                    }
                })
            }),
            _ => plain(value, out),
        },
        b"function" => match sub.as_slice() {
            b"list" => array(value, out, |library, out| {
                map(library, out, |key, value, out| {
                    if key == b"functions" {
                        array(value, out, |function, out| {
                            map(function, out, |key, value, out| {
                                if key == b"flags" {
                                    set(value, out, plain)
                                } else {
                                    plain(value, out)
                                }
                            })
                        })
                    } else {
                        plain(value, out)
                    }
                })
            }),
            b"stats" => map(value, out, |key, value, out| {
                if key == b"engines" {
                    map(value, out, |_, value, out| flat_map(value, out))
                } else if key == b"running_script" {
                    flat_map(value, out)
                } else {
                    plain(value, out)
                }
            }),
            _ => plain(value, out),
        },
        b"module" if sub == b"list" => array(value, out, flat_map),
        b"latency" if sub == b"histogram" => map(value, out, |_, value, out| {
            map(value, out, |key, value, out| {
                if key == b"histogram_usec" {
                    flat_map(value, out)
                } else {
                    plain(value, out)
                }
            })
        }),
        _ => plain(value, out),
    }
}

type Emit = fn(&Value, &mut Vec<u8>);

fn header(kind: u8, len: usize, out: &mut Vec<u8>) {
    out.push(kind);
    out.extend_from_slice(len.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// The value with its nulls as RESP3 nulls, at every depth.
fn plain(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Bulk(None) | Value::Array(None) => out.extend_from_slice(b"_\r\n"),
        Value::Array(Some(items)) => {
            header(b'*', items.len(), out);
            for item in items {
                plain(item, out);
            }
        }
        other => other.encode(out),
    }
}

/// A score: a bulk string holding a number becomes a double.
fn double(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Bulk(Some(text)) => {
            out.push(b',');
            out.extend_from_slice(text);
            out.extend_from_slice(b"\r\n");
        }
        other => plain(other, out),
    }
}

fn verbatim(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Bulk(Some(text)) => {
            header(b'=', text.len() + 4, out);
            out.extend_from_slice(b"txt:");
            out.extend_from_slice(text);
            out.extend_from_slice(b"\r\n");
        }
        other => plain(other, out),
    }
}

/// A list as an aggregate of type `kind` (`*` array, `~` set), each item shaped by `item`.
fn aggregate(kind: u8, value: &Value, out: &mut Vec<u8>, item: impl Fn(&Value, &mut Vec<u8>)) {
    match value {
        Value::Array(Some(items)) => {
            header(kind, items.len(), out);
            for each in items {
                item(each, out);
            }
        }
        other => plain(other, out),
    }
}

fn array(value: &Value, out: &mut Vec<u8>, item: impl Fn(&Value, &mut Vec<u8>)) {
    aggregate(b'*', value, out, item)
}

fn set(value: &Value, out: &mut Vec<u8>, item: impl Fn(&Value, &mut Vec<u8>)) {
    aggregate(b'~', value, out, item)
}

/// A flat `[key, value, key, value, ...]` list as a map, each value shaped by its key.
fn map(value: &Value, out: &mut Vec<u8>, field: impl Fn(&[u8], &Value, &mut Vec<u8>)) {
    match value {
        Value::Array(Some(items)) if items.len() % 2 == 0 => {
            header(b'%', items.len() / 2, out);
            for pair in items.chunks_exact(2) {
                plain(&pair[0], out);
                field(pair[0].as_bytes().unwrap_or_default(), &pair[1], out);
            }
        }
        other => plain(other, out),
    }
}

fn flat_map(value: &Value, out: &mut Vec<u8>) {
    map(value, out, |_, value, out| plain(value, out))
}

/// A flat `[a, b, a, b, ...]` list as an array of `[a, b]` pairs.
fn pairs(value: &Value, out: &mut Vec<u8>, second: Emit) {
    match value {
        Value::Array(Some(items)) if items.len() % 2 == 0 => {
            header(b'*', items.len() / 2, out);
            for pair in items.chunks_exact(2) {
                out.extend_from_slice(b"*2\r\n");
                plain(&pair[0], out);
                second(&pair[1], out);
            }
        }
        other => plain(other, out),
    }
}

/// An array whose items are shaped one by one; the last shape repeats for longer arrays.
fn tuple(value: &Value, out: &mut Vec<u8>, shapes: &[Emit]) {
    match value {
        Value::Array(Some(items)) => {
            header(b'*', items.len(), out);
            for (index, item) in items.iter().enumerate() {
                match shapes.get(index).or(shapes.last()) {
                    Some(shape) => shape(item, out),
                    None => plain(item, out),
                }
            }
        }
        other => plain(other, out),
    }
}

/// `[[member, score], ...]` (ZMPOP's elements) with the scores as doubles.
fn scored_pairs(value: &Value, out: &mut Vec<u8>) {
    array(value, out, |pair, out| tuple(pair, out, &[plain, double]))
}

fn coordinates(value: &Value, out: &mut Vec<u8>) {
    array(value, out, double)
}

/// `XREAD`'s `[[stream, entries], ...]` as a map from stream to entries.
fn stream_map(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Array(Some(streams))
            if streams
                .iter()
                .all(|stream| matches!(stream, Value::Array(Some(pair)) if pair.len() == 2)) =>
        {
            header(b'%', streams.len(), out);
            for stream in streams {
                if let Value::Array(Some(pair)) = stream {
                    plain(&pair[0], out);
                    plain(&pair[1], out);
                }
            }
        }
        other => plain(other, out),
    }
}

fn xinfo_full_field(key: &[u8], value: &Value, out: &mut Vec<u8>) {
    if key == b"groups" {
        array(value, out, |group, out| {
            map(group, out, |key, value, out| {
                if key == b"consumers" {
                    array(value, out, flat_map)
                } else {
                    plain(value, out)
                }
            })
        })
    } else {
        plain(value, out)
    }
}

fn acl_user_field(key: &[u8], value: &Value, out: &mut Vec<u8>) {
    match key {
        b"flags" => set(value, out, plain),
        b"selectors" => array(value, out, flat_map),
        _ => plain(value, out),
    }
}

/// One entry of `COMMAND INFO`: flags, ACL categories, tips, key specs and subcommands are
/// sets, each key spec a map.
fn command_info(value: &Value, out: &mut Vec<u8>) {
    fn spec_part(value: &Value, out: &mut Vec<u8>) {
        map(value, out, |key, value, out| {
            if key == b"spec" {
                flat_map(value, out)
            } else {
                plain(value, out)
            }
        })
    }
    fn key_spec(value: &Value, out: &mut Vec<u8>) {
        map(value, out, |key, value, out| match key {
            b"flags" => set(value, out, plain),
            b"begin_search" | b"find_keys" => spec_part(value, out),
            _ => plain(value, out),
        })
    }
    fn set_of_plain(value: &Value, out: &mut Vec<u8>) {
        set(value, out, plain)
    }
    // Redis sends the key specs and the subcommands as sets too.
    fn key_specs(value: &Value, out: &mut Vec<u8>) {
        set(value, out, key_spec)
    }
    fn subcommands(value: &Value, out: &mut Vec<u8>) {
        set(value, out, command_info)
    }
    tuple(
        value,
        out,
        &[
            plain,
            plain,
            set_of_plain,
            plain,
            plain,
            plain,
            set_of_plain,
            set_of_plain,
            key_specs,
            subcommands,
        ],
    )
}

/// One command's `COMMAND DOCS` entry.
fn command_doc(value: &Value, out: &mut Vec<u8>) {
    fn argument(value: &Value, out: &mut Vec<u8>) {
        map(value, out, |key, value, out| match key {
            b"flags" => set(value, out, plain),
            b"arguments" => array(value, out, argument),
            _ => plain(value, out),
        })
    }
    map(value, out, |key, value, out| match key {
        b"doc_flags" | b"history" => set(value, out, plain),
        b"arguments" => array(value, out, argument),
        b"subcommands" => map(value, out, |_, value, out| command_doc(value, out)),
        _ => plain(value, out),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|word| word.as_bytes().to_vec()).collect()
    }

    #[test]
    fn plain_replies_pass_unchanged_and_nulls_become_resp3_nulls() {
        assert_eq!(to_resp3(&args(&["SET", "k", "v"]), b"+OK\r\n"), b"+OK\r\n");
        assert_eq!(
            to_resp3(&args(&["GET", "k"]), b"$1\r\nv\r\n"),
            b"$1\r\nv\r\n"
        );
        assert_eq!(to_resp3(&args(&["GET", "k"]), b"$-1\r\n"), b"_\r\n");
        assert_eq!(
            to_resp3(&args(&["MGET", "a", "b"]), b"*2\r\n$1\r\nv\r\n$-1\r\n"),
            b"*2\r\n$1\r\nv\r\n_\r\n"
        );
    }

    #[test]
    fn shapes_by_command() {
        assert_eq!(
            to_resp3(&args(&["hgetall", "h"]), b"*2\r\n$1\r\nf\r\n$1\r\nv\r\n"),
            b"%1\r\n$1\r\nf\r\n$1\r\nv\r\n"
        );
        assert_eq!(
            to_resp3(&args(&["SMEMBERS", "s"]), b"*1\r\n$1\r\na\r\n"),
            b"~1\r\n$1\r\na\r\n"
        );
        assert_eq!(
            to_resp3(&args(&["ZSCORE", "z", "m"]), b"$3\r\n1.5\r\n"),
            b",1.5\r\n"
        );
        assert_eq!(
            to_resp3(
                &args(&["ZRANGE", "z", "0", "-1", "WITHSCORES"]),
                b"*2\r\n$1\r\nm\r\n$1\r\n2\r\n"
            ),
            b"*1\r\n*2\r\n$1\r\nm\r\n,2\r\n"
        );
        assert_eq!(
            to_resp3(&args(&["INFO"]), b"$2\r\nab\r\n"),
            b"=6\r\ntxt:ab\r\n"
        );
    }

    #[test]
    fn replies_of_an_unexpected_shape_are_passed_on() {
        // An odd-length list cannot be a map; a broken reply is left alone.
        assert_eq!(
            to_resp3(&args(&["HGETALL", "h"]), b"*1\r\n$1\r\nf\r\n"),
            b"*1\r\n$1\r\nf\r\n"
        );
        assert_eq!(to_resp3(&args(&["HGETALL", "h"]), b"*2\r\n$1"), b"*2\r\n$1");
        assert_eq!(to_resp3(&[], b"$-1\r\n"), b"_\r\n");
    }

    #[test]
    fn exec_shapes_each_entry_by_its_command() {
        let commands = vec![args(&["GET", "k"]), args(&["SMEMBERS", "s"])];
        assert_eq!(
            to_resp3_exec(&commands, b"*2\r\n$-1\r\n*1\r\n$1\r\na\r\n"),
            b"*2\r\n_\r\n~1\r\n$1\r\na\r\n"
        );
        assert_eq!(to_resp3_exec(&commands, b"*-1\r\n"), b"_\r\n");
    }
}
