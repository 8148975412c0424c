//! The allocation state: what the store keeps to hand out space. Free slots (packet engine)
//! or buddy blocks (conventional engine), the reserves kept for deletes and for the store's
//! own writes, the slots lent for receiving, each slot's place in its record's chain, and the
//! records freed by batches, waiting for a later commit to be reused.

use std::collections::HashSet;

use pmnet_store::codec::MAX_KEY_LEN;

use super::id_bits::IdBits;
use super::view::View;
use super::Corruption;
use crate::buddy::{order_for, Buddy};
use crate::layout::*;

const CHAIN_UNKNOWN: u32 = u32::MAX;
const CHAIN_END: u32 = u32::MAX - 1;

/// Where a store's free space is and what it has handed out. Only DRAM: recovery rebuilds it
/// from the records ([`Space::rebuild`]).
pub(super) struct Space {
    geometry: Geometry,
    free_slots: Vec<u32>,
    /// Packet engine, by slot: the record id of the next fragment in the slot's chain,
    /// `CHAIN_END` for the last fragment, or `CHAIN_UNKNOWN` (free, or recovered: read the
    /// metadata line). Freeing a record walks this instead of its metadata lines in PM.
    chain_next: Vec<u32>,
    /// Packet engine: records known to be one datagram, one bit per record id (their
    /// `chain_next` stays `CHAIN_UNKNOWN`). Freeing one tests a bit of a small bitmap instead
    /// of reading a random entry of `chain_next`, which a stream of writes keeps out of cache.
    one_datagram: IdBits,
    buddy: Option<Buddy>,
    /// Records freed by a batch, reusable once a later batch committed: (epoch, record id).
    limbo: Vec<(u64, u32)>,
    /// Lent receive slots.
    loans: Loans,
    receive_reserve: usize,
    /// Packet engine: free slots only deletes may take (see
    /// [`Store::delete_reserve_slots`](crate::Store::delete_reserve_slots)).
    delete_reserve: usize,
    /// Conventional engine: a free block of `delete_block_order`, held out of the allocator
    /// for deletes; taken again before the next data allocation.
    delete_block: Option<u32>,
    delete_block_order: u8,
}

impl Space {
    /// Nothing free yet: [`Space::rebuild`] finds the free space.
    pub(super) fn new(geometry: Geometry) -> Space {
        Space {
            geometry,
            free_slots: Vec::new(),
            // No slots (so nothing) in the conventional engine.
            chain_next: vec![CHAIN_UNKNOWN; geometry.slot_count as usize],
            // A bit per slot; none in the conventional engine.
            one_datagram: IdBits::new(
                geometry
                    .slot_count
                    .saturating_mul(geometry.granules_per_slot()),
                geometry.granules_per_slot(),
            ),
            buddy: None,
            limbo: Vec::new(),
            loans: Loans::new(geometry.slot_count),
            receive_reserve: 0,
            delete_reserve: 0,
            delete_block: None,
            delete_block_order: 0,
        }
    }

    // ----- how much -----

    /// Free space for new records, in bytes (the delete reserve included).
    pub(super) fn free_bytes(&self) -> u64 {
        match &self.buddy {
            Some(buddy) => {
                let held = self.delete_block.map_or(0, |_| self.delete_block_len());
                buddy.free_bytes() + held
            }
            None => self.free_slots.len() as u64 * u64::from(self.geometry.slot_size),
        }
    }

    /// Packet engine: free slots.
    pub(super) fn free_slot_count(&self) -> usize {
        self.free_slots.len()
    }

    /// Packet engine: the free slots only a DEL may take.
    pub(super) fn delete_reserve_slots(&self) -> usize {
        self.delete_reserve
    }

    /// Conventional engine: the bytes of the block held for deletes.
    pub(super) fn delete_block_len(&self) -> u64 {
        (GRANULE as u64) << self.delete_block_order
    }

    /// Records freed by batches and waiting for a later commit.
    pub(super) fn limbo_count(&self) -> usize {
        self.limbo.len()
    }

    // ----- receive loans (packet engine) -----

    /// Lend a free slot for receiving into, unless free slots are down to the receive reserve
    /// (kept for records the store writes itself).
    pub(super) fn lend_slot(&mut self) -> Option<u32> {
        if self.free_slots.len() <= self.receive_reserve {
            return None;
        }
        let slot = self.free_slots.pop()?;
        self.loans.lend(slot);
        Some(slot)
    }

