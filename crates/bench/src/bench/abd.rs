//! Replicated memory side by side: `pmnet bench --abd` (docs/abd.md, "The benchmark";
//! docs/benchmarks.md, "Replicated memory"). Reads and writes of one 64-byte line, in one
//! run, on:
//!
//! - `unreplicated`: one `pmnet memnode` through a `pmnet device --abd-node` (a write is one
//!   store the node stamps itself, a read one query);
//! - `client-abd`: three memory nodes, the quorum run by each client itself
//!   (`AbdMode::Direct`, writer ids 1000 + the client's index);
//! - `device-abd`: the same three nodes through a device that runs the quorum;
//! - `etcd`: the three-member etcd ensemble `pmnet coord-bench` starts, a line as a key with
//!   its 64-byte value;
//! - `device-abd-killed`: device-abd with one of its three nodes SIGKILLed (at the loaded
//!   client count only).
//!
//! Every process is started as a user starts it (the `pmnet` binary's `memnode` and `device`
//! commands, etcd's binary), in a directory under `--dir` (memory nodes' files: /dev/shm is
//! emulated persistent memory) and stopped at the end, on Ctrl-C and on errors too, by
//! `coord_bench`'s process machinery; the clients are `coord_bench`'s closed-loop load
//! generator (one request at a time per client thread, lines drawn uniformly from the seed,
//! every line written before the measurements).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;

use pmnet_runtime::{AbdMode, AbdSession, AbdSessionConfig, Shutdown};

use super::args::{AbdSystem, BenchArgs};
use crate::coord_bench::cpu::{run_phase, CpuPerOp};
use crate::coord_bench::etcd::{EtcdCluster, EtcdSetup};
use crate::coord_bench::load::{self, CoordClient, Measured, Op, Phase};
use crate::coord_bench::netchain::banner_value;
use crate::procs::{self, free_ports, loopback, run_dir, wait_until, Proc};
use pmnet::loadgen::{thousands, KeyDistribution, PopularityKind, Workload};
use pmnet::CliError;

/// Bytes of a line.
const LINE: usize = pmnet_abd::LINE;
/// Lines of the memory unless `--keys` says otherwise.
const DEFAULT_LINES: u32 = 4096;
/// The loaded client count unless `--clients` says otherwise.
const DEFAULT_CLIENTS: u32 = 16;
/// Rounds unless `--rounds` says otherwise.
const DEFAULT_ROUNDS: u32 = 3;
/// The first writer id of the client-driven clients (devices use their device ids, 1 and 2).
const DIRECT_WRITER_BASE: u16 = 1000;
/// The memory node of the three that the killed run SIGKILLs.
const KILLED_NODE: usize = 0;

/// What a run does, from the options.
#[derive(Debug, Clone)]
pub struct AbdPlan {
    pub systems: Vec<AbdSystem>,
    /// The client counts: 1 and the loaded count.
    pub clients: Vec<u32>,
    /// The loaded count (the killed run's).
    pub many: u32,
    pub lines: u32,
    pub warmup: Duration,
    pub duration: Duration,
    pub rounds: u32,
    pub seed: u64,
    /// Where the memory nodes' files go.
    pub dir: PathBuf,
    pub flush: String,
    pub persist_latency_ns: u64,
    pub etcd: EtcdSetup,
    pub client_cpu: Option<usize>,
    /// The memory nodes' and etcd members' CPU.
    pub node_cpu: Option<usize>,
    pub device_cpu: Option<usize>,
    pub json: Option<PathBuf>,
    pub progress: bool,
}

impl AbdPlan {
    pub fn from_args(args: &BenchArgs) -> Result<AbdPlan, String> {
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
        let conflict = if !args.replication.replicas.is_empty() {
            Some("--replicas")
        } else if args.capacity {
            Some("--capacity")
        } else if external {
            Some("the addresses of running parts (--device/--forward/--echo/--server)")
        } else if args.servers.is_some() || args.server_max_ops_per_s.is_some() {
            Some("a rack (--servers, --server-max-ops-per-s)")
        } else if args.cache.cache.contains(&true) {
            Some("--cache on")
        } else if args.window.is_some_and(|window| window > 1) {
            Some("--window above 1 (each client keeps one operation in flight)")
        } else if args.requests.is_some() {
            Some("--requests (each phase runs for --duration)")
        } else if args.busy_poll {
            Some("--busy-poll (every process and client waits blocking)")
        } else if args.key_file.is_some() {
            Some("--key-file (traffic is not authenticated: etcd's is not either)")
        } else {
            None
        };
        if let Some(conflict) = conflict {
            return Err(format!(
                "--abd starts its own memory nodes, devices and etcd; it does not go with \
                 {conflict}"
            ));
        }
        let lines = args.keys.unwrap_or(u64::from(DEFAULT_LINES));
        if lines > u64::from(pmnet::LINES_MAX) {
            return Err(format!(
                "--keys {lines}: with --abd the keys are the memory's lines, at most {}",
                pmnet::LINES_MAX
            ));
        }
        if !args.dir.is_dir() {
            return Err(format!(
                "--dir {}: not a directory; the memory nodes' files go there (/dev/shm is \
                 emulated persistent memory)",
                args.dir.display()
            ));
        }
        let etcd_dir = args
            .abd
            .etcd_data_dir
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        if !etcd_dir.is_dir() {
            return Err(format!(
                "--etcd-data-dir {}: not a directory",
                etcd_dir.display()
            ));
        }
        let online = pmnet_runtime::online_cpu_count();
        for (option, cpu) in [
            ("--client-cpu", args.client_cpu),
            ("--server-cpu", args.server_cpu),
            ("--device-cpu", args.device_cpu),
        ] {
            if let Some(cpu) = cpu.filter(|&cpu| cpu >= online) {
                return Err(format!(
                    "{option} {cpu}: this machine has {online} online CPUs (0 to {})",
                    online - 1
                ));
            }
        }
        let mut systems = Vec::new();
        for system in &args.abd.systems {
            if !systems.contains(system) {
                systems.push(*system);
            }
        }
        let many = args.clients.unwrap_or(DEFAULT_CLIENTS);
        let clients = if many == 1 { vec![1] } else { vec![1, many] };
        let node_cpu = args.server_cpu;
        Ok(AbdPlan {
            systems,
            clients,
            many,
            lines: lines as u32,
            warmup: Duration::from_secs_f64(args.warmup),
            duration: Duration::from_secs_f64(args.duration),
            rounds: args.rounds.unwrap_or(DEFAULT_ROUNDS),
            seed: args.seed.unwrap_or_else(rand::random),
            dir: args.dir.clone(),
            flush: args.flush.to_string(),
            persist_latency_ns: args.persist_latency_ns,
            etcd: EtcdSetup {
                program: args.abd.etcd.clone(),
                dir: etcd_dir,
                cpu: node_cpu,
            },
            client_cpu: args.client_cpu,
            node_cpu,
            device_cpu: args.device_cpu.or(node_cpu),
            json: args.json.clone(),
            progress: !args.no_progress,
        })
    }

