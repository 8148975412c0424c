//! Start-up: wait for Redis, read what it says about its durability, load the scripts, and
//! read the session records back (the exactly-once state the `Server` resumes from).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pmnet_proto::RecoveredSession;
use pmnet_runtime::Shutdown;

use crate::resp::{SyncClient, Value};
use crate::script;
use crate::table::CommandTable;

use super::{AdaptorError, AdaptorOptions, AdaptorStartup};

/// What the adaptor learnt from Redis at start-up.
#[derive(Debug)]
pub(super) struct RedisState {
    pub(super) startup: AdaptorStartup,
    pub(super) sessions: Vec<RecoveredSession>,
    pub(super) apply_sha: String,
    pub(super) group_sha: String,
    pub(super) read_sha: String,
    pub(super) watch_sha: String,
    /// Redis's command table.
    pub(super) table: CommandTable,
    /// How many databases Redis has (`databases`).
    pub(super) databases: u32,
    /// The database of the records (`--record-db`, resolved: the last one by default).
    pub(super) record_db: u32,
    /// User scripts loaded through the adaptor (`SCRIPT LOAD`), by SHA-1.
    pub(super) scripts: HashMap<String, Vec<u8>>,
}

/// Wait for Redis, read its version and durability settings, load the scripts and read every
/// session record.
pub(super) fn read_redis_state(
    options: &AdaptorOptions,
    shutdown: &Shutdown,
) -> Result<RedisState, AdaptorError> {
    let addr = options.redis;
    let mut client = connect_when_ready(options, shutdown)?;
    let info = client
        .command(&["INFO", "server"])
        .map_err(|error| redis_error(addr, "INFO", error))?;
    let redis_version = info
        .as_bytes()
        .and_then(|text| {
            String::from_utf8_lossy(text)
                .lines()
                .find_map(|line| line.strip_prefix("redis_version:").map(str::to_owned))
        })
        .unwrap_or_else(|| "?".to_owned());
    let appendonly = config_get(&mut client, addr, "appendonly")?;
    let appendfsync = config_get(&mut client, addr, "appendfsync")?;
    let redis_dir = config_get(&mut client, addr, "dir")?;
    let databases: u32 = config_get(&mut client, addr, "databases")?
        .parse()
        .unwrap_or(16);
    let record_db = if options.record_db == script::RECORD_DB_LAST {
        databases.saturating_sub(1)
    } else {
        options.record_db
    };
    if record_db >= databases {
        return Err(AdaptorError::Config(format!(
            "--record-db {record_db}: Redis at {addr} has {databases} databases (its \
             `databases` setting), so database {record_db} does not exist; choose 1 to {} or 0 \
             to keep the records with the data",
            databases.saturating_sub(1)
        )));
    }
    let table_reply = client
        .command(&["COMMAND"])
        .map_err(|error| redis_error(addr, "COMMAND", error))?;
    let table = CommandTable::from_reply(&table_reply).ok_or_else(|| {
        redis_error(
            addr,
            "COMMAND",
            "the reply is not a command table (the adaptor needs Redis 6 or later)",
        )
    })?;
    let apply_sha = script_load(&mut client, addr, &script::apply_script(record_db))?;
    let group_sha = script_load(&mut client, addr, &script::apply_group_script(record_db))?;
    let read_sha = script_load(&mut client, addr, &script::checked_read_script(record_db))?;
    let watch_sha = script_load(&mut client, addr, &script::watch_script(record_db))?;
    for db in (0..databases).filter(|db| *db != record_db) {
        let moved = move_records(&mut client, addr, &options.record_prefix, db, record_db)?;
        if moved > 0 {
            tracing::info!(
                "moved {moved} session records from database {db} to database {record_db} \
                 (--record-db)"
            );
        }
    }
    select(&mut client, addr, record_db)?;
    let (sessions, records_skipped) = load_sessions(&mut client, addr, &options.record_prefix)?;
    let scripts = load_scripts(&mut client, addr)?;
    select(&mut client, addr, 0)?;
    drop(client);
    let startup = AdaptorStartup {
        redis_version,
        appendonly,
        appendfsync,
        redis_dir,
        sessions_recovered: sessions.len(),
        records_skipped,
        databases,
        record_db,
    };
    Ok(RedisState {
        startup,
        sessions,
        apply_sha,
        group_sha,
        read_sha,
        watch_sha,
        table,
        databases,
        record_db,
        scripts,
    })
}

fn select(client: &mut SyncClient, addr: SocketAddr, db: u32) -> Result<(), AdaptorError> {
    match client
        .command(&["SELECT", &db.to_string()])
        .map_err(|error| redis_error(addr, "SELECT", error))?
    {
        Value::Simple(_) => Ok(()),
        other => Err(redis_error(addr, "SELECT", format!("{other:?}"))),
    }
}

