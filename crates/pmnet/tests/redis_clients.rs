//! Unmodified Redis clients against `pmnet gateway`, started as docs/redis.md tells a user:
//! redis-py with its defaults (RESP3 handshake, transactions as its default pipeline, WATCH,
//! scripts, its Lock) and with each protocol version, a walk over Redis's whole command table,
//! and the gateway's own password.
//!
//! Needs `redis-server` and `redis-tools` (Debian), Node.js with ioredis, and Python 3 with
//! redis-py ≥ 5
//! (`pip install redis`, or `PMNET_PYTHON` naming a Python that has it); scripts/test.sh
//! installs them.

mod redis_harness;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::process::Command;

use pmnet_redis::resp::{SyncClient, Value};
use redis_harness::*;

const REDIS_PY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/redis_py.py");
const IOREDIS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/ioredis.js");

/// The `node_modules` holding ioredis: `PMNET_NODE_PATH` (scripts/test.sh installs it under
/// target/), else Node's own search.
fn node_path() -> Option<String> {
    std::env::var("PMNET_NODE_PATH").ok()
}

/// The Python with redis-py: `PMNET_PYTHON` (scripts/test.sh sets it when it installs
/// redis-py in a virtual environment), else `python3`.
fn python() -> String {
    std::env::var("PMNET_PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

fn require_redis_py() {
    let found = Command::new(python())
        .args(["-c", "import redis"])
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        found,
        "Python 3 with redis-py is needed: `pip install redis` (scripts/test.sh does)"
    );
}

#[test]
fn redis_py_works_with_its_defaults_and_with_each_protocol() {
    require_redis_py();
    let system = System::start(false);
    for protocol in ["default", "2", "3"] {
        let output = Command::new(python())
            .arg(REDIS_PY)
            .arg(system.gateway_port().to_string())
            .arg(protocol)
            .output()
            .expect("run python3");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && stdout.trim_end().ends_with("ok"),
            "redis-py (protocol {protocol}) failed:\n{stdout}\n{stderr}"
        );
        eprintln!(
            "redis-py (protocol {protocol}): {} checks passed",
            stdout.lines().count() - 1
        );
    }
}

#[test]
fn ioredis_works_unmodified() {
    let mut probe = Command::new("node");
    probe.args(["-e", "require('ioredis')"]);
    if let Some(path) = node_path() {
        probe.env("NODE_PATH", path);
    }
    assert!(
        probe.status().is_ok_and(|status| status.success()),
        "Node.js with ioredis is needed: `npm install ioredis` and PMNET_NODE_PATH=its \
         node_modules (scripts/test.sh does)"
    );
    let system = System::start(false);
    let mut command = Command::new("node");
    command.arg(IOREDIS).arg(system.gateway_port().to_string());
    if let Some(path) = node_path() {
        command.env("NODE_PATH", path);
    }
    let output = command.output().expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.trim_end().ends_with("ok"),
        "ioredis failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("ioredis: {} checks passed", stdout.lines().count() - 1);
}

/// A command's words: its name (and subcommand), then placeholder arguments up to its arity.
fn placeholder_command(name: &str, arity: i64) -> Vec<Vec<u8>> {
    let mut words: Vec<Vec<u8>> = name.split('|').map(|w| w.as_bytes().to_vec()).collect();
    let wanted = arity.unsigned_abs() as usize;
    while words.len() < wanted {
        words.push(b"walk".to_vec());
    }
    words
}

/// Every command Redis lists (each subcommand of a container), with its arity.
fn redis_commands(redis: &mut SyncClient) -> Vec<(String, i64)> {
    let Value::Array(Some(entries)) = redis.command(&["COMMAND"]).expect("COMMAND") else {
        panic!("COMMAND did not answer a list");
    };
    let mut commands = Vec::new();
    let add = |entry: &Value, commands: &mut Vec<(String, i64)>| {
        let Value::Array(Some(fields)) = entry else {
            return;
        };
        let (Some(name), Some(Value::Integer(arity))) =
            (fields.first().and_then(Value::as_bytes), fields.get(1))
        else {
            return;
        };
        commands.push((String::from_utf8_lossy(name).to_lowercase(), *arity));
    };
    for entry in &entries {
        // A container (`ACL`, `CONFIG`, …) is sent with one of its subcommands.
        match entry {
            Value::Array(Some(fields)) if matches!(fields.get(9), Some(Value::Array(Some(subs))) if !subs.is_empty()) => {
                if let Some(Value::Array(Some(subs))) = fields.get(9) {
                    for sub in subs {
                        add(sub, &mut commands);
                    }
                }
            }
            _ => add(entry, &mut commands),
        }
    }
    commands.sort();
    commands
}

