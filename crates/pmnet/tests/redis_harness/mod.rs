//! The Redis system the Redis tests share: a redis-server of the test's own, and `pmnet`
//! processes (adaptor, device, gateway) in front of it, killed when dropped.

#![allow(dead_code)] // each test binary uses its own subset

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use pmnet_redis::resp::{SyncClient, Value};
#[allow(unused_imports)] // likewise
pub use pmnet_testkit::seed;

pub const BIN: &str = env!("CARGO_BIN_EXE_pmnet");
/// Longest wait for anything to become ready or to converge (liveness, not timing).
pub const PATIENCE: Duration = Duration::from_secs(60);

pub fn require_redis() {
    for tool in ["redis-server", "redis-cli", "redis-benchmark"] {
        let found = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        assert!(
            found,
            "{tool} is not installed: install redis-server and redis-tools (scripts/test.sh \
             does: apt-get install -y redis-server redis-tools)"
        );
    }
}

/// Free ports are chosen below Linux's ephemeral range (32768 and up): a port chosen here is
/// bound later by the process under test, and meanwhile every `bind(port 0)` — the other
/// processes' own sockets, Redis's clients — takes ports from the ephemeral range only.
fn free_port(bind: impl Fn(u16) -> bool) -> u16 {
    for _ in 0..1000 {
        let port = rand::random_range(20_000..32_768u16);
        if bind(port) {
            return port;
        }
    }
    panic!("no free port found between 20000 and 32767");
}

pub fn free_tcp_port() -> u16 {
    free_port(|port| TcpListener::bind(("127.0.0.1", port)).is_ok())
}

pub fn free_udp_port() -> u16 {
    free_port(|port| UdpSocket::bind(("127.0.0.1", port)).is_ok())
}

pub fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < PATIENCE, "gave up waiting: {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// A redis-server of the test's own, killed when dropped.
pub struct Redis {
    pub child: Option<Child>,
    pub port: u16,
    pub dir: PathBuf,
    /// The PMNet module's arguments, when Redis loads it (`--loadmodule`).
    pub module: Option<Vec<String>>,
}

/// Where the build put the PMNet Redis module (`libpmnet_redis_module.so`, crates/redis-module):
/// beside the `pmnet` binary under test.
pub fn module_path() -> PathBuf {
    let bin = Path::new(BIN);
    let dir = bin.parent().expect("the binary's directory");
    [
        dir.join("libpmnet_redis_module.so"),
        dir.join("deps/libpmnet_redis_module.so"),
    ]
    .into_iter()
    .find(|path| path.exists())
    .unwrap_or_else(|| {
        panic!(
            "libpmnet_redis_module.so is not in {} (build it: cargo build -p pmnet-redis-module)",
            dir.display()
        )
    })
}

impl Redis {
    pub fn start(dir: &Path) -> Redis {
        Redis::start_loading(dir, None)
    }

