//! Transactions and watched keys inside Redis: the gateway queues a client's `MULTI … EXEC`
//! and sends it whole as `PMNET.EXEC watched [db key fingerprint]… count [words word…]…`
//! (`crates/redis/src/adaptor/translation.rs`); the module checks the commands as Redis checks
//! queued commands (an unknown one discards the whole transaction), compares the watched
//! keys' fingerprints, and runs the commands one after another in the request's execution
//! unit, their replies as `EXEC`'s array. A key's fingerprint (`PMNET.WATCH`) is the SHA-1 of
//! its `DUMP` and its `PEXPIRETIME`, as the adaptor's scripts compute it, so a transaction
//! watched through one is checked by the other.

use pmnet_redis::adaptor::{ABORT, DB_OUT_OF_RANGE, REPLY_WORD};
use pmnet_redis::resp::{encode_bulk, error_reply};
use pmnet_redis::table::Run;

use crate::apply::Applier;
use crate::call::{Mode, Redis};

impl Applier {
    /// `PMNET.WATCH key…` in `db`: the keys' fingerprints, as an array of bulk strings.
    pub(crate) fn watch(&self, redis: &Redis, db: u32, keys: &[Vec<u8>]) -> Vec<u8> {
        redis.select(db);
        let mut out = format!("*{}\r\n", keys.len()).into_bytes();
        for key in keys {
            encode_bulk(&fingerprint(redis, key), &mut out);
        }
        out
    }

    /// `PMNET.EXEC …` starting in `db`: the reply `EXEC` gives (the nil array when a watched
    /// key changed), or an `EXECABORT` error for a transaction Redis would discard.
    pub(crate) fn transaction(&mut self, redis: &Redis, db: u32, args: &[Vec<u8>]) -> Vec<u8> {
        let parsed = match self.parse_transaction(args) {
            Ok(parsed) => parsed,
            Err(message) => return error_reply(&message),
        };
        for (watched_db, key, print) in &parsed.watched {
            redis.select(*watched_db);
            if fingerprint(redis, key) != *print {
                return b"*-1\r\n".to_vec();
            }
        }
        let mut db = db;
        let mut out = format!("*{}\r\n", parsed.commands.len()).into_bytes();
        for command in &parsed.commands {
            match command {
                Element::Reply(reply) => out.extend_from_slice(reply),
                Element::Select(n) => {
                    db = *n;
                    out.extend_from_slice(pmnet_redis::commands::OK);
                }
                Element::Run(words) => {
                    redis.select(db);
                    let mut reply = redis.call(Mode::Request, words);
                    if reply.starts_with(b"-NOSCRIPT")
                        && words[0].eq_ignore_ascii_case(b"EVALSHA")
                        && self.reload_script(redis, &words[1])
                    {
                        redis.select(db);
                        reply = redis.call(Mode::Request, words);
                    }
                    out.extend_from_slice(&reply);
                }
            }
        }
        out
    }

    fn parse_transaction(&self, args: &[Vec<u8>]) -> Result<Transaction, String> {
        let exec = pmnet_redis::adaptor::parse_exec(args, |db| self.is_user_db(db))?;
        let commands = (exec.commands.into_iter())
            .map(|command| self.element(command))
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Transaction {
            watched: exec.watched,
            commands,
        })
    }

    /// One queued command: as Redis would run it at `EXEC`, or the reply in its place.
    fn element(&self, command: &[Vec<u8>]) -> Result<Element, String> {
        if command[0].eq_ignore_ascii_case(REPLY_WORD) && command.len() == 2 {
            return Ok(Element::Reply(command[1].clone()));
        }
        let name = match self.table.find(command) {
            Ok((name, _)) => name,
            Err(why) => return Err(format!("{ABORT}: {}", why.trim_start_matches("ERR "))),
        };
        if name == "select" {
            return Ok(
                match pmnet_redis::adaptor::check_select(&command[1], |db| self.is_user_db(db)) {
                    Ok(db) => Element::Select(db),
                    Err(message) => Element::Reply(error_reply(message)),
                },
            );
        }
        if let Run::Refuse(why) = self.table.classify(command, self.record_db) {
            if why == DB_OUT_OF_RANGE {
                return Ok(Element::Reply(error_reply(&why)));
            }
            if name != "publish" {
                return Err(format!("{ABORT}: {}", why.trim_start_matches("ERR ")));
            }
        }
        Ok(Element::Run(command.to_vec()))
    }
}

struct Transaction {
    watched: Vec<(u32, Vec<u8>, Vec<u8>)>,
    commands: Vec<Element>,
}

enum Element {
    Reply(Vec<u8>),
    Select(u32),
    Run(Vec<Vec<u8>>),
}

/// A key's fingerprint in the selected database: the SHA-1 of its serialized value and its
/// expiry time (`hex:ms`, `-1` without one), or empty when it does not exist.
fn fingerprint(redis: &Redis, key: &[u8]) -> Vec<u8> {
    let dump = redis.call(Mode::Read, &[b"DUMP".as_slice(), key]);
    let Ok(Some((pmnet_redis::resp::Value::Bulk(Some(value)), _))) = pmnet_redis::resp::parse_value(
        &dump,
        &pmnet_redis::resp::Limits::gateway(1 << 20, 1 << 30),
    ) else {
        return Vec::new();
    };
    let expiry = redis.call(Mode::Read, &[b"PEXPIRETIME".as_slice(), key]);
    let expiry = expiry
        .strip_prefix(b":")
        .and_then(|rest| rest.strip_suffix(b"\r\n"))
        .unwrap_or(b"-1");
    let mut print = sha1_smol::Sha1::from(&value)
        .digest()
        .to_string()
        .into_bytes();
    print.push(b':');
    print.extend_from_slice(expiry);
    print
}
