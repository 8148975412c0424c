//! Log work carried out in batches: the one executor of a device's persistence work, shared by
//! the runtime (on a mapped file) and the simulator (on a [`crate::SimRegion`]).
//!
//! A batch is every write and invalidation a device asked for since the last batch, in order.
//! [`PmLog::persist_batch`] makes all of it durable with one pair of fences instead of two per
//! write: every invalidation's state word and every write's header and packet are stored and
//! flushed, one fence; then every write's state word becomes VALID, one fence. The order within
//! a batch survives where it matters: a slot that is invalidated and then written again in the
//! same batch (the device reuses a slot its server just acked) gets its invalidations fenced
//! first, so a crash cannot find the old entry's VALID state over a half-written new one.

use std::net::SocketAddr;

use super::{EntryKey, PmLog, STATE_FREE, STATE_VALID};
use crate::region::PmRegion;

/// One piece of log persistence work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogWork {
    /// Write `packet` into `slot` under `key`, recording `return_address` (the client the
    /// device acks) so that a restarted device can still route acknowledgements.
    Write {
        slot: u32,
        key: EntryKey,
        return_address: Option<SocketAddr>,
        /// Shared with the device's entry (kept for resends): one copy of the update.
        packet: std::sync::Arc<[u8]>,
    },
    /// Free `slot`.
    Invalidate { slot: u32 },
}

/// What carrying out one batch cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    pub writes: u64,
    pub invalidations: u64,
    pub fences: u64,
}

impl<R: PmRegion> PmLog<R> {
    /// Carry out `work` in order and make all of it durable before returning, with two fences
    /// (three when a slot is invalidated and written again within the batch; none for an empty
    /// batch). A crash before it returns may leave any subset of the batch's writes and
    /// invalidations, never a torn entry that passes its check.
    ///
    /// Panics, like [`PmLog::write`], on a slot out of range or a packet larger than a slot:
    /// both are bugs of the caller.
    pub fn persist_batch(&mut self, work: &[LogWork]) -> BatchStats {
        let mut stats = BatchStats::default();
        let mut invalidated: Vec<u32> = Vec::new();
        let mut reused = false;
        for item in work {
            match item {
                LogWork::Invalidate { slot } => invalidated.push(*slot),
                LogWork::Write { slot, .. } => reused |= invalidated.contains(slot),
            }
        }
        if reused {
            for slot in &invalidated {
                self.write_state(*slot, STATE_FREE);
            }
            self.region.fence();
            stats.fences += 1;
        }
        for item in work {
            match item {
                LogWork::Invalidate { slot } => {
                    stats.invalidations += 1;
                    if !reused {
                        self.write_state(*slot, STATE_FREE);
                    }
                }
                LogWork::Write {
                    slot,
                    key,
                    return_address,
                    packet,
                } => {
                    stats.writes += 1;
                    self.write_payload(*slot, key, *return_address, packet);
                }
            }
        }
        if stats.writes == 0 && stats.invalidations == 0 {
            return stats;
        }
        if stats.writes > 0 || !reused {
            self.region.fence();
            stats.fences += 1;
        }
        if stats.writes > 0 {
            for item in work {
                if let LogWork::Write { slot, .. } = item {
                    self.write_state(*slot, STATE_VALID);
                }
            }
            self.region.fence();
            stats.fences += 1;
        }
        stats
    }
}

impl<R: PmRegion> PmLog<R> {
    /// The stores and flushes of [`PmLog::persist_batch`] without its fences: the state a crash
    /// in the middle of a batch finds. Only simulators call this, to build that state on a
    /// [`crate::SimRegion`] before crashing it; nothing in the batch is durable.
    pub fn persist_batch_without_fences(&mut self, work: &[LogWork]) {
        for item in work {
            match item {
                LogWork::Invalidate { slot } => self.write_state(*slot, STATE_FREE),
                LogWork::Write {
                    slot,
                    key,
                    return_address,
                    packet,
                } => {
                    self.write_payload(*slot, key, *return_address, packet);
                    self.write_state(*slot, STATE_VALID);
                }
            }
        }
    }
}
