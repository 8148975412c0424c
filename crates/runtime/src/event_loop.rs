//! The one event loop every long-running node runs: pinning, publishing metrics and report
//! lines, waiting (busy-poll or `ppoll`), timers and the shutdown drain. A node supplies its
//! turn, its descriptors, its next deadline, its metrics and its report line ([`Node`]);
//! [`run_loop`] does the rest, the same way for the device, the server, the relay, the Redis
//! adaptor and the gateway.

use std::io;
use std::time::{Duration, Instant};

use crate::metrics::{Metrics, MetricsBoard};
use crate::wait::{pin_current_thread, poll, yield_cpu, PollFd, WaitMode};
use crate::{RuntimeError, Shutdown, METRICS_PUBLISH_INTERVAL};

/// Longest a blocking loop sleeps without looking at its shutdown flag and its reports.
pub const MAX_SLEEP: Duration = Duration::from_millis(50);

/// Rounds of the shutdown drain, each waiting at most [`DRAIN_WAIT`] for the sockets to take
/// what is still queued: a bounded goodbye, never a hang.
const DRAIN_ROUNDS: usize = 100;
const DRAIN_WAIT: Duration = Duration::from_millis(10);

/// Which of a node's descriptors a turn may receive on.
#[derive(Debug, Clone, Copy)]
pub enum Ready<'a> {
    /// All of them: the loop did not wait before this turn.
    All,
    /// The first only (the one more look [`Turn::again`] asks for).
    First,
    /// Those the wait found readable: entry `i` answers for `wait_fds`'s entry `i`.
    Polled(&'a [PollFd]),
}

impl Ready<'_> {
    /// Whether the turn may receive on descriptor `index` of `wait_fds`.
    pub fn is_readable(&self, index: usize) -> bool {
        match self {
            Ready::All => true,
            Ready::First => index == 0,
            Ready::Polled(fds) => fds.get(index).is_some_and(|fd| fd.readable),
        }
    }
}

/// What a turn of a node did, for deciding whether to go round again or wait.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// Something was received or a timer fired.
    pub busy: bool,
    /// A receive filled its batch or a timer fired: go round again before waiting.
    pub more: bool,
    /// Look once more at the first descriptor (only) before a blocking loop sleeps. The
    /// device asks it after a turn that received on its data socket: the server's ACK of what
    /// it just forwarded often arrives within microseconds, and taking it now saves a sleep
    /// and a wake-up.
    pub again: bool,
}

/// A node the event loop drives.
pub trait Node {
    /// Receive on the descriptors `ready` allows, handle what arrived, fire due timers,
    /// persist, send.
    fn turn(&mut self, ready: Ready<'_>) -> Turn;
    /// The descriptors to wait on and what for (reading; writing where sends wait for room),
    /// pushed onto `fds` in the order [`Ready::is_readable`] numbers them.
    fn wait_fds(&self, fds: &mut Vec<PollFd>);
    /// How long until the node's next timer is due, if it has one.
    fn next_timer(&self) -> Option<Duration>;
    /// Datagrams (or bytes) still queued to send; the shutdown drain waits for them.
    fn queued_len(&self) -> usize;
    /// Try to send what is queued.
    fn flush(&mut self);
    /// The node's counters, for the metrics endpoint.
    fn metrics(&self) -> Metrics;
    /// The node's state for `/status` and `pmnet status` (a JSON object; `None`: the node
    /// publishes none). The loop adds the process's uptime, pid and build.
    fn status(&self) -> Option<serde_json::Value> {
        None
    }
    /// A line of the most telling counters, logged every report interval and at the end.
    fn report_line(&self) -> String;
    /// What the node is, for the last line ("device", "server", …).
    fn kind(&self) -> &'static str;
    /// Where the loop counts its turns and waits (the node reports them with its metrics).
    fn loop_counters(&mut self) -> &mut LoopCounters;
}

/// How the loop runs: the wait mode, pinning and reporting of [`crate::LoopOptions`].
#[derive(Debug, Clone, Copy)]
pub struct LoopSettings {
    pub wait: WaitMode,
    pub cpu: Option<usize>,
    pub report_interval: Option<Duration>,
    /// Log the node's report line when it stops (the relay, a yardstick, stays quiet).
    pub report_at_stop: bool,
}

impl From<&crate::LoopOptions> for LoopSettings {
    fn from(options: &crate::LoopOptions) -> LoopSettings {
        LoopSettings {
            wait: options.wait,
            cpu: options.cpu,
            report_interval: options.report_interval,
            report_at_stop: true,
        }
    }
}

/// What a node publishes: its metrics and the process's.
fn published<N: Node>(node: &N) -> crate::Metrics {
    let mut metrics = node.metrics();
    metrics.add_process_metrics();
    metrics
}

/// Publish `node`'s metrics (with the process's) and status to `board`; the loop does it when
/// a scrape asks and every so often, a node's `open` once before its loop runs.
pub fn publish_node<N: Node>(node: &N, board: &MetricsBoard) {
    let metrics = published(node);
    match node.status() {
        Some(mut status) => {
            if let Some(object) = status.as_object_mut() {
                let build = crate::metrics::build_info();
                object.insert("pid".into(), std::process::id().into());
                object.insert("uptime_seconds".into(), process_uptime_seconds().into());
                object.insert(
                    "build".into(),
                    serde_json::json!({
                        "version": build.version,
                        "commit": build.commit,
                        "profile": build.profile,
                        "rustc": build.rustc,
                    }),
                );
            }
            board.publish_with_status(&metrics, status.to_string());
        }
        None => board.publish(&metrics),
    }
}

/// Seconds since the process started (0 where `/proc` does not say).
fn process_uptime_seconds() -> f64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64());
    crate::metrics::process_start_time_seconds().map_or(0.0, |start| (now - start).max(0.0))
}

