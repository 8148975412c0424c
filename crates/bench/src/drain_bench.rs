//! `pmnet drain-bench`: how fast a server drains a device's log after an outage.
//!
//! Started as a user starts them: a `pmnet device` process, a `pmnet server` that runs until
//! the device acks a write (a device acks nothing for a server it has not verified) and is
//! killed, clients that log N updates through the device while no server runs, then a
//! `pmnet server` process. Each client then reads its own key
//! (a bypass GET, applied after every earlier update of its session), so the last read
//! answered marks the moment every logged update was applied — and each read must return the
//! session's last write. The run is repeated side by side with the device's replay paced (the
//! default window of resends in flight) and unpaced (everything resent at once, as a device
//! without pacing would).

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use pmnet_proto::{ClientError, ClientEvent, Completion};
use pmnet_runtime::{ClientSession, SessionOptions, WaitMode};
use pmnet_store::{Reply, Request};
use serde::Serialize;

use pmnet::CliError;

/// How long a process may take to print its "listening on" line.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the drain may take before the run is declared failed.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, Args)]
pub struct DrainBenchArgs {
    /// Updates logged while the server is down, all clients together.
    #[arg(long, value_name = "N", default_value_t = 20_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub entries: u32,

    /// Client sessions logging them.
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub clients: u32,

    /// Bytes of each SET's value.
    #[arg(long, value_name = "BYTES", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(0..=1300))]
    pub payload: u32,

    /// Resent entries in flight of the paced run (the device's --resends-in-flight).
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub paced_window: u32,

    /// Skip the unpaced run.
    #[arg(long)]
    pub paced_only: bool,

    /// Where the log and store files go (removed afterwards).
    #[arg(long, value_name = "DIR", default_value = "/dev/shm")]
    pub dir: PathBuf,

    /// Busy-poll in the device and the server (both sleep otherwise).
    #[arg(long)]
    pub busy_poll: bool,

    /// Also write the results, with the setting, as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// The paper's recovery cost: 67 µs per resent request.
const PAPER_US_PER_ENTRY: f64 = 67.0;

/// One drain measured.
#[derive(Debug)]
struct Drained {
    window: u32,
    entries: u32,
    /// Server process started → it printed "listening on" (store opened).
    server_start: Duration,
    /// Server process started → every session's read answered (start-up included).
    drain: Duration,
    medium: String,
}

impl Drained {
    fn entries_per_second(&self) -> f64 {
        f64::from(self.entries) / self.drain.as_secs_f64().max(1e-9)
    }

    fn json(&self) -> RunJson {
        let entries_per_s = self.entries_per_second();
        let replay = self.drain.saturating_sub(self.server_start);
        RunJson {
            window: (!is_unpaced(self.window)).then_some(self.window),
            label: label(self.window),
            entries: self.entries,
            server_start_ms: self.server_start.as_secs_f64() * 1e3,
            drain_ms: self.drain.as_secs_f64() * 1e3,
            entries_per_s,
            us_per_entry: 1e6 / entries_per_s.max(f64::MIN_POSITIVE),
            replay_ms: replay.as_secs_f64() * 1e3,
            replay_entries_per_s: f64::from(self.entries) / replay.as_secs_f64().max(1e-9),
        }
    }
}

/// What `--json` writes.
#[derive(Debug, Serialize)]
struct ReportJson {
    setting: SettingJson,
    /// Paced first, then unpaced (unless `--paced-only`).
    runs: Vec<RunJson>,
    /// The paced run's entries per second over the unpaced run's; `None` with `--paced-only`.
    paced_vs_unpaced: Option<f64>,
    paper_us_per_entry: f64,
    /// The paced run's entries per second over the paper's (1 / 67 µs).
    paced_vs_paper: f64,
}

#[derive(Debug, Serialize)]
struct SettingJson {
    entries: u32,
    clients: u32,
    payload_bytes: u32,
    paced_window: u32,
    paced_only: bool,
    busy_poll: bool,
    dir: String,
    medium: String,
}

/// One drain, as `--json` writes it.
#[derive(Debug, Serialize)]
struct RunJson {
    /// Resends in flight; `None` for the unpaced run.
    window: Option<u32>,
    /// The window, or "unpaced".
    label: String,
    /// Entries logged (and drained).
    entries: u32,
    server_start_ms: f64,
    drain_ms: f64,
    entries_per_s: f64,
    us_per_entry: f64,
    /// The drain after the server's start-up (`drain_ms - server_start_ms`), and the entries
    /// per second over it: the replay alone, give or take what the server applied before its
    /// banner was out.
    replay_ms: f64,
    replay_entries_per_s: f64,
}

/// A child `pmnet` process, killed when dropped.
pub(crate) struct Process {
    name: &'static str,
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Process {
    pub(crate) fn spawn(name: &'static str, args: &[String]) -> Result<Process, CliError> {
        Process::spawn_binary(name, &crate::procs::pmnet_program()?, args)
    }

    /// Start `binary ARGS` (another build of `pmnet`, to compare against).
    pub(crate) fn spawn_binary(
        name: &'static str,
        binary: &std::path::Path,
        args: &[String],
    ) -> Result<Process, CliError> {
        let exe = binary;
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Process { name, child, lines })
    }