    /// The load: lines drawn uniformly, 64-byte values.
    fn workload(&self) -> Workload {
        Workload {
            keys: u64::from(self.lines),
            distribution: KeyDistribution::Uniform,
            zipf_exponent: 1.0,
            update_ratio: 0.0,
            value_len: LINE,
            servers: 1,
            popularity: PopularityKind::Static,
            change_every: Duration::from_secs(10),
            change_count: 1,
        }
    }

    /// The client counts `system` is measured at.
    fn clients_of(&self, system: AbdSystem) -> Vec<u32> {
        if system == AbdSystem::DeviceAbdKilled {
            vec![self.many]
        } else {
            self.clients.clone()
        }
    }

    fn placement(&self) -> String {
        if self.client_cpu.is_none() && self.node_cpu.is_none() && self.device_cpu.is_none() {
            return "not pinned: the scheduler places the clients and every process".to_owned();
        }
        let cpu =
            |cpu: Option<usize>| cpu.map_or_else(|| "any CPU".to_owned(), |c| format!("CPU {c}"));
        format!(
            "clients on {}; memory nodes and etcd members on {}; devices on {}",
            cpu(self.client_cpu),
            cpu(self.node_cpu),
            cpu(self.device_cpu)
        )
    }
}

/// A client of replicated memory: one session; a key is a line (`key_name(line)`).
struct LineClient {
    session: AbdSession,
}

/// The line a load-generator key names.
fn line_of(key: &str) -> Result<u32, CliError> {
    key.strip_prefix("key:")
        .and_then(|number| number.parse().ok())
        .ok_or_else(|| format!("{key:?} names no line").into())
}

impl CoordClient for LineClient {
    fn read(&mut self, key: &str) -> Result<(), CliError> {
        let line = line_of(key)?;
        match self.session.read(line, 1)? {
            Ok(bytes) if bytes.len() == LINE => Ok(()),
            Ok(bytes) => Err(format!("line {line}: {} bytes read", bytes.len()).into()),
            Err(error) => Err(format!("read of line {line}: {error}").into()),
        }
    }

    fn write(&mut self, key: &str, value: &[u8]) -> Result<(), CliError> {
        let line = line_of(key)?;
        self.session
            .write(line, value)?
            .map_err(|error| format!("write of line {line}: {error}").into())
    }

    fn acquire(&mut self, _: &str) -> Result<u64, CliError> {
        Err("replicated memory has no locks".into())
    }

    fn release(&mut self, _: &str) -> Result<(), CliError> {
        Err("replicated memory has no locks".into())
    }
}

/// The device's counters that say how its operations went.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct DeviceCounters {
    pub reads_one_phase: f64,
    pub write_backs: f64,
    pub resends: f64,
    pub failed: f64,
}

impl DeviceCounters {
    const NAMES: [&'static str; 4] = [
        "pmnet_abd_reads_one_phase_total",
        "pmnet_abd_write_backs_total",
        "pmnet_abd_resends_total",
        "pmnet_abd_failed_total",
    ];

    fn scrape(metrics: SocketAddr) -> Result<DeviceCounters, CliError> {
        let text = pmnet_runtime::metrics::scrape(metrics, Duration::from_secs(5))
            .map_err(|error| format!("scraping the device at {metrics}: {error}"))?;
        let value =
            |name: &str| pmnet_runtime::metrics::find_sample(&text, name, "").unwrap_or(0.0);
        Ok(DeviceCounters {
            reads_one_phase: value(Self::NAMES[0]),
            write_backs: value(Self::NAMES[1]),
            resends: value(Self::NAMES[2]),
            failed: value(Self::NAMES[3]),
        })
    }

    fn since(self, before: DeviceCounters) -> DeviceCounters {
        DeviceCounters {
            reads_one_phase: self.reads_one_phase - before.reads_one_phase,
            write_backs: self.write_backs - before.write_backs,
            resends: self.resends - before.resends,
            failed: self.failed - before.failed,
        }
    }
}

/// A memory: its nodes and the device that coordinates for it, running; stopped when
/// dropped.
struct Memory {
    /// The nodes' processes, then the device's.
    procs: Vec<Proc>,
    nodes: Vec<SocketAddr>,
    node_args: Vec<Vec<String>>,
    node_metrics: Vec<SocketAddr>,
    /// How often each node was started.
    lives: Vec<u32>,
    /// The node SIGKILLed, if one is.
    down: Option<usize>,
    device: SocketAddr,
    device_metrics: SocketAddr,
    /// What the first node's banner says of its medium.
    medium: String,
    lines: u32,
    name: &'static str,
    dir: PathBuf,
}

/// The metrics endpoint a banner names.
fn metrics_of(banner: &str, what: &str) -> Result<SocketAddr, CliError> {
    banner_value(banner, "metrics: http://")
        .and_then(|rest| rest.trim_end_matches("/metrics").parse().ok())
        .ok_or_else(|| format!("{what}'s banner names no metrics endpoint:\n{banner}").into())
}

