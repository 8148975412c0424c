//! Redis's own command table (`COMMAND`), read by the adaptor at start-up, and how the adaptor
//! runs each command through it.
//!
//! Redis describes every command it has — modules' included — with its arity and flags
//! (`write`, `readonly`, `noscript`, `blocking`, `pubsub`, `admin`, …) and its subcommands. The
//! adaptor classifies from those flags:
//!
//! | Redis says | the adaptor |
//! |---|---|
//! | `write` | runs it in the update script: applied and recorded exactly once |
//! | `readonly` | runs it as it is, in order (a read) |
//! | neither (`PING`, `TIME`, `INFO`, `PUBSUB CHANNELS`, …) | runs it as it is |
//! | `blocking` | refuses it (it would stall a connection other sessions share; the gateway sends the ones it knows on a direct connection of the client's own), except `XREAD`/`XREADGROUP` without `BLOCK` |
//! | `noscript` and `admin` | refuses it (operators' commands: run them against Redis), except `CONFIG GET` |
//! | `pubsub` and `noscript` (`SUBSCRIBE`, …) | refuses it (the gateway sends them on a direct connection) |
//!
//! and the knowledge the flags do not carry is the short table [`SPECIAL`], one test each.

use std::collections::HashMap;

use crate::resp::Value;

/// The flags the adaptor looks at.
pub mod flag {
    pub const WRITE: u16 = 1 << 0;
    pub const READONLY: u16 = 1 << 1;
    pub const NOSCRIPT: u16 = 1 << 2;
    pub const BLOCKING: u16 = 1 << 3;
    pub const PUBSUB: u16 = 1 << 4;
    pub const ADMIN: u16 = 1 << 5;
    /// Its keys are not at fixed positions (`EVAL`, `ZUNIONSTORE`, …).
    pub const MOVABLE_KEYS: u16 = 1 << 6;
    /// It may write without being a `write` command (`EVAL`, `FCALL`, `PUBLISH`).
    pub const MAY_REPLICATE: u16 = 1 << 7;
}

/// One command (or subcommand) as Redis describes it.
#[derive(Debug, Clone, Default)]
pub struct CommandInfo {
    /// Redis's arity: `n` exactly n words (the name included), `-n` at least n.
    pub arity: i64,
    pub flags: u16,
    /// Where its keys are (`COMMAND`'s first key, last key and step): words `first`,
    /// `first + step`, … through `last` (negative: counted from the end); `first` 0: none.
    pub keys: (i64, i64, i64),
    /// Subcommands by lower-case name (`object|encoding` is under `object`, as `encoding`).
    pub subcommands: HashMap<String, CommandInfo>,
}

impl CommandInfo {
    /// The keys `args` (this command's words, the name first) names at its fixed positions.
    pub fn fixed_keys<'a>(&self, args: &'a [Vec<u8>]) -> Vec<&'a [u8]> {
        let (first, last, step) = self.keys;
        let count = args.len() as i64;
        let last = if last < 0 { count + last } else { last };
        if first <= 0 || step <= 0 {
            return Vec::new();
        }
        (first..=last.min(count - 1))
            .step_by(step as usize)
            .filter_map(|at| args.get(usize::try_from(at).ok()?).map(Vec::as_slice))
            .collect()
    }
}

/// Every command Redis has.
#[derive(Debug, Clone, Default)]
pub struct CommandTable {
    commands: HashMap<String, CommandInfo>,
}

/// How the adaptor runs a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Run {
    /// In the update script, recorded with its session's sequence number.
    Write,
    /// As it is, ordered after its session's earlier requests (resent after a lost
    /// connection through the checked read).
    Read,
    /// As it is, always: the reply does not depend on the session's data.
    Direct,
    /// `EVAL`/`EVALSHA`: the user's script inside the exactly-once wrapper.
    Script,
    /// `SCRIPT LOAD`: loaded into Redis and remembered for `EVALSHA`.
    ScriptLoad,
    /// `FCALL`/`FCALL_RO`: the function's library in the exactly-once wrapper.
    Function,
    /// `FUNCTION LOAD/DELETE/FLUSH/RESTORE`: run at once (before any later `FCALL` is read).
    FunctionChange,
    /// `FLUSHALL`: every database but the records'.
    FlushAll,
    /// Not run: answered with this error reply (without the leading `-`).
    Refuse(String),
}

