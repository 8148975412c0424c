//! `pmnet bench --in-path`: the device in the path (docs/inpath.md) on a testbed of the run's
//! own (docs/testbed.md), against the kernel's forwarding and today's UDP-socket device, side
//! by side in one run (docs/benchmarks.md, "In the path (AF_XDP)"):
//!
//! 1. forwarding: traffic that is not PMNet's (a UDP flow on another port, a TCP bulk
//!    transfer) routed by the kernel with no device process, and with the in-path device's XDP
//!    program attached and passing it;
//! 2. capacity: updates/s at saturation (several clients, each a window of updates in flight)
//!    through the in-path AF_XDP device and through the UDP-socket device in proxy mode;
//! 3. latency: one client, one update at a time, through the in-path device against a UDP
//!    echo off the same device's kernel socket, blocking and busy-polling;
//! 4. load: 16 clients (`--clients`) through the in-path device against the clients talking
//!    to the server directly (no device process, kernel forwarding), with the CPU each process
//!    spends per update.
//!
//! Every process is started on its host as a user starts it (`pmnet server`, `pmnet device`
//! with the product's options: `bed.rs`); the clients are `pmnet bench`'s own (`run_modes`
//! against the addresses, on a thread moved into the client's namespace); the non-PMNet
//! traffic is in `traffic.rs`; the CPU readings in `meter.rs`; records, ratios and the JSON in
//! `report.rs`.

mod bed;
mod meter;
mod report;
mod traffic;

#[cfg(test)]
mod tests;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use pmnet_runtime::Shutdown;
use pmnet_testbed::Host;

use self::bed::{echo_addr, proxy_addr, server_addr, Bed, DeviceRole, ProcOptions};
use self::meter::Span;
use self::report::{CpuPerOp, InPathReport, InPathSetting, Record};
use super::args::{BenchArgs, Part};
use crate::procs::machine_text;
use pmnet::loadgen::{run_modes, thousands, Mode, ModeResult, Plan};
use pmnet::CliError;

/// Updates each capacity client keeps in flight unless `--window` says otherwise.
const CAPACITY_WINDOW: u32 = 16;
/// Client threads of the load part unless `--clients` says otherwise.
const LOAD_CLIENTS: u32 = 16;
/// The prefix of the run's testbed name (then this process's id).
const TESTBED_PREFIX: &str = "pb";

/// What one step measures.
#[derive(Debug, Clone, Copy)]
enum Work {
    UdpFlow,
    TcpBulk,
    /// PMNet clients (or, without a device, clients of the server).
    Updates {
        clients: u32,
        window: u32,
    },
    /// One echo client off the device's UDP echo port.
    Echo,
}

/// One measurement: a system under one configuration of processes.
#[derive(Debug, Clone, Copy)]
struct Step {
    part: Part,
    system: &'static str,
    role: DeviceRole,
    work: Work,
}

impl Step {
    fn busy_poll(&self) -> bool {
        self.role == (DeviceRole::InPath { busy_poll: true })
    }

    fn wait(&self) -> &'static str {
        if self.busy_poll() {
            "busy-poll"
        } else {
            "blocking"
        }
    }

    fn op(&self) -> &'static str {
        match self.work {
            Work::UdpFlow => "udp-flow",
            Work::TcpBulk => "tcp-bulk",
            Work::Updates { .. } => "update",
            Work::Echo => "echo",
        }
    }
}

/// What a run does, from the options.
struct InPathPlan {
    parts: Vec<Part>,
    load_clients: u32,
    capacity_clients: u32,
    capacity_window: u32,
    duration: Duration,
    warmup: Duration,
    rounds: u32,
    seed: u64,
    progress: bool,
    /// The update datagram's size (a PMNet header and the workload's SET), and the keys.
    datagram_bytes: usize,
    keys: u64,
    /// `pmnet bench`'s options, from which each step's client plan is made.
    args: BenchArgs,
    procs: ProcOptions,
}