    pub(super) fn is_lent(&self, slot: u32) -> bool {
        self.loans.is_lent(slot)
    }

    /// Record that lent `slot` received `len` bytes at `receive_time_ns`.
    pub(super) fn note_received(&mut self, slot: u32, len: u32, receive_time_ns: u64) {
        if let Some(loan) = self.loans.entry_mut(slot) {
            *loan = (len, receive_time_ns);
        }
    }

    /// (length, receive time) of what lent `slot` received.
    pub(super) fn received(&self, slot: u32) -> Option<(u32, u64)> {
        self.loans.received(slot)
    }

    /// End the loan of `slot`, which becomes part of a record: (length, receive time) of
    /// what it received.
    pub(super) fn end_loan(&mut self, slot: u32) -> Option<(u32, u64)> {
        self.loans.take(slot)
    }

    /// Give a lent slot back to the free slots.
    pub(super) fn release(&mut self, slot: u32) {
        if self.loans.take(slot).is_some() {
            self.free_slots.push(slot);
        }
    }

    /// Slots lent and not yet returned.
    pub(super) fn lent_count(&self) -> usize {
        self.loans.count
    }

    // ----- taking space -----

    /// Packet engine: whether `count` free slots may be taken for `purpose` now: data stops
    /// short of the delete reserve, a delete may use it.
    pub(super) fn slots_fit(&self, count: usize, purpose: Purpose) -> bool {
        let floor = match purpose {
            Purpose::Data => self.delete_reserve,
            Purpose::Delete => 0,
        };
        count + floor <= self.free_slots.len()
    }

    /// Packet engine: take a free slot.
    pub(super) fn take_slot(&mut self) -> Option<u32> {
        self.free_slots.pop()
    }

    /// Conventional engine: a block of at least `order` for `purpose`, with the order it was
    /// taken at. Data first makes sure the delete block is held (and is refused if no block of
    /// its size is free); a delete takes the delete block, whole, when nothing else fits.
    pub(super) fn take_block(&mut self, order: u8, purpose: Purpose) -> Option<(u32, u8)> {
        let buddy = self.buddy.as_mut()?;
        match purpose {
            Purpose::Data => {
                if self.delete_block.is_none() {
                    self.delete_block = Some(buddy.alloc(self.delete_block_order)?);
                }
                buddy.alloc(order).map(|id| (id, order))
            }
            Purpose::Delete => buddy.alloc(order).map(|id| (id, order)).or_else(|| {
                // The record names the block's whole order, so freeing it frees all of it.
                let reserve_order = self.delete_block_order;
                if order > reserve_order {
                    return None;
                }
                self.delete_block.take().map(|id| (id, reserve_order))
            }),
        }
    }

    /// Packet engine: remember that `slots` hold one record's chain, in this order.
    pub(super) fn note_chain(&mut self, slots: &[u32]) {
        if let [slot] = slots {
            // One datagram: a bit, and `chain_next` stays unknown.
            self.one_datagram.set(self.geometry.slot_id(*slot));
            return;
        }
        for (index, &slot) in slots.iter().enumerate() {
            let next = slots
                .get(index + 1)
                .map_or(CHAIN_END, |&next| self.geometry.slot_id(next));
            if let Some(entry) = self.chain_next.get_mut(slot as usize) {
                *entry = next;
            }
        }
    }

    // ----- freeing -----

    /// Record `id` was freed by the batch of `epoch`: reusable once a later batch commits.
    pub(super) fn free_after(&mut self, epoch: u64, id: u32) {
        self.limbo.push((epoch, id));
    }

    /// Batch `epoch` committed: free the records that earlier batches freed. Returns how many.
    pub(super) fn free_limbo_before(&mut self, epoch: u64, view: &View<'_>) -> u64 {
        let mut freed = 0;
        let mut index = 0;
        while index < self.limbo.len() {
            if self.limbo[index].0 < epoch {
                let (_, id) = self.limbo.swap_remove(index);
                self.free_record(id, view);
                freed += 1;
            } else {
                index += 1;
            }
        }
        freed
    }

