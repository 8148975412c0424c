//! Helpers shared by the integration tests: run real `pmnet` processes on loopback, wait for
//! them to be ready by reading their banner, scrape their metrics, poll for conditions with a
//! deadline, and never leave a process behind (every child is killed when its guard drops).

#![allow(dead_code)] // each test binary uses its own subset

pub mod writes;

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[allow(unused_imports)] // likewise
pub use pmnet_testkit::{args, run_to_completion, seed};

/// How long anything may take before a test gives up: generous, because the machine may be
/// small and busy (tests never assert on speed).
pub const PATIENCE: Duration = Duration::from_secs(20);

/// The `pmnet` binary cargo built for these tests.
pub fn pmnet_bin() -> &'static str {
    env!("CARGO_BIN_EXE_pmnet")
}

/// A port on 127.0.0.1 that was free a moment ago (for a process that must know another's
/// address before that one starts).
pub fn free_udp_addr() -> SocketAddr {
    // A free port below Linux's ephemeral range (32768 and up): a port chosen here is bound
    // later by the process under test, and meanwhile every `bind(port 0)` — the other
    // processes' own sockets — takes ports from the ephemeral range only, so none can take it.
    for _ in 0..1000 {
        let port = rand::random_range(20_000..32_768u16);
        if let Ok(socket) = UdpSocket::bind(("127.0.0.1", port)) {
            return socket.local_addr().expect("local address");
        }
    }
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind an ephemeral UDP port");
    socket.local_addr().expect("local address")
}

