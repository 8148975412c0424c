//! `pmnet memory`: read and write lines of replicated persistent memory (docs/abd.md), through
//! a coordinating device or running the quorum here (the client-driven mode).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use pmnet_runtime::{load_key_file, AbdMode, AbdSession, AbdSessionConfig};

use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct MemoryArgs {
    /// The coordinating device (`pmnet device --abd-node ...`).
    #[arg(long, value_name = "ADDR", value_parser = crate::addr::parse_addr,
          conflicts_with = "nodes", required_unless_present = "nodes")]
    pub device: Option<SocketAddr>,

    /// A memory node (repeat for each): run the quorum here, with no device.
    #[arg(long = "node", value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub nodes: Vec<SocketAddr>,

    /// This client's writer id with --node (unique among the memory's writers; devices use
    /// their device ids, so pick another range, e.g. from 1000).
    #[arg(long, value_name = "ID", default_value_t = 1000)]
    pub writer: u16,

    /// Lines of the memory (as the nodes' --lines).
    #[arg(long, value_name = "N", default_value_t = 65_536)]
    pub lines: u32,

    /// Deployment keys (as the device's and nodes' --key-file).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,

    #[command(subcommand)]
    pub command: MemoryCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum MemoryCommand {
    /// Read COUNT lines from line FIRST and print them (text where printable, else hex).
    Read {
        first: u32,
        #[arg(default_value_t = 1)]
        count: u32,
    },
    /// Write TEXT to the lines from line FIRST on (padded with zero bytes to whole lines);
    /// returns once a majority of the nodes hold it durably.
    Write { first: u32, text: String },
}

fn show(line: &[u8]) -> String {
    let end = line
        .iter()
        .rposition(|byte| *byte != 0)
        .map_or(0, |at| at + 1);
    let used = &line[..end];
    if used
        .iter()
        .all(|byte| byte.is_ascii_graphic() || *byte == b' ')
    {
        format!("{:?}", String::from_utf8_lossy(used))
    } else {
        used.iter().map(|byte| format!("{byte:02x}")).collect()
    }
}

/// What to look at when no answer came.
fn hint(args: &MemoryArgs) -> String {
    match args.device {
        Some(device) => format!(
            "; is the device at {device} running with --abd-node for each memory node{}, and \
             are a majority of the nodes up (a new node joins a second after it starts)?",
            if args.key_file.is_some() {
                " and the same --key-file"
            } else {
                " (and no --key-file, as here)"
            }
        ),
        None => format!(
            "; are a majority of the memory nodes up (a new node joins a second after it \
             starts){}?",
            if args.key_file.is_some() {
                ", and do they run with the same --key-file"
            } else {
                ", and without --key-file (give theirs if they have one)"
            }
        ),
    }
}

pub fn run(args: MemoryArgs) -> Result<ExitCode, CliError> {
    let mode = match args.device {
        Some(device) => AbdMode::Device(device),
        None => AbdMode::Direct {
            nodes: args.nodes.clone(),
            writer: args.writer,
        },
    };
    let keys = match &args.key_file {
        Some(path) => Some(load_key_file(path)?),
        None => None,
    };
    let mut session = AbdSession::open(AbdSessionConfig {
        mode,
        lines: args.lines,
        keys,
    })
    .map_err(|error| format!("replicated memory: {error}"))?;
    let hint = hint(&args);
    match args.command {
        MemoryCommand::Read { first, count } => {
            if count == 0 || u64::from(first) + u64::from(count) > u64::from(args.lines) {
                return Err(format!(
                    "lines {first}..{} are outside the memory's {} lines",
                    u64::from(first) + u64::from(count),
                    args.lines
                )
                .into());
            }
            let lines = session
                .read(first, count)?
                .map_err(|error| format!("read: {error}{}", hint))?;
            for (i, line) in lines.chunks(pmnet_abd::LINE).enumerate() {
                println!("{} {}", first + i as u32, show(line));
            }
        }
        MemoryCommand::Write { first, text } => {
            let mut bytes = text.into_bytes();
            let len = bytes.len().max(1).div_ceil(pmnet_abd::LINE) * pmnet_abd::LINE;
            bytes.resize(len, 0);
            let count = (len / pmnet_abd::LINE) as u64;
            if u64::from(first) + count > u64::from(args.lines) {
                return Err(format!(
                    "lines {first}..{} are outside the memory's {} lines",
                    u64::from(first) + count,
                    args.lines
                )
                .into());
            }
            session
                .write(first, &bytes)?
                .map_err(|error| format!("write: {error}{}", hint))?;
            println!("ok: {count} line(s) from {first}, durable on a majority");
        }
    }
    Ok(ExitCode::SUCCESS)
}
