//! A region in process memory with a modelled crash, for tests and the deterministic simulator.
//!
//! [`SimRegion`] keeps two images: the *current* bytes (what the running process sees, like the
//! CPU cache over memory) and the *durable* bytes (what survives a crash). Each 64-byte cache line
//! is in one of three states:
//!
//! - clean: current and durable agree;
//! - dirty: written since its last flush;
//! - flushed: flushed and not yet fenced.
//!
//! [`PmRegion::fence`] copies every flushed line into the durable image. A store to a flushed line
//! before the fence makes it dirty again, and the fence then leaves it alone: the flush covered
//! the old contents, and the model errs on the side of "not durable" so code that persists a line
//! and then changes it before fencing cannot pass its tests by luck.
//!
//! [`SimRegion::crash`] builds what a crash would leave: the durable image, with every dirty or
//! flushed line independently kept old, taken new, or torn at 8-byte-word granularity.

use std::fmt;

use rand::Rng;

use crate::region::{FlushMethod, Medium, MediumInfo, PmRegion, CACHE_LINE_SIZE};

/// The unit a torn cache line is torn at: x86 writes back aligned 8-byte words atomically.
const WORD_SIZE: usize = 8;

const _: () = assert!(CACHE_LINE_SIZE % WORD_SIZE == 0);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineState {
    /// Durable image equals current image.
    Clean,
    /// Written since its last flush: may be lost, kept or torn by a crash.
    Dirty,
    /// Flushed but not fenced: durable after the next fence, still losable before it.
    Flushed,
}

/// Process memory with an explicit durable image and a crash model. See the module doc.
#[derive(Clone)]
pub struct SimRegion {
    current: Vec<u8>,
    durable: Vec<u8>,
    line_states: Vec<LineState>,
    /// Lines that became `Flushed` since the last fence, so a fence touches only them. A line
    /// may appear here and have become `Dirty` again since; the fence checks the state.
    flushed_lines: Vec<usize>,
    fence_count: u64,
    flush_count: u64,
}

impl fmt::Debug for SimRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The images can be megabytes: print the shape, not the bytes.
        f.debug_struct("SimRegion")
            .field("len", &self.current.len())
            .field("unpersisted_line_count", &self.unpersisted_line_count())
            .field("fence_count", &self.fence_count)
            .field("flush_count", &self.flush_count)
            .finish()
    }
}

impl SimRegion {
    /// A zeroed region of `len` bytes, all of it durable.
    pub fn new(len: usize) -> Self {
        Self::from_durable(vec![0; len])
    }

    /// A region whose durable and current images are both `bytes`.
    fn from_durable(bytes: Vec<u8>) -> Self {
        let line_count = bytes.len().div_ceil(CACHE_LINE_SIZE);
        SimRegion {
            current: bytes.clone(),
            durable: bytes,
            line_states: vec![LineState::Clean; line_count],
            flushed_lines: Vec::new(),
            fence_count: 0,
            flush_count: 0,
        }
    }

    /// The region a crash would leave now, with everything in it durable.
    ///
    /// Starts from the durable image; every line that is dirty or flushed-but-not-fenced is,
    /// at random and independently, kept old, taken new, or torn: each of its 8-byte words
    /// independently old or new. Counters start at zero in the result.
    pub fn crash(&self, rng: &mut impl Rng) -> SimRegion {
        let mut bytes = self.durable.clone();
        for (line_index, state) in self.line_states.iter().enumerate() {
            if *state == LineState::Clean {
                continue;
            }
            let line = self.line_range(line_index);
            match rng.random_range(0..3u8) {
                0 => {} // The write-back never happened: old bytes.
                1 => bytes[line.clone()].copy_from_slice(&self.current[line]),
                _ => {
                    let mut word_start = line.start;
                    while word_start < line.end {
                        let word_end = (word_start + WORD_SIZE).min(line.end);
                        if rng.random_bool(0.5) {
                            bytes[word_start..word_end]
                                .copy_from_slice(&self.current[word_start..word_end]);
                        }
                        word_start = word_end;
                    }
                }
            }
        }
        SimRegion::from_durable(bytes)
    }

