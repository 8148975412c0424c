//! Replicated persistent memory (docs/abd.md): every 64-byte line is a multi-writer,
//! multi-reader atomic register replicated on several memory nodes and kept consistent with
//! the Attiya–Bar-Noy–Dolev protocol.
//!
//! - [`MemNode`]: a memory node over its lines in persistent memory (a direct-mapped
//!   `pmnet-pmtable` table: a line and its timestamp in one crash-consistent record), and
//!   [`MemNodeFunction`], the same in a pipeline.
//! - [`Coordinator`]: runs reads and writes against a majority of the nodes; in a device as
//!   [`AbdFunction`], in front of the log, or in the client itself (the client-driven mode).
//! - [`AbdClient`]: a client's session with a coordinating device.
//!
//! No I/O anywhere: the runtime and the simulator drive the same state machines.

mod client;
mod coordinator;
mod function;
mod node;

pub use client::{AbdClient, ClientConfig, ClientDone, WINDOW};
pub use coordinator::{
    counter_floor_at, Coordinator, CoordinatorConfig, CoordinatorCounters, Done, OpKind,
    COUNTER_EPOCH_UNIX_S, COUNTER_TICK_US, NODES_MAX, OPS_MAX, OP_DEADLINE, RESEND_FIRST,
    RESEND_MAX,
};
pub use function::{AbdFunction, FunctionCounters, MemNodeFunction, SESSIONS_MAX};
pub use node::{
    MemNode, NodeConfig, NodeCounters, COUNTER_LEAD_MAX, COUNTER_STEP_MAX, LEARN_WAIT, SYNC_RESEND,
    SYNC_SCAN, WAITERS_MAX,
};
pub use pmnet_wire::abd::{LINE, LINES_MAX};

/// Why an operation on lines failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbdError {
    /// A malformed request (no lines, more than 16, a write's bytes not matching).
    BadRequest,
    /// Lines beyond the memory's end.
    OutOfRange,
    /// No majority of nodes answered in time: the operation may or may not have taken
    /// effect.
    Unavailable,
    /// A write the coordinator no longer knows (it restarted, or forgot the session): it may
    /// or may not have taken effect.
    InDoubt,
    /// The coordinator has as many operations in flight as it keeps.
    Busy,
}

impl std::fmt::Display for AbdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AbdError::BadRequest => "a malformed request",
            AbdError::OutOfRange => "lines beyond the memory's end",
            AbdError::Unavailable => {
                "no majority of memory nodes answered in time (it may or may not have taken effect)"
            }
            AbdError::InDoubt => {
                "the coordinator no longer knows this write (it may or may not have taken effect)"
            }
            AbdError::Busy => "the coordinator has as many operations in flight as it keeps",
        })
    }
}

impl std::error::Error for AbdError {}

/// The group's majority of `nodes`.
pub fn majority(nodes: usize) -> usize {
    nodes / 2 + 1
}

#[cfg(test)]
mod tests;
