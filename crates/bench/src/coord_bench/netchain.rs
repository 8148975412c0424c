//! The chain store as a user runs it: three `pmnet device --chain-member …` processes on
//! loopback (README, "A chain store of three devices"), and clients of the chain library
//! (`pmnet_runtime::ChainSession`, as `pmnet kv`), with the lock recipe of `pmnet kv lock`
//! (`chain_lock.rs`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pmnet_netchain::{rotated_groups, ClientConfig, ClientOp, Outcome, ReadFrom};
use pmnet_runtime::{ChainSession, Shutdown};

use super::load::CoordClient;
use crate::procs::{free_ports, loopback, run_dir, wait_until, Proc};
use pmnet::chain_lock::{self, failed, LockAttempt, UnlockAttempt};
use pmnet::CliError;

/// How the chain store is started.
#[derive(Debug, Clone)]
pub struct ChainSetup {
    /// Where the devices' logs and tables go (/dev/shm: emulated persistent memory).
    pub dir: PathBuf,
    /// The devices' `--flush`.
    pub flush: String,
    pub groups: u16,
    /// Keys the benchmark writes (the tables get room for twice as many).
    pub keys: u64,
    pub value_max: usize,
    /// Each member's emulated capacity (`--chain-max-ops-per-s`), if any.
    pub member_max_ops_per_s: Option<u64>,
    /// The CPU the members run on (`--pin`).
    pub cpu: Option<usize>,
    /// `--key-file` of the members and the controller, and its keys for the clients.
    pub key_file: Option<PathBuf>,
    pub auth_keys: Option<pmnet_proto::KeySet>,
}

/// Three members running; stopped when dropped.
#[derive(Debug)]
pub struct ChainStore {
    pub members: Vec<SocketAddr>,
    pub groups: u16,
    /// What the first device's banner says of its medium.
    pub medium: String,
    /// The members' metrics endpoints.
    pub metrics: Vec<SocketAddr>,
    /// The clients' deployment keys (the members' --key-file), if any.
    auth_keys: Option<pmnet_proto::KeySet>,
    procs: Vec<Proc>,
    // Dropped after the processes are stopped (fields drop in order).
    _dir: tempfile::TempDir,
}

/// How a member knows its chains.
#[derive(Debug, Clone, Copy)]
pub enum Membership<'a> {
    /// `--chain-member` for each (README, "A chain store of three devices").
    Fixed(&'a [SocketAddr]),
    /// `--chain-controller` (README, "With the chain controller").
    Controlled(SocketAddr),
}

