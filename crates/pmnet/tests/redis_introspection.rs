//! `INFO`, `CLIENT LIST`/`INFO`/`KILL` and `SLOWLOG` through `pmnet redis-up`, started as
//! docs/redis.md starts it: they describe the clients of the gateway and their commands, not
//! the adaptor's connections to Redis, its scripts or its session records — which Redis itself,
//! asked directly, does show (each test checks that too, so that it could not pass by accident).
//!
//! Needs `redis-server` and `redis-tools` (Debian) and Python 3 with redis-py ≥ 5 (`PMNET_PYTHON`)
//! and redis-py 5.0.8 (`PMNET_PYTHON_REDIS_5_0_8`); scripts/test.sh installs them.

mod redis_harness;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use pmnet_redis::resp::{SyncClient, Value};
use redis_harness::*;

/// `pmnet redis-up --start-redis DIR` on ports of the test's own; stopped when dropped.
struct RedisUp {
    child: Child,
    gateway: SocketAddr,
    redis: SocketAddr,
    /// Its server side is the module inside Redis (else the adaptor), as its banner says.
    module: bool,
    _dir: tempfile::TempDir,
}

impl RedisUp {
    fn start(extra: &[&str]) -> RedisUp {
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
            .args(extra)
            .stdout(std::fs::File::create(&log).expect("log file"))
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start pmnet redis-up");
        poll_until("redis-up says where clients connect", || {
            std::fs::read_to_string(&log).is_ok_and(|text| text.contains("clients connect to"))
        });
        let mut text = String::new();
        poll_until("redis-up names its server side", || {
            text = std::fs::read_to_string(&log).unwrap_or_default();
            text.contains("server side:")
        });
        let redis = text
            .split("Redis at ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|addr| addr.parse().ok())
            .unwrap_or_else(|| panic!("redis-up names its Redis:\n{text}"));
        RedisUp {
            child,
            gateway: SocketAddr::from(([127, 0, 0, 1], gateway)),
            redis,
            module: text.contains("server side: the PMNet module"),
            _dir: dir,
        }
    }

    fn runs_the_module(&self) -> bool {
        self.module
    }

    fn client(&self) -> SyncClient {
        let mut client = SyncClient::connect(self.gateway, PATIENCE).expect("connect");
        // Answered once the gateway has taken the connection in.
        assert_eq!(ping(&mut client), "PONG");
        client
    }

    /// Redis itself, not through the gateway.
    fn redis(&self) -> SyncClient {
        SyncClient::connect(self.redis, PATIENCE).expect("connect to redis")
    }
}

impl Drop for RedisUp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ping(client: &mut SyncClient) -> String {
    text(&client.command(&["PING"]).expect("PING"))
}

fn text(value: &Value) -> String {
    match value {
        Value::Simple(bytes) | Value::Bulk(Some(bytes)) | Value::Error(bytes) => {
            String::from_utf8_lossy(bytes).into_owned()
        }
        Value::Integer(number) => number.to_string(),
        other => panic!("not text: {other:?}"),
    }
}

fn command(client: &mut SyncClient, args: &[&str]) -> Value {
    client
        .command(args)
        .unwrap_or_else(|error| panic!("{args:?}: {error}"))
}

/// `INFO sections…` as `field → value`, and the text.
fn info(client: &mut SyncClient, sections: &[&str]) -> (BTreeMap<String, String>, String) {
    let mut args = vec!["INFO"];
    args.extend_from_slice(sections);
    let reply = text(&command(client, &args));
    let fields = reply
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
    (fields, reply)
}

fn connected_clients(client: &mut SyncClient) -> u64 {
    info(client, &["clients"]).0["connected_clients"]
        .parse()
        .expect("a number")
}

#[test]
fn info_clients_counts_the_connections_to_the_gateway() {
    let up = RedisUp::start(&[]);
    let mut first = up.client();
    let second = up.client();
    let _third = up.client();
    // The adaptor has its own pool of connections to Redis: Redis counts those.
    let mut redis = up.redis();
    let (redis_clients, _) = info(&mut redis, &["clients"]);
    assert_ne!(
        redis_clients["connected_clients"], "3",
        "Redis counts the adaptor's pool"
    );
    let (fields, text) = info(&mut first, &["clients"]);
    assert_eq!(fields["connected_clients"], "3", "{text}");
    assert_eq!(
        fields["maxclients"], "1024",
        "the gateway's --max-connections: {text}"
    );
    assert_eq!(fields["blocked_clients"], "0");
    assert!(text.starts_with("# Clients\r\n"), "{text:?}");
    drop(second);
    poll_until("connected_clients drops to 2", || {
        connected_clients(&mut first) == 2
    });
    // Every section form Redis 7 takes, in any case.
    for sections in [
        &[][..],
        &["default"],
        &["ALL"],
        &["everything"],
        &["Clients", "server"],
    ] {
        let (fields, text) = info(&mut first, sections);
        assert_eq!(
            fields["connected_clients"], "2",
            "INFO {sections:?}: {text}"
        );
        assert!(text.contains("redis_version:"), "INFO {sections:?}");
    }
    let (fields, _) = info(&mut first, &["stats"]);
    assert!(fields.contains_key("instantaneous_ops_per_sec"));
    let received: u64 = fields["total_connections_received"].parse().unwrap();
    assert_eq!(received, 3, "the gateway's connections, not Redis's");
}

#[test]
fn commandstats_count_the_clients_commands_and_the_keyspace_hides_the_records() {
    let up = RedisUp::start(&[]);
    let mut client = up.client();
    let mut others: Vec<SyncClient> = (0..3).map(|_| up.client()).collect();
    for index in 0..100 {
        let key = format!("key:{index}");
        assert_eq!(text(&command(&mut client, &["SET", &key, "v"])), "OK");
    }
    for index in 0..10 {
        let key = format!("key:{index}");
        assert_eq!(text(&command(&mut client, &["GET", &key])), "v");
    }
    // Writes from several connections: each leaves a session record in the records' database.
    for (which, other) in others.iter_mut().enumerate() {
        for index in 0..5 {
            let key = format!("other:{which}:{index}");
            assert_eq!(text(&command(other, &["SET", &key, "v"])), "OK");
        }
        assert_eq!(text(&command(other, &["GET", "key:1"])), "v");
    }
    let mut redis = up.redis();
    poll_until("Redis has applied every write", || {
        text(&command(&mut redis, &["DBSIZE"])) == "115"
    });

    let (_, stats) = info(&mut client, &["commandstats"]);
    let lines: Vec<&str> = stats.lines().collect();
    assert_eq!(lines[0], "# Commandstats", "{stats}");
    let line = |name: &str| {
        lines
            .iter()
            .find(|line| line.starts_with(&format!("cmdstat_{name}:")))
            .unwrap_or_else(|| panic!("no cmdstat_{name}:\n{stats}"))
            .to_owned()
    };
    assert!(
        line("set").starts_with("cmdstat_set:calls=115,usec="),
        "{stats}"
    );
    assert!(
        line("get").starts_with("cmdstat_get:calls=13,usec="),
        "{stats}"
    );
    assert!(line("ping").starts_with("cmdstat_ping:calls=4,"), "{stats}");
    assert!(
        line("get").ends_with(",rejected_calls=0,failed_calls=0"),
        "{stats}"
    );
    for plumbing in [
        "evalsha", "eval", "select", "hset", "hget", "script", "expire",
    ] {
        assert!(
            !stats.contains(&format!("cmdstat_{plumbing}:"))
                && !stats.contains(&format!("cmdstat_{plumbing}|")),
            "{plumbing} is the adaptor's:\n{stats}"
        );
    }
    // Redis's own stats are the server side's plumbing: the adaptor's script calls, or the
    // module's session records.
    let (_, redis_stats) = info(&mut redis, &["commandstats"]);
    let plumbing = if up.runs_the_module() {
        "cmdstat_hset:"
    } else {
        "cmdstat_evalsha:"
    };
    assert!(redis_stats.contains(plumbing), "{redis_stats}");

    // A command Redis refuses for its arity, and one that fails.
    assert!(text(&command(&mut client, &["GET"])).starts_with("ERR wrong number"));
    command(&mut client, &["LPUSH", "list", "x"]);
    assert!(text(&command(&mut client, &["INCR", "list"])).starts_with("WRONGTYPE"));
    let (_, stats) = info(&mut client, &["commandstats", "errorstats"]);
    assert!(
        stats.contains(",rejected_calls=1,failed_calls=0\r\n"),
        "{stats}"
    );
    assert!(
        stats.contains("cmdstat_incr:calls=1,") && stats.contains("failed_calls=1\r\n"),
        "{stats}"
    );
    assert!(stats.contains("errorstat_WRONGTYPE:count=1\r\n"), "{stats}");

    // The keyspace: the user's database with the user's keys; the records' database not shown.
    let (fields, keyspace) = info(&mut client, &["keyspace"]);
    assert_eq!(fields.len(), 1, "{keyspace}");
    assert!(
        fields["db0"].starts_with("keys=116,expires=0,"),
        "{keyspace}"
    );
    let (redis_keyspace, text) = info(&mut redis, &["keyspace"]);
    let records = redis_keyspace
        .iter()
        .find(|(db, _)| db.as_str() != "db0")
        .unwrap_or_else(|| panic!("Redis has the records' database: {text}"));
    assert!(records.1.starts_with("keys=4,"), "{text}");
}

#[test]
fn the_records_in_database_0_are_not_counted_in_its_keyspace() {
    require_redis();
    let dir = tempfile::tempdir().expect("temporary directory");
    let redis = Redis::start(dir.path());
    let device = SocketAddr::from(([127, 0, 0, 1], free_udp_port()));
    let adaptor = SocketAddr::from(([127, 0, 0, 1], free_udp_port()));
    let strings = |words: &[&str]| words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
    let _adaptor = Proc::spawn(
        &strings(&[
            "redis-adaptor",
            "--listen",
            &adaptor.to_string(),
            "--redis",
            &redis.addr().to_string(),
            "--device",
            &device.to_string(),
            "--record-db",
            "0",
        ]),
        &dir.path().join("adaptor.log"),
    );
    let _device = Proc::spawn(
        &strings(&[
            "device",
            "--listen",
            &device.to_string(),
            "--server",
            &format!("1={adaptor}"),
            "--log-file",
            &dir.path().join("device.log").display().to_string(),
            "--slots",
            "4096",
        ]),
        &dir.path().join("device.stderr"),
    );
    let gateway = Proc::spawn(
        &strings(&[
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--device",
            &device.to_string(),
        ]),
        &dir.path().join("gateway.log"),
    );
    let mut clients: Vec<SyncClient> = (0..2)
        .map(|_| SyncClient::connect(gateway.addr, PATIENCE).expect("connect"))
        .collect();
    for (which, client) in clients.iter_mut().enumerate() {
        for index in 0..3 {
            let key = format!("k:{which}:{index}");
            assert_eq!(text(&command(client, &["SET", &key, "v"])), "OK");
        }
    }
    let mut direct = redis.client();
    poll_until("Redis has the 6 keys and the 2 session records", || {
        text(&command(&mut direct, &["DBSIZE"])) == "8"
    });
    let (fields, text) = info(&mut clients[0], &["keyspace"]);
    assert_eq!(fields.len(), 1, "{text}");
    assert!(fields["db0"].starts_with("keys=6,expires=0,"), "{text}");
    let (fields, text) = info(&mut direct, &["keyspace"]);
    assert!(fields["db0"].starts_with("keys=8,expires=2,"), "{text}");
}

/// `CLIENT LIST`'s fields, in Redis 7.2's order.
const FIELDS: [&str; 30] = [
    "id",
    "addr",
    "laddr",
    "fd",
    "name",
    "age",
    "idle",
    "flags",
    "db",
    "sub",
    "psub",
    "ssub",
    "multi",
    "qbuf",
    "qbuf-free",
    "argv-mem",
    "multi-mem",
    "rbs",
    "rbp",
    "obl",
    "oll",
    "omem",
    "tot-mem",
    "events",
    "cmd",
    "user",
    "redir",
    "resp",
    "lib-name",
    "lib-ver",
];

/// One client's line as (field, value) pairs, checked to have Redis's fields in order.
fn fields_of(line: &str) -> BTreeMap<String, String> {
    let pairs: Vec<(&str, &str)> = line
        .split(' ')
        .map(|pair| pair.split_once('=').expect("field=value"))
        .collect();
    let names: Vec<&str> = pairs.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, FIELDS, "{line}");
    pairs
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

fn client_list(client: &mut SyncClient, filter: &[&str]) -> Vec<BTreeMap<String, String>> {
    let mut args = vec!["CLIENT", "LIST"];
    args.extend_from_slice(filter);
    text(&command(client, &args))
        .lines()
        .map(fields_of)
        .collect()
}

fn id_of(client: &mut SyncClient) -> String {
    text(&command(client, &["CLIENT", "ID"]))
}

#[test]
fn client_list_shows_every_connection_and_kill_closes_them() {
    let up = RedisUp::start(&[]);
    let mut asker = up.client();
    let mut reader = up.client();
    let mut writer = up.client();
    command(&mut reader, &["CLIENT", "SETNAME", "reader"]);
    command(&mut reader, &["GET", "k"]);
    command(&mut writer, &["CLIENT", "SETNAME", "writer"]);
    command(&mut writer, &["SET", "k", "v"]);
    command(&mut asker, &["CLIENT", "SETINFO", "LIB-NAME", "tests"]);
    let (asker_id, reader_id, writer_id) =
        (id_of(&mut asker), id_of(&mut reader), id_of(&mut writer));

    let list = client_list(&mut asker, &[]);
    assert_eq!(list.len(), 3, "{list:?}");
    let by_id = |id: &str| {
        list.iter()
            .find(|fields| fields["id"] == id)
            .unwrap_or_else(|| panic!("no client {id}: {list:?}"))
    };
    let (me, read, write) = (by_id(&asker_id), by_id(&reader_id), by_id(&writer_id));
    assert_eq!(read["name"], "reader");
    assert_eq!(read["cmd"], "client|id");
    assert_eq!(write["name"], "writer");
    assert_eq!(me["cmd"], "client|list");
    assert_eq!(me["lib-name"], "tests");
    for fields in [me, read, write] {
        assert_eq!(fields["db"], "0");
        assert_eq!(fields["flags"], "N");
        assert_eq!(fields["multi"], "-1");
        assert_eq!(fields["user"], "default");
        assert_eq!(fields["laddr"], up.gateway.to_string());
    }
    // Redis's clients are not the gateway's: the adaptor's connections, or (the module inside
    // Redis) none but this one.
    let mut redis = up.redis();
    let redis_list = text(&command(&mut redis, &["CLIENT", "LIST"]));
    assert!(
        !redis_list.contains("name=reader") && !redis_list.contains("name=writer"),
        "{redis_list}"
    );
    if !up.runs_the_module() {
        assert!(redis_list.lines().count() > 3, "{redis_list}");
    }

    // Filters.
    let chosen = client_list(&mut asker, &["ID", &writer_id, &reader_id]);
    let ids: Vec<&str> = chosen.iter().map(|fields| fields["id"].as_str()).collect();
    assert_eq!(ids, [writer_id.as_str(), reader_id.as_str()]);
    assert_eq!(client_list(&mut asker, &["TYPE", "normal"]).len(), 3);
    assert!(client_list(&mut asker, &["TYPE", "pubsub"]).is_empty());
    let error = text(&command(&mut asker, &["CLIENT", "LIST", "TYPE", "nope"]));
    assert_eq!(error, "ERR Unknown client type 'nope'");
    let error = text(&command(&mut asker, &["CLIENT", "LIST", "ID", "x"]));
    assert_eq!(error, "ERR Invalid client ID");

    // CLIENT INFO: this connection's line, newline-terminated.
    let info = text(&command(&mut reader, &["CLIENT", "INFO"]));
    assert!(
        info.ends_with('\n') && info.lines().count() == 1,
        "{info:?}"
    );
    let fields = fields_of(info.trim_end());
    assert_eq!(fields["id"], reader_id);
    assert_eq!(fields["cmd"], "client|info");

    // CLIENT KILL by ID: the connection closes, and is no longer counted.
    assert_eq!(
        command(&mut asker, &["CLIENT", "KILL", "ID", &reader_id]),
        Value::Integer(1)
    );
    assert_closed(&mut reader);
    assert_eq!(client_list(&mut asker, &[]).len(), 2);
    assert_eq!(connected_clients(&mut asker), 2);
    // The old form, by address; an address no client has.
    let writer_addr = by_id(&writer_id)["addr"].clone();
    assert_eq!(
        text(&command(&mut asker, &["CLIENT", "KILL", "127.0.0.1:1"])),
        "ERR No such client"
    );
    assert_eq!(
        text(&command(&mut asker, &["CLIENT", "KILL", &writer_addr])),
        "OK"
    );
    assert_closed(&mut writer);
    // SKIPME (yes by default) spares the asking connection; SKIPME no does not, after its reply.
    assert_eq!(
        command(&mut asker, &["CLIENT", "KILL", "USER", "default"]),
        Value::Integer(0)
    );
    assert_eq!(
        text(&command(&mut asker, &["CLIENT", "KILL", "USER", "nobody"])),
        "ERR No such user 'nobody'"
    );
    assert_eq!(
        command(
            &mut asker,
            &["CLIENT", "KILL", "ID", &asker_id, "SKIPME", "no"]
        ),
        Value::Integer(1)
    );
    assert_closed(&mut asker);
}

/// The gateway closed this connection: a command gets no reply.
fn assert_closed(client: &mut SyncClient) {
    let gone = client.command(&["PING"]);
    assert!(gone.is_err(), "the connection is still open: {gone:?}");
}

/// A script that runs at least `ms` milliseconds (shorter than the 128 bytes of an argument
/// the slow log shows whole).
fn busy_script(ms: u32) -> String {
    let script = format!(
        "local s=redis.call('TIME') local n repeat n=redis.call('TIME') \
         until (n[1]-s[1])*1e6+n[2]-s[2]>={} return 1",
        ms * 1000
    );
    assert!(script.len() <= 128, "{script}");
    script
}

#[test]
fn slowlog_shows_the_clients_slow_commands_not_the_adaptors_scripts() {
    let up = RedisUp::start(&[]);
    let mut client = up.client();
    command(&mut client, &["CLIENT", "SETNAME", "slow-one"]);
    // Any command may be slow on a busy host (the first ones after start-up often are): start
    // from an empty log.
    assert_eq!(text(&command(&mut client, &["SLOWLOG", "RESET"])), "OK");
    for index in 0..20 {
        command(&mut client, &["SET", &format!("fast:{index}"), "v"]);
    }
    let script = busy_script(20);
    assert_eq!(
        command(&mut client, &["EVAL", &script, "0"]),
        Value::Integer(1)
    );
    let Value::Array(Some(entries)) = command(&mut client, &["SLOWLOG", "GET"]) else {
        panic!("SLOWLOG GET answers an array");
    };
    let entries: Vec<Vec<Value>> = entries
        .into_iter()
        .map(|entry| match entry {
            Value::Array(Some(fields)) => fields,
            other => panic!("an entry is an array: {other:?}"),
        })
        .collect();
    for entry in &entries {
        let command = String::from_utf8_lossy(&entry[3].to_bytes()).into_owned();
        assert!(
            !command.contains("EVALSHA") && !command.contains("pmnet"),
            "the adaptor's plumbing: {command}"
        );
    }
    // (a SET may be slow too on a busy host: the script is the one that must be there)
    let entry = entries
        .iter()
        .find(|entry| matches!(&entry[3], Value::Array(Some(argv)) if argv[0] == bulk("EVAL")))
        .unwrap_or_else(|| panic!("the script is in the slow log: {entries:?}"));
    assert_eq!(entry.len(), 6, "{entry:?}");
    let Value::Integer(micros) = entry[2] else {
        panic!("{entry:?}")
    };
    assert!(micros >= 20_000, "{entry:?}");
    assert_eq!(
        entry[3],
        Value::Array(Some(vec![bulk("EVAL"), bulk(&script), bulk("0")])),
        "the client's own command, not the adaptor's wrapper"
    );
    let addr = text(&command(&mut client, &["CLIENT", "INFO"]));
    let addr = fields_of(addr.trim_end())["addr"].clone();
    assert_eq!(text(&entry[4]), addr);
    assert_eq!(text(&entry[5]), "slow-one");
    assert_eq!(
        command(&mut client, &["SLOWLOG", "LEN"]),
        Value::Integer(entries.len() as i64)
    );
    // Redis's own slow log has the adaptor's wrapper around the script instead.
    let mut redis = up.redis();
    let redis_log = command(&mut redis, &["SLOWLOG", "GET"]).to_bytes();
    let redis_log = String::from_utf8_lossy(&redis_log);
    assert!(
        !redis_log.contains("slow-one")
            && (up.runs_the_module() || redis_log.contains("pmnet:session:")),
        "Redis's slow log shows the adaptor's call (or, with the module, not the client's): \
         {redis_log}"
    );
    assert_eq!(text(&command(&mut client, &["SLOWLOG", "RESET"])), "OK");
    // Empty, but for the RESET itself if it was slow (a command is logged once it ran).
    let Value::Integer(left) = command(&mut client, &["SLOWLOG", "LEN"]) else {
        panic!("SLOWLOG LEN answers an integer")
    };
    assert!(left <= 1, "{left} entries after SLOWLOG RESET");
}

#[test]
fn the_slowlog_threshold_is_the_gateways_option() {
    require_redis();
    let system = System::start_gateway_with(&["--slowlog-log-slower-than", "0"], false);
    let mut client = system.gateway_client();
    for index in 0..5 {
        command(&mut client, &["SET", &format!("k{index}"), "v"]);
    }
    let long = "x".repeat(200);
    command(&mut client, &["SET", "long", &long]);
    let Value::Array(Some(entries)) = command(&mut client, &["SLOWLOG", "GET", "-1"]) else {
        panic!("SLOWLOG GET answers an array");
    };
    assert_eq!(entries.len(), 6, "every command with a threshold of 0");
    let Value::Array(Some(newest)) = &entries[0] else {
        panic!("{entries:?}")
    };
    let trimmed = format!("{}... (72 more bytes)", "x".repeat(128));
    assert_eq!(
        newest[3],
        Value::Array(Some(vec![bulk("SET"), bulk("long"), bulk(&trimmed)]))
    );
}

fn python(var: &str, fallback: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| fallback.to_owned())
}

