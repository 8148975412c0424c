//! Counters kept in replicated persistent memory (docs/abd.md): an array of 64-bit counters in
//! an mmap'ed view of the memory (`pmnet_memory::MappedMemory` over an ABD session), every
//! counter incremented once a round and the round made durable on a majority of memory nodes
//! with `persist()`. With `--kill-pid PID --kill-at ROUND` it SIGKILLs a memory node itself
//! mid-run (or kill one by hand): the rounds go on with the other two. At the end it reads
//! the counters back with fresh quorum reads and checks that every persisted round is there.
//!
//! Start three memory nodes and a device (README, "Replicated memory"), then:
//!
//! ```text
//! cargo run --release -p pmnet --example replicated_counters -- --device 127.0.0.1:7410
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Instant;

use pmnet_memory::{LineStore, MappedMemory, LINE};
use pmnet_runtime::{AbdMode, AbdSession, AbdSessionConfig};

/// Counters in the array: 64 lines of eight each, one page.
const COUNTERS: usize = 512;

struct Options {
    device: Option<SocketAddr>,
    nodes: Vec<SocketAddr>,
    writer: u16,
    lines: u32,
    first_line: u64,
    rounds: u64,
    kill: Option<(u32, u64)>,
}

fn usage() -> String {
    "usage: replicated_counters (--device ADDR | --node ADDR --node ADDR ... [--writer ID]) \
     [--lines N] [--first-line N] [--rounds N] [--kill-pid PID --kill-at ROUND]"
        .to_owned()
}

fn parse() -> Result<Options, String> {
    let mut options = Options {
        device: None,
        nodes: Vec::new(),
        writer: 1001,
        lines: 65_536,
        first_line: 0,
        rounds: 1000,
        kill: None,
    };
    let mut kill_pid = None;
    let mut kill_at = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value; {}", usage()))
        };
        let bad = |what: &str| format!("{flag}: {what}");
        match flag.as_str() {
            "--device" => options.device = Some(value()?.parse().map_err(|_| bad("an ADDR"))?),
            "--node" => options
                .nodes
                .push(value()?.parse().map_err(|_| bad("an ADDR"))?),
            "--writer" => options.writer = value()?.parse().map_err(|_| bad("a number"))?,
            "--lines" => options.lines = value()?.parse().map_err(|_| bad("a number"))?,
            "--first-line" => options.first_line = value()?.parse().map_err(|_| bad("a number"))?,
            "--rounds" => options.rounds = value()?.parse().map_err(|_| bad("a number"))?,
            "--kill-pid" => kill_pid = Some(value()?.parse().map_err(|_| bad("a pid"))?),
            "--kill-at" => kill_at = Some(value()?.parse().map_err(|_| bad("a round"))?),
            "--help" | "-h" => return Err(usage()),
            other => return Err(format!("unknown option {other}; {}", usage())),
        }
    }
    if options.device.is_some() != options.nodes.is_empty() {
        // Both given, or neither.
        return Err(format!(
            "give --device, or --node for each memory node; {}",
            usage()
        ));
    }
    options.kill = match (kill_pid, kill_at) {
        (Some(pid), Some(at)) => Some((pid, at)),
        (Some(pid), None) => Some((pid, options.rounds / 2)),
        (None, Some(_)) => return Err("--kill-at needs --kill-pid".to_owned()),
        (None, None) => None,
    };
    Ok(options)
}

fn session(options: &Options) -> Result<AbdSession, String> {
    let mode = match options.device {
        Some(device) => AbdMode::Device(device),
        None => AbdMode::Direct {
            nodes: options.nodes.clone(),
            writer: options.writer,
        },
    };
    AbdSession::open(AbdSessionConfig {
        mode,
        lines: options.lines,
        keys: None,
    })
    .map_err(|error| format!("replicated memory: {error}"))
}

fn run() -> Result<(), String> {
    let options = parse()?;
    let store = session(&options)?;
    let map_options = pmnet_memory::MapOptions {
        first_line: options.first_line,
        ..pmnet_memory::MapOptions::default()
    };
    let mut view = MappedMemory::map_with(store, 1, map_options)
        .map_err(|error| format!("mapping the counters: {error}"))?;
    println!(
        "{COUNTERS} counters at lines {}..{} of the replicated memory ({} tracking of writes)",
        options.first_line,
        options.first_line + 64,
        match view.tracking() {
            pmnet_memory::Tracking::WriteProtect => "write-protect",
            pmnet_memory::Tracking::Explicit => "explicit",
        }
    );
    // The first touch fetches the page with quorum reads: counters left by an earlier run.
    let start: Vec<u64> = view.words_mut()[..COUNTERS].to_vec();
    println!("  found counter 0 at {} (from earlier runs)", start[0]);
    let began = Instant::now();
    for round in 1..=options.rounds {
        for counter in view.words_mut()[..COUNTERS].iter_mut() {
            *counter += 1;
        }
        view.persist()
            .map_err(|error| format!("round {round}: persist: {error}"))?;
        if let Some((pid, at)) = options.kill {
            if round == at {
                // SAFETY: kill(2) with a pid and a signal number; no memory is shared.
                let killed = unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) } == 0;
                println!(
                    "  round {round}: SIGKILL to memory node pid {pid}: {}",
                    if killed {
                        "sent"
                    } else {
                        "failed (no such process?)"
                    }
                );
            }
        }
        if round % (options.rounds / 10).max(1) == 0 {
            println!(
                "  round {round}/{}: durable on a majority ({:.0} rounds/s)",
                options.rounds,
                round as f64 / began.elapsed().as_secs_f64()
            );
        }
    }
    drop(view);
    // Read every counter back with fresh quorum reads, through a new session.
    let mut check = session(&options)?;
    let mut bytes = vec![0u8; 64 * LINE];
    check
        .read_lines(options.first_line, 64, &mut bytes)
        .map_err(|error| format!("reading the counters back: {error}"))?;
    let wrong: Vec<usize> = (0..COUNTERS)
        .filter(|i| {
            let value = u64::from_ne_bytes(bytes[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            value != start[*i] + options.rounds
        })
        .collect();
    if !wrong.is_empty() {
        return Err(format!(
            "{} counters lost rounds (counter {} among them)",
            wrong.len(),
            wrong[0]
        ));
    }
    println!(
        "ok: all {COUNTERS} counters read back at +{} (every persisted round durable)",
        options.rounds
    );
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("replicated_counters: {error}");
            ExitCode::FAILURE
        }
    }
}