    /// Return record `id`'s space (all of its chain) to the allocator.
    fn free_record(&mut self, id: u32, view: &View<'_>) {
        match self.geometry.engine {
            EngineKind::Packet => {
                if self.one_datagram.get(id) {
                    self.one_datagram.clear(id);
                    if let Some(slot) = self.geometry.slot_of(id) {
                        self.free_slots.push(slot);
                    }
                    return;
                }
                let mut next = Some(id);
                let mut guard = 0usize;
                while let Some(id) = next {
                    guard += 1;
                    let Some(slot) = self.geometry.slot_of(id) else {
                        break;
                    };
                    if guard > self.geometry.slot_count as usize {
                        break;
                    }
                    let known =
                        std::mem::replace(&mut self.chain_next[slot as usize], CHAIN_UNKNOWN);
                    next = match known {
                        CHAIN_END => None,
                        CHAIN_UNKNOWN => view.meta(id).and_then(|meta| {
                            (meta.self_id == id)
                                .then_some(meta.frag_next)
                                .and_then(id_of_link)
                        }),
                        next => Some(next),
                    };
                    self.free_slots.push(slot);
                }
            }
            EngineKind::Conventional => {
                if let (Some(meta), Some(buddy)) = (view.meta(id), self.buddy.as_mut()) {
                    if meta.self_id == id {
                        buddy.free(id, meta.order);
                    }
                }
            }
        }
    }

    // ----- recovery -----

    /// Recovery: the space of `allocated` (slots, or `(id, order)` blocks) is taken, the rest
    /// free; sets the reserves. Blocks that overlap go to `corrupt`.
    pub(super) fn rebuild(&mut self, mut allocated: Vec<(u32, u8)>, corrupt: &mut Vec<Corruption>) {
        match self.geometry.engine {
            EngineKind::Packet => {
                let mut used = vec![false; self.geometry.slot_count as usize];
                for (id, _) in &allocated {
                    if let Some(slot) = self.geometry.slot_of(*id) {
                        used[slot as usize] = true;
                    }
                }
                self.free_slots = (0..self.geometry.slot_count)
                    .rev()
                    .filter(|slot| !used[*slot as usize])
                    .collect();
                // The longest DEL, once per request of a batch, at most 1/64 of the slots.
                let longest_delete =
                    (3 + MAX_KEY_LEN).div_ceil(self.geometry.slot_payload_capacity());
                let deletes = (self.geometry.slot_count as usize / 64).clamp(1, MAX_BATCH_OPS);
                self.delete_reserve = longest_delete * deletes;
                // Loans stop above the delete reserve: a received SET must not take it.
                self.receive_reserve = (self.geometry.slot_count as usize / 16)
                    .max(4)
                    .max(self.delete_reserve);
            }
            EngineKind::Conventional => {
                let mut buddy = Buddy::new(self.geometry.granule_count());
                allocated.sort_unstable();
                allocated.dedup();
                for (id, order) in &allocated {
                    if !buddy.reserve(*id, *order) {
                        corrupt.push(Corruption {
                            record: *id,
                            reason: "overlaps another live block",
                        });
                    }
                }
                // A block for the longest DEL record (no larger than the heap), held for
                // deletes; if none is free now, data is refused until one is.
                let longest_delete = order_for(META_LEN + CONVENTIONAL_HEADER_LEN + MAX_KEY_LEN)
                    .expect("a DEL record fits the largest block");
                let largest_block = (31 - self.geometry.granule_count().leading_zeros()) as u8;
                self.delete_block_order = longest_delete
                    .min(largest_block)
                    .min(crate::buddy::MAX_ORDER);
                self.delete_block = buddy.alloc(self.delete_block_order);
                self.buddy = Some(buddy);
            }
        }
        self.limbo.sort_unstable();
        self.limbo.dedup();
    }

    /// Recovery: records that redo found live after all are not to be freed.
    pub(super) fn keep_live(&mut self, live: &HashSet<u32>) {
        self.limbo.retain(|(_, id)| !live.contains(id));
    }

    /// Recovery: the records waiting to be reused.
    pub(super) fn limbo_ids(&self) -> HashSet<u32> {
        self.limbo.iter().map(|(_, id)| *id).collect()
    }

    /// The space's part of [`Store::check_invariants`](crate::Store::check_invariants), between
    /// batches: every record older batches freed is free now (the limbo holds only the last
    /// committed batch's), and the free space, the lent slots and the records (`held`, the
    /// records the store references, and the limbo's) cover the data area exactly once, so
    /// nothing leaked and nothing is handed out twice. Reads only the metadata lines of
    /// chains and blocks whose length DRAM does not know (recovered records).
    #[cfg(any(test, debug_assertions))]
    pub(super) fn check(
        &self,
        held: &[u32],
        committed_epoch: u64,
        view: &View<'_>,
    ) -> Result<(), String> {
        let mut records = held.to_vec();
        for &(epoch, id) in &self.limbo {
            if epoch != committed_epoch {
                return Err(format!(
                    "record {id} freed by batch {epoch} is still in limbo after batch \
                     {committed_epoch} committed"
                ));
            }
            records.push(id);
        }
        match self.geometry.engine {
            EngineKind::Packet => self.check_slots_cover(&records, view),
            EngineKind::Conventional => self.check_blocks_cover(&records, view),
        }
    }