impl InPathPlan {
    fn from_args(args: &BenchArgs) -> Result<InPathPlan, String> {
        let external = [args.device, args.forward, args.echo, args.server]
            .iter()
            .any(Option::is_some);
        let conflict = if external {
            Some("the addresses of running parts (--device/--forward/--echo/--server)")
        } else if args.capacity {
            Some("--capacity")
        } else if !args.replication.replicas.is_empty() {
            Some("--replicas")
        } else if args.abd.abd {
            Some("--abd")
        } else if args.servers.is_some() || args.server_max_ops_per_s.is_some() {
            Some("a rack (--servers, --server-max-ops-per-s)")
        } else if args.cache.cache.contains(&true) {
            Some("--cache on")
        } else if args.requests.is_some() {
            Some("--requests (every measurement runs for --duration)")
        } else if args.busy_poll {
            Some("--busy-poll (the latency part runs blocking and busy-polling; the others block)")
        } else if args.key_file.is_some() {
            Some("--key-file (traffic is not authenticated)")
        } else if args.device_workers > 1 {
            Some("--device-workers (the AF_XDP device runs one worker)")
        } else {
            None
        };
        if let Some(conflict) = conflict {
            return Err(format!(
                "--in-path starts its own testbed, device and server; it does not go with \
                 {conflict}"
            ));
        }
        if args.update_ratio.is_some_and(|ratio| ratio < 1.0) {
            return Err("--in-path measures updates only; drop --update-ratio".into());
        }
        if !args.dir.is_dir() {
            return Err(format!(
                "--dir {}: not a directory (the log and store files go there)",
                args.dir.display()
            ));
        }
        let online = pmnet_runtime::online_cpu_count();
        for (what, cpu) in [
            ("client", args.client_cpu),
            ("device", args.device_cpu),
            ("server", args.server_cpu),
        ] {
            if let Some(cpu) = cpu.filter(|cpu| *cpu >= online) {
                return Err(format!(
                    "--{what}-cpu {cpu}: this machine has {online} online CPUs"
                ));
            }
        }
        let mut parts = Vec::new();
        for part in &args.inpath.parts {
            if !parts.contains(part) {
                parts.push(*part);
            }
        }
        // The workload every step's clients draw from (a plan against the server's address).
        let mut probe = args.clone();
        probe.server = Some(server_addr());
        probe.modes = vec![Mode::Baseline];
        let workload = Plan::from_args(&probe)?.workload;
        Ok(InPathPlan {
            datagram_bytes: pmnet_wire::HEADER_LEN + workload.set_request_len(),
            keys: workload.keys,
            parts,
            load_clients: args.clients.unwrap_or(LOAD_CLIENTS),
            capacity_clients: args.inpath.in_path_capacity_clients,
            capacity_window: args.window.unwrap_or(CAPACITY_WINDOW),
            duration: Duration::from_secs_f64(args.duration),
            warmup: Duration::from_secs_f64(args.warmup),
            rounds: args.rounds.unwrap_or(1),
            seed: args.seed.unwrap_or_else(rand::random),
            progress: !args.no_progress,
            args: args.clone(),
            procs: ProcOptions {
                flush: args.flush.name().to_owned(),
                persist_latency_ns: args.persist_latency_ns,
                ideal: args.ideal,
                engine: args
                    .engine
                    .to_possible_value()
                    .map_or_else(|| "packet".to_owned(), |v| v.get_name().to_owned()),
                data_mib: args.data_mib,
                slots: args.slots,
                batch_hold_us: args.batch_hold_us,
                no_batch: args.no_batch,
                device_cpu: args.device_cpu,
                server_cpu: args.server_cpu,
                xdp_mode: args.inpath.in_path_xdp_mode.clone(),
                dir: args.dir.clone(),
            },
        })
    }

    fn has(&self, part: Part) -> bool {
        self.parts.contains(&part)
    }

