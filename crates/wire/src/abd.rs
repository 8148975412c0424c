//! Replicated persistent memory's wire format (docs/abd.md): ABD quorum registers of 64-byte
//! lines, type codes `0x30–0x37` (the range `0x30–0x3F` is ABD's; `0x3F` is taken by the
//! pipeline's test function).
//!
//! Each message is one datagram with the PMNet header. A client's request and its reply carry
//! the client's session and request number; a coordinator's messages to the memory nodes carry
//! the coordinator's session and its operation's number, and a node's answer echoes them.
//! Integers are big-endian. A timestamp is `counter << 16 | writer` (u64): ordered by counter,
//! then by the writer's id.
//!
//! | message | field | size |
//! |---|---|---|
//! | request (`0x30`, client → coordinator) | op: 1 read, 2 write | 1 |
//! | | first line | 4 |
//! | | lines *n* (1 to 16) | 2 |
//! | | write: the lines' bytes | 64 *n* |
//! | reply (`0x31`, coordinator → client) | status: 0 ok, 1 bad request, 2 out of range, 3 unavailable, 4 in doubt, 5 busy | 1 |
//! | | first line, lines *n* | 4 + 2 |
//! | | read and ok: the lines' bytes | 64 *n* |
//! | query (`0x32`, coordinator → node) | what: 1 timestamps, 2 timestamps and values | 1 |
//! | | first line, lines *n* | 4 + 2 |
//! | query reply (`0x33`, node → coordinator) | status: 0 ok, 1 learning, 2 out of range | 1 |
//! | | what (as asked), first line, lines *n* | 1 + 4 + 2 |
//! | | ok: per line its timestamp, and its value if asked | *n* × (8 \[+ 64\]) |
//! | store (`0x34`, coordinator → node) | first line, lines *n* | 4 + 2 |
//! | | per line: timestamp (0, to a node without peers: the node stamps it), value | *n* × (8 + 64) |
//! | store ack (`0x35`, node → coordinator) | status (as the query reply's), first line, lines *n* | 1 + 4 + 2 |
//! | sync (`0x36`, learning node → node) | first line, lines to look at (1 to 65 535) | 4 + 2 |
//! | sync reply (`0x37`, node → learning node) | status (as the query reply's; 1: the sender is learning too) | 1 |
//! | | flags: bit 0, the sender holds at least one line | 1 |
//! | | first line, lines looked at *m* | 4 + 2 |
//! | | entries *e* (0 to 16), each: line, timestamp, value (lines never written are left out) | 2 + *e* × (4 + 8 + 64) |

use crate::netchain::ChainParseError as ParseError;

/// Bytes of a line.
pub const LINE: usize = 64;
/// Lines one request, query or store carries at most (a 4 KiB page is four requests).
pub const LINES_MAX: u16 = 16;
/// Entries one sync reply carries at most.
pub const SYNC_ENTRIES_MAX: u16 = 16;

/// Header flag of a client's request sent again: a coordinator that does not know the request
/// (it restarted since) answers a write [`Status::InDoubt`] instead of applying it again.
pub const RETRANSMITTED: u16 = crate::netchain::RETRANSMITTED;

/// Type code of a client's request to its coordinator.
pub const ABD_REQUEST: u8 = 0x30;
/// Type code of the coordinator's reply.
pub const ABD_REPLY: u8 = 0x31;
/// Type code of a coordinator's query to a memory node (the first phase).
pub const ABD_QUERY: u8 = 0x32;
/// Type code of a memory node's answer to a query.
pub const ABD_QUERY_REPLY: u8 = 0x33;
/// Type code of a coordinator's store to a memory node (the second phase).
pub const ABD_STORE: u8 = 0x34;
/// Type code of a memory node's acknowledgement of a store (the lines are durable there).
pub const ABD_STORE_ACK: u8 = 0x35;
/// Type code of a learning memory node's request for lines.
pub const ABD_SYNC: u8 = 0x36;
/// Type code of the answer to a sync request.
pub const ABD_SYNC_REPLY: u8 = 0x37;

/// The timestamp of `counter` and `writer`.
pub fn timestamp(counter: u64, writer: u16) -> u64 {
    counter << 16 | u64::from(writer)
}

/// The counter of a timestamp.
pub fn counter_of(ts: u64) -> u64 {
    ts >> 16
}

/// The writer of a timestamp.
pub fn writer_of(ts: u64) -> u16 {
    ts as u16
}

/// A client's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
}

