//! PMNet in front of a real Redis.
//!
//! - [`adaptor`]: the PMNet server side for a `redis-server`: applies each session's requests
//!   in order over pipelined RESP connections, exactly once across crashes (one Lua script per
//!   write records the session's sequence number and reply atomically with the write), and
//!   sends the server-ACK only after Redis replied (with `appendfsync always`, after its fsync).
//! - [`gateway`]: a RESP server for unmodified Redis clients (`redis-cli`, `redis-benchmark`):
//!   each connection is a PMNet session; fixed-reply writes are PMNet updates answered when the
//!   device has logged them, everything else is a bypass request answered with Redis's reply.
//! - [`resp`]: the RESP2 codec both use; [`commands`]: the routing table; [`script`]: the Lua
//!   scripts and the record layout.
//!
//! The request payload on the wire is one RESP-encoded command (an array of bulk strings); the
//! reply payload is Redis's RESP reply. See docs/redis.md.

pub mod adaptor;
pub mod commands;
pub mod gateway;
pub mod resp;
pub mod resp3;
pub mod script;
pub mod table;

pub use adaptor::{Adaptor, AdaptorError, AdaptorOptions, AdaptorStartup, Durability};
pub use gateway::{Gateway, GatewayError, GatewayOptions};
