//! The read cache's wire format (docs/cache.md; the cache function is being built and no
//! endpoint sends these yet).
//!
//! - **Keyed update**: an update request (type `0x01`) with flag [`KEYED`]. Its payload (the
//!   first fragment's, for a request in several) starts with a [`WriteDescriptor`]: the key it
//!   writes and the reply a read of that key gives after it, then the application's request.
//!   It is logged, acked, forwarded and applied exactly like any update; a server hands the
//!   application the payload after the descriptor.
//! - **Cache read** (type [`CACHE_READ`], `0x10`), client → server through devices: an
//!   unsequenced, idempotent read. `seq` is the read's id (the client's own counter), one
//!   fragment only; the payload is a [`ReadDescriptor`] (the session's last update number the
//!   read must come after, and the key), then the application's read request.
//! - **Cache reply** (type [`CACHE_REPLY`], `0x11`), device or server → client: the reply to the
//!   cache read `(session, seq)`; `device_id` names the device that answered (0: the server).
//!   The payload is the reply, one fragment.
//!
//! Descriptors (integers big-endian):
//!
//! | descriptor | field | size |
//! |---|---|---|
//! | write | key length *k* | 1 (1 to 255) |
//! | | key | *k* |
//! | | reply-after length *r* | 2 ([`NO_REPLY_AFTER`]: none, the write only invalidates) |
//! | | reply after the write | *r* (at most [`REPLY_AFTER_MAX`]) |
//! | read | read after | 4 (the session's last update number; 0: none) |
//! | | key length *k* | 1 (1 to 255) |
//! | | key | *k* |

/// Type code of a cache read.
pub const CACHE_READ: u8 = 0x10;
/// Type code of a cache reply.
pub const CACHE_REPLY: u8 = 0x11;
/// Header flag of an update request whose payload starts with a [`WriteDescriptor`]
/// (bit 8: the first of the bits reserved for the in-network functions).
pub const KEYED: u16 = 1 << 8;
/// The reply-after length of a write that carries no reply (its value is too large to cache).
pub const NO_REPLY_AFTER: u16 = u16::MAX;
/// Bytes of a reply-after at most.
pub const REPLY_AFTER_MAX: usize = 4096;

/// Why a descriptor did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescriptorError {
    /// The payload ends inside the descriptor.
    Truncated,
    /// A key of length 0.
    EmptyKey,
    /// A reply-after longer than [`REPLY_AFTER_MAX`].
    ReplyTooLong,
}

/// What a keyed update writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteDescriptor<'a> {
    pub key: &'a [u8],
    /// The reply a read of `key` gives once this write is applied; `None`: the write only
    /// invalidates what a cache holds for the key.
    pub reply_after: Option<&'a [u8]>,
}

impl<'a> WriteDescriptor<'a> {
    /// The descriptor at the front of `payload`, and the application's request after it.
    pub fn parse(payload: &'a [u8]) -> Result<(WriteDescriptor<'a>, &'a [u8]), DescriptorError> {
        let (key, rest) = key_at(payload)?;
        let (len, rest) = split(rest, 2)?;
        let len = u16::from_be_bytes([len[0], len[1]]);
        if len == NO_REPLY_AFTER {
            return Ok((
                WriteDescriptor {
                    key,
                    reply_after: None,
                },
                rest,
            ));
        }
        if usize::from(len) > REPLY_AFTER_MAX {
            return Err(DescriptorError::ReplyTooLong);
        }
        let (reply, rest) = split(rest, usize::from(len))?;
        Ok((
            WriteDescriptor {
                key,
                reply_after: Some(reply),
            },
            rest,
        ))
    }

    /// Bytes the descriptor takes.
    pub fn len(&self) -> usize {
        1 + self.key.len() + 2 + self.reply_after.map_or(0, <[u8]>::len)
    }

    /// Never: a descriptor holds at least its lengths.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Append the descriptor to `out`. Panics on a key of 0 or more than 255 bytes or a reply
    /// longer than [`REPLY_AFTER_MAX`]: the caller checks what it sends.
    pub fn emit(&self, out: &mut Vec<u8>) {
        emit_key(self.key, out);
        match self.reply_after {
            None => out.extend_from_slice(&NO_REPLY_AFTER.to_be_bytes()),
            Some(reply) => {
                assert!(reply.len() <= REPLY_AFTER_MAX, "a reply-after too long");
                out.extend_from_slice(&(reply.len() as u16).to_be_bytes());
                out.extend_from_slice(reply);
            }
        }
    }
}

