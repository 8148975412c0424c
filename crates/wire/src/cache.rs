//! The read cache's wire format (docs/cache.md).
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
//! | write | after: session | 8 (set by the device that logs it; 0 from a client) |
//! | | after: sequence number | 4 (0: the write waits for nothing) |
//! | | stamp | 8 (the device's count of keyed writes; 0 from a client) |
//! | | key length *k* | 1 (0 to 255; 0: a *barrier*, a write that may change every key) |
//! | | key | *k* |
//! | | reply-after length *r* | 2 ([`NO_REPLY_AFTER`]: none, the write only invalidates) |
//! | | reply after the write | *r* (at most [`REPLY_AFTER_MAX`]) |
//! | | a barrier only: room for afters *n* | 2 |
//! | | a barrier only: *n* afters, each session (8) and sequence number (4) | 12 *n* (set by the device; zeros from a client; number 0: unused) |
//! | read | read after | 4 (the session's last update number; 0: none) |
//! | | after: session | 8 (set by a device: a keyed write to the key not yet acknowledged) |
//! | | after: sequence number | 4 (0: none) |
//! | | key length *k* | 1 (1 to 255) |
//! | | key | *k* |

/// Type code of a cache read.
pub const CACHE_READ: u8 = 0x10;
/// Type code of a cache reply.
pub const CACHE_REPLY: u8 = 0x11;
/// Header flag of an update request whose payload starts with a [`WriteDescriptor`]
/// (bit 8: the first of the bits reserved for the in-network functions).
pub const KEYED: u16 = 1 << 8;
/// Header flag of a cache reply from a server that no cache may keep (a Redis key with a
/// time to live: the device would not see it expire). Bit 9.
pub const NOT_CACHEABLE: u16 = 1 << 9;
/// The reply-after length of a write that carries no reply (its value is too large to cache).
pub const NO_REPLY_AFTER: u16 = u16::MAX;
/// Bytes of a reply-after at most.
pub const REPLY_AFTER_MAX: usize = 4096;

/// Bytes of a write descriptor's [`WriteOrder`], at its front.
pub const ORDER_LEN: usize = 20;

/// Where a keyed write stands among the writes to its key, as the device that logged it says:
/// a client sends zeros, and the device writes its order in place before it logs the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteOrder {
    /// The request a server must have applied before this one: the device's latest earlier
    /// keyed write to the same key that its server had not yet acknowledged (`after_seq` 0:
    /// none).
    pub after_session: u64,
    pub after_seq: u32,
    /// The device's count of keyed writes when it logged this one (orders the writes it
    /// recovers from its log after a restart).
    pub stamp: u64,
}

impl WriteOrder {
    /// The request this write waits for, if any.
    pub fn after(&self) -> Option<(u64, u32)> {
        (self.after_seq != 0).then_some((self.after_session, self.after_seq))
    }

    /// Overwrite the order at the front of a keyed update's payload. `false` (nothing
    /// written) if the payload is shorter than [`ORDER_LEN`].
    pub fn write_into(&self, payload: &mut [u8]) -> bool {
        let Some(front) = payload.get_mut(..ORDER_LEN) else {
            return false;
        };
        front[..8].copy_from_slice(&self.after_session.to_be_bytes());
        front[8..12].copy_from_slice(&self.after_seq.to_be_bytes());
        front[12..].copy_from_slice(&self.stamp.to_be_bytes());
        true
    }

    fn parse(bytes: &[u8]) -> Result<(WriteOrder, &[u8]), DescriptorError> {
        let (front, rest) = split(bytes, ORDER_LEN)?;
        let u64_at = |at: usize| {
            let mut word = [0; 8];
            word.copy_from_slice(&front[at..at + 8]);
            u64::from_be_bytes(word)
        };
        let order = WriteOrder {
            after_session: u64_at(0),
            after_seq: u32::from_be_bytes([front[8], front[9], front[10], front[11]]),
            stamp: u64_at(12),
        };
        Ok((order, rest))
    }
}

