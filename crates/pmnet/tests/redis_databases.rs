//! Through the gateway a client gets exactly the reply Redis would give, in the database it
//! selected: no `+OK` for a write Redis then rejects, and every database of the Redis behind
//! (but the adaptor's records') usable as in Redis, each write landing in its client's
//! database.
//!
//! Each test starts its own `redis-server` and PMNet processes (tests/redis_harness); needs
//! `redis-server` and `redis-cli` (scripts/test.sh installs them).

mod redis_harness;

use pmnet_redis::resp::{SyncClient, Value};
use redis_harness::*;

fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_owned).collect()
}

/// Run `commands` (one per line, words split on spaces; `{k}` stands for a key prefix) on a
/// connection of their own, pipelined, and answer the replies.
fn run(client: &mut SyncClient, prefix: &str, commands: &[&str]) -> Vec<Value> {
    let commands: Vec<Vec<String>> = commands
        .iter()
        .map(|line| words(&line.replace("{k}", prefix)))
        .collect();
    client.pipeline(&commands).expect("pipeline")
}

/// Writes whose success depends on the data or on Redis's checks of their arguments: the
/// gateway must answer each exactly as Redis does (an error where Redis errs), and leave the
/// data as Redis leaves it. Each line runs through the gateway and, on other keys, on the
/// Redis behind directly; the replies must be equal.
#[test]
fn a_write_redis_rejects_is_answered_with_redis_error_not_ok() {
    require_redis();
    let system = System::start(false);
    let commands = [
        "SET {k}str hello",
        // WRONGTYPE: the key holds a string.
        "HMSET {k}str f v",
        "HSET {k}str f v",
        "LPUSH {k}str x",
        // Expiries Redis refuses (they overflow once converted to absolute milliseconds).
        "SETEX {k}a 9223372036854775807 v",
        "SET {k}b v EX 9223372036854775807",
        "PSETEX {k}c 9223372036854775807 v",
        "SET {k}d v PX 9223372036854775807",
        "SET {k}e v EXAT 9223372036854775807",
        "SETEX {k}f 01 v",
        "SETEX {k}g 0 v",
        "SET {k}h v EX 10 PX 10",
        "SET {k}i v KEEPTTL EX 10",
        // Valid: acked by the device, applied by Redis.
        "SETEX {k}j 100 v",
        "SET {k}l v PXAT 9223372036854775807",
        "HMSET {k}hash f v g w",
        "GET {k}a",
        "GET {k}b",
        "GET {k}c",
        "GET {k}d",
        "GET {k}e",
        "GET {k}f",
        "GET {k}g",
        "GET {k}j",
        "GET {k}l",
        "HGETALL {k}hash",
        "TYPE {k}str",
        "GET {k}str",
    ];
    let mut gateway = system.gateway_client();
    let through_gateway = run(&mut gateway, "gw:", &commands);
    let mut redis = system.redis.client();
    let alone = run(&mut redis, "direct:", &commands);
    for ((command, ours), theirs) in commands.iter().zip(&through_gateway).zip(&alone) {
        assert_eq!(
            ours, theirs,
            "{command}: the gateway answered {ours:?}, Redis alone {theirs:?}"
        );
    }
    // And Redis holds through the gateway what it holds alone.
    for key in ["str", "a", "b", "c", "j", "l", "hash"] {
        let mut dump = |prefix: &str| {
            redis
                .command(&["TYPE", &format!("{prefix}{key}")])
                .expect("TYPE")
        };
        assert_eq!(dump("gw:"), dump("direct:"), "{key}");
    }
}

