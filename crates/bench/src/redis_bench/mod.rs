//! `pmnet redis-bench`: Redis application workloads side by side on the client-server baseline
//! (clients speak RESP over TCP to a `redis-server` with `appendfsync always`: every write
//! durable before its reply) and on PMNet (the same clients, to the gateway of `pmnet redis-up
//! --redis ADDR` in front of its own such redis-server, the PMNet module loaded into it as its
//! server side, or with `--server-side adaptor` the adaptor). Both systems are started here,
//! afresh for every workload, loaded with the same data, measured in turns, checked, and
//! stopped (also on an error or Ctrl-C). See docs/benchmarks.md, "Redis workloads".

mod client;
mod conn;
mod cpu;
mod kinds;
mod report;
mod systems;
mod tpcc;
mod twitter;
mod workloads;
mod ycsb;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use pmnet_redis::resp::SyncClient;
use pmnet_runtime::Shutdown;

use crate::procs::{find_program, machine_text, remove_stale_dirs, run_dir};
use client::{run_round, RoundOutcome, RoundPlan};
use conn::command;
use kinds::{make, WorkloadKind};
use pmnet::CliError;
use report::{system_result, Agreement, Report, Setting, WorkloadResult};
use systems::{medium_of, redis_version, PmnetAddrs, Redis, RedisUp, ServerSide};
use workloads::{Params, Workload};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SystemKind {
    /// Clients talk to redis-server (appendfsync always) directly.
    Baseline,
    /// Clients talk to `pmnet redis-up`'s gateway in front of such a redis-server.
    Pmnet,
}

impl SystemKind {
    fn name(self) -> &'static str {
        match self {
            SystemKind::Baseline => "baseline",
            SystemKind::Pmnet => "pmnet",
        }
    }
}

/// `--server-side`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ServerSideArg {
    /// The PMNet module inside PMNet's redis-server.
    Module,
    /// The adaptor, a process of its own between the device and Redis.
    Adaptor,
}

#[derive(Debug, Clone, Args)]
pub struct RedisBenchArgs {
    /// The workloads (comma-separated): ycsb-a, ycsb-b, ycsb-f, twitter, tpcc.
    #[arg(
        long = "workload",
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "ycsb-a,ycsb-b,ycsb-f,twitter,tpcc"
    )]
    pub workloads: Vec<WorkloadKind>,

    /// The systems (comma-separated): baseline (Redis alone), pmnet (Redis behind PMNet).
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "baseline,pmnet"
    )]
    pub systems: Vec<SystemKind>,

    /// Closed-loop clients, each a thread with its own TCP connection, one request at a time.
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=256))]
    pub clients: u32,

    /// Seconds each system is measured per round, after the warm-up.
    #[arg(long, value_name = "SECONDS", default_value = "10",
          value_parser = |text: &str| pmnet::loadgen::parse_seconds(text, 0.1, 3600.0))]
    pub duration: f64,

    /// Seconds each system runs before it is measured, in every round.
    #[arg(long, value_name = "SECONDS", default_value = "2",
          value_parser = |text: &str| pmnet::loadgen::parse_seconds(text, 0.0, 600.0))]
    pub warmup: f64,

    /// Rounds per workload: the systems measured in turns (the order alternating), each
    /// system's median round (by update operations per second) reported.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,

    /// The seed of every random choice (data, keys, operations); printed, and taken back to
    /// replay a run's workload.
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// Bytes of every value (YCSB values, posts' bodies, customers' and history's data).
    #[arg(long, value_name = "BYTES", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=16_384))]
    pub payload: u32,

    /// Records loaded before the clients start: YCSB keys; Twitter users are records / 10;
    /// TPC-C items (at most 100 000) and customers (records / districts, 10 to 3 000 each).
    #[arg(long, value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u64).range(10..=1_000_000))]
    pub records: u64,

    /// Also write the results, with the setting, as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// No progress line while a round runs.
    #[arg(long)]
    pub no_progress: bool,

    /// Where a fresh directory for the Redis servers' append-only files is made (and removed
    /// at the end). On a disk, as `appendfsync always` is meant to be: a tmpfs would make
    /// every fsync free.
    #[arg(long, value_name = "DIR", default_value = "/var/tmp")]
    pub dir: PathBuf,

    /// The redis-server binary (Debian: `apt-get install redis-server`).
    #[arg(long, value_name = "PATH", default_value = "redis-server")]
    pub redis_server: String,

    /// PMNet's server side: `module` (the default: the PMNet module loaded into PMNet's
    /// redis-server with `--loadmodule`, as docs/redis.md loads it; if its file is not found,
    /// the adaptor is measured instead and the report says so) or `adaptor` (`pmnet
    /// redis-adaptor`, a process of its own between the device and Redis). Given explicitly,
    /// `module` stops the run when the module's file is not found.
    #[arg(long, value_name = "module|adaptor")]
    pub server_side: Option<ServerSideArg>,

    /// The Redis module (libpmnet_redis_module.so; default: beside the pmnet binary, as `cargo
    /// build --release -p pmnet` leaves it in target/release/deps/, or /usr/lib/pmnet/).
    #[arg(long, value_name = "FILE")]
    pub module: Option<PathBuf>,
}

