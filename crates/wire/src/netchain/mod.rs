//! NetChain's wire format (docs/netchain.md): the chain-replicated key-value store's requests,
//! replies and the messages between the members of a chain, type codes `0x20–0x23`; the
//! controller's messages, `0x24–0x29`, are in [`control`] (the range `0x20–0x2F` is shared
//! with replication, which uses only flag bits).
//!
//! Each message is one datagram (no fragments) with the PMNet header; `session_id` and `seq`
//! are the client's session and request number, carried unchanged along the chain so that the
//! tail's reply names the request. Integers are big-endian.
//!
//! | message | field | size |
//! |---|---|---|
//! | request (`0x20`, client → member) | op: 1 get, 2 put, 3 delete, 4 compare-and-set | 1 |
//! | | virtual group of the key | 2 |
//! | | compare-and-set: the version the key must hold (0: absent); 0 otherwise | 8 |
//! | | key length *k*, key | 1 + *k* (1 to 255) |
//! | | value length *v*, value (put and compare-and-set; 0 otherwise) | 2 + *v* |
//! | reply (`0x21`, member → client) | status: 0 ok, 1 not found, 2 compare failed, 3 full, 4 not this member's, 5 bad request, 6 in doubt, 7 paused | 1 |
//! | | the key's version after the operation (0: none) | 8 |
//! | | value length *v*, value (get only) | 2 + *v* |
//! | write (`0x22`, member → next member) | op: 2 put, 3 delete | 1 |
//! | | virtual group | 2 |
//! | | version (the head's sequence number for the key) | 8 |
//! | | the client: family (4 or 6), port, address (IPv4 in the first 4 of 16) | 1 + 2 + 16 |
//! | | key length *k*, key | 1 + *k* |
//! | | value length *v*, value | 2 + *v* |
//! | commit (`0x23`, member → previous member) | virtual group | 2 |
//! | | version the tail made durable | 8 |
//! | | key length *k*, key | 1 + *k* |
//! | decision (`0x2A`, member → next member) | virtual group | 2 |
//! | | the version a compare-and-set failed on (0: the key is absent) | 8 |
//! | | the client, as in a write | 1 + 2 + 16 |
//! | | key length *k*, key | 1 + *k* |
//! | | value length *v*, the key's value then (0: none) | 2 + *v* |
//!
//! A decision carries a compare-and-set the head decided failed down the chain: every member
//! remembers it for the session, and the tail answers the client, so whichever member heads
//! the group next answers a retransmission of it the same way.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub mod control;

/// Header flag of a client's request sent again (bit 12): the head that does not know the
/// request (it restarted since the first transmission) answers [`Status::InDoubt`] instead
/// of applying a write it may have applied already.
pub const RETRANSMITTED: u16 = 1 << 12;

/// Header flag of a read a member relays to the tail on a client's behalf (it carries the
/// client's session and request number), and of the tail's answer to it (bit 13). A client
/// never takes an answer with this flag as its reply: relayed for a compare-and-set, the
/// tail's answer is the key's committed version, not the outcome of the write.
pub const RELAYED: u16 = 1 << 13;

/// Type code of a client's request to a chain member.
pub const CHAIN_REQUEST: u8 = 0x20;
/// Type code of a member's reply to a client.
pub const CHAIN_REPLY: u8 = 0x21;
/// Type code of a write passed down the chain.
pub const CHAIN_WRITE: u8 = 0x22;
/// Type code of a commit passed up the chain.
pub const CHAIN_COMMIT: u8 = 0x23;
/// Type code of a failed compare-and-set's decision passed down the chain.
pub const CHAIN_DECISION: u8 = 0x2A;

/// A request's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Get,
    Put,
    Delete,
    /// Put if the key holds `expected` (a version; 0: the key is absent).
    CompareAndSet {
        expected: u64,
    },
}

impl Op {
    fn code(self) -> u8 {
        match self {
            Op::Get => 1,
            Op::Put => 2,
            Op::Delete => 3,
            Op::CompareAndSet { .. } => 4,
        }
    }
}