    /// Packet engine: each slot is free, lent or in exactly one of `records`' chains.
    #[cfg(any(test, debug_assertions))]
    fn check_slots_cover(&self, records: &[u32], view: &View<'_>) -> Result<(), String> {
        #[derive(Clone, Copy, Debug, PartialEq)]
        enum Holder {
            Nobody,
            Free,
            Lent,
            Record(u32),
        }
        let slot_count = self.geometry.slot_count as usize;
        let mut holders = vec![Holder::Nobody; slot_count];
        let mut take = |slot: u32, holder: Holder| match holders.get_mut(slot as usize) {
            None => Err(format!("{holder:?} names slot {slot}, past the last")),
            Some(Holder::Nobody) => {
                holders[slot as usize] = holder;
                Ok(())
            }
            Some(earlier) => Err(format!("slot {slot} is both {earlier:?} and {holder:?}")),
        };
        for &slot in &self.free_slots {
            take(slot, Holder::Free)?;
            if self.chain_next[slot as usize] != CHAIN_UNKNOWN {
                return Err(format!("free slot {slot} still has a chain link"));
            }
            if self.one_datagram.get(self.geometry.slot_id(slot)) {
                return Err(format!("free slot {slot} is still marked one datagram"));
            }
        }
        let mut lent = 0;
        for (slot, entry) in self.loans.entries.iter().enumerate() {
            if entry.0 != NOT_LENT {
                take(slot as u32, Holder::Lent)?;
                lent += 1;
            }
        }
        if lent != self.loans.count {
            return Err(format!(
                "{lent} slots are lent, the loans count {}",
                self.loans.count
            ));
        }
        for &head in records {
            let mut id = head;
            loop {
                let slot = self
                    .geometry
                    .slot_of(id)
                    .ok_or_else(|| format!("record {head}: {id} does not start a slot"))?;
                take(slot, Holder::Record(head))?;
                if self.one_datagram.get(id) {
                    if id != head || self.chain_next[slot as usize] != CHAIN_UNKNOWN {
                        return Err(format!(
                            "record {head}: {id} is marked one datagram but is in a chain"
                        ));
                    }
                    break;
                }
                let next =
                    match self.chain_next[slot as usize] {
                        CHAIN_END => None,
                        CHAIN_UNKNOWN => {
                            let meta = view.meta(id).filter(|meta| meta.self_id == id).ok_or_else(
                                || format!("record {head}: {id} has no metadata naming it"),
                            )?;
                            id_of_link(meta.frag_next)
                        }
                        next => Some(next),
                    };
                match next {
                    Some(next) => id = next,
                    None => break,
                }
            }
        }
        match holders.iter().position(|holder| *holder == Holder::Nobody) {
            Some(slot) => Err(format!(
                "slot {slot} is neither free, lent nor part of a record: leaked"
            )),
            None => Ok(()),
        }
    }

    /// Conventional engine: the buddy's free blocks, the delete block and `records`' blocks
    /// tile the heap.
    #[cfg(any(test, debug_assertions))]
    fn check_blocks_cover(&self, records: &[u32], view: &View<'_>) -> Result<(), String> {
        let buddy = self
            .buddy
            .as_ref()
            .ok_or("the conventional engine has no buddy")?;
        buddy.check()?;
        // (first granule, order, what)
        let mut blocks: Vec<(u32, u8, String)> = buddy
            .free_blocks()
            .map(|(id, order)| (id, order, "free".to_owned()))
            .collect();
        if let Some(id) = self.delete_block {
            blocks.push((id, self.delete_block_order, "the delete block".to_owned()));
        }
        for &id in records {
            let meta = view
                .meta(id)
                .filter(|meta| meta.self_id == id)
                .ok_or_else(|| format!("record {id} has no metadata naming it"))?;
            blocks.push((id, meta.order, format!("record {id}")));
        }
        blocks.sort_unstable_by_key(|block| block.0);
        let mut end = 0u64;
        let mut previous = "the heap's start";
        for (id, order, what) in &blocks {
            if u64::from(*id) < end {
                return Err(format!("{what} overlaps {previous}"));
            }
            if u64::from(*id) > end {
                return Err(format!(
                    "granules {end}..{id} are neither free nor part of a record: leaked"
                ));
            }
            end = u64::from(*id) + (1u64 << order);
            previous = what;
        }
        if end != u64::from(self.geometry.granule_count()) {
            return Err(format!(
                "the blocks end at granule {end}, the heap at {}",
                self.geometry.granule_count()
            ));
        }
        Ok(())
    }

