//! Reading the store: the read-only queries (get, scan, keys, verify) and the record checks
//! that reads, recovery and the invariant checks share.

use pmnet_pm::PmRegion;
use pmnet_store::codec::{MAX_KEY_LEN, MAX_VALUE_LEN};
use pmnet_wire::{Packet, PacketType, HEADER_LEN};

use super::{Corruption, Store, Value, OP_APPEND, OP_DEL, OP_SET};
use crate::layout::*;

/// What a request looks like, read from its datagrams without copying.
#[derive(Debug)]
pub(super) struct RequestShape<'a> {
    pub(super) session_id: u64,
    pub(super) seq: u32,
    pub(super) op: u8,
    pub(super) key: &'a [u8],
}

/// Check the datagrams of one request (in fragment order) and find its op and key, reading
/// only headers and the first bytes of the payload. `verify_crc` checks every CRC32C too.
pub(super) fn inspect_request<'a>(
    datagrams: &[&'a [u8]],
    verify_crc: bool,
    expected_type: PacketType,
) -> Result<RequestShape<'a>, &'static str> {
    let count = datagrams.len();
    if count == 0 || count > usize::from(u16::MAX) {
        return Err("bad_fragment");
    }
    let mut session_id = 0;
    let mut seq = 0;
    let mut total = 0usize;
    for (index, datagram) in datagrams.iter().enumerate() {
        let packet = Packet::new_checked(*datagram).map_err(|error| error.reason())?;
        if verify_crc && !packet.verify_checksum() {
            return Err("bad_checksum");
        }
        if PacketType::from_code(packet.type_code()).is_none() {
            return Err("unknown_type");
        }
        if index == 0 {
            session_id = packet.session_id();
            seq = packet.seq();
        } else if packet.session_id() != session_id || packet.seq() != seq {
            return Err("fragments_of_different_requests");
        }
        if usize::from(packet.fragment_index()) != index
            || usize::from(packet.fragment_count()) != count
        {
            return Err("bad_fragment");
        }
        let type_ok = packet.type_code() == expected_type.code()
            || (expected_type == PacketType::UpdateRequest
                && packet.type_code() == PacketType::BypassRequest.code());
        if !type_ok {
            return Err("unexpected_type");
        }
        total += usize::from(packet.payload_len());
    }
    let first = &datagrams[0][HEADER_LEN..];
    if expected_type != PacketType::UpdateRequest {
        return Ok(RequestShape {
            session_id,
            seq,
            op: 0,
            key: &[],
        });
    }
    let op = *first.first().ok_or("empty_request")?;
    if first.len() < 3 {
        return Err("key_not_in_first_fragment");
    }
    let key_len = usize::from(u16::from_le_bytes([first[1], first[2]]));
    if key_len == 0 || key_len > MAX_KEY_LEN {
        return Err("bad_key_length");
    }
    let key = first
        .get(3..3 + key_len)
        .ok_or("key_not_in_first_fragment")?;
    match op {
        OP_SET | OP_APPEND => {
            let field = first
                .get(3 + key_len..7 + key_len)
                .ok_or("key_not_in_first_fragment")?;
            let value_len = u32::from_le_bytes([field[0], field[1], field[2], field[3]]) as usize;
            if value_len > MAX_VALUE_LEN || total != 7 + key_len + value_len {
                return Err("request_length_mismatch");
            }
        }
        OP_DEL if total != 3 + key_len => return Err("request_length_mismatch"),
        _ => {}
    }
    Ok(RequestShape {
        session_id,
        seq,
        op,
        key,
    })
}