impl Memory {
    /// Start `count` memory nodes and a device (id `device_id`) coordinating for them; wait
    /// until every node is a member.
    fn start(
        name: &'static str,
        count: usize,
        device_id: u16,
        plan: &AbdPlan,
        dir: &Path,
        shutdown: &Shutdown,
    ) -> Result<Memory, CliError> {
        let exe = crate::procs::pmnet_program()?;
        let ports = free_ports(count + 1)?;
        let nodes: Vec<SocketAddr> = ports[..count].iter().map(|&port| loopback(port)).collect();
        let device = loopback(ports[count]);
        let mut memory = Memory {
            procs: Vec::new(),
            nodes: nodes.clone(),
            node_args: Vec::new(),
            node_metrics: Vec::new(),
            lives: vec![0; count],
            down: None,
            device,
            device_metrics: device,
            medium: String::new(),
            lines: plan.lines,
            name,
            dir: dir.to_owned(),
        };
        for (index, &listen) in nodes.iter().enumerate() {
            let file = dir.join(format!("{name}-node{index}.lines"));
            let mut args: Vec<String> = [
                "memnode",
                "--listen",
                &listen.to_string(),
                "--lines",
                &plan.lines.to_string(),
                "--file",
                &file.display().to_string(),
                "--flush",
                &plan.flush,
                "--persist-latency-ns",
                &plan.persist_latency_ns.to_string(),
                "--metrics",
                "127.0.0.1:0",
                "--report-interval",
                "0",
            ]
            .iter()
            .map(|arg| (*arg).to_owned())
            .collect();
            for peer in nodes.iter().filter(|peer| **peer != listen) {
                args.extend(["--peer".to_owned(), peer.to_string()]);
            }
            memory.node_args.push(args);
            let proc = memory.spawn_node(index, &exe, plan)?;
            memory.procs.push(proc);
        }
        let mut args: Vec<String> = [
            "device",
            "--device-id",
            &device_id.to_string(),
            "--listen",
            &device.to_string(),
            "--abd-lines",
            &plan.lines.to_string(),
            "--metrics",
            "127.0.0.1:0",
            "--report-interval",
            "0",
        ]
        .iter()
        .map(|arg| (*arg).to_owned())
        .collect();
        for node in &nodes {
            args.extend(["--abd-node".to_owned(), node.to_string()]);
        }
        let log = dir.join(format!("{name}-device.out"));
        memory.procs.push(Proc::spawn(
            &format!("{name} device"),
            &exe,
            &args,
            &log,
            plan.device_cpu,
        )?);
        let logs: Vec<PathBuf> = (0..count)
            .map(|index| memory.node_log(index))
            .chain([log])
            .collect();
        let banners = wait_for_banners(
            &format!("the {name} memory"),
            &logs,
            &mut memory.procs,
            shutdown,
        )?;
        for (index, banner) in banners[..count].iter().enumerate() {
            memory
                .node_metrics
                .push(metrics_of(banner, &memory.procs[index].name)?);
        }
        memory.device_metrics = metrics_of(&banners[count], &format!("the {name} device"))?;
        memory.medium = banner_value(&banners[0], "medium: ").unwrap_or_else(|| "unknown".into());
        memory.wait_members(shutdown)?;
        Ok(memory)
    }

    fn node_log(&self, index: usize) -> PathBuf {
        self.dir.join(format!(
            "{}-node{index}.{}.out",
            self.name, self.lives[index]
        ))
    }

    fn spawn_node(&mut self, index: usize, exe: &Path, plan: &AbdPlan) -> Result<Proc, CliError> {
        self.lives[index] += 1;
        Proc::spawn(
            &format!("{} memory node {index}", self.name),
            exe,
            &self.node_args[index],
            &self.node_log(index),
            plan.node_cpu,
        )
    }

    /// Wait until every node that runs is a member (a new node of a new group joins after
    /// about a second; one restarted on its file is a member at once).
    fn wait_members(&mut self, shutdown: &Shutdown) -> Result<(), CliError> {
        let metrics: Vec<SocketAddr> = self
            .node_metrics
            .iter()
            .enumerate()
            .filter(|(index, _)| Some(*index) != self.down)
            .map(|(_, addr)| *addr)
            .collect();
        let what = format!("the {} memory's nodes joining", self.name);
        wait_until(
            &what,
            Duration::from_secs(60),
            &mut self.procs,
            shutdown,
            || {
                for &addr in &metrics {
                    let text = pmnet_runtime::metrics::scrape(addr, Duration::from_secs(5))?;
                    if pmnet_runtime::metrics::find_sample(&text, "pmnet_memnode_member", "")
                        != Some(1.0)
                    {
                        return Ok(false);
                    }
                }
                Ok(true)
            },
        )
    }

    /// A session through the device, or running the quorum here as writer `writer`.
    fn session(&self, direct_writer: Option<u16>) -> Result<AbdSession, CliError> {
        let mode = match direct_writer {
            Some(writer) => AbdMode::Direct {
                nodes: self.nodes.clone(),
                writer,
            },
            None => AbdMode::Device(self.device),
        };
        Ok(AbdSession::open(AbdSessionConfig {
            mode,
            lines: self.lines,
            keys: None,
        })?)
    }

    /// Write every line with `value`, through the device; read one back.
    fn fill(&self, value: &[u8]) -> Result<(), CliError> {
        let mut session = self.session(None)?;
        let all = value.repeat(self.lines as usize);
        session
            .write(0, &all)?
            .map_err(|error| format!("writing the {} memory's lines: {error}", self.name))?;
        let last = self.lines - 1;
        match session.read(last, 1)? {
            Ok(line) if line == value => Ok(()),
            Ok(line) => Err(format!(
                "the {} memory's line {last} reads {line:?}, not the value written",
                self.name
            )
            .into()),
            Err(error) => Err(format!("reading the {} memory: {error}", self.name).into()),
        }
    }

    /// The processes measured: the nodes (and the device unless the quorum runs in the
    /// clients), the one killed left out.
    fn pids(&self, with_device: bool) -> Vec<u32> {
        let count = self.nodes.len();
        self.procs
            .iter()
            .enumerate()
            .filter(|(index, _)| Some(*index) != self.down && (with_device || *index < count))
            .map(|(_, proc)| proc.pid())
            .collect()
    }

    fn device_pid(&self) -> u32 {
        self.procs[self.nodes.len()].pid()
    }

    /// An error if a process that should run has exited.
    fn check_running(&mut self) -> Result<(), CliError> {
        for (index, proc) in self.procs.iter_mut().enumerate() {
            if Some(index) != self.down {
                proc.check_running()?;
            }
        }
        Ok(())
    }

