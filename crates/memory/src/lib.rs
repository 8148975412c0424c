//! The client memory controller of replicated persistent memory (docs/abd.md).

mod store;

pub use store::{LineError, LineStore, LINE};
