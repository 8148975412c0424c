//! Automatic failover of devices in series: `pmnet bench --device-failover`
//! (docs/replication.md, "Automatic failover"; docs/benchmarks.md, "Replication").
//!
//! Every process of the product is started as docs/replication.md starts it on one machine,
//! from the `pmnet` binary: `pmnet controller --device-chain … --spare-device …` (with the
//! one-member etcd it starts itself), `pmnet server --controller`, three `pmnet device
//! --controller` in series and a fourth as the spare; the devices' logs and the server's store
//! under `--dir` (default /dev/shm: emulated PM), in a directory removed at the end (on Ctrl-C
//! and on errors too: `crate::procs`). The load is in this process: `--clients` threads, each
//! a `pmnet_runtime::ClientSession` to the first device that waits for `--replicas` devices'
//! acks and follows the controller (`SessionOptions::controllers`), each writing one SET at a
//! time, its own keys, as `pmnet client` sends it.
//!
//! Each round, on a fresh deployment: after the warm-up, the middle device is SIGKILLed, and
//! once the controller's event line says the spare joined, plus one second, the first device
//! is SIGKILLed. Measured:
//!
//! - the failover time of each kill: from the kill until every client had an update
//!   acknowledged again (by `--replicas` devices, or all the chain has if fewer) — the longest
//!   of the clients' waits (issue 41: within 200 ms, the heartbeat interval included);
//! - the throughput (acknowledged writes per second) from the middle device's kill until the
//!   spare joined plus one second, against the second before the kill: the cost while the
//!   spare is copied in (issue 41: at most 20 % less).
//!
//! There is no other system that fails devices over automatically to run beside it; the
//! manual procedure's figure (docs/replication.md, "Permanent losses") is printed as context.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use pmnet_runtime::{ClientSession, SessionOptions, Shutdown, WaitMode};
use pmnet_store::{Reply, Request};

use super::args::BenchArgs;
use crate::procs::{self, free_ports, loopback, run_dir, wait_until, Proc};
use pmnet::CliError;

/// Issue 41's targets: writes acknowledged again within this long of a device's kill…
pub const FAILOVER_TARGET_MS: f64 = 200.0;
/// … and at most this fraction of the throughput lost while a spare is copied in.
pub const COPY_COST_TARGET: f64 = 0.20;
/// The manual procedure's outage (docs/replication.md, "Permanent losses"): from the start
/// of the reconfiguration, the operator's reaction time not included.
pub const MANUAL_OUTAGE_MS: f64 = 9.0;

const DEFAULT_ROUNDS: u32 = 5;
const DEFAULT_CLIENTS: u32 = 4;
const DEFAULT_REPLICAS: u8 = 2;
/// Keys written, all clients together, unless `--keys` says otherwise.
const DEFAULT_KEYS: u64 = 4096;
/// Keys at most: the server's store holds about 32 000 (one 2 KiB slot each).
const MAX_KEYS: u64 = 16_384;
/// The server's id (the `1=` of `--device-chain` and of the devices' `--server`).
const SERVER_ID: u16 = 1;
/// The server's store, MiB (a new data file is allocated in full: the default, 1 GiB, would
/// take that much of /dev/shm for a few thousand keys).
const DATA_MIB: u64 = 64;
/// Throughput is compared over this long before the kill, and measured until this long after
/// the spare joined.
const WINDOW: Duration = Duration::from_secs(1);
/// Longest a round waits for the controller or the clients after a kill.
const PATIENCE: Duration = Duration::from_secs(30);
/// How often the controller's output and the clients' acks are looked at after a kill.
const POLL: Duration = Duration::from_millis(2);
/// How long the clients go on after the first device's failover (for later stalls).
const TAIL: Duration = Duration::from_millis(500);

/// Set, it prints the writes acknowledged per [`TIMELINE_BIN`] around each kill.
pub const TIMELINE_VAR: &str = "PMNET_FAILOVER_TIMELINE";
/// Set, the run's directory (the processes' output, the logs and the store) is kept and named.
pub const KEEP_VAR: &str = "PMNET_FAILOVER_KEEP";
const TIMELINE_BIN: Duration = Duration::from_millis(20);

/// What a run does, from the options.
#[derive(Debug, Clone)]
pub struct FailoverPlan {
    pub rounds: u32,
    pub clients: u32,
    pub replicas: u8,
    pub heartbeat_ms: u64,
    pub suspect_after_ms: u64,
    pub payload: usize,
    /// Keys each client writes in turn (its own: `c<client>-<n>`), so that the store stays
    /// within its size.
    pub keys_per_client: u64,
    pub warmup: Duration,
    pub dir: PathBuf,
    /// The devices' and the server's `--flush`, when not their default.
    pub flush: Option<String>,
    pub json: Option<PathBuf>,
}

