//! Batches and the commit: making room in a batch, committing early to reuse freed space,
//! and the commit protocol of the module documentation.

use pmnet_pm::PmRegion;

use super::space::{CHAIN_END, CHAIN_UNKNOWN};
use super::{OpMark, Store};
use crate::breakdown::Phase;
use crate::layout::*;

impl<R: PmRegion> Store<R> {
    pub(super) fn batch_epoch(&self) -> u64 {
        self.committed_epoch + 1
    }

    /// Before staging a request: make room in the batch.
    pub(super) fn begin_op(&mut self) -> OpMark {
        if self.batch.ops.len() >= MAX_BATCH_OPS {
            // Committing early only makes earlier requests durable sooner.
            self.commit();
        }
        let mark = OpMark {
            epoch: self.committed_epoch,
            wrote: self.batch.wrote,
        };
        self.batch.wrote = true;
        self.stats.requests += 1;
        self.activity += 1;
        mark
    }

    /// A request begun at `mark` found no room before it staged anything: undo
    /// [`Store::begin_op`], so the store is as if it had never been asked.
    pub(super) fn cancel_op(&mut self, mark: OpMark) {
        if self.committed_epoch == mark.epoch {
            self.batch.wrote = mark.wrote;
        }
        self.stats.requests -= 1;
        self.activity -= 1;
        self.stats.no_space += 1;
    }

    /// Make the records that batches freed reusable: records freed by a committed batch are
    /// free once a later batch commits, and this batch's once the one after it does. So at
    /// most two commits, empty or not (committing early only makes the requests staged so far
    /// durable sooner). False when nothing waits to be freed.
    pub(super) fn reclaim(&mut self) -> bool {
        if self.limbo.is_empty() && self.batch.freed.is_empty() {
            return false;
        }
        for _ in 0..2 {
            if self.limbo.is_empty() && self.batch.freed.is_empty() {
                break;
            }
            // An empty batch commits too: its intent block supersedes the one that named
            // the freed records, and its first fence makes their unlinking durable.
            self.batch.wrote = true;
            self.commit();
            self.stats.reclaim_commits += 1;
        }
        true
    }

    /// Make everything staged since the last commit durable (see the module doc). Replies
    /// of staged requests may be sent once this returns.
    pub fn commit(&mut self) {
        if !self.batch.wrote {
            return;
        }
        let epoch = self.batch_epoch();
        let mut intent = std::mem::take(&mut self.scratch);
        encode_intent(epoch, &self.batch.ops, &mut intent);
        let offset = intent_offset(epoch);
        self.region.write(offset, &intent);
        self.region.flush(offset, intent.len());
        self.scratch = intent;
        self.region.fence();
        self.region.write(COMMIT_OFFSET, &epoch.to_le_bytes());
        self.region.persist(COMMIT_OFFSET, 8);
        self.stats.fences += 2;
        self.committed_epoch = epoch;
        // The breakdown charges each part of the commit to its phase: collecting the changed
        // links is index work, returning buffers is the allocator's.
        self.mark(Phase::Persist);
        // Level-0 links: durable by the next batch's first fence, redone until then.
        let mut links = std::mem::take(&mut self.links);
        self.index.take_dirty(&mut links);
        self.mark(Phase::Insert);
        for link in &links {
            let at = match link.from {
                None => HEAD_OFFSET,
                Some(id) => self.geometry.record_offset(id) + META_NEXT0,
            };
            self.region.write(at, &link_of(link.to).to_le_bytes());
            self.region.flush(at, 4);
        }
        self.links = links;
        self.mark(Phase::Persist);
        // Records freed by earlier batches are reusable now; this batch's after the next.
        let mut index = 0;
        while index < self.limbo.len() {
            if self.limbo[index].0 < epoch {
                let (_, id) = self.limbo.swap_remove(index);
                self.free_record(id);
            } else {
                index += 1;
            }
        }
        for id in self.batch.freed.drain(..) {
            self.limbo.push((epoch, id));
        }
        self.batch.ops.clear();
        self.batch.wrote = false;
        self.stats.batches += 1;
        self.mark(Phase::Allocate);
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

    /// Return record `id`'s space (all of its chain) to the allocator.
    fn free_record(&mut self, id: u32) {
        self.stats.records_freed += 1;
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
                        CHAIN_UNKNOWN => self.meta(id).and_then(|meta| {
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
                if let (Some(meta), Some(buddy)) = (self.meta(id), self.buddy.as_mut()) {
                    if meta.self_id == id {
                        buddy.free(id, meta.order);
                    }
                }
            }
        }
    }
}
