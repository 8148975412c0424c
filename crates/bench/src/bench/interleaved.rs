//! Two systems measured at once, in alternating slices: `pmnet bench --auth-cost`'s ack
//! latency, `pmnet` against `pmnet-auth`.
//!
//! On a machine whose speed drifts (a VM sharing its host, other work on its vCPUs), two modes
//! run one after the other see different machines: rounds of seconds each moved one mode's p50
//! by ±15 % against the other's, more than the few per cent authentication costs. Here both
//! devices and servers run for the whole measurement, and one client thread sends a block of
//! requests through one, then a block through the other, alternating every [`BLOCK`] requests
//! (a few milliseconds), so that whatever the machine does hits both alike. Each mode's
//! latencies are pooled over the run; the run is also cut into `rounds` stretches, and each
//! stretch's ratio of p50s is reported (their median is what the target is judged on).

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use pmnet_proto::{ClientEvent, Completion};
use pmnet_runtime::{pin_current_thread, ClientSession, SessionOptions, Shutdown};

use pmnet::loadgen::cpu::{own_cpu_ns, CpuSource, SystemCpu};
use pmnet::loadgen::latency::{new_histogram, record, summarize};
use pmnet::loadgen::results::ModeResult;
use pmnet::loadgen::system::LoopbackSystem;
use pmnet::loadgen::{workload::RequestGenerator, Mode, Plan, Target};

/// Requests sent through one system before the client turns to the other.
pub const BLOCK: usize = 32;

/// The client gives a request up as lost after this long (the run fails: on loopback with no
/// faults a request is answered in microseconds).
const REQUEST_LIMIT: Duration = Duration::from_secs(10);

/// What the interleaved run measured.
#[derive(Debug)]
pub struct Interleaved {
    /// `pmnet` then `pmnet-auth`, each over the whole measured run.
    pub results: Vec<ModeResult>,
    /// Each stretch's pmnet-auth p50 over its pmnet p50, in order.
    pub round_ratios: Vec<f64>,
    /// The devices' and servers' storage media, as their start-up reports them.
    pub media: (String, String),
}

/// One side of the comparison: its system, its client session, its requests.
struct Side {
    mode: Mode,
    system: LoopbackSystem,
    session: ClientSession,
    generator: RequestGenerator,
    /// Over the whole measured run, and over the current stretch.
    whole: Histogram<u64>,
    stretch: Histogram<u64>,
    acked_by_device: u64,
    answered_by_server: u64,
    /// The device's and the server's threads, read when measuring starts and ends; the client
    /// thread's CPU time spent on this side's blocks.
    cpu: SystemCpu,
    client_ns: u64,
}

impl Side {
    fn start(plan: &Plan, mode: Mode, index: u32) -> Result<Side, String> {
        let Target::Loopback(config) = &plan.target else {
            return Err("the interleaved measurement starts its own devices and servers".into());
        };
        let mut config = config.clone();
        config.keys = plan.mode_keys(mode);
        config.cache = None;
        let system = LoopbackSystem::start(&config)?;
        let mut options = SessionOptions::new(plan.server_id, system.addresses.device);
        options.wait = plan.wait;
        options.window = Some(1);
        options.keys = plan.mode_keys(mode);
        options.more_peers = system.addresses.device_workers.clone();
        options.peer_role = SessionOptions::DEVICE_PEER;
        let session = ClientSession::open(options)
            .map_err(|error| format!("cannot open a client session ({}): {error}", mode.name()))?;
        let cpu = SystemCpu::new(
            Some(CpuSource::Threads(system.device_tids.clone())),
            Some(CpuSource::Threads(system.server_tids.clone())),
        );
        Ok(Side {
            mode,
            cpu,
            client_ns: 0,
            system,
            session,
            // The same requests on both sides.
            generator: RequestGenerator::new(&plan.workload, plan.seed, index),
            whole: new_histogram(),
            stretch: new_histogram(),
            acked_by_device: 0,
            answered_by_server: 0,
        })
    }

    /// Send one request and wait for its answer; its latency in nanoseconds.
    fn one_request(&mut self) -> Result<u64, String> {
        let request = self.generator.next_request();
        let at = Instant::now();
        let seq = if request.is_update {
            self.session.start_update(&request.bytes)
        } else {
            self.session.start_bypass(&request.bytes)
        }
        .map_err(|error| format!("the session refused a request: {error}"))?;
        let limit = at + REQUEST_LIMIT;
        loop {
            let event = self.session.next_event(Some(limit));
            let done = Instant::now();
            match event {
                Some(ClientEvent::Completed {
                    seq: completed,
                    completion,
                    ..
                }) if completed == seq => {
                    match completion {
                        Completion::Logged { .. } => self.acked_by_device += 1,
                        _ => self.answered_by_server += 1,
                    }
                    return Ok(
                        u64::try_from(done.duration_since(at).as_nanos()).unwrap_or(u64::MAX)
                    );
                }
                Some(ClientEvent::Failed { seq: failed, .. }) if failed == seq => {
                    return Err(format!(
                        "a {} request failed on loopback with no faults",
                        self.mode.name()
                    ));
                }
                Some(_) => {}
                None if done >= limit => {
                    return Err(format!(
                        "a {} request was not answered in {} s",
                        self.mode.name(),
                        REQUEST_LIMIT.as_secs()
                    ));
                }
                None => {}
            }
        }
    }
}