#[test]
fn every_command_of_redis_is_served_or_refused_precisely() {
    let system = System::start(false);
    let commands = redis_commands(&mut system.redis.client());
    assert!(commands.len() > 200, "{} commands", commands.len());
    let mut gateway = system.gateway_client();
    let mut refused = BTreeSet::new();
    let mut served = 0;
    for (name, arity) in &commands {
        if name == "quit" || name == "shutdown" {
            // QUIT closes the connection (tested elsewhere); SHUTDOWN is refused below.
            continue;
        }
        let words = placeholder_command(name, *arity);
        let reply = gateway
            .command(&words)
            .unwrap_or_else(|error| panic!("{name}: the connection broke: {error}"));
        if let Value::Error(message) = &reply {
            let message = String::from_utf8_lossy(message).into_owned();
            assert!(
                !message.contains("unknown command") && !message.contains("unknown subcommand"),
                "{name}: Redis has it but the gateway answered {message:?}"
            );
            if message.contains("pmnet") {
                refused.insert(name.clone());
            }
        } else {
            served += 1;
        }
        if name == "multi" {
            assert_eq!(
                gateway.command(&["DISCARD"]).expect("DISCARD"),
                Value::Simple(b"OK".to_vec())
            );
        }
        if name == "hello" || name == "reset" {
            // Back to RESP2 for this client.
            gateway.command(&["HELLO", "2"]).expect("HELLO 2");
        }
        // The connection is in step: the next command gets its own reply.
        assert_eq!(
            gateway.command(&["ECHO", name]).expect("ECHO"),
            Value::Bulk(Some(name.as_bytes().to_vec())),
            "{name} left the connection out of step"
        );
    }
    let shutdown = gateway.command(&["SHUTDOWN"]).expect("SHUTDOWN");
    assert!(
        matches!(&shutdown, Value::Error(m) if m.starts_with(b"ERR SHUTDOWN is an administrative")),
        "{shutdown:?}"
    );
    eprintln!(
        "{} commands walked: {served} served (a reply, or Redis's own error for placeholder \
         arguments), {} refused by pmnet: {refused:?}",
        commands.len(),
        refused.len()
    );
    // The refusals are the documented ones, and nothing everyday is among them.
    for everyday in [
        "zrevrange",
        "zpopmin",
        "sinter",
        "smove",
        "lpos",
        "lmove",
        "getex",
        "setbit",
        "pfadd",
        "xadd",
        "geoadd",
        "publish",
        "time",
        "eval",
        "evalsha",
        "script|load",
        "fcall",
        "fcall_ro",
        "function|load",
        "copy",
    ] {
        assert!(!refused.contains(everyday), "{everyday} was refused");
    }
    for unsupported in ["blpop", "subscribe", "monitor", "wait", "config|set"] {
        assert!(
            refused.contains(unsupported),
            "{unsupported} was not refused"
        );
    }
}