impl<R: PmRegion> Store<R> {
    /// Reads see the batch being staged too (its records carry the next epoch).
    pub(super) fn view(&self) -> View<'_> {
        View {
            bytes: self.region.bytes(),
            geometry: self.geometry,
            committed_epoch: self.batch_epoch(),
        }
    }

    pub(super) fn meta(&self, id: u32) -> Option<Meta> {
        self.view().meta(id)
    }

    pub(super) fn check_record(
        &self,
        id: u32,
        verify: bool,
    ) -> Result<CheckedRecord<'_>, &'static str> {
        self.view().check_record(id, verify)
    }

    pub(super) fn value_of(&self, id: u32) -> Result<Value<'_>, Corruption> {
        self.view().value_of(id)
    }

    /// The value of `key`, read from the stored record and checksum-verified; a damaged record
    /// is reported, never returned.
    pub fn get(&self, key: &[u8]) -> Result<Option<Value<'_>>, Corruption> {
        let bytes = self.region.bytes();
        let geometry = self.geometry;
        let Some(id) = self.index.get(key, |r| record_key(bytes, &geometry, r)) else {
            return Ok(None);
        };
        self.value_of(id).map(Some)
    }

    /// Up to `limit` keys ≥ `start` in order, with their values (verified).
    pub fn scan(&self, start: &[u8], limit: usize) -> Result<Vec<(&[u8], Value<'_>)>, Corruption> {
        let bytes = self.region.bytes();
        let geometry = self.geometry;
        let mut out = Vec::new();
        for id in self
            .index
            .records_from(start, |r| record_key(bytes, &geometry, r))
            .take(limit)
        {
            let value = self.value_of(id)?;
            out.push((record_key(bytes, &geometry, id), value));
        }
        Ok(out)
    }

    /// Every key in order (no verification): for tests and tools.
    pub fn keys(&self) -> Vec<Vec<u8>> {
        let bytes = self.region.bytes();
        self.index
            .records()
            .map(|id| record_key(bytes, &self.geometry, id).to_vec())
            .collect()
    }

    /// The receive time recorded with the record holding `key` (0 if the store made it).
    pub fn receive_time_ns(&self, key: &[u8]) -> Option<u64> {
        let bytes = self.region.bytes();
        let id = self
            .index
            .get(key, |r| record_key(bytes, &self.geometry, r))?;
        self.meta(id).map(|meta| meta.receive_time_ns)
    }

    /// Verify the checksum of every indexed record (a scrub); returns what failed.
    pub fn verify_all(&self) -> Vec<Corruption> {
        self.index
            .records()
            .filter_map(|id| {
                self.check_record(id, true)
                    .err()
                    .map(|reason| Corruption { record: id, reason })
            })
            .collect()
    }

    pub(super) fn get_id(&self, key: &[u8]) -> Option<u32> {
        let bytes = self.region.bytes();
        self.index
            .get(key, |r| record_key(bytes, &self.geometry, r))
    }

    pub(super) fn read_reply_record(
        &self,
        id: u32,
    ) -> Result<(Vec<u8>, Vec<u32>, u8), &'static str> {
        self.view().read_reply_record(id)
    }
}

/// Read access to the records of a region: what recovery, reads and checks share.
#[derive(Clone, Copy)]
pub(super) struct View<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) geometry: Geometry,
    /// Records of later epochs are not (yet) part of the store.
    pub(super) committed_epoch: u64,
}

impl<'a> View<'a> {
    pub(super) fn meta(&self, id: u32) -> Option<Meta> {
        let offset = self.geometry.record_offset(id);
        Meta::decode(self.bytes.get(offset..offset + META_LEN)?)
    }

    pub(super) fn id_in_range(&self, id: u32) -> bool {
        match self.geometry.engine {
            EngineKind::Packet => self.geometry.slot_of(id).is_some(),
            EngineKind::Conventional => id < self.geometry.granule_count(),
        }
    }

