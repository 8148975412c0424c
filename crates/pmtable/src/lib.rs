//! A versioned key-value table in persistent memory (docs/netchain.md, "The table in
//! persistent memory"): each key's versions in a bucket of two crash-consistent records
//! (the current one: the higher generation whose checksum holds), a version taken only if it
//! is newer than the key's (or, for a member copying its source, whatever it is), written in
//! numbered batches by one executor ([`TableFile::persist_batch`]) that the runtime and the
//! simulator share, and the state machine side ([`Table`]) that decides what to write and
//! reports what is durable. The chain store keeps its keys in it.

mod file;
mod table;
#[cfg(test)]
mod tests;

pub use file::{
    region_batch, FileError, Geometry, Recovered, TableFile, TableWork, Version, SUPERBLOCK_LEN,
};
pub use table::{
    direct_bucket, direct_key, key_hash, KeySeq, Page, Refused, Table, Written, PAGE_SCAN,
    PROBE_LIMIT,
};