#[test]
fn the_gateway_asks_for_its_password() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let file = dir.path().join("password");
    std::fs::write(&file, "s3cret\n").expect("write the password file");
    let system = System::start_gateway_with(&["--password-file", file.to_str().unwrap()], false);
    let mut client = system.gateway_client();
    let error = |value: Value| match value {
        Value::Error(message) => String::from_utf8_lossy(&message).into_owned(),
        other => panic!("expected an error, got {other:?}"),
    };
    assert!(error(client.command(&["GET", "k"]).unwrap()).starts_with("NOAUTH"));
    assert!(error(client.command(&["AUTH", "wrong"]).unwrap()).starts_with("WRONGPASS"));
    assert_eq!(
        client.command(&["AUTH", "s3cret"]).unwrap(),
        Value::Simple(b"OK".to_vec())
    );
    assert_eq!(
        client.command(&["SET", "k", "v"]).unwrap(),
        Value::Simple(b"OK".to_vec())
    );
    assert_eq!(
        client.command(&["GET", "k"]).unwrap(),
        Value::Bulk(Some(b"v".to_vec()))
    );
    // HELLO with AUTH on a fresh connection, in RESP3: a map, whose last field is `modules`.
    let mut fresh =
        std::net::TcpStream::connect(system.gateway.as_ref().unwrap().addr).expect("connect");
    fresh
        .set_read_timeout(Some(PATIENCE))
        .expect("read timeout");
    fresh
        .write_all(
            b"*5\r\n$5\r\nHELLO\r\n$1\r\n3\r\n$4\r\nAUTH\r\n$7\r\ndefault\r\n$6\r\ns3cret\r\n",
        )
        .expect("send HELLO");
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    while !reply.ends_with(b"$7\r\nmodules\r\n*0\r\n") {
        let count = fresh.read(&mut chunk).expect("read the HELLO reply");
        assert!(count > 0, "closed: {}", String::from_utf8_lossy(&reply));
        reply.extend_from_slice(&chunk[..count]);
    }
    assert!(
        reply.starts_with(b"%7\r\n"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
}

/// Run `redis-cli ARGS` against `port`; its standard output.
fn redis_cli(port: u16, args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    assert!(output.status.success(), "redis-cli {args:?} failed");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn redis_cli_in_resp3_prints_what_it_prints_for_redis_itself() {
    require_redis();
    let system = System::start(false);
    let port = system.gateway_port();
    redis_cli(port, &["hset", "r3:h", "f", "v", "g", "w"]);
    redis_cli(port, &["sadd", "r3:s", "7", "8"]);
    redis_cli(port, &["zadd", "r3:z", "1.5", "m", "2", "n"]);
    // redis-cli prints each RESP3 type its own way (maps as `key => value`, doubles as
    // `(double)`): through the gateway as when it talks to Redis directly.
    for command in [
        &["hgetall", "r3:h"][..],
        &["smembers", "r3:s"],
        &["zscore", "r3:z", "m"],
        &["zrange", "r3:z", "0", "-1", "withscores"],
        &["get", "r3:missing"],
        &["mget", "r3:missing", "r3:h"],
        &["hgetall", "r3:missing"],
    ] {
        for protocol in ["-2", "-3"] {
            let mut args = vec![protocol, "--no-raw"];
            args.extend_from_slice(command);
            let through = redis_cli(port, &args);
            assert_eq!(
                through,
                redis_cli(system.redis.port, &args),
                "redis-cli {args:?} through the gateway and against Redis"
            );
        }
    }
    let map = redis_cli(port, &["-3", "--no-raw", "hgetall", "r3:h"]);
    assert!(map.contains("=>"), "a map: {map}");
}

/// `pmnet redis-up --start-redis DIR`, as the README shows it (with ports of the test's own),
/// serves clients and stops everything it started when asked to.
#[test]
fn redis_up_starts_a_redis_behind_pmnet_and_stops_it_all() {
    require_redis();
    let RedisUp {
        mut child,
        gateway,
        redis_port,
        log,
        _dir,
        ..
    } = start_redis_up();
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(redis_cli(gateway, &["set", "greeting", "hello"]), "OK\n");
    // Another connection (each redis-cli is one) sees an acked SET once the adaptor applied
    // it, a moment later (docs/redis.md).
    poll_until("the SET is seen through the gateway", || {
        redis_cli(gateway, &["get", "greeting"]) == "hello\n"
    });
    assert_eq!(redis_cli(redis_port, &["get", "greeting"]), "hello\n");
    assert!(
        text.contains("medium:"),
        "the device says its medium:\n{text}"
    );

    // SIGTERM (as Ctrl-C or a service manager would stop it): everything it started stops.
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) with a pid of our own child and a valid signal number.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = child.wait().expect("wait for redis-up");
    assert!(status.success(), "redis-up stopped with {status}");
    let refused = |port: u16| std::net::TcpStream::connect(("127.0.0.1", port)).is_err();
    poll_until("the gateway and the redis-server are gone", || {
        refused(gateway) && refused(redis_port)
    });
    assert!(std::fs::read_to_string(&log)
        .unwrap()
        .contains("pmnet redis-up: stopped"));
}

/// A SIGKILLed `pmnet redis-up` (it cannot stop anything itself) leaves nothing running: its
/// device, adaptor, gateway and redis-server die with it.
#[test]
fn a_killed_redis_up_leaves_nothing_behind() {
    require_redis();
    let RedisUp {
        mut child,
        gateway,
        device,
        adaptor,
        redis_port,
        log: _,
        _dir,
    } = start_redis_up();
    assert_eq!(redis_cli(gateway, &["set", "greeting", "hello"]), "OK\n");

    child.kill().expect("SIGKILL redis-up");
    child.wait().expect("wait for redis-up");
    let refused = |port: u16| std::net::TcpStream::connect(("127.0.0.1", port)).is_err();
    // A port is free again once the process that had it is gone.
    let free = |port: u16| std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok();
    poll_until(
        "the gateway, the redis-server, the device and the adaptor are gone",
        || refused(gateway) && refused(redis_port) && free(device) && free(adaptor),
    );
}