/// Member `id`'s arguments, listening on `listen`: as the README shows, plus files and sizes.
pub fn member_args(
    setup: &ChainSetup,
    id: usize,
    listen: SocketAddr,
    membership: Membership<'_>,
    server: SocketAddr,
    dir: &Path,
) -> Vec<String> {
    let mut args: Vec<String> = [
        "device",
        "--device-id",
        &id.to_string(),
        "--listen",
        &listen.to_string(),
        "--server",
        &format!("1={server}"),
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    match membership {
        Membership::Fixed(members) => {
            for member in members {
                args.extend(["--chain-member".to_owned(), member.to_string()]);
            }
        }
        Membership::Controlled(controller) => {
            args.extend(["--chain-controller".to_owned(), controller.to_string()]);
        }
    }
    let file = |name: String| dir.join(name).display().to_string();
    args.extend([
        "--log-file".to_owned(),
        file(format!("device{id}.log")),
        "--slots".to_owned(),
        "1024".to_owned(),
        "--chain-table".to_owned(),
        file(format!("chain{id}.table")),
        "--chain-keys".to_owned(),
        (setup.keys * 2 + 1024).min(1_000_000).to_string(),
        "--chain-value-max".to_owned(),
        setup.value_max.max(64).to_string(),
        "--chain-groups".to_owned(),
        setup.groups.to_string(),
        "--flush".to_owned(),
        setup.flush.clone(),
        "--metrics".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--report-interval".to_owned(),
        "0".to_owned(),
    ]);
    if let Some(ops_per_s) = setup.member_max_ops_per_s {
        args.extend(["--chain-max-ops-per-s".to_owned(), ops_per_s.to_string()]);
    }
    if let Some(path) = &setup.key_file {
        args.extend(["--key-file".to_owned(), path.display().to_string()]);
    }
    args
}

/// The value after `marker` on the banner line that holds it.
pub(crate) fn banner_value(banner: &str, marker: &str) -> Option<String> {
    let line = banner.lines().find(|line| line.contains(marker))?;
    let start = line.find(marker)? + marker.len();
    Some(line[start..].trim().to_owned())
}

impl ChainStore {
    /// Start three members and wait for their banners.
    pub fn start(setup: &ChainSetup, shutdown: &Shutdown) -> Result<ChainStore, CliError> {
        let dir = run_dir(&setup.dir, "netchain")?;
        let exe = crate::procs::pmnet_program()?;
        let ports = free_ports(4)?;
        let members: Vec<SocketAddr> = ports[..3].iter().map(|&port| loopback(port)).collect();
        // The devices' PMNet server: nothing sends it anything in this benchmark.
        let server = loopback(ports[3]);
        let mut procs = Vec::new();
        for id in 1..=3 {
            let membership = Membership::Fixed(&members);
            let args = member_args(setup, id, members[id - 1], membership, server, dir.path());
            let log = dir.path().join(format!("member{id}.out"));
            procs.push(Proc::spawn(
                &format!("chain member {id}"),
                &exe,
                &args,
                &log,
                setup.cpu,
            )?);
        }
        // The banner ends with the line that names the metrics endpoint.
        let patience = Duration::from_secs(60);
        wait_until("the chain members", patience, &mut procs, shutdown, || {
            Ok(banners_printed(dir.path(), 3))
        })?;
        let banners: Vec<String> = (1..=3)
            .map(|id| std::fs::read_to_string(dir.path().join(format!("member{id}.out"))))
            .collect::<Result<_, _>>()?;
        let medium = banner_value(&banners[0], "medium: ").unwrap_or_else(|| "unknown".into());
        let metrics = banners
            .iter()
            .map(|banner| {
                banner_value(banner, "metrics: http://")
                    .and_then(|rest| rest.trim_end_matches("/metrics").parse().ok())
                    .ok_or_else(|| CliError::from("a chain member's banner names no metrics"))
            })
            .collect::<Result<_, _>>()?;
        Ok(ChainStore {
            members,
            groups: setup.groups,
            medium,
            metrics,
            auth_keys: setup.auth_keys.clone(),
            procs,
            _dir: dir,
        })
    }

    /// A client of the store, its reads sent as `reads` says.
    pub fn client(
        &self,
        index: u32,
        reads: ReadFrom,
        retransmit_timeout: Duration,
    ) -> Result<NetchainClient, CliError> {
        let mut config = ClientConfig::new(
            rand::random::<u64>() | 1,
            rotated_groups(&self.members, self.groups),
        );
        config.request_lifetime = Duration::from_secs(10);
        config.retransmit_timeout = retransmit_timeout;
        config.reads = reads;
        config.auth = self.auth_keys.clone().map(pmnet_proto::Authenticator::new);
        let session = ChainSession::open(config, self.members[0])?;
        Ok(NetchainClient {
            session,
            owner: format!("client-{index}"),
            held: None,
        })
    }

    /// Counter `name` of every member, from its metrics endpoint.
    pub fn member_counters(&self, name: &str) -> Result<Vec<f64>, CliError> {
        self.metrics
            .iter()
            .map(|&addr| {
                let text = pmnet_runtime::metrics::scrape(addr, Duration::from_secs(5))
                    .map_err(|error| format!("scraping chain member {addr}: {error}"))?;
                pmnet_runtime::metrics::find_sample(&text, name, "")
                    .ok_or_else(|| format!("chain member {addr}: no {name}").into())
            })
            .collect()
    }

    /// The processes' ids.
    pub fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(Proc::pid).collect()
    }

    /// Stop the members (SIGTERM; they exit cleanly).
    pub fn stop(&mut self) {
        for proc in &mut self.procs {
            proc.stop();
        }
    }
}