/// `SELECT n` works for every database but the records' (the last one Redis has), each
/// write lands in its client's database, and `FLUSHDB` flushes that database only.
#[test]
fn every_database_but_the_records_is_the_clients() {
    require_redis();
    let system = System::start(false);
    let mut redis = system.redis.client();
    // The harness's Redis has the default 16 databases: clients get 0 to 14.
    let mut one = system.gateway_client();
    let replies = run(
        &mut one,
        "",
        &[
            "SET where zero",
            "SELECT 3",
            // An update (acked by the device) and a bypass write, both in database 3.
            "SET where three",
            "INCR counter",
            "GET where",
            "SELECT 14",
            "SET where fourteen",
            "SELECT 15",
            "SELECT 16",
            "SELECT -1",
            "SELECT x",
            "GET where",
            "MOVE where 15",
            "SWAPDB 0 15",
            "COPY where other DB 15",
        ],
    );
    let ok = Value::Simple(b"OK".to_vec());
    let out_of_range = Value::Error(b"ERR DB index is out of range".to_vec());
    assert_eq!(replies[0], ok);
    assert_eq!(replies[1], ok, "SELECT 3");
    assert_eq!(replies[2], ok);
    assert_eq!(replies[3], Value::Integer(1));
    assert_eq!(replies[4], bulk("three"));
    assert_eq!(replies[5], ok, "SELECT 14");
    assert_eq!(replies[6], ok);
    assert_eq!(replies[7], out_of_range, "SELECT 15: the records' database");
    assert_eq!(replies[8], out_of_range, "SELECT 16");
    assert_eq!(replies[9], out_of_range, "SELECT -1");
    assert_eq!(
        replies[10],
        Value::Error(b"ERR value is not an integer or out of range".to_vec())
    );
    assert_eq!(replies[11], bulk("fourteen"), "still in database 14");
    for (index, command) in [(12, "MOVE"), (13, "SWAPDB"), (14, "COPY … DB")] {
        assert_eq!(replies[index], out_of_range, "{command} into the records'");
    }
    // Another connection starts in database 0.
    let mut two = system.gateway_client();
    assert_eq!(
        two.command(&["GET", "where"]).expect("GET"),
        bulk("zero"),
        "a new connection is in database 0"
    );
    // What Redis holds, database by database.
    for (db, value) in [("0", "zero"), ("3", "three"), ("14", "fourteen")] {
        redis.command(&["SELECT", db]).expect("SELECT");
        poll_until(&format!("database {db} holds its write"), || {
            redis.command(&["GET", "where"]).expect("GET") == bulk(value)
        });
    }
    redis.command(&["SELECT", "3"]).expect("SELECT");
    assert_eq!(redis.command(&["GET", "counter"]).expect("GET"), bulk("1"));

    // FLUSHDB in database 3 leaves database 0 (and the records) alone.
    let replies = run(&mut two, "", &["SELECT 3", "FLUSHDB", "DBSIZE"]);
    assert_eq!(replies, vec![ok.clone(), ok.clone(), Value::Integer(0)]);
    assert_eq!(
        redis.command(&["DBSIZE"]).expect("DBSIZE"),
        Value::Integer(0)
    );
    redis.command(&["SELECT", "0"]).expect("SELECT");
    assert_eq!(redis.command(&["GET", "where"]).expect("GET"), bulk("zero"));
    // MOVE and SWAPDB between the clients' databases work as in Redis.
    let replies = run(
        &mut two,
        "",
        &[
            "SELECT 0",
            "MOVE where 5",
            "SELECT 5",
            "GET where",
            "SWAPDB 5 6",
            "GET where",
        ],
    );
    assert_eq!(
        replies,
        vec![
            ok.clone(),
            Value::Integer(1),
            ok.clone(),
            bulk("zero"),
            ok.clone(),
            Value::Bulk(None)
        ]
    );
    // RESET goes back to database 0.
    let replies = run(&mut two, "", &["SELECT 6", "RESET", "SET after reset"]);
    assert_eq!(replies[1], Value::Simple(b"RESET".to_vec()));
    poll_until("SET after RESET lands in database 0", || {
        redis.command(&["GET", "after"]).expect("GET") == bulk("reset")
    });
}

/// `redis-cli -n 1 FLUSHDB`, as a user types it, flushes database 1, not database 0.
#[test]
fn redis_cli_n_flushes_its_own_database() {
    require_redis();
    let system = System::start(false);
    assert_eq!(system.cli(&["set", "keep", "me"]), "OK");
    assert_eq!(system.cli(&["-n", "1", "set", "drop", "me"]), "OK");
    assert_eq!(system.cli(&["-n", "1", "flushdb"]), "OK");
    assert_eq!(system.cli(&["get", "keep"]), "me");
    assert_eq!(system.cli(&["-n", "1", "dbsize"]), "0");
    let mut redis = system.redis.client();
    assert_eq!(redis.command(&["GET", "keep"]).expect("GET"), bulk("me"));
}
