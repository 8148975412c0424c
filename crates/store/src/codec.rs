//! Request and reply encoding of the key-value application carried in PMNet payloads.
//!
//! PMNet itself moves opaque payloads; this module defines what the payload of a key-value
//! request and of its reply contain. All integers are fixed-width little-endian. A message is
//! exactly its fields: no padding, no length prefix of its own (the PMNet header carries the
//! payload length), and trailing bytes are an error.
//!
//! # Requests
//!
//! | op | name   | fields after the op byte                                  | PMNet kind |
//! |----|--------|-----------------------------------------------------------|------------|
//! | 1  | SET    | `key_len u16`, `key`, `value_len u32`, `value`            | update     |
//! | 2  | GET    | `key_len u16`, `key`                                      | bypass     |
//! | 3  | DEL    | `key_len u16`, `key`                                      | update     |
//! | 4  | INCR   | `key_len u16`, `key`, `delta i64`                         | bypass     |
//! | 5  | APPEND | `key_len u16`, `key`, `value_len u32`, `value`            | update     |
//!
//! Keys are 1..=[`MAX_KEY_LEN`] bytes, values 0..=[`MAX_VALUE_LEN`] bytes. SET, DEL and
//! APPEND are *update* requests ([`Request::is_update`]): their reply does not depend on server
//! state beyond "it was applied", so a PMNet device may log them and ack the client early. GET
//! and INCR must be sent as bypass requests: their reply carries server state.
//!
//! APPEND adds `value` at the end of the key's value (an absent key counts as empty) and
//! replies OK; if the result would exceed [`MAX_VALUE_LEN`] it changes nothing and replies
//! ERROR (a client acked early by a device never sees that reply: keep appended values well
//! below the limit). Every applied APPEND leaves its mark in order, so a history of appends
//! shows whether each request was applied exactly once and in sequence (the crash tests of
//! `crates/pmnet` use it).
//!
//! # Replies
//!
//! | status | name      | fields after the status byte        |
//! |--------|-----------|-------------------------------------|
//! | 0      | OK        | —                                   |
//! | 1      | VALUE     | `len u32`, `bytes`                  |
//! | 2      | NOT_FOUND | —                                   |
//! | 3      | INTEGER   | `value i64`                         |
//! | 4      | DELETED   | `count u32` (0 or 1)                |
//! | 255    | ERROR     | `len u16`, UTF-8 `message`          |
//!
//! VALUE bytes are at most [`MAX_VALUE_LEN`]; ERROR messages at most [`MAX_ERROR_MESSAGE_LEN`]
//! bytes (an encoder truncates a longer message at a character boundary: messages are
//! diagnostics, and a bound keeps every reply's size predictable).
//!
//! # Examples (bytes in hex)
//!
//! | message                   | bytes                                   |
//! |---------------------------|-----------------------------------------|
//! | SET `"k"` = `"v"`         | `01 01 00 6b 01 00 00 00 76`            |
//! | GET `"k"`                 | `02 01 00 6b`                           |
//! | DEL `"k"`                 | `03 01 00 6b`                           |
//! | INCR `"n"` by -2          | `04 01 00 6e fe ff ff ff ff ff ff ff`   |
//! | APPEND `"k"` + `"v"`      | `05 01 00 6b 01 00 00 00 76`            |
//! | OK                        | `00`                                    |
//! | VALUE `"v"`               | `01 01 00 00 00 76`                     |
//! | NOT_FOUND                 | `02`                                    |
//! | INTEGER 5                 | `03 05 00 00 00 00 00 00 00`            |
//! | DELETED 1                 | `04 01 00 00 00`                        |
//! | ERROR `"x"`               | `ff 01 00 78`                           |
//!
//! Decoding never panics: any byte string either decodes or yields a [`DecodeError`] saying
//! why not.

use thiserror::Error;

/// Largest key, in bytes. Keys are never empty.
pub const MAX_KEY_LEN: usize = 1024;

/// Largest value, in bytes, in a SET request and in a VALUE reply.
pub const MAX_VALUE_LEN: usize = 1024 * 1024;

/// Largest ERROR reply message, in bytes of UTF-8.
pub const MAX_ERROR_MESSAGE_LEN: usize = 1024;

