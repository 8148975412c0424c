//! A real `redis-server` behind PMNet, unmodified Redis clients in front: `redis-cli`,
//! `redis-benchmark` and a RESP client of our own talk to `pmnet gateway` → `pmnet device` →
//! `pmnet redis-adaptor` → `redis-server` (appendonly, appendfsync always), all real processes
//! on loopback, each test with its own Redis, ports and files.
//!
//! The crash tests SIGKILL Redis, the adaptor or the device in the middle of a write load and
//! restart it; every connection pushes its own numbered history (`RPUSH hist:<w> <i>`, a bypass
//! write: it may fail on the data, so it is never acked early), so a lost or a doubly applied
//! write shows up as a hole or a repeat in the list, and sets a key per push (`SET hist:<w>:<i>
//! <i>`, a PMNet update acked by the device), so a lost logged update shows up as a missing key. SIGKILL is a process crash: what a killed Redis wrote to its
//! append-only file survives in the page cache.
//!
//! Needs `redis-server`, `redis-cli` and `redis-benchmark` (Debian: `redis-server`,
//! `redis-tools`); scripts/test.sh installs them. Randomised tests print their seed;
//! `PMNET_SEED=N` replays it.

mod redis_harness;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use pmnet_redis::resp::Value;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use redis_harness::*;

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
    // that ended sessions do not pile up in Redis; the records are in their own database, out
    // of the users' keys.
    let Value::Array(Some(in_data)) = redis.command(&["KEYS", "pmnet:*"]).expect("KEYS") else {
        panic!("KEYS did not answer a list");
    };
    assert!(
        in_data.is_empty(),
        "records among the users' keys: {in_data:?}"
    );
    // The last of the harness's Redis's 16 databases.
    redis.command(&["SELECT", "15"]).expect("SELECT");
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
/// A library whose `push` appends its argument to its key and answers the length (`FCALL`).
const PUSH_LIBRARY: &str = "#!lua name=hist\n\
    redis.register_function('push', function(keys, args) \
        return redis.call('RPUSH', keys[1], args[1]) end)";

fn crash_during_writes(victim: Victim, record_reads: bool) {
    crash_during(victim, record_reads, false)
}

#[test]
fn with_the_module_killing_redis_loses_no_acked_write_and_applies_none_twice() {
    crash_on(System::start_module(true), Victim::Redis, false);
}

#[test]
fn with_the_module_killing_redis_mid_batch_of_many_sessions_applies_each_acked_write_once() {
    // Sixteen sessions' pipelines at once: the module applies many sessions' requests, and
    // writes their records, in each turn of Redis's loop; Redis is killed in the middle.
    crash_with(System::start_module(true), Victim::Redis, false, 16);
}

#[test]
fn with_the_module_killing_the_device_loses_no_acked_write_and_applies_none_twice() {
    crash_on(System::start_module(true), Victim::Device, false);
}

#[test]
fn with_the_module_killing_redis_during_function_calls_applies_each_exactly_once() {
    crash_on(System::start_module(true), Victim::Redis, true);
}

/// Writers push numbered histories (with `RPUSH`, or with `FCALL push` when `via_function`)
/// while `victim` is killed and restarted; every acked push is in Redis exactly once.
fn crash_during(victim: Victim, record_reads: bool, via_function: bool) {
    crash_on(System::start_with(true, record_reads), victim, via_function);
}

fn crash_on(system: System, victim: Victim, via_function: bool) {
    crash_with(system, victim, via_function, 3);
}

