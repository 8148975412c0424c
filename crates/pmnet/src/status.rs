//! `pmnet status ADDR`: what a running device or server says about itself, from the `/status`
//! path of its metrics endpoint.

use std::fmt::Write as _;
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// The process's metrics endpoint: the address given to its `--metrics` (HOST:PORT, or
    /// http://HOST:PORT/...).
    #[arg(value_name = "ADDR")]
    pub addr: String,

    /// Print the status as the process published it (JSON) instead of in words.
    #[arg(long)]
    pub json: bool,

    /// Seconds to wait for the answer.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0,
          value_parser = |text: &str| crate::node::parse_seconds_at_least(text, 0.001))]
    pub timeout: f64,
}

/// `HOST:PORT` from what the user gave (an `http://` prefix and a path are allowed).
fn endpoint(text: &str) -> Result<SocketAddr, CliError> {
    let trimmed = text.trim();
    let without_scheme = trimmed.strip_prefix("http://").unwrap_or(trimmed);
    let host_port = without_scheme.split('/').next().unwrap_or(without_scheme);
    host_port
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| {
            format!(
                "{text:?} is not HOST:PORT; give the address of the process's --metrics, for \
                 example 127.0.0.1:9400"
            )
            .into()
        })
}

pub fn run(args: StatusArgs) -> Result<ExitCode, CliError> {
    let addr = endpoint(&args.addr)?;
    let timeout = Duration::from_secs_f64(args.timeout);
    let response = pmnet_runtime::metrics::get(addr, "/status", timeout).map_err(|error| {
        match error.kind() {
            std::io::ErrorKind::ConnectionRefused => format!(
                "nothing listens on {addr}: is the device or server running with --metrics {addr}?"
            ),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                format!("{addr} did not answer within {:.1} s", args.timeout)
            }
            std::io::ErrorKind::InvalidData => {
                format!("{addr} is not a pmnet metrics endpoint (it does not answer HTTP)")
            }
            _ => format!("cannot ask {addr} for its status: {error}"),
        }
    })?;
    if !response.from_pmnet {
        return Err(format!(
            "{addr} is not a pmnet metrics endpoint (an HTTP server, but not pmnet's); give the \
             address of a device's or server's --metrics"
        )
        .into());
    }
    if response.code == 404 {
        return Err(format!(
            "{addr} is a pmnet metrics endpoint, but its process publishes no status (only \
             devices, servers and the chain controller do); its metrics are at \
             http://{addr}/metrics"
        )
        .into());
    }
    let status: Value = serde_json::from_str(&response.body)
        .ok()
        .filter(|status: &Value| status.get("pmnet_status").is_some())
        .ok_or_else(|| {
            format!("{addr} answered /status with something other than a pmnet status")
        })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", describe(&status));
    }
    Ok(ExitCode::SUCCESS)
}

/// A duration in seconds in words: `42 s`, `3 min 5 s`, `2 h 10 min`, `3 d 4 h`.
fn age(seconds: f64) -> String {
    if seconds < 10.0 {
        return format!("{seconds:.1} s");
    }
    let whole = seconds as u64;
    match whole {
        0..=59 => format!("{whole} s"),
        60..=3599 => format!("{} min {} s", whole / 60, whole % 60),
        3600..=86_399 => format!("{} h {} min", whole / 3600, whole % 3600 / 60),
        _ => format!("{} d {} h", whole / 86_400, whole % 86_400 / 3600),
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    }
}

fn number(value: &Value) -> f64 {
    value.as_f64().unwrap_or(0.0)
}

/// A peer in words: `server 1 127.0.0.1:7500, heard 0.3 s ago`.
fn peer_line(peer: &Value) -> String {
    let mut line = text(&peer["role"]);
    if !peer["id"].is_null() {
        let _ = write!(line, " {}", text(&peer["id"]));
    }
    let _ = write!(line, " {}", text(&peer["addr"]));
    match peer["last_heard_seconds_ago"].as_f64() {
        Some(seconds) => {
            let _ = write!(line, ", heard {} ago", age(seconds));
        }
        None => line.push_str(", never heard from"),
    }
    if peer["recovery_answered"] == Value::Bool(false) {
        line.push_str(", recovery poll not answered yet");
    }
    line
}

/// The status in words.
pub fn describe(status: &Value) -> String {
    let mut out = String::new();
    let role = text(&status["role"]);
    let build = &status["build"];
    let id = match &status["id"] {
        Value::Null => String::new(),
        id => format!(" {}", text(id)),
    };
    let _ = writeln!(
        out,
        "pmnet {role}{id} listening on {}; up {}; pid {}; pmnet {} ({}, {})",
        text(&status["listen"]),
        age(number(&status["uptime_seconds"])),
        text(&status["pid"]),
        text(&build["version"]),
        text(&build["commit"]),
        text(&build["profile"]),
    );
    let _ = writeln!(out, "  medium:     {}", text(&status["medium"]));
    match role.as_str() {
        "device" => describe_device(status, &mut out),
        "server" => describe_server(status, &mut out),
        "chain-controller" => describe_controller(status, &mut out),
        _ => {}
    }
    let peers = &status["peers"];
    if !peers.is_object() {
        counters_line(status, &mut out);
        return out;
    }
    let mut first = true;
    for peer in peers["servers"]
        .as_array()
        .into_iter()
        .chain(peers["devices"].as_array())
        .flatten()
    {
        let label = if first { "peers:" } else { "" };
        first = false;
        let _ = writeln!(out, "  {label:<11} {}", peer_line(peer));
    }
    let clients = peers["client_count"].as_u64().unwrap_or(0);
    let label = if first { "peers:" } else { "" };
    let mut line = format!("{clients} client address(es)");
    if let Some(latest) = peers["clients"].as_array().and_then(|list| list.first()) {
        let _ = write!(
            line,
            ", the latest {} heard {} ago",
            text(&latest["addr"]),
            age(number(&latest["last_heard_seconds_ago"]))
        );
    }
    let _ = writeln!(out, "  {label:<11} {line}");
    counters_line(status, &mut out);
    out
}