/// Largest encoded request: a SET with the largest key and value.
pub const MAX_REQUEST_LEN: usize = 1 + 2 + MAX_KEY_LEN + 4 + MAX_VALUE_LEN;

/// Largest encoded reply: a VALUE with the largest value.
pub const MAX_REPLY_LEN: usize = 1 + 4 + MAX_VALUE_LEN;

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_DEL: u8 = 3;
const OP_INCR: u8 = 4;
const OP_APPEND: u8 = 5;

const STATUS_OK: u8 = 0;
const STATUS_VALUE: u8 = 1;
const STATUS_NOT_FOUND: u8 = 2;
const STATUS_INTEGER: u8 = 3;
const STATUS_DELETED: u8 = 4;
const STATUS_ERROR: u8 = 255;

/// Why a byte string is not a valid request or reply (or why a request cannot be encoded).
///
/// Display strings are short (well under 100 bytes) because the store quotes them in ERROR
/// replies.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("empty message")]
    Empty,
    #[error("unknown op {0}")]
    UnknownOp(u8),
    #[error("unknown reply status {0}")]
    UnknownStatus(u8),
    #[error("truncated {field}: need {needed} bytes, have {available}")]
    Truncated {
        field: &'static str,
        needed: usize,
        available: usize,
    },
    #[error("{count} trailing bytes")]
    TrailingBytes { count: usize },
    #[error("empty key")]
    KeyEmpty,
    #[error("key of {len} bytes exceeds {MAX_KEY_LEN}")]
    KeyTooLong { len: usize },
    #[error("value of {len} bytes exceeds {MAX_VALUE_LEN}")]
    ValueTooLong { len: usize },
    #[error("error message of {len} bytes exceeds {MAX_ERROR_MESSAGE_LEN}")]
    ErrorMessageTooLong { len: usize },
    #[error("error message is not UTF-8")]
    ErrorMessageNotUtf8,
    #[error("deleted count {0} is not 0 or 1")]
    DeletedCountInvalid(u32),
}