    /// Wait for the "listening on" line; returns the banner's lines.
    pub(crate) fn wait_listening(&mut self) -> Result<Vec<String>, CliError> {
        let (mut lines, _) = self.wait_listening_since()?;
        // The banner's following lines (files, medium) come at once.
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(50)) {
            lines.push(line);
        }
        Ok(lines)
    }

    /// Wait for the "listening on" line; returns the lines up to it and when it came.
    pub(crate) fn wait_listening_since(&mut self) -> Result<(Vec<String>, Instant), CliError> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let done = line.contains("listening on");
                    seen.push(line);
                    if done {
                        return Ok((seen, Instant::now()));
                    }
                }
                Err(_) => {
                    let status = self.child.try_wait()?;
                    return Err(format!(
                        "the {} did not start within {START_TIMEOUT:?} (exit status {status:?})",
                        self.name
                    )
                    .into());
                }
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn free_port() -> Result<SocketAddr, CliError> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?)
}

fn key_of(client: u32) -> Vec<u8> {
    format!("drain-{client}").into_bytes()
}

fn value_of(client: u32, index: u32, payload: u32) -> Vec<u8> {
    let mut value = format!("{client}:{index}:").into_bytes();
    value.resize((payload as usize).max(value.len()), b'.');
    value
}

pub fn run(args: DrainBenchArgs) -> Result<ExitCode, CliError> {
    println!(
        "drain-bench: {} updates of {} bytes from {} clients logged with the server down, then \
         the server started; {}",
        args.entries,
        args.payload,
        args.clients,
        if args.busy_poll {
            "device and server busy-poll"
        } else {
            "device and server sleep when idle"
        }
    );
    let mut windows = vec![args.paced_window];
    if !args.paced_only {
        // Every entry out at once: no pacing.
        windows.push(UNPACED);
    }
    let mut results = Vec::new();
    for window in windows {
        let result = drain_once(&args, window)?;
        println!(
            "  resends in flight {:>9}: server start-up {:>6.1} ms; start to every read answered \
             {:>8.1} ms: {:>9.0} entries/s",
            label(result.window),
            result.server_start.as_secs_f64() * 1e3,
            result.drain.as_secs_f64() * 1e3,
            result.entries_per_second()
        );
        results.push(result);
    }
    println!("  medium: {}", results[0].medium);
    let paced_vs_unpaced = match results.as_slice() {
        [paced, unpaced] => Some(paced.entries_per_second() / unpaced.entries_per_second()),
        _ => None,
    };
    if let Some(ratio) = paced_vs_unpaced {
        println!("  paced/unpaced: {ratio:.2}x the entries per second (same run, same machine)");
    }
    let paper = 1e6 / PAPER_US_PER_ENTRY;
    let paced_vs_paper = results[0].entries_per_second() / paper;
    println!(
        "  the PMNet paper's recovery takes {PAPER_US_PER_ENTRY} us per request ({paper:.0}/s): \
         paced drain is {paced_vs_paper:.1}x that",
    );
    if let Some(path) = &args.json {
        let report = ReportJson {
            setting: SettingJson {
                entries: args.entries,
                clients: args.clients,
                payload_bytes: args.payload,
                paced_window: args.paced_window,
                paced_only: args.paced_only,
                busy_poll: args.busy_poll,
                dir: args.dir.display().to_string(),
                medium: results[0].medium.clone(),
            },
            runs: results.iter().map(Drained::json).collect(),
            paced_vs_unpaced,
            paper_us_per_entry: PAPER_US_PER_ENTRY,
            paced_vs_paper,
        };
        write_json(path, &report)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Write `value` as pretty JSON to `path`.
pub(crate) fn write_json(path: &Path, value: &impl Serialize) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|error| format!("cannot encode the report as JSON: {error}"))?;
    std::fs::write(path, text + "\n").map_err(|error| {
        format!(
            "cannot write the JSON report to {}: {error}; check that the directory exists and \
             is writable",
            path.display()
        )
    })?;
    Ok(())
}

