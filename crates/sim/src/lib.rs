//! A deterministic simulator of the PMNet protocol.
//!
//! [`World`] wires the production state machines — clients, devices, servers — through an
//! in-memory [`Network`] (the one network every world runs on) with virtual time, persistent
//! logs on the simulated crash model, and the real key-value store. The protocol crate's
//! scenario tests drive it by hand; [`vopr`] drives it from one seed through a safety phase
//! full of faults and a liveness phase that heals them, checking the protocol's invariants
//! (see `docs/simulation.md`). The chain store's world ([`chain`]) and replicated memory's
//! ([`abd`]) run on the same [`Network`].

pub mod abd;
pub mod chain;
mod function_host;
mod network;
pub mod vopr;
mod world;

pub use network::{Attacker, Cut, Delay, Faults, Network, NetworkCounters, Seen, Trace, TracedRun};
pub use world::{
    client_addr, controller_addr, device_addr, replica_addr, server_addr, ClientNode,
    ControllerNode, DeviceNode, ServerApp, ServerNode, Topology, World, DEVICE_ID, SERVER_DOWN_MAX,
    SERVER_ID, SERVER_SUSPECT_AFTER, SLOT_SIZE, STATUS_INTERVAL, SUSPECT_AFTER,
};
