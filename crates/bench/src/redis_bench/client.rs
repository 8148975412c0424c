//! The benchmark's clients: a synchronous RESP connection that counts the requests it sends by
//! the path the pmnet gateway gives them (update or bypass), and the closed loop that runs one
//! client per thread, one operation at a time, and measures the operations of the measured
//! interval.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use pmnet_redis::commands::{route, Policy, Route};
use pmnet_redis::resp::{SyncClient, Value};
use pmnet_runtime::Shutdown;

use super::workloads::Workload;
use pmnet::loadgen::{new_histogram, record};

/// How long a connection waits for a reply before it counts an error: more than the
/// gateway's own limit for an unacknowledged request (about 13 s).
const REPLY_TIMEOUT: Duration = Duration::from_secs(20);

/// Error messages kept per round (the count is kept in full).
const ERROR_SAMPLES: usize = 5;

/// Errors after which a round stops early: something is broken, measuring on is pointless.
const MAX_ERRORS: u64 = 1000;

/// One argument of a command, from the types the workloads build commands of.
pub trait IntoArg {
    fn into_arg(self) -> Vec<u8>;
}

impl IntoArg for &str {
    fn into_arg(self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl IntoArg for String {
    fn into_arg(self) -> Vec<u8> {
        self.into_bytes()
    }
}

impl IntoArg for &String {
    fn into_arg(self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}

impl IntoArg for Vec<u8> {
    fn into_arg(self) -> Vec<u8> {
        self
    }
}

impl IntoArg for &[u8] {
    fn into_arg(self) -> Vec<u8> {
        self.to_vec()
    }
}

impl IntoArg for &Vec<u8> {
    fn into_arg(self) -> Vec<u8> {
        self.clone()
    }
}

macro_rules! into_arg_by_display {
    ($($t:ty),*) => {$(
        impl IntoArg for $t {
            fn into_arg(self) -> Vec<u8> {
                self.to_string().into_bytes()
            }
        }
    )*};
}
into_arg_by_display!(u32, u64, i64, usize);

/// A command: `command!["SET", key, value]`.
macro_rules! command {
    ($($part:expr),+ $(,)?) => {
        vec![$($crate::redis_bench::client::IntoArg::into_arg($part)),+]
    };
}
pub(crate) use command;

/// Why an operation failed.
#[derive(Debug)]
pub enum OpError {
    /// The connection broke or timed out: reconnect.
    Io(io::Error),
    /// Redis (or the gateway) answered with an error, or with a reply of the wrong shape.
    Reply(String),
    /// What was read breaks the workload's invariant (a post on a timeline that does not
    /// exist, a lock lost while held): counted as an error and as a violation.
    Invariant(String),
}

impl From<io::Error> for OpError {
    fn from(error: io::Error) -> Self {
        OpError::Io(error)
    }
}

impl std::fmt::Display for OpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpError::Io(error) => write!(f, "connection: {error}"),
            OpError::Reply(text) => write!(f, "reply: {text}"),
            OpError::Invariant(text) => write!(f, "invariant: {text}"),
        }
    }
}

/// What an operation was: a read, or an update (it wrote).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Read,
    Update,
}

/// A client's connection, counting the requests that would reach the device through the
/// gateway: updates (logged and acked by the device) and bypass requests (answered by Redis),
/// by the gateway's own routing table. The counts are the same whichever system it talks to.
pub struct Conn {
    client: SyncClient,
    pub update_requests: u64,
    pub bypass_requests: u64,
}

/// An error reply's text.
fn error_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    text.chars().take(200).collect()
}

impl Conn {
    pub fn connect(addr: SocketAddr) -> io::Result<Conn> {
        Ok(Conn {
            client: SyncClient::connect(addr, REPLY_TIMEOUT)?,
            update_requests: 0,
            bypass_requests: 0,
        })
    }

    fn count(&mut self, args: &[Vec<u8>]) {
        match route(args, &Policy::default()) {
            Route::Update { .. } => self.update_requests += 1,
            Route::Bypass => self.bypass_requests += 1,
            _ => {}
        }
    }

    /// Send one command; its reply, an error reply as an error.
    pub fn cmd(&mut self, args: Vec<Vec<u8>>) -> Result<Value, OpError> {
        self.count(&args);
        match self.client.command(&args)? {
            Value::Error(text) => Err(OpError::Reply(error_text(&text))),
            value => Ok(value),
        }
    }

