//! Transactions: a `PMNET.EXEC` from the gateway checked as Redis checks queued commands and
//! put in the form the update script's mode `x` runs (see `crate::script`): commands as they
//! are, and the elements the script knows — a literal reply (`PMNET.REPLY`, a connection
//! command the gateway answered, or an error Redis gives at `EXEC`), a database switch
//! (`PMNET.SELECT`), a user's script (`PMNET.SCRIPT`).

use std::sync::Arc;

use crate::resp::{error_reply, parse_int};
use crate::script;
use crate::table::Run;

use super::pending::Op;
use super::translation::{key_count, ABORT, DB_OUT_OF_RANGE, REPLY_WORD, SCRIPT_WORD, SELECT_WORD};
use super::Adaptor;

/// A `PMNET.EXEC watched [db key fingerprint]… count [words word…]…` read: the watched keys
/// (database, key, fingerprint) and the queued commands. The adaptor's and the Redis module's
/// one reading of it; an `EXECABORT` error when it is malformed.
#[derive(Debug)]
pub struct Exec<'a> {
    pub watched: Vec<(u32, Vec<u8>, Vec<u8>)>,
    pub commands: Vec<&'a [Vec<u8>]>,
}

/// Read `PMNET.EXEC …` (`args[0]` is `PMNET.EXEC`); a watched key's database must be one
/// clients may use (`is_user_db`).
pub fn parse_exec(args: &[Vec<u8>], is_user_db: impl Fn(i64) -> bool) -> Result<Exec<'_>, String> {
    let malformed = || format!("{ABORT}: the transaction payload is malformed");
    let number = |index: usize| -> Result<usize, String> {
        args.get(index)
            .and_then(|word| parse_int(word))
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(malformed)
    };
    let watched_count = number(1)?;
    let mut watched = Vec::with_capacity(watched_count.min(1024));
    for index in 0..watched_count {
        let at = 2 + 3 * index;
        let db = args.get(at).and_then(|word| parse_int(word));
        let (Some(db), Some(key), Some(print)) = (db, args.get(at + 1), args.get(at + 2)) else {
            return Err(malformed());
        };
        if !is_user_db(db) {
            return Err(malformed());
        }
        watched.push((db as u32, key.clone(), print.clone()));
    }
    let mut at = 2 + 3 * watched_count;
    let count = number(at)?;
    at += 1;
    let mut commands = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        let words = number(at)?;
        let command = args.get(at + 1..at + 1 + words).ok_or_else(malformed)?;
        if command.is_empty() {
            return Err(malformed());
        }
        commands.push(command);
        at += 1 + words;
    }
    if at != args.len() {
        return Err(malformed());
    }
    Ok(Exec { watched, commands })
}

impl Adaptor {
    /// `PMNET.EXEC`: checked like Redis checks queued commands (an error aborts it whole),
    /// and put in the form the update script's mode `x` runs.
    pub(super) fn transaction(&mut self, args: &[Vec<u8>]) -> Result<Op, String> {
        let exec = parse_exec(args, |db| self.is_user_db(db))?;
        let mut words = vec![b"x".to_vec(), exec.watched.len().to_string().into_bytes()];
        for (db, key, print) in &exec.watched {
            words.extend([db.to_string().into_bytes(), key.clone(), print.clone()]);
        }
        words.push(exec.commands.len().to_string().into_bytes());
        for command in exec.commands {
            let element = self.transaction_element(command)?;
            words.push(element.len().to_string().into_bytes());
            words.extend(element);
        }
        Ok(Op::Apply(words))
    }

    /// One command of a transaction as the update script runs it: as it is, or one of the
    /// elements it knows (a literal reply, a database switch, a user's script).
    fn transaction_element(&mut self, command: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, String> {
        let literal = |reply: Vec<u8>| vec![REPLY_WORD.to_vec(), reply];
        if command[0].eq_ignore_ascii_case(REPLY_WORD) && command.len() == 2 {
            return Ok(command.to_vec());
        }
        let name = match self.table.find(command) {
            Ok((name, _)) => name,
            Err(why) => return Err(format!("{ABORT}: {}", why.trim_start_matches("ERR "))),
        };
        match name.as_str() {
            "select" => {
                // As Redis answers it at EXEC (see `decode_command`).
                return Ok(
                    match super::translation::check_select(&command[1], |db| self.is_user_db(db)) {
                        Ok(db) => vec![SELECT_WORD.to_vec(), db.to_string().into_bytes()],
                        Err(message) => literal(error_reply(message)),
                    },
                );
            }
            "script|load" | "script|exists" => {
                // Redis will not run SCRIPT in a script: run now on the lookup connection (it
                // reads or changes only the script cache), the reply in its place.
                let answer = self.lookup_command(command)?;
                if name == "script|load" && !answer.is_error() {
                    // Remembered for EVALSHA, also across restarts (the lookup connection is in
                    // the records' database).
                    let sha = self.remember_script(&command[2]);
                    let store = [
                        b"HSET".to_vec(),
                        script::SCRIPTS_KEY.into(),
                        sha.into_bytes(),
                        command[2].clone(),
                    ];
                    self.lookup_command(&store)?;
                }
                let mut reply = Vec::new();
                answer.encode(&mut reply);
                return Ok(literal(reply));
            }
            "eval" | "evalsha" | "eval_ro" | "evalsha_ro" => {
                return Ok(match self.script_element(command, &name) {
                    Ok(element) => element,
                    Err(error) => literal(error_reply(&error)),
                })
            }
            _ => {}
        }
        self.table
            .runs_in_script(command)
            .map_err(|why| format!("{ABORT}: {}", why.trim_start_matches("ERR ")))?;
        if let Run::Refuse(why) = self.table.classify(command, self.options.record_db) {
            if why == DB_OUT_OF_RANGE {
                // Naming the records' database (`MOVE`, `SWAPDB`, `COPY … DB`): Redis's own
                // error at EXEC, in its place, as for a database Redis does not have.
                return Ok(literal(error_reply(&why)));
            }
            if name != "publish" {
                return Err(format!("{ABORT}: {}", why.trim_start_matches("ERR ")));
            }
        }
        Ok(command.to_vec())
    }

    /// A user's script queued in a transaction (`name` is `eval`, `evalsha`, `eval_ro` or
    /// `evalsha_ro`): the update script runs its code as Redis would at `EXEC` (compiled
    /// then, named `@user_script`; read-only for the `_RO` forms and `no-writes` scripts), or
    /// Redis's error.
    fn script_element(&mut self, command: &[Vec<u8>], name: &str) -> Result<Vec<Vec<u8>>, String> {
        let count = key_count(command)?;
        let body: Arc<[u8]> = if name.starts_with("evalsha") {
            let sha = String::from_utf8_lossy(&command[1]).to_ascii_lowercase();
            self.find_script(&sha)
                .ok_or_else(|| "NOSCRIPT No matching script. Please use EVAL.".to_owned())?
        } else {
            self.load_script(&command[1]);
            command[1].as_slice().into()
        };
        let (code, no_writes) = script::strip_shebang(&body);
        let read_only = no_writes || name.ends_with("_ro");
        let mut element = vec![
            SCRIPT_WORD.to_vec(),
            if read_only {
                b"r".to_vec()
            } else {
                b"w".to_vec()
            },
            script::script_sha(&body).into_bytes(),
            code.to_vec(),
        ];
        element.extend_from_slice(&command[2..]);
        debug_assert!(element.len() >= 5 + count);
        Ok(element)
    }
}
