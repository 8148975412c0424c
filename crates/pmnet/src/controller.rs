//! `pmnet controller`: the chain store's controller with its state in etcd (docs/netchain.md,
//! "The controller on etcd"). Run two or three, each with the same `--etcd` and `--cluster`
//! and its own `--listen`; one leads (it holds the leader key under an etcd lease) and serves
//! the members and clients, the others stand by and take over when its lease goes (at once
//! when it stops, within the lease's time to live when it dies). Members and clients name
//! every controller (`--chain-controller` / `--controller`, repeated). Without `--etcd` it
//! starts a one-member etcd of its own, for one machine, and says so.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use pmnet_runtime::control_plane::{campaign, CampaignNote, EtcdPlane};
use pmnet_runtime::metrics::{serve_metrics, Metrics, MetricsBoard};
use pmnet_runtime::{ControllerRuntime, RunEnd, Shutdown, StateStore};

use crate::chain_controller::{controller_config, make_controller, print_banner, ChainPlanArgs};
use crate::CliError;

#[derive(Debug, Clone, Args)]
#[command(
    after_long_help = "Examples (docs/netchain.md, \"The controller on etcd\"):\n  \
    # one machine: a one-member etcd of its own, in ./pmnet-controller.etcd\n  \
    pmnet controller --member 127.0.0.1:7401 --member 127.0.0.1:7402 --member 127.0.0.1:7403\n\n  \
    # three hosts, one etcd cluster; each member names all three controllers\n  \
    pmnet controller --etcd 10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379 --listen 10.0.0.20:7700 \
    --key-file pmnet.key --member 10.0.0.21:7400 --member 10.0.0.22:7400 --member 10.0.0.23:7400\n  \
    pmnet device ... --chain-controller 10.0.0.20:7700 --chain-controller 10.0.0.30:7700"
)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub plan: ChainPlanArgs,

    /// The etcd cluster that holds the state and elects the leader: HOST:PORT, comma-separated
    /// (plain http; TLS is not supported). Without it the controller starts a one-member etcd
    /// of its own (see --etcd-dir): for one machine only.
    #[arg(long, value_name = "ENDPOINTS")]
    pub etcd: Option<String>,

    /// Without --etcd: the one-member etcd's data directory (kept across restarts).
    #[arg(long, value_name = "DIR", default_value = "pmnet-controller.etcd")]
    pub etcd_dir: PathBuf,

    /// Without --etcd: the etcd program to start (Debian's `etcd-server` package).
    #[arg(long, value_name = "PROGRAM", default_value = "etcd")]
    pub etcd_program: String,

    /// The cluster's name: its keys in etcd are under /pmnet/NAME (several clusters may share
    /// one etcd). Letters, digits, '-', '_' and '.', at most 64.
    #[arg(long, value_name = "NAME", default_value = "default", value_parser = parse_cluster)]
    pub cluster: String,

    /// This controller's name, as the leader key shows it (default: its --listen address).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// The leadership lease's time to live, in seconds: a dead leader is replaced this long
    /// after its last renewal (etcd raises it to its own minimum: 2 s with etcd's default
    /// election timeout; the one-member etcd of its own keeps 1 s).
    #[arg(long, value_name = "S", default_value_t = 1,
          value_parser = clap::value_parser!(i64).range(1..=60))]
    pub leader_ttl_s: i64,

    /// A chain of devices in series to watch and heal (docs/replication.md, "Automatic
    /// failover"): its server as ID=ADDR, then its devices as DEVICE_ID=ADDR, the first device
    /// first, comma-separated (at most 8 devices). Each device and the server run with
    /// --controller naming this controller; a device with no status for --suspect-after-ms is
    /// taken out of the chain. Repeat for each chain (one per server id). The plan is saved
    /// in etcd; a saved plan takes precedence at a restart.
    #[arg(long = "device-chain", value_name = "SERVER_ID=ADDR,DEVICE_ID=ADDR,...",
          value_parser = parse_device_chain)]
    pub device_chains: Vec<pmnet_proto::route::ChainSpec>,

    /// A spare device for the chain of server SERVER_ID, put in before the server when a
    /// device is taken out (run it with --server SERVER_ID=<the server> and --controller).
    #[arg(long = "spare-device", value_name = "SERVER_ID:DEVICE_ID=ADDR",
          value_parser = parse_spare)]
    pub spares: Vec<(u16, u16, std::net::SocketAddr)>,

    /// A chain's primary or replica server with no status for this long is replaced or taken
    /// out (at least --suspect-after-ms: a server restarts in place, its store opened again,
    /// when a route changes its part).
    #[arg(long, value_name = "MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(5..=600_000))]
    pub server_suspect_after_ms: u64,

    /// A replica server of the primary of the chain of server SERVER_ID, in the order of the
    /// primary's --replica list (repeat; at most 8): a lost primary is replaced by the one
    /// furthest along, a silent one taken out of the primary's list (run each with
    /// --controller; docs/replication.md, "Automatic failover").
    #[arg(long = "replica-server", value_name = "SERVER_ID=ADDR",
          value_parser = parse_replica)]
    pub replica_servers: Vec<(u16, std::net::SocketAddr)>,
}