/// Bytes of a read descriptor before its key: read-after and the device's after.
pub const READ_ORDER_LEN: usize = 16;

/// Why a descriptor did not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescriptorError {
    /// The payload ends inside the descriptor.
    Truncated,
    /// A key of length 0.
    EmptyKey,
    /// A reply-after longer than [`REPLY_AFTER_MAX`].
    ReplyTooLong,
    /// A barrier (no key) with a reply-after.
    BarrierWithReply,
}

/// What a keyed update writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteDescriptor<'a> {
    pub order: WriteOrder,
    /// The key written; empty for a barrier (a write that may change any key: a cache drops
    /// everything it holds).
    pub key: &'a [u8],
    /// The reply a read of `key` gives once this write is applied; `None`: the write only
    /// invalidates what a cache holds for the key.
    pub reply_after: Option<&'a [u8]>,
    /// A barrier's afters as they are on the wire: [`AFTER_LEN`] bytes each, the requests a
    /// server must have applied before it (one per session that had a keyed write the device
    /// had not seen acknowledged; sequence number 0: unused room). Empty for a keyed write.
    pub afters: &'a [u8],
}

/// Bytes of one of a barrier's afters: session (8) and sequence number (4).
pub const AFTER_LEN: usize = 12;

/// Where a barrier's afters start in its descriptor: the order, key length 0, reply-after
/// length, room.
const BARRIER_AFTERS_AT: usize = ORDER_LEN + 1 + 2 + 2;