    /// A redis-server that loads the PMNet module with `module` as its arguments.
    pub fn start_loading(dir: &Path, module: Option<Vec<String>>) -> Redis {
        let mut redis = Redis {
            child: None,
            port: free_tcp_port(),
            dir: dir.to_path_buf(),
            module,
        };
        redis.spawn();
        redis
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("redis.log"))
            .expect("redis log file");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .args([
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--daemonize",
                "no",
            ])
            .args(self.module.iter().flat_map(|args| {
                let mut words = vec![
                    "--loadmodule".to_owned(),
                    module_path().display().to_string(),
                ];
                words.extend(args.iter().cloned());
                words
            }))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let addr = self.addr();
        poll_until("redis-server answers PING", || {
            SyncClient::connect(addr, Duration::from_secs(1))
                .and_then(|mut client| client.command(&["PING"]))
                .is_ok_and(|reply| reply == Value::Simple(b"PONG".to_vec()))
        });
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn client(&self) -> SyncClient {
        SyncClient::connect(self.addr(), Duration::from_secs(30)).expect("connect to redis")
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `pmnet` process, killed when dropped.
pub struct Proc {
    pub child: Child,
    pub addr: SocketAddr,
    /// Its metrics endpoint, if it was started with one.
    pub metrics: Option<SocketAddr>,
}

impl Proc {
    /// Start `pmnet ARGS` and wait for its "listening on ADDR" line.
    pub fn spawn(args: &[String], log: &Path) -> Proc {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        let mut child = Command::new(BIN)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start pmnet");
        let stdout = child.stdout.take().expect("stdout");
        let (sender, receiver) = mpsc::channel();
        thread::spawn(move || {
            let mut addr = None;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some((_, rest)) = line.split_once(" listening on ") {
                    addr = Some(rest.split_whitespace().next().unwrap_or("").to_owned());
                }
                // The banner ends with "…; metrics: off" or "…; metrics: http://ADDR/metrics".
                if let (Some(listen), Some((_, rest))) = (&addr, line.split_once("metrics: ")) {
                    let metrics = rest.trim_start_matches("http://").split('/').next();
                    let _ = sender.send((listen.clone(), metrics.unwrap_or("").to_owned()));
                    addr = None;
                }
            }
        });
        let (addr, metrics) = receiver
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("pmnet {args:?} did not say where it listens; see {log:?}"));
        Proc {
            child,
            addr: addr.parse().expect("a socket address"),
            metrics: metrics.parse().ok(),
        }
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Redis, adaptor, device and gateway.
pub struct System {
    pub dir: tempfile::TempDir,
    pub redis: Redis,
    pub adaptor_port: u16,
    pub device_port: u16,
    pub adaptor: Option<Proc>,
    pub device: Option<Proc>,
    pub gateway: Option<Proc>,
    /// The adaptor runs with `--record-reads`.
    pub record_reads: bool,
    /// Options the device runs with besides the usual.
    pub device_options: Vec<String>,
}

impl System {
    pub fn start(ack_counting_writes: bool) -> System {
        System::start_with(ack_counting_writes, false)
    }

    pub fn start_with(ack_counting_writes: bool, record_reads: bool) -> System {
        let extra: &[&str] = if ack_counting_writes {
            &["--ack-counting-writes"]
        } else {
            &[]
        };
        System::start_gateway_with(extra, record_reads)
    }

    /// Redis, adaptor and device, and a gateway with these options besides the usual.
    pub fn start_gateway_with(gateway_options: &[&str], record_reads: bool) -> System {
        System::start_full(&[], gateway_options, record_reads)
    }

    /// Redis, adaptor, a device and a gateway with these options besides the usual.
    pub fn start_full(
        device_options: &[&str],
        gateway_options: &[&str],
        record_reads: bool,
    ) -> System {
        // PMNET_REDIS_SERVER_SIDE=module runs these systems with the module in place of the
        // adaptor (a check of the module against the adaptor's tests; tests that stop or
        // start the adaptor itself do not apply).
        let module = std::env::var("PMNET_REDIS_SERVER_SIDE").is_ok_and(|side| side == "module");
        System::start_on(module, device_options, gateway_options, record_reads)
    }

    /// Redis with the PMNet module in place of the adaptor, a device and a gateway (with
    /// `--ack-counting-writes` when `ack_counting_writes`).
    pub fn start_module(ack_counting_writes: bool) -> System {
        let extra: &[&str] = if ack_counting_writes {
            &["--ack-counting-writes"]
        } else {
            &[]
        };
        System::start_on(true, &[], extra, false)
    }

    /// The server side is the module inside Redis when `module`, else the adaptor.
    fn start_on(
        module: bool,
        device_options: &[&str],
        gateway_options: &[&str],
        record_reads: bool,
    ) -> System {
        require_redis();
        let dir = tempfile::tempdir().expect("temporary directory");
        let (adaptor_port, device_port) = (free_udp_port(), free_udp_port());
        let module_args = module.then(|| {
            [
                "listen",
                &format!("127.0.0.1:{adaptor_port}"),
                "device",
                &format!("127.0.0.1:{device_port}"),
                "record-reads",
                if record_reads { "yes" } else { "no" },
            ]
            .map(str::to_owned)
            .to_vec()
        });
        let redis = Redis::start_loading(dir.path(), module_args);
        let mut system = System {
            redis,
            adaptor_port,
            device_port,
            adaptor: None,
            device: None,
            gateway: None,
            record_reads,
            device_options: device_options.iter().map(|o| (*o).to_owned()).collect(),
            dir,
        };
        if !module {
            system.start_adaptor();
        }
        system.start_device();
        let mut args: Vec<String> = [
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--device",
            &system.device_addr().to_string(),
            "--report-interval",
            "0",
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(gateway_options.iter().map(|option| (*option).to_owned()));
        system.gateway = Some(Proc::spawn(&args, &system.dir.path().join("gateway.log")));
        system
    }

    pub fn device_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.device_port))
    }

