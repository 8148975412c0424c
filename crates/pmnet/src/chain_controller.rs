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
use pmnet_runtime::{ControllerRuntime, Shutdown, StateStore};

use crate::CliError;

/// What every chain controller takes: where it listens, the members, the chains' shape, the
/// timers and the event loop (`pmnet chain-controller` and `pmnet controller`).
#[derive(Debug, Clone, Args)]
pub struct ChainPlanArgs {
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

#[derive(Debug, Clone, Args)]
#[command(
    after_long_help = "Example (three members and a spare, docs/netchain.md; every member \
    and client with the same --key-file):\n  \
    pmnet chain-controller --listen 10.0.0.20:7700 --key-file pmnet.key \
    --member 10.0.0.21:7400 --member 10.0.0.22:7400 --member 10.0.0.23:7400 \
    --member 10.0.0.24:7400\n\nFor a controller that survives the loss of its host, run \
    `pmnet controller` (its state in etcd, two or three of them, one leading)."
)]
pub struct ChainControllerArgs {
    #[command(flatten)]
    pub plan: ChainPlanArgs,

    /// Where the controller's state is saved (made at the first start, taken back after).
    #[arg(
        long,
        value_name = "FILE",
        default_value = "pmnet-chain-controller.state"
    )]
    pub state: PathBuf,
}

/// The controller's configuration from the command line, and its keys' description.
pub(crate) fn controller_config(
    command: &str,
    plan: &ChainPlanArgs,
) -> Result<(ControllerConfig, String), CliError> {
    let keys = crate::node::keys_of(plan.run.key_file.as_deref())?;
    crate::protect::check(
        command,
        &[crate::protect::Listener::Addr("--listen", plan.listen)],
        keys.is_some(),
        plan.run.insecure,
    )?;
    let traffic = pmnet_runtime::auth_text(keys.as_ref());
    let config = ControllerConfig {
        chain_length: usize::from(plan.chain_length),
        suspect_after: Duration::from_millis(plan.suspect_after_ms),
        lease: Duration::from_millis(plan.lease_ms),
        auth: keys.map(pmnet_proto::Authenticator::new),
        ..ControllerConfig::default()
    };
    Ok((config, traffic))
}

/// The controller: from the saved state (`saved`, with where it came from for errors), or new
/// from --member.
pub(crate) fn make_controller(
    command: &str,
    plan: &ChainPlanArgs,
    config: ControllerConfig,
    saved: Option<(String, Vec<u8>)>,
    now: pmnet_proto::Time,
) -> Result<Controller, CliError> {
    let Some((place, bytes)) = saved else {
        if plan.members.is_empty() {
            return Err(format!(
                "{command}: give the members with --member ADDR (repeat), at least one"
            )
            .into());
        }
        return Ok(Controller::new(config, &plan.members, plan.groups, now)
            .map_err(|error| format!("{command}: {error}"))?);
    };
    let state_error = |what: String| format!("chain controller state {place}: {what}");
    let layout = decode_state(&bytes).map_err(|error| {
        state_error(format!(
            "{error}; move it aside to start with a new configuration"
        ))
    })?;
    if usize::from(plan.groups) != layout.groups.len() {
        return Err(state_error(format!(
            "it has {} virtual groups, --groups says {} (the groups are fixed at the first \
             start)",
            layout.groups.len(),
            plan.groups
        ))
        .into());
    }
    Ok(Controller::restore(config, layout, &plan.members, now)
        .map_err(|error| state_error(error.to_string()))?)
}

/// The banner's lines after the first: the chains, the state, the traffic, the loop.
pub(crate) fn print_banner(
    plan: &ChainPlanArgs,
    runtime: &ControllerRuntime,
    state: &str,
    traffic: &str,
) {
    if let Some(controller) = runtime.controller() {
        let layout = controller.layout();
        println!(
            "  chains: {} members, {} virtual groups, chains of {}; a member is suspected after \
             {} ms without a status, leases of {} ms",
            layout.members.len(),
            layout.groups.len(),
            plan.chain_length,
            plan.suspect_after_ms,
            plan.lease_ms,
        );
    }
    if let Some(planner) = runtime.planner() {
        for (server_id, route, spares, removed) in planner.chains() {
            let named = |devices: &[(u16, std::net::SocketAddr)]| {
                devices
                    .iter()
                    .map(|(id, address)| format!("{id}@{address}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let replicas = if route.replicas.is_empty() {
                String::new()
            } else {
                format!(
                    ", replica servers [{}]",
                    route
                        .replicas
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            println!(
                "  device chain of server {server_id} ({}{replicas}): {} > server (epoch {}); \
                 spares: [{}]; taken out: [{}]; a device is taken out after {} ms without a \
                 status",
                route.server,
                named(&route.devices).replace(", ", " > "),
                planner.epoch(),
                named(spares),
                named(removed),
                plan.suspect_after_ms,
            );
        }
    }
    println!("  state: {state}");
    println!("  traffic: {traffic}");
    println!("  {}", plan.run.describe(runtime.metrics_addr()));
    if let Some(controller) = runtime.controller() {
        pmnet_runtime::describe_layout(controller.layout());
    }
}

pub fn run(args: ChainControllerArgs) -> Result<ExitCode, CliError> {
    let plan = &args.plan;
    let (config, traffic) = controller_config("chain-controller", plan)?;
    let clock = pmnet_runtime::Clock::new();
    let saved = if args.state.exists() {
        let bytes = std::fs::read(&args.state)
            .map_err(|error| format!("chain controller state {}: {error}", args.state.display()))?;
        Some((args.state.display().to_string(), bytes))
    } else {
        None
    };
    let mut controller = make_controller("chain-controller", plan, config, saved, clock.now())?;
    // Without keys: say so, at most once a minute, while other hosts send to it.
    controller.warn_of_plain_traffic();
    let shutdown = Shutdown::on_signals()?;
    let mut runtime = ControllerRuntime::open(
        clock,
        Some(controller),
        None,
        plan.listen,
        StateStore::File(args.state.clone()),
        plan.run.loop_options(),
        shutdown,
    )
    .map_err(|error| format!("chain-controller: {error}"))?;
    println!("chain controller listening on {}", runtime.local_addr());
    print_banner(
        plan,
        &runtime,
        &format!(
            "{} (saved with write, fsync, rename, directory fsync before any epoch is sent)",
            args.state.display()
        ),
        &traffic,
    );
    runtime.run()?;
    Ok(ExitCode::SUCCESS)
}