/// A key-value request, borrowing its key and value from the payload it was decoded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    Set { key: &'a [u8], value: &'a [u8] },
    Get { key: &'a [u8] },
    Del { key: &'a [u8] },
    Incr { key: &'a [u8], delta: i64 },
    Append { key: &'a [u8], value: &'a [u8] },
}

impl<'a> Request<'a> {
    /// Decode one request occupying all of `bytes`.
    pub fn decode(bytes: &'a [u8]) -> Result<Request<'a>, DecodeError> {
        let mut reader = Reader { bytes };
        let op = reader.u8("op").map_err(|_| DecodeError::Empty)?;
        let request = match op {
            OP_SET | OP_APPEND => {
                let key = reader.key()?;
                let value_len = reader.u32("value_len")? as usize;
                if value_len > MAX_VALUE_LEN {
                    return Err(DecodeError::ValueTooLong { len: value_len });
                }
                let value = reader.take("value", value_len)?;
                if op == OP_SET {
                    Request::Set { key, value }
                } else {
                    Request::Append { key, value }
                }
            }
            OP_GET => Request::Get { key: reader.key()? },
            OP_DEL => Request::Del { key: reader.key()? },
            OP_INCR => {
                let key = reader.key()?;
                let delta = reader.u64("delta")? as i64;
                Request::Incr { key, delta }
            }
            other => return Err(DecodeError::UnknownOp(other)),
        };
        reader.finish()?;
        Ok(request)
    }

    /// Check the bounds [`Request::encode`] asserts, for callers holding untrusted keys/values.
    pub fn validate(&self) -> Result<(), DecodeError> {
        let key = self.key();
        if key.is_empty() {
            return Err(DecodeError::KeyEmpty);
        }
        if key.len() > MAX_KEY_LEN {
            return Err(DecodeError::KeyTooLong { len: key.len() });
        }
        if let Request::Set { value, .. } | Request::Append { value, .. } = self {
            if value.len() > MAX_VALUE_LEN {
                return Err(DecodeError::ValueTooLong { len: value.len() });
            }
        }
        Ok(())
    }

    /// Append the encoding to `out`.
    ///
    /// Panics if the key or value is out of bounds (see [`Request::validate`]): encoding is
    /// done on values the program built, and an unencodable request is a bug in the caller.
    pub fn encode(&self, out: &mut Vec<u8>) {
        if let Err(error) = self.validate() {
            panic!("request cannot be encoded: {error}");
        }
        let key = self.key();
        out.reserve(self.encoded_len());
        out.push(self.op());
        out.extend_from_slice(&(key.len() as u16).to_le_bytes());
        out.extend_from_slice(key);
        match self {
            Request::Set { value, .. } | Request::Append { value, .. } => {
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
            }
            Request::Get { .. } | Request::Del { .. } => {}
            Request::Incr { delta, .. } => out.extend_from_slice(&delta.to_le_bytes()),
        }
    }

    /// The encoding as a new vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode(&mut out);
        out
    }

    /// Size of the encoding in bytes.
    pub fn encoded_len(&self) -> usize {
        let fields = match self {
            Request::Set { value, .. } | Request::Append { value, .. } => 4 + value.len(),
            Request::Get { .. } | Request::Del { .. } => 0,
            Request::Incr { .. } => 8,
        };
        1 + 2 + self.key().len() + fields
    }

    /// True for SET, DEL and APPEND: the reply is fixed, so the request may travel as a PMNet
    /// update request and be acked by a device before the server applies it. False for GET and
    /// INCR, whose reply depends on server state: they must travel as bypass requests.
    pub fn is_update(&self) -> bool {
        match self {
            Request::Set { .. } | Request::Del { .. } | Request::Append { .. } => true,
            Request::Get { .. } | Request::Incr { .. } => false,
        }
    }

    /// The key every request names.
    pub fn key(&self) -> &'a [u8] {
        match *self {
            Request::Set { key, .. }
            | Request::Get { key }
            | Request::Del { key }
            | Request::Incr { key, .. }
            | Request::Append { key, .. } => key,
        }
    }

    fn op(&self) -> u8 {
        match self {
            Request::Set { .. } => OP_SET,
            Request::Get { .. } => OP_GET,
            Request::Del { .. } => OP_DEL,
            Request::Incr { .. } => OP_INCR,
            Request::Append { .. } => OP_APPEND,
        }
    }
}

/// A reply to a key-value request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// SET applied.
    Ok,
    /// GET found the key.
    Value(Vec<u8>),
    /// GET did not find the key.
    NotFound,
    /// INCR's new value.
    Integer(i64),
    /// DEL: how many keys were removed, 0 or 1.
    Deleted(u32),
    /// The request failed; the message says why.
    Error(String),
}

impl Reply {
    /// Decode one reply occupying all of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Reply, DecodeError> {
        let mut reader = Reader { bytes };
        let status = reader.u8("status").map_err(|_| DecodeError::Empty)?;
        let reply = match status {
            STATUS_OK => Reply::Ok,
            STATUS_VALUE => {
                let len = reader.u32("value_len")? as usize;
                if len > MAX_VALUE_LEN {
                    return Err(DecodeError::ValueTooLong { len });
                }
                Reply::Value(reader.take("value", len)?.to_vec())
            }
            STATUS_NOT_FOUND => Reply::NotFound,
            STATUS_INTEGER => Reply::Integer(reader.u64("integer")? as i64),
            STATUS_DELETED => {
                let count = reader.u32("deleted")?;
                if count > 1 {
                    return Err(DecodeError::DeletedCountInvalid(count));
                }
                Reply::Deleted(count)
            }
            STATUS_ERROR => {
                let len = reader.u16("message_len")? as usize;
                if len > MAX_ERROR_MESSAGE_LEN {
                    return Err(DecodeError::ErrorMessageTooLong { len });
                }
                let message = reader.take("message", len)?;
                let message =
                    std::str::from_utf8(message).map_err(|_| DecodeError::ErrorMessageNotUtf8)?;
                Reply::Error(message.to_owned())
            }
            other => return Err(DecodeError::UnknownStatus(other)),
        };
        reader.finish()?;
        Ok(reply)
    }

    /// Append the encoding to `out`.
    ///
    /// Panics if a VALUE exceeds [`MAX_VALUE_LEN`] or DELETED is not 0 or 1 (caller bugs). An
    /// ERROR message longer than [`MAX_ERROR_MESSAGE_LEN`] is truncated at a character boundary.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Reply::Ok => out.push(STATUS_OK),
            Reply::Value(value) => {
                assert!(
                    value.len() <= MAX_VALUE_LEN,
                    "value of {} bytes",
                    value.len()
                );
                out.push(STATUS_VALUE);
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
            }
            Reply::NotFound => out.push(STATUS_NOT_FOUND),
            Reply::Integer(value) => {
                out.push(STATUS_INTEGER);
                out.extend_from_slice(&value.to_le_bytes());
            }
            Reply::Deleted(count) => {
                assert!(*count <= 1, "deleted count {count}");
                out.push(STATUS_DELETED);
                out.extend_from_slice(&count.to_le_bytes());
            }
            Reply::Error(message) => {
                let message = truncate_utf8(message, MAX_ERROR_MESSAGE_LEN);
                out.push(STATUS_ERROR);
                out.extend_from_slice(&(message.len() as u16).to_le_bytes());
                out.extend_from_slice(message.as_bytes());
            }
        }
    }

    /// The encoding as a new vector.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }
}

