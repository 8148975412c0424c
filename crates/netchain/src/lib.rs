//! NetChain's chain-replicated key-value store as pmnet's second kind of in-network function
//! (docs/netchain.md). Built so far: the key-value table in persistent memory — each key's
//! versions in a bucket of two crash-consistent records, written in numbered batches by one
//! executor ([`TableFile::persist_batch`]) that the runtime and the simulator share, and the
//! state machine side ([`Table`]) that decides what to write and reports what is durable.

mod client;
mod controller;
mod file;
mod function;
mod node;
mod table;
#[cfg(test)]
mod tests;

pub use client::{Busy, ChainClient, ClientConfig, ClientOp, Outcome, ReadFrom};
pub use controller::{
    decode_state, encode_state, Controller, ControllerConfig, ControllerCounters, StateError,
};
pub use file::{FileError, Geometry, Recovered, TableFile, TableWork, Version};
pub use function::ChainFunction;
pub use node::{
    group_of, rotated_groups, ChainConfig, ChainCounters, ChainNode, RESEND_FIRST, RESEND_MAX,
    SESSIONS_MAX,
};
pub use table::{KeySeq, Refused, Table, Written, PROBE_LIMIT};
