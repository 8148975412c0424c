//! The persistence contract every durable structure in pmnet is written against.
//!
//! A [`PmRegion`] is a fixed-size range of bytes that survives some class of failure once it has
//! been *persisted*. Stores land in a volatile layer first (the CPU cache, the page cache, a
//! simulated cache); [`PmRegion::flush`] starts write-back of a range and [`PmRegion::fence`]
//! waits until every range flushed so far is durable. [`PmRegion::persist`] is the two together.
//! Nothing written is durable before the fence that follows its flush returns.
//!
//! Code built on a region must be crash-consistent under this model: after a crash, every
//! cache line that was written but not fenced may hold its old bytes, its new bytes, or (the
//! simulated region can model it) a mix of the two at 8-byte granularity.

use std::fmt;

/// Size of the unit the hardware writes back: the granularity of flushes and of torn writes.
pub const CACHE_LINE_SIZE: usize = 64;

/// Where the bytes of a region live, and so which failures they survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Medium {
    /// A file on a DAX file system mapped with `MAP_SYNC`: real persistent memory. Survives
    /// process crashes and power loss once flushed and fenced.
    DaxPm,
    /// A file on tmpfs or ramfs (for example under `/dev/shm`): DRAM, durable across a process
    /// crash, **not** across a power loss or a kernel crash, whatever the flush. This is how the
    /// PMNet prototype emulated its persistent memory.
    EmulatedPm,
    /// A file on a disk's file system flushed with cache-line write-back instructions only
    /// (`--flush clwb` and the like, asked for): they reach the page cache, which outlives the
    /// process but not a power loss or a kernel crash.
    PageCache,
    /// A file on a disk's file system made durable with `msync`/`fdatasync`: survives power
    /// loss, at block-device latency.
    Disk,
    /// Process memory with a modelled crash: used by tests and the simulator only.
    Simulated,
}

impl Medium {
    /// Short stable name, used in reports, metrics and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Medium::DaxPm => "dax-pm",
            Medium::EmulatedPm => "emulated-pm",
            Medium::PageCache => "page-cache",
            Medium::Disk => "disk",
            Medium::Simulated => "simulated",
        }
    }

    /// The failures a persisted write on this medium survives, in words a report can print.
    pub fn guarantee(self) -> &'static str {
        match self {
            Medium::DaxPm => "durable across process crash and power loss",
            Medium::EmulatedPm => {
                "durable across process crash, NOT power loss (tmpfs: DRAM standing in for PM)"
            }
            Medium::PageCache => {
                "durable across process crash, NOT power loss or a kernel crash (a disk file's \
                 page cache, flushed with cache-line instructions only; --flush auto or \
                 fdatasync writes it to the disk)"
            }
            Medium::Disk => {
                "durable across process crash and power loss (page cache written to the disk at \
                 each fence)"
            }
            Medium::Simulated => "simulated: in-process crash model for tests",
        }
    }
}

/// How a region makes a flushed range durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlushMethod {
    /// `clwb` per cache line, then `sfence`.
    Clwb,
    /// `clflushopt` per cache line, then `sfence`.
    Clflushopt,
    /// `clflush` per cache line (serialising; slow; the fallback on old CPUs).
    Clflush,
    /// `msync(MS_SYNC)` of the pages covering the range (`fence` is then a no-op).
    Msync,
    /// `fdatasync` of the backing file at each fence.
    Fdatasync,
    /// The simulated region's modelled write-back.
    Simulated,
}

impl FlushMethod {
    /// Short stable name, used in reports, metrics and JSON.
    pub fn name(self) -> &'static str {
        match self {
            FlushMethod::Clwb => "clwb+sfence",
            FlushMethod::Clflushopt => "clflushopt+sfence",
            FlushMethod::Clflush => "clflush",
            FlushMethod::Msync => "msync",
            FlushMethod::Fdatasync => "fdatasync",
            FlushMethod::Simulated => "simulated",
        }
    }
}

/// What a region is made of: printed at start-up and in every report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MediumInfo {
    pub medium: Medium,
    pub flush: FlushMethod,
    /// Extra latency added to every fence, to emulate a slower medium (0 when off).
    pub added_latency_ns: u64,
}

impl fmt::Display for MediumInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} via {}", self.medium.name(), self.flush.name())?;
        if self.added_latency_ns > 0 {
            write!(f, " (+{} ns per persist)", self.added_latency_ns)?;
        }
        write!(f, "; {}", self.medium.guarantee())
    }
}

/// A fixed-size byte range with an explicit persistence step.
///
/// Offsets and lengths out of range are caller bugs and panic; every caller in pmnet derives
/// them from validated layouts, never from untrusted input.
pub trait PmRegion {
    /// Size of the region in bytes; fixed for its lifetime.
    fn len(&self) -> usize;

    /// True when the region has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The current contents as the running process sees them (including unpersisted stores).
    fn bytes(&self) -> &[u8];

    /// Store `data` at `offset`. Not durable until flushed and fenced.
    fn write(&mut self, offset: usize, data: &[u8]);

    /// Start write-back of the cache lines covering `offset..offset + len`.
    fn flush(&mut self, offset: usize, len: usize);

    /// Wait until every range flushed so far is durable.
    fn fence(&mut self);

    /// Flush `offset..offset + len` and fence: the range is durable on return.
    fn persist(&mut self, offset: usize, len: usize) {
        self.flush(offset, len);
        self.fence();
    }

    /// What this region is made of.
    fn medium(&self) -> MediumInfo;
}
