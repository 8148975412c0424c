//! A small RESP2 codec: commands from clients (arrays of bulk strings, or inline lines),
//! replies from Redis (any RESP2 value), encoders for both, and a blocking client for start-up
//! work and tests.
//!
//! Every parser takes a byte buffer that may hold a partial message and answers
//! `Ok(None)` ("need more bytes"), `Ok(Some((message, bytes_used)))`, or an error for input
//! that can never become valid. Lengths and nesting are bounded by [`Limits`]; nothing here
//! panics on any input.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Bounds on what a parser accepts.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Arguments of one command at most.
    pub max_args: usize,
    /// Bytes of one bulk string at most.
    pub max_bulk_len: usize,
    /// Bytes of all the arguments of one command together at most.
    pub max_command_len: usize,
    /// Bytes of an inline command line (or of a `*`/`$` header line) at most.
    pub max_line_len: usize,
    /// Nesting of arrays in a reply at most.
    pub max_depth: usize,
}

/// Bytes of one bulk string at most in Redis (`proto-max-bulk-len`, 512 MB).
pub const REDIS_MAX_BULK_LEN: usize = 512 << 20;
/// Arguments of one command at most through the gateway (Redis takes up to `INT_MAX`; the
/// gateway stops at 1 048 576, each argument costing it a buffer of its own).
pub const GATEWAY_MAX_ARGS: usize = 1 << 20;

impl Limits {
    /// The gateway's limits on clients' commands: Redis's own bulk length, up to `max_args`
    /// arguments and `max_command_len` bytes of arguments in all.
    pub fn gateway(max_args: usize, max_command_len: usize) -> Limits {
        Limits {
            max_args,
            max_bulk_len: REDIS_MAX_BULK_LEN.min(max_command_len),
            max_command_len,
            ..Limits::default()
        }
    }

    /// Bytes a command within these limits takes on the wire at most (its arguments and the
    /// headers around them): a connection's input buffer must hold this much.
    pub fn max_wire_len(&self) -> usize {
        // `*N\r\n`, and `$len\r\n` + `\r\n` around each argument (at most 24 + 2 bytes).
        self.max_command_len
            .saturating_add(self.max_args.saturating_mul(26))
            .saturating_add(self.max_line_len)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // Redis's Lua `unpack` fails beyond about 8000 values; the adaptor passes the
            // arguments through a script, so stay well below.
            max_args: 4096,
            max_bulk_len: 1 << 20,
            max_command_len: 1 << 20,
            max_line_len: 64 << 10,
            max_depth: 16,
        }
    }
}

/// Input that can never become a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Protocol error: {0}")]
pub struct RespError(pub String);

fn protocol(message: impl Into<String>) -> RespError {
    RespError(message.into())
}

/// A RESP2 value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Simple(Vec<u8>),
    Error(Vec<u8>),
    Integer(i64),
    /// `None`: the nil bulk string.
    Bulk(Option<Vec<u8>>),
    /// `None`: the nil array.
    Array(Option<Vec<Value>>),
}

impl Value {
    /// Append the RESP encoding of this value to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Value::Simple(text) => {
                out.push(b'+');
                out.extend_from_slice(text);
                out.extend_from_slice(b"\r\n");
            }
            Value::Error(text) => {
                out.push(b'-');
                out.extend_from_slice(text);
                out.extend_from_slice(b"\r\n");
            }
            Value::Integer(number) => {
                out.extend_from_slice(format!(":{number}\r\n").as_bytes());
            }
            Value::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
            Value::Bulk(Some(bytes)) => encode_bulk(bytes, out),
            Value::Array(None) => out.extend_from_slice(b"*-1\r\n"),
            Value::Array(Some(items)) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for item in items {
                    item.encode(out);
                }
            }
        }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }

    /// The bytes of a simple or bulk string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Simple(bytes) | Value::Bulk(Some(bytes)) => Some(bytes),
            _ => None,
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Value::Error(_))
    }
}

/// Append a bulk string.
pub fn encode_bulk(bytes: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("${}\r\n", bytes.len()).as_bytes());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// Append a command: an array of bulk strings.
pub fn encode_command<A: AsRef<[u8]>>(args: &[A], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        encode_bulk(arg.as_ref(), out);
    }
}

/// A command as bytes.
pub fn command_bytes<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_command(args, &mut out);
    out
}