/// What a cache read reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadDescriptor<'a> {
    /// The session's last update number: a server answers the read only once it has applied
    /// the session through it (0: no update before it).
    pub read_after: u32,
    pub key: &'a [u8],
}

impl<'a> ReadDescriptor<'a> {
    /// The descriptor at the front of `payload`, and the application's request after it.
    pub fn parse(payload: &'a [u8]) -> Result<(ReadDescriptor<'a>, &'a [u8]), DescriptorError> {
        let (after, rest) = split(payload, 4)?;
        let read_after = u32::from_be_bytes([after[0], after[1], after[2], after[3]]);
        let (key, rest) = key_at(rest)?;
        Ok((ReadDescriptor { read_after, key }, rest))
    }

    /// Bytes the descriptor takes.
    pub fn len(&self) -> usize {
        4 + 1 + self.key.len()
    }

    /// Never: a descriptor holds at least its lengths.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Append the descriptor to `out`. Panics on a key of 0 or more than 255 bytes.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.read_after.to_be_bytes());
        emit_key(self.key, out);
    }
}

fn split(bytes: &[u8], len: usize) -> Result<(&[u8], &[u8]), DescriptorError> {
    if bytes.len() < len {
        return Err(DescriptorError::Truncated);
    }
    Ok(bytes.split_at(len))
}

fn key_at(bytes: &[u8]) -> Result<(&[u8], &[u8]), DescriptorError> {
    let (len, rest) = split(bytes, 1)?;
    if len[0] == 0 {
        return Err(DescriptorError::EmptyKey);
    }
    split(rest, usize::from(len[0]))
}

fn emit_key(key: &[u8], out: &mut Vec<u8>) {
    let len = u8::try_from(key.len()).expect("a key of at most 255 bytes");
    assert!(len > 0, "an empty key");
    out.push(len);
    out.extend_from_slice(key);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    #[test]
    fn golden_vectors() {
        // docs/cache.md, "Wire format": SET greeting hello through the gateway.
        let write = WriteDescriptor {
            key: b"greeting",
            reply_after: Some(b"$5\r\nhello\r\n"),
        };
        let mut out = Vec::new();
        write.emit(&mut out);
        assert_eq!(hex(&out), "086772656574696e67000b24350d0a68656c6c6f0d0a");
        assert_eq!(out.len(), write.len());
        let invalidate = WriteDescriptor {
            key: b"k",
            reply_after: None,
        };
        let mut out = Vec::new();
        invalidate.emit(&mut out);
        assert_eq!(hex(&out), "016bffff");
        let read = ReadDescriptor {
            read_after: 7,
            key: b"greeting",
        };
        let mut out = Vec::new();
        read.emit(&mut out);
        assert_eq!(hex(&out), "00000007086772656574696e67");
        assert_eq!(out.len(), read.len());
    }

    #[test]
    fn descriptors_read_back_and_leave_the_application_s_bytes() {
        let mut payload = Vec::new();
        let write = WriteDescriptor {
            key: b"k",
            reply_after: Some(b"v"),
        };
        write.emit(&mut payload);
        payload.extend_from_slice(b"APP");
        assert_eq!(WriteDescriptor::parse(&payload), Ok((write, &b"APP"[..])));
        let mut payload = Vec::new();
        let read = ReadDescriptor {
            read_after: u32::MAX,
            key: &[0xFF; 255],
        };
        read.emit(&mut payload);
        assert_eq!(ReadDescriptor::parse(&payload), Ok((read, &b""[..])));
    }

    #[test]
    fn every_prefix_of_a_descriptor_and_bad_lengths_are_refused() {
        let mut payload = Vec::new();
        WriteDescriptor {
            key: b"key",
            reply_after: Some(b"reply"),
        }
        .emit(&mut payload);
        for len in 0..payload.len() {
            assert_eq!(
                WriteDescriptor::parse(&payload[..len]),
                Err(DescriptorError::Truncated)
            );
        }
        assert_eq!(
            WriteDescriptor::parse(&[0, 0, 0]),
            Err(DescriptorError::EmptyKey)
        );
        assert_eq!(
            WriteDescriptor::parse(&[1, b'k', 0x10, 0x01]),
            Err(DescriptorError::ReplyTooLong)
        );
        assert_eq!(
            ReadDescriptor::parse(&[0, 0, 0, 1, 0]),
            Err(DescriptorError::EmptyKey)
        );
        for len in 0..5 {
            assert!(ReadDescriptor::parse(&[0, 0, 0, 1, 1][..len]).is_err());
        }
    }
}
