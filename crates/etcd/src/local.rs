//! A one-member etcd of a process's own: for one machine, `pmnet controller` without `--etcd`
//! starts one (as `redis-up --start-redis` starts a Redis), and tests start one.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Etcd, EtcdError};

/// `program` if it is a path to a file, else the first match on `PATH`.
pub fn find_program(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let path = PathBuf::from(program);
        return path.is_file().then_some(path);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}

/// `etcd --version`'s first line, for reports ("etcd (version unknown)" if it does not say).
pub fn version_of(program: &Path) -> String {
    Command::new(program)
        .arg("--version")
        .output()
        .ok()
        .and_then(|output| {
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .next()
                .map(|line| line.trim().to_owned())
        })
        .unwrap_or_else(|| "etcd (version unknown)".to_owned())
}

/// A running one-member etcd, stopped (SIGTERM, then waited for) when dropped.
#[derive(Debug)]
pub struct LocalEtcd {
    child: Child,
    client: SocketAddr,
    data_dir: PathBuf,
    log: PathBuf,
    version: String,
}

/// A free port on loopback (bound and released: etcd binds it next).
fn free_port() -> Result<u16, EtcdError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .map_err(|error| EtcdError(format!("finding a free port for etcd: {error}")))
}

impl LocalEtcd {
    /// Start `program` (`etcd`, or a path) as a one-member cluster with its data in
    /// `data_dir` (kept: a restart finds the state again) and its log in `data_dir`/etcd.log,
    /// clients served at `client` (port 0: a free one), and wait until it answers a
    /// linearizable read. Elections and leases are tuned for one machine: a heartbeat of
    /// 10 ms and an election timeout of 100 ms, so leases as short as one second keep the
    /// time to live they ask for.
    pub fn start(
        program: &str,
        data_dir: &Path,
        client: SocketAddr,
        ready_within: Duration,
    ) -> Result<LocalEtcd, EtcdError> {
        let path = find_program(program).ok_or_else(|| {
            EtcdError(format!(
                "etcd not found ({program:?} is not a file nor on PATH): install it with \
                 `apt-get install etcd-server`, or name a running cluster with --etcd"
            ))
        })?;
        let version = version_of(&path);
        std::fs::create_dir_all(data_dir).map_err(|error| {
            EtcdError(format!(
                "etcd data directory {}: {error}",
                data_dir.display()
            ))
        })?;
        let client = if client.port() == 0 {
            SocketAddr::new(client.ip(), free_port()?)
        } else {
            client
        };
        let peer = SocketAddr::new(client.ip(), free_port()?);
        let log = data_dir.join("etcd.log");
        let log_file = std::fs::File::create(&log)
            .map_err(|error| EtcdError(format!("etcd log {}: {error}", log.display())))?;
        let client_url = format!("http://{client}");
        let peer_url = format!("http://{peer}");
        let child = Command::new(&path)
            .args(["--name", "pmnet"])
            .arg("--data-dir")
            .arg(data_dir.join("member-data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("pmnet={peer_url}")])
            .args(["--heartbeat-interval", "10", "--election-timeout", "100"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(["--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(
                log_file
                    .try_clone()
                    .map_err(|error| EtcdError(error.to_string()))?,
            )
            .stderr(log_file)
            .spawn()
            .map_err(|error| EtcdError(format!("starting {}: {error}", path.display())))?;
        let mut etcd = LocalEtcd {
            child,
            client,
            data_dir: data_dir.to_owned(),
            log,
            version,
        };
        etcd.wait_ready(ready_within)?;
        Ok(etcd)
    }

    fn wait_ready(&mut self, within: Duration) -> Result<(), EtcdError> {
        let deadline = Instant::now() + within;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(EtcdError(format!(
                    "etcd exited ({status}) before it served; its log {}:\n{}",
                    self.log.display(),
                    self.log_tail()
                )));
            }
            match Etcd::connect(&[self.client], Duration::from_millis(500))
                .and_then(|mut etcd| etcd.get(b"/pmnet-ready"))
            {
                Ok(_) => return Ok(()),
                Err(error) => last = error.0,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(EtcdError(format!(
            "etcd at {} did not serve within {} s ({last}); its log {}:\n{}",
            self.client,
            within.as_secs(),
            self.log.display(),
            self.log_tail()
        )))
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    /// Where clients reach it.
    pub fn endpoint(&self) -> SocketAddr {
        self.client
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// `etcd --version`'s first line.
    pub fn version(&self) -> &str {
        &self.version
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stop it: SIGTERM, and wait (SIGKILL after 5 s).
    pub fn stop(&mut self) {
        stop_child(&mut self.child, Duration::from_secs(5));
    }
}

/// Stop `child`: SIGTERM, a wait of at most `patience`, then SIGKILL; reaped either way.
pub fn stop_child(child: &mut Child, patience: Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on the pid of our own child, not yet reaped (try_wait above said it
        // runs), so the pid cannot have been reused.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        self.stop();
    }
}
