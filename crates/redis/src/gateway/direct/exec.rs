//! Transactions that run on the direct connection: `MULTI`, the commands, `EXEC`, and with
//! watched keys `WATCH` and a check of their fingerprints first.

use crate::resp::{encode_command, parse_command, Limits};

use super::super::Conn;
use super::{may_write, Expect, Mode, Pending};

/// The check of watched keys' fingerprints (as the adaptor computes them, `script.rs`):
/// `KEYS` the keys, `ARGV` their fingerprints; 1 if every one is unchanged.
const CHECK_WATCHED: &str = "local function fingerprint(key)
  local dump = redis.call('DUMP', key)
  if not dump then return '' end
  return redis.sha1hex(dump) .. ':' .. redis.call('PEXPIRETIME', key)
end
for i = 1, #KEYS do
  if fingerprint(KEYS[i]) ~= ARGV[i] then return 0 end
end
return 1";

/// Run a transaction (the `PMNET.EXEC` payload the gateway built, and its commands) direct:
/// `MULTI`, the commands, `EXEC`, and with watched keys `WATCH` and a check of their
/// fingerprints first.
pub(in crate::gateway) fn queue_exec(conn: &mut Conn, payload: &[u8], commands: &[Vec<Vec<u8>>]) {
    let limits = Limits {
        max_args: usize::MAX,
        max_bulk_len: usize::MAX,
        max_command_len: usize::MAX,
        ..Limits::default()
    };
    // PMNET.EXEC <watched> [<database> <key> <fingerprint>]… <count> … (the direct connection
    // is in the client's database: the keys are watched there).
    let watched: Vec<(Vec<u8>, Vec<u8>)> = match parse_command(payload, &limits) {
        Ok(Some((words, _))) => {
            let count = words
                .get(1)
                .and_then(|word| crate::resp::parse_int(word))
                .and_then(|count| usize::try_from(count).ok())
                .unwrap_or(0);
            words
                .get(2..2 + 3 * count)
                .unwrap_or_default()
                .chunks(3)
                .filter(|triple| triple.len() == 3)
                .map(|triple| (triple[1].clone(), triple[2].clone()))
                .collect()
        }
        _ => Vec::new(),
    };
    let mut body = Vec::new();
    let mut body_expects = vec![Expect::Drop];
    encode_command(&[b"MULTI".as_slice()], &mut body);
    let mut writes = false;
    let mut sticky = false;
    for command in commands {
        encode_command(command, &mut body);
        body_expects.push(Expect::Drop);
        writes |= may_write(command);
        sticky |= command.first().is_some_and(|name| {
            matches!(
                crate::commands::lookup(name).map(|spec| spec.class),
                Some(crate::commands::Class::Direct(
                    crate::commands::DirectKind::Sticky
                ))
            )
        });
    }
    encode_command(&[b"EXEC".as_slice()], &mut body);
    body_expects.push(Expect::Client);
    let (bytes, expects) = if watched.is_empty() {
        (body, body_expects)
    } else {
        let mut bytes = Vec::new();
        let mut watch: Vec<&[u8]> = vec![b"WATCH"];
        watch.extend(watched.iter().map(|(key, _)| key.as_slice()));
        encode_command(&watch, &mut bytes);
        let count = watched.len().to_string();
        let mut check: Vec<&[u8]> = vec![b"EVAL", CHECK_WATCHED.as_bytes(), count.as_bytes()];
        check.extend(watched.iter().map(|(key, _)| key.as_slice()));
        check.extend(watched.iter().map(|(_, print)| print.as_slice()));
        encode_command(&check, &mut bytes);
        (
            bytes,
            vec![
                Expect::Setup("WATCH"),
                Expect::Check {
                    then: body,
                    expects: body_expects,
                },
            ],
        )
    };
    conn.direct.pending = Some(Pending {
        bytes,
        expects,
        mode: if sticky { Mode::Sticky } else { Mode::OneShot },
        writes,
        sent: false,
        first: vec![b"EXEC".to_vec()],
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watched_keys_check_is_the_adaptors_fingerprint() {
        let script = include_str!("../../script.rs");
        let function = CHECK_WATCHED
            .split("\nfor i")
            .next()
            .expect("the fingerprint function");
        assert!(script.contains(function), "script.rs's fingerprint changed");
    }
}
