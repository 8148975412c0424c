//! `pmnet client`: key-value requests from the command line or a prompt.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use pmnet_proto::{ClientError, Completion};
use pmnet_runtime::{ClientSession, SessionOptions, WaitMode};
use pmnet_store::{Reply, Request};

use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Where requests go: the PMNet device in front of the server (or the server itself, to
    /// bypass the device). For a device run with `--workers`, every worker's address,
    /// comma-separated: the session goes to one of them by its id.
    #[arg(
        long,
        visible_alias = "to",
        value_name = "ADDR[,ADDR...]",
        value_delimiter = ',',
        default_value = "127.0.0.1:7400",
        value_parser = crate::addr::parse_addr,
    )]
    pub device: Vec<SocketAddr>,

    /// The server the requests are for (its `--server-id`).
    #[arg(long, value_name = "ID", default_value_t = 1)]
    pub server_id: u16,

    /// Spin while waiting for replies instead of sleeping.
    #[arg(long)]
    pub busy_poll: bool,

    /// Seconds a request is tried before it fails (at most 15: a server closes a gap its
    /// client left once that is past).
    #[arg(long, value_name = "SECONDS", default_value_t = 12.0,
          value_parser = |text: &str| crate::node::parse_seconds_at_least(text, 0.001)
              .and_then(|seconds| if seconds <= 15.0 { Ok(seconds) } else {
                  Err(format!("{seconds} is out of range: give at most 15 seconds"))
              }))]
    pub request_lifetime: f64,

    /// Authenticate every datagram with the deployment keys in this file (mode 0600; make one
    /// with `pmnet keygen`). Without it traffic is not authenticated.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<std::path::PathBuf>,

    /// Devices whose PMNet-ACKs an update waits for: it then survives the permanent loss of
    /// all but one of them (docs/replication.md). The devices are in series (`--device` is the
    /// first; each forwards to the next), or with `--fan-out` the ones given.
    #[arg(long, value_name = "R", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=i64::from(pmnet_proto::REPLICAS_MAX)))]
    pub replicas: u8,

    /// Fan-out replication: send every update at once to these devices as well as to
    /// `--device`; each logs it, acks it and forwards it to the server, which applies it once
    /// (run each with `--server` the same server, and the server with every one of them as a
    /// `--device`). `--replicas` of them must ack (at most 1 + their number).
    #[arg(long, value_name = "ADDR[,ADDR...]", value_delimiter = ',',
          value_parser = crate::addr::parse_addr)]
    pub fan_out: Vec<SocketAddr>,

    /// A controller of the chain of devices that starts at `--device` (`pmnet controller
    /// --device-chain`): when updates go unanswered the client asks it where the chain starts
    /// now and follows (docs/replication.md, "Automatic failover"). Repeat for each
    /// controller (at most 7).
    #[arg(long = "controller", value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub controllers: Vec<SocketAddr>,

    /// The request; without one, read requests line by line from standard input
    /// (`set k v`, `get k`, `del k`, `incr k [delta]`, `quit`).
    #[command(subcommand)]
    pub request: Option<KvCommand>,
}

#[derive(Debug, Clone, Subcommand, PartialEq, Eq)]
pub enum KvCommand {
    /// Store VALUE under KEY (an update: acked as soon as a device has logged it).
    Set { key: String, value: String },
    /// Print the value of KEY (a bypass request: answered by the server).
    Get { key: String },
    /// Delete KEY (an update).
    Del { key: String },
    /// Add DELTA (default 1) to the integer under KEY and print the result (a bypass request).
    Incr {
        key: String,
        #[arg(default_value_t = 1, allow_negative_numbers = true)]
        delta: i64,
    },
}

impl KvCommand {
    /// Parse a line typed at the prompt.
    fn parse_line(line: &str) -> Result<Option<KvCommand>, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let usage = "requests: set KEY VALUE | get KEY | del KEY | incr KEY [DELTA] | quit";
        match words.as_slice() {
            [] => Ok(None),
            [verb, rest @ ..] => match (verb.to_ascii_lowercase().as_str(), rest) {
                ("set", [key, value @ ..]) if !value.is_empty() => Ok(Some(KvCommand::Set {
                    key: key.to_string(),
                    value: value.join(" "),
                })),
                ("get", [key]) => Ok(Some(KvCommand::Get {
                    key: key.to_string(),
                })),
                ("del", [key]) => Ok(Some(KvCommand::Del {
                    key: key.to_string(),
                })),
                ("incr", [key]) => Ok(Some(KvCommand::Incr {
                    key: key.to_string(),
                    delta: 1,
                })),
                ("incr", [key, delta]) => match delta.parse() {
                    Ok(delta) => Ok(Some(KvCommand::Incr {
                        key: key.to_string(),
                        delta,
                    })),
                    Err(_) => Err(format!("{delta:?} is not an integer; {usage}")),
                },
                _ => Err(usage.to_owned()),
            },
        }
    }
}

