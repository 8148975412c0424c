//! What goes to Redis on a client connection's direct connection, through `pmnet redis-up`
//! started as docs/redis.md tells a user: pub/sub (RESP2 and RESP3, raw sockets, redis-cli,
//! redis-py and ioredis), blocking commands woken from another connection and ordered after the
//! connection's earlier writes, `WAIT`, client-side caching's invalidations, `MONITOR`, and
//! requests larger than one PMNet request. And a gateway without `--redis` refusing them.
//!
//! Needs `redis-server` and `redis-tools`; the client-library test needs redis-py ≥ 5
//! (`PMNET_PYTHON`) and ioredis (`PMNET_NODE_PATH`), as tests/redis_clients.rs (scripts/test.sh
//! installs them).

mod redis_harness;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};

use pmnet_redis::resp::{command_bytes, SyncClient, Value};
use redis_harness::*;

/// `pmnet redis-up --start-redis DIR` on ports of the test's own.
struct RedisUp {
    child: Child,
    gateway: SocketAddr,
    redis: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for RedisUp {
    fn drop(&mut self) {
        // SIGTERM: redis-up stops what it started.
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child's pid with a valid signal.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let _ = self.child.wait();
    }
}

fn redis_up() -> RedisUp {
    require_redis();
    let dir = tempfile::tempdir().expect("temporary directory");
    let gateway = free_tcp_port();
    let log = dir.path().join("redis-up.out");
    let child = Command::new(BIN)
        .arg("redis-up")
        .arg("--start-redis")
        .arg(dir.path().join("redis"))
        .args(["--listen", &format!("127.0.0.1:{gateway}")])
        .args(["--device-listen", &format!("127.0.0.1:{}", free_udp_port())])
        .args([
            "--adaptor-listen",
            &format!("127.0.0.1:{}", free_udp_port()),
        ])
        .arg("--log-file")
        .arg(dir.path().join("device.log"))
        .stdout(std::fs::File::create(&log).expect("log file"))
        .stderr(Stdio::null())
        .spawn()
        .expect("start pmnet redis-up");
    // Stopped when dropped, whatever happens below.
    let mut up = RedisUp {
        child,
        gateway: SocketAddr::from(([127, 0, 0, 1], gateway)),
        redis: SocketAddr::from(([127, 0, 0, 1], 0)),
        _dir: dir,
    };
    // The gateway's banner says it has --redis (redis-up passes it).
    poll_until(
        "redis-up says where clients connect, and the gateway goes direct",
        || {
            std::fs::read_to_string(&log).is_ok_and(|text| {
                text.contains("clients connect to") && text.contains("[gateway]   direct: blocking")
            })
        },
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let redis_port: u16 = text
        .split("Redis at 127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|port| port.parse().ok())
        .unwrap_or_else(|| panic!("redis-up names its Redis:\n{text}"));
    up.redis = SocketAddr::from(([127, 0, 0, 1], redis_port));
    up
}

impl RedisUp {
    fn client(&self) -> SyncClient {
        SyncClient::connect(self.gateway, PATIENCE).expect("connect to the gateway")
    }

    fn raw(&self) -> Raw {
        let stream = TcpStream::connect(self.gateway).expect("connect to the gateway");
        stream.set_read_timeout(Some(PATIENCE)).expect("timeout");
        Raw {
            stream,
            seen: Vec::new(),
        }
    }

    /// Redis's own count of clients blocked in a command.
    fn blocked_clients(&self) -> i64 {
        let mut redis = SyncClient::connect(self.redis, PATIENCE).expect("connect to Redis");
        let info = redis.command(&["INFO", "clients"]).expect("INFO");
        let text = String::from_utf8_lossy(info.as_bytes().expect("INFO text")).into_owned();
        text.lines()
            .find_map(|line| line.strip_prefix("blocked_clients:"))
            .and_then(|count| count.trim().parse().ok())
            .expect("blocked_clients in INFO")
    }

    fn wait_blocked(&self, count: i64) {
        poll_until(&format!("{count} client(s) blocked at Redis"), || {
            self.blocked_clients() == count
        });
    }
}

/// A raw client connection: bytes out, bytes in, for RESP3 and for exact bytes.
struct Raw {
    stream: TcpStream,
    seen: Vec<u8>,
}

impl Raw {
    fn send(&mut self, args: &[&[u8]]) {
        self.stream
            .write_all(&command_bytes(args))
            .expect("send a command");
    }

    /// Read until what came since the last call ends with `wanted`; what came.
    fn until(&mut self, wanted: &[u8]) -> Vec<u8> {
        let mut chunk = [0u8; 65536];
        while !self.seen.ends_with(wanted) {
            let count = self.stream.read(&mut chunk).unwrap_or_else(|error| {
                panic!(
                    "waiting for {:?}, got {:?}: {error}",
                    String::from_utf8_lossy(wanted),
                    String::from_utf8_lossy(&self.seen)
                )
            });
            assert!(
                count > 0,
                "closed; got {:?}",
                String::from_utf8_lossy(&self.seen)
            );
            self.seen.extend_from_slice(&chunk[..count]);
        }
        std::mem::take(&mut self.seen)
    }
}

fn bulk_bytes(value: &Value) -> &[u8] {
    value
        .as_bytes()
        .unwrap_or_else(|| panic!("not a string: {value:?}"))
}

#[test]
fn subscribers_get_what_other_connections_publish() {
    let up = redis_up();
    let mut publisher = up.client();

    // RESP2, raw: SUBSCRIBE, a message, PSUBSCRIBE, UNSUBSCRIBE.
    let mut sub = up.raw();
    sub.send(&[b"SUBSCRIBE", b"news"]);
    sub.until(b"*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n");
    assert_eq!(
        publisher.command(&["PUBLISH", "news", "hello"]).unwrap(),
        Value::Integer(1)
    );
    sub.until(b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$5\r\nhello\r\n");
    sub.send(&[b"PSUBSCRIBE", b"ne*"]);
    sub.until(b"*3\r\n$10\r\npsubscribe\r\n$3\r\nne*\r\n:2\r\n");
    publisher.command(&["PUBLISH", "news", "again"]).unwrap();
    let both = sub.until(b"*4\r\n$8\r\npmessage\r\n$3\r\nne*\r\n$4\r\nnews\r\n$5\r\nagain\r\n");
    assert!(both.starts_with(b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$5\r\nagain\r\n"));
    // Redis's own answer to PING on a subscribed RESP2 connection.
    sub.send(&[b"PING"]);
    sub.until(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n");
    sub.send(&[b"UNSUBSCRIBE", b"news"]);
    sub.until(b"*3\r\n$11\r\nunsubscribe\r\n$4\r\nnews\r\n:1\r\n");
    assert_eq!(
        publisher.command(&["PUBLISH", "news", "x"]).unwrap(),
        Value::Integer(1),
        "the pattern subscription still counts"
    );

    // RESP3, raw: confirmations and messages are pushes.
    let mut sub3 = up.raw();
    sub3.send(&[b"HELLO", b"3"]);
    sub3.until(b"$7\r\nmodules\r\n*0\r\n");
    sub3.send(&[b"SUBSCRIBE", b"r3"]);
    sub3.until(b">3\r\n$9\r\nsubscribe\r\n$2\r\nr3\r\n:1\r\n");
    publisher.command(&["PUBLISH", "r3", "pushed"]).unwrap();
    sub3.until(b">3\r\n$7\r\nmessage\r\n$2\r\nr3\r\n$6\r\npushed\r\n");
    // A RESP3 subscriber may run any command; its reply comes between the pushes.
    sub3.send(&[b"ECHO", b"still here"]);
    sub3.until(b"$10\r\nstill here\r\n");
    // RESET: back to the PMNet path, RESP2, no subscriptions.
    sub3.send(&[b"RESET"]);
    sub3.until(b"+RESET\r\n");
    sub3.send(&[b"SET", b"after-reset", b"1"]);
    sub3.until(b"+OK\r\n");
    assert_eq!(
        publisher.command(&["PUBLISH", "r3", "nobody"]).unwrap(),
        Value::Integer(0)
    );

    // redis-cli subscribed in each protocol prints what it prints for Redis itself.
    for protocol in ["-2", "-3"] {
        let mut cli = Command::new("redis-cli")
            .args(["-p", &up.gateway.port().to_string(), protocol])
            .args(["subscribe", "cli"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("redis-cli");
        poll_until("redis-cli subscribed", || {
            up.client().command(&["PUBSUB", "NUMSUB", "cli"]).unwrap()
                == Value::Array(Some(vec![bulk("cli"), Value::Integer(1)]))
        });
        publisher.command(&["PUBLISH", "cli", "to-cli"]).unwrap();
        let mut out = cli.stdout.take().expect("stdout");
        let mut text = Vec::new();
        let mut chunk = [0u8; 4096];
        while !String::from_utf8_lossy(&text).contains("to-cli") {
            let count = out.read(&mut chunk).expect("redis-cli output");
            assert!(count > 0, "{}", String::from_utf8_lossy(&text));
            text.extend_from_slice(&chunk[..count]);
        }
        let _ = cli.kill();
        let _ = cli.wait();
        assert_eq!(
            String::from_utf8_lossy(&text),
            "subscribe\ncli\n1\nmessage\ncli\nto-cli\n",
            "redis-cli {protocol}"
        );
    }
}

#[test]
fn blocking_commands_run_after_the_connections_writes_and_are_woken_by_others() {
    let up = redis_up();
    let mut pusher = up.client();

    // BLPOP blocks at Redis until another connection pushes.
    let mut worker = up.raw();
    worker.send(&[b"BLPOP", b"jobs", b"0"]);
    up.wait_blocked(1);
    assert_eq!(
        pusher.command(&["RPUSH", "jobs", "job-1"]).unwrap(),
        Value::Integer(1)
    );
    worker.until(b"*2\r\n$4\r\njobs\r\n$5\r\njob-1\r\n");

    // Pipelined: SET k v and an RPUSH, then a BLMOVE and a BLPOP of the list just written:
    // both run after the writes are applied, and a third connection sees k once they answered.
    let mut client = up.client();
    let replies = client
        .pipeline(&[
            vec!["SET", "order:k", "v"],
            vec!["RPUSH", "order:l", "a", "b"],
            vec!["BLMOVE", "order:l", "order:m", "LEFT", "RIGHT", "0"],
            vec!["BLPOP", "order:l", "0"],
            vec!["GET", "order:k"],
        ])
        .unwrap();
    assert_eq!(
        replies,
        vec![
            Value::Simple(b"OK".to_vec()),
            Value::Integer(2),
            bulk("a"),
            Value::Array(Some(vec![bulk("order:l"), bulk("b")])),
            bulk("v"),
        ]
    );
    assert_eq!(up.client().command(&["GET", "order:k"]).unwrap(), bulk("v"));
    // An update (acked by the device, applied a moment later) right before a direct command
    // (an MGET with more keys than the adaptor's scripts take): the barrier makes Redis apply
    // it first, so the MGET sees it.
    for round in 0..20 {
        let key = format!("order:u{round}");
        let mut mget = vec!["MGET".to_owned(), key.clone()];
        mget.extend((0..4200).map(|i| format!("order:none{i}")));
        let mut replies = client
            .pipeline(&[vec!["SET".to_owned(), key, "u".to_owned()], mget])
            .unwrap();
        let Some(Value::Array(Some(values))) = replies.pop() else {
            panic!("MGET answered {replies:?}");
        };
        assert_eq!(values.len(), 4201);
        assert_eq!(
            values[0],
            bulk("u"),
            "round {round}: the SET before the MGET"
        );
    }
    assert_eq!(
        up.client()
            .command(&["LRANGE", "order:m", "0", "-1"])
            .unwrap(),
        Value::Array(Some(vec![bulk("a")]))
    );

    // The other blocking commands, each woken by another connection.
    let mut worker = up.client();
    let cases: [(&[&str], &[&str], Value); 4] = [
        (
            &["BRPOPLPUSH", "b:src", "b:dst", "0"],
            &["RPUSH", "b:src", "x"],
            bulk("x"),
        ),
        (
            &["BZPOPMIN", "b:z", "0"],
            &["ZADD", "b:z", "1.5", "m"],
            Value::Array(Some(vec![bulk("b:z"), bulk("m"), bulk("1.5")])),
        ),
        (
            &["BLMPOP", "0", "1", "b:mp", "LEFT"],
            &["RPUSH", "b:mp", "y"],
            Value::Array(Some(vec![
                bulk("b:mp"),
                Value::Array(Some(vec![bulk("y")])),
            ])),
        ),
        (
            &["BRPOP", "b:r", "0"],
            &["LPUSH", "b:r", "z"],
            Value::Array(Some(vec![bulk("b:r"), bulk("z")])),
        ),
    ];
    for (blocking, waking, expected) in cases {
        worker
            .send_raw(&command_bytes(blocking))
            .expect("send the blocking command");
        up.wait_blocked(1);
        pusher.command(waking).unwrap();
        assert_eq!(worker.read_value().unwrap(), expected, "{blocking:?}");
    }
    // XREAD BLOCK: woken by an XADD.
    worker
        .send_raw(&command_bytes(&[
            "XREAD", "BLOCK", "0", "STREAMS", "b:s", "$",
        ]))
        .unwrap();
    up.wait_blocked(1);
    let id = pusher.command(&["XADD", "b:s", "*", "f", "v"]).unwrap();
    let entry = Value::Array(Some(vec![
        id,
        Value::Array(Some(vec![bulk("f"), bulk("v")])),
    ]));
    assert_eq!(
        worker.read_value().unwrap(),
        Value::Array(Some(vec![Value::Array(Some(vec![
            bulk("b:s"),
            Value::Array(Some(vec![entry])),
        ]))]))
    );
    // A timeout answers nil, as Redis does; the connection goes on on the PMNet path.
    assert_eq!(
        worker.command(&["BLPOP", "b:never", "0.05"]).unwrap(),
        Value::Array(None)
    );
    assert_eq!(worker.command(&["INCR", "b:n"]).unwrap(), Value::Integer(1));

    // WAIT with no replicas: Redis's `:0`. WAITAOF (Redis 7.2): the local fsync is done; a
    // Redis before 7.2 answers its own unknown-command error.
    assert_eq!(
        worker.command(&["WAIT", "0", "0"]).unwrap(),
        Value::Integer(0)
    );
    let waitaof = worker.command(&["WAITAOF", "1", "0", "0"]).unwrap();
    assert!(
        waitaof == Value::Array(Some(vec![Value::Integer(1), Value::Integer(0)]))
            || matches!(&waitaof, Value::Error(m) if m.starts_with(b"ERR unknown command 'WAITAOF'")),
        "{waitaof:?}"
    );
}

#[test]
fn tracking_gets_invalidations_and_monitor_sees_commands() {
    let up = redis_up();
    let mut writer = up.client();
    // Written with a reply from Redis (APPEND's length): applied before the tracker reads it.
    assert_eq!(
        writer.command(&["APPEND", "t:k", "old"]).unwrap(),
        Value::Integer(3)
    );

    let mut tracker = up.raw();
    tracker.send(&[b"HELLO", b"3"]);
    tracker.until(b"$7\r\nmodules\r\n*0\r\n");
    tracker.send(&[b"CLIENT", b"TRACKING", b"ON"]);
    tracker.until(b"+OK\r\n");
    tracker.send(&[b"GET", b"t:k"]);
    tracker.until(b"$3\r\nold\r\n");
    tracker.send(&[b"CLIENT", b"TRACKINGINFO"]);
    let info = tracker.until(b"*0\r\n");
    assert!(
        String::from_utf8_lossy(&info).contains("on"),
        "{}",
        String::from_utf8_lossy(&info)
    );
    writer.command(&["SET", "t:k", "new"]).unwrap();
    tracker.until(b">2\r\n$10\r\ninvalidate\r\n*1\r\n$3\r\nt:k\r\n");

    let mut monitor = up.raw();
    monitor.send(&[b"MONITOR"]);
    monitor.until(b"+OK\r\n");
    writer
        .command(&["SET", "m:key", "seen-by-monitor"])
        .unwrap();
    let mut lines = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&lines).contains("\"seen-by-monitor\"") {
        let count = monitor.stream.read(&mut chunk).expect("monitor lines");
        assert!(count > 0);
        lines.extend_from_slice(&chunk[..count]);
    }
    let text = String::from_utf8_lossy(&lines);
    assert!(
        text.lines()
            .any(|line| line.starts_with('+') && line.contains("\"m:key\" \"seen-by-monitor\"")),
        "{text}"
    );
}

#[test]
fn requests_larger_than_pmnet_carries_get_redis_replies() {
    let up = redis_up();
    let mut client = up.client();
    let seed = seed("requests_larger_than_pmnet_carries_get_redis_replies");
    let value: Vec<u8> = {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..20 << 20).map(|_| rng.random()).collect()
    };
    assert_eq!(
        client
            .command(&[b"SET".as_slice(), b"big", &value])
            .unwrap(),
        Value::Simple(b"OK".to_vec())
    );
    let back = client.command(&["GET", "big"]).unwrap();
    assert!(bulk_bytes(&back) == value.as_slice(), "20 MB round trip");
    assert_eq!(
        client.command(&["STRLEN", "big"]).unwrap(),
        Value::Integer(20 << 20)
    );

    let mut push: Vec<Vec<u8>> = vec![b"RPUSH".to_vec(), b"biglist".to_vec()];
    push.extend((0..200_000).map(|i: u32| i.to_string().into_bytes()));
    assert_eq!(client.command(&push).unwrap(), Value::Integer(200_000));
    assert_eq!(
        client.command(&["LLEN", "biglist"]).unwrap(),
        Value::Integer(200_000)
    );
    assert_eq!(
        client.command(&["LINDEX", "biglist", "199999"]).unwrap(),
        bulk("199999")
    );

    // A transaction of reads whose reply is too large for one PMNet reply (as RQ's
    // `Job.fetch_many` of many jobs is) is run again, whole, on the direct connection: the
    // client gets Redis's reply.
    assert_eq!(
        client.command(&["MULTI"]).unwrap(),
        Value::Simple(b"OK".to_vec())
    );
    client.command(&["GET", "big"]).unwrap();
    client.command(&["LLEN", "biglist"]).unwrap();
    match client.command(&["EXEC"]).unwrap() {
        Value::Array(Some(items)) => {
            assert_eq!(items.len(), 2);
            assert!(bulk_bytes(&items[0]) == value.as_slice(), "the 20 MB value");
            assert_eq!(items[1], Value::Integer(200_000));
        }
        other => panic!("EXEC of reads: {other:?}"),
    }

    // A transaction too large for one PMNet request runs whole on the direct connection,
    // watched keys checked; one whose watched key changed runs nothing.
    let big = vec![b'y'; 2 << 20];
    assert_eq!(
        client.command(&["WATCH", "tx:w"]).unwrap(),
        Value::Simple(b"OK".to_vec())
    );
    client.command(&["MULTI"]).unwrap();
    client
        .command(&[b"SET".as_slice(), b"tx:big", &big])
        .unwrap();
    client.command(&["INCR", "tx:n"]).unwrap();
    assert_eq!(
        client.command(&["EXEC"]).unwrap(),
        Value::Array(Some(vec![Value::Simple(b"OK".to_vec()), Value::Integer(1)]))
    );
    client.command(&["WATCH", "tx:w"]).unwrap();
    // A write answered by Redis (APPEND's count): applied before the transaction runs.
    up.client().command(&["APPEND", "tx:w", "changed"]).unwrap();
    client.command(&["MULTI"]).unwrap();
    client
        .command(&[b"SET".as_slice(), b"tx:big", b"small"])
        .unwrap();
    client
        .command(&[b"APPEND".as_slice(), b"tx:n2", &big])
        .unwrap();
    assert_eq!(client.command(&["EXEC"]).unwrap(), Value::Array(None));
    assert_eq!(
        client.command(&["STRLEN", "tx:big"]).unwrap(),
        Value::Integer(2 << 20)
    );

    // A command over the gateway's bound gets Redis's protocol error.
    let mut raw = up.raw();
    raw.stream
        .write_all(b"*2\r\n$3\r\nGET\r\n$9999999999\r\n")
        .unwrap();
    raw.until(b"-ERR Protocol error: invalid bulk length\r\n");
}

#[test]
fn client_libraries_subscribe_and_block_through_the_gateway() {
    let up = redis_up();
    let python = std::env::var("PMNET_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/pubsub_py.py");
    for protocol in ["2", "3"] {
        let output = Command::new(&python)
            .arg(script)
            .arg(up.gateway.port().to_string())
            .arg(protocol)
            .output()
            .expect("run python3 (PMNET_PYTHON) with redis-py");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.trim_end().ends_with("ok"),
            "redis-py (protocol {protocol}):\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let mut node = Command::new("node");
    node.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/clients/pubsub_ioredis.js"
    ))
    .arg(up.gateway.port().to_string());
    if let Ok(path) = std::env::var("PMNET_NODE_PATH") {
        node.env("NODE_PATH", path);
    }
    let output = node
        .output()
        .expect("run node with ioredis (PMNET_NODE_PATH)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "ioredis:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_gateway_without_redis_refuses_direct_commands_saying_why() {
    let system = System::start(false);
    let mut client = system.gateway_client();
    for command in [
        &["BLPOP", "l", "0"][..],
        &["SUBSCRIBE", "c"],
        &["MONITOR"],
        &["WAIT", "0", "0"],
        &["CLIENT", "TRACKING", "ON"],
    ] {
        match client.command(command).unwrap() {
            Value::Error(message) => assert!(
                String::from_utf8_lossy(&message).contains("--redis"),
                "{command:?}: {}",
                String::from_utf8_lossy(&message)
            ),
            other => panic!("{command:?} answered {other:?}"),
        }
    }
    let mut push: Vec<Vec<u8>> = vec![b"RPUSH".to_vec(), b"l".to_vec()];
    push.extend((0..5000).map(|i: u32| i.to_string().into_bytes()));
    assert!(
        matches!(client.command(&push).unwrap(), Value::Error(m) if m.windows(7).any(|w| w == b"--redis")),
        "too many arguments for the adaptor, and no --redis"
    );
    // The connection is in step.
    assert_eq!(
        client.command(&["PING"]).unwrap(),
        Value::Simple(b"PONG".to_vec())
    );
}

/// With the device's read cache: a direct write (a transaction run direct, a write on a
/// tracking connection) is followed by a barrier that drops the cached value, so the cache
/// never keeps serving the value from before it.
#[test]
fn direct_writes_drop_what_the_device_caches() {
    let mut system = System::start_full(
        &[
            "--cache",
            "--cache-hot-threshold",
            "1",
            "--cache-interval-ms",
            "1",
            "--cache-fetch-warmup-ms",
            "0",
            "--metrics",
            "127.0.0.1:0",
        ],
        &["--device-cache"],
        false,
    );
    // The gateway again, with --redis (the harness's Redis is known once it started).
    let redis = system.redis.addr().to_string();
    let args: Vec<String> = [
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--device",
        &system.device_addr().to_string(),
        "--device-cache",
        "--redis",
        &redis,
        "--report-interval",
        "0",
    ]
    .map(str::to_owned)
    .to_vec();
    system.gateway = None;
    system.gateway = Some(Proc::spawn(&args, &system.dir.path().join("gateway2.log")));
    let hits = |system: &System| {
        let addr = system
            .device
            .as_ref()
            .and_then(|d| d.metrics)
            .expect("metrics");
        let text = pmnet_runtime::metrics::scrape(addr, std::time::Duration::from_secs(5))
            .expect("scrape");
        pmnet_runtime::metrics::find_sample(&text, "pmnet_cache_hits_total", "").unwrap_or(0.0)
    };
    let read_until_cached = |client: &mut SyncClient, expected: &Value| {
        let before = hits(&system);
        poll_until("the device answers GET c:k from its cache", || {
            assert_eq!(&client.command(&["GET", "c:k"]).unwrap(), expected);
            hits(&system) > before
        });
    };
    let mut writer = system.gateway_client();
    let mut reader = system.gateway_client();
    writer.command(&["SET", "c:k", "v1"]).unwrap();
    read_until_cached(&mut reader, &bulk("v1"));

    // A reply from Redis: the writer's SET is applied, so no barrier is needed before its
    // next direct command — the one after it is what drops the cache.
    assert_eq!(writer.command(&["INCR", "c:n"]).unwrap(), Value::Integer(1));
    // A transaction with a BLPOP (non-blocking inside MULTI) runs direct.
    writer.command(&["MULTI"]).unwrap();
    writer.command(&["SET", "c:k", "v2"]).unwrap();
    writer.command(&["BLPOP", "c:none", "0"]).unwrap();
    assert_eq!(
        writer.command(&["EXEC"]).unwrap(),
        Value::Array(Some(vec![
            Value::Simple(b"OK".to_vec()),
            Value::Array(None)
        ]))
    );
    // The writer's own next read follows the barrier; another connection's, once it passed.
    assert_eq!(writer.command(&["GET", "c:k"]).unwrap(), bulk("v2"));
    poll_until("the other connection reads v2", || {
        reader.command(&["GET", "c:k"]).unwrap() == bulk("v2")
    });
    read_until_cached(&mut reader, &bulk("v2"));

    // A write on a RESP3 tracking connection (sticky direct): the same.
    let mut tracker = Raw {
        stream: TcpStream::connect(system.gateway.as_ref().unwrap().addr).unwrap(),
        seen: Vec::new(),
    };
    tracker.stream.set_read_timeout(Some(PATIENCE)).unwrap();
    tracker.send(&[b"HELLO", b"3"]);
    tracker.until(b"$7\r\nmodules\r\n*0\r\n");
    tracker.send(&[b"CLIENT", b"TRACKING", b"ON"]);
    tracker.until(b"+OK\r\n");
    tracker.send(&[b"SET", b"c:k", b"v3"]);
    tracker.until(b"+OK\r\n");
    poll_until("the other connection reads v3", || {
        reader.command(&["GET", "c:k"]).unwrap() == bulk("v3")
    });
    // It stays: nothing cached from before the write comes back.
    read_until_cached(&mut reader, &bulk("v3"));
}
