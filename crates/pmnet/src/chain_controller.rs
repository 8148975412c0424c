//! `pmnet chain-controller`: the chain store's control plane as a process of its own
//! (docs/netchain.md, "The controller"). It keeps the members' chains per virtual group,
//! renews the members' leases as their statuses come, takes a member that stops answering out
//! of its chains, brings a live member into the chains that lack one, and answers clients
//! asking for the configuration. Its state (the configuration) is saved to `--state` — written
//! to a new file, fsynced, renamed over the old one, the directory fsynced — before any member
//! or client sees an epoch, and taken back at a restart.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use pmnet_netchain::{decode_state, Controller, ControllerConfig};
use pmnet_runtime::{ControllerRuntime, Shutdown};

use crate::CliError;

#[derive(Debug, Clone, Args)]
#[command(
    after_long_help = "Example (three members and a spare, docs/netchain.md; every member \
    and client with the same --key-file):\n  \
    pmnet chain-controller --listen 10.0.0.20:7700 --key-file pmnet.key \
    --member 10.0.0.21:7400 --member 10.0.0.22:7400 --member 10.0.0.23:7400 \
    --member 10.0.0.24:7400"
)]
pub struct ChainControllerArgs {
    /// Address the members and clients reach the controller at.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7700",
          value_parser = crate::addr::parse_addr)]
    pub listen: SocketAddr,

    /// A member (a device started with --chain-controller); repeat, at most 16. The first
    /// --chain-length make the chains at the first start, the others are spares; with a saved
    /// state, members not in it join as spares.
    #[arg(long = "member", value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub members: Vec<SocketAddr>,

    /// Virtual groups of keys (fixed at the first start).
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub groups: u16,

    /// Members in each group's chain (f + 1: tolerates f failures).
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u8).range(1..=16))]
    pub chain_length: u8,

    /// Where the controller's state is saved (made at the first start, taken back after).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "pmnet-chain-controller.state"
    )]
    pub state: PathBuf,

    /// A member with no status for this long is suspected (its lease then runs out before it
    /// is taken out of its chains).
    #[arg(long, value_name = "MS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(5..=60_000))]
    pub suspect_after_ms: u64,

    /// How long a member answers clients after the status a grant answers.
    #[arg(long, value_name = "MS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(5..=60_000))]
    pub lease_ms: u64,

    /// The event loop, metrics, report line and keys (`--key-file`: the members and clients
    /// hold the same; without it only a loopback --listen is allowed, see --insecure).
    #[command(flatten)]
    pub run: crate::node::LoopArgs,
}

pub fn run(args: ChainControllerArgs) -> Result<ExitCode, CliError> {
    let keys = crate::node::keys_of(args.run.key_file.as_deref())?;
    crate::protect::check(
        "chain-controller",
        &[crate::protect::Listener::Addr("--listen", args.listen)],
        keys.is_some(),
        args.run.insecure,
    )?;
    let traffic = pmnet_runtime::auth_text(keys.as_ref());
    let config = ControllerConfig {
        chain_length: usize::from(args.chain_length),
        suspect_after: Duration::from_millis(args.suspect_after_ms),
        lease: Duration::from_millis(args.lease_ms),
        auth: keys.map(pmnet_proto::Authenticator::new),
        ..ControllerConfig::default()
    };
    let clock = pmnet_runtime::Clock::new();
    let now = || clock.now();
    let state_error =
        |what: String| format!("chain controller state {}: {what}", args.state.display());
    let mut controller = if args.state.exists() {
        let bytes = std::fs::read(&args.state).map_err(|error| state_error(error.to_string()))?;
        let layout = decode_state(&bytes).map_err(|error| {
            state_error(format!(
                "{error}; move it aside to start with a new configuration"
            ))
        })?;
        if usize::from(args.groups) != layout.groups.len() {
            return Err(state_error(format!(
                "it has {} virtual groups, --groups says {} (the groups are fixed at the first \
                 start)",
                layout.groups.len(),
                args.groups
            ))
            .into());
        }
        Controller::restore(config, layout, &args.members, now())
            .map_err(|error| state_error(error.to_string()))?
    } else {
        if args.members.is_empty() {
            return Err(
                "chain-controller: give the members with --member ADDR (repeat), \
                        at least one"
                    .to_owned()
                    .into(),
            );
        }
        Controller::new(config, &args.members, args.groups, now())
            .map_err(|error| format!("chain-controller: {error}"))?
    };
    // Without keys: say so, at most once a minute, while other hosts send to it.
    controller.warn_of_plain_traffic();
    let shutdown = Shutdown::on_signals()?;
    let layout = controller.layout().clone();
    let mut runtime = ControllerRuntime::open(
        clock,
        controller,
        args.listen,
        args.state.clone(),
        args.run.loop_options(),
        shutdown,
    )
    .map_err(|error| format!("chain-controller: {error}"))?;
    println!("chain controller listening on {}", runtime.local_addr());
    println!(
        "  chains: {} members, {} virtual groups, chains of {}; a member is suspected after {} \
         ms without a status, leases of {} ms",
        layout.members.len(),
        layout.groups.len(),
        args.chain_length,
        args.suspect_after_ms,
        args.lease_ms,
    );
    println!(
        "  state: {} (saved with write, fsync, rename, directory fsync before any epoch is sent)",
        args.state.display()
    );
    println!("  traffic: {traffic}");
    println!("  {}", args.run.describe(runtime.metrics_addr()));
    pmnet_runtime::describe_layout(&layout);
    runtime.run()?;
    Ok(ExitCode::SUCCESS)
}
