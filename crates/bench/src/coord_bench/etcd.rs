//! etcd as a user runs it: three `etcd` members (Debian's `etcd-server`) on loopback, each
//! with its own data directory and etcd's default durability (the write-ahead log is
//! fsync'd before a write is acknowledged), driven over etcd's gRPC API v3.
//!
//! The client is the control plane's (`pmnet_etcd::Etcd`): one gRPC channel (one HTTP/2
//! connection) on a current-thread tokio runtime of its own, driven by the thread that uses
//! it: no thread hop between a request and its reply.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pmnet_runtime::Shutdown;

use super::load::CoordClient;
use crate::procs::{file_system, find_program, free_ports, loopback, run_dir, wait_until, Proc};
use pmnet::CliError;

/// How etcd is started.
#[derive(Debug, Clone)]
pub struct EtcdSetup {
    /// The etcd binary (`--etcd`).
    pub program: String,
    /// Where the members' data directories go.
    pub dir: PathBuf,
    /// The CPU the members run on (`--pin`).
    pub cpu: Option<usize>,
}

/// Three members running; stopped when dropped.
#[derive(Debug)]
pub struct EtcdCluster {
    pub clients: Vec<SocketAddr>,
    pub version: String,
    pub data_dir: PathBuf,
    procs: Vec<Proc>,
    _dir: tempfile::TempDir,
}

/// The error when etcd is not installed.
fn not_installed(program: &str) -> CliError {
    format!(
        "etcd not found ({program:?} is not a file nor on PATH): install it with `apt-get install \
         etcd-server` (Debian's etcd 3.4), give its path with --etcd, or leave etcd out of \
         --system"
    )
    .into()
}

