//! `PMNET.INFO [section…]`: Redis's `INFO` for the gateway, with what the gateway needs to tell
//! the clients' truth in it (crates/redis/src/gateway/introspect.rs): the records' database, and
//! — when the records share database 0 with the data (`--record-db 0`) and the reply has a
//! keyspace section — how many of database 0's keys are the adaptor's (`pmnet:*`), and how many
//! of those have a time to live.
//!
//! The reply is `[info text, records' database, pmnet keys, pmnet keys with a TTL]`. It runs as
//! one read-only script call (`INFO` and `SCAN` may run in scripts): nothing is recorded.

/// The name of the gateway's request for Redis's `INFO`: `PMNET.INFO [section…]`.
pub const INFO_COMMAND: &[u8] = b"PMNET.INFO";

/// `ARGV[1]`: the records' database; `ARGV[2…]`: the sections asked for. Counting the adaptor's
/// keys in database 0 is a scan of that database's keyspace (as `KEYS` is): only with
/// `--record-db 0`, and only when the reply has a keyspace section.
const INFO_SCRIPT: &str = "\
local info = redis.call('INFO', unpack(ARGV, 2))
local keys, expires = 0, 0
if ARGV[1] == '0' and string.find(info, '# Keyspace', 1, true) then
  redis.call('SELECT', 0)
  local cursor = '0'
  repeat
    local page = redis.call('SCAN', cursor, 'MATCH', 'pmnet:*', 'COUNT', 1000)
    cursor = page[1]
    for _, key in ipairs(page[2]) do
      keys = keys + 1
      if redis.call('PTTL', key) >= 0 then expires = expires + 1 end
    end
  until cursor == '0'
end
return {info, tonumber(ARGV[1]), keys, expires}
";

/// The command the adaptor sends Redis for `PMNET.INFO sections…`.
pub fn info_request(record_db: u32, sections: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut words = Vec::with_capacity(4 + sections.len());
    words.push(b"EVAL".to_vec());
    words.push(INFO_SCRIPT.as_bytes().to_vec());
    words.push(b"0".to_vec());
    words.push(record_db.to_string().into_bytes());
    words.extend(sections.iter().cloned());
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_names_the_records_database_then_the_sections() {
        let words = info_request(3, &[b"clients".to_vec(), b"keyspace".to_vec()]);
        assert_eq!(words[0], b"EVAL");
        assert_eq!(words[2], b"0");
        assert_eq!(words[3], b"3");
        assert_eq!(&words[4..], &[b"clients".to_vec(), b"keyspace".to_vec()]);
    }
}
