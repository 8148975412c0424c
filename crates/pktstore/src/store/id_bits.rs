//! A dense bitmap over record ids.

use crate::layout::divide;

/// One bit per record id. Ids that can start a record are multiples of `per` (a slot's granules
/// in the packet store, 1 in the conventional heap), so the bits stay dense: 2.5 KB for 20 000
/// slots.
#[derive(Debug, Clone)]
pub(super) struct IdBits {
    words: Vec<u64>,
    per: u32,
}

impl IdBits {
    pub(super) fn new(ids: u32, per: u32) -> IdBits {
        let per = per.max(1);
        IdBits {
            words: vec![0; (ids / per) as usize / 64 + 1],
            per,
        }
    }

    fn locate(&self, id: u32) -> (usize, u64) {
        let (bit, _) = divide(id, self.per);
        (bit as usize / 64, 1 << (bit % 64))
    }

    pub(super) fn get(&self, id: u32) -> bool {
        let (word, mask) = self.locate(id);
        self.words.get(word).is_some_and(|word| word & mask != 0)
    }

    pub(super) fn set(&mut self, id: u32) {
        let (word, mask) = self.locate(id);
        if let Some(word) = self.words.get_mut(word) {
            *word |= mask;
        }
    }

    pub(super) fn clear(&mut self, id: u32) {
        let (word, mask) = self.locate(id);
        if let Some(word) = self.words.get_mut(word) {
            *word &= !mask;
        }
    }
}

#[cfg(any(test, debug_assertions))]
impl IdBits {
    /// How many ids are set.
    pub(super) fn count(&self) -> usize {
        self.words
            .iter()
            .map(|word| word.count_ones() as usize)
            .sum()
    }
}
