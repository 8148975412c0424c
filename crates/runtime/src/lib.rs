//! The PMNet runtime: drives the I/O-free state machines of `pmnet-proto` over real UDP.
//!
//! - [`DeviceRuntime`]: the PMNet device. Opens (or formats) its log file, rebuilds the
//!   [`pmnet_proto::Device`] from the recovered entries, and runs a loop that receives batches
//!   of datagrams, carries out the log writes in order (a PMNet-ACK leaves only after
//!   [`pmnet_pm::PmLog`] returned from the write), and sends in batches. Optionally a second
//!   port that forwards without logging (a plain switch, for comparison) and a UDP echo port
//!   (the floor for any acknowledgement).
//! - [`ServerRuntime`]: the server. Opens its key-value store (or the ideal handler), tells the
//!   [`pmnet_proto::Server`] what the store recovered, polls its devices, and applies requests
//!   (the server-ACK leaves only after [`pmnet_store::Application::apply`] returned).
//! - [`ClientSession`]: one client session on its own UDP socket, for the `pmnet client` command
//!   and the benchmark.
//!
//! Every loop receives and sends with `recvmmsg`/`sendmmsg` ([`udp::BATCH_LEN`] datagrams per
//! call), waits with `ppoll` until the next datagram or timer ([`WaitMode::Blocking`]) or spins
//! ([`WaitMode::BusyPoll`]), may be pinned to a CPU, stops cleanly on SIGINT/SIGTERM through a
//! [`Shutdown`] flag, and publishes its counters in the Prometheus text format.
//!
//! # The client API
//!
//! A [`ClientSession`] is one PMNet session: updates complete when a device has logged them
//! (its PMNet-ACK) or, if no device could, with the server's reply; other requests (bypass)
//! complete with the server's reply, in order with the session's updates. Payloads are the
//! application's; with the embedded store they are [`pmnet_store::Request`]s:
//!
//! ```no_run
//! use pmnet_proto::Completion;
//! use pmnet_runtime::{ClientSession, SessionOptions};
//! use pmnet_store::{Reply, Request};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Server 1, reached through the device at 10.0.0.2:7400.
//! let device = "10.0.0.2:7400".parse()?;
//! let mut session = ClientSession::open(SessionOptions::new(1, device))?;
//! let set = Request::Set { key: b"greeting", value: b"hello" };
//! if let Completion::Logged { device_id } = session.update(&set.to_bytes())? {
//!     println!("durable in the log of device {device_id}");
//! }
//! let get = Request::Get { key: b"greeting" };
//! if let Completion::Replied { reply, .. } = session.bypass(&get.to_bytes())? {
//!     assert_eq!(Reply::decode(&reply)?, Reply::Value(b"hello".to_vec()));
//! }
//! # Ok(())
//! # }
//! ```
//!
//! `examples/kv_client.rs` runs the same against a server and a device it starts in-process:
//! `cargo run -p pmnet-runtime --example kv_client`.

mod abd_client;
mod chain_client;
mod chain_controller;
mod client;
pub mod control_plane;
mod device;
mod event_loop;
mod keys;
pub mod metrics;
mod peer_book;
mod peers;
mod relay;
mod route_status;
mod server;
mod shutdown;
pub mod trace;
pub mod udp;
mod wait;
pub mod xdp_path;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use abd_client::{abd_counter_floor, AbdMode, AbdSession, AbdSessionConfig};
pub use chain_client::ChainSession;
pub use chain_controller::{
    describe as describe_layout, ControllerRuntime, RunEnd, StateStore, CONTROLLER_LEADING,
    CONTROLLER_LEADING_HELP,
};
pub use client::{random_session_id, steer_session, ClientSession, SessionOptions};
pub use device::{
    stale_worker_logs, worker_log_path, DeviceAddresses, DeviceFunction, DeviceOptions,
    DeviceRuntime, DeviceStartup, LogOptions, ECHO_MAX_QUEUED, WORKERS_MAX,
};
pub use event_loop::{
    publish_node, run_loop, wait_once, LoopCounters, LoopSettings, Node, Ready, Turn,
};
pub use keys::{auth_text, load_key_file};
pub use metrics::{Metrics, MetricsBoard};
pub use peers::{wants_answer, PeerWatch, SILENCE_WARNING};
pub use pmnet_auth::KeySet;
pub use pmnet_xdp::AttachMode;
pub use relay::{RelayOptions, UdpRelay};
pub use server::{
    check_max_ops_per_s, emulated_capacity_text, forward_log_path, ServerAddresses, ServerApp,
    ServerOptions, ServerRuntime, ServerStartup, ServerXdpOptions, StoreGrowth, StoreOptions,
    TokenBucket, FORWARD_LOG_SLOTS, FORWARD_LOG_SLOT_SIZE,
};
pub use shutdown::Shutdown;
pub use wait::{online_cpu_count, pin_current_thread, poll, yield_cpu, Clock, PollFd, WaitMode};
pub use xdp_path::{xdp_available, XdpOptions, XdpPath};

