//! The receive path (packet engine): free slots lent for receiving datagrams straight into
//! them, and received datagrams staged as records where they landed.

use pmnet_pm::PmRegion;
use pmnet_store::NoSpace;
use pmnet_wire::{PacketType, HEADER_LEN};

use super::view::{inspect_request, KeyAt};
use super::{Pending, ReceiveReject, ReceiveSlot, Store, OP_DEL, OP_SET};
use crate::breakdown::Phase;
use crate::layout::*;

impl<R: PmRegion> Store<R> {
    /// Lend up to `want` free slots for receiving datagrams straight into them. A lent slot
    /// belongs to the caller until [`Store::stage_received`] turns it into a record or
    /// [`Store::release_slot`] gives it back; a slot holding a live record is never lent.
    /// Lends nothing for the conventional engine or when free slots run low (the reserve is
    /// kept for records the store writes itself).
    pub fn lend_receive_slots(&mut self, want: usize, out: &mut Vec<ReceiveSlot>) {
        out.clear();
        self.top_up_receive_slots(want, out);
    }

    /// Lend more free slots until `ring` holds `want` (a receive ring: slots stay lent across
    /// receive calls, and only those that received a datagram are replaced).
    pub fn top_up_receive_slots(&mut self, want: usize, ring: &mut Vec<ReceiveSlot>) {
        let out = ring;
        if self.geometry.engine != EngineKind::Packet {
            return;
        }
        while out.len() < want {
            let Some(slot) = self.space.lend_slot() else {
                break;
            };
            out.push(self.receive_slot(slot));
        }
    }

    fn receive_slot(&self, slot: u32) -> ReceiveSlot {
        let id = self.geometry.slot_id(slot);
        ReceiveSlot {
            slot,
            offset: self.geometry.record_offset(id) + META_LEN,
            capacity: self.geometry.slot_datagram_capacity(),
        }
    }

    /// Record that `len` bytes were received into lent `slot` at `receive_time_ns`. Rejects
    /// (with a reason, keeping the slot lent) a slot not lent or a length that does not fit.
    pub fn on_slot_received(
        &mut self,
        slot: u32,
        len: usize,
        receive_time_ns: u64,
    ) -> Result<(), ReceiveReject> {
        let capacity = self.geometry.slot_datagram_capacity();
        if !self.space.is_lent(slot) {
            return Err(ReceiveReject {
                reason: "slot_not_lent",
            });
        }
        if len > capacity || len < HEADER_LEN {
            self.stats.receive_rejects += 1;
            return Err(ReceiveReject {
                reason: if len < HEADER_LEN {
                    "truncated"
                } else {
                    "larger_than_slot"
                },
            });
        }
        self.space.note_received(slot, len as u32, receive_time_ns);
        Ok(())
    }

    /// Copy `datagram` into lent `slot` as a receive would (tests, the simulator, and regions
    /// the kernel cannot write into), then [`Store::on_slot_received`].
    pub fn write_received(
        &mut self,
        slot: u32,
        datagram: &[u8],
        receive_time_ns: u64,
    ) -> Result<(), ReceiveReject> {
        if !self.space.is_lent(slot) {
            return Err(ReceiveReject {
                reason: "slot_not_lent",
            });
        }
        if datagram.len() > self.geometry.slot_datagram_capacity() {
            self.stats.receive_rejects += 1;
            return Err(ReceiveReject {
                reason: "larger_than_slot",
            });
        }
        let offset = self.receive_slot(slot).offset;
        self.region.write(offset, datagram);
        self.on_slot_received(slot, datagram.len(), receive_time_ns)
    }

    /// The datagram received into lent `slot`.
    pub fn received_datagram(&self, slot: u32) -> Option<&[u8]> {
        let (len, _) = self.space.received(slot)?;
        let offset = self.receive_slot(slot).offset;
        self.region.bytes().get(offset..offset + len as usize)
    }

