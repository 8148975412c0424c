//! `pmnet memnode`: a memory node of replicated persistent memory (docs/abd.md): 64-byte
//! lines, each with its timestamp in one crash-consistent record of a mapped file, answering
//! the coordinators (devices with `--abd-node`, or clients running the quorum themselves).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use pmnet_pmtable::{Geometry, Recovered, Table, TableFile};
use pmnet_runtime::{auth_text, DeviceOptions, DeviceRuntime, Shutdown};

use crate::node::{LoopArgs, MediumArgs};
use crate::CliError;

/// Lines a memory node holds at most (4 GiB of lines).
pub const LINES_MAX: u32 = 1 << 26;

#[derive(Debug, Clone, Args)]
pub struct MemnodeArgs {
    /// Where coordinators (devices, or clients in the client-driven mode) reach the node.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7800", value_parser = crate::addr::parse_addr)]
    pub listen: SocketAddr,

    /// Another memory node of the same memory (repeat for each). A node that lost its memory
    /// (a new file) copies every line from a majority of them before it counts in a quorum.
    #[arg(long = "peer", value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub peers: Vec<SocketAddr>,

    /// Lines of 64 bytes (every node and coordinator of one memory uses the same number).
    #[arg(long, value_name = "N", default_value_t = 65_536)]
    pub lines: u32,

    /// The lines' file (default: pmnet-memnode-<PORT>.lines in --dir); made if missing: a new
    /// file is a node that lost its memory, and learns before it counts.
    #[arg(long, value_name = "PATH")]
    pub file: Option<PathBuf>,

    #[command(flatten)]
    pub medium: MediumArgs,

    #[command(flatten)]
    pub run: LoopArgs,
}

impl MemnodeArgs {
    fn path(&self) -> PathBuf {
        self.file.clone().unwrap_or_else(|| {
            (self.medium).default_file(&format!("pmnet-memnode-{}.lines", self.listen.port()))
        })
    }
}

/// The geometry of a memory node's file of `lines` lines: one bucket per line and one for the
/// node's membership record; 4-byte keys (the line's number), 64-byte values.
pub fn geometry(lines: u32) -> Geometry {
    Geometry {
        buckets: lines + 1,
        key_max: 4,
        value_max: pmnet_abd::LINE as u16,
    }
}

pub fn run(args: MemnodeArgs) -> Result<ExitCode, CliError> {
    if args.lines == 0 || args.lines > LINES_MAX {
        return Err(format!("--lines {}: give 1 to {LINES_MAX}", args.lines).into());
    }
    if args.peers.contains(&args.listen) {
        return Err(format!(
            "--peer {}: that is this node's own address (--listen); name the other nodes",
            args.listen
        )
        .into());
    }
    if args.peers.len() + 1 > pmnet_abd::NODES_MAX {
        return Err(format!(
            "{} peers: a memory has at most {} nodes",
            args.peers.len(),
            pmnet_abd::NODES_MAX
        )
        .into());
    }
    let shutdown = Shutdown::on_signals()?;
    let keys = args.run.keys()?;
    args.run.protect(
        "memnode",
        &[crate::protect::Listener::Addr("--listen", args.listen)],
        keys.as_ref(),
    )?;
    let traffic = auth_text(keys.as_ref());
    let path = args.path();
    let options = args.medium.mmap_options();
    let geometry = geometry(args.lines);
    let file_error = |what: String| format!("memory node file {}: {what}", path.display());
    let exists = path.exists() && !args.medium.format;
    let (file, recovered) = if exists {
        let region = pmnet_pm::MmapRegion::open(&path, options)
            .map_err(|error| file_error(error.to_string()))?;
        let (file, recovered) = TableFile::open(region).map_err(|error| {
            file_error(format!(
                "{error}; move it aside (the node then learns its lines from the others) or \
                 point --file at another file"
            ))
        })?;
        if file.geometry() != geometry {
            return Err(file_error(format!(
                "it holds {} lines, not the {} of --lines (every node of a memory has the same)",
                file.geometry().buckets.saturating_sub(1),
                args.lines
            ))
            .into());
        }
        (file, recovered)
    } else {
        if args.medium.format {
            let _ = std::fs::remove_file(&path);
        }
        let (region, new_file) =
            pmnet_pm::MmapRegion::create_new(&path, geometry.region_len(), options)
                .map_err(|error| file_error(error.to_string()))?;
        let file =
            TableFile::format(region, geometry).map_err(|error| file_error(error.to_string()))?;
        new_file
            .publish()
            .map_err(|error| file_error(error.to_string()))?;
        (file, Recovered::default())
    };
    if recovered.damaged_records > 0 {
        tracing::warn!(
            "memory node file {}: {} damaged records ignored (torn writes never acknowledged: \
             each line's other record holds it)",
            path.display(),
            recovered.damaged_records
        );
    }
    let table = Table::recover_direct(file.geometry(), recovered);
    let config = pmnet_abd::NodeConfig {
        peers: args.peers.clone(),
        lines: args.lines,
        // Stored counters are bounded by what a coordinator's clock can have reached.
        counter_clock: Some(pmnet_runtime::abd_counter_floor()),
    };
    let node = pmnet_abd::MemNode::new(config, table, pmnet_proto::Time::ZERO);
    let state = node.state_text();
    let held = node.lines_held();
    let function = pmnet_abd::MemNodeFunction::new(node, geometry);
    let options = DeviceOptions {
        device_id: 0,
        listen: args.listen,
        servers: Vec::new(),
        previous_devices: Vec::new(),
        follow: None,
        log: None,
        forward_listen: None,
        echo_listen: None,
        max_resends_in_flight: None,
        resend_timeout: None,
        keys,
        batch: false,
        batch_hold: std::time::Duration::ZERO,
        xdp: None,
        loop_options: args.run.loop_options(),
    };
    let mut device = DeviceRuntime::open_with_functions(
        options,
        shutdown,
        vec![pmnet_runtime::DeviceFunction::on(
            Box::new(function),
            file.into_region(),
        )],
    )?;
    // A memory node's drops (datagrams that failed verification, or no memory node's type)
    // are its own, not a PMNet device's.
    device.name_drops_as(
        "pmnet_memnode_datagrams_dropped_total",
        "pmnet_memnode_datagrams_dropped_all_total",
    );
    device.serve_as("memnode");
    let lines = [
        format!("pmnet memnode listening on {}", device.addresses().data),
        format!(
            "  lines: {} of 64 bytes in {} ({}; {held} written)",
            args.lines,
            path.display(),
            if exists { "reopened" } else { "new" }
        ),
        format!("  medium: {}", device.startup().medium_text()),
        format!("  state: {state}"),
        format!(
            "  peers: {}",
            if args.peers.is_empty() {
                "none (a memory of one node: no replication)".to_owned()
            } else {
                args.peers
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
        format!("  traffic: {traffic}"),
        format!("  {}", args.run.describe(device.addresses().metrics)),
    ];
    let mut out = std::io::stdout().lock();
    for line in &lines {
        let _ = writeln!(out, "{line}");
    }
    let _ = out.flush();
    drop(out);
    device.run()?;
    Ok(ExitCode::SUCCESS)
}