    /// Every step of a round, in the order that restarts the processes least: no device,
    /// the in-path device blocking, busy-polling, the proxy-mode device.
    fn steps(&self) -> Vec<Step> {
        use DeviceRole::{InPath, Proxy};
        let inpath = InPath { busy_poll: false };
        let busy = InPath { busy_poll: true };
        let load = Work::Updates {
            clients: self.load_clients,
            window: 1,
        };
        let capacity = Work::Updates {
            clients: self.capacity_clients,
            window: self.capacity_window,
        };
        let one = Work::Updates {
            clients: 1,
            window: 1,
        };
        let step = |part, system, role, work| Step {
            part,
            system,
            role,
            work,
        };
        let all = [
            step(Part::Forwarding, "kernel", DeviceRole::None, Work::UdpFlow),
            step(Part::Forwarding, "kernel", DeviceRole::None, Work::TcpBulk),
            step(Part::Load, "baseline", DeviceRole::None, load),
            step(Part::Forwarding, "in-path", inpath, Work::UdpFlow),
            step(Part::Forwarding, "in-path", inpath, Work::TcpBulk),
            step(Part::Load, "in-path", inpath, load),
            step(Part::Latency, "echo", inpath, Work::Echo),
            step(Part::Latency, "in-path", inpath, one),
            step(Part::Capacity, "in-path", inpath, capacity),
            step(Part::Latency, "echo", busy, Work::Echo),
            step(Part::Latency, "in-path", busy, one),
            step(Part::Capacity, "proxy-udp", Proxy, capacity),
        ];
        all.into_iter().filter(|step| self.has(step.part)).collect()
    }

    /// The client plan of a step: `pmnet bench`'s own against the step's address.
    fn client_plan(&self, step: &Step) -> Result<Plan, String> {
        let mut args = self.args.clone();
        let (clients, window) = match step.work {
            Work::Updates { clients, window } => (clients, window),
            _ => (1, 1),
        };
        args.clients = Some(clients);
        args.window = Some(window);
        args.busy_poll = step.busy_poll();
        args.seed = Some(self.seed);
        args.rounds = Some(1);
        args.requests = None;
        args.json = None;
        // The live progress line on a terminal; no line per mode otherwise (the steps say).
        args.no_progress = !(self.progress && std::io::stderr().is_terminal());
        let (mode, peer) = match (step.work, step.role) {
            (Work::Echo, _) => (Mode::Echo, &mut args.echo),
            (_, DeviceRole::None) => (Mode::Baseline, &mut args.server),
            (_, DeviceRole::Proxy) => (Mode::Pmnet, &mut args.device),
            (_, DeviceRole::InPath { .. }) => (Mode::Pmnet, &mut args.device),
        };
        *peer = Some(match (step.work, step.role) {
            (Work::Echo, _) => echo_addr(),
            (_, DeviceRole::Proxy) => proxy_addr(),
            _ => server_addr(),
        });
        args.modes = vec![mode];
        Plan::from_args(&args)
    }
}

/// `pmnet bench --in-path`.
pub fn run_command(args: &BenchArgs) -> Result<ExitCode, CliError> {
    let plan = InPathPlan::from_args(args)?;
    let shutdown = Shutdown::on_signals()?;
    remove_stale_testbeds();
    let name = format!("{TESTBED_PREFIX}{}", std::process::id());
    let steps = plan.steps();
    println!(
        "pmnet bench --in-path: {} on testbed {name}; {} round(s) of {} measurements, {:.1} s \
         each after {:.1} s of warm-up (seed {})",
        plan.parts
            .iter()
            .map(|part| part.name())
            .collect::<Vec<_>>()
            .join(", "),
        plan.rounds,
        steps.len(),
        plan.duration.as_secs_f64(),
        plan.warmup.as_secs_f64(),
        plan.seed
    );
    let load_start = pmnet::loadgen::plan::load_average();
    let mut bed = Bed::up(&name, plan.procs.clone())?;
    let mut all = Vec::new();
    let mut interrupted = false;
    'rounds: for round in 1..=plan.rounds {
        if plan.rounds > 1 {
            println!("round {round} of {}:", plan.rounds);
        }
        for step in &steps {
            if shutdown.is_requested() {
                interrupted = true;
                break 'rounds;
            }
            bed.ensure(step.role, &shutdown)?;
            print_step_start(step);
            match run_step(&plan, &mut bed, step, &shutdown)? {
                Some(record) => {
                    println!("{}", step_figure(&record));
                    all.push(record);
                }
                None => {
                    println!("interrupted");
                    interrupted = true;
                    break 'rounds;
                }
            }
        }
    }
    bed.stop();
    let results = report::medians(all);
    let ratios = report::ratios(&results);
    let setting = setting(&plan, &bed, &name, load_start);
    drop(bed);
    println!();
    print!("{}", report::results_text(&results));
    let notes = report::notes_text(&results);
    if !notes.is_empty() {
        println!();
        print!("{notes}");
    }
    if !ratios.is_empty() {
        println!();
        print!("{}", report::ratios_text(&ratios));
    }
    println!();
    print!("{}", report::setting_text(&setting));
    if interrupted {
        println!("interrupted: the measurements not shown did not run");
    }
    let report = InPathReport {
        setting,
        results,
        ratios,
        interrupted,
    };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("JSON written to {}", path.display());
    }
    Ok(if interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// Take down the testbeds of earlier runs that were killed before they could (named
/// `pb<PID>` after a process that no longer runs).
fn remove_stale_testbeds() {
    let Ok(namespaces) = pmnet_testbed::netns_list() else {
        return;
    };
    for netns in namespaces {
        let Some(name) = netns.strip_suffix("-d") else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(TESTBED_PREFIX)
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            match pmnet_testbed::Testbed::down(name) {
                Ok(()) => println!("removed testbed {name} left by an earlier run"),
                Err(error) => eprintln!("cannot remove the stale testbed {name}: {error}"),
            }
        }
    }
}

