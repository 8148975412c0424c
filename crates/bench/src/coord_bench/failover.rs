//! `pmnet coord-bench --failover`: the chain store with its controller as a user starts it
//! (`pmnet chain-controller` and four `pmnet device --chain-controller` processes: chains of
//! three, one spare), clients writing all the time; one member (in every chain, the head of
//! some groups) is SIGKILLed. Measured: how long after the kill writes to the groups it headed
//! complete again (issue 22: within 100 ms), and the throughput while the spare is copied into
//! every group against the throughput before the kill (issue 22: it costs at most 20 %).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pmnet_netchain::{group_of, ClientConfig, ClientOp, Outcome};
use pmnet_runtime::{ChainSession, Shutdown};
use serde::Serialize;

use super::netchain::{banners_printed, member_args, Membership};
use super::plan::Plan;
use crate::procs::{free_ports, loopback, run_dir, wait_until, Proc};
use pmnet::CliError;

/// Issue 22's targets.
pub const FAILOVER_TARGET_MS: f64 = 100.0;
pub const RECOVERY_COST_TARGET: f64 = 0.20;

/// What the run measured.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverSummary {
    pub system: &'static str,
    pub op: &'static str,
    pub clients: u32,
    pub groups: u16,
    /// Writes per second before the kill.
    pub ops_per_s_before: f64,
    /// From the kill to the first write completed (issued after the kill) in each group the
    /// killed member headed: the longest of them.
    pub failover_ms: f64,
    /// From the kill to the spare's joining the last group.
    pub recovery_ms: f64,
    /// Writes per second while the spare was being copied in.
    pub ops_per_s_during_recovery: f64,
    /// 1 − during / before.
    pub recovery_cost: f64,
    pub failover_met: bool,
    pub recovery_met: bool,
    pub medium: String,
}

/// Whether an epoch line of the controller shows every group with three members and nothing
/// under way.
fn whole(line: &str) -> bool {
    line.split_once(": ").is_some_and(|(head, groups)| {
        head.starts_with("epoch ")
            && groups.split("; ").all(|group| {
                !group.contains("paused")
                    && !group.contains(" +")
                    && group.matches(" > ").count() == 2
            })
    })
}

fn last_epoch_line(text: &str) -> Option<&str> {
    text.lines().rev().find(|line| line.starts_with("epoch "))
}