    /// Send several commands at once (one round trip); their replies, the first error reply
    /// as an error.
    pub fn pipeline(&mut self, commands: Vec<Vec<Vec<u8>>>) -> Result<Vec<Value>, OpError> {
        for args in &commands {
            self.count(args);
        }
        let replies = self.client.pipeline(&commands)?;
        match replies.iter().find(|reply| reply.is_error()) {
            Some(Value::Error(text)) => Err(OpError::Reply(error_text(text))),
            _ => Ok(replies),
        }
    }

    /// `MULTI`, the commands, `EXEC`, sent at once: the replies of the commands. Through the
    /// gateway this is one bypass request (the gateway queues the commands and sends `EXEC`).
    pub fn transaction(&mut self, commands: Vec<Vec<Vec<u8>>>) -> Result<Vec<Value>, OpError> {
        let count = commands.len();
        let mut all = Vec::with_capacity(count + 2);
        all.push(command!["MULTI"]);
        all.extend(commands);
        all.push(command!["EXEC"]);
        self.bypass_requests += 1;
        let mut replies = self.client.pipeline(&all)?;
        let exec = replies.pop().unwrap_or(Value::Array(None));
        if let Some(Value::Error(text)) = replies.iter().find(|reply| reply.is_error()) {
            return Err(OpError::Reply(error_text(text)));
        }
        match exec {
            Value::Array(Some(items)) if items.len() == count => {
                match items.iter().find(|item| item.is_error()) {
                    Some(Value::Error(text)) => Err(OpError::Reply(error_text(text))),
                    _ => Ok(items),
                }
            }
            Value::Error(text) => Err(OpError::Reply(error_text(&text))),
            other => Err(OpError::Reply(format!(
                "EXEC of {count} commands answered {other:?}"
            ))),
        }
    }
}

/// A reply as an integer (an integer reply, or a string of digits).
pub fn as_int(value: &Value) -> Option<i64> {
    match value {
        Value::Integer(number) => Some(*number),
        other => std::str::from_utf8(other.as_bytes()?).ok()?.parse().ok(),
    }
}

/// A reply as an array of items (a nil array is empty).
pub fn as_array(value: Value) -> Result<Vec<Value>, OpError> {
    match value {
        Value::Array(Some(items)) => Ok(items),
        Value::Array(None) => Ok(Vec::new()),
        other => Err(OpError::Reply(format!("expected an array, got {other:?}"))),
    }
}

/// What one client does, one operation per call.
pub trait ClientOps: Send {
    fn op(&mut self, conn: &mut Conn) -> Result<OpKind, OpError>;
}

/// When a round runs and how it is measured.
pub struct RoundPlan<'a> {
    pub addr: SocketAddr,
    pub clients: u32,
    pub round: u32,
    pub warmup: Duration,
    pub duration: Duration,
    pub shutdown: &'a Shutdown,
    /// Print a progress line on stderr (a terminal) every second, with this label.
    pub progress: Option<String>,
}

/// What one round of one system measured.
pub struct RoundOutcome {
    pub all: Histogram<u64>,
    pub updates: Histogram<u64>,
    /// Operations completed in the measured interval (all, and updates).
    pub ops: u64,
    pub update_ops: u64,
    pub seconds: f64,
    /// Requests of the measured operations, by the gateway's routing.
    pub update_requests: u64,
    pub bypass_requests: u64,
    /// Failed operations (warm-up included) and connections that could not be made.
    pub errors: u64,
    pub error_samples: Vec<String>,
    pub interrupted: bool,
}

struct Tally {
    all: Histogram<u64>,
    updates: Histogram<u64>,
    update_requests: u64,
    bypass_requests: u64,
    errors: u64,
    error_samples: Vec<String>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            all: new_histogram(),
            updates: new_histogram(),
            update_requests: 0,
            bypass_requests: 0,
            errors: 0,
            error_samples: Vec::new(),
        }
    }

    fn error(&mut self, what: String) {
        self.errors += 1;
        if self.error_samples.len() < ERROR_SAMPLES {
            self.error_samples.push(what);
        }
    }
}