impl FailoverPlan {
    pub fn from_args(args: &BenchArgs) -> Result<FailoverPlan, String> {
        let external = [
            args.device,
            args.forward,
            args.echo,
            args.server,
            args.device_metrics,
            args.server_metrics,
        ]
        .iter()
        .any(Option::is_some);
        let conflict = if args.abd.abd {
            Some("--abd")
        } else if args.inpath.in_path {
            Some("--in-path")
        } else if args.auth_cost.is_some() {
            Some("--auth-cost")
        } else if args.capacity {
            Some("--capacity")
        } else if external {
            Some("the addresses of running parts (--device/--forward/--echo/--server)")
        } else if args.servers.is_some() || args.server_max_ops_per_s.is_some() {
            Some("a rack (--servers, --server-max-ops-per-s)")
        } else if args.cache.cache.contains(&true) {
            Some("--cache on")
        } else if args.window.is_some_and(|window| window > 1) {
            Some("--window above 1 (each client keeps one write in flight)")
        } else if args.requests.is_some() {
            Some("--requests (the clients write until the round ends)")
        } else if args.busy_poll {
            Some("--busy-poll (every process and client waits blocking)")
        } else if args.key_file.is_some() {
            Some("--key-file (the processes run on loopback without keys)")
        } else {
            None
        };
        if let Some(conflict) = conflict {
            return Err(format!(
                "--device-failover starts its own controller, server and devices; it does not \
                 go with {conflict}"
            ));
        }
        let replicas =
            match args.replication.replicas.as_slice() {
                [] => DEFAULT_REPLICAS,
                [replicas @ 1..=3] => *replicas,
                _ => return Err(
                    "--device-failover: give --replicas one value, 1 to 3 (the chain has three \
                     devices)"
                        .to_owned(),
                ),
            };
        if !args.dir.is_dir() {
            return Err(format!(
                "--dir {}: not a directory; the devices' logs and the server's store go there \
                 (/dev/shm is emulated persistent memory)",
                args.dir.display()
            ));
        }
        let clients = args.clients.unwrap_or(DEFAULT_CLIENTS);
        let keys = args.keys.unwrap_or(DEFAULT_KEYS);
        if keys > MAX_KEYS {
            return Err(format!(
                "--device-failover: --keys {keys} is more than the server's {DATA_MIB} MiB store \
                 holds here (at most {MAX_KEYS})"
            ));
        }
        let flush = args.flush.to_string();
        Ok(FailoverPlan {
            rounds: args.rounds.unwrap_or(DEFAULT_ROUNDS),
            clients,
            replicas,
            heartbeat_ms: args.failover.heartbeat_ms,
            suspect_after_ms: args.failover.suspect_after_ms,
            payload: args.payload,
            keys_per_client: (keys / u64::from(clients)).max(1),
            warmup: Duration::from_secs_f64(args.warmup.max(0.5)),
            dir: args.dir.clone(),
            flush: (flush != "auto").then_some(flush),
            json: args.json.clone(),
        })
    }
}

/// One round's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Round {
    pub round: u32,
    /// Acknowledged writes per second in the second before the middle device's kill.
    pub writes_per_s_before: f64,
    /// From the middle device's kill until every client had a write acknowledged again.
    pub middle_failover_ms: f64,
    /// From the kill until the controller's event line said the middle device was removed.
    pub middle_removed_ms: f64,
    /// From the kill until the controller's event line said the spare joined.
    pub spare_joined_ms: f64,
    /// Acknowledged writes per second from the kill until the spare joined plus one second.
    pub writes_per_s_while_copied_in: f64,
    /// 1 − while copied in / before: the fraction of the throughput lost (negative when it
    /// went up).
    pub copy_cost: f64,
    /// The longest any client waited for an acknowledgement after its first one after the
    /// middle device's kill, until the spare joined plus one second (a second stall, as the
    /// spare is put in, shows here).
    pub middle_later_stall_ms: f64,
    /// The CPUs the run's processes (this one's clients included) and all other work used in
    /// the second before the middle device's kill…
    pub cpus_before: CpuUse,
    /// … and from the kill until the spare joined plus one second.
    pub cpus_while_copied_in: CpuUse,
    /// From the first device's kill until every client had a write acknowledged again.
    pub first_failover_ms: f64,
    /// From the kill until the controller's event line said the first device was removed.
    pub first_removed_ms: f64,
    /// Writes acknowledged in the round, and writes that failed.
    pub writes_acked: u64,
    pub writes_failed: u64,
    /// Writes the server's reply completed before `replicas` devices acked them.
    pub writes_short_of_replicas: u64,
    pub middle_failover_met: bool,
    pub copy_cost_met: bool,
    pub first_failover_met: bool,
}

/// CPU time used over a span, in CPUs (seconds per second).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuUse {
    /// The controller, its etcd, the server, the devices and this process (the clients).
    pub run: f64,
    /// Everything else on the machine.
    pub others: f64,
}

impl CpuUse {
    fn between(from: &CpuSample, to: &CpuSample) -> CpuUse {
        let seconds = (to.at - from.at).as_secs_f64().max(1e-3);
        // A process gone by `to` (killed) counts for nothing after `from`.
        let run: f64 = from
            .run
            .iter()
            .filter_map(|(pid, before)| {
                let after = to.run.iter().find(|(other, _)| other == pid)?.1;
                Some(after - before)
            })
            .sum();
        let machine = to.machine - from.machine;
        CpuUse {
            run: run / seconds,
            others: ((machine - run) / seconds).max(0.0),
        }
    }
}

/// CPU time used so far: by the whole machine and by each of the run's processes.
#[derive(Debug, Clone)]
struct CpuSample {
    at: Instant,
    machine: f64,
    run: Vec<(u32, f64)>,
}

impl CpuSample {
    fn take(pids: &[u32]) -> CpuSample {
        CpuSample {
            at: Instant::now(),
            machine: procs::machine_busy_seconds().unwrap_or(0.0),
            run: pids
                .iter()
                .filter_map(|&pid| Some((pid, procs::cpu_seconds_of(pid)?)))
                .collect(),
        }
    }
}

/// The medians over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Medians {
    pub writes_per_s_before: f64,
    pub middle_failover_ms: f64,
    pub spare_joined_ms: f64,
    pub writes_per_s_while_copied_in: f64,
    pub copy_cost: f64,
    pub first_failover_ms: f64,
    pub middle_failover_met: bool,
    pub copy_cost_met: bool,
    pub first_failover_met: bool,
}

/// The run's settings.
#[derive(Debug, Clone, Serialize)]
pub struct Setting {
    pub machine: String,
    pub cpus_online: usize,
    pub placement: &'static str,
    pub medium: String,
    pub heartbeat_ms: u64,
    pub suspect_after_ms: u64,
    pub clients: u32,
    pub replicas: u8,
    pub value_bytes: usize,
    pub keys_per_client: u64,
    pub warmup_s: f64,
    pub processes: Vec<String>,
}

/// Everything `--json` writes.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverReport {
    pub setting: Setting,
    pub rounds: Vec<Round>,
    pub median: Option<Medians>,
    pub failover_target_ms: f64,
    pub copy_cost_target: f64,
    /// Context, not a race: the manual procedure's outage from the start of the
    /// reconfiguration (docs/replication.md, "Permanent losses").
    pub manual_reconfiguration_ms: f64,
    pub interrupted: bool,
}