/// Commands whose treatment the flags do not tell, with what the adaptor does and why.
pub const SPECIAL: &[(&str, Special)] = &[
    // Connection state: answered by the gateway, meaningless on a connection many sessions share.
    ("hello", Special::Connection),
    ("auth", Special::Connection),
    ("client", Special::Connection),
    ("select", Special::Connection),
    ("reset", Special::Connection),
    ("quit", Special::Connection),
    ("multi", Special::Connection),
    ("exec", Special::Connection),
    ("discard", Special::Connection),
    ("watch", Special::Connection),
    ("unwatch", Special::Connection),
    ("monitor", Special::Connection),
    // A message published is an effect: exactly once, like a write.
    ("publish", Special::Write),
    ("spublish", Special::Write),
    // Scripts: the user's code runs inside the exactly-once wrapper.
    ("eval", Special::Script),
    ("evalsha", Special::Script),
    ("script|load", Special::ScriptLoad),
    // Functions: the library's code runs inside the exactly-once wrapper (adaptor/functions.rs).
    ("fcall", Special::Function),
    ("fcall_ro", Special::Function),
    // Changes to the libraries run at once, so that a later FCALL reads them.
    ("function|load", Special::FunctionChange),
    ("function|delete", Special::FunctionChange),
    ("function|flush", Special::FunctionChange),
    ("function|restore", Special::FunctionChange),
    // Waiting for replicas would stall a connection other sessions share: the gateway sends
    // them on a direct connection of the client's own.
    (
        "wait",
        Special::Refused(
            "WAIT cannot run on the pmnet adaptor's shared connections to Redis: the pmnet \
         gateway sends it to Redis on a direct connection (see docs/redis.md)",
        ),
    ),
    (
        "waitaof",
        Special::Refused(
            "WAITAOF cannot run on the pmnet adaptor's shared connections to Redis: the pmnet \
         gateway sends it to Redis on a direct connection (see docs/redis.md)",
        ),
    ),
    ("config|get", Special::Direct),
    ("flushall", Special::FlushAll),
];

/// What [`SPECIAL`] says of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    Connection,
    Write,
    Direct,
    Script,
    ScriptLoad,
    Function,
    FunctionChange,
    FlushAll,
    Refused(&'static str),
}

fn special(name: &str) -> Option<Special> {
    SPECIAL
        .iter()
        .find(|(special, _)| *special == name)
        .map(|(_, what)| *what)
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::Simple(bytes) | Value::Bulk(Some(bytes)) => {
            Some(String::from_utf8_lossy(bytes).to_ascii_lowercase())
        }
        _ => None,
    }
}

fn parse_entry(entry: &Value) -> Option<(String, CommandInfo)> {
    let Value::Array(Some(fields)) = entry else {
        return None;
    };
    let name = text(fields.first()?)?;
    let arity = match fields.get(1)? {
        Value::Integer(arity) => *arity,
        _ => return None,
    };
    let mut flags = 0;
    if let Some(Value::Array(Some(words))) = fields.get(2) {
        for word in words.iter().filter_map(text) {
            flags |= match word.as_str() {
                "write" => flag::WRITE,
                "readonly" => flag::READONLY,
                "noscript" => flag::NOSCRIPT,
                "blocking" => flag::BLOCKING,
                "pubsub" => flag::PUBSUB,
                "admin" => flag::ADMIN,
                "movablekeys" => flag::MOVABLE_KEYS,
                "may_replicate" => flag::MAY_REPLICATE,
                _ => 0,
            };
        }
    }
    let number = |at: usize| match fields.get(at) {
        Some(Value::Integer(n)) => *n,
        _ => 0,
    };
    let keys = (number(3), number(4), number(5));
    let mut subcommands = HashMap::new();
    // Redis 7: field 10 lists the subcommands, named `container|sub`.
    if let Some(Value::Array(Some(subs))) = fields.get(9) {
        for sub in subs {
            if let Some((full, info)) = parse_entry(sub) {
                let short = full
                    .split_once('|')
                    .map_or(full.clone(), |(_, sub)| sub.to_owned());
                subcommands.insert(short, info);
            }
        }
    }
    Some((
        name,
        CommandInfo {
            arity,
            flags,
            keys,
            subcommands,
        },
    ))
}