    pub fn adaptor_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.adaptor_port))
    }

    pub fn start_adaptor(&mut self) {
        let mut args = [
            "redis-adaptor",
            "--listen",
            &self.adaptor_addr().to_string(),
            "--redis",
            &self.redis.addr().to_string(),
            "--device",
            &self.device_addr().to_string(),
            "--report-interval",
            "0",
            "--metrics",
            "127.0.0.1:0",
        ]
        .map(str::to_owned)
        .to_vec();
        if self.record_reads {
            args.push("--record-reads".to_owned());
        }
        self.adaptor = Some(Proc::spawn(&args, &self.dir.path().join("adaptor.log")));
    }

    pub fn start_device(&mut self) {
        let args = [
            "device",
            "--listen",
            &self.device_addr().to_string(),
            "--server",
            &format!("1={}", self.adaptor_addr()),
            "--log-file",
            &self.dir.path().join("device.log").display().to_string(),
            "--slots",
            "4096",
            "--report-interval",
            "0",
        ]
        .map(str::to_owned)
        .to_vec();
        let mut args = args;
        args.extend(self.device_options.iter().cloned());
        self.device = Some(Proc::spawn(&args, &self.dir.path().join("device.stderr")));
    }

    pub fn gateway_port(&self) -> u16 {
        self.gateway.as_ref().expect("gateway").addr.port()
    }

    pub fn gateway_client(&self) -> SyncClient {
        let addr = self.gateway.as_ref().expect("gateway").addr;
        SyncClient::connect(addr, PATIENCE).expect("connect to the gateway")
    }

    /// redis-cli against the gateway: its output, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &self.gateway_port().to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        assert!(output.status.success(), "redis-cli {args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// redis-cli reading commands from stdin: one connection for all of them.
    pub fn cli_stdin(&self, commands: &str) -> String {
        use std::io::Write;
        let mut child = Command::new("redis-cli")
            .args(["-p", &self.gateway_port().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run redis-cli");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(commands.as_bytes())
            .expect("write to redis-cli");
        let output = child.wait_with_output().expect("redis-cli");
        assert!(output.status.success(), "redis-cli: {output:?}");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    pub fn benchmark(&self, args: &[&str]) {
        let output = Command::new("redis-benchmark")
            .args(["-p", &self.gateway_port().to_string(), "-q"])
            .args(args)
            .output()
            .expect("run redis-benchmark");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "redis-benchmark {args:?}: {output:?}"
        );
        eprintln!(
            "redis-benchmark {args:?}: {}",
            text.split(['\r', '\n'])
                .rfind(|line| !line.trim().is_empty())
                .unwrap_or("")
                .trim()
        );
    }
}

/// Every key in Redis but the adaptor's records, with its value (strings and lists).
pub fn user_data(redis: &mut SyncClient) -> BTreeMap<String, Value> {
    let Value::Array(Some(keys)) = redis.command(&["KEYS", "*"]).expect("KEYS") else {
        panic!("KEYS did not answer a list");
    };
    let mut data = BTreeMap::new();
    for key in keys {
        let key = String::from_utf8(key.as_bytes().expect("a key").to_vec()).expect("utf-8");
        if key.starts_with("pmnet:") {
            continue;
        }
        let kind = redis.command(&["TYPE", &key]).expect("TYPE");
        let value = match kind.as_bytes() {
            Some(b"list") => redis.command(&["LRANGE", &key, "0", "-1"]).expect("LRANGE"),
            _ => redis.command(&["GET", &key]).expect("GET"),
        };
        data.insert(key, value);
    }
    data
}

pub fn bulk(text: &str) -> Value {
    Value::Bulk(Some(text.as_bytes().to_vec()))
}

pub fn int_of(value: &Value) -> i64 {
    match value {
        Value::Integer(number) => *number,
        Value::Bulk(Some(bytes)) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| text.parse().ok())
            .unwrap_or_else(|| panic!("not a number: {value:?}")),
        other => panic!("not a number: {other:?}"),
    }
}

/// A `pmnet redis-up --start-redis` on ports of the test's own, once it says where clients
/// connect.
pub struct RedisUp {
    pub child: std::process::Child,
    pub gateway: u16,
    pub device: u16,
    pub adaptor: u16,
    pub redis_port: u16,
    /// Its output so far is read from here (its parts' logs: `redis-up.err` beside it).
    pub log: std::path::PathBuf,
    pub _dir: tempfile::TempDir,
}

pub fn start_redis_up() -> RedisUp {
    let dir = tempfile::tempdir().expect("temporary directory");
    let gateway = free_tcp_port();
    let device = free_udp_port();
    let adaptor = free_udp_port();
    let log = dir.path().join("redis-up.out");
    let child = Command::new(BIN)
        .arg("redis-up")
        .arg("--start-redis")
        .arg(dir.path().join("redis"))
        .args(["--listen", &format!("127.0.0.1:{gateway}")])
        .args(["--device-listen", &format!("127.0.0.1:{device}")])
        .args(["--adaptor-listen", &format!("127.0.0.1:{adaptor}")])
        .arg("--log-file")
        .arg(dir.path().join("device.log"))
        .stdout(std::fs::File::create(&log).expect("log file"))
        .stderr(std::fs::File::create(dir.path().join("redis-up.err")).expect("log file"))
        .spawn()
        .expect("start pmnet redis-up");
    poll_until("redis-up says where clients connect", || {
        std::fs::read_to_string(&log).is_ok_and(|text| text.contains("clients connect to"))
    });
    let text = std::fs::read_to_string(&log).unwrap();
    let redis_port: u16 = text
        .split("Redis at 127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("redis-up names its Redis:\n{text}"));
    RedisUp {
        child,
        gateway,
        device,
        adaptor,
        redis_port,
        log,
        _dir: dir,
    }
}