    /// The region a crash would leave if no unpersisted write reached the medium: exactly the
    /// durable image. Deterministic.
    pub fn crash_losing_unpersisted(&self) -> SimRegion {
        SimRegion::from_durable(self.durable.clone())
    }

    /// True iff no cache line overlapping `offset..offset + len` is dirty or flushed-unfenced:
    /// the range would survive a crash exactly as the process sees it now.
    pub fn is_durable(&self, offset: usize, len: usize) -> bool {
        self.assert_range(offset, len);
        if len == 0 {
            return true;
        }
        self.line_indexes(offset, len)
            .all(|line_index| self.line_states[line_index] == LineState::Clean)
    }

    /// The bytes a crash that loses every unpersisted write would leave.
    pub fn durable_bytes(&self) -> &[u8] {
        &self.durable
    }

    /// Flip one random bit of the byte at `offset` in both images: media corruption at rest.
    pub fn corrupt_at_rest(&mut self, offset: usize, rng: &mut impl Rng) {
        let bit = rng.random_range(0..8u8);
        self.flip_bit(offset, bit);
    }

    /// Flip bit `bit` (0 = least significant) of the byte at `offset` in both images.
    pub fn flip_bit(&mut self, offset: usize, bit: u8) {
        assert!(offset < self.current.len(), "offset {offset} out of range");
        assert!(bit < 8, "bit {bit} out of range");
        let mask = 1u8 << bit;
        self.current[offset] ^= mask;
        self.durable[offset] ^= mask;
    }

    /// Fences issued since this region was made.
    pub fn fence_count(&self) -> u64 {
        self.fence_count
    }

    /// Cache lines flushed since this region was made (each line of each flush call counts).
    pub fn flush_count(&self) -> u64 {
        self.flush_count
    }

    /// Cache lines that a crash could lose or tear now (dirty or flushed-unfenced).
    pub fn unpersisted_line_count(&self) -> usize {
        self.line_states
            .iter()
            .filter(|state| **state != LineState::Clean)
            .count()
    }

    fn assert_range(&self, offset: usize, len: usize) {
        let end = offset.checked_add(len);
        assert!(
            end.is_some_and(|end| end <= self.current.len()),
            "range {offset}+{len} out of region of {} bytes",
            self.current.len()
        );
    }

    /// Indexes of the cache lines overlapping a non-empty in-range byte range.
    fn line_indexes(&self, offset: usize, len: usize) -> std::ops::Range<usize> {
        debug_assert!(len > 0);
        let first = offset / CACHE_LINE_SIZE;
        let last = (offset + len - 1) / CACHE_LINE_SIZE;
        first..last + 1
    }

    /// Byte range of a line; the last line is short when the length is not a multiple of 64.
    fn line_range(&self, line_index: usize) -> std::ops::Range<usize> {
        let start = line_index * CACHE_LINE_SIZE;
        start..(start + CACHE_LINE_SIZE).min(self.current.len())
    }
}

impl PmRegion for SimRegion {
    fn len(&self) -> usize {
        self.current.len()
    }

    fn bytes(&self) -> &[u8] {
        &self.current
    }

    fn write(&mut self, offset: usize, data: &[u8]) {
        self.assert_range(offset, data.len());
        if data.is_empty() {
            return;
        }
        self.current[offset..offset + data.len()].copy_from_slice(data);
        for line_index in self.line_indexes(offset, data.len()) {
            // Even a store of identical bytes dirties the line, as in hardware: the model must
            // not depend on the values written.
            self.line_states[line_index] = LineState::Dirty;
        }
    }

