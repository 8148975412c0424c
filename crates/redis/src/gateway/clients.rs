//! `CLIENT LIST`, `CLIENT INFO` and `CLIENT KILL` over the gateway's own connections: each
//! client's line in Redis 7.2's exact field order and set (`id addr laddr fd name age idle
//! flags db sub psub ssub multi qbuf qbuf-free argv-mem multi-mem rbs rbp obl oll omem tot-mem
//! events cmd user redir resp lib-name lib-ver`), with the gateway's values: `idle` since the
//! connection's last command, `cmd` that command, `qbuf` the input buffered and not yet parsed,
//! `obl`/`oll`/`omem` the replies owed and not yet written.

use std::net::Shutdown;

use crate::resp::{encode_bulk, error_reply, parse_int};

use super::{Conn, Slot};

/// Redis's fixed reply buffer (`obl` counts the bytes in it, the rest is `omem`).
const REPLY_CHUNK: usize = 16 << 10;

/// Whether a connection is still a client (not one being closed after a kill, a write error
/// or its peer's close, with requests still in flight).
pub(super) fn is_listed(conn: &Conn) -> bool {
    !conn.broken && !conn.read_closed
}

/// The database the connection has selected.
fn db_of(conn: &Conn) -> u32 {
    conn.state.db
}

fn show(bytes: Option<&[u8]>) -> String {
    bytes
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}

/// One client's line of `CLIENT LIST` (without its newline).
pub(super) fn line(conn: &Conn) -> String {
    let state = &conn.state;
    let addr = |addr: Option<std::net::SocketAddr>| addr.map(|a| a.to_string()).unwrap_or_default();
    let mut flags = String::new();
    if state.in_transaction() {
        flags.push('x');
    }
    if conn.closing {
        flags.push('c');
    }
    if flags.is_empty() {
        flags.push('N');
    }
    let (multi, multi_mem) = match state.queued() {
        Some((commands, bytes)) => (commands as i64, bytes),
        None => (-1, 0),
    };
    let unsent = conn.unsent();
    let owed: usize = conn
        .slots
        .iter()
        .map(|slot| match slot {
            Slot::Ready(bytes) => bytes.len(),
            _ => 0,
        })
        .sum();
    let obl = unsent.min(REPLY_CHUNK);
    let omem = unsent - obl + owed;
    let events = match conn.interest(usize::MAX) {
        Some((true, true)) => "rw",
        Some((true, false)) => "r",
        Some((false, true)) => "w",
        _ => "",
    };
    let argv_mem = conn.intro.argv_mem;
    let tot_mem = std::mem::size_of::<Conn>()
        + conn.input.capacity()
        + conn.out.capacity()
        + argv_mem
        + multi_mem
        + owed;
    format!(
        "id={} addr={} laddr={} fd={} name={} age={} idle={} flags={flags} db={} sub=0 psub=0 \
         ssub=0 multi={multi} qbuf={} qbuf-free={} argv-mem={argv_mem} multi-mem={multi_mem} \
         rbs={} rbp={} obl={obl} oll={} omem={omem} tot-mem={tot_mem} events={events} cmd={} \
         user=default redir=-1 resp={} lib-name={} lib-ver={}",
        state.id,
        addr(state.peer),
        addr(state.local),
        conn.fd,
        show(state.name.as_deref()),
        state.opened.elapsed().as_secs(),
        conn.intro.last_command.elapsed().as_secs(),
        db_of(conn),
        conn.input.len(),
        conn.input.capacity() - conn.input.len(),
        conn.input.capacity(),
        conn.intro.peak_input.max(conn.input.len()),
        conn.slots.len(),
        conn.intro.last_name.as_deref().unwrap_or("NULL"),
        if state.resp3 { 3 } else { 2 },
        show(state.lib_name.as_deref()),
        show(state.lib_ver.as_deref()),
    )
}

/// Text as `CLIENT INFO`/`LIST` answer it: a bulk string, verbatim text in RESP3.
fn text_reply(text: &str, resp3: bool) -> Vec<u8> {
    if resp3 {
        let mut out = format!("={}\r\ntxt:", text.len() + 4).into_bytes();
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(b"\r\n");
        out
    } else {
        let mut out = Vec::new();
        encode_bulk(text.as_bytes(), &mut out);
        out
    }
}

fn arity_error(sub: &[u8]) -> Vec<u8> {
    error_reply(&format!(
        "ERR wrong number of arguments for 'client|{}' command",
        String::from_utf8_lossy(sub).to_ascii_lowercase()
    ))
}

/// A client type of `TYPE`: whether gateway clients (all `normal`) are of it.
fn type_matches(name: &[u8]) -> Result<bool, Vec<u8>> {
    match name.to_ascii_lowercase().as_slice() {
        b"normal" => Ok(true),
        b"master" | b"replica" | b"slave" | b"pubsub" => Ok(false),
        _ => Err(error_reply(&format!(
            "ERR Unknown client type '{}'",
            String::from_utf8_lossy(name)
        ))),
    }
}

/// `CLIENT LIST|INFO|KILL …` asked on `conn`; `others` are the gateway's other connections.
pub(super) fn client_command(
    conn: &mut Conn,
    args: &[Vec<u8>],
    others: &mut [Option<Box<Conn>>],
) -> Vec<u8> {
    let sub = args[1].to_ascii_uppercase();
    match sub.as_slice() {
        b"INFO" if args.len() == 2 => text_reply(&format!("{}\n", line(conn)), conn.state.resp3),
        b"INFO" => arity_error(&args[1]),
        b"LIST" => list(conn, args, others),
        _ => kill(conn, args, others),
    }
}