/// An error reply `-MESSAGE\r\n`; line breaks in the message become spaces.
pub fn error_reply(message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(message.len() + 3);
    out.push(b'-');
    out.extend(message.bytes().map(|byte| {
        if byte == b'\r' || byte == b'\n' {
            b' '
        } else {
            byte
        }
    }));
    out.extend_from_slice(b"\r\n");
    out
}

/// Index of the `\r` of the first `\r\n` at or after `from`.
fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    let rest = buf.get(from..)?;
    rest.windows(2)
        .position(|pair| pair == b"\r\n")
        .map(|offset| from + offset)
}

/// A strict decimal integer: optional `-`, then 1..=19 digits, no overflow.
pub fn parse_int(bytes: &[u8]) -> Option<i64> {
    let (negative, digits) = match bytes.first() {
        Some(b'-') => (true, &bytes[1..]),
        _ => (false, bytes),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut value: i64 = 0;
    for &digit in digits {
        value = value
            .checked_mul(10)?
            .checked_sub(i64::from(digit - b'0'))?;
    }
    if negative {
        Some(value)
    } else {
        value.checked_neg()
    }
}

/// An integer exactly as Redis parses a command's argument (`string2ll`): an optional `-`,
/// then `0` alone or digits not starting with `0`, within a signed 64-bit integer. Stricter
/// than [`parse_int`] (`01`, `-0` and `+1` are not integers to Redis).
pub fn parse_redis_int(bytes: &[u8]) -> Option<i64> {
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    let canonical = digits == b"0" && digits.len() == bytes.len()
        || digits
            .first()
            .is_some_and(|first| (b'1'..=b'9').contains(first));
    if !canonical {
        return None;
    }
    parse_int(bytes)
}

/// Read the header line at `pos` (after its type byte): the integer and where the next
/// element starts. `Ok(None)`: incomplete.
fn header_line(buf: &[u8], pos: usize) -> Result<Option<(i64, usize)>, RespError> {
    let Some(end) = find_crlf(buf, pos + 1) else {
        if buf.len().saturating_sub(pos) > 32 {
            return Err(protocol("header line too long"));
        }
        return Ok(None);
    };
    let number = parse_int(&buf[pos + 1..end]).ok_or_else(|| {
        protocol(format!(
            "invalid length {:?}",
            String::from_utf8_lossy(&buf[pos + 1..end])
        ))
    })?;
    Ok(Some((number, end + 2)))
}

/// A command from a client: its arguments and the bytes it took. An empty argument list is a
/// command to ignore (`*0`, `*-1`, a blank inline line).
pub type ParsedCommand = (Vec<Vec<u8>>, usize);

/// Parse one command from the front of `buf`.
pub fn parse_command(buf: &[u8], limits: &Limits) -> Result<Option<ParsedCommand>, RespError> {
    match buf.first() {
        None => Ok(None),
        Some(b'*') => parse_multibulk(buf, limits),
        Some(_) => parse_inline(buf, limits),
    }
}

/// How far [`parse_command_resumable`] got into an incomplete command: where its next
/// argument starts and how many are left. Valid for the same buffer (grown at its end only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Progress {
    /// The next argument's header starts here (0: nothing parsed yet).
    pos: usize,
    left: usize,
    total: usize,
}

/// [`parse_command`], remembering in `progress` how far it got into an incomplete command, so
/// that a large command arriving in many reads is scanned once, not again from its start on
/// every read. `progress` must be reset (`Progress::default()`) whenever `buf`'s front
/// changes; it is reset here whenever a command is complete or an error found.
pub fn parse_command_resumable(
    buf: &[u8],
    limits: &Limits,
    progress: &mut Progress,
) -> Result<Option<ParsedCommand>, RespError> {
    if buf.first() != Some(&b'*') {
        *progress = Progress::default();
        return parse_command(buf, limits);
    }
    let scanned = scan_multibulk(buf, limits, progress);
    match scanned {
        Ok(true) => {
            *progress = Progress::default();
            parse_multibulk(buf, limits)
        }
        Ok(false) => Ok(None),
        Err(error) => {
            *progress = Progress::default();
            Err(error)
        }
    }
}

