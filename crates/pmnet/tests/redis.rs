//! A real `redis-server` behind PMNet, unmodified Redis clients in front: `redis-cli`,
//! `redis-benchmark` and a RESP client of our own talk to `pmnet gateway` → `pmnet device` →
//! `pmnet redis-adaptor` → `redis-server` (appendonly, appendfsync always), all real processes
//! on loopback, each test with its own Redis, ports and files.
//!
//! The crash tests SIGKILL Redis, the adaptor or the device in the middle of a write load and
//! restart it; every connection pushes its own numbered history (`RPUSH hist:<w> <i>`, sent as
//! PMNet updates with `--ack-counting-writes`), so a lost or a doubly applied write shows up as
//! a hole or a repeat in the list. SIGKILL is a process crash: what a killed Redis wrote to its
//! append-only file survives in the page cache.
//!
//! Needs `redis-server`, `redis-cli` and `redis-benchmark` (Debian: `redis-server`,
//! `redis-tools`); scripts/test.sh installs them. Randomised tests print their seed;
//! `PMNET_SEED=N` replays it.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use pmnet_redis::resp::{SyncClient, Value};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const BIN: &str = env!("CARGO_BIN_EXE_pmnet");
/// Longest wait for anything to become ready or to converge (liveness, not timing).
const PATIENCE: Duration = Duration::from_secs(60);

fn seed(test: &str) -> u64 {
    let seed = match std::env::var("PMNET_SEED") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("PMNET_SEED must be a u64, got {text:?}")),
        Err(_) => rand::random(),
    };
    eprintln!("{test}: PMNET_SEED={seed}");
    seed
}

fn require_redis() {
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

fn free_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free TCP port")
        .port()
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|socket| socket.local_addr())
        .expect("a free UDP port")
        .port()
}

fn poll_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < PATIENCE, "gave up waiting: {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// A redis-server of the test's own, killed when dropped.
struct Redis {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl Redis {
    fn start(dir: &Path) -> Redis {
        let mut redis = Redis {
            child: None,
            port: free_tcp_port(),
            dir: dir.to_path_buf(),
        };
        redis.spawn();
        redis
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn spawn(&mut self) {
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

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn client(&self) -> SyncClient {
        SyncClient::connect(self.addr(), Duration::from_secs(30)).expect("connect to redis")
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A `pmnet` process, killed when dropped.
struct Proc {
    child: Child,
    addr: SocketAddr,
}

impl Proc {
    /// Start `pmnet ARGS` and wait for its "listening on ADDR" line.
    fn spawn(args: &[String], log: &Path) -> Proc {
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
            let mut sent = false;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if !sent {
                    if let Some((_, rest)) = line.split_once(" listening on ") {
                        let addr = rest.split_whitespace().next().unwrap_or("").to_owned();
                        let _ = sender.send(addr);
                        sent = true;
                    }
                }
            }
        });
        let addr = receiver
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("pmnet {args:?} did not say where it listens; see {log:?}"));
        Proc {
            child,
            addr: addr.parse().expect("a socket address"),
        }
    }

    fn kill(&mut self) {
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
struct System {
    dir: tempfile::TempDir,
    redis: Redis,
    adaptor_port: u16,
    device_port: u16,
    adaptor: Option<Proc>,
    device: Option<Proc>,
    gateway: Option<Proc>,
    /// The adaptor runs with `--record-reads`.
    record_reads: bool,
}

impl System {
    fn start(ack_counting_writes: bool) -> System {
        System::start_with(ack_counting_writes, false)
    }

    fn start_with(ack_counting_writes: bool, record_reads: bool) -> System {
        require_redis();
        let dir = tempfile::tempdir().expect("temporary directory");
        let redis = Redis::start(dir.path());
        let mut system = System {
            redis,
            adaptor_port: free_udp_port(),
            device_port: free_udp_port(),
            adaptor: None,
            device: None,
            gateway: None,
            record_reads,
            dir,
        };
        system.start_adaptor();
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
        if ack_counting_writes {
            args.push("--ack-counting-writes".to_owned());
        }
        system.gateway = Some(Proc::spawn(&args, &system.dir.path().join("gateway.log")));
        system
    }

    fn device_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.device_port))
    }