pub fn run(args: ClientArgs) -> Result<ExitCode, CliError> {
    let (&first, more) = args
        .device
        .split_first()
        .ok_or("--device needs an address")?;
    let mut options = SessionOptions::new(args.server_id, first);
    options.more_peers = more.to_vec();
    options.wait = WaitMode::from_busy_poll(args.busy_poll);
    options.replicas = args.replicas;
    check_fan_out(&args.fan_out, more.len(), args.replicas)?;
    options.fan_out = args.fan_out.clone();
    crate::node::check_controllers(&args.controllers)?;
    options.controllers = args.controllers.clone();
    options.request_lifetime = Some(std::time::Duration::from_secs_f64(args.request_lifetime));
    if let Some(path) = &args.key_file {
        options.keys = Some(pmnet_runtime::load_key_file(path)?);
    }
    let mut session = ClientSession::open(options)?;
    // With a controller: the chain's length is known, and a --replicas longer than it refused
    // before anything is sent (without one, the server's reply says so after the fact).
    if !args.controllers.is_empty() {
        match session.fetch_route(std::time::Duration::from_secs(1)) {
            Some(devices) if usize::from(args.replicas) > devices => {
                return Err(format!(
                    "--replicas {} asks for more devices' acks than the {devices} of the chain \
                     starting at {} (the controller's plan): no update could be acked that many \
                     times",
                    args.replicas,
                    session.peer()
                )
                .into());
            }
            Some(_) => {}
            None => tracing::warn!(
                "no controller ({}) answered within 1 s; sending to {} as given",
                args.controllers
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                first
            ),
        }
    }
    if let Some(request) = &args.request {
        let line = execute(&mut session, args.server_id, request)?;
        println!("{line}");
        return Ok(ExitCode::SUCCESS);
    }
    let stdin = std::io::stdin();
    let interactive = is_terminal();
    if interactive {
        eprintln!(
            "pmnet client: session {:016x} to server {} via {}; type `set k v`, `get k`, \
             `del k`, `incr k [delta]`, or `quit`",
            session.session_id(),
            args.server_id,
            session.peer()
        );
    }
    let mut failures = 0u32;
    loop {
        if interactive {
            eprint!("pmnet> ");
            let _ = std::io::stderr().flush();
        }
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let trimmed = line.trim();
        if trimmed.eq_ignore_ascii_case("quit") || trimmed.eq_ignore_ascii_case("exit") {
            break;
        }
        match KvCommand::parse_line(trimmed) {
            Ok(None) => {}
            Ok(Some(request)) => match execute(&mut session, args.server_id, &request) {
                Ok(text) => println!("{text}"),
                Err(error) => {
                    failures += 1;
                    println!("(error) {error}");
                }
            },
            Err(message) => {
                failures += 1;
                println!("(error) {message}");
            }
        }
    }
    Ok(if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn is_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stdin().is_terminal()
}

/// `--fan-out`'s rules, for the client and the gateway: one `--device` (not a device's
/// `workers` more), and no more `--replicas` than the devices an update goes to.
pub(crate) fn check_fan_out(
    fan_out: &[SocketAddr],
    workers: usize,
    replicas: u8,
) -> Result<(), CliError> {
    if fan_out.is_empty() {
        return Ok(());
    }
    if workers > 0 {
        return Err(
            "--fan-out takes one --device address (the first of the devices an update \
                    goes to), not a device's workers"
                .into(),
        );
    }
    let devices = 1 + fan_out.len();
    if usize::from(replicas) > devices {
        return Err(format!(
            "--replicas {replicas} asks for more devices' acks than the {devices} an update goes \
             to (--device and --fan-out)"
        )
        .into());
    }
    Ok(())
}

/// Who answered a read: the cache of the device that names itself in the reply, or the server
/// (`device_id` 0, docs/cache.md).
fn answered_by(device_id: u16, server_id: u16) -> String {
    if device_id == 0 {
        format!("from server {server_id}")
    } else {
        format!("from the cache of device {device_id}")
    }
}

/// Send one request and describe its outcome in a line (a read's says who answered it).
fn execute(
    session: &mut ClientSession,
    server_id: u16,
    command: &KvCommand,
) -> Result<String, CliError> {
    let request = match command {
        KvCommand::Set { key, value } => Request::Set {
            key: key.as_bytes(),
            value: value.as_bytes(),
        },
        KvCommand::Get { key } => Request::Get {
            key: key.as_bytes(),
        },
        KvCommand::Del { key } => Request::Del {
            key: key.as_bytes(),
        },
        KvCommand::Incr { key, delta } => Request::Incr {
            key: key.as_bytes(),
            delta: *delta,
        },
    };
    let payload = request.to_bytes();
    let keyed = session.is_authenticated();
    let short_before = session.counters().updates_short_of_replicas;
    let mut source = None;
    // Every write is keyed and every GET a cache read, so a device run with --cache can serve
    // this key's reads and keep them coherent (docs/cache.md); without a cache the device
    // forwards them and the server answers as before.
    let completion = match command {
        KvCommand::Set { key, value } => {
            let after = Reply::Value(value.as_bytes().to_vec()).to_bytes();
            session.keyed_update(key.as_bytes(), Some(&after), &payload)
        }
        KvCommand::Del { key } => {
            let after = Reply::NotFound.to_bytes();
            session.keyed_update(key.as_bytes(), Some(&after), &payload)
        }
        KvCommand::Incr { key, .. } => session.keyed_bypass(key.as_bytes(), &payload),
        KvCommand::Get { key } => {
            session
                .cache_read(key.as_bytes(), &payload)
                .map(|(reply, device_id)| {
                    source = Some(answered_by(device_id, server_id));
                    Completion::Replied {
                        reply,
                        makeup: false,
                    }
                })
        }
    }
    .map_err(|error| match error {
        ClientError::TimedOut
            if session.peer_silence().is_some() && session.unverified_answers().is_some() =>
        {
            format!(
                "{error}: {}; the request may or may not have been applied",
                session.unverified_answers().unwrap_or_default()
            )
        }
        ClientError::TimedOut => match session.peer_silence() {
            Some(why) if why.contains("never answered") => format!(
                "{error}: {why} — or it drops this client's datagrams because they fail \
                 authentication ({}; the device logs each such sender); the request may or may \
                 not have been applied",
                if keyed {
                    "it must run with the same --key-file as this client"
                } else {
                    "if it runs with --key-file, give this client the same --key-file"
                }
            ),
            Some(why) => format!("{error}: {why}; the request may or may not have been applied"),
            None => format!(
                "{error}: the device at {} answers, but no reply came from the server behind it \
                 (is the server running, at the address of the device's --server?); the request \
                 may or may not have been applied",
                session.peer()
            ),
        },
        ClientError::NotLogged(pmnet_wire::NotLoggedReason::ServerUnverified) => {
            format!("{error}; the request may or may not have been applied")
        }
        ClientError::NotLogged(_) => format!(
            "{error}: the request was not acknowledged and may or may not have been applied \
             (the server is unreachable or overloaded; it applies the device's log when it is \
             back)"
        ),
        other => format!("{other}"),
    })?;
    // An update the server's reply completed before --replicas devices acked it: say so, or a
    // chain shorter than --replicas would pass for one that replicated it.
    let short = (session.counters().updates_short_of_replicas > short_before)
        .then(|| session.short_of_replicas())
        .flatten()
        .map(|(_, acked)| {
            format!(
                "; WARNING: only {acked} of the {} devices --replicas asks for acknowledged it \
                 (is the chain of devices from {} shorter than that?)",
                session.replicas(),
                session.peer()
            )
        })
        .unwrap_or_default();
    let line = match completion {
        Completion::Logged { device_id } => match session.replicas() {
            1 => {
                format!("OK (durable in the log of device {device_id}; the server applies it next)")
            }
            replicas => format!(
                "OK (durable in the logs of {replicas} devices; the server applies it next)"
            ),
        },
        Completion::ReplyUnavailable => {
            format!("OK (applied before; the server no longer keeps its reply{short})")
        }
        Completion::Replied { reply, .. } => match Reply::decode(&reply) {
            Ok(Reply::Ok) => format!("OK (applied by the server{short})"),
            Ok(Reply::Value(value)) => String::from_utf8_lossy(&value).into_owned(),
            Ok(Reply::NotFound) => "(not found)".to_owned(),
            Ok(Reply::Integer(value)) => format!("(integer) {value}"),
            Ok(Reply::Deleted(count)) => format!("(deleted {count}{short})"),
            Ok(Reply::Error(message)) => format!("(error) {message}"),
            Err(error) => format!("(undecodable reply: {error:?})"),
        },
    };
    Ok(match source {
        Some(source) => format!("{line} ({source})"),
        None => line,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_lines_parse() {
        assert_eq!(
            KvCommand::parse_line("set k hello world").unwrap(),
            Some(KvCommand::Set {
                key: "k".into(),
                value: "hello world".into()
            })
        );
        assert_eq!(
            KvCommand::parse_line("INCR n -3").unwrap(),
            Some(KvCommand::Incr {
                key: "n".into(),
                delta: -3
            })
        );
        assert_eq!(KvCommand::parse_line("   ").unwrap(), None);
        assert!(KvCommand::parse_line("set k").is_err());
        assert!(KvCommand::parse_line("incr n x")
            .unwrap_err()
            .contains("integer"));
        assert!(KvCommand::parse_line("frobnicate").is_err());
    }

    #[test]
    fn a_read_says_who_answered_it() {
        assert_eq!(answered_by(0, 1), "from server 1");
        assert_eq!(answered_by(0, 7), "from server 7");
        assert_eq!(answered_by(2, 1), "from the cache of device 2");
    }
}
