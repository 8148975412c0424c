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

/// Header flag of a request a primary server forwards to its replica servers as it applied it
/// (bit 11; docs/replication.md, "Replicated servers"): a barrier descriptor naming the
/// request the primary applied before it comes first, so its fragments are cut from a
/// different payload than the client's. A replica never mixes fragments with and without it
/// in one request: a fragment that disagrees replaces the unfinished request.
pub const FROM_PRIMARY: u16 = 1 << 11;

/// Header flag of the traffic between a primary server and one of its replicas (bit 14): a
/// request the primary sends the replica (forwarded, or a duplicate passed on), and the
/// server-ACK the replica answers with. `device_id` names the replica: its place in the
/// primary's `--replica` list, plus one. A replica's ack says the replica applied the request,
/// not that the primary did: no client or device takes it, and a primary counts it only for
/// the replica it names (with keys flag and id are authenticated: a replica's ack replayed to
/// a client, or as another replica's, counts for nothing).
pub const REPLICA: u16 = 1 << 14;