/// The longest prefix of `text` that is at most `max_len` bytes and ends on a char boundary.
pub(crate) fn truncate_utf8(text: &str, max_len: usize) -> &str {
    if text.len() <= max_len {
        return text;
    }
    let mut end = max_len;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A cursor over untrusted bytes: every read is bounds-checked and names the field it reads.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, field: &'static str, len: usize) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < len {
            return Err(DecodeError::Truncated {
                field,
                needed: len,
                available: self.bytes.len(),
            });
        }
        let (head, tail) = self.bytes.split_at(len);
        self.bytes = tail;
        Ok(head)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let bytes = self.take(field, N)?;
        let mut array = [0u8; N];
        array.copy_from_slice(bytes);
        Ok(array)
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    fn key(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u16("key_len")? as usize;
        if len == 0 {
            return Err(DecodeError::KeyEmpty);
        }
        if len > MAX_KEY_LEN {
            return Err(DecodeError::KeyTooLong { len });
        }
        self.take("key", len)
    }

    fn finish(self) -> Result<(), DecodeError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                count: self.bytes.len(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The examples in the module documentation, byte for byte.
    #[test]
    fn golden_requests() {
        let cases: [(Request, &[u8]); 7] = [
            (
                Request::Set {
                    key: b"k",
                    value: b"v",
                },
                &[0x01, 0x01, 0x00, 0x6b, 0x01, 0x00, 0x00, 0x00, 0x76],
            ),
            (Request::Get { key: b"k" }, &[0x02, 0x01, 0x00, 0x6b]),
            (Request::Del { key: b"k" }, &[0x03, 0x01, 0x00, 0x6b]),
            (
                Request::Incr {
                    key: b"n",
                    delta: -2,
                },
                &[
                    0x04, 0x01, 0x00, 0x6e, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                ],
            ),
            (
                Request::Set {
                    key: b"ab",
                    value: b"",
                },
                &[0x01, 0x02, 0x00, 0x61, 0x62, 0x00, 0x00, 0x00, 0x00],
            ),
            (
                Request::Append {
                    key: b"k",
                    value: b"v",
                },
                &[0x05, 0x01, 0x00, 0x6b, 0x01, 0x00, 0x00, 0x00, 0x76],
            ),
            (
                Request::Append {
                    key: b"s1",
                    value: b"12,",
                },
                &[
                    0x05, 0x02, 0x00, 0x73, 0x31, 0x03, 0x00, 0x00, 0x00, 0x31, 0x32, 0x2c,
                ],
            ),
        ];
        for (request, bytes) in cases {
            assert_eq!(request.to_bytes(), bytes, "{request:?}");
            assert_eq!(request.encoded_len(), bytes.len());
            assert_eq!(Request::decode(bytes).unwrap(), request);
        }
    }

    #[test]
    fn golden_replies() {
        let cases: [(Reply, &[u8]); 7] = [
            (Reply::Ok, &[0x00]),
            (
                Reply::Value(b"v".to_vec()),
                &[0x01, 0x01, 0x00, 0x00, 0x00, 0x76],
            ),
            (Reply::NotFound, &[0x02]),
            (
                Reply::Integer(5),
                &[0x03, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00],
            ),
            (Reply::Deleted(1), &[0x04, 0x01, 0x00, 0x00, 0x00]),
            (Reply::Deleted(0), &[0x04, 0x00, 0x00, 0x00, 0x00]),
            (Reply::Error("x".to_owned()), &[0xff, 0x01, 0x00, 0x78]),
        ];
        for (reply, bytes) in cases {
            assert_eq!(reply.to_bytes(), bytes, "{reply:?}");
            assert_eq!(Reply::decode(bytes).unwrap(), reply);
        }
    }

    #[test]
    fn is_update_matches_reply_dependence() {
        assert!(Request::Set {
            key: b"k",
            value: b"v"
        }
        .is_update());
        assert!(Request::Del { key: b"k" }.is_update());
        assert!(Request::Append {
            key: b"k",
            value: b"v"
        }
        .is_update());
        assert!(!Request::Get { key: b"k" }.is_update());
        assert!(!Request::Incr {
            key: b"k",
            delta: 1
        }
        .is_update());
    }

    #[test]
    fn request_errors() {
        let cases: [(&[u8], DecodeError); 11] = [
            (&[], DecodeError::Empty),
            (&[0x09], DecodeError::UnknownOp(9)),
            (&[0x06], DecodeError::UnknownOp(6)),
            (
                &[0x05, 0x01, 0x00, 0x6b, 0x02, 0x00, 0x00, 0x00, 0x76],
                DecodeError::Truncated {
                    field: "value",
                    needed: 2,
                    available: 1,
                },
            ),
            (
                &[0x02, 0x01],
                DecodeError::Truncated {
                    field: "key_len",
                    needed: 2,
                    available: 1,
                },
            ),
            (
                &[0x02, 0x02, 0x00, 0x6b],
                DecodeError::Truncated {
                    field: "key",
                    needed: 2,
                    available: 1,
                },
            ),
            (&[0x02, 0x00, 0x00], DecodeError::KeyEmpty),
            (&[0x02, 0x01, 0x04], DecodeError::KeyTooLong { len: 1025 }),
            (
                &[0x02, 0x01, 0x00, 0x6b, 0x00],
                DecodeError::TrailingBytes { count: 1 },
            ),
            (
                &[0x01, 0x01, 0x00, 0x6b, 0x01, 0x00, 0x10, 0x00],
                DecodeError::ValueTooLong {
                    len: MAX_VALUE_LEN + 1,
                },
            ),
            (
                &[0x04, 0x01, 0x00, 0x6e, 0x01],
                DecodeError::Truncated {
                    field: "delta",
                    needed: 8,
                    available: 1,
                },
            ),
        ];
        for (bytes, error) in cases {
            assert_eq!(Request::decode(bytes), Err(error), "{bytes:02x?}");
        }
    }

    #[test]
    fn reply_errors() {
        let cases: [(&[u8], DecodeError); 6] = [
            (&[], DecodeError::Empty),
            (&[0x07], DecodeError::UnknownStatus(7)),
            (&[0x00, 0x00], DecodeError::TrailingBytes { count: 1 }),
            (
                &[0x04, 0x02, 0x00, 0x00, 0x00],
                DecodeError::DeletedCountInvalid(2),
            ),
            (&[0xff, 0x01, 0x00, 0xc3], DecodeError::ErrorMessageNotUtf8),
            (
                &[0xff, 0x01, 0x04],
                DecodeError::ErrorMessageTooLong { len: 1025 },
            ),
        ];
        for (bytes, error) in cases {
            assert_eq!(Reply::decode(bytes), Err(error), "{bytes:02x?}");
        }
    }

    #[test]
    fn long_error_messages_truncate_at_char_boundary() {
        // 'é' is two bytes: 1023 ASCII bytes then 'é' cannot both fit in 1024 bytes.
        let message = format!("{}é", "a".repeat(MAX_ERROR_MESSAGE_LEN - 1));
        let bytes = Reply::Error(message).to_bytes();
        assert_eq!(
            Reply::decode(&bytes).unwrap(),
            Reply::Error("a".repeat(MAX_ERROR_MESSAGE_LEN - 1))
        );
    }

    #[test]
    fn validate_rejects_what_encode_would_panic_on() {
        assert_eq!(
            Request::Get { key: b"" }.validate(),
            Err(DecodeError::KeyEmpty)
        );
        let long = vec![0u8; MAX_KEY_LEN + 1];
        assert_eq!(
            Request::Del { key: &long }.validate(),
            Err(DecodeError::KeyTooLong { len: 1025 })
        );
        let big = vec![0u8; MAX_VALUE_LEN + 1];
        assert_eq!(
            Request::Set {
                key: b"k",
                value: &big
            }
            .validate(),
            Err(DecodeError::ValueTooLong {
                len: MAX_VALUE_LEN + 1
            })
        );
        assert_eq!(
            Request::Append {
                key: b"k",
                value: &big
            }
            .validate(),
            Err(DecodeError::ValueTooLong {
                len: MAX_VALUE_LEN + 1
            })
        );
        let max_key = vec![1u8; MAX_KEY_LEN];
        let max_value = vec![2u8; MAX_VALUE_LEN];
        let request = Request::Set {
            key: &max_key,
            value: &max_value,
        };
        assert_eq!(request.to_bytes().len(), MAX_REQUEST_LEN);
        assert_eq!(
            Reply::Value(max_value.clone()).to_bytes().len(),
            MAX_REPLY_LEN
        );
    }

    #[test]
    fn display_strings_are_short() {
        // The store quotes these in ERROR replies it must keep within a reserved size.
        let longest = DecodeError::Truncated {
            field: "message_len",
            needed: usize::MAX,
            available: usize::MAX,
        };
        assert!(longest.to_string().len() < 100, "{longest}");
    }

    fn key() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 1..=64)
    }

    fn owned_request() -> impl Strategy<Value = (u8, Vec<u8>, Vec<u8>, i64)> {
        (
            1u8..=5,
            key(),
            proptest::collection::vec(any::<u8>(), 0..256),
            any::<i64>(),
        )
    }

    fn as_request<'a>(op: u8, key: &'a [u8], value: &'a [u8], delta: i64) -> Request<'a> {
        match op {
            1 => Request::Set { key, value },
            2 => Request::Get { key },
            3 => Request::Del { key },
            4 => Request::Incr { key, delta },
            _ => Request::Append { key, value },
        }
    }

    fn reply() -> impl Strategy<Value = Reply> {
        prop_oneof![
            Just(Reply::Ok),
            proptest::collection::vec(any::<u8>(), 0..256).prop_map(Reply::Value),
            Just(Reply::NotFound),
            any::<i64>().prop_map(Reply::Integer),
            (0u32..=1).prop_map(Reply::Deleted),
            ".{0,64}".prop_map(Reply::Error),
        ]
    }

    proptest! {
        #[test]
        fn request_round_trip((op, key, value, delta) in owned_request()) {
            let request = as_request(op, &key, &value, delta);
            let bytes = request.to_bytes();
            prop_assert_eq!(bytes.len(), request.encoded_len());
            prop_assert_eq!(Request::decode(&bytes).unwrap(), request);
        }

        #[test]
        fn reply_round_trip(reply in reply()) {
            let bytes = reply.to_bytes();
            prop_assert_eq!(Reply::decode(&bytes).unwrap(), reply);
        }

        #[test]
        fn truncated_request_never_decodes((op, key, value, delta) in owned_request(), cut in any::<prop::sample::Index>()) {
            let bytes = as_request(op, &key, &value, delta).to_bytes();
            let cut = cut.index(bytes.len());
            prop_assert!(Request::decode(&bytes[..cut]).is_err());
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Request::decode(&bytes);
            let _ = Reply::decode(&bytes);
        }

        #[test]
        fn arbitrary_bytes_after_valid_op_never_panic(op in 0u8..=6, status in prop::sample::select(vec![0u8, 1, 2, 3, 4, 255]), rest in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut request = vec![op];
            request.extend_from_slice(&rest);
            let _ = Request::decode(&request);
            let mut reply = vec![status];
            reply.extend_from_slice(&rest);
            let _ = Reply::decode(&reply);
        }
    }
}