    /// SIGKILL node `index`.
    fn kill(&mut self, index: usize) {
        self.procs[index].kill();
        self.down = Some(index);
    }

    /// Start the node that was killed again on its file, wait until it is a member, and
    /// write every line again, so that it holds every line's latest value.
    fn restart(
        &mut self,
        plan: &AbdPlan,
        value: &[u8],
        shutdown: &Shutdown,
    ) -> Result<(), CliError> {
        let Some(index) = self.down else {
            return Ok(());
        };
        let exe = crate::procs::pmnet_program()?;
        let proc = self.spawn_node(index, &exe, plan)?;
        self.procs[index] = proc;
        let log = self.node_log(index);
        let banner = wait_for_banners(
            &format!("{} restarted", self.procs[index].name),
            std::slice::from_ref(&log),
            std::slice::from_mut(&mut self.procs[index]),
            shutdown,
        )?;
        self.node_metrics[index] = metrics_of(&banner[0], &self.procs[index].name)?;
        self.down = None;
        self.wait_members(shutdown)?;
        self.fill(value)
    }
}

/// Wait until every log of `logs` holds its process's whole banner (its last line names the
/// metrics endpoint); the banners.
fn wait_for_banners(
    what: &str,
    logs: &[PathBuf],
    procs: &mut [Proc],
    shutdown: &Shutdown,
) -> Result<Vec<String>, CliError> {
    let read = || -> Vec<String> {
        logs.iter()
            .map(|log| std::fs::read_to_string(log).unwrap_or_default())
            .collect()
    };
    wait_until(what, Duration::from_secs(60), procs, shutdown, || {
        Ok(read().iter().all(|text| text.contains("metrics: ")))
    })?;
    Ok(read())
}

/// Everything a run started.
struct Deployment {
    single: Option<Memory>,
    triple: Option<Memory>,
    etcd: Option<EtcdCluster>,
    /// Declared last: removed after the processes stopped.
    _dir: tempfile::TempDir,
}

impl Deployment {
    fn start(plan: &AbdPlan, value: &[u8], shutdown: &Shutdown) -> Result<Deployment, CliError> {
        let dir = run_dir(&plan.dir, "abd")?;
        let mut deployment = Deployment {
            single: None,
            triple: None,
            etcd: None,
            _dir: dir,
        };
        let path = deployment._dir.path().to_owned();
        if plan.systems.contains(&AbdSystem::Unreplicated) {
            progress("unreplicated: starting 1 memory node and a device ...");
            let memory = Memory::start("unreplicated", 1, 1, plan, &path, shutdown)?;
            progress(&format!("unreplicated: writing {} lines ...", plan.lines));
            memory.fill(value)?;
            deployment.single = Some(memory);
        }
        if plan.systems.iter().any(|system| system.on_three_nodes()) {
            progress("replicated: starting 3 memory nodes and a device ...");
            let memory = Memory::start("replicated", 3, 2, plan, &path, shutdown)?;
            progress(&format!("replicated: writing {} lines ...", plan.lines));
            memory.fill(value)?;
            deployment.triple = Some(memory);
        }
        if plan.systems.contains(&AbdSystem::Etcd) {
            progress("etcd: starting 3 members ...");
            let etcd = EtcdCluster::start(&plan.etcd, shutdown)?;
            progress(&format!(
                "etcd: running ({}); writing {} keys ...",
                etcd.durability(),
                plan.lines
            ));
            let mut loaders: Vec<Box<dyn CoordClient>> = (0..plan.lines.min(16))
                .map(|index| {
                    etcd.client(index)
                        .map(|c| Box::new(c) as Box<dyn CoordClient>)
                })
                .collect::<Result<_, _>>()?;
            load::preload(&mut loaders, u64::from(plan.lines), value, shutdown)?;
            deployment.etcd = Some(etcd);
        }
        Ok(deployment)
    }

    fn single(&mut self) -> &mut Memory {
        self.single.as_mut().expect("the unreplicated memory runs")
    }

    fn triple(&mut self) -> &mut Memory {
        self.triple.as_mut().expect("the replicated memory runs")
    }

    /// `count` clients of `system`.
    fn clients(
        &mut self,
        system: AbdSystem,
        count: u32,
    ) -> Result<Vec<Box<dyn CoordClient>>, CliError> {
        (0..count)
            .map(|index| -> Result<Box<dyn CoordClient>, CliError> {
                let session = match system {
                    AbdSystem::Etcd => {
                        let etcd = self.etcd.as_ref().expect("etcd runs");
                        return Ok(Box::new(etcd.client(index)?));
                    }
                    AbdSystem::Unreplicated => self.single().session(None)?,
                    AbdSystem::ClientAbd => {
                        let writer = DIRECT_WRITER_BASE + index as u16;
                        self.triple().session(Some(writer))?
                    }
                    AbdSystem::DeviceAbd | AbdSystem::DeviceAbdKilled => {
                        self.triple().session(None)?
                    }
                };
                Ok(Box::new(LineClient { session }))
            })
            .collect()
    }

    /// The processes whose CPU `system` is charged, and its coordinating device.
    fn charged(&mut self, system: AbdSystem) -> Result<Charged, CliError> {
        if system == AbdSystem::Etcd {
            let etcd = self.etcd.as_ref().expect("etcd runs");
            return Ok(Charged {
                pids: etcd.pids(),
                device: None,
            });
        }
        let memory = match system {
            AbdSystem::Unreplicated => self.single(),
            _ => self.triple(),
        };
        memory.check_running()?;
        let with_device = system != AbdSystem::ClientAbd;
        Ok(Charged {
            pids: memory.pids(with_device),
            device: with_device.then(|| (memory.device_metrics, memory.device_pid())),
        })
    }
}

/// What a system's phases are charged to: its processes, and the device coordinating (its
/// metrics endpoint and process id), if one does.
struct Charged {
    pids: Vec<u32>,
    device: Option<(SocketAddr, u32)>,
}

fn progress(text: &str) {
    eprintln!("  {text}");
}