/// How an event loop runs: shared by the device and the server.
#[derive(Debug, Clone)]
pub struct LoopOptions {
    pub wait: WaitMode,
    /// Pin the loop's thread to this CPU.
    pub cpu: Option<usize>,
    /// Log a line of counters at info level this often (`None`: never).
    pub report_interval: Option<Duration>,
    /// Serve the counters in the Prometheus text format on this TCP address.
    pub metrics_listen: Option<SocketAddr>,
    /// Datagrams queued for sending per socket at most; beyond it they are dropped and counted.
    pub max_queued: usize,
}

impl Default for LoopOptions {
    fn default() -> Self {
        LoopOptions {
            wait: WaitMode::Blocking,
            cpu: None,
            report_interval: Some(Duration::from_secs(10)),
            metrics_listen: None,
            max_queued: 1 << 16,
        }
    }
}

/// How often a loop renders its metrics for the endpoint on its own (a scrape asks for fresh
/// values, answered at the end of the loop's next turn).
const METRICS_PUBLISH_INTERVAL: Duration = Duration::from_secs(1);

/// Why a runtime could not start. Every message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(
        "cannot bind the {what} socket to {addr}: {source}; choose another address or port \
         (port 0 picks a free one)"
    )]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the device log {}: {source}", path.display())]
    LogFile {
        path: PathBuf,
        #[source]
        source: pmnet_pm::PmError,
    },
    #[error("device log {}: {source}", path.display())]
    Log {
        path: PathBuf,
        #[source]
        source: pmnet_pm::LogError,
    },
    #[error(
        "{problem}. It may have held updates that were acknowledged, so the device does not \
         start on it: restore the file from a copy, or pass --format to erase it and start with \
         an empty log (everything in it is lost)"
    )]
    LogUnusable { problem: pmnet_pm::LogFileError },
    #[error("cannot open the data file {}: {source}", path.display())]
    DataFile {
        path: PathBuf,
        #[source]
        source: pmnet_pm::PmError,
    },
    #[error(
        "data file {}: {source}; point --data-file at another file, or pass --format to erase \
         it and start an empty store",
        path.display()
    )]
    Store {
        path: PathBuf,
        #[source]
        source: pmnet_store::StoreError,
    },
    #[error(
        "data file {} ({file_len} bytes) holds no usable {engine} store: {problem}. It may have \
         held updates that were acknowledged, so the server does not start on it: restore the \
         file from a copy, point --data-file at another file, or pass --format to erase it and \
         start an empty store (everything in it is lost)",
        path.display()
    )]
    StoreUnusable {
        path: PathBuf,
        file_len: u64,
        engine: String,
        problem: String,
    },
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Pin(String),
}

/// Start the metrics endpoint if asked for.
fn start_metrics(
    options: &LoopOptions,
    board: &MetricsBoard,
    shutdown: &Shutdown,
) -> Result<Option<SocketAddr>, RuntimeError> {
    let Some(addr) = options.metrics_listen else {
        return Ok(None);
    };
    metrics::serve_metrics(addr, board.clone(), shutdown.clone())
        .map(Some)
        .map_err(|source| RuntimeError::Bind {
            what: "metrics",
            addr,
            source,
        })
}

