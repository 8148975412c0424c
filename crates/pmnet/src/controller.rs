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
    loop {
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
        let ttl_s = leadership.ttl_s();
        let state_key = String::from_utf8_lossy(&plane.state_key()).into_owned();
        let started = (|| -> Result<ControllerRuntime, CliError> {
            let saved = leadership
                .load()
                .map_err(|error| format!("controller: reading {state_key}: {error}"))?
                .map(|bytes| (format!("etcd key {state_key}"), bytes));
            let mut controller =
                make_controller("controller", plan, config.clone(), saved, clock.now())?;
            // A new term: a new epoch, saved (fenced) before any member sees it.
            controller.begin_term();
            controller.warn_of_plain_traffic();
            Ok(ControllerRuntime::open(
                clock,
                controller,
                plan.listen,
                StateStore::Etcd(Box::new(leadership)),
                plan.run.loop_options(),
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
                "{etcd_text}, key {state_key} (saved in a transaction fenced by the leadership \
                 before any epoch is sent)"
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