/// Run it; prints its report and writes `--json` if asked.
pub fn run(plan: &Plan, shutdown: &Shutdown) -> Result<FailoverSummary, CliError> {
    let dir = run_dir(&plan.netchain.dir, "failover")?;
    let exe = crate::procs::pmnet_program()?;
    let ports = free_ports(6)?;
    let controller = loopback(ports[0]);
    let server = loopback(ports[1]);
    let members: Vec<SocketAddr> = ports[2..].iter().map(|&port| loopback(port)).collect();
    let groups = plan.netchain.groups;
    let mut args: Vec<String> = vec![
        "chain-controller".into(),
        "--listen".into(),
        controller.to_string(),
        "--groups".into(),
        groups.to_string(),
        "--state".into(),
        dir.path().join("controller.state").display().to_string(),
    ];
    for member in &members {
        args.extend(["--member".into(), member.to_string()]);
    }
    if let Some(path) = &plan.netchain.key_file {
        args.extend(["--key-file".into(), path.display().to_string()]);
    }
    let controller_log = dir.path().join("controller.out");
    let mut procs = vec![Proc::spawn(
        "chain controller",
        &exe,
        &args,
        &controller_log,
        None,
    )?];
    for (index, member) in members.iter().enumerate() {
        let id = index + 1;
        let membership = Membership::Controlled(controller);
        let args = member_args(&plan.netchain, id, *member, membership, server, dir.path());
        let log = dir.path().join(format!("member{id}.out"));
        procs.push(Proc::spawn(
            &format!("chain member {id}"),
            &exe,
            &args,
            &log,
            None,
        )?);
    }
    let read_log = || std::fs::read_to_string(&controller_log).unwrap_or_default();
    wait_until(
        "the chains",
        Duration::from_secs(60),
        &mut procs,
        shutdown,
        || {
            Ok(banners_printed(dir.path(), members.len())
                && last_epoch_line(&read_log()).is_some_and(whole))
        },
    )?;
    let medium = std::fs::read_to_string(dir.path().join("member1.out"))
        .ok()
        .and_then(|banner| {
            banner.lines().find_map(|line| {
                line.split_once("medium: ")
                    .map(|(_, rest)| rest.trim().to_owned())
            })
        })
        .unwrap_or_else(|| "unknown".into());

    // The load: every client writes its own keys, one request at a time.
    let clients = plan.clients.iter().copied().max().unwrap_or(16);
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    // (call, return) in µs since the start, and the key's group, of each completed write.
    let done: Arc<Mutex<Vec<(u64, u64, u16)>>> = Arc::new(Mutex::new(Vec::new()));
    let keys = plan.keys.max(u64::from(clients));
    let threads: Vec<_> = (0..u64::from(clients))
        .map(|client| {
            let (stop, done) = (stop.clone(), done.clone());
            let auth = plan
                .netchain
                .auth_keys
                .clone()
                .map(pmnet_proto::Authenticator::new);
            std::thread::spawn(move || -> Result<(), String> {
                let mut config =
                    ClientConfig::controlled(pmnet_runtime::random_session_id() | 1, controller);
                config.auth = auth;
                config.retransmit_timeout_max = Duration::from_millis(10);
                config.request_lifetime = Duration::from_secs(10);
                let mut session =
                    ChainSession::open(config, controller).map_err(|error| error.to_string())?;
                let mut at = client;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("key{}", at % keys);
                    at += u64::from(clients);
                    let call = started.elapsed().as_micros() as u64;
                    let outcome = session
                        .run(key.as_bytes(), ClientOp::Put(call.to_le_bytes().to_vec()))
                        .map_err(|error| error.to_string())?;
                    if matches!(outcome, Outcome::Written { .. }) {
                        let ret = started.elapsed().as_micros() as u64;
                        done.lock().expect("no panic holds it").push((
                            call,
                            ret,
                            group_of(key.as_bytes(), groups),
                        ));
                    }
                }
                Ok(())
            })
        })
        .collect();
    let warmup = Duration::from_secs_f64(plan.warmup.as_secs_f64().max(0.5));
    let before = Duration::from_secs_f64(plan.duration.as_secs_f64().max(1.0));
    std::thread::sleep(warmup + before);
    // Kill the first member: in every chain, the head of groups 0, 3, 6, …
    let killed_at = started.elapsed().as_micros() as u64;
    let kill_instant = Instant::now();
    procs[1].kill();
    // Watch the controller until every group has three members again.
    let mut recovered = None;
    let mut last_seen = String::new();
    while recovered.is_none() && kill_instant.elapsed() < Duration::from_secs(120) {
        if shutdown.is_requested() {
            break;
        }
        let text = read_log();
        if let Some(line) = last_epoch_line(&text) {
            if line != last_seen {
                last_seen = line.to_owned();
                if whole(line) && !line.contains(&members[0].to_string()) {
                    recovered = Some(kill_instant.elapsed());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let recovered_at = recovered.ok_or("the spare did not join every group within 120 s")?;
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread
            .join()
            .map_err(|_| "a client thread panicked".to_owned())?
            .map_err(|error| format!("a client: {error}"))?;
    }
    let done = done.lock().expect("no panic holds it").clone();
    let warm = warmup.as_micros() as u64;
    let count_between = |from: u64, to: u64| {
        done.iter()
            .filter(|(_, ret, _)| *ret >= from && *ret < to)
            .count()
    };
    let ops_per_s_before =
        count_between(warm, killed_at) as f64 / ((killed_at - warm) as f64 / 1e6);
    let headed: Vec<u16> = (0..groups).filter(|group| group % 3 == 0).collect();
    let failover_ms = headed
        .iter()
        .map(|group| {
            done.iter()
                .filter(|(call, _, g)| g == group && *call >= killed_at)
                .map(|(_, ret, _)| *ret)
                .min()
                .map_or(f64::INFINITY, |ret| (ret - killed_at) as f64 / 1e3)
        })
        .fold(0.0, f64::max);
    // The recovery: from the first write after the failover to the last group joined.
    let recovery_end = killed_at + recovered_at.as_micros() as u64;
    let recovery_start = killed_at + (failover_ms * 1e3) as u64;
    let during = count_between(recovery_start, recovery_end) as f64
        / ((recovery_end.saturating_sub(recovery_start)).max(1) as f64 / 1e6);
    let recovery_cost = (1.0 - during / ops_per_s_before).max(0.0);
    if std::env::var_os("PMNET_FAILOVER_TIMELINE").is_some() {
        // Writes completed per 20 ms from 100 ms before the kill.
        let from = killed_at.saturating_sub(100_000);
        let bins: Vec<usize> = (0..20)
            .map(|bin| count_between(from + bin * 20_000, from + (bin + 1) * 20_000))
            .collect();
        eprintln!("writes per 20 ms from 100 ms before the kill: {bins:?}");
    }
    drop(procs);
    let summary = FailoverSummary {
        system: "netchain",
        op: "failover",
        clients,
        groups,
        ops_per_s_before,
        failover_ms,
        recovery_ms: recovered_at.as_secs_f64() * 1e3,
        ops_per_s_during_recovery: during,
        recovery_cost,
        failover_met: failover_ms <= FAILOVER_TARGET_MS,
        recovery_met: recovery_cost <= RECOVERY_COST_TARGET,
        medium,
    };
    println!(
        "coord-bench --failover: the controller and 4 members (chains of 3, one spare), {} \
         virtual groups, {clients} clients writing; medium: {}\n\
         \n\
         writes/s before the kill          {:>10.0}\n\
         writes to the killed member's groups again after   {:.1} ms (target ≤ {FAILOVER_TARGET_MS} ms: {})\n\
         the spare in every group after    {:>10.0} ms\n\
         writes/s while it was copied in   {:>10.0} ({:.0} % less; target ≤ {:.0} %: {})",
        groups,
        summary.medium,
        summary.ops_per_s_before,
        summary.failover_ms,
        if summary.failover_met { "met" } else { "not met" },
        summary.recovery_ms,
        summary.ops_per_s_during_recovery,
        summary.recovery_cost * 100.0,
        RECOVERY_COST_TARGET * 100.0,
        if summary.recovery_met { "met" } else { "not met" },
    );
    if let Some(path) = &plan.json {
        let text = serde_json::to_string_pretty(&serde_json::json!({ "failover": &summary }))
            .map_err(|error| format!("--json: {error}"))?;
        std::fs::write(path, text).map_err(|error| format!("{}: {error}", path.display()))?;
        println!("JSON written to {}", path.display());
    }
    Ok(summary)
}