impl<'a> WriteDescriptor<'a> {
    /// The descriptor at the front of `payload`, and the application's request after it.
    pub fn parse(payload: &'a [u8]) -> Result<(WriteDescriptor<'a>, &'a [u8]), DescriptorError> {
        let (order, rest) = WriteOrder::parse(payload)?;
        let (key, rest) = key_or_barrier_at(rest)?;
        let (len, rest) = split(rest, 2)?;
        let len = u16::from_be_bytes([len[0], len[1]]);
        if key.is_empty() {
            if len != NO_REPLY_AFTER {
                return Err(DescriptorError::BarrierWithReply);
            }
            let (room, rest) = split(rest, 2)?;
            let room = usize::from(u16::from_be_bytes([room[0], room[1]]));
            let (afters, rest) = split(rest, room * AFTER_LEN)?;
            return Ok((
                WriteDescriptor {
                    order,
                    key,
                    reply_after: None,
                    afters,
                },
                rest,
            ));
        }
        if len == NO_REPLY_AFTER {
            return Ok((
                WriteDescriptor {
                    order,
                    key,
                    reply_after: None,
                    afters: &[],
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
                order,
                key,
                reply_after: Some(reply),
                afters: &[],
            },
            rest,
        ))
    }

    /// A barrier's descriptor as a client sends it, with room for `room` afters.
    pub fn barrier(room: usize) -> Vec<u8> {
        let room = room.min(usize::from(u16::MAX));
        let mut out = vec![0; ORDER_LEN];
        out.push(0);
        out.extend_from_slice(&NO_REPLY_AFTER.to_be_bytes());
        out.extend_from_slice(&(room as u16).to_be_bytes());
        out.resize(out.len() + room * AFTER_LEN, 0);
        out
    }

    /// A barrier's afters in use: (session, sequence number).
    pub fn barrier_afters(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.afters.chunks_exact(AFTER_LEN).filter_map(|entry| {
            let mut session = [0; 8];
            session.copy_from_slice(&entry[..8]);
            let seq = u32::from_be_bytes([entry[8], entry[9], entry[10], entry[11]]);
            (seq != 0).then_some((u64::from_be_bytes(session), seq))
        })
    }

    /// Write `afters` into the room of the barrier at the front of `payload` (the rest of the
    /// room zeroed). `false` (nothing written) when the payload holds no barrier with room
    /// enough.
    pub fn write_barrier_afters(payload: &mut [u8], afters: &[(u64, u32)]) -> bool {
        let Ok((descriptor, _)) = WriteDescriptor::parse(payload) else {
            return false;
        };
        let room = descriptor.afters.len() / AFTER_LEN;
        if !descriptor.is_barrier() || afters.len() > room {
            return false;
        }
        let area = &mut payload[BARRIER_AFTERS_AT..BARRIER_AFTERS_AT + room * AFTER_LEN];
        area.fill(0);
        for (entry, (session, seq)) in area.chunks_exact_mut(AFTER_LEN).zip(afters) {
            entry[..8].copy_from_slice(&session.to_be_bytes());
            entry[8..].copy_from_slice(&seq.to_be_bytes());
        }
        true
    }

    /// Bytes the descriptor takes.
    pub fn len(&self) -> usize {
        let barrier_room = if self.is_barrier() {
            2 + self.afters.len()
        } else {
            0
        };
        ORDER_LEN + 1 + self.key.len() + 2 + self.reply_after.map_or(0, <[u8]>::len) + barrier_room
    }

    /// Never: a descriptor holds at least its lengths.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether the write is a barrier (it names no key: it may change any).
    pub fn is_barrier(&self) -> bool {
        self.key.is_empty()
    }

    /// Append the descriptor to `out`. Panics on a key of more than 255 bytes or a reply
    /// longer than [`REPLY_AFTER_MAX`]: the caller checks what it sends.
    pub fn emit(&self, out: &mut Vec<u8>) {
        let at = out.len();
        out.resize(at + ORDER_LEN, 0);
        self.order.write_into(&mut out[at..]);
        emit_key(self.key, out);
        match self.reply_after {
            None => out.extend_from_slice(&NO_REPLY_AFTER.to_be_bytes()),
            Some(reply) => {
                assert!(reply.len() <= REPLY_AFTER_MAX, "a reply-after too long");
                out.extend_from_slice(&(reply.len() as u16).to_be_bytes());
                out.extend_from_slice(reply);
            }
        }
        if self.is_barrier() {
            assert!(self.reply_after.is_none(), "a barrier has no reply-after");
            let room = self.afters.len() / AFTER_LEN;
            out.extend_from_slice(&(room as u16).to_be_bytes());
            out.extend_from_slice(&self.afters[..room * AFTER_LEN]);
        }
    }
}

/// What a cache read reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadDescriptor<'a> {
    /// The session's last update number: a server answers the read only once it has applied
    /// the session through it (0: no update before it).
    pub read_after: u32,
    /// Set by a device that forwards the read while a keyed write to the key it acknowledged
    /// is not yet acknowledged by the server: that write (session, number), which the server
    /// must have applied before it answers (`after_seq` 0: none; a client sends zeros).
    pub after_session: u64,
    pub after_seq: u32,
    pub key: &'a [u8],
}

impl<'a> ReadDescriptor<'a> {
    /// The descriptor at the front of `payload`, and the application's request after it.
    pub fn parse(payload: &'a [u8]) -> Result<(ReadDescriptor<'a>, &'a [u8]), DescriptorError> {
        let (front, rest) = split(payload, READ_ORDER_LEN)?;
        let read_after = u32::from_be_bytes([front[0], front[1], front[2], front[3]]);
        let mut session = [0; 8];
        session.copy_from_slice(&front[4..12]);
        let after_seq = u32::from_be_bytes([front[12], front[13], front[14], front[15]]);
        let (key, rest) = key_at(rest)?;
        Ok((
            ReadDescriptor {
                read_after,
                after_session: u64::from_be_bytes(session),
                after_seq,
                key,
            },
            rest,
        ))
    }

    /// The keyed write the read waits for, if a device named one.
    pub fn after(&self) -> Option<(u64, u32)> {
        (self.after_seq != 0).then_some((self.after_session, self.after_seq))
    }

    /// Overwrite the device's `after` in a cache read's payload (`false` if it is too short).
    pub fn write_after(payload: &mut [u8], after_session: u64, after_seq: u32) -> bool {
        let Some(front) = payload.get_mut(4..READ_ORDER_LEN) else {
            return false;
        };
        front[..8].copy_from_slice(&after_session.to_be_bytes());
        front[8..].copy_from_slice(&after_seq.to_be_bytes());
        true
    }

