//! The gateway's slow log (`SLOWLOG GET|LEN|RESET|HELP`): client commands slower than
//! `--slowlog-log-slower-than` µs from being parsed to their reply being ready, newest first,
//! the `--slowlog-max-len` newest kept, in Redis's format (id, Unix time, µs, the arguments
//! trimmed as Redis trims them, the client's address and name). Never Redis's own slow log,
//! which holds the adaptor's script calls.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use crate::resp::{encode_bulk, error_reply, parse_int};

use super::Conn;

/// Redis's default `slowlog-log-slower-than` (µs).
pub const DEFAULT_SLOWLOG_SLOWER_THAN: i64 = 10_000;
/// Redis's default `slowlog-max-len`.
pub const DEFAULT_SLOWLOG_MAX_LEN: usize = 128;

/// Redis's slow log keeps 32 arguments at most, each of 128 bytes at most.
const SLOWLOG_MAX_ARGC: usize = 32;
const SLOWLOG_MAX_STRING: usize = 128;

/// One entry of the slow log.
#[derive(Debug)]
struct SlowEntry {
    id: u64,
    unix_seconds: u64,
    micros: u64,
    argv: Vec<Vec<u8>>,
    addr: String,
    name: Vec<u8>,
}

/// The slow log.
#[derive(Debug)]
pub(super) struct SlowLog {
    slower_than: i64,
    max_len: usize,
    entries: VecDeque<SlowEntry>,
    next_id: u64,
}

impl SlowLog {
    pub(super) fn new(slower_than: i64, max_len: usize) -> SlowLog {
        SlowLog {
            slower_than,
            max_len,
            entries: VecDeque::new(),
            next_id: 0,
        }
    }

    /// Whether commands may enter it (their arguments must then be kept).
    pub(super) fn on(&self) -> bool {
        self.slower_than >= 0 && self.max_len > 0
    }

    /// `SLOWLOG …` (arity checked here: the gateway's table does not know it).
    pub(super) fn command(&mut self, args: &[Vec<u8>]) -> Vec<u8> {
        let Some(sub) = args.get(1) else {
            return error_reply("ERR wrong number of arguments for 'slowlog' command");
        };
        let upper = sub.to_ascii_uppercase();
        let arity = |ok: bool| {
            (!ok).then(|| {
                error_reply(&format!(
                    "ERR wrong number of arguments for 'slowlog|{}' command",
                    String::from_utf8_lossy(sub).to_ascii_lowercase()
                ))
            })
        };
        match upper.as_slice() {
            b"GET" => {
                if let Some(error) = arity(args.len() <= 3) {
                    return error;
                }
                let count = match args.get(2) {
                    None => 10,
                    Some(text) => match parse_int(text) {
                        Some(-1) => usize::MAX,
                        Some(count) if count >= 0 => usize::try_from(count).unwrap_or(usize::MAX),
                        _ => return error_reply("ERR count should be greater than or equal to -1"),
                    },
                };
                self.get(count)
            }
            b"LEN" => arity(args.len() == 2)
                .unwrap_or_else(|| format!(":{}\r\n", self.entries.len()).into_bytes()),
            b"RESET" => arity(args.len() == 2).unwrap_or_else(|| {
                self.entries.clear();
                b"+OK\r\n".to_vec()
            }),
            b"HELP" => arity(args.len() == 2).unwrap_or_else(help),
            _ => error_reply(&format!(
                "ERR unknown subcommand '{}'. Try SLOWLOG HELP.",
                String::from_utf8_lossy(sub)
            )),
        }
    }

    fn get(&self, count: usize) -> Vec<u8> {
        let entries: Vec<&SlowEntry> = self.entries.iter().take(count).collect();
        let mut out = format!("*{}\r\n", entries.len()).into_bytes();
        for entry in entries {
            out.extend_from_slice(
                format!(
                    "*6\r\n:{}\r\n:{}\r\n:{}\r\n*{}\r\n",
                    entry.id,
                    entry.unix_seconds,
                    entry.micros,
                    entry.argv.len()
                )
                .as_bytes(),
            );
            for arg in &entry.argv {
                encode_bulk(arg, &mut out);
            }
            encode_bulk(entry.addr.as_bytes(), &mut out);
            encode_bulk(&entry.name, &mut out);
        }
        out
    }

    /// Log a command that took `elapsed` (its arguments as [`argv`] trimmed them) if that is
    /// slow.
    pub(super) fn log(&mut self, argv: Vec<Vec<u8>>, elapsed: Duration, conn: &Conn) {
        let micros = elapsed.as_micros() as u64;
        if !self.on() || micros < self.slower_than as u64 {
            return;
        }
        let unix_seconds = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        self.entries.push_front(SlowEntry {
            id: self.next_id,
            unix_seconds,
            micros,
            argv,
            addr: conn.state.peer.map(|a| a.to_string()).unwrap_or_default(),
            name: conn.state.name.clone().unwrap_or_default(),
        });
        self.next_id += 1;
        self.entries.truncate(self.max_len);
    }
}

fn help() -> Vec<u8> {
    let lines: [&str; 12] = [
        "SLOWLOG <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
        "GET [<count>]",
        "    Return top <count> entries from the slowlog (default: 10, -1 mean all).",
        "    Entries are made of:",
        "    id, timestamp, time in microseconds, arguments array, client IP and port,",
        "    client name",
        "LEN",
        "    Return the length of the slowlog.",
        "RESET",
        "    Reset the slowlog.",
        "HELP",
        "    Prints this help.",
    ];
    let mut out = format!("*{}\r\n", lines.len()).into_bytes();
    for line in lines {
        out.extend_from_slice(format!("+{line}\r\n").as_bytes());
    }
    out
}