fn counters_line(status: &Value, out: &mut String) {
    if let Some(counters) = status["counters"].as_object() {
        let words: Vec<String> = counters
            .iter()
            .map(|(name, value)| format!("{} {}", name.replace('_', " "), text(value)))
            .collect();
        let _ = writeln!(out, "  counters:   {}", words.join(", "));
    }
}

/// The chain store's plan: each member as the controller sees it, each group's chain.
fn describe_controller(status: &Value, out: &mut String) {
    let _ = writeln!(
        out,
        "  plan:       epoch {}, leases of {} ms",
        text(&status["epoch"]),
        text(&status["lease_ms"])
    );
    for member in status["members"].as_array().into_iter().flatten() {
        let heard = match member["last_heard_seconds_ago"].as_f64() {
            Some(seconds) => format!("heard {} ago", age(seconds)),
            None => "never heard from".to_owned(),
        };
        let _ = writeln!(
            out,
            "  member:     {}: heads {}, in {} chain(s), runs epoch {}, {heard}{}",
            text(&member["addr"]),
            text(&member["heads"]),
            text(&member["chains"]),
            text(&member["epoch"]),
            if member["suspected"] == Value::Bool(true) {
                ", SUSPECTED"
            } else {
                ""
            }
        );
    }
    for group in status["groups"].as_array().into_iter().flatten() {
        let chain: Vec<String> = group["chain"]
            .as_array()
            .map(|list| list.iter().map(text).collect())
            .unwrap_or_default();
        let mut line = format!("g{}: {}", text(&group["group"]), chain.join(" > "));
        if group["paused"] == Value::Bool(true) {
            line.push_str(", writes paused");
        }
        let joining = &group["joining"];
        if joining.is_object() {
            let _ = write!(
                line,
                ", {} joining ({} from {})",
                text(&joining["member"]),
                text(&joining["phase"]),
                text(&joining["source"])
            );
        }
        let _ = writeln!(out, "  group:      {line}");
    }
}

fn describe_device(status: &Value, out: &mut String) {
    let log = &status["log"];
    if log.is_null() {
        let _ = writeln!(out, "  log:        off (a plain switch: nothing is logged)");
    } else {
        let used = number(&log["entries_used"]);
        let slots = number(&log["slots"]);
        let by_server: Vec<String> = log["entries_by_server"]
            .as_object()
            .map(|servers| {
                servers
                    .iter()
                    .map(|(id, count)| format!("server {id}: {}", text(count)))
                    .collect()
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  log:        {}: {} of {} slots used ({:.2}%; {} of {} bytes){}",
            text(&log["path"]),
            used,
            slots,
            if slots > 0.0 {
                100.0 * used / slots
            } else {
                0.0
            },
            text(&log["bytes_used"]),
            text(&log["bytes_total"]),
            if by_server.is_empty() {
                String::new()
            } else {
                format!("; {}", by_server.join(", "))
            }
        );
    }
    let _ = writeln!(
        out,
        "  sessions:   {} known",
        text(&status["sessions_known"])
    );
    let recovery = &status["recovery"];
    let line = if recovery["in_progress"] == Value::Bool(true) {
        format!(
            "IN PROGRESS: {} entries recovered from the log at start-up not yet acked by their \
             servers",
            text(&recovery["recovered_entries_left"]),
        )
    } else {
        "none in progress (every entry recovered at start-up is acked)".to_owned()
    };
    let _ = writeln!(out, "  recovery:   {line}");
    let replay = &status["replay"];
    let line = if replay["in_progress"] == Value::Bool(true) {
        format!(
            "IN PROGRESS: entries resent to servers that had not acked them in time: {} queued, \
             {} resent and not yet acked",
            text(&replay["queued"]),
            text(&replay["resent_unacked"]),
        )
    } else {
        "nothing being resent".to_owned()
    };
    let _ = writeln!(out, "  replay:     {line}");
}

fn describe_server(status: &Value, out: &mut String) {
    let _ = writeln!(
        out,
        "  engine:     {} (data file {})",
        text(&status["engine"]),
        text(&status["data_file"])
    );
    let store = &status["store"];
    if let Some(fields) = store.as_object() {
        let words: Vec<String> = fields
            .iter()
            .map(|(name, value)| format!("{} {}", name.replace('_', " "), text(value)))
            .collect();
        let _ = writeln!(out, "  store:      {}", words.join(", "));
    }
    let _ = writeln!(
        out,
        "  sessions:   {} known, {} waiting for room in the store",
        text(&status["sessions_known"]),
        text(&status["sessions_waiting_for_room"])
    );
    let recovery = &status["recovery"];
    let line = if recovery["in_progress"] == Value::Bool(true) {
        let awaited: Vec<String> = recovery["devices_awaited"]
            .as_array()
            .map(|list| list.iter().map(text).collect())
            .unwrap_or_default();
        format!(
            "IN PROGRESS: waiting for device(s) {} to replay their logs ({} entries resent \
             so far)",
            awaited.join(", "),
            text(&recovery["entries_resent_by_devices"])
        )
    } else {
        format!(
            "complete ({} logged entries resent by the devices at start-up)",
            text(&recovery["entries_resent_by_devices"])
        )
    };
    let _ = writeln!(out, "  recovery:   {line}");
}
