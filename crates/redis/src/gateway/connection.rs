//! What a Redis connection holds besides its PMNet session, and the commands the gateway
//! answers from it: `HELLO` (RESP2 or RESP3), `AUTH`, `CLIENT`, `SELECT`, `RESET`, and
//! transactions (`MULTI`/`EXEC`/`DISCARD`/`WATCH`/`UNWATCH`).
//!
//! A transaction's commands are queued here and go to the adaptor at `EXEC` as one request
//! (`PMNET.EXEC`), which runs them in one script call: atomically, and exactly once like any
//! write. `WATCH` asks the adaptor for the watched keys' fingerprints (`PMNET.WATCH`: the hash
//! of each key's serialized value and expiry); `EXEC` carries them, each with the database it
//! was watched in, and the adaptor runs the
//! transaction only if every watched key still has its fingerprint — otherwise the reply is the
//! nil array, as Redis answers when a watched key changed. Unlike Redis, a key changed and
//! changed back to the same value and expiry between `WATCH` and `EXEC` counts as unchanged.
//!
//! Inside `MULTI` each command is checked against Redis's command table as Redis checks it
//! (unknown command or subcommand, wrong number of arguments: the error at once, and `EXEC`
//! answers `EXECABORT`). The connection commands Redis queues are queued too, and run at `EXEC`
//! in their place: `CLIENT …`, `HELLO`, `AUTH` and `UNWATCH` are answered by the gateway, their
//! replies carried in the transaction as literals (`PMNET.REPLY <reply>`) so that the adaptor's
//! array has them in their places, and their effects on the connection kept only if the
//! transaction ran; a `SELECT` goes in the transaction as it is, the adaptor switches the
//! database for the commands after it, and the connection stays in the database the last
//! successful one chose.

use std::net::SocketAddr;
use std::time::Instant;

use crate::adaptor::{EXEC_COMMAND, REPLY_WORD, WATCH_COMMAND};
use crate::commands::{Class, Route, OK};
use crate::resp::{encode_bulk, error_reply, parse_value, Limits, Value};
use crate::table::CommandTable;

/// Words queued in one transaction at most (one larger than one PMNet request or the adaptor's
/// scripts take runs on a direct connection: `gateway::direct`).
const MAX_QUEUED_WORDS: usize = 1 << 20;
/// Bytes queued in one transaction at most.
const MAX_QUEUED_BYTES: usize = 512 << 20;
/// Keys watched by one connection at most.
const MAX_WATCHED: usize = 1024;

/// The gateway's own `AUTH` setting.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    /// Clients must `AUTH` (or `HELLO … AUTH`) with this password (user `default`) first.
    pub password: Option<Vec<u8>>,
}

/// A transaction being queued.
#[derive(Debug, Default, Clone)]
struct Queued {
    commands: Vec<Vec<Vec<u8>>>,
    words: usize,
    bytes: usize,
    /// A command was refused while queueing: `EXEC` aborts.
    dirty: bool,
}

/// A connection's state.
#[derive(Debug, Clone)]
pub struct ConnState {
    pub id: u64,
    pub peer: Option<SocketAddr>,
    pub local: Option<SocketAddr>,
    pub opened: Instant,
    pub name: Option<Vec<u8>>,
    pub lib_name: Option<Vec<u8>>,
    pub lib_ver: Option<Vec<u8>>,
    /// The client asked for RESP3 (`HELLO 3`).
    pub resp3: bool,
    /// The database the client selected (`SELECT`; 0 at first and after `RESET`).
    pub db: u32,
    pub authenticated: bool,
    queued: Option<Queued>,
    /// Watched keys and their fingerprints.
    /// Watched keys: the database each was watched in, the key, its fingerprint.
    watched: Vec<(u32, Vec<u8>, Vec<u8>)>,
    /// A write of this connection's own, sent since the `WATCH`, may have changed a watched
    /// key: the next `EXEC` fails, as Redis fails it (see [`ConnState::note_own_command`]).
    watch_touched: bool,
}

/// What the gateway does for a connection command.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Answer at once.
    Reply(Vec<u8>),
    /// Ask the adaptor for these keys' fingerprints (this bypass payload); answer `+OK` then.
    Watch {
        payload: Vec<u8>,
        keys: Vec<Vec<u8>>,
    },
    /// Send this transaction (bypass payload); its reply is the array of the commands'.
    Exec {
        payload: Vec<u8>,
        commands: Vec<Vec<Vec<u8>>>,
        after: AfterExec,
    },
    /// Ask the adaptor whether database `db` can be selected (this bypass payload, `SELECT
    /// n`): on `+OK` the connection's later requests run in it (see [`ConnState::selected`]).
    Select { payload: Vec<u8>, db: Option<u32> },
}

/// What a transaction's connection commands do to the connection, once it ran.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AfterExec {
    /// The settings its `CLIENT`, `HELLO` and `AUTH` commands left (`None`: it has none).
    settings: Option<Settings>,
    /// Its `SELECT`s: their places in the transaction and the databases they name.
    selects: Vec<(usize, Option<u32>)>,
}

impl AfterExec {
    /// Whether the connection's later commands must wait for the transaction's reply (they
    /// run in the database it selects, with the settings it leaves).
    pub fn changes_connection(&self) -> bool {
        self.settings.is_some() || !self.selects.is_empty()
    }
}

