//! The conventional engine's allocator: a binary buddy allocator over the heap, in 64-byte
//! granules, block sizes 64 B << order. Its state is volatile; recovery rebuilds it from the
//! blocks the index and the session table reach (each block's metadata line names its order).

use std::collections::BTreeSet;

pub const MAX_ORDER: u8 = 16;

#[derive(Debug, Clone)]
pub struct Buddy {
    granule_count: u32,
    free: Vec<BTreeSet<u32>>,
    free_granules: u64,
}

/// The order of the smallest block holding `len` bytes, if any block does.
pub fn order_for(len: usize) -> Option<u8> {
    let granules = len.div_ceil(crate::layout::GRANULE).max(1);
    let order = granules.next_power_of_two().trailing_zeros();
    (order <= u32::from(MAX_ORDER)).then_some(order as u8)
}

impl Buddy {
    /// Every granule free.
    pub fn new(granule_count: u32) -> Buddy {
        let mut buddy = Buddy {
            granule_count,
            free: vec![BTreeSet::new(); usize::from(MAX_ORDER) + 1],
            free_granules: 0,
        };
        let mut id = 0u32;
        while id < granule_count {
            let mut order = MAX_ORDER;
            while order > 0
                && (id % (1 << order) != 0
                    || u64::from(id) + (1u64 << order) > granule_count as u64)
            {
                order -= 1;
            }
            buddy.free[usize::from(order)].insert(id);
            buddy.free_granules += 1 << order;
            id += 1 << order;
        }
        buddy
    }

    pub fn free_bytes(&self) -> u64 {
        self.free_granules * crate::layout::GRANULE as u64
    }

    pub fn alloc(&mut self, order: u8) -> Option<u32> {
        let found = (order..=MAX_ORDER).find(|o| !self.free[usize::from(*o)].is_empty())?;
        let id = self.free[usize::from(found)].pop_first()?;
        let mut current = found;
        while current > order {
            current -= 1;
            self.free[usize::from(current)].insert(id + (1 << current));
        }
        self.free_granules -= 1 << order;
        Some(id)
    }

    pub fn free(&mut self, id: u32, order: u8) {
        self.free_granules += 1 << order;
        let mut id = id;
        let mut order = order;
        while order < MAX_ORDER {
            let buddy = id ^ (1 << order);
            if !self.free[usize::from(order)].remove(&buddy) {
                break;
            }
            id = id.min(buddy);
            order += 1;
        }
        self.free[usize::from(order)].insert(id);
    }

    /// Take the block `id` of `order` out of the free space (recovery); false if any of it is
    /// not free (two live blocks overlap: the layout is damaged).
    pub fn reserve(&mut self, id: u32, order: u8) -> bool {
        if order > MAX_ORDER
            || id % (1 << order) != 0
            || u64::from(id) + (1u64 << order) > u64::from(self.granule_count)
        {
            return false;
        }
        for containing_order in order..=MAX_ORDER {
            let start = id & !((1u32 << containing_order) - 1);
            if self.free[usize::from(containing_order)].remove(&start) {
                let mut block = start;
                let mut current = containing_order;
                while current > order {
                    current -= 1;
                    let half = 1u32 << current;
                    if id >= block + half {
                        self.free[usize::from(current)].insert(block);
                        block += half;
                    } else {
                        self.free[usize::from(current)].insert(block + half);
                    }
                }
                debug_assert_eq!(block, id);
                self.free_granules -= 1 << order;
                return true;
            }
        }
        false
    }
}

#[cfg(any(test, debug_assertions))]
impl Buddy {
    /// The free blocks, as (first granule, order).
    pub fn free_blocks(&self) -> impl Iterator<Item = (u32, u8)> + '_ {
        self.free
            .iter()
            .enumerate()
            .flat_map(|(order, ids)| ids.iter().map(move |id| (*id, order as u8)))
    }

    /// The free lists agree with the free-granule count, and every free block is aligned to
    /// its order and inside the heap. (Whether free blocks overlap each other or live ones,
    /// the store checks: it knows the live ones.)
    pub fn check(&self) -> Result<(), String> {
        let mut granules = 0u64;
        for (id, order) in self.free_blocks() {
            if id % (1 << order) != 0
                || u64::from(id) + (1u64 << order) > u64::from(self.granule_count)
            {
                return Err(format!("free block {id} of order {order} is misplaced"));
            }
            granules += 1 << order;
        }
        if granules != self.free_granules {
            return Err(format!(
                "the free lists hold {granules} granules, the count says {}",
                self.free_granules
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_merges_back() {
        let mut buddy = Buddy::new(1000);
        let total = buddy.free_bytes();
        let a = buddy.alloc(0).unwrap();
        let b = buddy.alloc(3).unwrap();
        let c = buddy.alloc(5).unwrap();
        assert!(buddy.free_bytes() < total);
        buddy.free(b, 3);
        buddy.free(a, 0);
        buddy.free(c, 5);
        assert_eq!(buddy.free_bytes(), total);
        // Everything merged back: the largest block is allocatable again.
        assert!(buddy.alloc(9).is_some());
    }

    #[test]
    fn reserve_matches_alloc() {
        let mut live = Buddy::new(4096);
        let blocks: Vec<(u32, u8)> = (0..40u8)
            .map(|i| {
                let order = i % 5;
                (live.alloc(order).unwrap(), order)
            })
            .collect();
        let mut rebuilt = Buddy::new(4096);
        for (id, order) in &blocks {
            assert!(rebuilt.reserve(*id, *order));
            assert!(
                !rebuilt.reserve(*id, *order),
                "double reservation must fail"
            );
        }
        assert_eq!(rebuilt.free_bytes(), live.free_bytes());
        assert_eq!(order_for(1), Some(0));
        assert_eq!(order_for(65), Some(1));
        assert_eq!(order_for(64 << 16), Some(16));
        assert_eq!(order_for((64 << 16) + 1), None);
    }
}
