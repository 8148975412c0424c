//! `pmnet kv`: the chain store's client (docs/netchain.md): get, put, delete and
//! compare-and-set of a key, and locks with an owner and a lease built on them.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use pmnet_netchain::{rotated_groups, ClientConfig, ClientOp, Outcome};
use pmnet_runtime::ChainSession;

use crate::CliError;

#[derive(Debug, Args)]
pub struct KvArgs {
    /// A member of the chain store, in the order the members were given (repeat for each, as
    /// to `pmnet device --chain-member`).
    #[arg(long = "member", value_name = "ADDR", required_unless_present = "controller",
          conflicts_with = "controller", value_parser = crate::addr::parse_addr)]
    pub members: Vec<SocketAddr>,

    /// The chain controller (`pmnet chain-controller`): the chains come from it, and follow
    /// it through failover and recovery.
    #[arg(long, value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub controller: Option<SocketAddr>,

    /// Virtual groups of keys, as the members were given (`--chain-groups`).
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub groups: u16,

    /// Milliseconds to wait for an answer before the request fails (its outcome unknown).
    #[arg(long, value_name = "MS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub timeout_ms: u64,

    #[command(subcommand)]
    pub op: KvOp,
}

#[derive(Debug, Subcommand)]
pub enum KvOp {
    /// Print a key's value (`(nil)` if it has none) and, on stderr, its version.
    Get { key: String },
    /// Set a key's value.
    Put { key: String, value: String },
    /// Delete a key.
    Delete { key: String },
    /// Set a key's value if it holds version EXPECTED (0: if it has no value).
    Cas {
        key: String,
        expected: u64,
        value: String,
    },
    /// Take a lock: it is free (no value, or an expired lease) or OWNER's already; it stays
    /// OWNER's for LEASE_MS unless released or taken again.
    Lock {
        name: String,
        #[arg(long)]
        owner: String,
        #[arg(long, value_name = "MS", default_value_t = 10_000)]
        lease_ms: u64,
    },
    /// Release a lock OWNER holds.
    Unlock {
        name: String,
        #[arg(long)]
        owner: String,
    },
}

/// One blocking session over a UDP socket.
struct Session {
    inner: ChainSession,
}

impl Session {
    fn open(args: &KvArgs) -> Result<Session, CliError> {
        let session = rand::random::<u64>() | 1;
        let (mut config, toward) = match args.controller {
            Some(controller) => (ClientConfig::controlled(session, controller), controller),
            None => (
                ClientConfig::new(session, rotated_groups(&args.members, args.groups)),
                args.members[0],
            ),
        };
        config.request_lifetime = Duration::from_millis(args.timeout_ms);
        Ok(Session {
            inner: ChainSession::open(config, toward)?,
        })
    }

    /// Run one request to its outcome.
    fn run(&mut self, key: &str, op: ClientOp) -> Result<Outcome, CliError> {
        if key.is_empty() || key.len() > 64 {
            return Err("a key is 1 to 64 bytes".to_owned().into());
        }
        Ok(self.inner.run(key.as_bytes(), op)?)
    }
}

fn unknown() -> CliError {
    "no answer in time: the request may or may not have been applied"
        .to_owned()
        .into()
}

