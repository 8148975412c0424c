//! Batches and the commit: making room in a batch, committing early to reuse freed space,
//! and the commit protocol of the module documentation.

use pmnet_pm::PmRegion;

use super::view::View;
use super::{OpMark, Store};
use crate::breakdown::Phase;
use crate::index::LinkUpdate;
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
        if self.space.limbo_count() == 0 && self.batch.freed.is_empty() {
            return false;
        }
        for _ in 0..2 {
            if self.space.limbo_count() == 0 && self.batch.freed.is_empty() {
                break;
            }
            // An empty batch commits too: its intent block supersedes the one that named
            // the freed records, and its first fence makes their unlinking durable. Not
            // `commit`: this may be the middle of a request (a record it displaced is not
            // yet freed), where the invariants need not hold.
            self.batch.wrote = true;
            self.commit_batch();
            self.stats.reclaim_commits += 1;
        }
        true
    }

    /// Make everything staged since the last commit durable (see the module doc). Replies
    /// of staged requests may be sent once this returns. Debug builds then check the
    /// bookkeeping ([`Store::check_invariants`]).
    pub fn commit(&mut self) {
        if !self.batch.wrote {
            return;
        }
        self.commit_batch();
        #[cfg(debug_assertions)]
        self.check_invariants_after_commit();
    }

    /// [`Store::commit`] without the check, which may come in the middle of a request.
    fn commit_batch(&mut self) {
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
        self.write_links(&links);
        self.links = links;
        self.mark(Phase::Persist);
        // Records freed by earlier batches are reusable now; this batch's after the next.
        let view = View {
            bytes: self.region.bytes(),
            geometry: self.geometry,
            committed_epoch: self.batch_epoch(),
        };
        self.stats.records_freed += self.space.free_limbo_before(epoch, &view);
        for id in self.batch.freed.drain(..) {
            self.space.free_after(epoch, id);
        }
        self.batch.ops.clear();
        self.batch.wrote = false;
        self.stats.batches += 1;
        self.mark(Phase::Allocate);
    }

    /// Write changed level-0 links (4-byte stores) and flush them, without a fence.
    pub(super) fn write_links(&mut self, links: &[LinkUpdate]) {
        for link in links {
            let at = match link.from {
                None => HEAD_OFFSET,
                Some(id) => self.geometry.record_offset(id) + META_NEXT0,
            };
            self.region.write(at, &link_of(link.to).to_le_bytes());
            self.region.flush(at, 4);
        }
    }
}