/// One measured (system, op, clients).
#[derive(Debug, Clone, Serialize)]
pub struct AbdRow {
    pub system: &'static str,
    pub op: &'static str,
    pub clients: u32,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub mean_us: f64,
    pub ops_per_s: f64,
    /// Operations measured.
    pub ops: u64,
    pub seconds: f64,
    /// With several rounds: every round's p50 and ops/s, in order (the row is the round with
    /// the median p50).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_us_rounds: Option<Vec<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ops_per_s_rounds: Option<Vec<f64>>,
    /// CPU per operation, warm-up included: the system's processes (`servers`: memory nodes
    /// and device, or etcd's members) and the clients (this process).
    pub cpu_us_per_op: CpuPerOp,
    /// The coordinating device's counters over the phase (warm-up included), per operation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_per_op: Option<DeviceCounters>,
    /// The coordinating device's share of `cpu_us_per_op.servers` (the rest is the memory
    /// nodes').
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_cpu_us_per_op: Option<f64>,
}

fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}

impl AbdRow {
    fn new(system: AbdSystem, op: Op, clients: u32, measured: &Measured, cpu: CpuPerOp) -> AbdRow {
        AbdRow {
            system: system.name(),
            op: op.name(),
            clients,
            p50_us: round2(measured.p50_us),
            p99_us: round2(measured.p99_us),
            p999_us: round2(measured.p999_us),
            mean_us: round2(measured.mean_us),
            ops_per_s: measured.ops_per_s.round(),
            ops: measured.count,
            seconds: round2(measured.seconds),
            p50_us_rounds: None,
            ops_per_s_rounds: None,
            cpu_us_per_op: cpu,
            device_per_op: None,
            device_cpu_us_per_op: None,
        }
    }

    fn brief(&self) -> String {
        format!(
            "p50 {} µs, p99 {} µs, {} ops/s",
            cell(self.p50_us),
            cell(self.p99_us),
            thousands(self.ops_per_s)
        )
    }
}

fn cell(value: f64) -> String {
    if value >= 1000.0 {
        thousands(value)
    } else {
        format!("{value:.1}")
    }
}

/// The round with the median p50, with every round's p50 and ops/s.
fn median_round(mut rows: Vec<AbdRow>) -> Option<AbdRow> {
    if rows.is_empty() {
        return None;
    }
    let p50s: Vec<f64> = rows.iter().map(|row| row.p50_us).collect();
    let rates: Vec<f64> = rows.iter().map(|row| row.ops_per_s).collect();
    rows.sort_by(|a, b| a.p50_us.total_cmp(&b.p50_us));
    let mut median = rows.swap_remove(rows.len() / 2);
    if p50s.len() > 1 {
        median.p50_us_rounds = Some(p50s);
        median.ops_per_s_rounds = Some(rates);
    }
    Some(median)
}

/// A ratio the issue sets a target for (or, without one, shown for comparison).
#[derive(Debug, Clone, Serialize)]
pub struct AbdRatio {
    pub numerator: &'static str,
    pub denominator: &'static str,
    /// `p50_us` or `ops_per_s`.
    pub measure: &'static str,
    pub op: &'static str,
    pub clients: u32,
    pub value: f64,
    /// `at most` or `at least`, with `target`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub met: Option<bool>,
}