    fn adaptor_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.adaptor_port))
    }

    fn start_adaptor(&mut self) {
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
        ]
        .map(str::to_owned)
        .to_vec();
        if self.record_reads {
            args.push("--record-reads".to_owned());
        }
        self.adaptor = Some(Proc::spawn(&args, &self.dir.path().join("adaptor.log")));
    }

    fn start_device(&mut self) {
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
        .map(str::to_owned);
        self.device = Some(Proc::spawn(&args, &self.dir.path().join("device.stderr")));
    }

    fn gateway_port(&self) -> u16 {
        self.gateway.as_ref().expect("gateway").addr.port()
    }

    fn gateway_client(&self) -> SyncClient {
        let addr = self.gateway.as_ref().expect("gateway").addr;
        SyncClient::connect(addr, PATIENCE).expect("connect to the gateway")
    }

    /// redis-cli against the gateway: its output, trimmed.
    fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &self.gateway_port().to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        assert!(output.status.success(), "redis-cli {args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// redis-cli reading commands from stdin: one connection for all of them.
    fn cli_stdin(&self, commands: &str) -> String {
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

    fn benchmark(&self, args: &[&str]) {
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
fn user_data(redis: &mut SyncClient) -> BTreeMap<String, Value> {
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

fn bulk(text: &str) -> Value {
    Value::Bulk(Some(text.as_bytes().to_vec()))
}

fn int_of(value: &Value) -> i64 {
    match value {
        Value::Integer(number) => *number,
        Value::Bulk(Some(bytes)) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| text.parse().ok())
            .unwrap_or_else(|| panic!("not a number: {value:?}")),
        other => panic!("not a number: {other:?}"),
    }
}

#[test]
fn redis_cli_and_redis_benchmark_through_the_gateway() {
    let system = System::start(false);
    // One redis-cli connection is one session: its GET is ordered after its SET. (Separate
    // connections are separate sessions; a write acked by the device reaches Redis a moment
    // later.)
    assert_eq!(
        system.cli_stdin("SET greeting hello\nGET greeting\n"),
        "OK\nhello"
    );
    assert_eq!(system.cli(&["PING"]), "PONG");
    assert_eq!(system.cli(&["RPUSH", "cli-list", "a", "b"]), "2");
    assert_eq!(system.cli(&["LRANGE", "cli-list", "0", "-1"]), "a\nb");
    assert!(system
        .cli(&["NOSUCHCOMMAND", "x"])
        .starts_with("ERR unknown"));
    assert!(system.cli(&["FLUSHALL"]).starts_with("ERR"));
    assert!(system.cli(&["GET"]).contains("wrong number of arguments"));

    // Fixed keys, counters and a list: every request's effect is countable at the end.
    system.benchmark(&[
        "-t", "set,get", "-n", "2000", "-c", "4", "-r", "50", "-d", "16",
    ]);
    system.benchmark(&[
        "-t", "set", "-n", "2000", "-c", "2", "-r", "50", "-d", "16", "-P", "16",
    ]);
    system.benchmark(&["-t", "incr", "-n", "1000", "-c", "4", "-r", "20", "-P", "4"]);
    system.benchmark(&["-t", "lpush", "-n", "1000", "-c", "4", "-P", "8"]);

    // The benchmark's connections are gone; their last updates, acked by the device, reach
    // Redis a moment later: wait for the counts to converge, then check everything.
    let mut redis = system.redis.client();
    let started = Instant::now();
    loop {
        let problem = match check_benchmark_content(&user_data(&mut redis)) {
            Ok(()) => break,
            Err(problem) => problem,
        };
        assert!(
            started.elapsed() < PATIENCE,
            "Redis never held the expected content: {problem}"
        );
        thread::sleep(Duration::from_millis(50));
    }

    // Every connection left a session record, set to expire (the default --session-ttl), so
    // that ended sessions do not pile up in Redis.
    let Value::Array(Some(records)) = redis.command(&["KEYS", "pmnet:session:*"]).expect("KEYS")
    else {
        panic!("KEYS did not answer a list");
    };
    assert!(records.len() >= 4, "{} session records", records.len());
    let ttl_max = pmnet_redis::script::DEFAULT_SESSION_TTL_SECS as i64;
    for record in records {
        let key = String::from_utf8(record.as_bytes().expect("a key").to_vec()).expect("utf-8");
        let ttl = int_of(&redis.command(&["TTL", &key]).expect("TTL"));
        assert!(
            (ttl_max - 60..=ttl_max).contains(&ttl),
            "{key}: TTL {ttl}, expected about {ttl_max}"
        );
    }
}

fn check_benchmark_content(data: &BTreeMap<String, Value>) -> Result<(), String> {
    let mut counters = 0;
    let mut set_keys = 0;
    for (key, value) in data {
        match key.as_str() {
            "greeting" if value == &bulk("hello") => {}
            "cli-list" if value == &Value::Array(Some(vec![bulk("a"), bulk("b")])) => {}
            "mylist" => {
                let Value::Array(Some(items)) = value else {
                    return Err(format!("mylist: {value:?}"));
                };
                if items.len() != 1000 {
                    return Err(format!("mylist has {} items, not 1000", items.len()));
                }
            }
            key if key.starts_with("counter:") => counters += int_of(value),
            key if key.starts_with("key:") => {
                set_keys += 1;
                // redis-benchmark fills values with 16 random bytes.
                if value.as_bytes().map(<[u8]>::len) != Some(16) {
                    return Err(format!("{key} = {value:?}"));
                }
            }
            other => return Err(format!("unexpected {other:?} = {value:?} in Redis")),
        }
    }
    if counters != 1000 {
        return Err(format!("the counters add up to {counters}, not 1000"));
    }
    if !(1..=50).contains(&set_keys) {
        return Err(format!("{set_keys} key:* keys"));
    }
    Ok(())
}

#[test]
fn bad_resp_input_gets_an_error_and_the_connection_closes() {
    let system = System::start(false);
    let mut client = system.gateway_client();
    client.send_raw(b"*1\r\n$x\r\n").expect("send");
    let reply = client.read_value().expect("an error reply");
    assert!(
        matches!(&reply, Value::Error(text) if text.starts_with(b"ERR Protocol error")),
        "{reply:?}"
    );
    assert!(
        client.read_value().is_err(),
        "the gateway closes the connection"
    );
    // Pipelined commands, answered in order, with local answers between remote ones.
    let mut client = system.gateway_client();
    let replies = client
        .pipeline(&[
            vec!["SET", "p", "1"],
            vec!["PING"],
            vec!["GET", "p"],
            vec!["NOPE"],
            vec!["INCR", "p"],
            vec!["ECHO", "e"],
            vec!["GET", "p"],
        ])
        .expect("pipeline");
    assert_eq!(replies[0], Value::Simple(b"OK".to_vec()));
    assert_eq!(replies[1], Value::Simple(b"PONG".to_vec()));
    assert_eq!(replies[2], bulk("1"));
    assert!(replies[3].is_error());
    assert_eq!(replies[4], Value::Integer(2));
    assert_eq!(replies[5], bulk("e"));
    assert_eq!(replies[6], bulk("2"));
}

/// A YCSB-like mix per connection (SET 45%, GET 35%, INCRBY 10%, APPEND 5%, DEL 5%) on the
/// connection's own keys, sent in pipelined batches; every reply is checked against the
/// connection's model (read-your-writes), and Redis ends with exactly the models' content.
#[test]
fn a_mixed_workload_reads_its_own_writes() {
    let seed = seed("a_mixed_workload_reads_its_own_writes");
    let system = System::start(false);
    let connections = 4;
    let ops = 400;
    let handles: Vec<_> = (0..connections)
        .map(|connection| {
            let mut client = system.gateway_client();
            thread::spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (connection as u64) << 32);
                let mut model: HashMap<String, String> = HashMap::new();
                let mut done = 0;
                while done < ops {
                    let batch = rng.random_range(1..=8usize);
                    let mut commands = Vec::new();
                    let mut expected = Vec::new();
                    for _ in 0..batch {
                        let key = format!("ycsb:{connection}:{}", rng.random_range(0..16));
                        let roll = rng.random_range(0..100);
                        let (command, reply) = if roll < 45 {
                            let value = format!("v{}", rng.random_range(0..1_000_000));
                            model.insert(key.clone(), value.clone());
                            (
                                vec!["SET".to_owned(), key, value],
                                Value::Simple(b"OK".to_vec()),
                            )
                        } else if roll < 80 {
                            let reply = match model.get(&key) {
                                Some(value) => bulk(value),
                                None => Value::Bulk(None),
                            };
                            (vec!["GET".to_owned(), key], reply)
                        } else if roll < 90 {
                            let key = format!("ycsb:{connection}:n");
                            let delta = rng.random_range(-5..=5i64);
                            let old: i64 = model.get(&key).map_or(0, |v| v.parse().unwrap());
                            model.insert(key.clone(), (old + delta).to_string());
                            (
                                vec!["INCRBY".to_owned(), key, delta.to_string()],
                                Value::Integer(old + delta),
                            )
                        } else if roll < 95 {
                            let piece = format!("+{}", rng.random_range(0..100));
                            let entry = model.entry(key.clone()).or_default();
                            entry.push_str(&piece);
                            let len = entry.len() as i64;
                            (vec!["APPEND".to_owned(), key, piece], Value::Integer(len))
                        } else {
                            let existed = model.remove(&key).is_some();
                            (
                                vec!["DEL".to_owned(), key],
                                Value::Integer(i64::from(existed)),
                            )
                        };
                        commands.push(command);
                        expected.push(reply);
                    }
                    let replies = client.pipeline(&commands).expect("pipeline");
                    for ((command, reply), want) in commands.iter().zip(&replies).zip(&expected) {
                        assert_eq!(
                            reply, want,
                            "connection {connection}: {command:?} (seed {seed})"
                        );
                    }
                    done += batch;
                }
                // A bypass read is ordered after every earlier update of the session: once it
                // is answered, all of this connection's writes are in Redis.
                let last = client.command(&["GET", "ycsb:end"]).expect("GET");
                assert_eq!(last, Value::Bulk(None));
                model
            })
        })
        .collect();
    let mut expected: BTreeMap<String, Value> = BTreeMap::new();
    for handle in handles {
        for (key, value) in handle.join().expect("a connection's thread") {
            expected.insert(key, bulk(&value));
        }
    }
    let mut redis = system.redis.client();
    assert_eq!(user_data(&mut redis), expected, "seed {seed}");
}