/// The window of the unpaced run: every entry out at once.
const UNPACED: u32 = 1_048_576;

fn is_unpaced(window: u32) -> bool {
    window >= UNPACED
}

fn label(window: u32) -> String {
    if is_unpaced(window) {
        "unpaced".to_owned()
    } else {
        window.to_string()
    }
}

/// One drain with `window` resends in flight: log the updates through a device with no server
/// up, then start the server and time it until every session's read is answered.
fn drain_once(args: &DrainBenchArgs, window: u32) -> Result<Drained, CliError> {
    let device_addr = free_port()?;
    let server_addr = free_port()?;
    let unique = format!("{}-{window}", std::process::id());
    let log_file = args.dir.join(format!("pmnet-drain-{unique}.log"));
    let data_file = args.dir.join(format!("pmnet-drain-{unique}.data"));
    let _files = FilesGuard(vec![log_file.clone(), data_file.clone()]);
    let mut device_args = device_args(args, window, device_addr, server_addr, &log_file);
    let mut server_args = server_args(server_addr, device_addr, &data_file);
    if args.busy_poll {
        device_args.push("--busy-poll".to_owned());
        server_args.push("--busy-poll".to_owned());
    }
    let mut device = Process::spawn("device", &device_args)?;
    let banner = device.wait_listening()?;
    let medium = banner
        .iter()
        .find_map(|line| line.trim().strip_prefix("medium: "))
        .unwrap_or("unknown")
        .to_owned();

    // A device acks nothing for a server it has not verified (docs/security.md, "Devices and
    // their servers"): the server runs once, until the device acks a write, then stops —
    // the outage the drain measures.
    {
        let mut first_life = Process::spawn("server", &server_args)?;
        first_life.wait_listening()?;
        let mut options = SessionOptions::new(1, device_addr);
        options.wait = WaitMode::Blocking;
        let mut warm_up = ClientSession::open(options)?;
        let payload = Request::Set {
            key: b"drain-bench-warm-up",
            value: b"1",
        }
        .to_bytes();
        let deadline = Instant::now() + START_TIMEOUT;
        while !matches!(warm_up.update(&payload), Ok(Completion::Logged { .. })) {
            if Instant::now() >= deadline {
                return Err(format!(
                    "the device acked no write within {START_TIMEOUT:?} of its server's start"
                )
                .into());
            }
        }
        drop(first_life);
    }

    let mut sessions = Vec::new();
    for _ in 0..args.clients {
        let mut options = SessionOptions::new(1, device_addr);
        options.wait = WaitMode::Blocking;
        options.window = Some(64);
        sessions.push(ClientSession::open(options)?);
    }
    let mut last_value = vec![Vec::new(); args.clients as usize];
    let per_client = args.entries.div_ceil(args.clients);
    let mut logged = 0u32;
    for (client, session) in sessions.iter_mut().enumerate() {
        let client = client as u32;
        let count = per_client.min(args.entries - logged);
        log_updates(session, client, count, args.payload, &mut last_value)?;
        logged += count;
    }

    let started = Instant::now();
    let mut server = Process::spawn("server", &server_args)?;
    // The server polls the device as it opens, and the replay may begin before its banner is
    // out: the drain is timed from the moment the process started, and the start-up (to the
    // "listening on" line) reported beside it.
    let (_, listening) = server.wait_listening_since()?;
    read_last_writes(&mut sessions, &last_value)?;
    let done = Instant::now();
    drop(server);
    drop(device);
    Ok(Drained {
        window,
        entries: logged,
        server_start: listening - started,
        drain: done - started,
        medium,
    })
}