/// A word as Redis shows it in an error (C's `%.*s`): the bytes before its first NUL, at most
/// `max` of them.
fn c_text(word: &[u8], max: usize) -> &[u8] {
    let end = word.iter().position(|&b| b == 0).unwrap_or(word.len());
    &word[..end.min(max)]
}

fn shown(word: &[u8]) -> String {
    String::from_utf8_lossy(c_text(word, 128)).into_owned()
}

/// Redis's error for an unknown subcommand of `container` (upper case), as Redis writes it:
/// the subcommand's bytes before a NUL, at most 128, line breaks as spaces.
pub fn unknown_subcommand_reply(container: &str, sub: &[u8]) -> Vec<u8> {
    let mut out = b"-ERR unknown subcommand '".to_vec();
    out.extend(
        c_text(sub, 128)
            .iter()
            .map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    out.extend_from_slice(format!("'. Try {container} HELP.\r\n").as_bytes());
    out
}

/// Redis's error for an unknown command: its name and the beginning of its arguments, each
/// quoted, until they fill 128 bytes (as `processCommand` writes it).
pub fn unknown_command(args: &[Vec<u8>]) -> String {
    let mut shown_args: Vec<u8> = Vec::new();
    for arg in args.iter().skip(1) {
        if shown_args.len() >= 128 {
            break;
        }
        let room = 128 - shown_args.len();
        shown_args.push(b'\'');
        shown_args.extend_from_slice(c_text(arg, room));
        shown_args.extend_from_slice(b"' ");
    }
    format!(
        "ERR unknown command '{}', with args beginning with: {}",
        shown(&args[0]),
        String::from_utf8_lossy(&shown_args)
    )
}

impl CommandTable {
    /// The table from Redis's reply to `COMMAND`; `None` if the reply is not such a table.
    pub fn from_reply(reply: &Value) -> Option<CommandTable> {
        let Value::Array(Some(entries)) = reply else {
            return None;
        };
        let commands: HashMap<String, CommandInfo> =
            entries.iter().filter_map(parse_entry).collect();
        (!commands.is_empty()).then_some(CommandTable { commands })
    }

    pub fn len(&self) -> usize {
        self.commands.len()
    }

    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// Every command name, lower case.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.commands.keys().map(String::as_str)
    }

    /// The command (or subcommand) `args` names, with its full name (`object|encoding`), or the
    /// error Redis would give.
    pub fn find<'t>(&'t self, args: &[Vec<u8>]) -> Result<(String, &'t CommandInfo), String> {
        let Some(word) = args.first() else {
            return Err("ERR empty command".to_owned());
        };
        let name = String::from_utf8_lossy(word).to_ascii_lowercase();
        let Some(info) = self.commands.get(&name) else {
            return Err(unknown_command(args));
        };
        // A container that takes no subcommand runs itself (`COMMAND`, arity -1).
        let bare = args.len() == 1 && (info.arity == 1 || info.arity == -1);
        let (full, info) = if info.subcommands.is_empty() || bare {
            (name, info)
        } else {
            let Some(sub) = args.get(1) else {
                return Err(format!(
                    "ERR wrong number of arguments for '{name}' command"
                ));
            };
            let sub_name = String::from_utf8_lossy(sub).to_ascii_lowercase();
            match info.subcommands.get(&sub_name) {
                Some(sub_info) => (format!("{name}|{sub_name}"), sub_info),
                None => {
                    return Err(format!(
                        "ERR unknown subcommand '{}'. Try {} HELP.",
                        shown(sub),
                        name.to_ascii_uppercase()
                    ))
                }
            }
        };
        let count = args.len() as i64;
        if (info.arity > 0 && count != info.arity) || (info.arity < 0 && count < -info.arity) {
            return Err(format!(
                "ERR wrong number of arguments for '{full}' command"
            ));
        }
        Ok((full, info))
    }

    /// How the adaptor runs `args`, with records in database `record_db` (0: with the data).
    pub fn classify(&self, args: &[Vec<u8>], record_db: u32) -> Run {
        let (full, info) = match self.find(args) {
            Ok(found) => found,
            Err(message) => return Run::Refuse(message),
        };
        let container = full.split('|').next().unwrap_or_default().to_owned();
        let what = special(&full).or_else(|| special(&container));
        if let Some(refusal) = database_refusal(&container, args, record_db) {
            return Run::Refuse(refusal);
        }
        match what {
            Some(Special::Connection) => {
                return Run::Refuse(format!(
                    "ERR {} is a connection command: the pmnet gateway answers it, it is not \
                     sent to Redis",
                    full.to_ascii_uppercase()
                ))
            }
            Some(Special::Write) => return Run::Write,
            Some(Special::Direct) => return Run::Direct,
            Some(Special::Script) => return Run::Script,
            Some(Special::ScriptLoad) => return Run::ScriptLoad,
            Some(Special::Function) => return Run::Function,
            Some(Special::FunctionChange) => return Run::FunctionChange,
            Some(Special::FlushAll) => return Run::FlushAll,
            Some(Special::Refused(why)) => return Run::Refuse(format!("ERR {why}")),
            None => {}
        }
        if container == "sort"
            && !args
                .iter()
                .skip(2)
                .any(|a| a.eq_ignore_ascii_case(b"STORE"))
        {
            // Flagged `write` for its STORE form; without it, it only reads. Run as a read, as
            // Redis runs it for a client: inside a script Redis sorts a set even `BY nosort`.
            return Run::Read;
        }
        let flags = info.flags;
        if flags & flag::BLOCKING != 0 && !non_blocking_stream_read(&container, args) {
            return Run::Refuse(format!(
                "ERR blocking commands ({}) cannot run on the pmnet adaptor's shared connections \
                 to Redis: the pmnet gateway sends the ones it knows to Redis on a direct \
                 connection (--redis); use the non-blocking form otherwise",
                full.to_ascii_uppercase()
            ));
        }
        if flags & flag::PUBSUB != 0 && flags & flag::NOSCRIPT != 0 {
            return Run::Refuse(format!(
                "ERR {} cannot run on the pmnet adaptor's shared connections to Redis: the pmnet \
                 gateway sends it to Redis on a direct connection (--redis)",
                full.to_ascii_uppercase()
            ));
        }
        if flags & flag::NOSCRIPT != 0 && flags & flag::ADMIN != 0 {
            return Run::Refuse(format!(
                "ERR {} is an administrative command: run it against Redis directly, not \
                 through the pmnet gateway",
                full.to_ascii_uppercase()
            ));
        }
        if flags & flag::WRITE != 0 {
            if flags & flag::NOSCRIPT != 0 {
                // FUNCTION LOAD/DELETE/FLUSH/RESTORE: cannot run inside the update script.
                // Run as they are: each is idempotent or fails harmlessly when redone.
                return Run::Direct;
            }
            return Run::Write;
        }
        if flags & flag::READONLY != 0 {
            return Run::Read;
        }
        Run::Direct
    }

    /// Whether `args` can run inside a script (a transaction's commands must).
    pub fn runs_in_script(&self, args: &[Vec<u8>]) -> Result<(), String> {
        let (full, info) = self.find(args)?;
        let container = full.split('|').next().unwrap_or_default();
        if info.flags & flag::NOSCRIPT != 0
            || matches!(special(container), Some(Special::Connection))
            || container == "flushall"
        {
            return Err(format!(
                "ERR {} is not supported inside MULTI through the pmnet gateway",
                full.to_ascii_uppercase()
            ));
        }
        if info.flags & flag::BLOCKING != 0 && !non_blocking_stream_read(container, args) {
            return Err(format!(
                "ERR blocking commands ({}) inside MULTI need the pmnet gateway started with \
                 --redis (the transaction then runs on a direct connection to Redis)",
                full.to_ascii_uppercase()
            ));
        }
        Ok(())
    }
}