/// Walk the arguments of the multibulk at the front of `buf` from `progress` on, without
/// copying them: whether the command is complete.
fn scan_multibulk(buf: &[u8], limits: &Limits, progress: &mut Progress) -> Result<bool, RespError> {
    if progress.pos == 0 {
        let Some((count, pos)) = header_line(buf, 0)? else {
            return Ok(false);
        };
        if count <= 0 {
            return Ok(true);
        }
        let count = usize::try_from(count).unwrap_or(usize::MAX);
        if count > limits.max_args {
            return Err(protocol("invalid multibulk length"));
        }
        *progress = Progress {
            pos,
            left: count,
            total: 0,
        };
    }
    while progress.left > 0 {
        let (len, start) = bulk_header(buf, progress.pos, limits, progress.total)?;
        let Some((len, start)) = len.zip(start) else {
            return Ok(false);
        };
        let end = start + len;
        if buf.len() < end + 2 {
            return Ok(false);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(protocol("bulk string not followed by CRLF"));
        }
        progress.pos = end + 2;
        progress.total += len;
        progress.left -= 1;
    }
    Ok(true)
}

/// The header of an argument at `pos`: its length and where its bytes start (`None`s:
/// incomplete), checked against the limits with `total` bytes of arguments before it.
fn bulk_header(
    buf: &[u8],
    pos: usize,
    limits: &Limits,
    total: usize,
) -> Result<(Option<usize>, Option<usize>), RespError> {
    match buf.get(pos) {
        None => return Ok((None, None)),
        Some(b'$') => {}
        Some(&other) => {
            return Err(protocol(format!(
                "expected '$', got '{}'",
                char::from(other).escape_default()
            )))
        }
    }
    let Some((len, start)) = header_line(buf, pos)? else {
        return Ok((None, None));
    };
    let len = usize::try_from(len).map_err(|_| protocol("invalid bulk length"))?;
    if len > limits.max_bulk_len {
        return Err(protocol("invalid bulk length"));
    }
    if total.saturating_add(len) > limits.max_command_len {
        return Err(protocol(format!(
            "command larger than {} bytes",
            limits.max_command_len
        )));
    }
    Ok((Some(len), Some(start)))
}

fn parse_multibulk(buf: &[u8], limits: &Limits) -> Result<Option<ParsedCommand>, RespError> {
    let Some((count, mut pos)) = header_line(buf, 0)? else {
        return Ok(None);
    };
    if count <= 0 {
        return Ok(Some((Vec::new(), pos)));
    }
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    if count > limits.max_args {
        return Err(protocol("invalid multibulk length"));
    }
    let mut args = Vec::with_capacity(count.min(1 << 16));
    let mut total = 0usize;
    for _ in 0..count {
        let (len, start) = bulk_header(buf, pos, limits, total)?;
        let Some((len, start)) = len.zip(start) else {
            return Ok(None);
        };
        total += len;
        let end = start + len;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(protocol("bulk string not followed by CRLF"));
        }
        args.push(buf[start..end].to_vec());
        pos = end + 2;
    }
    Ok(Some((args, pos)))
}