/// Run `node` until `shutdown` is requested; then take one last turn (so nothing received is
/// left half done), give the sockets a bounded chance to send what is queued, publish the
/// final metrics to `board` (if any) and log the node's last report line.
pub fn run_loop<N: Node>(
    node: &mut N,
    settings: LoopSettings,
    board: Option<&MetricsBoard>,
    shutdown: &Shutdown,
) -> Result<(), RuntimeError> {
    if let Some(cpu) = settings.cpu {
        pin_current_thread(cpu).map_err(RuntimeError::Pin)?;
    }
    if let Some(board) = board {
        publish_node(node, board);
        board.set_live(true);
    }
    let mut next_publish = Instant::now() + METRICS_PUBLISH_INTERVAL;
    let mut next_report = settings
        .report_interval
        .map(|interval| Instant::now() + interval);
    let mut fds: Vec<PollFd> = Vec::new();
    // What the next turn receives on: after a wait, what the kernel said is readable;
    // otherwise everything.
    let mut waited = false;
    let mut again = false;
    // When a turn last did something (`WaitMode::Spin` spins for a while after it).
    let mut last_busy = Instant::now();
    loop {
        let stopping = shutdown.is_requested();
        node.loop_counters().iterations += 1;
        let ready = match (stopping, waited, again) {
            (false, true, _) => Ready::Polled(&fds),
            (false, false, true) => Ready::First,
            _ => Ready::All,
        };
        let turn = node.turn(ready);
        (waited, again) = (false, false);
        if stopping {
            break;
        }
        let wall = Instant::now();
        // A scrape waiting for fresh values is answered at the end of this turn.
        if let Some(board) = board.filter(|board| board.is_wanted() || wall >= next_publish) {
            publish_node(node, board);
            next_publish = wall + METRICS_PUBLISH_INTERVAL;
        }
        if let (Some(at), Some(interval)) = (next_report, settings.report_interval) {
            if wall >= at {
                tracing::info!("{}", node.report_line());
                next_report = Some(wall + interval);
            }
        }
        if turn.busy {
            last_busy = wall;
        }
        let sleeps = settings.wait.sleeps();
        match settings.wait {
            WaitMode::BusyPoll if turn.busy => continue,
            _ if sleeps && turn.more => continue,
            _ if sleeps && turn.again => {
                again = true;
                continue;
            }
            _ => {}
        }
        node.loop_counters().idle_waits += 1;
        let spinning = match settings.wait {
            WaitMode::BusyPoll => true,
            WaitMode::Spin(micros) => {
                wall.saturating_duration_since(last_busy) < Duration::from_micros(micros.into())
            }
            WaitMode::Blocking => false,
        };
        match spinning {
            true => yield_cpu(),
            false => {
                let mut timeout = MAX_SLEEP;
                if let Some(timer) = node.next_timer() {
                    timeout = timeout.min(timer);
                }
                if board.is_some() {
                    timeout = timeout.min(next_publish.saturating_duration_since(wall));
                }
                if let Some(at) = next_report {
                    timeout = timeout.min(at.saturating_duration_since(wall));
                }
                fds.clear();
                node.wait_fds(&mut fds);
                match poll(&mut fds, timeout) {
                    Ok(()) => waited = true,
                    // A failing ppoll degrades to a short sleep: the loop must keep serving.
                    Err(_) => std::thread::sleep(timeout.min(Duration::from_millis(1))),
                }
            }
        }
    }
    drain(node);
    if let Some(board) = board {
        publish_node(node, board);
        board.set_live(false);
    }
    if settings.report_at_stop {
        tracing::info!("{} stopped: {}", node.kind(), node.report_line());
    }
    Ok(())
}