/// A connection's settings that its commands change.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Settings {
    name: Option<Vec<u8>>,
    lib_name: Option<Vec<u8>>,
    lib_ver: Option<Vec<u8>>,
    resp3: bool,
    authenticated: bool,
}

/// The name of a command the gateway answers from the connection's state, if `name` is one.
fn connection_command(name: &[u8]) -> Option<&'static str> {
    crate::commands::lookup(name)
        .filter(|spec| spec.class == Class::Connection)
        .map(|spec| spec.name)
}

fn bulk(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_bulk(bytes, &mut out);
    out
}

fn words_len(args: &[Vec<u8>]) -> usize {
    args.iter().map(Vec::len).sum()
}

impl ConnState {
    pub fn new(id: u64, peer: Option<SocketAddr>, local: Option<SocketAddr>, auth: &Auth) -> Self {
        ConnState {
            id,
            peer,
            local,
            opened: Instant::now(),
            name: None,
            lib_name: None,
            lib_ver: None,
            resp3: false,
            db: 0,
            authenticated: auth.password.is_none(),
            queued: None,
            watched: Vec::new(),
            watch_touched: false,
        }
    }

    pub fn in_transaction(&self) -> bool {
        self.queued.is_some()
    }

    /// In a transaction: the commands queued and their bytes (`CLIENT LIST`'s `multi`,
    /// `multi-mem`).
    pub fn queued(&self) -> Option<(usize, usize)> {
        self.queued
            .as_ref()
            .map(|queued| (queued.commands.len(), queued.bytes))
    }

    /// How many keys this connection watches.
    pub fn watched_count(&self) -> usize {
        self.watched.len()
    }

    /// An `EXEC` Redis rejects (the wrong number of arguments): the transaction, if any, and
    /// the watched keys are discarded.
    pub fn abort_exec(&mut self) {
        self.queued = None;
        self.unwatch();
    }

    fn unwatch(&mut self) {
        self.watched.clear();
        self.watch_touched = false;
    }

    /// Whether this command of the connection's own, about to run outside a transaction,
    /// may change a watched key. Redis fails the next `EXEC` when any write — this
    /// connection's own too — changed a watched key, even back to what it was; fingerprints
    /// alone cannot see that. A write of this connection's that names a watched key (in the
    /// database watched), a `FLUSHDB` or `SWAPDB` of its database or a `FLUSHALL` while a
    /// watched key existed may; the caller marks it ([`ConnState::touch_watched`]) once Redis
    /// applied it. Without Redis's command table, fingerprints only.
    pub fn may_touch_watched(&self, args: &[Vec<u8>], table: Option<&CommandTable>) -> bool {
        if self.watched.is_empty() || self.watch_touched || self.queued.is_some() {
            return false;
        }
        let Some(Ok((full, info))) = table.map(|table| table.find(args)) else {
            return false;
        };
        if info.flags & (crate::table::flag::WRITE | crate::table::flag::MAY_REPLICATE) == 0 {
            return false;
        }
        let db = self.db;
        let existed_in = |dbs: &[u32]| {
            self.watched
                .iter()
                .any(|(at, _, print)| dbs.contains(at) && !print.is_empty())
        };
        let names = |key: &[u8]| {
            self.watched
                .iter()
                .any(|(at, watched, _)| *at == db && watched.as_slice() == key)
        };
        if let Some(written) = written_keys(&full, args) {
            // Its other keys are sources it only reads: Redis marks the destination alone.
            return written.into_iter().any(names);
        }
        match full.as_str() {
            // `LTRIM` of a missing key answers OK and marks nothing; of one that exists, it
            // marks it even when nothing is trimmed. (A key made or removed since the watch
            // moved its fingerprint: that EXEC fails anyway.)
            "ltrim" => args.get(1).is_some_and(|key| {
                self.watched.iter().any(|(at, watched, print)| {
                    *at == db && watched.as_slice() == key.as_slice() && !print.is_empty()
                })
            }),
            "flushdb" => existed_in(&[db]),
            "flushall" => self.watched.iter().any(|(_, _, print)| !print.is_empty()),
            "swapdb" => {
                let dbs: Vec<u32> = args[1..]
                    .iter()
                    .filter_map(|arg| crate::resp::parse_redis_int(arg))
                    .filter_map(|n| u32::try_from(n).ok())
                    .collect();
                existed_in(&dbs)
            }
            _ if info.flags & crate::table::flag::MOVABLE_KEYS != 0 => {
                args[1..].iter().any(|arg| names(arg))
            }
            _ => info.fixed_keys(args).into_iter().any(names),
        }
    }

    /// A write of this connection's own changed a watched key: the next `EXEC` fails.
    pub fn touch_watched(&mut self) {
        if !self.watched.is_empty() {
            self.watch_touched = true;
        }
    }

