//! The client memory controller of replicated persistent memory (docs/abd.md).
//!
//! Memory is an array of 64-byte lines ([`LINE`]), each replicated on several memory nodes
//! and kept consistent with ABD quorums. A [`LineStore`] reads and writes whole lines;
//! [`RemoteMemory`] builds byte-addressed memory on it: `read(addr, buf)`,
//! `write(addr, bytes)`, `persist()`, with a bounded buffer of dirty lines.
//!
//! [`MemLineStore`] is an in-memory store for tests and examples.

mod mem_store;
mod remote;
mod store;

pub use mem_store::{Call, MemLineStore};
pub use remote::{RemoteMemory, DEFAULT_DIRTY_LINES};
pub use store::{LineError, LineStore, LINE};