/// Give the sockets a bounded chance to send what is still queued.
fn drain<N: Node>(node: &mut N) {
    let mut fds = Vec::new();
    for _ in 0..DRAIN_ROUNDS {
        if node.queued_len() == 0 {
            break;
        }
        fds.clear();
        node.wait_fds(&mut fds);
        for fd in &mut fds {
            fd.write = true;
        }
        let _ = poll(&mut fds, DRAIN_WAIT);
        node.flush();
    }
}

/// What the loop itself counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoopCounters {
    pub iterations: u64,
    pub idle_waits: u64,
}

/// Wait as `wait` says for one of `fds`, or `timeout`: for a node driven by its caller (a
/// client session waiting for its next event) rather than by [`run_loop`].
pub fn wait_once(wait: WaitMode, fds: &mut [PollFd], timeout: Duration) -> io::Result<()> {
    match wait {
        WaitMode::BusyPoll => {
            yield_cpu();
            for fd in fds.iter_mut() {
                fd.readable = fd.read;
            }
            Ok(())
        }
        WaitMode::Blocking | WaitMode::Spin(_) => poll(fds, timeout.min(MAX_SLEEP)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node busy for its first `busy_turns` turns, idle after; it asks the loop to stop
    /// once the loop has slept `sleeps_before_stop` times or turned `turns_max` times.
    struct Probe {
        busy_turns: u64,
        turns: u64,
        turns_max: u64,
        sleeps: std::cell::Cell<u64>,
        sleeps_before_stop: u64,
        shutdown: Shutdown,
        counters: LoopCounters,
    }

    impl Node for Probe {
        fn turn(&mut self, _: Ready<'_>) -> Turn {
            self.turns += 1;
            if self.turns >= self.turns_max || self.sleeps.get() >= self.sleeps_before_stop {
                self.shutdown.request();
            }
            let busy = self.turns <= self.busy_turns;
            Turn {
                busy,
                more: false,
                again: false,
            }
        }
        fn wait_fds(&self, _: &mut Vec<PollFd>) {
            // Asked only when the loop is about to sleep.
            self.sleeps.set(self.sleeps.get() + 1);
        }
        fn next_timer(&self) -> Option<Duration> {
            Some(Duration::ZERO)
        }
        fn queued_len(&self) -> usize {
            0
        }
        fn flush(&mut self) {}
        fn metrics(&self) -> Metrics {
            Metrics::default()
        }
        fn report_line(&self) -> String {
            String::new()
        }
        fn kind(&self) -> &'static str {
            "probe"
        }
        fn loop_counters(&mut self) -> &mut LoopCounters {
            &mut self.counters
        }
    }

    fn run(wait: WaitMode, turns_max: u64, sleeps_before_stop: u64) -> Probe {
        let shutdown = Shutdown::new();
        let mut probe = Probe {
            busy_turns: 3,
            turns: 0,
            turns_max,
            sleeps: std::cell::Cell::new(0),
            sleeps_before_stop,
            shutdown: shutdown.clone(),
            counters: LoopCounters::default(),
        };
        let settings = LoopSettings {
            wait,
            cpu: None,
            report_interval: None,
            report_at_stop: false,
        };
        run_loop(&mut probe, settings, None, &shutdown).expect("the loop");
        probe
    }

    #[test]
    fn a_spinning_loop_stays_awake_after_work_and_sleeps_once_idle_long_enough() {
        // An hour of spin: 1 000 turns after the busy ones and not one sleep.
        let awake = run(WaitMode::Spin(3_600_000_000), 1_000, u64::MAX);
        assert_eq!(awake.sleeps.get(), 0, "slept while spinning");
        assert_eq!(awake.turns, 1_000 + 1, "and the turn that stops");
        // A microsecond of spin: it goes to sleep (the probe stops the loop once it has).
        let asleep = run(WaitMode::Spin(1), u64::MAX, 1);
        assert!(asleep.sleeps.get() >= 1);
        // Blocking sleeps after its first turn (busy or not, when the node has no more): the
        // turn after that sleep asks to stop, before the busy turns are over.
        let blocking = run(WaitMode::Blocking, u64::MAX, 1);
        assert!(blocking.turns <= 3, "{} turns", blocking.turns);
        assert_eq!(run(WaitMode::BusyPoll, 1_000, u64::MAX).sleeps.get(), 0);
    }
}
