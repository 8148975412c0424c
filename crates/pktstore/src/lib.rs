//! The server's storage engine: **packets as persistent in-memory data structures**.
//!
//! After Honda, "Packets as Persistent In-Memory Data Structures" (HotNets 2021): a received
//! PMNet update datagram is kept, in persistent memory, as the stored record itself. The
//! network already gave it what a storage record needs:
//!
//! - **integrity**: the PMNet header's CRC32C (over header bytes 0..28 and the payload) is
//!   checked once on receipt, again at recovery and on every read; it is never computed on
//!   write;
//! - **ordering and dedupe**: the header's session id and sequence number; a session's last
//!   applied sequence number is read back from the stored headers, so it is durable exactly
//!   when the data is;
//! - **a receive timestamp** in the record's metadata line;
//! - **the index node**: the slot's metadata line carries the ordered index's level-0 link, so
//!   inserting a key allocates nothing and copies no key;
//! - **the buffer**: datagrams are received straight into free slots of the mapped region
//!   ([`Store::lend_receive_slots`]); a slot that holds a live record is never lent. Two
//!   receive paths do it: `recvmmsg` from a UDP socket ([`recv`]) and an AF_XDP socket whose
//!   UMEM is the store's region, so a steered frame is written by the kernel where its datagram
//!   stays as the record ([`xsk_recv`]).
//!
//! The same [`Store`] also runs the **conventional** engine ([`EngineKind::Conventional`]),
//! built the way persistent-memory key-value stores usually are: copy key and value into a
//! block from an allocator, compute its own CRC32C, link its own index node. Both engines share
//! the commit protocol, the index structure and the session table, so what differs between
//! them is exactly the data-management work of Table 1 of the paper; [`bench`] measures it.
//!
//! See `docs/storage.md` for the layout, the crash-consistency argument, what is simplified,
//! and the measurements.

pub mod bench;
pub mod breakdown;
mod buddy;
mod index;
pub mod layout;
#[cfg(target_os = "linux")]
pub mod recv;
mod sessions;
mod store;
#[cfg(target_os = "linux")]
pub mod xsk_recv;

pub use layout::EngineKind;
pub use store::{
    CopyError, CopyReport, Corruption, ReceiveReject, ReceiveSlot, RecoveryReport, Store,
    StoreConfig, StoreError, StoreStats, Value, COPY_SESSION,
};

#[cfg(test)]
mod tests;