/// Move the session records (and the remembered scripts) an adaptor that kept them in
/// database `from` left there — with the data (`--record-db 0`), or in another records'
/// database (an earlier default was database 1) — into `record_db`. Returns how many moved.
fn move_records(
    client: &mut SyncClient,
    addr: SocketAddr,
    prefix: &str,
    from: u32,
    record_db: u32,
) -> Result<usize, AdaptorError> {
    if from == record_db {
        return Ok(0);
    }
    select(client, addr, from)?;
    let mut keys = scan_keys(client, addr, &format!("{}*", glob_escape(prefix)))?;
    keys.retain(|key| script::session_of_key(prefix, key).is_some());
    let db = record_db.to_string();
    // The scripts' bodies (never kept in database 0 without the records): merged into the
    // records' database's hash (a field there wins).
    if from != 0 {
        let scripts = load_scripts(client, addr)?;
        if !scripts.is_empty() {
            select(client, addr, record_db)?;
            for (sha, body) in &scripts {
                client
                    .command(&[
                        b"HSETNX".as_slice(),
                        script::SCRIPTS_KEY.as_bytes(),
                        sha.as_bytes(),
                        body,
                    ])
                    .map_err(|error| redis_error(addr, "HSETNX", error))?;
            }
            select(client, addr, from)?;
            client
                .command(&["DEL", script::SCRIPTS_KEY])
                .map_err(|error| redis_error(addr, "DEL", error))?;
        }
    }
    let mut moved = 0;
    for key in keys {
        match client
            .command(&[b"MOVE".as_slice(), &key, db.as_bytes()])
            .map_err(|error| redis_error(addr, "MOVE", error))?
        {
            Value::Integer(1) => moved += 1,
            _ => tracing::warn!(
                "session record {} is in database {from} and in database {record_db}; the \
                 one in database {record_db} is used",
                String::from_utf8_lossy(&key)
            ),
        }
    }
    Ok(moved)
}

/// Every key matching `pattern` in the selected database.
fn scan_keys(
    client: &mut SyncClient,
    addr: SocketAddr,
    pattern: &str,
) -> Result<Vec<Vec<u8>>, AdaptorError> {
    let mut cursor = b"0".to_vec();
    let mut all = Vec::new();
    loop {
        let reply = client
            .command(&[
                b"SCAN".as_slice(),
                &cursor,
                b"MATCH",
                pattern.as_bytes(),
                b"COUNT",
                b"1000",
            ])
            .map_err(|error| redis_error(addr, "SCAN", error))?;
        let Value::Array(Some(mut parts)) = reply else {
            return Err(redis_error(
                addr,
                "SCAN",
                format!("unexpected reply {reply:?}"),
            ));
        };
        if parts.len() != 2 {
            return Err(redis_error(addr, "SCAN", "unexpected reply shape"));
        }
        let keys = parts.pop();
        let next = parts.pop();
        let (Some(Value::Bulk(Some(next))), Some(Value::Array(Some(keys)))) = (next, keys) else {
            return Err(redis_error(addr, "SCAN", "unexpected reply shape"));
        };
        all.extend(
            keys.into_iter()
                .filter_map(|key| key.as_bytes().map(<[u8]>::to_vec)),
        );
        if next == b"0" {
            return Ok(all);
        }
        cursor = next;
    }
}

/// The user scripts remembered in the records' database (selected).
fn load_scripts(
    client: &mut SyncClient,
    addr: SocketAddr,
) -> Result<HashMap<String, Vec<u8>>, AdaptorError> {
    let reply = client
        .command(&["HGETALL", script::SCRIPTS_KEY])
        .map_err(|error| redis_error(addr, "HGETALL", error))?;
    let mut scripts = HashMap::new();
    if let Value::Array(Some(items)) = reply {
        let mut items = items.into_iter();
        while let (Some(sha), Some(body)) = (items.next(), items.next()) {
            if let (Some(sha), Some(body)) = (sha.as_bytes(), body.as_bytes()) {
                if scripts.len() < script::SCRIPTS_CACHED_MAX {
                    scripts.insert(String::from_utf8_lossy(sha).into_owned(), body.to_vec());
                }
            }
        }
    }
    Ok(scripts)
}

fn redis_error(addr: SocketAddr, what: &str, error: impl std::fmt::Display) -> AdaptorError {
    AdaptorError::Redis {
        addr,
        reason: format!("{what}: {error}"),
    }
}