/// One member's arguments: its own ports and data directory; fsync left at its default (on).
fn member_args(
    index: usize,
    clients: &[SocketAddr],
    peers: &[SocketAddr],
    data: &Path,
    token: &str,
) -> Vec<String> {
    let cluster: Vec<String> = peers
        .iter()
        .enumerate()
        .map(|(other, peer)| format!("m{}=http://{peer}", other + 1))
        .collect();
    let client = format!("http://{}", clients[index]);
    let peer = format!("http://{}", peers[index]);
    [
        "--name",
        &format!("m{}", index + 1),
        "--data-dir",
        &data.display().to_string(),
        "--listen-client-urls",
        &client,
        "--advertise-client-urls",
        &client,
        "--listen-peer-urls",
        &peer,
        "--initial-advertise-peer-urls",
        &peer,
        "--initial-cluster",
        &cluster.join(","),
        "--initial-cluster-token",
        token,
        "--initial-cluster-state",
        "new",
        "--logger",
        "zap",
        "--log-outputs",
        "stderr",
        "--log-level",
        "warn",
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect()
}

impl EtcdCluster {
    /// Start three members and wait until a linearizable read succeeds at each (a leader is
    /// elected and every member serves).
    pub fn start(setup: &EtcdSetup, shutdown: &Shutdown) -> Result<EtcdCluster, CliError> {
        let program = find_program(&setup.program).ok_or_else(|| not_installed(&setup.program))?;
        let version = pmnet_etcd::version_of(&program);
        let dir = run_dir(&setup.dir, "etcd")?;
        let ports = free_ports(6)?;
        let clients: Vec<SocketAddr> = ports[..3].iter().map(|&port| loopback(port)).collect();
        let peers: Vec<SocketAddr> = ports[3..].iter().map(|&port| loopback(port)).collect();
        let token = format!("pmnet-coord-bench-{}", std::process::id());
        let mut procs = Vec::new();
        for index in 0..3 {
            let data = dir.path().join(format!("m{}", index + 1));
            let args = member_args(index, &clients, &peers, &data, &token);
            let log = dir.path().join(format!("m{}.log", index + 1));
            procs.push(Proc::spawn(
                &format!("etcd member {}", index + 1),
                &program,
                &args,
                &log,
                setup.cpu,
            )?);
        }
        let mut probes: Vec<Option<EtcdClient>> = (0..3).map(|_| None).collect();
        wait_until(
            "the etcd cluster",
            Duration::from_secs(60),
            &mut procs,
            shutdown,
            || {
                for (index, probe) in probes.iter_mut().enumerate() {
                    if probe.is_none() {
                        *probe = Some(EtcdClient::connect(clients[index], 0)?);
                    }
                    let probe = probe.as_mut().expect("made above");
                    probe.get(b"pmnet-coord-bench-ready")?;
                }
                Ok(true)
            },
        )?;
        Ok(EtcdCluster {
            clients,
            version,
            data_dir: dir.path().to_owned(),
            procs,
            _dir: dir,
        })
    }

    /// Client `index`, connected to member `index` modulo 3.
    pub fn client(&self, index: u32) -> Result<EtcdClient, CliError> {
        EtcdClient::connect(self.clients[index as usize % self.clients.len()], index)
    }

    /// The setting: version and durability.
    pub fn durability(&self) -> String {
        format!(
            "{}; 3 members; each write-ahead-log append fsync'd before the write is \
             acknowledged (default: --unsafe-no-fsync not given); data directories on {}; \
             linearizable reads (default)",
            self.version,
            file_system(&self.data_dir)
        )
    }

    /// The processes' ids.
    pub fn pids(&self) -> Vec<u32> {
        crate::procs::pids(&self.procs)
    }

    pub fn stop(&mut self) {
        crate::procs::stop_all(&mut self.procs);
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A client: one gRPC channel on a runtime of its own (`pmnet_etcd::Etcd`).
#[derive(Debug)]
pub struct EtcdClient {
    etcd: pmnet_etcd::Etcd,
    owner: Vec<u8>,
    /// The lease this client's locks are held under (granted on first use).
    lease: Option<i64>,
}

/// A lease for the locks: longer than any run.
const LEASE_TTL_S: i64 = 3_600;

impl EtcdClient {
    fn connect(addr: SocketAddr, index: u32) -> Result<EtcdClient, CliError> {
        let etcd = pmnet_etcd::Etcd::connect(&[addr], Duration::from_secs(30))
            .map_err(|error| format!("connecting to etcd at {addr}: {error}"))?;
        Ok(EtcdClient {
            etcd,
            owner: format!("client-{index}").into_bytes(),
            lease: None,
        })
    }

    /// A linearizable read of `key`: its value, if it has one.
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, CliError> {
        Ok(self.etcd.get(key)?.map(|entry| entry.value))
    }

    fn lease(&mut self) -> Result<i64, CliError> {
        if let Some(lease) = self.lease {
            return Ok(lease);
        }
        let lease = self.etcd.grant_lease(LEASE_TTL_S)?.id;
        self.lease = Some(lease);
        Ok(lease)
    }
}

impl CoordClient for EtcdClient {
    fn read(&mut self, key: &str) -> Result<(), CliError> {
        match self.get(key.as_bytes())? {
            Some(_) => Ok(()),
            None => Err(format!("etcd: {key} has no value").into()),
        }
    }

    fn write(&mut self, key: &str, value: &[u8]) -> Result<(), CliError> {
        Ok(self.etcd.put(key.as_bytes(), value, 0)?)
    }

    /// A transaction: if the lock's key does not exist, create it with this client's name
    /// under its lease.
    fn acquire(&mut self, name: &str) -> Result<u64, CliError> {
        let lease = self.lease()?;
        let mut attempts = 0;
        loop {
            attempts += 1;
            if self.etcd.create(name.as_bytes(), &self.owner, lease)? {
                return Ok(attempts);
            }
        }
    }

    fn release(&mut self, name: &str) -> Result<(), CliError> {
        let deleted = self.etcd.delete(name.as_bytes())?;
        if deleted != 1 {
            return Err(format!("etcd: releasing {name} deleted {deleted} keys").into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_get_their_own_ports_and_directories_and_the_default_fsync() {
        let clients: Vec<SocketAddr> = (1..=3).map(|port| loopback(2000 + port)).collect();
        let peers: Vec<SocketAddr> = (1..=3).map(|port| loopback(3000 + port)).collect();
        let args = member_args(1, &clients, &peers, Path::new("/d/m2"), "t").join(" ");
        assert!(args.contains("--name m2 --data-dir /d/m2"), "{args}");
        assert!(
            args.contains("--listen-client-urls http://127.0.0.1:2002"),
            "{args}"
        );
        assert!(
            args.contains("--listen-peer-urls http://127.0.0.1:3002"),
            "{args}"
        );
        assert!(
            args.contains(
                "--initial-cluster m1=http://127.0.0.1:3001,m2=http://127.0.0.1:3002,\
                 m3=http://127.0.0.1:3003"
            ),
            "{args}"
        );
        assert!(!args.contains("fsync"), "{args}");
    }

    #[test]
    fn a_missing_etcd_says_how_to_install_it() {
        let setup = EtcdSetup {
            program: "/nonexistent/etcd".to_owned(),
            dir: std::env::temp_dir(),
            cpu: None,
        };
        let error = EtcdCluster::start(&setup, &Shutdown::new())
            .unwrap_err()
            .to_string();
        assert!(error.contains("apt-get install etcd-server"), "{error}");
    }
}
