//! Batches: several complete datagrams for one peer in one datagram ([`PacketType::Batch`]).
//!
//! A device packs the updates it forwards to a server, and a server the acks it sends back to
//! a device, when a turn of its loop has several for the same peer; the receiver handles each
//! packed datagram as if it had arrived on its own. The payload is a sequence of entries:
//!
//! | size | field |
//! |------|-------|
//! | 2    | u16 big-endian: the entry's length, at least [`HEADER_LEN`] |
//! | len  | a complete datagram (header and payload; its own CRC), never itself a batch |
//!
//! The batch's header: type `0x0B`, session 0, sequence number 0, one fragment, the sender's
//! device id (0 from a server) and the server id of its entries. With authentication, the
//! batch carries one trailer that covers every entry (entries carry none).

use crate::{Header, PacketType, ParseError, HEADER_LEN};

/// Bytes an entry of `datagram_len` takes in a batch's payload.
pub fn batch_entry_len(datagram_len: usize) -> usize {
    2 + datagram_len
}

/// A batch of `entries` (complete datagrams, none a batch; together at most `u16::MAX` bytes
/// of payload) for server `server_id`, from device `device_id` (0: from a server).
pub fn encode_batch(server_id: u16, device_id: u16, entries: &[Vec<u8>]) -> Vec<u8> {
    let payload_len: usize = entries
        .iter()
        .map(|entry| batch_entry_len(entry.len()))
        .sum();
    assert!(
        payload_len <= usize::from(u16::MAX),
        "a batch of {payload_len} bytes"
    );
    // One buffer, written once: the entries behind room for the header, then the header.
    let mut datagram = Vec::with_capacity(HEADER_LEN + payload_len + crate::TRAILER_ROOM);
    datagram.resize(HEADER_LEN, 0);
    for entry in entries {
        let len = u16::try_from(entry.len()).expect("an entry fits a datagram");
        datagram.extend_from_slice(&len.to_be_bytes());
        datagram.extend_from_slice(entry);
    }
    let mut header = Header::new(PacketType::Batch, server_id, 0, 0);
    header.device_id = device_id;
    header.emit_header(payload_len, &mut datagram);
    datagram
}

/// The entries of a batch's payload, in order. Yields an error (and nothing after it) for an
/// entry that runs past the payload or is shorter than a header; each entry is a datagram still
/// to be parsed.
pub fn batch_entries(payload: &[u8]) -> BatchEntries<'_> {
    BatchEntries { rest: payload }
}

/// Iterator of [`batch_entries`].
#[derive(Debug, Clone)]
pub struct BatchEntries<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for BatchEntries<'a> {
    type Item = Result<&'a [u8], ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let Some((len, rest)) = self.rest.split_first_chunk::<2>() else {
            self.rest = &[];
            return Some(Err(ParseError::Truncated));
        };
        let len = usize::from(u16::from_be_bytes(*len));
        if len < HEADER_LEN || len > rest.len() {
            self.rest = &[];
            return Some(Err(ParseError::Truncated));
        }
        let (entry, rest) = rest.split_at(len);
        self.rest = rest;
        Some(Ok(entry))
    }
}