#[derive(Debug, Clone, Copy)]
enum Victim {
    Redis,
    Adaptor,
    Device,
}

/// Writers push numbered histories through the gateway (RPUSH as PMNet updates) and check
/// with LLEN (a bypass read, ordered after their pushes) that they see all their own pushes;
/// the victim is killed with SIGKILL mid-load and restarted. At the end each history is
/// exactly 0, 1, …, n−1: no acknowledged push lost, none applied twice, order kept.
///
/// With `record_reads` the adaptor records reads like writes (`--record-reads`), so a read
/// redone after a crash gets its recorded reply: no read may come back without one.
fn crash_during_writes(victim: Victim, record_reads: bool) {
    let mut system = System::start_with(true, record_reads);
    let writers = 3;
    let pushes = 300;
    let acked = Arc::new(AtomicUsize::new(0));
    let reads_without_reply = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let handles: Vec<_> = (0..writers)
        .map(|writer| {
            let mut client = system.gateway_client();
            let acked = acked.clone();
            let reads_without_reply = reads_without_reply.clone();
            let stop = stop.clone();
            thread::spawn(move || {
                let key = format!("hist:{writer}");
                let mut next = 0;
                while next < pushes && !stop.load(Ordering::Relaxed) {
                    let batch = (pushes - next).min(4);
                    let commands: Vec<Vec<String>> = (next..next + batch)
                        .map(|i| vec!["RPUSH".to_owned(), key.clone(), i.to_string()])
                        .chain(std::iter::once(vec!["LLEN".to_owned(), key.clone()]))
                        .collect();
                    let replies = client.pipeline(&commands).expect("pipeline");
                    for (offset, reply) in replies[..batch].iter().enumerate() {
                        match reply {
                            // Logged by the device, or answered by Redis first (the length).
                            Value::Simple(ok) if ok == b"OK" => {}
                            Value::Integer(len) => {
                                assert_eq!(*len, (next + offset + 1) as i64, "{key}")
                            }
                            other => panic!("{key}: RPUSH {} answered {other:?}", next + offset),
                        }
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    match &replies[batch] {
                        Value::Integer(len) => {
                            assert_eq!(*len, (next + batch) as i64, "{key}: LLEN sees its pushes")
                        }
                        Value::Error(text)
                            if text.windows(20).any(|w| w == b"applied exactly once") =>
                        {
                            // An adaptor crash lost this read's reply after a later push of
                            // the session was applied (documented).
                            reads_without_reply.fetch_add(1, Ordering::Relaxed);
                        }
                        other => panic!("{key}: LLEN answered {other:?}"),
                    }
                    next += batch;
                }
                next
            })
        })
        .collect();
    let total = writers * pushes;
    poll_until("a third of the pushes acked", || {
        acked.load(Ordering::Relaxed) >= total / 3
    });
    match victim {
        Victim::Redis => {
            system.redis.kill();
            thread::sleep(Duration::from_millis(200));
            system.redis.spawn();
        }
        Victim::Adaptor => {
            if let Some(mut adaptor) = system.adaptor.take() {
                adaptor.kill();
            }
            thread::sleep(Duration::from_millis(200));
            system.start_adaptor();
        }
        Victim::Device => {
            if let Some(mut device) = system.device.take() {
                device.kill();
            }
            thread::sleep(Duration::from_millis(200));
            system.start_device();
        }
    }
    let mut finished = Vec::new();
    for handle in handles {
        finished.push(handle.join().expect("a writer's thread"));
    }
    stop.store(true, Ordering::Relaxed);
    eprintln!(
        "{victim:?} killed after {} of {total} pushes were acked; reads whose reply was lost: {}",
        total / 3,
        reads_without_reply.load(Ordering::Relaxed)
    );
    if record_reads {
        assert_eq!(
            reads_without_reply.load(Ordering::Relaxed),
            0,
            "with --record-reads every redone read keeps its reply"
        );
    }
    let mut redis = system.redis.client();
    for (writer, &count) in finished.iter().enumerate() {
        assert_eq!(count, pushes);
        let key = format!("hist:{writer}");
        poll_until(&format!("{key} complete in Redis"), || {
            redis
                .command(&["LLEN", &key])
                .is_ok_and(|len| int_of(&len) >= count as i64)
        });
        let expected: Vec<Value> = (0..count).map(|i| bulk(&i.to_string())).collect();
        assert_eq!(
            redis.command(&["LRANGE", &key, "0", "-1"]).expect("LRANGE"),
            Value::Array(Some(expected)),
            "{key}: every acked push exactly once, in order"
        );
    }
}

#[test]
fn killing_redis_loses_no_acked_write_and_applies_none_twice() {
    crash_during_writes(Victim::Redis, false);
}

#[test]
fn killing_the_adaptor_loses_no_acked_write_and_applies_none_twice() {
    crash_during_writes(Victim::Adaptor, false);
}

#[test]
fn killing_the_device_loses_no_acked_write_and_applies_none_twice() {
    crash_during_writes(Victim::Device, false);
}

#[test]
fn killing_the_adaptor_that_records_reads_loses_no_reply() {
    crash_during_writes(Victim::Adaptor, true);
}