impl Drop for ChainStore {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether every member has printed its whole banner.
/// Whether members 1 to `count`, their output in `dir/memberN.out`, have printed their
/// whole banner (its last line names the metrics endpoint).
pub fn banners_printed(dir: &Path, count: usize) -> bool {
    (1..=count).all(|id| {
        std::fs::read_to_string(dir.join(format!("member{id}.out")))
            .is_ok_and(|text| text.contains("metrics: "))
    })
}

/// A client of the chain store: one session.
#[derive(Debug)]
pub struct NetchainClient {
    session: ChainSession,
    owner: String,
    /// The version at which this client holds the lock.
    held: Option<u64>,
}

/// A lock's lease: far longer than a cycle.
const LEASE_MS: u64 = 10_000;

impl CoordClient for NetchainClient {
    fn read(&mut self, key: &str) -> Result<(), CliError> {
        match self.session.run(key.as_bytes(), ClientOp::Get)? {
            Outcome::Value { value: Some(_), .. } => Ok(()),
            Outcome::Value { value: None, .. } => Err(format!("{key} has no value").into()),
            other => Err(failed(&other)),
        }
    }

    fn write(&mut self, key: &str, value: &[u8]) -> Result<(), CliError> {
        match self
            .session
            .run(key.as_bytes(), ClientOp::Put(value.to_vec()))?
        {
            Outcome::Written { .. } => Ok(()),
            other => Err(failed(&other)),
        }
    }

    fn acquire(&mut self, name: &str) -> Result<u64, CliError> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match chain_lock::try_lock(&mut self.session, name, &self.owner, LEASE_MS)? {
                LockAttempt::Taken { version } => {
                    self.held = Some(version);
                    return Ok(attempts);
                }
                LockAttempt::Held { .. } | LockAttempt::TakenMeanwhile { .. } => {}
            }
        }
    }

    fn release(&mut self, name: &str) -> Result<(), CliError> {
        let version = self.held.take();
        match chain_lock::unlock(&mut self.session, name, &self.owner, version)? {
            UnlockAttempt::Released => Ok(()),
            other => Err(format!("{} could not release {name}: {other:?}", self.owner).into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_started_as_the_readme_shows_with_their_files_in_the_run_s_directory() {
        let setup = ChainSetup {
            dir: PathBuf::from("/dev/shm"),
            flush: "auto".to_owned(),
            groups: 16,
            keys: 1000,
            value_max: 64,
            member_max_ops_per_s: Some(2000),
            cpu: None,
            key_file: None,
            auth_keys: None,
        };
        let members: Vec<SocketAddr> = (1..=3).map(|port| loopback(7400 + port)).collect();
        let fixed = Membership::Fixed(&members);
        let args = member_args(
            &setup,
            2,
            members[1],
            fixed,
            loopback(7500),
            Path::new("/d"),
        );
        let text = args.join(" ");
        assert!(
            text.starts_with(
                "device --device-id 2 --listen 127.0.0.1:7402 --server 1=127.0.0.1:7500 \
                 --chain-member 127.0.0.1:7401 --chain-member 127.0.0.1:7402 --chain-member \
                 127.0.0.1:7403"
            ),
            "{text}"
        );
        assert!(text.contains("--chain-table /d/chain2.table"), "{text}");
        assert!(text.contains("--chain-keys 3024"), "{text}");
        assert!(text.contains("--chain-max-ops-per-s 2000"), "{text}");
        let controlled = Membership::Controlled(loopback(7700));
        let args = member_args(
            &setup,
            4,
            loopback(7404),
            controlled,
            loopback(7500),
            Path::new("/d"),
        );
        let text = args.join(" ");
        assert!(text.contains("--listen 127.0.0.1:7404"), "{text}");
        assert!(text.contains("--chain-controller 127.0.0.1:7700"), "{text}");
        assert!(!text.contains("--chain-member"), "{text}");
    }

    #[test]
    fn banner_values_are_read_from_their_lines() {
        let banner = "pmnet device 1 listening on 127.0.0.1:1\n  medium: emulated-pm via clwb\n  \
                      wait: blocking; metrics: http://127.0.0.1:9/metrics\n";
        assert_eq!(
            banner_value(banner, "medium: ").as_deref(),
            Some("emulated-pm via clwb")
        );
        assert_eq!(
            banner_value(banner, "metrics: http://").as_deref(),
            Some("127.0.0.1:9/metrics")
        );
        assert_eq!(banner_value(banner, "nothing: "), None);
    }
}