/// Call `check` until it returns `Some`, every 20 ms, for at most `PATIENCE`; panic with `what`
/// (and the last observation) if it never does.
pub fn poll_until<T>(what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match check() {
            Ok(value) => return value,
            Err(last) => {
                if Instant::now() >= deadline {
                    panic!("gave up after {PATIENCE:?} waiting for {what}; last seen: {last}");
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running child process whose standard output and error are collected by threads. Killed
/// (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    child: Option<Child>,
    lines: Receiver<String>,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
    status: Option<ExitStatus>,
    /// One message from each reader thread when it reached the end of its pipe: once the
    /// process exited, what it wrote is all collected only then.
    readers_done: Receiver<()>,
    readers_left: usize,
}

impl Proc {
    /// Start `pmnet ARGS`.
    pub fn spawn(name: &str, args: &[String]) -> Proc {
        let mut command = Command::new(pmnet_bin());
        command.args(args);
        Proc::spawn_command(name, command)
    }

    /// Start `command` (e.g. `pmnet` in another network namespace, through `ip netns exec`,
    /// which execs it: the child's pid is the program's).
    pub fn spawn_command(name: &str, mut command: Command) -> Proc {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {name} ({command:?}): {error}"));
        let (sender, lines) = mpsc::channel();
        let (done, readers_done) = mpsc::channel();
        let stdout_done = done.clone();
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let out = child.stdout.take().expect("piped stdout");
        let seen = stdout.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                seen.lock().unwrap().push(line.clone());
                let _ = sender.send(line);
            }
            let _ = stdout_done.send(());
        });
        let mut err = child.stderr.take().expect("piped stderr");
        let collected = stderr.clone();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            loop {
                match err.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(count) => collected
                        .lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buffer[..count])),
                }
            }
            let _ = done.send(());
        });
        Proc {
            name: name.to_owned(),
            child: Some(child),
            lines,
            stdout,
            stderr,
            status: None,
            readers_done,
            readers_left: 2,
        }
    }

    /// The process exited: wait (within `PATIENCE`) until its output is read to the end of
    /// both pipes (a child of it holding them open ends the wait at the bound).
    fn collect_the_rest(&mut self) {
        let deadline = Instant::now() + PATIENCE;
        while self.readers_left > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if self.readers_done.recv_timeout(left).is_err() {
                return;
            }
            self.readers_left -= 1;
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Everything the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Every line the process wrote to stdout so far.
    pub fn stdout(&self) -> Vec<String> {
        self.stdout.lock().unwrap().clone()
    }

    /// The next stdout line that `wanted` accepts (lines before it are skipped), within
    /// `PATIENCE`.
    pub fn wait_for_line(&mut self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if wanted(&line) => return line,
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => panic!(
                    "{}: no {what} on stdout within {PATIENCE:?}\nstdout: {:?}\nstderr:\n{}",
                    self.name,
                    self.stdout(),
                    self.stderr()
                ),
                Err(RecvTimeoutError::Disconnected) => {
                    // Give the stderr reader a moment to collect the last words.
                    let status = self.wait_timeout(Duration::from_secs(5));
                    panic!(
                        "{}: exited ({status:?}) before printing {what}\nstdout: {:?}\nstderr:\n{}",
                        self.name,
                        self.stdout(),
                        self.stderr()
                    )
                }
            }
        }
    }

    /// Send `signal` to the process.
    pub fn signal(&self, signal: libc::c_int) {
        if let Some(pid) = self.pid() {
            if self.status.is_none() {
                // SAFETY: kill(2) with the pid of our own unreaped child: the pid cannot have
                // been reused, since we have not waited for it yet.
                unsafe {
                    libc::kill(pid as libc::pid_t, signal);
                }
            }
        }
    }

    /// Wait for the process to exit, for at most `timeout`; `None` if it is still running.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.status {
            return Some(status);
        }
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.status = Some(status);
                self.collect_the_rest();
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILL: the process dies at once, wherever it is (a process crash).
    pub fn kill(&mut self) {
        if self.status.is_some() {
            return;
        }
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            if let Ok(status) = child.wait() {
                self.status = Some(status);
            }
        }
    }

    /// SIGTERM, then wait for a clean exit (status 0); panics otherwise.
    pub fn stop(&mut self) {
        self.signal(libc::SIGTERM);
        match self.wait_timeout(PATIENCE) {
            Some(status) if status.success() => {}
            Some(status) => panic!(
                "{} exited with {status} after SIGTERM\nstderr:\n{}",
                self.name,
                self.stderr()
            ),
            None => panic!(
                "{} did not stop within {PATIENCE:?} of SIGTERM\nstderr:\n{}",
                self.name,
                self.stderr()
            ),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The address after `marker` in `line`, up to the next whitespace or `/`.
fn addr_after(line: &str, marker: &str) -> Option<SocketAddr> {
    let start = line.find(marker)? + marker.len();
    let rest = &line[start..];
    let end = rest
        .find(|c: char| c.is_whitespace() || c == '/' || c == ';')
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// A device or server process and what its banner said.
#[derive(Debug)]
pub struct Node {
    pub proc: Proc,
    /// The data address from "listening on ADDR".
    pub addr: SocketAddr,
    /// The metrics endpoint, when started with one.
    pub metrics: Option<SocketAddr>,
    /// Every banner line.
    pub banner: Vec<String>,
}

impl Node {
    /// Start `pmnet ARGS` and read its banner: the "listening on" line, up to the line that
    /// describes the loop (the last one, with "metrics:").
    pub fn start(name: &str, args: Vec<String>) -> Node {
        let mut proc = Proc::spawn(name, &args);
        let first = proc.wait_for_line("a \"listening on\" line", |line| {
            line.contains(" listening on ")
        });
        let addr = addr_after(&first, " listening on ")
            .unwrap_or_else(|| panic!("{name}: no address in {first:?}"));
        let last = proc.wait_for_line("the end of the banner", |line| line.contains("metrics: "));
        let banner = proc.stdout();
        let metrics = addr_after(&last, "metrics: http://");
        Node {
            proc,
            addr,
            metrics,
            banner,
        }
    }

    /// The current value of a metric sample (`labels` as written, e.g. `reason="x"`).
    pub fn metric(&self, name: &str, labels: &str) -> Result<f64, String> {
        let addr = self
            .metrics
            .ok_or_else(|| format!("{} has no metrics endpoint", self.proc.name))?;
        let text = pmnet_runtime::metrics::scrape(addr, Duration::from_secs(5))
            .map_err(|error| format!("scrape {addr}: {error}"))?;
        pmnet_runtime::metrics::find_sample(&text, name, labels)
            .ok_or_else(|| format!("no sample {name}{{{labels}}} in the metrics"))
    }

    /// Wait until a line of the metrics text satisfies `ok` (for a sample whose other labels
    /// do not matter).
    #[allow(dead_code)] // not every test binary uses it
    pub fn wait_metrics_line(&self, what: &str, ok: impl Fn(&str) -> bool) {
        poll_until(&format!("{} {what}", self.proc.name), || {
            let addr = self
                .metrics
                .ok_or_else(|| format!("{} has no metrics endpoint", self.proc.name))?;
            let text = pmnet_runtime::metrics::scrape(addr, Duration::from_secs(5))
                .map_err(|error| format!("scrape {addr}: {error}"))?;
            if text.lines().any(&ok) {
                Ok(())
            } else {
                Err("no such line".into())
            }
        });
    }

    /// Wait until metric `name{labels}` satisfies `ok`.
    pub fn wait_metric(&self, name: &str, labels: &str, what: &str, ok: impl Fn(f64) -> bool) {
        poll_until(
            &format!("{} {name}{{{labels}}} {what}", self.proc.name),
            || match self.metric(name, labels) {
                Ok(value) if ok(value) => Ok(()),
                Ok(value) => Err(format!("{value}")),
                Err(error) => Err(error),
            },
        );
    }
}

fn s(text: impl ToString) -> String {
    text.to_string()
}

/// Arguments of a server with id 1 listening on `listen`, its store in `data_file`, polling
/// `device` at start-up, with a metrics endpoint on a free port; `engine` is its `--engine`
/// (`None`: the default, the packet store).
pub fn server_args(
    listen: SocketAddr,
    device: SocketAddr,
    data_file: &Path,
    engine: Option<&str>,
) -> Vec<String> {
    let mut args = vec![
        s("server"),
        s("--listen"),
        s(listen),
        s("--server-id"),
        s(1),
        s("--device"),
        s(device),
        s("--data-file"),
        s(data_file.display()),
        s("--data-mib"),
        s(8),
        s("--metrics"),
        s("127.0.0.1:0"),
        s("--report-interval"),
        s(0),
    ];
    if let Some(engine) = engine {
        args.extend([s("--engine"), s(engine)]);
    }
    args
}

/// Arguments of device 1 listening on `listen` in front of server 1 at `server`, its log in
/// `log_file` (1024 slots), with a metrics endpoint on a free port.
/// A chain store member `id` on `listen`, its files under `dir`: a device's arguments and
/// its table, then `membership` (`--chain-member …` or `--chain-controller ADDR`).
#[allow(dead_code)] // not every test binary uses it
pub fn chain_member(id: u16, listen: SocketAddr, membership: &[String], dir: &Path) -> Node {
    let mut list = device_args(
        listen,
        free_udp_addr(),
        &dir.join(format!("device{id}.log")),
    );
    list.extend([s("--device-id"), s(id)]);
    list.extend([
        s("--chain-table"),
        s(dir.join(format!("chain{id}.table")).display()),
        s("--chain-keys"),
        s(1000),
    ]);
    list.extend(membership.iter().cloned());
    Node::start(&format!("member {id}"), list)
}

pub fn device_args(listen: SocketAddr, server: SocketAddr, log_file: &Path) -> Vec<String> {
    vec![
        s("device"),
        s("--listen"),
        s(listen),
        s("--server"),
        format!("1={server}"),
        s("--log-file"),
        s(log_file.display()),
        s("--slots"),
        s(1024),
        s("--metrics"),
        s("127.0.0.1:0"),
        s("--report-interval"),
        s(0),
    ]
}

/// A stand-in for a server at `addr` that answers the device's probes (so the device acks
/// what it logs) and applies nothing: the entries stay in the log. Ends when `stop` is set.
#[allow(dead_code)] // not every test binary uses it
pub fn probe_answerer(addr: SocketAddr, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) {
    let socket = std::net::UdpSocket::bind(addr).expect("bind the stand-in server");
    socket
        .set_read_timeout(Some(std::time::Duration::from_millis(20)))
        .expect("a timeout");
    std::thread::spawn(move || {
        let mut buffer = [0u8; 2048];
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok((len, from)) = socket.recv_from(&mut buffer) else {
                continue;
            };
            let Ok((header, payload)) = pmnet_wire::Header::parse(&buffer[..len]) else {
                continue;
            };
            if header.packet_type == pmnet_wire::PacketType::Probe {
                let answer = pmnet_wire::Header {
                    flags: header.flags | pmnet_wire::flags::ANSWER,
                    ..header
                };
                let _ = socket.send_to(&answer.encode(payload), from);
            }
        }
    });
}

/// A device and a server on loopback, with their files in a temporary directory. Each can be
/// stopped, killed and restarted on the same address and files.
#[derive(Debug)]
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub device_addr: SocketAddr,
    /// Known once the server has started the first time (it binds port 0 then).
    pub server_addr: SocketAddr,
    pub device: Option<Node>,
    pub server: Option<Node>,
    pub device_starts: u32,
    pub server_starts: u32,
    /// Log entries the device found at its start-ups (and resent), and torn or corrupt slots
    /// it rejected, from its banners.
    pub device_recovered_entries: u64,
    pub device_rejected_slots: u64,
    /// The server's `--engine`; `None` runs the default.
    pub engine: Option<&'static str>,
    /// Options every start of the device gets besides the usual.
    pub device_extra: Vec<String>,
}

impl Cluster {
    /// Start the server (on a free port, with the default engine), then the device in front
    /// of it.
    pub fn start() -> Cluster {
        Cluster::start_with_engine(None)
    }

    /// [`Cluster::start`] with these options for the device besides the usual.
    #[allow(dead_code)] // not every test binary uses it
    pub fn start_with_device_options(options: &[&str]) -> Cluster {
        Cluster::start_with(None, options)
    }

    /// [`Cluster::start`] with the server's `--engine` (`kv`, `packet`, `conventional`).
    pub fn start_with_engine(engine: Option<&'static str>) -> Cluster {
        Cluster::start_with(engine, &[])
    }

    fn start_with(engine: Option<&'static str>, device_options: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().expect("temporary directory");
        let device_addr = free_udp_addr();
        let mut cluster = Cluster {
            dir,
            device_addr,
            server_addr: "127.0.0.1:0".parse().unwrap(),
            device: None,
            server: None,
            device_starts: 0,
            server_starts: 0,
            device_recovered_entries: 0,
            device_rejected_slots: 0,
            engine,
            device_extra: device_options
                .iter()
                .map(|option| option.to_string())
                .collect(),
        };
        cluster.start_server();
        cluster.start_device();
        cluster
    }

    pub fn log_file(&self) -> PathBuf {
        self.dir.path().join("device.log")
    }

    pub fn data_file(&self) -> PathBuf {
        self.dir.path().join("server.data")
    }

    pub fn start_server(&mut self) {
        assert!(self.server.is_none(), "the server is running");
        self.server_starts += 1;
        let node = Node::start(
            &format!("server (start {})", self.server_starts),
            server_args(
                self.server_addr,
                self.device_addr,
                &self.data_file(),
                self.engine,
            ),
        );
        self.server_addr = node.addr;
        self.server = Some(node);
    }

    pub fn start_device(&mut self) {
        assert!(self.device.is_none(), "the device is running");
        self.device_starts += 1;
        let node = Node::start(&format!("device (start {})", self.device_starts), {
            let mut args = device_args(self.device_addr, self.server_addr, &self.log_file());
            args.extend(self.device_extra.iter().cloned());
            args
        });
        assert_eq!(node.addr, self.device_addr);
        // "  log: PATH (N slots of B bytes; reopened; E entries recovered and resent, R torn
        // or corrupt slots rejected)"
        let number_before = |marker: &str| -> u64 {
            node.banner
                .iter()
                .find_map(|line| {
                    let end = line.find(marker)?;
                    line[..end].rsplit(' ').next()?.parse().ok()
                })
                .unwrap_or_else(|| panic!("no \"{marker}\" in the banner {:?}", node.banner))
        };
        self.device_recovered_entries += number_before(" entries recovered");
        self.device_rejected_slots += number_before(" torn or corrupt");
        if self.server.is_some() {
            // A device acks nothing for a server it has not verified (docs/security.md): with
            // the server up that takes a round trip, awaited here so that the first write is
            // acked as before.
            node.wait_metric(
                "pmnet_device_servers_verified",
                "port=\"pmnet\"",
                "verified its server",
                |value| value == 1.0,
            );
        }
        self.device = Some(node);
    }

    pub fn device(&self) -> &Node {
        self.device.as_ref().expect("the device is running")
    }

    pub fn server(&self) -> &Node {
        self.server.as_ref().expect("the server is running")
    }

    /// SIGKILL the device (a process crash).
    pub fn kill_device(&mut self) {
        let mut node = self.device.take().expect("the device is running");
        node.proc.kill();
        assert_no_panic(&node.proc);
    }

    /// SIGKILL the server (a process crash).
    pub fn kill_server(&mut self) {
        let mut node = self.server.take().expect("the server is running");
        node.proc.kill();
        assert_no_panic(&node.proc);
    }

    /// SIGTERM the server and wait for its clean exit.
    pub fn stop_server(&mut self) {
        let mut node = self.server.take().expect("the server is running");
        node.proc.stop();
        assert_no_panic(&node.proc);
    }

    /// SIGTERM the device and wait for its clean exit.
    pub fn stop_device(&mut self) {
        let mut node = self.device.take().expect("the device is running");
        node.proc.stop();
        assert_no_panic(&node.proc);
    }

    /// Open the server's data file (the server must be stopped) with the engine that wrote
    /// it.
    pub fn open_store(&self) -> StoredData {
        assert!(
            self.server.is_none(),
            "stop the server before opening its store"
        );
        StoredData::open(&self.data_file())
    }
}

/// A stopped server's data file, opened with the engine that wrote it (the packet store and
/// the conventional engine share a format; the key-value store has its own).
#[derive(Debug)]
pub enum StoredData {
    Kv(Box<pmnet_store::KvStore<pmnet_pm::MmapRegion>>),
    Engine(Box<pmnet_pktstore::Store<pmnet_pm::MmapRegion>>),
}

impl StoredData {
    pub fn open(path: &Path) -> StoredData {
        let region = || {
            pmnet_pm::MmapRegion::open(path, pmnet_pm::MmapOptions::default())
                .expect("open the data file")
        };
        match pmnet_pktstore::Store::open(region()) {
            Ok(store) => StoredData::Engine(Box::new(store)),
            Err(engine_error) => match pmnet_store::KvStore::open(region()) {
                Ok(store) => StoredData::Kv(Box::new(store)),
                Err(kv_error) => panic!(
                    "{} holds no store: as an engine's: {engine_error}; as a key-value \
                     store: {kv_error}",
                    path.display()
                ),
            },
        }
    }

    /// The value of `key`; a record that fails its checksum fails the test.
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        match self {
            StoredData::Kv(store) => store.get(key).map(<[u8]>::to_vec),
            StoredData::Engine(store) => store
                .get(key)
                .unwrap_or_else(|corruption| panic!("a corrupt record: {corruption:?}"))
                .map(|value| value.to_vec()),
        }
    }

    /// Keys stored.
    pub fn len(&self) -> usize {
        match self {
            StoredData::Kv(store) => store.len(),
            StoredData::Engine(store) => store.key_count(),
        }
    }

    /// The per-session exactly-once records.
    pub fn sessions(&self) -> Vec<pmnet_store::SessionRecord> {
        use pmnet_store::Application;
        match self {
            StoredData::Kv(store) => store.sessions(),
            StoredData::Engine(store) => store.sessions(),
        }
    }

    /// What recovery rejected or found damaged, if anything.
    pub fn recovery_problem(&self) -> Option<String> {
        match self {
            StoredData::Kv(store) => store
                .recovery()
                .rejected
                .as_ref()
                .map(|rejected| format!("rejected record: {rejected:?}")),
            StoredData::Engine(store) => store.recovery().warning(),
        }
    }
}