fn list(conn: &Conn, args: &[Vec<u8>], others: &[Option<Box<Conn>>]) -> Vec<u8> {
    let mut all: Vec<&Conn> = std::iter::once(conn)
        .chain(others.iter().flatten().map(|other| &**other))
        .filter(|other| is_listed(other) || std::ptr::eq(*other, conn))
        .collect();
    all.sort_by_key(|other| other.state.id);
    let chosen: Vec<&Conn> = if args.len() == 4 && args[2].eq_ignore_ascii_case(b"TYPE") {
        match type_matches(&args[3]) {
            Ok(true) => all,
            Ok(false) => Vec::new(),
            Err(error) => return error,
        }
    } else if args.len() > 3 && args[2].eq_ignore_ascii_case(b"ID") {
        let mut chosen = Vec::new();
        for id in &args[3..] {
            let Some(id) = parse_int(id).filter(|id| *id > 0) else {
                return error_reply("ERR Invalid client ID");
            };
            chosen.extend(all.iter().find(|other| other.state.id == id as u64));
        }
        chosen
    } else if args.len() != 2 {
        return error_reply("ERR syntax error");
    } else {
        all
    };
    let mut text = String::new();
    for other in chosen {
        text.push_str(&line(other));
        text.push('\n');
    }
    text_reply(&text, conn.state.resp3)
}

/// What a `CLIENT KILL` kills.
#[derive(Default)]
struct Filter {
    id: Option<u64>,
    addr: Option<Vec<u8>>,
    laddr: Option<Vec<u8>>,
    /// `TYPE` names no type of the gateway's clients.
    no_type: bool,
    skip_me: bool,
}

impl Filter {
    fn parse(args: &[Vec<u8>]) -> Result<Filter, Vec<u8>> {
        let mut filter = Filter {
            skip_me: true,
            ..Filter::default()
        };
        let mut index = 2;
        while index < args.len() {
            let Some(value) = args.get(index + 1) else {
                return Err(error_reply("ERR syntax error"));
            };
            match args[index].to_ascii_uppercase().as_slice() {
                b"ID" => match parse_int(value).filter(|id| *id > 0) {
                    Some(id) => filter.id = Some(id as u64),
                    None => return Err(error_reply("ERR client-id should be greater than 0")),
                },
                b"TYPE" => filter.no_type |= !type_matches(value)?,
                b"ADDR" => filter.addr = Some(value.clone()),
                b"LADDR" => filter.laddr = Some(value.clone()),
                b"USER" => {
                    if value.as_slice() != b"default" {
                        return Err(error_reply(&format!(
                            "ERR No such user '{}'",
                            String::from_utf8_lossy(value)
                        )));
                    }
                }
                b"SKIPME" => match value.to_ascii_lowercase().as_slice() {
                    b"yes" => filter.skip_me = true,
                    b"no" => filter.skip_me = false,
                    _ => return Err(error_reply("ERR syntax error")),
                },
                _ => return Err(error_reply("ERR syntax error")),
            }
            index += 2;
        }
        Ok(filter)
    }

    fn matches(&self, conn: &Conn) -> bool {
        let addr = |addr: Option<std::net::SocketAddr>| addr.map(|a| a.to_string().into_bytes());
        !self.no_type
            && is_listed(conn)
            && self.id.is_none_or(|id| id == conn.state.id)
            && self
                .addr
                .as_ref()
                .is_none_or(|want| addr(conn.state.peer).as_ref() == Some(want))
            && self
                .laddr
                .as_ref()
                .is_none_or(|want| addr(conn.state.local).as_ref() == Some(want))
    }
}

/// Close another connection now: its socket is shut down (the client sees the connection
/// close), what it sent and the gateway has not started is dropped (as Redis runs no more of a
/// killed client's commands), its replies are dropped, and its session lingers until its
/// requests in flight complete.
fn close(conn: &mut Conn) {
    let _ = conn.stream.shutdown(Shutdown::Both);
    conn.input.clear();
    conn.read_closed = true;
    conn.closing = true;
    conn.broken = true;
}

fn kill(conn: &mut Conn, args: &[Vec<u8>], others: &mut [Option<Box<Conn>>]) -> Vec<u8> {
    let (filter, old_form) = match args.len() {
        2 => return arity_error(&args[1]),
        // `CLIENT KILL addr:port`: the client at that address, this one included.
        3 => (
            Filter {
                addr: Some(args[2].clone()),
                ..Filter::default()
            },
            true,
        ),
        _ => match Filter::parse(args) {
            Ok(filter) => (filter, false),
            Err(error) => return error,
        },
    };
    let mut killed = 0;
    for other in others.iter_mut().flatten() {
        if filter.matches(other) {
            close(other);
            killed += 1;
        }
    }
    if !filter.skip_me && filter.matches(conn) {
        // As Redis: this connection closes once this reply is written.
        conn.closing = true;
        killed += 1;
    }
    match (old_form, killed) {
        (true, 0) => error_reply("ERR No such client"),
        (true, _) => b"+OK\r\n".to_vec(),
        (false, count) => format!(":{count}\r\n").into_bytes(),
    }
}