/// `--replica-server`: `SERVER_ID=ADDR`.
fn parse_replica(text: &str) -> Result<(u16, std::net::SocketAddr), String> {
    let (id, address) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not SERVER_ID=ADDR"))?;
    let id = id
        .trim()
        .parse::<u16>()
        .map_err(|_| format!("{id:?} is not an id (0 to 65535)"))?;
    Ok((id, crate::addr::parse_addr(address.trim())?))
}

/// `--device-chain`: `SERVER_ID=ADDR,DEVICE_ID=ADDR,...`.
fn parse_device_chain(text: &str) -> Result<pmnet_proto::route::ChainSpec, String> {
    let mut pairs = text.split(',').map(|pair| {
        let (id, address) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not ID=ADDR"))?;
        let id: u16 = id
            .trim()
            .parse()
            .map_err(|_| format!("{id:?} is not an id (0 to 65535)"))?;
        Ok::<_, String>((id, crate::addr::parse_addr(address.trim())?))
    });
    let (server_id, server) = pairs.next().ok_or("give the server, then its devices")??;
    let devices = pairs.collect::<Result<Vec<_>, _>>()?;
    let spec = pmnet_proto::route::ChainSpec {
        server_id,
        server,
        devices,
        spares: Vec::new(),
        replicas: Vec::new(),
    };
    pmnet_wire::route::ChainRoute {
        devices: spec.devices.clone(),
        server,
        replicas: Vec::new(),
    }
    .check()
    .map_err(|_| {
        format!(
            "a chain has 1 to {} devices after its server, each id and address once, none at \
             the server's address",
            pmnet_wire::route::MAX_CHAIN_DEVICES
        )
    })?;
    Ok(spec)
}

/// `--spare-device`: `SERVER_ID:DEVICE_ID=ADDR`.
fn parse_spare(text: &str) -> Result<(u16, u16, std::net::SocketAddr), String> {
    let (ids, address) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not SERVER_ID:DEVICE_ID=ADDR"))?;
    let (server_id, device_id) = ids
        .split_once(':')
        .ok_or_else(|| format!("{ids:?} is not SERVER_ID:DEVICE_ID"))?;
    let parse = |id: &str| {
        id.trim()
            .parse::<u16>()
            .map_err(|_| format!("{id:?} is not an id (0 to 65535)"))
    };
    Ok((
        parse(server_id)?,
        parse(device_id)?,
        crate::addr::parse_addr(address.trim())?,
    ))
}

/// The device chains' planner's settings, from the command line.
fn planner_config(
    args: &ControllerArgs,
) -> Result<Option<pmnet_proto::route::PlannerConfig>, CliError> {
    if args.device_chains.is_empty() {
        if let Some((server_id, _)) = args.replica_servers.first() {
            return Err(format!(
                "controller: --replica-server {server_id}=…: no --device-chain for server {server_id}"
            )
            .into());
        }
        if let Some((server_id, _, _)) = args.spares.first() {
            return Err(format!(
                "controller: --spare-device {server_id}:…: no --device-chain for server {server_id}"
            )
            .into());
        }
        return Ok(None);
    }
    let mut chains = args.device_chains.clone();
    for &(server_id, device_id, address) in &args.spares {
        let chain = chains
            .iter_mut()
            .find(|chain| chain.server_id == server_id)
            .ok_or_else(|| {
                format!("controller: --spare-device {server_id}:{device_id}: no --device-chain for server {server_id}")
            })?;
        chain.spares.push((device_id, address));
    }
    for &(server_id, address) in &args.replica_servers {
        let chain = chains
            .iter_mut()
            .find(|chain| chain.server_id == server_id)
            .ok_or_else(|| {
                format!("controller: --replica-server {server_id}={address}: no --device-chain for server {server_id}")
            })?;
        chain.replicas.push(address);
    }
    let keys = crate::node::keys_of(args.plan.run.key_file.as_deref())?;
    Ok(Some(pmnet_proto::route::PlannerConfig {
        chains,
        suspect_after: Duration::from_millis(args.plan.suspect_after_ms),
        server_suspect_after: Duration::from_millis(args.server_suspect_after_ms),
        auth: keys.map(pmnet_proto::Authenticator::new),
    }))
}

