//! The server's embedded durable key-value store, its request/reply encoding, and the ideal
//! handler.
//!
//! - [`codec`]: the byte-exact encoding of key-value requests and replies carried in PMNet
//!   payloads ([`Request`], [`Reply`], [`DecodeError`]).
//! - [`Application`]: what the server runtime calls to apply a session's request exactly once
//!   and to learn, after a restart, each session's last applied seq and reply; [`NoSpace`]
//!   when the store has no room for a request (nothing of it is made durable).
//! - [`KvStore`]: a small durable key-value store on one [`pmnet_pm::PmRegion`] whose every
//!   apply is crash-atomic with its dedupe record.
//! - [`IdealHandler`]: replies OK to everything and keeps nothing, for microbenchmarks.

pub mod app;
pub mod codec;
pub mod ideal;
pub mod kv;

pub use app::{stale_reply, Application, NoSpace, SessionRecord};
pub use codec::{DecodeError, Reply, Request};
pub use ideal::IdealHandler;
pub use kv::{KvConfig, KvStats, KvStore, Recovery, RejectReason, RejectedRecord, StoreError};
