//! The `pmnet` command's code: the product's commands (device, server, client, gateway, …),
//! run by the `pmnet` binary through [`cli::main`], and the pieces the benchmarks of
//! `pmnet-bench` (crates/bench) drive as a user's command line would: the loopback load
//! generator ([`loadgen`], which `pmnet demo` runs too), option parsers and the configuration
//! file.

pub mod addr;
mod chain_controller;
pub mod chain_lock;
pub mod cli;
mod client;
pub mod config;
mod controller;
mod demo;
mod forward;
mod generate;
mod keygen;
mod kv;
pub mod loadgen;
mod log_inspect;
mod memnode;
mod memory_cli;
pub mod node;
mod protect;
mod redis;
mod redis_up;
mod sim;
mod sim_abd;
mod sim_chain;
pub mod state_dir;
mod status;
mod store_cli;
mod testbed;

/// The error every command returns: a message for the user.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;

pub use memnode::LINES_MAX;
pub use redis_up::{durable_redis_args, module_file_beside, module_redis_args};
