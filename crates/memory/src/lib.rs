//! The client memory controller of replicated persistent memory (docs/abd.md).
//!
//! Memory is an array of 64-byte lines ([`LINE`]), each replicated on several memory nodes
//! and kept consistent with ABD quorums. A [`LineStore`] reads and writes whole lines; this
//! crate builds byte-addressed memory on it two ways:
//!
//! * [`RemoteMemory`]: `read(addr, buf)`, `write(addr, bytes)`, `persist()`, with a bounded
//!   buffer of dirty lines;
//! * [`MappedMemory`]: a region of the address space (userfaultfd) whose first touch of a page
//!   fetches its 64 lines, whose writes are tracked by write-protect faults, and whose
//!   `persist()` writes the changed lines back.
//!
//! [`MemLineStore`] is an in-memory store for tests and examples.
//!
//! # Consistency
//!
//! * **A line is a linearizable register.** Every quorum read or write of one line takes
//!   effect at one instant between its call and its return; a read returns the value of the
//!   last write before it. Nothing bigger than a line is atomic: a read or write of several
//!   lines (a `read` spanning lines, a page fault, a `persist()`) is one such operation per
//!   line, and another client can see some of its lines and not others. **A page is not
//!   atomic.**
//! * **Writes are buffered until `persist()`.** A write changes this client's copy only: other
//!   clients cannot see it, and it is lost if this client dies. `persist()` writes the changed
//!   lines back and returns once a majority of memory nodes holds every one of them durably;
//!   from then on they survive the loss of any minority of nodes and every read that begins
//!   later returns them (or a later write). If `persist()` fails, the lines may or may not
//!   have reached the nodes (some may become visible later); they stay dirty and the next
//!   `persist()` writes them again. Lines of one `persist()` become visible in no particular
//!   order.
//! * **Partial lines are read-modify-write.** Writing part of a line means writing the whole
//!   line, with the rest of it as this client last saw it (fetched by a quorum read in
//!   `RemoteMemory`, or when the page was faulted in). That is not atomic: another client's
//!   write to the rest of the line in between is overwritten. Clients that write the same
//!   line concurrently must write whole lines (the last `persist()` then wins per line), or
//!   coordinate.
//! * **`RemoteMemory` reads are fresh.** It caches no clean line: a read of a line it has not
//!   written goes to a quorum, so it sees every write completed before the read began. Its own
//!   unpersisted writes are read from its buffer (read-your-writes).
//! * **`MappedMemory` caches the pages it has faulted in.** Once present, a page is read
//!   locally: the view does not see other clients' later writes until
//!   [`MappedMemory::refresh`] (or [`MappedMemory::invalidate`] for a range) drops its clean
//!   pages, so that their next touch fetches them again. A read of the view is therefore as of
//!   the page's last fetch; the view always sees its own writes. Dirty pages are kept by
//!   `refresh`: persist first to refresh those too.
//!
//! # Keeping state in the view
//!
//! A program keeps its data in the mapped view like any memory and persists at the points it
//! wants durable, e.g. an array of counters, incremented and made durable once a round:
//!
//! ```no_run
//! use pmnet_memory::{MappedMemory, MemLineStore};
//!
//! let store = MemLineStore::new(64); // one page of lines; a real program uses an ABD session
//! let mut view = MappedMemory::map(store, 1)?;
//! for _round in 0..10 {
//!     for counter in view.words_mut().iter_mut().take(8) {
//!         *counter += 1;
//!     }
//!     view.persist()?; // durable on a majority when this returns
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod mapped;
mod mem_store;
mod remote;
mod store;
mod uffd;

pub use mapped::{
    FaultPolicy, MapError, MapOptions, MappedMemory, Tracking, ViewStats, PAGE, PAGE_LINES,
};
pub use mem_store::{Call, MemLineStore};
pub use remote::{RemoteMemory, DEFAULT_DIRTY_LINES};
pub use store::{LineError, LineStore, LINE};
