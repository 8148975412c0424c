//! The TCP connection to Redis of one client connection: opened without blocking, set up to
//! match the client (`AUTH`, `HELLO`, `SELECT`, `CLIENT SETNAME`), written and read in the
//! gateway's event loop.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};

use crate::resp::encode_command;

use super::super::scan::ValueScan;
use super::super::{Conn, MAX_OUTPUT};
use super::{DirectOptions, Expect};

/// Bytes read from a direct connection at once.
const READ_CHUNK: usize = 64 << 10;

/// The TCP connection to Redis of one client connection.
#[derive(Debug)]
pub(super) struct Link {
    pub(super) stream: TcpStream,
    pub(super) fd: RawFd,
    pub(super) connected: bool,
    pub(super) out: Vec<u8>,
    pub(super) out_sent: usize,
    pub(super) input: Vec<u8>,
    pub(super) scan: ValueScan,
    pub(super) expect: VecDeque<Expect>,
    /// What the connection is set to.
    pub(super) resp3: bool,
    pub(super) db: u32,
    pub(super) name: Option<Vec<u8>>,
    pub(super) readable: bool,
    /// Redis closed the connection (after `QUIT`, say): what it sent before is still passed on.
    pub(super) eof: bool,
}

pub(super) fn open(options: &DirectOptions) -> io::Result<Link> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(options.redis), Type::STREAM, None)?;
    socket.set_nonblocking(true)?;
    socket.set_tcp_nodelay(true)?;
    match socket.connect(&options.redis.into()) {
        Ok(()) => {}
        Err(error) if error.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(error) => return Err(error),
    }
    let stream: TcpStream = socket.into();
    let mut link = Link {
        fd: stream.as_raw_fd(),
        stream,
        connected: false,
        out: Vec::new(),
        out_sent: 0,
        input: Vec::new(),
        scan: ValueScan::default(),
        expect: VecDeque::new(),
        resp3: false,
        db: 0,
        name: None,
        readable: false,
        eof: false,
    };
    if let Some((user, password)) = &options.auth {
        let mut words: Vec<&[u8]> = vec![b"AUTH"];
        words.extend(user.as_deref());
        words.push(password);
        link.setup(&words, "AUTH");
    }
    Ok(link)
}

impl Link {
    pub(super) fn setup(&mut self, words: &[&[u8]], what: &'static str) {
        encode_command(words, &mut self.out);
        self.expect.push_back(Expect::Setup(what));
    }

    /// Make the connection's protocol, database and name the client's.
    pub(super) fn set_up(&mut self, resp3: bool, db: u32, name: Option<Vec<u8>>) {
        if self.resp3 != resp3 {
            self.setup(&[b"HELLO", if resp3 { b"3" } else { b"2" }], "HELLO");
            self.resp3 = resp3;
        }
        if self.db != db {
            let number = db.to_string();
            self.setup(&[b"SELECT", number.as_bytes()], "SELECT");
            self.db = db;
        }
        if self.name != name {
            let word = name.as_deref().unwrap_or_default();
            self.setup(&[b"CLIENT", b"SETNAME", word], "CLIENT SETNAME");
            self.name = name;
        }
    }
}

/// Finish connecting, write what waits, read what came (while the client has room for it).
pub(super) fn pump(conn: &mut Conn) -> Result<(), String> {
    let room = conn.out.len() - conn.out_sent < MAX_OUTPUT;
    let Some(link) = conn.direct.link.as_mut() else {
        return Ok(());
    };
    if !link.connected {
        if let Ok(Some(error)) | Err(error) = link.stream.take_error() {
            return Err(format!("cannot connect: {error}"));
        }
        if link.stream.peer_addr().is_err() {
            return Ok(());
        }
        link.connected = true;
    }
    write_link(link)?;
    // Read only what the last wait (or look) found readable: an idle direct connection costs
    // no system call per turn.
    if !room || !link.readable {
        return Ok(());
    }
    let mut chunk = [0u8; READ_CHUNK];
    let mut total = 0;
    while total < 4 * READ_CHUNK && !link.eof {
        match link.stream.read(&mut chunk) {
            Ok(0) => link.eof = true,
            Ok(count) => {
                link.input.extend_from_slice(&chunk[..count]);
                total += count;
                if count < chunk.len() {
                    break;
                }
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(format!("reading from Redis failed: {error}")),
        }
    }
    link.readable = false;
    Ok(())
}

pub(super) fn pump_out(conn: &mut Conn) -> Result<(), String> {
    match conn.direct.link.as_mut() {
        Some(link) if link.connected => write_link(link),
        _ => Ok(()),
    }
}

fn write_link(link: &mut Link) -> Result<(), String> {
    while link.out_sent < link.out.len() {
        match link.stream.write(&link.out[link.out_sent..]) {
            Ok(0) => return Err("Redis closed the connection".to_owned()),
            Ok(count) => link.out_sent += count,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(format!("writing to Redis failed: {error}")),
        }
    }
    if link.out_sent == link.out.len() {
        link.out.clear();
        link.out_sent = 0;
    } else if link.out_sent > (1 << 20) {
        link.out.drain(..link.out_sent);
        link.out_sent = 0;
    }
    Ok(())
}