fn print_step_start(step: &Step) {
    use std::io::Write;
    let shape = match step.work {
        Work::Updates { clients, window } => format!(" {clients}×{window}"),
        Work::Echo => " 1×1".to_owned(),
        _ => String::new(),
    };
    print!(
        "  {:<10} {:<9} {}{shape} [{}, {}] ... ",
        step.part.name(),
        step.system,
        step.op(),
        step.role.datapath(),
        step.wait()
    );
    let _ = std::io::stdout().flush();
}

fn step_figure(record: &Record) -> String {
    match (record.op, record.mb_per_s) {
        (_, Some(mb)) => format!("{mb:.1} MB/s"),
        ("udp-flow", _) => format!(
            "{} datagrams/s (loss {:.1}%)",
            thousands(record.ops_per_s.unwrap_or(0.0)),
            record.loss.unwrap_or(0.0) * 100.0
        ),
        _ => format!(
            "p50 {:.1} µs, p99 {:.1} µs, {} ops/s",
            record.p50_us.unwrap_or(f64::NAN),
            record.p99_us.unwrap_or(f64::NAN),
            thousands(record.ops_per_s.unwrap_or(0.0))
        ),
    }
}

/// Run one step on the processes `bed` has running; `None` when interrupted.
fn run_step(
    plan: &InPathPlan,
    bed: &mut Bed,
    step: &Step,
    shutdown: &Shutdown,
) -> Result<Option<Record>, CliError> {
    let record = match step.work {
        Work::UdpFlow | Work::TcpBulk => flow_step(plan, bed, step, shutdown)?,
        Work::Updates { .. } | Work::Echo => clients_step(plan, bed, step, shutdown)?,
    };
    // A process that died during the measurement is an error, whatever the clients saw.
    bed.check_running()?;
    Ok(record.map(|mut record| {
        record.warnings = bed.new_warnings();
        record
    }))
}

/// A record with the step's names and nothing measured yet.
fn empty_record(step: &Step) -> Record {
    let (clients, window) = match step.work {
        Work::Updates { clients, window } => (Some(clients), Some(window)),
        Work::Echo => (Some(1), Some(1)),
        _ => (None, None),
    };
    Record {
        part: step.part.name(),
        system: step.system,
        op: step.op(),
        wait: step.wait(),
        datapath: match step.work {
            Work::Echo => "the device's kernel UDP socket (XDP passes the echo port)",
            _ => step.role.datapath(),
        },
        clients,
        window,
        p50_us: None,
        p99_us: None,
        p999_us: None,
        mean_us: None,
        ops_per_s: None,
        mb_per_s: None,
        count: 0,
        seconds: 0.0,
        loss: None,
        cpu_us_per_op: CpuPerOp::default(),
        device_cpus: None,
        server_cpus: None,
        others_cpus: 0.0,
        failed: 0,
        retransmissions: 0,
        warnings: Vec::new(),
        rounds: Vec::new(),
    }
}