/// Connect to Redis and wait until it answers PING (not LOADING), or `timeout` passes.
fn connect_when_ready(
    options: &AdaptorOptions,
    shutdown: &Shutdown,
) -> Result<SyncClient, AdaptorError> {
    let (addr, timeout) = (options.redis, options.startup_timeout);
    let started = Instant::now();
    let mut warned = false;
    loop {
        let reason = match connect(options) {
            Ok(mut client) => match client.command(&["PING"]) {
                Ok(Value::Simple(_)) => {
                    if warned {
                        tracing::info!(
                            "Redis at {addr} answers after {:.1} s; carrying on",
                            started.elapsed().as_secs_f64()
                        );
                    }
                    return Ok(client);
                }
                Ok(Value::Error(message)) => String::from_utf8_lossy(&message).into_owned(),
                Ok(other) => format!("unexpected reply to PING: {other:?}"),
                Err(error) => error.to_string(),
            },
            Err(error) => error.to_string(),
        };
        if started.elapsed() >= timeout || shutdown.is_requested() {
            return Err(AdaptorError::RedisUnavailable {
                addr,
                waited: started.elapsed(),
                reason,
            });
        }
        if !warned && started.elapsed() >= super::REDIS_SILENCE_WARNING {
            warned = true;
            tracing::warn!(
                "Redis at {addr} does not answer ({reason}) for {} s; is redis-server running \
                 there? still trying for up to {} s (--startup-timeout)",
                started.elapsed().as_secs(),
                timeout.as_secs()
            );
        } else {
            tracing::debug!("Redis at {addr} is not ready: {reason}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A blocking connection to Redis, authenticated if the options say so.
pub(super) fn connect(options: &AdaptorOptions) -> std::io::Result<SyncClient> {
    let mut client = SyncClient::connect(options.redis, Duration::from_secs(5))?;
    if let Some((user, password)) = &options.redis_auth {
        let mut words: Vec<&[u8]> = vec![b"AUTH"];
        words.extend(user.as_deref());
        words.push(password);
        if let Value::Error(message) = client.command(&words)? {
            return Err(std::io::Error::other(format!(
                "AUTH failed: {}",
                String::from_utf8_lossy(&message)
            )));
        }
    }
    Ok(client)
}

fn config_get(
    client: &mut SyncClient,
    addr: SocketAddr,
    name: &str,
) -> Result<String, AdaptorError> {
    let value = client
        .command(&["CONFIG", "GET", name])
        .map_err(|error| redis_error(addr, "CONFIG GET", error))?;
    match value {
        Value::Array(Some(items)) if items.len() == 2 => Ok(items[1]
            .as_bytes()
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
            .unwrap_or_default()),
        _ => Ok(String::from("?")),
    }
}

fn script_load(
    client: &mut SyncClient,
    addr: SocketAddr,
    text: &str,
) -> Result<String, AdaptorError> {
    match client
        .command(&["SCRIPT", "LOAD", text])
        .map_err(|error| redis_error(addr, "SCRIPT LOAD", error))?
    {
        Value::Bulk(Some(sha)) => Ok(String::from_utf8_lossy(&sha).into_owned()),
        other => Err(redis_error(
            addr,
            "SCRIPT LOAD",
            format!("unexpected reply {other:?}"),
        )),
    }
}

/// Escape glob characters for SCAN MATCH.
pub fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for character in text.chars() {
        if matches!(character, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(character);
    }
    out
}

/// Read every session record under `prefix` in the selected database. Returns the sessions and how many keys under the
/// prefix were not valid records.
pub fn load_sessions(
    client: &mut SyncClient,
    addr: SocketAddr,
    prefix: &str,
) -> Result<(Vec<RecoveredSession>, usize), AdaptorError> {
    let keys = scan_keys(client, addr, &format!("{}*", glob_escape(prefix)))?;
    let mut sessions = Vec::new();
    let mut skipped = 0;
    for chunk in keys.chunks(1000) {
        let commands: Vec<Vec<Vec<u8>>> = chunk
            .iter()
            .map(|key| vec![b"HGETALL".to_vec(), key.clone()])
            .collect();
        let replies = client
            .pipeline(&commands)
            .map_err(|error| redis_error(addr, "HGETALL", error))?;
        for (key, reply) in chunk.iter().zip(replies) {
            match parse_record(prefix, key, reply) {
                Some(session) => sessions.push(session),
                None => skipped += 1,
            }
        }
    }
    Ok((sessions, skipped))
}

/// A session record (the reply of `HGETALL key`) as the server recovers it; `None` for a key
/// that is not one.
pub fn parse_record(prefix: &str, key: &[u8], reply: Value) -> Option<RecoveredSession> {
    let session_id = script::session_of_key(prefix, key)?;
    let Value::Array(Some(items)) = reply else {
        return None;
    };
    let mut fields: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut items = items.into_iter();
    while let (Some(field), Some(value)) = (items.next(), items.next()) {
        if let (Some(field), Some(value)) = (field.as_bytes(), value.as_bytes()) {
            fields.insert(field.to_vec(), value.to_vec());
        }
    }
    let seq_text = fields.get(b"seq".as_slice())?;
    let last_seq: u32 = std::str::from_utf8(seq_text).ok()?.parse().ok()?;
    // A request's reply: its entry, or in a record of the earlier layout its reply field
    // (the last request's unchecked, as that layout wrote its number only with the reply).
    let mut reply_of = |seq: u32, checked: bool| -> Option<Vec<u8>> {
        if let Some(value) = fields.get(script::entry_field(seq).as_bytes()) {
            if let Some(reply) = script::entry_reply(value, seq) {
                return Some(reply.to_vec());
            }
        }
        if checked {
            let number = fields.get(script::legacy_reply_seq_field(seq).as_bytes())?;
            (number.as_slice() == seq.to_string().as_bytes()).then_some(())?;
        }
        fields.remove(script::legacy_reply_field(seq).as_bytes())
    };
    let last_reply = reply_of(last_seq, false).unwrap_or_default();
    // The replies kept of the requests before it, each where its own number says it is.
    let earlier_replies = (1..script::REPLY_RING)
        .filter_map(|back| last_seq.checked_sub(back).filter(|&seq| seq > 0))
        .filter_map(|seq| Some((seq, reply_of(seq, true)?)))
        .collect();
    Some(RecoveredSession {
        session_id,
        last_seq,
        last_reply,
        earlier_replies,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_or_are_skipped() {
        let prefix = script::DEFAULT_RECORD_PREFIX;
        let key = script::record_key(prefix, 7);
        let reply = Value::Array(Some(vec![
            Value::Bulk(Some(b"seq".to_vec())),
            Value::Bulk(Some(b"65".to_vec())),
            Value::Bulk(Some(b"r1".to_vec())),
            Value::Bulk(Some(b"+OK\r\n".to_vec())),
            // The reply of 64, with its number.
            Value::Bulk(Some(b"s0".to_vec())),
            Value::Bulk(Some(b"64".to_vec())),
            Value::Bulk(Some(b"r0".to_vec())),
            Value::Bulk(Some(b":3\r\n".to_vec())),
            // The reply of 63's slot answers 63 - 64 < 0: not 63's, left out.
            Value::Bulk(Some(b"s63".to_vec())),
            Value::Bulk(Some(b"127".to_vec())),
            Value::Bulk(Some(b"r63".to_vec())),
            Value::Bulk(Some(b":9\r\n".to_vec())),
        ]));
        let session = parse_record(prefix, &key, reply).unwrap();
        assert_eq!(session.session_id, 7);
        assert_eq!(session.last_seq, 65);
        assert_eq!(session.last_reply, b"+OK\r\n");
        assert_eq!(session.earlier_replies, vec![(64, b":3\r\n".to_vec())]);
        // The same in entries (`e<i>`: number, space, reply): e63 holds 127's reply, not 63's
        // (left out); e62 holds 62's, three before the last.
        let entries = Value::Array(Some(vec![
            Value::Bulk(Some(b"seq".to_vec())),
            Value::Bulk(Some(b"65".to_vec())),
            Value::Bulk(Some(b"e1".to_vec())),
            Value::Bulk(Some(b"65 +OK\r\n".to_vec())),
            Value::Bulk(Some(b"e0".to_vec())),
            Value::Bulk(Some(b"64 :3\r\n".to_vec())),
            Value::Bulk(Some(b"e63".to_vec())),
            Value::Bulk(Some(b"127 :9\r\n".to_vec())),
            Value::Bulk(Some(b"e62".to_vec())),
            Value::Bulk(Some(b"62 $1\r\n \r\n".to_vec())),
        ]));
        let session = parse_record(prefix, &key, entries).unwrap();
        assert_eq!(session.session_id, 7);
        assert_eq!(session.last_seq, 65);
        assert_eq!(session.last_reply, b"+OK\r\n");
        assert_eq!(
            session.earlier_replies,
            vec![(64, b":3\r\n".to_vec()), (62, b"$1\r\n \r\n".to_vec())]
        );
        assert!(parse_record(prefix, &key, Value::Array(Some(vec![]))).is_none());
        assert!(parse_record(prefix, b"pmnet:session:zz", Value::Array(None)).is_none());
    }

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