fn parse_cluster(text: &str) -> Result<String, String> {
    let valid = !text.is_empty()
        && text.len() <= 64
        && text
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || b"-_.".contains(&byte));
    if valid {
        Ok(text.to_owned())
    } else {
        Err("letters, digits, '-', '_' and '.', 1 to 64 of them".to_owned())
    }
}

pub fn run(args: ControllerArgs) -> Result<ExitCode, CliError> {
    let plan = &args.plan;
    let (config, traffic) = controller_config("controller", plan)?;
    let planner = planner_config(&args)?;
    let signals = Shutdown::on_signals()?;
    let clock = pmnet_runtime::Clock::new();
    let name = args.name.clone().unwrap_or_else(|| plan.listen.to_string());
    // etcd: the cluster named, or one of its own.
    let (_local, endpoints, etcd_text) = match &args.etcd {
        Some(text) => {
            let endpoints = pmnet_etcd::parse_endpoints(text)
                .map_err(|error| format!("controller: --etcd {error}"))?;
            let listed: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
            (
                None,
                endpoints,
                format!("etcd cluster at {}", listed.join(",")),
            )
        }
        None => {
            let local = pmnet_etcd::LocalEtcd::start(
                &args.etcd_program,
                &args.etcd_dir,
                "127.0.0.1:0".parse().expect("an address"),
                Duration::from_secs(30),
            )
            .map_err(|error| format!("controller: {error}"))?;
            let text = format!(
                "a one-member etcd of its own at {} ({}, data in {}, pid {}): for one machine \
                 only, the state is lost with this host; name a cluster with --etcd",
                local.endpoint(),
                local.version(),
                args.etcd_dir.display(),
                local.pid()
            );
            let endpoint = local.endpoint();
            (Some(local), vec![endpoint], text)
        }
    };
    let plane = EtcdPlane {
        endpoints,
        prefix: format!("/pmnet/{}", args.cluster),
        name: format!("{name} {}", plan.listen),
        ttl_s: args.leader_ttl_s,
        timeout: Duration::from_millis(500),
    };
    println!(
        "controller {name}: control plane on {etcd_text}; keys under {}",
        plane.prefix
    );
    let _ = std::io::Write::flush(&mut std::io::stdout());
    // While it stands by, its metrics endpoint says so (and the process's metrics); leading, the
    // runtime serves it at the same address.
    let mut metrics_at = plan.run.metrics;
    loop {
        let standby = match metrics_at {
            Some(addr) => {
                let standby = StandbyMetrics::start(addr)
                    .map_err(|error| format!("controller: --metrics {addr}: {error}"))?;
                metrics_at = Some(standby.addr);
                Some(standby)
            }
            None => None,
        };
        let leadership = campaign(&plane, clock, &signals, |note| {
            match note {
                CampaignNote::Standby(leader) => {
                    println!("controller {name}: standing by, {leader} leads")
                }
                CampaignNote::Unreachable(why) => println!(
                    "controller {name}: cannot reach etcd ({why}); no controller can take over \
                     until it answers"
                ),
            }
            let _ = std::io::Write::flush(&mut std::io::stdout());
        })
        .map_err(|error| format!("controller: {error}"))?;
        let Some(mut leadership) = leadership else {
            return Ok(ExitCode::SUCCESS);
        };
        if let Some(standby) = standby {
            standby.hand_over();
        }
        let ttl_s = leadership.ttl_s();
        let state_key = String::from_utf8_lossy(&plane.state_key()).into_owned();
        let started = (|| -> Result<ControllerRuntime, CliError> {
            let saved = leadership
                .load()
                .map_err(|error| format!("controller: reading {state_key}: {error}"))?
                .map(|bytes| (format!("etcd key {state_key}"), bytes));
            // The chain store's controller, when there are members (or a saved state).
            let controller = if plan.members.is_empty() && saved.is_none() && planner.is_some() {
                None
            } else {
                let mut controller =
                    make_controller("controller", plan, config.clone(), saved, clock.now())?;
                // A new term: a new epoch, saved (fenced) before any member sees it.
                controller.begin_term();
                controller.warn_of_plain_traffic();
                Some(controller)
            };
            let planner = match &planner {
                None => None,
                Some(planner) => {
                    let saved = leadership
                        .load_devices()
                        .map_err(|error| format!("controller: {error}"))?;
                    Some(
                        pmnet_proto::route::Planner::new(
                            planner.clone(),
                            clock.now(),
                            saved.as_deref(),
                        )
                        .map_err(|error| format!("controller: --device-chain: {error}"))?,
                    )
                }
            };
            let mut loop_options = plan.run.loop_options();
            loop_options.metrics_listen = metrics_at;
            Ok(ControllerRuntime::open(
                clock,
                controller,
                planner,
                plan.listen,
                StateStore::Etcd(Box::new(leadership)),
                loop_options,
                signals.clone(),
            )
            .map_err(|error| format!("controller: {error}"))?)
        })();
        let mut runtime = started?;
        println!(
            "controller {name} leads (leadership lease {ttl_s} s) and is listening on {}",
            runtime.local_addr()
        );
        print_banner(
            plan,
            &runtime,
            &format!(
                "{etcd_text}, {} (saved in a transaction fenced by the leadership before any \
                 epoch is sent)",
                [
                    runtime
                        .controller()
                        .map(|_| format!("chain store in key {state_key}")),
                    runtime.planner().map(|_| {
                        format!(
                            "device chains in key {}",
                            String::from_utf8_lossy(&plane.devices_key())
                        )
                    }),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(", ")
            ),
            &traffic,
        );
        let end = runtime.run()?;
        let store = runtime.into_store();
        match end {
            RunEnd::Stopped => {
                if let StateStore::Etcd(leadership) = store {
                    // Another controller takes over at once.
                    leadership.resign();
                }
                println!("controller {name}: stopped, leadership given up");
                return Ok(ExitCode::SUCCESS);
            }
            RunEnd::LostLeadership(why) => {
                println!("controller {name} no longer leads: {why}; standing by");
                let _ = std::io::Write::flush(&mut std::io::stdout());
            }
        }
    }
}

/// A standing-by controller's metrics endpoint: the process's metrics and build information
/// and `pmnet_controller_leading 0`, refreshed every second, until it leads.
struct StandbyMetrics {
    addr: std::net::SocketAddr,
    stop: Shutdown,
}

impl StandbyMetrics {
    fn start(listen: std::net::SocketAddr) -> std::io::Result<StandbyMetrics> {
        let board = MetricsBoard::new();
        let render = |board: &MetricsBoard| {
            let mut metrics = Metrics::new();
            metrics.gauge(
                pmnet_runtime::CONTROLLER_LEADING,
                pmnet_runtime::CONTROLLER_LEADING_HELP,
                &[],
                0.0,
            );
            metrics.add_process_metrics();
            board.publish(&metrics);
        };
        render(&board);
        // No loop answers a scrape's request for a fresh rendering: the last one is served.
        board.set_live(false);
        let stop = Shutdown::new();
        // The leading runtime's endpoint, just stopped, may hold the address a moment more.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        let addr = loop {
            match serve_metrics(listen, board.clone(), stop.clone()) {
                Err(error)
                    if error.kind() == std::io::ErrorKind::AddrInUse
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => break other?,
            }
        };
        let refresh = stop.clone();
        std::thread::Builder::new()
            .name("pmnet-standby-metrics".into())
            .spawn(move || {
                while !refresh.is_requested() {
                    std::thread::sleep(Duration::from_millis(200));
                    render(&board);
                }
            })?;
        Ok(StandbyMetrics { addr, stop })
    }

    /// Stop serving, and wait until the address is free for the leading runtime's endpoint.
    fn hand_over(self) {
        self.stop.request();
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while std::net::TcpListener::bind(self.addr).is_err()
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_name_is_a_safe_key_segment() {
        assert_eq!(parse_cluster("prod-1.eu_west").unwrap(), "prod-1.eu_west");
        assert!(parse_cluster("").is_err());
        assert!(parse_cluster("a/b").is_err());
        assert!(parse_cluster(&"x".repeat(65)).is_err());
    }
}