    /// The datagram stored in slot record `id`, by its metadata length.
    fn datagram(&self, id: u32, meta: &Meta) -> Option<&'a [u8]> {
        if meta.len as usize > self.geometry.slot_datagram_capacity() {
            return None;
        }
        let start = self.geometry.record_offset(id) + META_LEN;
        self.bytes.get(start..start + meta.len as usize)
    }

    /// The record ids of a packet chain, head first, with the datagrams; checks the metadata
    /// (own id, kind, epoch) of every member.
    fn packet_chain(
        &self,
        head: u32,
        kind: RecordKind,
    ) -> Result<Vec<(u32, &'a [u8])>, &'static str> {
        let mut chain = Vec::new();
        let mut id = head;
        loop {
            if !self.id_in_range(id) {
                return Err("link_out_of_range");
            }
            let meta = self.meta(id).ok_or("bad_metadata")?;
            if meta.self_id != id || meta.kind != kind {
                return Err("misplaced_record");
            }
            if meta.epoch > self.committed_epoch {
                return Err("uncommitted_record");
            }
            let datagram = self.datagram(id, &meta).ok_or("bad_length")?;
            chain.push((id, datagram));
            if chain.len() > usize::from(u16::MAX) {
                return Err("chain_too_long");
            }
            match id_of_link(meta.frag_next) {
                Some(next) => id = next,
                None => return Ok(chain),
            }
        }
    }

    /// Check record `id` as the index would hold it: its chain, its structure and (with
    /// `verify`) its checksums. Returns its key, session, seq and the ids it occupies.
    pub(super) fn check_record(
        &self,
        id: u32,
        verify: bool,
    ) -> Result<CheckedRecord<'a>, &'static str> {
        match self.geometry.engine {
            EngineKind::Packet => {
                let chain = self.packet_chain(id, RecordKind::Packet)?;
                let datagrams: Vec<&[u8]> = chain.iter().map(|(_, d)| *d).collect();
                let shape = inspect_request(&datagrams, verify, PacketType::UpdateRequest)?;
                if shape.op != OP_SET && shape.op != OP_DEL {
                    return Err("not_a_set_or_del_request");
                }
                Ok(CheckedRecord {
                    key: shape.key,
                    session_id: shape.session_id,
                    seq: shape.seq,
                    op: shape.op,
                    ids: chain.iter().map(|(id, _)| *id).collect(),
                    order: 0,
                    bytes: datagrams.iter().map(|d| d.len() as u64).sum(),
                })
            }
            EngineKind::Conventional => {
                if !self.id_in_range(id) {
                    return Err("link_out_of_range");
                }
                let meta = self.meta(id).ok_or("bad_metadata")?;
                if meta.self_id != id || meta.kind != RecordKind::Conventional {
                    return Err("misplaced_record");
                }
                if meta.epoch > self.committed_epoch {
                    return Err("uncommitted_record");
                }
                let body = self.conventional_body(id, &meta)?;
                let key_len = usize::from(u16_at(body, 12));
                let value_len = u32_at(body, 16) as usize;
                let op = body[14];
                if key_len == 0
                    || key_len > MAX_KEY_LEN
                    || CONVENTIONAL_HEADER_LEN + key_len + value_len != body.len()
                    || (op != CONVENTIONAL_OP_PUT && op != CONVENTIONAL_OP_DELETE)
                {
                    return Err("bad_structure");
                }
                if verify {
                    let crc = crc32c::crc32c_append(
                        crc32c::crc32c(&body[0..20]),
                        &body[CONVENTIONAL_HEADER_LEN..],
                    );
                    if crc != u32_at(body, 20) {
                        return Err("bad_checksum");
                    }
                }
                Ok(CheckedRecord {
                    key: &body[CONVENTIONAL_HEADER_LEN..CONVENTIONAL_HEADER_LEN + key_len],
                    session_id: u64_at(body, 0),
                    seq: u32_at(body, 8),
                    op: if op == CONVENTIONAL_OP_PUT {
                        OP_SET
                    } else {
                        OP_DEL
                    },
                    ids: vec![id],
                    order: meta.order,
                    bytes: body.len() as u64,
                })
            }
        }
    }

    fn conventional_body(&self, id: u32, meta: &Meta) -> Result<&'a [u8], &'static str> {
        if meta.order > crate::buddy::MAX_ORDER {
            return Err("bad_length");
        }
        let block_len = GRANULE << meta.order;
        if META_LEN + meta.len as usize > block_len
            || (meta.len as usize) < CONVENTIONAL_HEADER_LEN
            || id % (1 << meta.order) != 0
        {
            return Err("bad_length");
        }
        let start = self.geometry.record_offset(id) + META_LEN;
        self.bytes
            .get(start..start + meta.len as usize)
            .ok_or("bad_length")
    }

    /// The value of indexed record `id`, checksums verified.
    pub(super) fn value_of(&self, id: u32) -> Result<Value<'a>, Corruption> {
        let corrupt = |reason| Corruption { record: id, reason };
        match self.geometry.engine {
            EngineKind::Packet => {
                let chain = self.packet_chain(id, RecordKind::Packet).map_err(corrupt)?;
                let datagrams: Vec<&[u8]> = chain.iter().map(|(_, d)| *d).collect();
                let shape = inspect_request(&datagrams, true, PacketType::UpdateRequest)
                    .map_err(corrupt)?;
                if shape.op != OP_SET {
                    return Err(corrupt("not_a_set_request"));
                }
                let mut segments = Vec::with_capacity(datagrams.len());
                let value_start = HEADER_LEN + 7 + shape.key.len();
                segments.push(&datagrams[0][value_start..]);
                for datagram in &datagrams[1..] {
                    segments.push(&datagram[HEADER_LEN..]);
                }
                Ok(Value { segments })
            }
            EngineKind::Conventional => {
                let checked = self.check_record(id, true).map_err(corrupt)?;
                let meta = self.meta(id).ok_or(corrupt("bad_metadata"))?;
                let body = self.conventional_body(id, &meta).map_err(corrupt)?;
                let start = CONVENTIONAL_HEADER_LEN + checked.key.len();
                Ok(Value {
                    segments: vec![&body[start..]],
                })
            }
        }
    }

    /// The bytes of reply record `id`, verified; with the ids it occupies and its order.
    pub(super) fn read_reply_record(
        &self,
        id: u32,
    ) -> Result<(Vec<u8>, Vec<u32>, u8), &'static str> {
        match self.geometry.engine {
            EngineKind::Packet => {
                let chain = self.packet_chain(id, RecordKind::Reply)?;
                let datagrams: Vec<&[u8]> = chain.iter().map(|(_, d)| *d).collect();
                inspect_request(&datagrams, true, PacketType::ServerAck)?;
                let mut reply = Vec::new();
                for datagram in &datagrams {
                    reply.extend_from_slice(&datagram[HEADER_LEN..]);
                }
                Ok((reply, chain.iter().map(|(id, _)| *id).collect(), 0))
            }
            EngineKind::Conventional => {
                if !self.id_in_range(id) {
                    return Err("link_out_of_range");
                }
                let meta = self.meta(id).ok_or("bad_metadata")?;
                if meta.self_id != id || meta.kind != RecordKind::Reply {
                    return Err("misplaced_record");
                }
                let body = self.conventional_reply_body(id, &meta)?;
                let len = u32_at(body, 0) as usize;
                if 8 + len != body.len() {
                    return Err("bad_length");
                }
                if crc32c::crc32c(&body[8..]) != u32_at(body, 4) {
                    return Err("bad_checksum");
                }
                Ok((body[8..].to_vec(), vec![id], meta.order))
            }
        }
    }

    fn conventional_reply_body(&self, id: u32, meta: &Meta) -> Result<&'a [u8], &'static str> {
        let block_len = GRANULE << meta.order.min(crate::buddy::MAX_ORDER);
        if meta.order > crate::buddy::MAX_ORDER
            || META_LEN + meta.len as usize > block_len
            || (meta.len as usize) < 8
        {
            return Err("bad_length");
        }
        let start = self.geometry.record_offset(id) + META_LEN;
        self.bytes
            .get(start..start + meta.len as usize)
            .ok_or("bad_length")
    }
}