    fn flush(&mut self, offset: usize, len: usize) {
        self.assert_range(offset, len);
        if len == 0 {
            return;
        }
        for line_index in self.line_indexes(offset, len) {
            self.flush_count += 1;
            if self.line_states[line_index] == LineState::Dirty {
                self.line_states[line_index] = LineState::Flushed;
                self.flushed_lines.push(line_index);
            }
        }
    }

    fn fence(&mut self) {
        self.fence_count += 1;
        for line_index in std::mem::take(&mut self.flushed_lines) {
            // A line written again after its flush is Dirty now: the flush does not cover it.
            if self.line_states[line_index] == LineState::Flushed {
                let line = self.line_range(line_index);
                self.durable[line.clone()].copy_from_slice(&self.current[line]);
                self.line_states[line_index] = LineState::Clean;
            }
        }
        debug_assert!(!self.line_states.contains(&LineState::Flushed));
    }

    fn medium(&self) -> MediumInfo {
        MediumInfo {
            medium: Medium::Simulated,
            flush: FlushMethod::Simulated,
            added_latency_ns: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::test_seed;

    #[test]
    fn new_region_is_zeroed_and_durable() {
        let region = SimRegion::new(200);
        assert_eq!(region.len(), 200);
        assert!(region.bytes().iter().all(|b| *b == 0));
        assert!(region.is_durable(0, 200));
        assert_eq!(region.unpersisted_line_count(), 0);
        assert_eq!(region.medium().medium, Medium::Simulated);
        assert_eq!(region.medium().flush, FlushMethod::Simulated);
    }

    #[test]
    fn unpersisted_writes_can_be_lost() {
        let seed = test_seed("unpersisted_writes_can_be_lost");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut region = SimRegion::new(256);
        region.write(64, &[0xAA; 64]);
        assert_eq!(&region.bytes()[64..128], &[0xAA; 64]);
        assert!(!region.is_durable(64, 64));

        let lost = region.crash_losing_unpersisted();
        assert!(lost.bytes().iter().all(|b| *b == 0));
        assert!(lost.is_durable(0, 256));

        // Flushed but not fenced is still losable.
        region.flush(64, 64);
        assert!(!region.is_durable(64, 64));
        assert!(region.crash_losing_unpersisted().bytes()[64..128]
            .iter()
            .all(|b| *b == 0));

        // Over many crashes, each outcome (old, new, torn) shows up.
        let (mut old_seen, mut new_seen, mut torn_seen) = (false, false, false);
        for _ in 0..200 {
            let crashed = region.crash(&mut rng);
            let line = &crashed.bytes()[64..128];
            assert!(crashed.is_durable(0, 256));
            assert_eq!(crashed.bytes(), crashed.durable_bytes());
            if line.iter().all(|b| *b == 0) {
                old_seen = true;
            } else if line.iter().all(|b| *b == 0xAA) {
                new_seen = true;
            } else {
                torn_seen = true;
            }
            // Lines never written are untouched.
            assert!(crashed.bytes()[..64].iter().all(|b| *b == 0));
            assert!(crashed.bytes()[128..].iter().all(|b| *b == 0));
        }
        assert!(old_seen && new_seen && torn_seen, "seed {seed}");
    }

    #[test]
    fn torn_writes_happen_at_word_granularity() {
        let seed = test_seed("torn_writes_happen_at_word_granularity");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut region = SimRegion::new(64 * 4 + 20); // A short last line too.
        let new_bytes: Vec<u8> = (0..region.len()).map(|i| (i % 251) as u8 + 1).collect();
        region.write(0, &new_bytes);
        let mut mixed_words_seen = 0;
        for _ in 0..500 {
            let crashed = region.crash(&mut rng);
            for word in crashed.bytes().chunks(WORD_SIZE).enumerate() {
                let (word_index, word_bytes) = word;
                let start = word_index * WORD_SIZE;
                let new_word = &new_bytes[start..start + word_bytes.len()];
                let all_old = word_bytes.iter().all(|b| *b == 0);
                assert!(
                    all_old || word_bytes == new_word,
                    "seed {seed}: word {word_index} is torn inside: {word_bytes:?}"
                );
            }
            for line in crashed.bytes().chunks(CACHE_LINE_SIZE) {
                let old_words = line.chunks(WORD_SIZE).filter(|w| w[0] == 0).count();
                if old_words != 0 && old_words != line.len().div_ceil(WORD_SIZE) {
                    mixed_words_seen += 1;
                }
            }
        }
        assert!(mixed_words_seen > 0, "seed {seed}: no torn line seen");
    }

    #[test]
    fn persisted_ranges_always_survive() {
        let seed = test_seed("persisted_ranges_always_survive");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut region = SimRegion::new(4096);
        region.write(100, &[7; 300]);
        region.persist(100, 300);
        assert!(region.is_durable(100, 300));
        // Unpersisted writes elsewhere, including the same line as the persisted range's edge.
        region.write(0, &[9; 50]);
        region.write(1000, &[9; 500]);
        region.flush(1000, 100);
        for _ in 0..200 {
            let crashed = region.crash(&mut rng);
            assert_eq!(&crashed.bytes()[100..400], &[7; 300], "seed {seed}");
        }
        assert_eq!(
            &region.crash_losing_unpersisted().bytes()[100..400],
            &[7; 300]
        );
    }

    #[test]
    fn is_durable_tracks_lines() {
        let mut region = SimRegion::new(1024);
        region.write(130, &[1; 4]); // Line 2 only.
        assert!(region.is_durable(0, 128));
        assert!(!region.is_durable(128, 1));
        assert!(!region.is_durable(191, 1));
        assert!(region.is_durable(192, 64));
        assert!(!region.is_durable(0, 1024));
        assert!(region.is_durable(500, 0));

        region.flush(128, 64);
        assert!(!region.is_durable(128, 64), "flushed but not fenced");
        region.fence();
        assert!(region.is_durable(0, 1024));
        assert_eq!(region.fence_count(), 1);
        assert_eq!(region.flush_count(), 1);

        // A flush spanning three lines counts three.
        region.write(60, &[2; 10]);
        region.flush(60, 70);
        assert_eq!(region.flush_count(), 4);
        region.fence();
        assert!(region.is_durable(0, 1024));
    }

    #[test]
    fn write_after_flush_before_fence_is_not_made_durable() {
        let mut region = SimRegion::new(256);
        region.write(0, &[1; 8]);
        region.flush(0, 8);
        region.write(8, &[2; 8]); // Same line, after its flush.
        region.fence();
        assert!(!region.is_durable(0, 8));
        assert_eq!(&region.durable_bytes()[0..16], &[0; 16]);
        // A second fence without a flush changes nothing.
        region.fence();
        assert!(!region.is_durable(0, 16));
        region.persist(0, 16);
        assert!(region.is_durable(0, 16));
        assert_eq!(&region.durable_bytes()[0..8], &[1; 8]);
        assert_eq!(&region.durable_bytes()[8..16], &[2; 8]);
    }

    #[test]
    fn corruption_at_rest_changes_both_images() {
        let seed = test_seed("corruption_at_rest_changes_both_images");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut region = SimRegion::new(128);
        region.flip_bit(3, 7);
        assert_eq!(region.bytes()[3], 0x80);
        assert_eq!(region.durable_bytes()[3], 0x80);
        assert!(region.is_durable(0, 128));
        region.corrupt_at_rest(70, &mut rng);
        assert_eq!(region.bytes()[70].count_ones(), 1);
        assert_eq!(region.durable_bytes()[70], region.bytes()[70]);
        assert_eq!(region.crash(&mut rng).bytes(), region.bytes());
    }

    #[test]
    #[should_panic(expected = "out of region")]
    fn write_out_of_range_panics() {
        let mut region = SimRegion::new(64);
        region.write(60, &[0; 8]);
    }
}