/// A reply's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    NotFound = 1,
    CompareFailed = 2,
    Full = 3,
    /// The member is not where this operation goes for the key's group (a write not at the
    /// head, say, or a group it does not serve): the client asks the controller's
    /// configuration again.
    NotHere = 4,
    BadRequest = 5,
    /// A write sent again that the head cannot tell apart from one it applied before a
    /// restart: it may or may not have been applied (the client reports it failed, outcome
    /// unknown).
    InDoubt = 6,
    /// The key's group takes no writes for a moment (the controller is adding a member to
    /// it): the client sends the write again shortly.
    Paused = 7,
}

impl Status {
    fn from_code(code: u8) -> Option<Status> {
        [
            Status::Ok,
            Status::NotFound,
            Status::CompareFailed,
            Status::Full,
            Status::NotHere,
            Status::BadRequest,
            Status::InDoubt,
            Status::Paused,
        ]
        .into_iter()
        .find(|status| *status as u8 == code)
    }
}

/// Why a chain payload did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainParseError {
    /// Shorter than its fields say.
    Truncated,
    /// Bytes after the last field.
    TrailingBytes,
    /// An operation, status or address family code that is not defined.
    BadCode,
    /// A key of length 0.
    EmptyKey,
    /// A value where the operation has none.
    UnexpectedValue,
    /// A configuration or status out of its bounds or inconsistent (a member index out of
    /// range, a member twice in a chain, no members).
    Invalid,
}

impl std::fmt::Display for ChainParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ChainParseError::Truncated => "truncated",
            ChainParseError::TrailingBytes => "trailing bytes",
            ChainParseError::BadCode => "undefined code",
            ChainParseError::EmptyKey => "empty key",
            ChainParseError::UnexpectedValue => "a value where the operation has none",
            ChainParseError::Invalid => "out of bounds or inconsistent",
        })
    }
}

impl std::error::Error for ChainParseError {}

/// A client's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    pub op: Op,
    pub group: u16,
    pub key: &'a [u8],
    /// Put and compare-and-set: the new value; empty otherwise.
    pub value: &'a [u8],
}

/// A member's reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply<'a> {
    pub status: Status,
    pub version: u64,
    pub value: &'a [u8],
}

/// A compare-and-set the head decided failed, passed down the chain (the tail answers it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision<'a> {
    pub group: u16,
    /// The key's version the compare failed on (0: absent).
    pub version: u64,
    pub client: SocketAddr,
    pub key: &'a [u8],
    /// The key's value at that version (empty when absent).
    pub value: &'a [u8],
}

/// A write passed down the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write<'a> {
    /// `None`: a deletion.
    pub value: Option<&'a [u8]>,
    pub group: u16,
    pub version: u64,
    pub client: SocketAddr,
    pub key: &'a [u8],
}

/// A commit passed up the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit<'a> {
    pub group: u16,
    pub version: u64,
    pub key: &'a [u8],
}

/// Reads fields from the front of a payload.
pub(crate) struct Reader<'a> {
    pub(crate) bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, len: usize) -> Result<&'a [u8], ChainParseError> {
        if self.bytes.len() < len {
            return Err(ChainParseError::Truncated);
        }
        let (front, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(front)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, ChainParseError> {
        Ok(self.take(1)?[0])
    }

    pub(crate) fn u16(&mut self) -> Result<u16, ChainParseError> {
        let bytes = self.take(2)?;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, ChainParseError> {
        let bytes = self.take(8)?;
        Ok(u64::from_be_bytes(bytes.try_into().expect("8 bytes")))
    }

    pub(crate) fn key(&mut self) -> Result<&'a [u8], ChainParseError> {
        let len = usize::from(self.u8()?);
        if len == 0 {
            return Err(ChainParseError::EmptyKey);
        }
        self.take(len)
    }

    pub(crate) fn value(&mut self) -> Result<&'a [u8], ChainParseError> {
        let len = usize::from(self.u16()?);
        self.take(len)
    }

    pub(crate) fn address(&mut self) -> Result<SocketAddr, ChainParseError> {
        let family = self.u8()?;
        let port = self.u16()?;
        let bytes: [u8; 16] = self.take(16)?.try_into().expect("16 bytes");
        let ip = match family {
            4 => IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])),
            6 => IpAddr::V6(Ipv6Addr::from(bytes)),
            _ => return Err(ChainParseError::BadCode),
        };
        Ok(SocketAddr::new(ip, port))
    }

    pub(crate) fn end(&self) -> Result<(), ChainParseError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(ChainParseError::TrailingBytes)
        }
    }
}