/// The targets: device-abd's p50 at most 3× unreplicated's; etcd's p50 at least 10×
/// device-abd's; device-abd's throughput at the loaded count at least 10× etcd's, and with a
/// node killed at least 0.8× its own. Then, for comparison, client-driven against
/// device-driven ABD.
pub fn ratios(results: &[AbdRow], many: u32) -> Vec<AbdRatio> {
    use AbdSystem::*;
    let find = |system: AbdSystem, op: Op, clients: u32| {
        results.iter().find(|row| {
            row.system == system.name() && row.op == op.name() && row.clients == clients
        })
    };
    type Spec = (
        AbdSystem,
        AbdSystem,
        &'static str,
        u32,
        Option<(&'static str, f64)>,
    );
    let specs: [Spec; 6] = [
        (DeviceAbd, Unreplicated, "p50_us", 1, Some(("at most", 3.0))),
        (Etcd, DeviceAbd, "p50_us", 1, Some(("at least", 10.0))),
        (DeviceAbd, Etcd, "ops_per_s", many, Some(("at least", 10.0))),
        (
            DeviceAbdKilled,
            DeviceAbd,
            "ops_per_s",
            many,
            Some(("at least", 0.8)),
        ),
        (ClientAbd, DeviceAbd, "p50_us", 1, None),
        (DeviceAbd, ClientAbd, "ops_per_s", many, None),
    ];
    let mut out = Vec::new();
    for (numerator, denominator, measure, clients, target) in specs {
        if measure == "ops_per_s" && clients == 1 {
            // Throughput is compared under load only.
            continue;
        }
        for op in [Op::Read, Op::Write] {
            let (Some(a), Some(b)) = (find(numerator, op, clients), find(denominator, op, clients))
            else {
                continue;
            };
            let (x, y) = match measure {
                "p50_us" => (a.p50_us, b.p50_us),
                _ => (a.ops_per_s, b.ops_per_s),
            };
            if y <= 0.0 {
                continue;
            }
            let value = (x / y * 1000.0).round() / 1000.0;
            out.push(AbdRatio {
                numerator: numerator.name(),
                denominator: denominator.name(),
                measure,
                op: op.name(),
                clients,
                value,
                bound: target.map(|(bound, _)| bound),
                target: target.map(|(_, target)| target),
                met: target.map(|(bound, target)| match bound {
                    "at most" => value <= target,
                    _ => value >= target,
                }),
            });
        }
    }
    out
}

/// The setting a run reports.
#[derive(Debug, Clone, Serialize)]
pub struct AbdSetting {
    pub machine: String,
    pub cpus_online: usize,
    pub placement: String,
    pub wait: &'static str,
    /// What the memory nodes' banners say of their medium.
    pub memory_node_medium: String,
    pub lines: u32,
    pub value_bytes: usize,
    /// etcd's version and durability.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub etcd: Option<String>,
    pub killed: String,
    pub clients: Vec<u32>,
    pub seed: u64,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub rounds: u32,
    pub dir: String,
    /// The most CPUs the machine's other processes kept busy during any measurement shown
    /// (0: the run had the machine to itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub others_cpus_max: Option<f64>,
}

/// A whole run, as the JSON has it.
#[derive(Debug, Serialize)]
pub struct AbdReport {
    pub setting: AbdSetting,
    pub results: Vec<AbdRow>,
    pub ratios: Vec<AbdRatio>,
    pub interrupted: bool,
}

impl AbdReport {
    /// The results table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let counts = &self.setting.clients;
        let mut header = format!("  {:<26} {:<5}", "system", "op");
        for &count in counts {
            let clients = if count == 1 {
                "1 client".to_owned()
            } else {
                format!("{count} clients")
            };
            let _ = write!(
                header,
                " | {:>11} {:>8} {:>9} {:>10}",
                format!("{clients}: p50"),
                "p99",
                "ops/s",
                "CPU s+c"
            );
        }
        let _ = writeln!(out, "{header}");
        let mut seen: Vec<(&str, &str)> = Vec::new();
        for row in &self.results {
            if seen.contains(&(row.system, row.op)) {
                continue;
            }
            seen.push((row.system, row.op));
            let label = [
                AbdSystem::Unreplicated,
                AbdSystem::ClientAbd,
                AbdSystem::DeviceAbd,
                AbdSystem::Etcd,
                AbdSystem::DeviceAbdKilled,
            ]
            .into_iter()
            .find(|system| system.name() == row.system)
            .map_or(row.system, AbdSystem::label);
            let mut line = format!("  {label:<26} {:<5}", row.op);
            for &count in counts {
                match self.results.iter().find(|other| {
                    other.system == row.system && other.op == row.op && other.clients == count
                }) {
                    Some(found) => {
                        let cpu = format!(
                            "{:.0} + {:.0}",
                            found.cpu_us_per_op.servers, found.cpu_us_per_op.clients
                        );
                        let _ = write!(
                            line,
                            " | {:>11} {:>8} {:>9} {:>10}",
                            cell(found.p50_us),
                            cell(found.p99_us),
                            thousands(found.ops_per_s),
                            cpu
                        );
                    }
                    None => {
                        let _ = write!(line, " | {:>11} {:>8} {:>9} {:>10}", "-", "-", "-", "-");
                    }
                }
            }
            let _ = writeln!(out, "{}", line.trim_end());
        }
        out
    }

    /// The ratios, one line each, with their targets.
    pub fn ratios_text(&self) -> String {
        let mut out = String::new();
        for ratio in &self.ratios {
            let measure = if ratio.measure == "p50_us" {
                "p50"
            } else {
                "ops/s"
            };
            let clients = if ratio.clients == 1 {
                "1 client".to_owned()
            } else {
                format!("{} clients", ratio.clients)
            };
            let name = format!(
                "{} {measure} / {} {measure}, {}, {clients}",
                ratio.numerator, ratio.denominator, ratio.op
            );
            let verdict = match (ratio.bound, ratio.target, ratio.met) {
                (Some(bound), Some(target), Some(met)) => format!(
                    "target {} {target}×: {}",
                    if bound == "at most" { "≤" } else { "≥" },
                    if met { "met" } else { "NOT met" }
                ),
                _ => "(no target)".to_owned(),
            };
            let _ = writeln!(out, "  {name:<62} {:>6.2}×  {verdict}", ratio.value);
        }
        out
    }

    /// What the coordinating devices counted.
    pub fn device_text(&self) -> String {
        let mut out = String::new();
        for row in &self.results {
            if let (Some(device), Some(cpu)) = (row.device_per_op, row.device_cpu_us_per_op) {
                let clients = if row.clients == 1 {
                    "1 client".to_owned()
                } else {
                    format!("{} clients", row.clients)
                };
                let _ = writeln!(
                    out,
                    "  {:<17} {:<5} {clients:>10}: device CPU {cpu:.1} µs of {:.1}; per op: \
                     one-phase reads {:.3}, write-backs {:.3}, resends {:.3}, failed {:.3}",
                    row.system,
                    row.op,
                    row.cpu_us_per_op.servers,
                    device.reads_one_phase,
                    device.write_backs,
                    device.resends,
                    device.failed
                );
            }
        }
        out
    }

    pub fn setting_text(&self) -> String {
        let s = &self.setting;
        let mut out = String::new();
        let _ = writeln!(out, "  machine: {}", s.machine);
        let _ = writeln!(out, "  placement: {}; waits: {}", s.placement, s.wait);
        let _ = writeln!(
            out,
            "  memory: {} lines of {} bytes; memory nodes' medium: {}",
            s.lines, s.value_bytes, s.memory_node_medium
        );
        if let Some(etcd) = &s.etcd {
            let _ = writeln!(
                out,
                "  etcd: {etcd}; a line is a key of {} bytes",
                s.value_bytes
            );
        }
        let _ = writeln!(out, "  killed: {}", s.killed);
        if let Some(others) = s.others_cpus_max {
            let _ = writeln!(
                out,
                "  other processes on the machine kept up to {others:.2} CPUs busy during a \
                 measurement shown"
            );
        }
        let _ = writeln!(
            out,
            "  load: closed loop, one operation in flight per client, lines drawn uniformly; \
             seed {}; {:.1} s warm-up and {:.1} s measured per phase; {} round(s), the median \
             round by p50 shown; CPU s+c: CPU µs per operation of the system's processes + the \
             clients, warm-up included",
            s.seed, s.warmup_s, s.duration_s, s.rounds
        );
        out
    }

    fn write_json(&self, path: &Path) -> Result<(), CliError> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n")
            .map_err(|error| format!("cannot write {}: {error}", path.display()).into())
    }
}