/// What [`View::check_record`] found.
#[derive(Debug)]
pub(super) struct CheckedRecord<'a> {
    pub(super) key: &'a [u8],
    pub(super) session_id: u64,
    pub(super) seq: u32,
    pub(super) op: u8,
    pub(super) ids: Vec<u32>,
    pub(super) order: u8,
    pub(super) bytes: u64,
}

/// Where a key is: in a received slot (resolved against the region when needed, so no borrow
/// of the region is held across writes) or in the caller's request bytes.
#[derive(Debug, Clone, Copy)]
pub(super) enum KeyAt<'k> {
    Slot {
        slot: u32,
        offset: usize,
        len: usize,
    },
    External(&'k [u8]),
}

impl<'k> KeyAt<'k> {
    pub(super) fn resolve<'a>(&self, bytes: &'a [u8], geometry: &Geometry) -> &'a [u8]
    where
        'k: 'a,
    {
        match *self {
            KeyAt::Slot { slot, offset, len } => {
                let start = geometry.record_offset(geometry.slot_id(slot)) + META_LEN + offset;
                bytes.get(start..start + len).unwrap_or(&[])
            }
            KeyAt::External(key) => key,
        }
    }
}

/// The key of indexed record `id` (validated when it was indexed; empty if the bytes are out
/// of range, which never panics).
pub(crate) fn record_key<'a>(bytes: &'a [u8], geometry: &Geometry, id: u32) -> &'a [u8] {
    let start = geometry.record_offset(id) + META_LEN;
    let read = || -> Option<&'a [u8]> {
        match geometry.engine {
            EngineKind::Packet => {
                let payload = start + HEADER_LEN;
                let len_bytes = bytes.get(payload + 1..payload + 3)?;
                let len = usize::from(u16::from_le_bytes([len_bytes[0], len_bytes[1]]));
                bytes.get(payload + 3..payload + 3 + len)
            }
            EngineKind::Conventional => {
                let len_bytes = bytes.get(start + 12..start + 14)?;
                let len = usize::from(u16::from_le_bytes([len_bytes[0], len_bytes[1]]));
                let key = start + CONVENTIONAL_HEADER_LEN;
                bytes.get(key..key + len)
            }
        }
    };
    read().unwrap_or(&[])
}