    /// Test invariant (packet engine): no free slot is part of a live record, and what the
    /// chain links and one-datagram bits say agrees with `records` (each live record's head
    /// and the ids of its chain, as the metadata lines in PM say).
    #[cfg(test)]
    pub(super) fn check_slots(&self, records: &[(u32, Vec<u32>)]) -> Result<(), String> {
        let free: std::collections::HashSet<u32> = self.free_slots.iter().copied().collect();
        for (id, members) in records {
            for (position, &member) in members.iter().enumerate() {
                let slot = self.geometry.slot_of(member).unwrap_or(u32::MAX);
                if free.contains(&slot) {
                    return Err(format!(
                        "slot of live record {member} (head {id}) is free; limbo {:?}",
                        self.limbo
                    ));
                }
                if self.one_datagram.get(member) && (position != 0 || members.len() != 1) {
                    return Err(format!(
                        "record {id}: {member} is marked one datagram in a chain of {}",
                        members.len()
                    ));
                }
                let known = self.chain_next.get(slot as usize).copied();
                let expected = members.get(position + 1).copied().unwrap_or(CHAIN_END);
                if known != Some(CHAIN_UNKNOWN) && known != Some(expected) {
                    return Err(format!(
                        "record {id}: DRAM chain says {known:?} after {member}, PM says {expected}"
                    ));
                }
            }
        }
        for &slot in &self.free_slots {
            if self.chain_next.get(slot as usize) != Some(&CHAIN_UNKNOWN) {
                return Err(format!("free slot {slot} still has a chain link"));
            }
            if self.one_datagram.get(self.geometry.slot_id(slot)) {
                return Err(format!("free slot {slot} is still marked one datagram"));
            }
        }
        Ok(())
    }
}

/// The receive slots lent out, by slot number: what each received. An array, not a map: a loan
/// is looked up for every received datagram.
#[derive(Debug, Default)]
struct Loans {
    /// Per slot: (`NOT_LENT`, `AWAITING` or the received length; receive time).
    entries: Vec<(u32, u64)>,
    count: usize,
}

const NOT_LENT: u32 = u32::MAX;
const AWAITING: u32 = u32::MAX - 1;

impl Loans {
    fn new(slot_count: u32) -> Loans {
        Loans {
            entries: vec![(NOT_LENT, 0); slot_count as usize],
            count: 0,
        }
    }

    fn lend(&mut self, slot: u32) {
        if let Some(entry) = self.entries.get_mut(slot as usize) {
            if entry.0 == NOT_LENT {
                self.count += 1;
            }
            *entry = (AWAITING, 0);
        }
    }

    fn is_lent(&self, slot: u32) -> bool {
        self.entries
            .get(slot as usize)
            .is_some_and(|entry| entry.0 != NOT_LENT)
    }

    /// A lent slot's entry, to record what it received.
    fn entry_mut(&mut self, slot: u32) -> Option<&mut (u32, u64)> {
        self.entries
            .get_mut(slot as usize)
            .filter(|entry| entry.0 != NOT_LENT)
    }

    /// (length, receive time) of what lent `slot` received.
    fn received(&self, slot: u32) -> Option<(u32, u64)> {
        self.entries
            .get(slot as usize)
            .copied()
            .filter(|entry| entry.0 != NOT_LENT && entry.0 != AWAITING)
    }

    /// End the loan of `slot`; its entry (`AWAITING` as the length if nothing was received).
    fn take(&mut self, slot: u32) -> Option<(u32, u64)> {
        let entry = self.entries.get_mut(slot as usize)?;
        if entry.0 == NOT_LENT {
            return None;
        }
        self.count -= 1;
        Some(std::mem::replace(entry, (NOT_LENT, 0)))
    }
}

/// What space is taken for. Data may not use the delete reserve; a delete, which frees at
/// least as much as it takes, may (see
/// [`Store::delete_reserve_slots`](crate::Store::delete_reserve_slots)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    Data,
    Delete,
}
