//! `pmnet kv`: the chain store's client (docs/netchain.md): get, put, delete and
//! compare-and-set of a key, and locks with an owner and a lease built on them.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use pmnet_netchain::{rotated_groups, ClientConfig, ClientOp, Outcome};
use pmnet_runtime::ChainSession;

use crate::chain_lock::{self, failed, try_lock, LockAttempt, UnlockAttempt};
use crate::CliError;

#[derive(Debug, Args)]
pub struct KvArgs {
    /// A member of the chain store, in the order the members were given (repeat for each, as
    /// to `pmnet device --chain-member`).
    #[arg(long = "member", value_name = "ADDR", required_unless_present = "controller",
          conflicts_with = "controller", value_parser = crate::addr::parse_addr)]
    pub members: Vec<SocketAddr>,

    /// The chain controller (`pmnet controller`, or `pmnet chain-controller`): the chains
    /// come from it, and follow it through failover and recovery. Repeat for each controller
    /// of an etcd control plane (at most 7): the configuration comes from whichever leads.
    #[arg(long, value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub controller: Vec<SocketAddr>,

    /// Virtual groups of keys, as the members were given (`--chain-groups`).
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u16).range(1..=4096))]
    pub groups: u16,

    /// Milliseconds to wait for an answer before the request fails (its outcome unknown).
    #[arg(long, value_name = "MS", default_value_t = 5_000,
          value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub timeout_ms: u64,

    /// Authenticate every datagram with the deployment keys in this file (mode 0600; the
    /// members' and the controller's --key-file). Without it nothing is authenticated, and
    /// members with keys drop every request.
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<std::path::PathBuf>,

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
        if args.controller.len() > pmnet_netchain::MAX_CONTROLLERS {
            return Err(format!(
                "--controller: at most {} controllers (given {})",
                pmnet_netchain::MAX_CONTROLLERS,
                args.controller.len()
            )
            .into());
        }
        let session = rand::random::<u64>() | 1;
        let (mut config, toward) = match args.controller.split_first() {
            Some((controller, standbys)) => (
                ClientConfig {
                    standby_controllers: standbys.to_vec(),
                    ..ClientConfig::controlled(session, *controller)
                },
                *controller,
            ),
            None => (
                ClientConfig::new(session, rotated_groups(&args.members, args.groups)),
                args.members[0],
            ),
        };
        config.request_lifetime = Duration::from_millis(args.timeout_ms);
        config.auth =
            crate::node::keys_of(args.key_file.as_deref())?.map(pmnet_proto::Authenticator::new);
        Ok(Session {
            inner: ChainSession::open(config, toward)?,
        })
    }

    /// A key the members take: 1 to 64 bytes.
    fn check_key(&self, key: &str) -> Result<(), CliError> {
        if key.is_empty() || key.len() > 64 {
            return Err("a key is 1 to 64 bytes".to_owned().into());
        }
        Ok(())
    }

    /// Run one request to its outcome.
    fn run(&mut self, key: &str, op: ClientOp) -> Result<Outcome, CliError> {
        self.check_key(key)?;
        Ok(self.inner.run(key.as_bytes(), op)?)
    }
}

pub fn run(args: KvArgs) -> Result<ExitCode, CliError> {
    let mut session = Session::open(&args)?;
    let result = run_op(&args, &mut session);
    match result {
        Err(error) if error.to_string().starts_with("no answer") => {
            // Say why, when authentication is the likely cause.
            let drops: Vec<String> = session
                .inner
                .drops()
                .iter()
                .map(|(reason, count)| format!("{count} {reason}"))
                .collect();
            let hint = if !drops.is_empty() {
                format!(
                    "; answers that failed authentication were dropped ({}): give the members' \
                     and controller's --key-file",
                    drops.join(", ")
                )
            } else if args.key_file.is_none() {
                "; if the members run with --key-file, give this command the same --key-file"
                    .to_owned()
            } else {
                String::new()
            };
            Err(format!("{error}{hint}").into())
        }
        other => other,
    }
}

fn run_op(args: &KvArgs, session: &mut Session) -> Result<ExitCode, CliError> {
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
            other => Err(failed(&other)),
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
        } => lock(session, name, owner, *lease_ms),
        KvOp::Unlock { name, owner } => unlock(session, name, owner),
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
        other => Err(failed(&other)),
    }
}

fn lock(
    session: &mut Session,
    name: &str,
    owner: &str,
    lease_ms: u64,
) -> Result<ExitCode, CliError> {
    session.check_key(name)?;
    match try_lock(&mut session.inner, name, owner, lease_ms)? {
        LockAttempt::Taken { version } => {
            println!("locked by {owner} for {lease_ms} ms (version {version})");
            Ok(ExitCode::SUCCESS)
        }
        LockAttempt::Held { holder, ms_left } => {
            println!("held by {holder} for {ms_left} ms more");
            Ok(ExitCode::FAILURE)
        }
        LockAttempt::TakenMeanwhile { holder } => {
            println!(
                "taken meanwhile by {}",
                holder.as_deref().unwrap_or("another")
            );
            Ok(ExitCode::FAILURE)
        }
    }
}

fn unlock(session: &mut Session, name: &str, owner: &str) -> Result<ExitCode, CliError> {
    session.check_key(name)?;
    let (text, code) = match chain_lock::unlock(&mut session.inner, name, owner, None)? {
        UnlockAttempt::Released => ("unlocked".to_owned(), ExitCode::SUCCESS),
        UnlockAttempt::NotYours { holder } => {
            (format!("not yours: held by {holder}"), ExitCode::FAILURE)
        }
        UnlockAttempt::NotHeld => ("not held".to_owned(), ExitCode::FAILURE),
        UnlockAttempt::ChangedMeanwhile => (
            "changed meanwhile: not released".to_owned(),
            ExitCode::FAILURE,
        ),
    };
    println!("{text}");
    Ok(code)
}