/// PMNet's server side for `args` (the `pmnet` binary `exe`, beside which the module is looked
/// for), and, when the adaptor stands in for the module by default, why.
fn server_side(
    args: &RedisBenchArgs,
    exe: &Path,
) -> Result<(ServerSide, Option<String>), CliError> {
    if args.server_side == Some(ServerSideArg::Adaptor) {
        return Ok((ServerSide::Adaptor, None));
    }
    match pmnet::module_file_beside(args.module.as_deref(), Some(exe)) {
        Ok(path) => Ok((ServerSide::Module(path), None)),
        Err(why) if args.server_side.is_some() || args.module.is_some() => {
            Err(format!("--server-side module: {why}").into())
        }
        Err(why) => Ok((
            ServerSide::Adaptor,
            Some(format!(
                "THE ADAPTOR, NOT THE MODULE, was measured (the default is the module): {why}"
            )),
        )),
    }
}

/// Where the PMNet device's log goes (emulated persistent memory, as `pmnet redis-up`'s
/// default).
const DEVICE_LOG_DIR: &str = "/dev/shm";

/// Keys compared through the gateway and directly, at most.
const COMPARED_KEYS: usize = 400;

struct Run<'a> {
    args: &'a RedisBenchArgs,
    exe: PathBuf,
    side: ServerSide,
    redis_server: PathBuf,
    shutdown: &'a Shutdown,
    params: Params,
}

/// One system while a workload runs: its Redis, its redis-up (pmnet), its workload instance
/// and its rounds.
struct Running {
    kind: SystemKind,
    redis: Redis,
    /// (pmnet) Its parts' addresses, the module's among them.
    pmnet: Option<PmnetAddrs>,
    /// The parts whose CPU time a round reads: the clients, redis-server, and PMNet's
    /// processes.
    cpu_parts: Vec<cpu::Part>,
    redis_up: Option<RedisUp>,
    workload: Box<dyn Workload>,
    rounds: Vec<RoundOutcome>,
}

impl Running {
    fn addr(&self) -> std::net::SocketAddr {
        self.redis_up.as_ref().map_or(self.redis.addr, |up| up.addr)
    }

    fn check_running(&mut self) -> Result<(), CliError> {
        self.redis.check_running()?;
        match self.redis_up.as_mut() {
            Some(up) => up.check_running(),
            None => Ok(()),
        }
    }
}