/// `XREAD`/`XREADGROUP` block only with `BLOCK`.
fn non_blocking_stream_read(container: &str, args: &[Vec<u8>]) -> bool {
    matches!(container, "xread" | "xreadgroup")
        && !args
            .iter()
            .skip(1)
            .any(|arg| arg.eq_ignore_ascii_case(b"BLOCK"))
}

/// Commands that would reach into the records' database.
fn database_refusal(container: &str, args: &[Vec<u8>], record_db: u32) -> Option<String> {
    let record = record_db.to_string();
    let names_record_db = |arg: &Vec<u8>| arg.as_slice() == record.as_bytes();
    let refused = match container {
        "flushdb" | "flushall" => record_db == 0,
        "swapdb" => args.iter().skip(1).take(2).any(names_record_db),
        "move" => args.get(2).is_some_and(names_record_db),
        "copy" => args
            .windows(2)
            .any(|pair| pair[0].eq_ignore_ascii_case(b"DB") && names_record_db(&pair[1])),
        _ => false,
    };
    refused.then(|| {
        if record_db == 0 {
            "ERR FLUSHDB and FLUSHALL are refused through the pmnet gateway while the adaptor \
             keeps its exactly-once records with the data (--record-db 0): they would erase them"
                .to_owned()
        } else {
            // The records' database is not one of the client's: to them it does not exist.
            "ERR DB index is out of range".to_owned()
        }
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::Bulk(Some(text.as_bytes().to_vec()))
    }

    fn entry(name: &str, arity: i64, flags: &[&str], subs: Vec<Value>) -> Value {
        keyed_entry(name, arity, flags, (0, 0, 0), subs)
    }

    /// One command as Redis 7's `COMMAND` describes it, with its key positions.
    pub(crate) fn keyed_entry(
        name: &str,
        arity: i64,
        flags: &[&str],
        keys: (i64, i64, i64),
        subs: Vec<Value>,
    ) -> Value {
        let mut fields = vec![
            bulk(name),
            Value::Integer(arity),
            Value::Array(Some(
                flags
                    .iter()
                    .map(|f| Value::Simple(f.as_bytes().to_vec()))
                    .collect(),
            )),
            Value::Integer(keys.0),
            Value::Integer(keys.1),
            Value::Integer(keys.2),
            Value::Array(Some(vec![])),
            Value::Array(Some(vec![])),
            Value::Array(Some(vec![])),
        ];
        fields.push(Value::Array(Some(subs)));
        Value::Array(Some(fields))
    }

    /// A table shaped like Redis 7's, with one command of each kind.
    pub(crate) fn table() -> CommandTable {
        CommandTable::from_reply(&Value::Array(Some(vec![
            entry("get", 2, &["readonly", "fast"], vec![]),
            entry("sort", -2, &["write", "denyoom"], vec![]),
            entry("set", -3, &["write", "denyoom"], vec![]),
            entry("ping", -1, &["fast"], vec![]),
            entry("blpop", -3, &["write", "noscript", "blocking"], vec![]),
            entry("xread", -4, &["readonly", "blocking"], vec![]),
            entry("subscribe", -2, &["pubsub", "noscript"], vec![]),
            entry("publish", 3, &["pubsub", "fast"], vec![]),
            entry("eval", -3, &["noscript"], vec![]),
            entry("evalsha", -3, &["noscript"], vec![]),
            entry("fcall", -3, &["noscript"], vec![]),
            entry("fcall_ro", -3, &["readonly", "noscript"], vec![]),
            entry("wait", 3, &["noscript"], vec![]),
            entry("waitaof", 4, &["noscript"], vec![]),
            entry("flushall", -1, &["write"], vec![]),
            entry("flushdb", -1, &["write"], vec![]),
            entry("move", 3, &["write"], vec![]),
            entry("swapdb", 3, &["write"], vec![]),
            entry("copy", -3, &["write"], vec![]),
            entry("shutdown", -1, &["admin", "noscript"], vec![]),
            entry("hello", -1, &["noscript"], vec![]),
            entry(
                "config",
                -2,
                &[],
                vec![
                    entry("config|get", -3, &["admin", "noscript"], vec![]),
                    entry("config|set", -4, &["admin", "noscript"], vec![]),
                ],
            ),
            entry(
                "script",
                -2,
                &[],
                vec![
                    entry("script|load", 3, &["noscript"], vec![]),
                    entry("script|exists", -3, &["noscript"], vec![]),
                ],
            ),
            entry(
                "command",
                -1,
                &["loading", "stale"],
                vec![entry("command|count", 2, &["loading", "stale"], vec![])],
            ),
            entry(
                "function",
                -2,
                &[],
                vec![entry("function|load", -3, &["write", "noscript"], vec![])],
            ),
        ])))
        .unwrap()
    }

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    fn run(words: &[&str]) -> Run {
        table().classify(&args(words), 1)
    }

    #[test]
    fn flags_decide_the_common_cases() {
        assert_eq!(run(&["GET", "k"]), Run::Read);
        assert_eq!(run(&["set", "k", "v"]), Run::Write);
        assert_eq!(run(&["PING"]), Run::Direct);
        assert_eq!(run(&["SCRIPT", "EXISTS", "abc"]), Run::Direct);
        assert_eq!(run(&["FUNCTION", "LOAD", "code"]), Run::FunctionChange);
        assert_eq!(run(&["XREAD", "STREAMS", "s", "0"]), Run::Read);
        // SORT writes only with STORE (any word STORE counts, to be safe).
        assert_eq!(run(&["SORT", "s", "BY", "nosort"]), Run::Read);
        assert_eq!(run(&["sort", "s", "store", "d"]), Run::Write);
        assert_eq!(run(&["SORT", "s", "GET", "STORE"]), Run::Write);
        assert_eq!(
            unknown_subcommand_reply("CLIENT", b"k\0\xff bin"),
            b"-ERR unknown subcommand 'k'. Try CLIENT HELP.\r\n"
        );
        assert_eq!(
            unknown_subcommand_reply("CLIENT", b"a\r\n\xff"),
            b"-ERR unknown subcommand 'a  \xff'. Try CLIENT HELP.\r\n"
        );
        for refused in [
            &["BLPOP", "l", "0"][..],
            &["XREAD", "BLOCK", "10", "STREAMS", "s", "0"],
            &["SUBSCRIBE", "c"],
            &["SHUTDOWN"],
            &["CONFIG", "SET", "a", "b"],
        ] {
            assert!(matches!(run(refused), Run::Refuse(_)), "{refused:?}");
        }
    }

    #[test]
    fn every_special_entry_does_what_it_says() {
        assert!(matches!(run(&["HELLO", "3"]), Run::Refuse(m) if m.contains("connection")));
        assert_eq!(run(&["PUBLISH", "c", "m"]), Run::Write);
        assert_eq!(run(&["EVAL", "return 1", "0"]), Run::Script);
        assert_eq!(run(&["EVALSHA", "abc", "0"]), Run::Script);
        assert_eq!(run(&["SCRIPT", "LOAD", "return 1"]), Run::ScriptLoad);
        assert_eq!(run(&["FCALL", "f", "0"]), Run::Function);
        assert_eq!(run(&["FCALL_RO", "f", "0"]), Run::Function);
        assert!(matches!(run(&["WAIT", "1", "0"]), Run::Refuse(m) if m.contains("WAIT")));
        assert!(matches!(run(&["WAITAOF", "1", "0", "0"]), Run::Refuse(_)));
        assert_eq!(run(&["CONFIG", "GET", "save"]), Run::Direct);
        assert_eq!(run(&["FLUSHALL"]), Run::FlushAll);
    }

    #[test]
    fn errors_show_words_as_redis_shows_them() {
        // Up to a NUL byte, and arguments until they fill 128 bytes.
        let long = [
            "NOPE",
            "k\0ignored",
            &"a".repeat(100),
            &"b".repeat(100),
            "c",
        ];
        assert_eq!(
            run(&long),
            Run::Refuse(format!(
                "ERR unknown command 'NOPE', with args beginning with: 'k' '{}' '{}' ",
                "a".repeat(100),
                "b".repeat(21)
            ))
        );
        assert_eq!(
            run(&["CONFIG", "x\0y"]),
            Run::Refuse("ERR unknown subcommand 'x'. Try CONFIG HELP.".to_owned())
        );
        // A container that runs without a subcommand, and one that does not.
        assert_eq!(run(&["COMMAND"]), Run::Direct);
        assert_eq!(run(&["COMMAND", "COUNT"]), Run::Direct);
        assert_eq!(
            run(&["CONFIG"]),
            Run::Refuse("ERR wrong number of arguments for 'config' command".to_owned())
        );
    }

    #[test]
    fn unknown_commands_and_wrong_arity_get_redis_errors() {
        assert_eq!(
            run(&["NOPE", "a"]),
            Run::Refuse("ERR unknown command 'NOPE', with args beginning with: 'a' ".to_owned())
        );
        assert_eq!(
            run(&["GET"]),
            Run::Refuse("ERR wrong number of arguments for 'get' command".to_owned())
        );
        assert_eq!(
            run(&["CONFIG", "NOPE"]),
            Run::Refuse("ERR unknown subcommand 'NOPE'. Try CONFIG HELP.".to_owned())
        );
        assert_eq!(
            run(&["CONFIG", "GET"]),
            Run::Refuse("ERR wrong number of arguments for 'config|get' command".to_owned())
        );
    }

    #[test]
    fn the_records_database_is_out_of_reach() {
        assert_eq!(run(&["FLUSHDB"]), Run::Write);
        assert!(matches!(run(&["MOVE", "k", "1"]), Run::Refuse(_)));
        assert_eq!(run(&["MOVE", "k", "2"]), Run::Write);
        assert!(matches!(run(&["SWAPDB", "0", "1"]), Run::Refuse(_)));
        assert!(matches!(
            run(&["COPY", "a", "b", "DB", "1"]),
            Run::Refuse(_)
        ));
        let with_data = table();
        assert!(matches!(
            with_data.classify(&args(&["FLUSHDB"]), 0),
            Run::Refuse(_)
        ));
        assert!(matches!(
            with_data.classify(&args(&["FLUSHALL"]), 0),
            Run::Refuse(_)
        ));
    }

    #[test]
    fn transactions_take_only_what_runs_in_a_script() {
        let table = table();
        assert!(table.runs_in_script(&args(&["SET", "k", "v"])).is_ok());
        assert!(table.runs_in_script(&args(&["PING"])).is_ok());
        assert!(table.runs_in_script(&args(&["EVAL", "x", "0"])).is_err());
        assert!(table.runs_in_script(&args(&["FLUSHALL"])).is_err());
        assert!(table.runs_in_script(&args(&["BLPOP", "l", "0"])).is_err());
        assert!(table.runs_in_script(&args(&["NOPE"])).is_err());
    }

    #[test]
    fn garbage_is_not_a_table() {
        assert!(CommandTable::from_reply(&Value::Integer(3)).is_none());
        assert!(CommandTable::from_reply(&Value::Array(Some(vec![Value::Integer(1)]))).is_none());
    }
}