    /// Queue a command inside `MULTI` (routed as `route`); the reply to send now. With Redis's
    /// command table (`table`), the command is checked as Redis checks it.
    pub fn queue(
        &mut self,
        args: &[Vec<u8>],
        route: &Route,
        table: Option<&CommandTable>,
    ) -> Vec<u8> {
        let Some(queued) = self.queued.as_mut() else {
            return error_reply("ERR internal: queueing outside MULTI");
        };
        let checked = match table {
            Some(table) => table.find(args).err(),
            // The adaptor's own words are no command of Redis's.
            None if args[0].len() > 6 && args[0][..6].eq_ignore_ascii_case(b"PMNET.") => {
                Some(crate::table::unknown_command(args))
            }
            None => None,
        };
        let refusal = match route {
            _ if checked.is_some() => checked.as_deref().map(error_reply),
            Route::Reply(bytes) if bytes.first() == Some(&b'-') => Some(bytes.clone()),
            _ if queued.words + args.len() + 1 > MAX_QUEUED_WORDS
                || queued.bytes + words_len(args) > MAX_QUEUED_BYTES =>
            {
                Some(error_reply(
                    "ERR transaction too large for the pmnet gateway (at most 512 MiB and \
                     1048576 words queued)",
                ))
            }
            _ => None,
        };
        if let Some(error) = refusal {
            queued.dirty = true;
            return error;
        }
        queued.words += args.len() + 1;
        queued.bytes += words_len(args);
        queued.commands.push(args.to_vec());
        b"+QUEUED\r\n".to_vec()
    }

    /// Take in the reply of a transaction that carried connection commands (`after`): if it
    /// ran, the connection keeps what they did.
    pub fn executed(&mut self, after: AfterExec, reply: &[u8]) {
        if !after.changes_connection() {
            return;
        }
        let limits = Limits {
            max_bulk_len: usize::MAX >> 1,
            max_command_len: usize::MAX >> 1,
            ..Limits::default()
        };
        let items = match parse_value(reply, &limits) {
            Ok(Some((Value::Array(Some(items)), used))) if used == reply.len() => items,
            // Not run: a watched key changed, or an error.
            _ => return,
        };
        for (at, db) in after.selects {
            if let (Some(db), Some(Value::Simple(text))) = (db, items.get(at)) {
                if text == b"OK" {
                    self.db = db;
                }
            }
        }
        if let Some(settings) = after.settings {
            self.name = settings.name;
            self.lib_name = settings.lib_name;
            self.lib_ver = settings.lib_ver;
            self.resp3 = settings.resp3;
            self.authenticated = settings.authenticated;
        }
    }

    /// Take in the adaptor's answer to a `SELECT` of `db`; the reply.
    pub fn selected(&mut self, db: Option<u32>, reply: Vec<u8>) -> Vec<u8> {
        if let (Some(db), true) = (db, reply == OK) {
            self.db = db;
        }
        reply
    }

    /// Take in the fingerprints the adaptor answered for a `WATCH` of `keys`; the reply.
    pub fn watched(&mut self, keys: Vec<Vec<u8>>, reply: &[u8]) -> Vec<u8> {
        let prints = match crate::resp::parse_value(reply, &crate::resp::Limits::default()) {
            Ok(Some((crate::resp::Value::Array(Some(items)), used))) if used == reply.len() => {
                items
                    .into_iter()
                    .map(|item| item.as_bytes().map(<[u8]>::to_vec))
                    .collect::<Option<Vec<_>>>()
            }
            _ => None,
        };
        match prints {
            Some(prints) if prints.len() == keys.len() => {
                for (key, print) in keys.into_iter().zip(prints) {
                    if self.watched.len() < MAX_WATCHED {
                        // Commands after a WATCH wait for its answer: still its database.
                        self.watched.push((self.db, key, print));
                    }
                }
                OK.to_vec()
            }
            _ if reply.first() == Some(&b'-') => reply.to_vec(),
            _ => error_reply("ERR pmnet gateway: unexpected answer to WATCH"),
        }
    }

    /// A command the gateway answers from this state.
    pub fn handle(&mut self, name: &str, args: &[Vec<u8>], auth: &Auth) -> Action {
        match name {
            "HELLO" => self.hello(args, auth),
            "AUTH" => Action::Reply(self.auth(args, auth)),
            "CLIENT" => self.client(args),
            "SELECT" => Action::Select {
                payload: crate::resp::command_bytes(args),
                db: crate::resp::parse_redis_int(&args[1]).and_then(|n| u32::try_from(n).ok()),
            },
            "RESET" => {
                self.queued = None;
                self.unwatch();
                self.name = None;
                self.resp3 = false;
                self.db = 0;
                self.authenticated = auth.password.is_none();
                Action::Reply(b"+RESET\r\n".to_vec())
            }
            "MULTI" => Action::Reply(if self.queued.is_some() {
                error_reply("ERR MULTI calls can not be nested")
            } else {
                self.queued = Some(Queued::default());
                OK.to_vec()
            }),
            "DISCARD" => Action::Reply(match self.queued.take() {
                Some(_) => {
                    self.unwatch();
                    OK.to_vec()
                }
                None => error_reply("ERR DISCARD without MULTI"),
            }),
            "UNWATCH" => {
                self.unwatch();
                Action::Reply(OK.to_vec())
            }
            "WATCH" => {
                if self.queued.is_some() {
                    return Action::Reply(error_reply("ERR WATCH inside MULTI is not allowed"));
                }
                if self.watched.len() + args.len() - 1 > MAX_WATCHED {
                    return Action::Reply(error_reply(&format!(
                        "ERR at most {MAX_WATCHED} keys can be watched through the pmnet gateway"
                    )));
                }
                let mut words = vec![WATCH_COMMAND.to_vec()];
                words.extend_from_slice(&args[1..]);
                Action::Watch {
                    payload: crate::resp::command_bytes(&words),
                    keys: args[1..].to_vec(),
                }
            }
            "EXEC" => self.exec(auth),
            _ => Action::Reply(error_reply(&format!(
                "ERR unknown command '{name}' for the pmnet gateway"
            ))),
        }
    }

