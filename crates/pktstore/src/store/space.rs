//! The allocation state: what the store keeps to hand out space.

/// The receive slots lent out, by slot number: what each received. An array, not a map: a loan
/// is looked up for every received datagram.
#[derive(Debug, Default)]
pub(super) struct Loans {
    /// Per slot: (`NOT_LENT`, `AWAITING` or the received length; receive time).
    entries: Vec<(u32, u64)>,
    pub(super) count: usize,
}

pub(super) const CHAIN_UNKNOWN: u32 = u32::MAX;
pub(super) const CHAIN_END: u32 = u32::MAX - 1;

const NOT_LENT: u32 = u32::MAX;
const AWAITING: u32 = u32::MAX - 1;

impl Loans {
    pub(super) fn new(slot_count: u32) -> Loans {
        Loans {
            entries: vec![(NOT_LENT, 0); slot_count as usize],
            count: 0,
        }
    }

    pub(super) fn lend(&mut self, slot: u32) {
        if let Some(entry) = self.entries.get_mut(slot as usize) {
            if entry.0 == NOT_LENT {
                self.count += 1;
            }
            *entry = (AWAITING, 0);
        }
    }

    pub(super) fn is_lent(&self, slot: u32) -> bool {
        self.entries
            .get(slot as usize)
            .is_some_and(|entry| entry.0 != NOT_LENT)
    }

    /// A lent slot's entry, to record what it received.
    pub(super) fn entry_mut(&mut self, slot: u32) -> Option<&mut (u32, u64)> {
        self.entries
            .get_mut(slot as usize)
            .filter(|entry| entry.0 != NOT_LENT)
    }

    /// (length, receive time) of what lent `slot` received.
    pub(super) fn received(&self, slot: u32) -> Option<(u32, u64)> {
        self.entries
            .get(slot as usize)
            .copied()
            .filter(|entry| entry.0 != NOT_LENT && entry.0 != AWAITING)
    }

    /// End the loan of `slot`; its entry (`AWAITING` as the length if nothing was received).
    pub(super) fn take(&mut self, slot: u32) -> Option<(u32, u64)> {
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