    /// Bytes the descriptor takes.
    pub fn len(&self) -> usize {
        READ_ORDER_LEN + 1 + self.key.len()
    }

    /// Never: a descriptor holds at least its lengths.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Append the descriptor to `out`. Panics on a key of 0 or more than 255 bytes.
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.read_after.to_be_bytes());
        out.extend_from_slice(&self.after_session.to_be_bytes());
        out.extend_from_slice(&self.after_seq.to_be_bytes());
        assert!(!self.key.is_empty(), "an empty key");
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

/// A write's key: empty for a barrier.
fn key_or_barrier_at(bytes: &[u8]) -> Result<(&[u8], &[u8]), DescriptorError> {
    let (len, rest) = split(bytes, 1)?;
    split(rest, usize::from(len[0]))
}

/// A key's length (one byte) and the key; panics on a key of more than 255 bytes.
fn emit_key(key: &[u8], out: &mut Vec<u8>) {
    let len = u8::try_from(key.len()).expect("a key of at most 255 bytes");
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
        // As a client sends it: no order yet.
        let write = WriteDescriptor {
            order: WriteOrder::default(),
            key: b"greeting",
            reply_after: Some(b"$5\r\nhello\r\n"),
            afters: &[],
        };
        let mut out = Vec::new();
        write.emit(&mut out);
        assert_eq!(
            hex(&out),
            "0000000000000000000000000000000000000000\
             086772656574696e67000b24350d0a68656c6c6f0d0a"
        );
        assert_eq!(out.len(), write.len());
        // As a device logs it: after request 3 of session 0x5e55…01, its 42nd keyed write.
        let order = WriteOrder {
            after_session: 0x5e55_0000_0000_0001,
            after_seq: 3,
            stamp: 42,
        };
        assert!(order.write_into(&mut out));
        assert_eq!(
            hex(&out[..ORDER_LEN]),
            "5e55000000000001" /* after session */
            .to_owned() + "00000003" /* after seq */ + "000000000000002a" /* stamp */
        );
        assert_eq!(
            WriteDescriptor::parse(&out).unwrap().0.order.after(),
            Some((0x5e55_0000_0000_0001, 3))
        );
        let invalidate = WriteDescriptor {
            order: WriteOrder::default(),
            key: b"k",
            reply_after: None,
            afters: &[],
        };
        let mut out = Vec::new();
        invalidate.emit(&mut out);
        assert_eq!(
            hex(&out),
            "0000000000000000000000000000000000000000016bffff"
        );
        assert!(!WriteOrder::default().write_into(&mut [0; ORDER_LEN - 1]));
        // A barrier: MSET a 1 b 2 through the gateway writes no single key.
        // With room for two afters, as a client sends it.
        let mut out = WriteDescriptor::barrier(2);
        assert_eq!(
            hex(&out),
            "000000000000000000000000000000000000000000ffff0002".to_owned()
                + &"00".repeat(2 * AFTER_LEN)
        );
        let (parsed, rest) = WriteDescriptor::parse(&out).unwrap();
        assert!(parsed.is_barrier() && rest.is_empty() && parsed.len() == out.len());
        assert_eq!(parsed.barrier_afters().count(), 0);
        // A device fills in one: request 3 of session 0x5e55…01 must be applied before it.
        assert!(WriteDescriptor::write_barrier_afters(
            &mut out,
            &[(0x5e55_0000_0000_0001, 3)]
        ));
        assert_eq!(
            hex(&out[ORDER_LEN..]),
            "00ffff0002".to_owned() + "5e5500000000000100000003" + &"00".repeat(AFTER_LEN)
        );
        let (parsed, _) = WriteDescriptor::parse(&out).unwrap();
        assert_eq!(
            parsed.barrier_afters().collect::<Vec<_>>(),
            vec![(0x5e55_0000_0000_0001, 3)]
        );
        let mut again = Vec::new();
        parsed.emit(&mut again);
        assert_eq!(again, out);
        // No room for three.
        assert!(!WriteDescriptor::write_barrier_afters(
            &mut out,
            &[(1, 1), (2, 2), (3, 3)]
        ));
        let read = ReadDescriptor {
            read_after: 7,
            after_session: 0,
            after_seq: 0,
            key: b"greeting",
        };
        let mut out = Vec::new();
        read.emit(&mut out);
        assert_eq!(
            hex(&out),
            "00000007000000000000000000000000086772656574696e67"
        );
        assert_eq!(out.len(), read.len());
        // A device names the keyed write it must follow: request 3 of session 0x5e55…01.
        assert!(ReadDescriptor::write_after(
            &mut out,
            0x5e55_0000_0000_0001,
            3
        ));
        assert_eq!(
            hex(&out),
            "000000075e5500000000000100000003086772656574696e67"
        );
        assert_eq!(
            ReadDescriptor::parse(&out).unwrap().0.after(),
            Some((0x5e55_0000_0000_0001, 3))
        );
    }

    #[test]
    fn descriptors_read_back_and_leave_the_application_s_bytes() {
        let mut payload = Vec::new();
        let write = WriteDescriptor {
            order: WriteOrder {
                after_session: u64::MAX,
                after_seq: u32::MAX,
                stamp: 1,
            },
            key: b"k",
            reply_after: Some(b"v"),
            afters: &[],
        };
        write.emit(&mut payload);
        payload.extend_from_slice(b"APP");
        assert_eq!(WriteDescriptor::parse(&payload), Ok((write, &b"APP"[..])));
        let mut payload = Vec::new();
        let read = ReadDescriptor {
            read_after: u32::MAX,
            after_session: 1,
            after_seq: 2,
            key: &[0xFF; 255],
        };
        read.emit(&mut payload);
        assert_eq!(ReadDescriptor::parse(&payload), Ok((read, &b""[..])));
    }

    #[test]
    fn every_prefix_of_a_descriptor_and_bad_lengths_are_refused() {
        let mut payload = Vec::new();
        WriteDescriptor {
            order: WriteOrder::default(),
            key: b"key",
            reply_after: Some(b"reply"),
            afters: &[],
        }
        .emit(&mut payload);
        for len in 0..payload.len() {
            assert_eq!(
                WriteDescriptor::parse(&payload[..len]),
                Err(DescriptorError::Truncated)
            );
        }
        let ordered = |rest: &[u8]| [&[0; ORDER_LEN][..], rest].concat();
        // A key of length 0 is a barrier: no reply-after, then its room for afters.
        let barrier_payload = ordered(&[0, 0xff, 0xff, 0, 0, b'X']);
        let (barrier, rest) = WriteDescriptor::parse(&barrier_payload).unwrap();
        assert!(barrier.is_barrier() && barrier.reply_after.is_none() && rest == b"X");
        assert_eq!(
            WriteDescriptor::parse(&ordered(&[0, 0, 1, b'v', 0, 0])),
            Err(DescriptorError::BarrierWithReply)
        );
        assert_eq!(
            WriteDescriptor::parse(&ordered(&[0, 0xff, 0xff, 0, 1, 0, 0])),
            Err(DescriptorError::Truncated)
        );
        assert_eq!(
            WriteDescriptor::parse(&ordered(&[1, b'k', 0x10, 0x01])),
            Err(DescriptorError::ReplyTooLong)
        );
        let read = [&[0, 0, 0, 1][..], &[0; 12], &[1, b'k']].concat();
        assert_eq!(
            ReadDescriptor::parse(
                &read[..READ_ORDER_LEN + 1]
                    .iter()
                    .map(|_| 0)
                    .collect::<Vec<u8>>()
            ),
            Err(DescriptorError::EmptyKey)
        );
        for len in 0..read.len() {
            assert!(ReadDescriptor::parse(&read[..len]).is_err());
        }
        assert!(ReadDescriptor::parse(&read).is_ok());
    }
}
