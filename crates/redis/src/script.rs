//! The Lua scripts the adaptor runs in Redis, and the per-session records they keep.
//!
//! Every request that may change data runs as one script call (`EVALSHA`), so that the command,
//! the session's last-applied sequence number and the command's reply become durable together:
//! Redis runs a script atomically and writes its effects to the append-only file as one
//! `MULTI … EXEC` block, which a restart replays whole or not at all.
//!
//! The record of session `S` is the hash `<prefix><S as 16 hex digits>` with the field `seq`
//! (the last applied sequence number, decimal) and the fields `r0` … `r63`: the RESP reply of
//! request `n` is kept in `r<n mod 64>`, so the replies of the last 64 requests are kept. The
//! adaptor never has more than 64 requests of one session at Redis at once, so a request redone
//! after a crash always finds its reply. Each write also sets the record to expire after the
//! adaptor's session TTL (`--session-ttl`, default 7 days; 0 keeps records for ever), so the
//! records of sessions that ended do not pile up.

/// Replies kept per session (the adaptor's limit of requests of one session at Redis).
pub const REPLY_RING: u32 = 64;

/// How long a session record outlives its session's last write, by default (7 days).
pub const DEFAULT_SESSION_TTL_SECS: u64 = 7 * 24 * 3600;

/// The default key prefix of the session records.
pub const DEFAULT_RECORD_PREFIX: &str = "pmnet:session:";

/// Status of a script's answer: the command ran now.
pub const STATUS_APPLIED: i64 = 1;
/// Status of a script's answer: applied before (a redo); the stored reply follows.
pub const STATUS_ALREADY_APPLIED: i64 = 0;
/// Status of a script's answer: applied before, reply no longer kept (or, for a checked read,
/// a later request of the session is already applied, so the read cannot be answered as of
/// its place in the sequence).
pub const STATUS_REPLY_GONE: i64 = 2;

/// The RESP encoder shared by both scripts: Redis hands a command's reply to Lua as a value
/// (status and error replies as tables with `ok`/`err`, nil as `false`), and this turns it
/// back into the RESP bytes a client would have received. Integers pass through a Lua number
/// (a double): beyond ±2^53 they lose precision.
const ENCODER: &str = r#"
local function enc(r)
  local t = type(r)
  if t == 'table' then
    if r.ok then return '+' .. r.ok .. '\r\n' end
    if r.err then return '-' .. r.err .. '\r\n' end
    local parts = {'*' .. #r .. '\r\n'}
    for i = 1, #r do parts[#parts + 1] = enc(r[i]) end
    return table.concat(parts)
  elseif t == 'number' then
    return ':' .. string.format('%d', r) .. '\r\n'
  elseif t == 'string' then
    return '$' .. #r .. '\r\n' .. r .. '\r\n'
  elseif r == true then
    return ':1\r\n'
  end
  return '$-1\r\n'
end
"#;

/// The update script. `KEYS[1]`: the session record; `ARGV[1]`: the sequence number;
/// `ARGV[2]`: seconds the record lives after this write (0: for ever); `ARGV[3]`: `c` (the
/// command follows in `ARGV[4..]`) or `r` (record `ARGV[4]` as the reply and run nothing: no-op
/// fills and undecodable payloads). Returns `{status, reply}`.
const APPLY_BODY: &str = r#"
local ring = 64
local seq = tonumber(ARGV[1])
local last = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
if seq <= last then
  if last - seq < ring then
    local stored = redis.call('HGET', KEYS[1], 'r' .. (seq % ring))
    if stored then return {0, stored} end
  end
  return {2, ''}
end
local reply
if ARGV[3] == 'c' then
  reply = enc(redis.pcall(unpack(ARGV, 4)))
else
  reply = ARGV[4] or ''
end
redis.call('HSET', KEYS[1], 'seq', ARGV[1], 'r' .. (seq % ring), reply)
local ttl = tonumber(ARGV[2]) or 0
if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
return {1, reply}
"#;

/// The checked read, used only when a read is resent after a lost connection while a later
/// request of its session may have been applied. `KEYS[1]`: the session record; `ARGV[1]`:
/// the sequence number of that later request; `ARGV[2..]`: the command. Runs the read only if
/// the session has not reached `ARGV[1]` (so it still sees the state of its place in the
/// sequence). Writes nothing.
const CHECKED_READ_BODY: &str = r#"
local bound = tonumber(ARGV[1])
local last = tonumber(redis.call('HGET', KEYS[1], 'seq') or '0')
if last >= bound then return {2, ''} end
return {1, enc(redis.pcall(unpack(ARGV, 2)))}
"#;

/// The full text of the update script.
pub fn apply_script() -> String {
    format!("{ENCODER}{APPLY_BODY}")
}

/// The full text of the checked-read script.
pub fn checked_read_script() -> String {
    format!("{ENCODER}{CHECKED_READ_BODY}")
}

/// The record key of a session.
pub fn record_key(prefix: &str, session_id: u64) -> Vec<u8> {
    format!("{prefix}{session_id:016x}").into_bytes()
}

/// The session id in a record key, if the key is one.
pub fn session_of_key(prefix: &str, key: &[u8]) -> Option<u64> {
    let suffix = key.strip_prefix(prefix.as_bytes())?;
    if suffix.len() != 16 {
        return None;
    }
    let text = std::str::from_utf8(suffix).ok()?;
    u64::from_str_radix(text, 16).ok()
}

/// The hash field holding the reply of request `seq`.
pub fn reply_field(seq: u32) -> String {
    format!("r{}", seq % REPLY_RING)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_keys_round_trip() {
        let key = record_key(DEFAULT_RECORD_PREFIX, 0xAB);
        assert_eq!(key, b"pmnet:session:00000000000000ab");
        assert_eq!(session_of_key(DEFAULT_RECORD_PREFIX, &key), Some(0xAB));
        assert_eq!(
            session_of_key(DEFAULT_RECORD_PREFIX, b"pmnet:session:xyz"),
            None
        );
        assert_eq!(session_of_key(DEFAULT_RECORD_PREFIX, b"other"), None);
        assert_eq!(reply_field(65), "r1");
    }

    #[test]
    fn the_ring_in_the_script_matches_the_constant() {
        assert!(apply_script().contains(&format!("local ring = {REPLY_RING}")));
    }
}
