//! A deterministic simulator of the PMNet protocol.
//!
//! [`World`] wires the production state machines — clients, devices, servers — through an
//! in-memory network with virtual time, persistent logs on the simulated crash model, and the
//! real key-value store. The protocol crate's scenario tests drive it by hand; [`vopr`] drives
//! it from one seed through a safety phase full of faults and a liveness phase that heals
//! them, checking the protocol's invariants (see `docs/simulation.md`).

pub mod abd;
pub mod chain;
mod function_host;
mod net;
mod net_attacker;
pub mod vopr;
mod world;

pub use world::{
    client_addr, device_addr, replica_addr, server_addr, ClientNode, DeviceNode, Faults,
    NetworkCounters, Seen, ServerApp, ServerNode, Topology, World, DEVICE_ID, SERVER_ID, SLOT_SIZE,
};