    fn exec(&mut self, auth: &Auth) -> Action {
        let Some(queued) = self.queued.take() else {
            return Action::Reply(error_reply("ERR EXEC without MULTI"));
        };
        let watched = std::mem::take(&mut self.watched);
        if std::mem::take(&mut self.watch_touched) && !queued.dirty {
            return Action::Reply(if self.resp3 {
                b"_\r\n".to_vec()
            } else {
                b"*-1\r\n".to_vec()
            });
        }
        if queued.dirty {
            return Action::Reply(error_reply(
                "EXECABORT Transaction discarded because of previous errors.",
            ));
        }
        if queued.commands.is_empty() && watched.is_empty() {
            return Action::Reply(b"*0\r\n".to_vec());
        }
        let mut words: Vec<Vec<u8>> = vec![
            EXEC_COMMAND.to_vec(),
            watched.len().to_string().into_bytes(),
        ];
        for (db, key, print) in watched {
            words.push(db.to_string().into_bytes());
            words.push(key);
            words.push(print);
        }
        words.push(queued.commands.len().to_string().into_bytes());
        // The connection commands run on a copy of this state, in order; it becomes the
        // connection's once the transaction ran.
        let mut shadow: Option<Box<ConnState>> = None;
        let mut after = AfterExec::default();
        for (at, command) in queued.commands.iter().enumerate() {
            match connection_command(&command[0]) {
                Some("SELECT") => {
                    let db = crate::resp::parse_redis_int(&command[1])
                        .and_then(|n| u32::try_from(n).ok());
                    after.selects.push((at, db));
                }
                Some(name) => {
                    let state = shadow.get_or_insert_with(|| Box::new(self.clone()));
                    let reply = match state.handle(name, command, auth) {
                        Action::Reply(bytes) => bytes,
                        _ => error_reply(&format!(
                            "ERR {name} inside MULTI is not supported through the pmnet gateway"
                        )),
                    };
                    words.push(b"2".to_vec());
                    words.push(REPLY_WORD.to_vec());
                    words.push(reply);
                    continue;
                }
                None => {}
            }
            words.push(command.len().to_string().into_bytes());
            words.extend(command.iter().cloned());
        }
        after.settings = shadow.map(|state| Settings {
            name: state.name,
            lib_name: state.lib_name,
            lib_ver: state.lib_ver,
            resp3: state.resp3,
            authenticated: state.authenticated,
        });
        Action::Exec {
            payload: crate::resp::command_bytes(&words),
            commands: queued.commands,
            after,
        }
    }

    fn check_password(&mut self, user: Option<&[u8]>, password: &[u8], auth: &Auth) -> Vec<u8> {
        let Some(expected) = auth.password.as_deref() else {
            return error_reply(
                "ERR AUTH <password> called without any password configured for the default \
                 user. Are you sure your configuration is correct?",
            );
        };
        let user_ok = user.is_none_or(|user| user == b"default");
        if user_ok && constant_time_eq(password, expected) {
            self.authenticated = true;
            OK.to_vec()
        } else {
            error_reply("WRONGPASS invalid username-password pair or user is disabled.")
        }
    }

    fn auth(&mut self, args: &[Vec<u8>], auth: &Auth) -> Vec<u8> {
        match args.len() {
            2 => self.check_password(None, &args[1], auth),
            3 => self.check_password(Some(&args[1]), &args[2], auth),
            _ => error_reply("ERR syntax error"),
        }
    }