/// The CPU figures of `span` over `ops` operations.
fn charge(record: &mut Record, span: &Span, ops: f64) {
    let per = |seconds: f64| {
        if ops > 0.0 {
            (seconds * 1e6 / ops * 100.0).round() / 100.0
        } else {
            0.0
        }
    };
    let share = |seconds: f64| (seconds / span.seconds.max(1e-9) * 100.0).round() / 100.0;
    record.seconds = (span.seconds * 1000.0).round() / 1000.0;
    record.cpu_us_per_op = CpuPerOp {
        device: span.device.map(per),
        server: span.server.map(per),
        bench: per(span.bench),
        ksoftirqd: per(span.ksoftirqd),
        machine: per(span.machine),
    };
    record.device_cpus = span.device.map(share);
    record.server_cpus = span.server.map(share);
    record.others_cpus = share(span.others());
}

/// The UDP flow or the TCP transfer across the router, its counters read with the clocks.
fn flow_step(
    plan: &InPathPlan,
    bed: &mut Bed,
    step: &Step,
    shutdown: &Shutdown,
) -> Result<Option<Record>, CliError> {
    let counters = traffic::FlowCounters::default();
    let udp_len = plan.datagram_bytes.max(1);
    let start = Instant::now();
    let stopped =
        || shutdown.is_requested() || counters.stop.load(std::sync::atomic::Ordering::Relaxed);
    let span = match step.work {
        Work::UdpFlow => {
            let (sender, receiver) = traffic::udp_sockets(bed.testbed())?;
            std::thread::scope(|scope| {
                scope.spawn(|| traffic::udp_receive(&receiver, &counters));
                scope.spawn(|| traffic::udp_send(&sender, udp_len, &counters));
                let span = meter::measure(
                    bed,
                    Some(&counters),
                    start,
                    plan.warmup,
                    plan.duration,
                    stopped,
                );
                counters
                    .stop
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                span
            })
        }
        _ => {
            let (client, server) = traffic::tcp_streams(bed.testbed())?;
            std::thread::scope(|scope| {
                scope.spawn(|| traffic::tcp_receive(&server, &counters));
                scope.spawn(|| traffic::tcp_send(&client, &counters));
                let span = meter::measure(
                    bed,
                    Some(&counters),
                    start,
                    plan.warmup,
                    plan.duration,
                    stopped,
                );
                counters
                    .stop
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                span
            })
        }
    };
    if let Some(error) = counters.error() {
        return Err(format!("{} {}: {error}", step.system, step.op()).into());
    }
    let Some(span) = span else { return Ok(None) };
    let mut record = empty_record(step);
    let seconds = span.seconds.max(1e-9);
    record.count = span.received;
    if let Work::UdpFlow = step.work {
        record.ops_per_s = Some((span.received as f64 / seconds).round());
        record.loss = Some(if span.sent > 0 {
            (1.0 - span.received as f64 / span.sent as f64).max(0.0)
        } else {
            0.0
        });
        charge(&mut record, &span, span.received as f64);
    } else {
        let mb = span.received as f64 / 1e6;
        record.mb_per_s = Some((mb / seconds * 10.0).round() / 10.0);
        charge(&mut record, &span, mb);
    }
    if span.received == 0 {
        return Err(format!(
            "{} {}: nothing arrived at the server host in {:.1} s ({} sent): the router does not \
             forward",
            step.system,
            step.op(),
            span.seconds,
            span.sent
        )
        .into());
    }
    Ok(Some(record))
}