fn crash_with(mut system: System, victim: Victim, via_function: bool, writers: usize) {
    let record_reads = system.record_reads;
    if via_function {
        let loaded = system
            .gateway_client()
            .command(&["FUNCTION", "LOAD", PUSH_LIBRARY])
            .expect("FUNCTION LOAD");
        assert_eq!(loaded, bulk("hist"));
    }
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
                        .flat_map(|i| {
                            let push = ["RPUSH", key.as_str(), &i.to_string()].map(String::from);
                            let push = if via_function {
                                let call = ["FCALL", "push", "1"].map(String::from);
                                call.into_iter().chain(push.into_iter().skip(1)).collect()
                            } else {
                                push.to_vec()
                            };
                            let set = ["SET", &format!("{key}:{i}"), &i.to_string()]
                                .map(String::from)
                                .to_vec();
                            [push, set]
                        })
                        .chain(std::iter::once(vec!["LLEN".to_owned(), key.clone()]))
                        .collect();
                    let replies = client.pipeline(&commands).expect("pipeline");
                    for (offset, pair) in replies[..2 * batch].chunks(2).enumerate() {
                        assert_eq!(
                            pair[1],
                            Value::Simple(b"OK".to_vec()),
                            "{key}: SET {}",
                            next + offset
                        );
                        match &pair[0] {
                            // Logged by the device, or answered by Redis first (the length).
                            Value::Simple(ok) if ok == b"OK" => {}
                            Value::Integer(len) => {
                                assert_eq!(*len, (next + offset + 1) as i64, "{key}")
                            }
                            other => panic!("{key}: RPUSH {} answered {other:?}", next + offset),
                        }
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                    match &replies[2 * batch] {
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
        for i in 0..count {
            let set_key = format!("{key}:{i}");
            poll_until(&format!("{set_key} applied in Redis"), || {
                redis
                    .command(&["GET", &set_key])
                    .is_ok_and(|value| value == bulk(&i.to_string()))
            });
        }
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
fn killing_the_adaptor_during_function_calls_applies_each_exactly_once() {
    crash_during(Victim::Adaptor, false, true);
}

#[test]
fn functions_are_called_through_the_gateway_and_see_every_change_to_their_libraries() {
    let system = System::start(false);
    let mut client = system.gateway_client();
    let mut call = |words: &[&str]| client.command(words).expect("a reply");
    assert_eq!(
        call(&["FCALL", "push", "1", "f:list", "a"]),
        err("ERR Function not found")
    );
    let library = format!(
        "{PUSH_LIBRARY}\nredis.register_function{{function_name='peek', \
         callback=function(keys) return redis.call('LLEN', keys[1]) end, flags={{'no-writes'}}}}"
    );
    assert_eq!(call(&["FUNCTION", "LOAD", &library]), bulk("hist"));
    assert_eq!(
        call(&["FCALL", "push", "1", "f:list", "a"]),
        Value::Integer(1)
    );
    assert_eq!(
        call(&["FCALL", "push", "1", "f:list", "b"]),
        Value::Integer(2)
    );
    assert_eq!(
        call(&["FCALL_RO", "peek", "1", "f:list"]),
        Value::Integer(2)
    );
    assert_eq!(call(&["FCALL", "peek", "1", "f:list"]), Value::Integer(2));
    assert_eq!(
        call(&["FCALL_RO", "push", "1", "f:list", "c"]),
        err("ERR Can not execute a script with write flag using *_ro command.")
    );
    assert_eq!(
        call(&["FCALL", "push", "-1"]),
        err("ERR Number of keys can't be negative")
    );
    // A library replaced through the gateway is what the next call runs.
    let tenfold = "#!lua name=hist\nredis.register_function('push', function(keys, args) \
                   return 10 * redis.call('RPUSH', keys[1], args[1]) end)";
    assert_eq!(
        call(&["FUNCTION", "LOAD", "REPLACE", tenfold]),
        bulk("hist")
    );
    assert_eq!(
        call(&["FCALL", "push", "1", "f:list", "c"]),
        Value::Integer(30)
    );
    assert_eq!(
        call(&["FUNCTION", "DELETE", "hist"]),
        Value::Simple(b"OK".to_vec())
    );
    assert_eq!(
        call(&["FCALL", "push", "1", "f:list", "d"]),
        err("ERR Function not found")
    );
    // Each call ran once.
    let mut redis = system.redis.client();
    assert_eq!(
        redis
            .command(&["LRANGE", "f:list", "0", "-1"])
            .expect("LRANGE"),
        Value::Array(Some(["a", "b", "c"].map(bulk).to_vec()))
    );
}

fn err(text: &str) -> Value {
    Value::Error(text.as_bytes().to_vec())
}

#[test]
fn killing_the_adaptor_that_records_reads_loses_no_reply() {
    crash_during_writes(Victim::Adaptor, true);
}

#[test]
fn the_gateway_counts_and_times_every_request_when_scraped_at_once() {
    const SETS: usize = 20;
    const GETS: usize = 7;
    let metrics_port = free_tcp_port();
    let metrics: std::net::SocketAddr = ([127, 0, 0, 1], metrics_port).into();
    let system = System::start_gateway_with(&["--metrics", &metrics.to_string()], false);
    let mut client = system.gateway_client();
    for index in 0..SETS {
        let key = format!("obs-{index}");
        assert_eq!(
            client.command(&["SET", key.as_str(), "v"]).unwrap(),
            Value::Simple(b"OK".to_vec())
        );
    }
    for _ in 0..GETS {
        assert_eq!(client.command(&["GET", "obs-0"]).unwrap(), bulk("v"));
    }
    // One scrape, right after the last reply.
    let text = pmnet_runtime::metrics::scrape(metrics, Duration::from_secs(10)).unwrap();
    let value = |name: &str, labels: &str| {
        pmnet_runtime::metrics::find_sample(&text, name, labels)
            .unwrap_or_else(|| panic!("no {name}{{{labels}}} in:\n{text}"))
    };
    assert_eq!(
        value("pmnet_gateway_commands_total", "path=\"update\""),
        SETS as f64
    );
    assert_eq!(
        value("pmnet_gateway_commands_total", "path=\"bypass\""),
        GETS as f64
    );
    let by_device = value("pmnet_gateway_updates_acked_by_device_total", "");
    let by_server = value("pmnet_gateway_updates_answered_by_server_total", "");
    assert_eq!(by_device + by_server, SETS as f64);
    let acks = value("pmnet_client_pmnet_ack_latency_seconds_count", "");
    let replies = value("pmnet_client_server_reply_latency_seconds_count", "");
    assert_eq!(acks, by_device);
    assert_eq!(replies, GETS as f64 + by_server);
    for name in [
        "pmnet_client_pmnet_ack_latency_seconds",
        "pmnet_client_server_reply_latency_seconds",
    ] {
        let prefix = format!("{name}_bucket{{le=\"");
        let buckets: Vec<f64> = text
            .lines()
            .filter_map(|line| line.strip_prefix(prefix.as_str()))
            .filter_map(|rest| rest.rsplit_once(' ')?.1.parse().ok())
            .collect();
        assert!(buckets.len() >= 10, "{name}: {buckets:?}");
        assert!(
            buckets.windows(2).all(|pair| pair[0] <= pair[1]),
            "{buckets:?}"
        );
        assert_eq!(
            *buckets.last().unwrap(),
            value(&format!("{name}_count"), "")
        );
    }
    assert!(value("process_resident_memory_bytes", "") > 0.0);
    assert!(text.contains("pmnet_build_info{"));
}

#[test]
fn writes_of_many_sessions_share_script_calls_and_each_applies_once() {
    // INCR goes as a bypass write: through the adaptor's scripts, grouped when several
    // sessions' writes reach a connection to Redis in one turn.
    let system = System::start(false);
    let clients = 12;
    let rounds = 20;
    let batch = 10;
    let handles: Vec<_> = (0..clients)
        .map(|client_index| {
            let mut client = system.gateway_client();
            thread::spawn(move || {
                for round in 0..rounds {
                    let commands: Vec<Vec<String>> = (0..batch)
                        .map(|i| {
                            let key = if i % 2 == 0 { "shared" } else { "own" };
                            let key = format!(
                                "group:{key}:{}",
                                if i % 2 == 0 { 0 } else { client_index }
                            );
                            vec!["INCR".to_owned(), key]
                        })
                        .collect();
                    let replies = client.pipeline(&commands).expect("pipeline");
                    for (i, reply) in replies.iter().enumerate() {
                        let Value::Integer(value) = reply else {
                            panic!("INCR answered {reply:?}");
                        };
                        if i % 2 == 1 {
                            assert_eq!(*value, (round * batch / 2 + i / 2 + 1) as i64);
                        }
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("a client's thread");
    }
    let mut redis = system.redis.client();
    let shared = redis.command(&["GET", "group:shared:0"]).expect("GET");
    assert_eq!(shared, bulk(&(clients * rounds * batch / 2).to_string()));
    for client_index in 0..clients {
        let own = redis
            .command(&["GET", &format!("group:own:{client_index}")])
            .expect("GET");
        assert_eq!(own, bulk(&(rounds * batch / 2).to_string()));
    }
    let metrics = system.adaptor.as_ref().and_then(|adaptor| adaptor.metrics);
    let metrics = metrics.expect("the adaptor's metrics endpoint");
    let text = pmnet_runtime::metrics::scrape(metrics, Duration::from_secs(5)).expect("scrape");
    let sample = |name: &str| {
        pmnet_runtime::metrics::find_sample(&text, name, "").unwrap_or_else(|| panic!("{name}"))
    };
    let grouped = sample("pmnet_redis_grouped_writes_total");
    let groups = sample("pmnet_redis_write_groups_total");
    let writes = sample("pmnet_redis_writes_applied_total");
    eprintln!("{writes} writes applied, {grouped} of them in {groups} group calls");
    assert_eq!(writes, (clients * rounds * batch) as f64);
    assert!(
        groups >= 1.0 && grouped >= 2.0 * groups,
        "{groups} groups of {grouped}"
    );
}

/// `pmnet gateway --fan-out` (docs/replication.md, "Fan-out"): every write goes to two
/// devices at once, each acks the gateway and forwards its copy to the module, which applies
/// it once; both devices logged every write, and Redis holds each exactly once (an `RPUSH`
/// applied twice would show twice).
#[test]
fn with_the_module_a_gateway_fans_each_write_out_to_two_devices() {
    require_redis();
    let dir = tempfile::tempdir().expect("temporary directory");
    let (listen, d1, d2) = (free_udp_port(), free_udp_port(), free_udp_port());
    let device_addr = |port: u16| format!("127.0.0.1:{port}");
    let redis_server = Redis::start_loading(
        dir.path(),
        Some(vec![
            "listen".to_owned(),
            device_addr(listen),
            "device".to_owned(),
            format!("{},{}", device_addr(d1), device_addr(d2)),
        ]),
    );
    let device = |id: u16, port: u16| {
        let args: Vec<String> = [
            "device",
            "--listen",
            &device_addr(port),
            "--server",
            &format!("1={}", device_addr(listen)),
            "--device-id",
            &id.to_string(),
            "--log-file",
            &dir.path().join(format!("d{id}.log")).display().to_string(),
            "--slots",
            "4096",
            "--metrics",
            "127.0.0.1:0",
            "--report-interval",
            "0",
        ]
        .map(str::to_owned)
        .to_vec();
        Proc::spawn(&args, &dir.path().join(format!("d{id}.stderr")))
    };
    let devices = [device(1, d1), device(2, d2)];
    let gateway_args: Vec<String> = [
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--device",
        &device_addr(d1),
        "--fan-out",
        &device_addr(d2),
        "--replicas",
        "2",
        "--redis",
        &redis_server.addr().to_string(),
        "--report-interval",
        "0",
    ]
    .map(str::to_owned)
    .to_vec();
    let gateway = Proc::spawn(&gateway_args, &dir.path().join("gateway.log"));
    let mut client = pmnet_redis::resp::SyncClient::connect(gateway.addr, Duration::from_secs(30))
        .expect("connect to the gateway");
    for index in 0..20 {
        let reply = client
            .command(&["SET", &format!("k{index}"), &index.to_string()])
            .expect("SET");
        assert_eq!(reply, Value::Simple(b"OK".to_vec()));
    }
    let logged = |proc: &Proc| {
        let text = pmnet_runtime::metrics::scrape(
            proc.metrics.expect("a metrics endpoint"),
            Duration::from_secs(5),
        )
        .expect("scrape a device");
        pmnet_runtime::metrics::find_sample(
            &text,
            "pmnet_device_updates_logged_total",
            r#"port="pmnet""#,
        )
        .unwrap_or(0.0)
    };
    for proc in &devices {
        let count = logged(proc);
        assert!(count >= 20.0, "every device logged every write: {count}");
    }
    // Acked by the devices, applied by the module a moment later.
    let mut redis = redis_server.client();
    poll_until("the module applied every write", || {
        (0..20).all(|index| {
            redis.command(&["GET", &format!("k{index}")]).ok() == Some(bulk(&index.to_string()))
        })
    });
    // INCR is a counting write, sent as a bypass request through the first device only, and
    // applied once however it travels.
    client.command(&["INCR", "n"]).expect("INCR");
    assert_eq!(redis.command(&["GET", "n"]).expect("GET"), bulk("1"));
    drop(gateway);
}

/// `pmnet gateway --replicas 2` in front of one device: each write waits for two devices'
/// acks, only one comes, and Redis's reply answers it. The gateway counts such writes and says
/// so, rather than passing one device off as two.
#[test]
fn a_gateway_counts_writes_answered_before_replicas_devices_acked_them() {
    let system =
        System::start_gateway_with(&["--replicas", "2", "--metrics", "127.0.0.1:0"], false);
    let mut client = system.gateway_client();
    for index in 0..3 {
        let reply = client
            .command(&["SET", &format!("short{index}"), "v"])
            .expect("SET");
        assert_eq!(reply, Value::Simple(b"OK".to_vec()));
    }
    let gateway = system.gateway.as_ref().expect("gateway");
    let text = pmnet_runtime::metrics::scrape(
        gateway.metrics.expect("the gateway's metrics endpoint"),
        Duration::from_secs(5),
    )
    .expect("scrape the gateway");
    let short = pmnet_runtime::metrics::find_sample(
        &text,
        "pmnet_gateway_updates_short_of_replicas_total",
        "",
    )
    .unwrap_or(0.0);
    assert_eq!(short, 3.0, "{text}");
}