    fn hello(&mut self, args: &[Vec<u8>], auth: &Auth) -> Action {
        let mut protocol = if self.resp3 { 3 } else { 2 };
        let mut index = 1;
        if let Some(version) = args.get(1) {
            match version.as_slice() {
                b"2" => protocol = 2,
                b"3" => protocol = 3,
                _ => {
                    return Action::Reply(error_reply(
                        if crate::resp::parse_int(version).is_some() {
                            "NOPROTO unsupported protocol version"
                        } else {
                            "ERR Protocol version is not an integer or out of range"
                        },
                    ))
                }
            }
            index = 2;
        }
        let mut name = None;
        while index < args.len() {
            let option = args[index].to_ascii_uppercase();
            match option.as_slice() {
                b"AUTH" if index + 2 < args.len() => {
                    let reply = self.check_password(Some(&args[index + 1]), &args[index + 2], auth);
                    if reply != OK {
                        return Action::Reply(reply);
                    }
                    index += 3;
                }
                b"SETNAME" if index + 1 < args.len() => {
                    name = Some(args[index + 1].clone());
                    index += 2;
                }
                _ => {
                    return Action::Reply(error_reply(&format!(
                        "ERR Syntax error in HELLO option '{}'",
                        String::from_utf8_lossy(&args[index])
                    )))
                }
            }
        }
        if !self.authenticated {
            return Action::Reply(error_reply(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise \
                 the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the \
                 client and select the RESP protocol version at the same time",
            ));
        }
        if let Some(name) = name {
            if let Err(error) = valid_name(&name) {
                return Action::Reply(error);
            }
            self.name = Some(name);
        }
        self.resp3 = protocol == 3;
        let id = self.id.to_string();
        let fields: [(&[u8], Vec<u8>); 7] = [
            (b"server", bulk(b"redis")),
            (b"version", bulk(b"7.0.0")),
            (b"proto", format!(":{protocol}\r\n").into_bytes()),
            (b"id", format!(":{id}\r\n").into_bytes()),
            (b"mode", bulk(b"standalone")),
            (b"role", bulk(b"master")),
            (b"modules", b"*0\r\n".to_vec()),
        ];
        let mut out = if self.resp3 {
            format!("%{}\r\n", fields.len()).into_bytes()
        } else {
            format!("*{}\r\n", 2 * fields.len()).into_bytes()
        };
        for (key, value) in fields {
            encode_bulk(key, &mut out);
            out.extend_from_slice(&value);
        }
        Action::Reply(out)
    }

    fn client(&mut self, args: &[Vec<u8>]) -> Action {
        let sub = args[1].to_ascii_uppercase();
        let arity_error = || {
            Action::Reply(error_reply(&format!(
                "ERR wrong number of arguments for 'client|{}' command",
                String::from_utf8_lossy(&args[1]).to_ascii_lowercase()
            )))
        };
        let reply = match (sub.as_slice(), args.len()) {
            (b"ID", 2) => format!(":{}\r\n", self.id).into_bytes(),
            (b"GETNAME", 2) => match &self.name {
                Some(name) => bulk(name),
                None => b"$-1\r\n".to_vec(),
            },
            (b"SETNAME", 3) => match valid_name(&args[2]) {
                Ok(()) => {
                    self.name = (!args[2].is_empty()).then(|| args[2].clone());
                    OK.to_vec()
                }
                Err(error) => error,
            },
            (b"SETINFO", 4) => {
                let attribute = args[2].to_ascii_uppercase();
                match attribute.as_slice() {
                    b"LIB-NAME" | b"LIB-VER" => match valid_name(&args[3]) {
                        Ok(()) => {
                            let value = Some(args[3].clone());
                            if attribute == b"LIB-NAME" {
                                self.lib_name = value;
                            } else {
                                self.lib_ver = value;
                            }
                            OK.to_vec()
                        }
                        Err(error) => error,
                    },
                    _ => error_reply(&format!(
                        "ERR Unrecognized option '{}'",
                        String::from_utf8_lossy(&args[2])
                    )),
                }
            }
            (b"NO-EVICT", 3) | (b"NO-TOUCH", 3) => OK.to_vec(),
            (b"GETREDIR", 2) => b":-1\r\n".to_vec(),
            (b"HELP", 2) => {
                let lines: [&[u8]; 9] = [
                    b"CLIENT <subcommand> through the pmnet gateway:",
                    b"ID, GETNAME, SETNAME <name>, SETINFO LIB-NAME|LIB-VER <value>, INFO,",
                    b"LIST [TYPE type|ID id...], KILL (the gateway's clients), NO-EVICT|NO-TOUCH",
                    b"ON|OFF, GETREDIR. TRACKING, CACHING, TRACKINGINFO go to Redis on a direct",
                    b"connection (--redis); PAUSE, UNPAUSE, UNBLOCK and REPLY are not supported",
                    b"here: run them against Redis directly.",
                    b"",
                    b"See docs/redis.md.",
                    b"HELP",
                ];
                let mut out = format!("*{}\r\n", lines.len()).into_bytes();
                for line in lines {
                    out.push(b'+');
                    out.extend_from_slice(line);
                    out.extend_from_slice(b"\r\n");
                }
                out
            }
            (
                b"ID" | b"GETNAME" | b"SETNAME" | b"SETINFO" | b"NO-EVICT" | b"NO-TOUCH"
                | b"GETREDIR" | b"HELP",
                _,
            ) => return arity_error(),
            // `INFO`, `LIST` and `KILL` are answered over every connection (gateway/clients.rs).
            (
                b"PAUSE" | b"UNPAUSE" | b"UNBLOCK" | b"TRACKING" | b"CACHING" | b"REPLY"
                | b"TRACKINGINFO",
                _,
            ) => error_reply(&format!(
                "ERR CLIENT {} is not supported through the pmnet gateway: run it against Redis \
                 directly",
                String::from_utf8_lossy(&sub)
            )),
            _ => crate::table::unknown_subcommand_reply("CLIENT", &args[1]),
        };
        Action::Reply(reply)
    }
}