pub(crate) fn push_key(out: &mut Vec<u8>, key: &[u8]) {
    assert!(
        !key.is_empty() && key.len() <= 255,
        "a key is 1 to 255 bytes"
    );
    out.push(key.len() as u8);
    out.extend_from_slice(key);
}

pub(crate) fn push_value(out: &mut Vec<u8>, value: &[u8]) {
    let len = u16::try_from(value.len()).expect("a value is at most 65 535 bytes");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(value);
}

pub(crate) fn push_address(out: &mut Vec<u8>, address: SocketAddr) {
    let mut bytes = [0u8; 16];
    let family = match address.ip() {
        IpAddr::V4(ip) => {
            bytes[..4].copy_from_slice(&ip.octets());
            4
        }
        IpAddr::V6(ip) => {
            bytes = ip.octets();
            6
        }
    };
    out.push(family);
    out.extend_from_slice(&address.port().to_be_bytes());
    out.extend_from_slice(&bytes);
}

impl<'a> Request<'a> {
    /// The request a payload holds. Never panics.
    pub fn parse(payload: &'a [u8]) -> Result<Request<'a>, ChainParseError> {
        let mut reader = Reader { bytes: payload };
        let code = reader.u8()?;
        let group = reader.u16()?;
        let expected = reader.u64()?;
        let key = reader.key()?;
        let value = reader.value()?;
        reader.end()?;
        let op = match code {
            1 => Op::Get,
            2 => Op::Put,
            3 => Op::Delete,
            4 => Op::CompareAndSet { expected },
            _ => return Err(ChainParseError::BadCode),
        };
        if matches!(op, Op::Get | Op::Delete) && !value.is_empty() {
            return Err(ChainParseError::UnexpectedValue);
        }
        Ok(Request {
            op,
            group,
            key,
            value,
        })
    }

    /// The payload. Panics on a key of 0 or more than 255 bytes, or a value over 65 535.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.push(self.op.code());
        out.extend_from_slice(&self.group.to_be_bytes());
        let expected = match self.op {
            Op::CompareAndSet { expected } => expected,
            _ => 0,
        };
        out.extend_from_slice(&expected.to_be_bytes());
        push_key(out, self.key);
        push_value(out, self.value);
    }
}

impl<'a> Reply<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<Reply<'a>, ChainParseError> {
        let mut reader = Reader { bytes: payload };
        let status = Status::from_code(reader.u8()?).ok_or(ChainParseError::BadCode)?;
        let version = reader.u64()?;
        let value = reader.value()?;
        reader.end()?;
        Ok(Reply {
            status,
            version,
            value,
        })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.push(self.status as u8);
        out.extend_from_slice(&self.version.to_be_bytes());
        push_value(out, self.value);
    }
}

impl<'a> Write<'a> {
    /// A write is its op code, then a decision's fields (group, version, client, key, value).
    pub fn parse(payload: &'a [u8]) -> Result<Write<'a>, ChainParseError> {
        let (&code, body) = payload.split_first().ok_or(ChainParseError::Truncated)?;
        let body = Decision::parse(body)?;
        let value = match code {
            2 => Some(body.value),
            3 if body.value.is_empty() => None,
            3 => return Err(ChainParseError::UnexpectedValue),
            _ => return Err(ChainParseError::BadCode),
        };
        Ok(Write {
            value,
            group: body.group,
            version: body.version,
            client: body.client,
            key: body.key,
        })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.push(if self.value.is_some() { 2 } else { 3 });
        Decision {
            group: self.group,
            version: self.version,
            client: self.client,
            key: self.key,
            value: self.value.unwrap_or_default(),
        }
        .emit(out);
    }
}

impl<'a> Decision<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<Decision<'a>, ChainParseError> {
        let mut reader = Reader { bytes: payload };
        let group = reader.u16()?;
        let version = reader.u64()?;
        let client = reader.address()?;
        let key = reader.key()?;
        let value = reader.value()?;
        reader.end()?;
        Ok(Decision {
            group,
            version,
            client,
            key,
            value,
        })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.group.to_be_bytes());
        out.extend_from_slice(&self.version.to_be_bytes());
        push_address(out, self.client);
        push_key(out, self.key);
        push_value(out, self.value);
    }
}

