//! Writing records into free space: packet chains (datagrams the store makes itself),
//! conventional records and reply blocks, and finding the room for them.

use pmnet_pm::PmRegion;
use pmnet_wire::{Header, PacketType, HEADER_LEN};

use super::space::Purpose;
use super::{Pending, Store};
use crate::breakdown::Phase;
use crate::buddy::order_for;
use crate::layout::*;

/// The PMNet header of a datagram the store makes itself (server, flags and device 0), for
/// `payload`, which goes into the slot behind it.
fn synth_header(
    packet_type: PacketType,
    session_id: u64,
    seq: u32,
    fragment: (u16, u16),
    payload: &[u8],
) -> [u8; HEADER_LEN] {
    let mut header = Header::new(packet_type, 0, session_id, seq);
    (header.fragment_index, header.fragment_count) = fragment;
    let mut bytes = [0u8; HEADER_LEN];
    header.emit_header_for(payload, &mut bytes);
    bytes
}

impl<R: PmRegion> Store<R> {
    /// Write a chain of datagrams carrying `payload` into free slots; the head's metadata is
    /// returned, the others' written. `None` (nothing taken or written) when the slots run
    /// out: data stops short of the delete reserve, a delete may use it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_packet_chain(
        &mut self,
        session_id: u64,
        seq: u32,
        packet_type: PacketType,
        payload: &[u8],
        kind: RecordKind,
        style: ReplyStyle,
        purpose: Purpose,
    ) -> Option<Pending> {
        let capacity = self.geometry.slot_payload_capacity();
        let count = payload.len().div_ceil(capacity).max(1);
        if count > usize::from(u16::MAX) || !self.room_for_slots(count, purpose) {
            return None;
        }
        // After finding room, which may have committed the batch so far.
        let epoch = self.batch_epoch();
        let mut ids = Vec::with_capacity(count);
        for _ in 0..count {
            ids.push(self.space.take_slot()?);
        }
        self.space.note_chain(&ids);
        // Slots to the record ids they start.
        for id in &mut ids {
            *id = self.geometry.slot_id(*id);
        }
        self.mark(Phase::Allocate);
        let mut head = None;
        for (index, &id) in ids.iter().enumerate() {
            let chunk = &payload[(index * capacity).min(payload.len())
                ..((index + 1) * capacity).min(payload.len())];
            let header = synth_header(
                packet_type,
                session_id,
                seq,
                (index as u16, count as u16),
                chunk,
            );
            self.mark(Phase::Checksum);
            let offset = self.geometry.record_offset(id);
            self.region.write(offset + META_LEN, &header);
            self.region.write(offset + META_LEN + HEADER_LEN, chunk);
            self.mark(Phase::Copy);
            let meta = Meta {
                next0: 0,
                frag_next: link_of(ids.get(index + 1).copied()),
                epoch,
                receive_time_ns: 0,
                len: (HEADER_LEN + chunk.len()) as u32,
                kind,
                order: 0,
                reply_style: style,
                self_id: id,
            };
            if index == 0 {
                // Flushed with its metadata line once linked.
                head = Some(meta);
            } else {
                self.region.write(offset, &meta.encode());
                self.region
                    .flush(offset, META_LEN + HEADER_LEN + chunk.len());
            }
            self.mark(Phase::Persist);
        }
        self.stats.records_written += 1;
        let head = head?;
        Some(Pending {
            id: ids[0],
            meta: head,
            unflushed: head.len,
        })
    }

    /// The conventional write: allocate a block, build the record, checksum it, copy it in.
    /// `None` (nothing taken or written) when no block is free for it: data leaves the delete
    /// block alone, a delete may take it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn write_conventional(
        &mut self,
        session_id: u64,
        seq: u32,
        op: u8,
        key: &[u8],
        value: &[u8],
        style: ReplyStyle,
        purpose: Purpose,
    ) -> Option<Pending> {
        let body_len = CONVENTIONAL_HEADER_LEN + key.len() + value.len();
        let (id, order) = self.alloc_block(order_for(META_LEN + body_len)?, purpose)?;
        self.mark(Phase::Allocate);
        let mut header = [0u8; CONVENTIONAL_HEADER_LEN];
        header[0..8].copy_from_slice(&session_id.to_le_bytes());
        header[8..12].copy_from_slice(&seq.to_le_bytes());
        header[12..14].copy_from_slice(&(key.len() as u16).to_le_bytes());
        header[14] = op;
        header[16..20].copy_from_slice(&(value.len() as u32).to_le_bytes());
        let mut crc = crc32c::crc32c(&header[0..20]);
        crc = crc32c::crc32c_append(crc, key);
        crc = crc32c::crc32c_append(crc, value);
        header[20..24].copy_from_slice(&crc.to_le_bytes());
        self.mark(Phase::Checksum);
        let offset = self.geometry.record_offset(id);
        let body = offset + META_LEN;
        self.region.write(body, &header);
        self.region.write(body + CONVENTIONAL_HEADER_LEN, key);
        self.region
            .write(body + CONVENTIONAL_HEADER_LEN + key.len(), value);
        self.mark(Phase::Copy);
        self.stats.records_written += 1;
        Some(Pending {
            id,
            unflushed: body_len as u32,
            meta: Meta {
                next0: 0,
                frag_next: 0,
                epoch: self.batch_epoch(),
                receive_time_ns: 0,
                len: body_len as u32,
                kind: RecordKind::Conventional,
                order,
                reply_style: style,
                self_id: id,
            },
        })
    }

    /// Conventional engine: a long reply in a block of its own: length, CRC32C, bytes.
    pub(super) fn write_reply_block(&mut self, reply: &[u8]) -> Option<Pending> {
        let body_len = 8 + reply.len();
        let (id, order) = self.alloc_block(order_for(META_LEN + body_len)?, Purpose::Data)?;
        let offset = self.geometry.record_offset(id) + META_LEN;
        let mut header = [0u8; 8];
        header[0..4].copy_from_slice(&(reply.len() as u32).to_le_bytes());
        header[4..8].copy_from_slice(&crc32c::crc32c(reply).to_le_bytes());
        self.region.write(offset, &header);
        self.region.write(offset + 8, reply);
        self.region.flush(offset, body_len);
        self.stats.records_written += 1;
        Some(Pending {
            id,
            unflushed: 0,
            meta: Meta {
                next0: 0,
                frag_next: 0,
                epoch: self.batch_epoch(),
                receive_time_ns: 0,
                len: body_len as u32,
                kind: RecordKind::Reply,
                order,
                reply_style: ReplyStyle::Ok,
                self_id: id,
            },
        })
    }

    /// Packet engine: whether `count` free slots may be taken for `purpose`, reclaiming what
    /// earlier batches freed if they are short. True means the caller takes them and stages
    /// into the (possibly new) batch.
    fn room_for_slots(&mut self, count: usize, purpose: Purpose) -> bool {
        let fits = |store: &Self| store.space.slots_fit(count, purpose);
        let room = fits(self) || (self.reclaim() && fits(self));
        if room {
            self.batch.wrote = true;
        }
        room
    }

    /// Conventional engine: a block of at least `order` for `purpose`, with the order it was
    /// taken at; reclaims what earlier batches freed if none is free. Data first makes sure
    /// the delete block is held (and is refused if no block of its size is free); a delete
    /// takes the delete block, whole, when nothing else fits.
    fn alloc_block(&mut self, order: u8, purpose: Purpose) -> Option<(u32, u8)> {
        let taken = match self.space.take_block(order, purpose) {
            Some(taken) => taken,
            None if self.reclaim() => self.space.take_block(order, purpose)?,
            None => return None,
        };
        self.batch.wrote = true;
        Some(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synthesised header and its payload are the datagram `Header::encode` makes for the
    /// same fields, and parse back to them.
    #[test]
    fn a_synthesised_datagram_is_the_wire_encoding() {
        for (packet_type, fragment, payload) in [
            (PacketType::UpdateRequest, (0, 1), &b""[..]),
            (PacketType::UpdateRequest, (2, 3), b"\x01\x03keyvalue"),
            (PacketType::ServerAck, (0, 2), &[0xAB; 1400][..]),
        ] {
            let mut expected = Header::new(packet_type, 0, 0x0123_4567_89AB_CDEF, 7);
            (expected.fragment_index, expected.fragment_count) = fragment;
            let mut datagram =
                synth_header(packet_type, 0x0123_4567_89AB_CDEF, 7, fragment, payload).to_vec();
            datagram.extend_from_slice(payload);
            assert_eq!(datagram, expected.encode(payload));
            assert_eq!(Header::parse(&datagram), Ok((expected, payload)));
        }
    }
}