/// Redis's rule for client names and library attributes.
fn valid_name(name: &[u8]) -> Result<(), Vec<u8>> {
    if name.iter().any(|&b| !(b'!'..=b'~').contains(&b)) {
        return Err(error_reply(
            "ERR Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    Ok(())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The keys a write command writes, where it also names keys it only reads (whose watch
/// Redis leaves alone): the destination of the `…STORE` commands, `PFMERGE`, `BITOP` and
/// `COPY`, and `SORT`'s `STORE` key. `None` for the other commands (all their keys count).
fn written_keys<'a>(full: &str, args: &'a [Vec<u8>]) -> Option<Vec<&'a [u8]>> {
    let at = |index: usize| args.get(index).map(Vec::as_slice);
    let after = |word: &[u8]| {
        args.windows(2)
            .rev()
            .find(|pair| pair[0].eq_ignore_ascii_case(word))
            .map(|pair| pair[1].as_slice())
    };
    let one = |key: Option<&'a [u8]>| Some(key.into_iter().collect());
    match full {
        "pfmerge" | "sunionstore" | "sinterstore" | "sdiffstore" | "zunionstore"
        | "zinterstore" | "zdiffstore" | "zrangestore" | "geosearchstore" => one(at(1)),
        "bitop" | "copy" => one(at(2)),
        "sort" => one(after(b"STORE")),
        "georadius" | "georadiusbymember" => Some(
            [after(b"STORE"), after(b"STOREDIST")]
                .into_iter()
                .flatten()
                .collect(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    fn state() -> ConnState {
        ConnState::new(7, None, None, &Auth::default())
    }

    fn reply(state: &mut ConnState, words: &[&str]) -> Vec<u8> {
        let words = args(words);
        let name = words[0].to_ascii_uppercase();
        match state.handle(
            std::str::from_utf8(&name).unwrap(),
            &words,
            &Auth::default(),
        ) {
            Action::Reply(bytes) => bytes,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn hello_switches_protocols_and_answers_a_map_in_resp3() {
        let mut conn = state();
        let two = reply(&mut conn, &["HELLO", "2"]);
        assert!(two.starts_with(b"*14\r\n$6\r\nserver\r\n$5\r\nredis\r\n"));
        assert!(!conn.resp3);
        let three = reply(&mut conn, &["HELLO", "3", "SETNAME", "app"]);
        assert!(three.starts_with(b"%7\r\n"));
        assert!(three.windows(8).any(|w| w == b"proto\r\n:"));
        assert!(conn.resp3);
        assert_eq!(conn.name.as_deref(), Some(&b"app"[..]));
        assert_eq!(
            reply(&mut conn, &["HELLO", "4"]),
            b"-NOPROTO unsupported protocol version\r\n"
        );
        assert!(conn.resp3, "a refused HELLO changes nothing");
    }

    #[test]
    fn auth_is_checked_by_the_gateway_when_it_has_a_password() {
        let auth = Auth {
            password: Some(b"secret".to_vec()),
        };
        let mut conn = ConnState::new(1, None, None, &auth);
        assert!(!conn.authenticated);
        let attempt = |conn: &mut ConnState, words: &[&str]| match conn.handle(
            &words[0].to_ascii_uppercase(),
            &args(words),
            &auth,
        ) {
            Action::Reply(bytes) => bytes,
            other => panic!("{other:?}"),
        };
        assert!(attempt(&mut conn, &["HELLO", "3"]).starts_with(b"-NOAUTH"));
        assert!(attempt(&mut conn, &["AUTH", "wrong"]).starts_with(b"-WRONGPASS"));
        assert!(attempt(&mut conn, &["AUTH", "other", "secret"]).starts_with(b"-WRONGPASS"));
        assert!(!conn.authenticated);
        assert!(attempt(&mut conn, &["HELLO", "3", "AUTH", "default", "secret"]).starts_with(b"%"));
        assert!(conn.authenticated);
        let mut open = state();
        assert!(reply(&mut open, &["AUTH", "x"]).starts_with(b"-ERR AUTH <password> called"));
    }

    #[test]
    fn client_names_ids_and_library_info() {
        let mut conn = state();
        assert_eq!(reply(&mut conn, &["CLIENT", "ID"]), b":7\r\n");
        assert_eq!(reply(&mut conn, &["CLIENT", "GETNAME"]), b"$-1\r\n");
        assert_eq!(reply(&mut conn, &["CLIENT", "SETNAME", "worker-1"]), OK);
        assert_eq!(
            reply(&mut conn, &["CLIENT", "GETNAME"]),
            b"$8\r\nworker-1\r\n"
        );
        assert!(reply(&mut conn, &["CLIENT", "SETNAME", "a b"]).starts_with(b"-ERR Client names"));
        assert_eq!(
            reply(&mut conn, &["CLIENT", "SETINFO", "LIB-NAME", "redis-py"]),
            OK
        );
        assert_eq!(conn.lib_name.as_deref(), Some(&b"redis-py"[..]));
        assert!(reply(&mut conn, &["CLIENT", "PAUSE", "1"]).starts_with(b"-ERR CLIENT PAUSE"));
        assert!(reply(&mut conn, &["CLIENT", "NOPE"]).starts_with(b"-ERR unknown subcommand"));
        assert!(reply(&mut conn, &["CLIENT", "ID", "x"]).starts_with(b"-ERR wrong number"));
    }

    /// A table of a few commands with their key positions, as Redis 7's `COMMAND` gives them.
    fn keyed_table() -> CommandTable {
        use crate::table::tests::keyed_entry as entry;
        CommandTable::from_reply(&crate::resp::Value::Array(Some(vec![
            entry("get", 2, &["readonly"], (1, 1, 1), vec![]),
            entry("rpush", -3, &["write"], (1, 1, 1), vec![]),
            entry("mset", -3, &["write"], (1, -1, 2), vec![]),
            entry("flushdb", -1, &["write"], (0, 0, 0), vec![]),
            entry(
                "eval",
                -3,
                &["noscript", "may_replicate", "movablekeys"],
                (0, 0, 0),
                vec![],
            ),
            entry(
                "zunionstore",
                -4,
                &["write", "movablekeys"],
                (1, 1, 1),
                vec![],
            ),
            entry("pfmerge", -2, &["write"], (1, -1, 1), vec![]),
            entry("ltrim", 4, &["write"], (1, 1, 1), vec![]),
            entry("sort", -2, &["write", "movablekeys"], (1, 1, 1), vec![]),
        ])))
        .unwrap()
    }

    /// The next EXEC's reply, after `WATCH k` (whose fingerprint says it existed, or not) and
    /// the connection's own `command`.
    fn exec_after_own(existed: bool, command: &[&str]) -> Option<Vec<u8>> {
        let mut conn = state();
        let Action::Watch { keys, .. } =
            conn.handle("WATCH", &args(&["WATCH", "k"]), &Auth::default())
        else {
            panic!("a watch")
        };
        let print: &[u8] = if existed {
            b"*1\r\n$3\r\nab:\r\n"
        } else {
            b"*1\r\n$0\r\n\r\n"
        };
        assert_eq!(conn.watched(keys, print), OK);
        if conn.may_touch_watched(&args(command), Some(&keyed_table())) {
            conn.touch_watched();
        }
        assert_eq!(reply(&mut conn, &["MULTI"]), OK);
        match conn.handle("EXEC", &args(&["EXEC"]), &Auth::default()) {
            Action::Reply(bytes) => Some(bytes),
            Action::Exec { .. } => None,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_write_of_the_connections_own_to_a_watched_key_fails_the_exec() {
        // Redis fails the EXEC even when the key was changed back (fingerprints cannot see it).
        let failed = Some(b"*-1\r\n".to_vec());
        assert_eq!(exec_after_own(false, &["RPUSH", "k", "v"]), failed);
        assert_eq!(exec_after_own(false, &["MSET", "a", "1", "k", "2"]), failed);
        assert_eq!(exec_after_own(true, &["FLUSHDB"]), failed);
        assert_eq!(
            exec_after_own(false, &["EVAL", "return 1", "1", "k"]),
            failed
        );
        // Reads, other keys, a flush of nothing watched that existed: it runs.
        assert_eq!(exec_after_own(true, &["GET", "k"]), None);
        assert_eq!(exec_after_own(true, &["RPUSH", "other", "v"]), None);
        assert_eq!(
            exec_after_own(true, &["MSET", "other", "k", "x", "y"]),
            None,
            "k as a value"
        );
        assert_eq!(exec_after_own(false, &["FLUSHDB"]), None);
    }

    #[test]
    fn a_watched_key_a_write_only_reads_is_not_marked() {
        let failed = Some(b"*-1\r\n".to_vec());
        // The watched key as a source: Redis leaves it alone.
        assert_eq!(exec_after_own(false, &["PFMERGE", "dest", "k"]), None);
        assert_eq!(
            exec_after_own(true, &["ZUNIONSTORE", "dest", "1", "k"]),
            None
        );
        assert_eq!(exec_after_own(true, &["SORT", "k", "STORE", "dest"]), None);
        // As the destination: marked.
        assert_eq!(exec_after_own(false, &["PFMERGE", "k", "src"]), failed);
        assert_eq!(
            exec_after_own(false, &["ZUNIONSTORE", "k", "1", "src"]),
            failed
        );
        assert_eq!(
            exec_after_own(false, &["SORT", "src", "STORE", "k"]),
            failed
        );
        // LTRIM of a missing key marks nothing; of one that existed, it marks it.
        assert_eq!(exec_after_own(false, &["LTRIM", "k", "1", "1"]), None);
        assert_eq!(exec_after_own(true, &["LTRIM", "k", "0", "-1"]), failed);
    }

    #[test]
    fn a_transaction_is_queued_and_sent_whole_with_its_watches() {
        let mut conn = state();
        let watch = conn.handle("WATCH", &args(&["WATCH", "k"]), &Auth::default());
        let Action::Watch { keys, .. } = watch else {
            panic!("{watch:?}")
        };
        assert_eq!(conn.watched(keys, b"*1\r\n$3\r\nab:\r\n"), OK);
        assert_eq!(reply(&mut conn, &["MULTI"]), OK);
        assert_eq!(
            reply(&mut conn, &["MULTI"]),
            b"-ERR MULTI calls can not be nested\r\n"
        );
        assert_eq!(
            conn.queue(&args(&["SET", "k", "v"]), &Route::Update { ack: OK }, None),
            b"+QUEUED\r\n"
        );
        assert_eq!(
            conn.queue(&args(&["INCR", "n"]), &Route::Bypass, None),
            b"+QUEUED\r\n"
        );
        let exec = conn.handle("EXEC", &args(&["EXEC"]), &Auth::default());
        let Action::Exec {
            payload, commands, ..
        } = exec
        else {
            panic!("{exec:?}")
        };
        assert_eq!(commands.len(), 2);
        let expected = crate::resp::command_bytes(&[
            "PMNET.EXEC",
            "1",
            "0",
            "k",
            "ab:",
            "2",
            "3",
            "SET",
            "k",
            "v",
            "2",
            "INCR",
            "n",
        ]);
        assert_eq!(payload, expected);
        assert!(!conn.in_transaction());
        assert_eq!(reply(&mut conn, &["EXEC"]), b"-ERR EXEC without MULTI\r\n");
    }

    #[test]
    fn connection_commands_run_in_their_place_and_count_once_the_transaction_ran() {
        let mut conn = state();
        let queue = |conn: &mut ConnState, words: &[&str]| {
            let words = args(words);
            let route = crate::commands::route(&words, &Default::default());
            conn.queue(&words, &route, None)
        };
        for _ in 0..2 {
            reply(&mut conn, &["MULTI"]);
            for words in [
                &["CLIENT", "SETNAME", "a"][..],
                &["CLIENT", "GETNAME"],
                &["SELECT", "3"],
                &["SET", "k", "v"],
                &["UNWATCH"],
            ] {
                assert_eq!(queue(&mut conn, words), b"+QUEUED\r\n", "{words:?}");
            }
            let exec = conn.handle("EXEC", &args(&["EXEC"]), &Auth::default());
            let Action::Exec {
                payload,
                commands,
                after,
            } = exec
            else {
                panic!("{exec:?}")
            };
            assert_eq!(commands.len(), 5);
            assert!(after.changes_connection());
            let expected = crate::resp::command_bytes(&[
                "PMNET.EXEC",
                "0",
                "5",
                "2",
                "PMNET.REPLY",
                "+OK\r\n",
                "2",
                "PMNET.REPLY",
                "$1\r\na\r\n",
                "2",
                "SELECT",
                "3",
                "3",
                "SET",
                "k",
                "v",
                "2",
                "PMNET.REPLY",
                "+OK\r\n",
            ]);
            assert_eq!(
                String::from_utf8_lossy(&payload),
                String::from_utf8_lossy(&expected)
            );
            // Nothing changes until the transaction ran: a watched key changed (nil array).
            if conn.name.is_none() {
                conn.executed(after, b"*-1\r\n");
                assert_eq!((conn.name.as_deref(), conn.db), (None, 0));
            } else {
                conn.executed(after, b"*5\r\n+OK\r\n$1\r\na\r\n+OK\r\n+OK\r\n+OK\r\n");
                assert_eq!((conn.name.as_deref(), conn.db), (Some(&b"a"[..]), 3));
            }
            conn.name = conn.name.take().or(Some(b"before".to_vec()));
        }
    }

    #[test]
    fn an_error_while_queueing_aborts_the_transaction() {
        let mut conn = state();
        reply(&mut conn, &["MULTI"]);
        let refused = conn.queue(
            &args(&["SET", "k"]),
            &Route::Reply(error_reply(
                "ERR wrong number of arguments for 'set' command",
            )),
            None,
        );
        assert!(refused.starts_with(b"-ERR wrong number"));
        assert!(reply(&mut conn, &["EXEC"]).starts_with(b"-EXECABORT"));
        // Checked against Redis's table as Redis checks it.
        let table = crate::table::tests::table();
        for (words, error) in [
            (
                &["NOPE", "k"][..],
                "-ERR unknown command 'NOPE', with args beginning with: 'k' \r\n",
            ),
            (
                &["CONFIG", "nope"],
                "-ERR unknown subcommand 'nope'. Try CONFIG HELP.\r\n",
            ),
            (
                &["get", "a", "b"],
                "-ERR wrong number of arguments for 'get' command\r\n",
            ),
            (
                &["PMNET.REPLY", "+OK\r\n"],
                "-ERR unknown command 'PMNET.REPLY'",
            ),
        ] {
            reply(&mut conn, &["MULTI"]);
            assert_eq!(
                conn.queue(&args(&["GET", "k"]), &Route::Bypass, Some(&table)),
                b"+QUEUED\r\n"
            );
            let refused = conn.queue(&args(words), &Route::Bypass, Some(&table));
            assert!(
                refused.starts_with(error.as_bytes()),
                "{words:?}: {}",
                String::from_utf8_lossy(&refused)
            );
            assert!(reply(&mut conn, &["EXEC"]).starts_with(b"-EXECABORT"));
        }
        // The adaptor's own words are refused without the table too.
        reply(&mut conn, &["MULTI"]);
        assert!(conn
            .queue(&args(&["pmnet.reply", "x"]), &Route::Bypass, None)
            .starts_with(b"-ERR unknown command 'pmnet.reply'"));
        assert!(reply(&mut conn, &["EXEC"]).starts_with(b"-EXECABORT"));
        reply(&mut conn, &["MULTI"]);
        assert_eq!(reply(&mut conn, &["DISCARD"]), OK);
        assert_eq!(
            reply(&mut conn, &["DISCARD"]),
            b"-ERR DISCARD without MULTI\r\n"
        );
    }
}