/// Run `pmnet` and `pmnet-auth` interleaved: warm-up, then `rounds` stretches of `duration`
/// (from the plan; one client, window 1).
pub fn run(plan: &Plan, shutdown: &Shutdown) -> Result<Interleaved, String> {
    // A thread of its own, pinned where the plan puts clients.
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("pmnet-client-0".into())
            .spawn_scoped(scope, || {
                if let Some(cpu) = plan.client_cpu {
                    pin_current_thread(cpu)?;
                }
                run_here(plan, shutdown)
            })
            .map_err(|error| format!("cannot start the client thread: {error}"))?
            .join()
            .map_err(|_| "the client thread panicked".to_owned())?
    })
}

fn run_here(plan: &Plan, shutdown: &Shutdown) -> Result<Interleaved, String> {
    let mut sides = [
        Side::start(plan, Mode::Pmnet, 0)?,
        Side::start(plan, Mode::PmnetAuth, 0)?,
    ];
    let media = (
        sides[0].system.device_medium.clone(),
        sides[0].system.server_medium.clone(),
    );
    let stretch_length = plan.duration.unwrap_or(Duration::from_secs(1));
    let rounds = plan.rounds.max(1);
    let start = Instant::now();
    let measure_from = start + plan.warmup;
    let mut stretch_end = measure_from + stretch_length;
    let mut stretches_done = 0;
    let mut round_ratios = Vec::new();
    let mut turn = 0usize;
    let mut failure = None;
    let mut measuring = false;
    'run: while stretches_done < rounds && !shutdown.is_requested() {
        if !measuring && Instant::now() >= measure_from {
            measuring = true;
            for side in &mut sides {
                side.cpu.start();
            }
        }
        let block_start_ns = own_cpu_ns();
        for _ in 0..BLOCK {
            let side = &mut sides[turn];
            let nanos = match side.one_request() {
                Ok(nanos) => nanos,
                Err(error) => {
                    failure = Some(error);
                    break 'run;
                }
            };
            if measuring {
                record(&mut side.whole, nanos);
                record(&mut side.stretch, nanos);
            }
        }
        if measuring {
            sides[turn].client_ns += own_cpu_ns().saturating_sub(block_start_ns);
        }
        turn = 1 - turn;
        let now = Instant::now();
        // A stretch ends on a whole pair of blocks, so both modes have as many in it.
        if turn == 0 && now >= stretch_end {
            let p50 = |side: &Side| summarize(&side.stretch).map(|summary| summary.p50_us);
            if let (Some(plain), Some(auth)) = (p50(&sides[0]), p50(&sides[1])) {
                if plain > 0.0 {
                    round_ratios.push(auth / plain);
                }
            }
            for side in &mut sides {
                side.stretch.reset();
            }
            stretches_done += 1;
            stretch_end = now + stretch_length;
        }
    }
    for side in &mut sides {
        side.cpu.end();
    }
    let measured_s = Instant::now()
        .saturating_duration_since(measure_from)
        .as_secs_f64();
    let mut results = Vec::new();
    for side in sides {
        let mut result = ModeResult::from_summary(
            side.mode.name(),
            side.mode.waits_for(),
            summarize(&side.whole),
        );
        result.measured_s = measured_s;
        // Each mode had about half of the run.
        result.ops_per_s = side.whole.len() as f64 / measured_s.max(1e-9) * 2.0;
        result.acked_by_device = side.acked_by_device;
        result.answered_by_server = side.answered_by_server;
        result.client_retransmissions = side.session.counters().retransmitted_fragments;
        result.cpu = side.cpu.per_request(Some(side.client_ns), side.whole.len());
        result.notes.push(format!(
            "interleaved with the other mode in blocks of {BLOCK} requests, one client thread"
        ));
        let counters = side.system.stop();
        result.notes.extend(counters.notes());
        results.push(result);
    }
    if let Some(error) = failure {
        return Err(error);
    }
    Ok(Interleaved {
        results,
        round_ratios,
        media,
    })
}
