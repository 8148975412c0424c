//! Devices in series (docs/replication.md): the wire's part of replication in the network.
//!
//! A client that wants an update to survive the permanent loss of R − 1 devices sends it
//! through R devices in series (client → D1 → … → DR → server) and completes it when every
//! fragment holds PMNet-ACKs from R distinct devices (the acks' `device_id`s). Each device
//! logs the update and sends its own PMNet-ACK towards the client; a device passes on, towards
//! the client, the PMNet-ACKs and not-logged notices that come from the next device (its
//! "server" address). The client marks such an update [`REPLICATED`]: a device then never
//! keeps the server-ACK back on the strength of its own acks (the client needs the others'
//! too), and the server-ACK travels back through every device, freeing each one's entry.

/// Header flag of an update request whose client waits for PMNet-ACKs from more than one
/// device (bit 10: among the bits reserved for the in-network functions).
pub const REPLICATED: u16 = 1 << 10;