/// Per-type counts by type name, in slot order: the slots no packet type has are summed into
/// one `other` (one series each, never two with the same labels).
fn by_type_name(counts: &[u64; udp::TYPE_SLOT_COUNT]) -> Vec<(&'static str, u64)> {
    let mut named: Vec<(&'static str, u64)> = Vec::with_capacity(udp::TYPE_SLOT_COUNT);
    for (slot, count) in counts.iter().enumerate() {
        let name = udp::type_slot_name(slot);
        match named.iter_mut().find(|(seen, _)| *seen == name) {
            Some((_, total)) => *total += count,
            None => named.push((name, *count)),
        }
    }
    named
}

/// Counters of a socket as metrics, labelled with the socket's role.
fn socket_metrics(out: &mut Metrics, socket: &str, counters: &udp::SocketCounters) {
    for (type_name, count) in by_type_name(&counters.received_by_type) {
        out.counter(
            "pmnet_packets_received_total",
            "Datagrams received, by socket and PMNet type (\"other\": not a PMNet datagram).",
            &[("socket", socket), ("type", type_name)],
            count,
        );
    }
    for (type_name, count) in by_type_name(&counters.sent_by_type) {
        out.counter(
            "pmnet_packets_sent_total",
            "Datagrams sent, by socket and PMNet type.",
            &[("socket", socket), ("type", type_name)],
            count,
        );
    }
    let labels = [("socket", socket)];
    out.counter(
        "pmnet_bytes_received_total",
        "Bytes of datagrams received.",
        &labels,
        counters.bytes_received,
    );
    out.counter(
        "pmnet_bytes_sent_total",
        "Bytes of datagrams sent.",
        &labels,
        counters.bytes_sent,
    );
    out.counter(
        "pmnet_receive_batches_total",
        "recvmmsg calls that returned datagrams.",
        &labels,
        counters.receive_batches,
    );
    out.counter(
        "pmnet_send_batches_total",
        "sendmmsg calls that sent datagrams.",
        &labels,
        counters.send_batches,
    );
    for (reason, value) in [
        ("truncated", counters.truncated),
        ("unknown_source", counters.unknown_source),
        ("send_error", counters.send_errors),
        ("send_queue_full", counters.send_queue_full),
        ("receive_error", counters.receive_errors),
    ] {
        out.counter(
            "pmnet_socket_dropped_total",
            "Datagrams the runtime dropped, by socket and reason.",
            &[("socket", socket), ("reason", reason)],
            value,
        );
    }
}

/// A client's request latencies as histograms (the gateway's sessions, summed).
pub fn client_latency_metrics(out: &mut Metrics, latency: &pmnet_proto::ClientLatency) {
    out.histogram(
        "pmnet_client_pmnet_ack_latency_seconds",
        "Time from sending an update to the PMNet-ACKs of all its fragments (updates a device logged).",
        &[],
        &latency.pmnet_ack,
    );
    out.histogram(
        "pmnet_client_server_reply_latency_seconds",
        "Time from sending a request to the server's reply (requests that completed on it: reads, and updates no device acked).",
        &[],
        &latency.server_reply,
    );
}

/// A one-line digest of a socket's counters for the periodic report.
fn socket_digest(counters: &udp::SocketCounters) -> String {
    let mut text = format!(
        "in {} out {}",
        counters.received_total(),
        counters.sent_total()
    );
    let dropped = counters.truncated
        + counters.unknown_source
        + counters.send_errors
        + counters.send_queue_full
        + counters.receive_errors;
    if dropped > 0 {
        text.push_str(&format!(" socket-drops {dropped}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sockets_series_are_each_named_once() {
        let mut counters = udp::SocketCounters::default();
        for (slot, count) in counters.received_by_type.iter_mut().enumerate() {
            *count = slot as u64 + 1;
        }
        let mut out = Metrics::default();
        socket_metrics(&mut out, "device", &counters);
        let text = out.render();
        let mut series = std::collections::HashSet::new();
        for line in text.lines().filter(|line| !line.starts_with('#')) {
            let name = line.rsplit_once(' ').map_or(line, |(name, _)| name);
            assert!(series.insert(name.to_owned()), "{name} twice in:\n{text}");
        }
        // Every datagram counted once: the slots without a type summed into "other".
        let total: u64 = by_type_name(&counters.received_by_type)
            .iter()
            .map(|(_, count)| count)
            .sum();
        assert_eq!(total, counters.received_total());
    }
}
