//! Start-up: wait for Redis, read what it says about its durability, load the scripts, and
//! read the session records back (the exactly-once state the `Server` resumes from).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pmnet_proto::RecoveredSession;
use pmnet_runtime::Shutdown;

use crate::resp::{SyncClient, Value};
use crate::script;

use super::{AdaptorError, AdaptorOptions, AdaptorStartup};

/// What the adaptor learnt from Redis at start-up.
#[derive(Debug)]
pub(super) struct RedisState {
    pub(super) startup: AdaptorStartup,
    pub(super) sessions: Vec<RecoveredSession>,
    pub(super) apply_sha: String,
    pub(super) read_sha: String,
}

/// Wait for Redis, read its version and durability settings, load the scripts and read every
/// session record.
pub(super) fn read_redis_state(
    options: &AdaptorOptions,
    shutdown: &Shutdown,
) -> Result<RedisState, AdaptorError> {
    let addr = options.redis;
    let mut client = connect_when_ready(addr, options.startup_timeout, shutdown)?;
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
    let apply_sha = script_load(&mut client, addr, &script::apply_script())?;
    let read_sha = script_load(&mut client, addr, &script::checked_read_script())?;
    let (sessions, records_skipped) = load_sessions(&mut client, addr, &options.record_prefix)?;
    drop(client);
    let startup = AdaptorStartup {
        redis_version,
        appendonly,
        appendfsync,
        redis_dir,
        sessions_recovered: sessions.len(),
        records_skipped,
    };
    Ok(RedisState {
        startup,
        sessions,
        apply_sha,
        read_sha,
    })
}

fn redis_error(addr: SocketAddr, what: &str, error: impl std::fmt::Display) -> AdaptorError {
    AdaptorError::Redis {
        addr,
        reason: format!("{what}: {error}"),
    }
}

/// Connect to Redis and wait until it answers PING (not LOADING), or `timeout` passes.
fn connect_when_ready(
    addr: SocketAddr,
    timeout: Duration,
    shutdown: &Shutdown,
) -> Result<SyncClient, AdaptorError> {
    let started = Instant::now();
    loop {
        let reason = match SyncClient::connect(addr, Duration::from_secs(5)) {
            Ok(mut client) => match client.command(&["PING"]) {
                Ok(Value::Simple(_)) => return Ok(client),
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
        std::thread::sleep(Duration::from_millis(50));
    }
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
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for character in text.chars() {
        if matches!(character, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(character);
    }
    out
}

/// Read every session record under `prefix`. Returns the sessions and how many keys under the
/// prefix were not valid records.
pub fn load_sessions(
    client: &mut SyncClient,
    addr: SocketAddr,
    prefix: &str,
) -> Result<(Vec<RecoveredSession>, usize), AdaptorError> {
    let pattern = format!("{}*", glob_escape(prefix));
    let mut cursor = b"0".to_vec();
    let mut sessions = Vec::new();
    let mut skipped = 0;
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
        let keys: Vec<Vec<u8>> = keys
            .into_iter()
            .filter_map(|key| key.as_bytes().map(<[u8]>::to_vec))
            .collect();
        let commands: Vec<Vec<Vec<u8>>> = keys
            .iter()
            .map(|key| vec![b"HGETALL".to_vec(), key.clone()])
            .collect();
        let replies = if commands.is_empty() {
            Vec::new()
        } else {
            client
                .pipeline(&commands)
                .map_err(|error| redis_error(addr, "HGETALL", error))?
        };
        for (key, reply) in keys.iter().zip(replies) {
            match parse_record(prefix, key, reply) {
                Some(session) => sessions.push(session),
                None => skipped += 1,
            }
        }
        if next == b"0" {
            break;
        }
        cursor = next;
    }
    Ok((sessions, skipped))
}

fn parse_record(prefix: &str, key: &[u8], reply: Value) -> Option<RecoveredSession> {
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
    let last_reply = fields
        .remove(script::reply_field(last_seq).as_bytes())
        .unwrap_or_default();
    Some(RecoveredSession {
        session_id,
        last_seq,
        last_reply,
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
        ]));
        let session = parse_record(prefix, &key, reply).unwrap();
        assert_eq!(session.session_id, 7);
        assert_eq!(session.last_seq, 65);
        assert_eq!(session.last_reply, b"+OK\r\n");
        assert!(parse_record(prefix, &key, Value::Array(Some(vec![]))).is_none());
        assert!(parse_record(prefix, b"pmnet:session:zz", Value::Array(None)).is_none());
    }

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