fn parse_inline(buf: &[u8], limits: &Limits) -> Result<Option<ParsedCommand>, RespError> {
    let Some(newline) = buf.iter().position(|&byte| byte == b'\n') else {
        if buf.len() > limits.max_line_len {
            return Err(protocol("too big inline request"));
        }
        return Ok(None);
    };
    if newline > limits.max_line_len {
        return Err(protocol("too big inline request"));
    }
    let line = &buf[..newline];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let args: Vec<Vec<u8>> = line
        .split(|byte| byte.is_ascii_whitespace())
        .filter(|word| !word.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    if args.len() > limits.max_args {
        return Err(protocol("too many arguments"));
    }
    Ok(Some((args, newline + 1)))
}

/// Parse one reply (any RESP2 value) from the front of `buf`.
pub fn parse_value(buf: &[u8], limits: &Limits) -> Result<Option<(Value, usize)>, RespError> {
    parse_value_at(buf, 0, limits, 0)
}

fn parse_value_at(
    buf: &[u8],
    pos: usize,
    limits: &Limits,
    depth: usize,
) -> Result<Option<(Value, usize)>, RespError> {
    let Some(&kind) = buf.get(pos) else {
        return Ok(None);
    };
    match kind {
        b'+' | b'-' => {
            let Some(end) = find_crlf(buf, pos + 1) else {
                if buf.len() - pos > limits.max_line_len {
                    return Err(protocol("status line too long"));
                }
                return Ok(None);
            };
            let text = buf[pos + 1..end].to_vec();
            let value = if kind == b'+' {
                Value::Simple(text)
            } else {
                Value::Error(text)
            };
            Ok(Some((value, end + 2)))
        }
        b':' => {
            let Some((number, next)) = header_line(buf, pos)? else {
                return Ok(None);
            };
            Ok(Some((Value::Integer(number), next)))
        }
        b'$' => {
            let Some((len, start)) = header_line(buf, pos)? else {
                return Ok(None);
            };
            if len < 0 {
                return Ok(Some((Value::Bulk(None), start)));
            }
            let len = usize::try_from(len).map_err(|_| protocol("invalid bulk length"))?;
            if len > limits.max_bulk_len {
                return Err(protocol(format!("bulk reply of {len} bytes is too large")));
            }
            let end = start + len;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            if &buf[end..end + 2] != b"\r\n" {
                return Err(protocol("bulk string not followed by CRLF"));
            }
            Ok(Some((Value::Bulk(Some(buf[start..end].to_vec())), end + 2)))
        }
        b'*' => {
            if depth >= limits.max_depth {
                return Err(protocol("reply nested too deeply"));
            }
            let Some((count, mut next)) = header_line(buf, pos)? else {
                return Ok(None);
            };
            if count < 0 {
                return Ok(Some((Value::Array(None), next)));
            }
            let count = usize::try_from(count).map_err(|_| protocol("invalid array length"))?;
            if count > limits.max_bulk_len {
                return Err(protocol("array reply too long"));
            }
            let mut items = Vec::with_capacity(count.min(1024));
            for _ in 0..count {
                let Some((item, after)) = parse_value_at(buf, next, limits, depth + 1)? else {
                    return Ok(None);
                };
                items.push(item);
                next = after;
            }
            Ok(Some((Value::Array(Some(items)), next)))
        }
        other => Err(protocol(format!(
            "unexpected reply type byte '{}'",
            char::from(other).escape_default()
        ))),
    }
}

/// A blocking RESP client for short exchanges: start-up work, tests, scripts.
#[derive(Debug)]
pub struct SyncClient {
    stream: TcpStream,
    buffer: Vec<u8>,
    limits: Limits,
}

impl SyncClient {
    /// Connect with `timeout` for the connection and for every later read and write.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<SyncClient> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(SyncClient {
            stream,
            buffer: Vec::new(),
            limits: Limits {
                max_bulk_len: 512 << 20,
                ..Limits::default()
            },
        })
    }

    /// Send one command and read its reply.
    pub fn command<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<Value> {
        self.stream.write_all(&command_bytes(args))?;
        self.read_value()
    }

    /// Send several commands at once and read their replies, in order.
    pub fn pipeline<A: AsRef<[u8]>>(&mut self, commands: &[Vec<A>]) -> io::Result<Vec<Value>> {
        let mut out = Vec::new();
        for args in commands {
            encode_command(args, &mut out);
        }
        self.stream.write_all(&out)?;
        (0..commands.len()).map(|_| self.read_value()).collect()
    }

    /// Send raw bytes (for tests of malformed input).
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Read one reply.
    pub fn read_value(&mut self) -> io::Result<Value> {
        loop {
            match parse_value(&self.buffer, &self.limits) {
                Ok(Some((value, used))) => {
                    self.buffer.drain(..used);
                    return Ok(value);
                }
                Ok(None) => {}
                Err(error) => return Err(io::Error::new(io::ErrorKind::InvalidData, error)),
            }
            let mut chunk = [0u8; 16 << 10];
            let count = self.stream.read(&mut chunk)?;
            if count == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed by the server",
                ));
            }
            self.buffer.extend_from_slice(&chunk[..count]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits() -> Limits {
        Limits::default()
    }

    #[test]
    fn commands_parse_whole_or_ask_for_more() {
        let bytes = command_bytes(&["SET", "k", "v"]);
        for cut in 0..bytes.len() {
            assert_eq!(
                parse_command(&bytes[..cut], &limits()).unwrap(),
                None,
                "{cut}"
            );
        }
        let (args, used) = parse_command(&bytes, &limits()).unwrap().unwrap();
        assert_eq!(args, vec![b"SET".to_vec(), b"k".to_vec(), b"v".to_vec()]);
        assert_eq!(used, bytes.len());
    }

    #[test]
    fn a_large_command_in_many_pieces_is_scanned_once_and_parsed_whole() {
        let limits = Limits::gateway(GATEWAY_MAX_ARGS, 64 << 20);
        let mut args: Vec<Vec<u8>> = vec![b"RPUSH".to_vec(), b"l".to_vec()];
        args.extend((0..20_000u32).map(|i| i.to_string().into_bytes()));
        args.push(vec![b'v'; 3 << 20]);
        let bytes = command_bytes(&args);
        let mut progress = Progress::default();
        let mut end = 0;
        while end < bytes.len() {
            end = (end + 65_536).min(bytes.len());
            let parsed = parse_command_resumable(&bytes[..end], &limits, &mut progress).unwrap();
            if end < bytes.len() {
                assert_eq!(parsed, None, "{end}");
                // Resumed where it stopped: the next piece is scanned from there.
                assert!(progress.pos == 0 || progress.pos + (3 << 20) + 64 >= end);
            } else {
                assert_eq!(parsed, Some((args.clone(), bytes.len())));
                assert_eq!(progress, Progress::default());
            }
        }
        // Redis's own errors past the limits.
        let small = Limits::gateway(4, 1 << 20);
        let mut fresh = Progress::default();
        assert_eq!(
            parse_command_resumable(b"*5\r\n", &small, &mut fresh),
            Err(RespError("invalid multibulk length".to_owned()))
        );
        assert_eq!(
            parse_command_resumable(b"*1\r\n$2000000\r\n", &small, &mut fresh),
            Err(RespError("invalid bulk length".to_owned()))
        );
    }

    #[test]
    fn inline_commands_split_on_whitespace() {
        let (args, used) = parse_command(b"PING  hello\r\nrest", &limits())
            .unwrap()
            .unwrap();
        assert_eq!(args, vec![b"PING".to_vec(), b"hello".to_vec()]);
        assert_eq!(used, 13);
        assert_eq!(parse_command(b"PING", &limits()).unwrap(), None);
        let (args, _) = parse_command(b"\r\n", &limits()).unwrap().unwrap();
        assert!(args.is_empty());
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        for bad in [
            &b"*x\r\n"[..],
            b"*1\r\n+OK\r\n",
            b"*1\r\n$-5\r\n",
            b"*1\r\n$1\r\nab\r\n",
            b"*99999999\r\n",
            b"*1\r\n$99999999999\r\n",
            b"*1\r\n$1\r\n\xff\xff\xff",
            b"*11111111111111111111111111111111111111",
        ] {
            assert!(parse_command(bad, &limits()).is_err(), "{bad:?}");
        }
        assert!(parse_value(b"?x\r\n", &limits()).is_err());
        let deep = "*1\r\n".repeat(100);
        assert!(parse_value(deep.as_bytes(), &limits()).is_err());
    }

    #[test]
    fn replies_round_trip() {
        let value = Value::Array(Some(vec![
            Value::Simple(b"OK".to_vec()),
            Value::Error(b"ERR no".to_vec()),
            Value::Integer(-42),
            Value::Bulk(None),
            Value::Bulk(Some(b"a\r\nb".to_vec())),
            Value::Array(None),
            Value::Array(Some(vec![])),
        ]));
        let bytes = value.to_bytes();
        for cut in 0..bytes.len() {
            assert_eq!(parse_value(&bytes[..cut], &limits()).unwrap(), None);
        }
        assert_eq!(
            parse_value(&bytes, &limits()).unwrap(),
            Some((value, bytes.len()))
        );
    }

    #[test]
    fn integers_are_strict() {
        assert_eq!(parse_int(b"0"), Some(0));
        assert_eq!(parse_int(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_int(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_int(b"9223372036854775808"), None);
        assert_eq!(parse_int(b""), None);
        assert_eq!(parse_int(b"-"), None);
        assert_eq!(parse_int(b"+1"), None);
        assert_eq!(parse_int(b"1 "), None);
    }

    #[test]
    fn error_replies_stay_on_one_line() {
        assert_eq!(error_reply("ERR a\r\nb"), b"-ERR a  b\r\n");
    }

    proptest! {
        #[test]
        fn any_bytes_parse_without_panicking(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse_command(&bytes, &limits());
            let _ = parse_value(&bytes, &limits());
        }

        #[test]
        fn encoded_commands_parse_back(args in proptest::collection::vec(
            proptest::collection::vec(any::<u8>(), 0..40), 1..8)) {
            let bytes = command_bytes(&args);
            let (parsed, used) = parse_command(&bytes, &limits()).unwrap().unwrap();
            prop_assert_eq!(parsed, args);
            prop_assert_eq!(used, bytes.len());
        }
    }
}