/// Connect, retrying for a few seconds (a gateway that has just started).
fn connect(addr: SocketAddr) -> io::Result<Conn> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match Conn::connect(addr) {
            Ok(conn) => return Ok(conn),
            Err(error) if Instant::now() >= deadline => return Err(error),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// One client's closed loop until `until` (or a stop), then a fence: a bypass read on the
/// same connection, which the gateway orders after the connection's updates, so that when it
/// returns every update of this client has been applied at Redis.
fn client_loop(
    ops: &mut dyn ClientOps,
    plan: &RoundPlan<'_>,
    measure_from: Instant,
    until: Instant,
    stop: &AtomicBool,
    completed: &AtomicU64,
) -> Tally {
    let mut tally = Tally::new();
    let mut conn = match connect(plan.addr) {
        Ok(conn) => conn,
        Err(error) => {
            tally.error(format!("cannot connect to {}: {error}", plan.addr));
            stop.store(true, Ordering::Relaxed);
            return tally;
        }
    };
    while !stop.load(Ordering::Relaxed) && !plan.shutdown.is_requested() {
        let started = Instant::now();
        if started >= until {
            break;
        }
        let (updates_before, bypass_before) = (conn.update_requests, conn.bypass_requests);
        let result = ops.op(&mut conn);
        let ended = Instant::now();
        completed.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(kind) => {
                if started >= measure_from && ended <= until {
                    let nanos =
                        u64::try_from(ended.duration_since(started).as_nanos()).unwrap_or(u64::MAX);
                    record(&mut tally.all, nanos);
                    if kind == OpKind::Update {
                        record(&mut tally.updates, nanos);
                    }
                    tally.update_requests += conn.update_requests - updates_before;
                    tally.bypass_requests += conn.bypass_requests - bypass_before;
                }
            }
            Err(OpError::Io(error)) => {
                tally.error(format!("connection: {error}"));
                match connect(plan.addr) {
                    Ok(fresh) => conn = fresh,
                    Err(error) => {
                        tally.error(format!("cannot reconnect to {}: {error}", plan.addr));
                        break;
                    }
                }
            }
            Err(error) => tally.error(error.to_string()),
        }
        if tally.errors >= MAX_ERRORS {
            stop.store(true, Ordering::Relaxed);
        }
    }
    if let Err(error) = conn.cmd(command!["EXISTS", "pmnet-bench:fence"]) {
        tally.error(format!("the closing read failed: {error}"));
    }
    tally
}

/// Run `clients` clients of `workload` against `plan.addr` for the warm-up and the measured
/// interval.
pub fn run_round(workload: &dyn Workload, plan: &RoundPlan<'_>) -> RoundOutcome {
    let start = Instant::now();
    let measure_from = start + plan.warmup;
    let until = measure_from + plan.duration;
    let stop = AtomicBool::new(false);
    let completed = AtomicU64::new(0);
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let tallies: Vec<Tally> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..plan.clients)
            .map(|index| {
                let mut ops = workload.client(index, plan.round);
                let (stop, completed) = (&stop, &completed);
                scope.spawn(move || {
                    client_loop(ops.as_mut(), plan, measure_from, until, stop, completed)
                })
            })
            .collect();
        let mut last_print = Instant::now();
        while !handles.iter().all(|handle| handle.is_finished()) {
            std::thread::sleep(Duration::from_millis(50));
            if let Some(label) = plan.progress.as_ref().filter(|_| terminal) {
                if last_print.elapsed() >= Duration::from_secs(1) {
                    last_print = Instant::now();
                    let phase = if Instant::now() < measure_from {
                        "warm-up"
                    } else {
                        "measuring"
                    };
                    eprint!(
                        "\r  {label}: {phase}, {:.0} s of {:.0} s, {} operations   ",
                        start.elapsed().as_secs_f64(),
                        (plan.warmup + plan.duration).as_secs_f64(),
                        completed.load(Ordering::Relaxed)
                    );
                }
            }
        }
        handles
            .into_iter()
            .map(|handle| {
                handle.join().unwrap_or_else(|_| {
                    let mut tally = Tally::new();
                    tally.error("a client thread panicked".to_owned());
                    tally
                })
            })
            .collect()
    });
    // Cut short by a stop: the measured interval ended when the clients did.
    let measured = Instant::now()
        .saturating_duration_since(measure_from)
        .min(plan.duration);
    if plan.progress.is_some() && terminal {
        eprint!("\r{:100}\r", "");
    }
    let mut outcome = RoundOutcome {
        all: new_histogram(),
        updates: new_histogram(),
        ops: 0,
        update_ops: 0,
        seconds: measured.as_secs_f64(),
        update_requests: 0,
        bypass_requests: 0,
        errors: 0,
        error_samples: Vec::new(),
        interrupted: plan.shutdown.is_requested(),
    };
    for tally in tallies {
        let _ = outcome.all.add(&tally.all);
        let _ = outcome.updates.add(&tally.updates);
        outcome.update_requests += tally.update_requests;
        outcome.bypass_requests += tally.bypass_requests;
        outcome.errors += tally.errors;
        for sample in tally.error_samples {
            if outcome.error_samples.len() < ERROR_SAMPLES {
                outcome.error_samples.push(sample);
            }
        }
    }
    outcome.ops = outcome.all.len();
    outcome.update_ops = outcome.updates.len();
    outcome
}