/// A coordinator's reply status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    BadRequest = 1,
    /// Lines beyond the memory's end.
    OutOfRange = 2,
    /// No majority answered before the operation's deadline: it may or may not have taken
    /// effect.
    Unavailable = 3,
    /// A write sent again that the coordinator does not know (it restarted, or forgot the
    /// session): it may or may not have taken effect.
    InDoubt = 4,
    /// The coordinator has as many operations in flight as it keeps: send again later.
    Busy = 5,
}

impl Status {
    fn from_code(code: u8) -> Option<Status> {
        [
            Status::Ok,
            Status::BadRequest,
            Status::OutOfRange,
            Status::Unavailable,
            Status::InDoubt,
            Status::Busy,
        ]
        .into_iter()
        .find(|status| *status as u8 == code)
    }
}

/// A memory node's answer status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeStatus {
    Ok = 0,
    /// The node lost its memory and is being brought up to date: its answer does not count.
    Learning = 1,
    OutOfRange = 2,
}

impl NodeStatus {
    fn from_code(code: u8) -> Option<NodeStatus> {
        [NodeStatus::Ok, NodeStatus::Learning, NodeStatus::OutOfRange]
            .into_iter()
            .find(|status| *status as u8 == code)
    }
}

/// A client's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    pub op: Op,
    pub first: u32,
    pub count: u16,
    /// A write's lines (`64 * count` bytes); empty for a read.
    pub data: &'a [u8],
}

/// The coordinator's reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply<'a> {
    pub status: Status,
    pub first: u32,
    pub count: u16,
    /// A successful read's lines; empty otherwise.
    pub data: &'a [u8],
}

/// A query: timestamps only (a write's first phase) or with values (a read's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query {
    pub values: bool,
    pub first: u32,
    pub count: u16,
}

/// A node's answer to a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryReply<'a> {
    pub status: NodeStatus,
    pub values: bool,
    pub first: u32,
    pub count: u16,
    /// Ok: per line the timestamp (8 bytes), then the value (64) when asked.
    pub lines: &'a [u8],
}

impl QueryReply<'_> {
    /// Bytes of one line's entry.
    pub fn entry_len(values: bool) -> usize {
        if values {
            8 + LINE
        } else {
            8
        }
    }

    /// Line `i`'s timestamp and value (an empty value when not asked). Panics past `count`.
    pub fn line(&self, i: usize) -> (u64, &[u8]) {
        let len = QueryReply::entry_len(self.values);
        let entry = &self.lines[i * len..(i + 1) * len];
        let ts = u64::from_be_bytes(entry[..8].try_into().expect("8 bytes"));
        (ts, &entry[8..])
    }
}

/// A store: per line a timestamp and a value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Store<'a> {
    pub first: u32,
    pub count: u16,
    /// Per line: timestamp (8 bytes), value (64).
    pub lines: &'a [u8],
}

impl Store<'_> {
    /// Line `i`'s timestamp and value. Panics past `count`.
    pub fn line(&self, i: usize) -> (u64, &[u8]) {
        let entry = &self.lines[i * (8 + LINE)..(i + 1) * (8 + LINE)];
        let ts = u64::from_be_bytes(entry[..8].try_into().expect("8 bytes"));
        (ts, &entry[8..])
    }

    /// A store's line bytes from (timestamp, value) pairs.
    pub fn encode_lines<'v>(lines: impl IntoIterator<Item = (u64, &'v [u8])>) -> Vec<u8> {
        let mut out = Vec::new();
        for (ts, value) in lines {
            assert_eq!(value.len(), LINE, "a line is 64 bytes");
            out.extend_from_slice(&ts.to_be_bytes());
            out.extend_from_slice(value);
        }
        out
    }
}

/// A node's acknowledgement of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreAck {
    pub status: NodeStatus,
    pub first: u32,
    pub count: u16,
}

/// A learning node's request for the lines of a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sync {
    pub first: u32,
    pub count: u16,
}

/// The answer to a sync request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncReply<'a> {
    pub status: NodeStatus,
    /// The sender holds at least one line.
    pub holds_lines: bool,
    pub first: u32,
    /// Lines looked at from `first` (the next request starts after them).
    pub count: u16,
    /// Entries: line (4), timestamp (8), value (64).
    pub entries: &'a [u8],
}

/// Bytes of a sync reply's entry.
pub const SYNC_ENTRY_LEN: usize = 4 + 8 + LINE;