/// Read `keys` through the gateway and directly (`DUMP`: the exact serialized value).
fn compare_through_gateway(
    gateway: std::net::SocketAddr,
    redis: &mut SyncClient,
    keys: &[String],
) -> Result<Agreement, CliError> {
    let mut through = SyncClient::connect(gateway, Duration::from_secs(30))
        .map_err(|error| format!("cannot connect to the gateway: {error}"))?;
    let keys = &keys[..keys.len().min(COMPARED_KEYS)];
    let dumps: Vec<Vec<Vec<u8>>> = keys.iter().map(|key| command!["DUMP", key]).collect();
    let via_gateway = workloads::batched(&mut through, dumps.clone())?;
    let direct = workloads::batched(redis, dumps)?;
    let disagreeing: Vec<String> = keys
        .iter()
        .zip(via_gateway.iter().zip(&direct))
        .filter(|(_, (a, b))| a != b)
        .map(|(key, _)| key.clone())
        .take(10)
        .collect();
    let agreed = keys.len()
        - via_gateway
            .iter()
            .zip(&direct)
            .filter(|(a, b)| a != b)
            .count();
    Ok(Agreement {
        keys: keys.len(),
        agreed,
        disagreeing,
    })
}

impl Run<'_> {
    /// Start `system`'s Redis (and nothing else yet) with a fresh instance of `workload`.
    fn start(
        &self,
        system: SystemKind,
        workload: WorkloadKind,
        dir: &Path,
    ) -> Result<Running, CliError> {
        let name = system.name();
        let pmnet = match system {
            SystemKind::Pmnet => Some(PmnetAddrs::free()?),
            SystemKind::Baseline => None,
        };
        let (label, extra) = match &pmnet {
            Some(addrs) => (
                format!("redis-server ({name}, server side: {})", self.side.name()),
                addrs.redis_args(&self.side),
            ),
            None => (format!("redis-server ({name})"), Vec::new()),
        };
        let redis = Redis::start(
            &self.redis_server,
            &label,
            &dir.join(name),
            &extra,
            self.shutdown,
        )?;
        Ok(Running {
            kind: system,
            cpu_parts: vec![
                cpu::Part {
                    name: cpu::CLIENTS,
                    pid: std::process::id(),
                },
                cpu::Part {
                    name: "redis-server",
                    pid: redis.pid(),
                },
            ],
            redis,
            pmnet,
            redis_up: None,
            workload: make(workload, &self.params),
            rounds: Vec::new(),
        })
    }

    fn workload(
        &self,
        kind: WorkloadKind,
        setting: &mut Setting,
    ) -> Result<(WorkloadResult, bool), CliError> {
        let dir = run_dir(&self.args.dir, &format!("redis-{}", kind.name()))?;
        let log_dir = run_dir(Path::new(DEVICE_LOG_DIR), "redis-bench-device")?;
        let mut running: Vec<Running> = Vec::new();
        for &system in &self.args.systems {
            let mut one = self.start(system, kind, dir.path())?;
            let mut direct = one.redis.connect()?;
            one.workload.load(&mut direct).map_err(|error| {
                format!("loading {} into {}: {error}", kind.name(), system.name())
            })?;
            if let Some(addrs) = one.pmnet {
                let up = RedisUp::start(
                    &self.exe,
                    &one.redis,
                    addrs,
                    &self.side,
                    dir.path(),
                    log_dir.path(),
                    self.shutdown,
                )?;
                let said = up.server_side().unwrap_or_default();
                let expected = match self.side {
                    ServerSide::Module(_) => "the PMNet module",
                    ServerSide::Adaptor => "the adaptor",
                };
                if !said.starts_with(expected) {
                    return Err(format!(
                        "pmnet redis-up's server side is not {} as asked: it says `{said}`",
                        self.side.name()
                    )
                    .into());
                }
                if setting.pmnet_device_media.is_none() {
                    let (device, adaptor, placement) = up.media();
                    setting.pmnet_device_media = Some(device);
                    setting.pmnet_adaptor_media =
                        (self.side == ServerSide::Adaptor).then_some(adaptor);
                    setting.pmnet_placement = Some(placement);
                    setting.pmnet_server_side_said = Some(said);
                }
                let parts = up.parts();
                let names: Vec<&str> = parts.iter().map(|(name, _)| *name).collect();
                let wanted: &[&str] = match self.side {
                    ServerSide::Module(_) => &["device", "gateway"],
                    ServerSide::Adaptor => &["adaptor", "device", "gateway"],
                };
                if names != wanted {
                    return Err(format!(
                        "pmnet redis-up's processes are {names:?}, not {wanted:?}: their CPU \
                         time cannot be read"
                    )
                    .into());
                }
                one.cpu_parts
                    .extend(parts.into_iter().map(|(name, pid)| cpu::Part { name, pid }));
                one.redis_up = Some(up);
            }
            running.push(one);
        }
        setting.redis_media = format!(
            "appendonly yes, appendfsync always (each write's reply after its fsync); \
             append-only files on {} under {}",
            medium_of(dir.path()),
            self.args.dir.display()
        );
        let mut interrupted = false;
        'rounds: for round in 0..self.args.rounds {
            let count = running.len();
            for turn in 0..count {
                // The order alternates from round to round.
                let index = if round % 2 == 0 {
                    turn
                } else {
                    count - 1 - turn
                };
                for other in &running {
                    other.redis.settle()?;
                }
                let one = &mut running[index];
                one.check_running()?;
                let label = format!(
                    "{} round {}/{} {}",
                    kind.name(),
                    round + 1,
                    self.args.rounds,
                    one.kind.name()
                );
                let plan = RoundPlan {
                    addr: one.addr(),
                    clients: self.args.clients,
                    round,
                    warmup: Duration::from_secs_f64(self.args.warmup),
                    duration: Duration::from_secs_f64(self.args.duration),
                    shutdown: self.shutdown,
                    progress: (!self.args.no_progress).then(|| label.clone()),
                    cpu_parts: &one.cpu_parts,
                };
                let outcome = run_round(one.workload.as_ref(), &plan);
                eprintln!(
                    "  {label}: {} ops/s, {} updates/s, {} errors",
                    pmnet::loadgen::thousands(outcome.ops as f64 / outcome.seconds),
                    pmnet::loadgen::thousands(outcome.update_ops as f64 / outcome.seconds),
                    outcome.errors
                );
                interrupted |= outcome.interrupted;
                one.rounds.push(outcome);
                if interrupted {
                    break 'rounds;
                }
            }
        }
        let mut results = Vec::new();
        let mut agreement = None;
        for mut one in running.into_iter().rev() {
            let mut direct = one.redis.connect()?;
            let check = one.workload.check(&mut direct);
            if let Some(up) = one.redis_up.as_ref() {
                agreement = Some(compare_through_gateway(
                    up.addr,
                    &mut direct,
                    &one.workload.sample_keys(),
                )?);
            }
            let gateway_commands = one.redis_up.take().and_then(RedisUp::stop);
            if let Some(result) = system_result(
                one.kind.name(),
                &one.rounds,
                check,
                one.workload.counters(),
                gateway_commands,
            ) {
                results.push(result);
            }
        }
        results.reverse();
        Ok((
            WorkloadResult::new(kind.name(), kind.mix(), results, agreement),
            interrupted,
        ))
    }
}