    /// The one full check of a received datagram (length, magic, version, CRC32C, type,
    /// fragment fields), for callers whose protocol layer does not check it already.
    pub fn check_received(&self, slot: u32) -> Result<pmnet_wire::Header, &'static str> {
        let datagram = self.received_datagram(slot).ok_or("nothing_received")?;
        pmnet_wire::Header::parse(datagram)
            .map(|(header, _)| header)
            .map_err(|error| error.reason())
    }

    /// The region, for the receiver to build iovecs into lent slots.
    pub(crate) fn region_for_receive(&mut self) -> &mut R {
        &mut self.region
    }

    /// The first `len` bytes of lent `slot`'s datagram area.
    pub(crate) fn slot_bytes(&self, slot: u32, len: usize) -> &[u8] {
        let area = self.receive_slot(slot);
        let len = len.min(area.capacity);
        self.region
            .bytes()
            .get(area.offset..area.offset + len)
            .unwrap_or(&[])
    }

    /// Give a lent slot back.
    pub fn release_slot(&mut self, slot: u32) {
        self.space.release(slot);
    }

    /// Slots lent and not yet returned.
    pub fn lent_slot_count(&self) -> usize {
        self.space.lent_count()
    }

    /// Apply request `seq` of `session_id` whose datagrams (one per fragment, in order) were
    /// received into lent `slots` and **checked on receipt** (CRC included: the protocol layer
    /// or [`Store::check_received`] did it; this does not compute it again). A SET or DEL
    /// becomes a record in place; any other request is applied from a copy of its bytes and
    /// the slots go back. Durable at the next [`Store::commit`]; returns the reply.
    ///
    /// `Ok(Err(NoSpace))`: an INCR or APPEND received in slots found no room (see
    /// [`Store::stage_request`]); nothing of it was staged, and its slots went back to the free
    /// pool (they would not have been its record): retry it from its bytes. A SET or DEL
    /// received in place never gets it: its record is the slots it arrived in.
    ///
    /// On `Err` nothing was applied and the slots were released: apply the request from its
    /// bytes with [`Store::stage_request`].
    pub fn stage_received(
        &mut self,
        session_id: u64,
        seq: u32,
        slots: &[u32],
    ) -> Result<Result<Vec<u8>, NoSpace>, ReceiveReject> {
        self.start_timing();
        let outcome = self.inspect_received(session_id, seq, slots);
        let shape = match outcome {
            Ok(shape) => shape,
            Err(reason) => {
                for &slot in slots {
                    self.release_slot(slot);
                }
                self.stats.receive_rejects += 1;
                return Err(ReceiveReject { reason });
            }
        };
        let (op, key_range) = shape;
        if op != OP_SET && op != OP_DEL {
            // GET, INCR, APPEND and the rest: their record (if any) is not this packet.
            return Ok(self.stage_received_copy(session_id, seq, slots));
        }
        // Its own slots hold it: no room to find.
        self.begin_op();
        let pending = self.chain_received(slots);
        let key = key_range;
        let reply = if op == OP_SET {
            self.link_record(session_id, seq, key, pending)
        } else {
            self.delete_with_record(session_id, seq, key, Some(pending))
        };
        Ok(Ok(reply))
    }

    /// A request received into `slots` that does not become a record in place: apply it from
    /// a copy of its bytes, and give the slots back.
    fn stage_received_copy(
        &mut self,
        session_id: u64,
        seq: u32,
        slots: &[u32],
    ) -> Result<Vec<u8>, NoSpace> {
        let mut request = std::mem::take(&mut self.scratch);
        request.clear();
        for &slot in slots {
            if let Some(datagram) = self.received_datagram(slot) {
                request.extend_from_slice(&datagram[HEADER_LEN..]);
            }
        }
        for &slot in slots {
            self.release_slot(slot);
        }
        let reply = self.stage_request_inner(session_id, seq, &request);
        self.scratch = request;
        reply
    }

    /// Make lent `slots`, which received one request's datagrams in order, the chain of one
    /// record: the metadata of every fragment but the head written and flushed now; the
    /// head's returned, to be written once its place in the index is known.
    fn chain_received(&mut self, slots: &[u32]) -> Pending {
        let epoch = self.batch_epoch();
        let mut head_meta = None;
        // Lengths of the fragments after the first (no allocation for one datagram).
        let mut tail_lens: Vec<u32> = Vec::new();
        for (index, &slot) in slots.iter().enumerate() {
            let (len, time) = self.space.end_loan(slot).unwrap_or((0, 0));
            if index > 0 {
                tail_lens.push(len);
            }
            let id = self.geometry.slot_id(slot);
            let next = slots
                .get(index + 1)
                .map(|next| self.geometry.slot_id(*next));
            let meta = Meta {
                next0: 0,
                frag_next: link_of(next),
                epoch,
                receive_time_ns: time,
                len,
                kind: RecordKind::Packet,
                order: 0,
                reply_style: ReplyStyle::Ok,
                self_id: id,
            };
            if index == 0 {
                head_meta = Some(meta);
            } else {
                self.region
                    .write(self.geometry.record_offset(id), &meta.encode());
            }
        }
        self.space.note_chain(slots);
        self.mark(Phase::Allocate);
        for (index, &slot) in slots.iter().enumerate() {
            let offset = self.receive_slot(slot).offset;
            let len = match index {
                0 => head_meta.map_or(0, |meta| meta.len as usize),
                _ => tail_lens[index - 1] as usize,
            };
            if index > 0 {
                self.region.flush(offset - META_LEN, META_LEN + len);
            }
        }
        self.stats.records_received_in_place += 1;
        self.mark(Phase::Persist);
        let head_id = self.geometry.slot_id(slots[0]);
        let head_meta = head_meta.expect("at least one slot");
        Pending {
            id: head_id,
            meta: head_meta,
            unflushed: head_meta.len,
        }
    }

    /// Check lent `slots` hold request `seq` of `session_id`; returns its op and key location.
    fn inspect_received(
        &mut self,
        session_id: u64,
        seq: u32,
        slots: &[u32],
    ) -> Result<(u8, KeyAt<'static>), &'static str> {
        if self.geometry.engine != EngineKind::Packet {
            return Err("not_a_packet_store");
        }
        let single;
        let mut several = Vec::new();
        let datagrams: &[&[u8]] = if let [slot] = slots {
            single = [self.received_datagram(*slot).ok_or("slot_not_received")?];
            &single
        } else {
            for (index, &slot) in slots.iter().enumerate() {
                if slots[..index].contains(&slot) {
                    return Err("slot_given_twice");
                }
                several.push(self.received_datagram(slot).ok_or("slot_not_received")?);
            }
            &several
        };
        let shape = inspect_request(datagrams, false, PacketType::UpdateRequest)?;
        if shape.session_id != session_id || shape.seq != seq {
            return Err("slots_hold_another_request");
        }
        let key = KeyAt::Slot {
            slot: slots[0],
            offset: HEADER_LEN + 3,
            len: shape.key.len(),
        };
        let op = shape.op;
        self.mark(Phase::Prepare);
        Ok((op, key))
    }
}
