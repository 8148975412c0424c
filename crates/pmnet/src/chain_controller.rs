//! `pmnet chain-controller`: the chain store's control plane as a process of its own
//! (docs/netchain.md, "The controller"). It keeps the members' chains per virtual group,
//! renews the members' leases as their statuses come, takes a member that stops answering out
//! of its chains, brings a live member into the chains that lack one, and answers clients
//! asking for the configuration. Its state (the configuration) is saved to `--state` — written
//! to a new file, fsynced, renamed over the old one, the directory fsynced — before any member
//! or client sees an epoch, and taken back at a restart.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use pmnet_netchain::{decode_state, encode_state, Controller, ControllerConfig};
use pmnet_proto::Time;
use pmnet_runtime::Shutdown;
use pmnet_wire::netchain::control::Layout;

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

    /// Authenticate every datagram with the deployment keys in this file (mode 0600; make one
    /// with `pmnet keygen`): the members and clients hold the same. Without it traffic is not
    /// authenticated, and only a loopback --listen is allowed (see --insecure).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,

    /// Listen on an address other hosts reach without --key-file: anyone who reaches the
    /// controller could then change the chains. Without it such a controller refuses to start
    /// (protected mode, docs/security.md).
    #[arg(long)]
    pub insecure: bool,
}

pub fn run(args: ChainControllerArgs) -> Result<ExitCode, CliError> {
    let keys = crate::node::keys_of(args.key_file.as_deref())?;
    crate::protect::check(
        "chain-controller",
        &[crate::protect::Listener::Addr("--listen", args.listen)],
        keys.is_some(),
        args.insecure,
    )?;
    let traffic = pmnet_runtime::auth_text(keys.as_ref());
    let config = ControllerConfig {
        chain_length: usize::from(args.chain_length),
        suspect_after: Duration::from_millis(args.suspect_after_ms),
        lease: Duration::from_millis(args.lease_ms),
        auth: keys.map(pmnet_proto::Authenticator::new),
        ..ControllerConfig::default()
    };
    let started = Instant::now();
    let now = || Time::since(started, Instant::now());
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
    let socket = UdpSocket::bind(args.listen)
        .map_err(|error| format!("chain-controller: binding {}: {error}", args.listen))?;
    socket.set_read_timeout(Some(Duration::from_millis(1)))?;
    let shutdown = Shutdown::on_signals()?;
    println!(
        "chain controller listening on {}: {} members, {} virtual groups, chains of {}, suspect \
         after {} ms, lease {} ms; state {} (saved with write, fsync, rename, directory fsync \
         before any epoch is sent)",
        args.listen,
        controller.layout().members.len(),
        controller.layout().groups.len(),
        args.chain_length,
        args.suspect_after_ms,
        args.lease_ms,
        args.state.display()
    );
    println!("  traffic: {traffic}");
    describe(controller.layout());
    let mut buffer = vec![0u8; 65_536];
    let mut last_epoch = 0;
    while !shutdown.is_requested() {
        match socket.recv_from(&mut buffer) {
            Ok((len, from)) => controller.handle(now(), from, &buffer[..len]),
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                        | std::io::ErrorKind::ConnectionRefused
                ) => {}
            Err(error) => return Err(format!("chain-controller: receiving: {error}").into()),
        }
        controller.handle_timeout(now());
        if let Some(layout) = controller.poll_save() {
            save(&args.state, &layout).map_err(|error| state_error(error.to_string()))?;
        }
        while let Some(transmit) = controller.poll_transmit() {
            // A member that is down answers with an ICMP error: not the controller's.
            let _ = socket.send_to(&transmit.bytes, transmit.destination);
        }
        if controller.layout().epoch != last_epoch {
            last_epoch = controller.layout().epoch;
            describe(controller.layout());
        }
    }
    let counters = controller.counters();
    let drops: Vec<String> = controller
        .drops()
        .iter()
        .map(|(reason, count)| format!("{reason} {count}"))
        .collect();
    eprintln!(
        "chain-controller: stopped at epoch {}; {} statuses, {} grants, {} configurations \
         sent, {} members taken out, {} recoveries done ({} aborted), {} dropped{}",
        controller.layout().epoch,
        counters.statuses,
        counters.grants,
        counters.configs_sent,
        counters.removed,
        counters.recoveries_done,
        counters.recoveries_aborted,
        counters.dropped,
        if drops.is_empty() {
            String::new()
        } else {
            format!(" ({})", drops.join(", "))
        }
    );
    Ok(ExitCode::SUCCESS)
}

/// One line per epoch: each group's chain (head first), paused and joining groups marked.
fn describe(layout: &Layout) {
    let groups: Vec<String> = layout
        .groups
        .iter()
        .enumerate()
        .map(|(index, group)| {
            let chain: Vec<String> = group
                .chain
                .iter()
                .map(|member| layout.members[usize::from(*member)].to_string())
                .collect();
            let mut text = format!("g{index} [{}]", chain.join(" > "));
            if group.paused {
                text.push_str(" paused");
            }
            if let Some(joining) = group.joining {
                text.push_str(&format!(
                    " +{} ({:?} from {})",
                    layout.members[usize::from(joining.member)],
                    joining.phase,
                    layout.members[usize::from(joining.source)]
                ));
            }
            text
        })
        .collect();
    println!("epoch {}: {}", layout.epoch, groups.join("; "));
    let _ = std::io::Write::flush(&mut std::io::stdout());
}

/// Save `layout` so that a crash leaves the old state or the new one, whole.
fn save(path: &Path, layout: &Layout) -> std::io::Result<()> {
    use std::io::Write;
    let bytes = encode_state(layout);
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".new");
    let temporary = PathBuf::from(temporary);
    {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&temporary, path)?;
    let directory = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(directory)?.sync_all()
}
