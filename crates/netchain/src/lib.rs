//! NetChain's chain-replicated key-value store as pmnet's second kind of in-network function
//! (docs/netchain.md): the chain member ([`ChainNode`], and [`ChainFunction`] in a device's
//! pipeline) over its table in persistent memory (`pmnet-pmtable`, re-exported here), the
//! client session ([`ChainClient`]) and the controller ([`Controller`]).

mod capacity;
mod client;
mod controller;
mod function;
mod node;

pub use capacity::{CapacityLimited, WAITING_MAX as CAPACITY_WAITING_MAX};
pub use client::{Busy, ChainClient, ClientConfig, ClientOp, Outcome, ReadFrom};
pub use controller::{
    decode_state, encode_state, Controller, ControllerConfig, ControllerCounters, ControllerEvent,
    MemberState, StateError, EVENTS_MAX,
};
pub use function::ChainFunction;
pub use node::{
    group_of, rotated_groups, ChainConfig, ChainCounters, ChainNode, MAX_CONTROLLERS, RESEND_FIRST,
    RESEND_MAX, SESSIONS_MAX,
};
pub use pmnet_pmtable::{
    FileError, Geometry, KeySeq, Recovered, Refused, Table, TableFile, TableWork, Version, Written,
    PROBE_LIMIT,
};