/// Measure `op` on `clients` of `system`; `None` if a signal cut it short.
fn measure_op(
    system: AbdSystem,
    op: Op,
    clients: &mut [Box<dyn CoordClient>],
    charged: &Charged,
    (plan, label): (&AbdPlan, &str),
    shutdown: &Shutdown,
) -> Result<Option<AbdRow>, CliError> {
    let count = clients.len() as u32;
    if plan.progress {
        eprintln!(
            "{label}: {:.1} s warm-up, {:.1} s measured ...",
            plan.warmup.as_secs_f64(),
            plan.duration.as_secs_f64()
        );
    }
    let phase = Phase {
        op,
        workload: plan.workload(),
        seed: plan.seed,
        warmup: plan.warmup,
        duration: plan.duration,
        client_cpu: plan.client_cpu,
    };
    let device_cpu = |pid| procs::cpu_seconds_of(pid).unwrap_or(0.0);
    let before = match charged.device {
        Some((metrics, pid)) => Some((DeviceCounters::scrape(metrics)?, device_cpu(pid))),
        None => None,
    };
    let (measured, cpu) = run_phase(clients, &phase, shutdown, &charged.pids)
        .map_err(|error| format!("{} {}: {error}", system.name(), op.name()))?;
    if measured.interrupted {
        return Ok(None);
    }
    let mut row = AbdRow::new(system, op, count, &measured, cpu);
    if let (Some((metrics, pid)), Some((counters, seconds))) = (charged.device, before) {
        let counters = DeviceCounters::scrape(metrics)?.since(counters);
        let per_op = |value: f64| value / measured.completed.max(1) as f64;
        let round3 = |value: f64| (value * 1000.0).round() / 1000.0;
        row.device_per_op = Some(DeviceCounters {
            reads_one_phase: round3(per_op(counters.reads_one_phase)),
            write_backs: round3(per_op(counters.write_backs)),
            resends: round3(per_op(counters.resends)),
            failed: round3(per_op(counters.failed)),
        });
        row.device_cpu_us_per_op = Some(round2(per_op(device_cpu(pid) - seconds) * 1e6));
    }
    if plan.progress {
        eprintln!("{label}: {}", row.brief());
    }
    Ok(Some(row))
}

/// Run every system's phases, `plan.rounds` times in turns; every (system, op, clients)'s
/// rows, and whether a signal cut the run short.
fn measure_all(
    plan: &AbdPlan,
    deployment: &mut Deployment,
    value: &[u8],
    shutdown: &Shutdown,
) -> Result<(Vec<Vec<AbdRow>>, bool), CliError> {
    let mut rows: Vec<Vec<AbdRow>> = Vec::new();
    for round in 0..plan.rounds {
        let mut index = 0;
        for &system in &plan.systems {
            if system == AbdSystem::DeviceAbdKilled {
                if plan.progress {
                    eprintln!(
                        "  {}: SIGKILL memory node {KILLED_NODE} of 3",
                        system.name()
                    );
                }
                deployment.triple().kill(KILLED_NODE);
            }
            for count in plan.clients_of(system) {
                let mut clients = deployment.clients(system, count)?;
                let charged = deployment.charged(system)?;
                for op in [Op::Read, Op::Write] {
                    let who = if count == 1 {
                        "  1 client ".to_owned()
                    } else {
                        format!("{count:>3} clients")
                    };
                    let label = if plan.rounds > 1 {
                        format!(
                            "  {:<17} {:<5} {who}, round {}/{}",
                            system.name(),
                            op.name(),
                            round + 1,
                            plan.rounds
                        )
                    } else {
                        format!("  {:<17} {:<5} {who}", system.name(), op.name())
                    };
                    let Some(row) =
                        measure_op(system, op, &mut clients, &charged, (plan, &label), shutdown)?
                    else {
                        return Ok((rows, true));
                    };
                    if round == 0 {
                        rows.push(Vec::new());
                    }
                    rows[index].push(row);
                    index += 1;
                }
            }
            if system == AbdSystem::DeviceAbdKilled {
                if plan.progress {
                    eprintln!(
                        "  {}: memory node {KILLED_NODE} started again on its file; writing \
                         every line again ...",
                        system.name()
                    );
                }
                deployment.triple().restart(plan, value, shutdown)?;
            }
        }
    }
    Ok((rows, false))
}