impl SyncReply<'_> {
    pub fn entry_count(&self) -> usize {
        self.entries.len() / SYNC_ENTRY_LEN
    }

    /// Entry `i`: line, timestamp, value. Panics past the entries.
    pub fn entry(&self, i: usize) -> (u32, u64, &[u8]) {
        let entry = &self.entries[i * SYNC_ENTRY_LEN..(i + 1) * SYNC_ENTRY_LEN];
        let line = u32::from_be_bytes(entry[..4].try_into().expect("4 bytes"));
        let ts = u64::from_be_bytes(entry[4..12].try_into().expect("8 bytes"));
        (line, ts, &entry[12..])
    }

    /// A sync reply's entry bytes from (line, timestamp, value).
    pub fn encode_entries<'v>(entries: impl IntoIterator<Item = (u32, u64, &'v [u8])>) -> Vec<u8> {
        let mut out = Vec::new();
        for (line, ts, value) in entries {
            assert_eq!(value.len(), LINE, "a line is 64 bytes");
            out.extend_from_slice(&line.to_be_bytes());
            out.extend_from_slice(&ts.to_be_bytes());
            out.extend_from_slice(value);
        }
        out
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], ParseError> {
        if self.bytes.len() < len {
            return Err(ParseError::Truncated);
        }
        let (front, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(front)
    }

    fn u8(&mut self) -> Result<u8, ParseError> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, ParseError> {
        let bytes = self.take(2)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    fn u32(&mut self) -> Result<u32, ParseError> {
        let bytes = self.take(4)?;
        Ok(u32::from_be_bytes(bytes.try_into().expect("4 bytes")))
    }

    /// A line count of 1 to `max`.
    fn count(&mut self, max: u16) -> Result<u16, ParseError> {
        let count = self.u16()?;
        if count == 0 || count > max {
            return Err(ParseError::Invalid);
        }
        Ok(count)
    }

    fn finish(self) -> Result<(), ParseError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(ParseError::TrailingBytes)
        }
    }
}

fn node_status(code: u8) -> Result<NodeStatus, ParseError> {
    NodeStatus::from_code(code).ok_or(ParseError::BadCode)
}

impl<'a> Request<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<Request<'a>, ParseError> {
        let mut reader = Reader { bytes: payload };
        let op = match reader.u8()? {
            1 => Op::Read,
            2 => Op::Write,
            _ => return Err(ParseError::BadCode),
        };
        let first = reader.u32()?;
        let count = reader.count(LINES_MAX)?;
        let data = match op {
            Op::Read => &[][..],
            Op::Write => reader.take(usize::from(count) * LINE)?,
        };
        reader.finish()?;
        Ok(Request {
            op,
            first,
            count,
            data,
        })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.push(match self.op {
            Op::Read => 1,
            Op::Write => 2,
        });
        out.extend_from_slice(&self.first.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        out.extend_from_slice(self.data);
    }
}

impl<'a> Reply<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<Reply<'a>, ParseError> {
        let mut reader = Reader { bytes: payload };
        let status = Status::from_code(reader.u8()?).ok_or(ParseError::BadCode)?;
        let first = reader.u32()?;
        let count = reader.count(LINES_MAX)?;
        // Only a successful read carries lines; the caller knows which it asked for.
        let data = reader.bytes;
        if !(data.is_empty() || status == Status::Ok && data.len() == usize::from(count) * LINE) {
            return Err(ParseError::Invalid);
        }
        Ok(Reply {
            status,
            first,
            count,
            data,
        })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.push(self.status as u8);
        out.extend_from_slice(&self.first.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        out.extend_from_slice(self.data);
    }
}

impl Query {
    pub fn parse(payload: &[u8]) -> Result<Query, ParseError> {
        let mut reader = Reader { bytes: payload };
        let values = match reader.u8()? {
            1 => false,
            2 => true,
            _ => return Err(ParseError::BadCode),
        };
        let first = reader.u32()?;
        let count = reader.count(LINES_MAX)?;
        reader.finish()?;
        Ok(Query {
            values,
            first,
            count,
        })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.push(if self.values { 2 } else { 1 });
        out.extend_from_slice(&self.first.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
    }
}

impl<'a> QueryReply<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<QueryReply<'a>, ParseError> {
        let mut reader = Reader { bytes: payload };
        let status = node_status(reader.u8()?)?;
        let values = match reader.u8()? {
            1 => false,
            2 => true,
            _ => return Err(ParseError::BadCode),
        };
        let first = reader.u32()?;
        let count = reader.count(LINES_MAX)?;
        let lines = if status == NodeStatus::Ok {
            reader.take(usize::from(count) * QueryReply::entry_len(values))?
        } else {
            &[][..]
        };
        reader.finish()?;
        Ok(QueryReply {
            status,
            values,
            first,
            count,
            lines,
        })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.push(self.status as u8);
        out.push(if self.values { 2 } else { 1 });
        out.extend_from_slice(&self.first.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        out.extend_from_slice(self.lines);
    }
}

impl<'a> Store<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<Store<'a>, ParseError> {
        let mut reader = Reader { bytes: payload };
        let first = reader.u32()?;
        let count = reader.count(LINES_MAX)?;
        let lines = reader.take(usize::from(count) * (8 + LINE))?;
        reader.finish()?;
        Ok(Store {
            first,
            count,
            lines,
        })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.first.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        out.extend_from_slice(self.lines);
    }
}