/// A command's arguments as Redis's slow log keeps them: at most 32 (the last one then says
/// how many more there were), each at most 128 bytes (then saying how many more bytes), and
/// passwords redacted.
pub(super) fn argv(args: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let shown = args.len().min(SLOWLOG_MAX_ARGC);
    let redacted = redacted_args(args);
    (0..shown)
        .map(|index| {
            if shown != args.len() && index == shown - 1 {
                format!("... ({} more arguments)", args.len() - shown + 1).into_bytes()
            } else if redacted.contains(&index) {
                b"(redacted)".to_vec()
            } else if args[index].len() > SLOWLOG_MAX_STRING {
                let mut arg = args[index][..SLOWLOG_MAX_STRING].to_vec();
                arg.extend_from_slice(
                    format!(
                        "... ({} more bytes)",
                        args[index].len() - SLOWLOG_MAX_STRING
                    )
                    .as_bytes(),
                );
                arg
            } else {
                args[index].clone()
            }
        })
        .collect()
}

/// The positions of passwords (as Redis redacts them: `AUTH`'s arguments, `HELLO … AUTH user
/// pass`).
fn redacted_args(args: &[Vec<u8>]) -> Vec<usize> {
    let name = args[0].to_ascii_uppercase();
    match name.as_slice() {
        b"AUTH" => (1..args.len()).collect(),
        b"HELLO" => args
            .iter()
            .position(|arg| arg.eq_ignore_ascii_case(b"AUTH"))
            .map(|at| vec![at + 1, at + 2])
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    #[test]
    fn the_slow_log_trims_arguments_as_redis_does() {
        let long = "v".repeat(130);
        let shown = argv(&args(&["SET", "k", &long]));
        assert_eq!(shown.len(), 3);
        assert_eq!(
            shown[2],
            format!("{}... (2 more bytes)", "v".repeat(128)).into_bytes()
        );
        let many: Vec<String> = (0..40).map(|i| i.to_string()).collect();
        let words: Vec<&str> = std::iter::once("RPUSH")
            .chain(many.iter().map(String::as_str))
            .collect();
        let shown = argv(&args(&words));
        assert_eq!(shown.len(), 32);
        assert_eq!(shown[30], b"29");
        assert_eq!(shown[31], b"... (10 more arguments)");
        assert_eq!(
            argv(&args(&["AUTH", "user", "secret"])),
            args(&["AUTH", "(redacted)", "(redacted)"])
        );
        assert_eq!(
            argv(&args(&["HELLO", "3", "AUTH", "u", "p", "SETNAME", "n"])),
            args(&[
                "HELLO",
                "3",
                "AUTH",
                "(redacted)",
                "(redacted)",
                "SETNAME",
                "n"
            ])
        );
    }

    #[test]
    fn slowlog_commands_answer_as_redis() {
        let mut intro = SlowLog::new(0, 2);
        let reply = |intro: &mut SlowLog, words: &[&str]| {
            String::from_utf8(intro.command(&args(words))).unwrap()
        };
        assert_eq!(reply(&mut intro, &["SLOWLOG", "LEN"]), ":0\r\n");
        assert_eq!(reply(&mut intro, &["SLOWLOG", "GET"]), "*0\r\n");
        for (index, micros) in [5u64, 7, 9].iter().enumerate() {
            intro.entries.push_front(SlowEntry {
                id: index as u64,
                unix_seconds: 1_700_000_000,
                micros: *micros,
                argv: args(&["GET", "k"]),
                addr: "127.0.0.1:5".to_owned(),
                name: b"app".to_vec(),
            });
            intro.entries.truncate(intro.max_len);
        }
        assert_eq!(reply(&mut intro, &["slowlog", "len"]), ":2\r\n");
        assert_eq!(
            reply(&mut intro, &["SLOWLOG", "GET", "1"]),
            "*1\r\n*6\r\n:2\r\n:1700000000\r\n:9\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n\
             $11\r\n127.0.0.1:5\r\n$3\r\napp\r\n"
        );
        assert!(reply(&mut intro, &["SLOWLOG", "GET", "-1"]).starts_with("*2\r\n"));
        assert_eq!(
            reply(&mut intro, &["SLOWLOG", "GET", "-2"]),
            "-ERR count should be greater than or equal to -1\r\n"
        );
        assert_eq!(
            reply(&mut intro, &["SLOWLOG", "GET", "x"]),
            "-ERR count should be greater than or equal to -1\r\n"
        );
        assert_eq!(
            reply(&mut intro, &["SLOWLOG", "LEN", "x"]),
            "-ERR wrong number of arguments for 'slowlog|len' command\r\n"
        );
        assert_eq!(
            reply(&mut intro, &["SLOWLOG"]),
            "-ERR wrong number of arguments for 'slowlog' command\r\n"
        );
        assert_eq!(
            reply(&mut intro, &["SLOWLOG", "nope"]),
            "-ERR unknown subcommand 'nope'. Try SLOWLOG HELP.\r\n"
        );
        assert!(reply(&mut intro, &["SLOWLOG", "HELP"]).starts_with("*12\r\n+SLOWLOG <sub"));
        assert_eq!(reply(&mut intro, &["SLOWLOG", "RESET"]), "+OK\r\n");
        assert_eq!(reply(&mut intro, &["SLOWLOG", "LEN"]), ":0\r\n");
    }
}