/// How PMNet is started, for the setting.
fn pmnet_command(side: &ServerSide) -> String {
    let redis_up = format!(
        "pmnet redis-up --redis ADDR --server-side {} (default options otherwise; its own ports \
         and device log under /dev/shm)",
        side.name()
    );
    match side {
        ServerSide::Module(path) => format!(
            "redis-server ... --loadmodule {} listen ADDR device ADDR, then {redis_up}",
            path.display()
        ),
        ServerSide::Adaptor => redis_up,
    }
}

pub fn run(args: RedisBenchArgs) -> Result<ExitCode, CliError> {
    let redis_server = find_program(&args.redis_server).ok_or_else(|| {
        format!(
            "{} not found: install Redis (apt-get install redis-server) or give its path with \
             --redis-server PATH",
            args.redis_server
        )
    })?;
    if !args.dir.is_dir() {
        return Err(format!("--dir {}: not a directory", args.dir.display()).into());
    }
    let mut kinds: Vec<WorkloadKind> = Vec::new();
    for kind in &args.workloads {
        if !kinds.contains(kind) {
            kinds.push(*kind);
        }
    }
    let mut systems: Vec<SystemKind> = Vec::new();
    for system in &args.systems {
        if !systems.contains(system) {
            systems.push(*system);
        }
    }
    let args = RedisBenchArgs { systems, ..args };
    let exe = crate::procs::pmnet_program()?;
    let (side, side_note) = if args.systems.contains(&SystemKind::Pmnet) {
        server_side(&args, &exe)?
    } else {
        (ServerSide::Adaptor, None)
    };
    match (&side, &side_note) {
        (_, Some(note)) => eprintln!("redis-bench: WARNING: {note}"),
        (ServerSide::Module(path), None) => eprintln!(
            "redis-bench: PMNet's server side: the module ({}), loaded into its redis-server",
            path.display()
        ),
        (ServerSide::Adaptor, None) => {}
    }
    let shutdown = Shutdown::on_signals()?;
    let removed = remove_stale_dirs(&[&args.dir, Path::new(DEVICE_LOG_DIR)]);
    if removed > 0 {
        eprintln!("(removed {removed} directories an earlier run left when it was killed)");
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    eprintln!("redis-bench: seed {seed} (--seed {seed} replays the workload)");
    let params = Params {
        records: args.records,
        payload: args.payload as usize,
        clients: args.clients,
        seed,
    };
    let setting = Setting {
        clients: args.clients,
        payload_bytes: params.payload,
        records: args.records,
        duration_s: args.duration,
        warmup_s: args.warmup,
        rounds: args.rounds,
        seed,
        workloads: kinds.iter().map(|kind| kind.name()).collect(),
        systems: args.systems.iter().map(|system| system.name()).collect(),
        cpus: pmnet_runtime::online_cpu_count(),
        machine: machine_text(),
        redis_server: redis_version(&redis_server),
        redis_media: String::new(),
        pmnet_device_media: None,
        pmnet_adaptor_media: None,
        pmnet_placement: None,
        pmnet_server_side: args
            .systems
            .contains(&SystemKind::Pmnet)
            .then(|| side.name()),
        pmnet_server_side_said: None,
        pmnet_server_side_note: side_note,
        pmnet_command: pmnet_command(&side),
    };
    let run = Run {
        args: &args,
        exe,
        side,
        redis_server,
        shutdown: &shutdown,
        params,
    };
    let mut report = Report::new(setting);
    for kind in kinds {
        let mut setting = report.setting.clone();
        match run.workload(kind, &mut setting) {
            Ok((result, interrupted)) => {
                report.setting = setting;
                report.workloads.push(result);
                if interrupted {
                    report.interrupted = true;
                    break;
                }
            }
            Err(error) if shutdown.is_requested() => {
                eprintln!("redis-bench: interrupted ({error})");
                report.interrupted = true;
                break;
            }
            Err(error) => return Err(format!("{}: {error}", kind.name()).into()),
        }
    }
    report.compute_averages();
    print!("{}", report.text());
    if let Some(path) = &args.json {
        report.write_json(path)?;
        println!("JSON written to {}", path.display());
    }
    let failed: Vec<&str> = report
        .workloads
        .iter()
        .filter(|w| !w.invariants_hold)
        .map(|w| w.workload)
        .collect();
    if !failed.is_empty() {
        return Err(format!(
            "the checks failed for {} (see FAILED above){}",
            failed.join(", "),
            if report.interrupted {
                "; the run was interrupted"
            } else {
                ""
            }
        )
        .into());
    }
    Ok(if report.interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}