impl StoreAck {
    pub fn parse(payload: &[u8]) -> Result<StoreAck, ParseError> {
        let mut reader = Reader { bytes: payload };
        let status = node_status(reader.u8()?)?;
        let first = reader.u32()?;
        let count = reader.count(LINES_MAX)?;
        reader.finish()?;
        Ok(StoreAck {
            status,
            first,
            count,
        })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.push(self.status as u8);
        out.extend_from_slice(&self.first.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
    }
}

impl Sync {
    pub fn parse(payload: &[u8]) -> Result<Sync, ParseError> {
        let mut reader = Reader { bytes: payload };
        let first = reader.u32()?;
        let count = reader.count(u16::MAX)?;
        reader.finish()?;
        Ok(Sync { first, count })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.first.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
    }
}

impl<'a> SyncReply<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<SyncReply<'a>, ParseError> {
        let mut reader = Reader { bytes: payload };
        let status = node_status(reader.u8()?)?;
        let flags = reader.u8()?;
        if flags > 1 {
            return Err(ParseError::BadCode);
        }
        let first = reader.u32()?;
        let count = reader.count(u16::MAX)?;
        let entries = reader.u16()?;
        if entries > SYNC_ENTRIES_MAX {
            return Err(ParseError::Invalid);
        }
        let bytes = reader.take(usize::from(entries) * SYNC_ENTRY_LEN)?;
        reader.finish()?;
        let reply = SyncReply {
            status,
            holds_lines: flags == 1,
            first,
            count,
            entries: bytes,
        };
        // Every entry within the range looked at.
        let end = u64::from(first) + u64::from(count);
        if (0..reply.entry_count()).any(|i| {
            let line = u64::from(reply.entry(i).0);
            line < u64::from(first) || line >= end
        }) {
            return Err(ParseError::Invalid);
        }
        Ok(reply)
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.push(self.status as u8);
        out.push(u8::from(self.holds_lines));
        out.extend_from_slice(&self.first.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        let entries = u16::try_from(self.entry_count()).expect("at most 16 entries");
        out.extend_from_slice(&entries.to_be_bytes());
        out.extend_from_slice(self.entries);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(byte: u8) -> Vec<u8> {
        vec![byte; LINE]
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// The vectors in docs/protocol.md ("Replicated memory"), byte for byte.
    #[test]
    fn the_documented_vectors() {
        let value = {
            let mut value = b"hi".to_vec();
            value.resize(LINE, 0);
            value
        };
        let zeros62 = "00".repeat(62);
        // 19: a client's write of line 5 (one line), "hi" and zeros.
        let mut out = Vec::new();
        Request {
            op: Op::Write,
            first: 5,
            count: 1,
            data: &value,
        }
        .emit(&mut out);
        assert_eq!(hex(&out), format!("02000000050001{}{zeros62}", "6869"));
        // 20: the coordinator's first phase for it: timestamps of line 5.
        out.clear();
        Query {
            values: false,
            first: 5,
            count: 1,
        }
        .emit(&mut out);
        assert_eq!(hex(&out), "01000000050001");
        // 21: a node's answer: line 5 at counter 3, writer 2.
        out.clear();
        let ts = timestamp(3, 2).to_be_bytes();
        QueryReply {
            status: NodeStatus::Ok,
            values: false,
            first: 5,
            count: 1,
            lines: &ts,
        }
        .emit(&mut out);
        assert_eq!(hex(&out), "00010000000500010000000000030002");
        // 22: the second phase: line 5 at counter 4, writer 1 (the device's id).
        out.clear();
        let lines = Store::encode_lines([(timestamp(4, 1), &value[..])]);
        Store {
            first: 5,
            count: 1,
            lines: &lines,
        }
        .emit(&mut out);
        assert_eq!(
            hex(&out),
            format!("000000050001{}6869{zeros62}", "0000000000040001")
        );
        // 23: a node's ack, and the coordinator's reply to the client.
        out.clear();
        StoreAck {
            status: NodeStatus::Ok,
            first: 5,
            count: 1,
        }
        .emit(&mut out);
        assert_eq!(hex(&out), "00000000050001");
        out.clear();
        Reply {
            status: Status::Ok,
            first: 5,
            count: 1,
            data: &[],
        }
        .emit(&mut out);
        assert_eq!(hex(&out), "00000000050001");
    }

    #[test]
    fn every_message_survives_emit_and_parse() {
        let data = [line(1), line(2)].concat();
        let request = Request {
            op: Op::Write,
            first: 7,
            count: 2,
            data: &data,
        };
        let mut out = Vec::new();
        request.emit(&mut out);
        assert_eq!(Request::parse(&out), Ok(request));

        let reply = Reply {
            status: Status::Ok,
            first: 7,
            count: 2,
            data: &data,
        };
        out.clear();
        reply.emit(&mut out);
        assert_eq!(Reply::parse(&out), Ok(reply));

        let query = Query {
            values: true,
            first: 3,
            count: 16,
        };
        out.clear();
        query.emit(&mut out);
        assert_eq!(Query::parse(&out), Ok(query));

        let lines = Store::encode_lines([(timestamp(5, 2), &line(9)[..])]);
        let store = Store {
            first: 3,
            count: 1,
            lines: &lines,
        };
        out.clear();
        store.emit(&mut out);
        assert_eq!(Store::parse(&out), Ok(store.clone()));
        assert_eq!(store.line(0), (timestamp(5, 2), &line(9)[..]));

        let answer = QueryReply {
            status: NodeStatus::Ok,
            values: true,
            first: 3,
            count: 1,
            lines: &lines,
        };
        out.clear();
        answer.emit(&mut out);
        assert_eq!(QueryReply::parse(&out), Ok(answer));

        let entries = SyncReply::encode_entries([(40, timestamp(1, 1), &line(3)[..])]);
        let sync = SyncReply {
            status: NodeStatus::Ok,
            holds_lines: true,
            first: 32,
            count: 4096,
            entries: &entries,
        };
        out.clear();
        sync.emit(&mut out);
        assert_eq!(SyncReply::parse(&out), Ok(sync));
    }

    #[test]
    fn bad_payloads_are_refused_not_panicked_on() {
        // Zero lines, too many lines, a write without its data, trailing bytes, bad codes.
        assert!(Request::parse(&[1, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(Request::parse(&[1, 0, 0, 0, 0, 0, 17]).is_err());
        assert!(Request::parse(&[2, 0, 0, 0, 0, 0, 1]).is_err());
        assert!(Request::parse(&[1, 0, 0, 0, 0, 0, 1, 0]).is_err());
        assert!(Request::parse(&[9, 0, 0, 0, 0, 0, 1]).is_err());
        assert!(Reply::parse(&[0, 0, 0, 0, 0, 0, 1, 5]).is_err());
        assert!(QueryReply::parse(&[0, 1, 0, 0, 0, 0, 0, 1]).is_err());
        // A sync entry outside the range it says it looked at.
        let entries = SyncReply::encode_entries([(1, 1, &line(0)[..])]);
        let mut out = Vec::new();
        SyncReply {
            status: NodeStatus::Ok,
            holds_lines: true,
            first: 2,
            count: 4,
            entries: &entries,
        }
        .emit(&mut out);
        assert!(SyncReply::parse(&out).is_err());
        for len in 0..40 {
            let bytes = vec![0xFFu8; len];
            let _ = Request::parse(&bytes);
            let _ = Reply::parse(&bytes);
            let _ = Query::parse(&bytes);
            let _ = QueryReply::parse(&bytes);
            let _ = Store::parse(&bytes);
            let _ = StoreAck::parse(&bytes);
            let _ = Sync::parse(&bytes);
            let _ = SyncReply::parse(&bytes);
        }
    }

    #[test]
    fn timestamps_order_by_counter_then_writer() {
        assert!(timestamp(2, 1) > timestamp(1, 9));
        assert!(timestamp(2, 3) > timestamp(2, 1));
        assert_eq!(counter_of(timestamp(77, 5)), 77);
        assert_eq!(writer_of(timestamp(77, 5)), 5);
    }
}