/// A process must never die of a panic: that is a bug whatever the input.
pub fn assert_no_panic(proc: &Proc) {
    let stderr = proc.stderr();
    assert!(
        !stderr.contains("panicked"),
        "{} panicked:\n{stderr}",
        proc.name
    );
}

/// A client session through `peer` (default protocol settings).
pub fn session(peer: SocketAddr) -> pmnet_runtime::ClientSession {
    pmnet_runtime::ClientSession::open(pmnet_runtime::SessionOptions::new(1, peer))
        .expect("open a client session")
}

/// Run `pmnet ARGS` to completion (at most `PATIENCE`): (status, stdout, stderr).
pub fn run_pmnet(args: &[String], stdin: Option<&str>) -> (ExitStatus, String, String) {
    run_to_completion(Command::new(pmnet_bin()).args(args), stdin, PATIENCE)
}

/// A chain store's history: each key's operations, with their call and return times.
pub type ChainHistory = Vec<(
    Vec<u8>,
    pmnet_lincheck::Operation<
        pmnet_lincheck::RegisterInput<Vec<u8>>,
        pmnet_lincheck::RegisterOutput<Vec<u8>>,
    >,
)>;

/// `count` chain store clients (sessions `session_base + i`) taking the chains from
/// `controllers` (the first, then the standbys), each on a mix of reads and writes of `keys`
/// until `stop`; every operation goes into `history`, its times in nanoseconds since `started`
/// (a request whose outcome is unknown stays pending).
pub fn chain_clients(
    count: u64,
    session_base: u64,
    controllers: &[SocketAddr],
    keys: &[Vec<u8>],
    started: Instant,
    stop: &Arc<std::sync::atomic::AtomicBool>,
    history: &Arc<Mutex<ChainHistory>>,
) -> Vec<std::thread::JoinHandle<()>> {
    use pmnet_lincheck::{Operation, RegisterInput, RegisterOutput, PENDING};
    use pmnet_netchain::{ClientConfig, ClientOp, Outcome};
    use std::sync::atomic::Ordering;
    (0..count)
        .map(|client| {
            let (stop, history, keys) = (stop.clone(), history.clone(), keys.to_vec());
            let controllers = controllers.to_vec();
            std::thread::spawn(move || {
                let mut config = ClientConfig::controlled(session_base + client, controllers[0]);
                config.standby_controllers = controllers[1..].to_vec();
                config.retransmit_timeout_max = Duration::from_millis(20);
                config.request_lifetime = Duration::from_secs(5);
                let mut session =
                    pmnet_runtime::ChainSession::open(config, controllers[0]).expect("socket");
                let mut at = client as usize;
                let mut value = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    at = at.wrapping_mul(31).wrapping_add(17);
                    let key = keys[at % keys.len()].clone();
                    let op = if at % 3 == 0 {
                        ClientOp::Get
                    } else {
                        value += 1;
                        ClientOp::Put(format!("{client}:{value}").into_bytes())
                    };
                    let call = started.elapsed().as_nanos() as u64;
                    let outcome = session.run(&key, op.clone()).expect("the socket works");
                    let ret = started.elapsed().as_nanos() as u64;
                    let input = match &op {
                        ClientOp::Get => RegisterInput::Read,
                        ClientOp::Put(value) => RegisterInput::Write(Some(value.clone())),
                        _ => unreachable!(),
                    };
                    let (output, ret) = match outcome {
                        Outcome::Value { value, .. } => (RegisterOutput::Value(value), ret),
                        Outcome::Written { .. } => (RegisterOutput::Written, ret),
                        Outcome::Unknown => (RegisterOutput::Unknown, PENDING),
                        other => panic!("client {client}: {other:?}"),
                    };
                    history.lock().unwrap().push((
                        key,
                        Operation {
                            client,
                            call,
                            ret,
                            input,
                            output,
                        },
                    ));
                }
            })
        })
        .collect()
}