/// `pmnet bench --abd`.
pub fn run_command(args: &BenchArgs) -> Result<ExitCode, CliError> {
    let plan = AbdPlan::from_args(args)?;
    let shutdown = Shutdown::on_signals()?;
    let removed = procs::remove_stale_dirs(&[&plan.dir, &plan.etcd.dir]);
    if removed > 0 {
        eprintln!("(removed {removed} directories an earlier run left when it was killed)");
    }
    println!(
        "pmnet bench --abd: {} at {} client(s), reads and writes of one {LINE}-byte line over \
         {} lines (seed {})",
        plan.systems
            .iter()
            .map(|system| system.name())
            .collect::<Vec<_>>()
            .join(", "),
        plan.clients
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" and "),
        plan.lines,
        plan.seed
    );
    let value = load::value_of(plan.seed, LINE);
    // An error while a signal asks to stop (a start-up cut short) is the interruption.
    let mut deployment = match Deployment::start(&plan, &value, &shutdown) {
        Ok(deployment) => deployment,
        Err(_) if shutdown.is_requested() => {
            eprintln!("pmnet bench --abd: interrupted while starting");
            return Ok(ExitCode::from(130));
        }
        Err(error) => return Err(error),
    };
    let (rows, mut interrupted) = match measure_all(&plan, &mut deployment, &value, &shutdown) {
        Ok(outcome) => outcome,
        Err(_) if shutdown.is_requested() => (Vec::new(), true),
        Err(error) => return Err(error),
    };
    interrupted |= shutdown.is_requested();
    let medium = deployment
        .triple
        .as_ref()
        .or(deployment.single.as_ref())
        .map_or_else(|| "none started".to_owned(), |memory| memory.medium.clone());
    let etcd = deployment.etcd.as_ref().map(EtcdCluster::durability);
    drop(deployment);
    let results: Vec<AbdRow> = rows.into_iter().filter_map(median_round).collect();
    let ratios = ratios(&results, plan.many);
    let report = AbdReport {
        setting: AbdSetting {
            machine: procs::machine_text(),
            cpus_online: pmnet_runtime::online_cpu_count(),
            placement: plan.placement(),
            wait: "blocking (every process and client sleeps in the kernel while it waits)",
            memory_node_medium: medium,
            lines: plan.lines,
            value_bytes: LINE,
            etcd,
            killed: format!(
                "memory node {KILLED_NODE} of 3 SIGKILLed before the warm-up of the killed \
                 run ({} clients); afterwards started again on its file and every line \
                 written again",
                plan.many
            ),
            clients: plan.clients.clone(),
            seed: plan.seed,
            duration_s: plan.duration.as_secs_f64(),
            warmup_s: plan.warmup.as_secs_f64(),
            rounds: plan.rounds,
            dir: plan.dir.display().to_string(),
            others_cpus_max: results
                .iter()
                .filter_map(|row| row.cpu_us_per_op.others_cpus)
                .reduce(f64::max),
        },
        results,
        ratios,
        interrupted,
    };
    println!();
    print!("{}", report.table());
    if !report.ratios.is_empty() {
        println!();
        println!("ratios:");
        print!("{}", report.ratios_text());
    }
    let device = report.device_text();
    if !device.is_empty() {
        println!();
        println!("the coordinating devices (CPU µs per op, of the system's; counters per op):");
        print!("{device}");
    }
    println!();
    println!("setting:");
    print!("{}", report.setting_text());
    if interrupted {
        println!("interrupted: what is not shown did not run");
    }
    if let Some(path) = &plan.json {
        report.write_json(path)?;
        println!("JSON written to {}", path.display());
    }
    Ok(if interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::super::args::tests::parse;
    use super::*;

    #[test]
    fn the_defaults_measure_every_system_at_1_and_16_clients_over_4096_lines() {
        let args = parse(&["--abd"]).unwrap();
        let plan = AbdPlan::from_args(&args).unwrap();
        assert_eq!(
            plan.systems,
            [
                AbdSystem::Unreplicated,
                AbdSystem::ClientAbd,
                AbdSystem::DeviceAbd,
                AbdSystem::Etcd,
                AbdSystem::DeviceAbdKilled
            ]
        );
        assert_eq!(plan.clients, [1, 16]);
        assert_eq!(plan.clients_of(AbdSystem::DeviceAbdKilled), [16]);
        assert_eq!((plan.lines, plan.rounds), (4096, 3));
        assert_eq!(plan.etcd.program, "etcd");
        assert!(plan.placement().starts_with("not pinned"));
        let args = parse(&["--abd", "--clients", "1", "--keys", "64", "--rounds", "1"]).unwrap();
        let plan = AbdPlan::from_args(&args).unwrap();
        assert_eq!(
            (plan.clients.as_slice(), plan.lines, plan.rounds),
            (&[1][..], 64, 1)
        );
    }

    #[test]
    fn options_that_do_not_fit_are_refused() {
        for (words, expected) in [
            (&["--abd", "--replicas", "2"][..], "--replicas"),
            (&["--abd", "--capacity"][..], "--capacity"),
            (
                &["--abd", "--device", "127.0.0.1:7400"][..],
                "running parts",
            ),
            (&["--abd", "--servers", "2"][..], "a rack"),
            (&["--abd", "--window", "4"][..], "--window"),
            (&["--abd", "--busy-poll"][..], "--busy-poll"),
            (&["--abd", "--keys", "100000000"][..], "at most"),
            (&["--abd", "--client-cpu", "100000"][..], "online CPUs"),
        ] {
            let error = AbdPlan::from_args(&parse(words).unwrap()).unwrap_err();
            assert!(error.contains(expected), "{words:?}: {error}");
        }
        assert!(parse(&["--abd-system", "etcd"])
            .unwrap_err()
            .contains("--abd"));
        assert!(parse(&["--abd", "--abd-system", "redis"])
            .unwrap_err()
            .contains("unreplicated"));
    }

    #[test]
    fn keys_name_lines() {
        assert_eq!(line_of(&pmnet::loadgen::key_name(4095)).unwrap(), 4095);
        assert!(line_of("other").is_err());
    }

    fn row(system: AbdSystem, op: Op, clients: u32, p50_us: f64, ops_per_s: f64) -> AbdRow {
        let measured = Measured {
            count: 10,
            completed: 10,
            p50_us,
            p99_us: p50_us * 2.0,
            ops_per_s,
            ..Measured::default()
        };
        let cpu = CpuPerOp {
            servers: 1.0,
            clients: 1.0,
            others_cpus: None,
        };
        AbdRow::new(system, op, clients, &measured, cpu)
    }

    #[test]
    fn ratios_are_checked_against_their_targets() {
        let mut results = Vec::new();
        for op in [Op::Read, Op::Write] {
            results.push(row(AbdSystem::Unreplicated, op, 1, 20.0, 50_000.0));
            results.push(row(AbdSystem::DeviceAbd, op, 1, 50.0, 20_000.0));
            results.push(row(AbdSystem::Etcd, op, 1, 600.0, 1_600.0));
            results.push(row(AbdSystem::DeviceAbd, op, 16, 300.0, 50_000.0));
            results.push(row(AbdSystem::Etcd, op, 16, 3000.0, 6_000.0));
            results.push(row(AbdSystem::DeviceAbdKilled, op, 16, 300.0, 45_000.0));
        }
        assert_eq!(ratios(&results, 1).len(), 4, "throughput under load only");
        let ratios = ratios(&results, 16);
        assert_eq!(ratios.len(), 8, "{ratios:?}");
        let find = |numerator: &str, op: &str| {
            ratios
                .iter()
                .find(|r| r.numerator == numerator && r.op == op)
                .unwrap()
                .clone()
        };
        let latency = find("device-abd", "read");
        assert_eq!((latency.value, latency.met), (2.5, Some(true)));
        let etcd = find("etcd", "write");
        assert_eq!((etcd.value, etcd.met), (12.0, Some(true)));
        let killed = find("device-abd-killed", "read");
        assert_eq!((killed.value, killed.met), (0.9, Some(true)));
        let throughput = ratios
            .iter()
            .find(|r| r.measure == "ops_per_s" && r.denominator == "etcd")
            .unwrap();
        assert_eq!((throughput.value, throughput.met), (8.333, Some(false)));
    }

    #[test]
    fn the_median_round_is_kept_with_every_round() {
        let rows = vec![
            row(AbdSystem::DeviceAbd, Op::Read, 1, 30.0, 1.0),
            row(AbdSystem::DeviceAbd, Op::Read, 1, 10.0, 3.0),
            row(AbdSystem::DeviceAbd, Op::Read, 1, 20.0, 2.0),
        ];
        let median = median_round(rows).unwrap();
        assert_eq!(median.p50_us, 20.0);
        assert_eq!(median.p50_us_rounds, Some(vec![30.0, 10.0, 20.0]));
        assert_eq!(median.ops_per_s_rounds, Some(vec![1.0, 3.0, 2.0]));
        assert!(median_round(Vec::new()).is_none());
    }
}