fn run_redis_py(python: &str, port: u16) {
    let script = r#"
import sys, redis
port = int(sys.argv[1])
for protocol in (2, 3):
    r = redis.Redis(port=port, protocol=protocol)
    other = redis.Redis(port=port, protocol=protocol, client_name="other")
    other.ping()
    r.client_setname("me")
    info = r.client_info()
    assert info["name"] == "me" and info["db"] == 0 and info["id"] == r.client_id(), info
    assert info["cmd"] == "client|info", info
    clients = r.client_list()
    names = sorted(c["name"] for c in clients)
    assert "me" in names and "other" in names, clients
    assert all(c["db"] == "0" for c in clients), clients
    assert r.info("clients")["connected_clients"] >= 2, r.info("clients")
    assert r.slowlog_len() >= 0
    other.close()
    r.close()
print("ok", redis.__version__)
"#;
    let output = Command::new(python)
        .args(["-c", script, &port.to_string()])
        .output()
        .unwrap_or_else(|error| panic!("run {python}: {error}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.starts_with("ok"),
        "redis-py ({python}):\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("{}", stdout.trim());
}

fn require_redis_py(python: &str, version: Option<&str>) {
    let found = Command::new(python)
        .args(["-c", "import redis; print(redis.__version__)"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned());
    match (found, version) {
        (Some(found), Some(version)) => assert_eq!(
            found, version,
            "{python} must have redis-py {version} (scripts/test.sh installs it)"
        ),
        (Some(_), None) => {}
        (None, _) => panic!(
            "{python} has no redis-py: scripts/test.sh installs it (PMNET_PYTHON, \
             PMNET_PYTHON_REDIS_5_0_8)"
        ),
    }
}

/// redis-py's `client_info()` and `client_list()` parse the gateway's lines: with the version
/// scripts/test.sh installs, and with 5.0.8, whose parser needs every integer field.
#[test]
fn redis_py_parses_client_info_and_client_list() {
    let up = RedisUp::start(&[]);
    let current = python("PMNET_PYTHON", "python3");
    require_redis_py(&current, None);
    run_redis_py(&current, up.gateway.port());
    let pinned = python(
        "PMNET_PYTHON_REDIS_5_0_8",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/redis-py-5.0.8/bin/python3"
        ),
    );
    require_redis_py(&pinned, Some("5.0.8"));
    run_redis_py(&pinned, up.gateway.port());
}

#[test]
fn introspection_inside_multi_is_refused_and_aborts_the_transaction() {
    let up = RedisUp::start(&[]);
    let mut client = up.client();
    assert_eq!(text(&command(&mut client, &["MULTI"])), "OK");
    assert_eq!(text(&command(&mut client, &["SET", "k", "v"])), "QUEUED");
    let refused = text(&command(&mut client, &["INFO"]));
    assert!(refused.contains("inside MULTI"), "{refused}");
    assert!(text(&command(&mut client, &["EXEC"])).starts_with("EXECABORT"));
    // A transaction's commands are counted when EXEC runs them.
    command(&mut client, &["MULTI"]);
    command(&mut client, &["SET", "k", "v"]);
    command(&mut client, &["INCR", "n"]);
    command(&mut client, &["EXEC"]);
    let (_, stats) = info(&mut client, &["commandstats"]);
    let line = |name: &str| {
        stats
            .lines()
            .find(|line| line.starts_with(&format!("cmdstat_{name}:")))
            .unwrap_or_else(|| panic!("no cmdstat_{name}:\n{stats}"))
    };
    // The aborted EXEC was refused, the other one ran.
    assert!(line("exec").starts_with("cmdstat_exec:calls=1,"), "{stats}");
    assert!(
        line("exec").ends_with(",rejected_calls=1,failed_calls=0"),
        "{stats}"
    );
    assert!(line("incr").starts_with("cmdstat_incr:calls=1,"), "{stats}");
    assert!(line("set").starts_with("cmdstat_set:calls=1,"), "{stats}");
    assert!(
        line("info").ends_with(",rejected_calls=1,failed_calls=0"),
        "{stats}"
    );
}

/// `OBJECT REFCOUNT` right after a write of the same key, as a client of Redis would see it:
/// the write's propagation holds a reference until its execution unit ends (a module's turn,
/// a group script), which Redis's own clients never see.
#[test]
fn object_refcount_after_a_write_counts_what_redis_counts() {
    let up = RedisUp::start(&[]);
    let mut direct = up.redis();
    command(&mut direct, &["SET", "direct", "abc"]);
    let expected = command(&mut direct, &["OBJECT", "REFCOUNT", "direct"]);
    assert_eq!(expected, Value::Integer(1));
    for round in 0..200 {
        // A new connection each time, so the write and the read reach Redis together.
        let mut client = up.client();
        let key = format!("k{}", round % 3);
        assert_eq!(text(&command(&mut client, &["SET", &key, "abc"])), "OK");
        let counted = command(&mut client, &["OBJECT", "REFCOUNT", &key]);
        assert_eq!(counted, expected, "round {round}");
    }
}