/// The device's command line: its log sized for the entries, `window` resends in flight.
fn device_args(
    args: &DrainBenchArgs,
    window: u32,
    device_addr: SocketAddr,
    server_addr: SocketAddr,
    log_file: &Path,
) -> Vec<String> {
    // Slots are placed by a hash with a short probe: room for eight times the entries keeps
    // collisions (an update forwarded unlogged) rare; slots just large enough for the SETs.
    let slots = args.entries.saturating_mul(8).clamp(1024, 1 << 24);
    let slot_size = (args.payload + 256).div_ceil(64) * 64;
    vec![
        "device".to_owned(),
        "--listen".to_owned(),
        device_addr.to_string(),
        "--server".to_owned(),
        format!("1={server_addr}"),
        "--log-file".to_owned(),
        log_file.display().to_string(),
        "--slots".to_owned(),
        slots.to_string(),
        "--slot-size".to_owned(),
        slot_size.to_string(),
        "--format".to_owned(),
        "--resends-in-flight".to_owned(),
        window.to_string(),
    ]
}

/// The server's command line, behind the device.
fn server_args(server_addr: SocketAddr, device_addr: SocketAddr, data_file: &Path) -> Vec<String> {
    vec![
        "server".to_owned(),
        "--listen".to_owned(),
        server_addr.to_string(),
        "--device".to_owned(),
        device_addr.to_string(),
        "--data-file".to_owned(),
        data_file.display().to_string(),
        // One key per client: a small file keeps the timed start-up what it measures.
        "--data-mib".to_owned(),
        "64".to_owned(),
        "--format".to_owned(),
    ]
}

/// Each session reads its key back (a bypass GET, ordered after its logged updates) and must
/// get its last write; returns when every read is answered.
fn read_last_writes(
    sessions: &mut [ClientSession],
    last_value: &[Vec<u8>],
) -> Result<(), CliError> {
    let mut reads = Vec::new();
    for (client, session) in sessions.iter_mut().enumerate() {
        let payload = Request::Get {
            key: &key_of(client as u32),
        }
        .to_bytes();
        reads.push(session.start_bypass(&payload)?);
    }
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    for (client, session) in sessions.iter_mut().enumerate() {
        let wanted = reads[client];
        loop {
            match session.next_event(Some(deadline)) {
                Some(ClientEvent::Completed {
                    seq,
                    completion: Completion::Replied { reply, .. },
                    ..
                }) if seq == wanted => {
                    let expected = &last_value[client];
                    match Reply::decode(&reply) {
                        Ok(Reply::Value(value)) if value == *expected => break,
                        other => {
                            return Err(format!(
                                "client {client} read {other:?} after the drain, not its last \
                                 write"
                            )
                            .into())
                        }
                    }
                }
                Some(ClientEvent::Failed { seq, error, .. }) if seq == wanted => {
                    return Err(format!("client {client}: the read failed: {error}").into())
                }
                Some(_) => {}
                None => {
                    return Err(format!(
                        "the drain took longer than {DRAIN_TIMEOUT:?} (client {client})"
                    )
                    .into())
                }
            }
        }
    }
    Ok(())
}

/// Log `count` SETs of one key through the device (server down), each acked by the device.
fn log_updates(
    session: &mut ClientSession,
    client: u32,
    count: u32,
    payload: u32,
    last_value: &mut [Vec<u8>],
) -> Result<(), CliError> {
    let key = key_of(client);
    let mut started = 0;
    let mut acked = 0;
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while acked < count {
        while started < count && session.can_send() {
            let value = value_of(client, started, payload);
            session.start_update(
                &Request::Set {
                    key: &key,
                    value: &value,
                }
                .to_bytes(),
            )?;
            last_value[client as usize] = value;
            started += 1;
        }
        match session.next_event(Some(deadline)) {
            Some(ClientEvent::Completed {
                completion: Completion::Logged { .. },
                ..
            }) => acked += 1,
            Some(ClientEvent::Failed {
                error: ClientError::TimedOut,
                ..
            }) => {
                return Err(format!(
                    "client {client}: the device did not acknowledge an update in time; with many \
                     entries the unpaced device resends every one logged to the server that is \
                     down at each timeout and falls behind (try --paced-only)"
                )
                .into())
            }
            Some(other) => {
                return Err(format!(
                    "client {client}: an update was not logged by the device ({other:?}); is the \
                     log large enough?"
                )
                .into())
            }
            None => return Err("logging the updates timed out".into()),
        }
    }
    Ok(())
}

/// Removes files when dropped (and, for a server's data file, its forward log).
pub(crate) struct FilesGuard(pub(crate) Vec<PathBuf>);

impl Drop for FilesGuard {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(pmnet_runtime::forward_log_path(path));
            let _ = std::fs::remove_file(path);
        }
    }
}