fn refused(outcome: &Outcome) -> CliError {
    match outcome {
        Outcome::Full => "refused: the table has no room near this key"
            .to_owned()
            .into(),
        Outcome::Refused(status) => format!(
            "refused ({status:?}): the members' configuration (--member order, --groups) \
             differs from this one's, or the request is malformed"
        )
        .into(),
        _ => unknown(),
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// A lock's value: "OWNER EXPIRY_MS"; empty or absent: free.
fn lock_holder(value: Option<&[u8]>) -> Option<(String, u64)> {
    let text = std::str::from_utf8(value?).ok()?;
    let (owner, expiry) = text.rsplit_once(' ')?;
    Some((owner.to_owned(), expiry.parse().ok()?))
}

pub fn run(args: KvArgs) -> Result<ExitCode, CliError> {
    let mut session = Session::open(&args)?;
    match &args.op {
        KvOp::Get { key } => match session.run(key, ClientOp::Get)? {
            Outcome::Value { version, value } => {
                match value {
                    Some(value) => println!("{}", String::from_utf8_lossy(&value)),
                    None => println!("(nil)"),
                }
                eprintln!("version {version}");
                Ok(ExitCode::SUCCESS)
            }
            other => Err(refused(&other)),
        },
        KvOp::Put { key, value } => {
            written(session.run(key, ClientOp::Put(value.as_bytes().to_vec()))?)
        }
        KvOp::Delete { key } => written(session.run(key, ClientOp::Delete)?),
        KvOp::Cas {
            key,
            expected,
            value,
        } => {
            let op = ClientOp::CompareAndSet {
                expected: *expected,
                value: value.as_bytes().to_vec(),
            };
            written(session.run(key, op)?)
        }
        KvOp::Lock {
            name,
            owner,
            lease_ms,
        } => lock(&mut session, name, owner, *lease_ms),
        KvOp::Unlock { name, owner } => unlock(&mut session, name, owner),
    }
}

fn written(outcome: Outcome) -> Result<ExitCode, CliError> {
    match outcome {
        Outcome::Written { version } => {
            println!("OK (version {version})");
            Ok(ExitCode::SUCCESS)
        }
        Outcome::CompareFailed { version, value } => {
            println!(
                "compare failed: the key holds version {version}: {}",
                String::from_utf8_lossy(&value)
            );
            Ok(ExitCode::FAILURE)
        }
        other => Err(refused(&other)),
    }
}

fn lock(
    session: &mut Session,
    name: &str,
    owner: &str,
    lease_ms: u64,
) -> Result<ExitCode, CliError> {
    if owner.is_empty() || owner.contains(' ') {
        return Err("--owner: a name without spaces".to_owned().into());
    }
    let Outcome::Value { version, value } = session.run(name, ClientOp::Get)? else {
        return Err(unknown());
    };
    let holder = lock_holder(value.as_deref()).filter(|(_, expiry)| *expiry > now_ms());
    if let Some((holder, expiry)) = &holder {
        if holder != owner {
            println!(
                "held by {holder} for {} ms more",
                expiry.saturating_sub(now_ms())
            );
            return Ok(ExitCode::FAILURE);
        }
    }
    let expected = if value.is_some() { version } else { 0 };
    let value = format!("{owner} {}", now_ms() + lease_ms).into_bytes();
    match session.run(name, ClientOp::CompareAndSet { expected, value })? {
        Outcome::Written { version } => {
            println!("locked by {owner} for {lease_ms} ms (version {version})");
            Ok(ExitCode::SUCCESS)
        }
        Outcome::CompareFailed { value, .. } => {
            let holder = lock_holder(Some(&value)).map_or_else(|| "another".to_owned(), |h| h.0);
            println!("taken meanwhile by {holder}");
            Ok(ExitCode::FAILURE)
        }
        other => Err(refused(&other)),
    }
}

fn unlock(session: &mut Session, name: &str, owner: &str) -> Result<ExitCode, CliError> {
    let Outcome::Value { version, value } = session.run(name, ClientOp::Get)? else {
        return Err(unknown());
    };
    match lock_holder(value.as_deref()) {
        Some((holder, _)) if holder == owner => {}
        Some((holder, _)) => {
            println!("not yours: held by {holder}");
            return Ok(ExitCode::FAILURE);
        }
        None => {
            println!("not held");
            return Ok(ExitCode::FAILURE);
        }
    }
    match session.run(
        name,
        ClientOp::CompareAndSet {
            expected: version,
            value: Vec::new(),
        },
    )? {
        Outcome::Written { .. } => {
            println!("unlocked");
            Ok(ExitCode::SUCCESS)
        }
        Outcome::CompareFailed { .. } => {
            println!("changed meanwhile: not released");
            Ok(ExitCode::FAILURE)
        }
        other => Err(refused(&other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_value_names_its_owner_and_expiry() {
        assert_eq!(lock_holder(Some(b"me 1700")), Some(("me".to_owned(), 1700)));
        assert_eq!(lock_holder(Some(b"")), None);
        assert_eq!(lock_holder(None), None);
        assert_eq!(lock_holder(Some(b"me soon")), None);
    }
}