impl<'a> Commit<'a> {
    pub fn parse(payload: &'a [u8]) -> Result<Commit<'a>, ChainParseError> {
        let mut reader = Reader { bytes: payload };
        let group = reader.u16()?;
        let version = reader.u64()?;
        let key = reader.key()?;
        reader.end()?;
        Ok(Commit {
            group,
            version,
            key,
        })
    }

    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.group.to_be_bytes());
        out.extend_from_slice(&self.version.to_be_bytes());
        push_key(out, self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// The vectors in docs/protocol.md ("NetChain"), byte for byte.
    #[test]
    fn the_documented_vectors() {
        let mut out = Vec::new();
        Request {
            op: Op::CompareAndSet { expected: 7 },
            group: 3,
            key: b"lock",
            value: b"me",
        }
        .emit(&mut out);
        assert_eq!(hex(&out), "0400030000000000000007046c6f636b00026d65");
        assert_eq!(
            Request::parse(&out).unwrap().op,
            Op::CompareAndSet { expected: 7 }
        );

        out.clear();
        Reply {
            status: Status::Ok,
            version: 8,
            value: b"",
        }
        .emit(&mut out);
        assert_eq!(hex(&out), "0000000000000000080000");

        out.clear();
        let write = Write {
            value: Some(b"me"),
            group: 3,
            version: 8,
            client: "10.0.0.9:7000".parse().unwrap(),
            key: b"lock",
        };
        write.emit(&mut out);
        assert_eq!(
            hex(&out),
            "0200030000000000000008041b580a000009000000000000000000000000\
             046c6f636b00026d65"
        );
        assert_eq!(Write::parse(&out).unwrap(), write);

        out.clear();
        Commit {
            group: 3,
            version: 8,
            key: b"lock",
        }
        .emit(&mut out);
        assert_eq!(hex(&out), "00030000000000000008046c6f636b");

        out.clear();
        let decision = Decision {
            group: 3,
            version: 8,
            client: "10.0.0.9:7000".parse().unwrap(),
            key: b"lock",
            value: b"you",
        };
        decision.emit(&mut out);
        assert_eq!(
            hex(&out),
            "00030000000000000008041b580a000009000000000000000000000000\
             046c6f636b0003796f75"
        );
        assert_eq!(Decision::parse(&out).unwrap(), decision);
        assert!(Decision::parse(&out[..out.len() - 1]).is_err());
    }

    #[test]
    fn every_message_round_trips_and_ipv6_clients_too() {
        let mut out = Vec::new();
        for op in [
            Op::Get,
            Op::Put,
            Op::Delete,
            Op::CompareAndSet { expected: 0 },
        ] {
            out.clear();
            let value: &[u8] = if matches!(op, Op::Get | Op::Delete) {
                b""
            } else {
                b"v"
            };
            let request = Request {
                op,
                group: 65535,
                key: &[9; 255],
                value,
            };
            request.emit(&mut out);
            assert_eq!(Request::parse(&out).unwrap(), request);
        }
        out.clear();
        let write = Write {
            value: None,
            group: 1,
            version: u64::MAX,
            client: "[2001:db8::1]:9".parse().unwrap(),
            key: b"k",
        };
        write.emit(&mut out);
        assert_eq!(Write::parse(&out).unwrap(), write);
    }

    #[test]
    fn any_bytes_parse_or_fail_without_panicking() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let len = (state % 48) as usize;
            let bytes: Vec<u8> = (0..len).map(|i| (state >> (i % 57)) as u8).collect();
            let _ = Request::parse(&bytes);
            let _ = Reply::parse(&bytes);
            let _ = Write::parse(&bytes);
            let _ = Commit::parse(&bytes);
        }
        assert_eq!(Request::parse(&[]), Err(ChainParseError::Truncated));
        assert_eq!(
            Request::parse(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(ChainParseError::EmptyKey)
        );
        assert_eq!(
            Request::parse(&[9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 7, 0, 0]),
            Err(ChainParseError::BadCode)
        );
        assert_eq!(
            Request::parse(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 7, 0, 1, 5]),
            Err(ChainParseError::UnexpectedValue)
        );
        assert_eq!(
            Request::parse(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 7, 0, 0, 0]),
            Err(ChainParseError::TrailingBytes)
        );
    }
}