/// The deployment of one round: the processes, stopped (SIGTERM, then SIGKILL) and their
/// directory removed when dropped.
struct Deployment {
    /// The controller, the server, devices 1 to 4 (a device killed is taken out).
    procs: Vec<Proc>,
    controller: SocketAddr,
    devices: [SocketAddr; 4],
    controller_log: PathBuf,
    /// Each process's command line, for the report.
    commands: Vec<String>,
    medium: String,
    /// Declared last: removed once the processes stopped.
    _dir: tempfile::TempDir,
}

fn strings(words: &[&str]) -> Vec<String> {
    words.iter().map(|word| (*word).to_owned()).collect()
}

impl Deployment {
    fn start(plan: &FailoverPlan, shutdown: &Shutdown) -> Result<Deployment, CliError> {
        let dir = run_dir(&plan.dir, "device-failover")?;
        let exe = procs::pmnet_program()?;
        let ports = free_ports(6)?;
        let controller = loopback(ports[0]);
        let server = loopback(ports[1]);
        let devices = [
            loopback(ports[2]),
            loopback(ports[3]),
            loopback(ports[4]),
            loopback(ports[5]),
        ];
        let path = |name: &str| dir.path().join(name).display().to_string();
        let heartbeat = plan.heartbeat_ms.to_string();
        let flush: Vec<String> = plan
            .flush
            .iter()
            .flat_map(|flush| ["--flush".to_owned(), flush.clone()])
            .collect();
        let mut started: Vec<(String, Vec<String>)> = Vec::new();
        // As docs/replication.md, "Automatic failover", starts them (its etcd's directory
        // and the files in the run's directory).
        started.push((
            "controller".to_owned(),
            strings(&[
                "controller",
                "--listen",
                &controller.to_string(),
                "--suspect-after-ms",
                &plan.suspect_after_ms.to_string(),
                "--device-chain",
                &format!(
                    "{SERVER_ID}={server},1={},2={},3={}",
                    devices[0], devices[1], devices[2]
                ),
                "--spare-device",
                &format!("{SERVER_ID}:4={}", devices[3]),
                "--etcd-dir",
                &path("etcd"),
            ]),
        ));
        let mut args = strings(&[
            "server",
            "--listen",
            &server.to_string(),
            "--device",
            &devices[2].to_string(),
            "--controller",
            &controller.to_string(),
            "--heartbeat-ms",
            &heartbeat,
            "--data-file",
            &path("server.data"),
            "--data-mib",
            &DATA_MIB.to_string(),
        ]);
        args.extend(flush.iter().cloned());
        started.push(("server".to_owned(), args));
        for (index, listen) in devices.iter().enumerate() {
            let id = index + 1;
            // Devices 1 to 3 in series, each forwarding to the next (the last to the server);
            // device 4, the spare, to the server.
            let next = match index {
                0..=1 => format!("{SERVER_ID}={}", devices[index + 1]),
                _ => format!("{SERVER_ID}={server}"),
            };
            let mut args = strings(&[
                "device",
                "--listen",
                &listen.to_string(),
                "--device-id",
                &id.to_string(),
                "--server",
                &next,
            ]);
            if (1..=2).contains(&index) {
                args.extend([
                    "--previous-device".to_owned(),
                    format!("{SERVER_ID}={}", devices[index - 1]),
                ]);
            }
            args.extend(strings(&[
                "--log-file",
                &path(&format!("d{id}.log")),
                "--controller",
                &controller.to_string(),
                "--heartbeat-ms",
                &heartbeat,
            ]));
            args.extend(flush.iter().cloned());
            started.push((format!("device {id}"), args));
        }
        let controller_log = dir.path().join("controller.out");
        let mut deployment = Deployment {
            procs: Vec::new(),
            controller,
            devices,
            controller_log: controller_log.clone(),
            commands: started
                .iter()
                .map(|(_, args)| format!("pmnet {}", args.join(" ")))
                .collect(),
            medium: "unknown".to_owned(),
            _dir: dir,
        };
        for (name, args) in &started {
            let log = deployment
                ._dir
                .path()
                .join(format!("{}.out", name.replace(' ', "")));
            deployment
                .procs
                .push(Proc::spawn(name, &exe, args, &log, None)?);
        }
        let heard: Vec<SocketAddr> = devices.iter().copied().chain([server]).collect();
        let read = || std::fs::read_to_string(&controller_log).unwrap_or_default();
        wait_until(
            "every device and the server heard by the controller",
            Duration::from_secs(60),
            &mut deployment.procs,
            shutdown,
            || {
                let said = read();
                Ok(heard
                    .iter()
                    .all(|address| said.contains(&format!("{address} heard"))))
            },
        )?;
        deployment.medium = deployment
            .proc("device 1")
            .map(Proc::log_text)
            .unwrap_or_default()
            .lines()
            .find_map(|line| {
                line.split_once("medium: ")
                    .map(|(_, rest)| rest.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        Ok(deployment)
    }

    /// The run's processes: this one (the clients), the controller's etcd and every process
    /// started.
    fn pids(&self) -> Vec<u32> {
        let mut pids = vec![std::process::id()];
        for proc in &self.procs {
            pids.push(proc.pid());
            pids.extend(
                procs::children_of(proc.pid())
                    .into_iter()
                    .map(|(pid, _)| pid),
            );
        }
        pids
    }

    fn proc(&self, name: &str) -> Option<&Proc> {
        self.procs.iter().find(|proc| proc.name == name)
    }

    /// SIGKILL process `name` (and reap it); it is no longer watched.
    fn kill(&mut self, name: &str) -> Result<(), CliError> {
        let at = self
            .procs
            .iter()
            .position(|proc| proc.name == name)
            .ok_or_else(|| format!("no process {name} to kill"))?;
        let mut proc = self.procs.remove(at);
        proc.kill();
        Ok(())
    }

    fn controller_said(&self) -> String {
        std::fs::read_to_string(&self.controller_log).unwrap_or_default()
    }

    /// An error if a process still running exited, with the end of its log.
    fn check(&mut self) -> Result<(), CliError> {
        for proc in &mut self.procs {
            proc.check_running()?;
        }
        Ok(())
    }

    fn logs(&self) -> String {
        self.procs
            .iter()
            .map(|proc| format!("--- {}:\n{}", proc.name, proc.log_tail(8)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// One acknowledged write: when it was sent and when it was acknowledged, µs since the round's
/// start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Write {
    issued: u64,
    acked: u64,
}

/// What a client thread hands back: its acknowledged writes in order (one at a time, so
/// both times rise), and what failed.
#[derive(Debug, Default)]
struct ClientLog {
    writes: Vec<Write>,
    /// When (µs since the start) and what.
    failed: Vec<(u64, String)>,
    short_of_replicas: u64,
}

/// The clients of a round: threads writing until stopped.
struct Clients {
    stop: Arc<AtomicBool>,
    /// When each client's latest acknowledged write was sent, µs since the start plus one
    /// (0: none yet).
    latest: Arc<Vec<AtomicU64>>,
    threads: Vec<std::thread::JoinHandle<Result<ClientLog, String>>>,
}

impl Clients {
    fn start(
        plan: &FailoverPlan,
        deployment: &Deployment,
        start: Instant,
    ) -> Result<Clients, CliError> {
        let stop = Arc::new(AtomicBool::new(false));
        let latest: Arc<Vec<AtomicU64>> =
            Arc::new((0..plan.clients).map(|_| AtomicU64::new(0)).collect());
        let mut threads = Vec::new();
        for index in 0..plan.clients {
            let mut options = SessionOptions::new(SERVER_ID, deployment.devices[0]);
            options.wait = WaitMode::Blocking;
            options.window = Some(1);
            options.replicas = plan.replicas;
            options.controllers = vec![deployment.controller];
            let (stop, latest) = (stop.clone(), latest.clone());
            let value = vec![b'v'; plan.payload];
            let keys = plan.keys_per_client;
            let replicas = plan.replicas;
            let thread = std::thread::Builder::new()
                .name(format!("pmnet-bench-failover-client-{index}"))
                .spawn(move || {
                    let mut session = ClientSession::open(options)
                        .map_err(|error| format!("open a client session: {error}"))?;
                    // As `pmnet client --controller` does: the chain's route first.
                    match session.fetch_route(Duration::from_secs(1)) {
                        Some(devices) if usize::from(replicas) > devices => {
                            return Err(format!(
                                "--replicas {replicas} is more than the {devices} devices of \
                                 the controller's chain"
                            ))
                        }
                        Some(_) => {}
                        None => return Err("the controller did not answer within 1 s".to_owned()),
                    }
                    let mut log = ClientLog::default();
                    let after = Reply::Value(value.clone()).to_bytes();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let key = format!("c{index}-{}", n % keys);
                        let payload = Request::Set {
                            key: key.as_bytes(),
                            value: &value,
                        }
                        .to_bytes();
                        let short = session.counters().updates_short_of_replicas;
                        let issued = micros(start);
                        // As `pmnet client` sends a SET: keyed, with what a read answers after.
                        match session.keyed_update(key.as_bytes(), Some(&after), &payload) {
                            Ok(_) => {
                                let acked = micros(start);
                                log.writes.push(Write { issued, acked });
                                latest[index as usize].store(issued + 1, Ordering::Relaxed);
                            }
                            Err(error) => log.failed.push((
                                start.elapsed().as_micros() as u64,
                                format!("{key}: {error}"),
                            )),
                        }
                        log.short_of_replicas +=
                            session.counters().updates_short_of_replicas - short;
                    }
                    Ok(log)
                })
                .map_err(|error| format!("cannot start a client thread: {error}"))?;
            threads.push(thread);
        }
        Ok(Clients {
            stop,
            latest,
            threads,
        })
    }

    /// Whether every client had a write sent at or after `since` (µs) acknowledged.
    fn all_acked_since(&self, since: u64) -> bool {
        self.latest
            .iter()
            .all(|latest| latest.load(Ordering::Relaxed) > since)
    }

    fn finish(mut self) -> Result<Vec<ClientLog>, CliError> {
        self.stop.store(true, Ordering::Relaxed);
        let mut logs = Vec::new();
        for thread in std::mem::take(&mut self.threads) {
            logs.push(
                thread
                    .join()
                    .map_err(|_| "a client thread panicked".to_owned())?
                    .map_err(|error| format!("a client: {error}"))?,
            );
        }
        Ok(logs)
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The first of `writes` sent at or after `since`: its index.
fn first_sent_from(writes: &[Write], since: u64) -> usize {
    writes.partition_point(|write| write.issued < since)
}

/// Writes of `writes` acknowledged in `[from, to)`.
fn count_between(writes: &[Write], from: u64, to: u64) -> usize {
    writes.partition_point(|write| write.acked < to)
        - writes.partition_point(|write| write.acked < from)
}

/// From `kill` until every client had a write sent at or after it acknowledged (the longest
/// of the clients' waits), in ms; infinite if one never had. (A write acknowledged just after
/// the kill that was sent before it does not count: the devices may have acked it before.)
fn failover_ms(logs: &[Vec<Write>], kill: u64) -> f64 {
    logs.iter()
        .map(|writes| {
            writes
                .get(first_sent_from(writes, kill))
                .map_or(f64::INFINITY, |write| (write.acked - kill) as f64 / 1e3)
        })
        .fold(0.0, f64::max)
}

/// The longest one client waited between two acknowledgements after the failover (from its
/// first write sent at or after `kill` and acknowledged) until `until`, in ms (a wait still
/// open at `until` counts to `until`).
fn later_stall_ms(logs: &[Vec<Write>], kill: u64, until: u64) -> f64 {
    logs.iter()
        .map(|writes| {
            let from = first_sent_from(writes, kill);
            let to = writes.partition_point(|write| write.acked < until);
            let within = &writes[from.min(to)..to];
            let gaps = within.windows(2).map(|pair| pair[1].acked - pair[0].acked);
            let open = within.last().map_or(0, |last| until - last.acked);
            gaps.chain([open]).max().unwrap_or(0) as f64 / 1e3
        })
        .fold(0.0, f64::max)
}

/// Writes acknowledged per [`TIMELINE_BIN`], from five bins before `kill` to 30 after.
fn timeline(logs: &[Vec<Write>], kill: u64) -> Vec<usize> {
    let bin = TIMELINE_BIN.as_micros() as u64;
    let from = kill.saturating_sub(5 * bin);
    (0..35)
        .map(|index| {
            logs.iter()
                .map(|writes| count_between(writes, from + index * bin, from + (index + 1) * bin))
                .sum()
        })
        .collect()
}

/// The median of `values` (the mean of the two middle ones for an even count).
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// µs since `start`.
fn micros(start: Instant) -> u64 {
    start.elapsed().as_micros() as u64
}

/// Poll every [`POLL`] until `done` says yes (with the time it first did, µs since `start`),
/// failing after [`PATIENCE`], on a signal, or if a process exits.
fn watch(
    what: &str,
    deployment: &mut Deployment,
    shutdown: &Shutdown,
    mut done: impl FnMut(&Deployment) -> bool,
) -> Result<(), CliError> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if done(deployment) {
            return Ok(());
        }
        deployment.check()?;
        if shutdown.is_requested() {
            return Err(format!("interrupted while waiting for {what}").into());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{what}: not within {} s; the ends of the logs:\n{}",
                PATIENCE.as_secs(),
                deployment.logs()
            )
            .into());
        }
        std::thread::sleep(POLL);
    }
}

/// Whether the controller's output has a line with every one of `words`.
fn said(text: &str, words: &[&str]) -> bool {
    text.lines()
        .any(|line| words.iter().all(|word| line.contains(word)))
}

/// One round on a fresh deployment: its figures, and the deployment's commands and medium.
fn run_round(
    plan: &FailoverPlan,
    round: u32,
    shutdown: &Shutdown,
) -> Result<(Round, Vec<String>, String), CliError> {
    let mut deployment = Deployment::start(plan, shutdown)?;
    let start = Instant::now();
    let clients = Clients::start(plan, &deployment, start)?;
    // The warm-up, then the second before the kill.
    let warm = Instant::now() + plan.warmup;
    watch(
        "the clients' first writes",
        &mut deployment,
        shutdown,
        |_| Instant::now() >= warm && clients.all_acked_since(0),
    )?;
    let pids = deployment.pids();
    let cpu_from = CpuSample::take(&pids);
    std::thread::sleep(WINDOW);
    deployment.check()?;

    // The middle device.
    let cpu_kill = CpuSample::take(&pids);
    let middle_kill = micros(start);
    deployment.kill("device 2")?;
    let mut cpu_end = None;
    let (mut removed, mut joined) = (None, None);
    let device2 = format!("device 2 ({})", deployment.devices[1]);
    let spare = format!("spare device 4 ({})", deployment.devices[3]);
    watch(
        "the spare's joining and every client's writes",
        &mut deployment,
        shutdown,
        |deployment| {
            let now = micros(start);
            if removed.is_none() || joined.is_none() {
                let text = deployment.controller_said();
                if removed.is_none() && said(&text, &[&device2, "removed"]) {
                    removed = Some(now);
                }
                if joined.is_none() && said(&text, &[&spare, "joined after"]) {
                    joined = Some(now);
                }
            }
            let done = joined.is_some_and(|joined| now >= joined + WINDOW.as_micros() as u64);
            if done && cpu_end.is_none() {
                cpu_end = Some(CpuSample::take(&pids));
            }
            done && clients.all_acked_since(middle_kill)
        },
    )?;
    let cpu_end = cpu_end.expect("taken once it joined");
    let joined = joined.expect("watched until it joined");
    let window_end = joined + WINDOW.as_micros() as u64;

    // The first device: the clients ask the controller where the chain starts now.
    let first_kill = micros(start);
    deployment.kill("device 1")?;
    let mut first_removed = None;
    let device1 = format!("device 1 ({})", deployment.devices[0]);
    watch(
        "every client's writes after the first device's kill",
        &mut deployment,
        shutdown,
        |deployment| {
            let now = micros(start);
            if first_removed.is_none()
                && said(&deployment.controller_said(), &[&device1, "removed"])
            {
                first_removed = Some(now);
            }
            first_removed.is_some() && clients.all_acked_since(first_kill)
        },
    )?;
    std::thread::sleep(TAIL);
    let logs = clients.finish()?;
    let commands = deployment.commands.clone();
    let medium = deployment.medium.clone();
    if std::env::var_os(KEEP_VAR).is_some() {
        let mut deployment = deployment;
        procs::stop_all(&mut deployment.procs);
        let kept = deployment._dir.keep();
        eprintln!("round {round}: its directory kept: {}", kept.display());
    } else {
        drop(deployment);
    }

    let acks: Vec<Vec<Write>> = logs.iter().map(|log| log.writes.clone()).collect();
    let before_from = middle_kill.saturating_sub(WINDOW.as_micros() as u64);
    let total = |from: u64, to: u64| -> usize {
        acks.iter()
            .map(|writes| count_between(writes, from, to))
            .sum()
    };
    let writes_per_s_before =
        total(before_from, middle_kill) as f64 / ((middle_kill - before_from) as f64 / 1e6);
    let during = total(middle_kill, window_end) as f64 / ((window_end - middle_kill) as f64 / 1e6);
    let copy_cost = 1.0 - during / writes_per_s_before;
    let middle_failover_ms = failover_ms(&acks, middle_kill);
    let first_failover_ms = failover_ms(&acks, first_kill);
    let ms = |at: Option<u64>, kill: u64| at.map_or(f64::NAN, |at| (at - kill) as f64 / 1e3);
    let failed: Vec<&(u64, String)> = logs.iter().flat_map(|log| &log.failed).collect();
    for (at, what) in &failed {
        eprintln!(
            "round {round}: a write failed {:.1} ms after the first device's kill: {what}",
            (*at as f64 - first_kill as f64) / 1e3
        );
    }
    if std::env::var_os(TIMELINE_VAR).is_some() {
        for (what, kill) in [("middle", middle_kill), ("first", first_kill)] {
            eprintln!(
                "round {round}: writes acked per {} ms from {} ms before the {what} device's \
                 kill: {:?}",
                TIMELINE_BIN.as_millis(),
                TIMELINE_BIN.as_millis() * 5,
                timeline(&acks, kill)
            );
        }
    }
    Ok((
        Round {
            round,
            writes_per_s_before,
            middle_failover_ms,
            middle_removed_ms: ms(removed, middle_kill),
            spare_joined_ms: ms(Some(joined), middle_kill),
            writes_per_s_while_copied_in: during,
            copy_cost,
            middle_later_stall_ms: later_stall_ms(&acks, middle_kill, window_end),
            cpus_before: CpuUse::between(&cpu_from, &cpu_kill),
            cpus_while_copied_in: CpuUse::between(&cpu_kill, &cpu_end),
            first_failover_ms,
            first_removed_ms: ms(first_removed, first_kill),
            writes_acked: acks.iter().map(|writes| writes.len() as u64).sum(),
            writes_failed: failed.len() as u64,
            writes_short_of_replicas: logs.iter().map(|log| log.short_of_replicas).sum(),
            middle_failover_met: middle_failover_ms <= FAILOVER_TARGET_MS,
            copy_cost_met: copy_cost <= COPY_COST_TARGET,
            first_failover_met: first_failover_ms <= FAILOVER_TARGET_MS,
        },
        commands,
        medium,
    ))
}

fn medians(rounds: &[Round]) -> Option<Medians> {
    if rounds.is_empty() {
        return None;
    }
    let of = |field: fn(&Round) -> f64| median(&rounds.iter().map(field).collect::<Vec<_>>());
    let middle_failover_ms = of(|round| round.middle_failover_ms);
    let copy_cost = of(|round| round.copy_cost);
    let first_failover_ms = of(|round| round.first_failover_ms);
    Some(Medians {
        writes_per_s_before: of(|round| round.writes_per_s_before),
        middle_failover_ms,
        spare_joined_ms: of(|round| round.spare_joined_ms),
        writes_per_s_while_copied_in: of(|round| round.writes_per_s_while_copied_in),
        copy_cost,
        first_failover_ms,
        middle_failover_met: middle_failover_ms <= FAILOVER_TARGET_MS,
        copy_cost_met: copy_cost <= COPY_COST_TARGET,
        first_failover_met: first_failover_ms <= FAILOVER_TARGET_MS,
    })
}

fn met(yes: bool) -> &'static str {
    if yes {
        "met"
    } else {
        "not met"
    }
}

/// The report in words: the table of rounds, the medians against the targets, the context.
pub fn report_text(report: &FailoverReport) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "\n| round | writes/s before | middle killed: acked again after | spare joined after | \
         writes/s until joined + 1 s | lost | later stall | first killed: acked again after | \
         CPUs before: run + others | CPUs until joined + 1 s |"
    );
    let _ = writeln!(text, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for round in &report.rounds {
        let _ = writeln!(
            text,
            "| {} | {:.0} | {:.1} ms | {:.0} ms | {:.0} | {:.1} % | {:.1} ms | {:.1} ms | {:.2} + \
             {:.2} | {:.2} + {:.2} |",
            round.round,
            round.writes_per_s_before,
            round.middle_failover_ms,
            round.spare_joined_ms,
            round.writes_per_s_while_copied_in,
            round.copy_cost * 100.0,
            round.middle_later_stall_ms,
            round.first_failover_ms,
            round.cpus_before.run,
            round.cpus_before.others,
            round.cpus_while_copied_in.run,
            round.cpus_while_copied_in.others,
        );
    }
    if let Some(median) = &report.median {
        let _ = writeln!(
            text,
            "| **median** | {:.0} | {:.1} ms | {:.0} ms | {:.0} | {:.1} % | | {:.1} ms | | |",
            median.writes_per_s_before,
            median.middle_failover_ms,
            median.spare_joined_ms,
            median.writes_per_s_while_copied_in,
            median.copy_cost * 100.0,
            median.first_failover_ms,
        );
        let target = report.failover_target_ms;
        let rounds_met = |field: fn(&Round) -> bool| {
            format!(
                "{} of {} rounds",
                report.rounds.iter().filter(|round| field(round)).count(),
                report.rounds.len()
            )
        };
        let _ = writeln!(
            text,
            "\nmiddle device killed: writes acked again after {:.1} ms (median; target ≤ {target:.0} \
             ms: {:.2}× the target, {}; {})",
            median.middle_failover_ms,
            median.middle_failover_ms / target,
            met(median.middle_failover_met),
            rounds_met(|round| round.middle_failover_met),
        );
        let against = if median.copy_cost > 0.0 {
            format!(
                "{:.2}× the target",
                median.copy_cost / report.copy_cost_target
            )
        } else {
            "more writes than before, not fewer".to_owned()
        };
        let _ = writeln!(
            text,
            "spare copied in: {:.1} % of the writes/s lost from the kill until it joined + 1 s, \
             against the second before (median; negative: more; target ≤ {:.0} %: {against}, \
             {}; {})",
            median.copy_cost * 100.0,
            report.copy_cost_target * 100.0,
            met(median.copy_cost_met),
            rounds_met(|round| round.copy_cost_met),
        );
        let _ = writeln!(
            text,
            "first device killed: writes acked again after {:.1} ms (median; target ≤ {target:.0} \
             ms: {:.2}× the target, {}; {})",
            median.first_failover_ms,
            median.first_failover_ms / target,
            met(median.first_failover_met),
            rounds_met(|round| round.first_failover_met),
        );
    }
    let failed: u64 = report.rounds.iter().map(|round| round.writes_failed).sum();
    let short: u64 = report
        .rounds
        .iter()
        .map(|round| round.writes_short_of_replicas)
        .sum();
    let acked: u64 = report.rounds.iter().map(|round| round.writes_acked).sum();
    let _ = writeln!(
        text,
        "writes acknowledged: {acked}; failed: {failed}; completed by the server's reply short \
         of {} devices' acks: {short}",
        report.setting.replicas
    );
    let _ = writeln!(
        text,
        "\nContext, not a race (nothing else fails devices over automatically): the manual \
         procedure (docs/replication.md, \"Permanent losses\") had writes acknowledged by two \
         devices again {:.0} ms after the operator began reconfiguring, the operator's reaction \
         time not included; here the controller notices by itself (--suspect-after-ms {}).",
        report.manual_reconfiguration_ms, report.setting.suspect_after_ms
    );
    text
}

/// `pmnet bench --device-failover`.
pub fn run_command(args: &BenchArgs) -> Result<ExitCode, CliError> {
    let plan = FailoverPlan::from_args(args)?;
    let shutdown = Shutdown::on_signals()?;
    let removed = procs::remove_stale_dirs(&[&plan.dir]);
    if removed > 0 {
        eprintln!("(removed {removed} directories an earlier run left when it was killed)");
    }
    println!(
        "pmnet bench --device-failover: a controller (with a one-member etcd of its own), a \
         server and 4 devices (3 in series, 1 spare), as docs/replication.md starts them; {} \
         clients writing one {}-byte SET at a time each, --replicas {}, following the \
         controller; heartbeat {} ms, --suspect-after-ms {}; {} rounds",
        plan.clients,
        plan.payload,
        plan.replicas,
        plan.heartbeat_ms,
        plan.suspect_after_ms,
        plan.rounds
    );
    println!("machine: {}", procs::machine_text());
    let mut rounds = Vec::new();
    let mut commands = Vec::new();
    let mut medium = "none started".to_owned();
    let mut interrupted = false;
    for round in 1..=plan.rounds {
        match run_round(&plan, round, &shutdown) {
            Ok((result, used, used_medium)) => {
                if round == 1 {
                    println!("medium: {used_medium}");
                }
                println!(
                    "round {round}: before {:.0} writes/s; middle killed: acked again after \
                     {:.1} ms (removed after {:.1} ms, spare joined after {:.1} ms), {:.0} \
                     writes/s until joined + 1 s ({:+.1} % against before); first killed: \
                     acked again after {:.1} ms; other work on the machine: {:.2} CPUs, then \
                     {:.2}",
                    result.writes_per_s_before,
                    result.middle_failover_ms,
                    result.middle_removed_ms,
                    result.spare_joined_ms,
                    result.writes_per_s_while_copied_in,
                    -result.copy_cost * 100.0,
                    result.first_failover_ms,
                    result.cpus_before.others,
                    result.cpus_while_copied_in.others,
                );
                rounds.push(result);
                commands = used;
                medium = used_medium;
            }
            Err(_) if shutdown.is_requested() => {
                interrupted = true;
                break;
            }
            Err(error) => return Err(error),
        }
    }
    let report = FailoverReport {
        setting: Setting {
            machine: procs::machine_text(),
            cpus_online: pmnet_runtime::online_cpu_count(),
            placement: "not pinned: the scheduler places the clients and every process",
            medium,
            heartbeat_ms: plan.heartbeat_ms,
            suspect_after_ms: plan.suspect_after_ms,
            clients: plan.clients,
            replicas: plan.replicas,
            value_bytes: plan.payload,
            keys_per_client: plan.keys_per_client,
            warmup_s: plan.warmup.as_secs_f64(),
            processes: commands,
        },
        median: medians(&rounds),
        rounds,
        failover_target_ms: FAILOVER_TARGET_MS,
        copy_cost_target: COPY_COST_TARGET,
        manual_reconfiguration_ms: MANUAL_OUTAGE_MS,
        interrupted,
    };
    print!("{}", report_text(&report));
    if let Some(path) = &plan.json {
        write_json(path, &report)?;
        println!("JSON written to {}", path.display());
    }
    Ok(if interrupted {
        eprintln!("pmnet bench --device-failover: interrupted");
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

fn write_json(path: &Path, report: &FailoverReport) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(&serde_json::json!({ "device_failover": report }))
        .map_err(|error| format!("--json: {error}"))?;
    std::fs::write(path, text).map_err(|error| format!("{}: {error}", path.display()).into())
}

#[cfg(test)]
mod tests {
    use super::super::args::tests::parse;
    use super::*;

    #[test]
    fn the_defaults_are_five_rounds_four_clients_two_replicas_and_100_ms() {
        let plan = FailoverPlan::from_args(&parse(&["--device-failover"]).unwrap()).unwrap();
        assert_eq!(
            (plan.rounds, plan.clients, plan.replicas),
            (5, 4, DEFAULT_REPLICAS)
        );
        assert_eq!((plan.heartbeat_ms, plan.suspect_after_ms), (10, 100));
        assert_eq!(plan.flush, None);
        assert_eq!(plan.keys_per_client, 1024);
        let plan = FailoverPlan::from_args(
            &parse(&[
                "--device-failover",
                "--rounds",
                "2",
                "--clients",
                "3",
                "--replicas",
                "3",
                "--heartbeat-ms",
                "5",
                "--suspect-after-ms",
                "150",
                "--flush",
                "clflush",
            ])
            .unwrap(),
        )
        .unwrap();
        assert_eq!((plan.rounds, plan.clients, plan.replicas), (2, 3, 3));
        assert_eq!((plan.heartbeat_ms, plan.suspect_after_ms), (5, 150));
        assert_eq!(plan.flush.as_deref(), Some("clflush"));
    }

    #[test]
    fn options_that_do_not_fit_are_refused() {
        for (words, expected) in [
            (&["--device-failover", "--replicas", "1,2"][..], "one value"),
            (&["--device-failover", "--replicas", "4"][..], "one value"),
            (&["--device-failover", "--abd"][..], "--abd"),
            (&["--device-failover", "--capacity"][..], "--capacity"),
            (&["--device-failover", "--window", "4"][..], "--window"),
            (&["--device-failover", "--busy-poll"][..], "--busy-poll"),
            (&["--device-failover", "--keys", "100000"][..], "at most"),
            (
                &["--device-failover", "--device", "127.0.0.1:7400"][..],
                "running parts",
            ),
            (
                &["--device-failover", "--dir", "/nonexistent-pmnet"][..],
                "not a directory",
            ),
        ] {
            let error = FailoverPlan::from_args(&parse(words).unwrap()).unwrap_err();
            assert!(error.contains(expected), "{words:?}: {error}");
        }
        assert!(parse(&["--suspect-after-ms", "50"])
            .unwrap_err()
            .contains("--device-failover"));
    }

    #[test]
    fn the_failover_is_the_longest_wait_of_any_client_from_the_kill() {
        let writes = |pairs: &[(u64, u64)]| -> Vec<Write> {
            pairs
                .iter()
                .map(|&(issued, acked)| Write { issued, acked })
                .collect()
        };
        // Client 0's write sent at 250 µs was acked at 310, after the kill at 300: it does
        // not count; its next, sent at 310, acked at 900, does. Client 1's write in flight at
        // the kill was acked at 1 400, and its next, sent then, at 1 500: 1.2 ms.
        let logs = vec![
            writes(&[(50, 100), (150, 200), (250, 310), (310, 900), (900, 1000)]),
            writes(&[(100, 150), (150, 250), (250, 1_400), (1_400, 1_500)]),
        ];
        assert_eq!(failover_ms(&logs, 300), 1.2);
        assert_eq!(failover_ms(&logs, 1_450), f64::INFINITY);
        assert_eq!(first_sent_from(&logs[0], 300), 3);
        assert_eq!(count_between(&logs[0], 100, 1000), 4);
        assert_eq!(count_between(&logs[1], 0, 10_000), 4);
        // After client 0's first ack of a write sent after the kill (900): 0.1 ms, then open
        // to the end (1.5 ms from 1 000 µs to 2 500 µs); client 1's open 1.0 ms.
        assert_eq!(later_stall_ms(&logs, 300, 2_500), 1.5);
        assert_eq!(later_stall_ms(&[vec![]], 300, 2_500), 0.0);
    }

    #[test]
    fn cpu_use_splits_the_machine_s_time_between_the_run_and_the_rest() {
        let at = Instant::now();
        let from = CpuSample {
            at,
            machine: 100.0,
            run: vec![(1, 10.0), (2, 5.0), (3, 1.0)],
        };
        // Process 3 was killed in between: it counts for nothing.
        let to = CpuSample {
            at: at + Duration::from_secs(2),
            machine: 103.0,
            run: vec![(1, 11.0), (2, 5.5)],
        };
        let used = CpuUse::between(&from, &to);
        assert!((used.run - 0.75).abs() < 1e-9, "{used:?}");
        assert!((used.others - 0.75).abs() < 1e-9, "{used:?}");
    }

    #[test]
    fn medians_and_the_report_say_met_or_not() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let round = |middle: f64, cost: f64| Round {
            round: 1,
            writes_per_s_before: 1000.0,
            middle_failover_ms: middle,
            middle_removed_ms: 100.0,
            spare_joined_ms: 100.0,
            writes_per_s_while_copied_in: 1000.0 * (1.0 - cost),
            copy_cost: cost,
            middle_later_stall_ms: 5.0,
            cpus_before: CpuUse::default(),
            cpus_while_copied_in: CpuUse::default(),
            first_failover_ms: 250.0,
            first_removed_ms: 100.0,
            writes_acked: 10,
            writes_failed: 0,
            writes_short_of_replicas: 0,
            middle_failover_met: middle <= FAILOVER_TARGET_MS,
            copy_cost_met: cost <= COPY_COST_TARGET,
            first_failover_met: false,
        };
        let rounds = vec![round(120.0, 0.1), round(130.0, 0.3), round(300.0, 0.15)];
        let median = medians(&rounds).unwrap();
        assert_eq!(median.middle_failover_ms, 130.0);
        assert!(median.middle_failover_met && median.copy_cost_met);
        assert!(!median.first_failover_met);
        let report = FailoverReport {
            setting: Setting {
                machine: "a machine".to_owned(),
                cpus_online: 2,
                placement: "not pinned",
                medium: "emulated-pm".to_owned(),
                heartbeat_ms: 10,
                suspect_after_ms: 100,
                clients: 4,
                replicas: 2,
                value_bytes: 100,
                keys_per_client: 1024,
                warmup_s: 1.0,
                processes: Vec::new(),
            },
            rounds,
            median: Some(median),
            failover_target_ms: FAILOVER_TARGET_MS,
            copy_cost_target: COPY_COST_TARGET,
            manual_reconfiguration_ms: MANUAL_OUTAGE_MS,
            interrupted: false,
        };
        let text = report_text(&report);
        assert!(
            text.contains("130.0 ms (median; target ≤ 200 ms: 0.65× the target, met; 2 of 3"),
            "{text}"
        );
        assert!(text.contains("first device killed: writes acked again after 250.0 ms"));
        assert!(text.contains("not met; 0 of 3 rounds"), "{text}");
        assert!(text.contains("9 ms after the operator began"), "{text}");
        assert!(
            text.contains("15.0 % of the writes/s lost") && text.contains("0.75× the target, met"),
            "{text}"
        );
        let mut gained = report.clone();
        gained.median.as_mut().unwrap().copy_cost = -0.05;
        let text = report_text(&gained);
        assert!(
            text.contains("-5.0 % of the writes/s lost")
                && text.contains("more writes than before, not fewer"),
            "{text}"
        );
        assert!(medians(&[]).is_none());
    }
}