/// `pmnet bench`'s clients against the step's address, on a thread in the client's
/// namespace, with the processes' clocks read at the ends of the measured stretch.
fn clients_step(
    plan: &InPathPlan,
    bed: &mut Bed,
    step: &Step,
    shutdown: &Shutdown,
) -> Result<Option<Record>, CliError> {
    let client_plan = plan.client_plan(step)?;
    let testbed = bed.testbed().clone();
    let start = Instant::now();
    let (outcome, span) = std::thread::scope(|scope| {
        let clients = scope.spawn(|| {
            testbed
                .enter(Host::Client)
                .map_err(|error| error.to_string())?;
            run_modes(&client_plan, shutdown)
        });
        let span = meter::measure(bed, None, start, plan.warmup, plan.duration, || {
            clients.is_finished()
        });
        let outcome = clients
            .join()
            .unwrap_or_else(|_| Err("a client thread panicked".to_owned()));
        (outcome, span)
    });
    let (results, _, interrupted) = outcome.map_err(|error| {
        format!(
            "{} {} ({}, {}): {error}\n{}",
            step.system,
            step.op(),
            step.role.datapath(),
            step.wait(),
            bed.log_tails()
        )
    })?;
    let (Some(result), Some(span), false) = (results.into_iter().next(), span, interrupted) else {
        return Ok(None);
    };
    if result.requests == 0 {
        // Nothing completed: the system measured does not work (or is stalled); say what
        // the processes said rather than report a zero.
        return Err(format!(
            "{} {} ({}, {}): no request completed in the {:.1} s measured ({} failed, {}              datagrams retransmitted by the clients)\n{}\n{}",
            step.system,
            step.op(),
            step.role.datapath(),
            step.wait(),
            span.seconds,
            result.failed,
            result.client_retransmissions,
            bed.new_warnings().join("\n"),
            bed.log_tails()
        )
        .into());
    }
    Ok(Some(clients_record(step, &result, &span)))
}

fn clients_record(step: &Step, result: &ModeResult, span: &Span) -> Record {
    let mut record = empty_record(step);
    record.p50_us = result.p50_us;
    record.p99_us = result.p99_us;
    record.p999_us = result.p999_us;
    record.mean_us = result.mean_us;
    record.ops_per_s = Some(result.ops_per_s);
    record.count = result.requests;
    record.failed = result.failed;
    record.retransmissions = result.client_retransmissions;
    charge(&mut record, span, result.ops_per_s * span.seconds);
    record
}

fn setting(plan: &InPathPlan, bed: &Bed, name: &str, load_start: String) -> InPathSetting {
    let args = &plan.args;
    let udp_len = plan.datagram_bytes;
    InPathSetting {
        machine: machine_text(),
        cpus_online: pmnet_runtime::online_cpu_count(),
        load_average_start: load_start,
        load_average_end: pmnet::loadgen::plan::load_average(),
        testbed: format!(
            "{name}: client, router and server network namespaces joined by veth pairs (MTU \
             {}), docs/testbed.md",
            pmnet_testbed::MTU
        ),
        device_medium: bed
            .device_medium
            .clone()
            .unwrap_or_else(|| "no device ran".to_owned()),
        server_medium: bed
            .server_medium
            .clone()
            .unwrap_or_else(|| "no server ran".to_owned()),
        flush: args.flush.name().to_owned(),
        server_app: if args.ideal {
            "ideal handler (--ideal: replies OK, stores nothing)".to_owned()
        } else {
            format!("{} store", plan.procs.engine)
        },
        datapath: bed
            .datapath
            .clone()
            .unwrap_or_else(|| "no in-path device ran".to_owned()),
        waits: "blocking: the device and the clients sleep in ppoll until a datagram arrives; \
                busy-poll (latency part): the device (--busy-poll, its AF_XDP sockets busy-polled) \
                and the client spin; the server always blocks"
            .to_owned(),
        update_datagram_bytes: udp_len,
        udp_datagram_bytes: udp_len,
        payload_bytes: args.payload,
        keys: plan.keys,
        load_clients: plan.load_clients,
        capacity_clients: plan.capacity_clients,
        capacity_window: plan.capacity_window,
        duration_s: plan.duration.as_secs_f64(),
        warmup_s: plan.warmup.as_secs_f64(),
        rounds: plan.rounds,
        seed: plan.seed,
        commands: bed.commands.clone(),
        device_reports: bed.device_reports.clone(),
    }
}
