//! The two systems, each started afresh for every workload and stopped at its end: a
//! redis-server with `appendonly yes` and `appendfsync always` (the baseline's, and the one
//! PMNet is put in front of, with the PMNet module loaded when the module is the server side),
//! and `pmnet redis-up --redis ADDR` as a user starts it. Both are children of this process
//! (`crate::procs::Proc`: their own process group, killed if this process dies, stopped when
//! dropped).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pmnet_redis::resp::{SyncClient, Value};
use pmnet_runtime::Shutdown;
use serde::Serialize;

use crate::procs::{children_of, file_system, free_ports, loopback, wait_until, Proc};
use pmnet::CliError;

/// How long a system may take to start.
const START_PATIENCE: Duration = Duration::from_secs(60);

/// PMNet's server side: the module inside its redis-server, or the adaptor, a process of its
/// own (`pmnet redis-up --server-side`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerSide {
    /// The module, from this file.
    Module(PathBuf),
    Adaptor,
}

impl ServerSide {
    pub fn name(&self) -> &'static str {
        match self {
            ServerSide::Module(_) => "module",
            ServerSide::Adaptor => "adaptor",
        }
    }
}

/// The addresses of PMNet's parts, chosen before its redis-server starts (the module in it
/// must know the device's): the gateway (TCP), the device and the server side (UDP: the
/// module's socket in redis-server, or the adaptor's).
#[derive(Debug, Clone, Copy)]
pub struct PmnetAddrs {
    pub gateway: SocketAddr,
    pub device: SocketAddr,
    pub server: SocketAddr,
}

impl PmnetAddrs {
    pub fn free() -> Result<PmnetAddrs, CliError> {
        let ports = free_ports(3)?;
        Ok(PmnetAddrs {
            gateway: loopback(ports[0]),
            device: loopback(ports[1]),
            server: loopback(ports[2]),
        })
    }

    /// The options that load `side`'s module into redis-server, as docs/redis.md loads it:
    /// listening on the server address, the device in front of it (none for the adaptor).
    pub fn redis_args(&self, side: &ServerSide) -> Vec<String> {
        match side {
            ServerSide::Module(path) => {
                pmnet::module_redis_args(path, self.server, self.device, None)
            }
            ServerSide::Adaptor => Vec::new(),
        }
    }
}

/// A redis-server of the benchmark's.
pub struct Redis {
    pub addr: SocketAddr,
    proc: Proc,
}

impl Redis {
    /// Start `program` with its append-only file in `dir` (made if missing), on a free port,
    /// with `extra` options after the durable ones (the module's `--loadmodule`).
    pub fn start(
        program: &Path,
        name: &str,
        dir: &Path,
        extra: &[String],
        shutdown: &Shutdown,
    ) -> Result<Redis, CliError> {
        std::fs::create_dir_all(dir)
            .map_err(|error| format!("cannot make {}: {error}", dir.display()))?;
        let port = free_ports(1)?[0];
        let mut args = pmnet::durable_redis_args(port, dir);
        args.extend(extra.iter().cloned());
        let mut proc = Proc::spawn(name, program, &args, &dir.join("redis.log"), None)?;
        let addr = loopback(port);
        wait_until(
            &format!("{name} to answer PING"),
            START_PATIENCE,
            std::slice::from_mut(&mut proc),
            shutdown,
            || Ok(ping(addr)),
        )?;
        Ok(Redis { addr, proc })
    }

    /// A direct connection.
    pub fn connect(&self) -> Result<SyncClient, CliError> {
        SyncClient::connect(self.addr, Duration::from_secs(30))
            .map_err(|error| format!("cannot connect to {}: {error}", self.proc.name).into())
    }

    pub fn check_running(&mut self) -> Result<(), CliError> {
        self.proc.check_running()
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Wait (at most [`SETTLE_PATIENCE`]) until Redis rewrites no append-only file, so that a
    /// rewrite one system's writes set off does not run during the other system's round.
    pub fn settle(&self) -> Result<(), CliError> {
        let mut client = self.connect()?;
        let started = std::time::Instant::now();
        loop {
            let info = client
                .command(&["INFO", "persistence"])
                .map_err(|error| format!("INFO persistence: {error}"))?;
            let text = String::from_utf8_lossy(info.as_bytes().unwrap_or_default()).into_owned();
            let busy = text.lines().any(|line| {
                matches!(
                    line.trim(),
                    "aof_rewrite_in_progress:1" | "aof_rewrite_scheduled:1"
                )
            });
            if !busy || started.elapsed() > SETTLE_PATIENCE {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// How long [`Redis::settle`] waits for a rewrite to end at most.
const SETTLE_PATIENCE: Duration = Duration::from_secs(120);

fn ping(addr: SocketAddr) -> bool {
    SyncClient::connect(addr, Duration::from_secs(1))
        .and_then(|mut client| client.command(&["PING"]))
        .is_ok_and(|reply| reply == Value::Simple(b"PONG".to_vec()))
}

/// `pmnet redis-up` in front of a [`Redis`].
pub struct RedisUp {
    /// Where clients connect: the gateway.
    pub addr: SocketAddr,
    proc: Proc,
    log_file: PathBuf,
}

/// The gateway's own counts of the commands it took, from the line it prints when it stops.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct GatewayCommands {
    pub local: u64,
    pub update: u64,
    pub bypass: u64,
}

impl RedisUp {
    /// `EXE redis-up --redis ADDR --server-side SIDE` with the addresses `addrs` (the device's
    /// the one the module in `redis` was given) and a device log (in `log_dir`) of its own, and
    /// its output in `dir/redis-up.log`.
    pub fn start(
        exe: &Path,
        redis: &Redis,
        addrs: PmnetAddrs,
        side: &ServerSide,
        dir: &Path,
        log_dir: &Path,
        shutdown: &Shutdown,
    ) -> Result<RedisUp, CliError> {
        let log_file = log_dir.join("device.log");
        let mut args = vec![
            "redis-up".to_owned(),
            "--redis".to_owned(),
            redis.addr.to_string(),
            "--listen".to_owned(),
            addrs.gateway.to_string(),
            "--device-listen".to_owned(),
            addrs.device.to_string(),
            "--adaptor-listen".to_owned(),
            addrs.server.to_string(),
            "--log-file".to_owned(),
            log_file.display().to_string(),
            "--server-side".to_owned(),
            side.name().to_owned(),
        ];
        if let ServerSide::Module(path) = side {
            args.extend(["--module".to_owned(), path.display().to_string()]);
        }
        let mut proc = Proc::spawn(
            "pmnet redis-up",
            exe,
            &args,
            &dir.join("redis-up.log"),
            None,
        )?;
        let addr = addrs.gateway;
        wait_until(
            "pmnet redis-up's gateway",
            START_PATIENCE,
            std::slice::from_mut(&mut proc),
            shutdown,
            || Ok(proc_says(&dir.join("redis-up.log"), "clients connect to") && ping(addr)),
        )?;
        Ok(RedisUp {
            addr,
            proc,
            log_file,
        })
    }

    /// Lines of its output that contain `needle`, without the part's prefix and indent.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        self.proc
            .log_text()
            .lines()
            .filter(|line| line.contains(needle))
            .map(|line| line.trim().to_owned())
            .collect()
    }

    /// The device's and the adaptor's medium, and the placement, as redis-up printed them.
    pub fn media(&self) -> (String, String, String) {
        let find = |prefix: &str| {
            self.lines_with("medium:")
                .into_iter()
                .find(|line| line.starts_with(prefix))
                .and_then(|line| line.split_once("medium:").map(|(_, m)| m.trim().to_owned()))
                .unwrap_or_else(|| "unknown (not in redis-up's output)".to_owned())
        };
        let placement = self
            .lines_with("placement (")
            .into_iter()
            .next()
            .unwrap_or_else(|| "unknown".to_owned());
        (find("[device]"), find("[redis-adaptor]"), placement)
    }

    /// What redis-up says of its server side (its `server side:` line, without the label).
    pub fn server_side(&self) -> Option<String> {
        self.lines_with("server side:")
            .into_iter()
            .next()
            .and_then(|line| {
                line.split_once("server side:")
                    .map(|(_, text)| text.trim().to_owned())
            })
    }

    /// The parts redis-up started (its children), by the command each runs: `gateway`,
    /// `device` and `adaptor` (`pmnet redis-adaptor`), with their process ids.
    pub fn parts(&self) -> Vec<(&'static str, u32)> {
        let mut parts: Vec<(&'static str, u32)> = children_of(self.proc.pid())
            .into_iter()
            .filter_map(|(pid, words)| {
                let part = match words.get(1).map(String::as_str) {
                    Some("gateway") => "gateway",
                    Some("device") => "device",
                    Some("redis-adaptor") => "adaptor",
                    _ => return None,
                };
                Some((part, pid))
            })
            .collect();
        parts.sort();
        parts
    }

    pub fn check_running(&mut self) -> Result<(), CliError> {
        self.proc.check_running()
    }

    /// Stop it (and so the device, adaptor and gateway); the gateway's command counts.
    pub fn stop(mut self) -> Option<GatewayCommands> {
        self.proc.stop();
        let _ = std::fs::remove_file(&self.log_file);
        self.lines_with("gateway stopped:")
            .last()
            .and_then(|line| gateway_commands(line))
    }
}

fn proc_says(log: &Path, needle: &str) -> bool {
    std::fs::read_to_string(log).is_ok_and(|text| text.contains(needle))
}

/// `commands local L update U bypass B` in the gateway's closing line.
fn gateway_commands(line: &str) -> Option<GatewayCommands> {
    let rest = line.split_once("commands local ")?.1;
    let mut words = rest.split_whitespace();
    let local = words.next()?.parse().ok()?;
    let mut take = |name: &str| -> Option<u64> {
        (words.next()? == name).then_some(())?;
        words.next()?.parse().ok()
    };
    let update = take("update")?;
    let bypass = take("bypass")?;
    Some(GatewayCommands {
        local,
        update,
        bypass,
    })
}

/// Where a path's files go: its file system and the device or source mounted there.
pub fn medium_of(path: &Path) -> String {
    let fs = file_system(path);
    let source = mount_source(path).unwrap_or_else(|| "unknown device".to_owned());
    format!("{fs} on {source}")
}

/// The source (device) of the mount that holds `path`, from /proc/self/mountinfo.
fn mount_source(path: &Path) -> Option<String> {
    let path = std::fs::canonicalize(path).ok()?;
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut best: Option<(usize, String)> = None;
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(mount_point), Some(dash)) =
            (fields.get(4), fields.iter().position(|f| *f == "-"))
        else {
            continue;
        };
        let Some(source) = fields.get(dash + 2) else {
            continue;
        };
        if path.starts_with(mount_point)
            && best
                .as_ref()
                .is_none_or(|(len, _)| mount_point.len() >= *len)
        {
            best = Some((mount_point.len(), (*source).to_owned()));
        }
    }
    best.map(|(_, source)| source)
}

/// `program --version`'s first line.
pub fn redis_version(program: &Path) -> String {
    std::process::Command::new(program)
        .arg("--version")
        .output()
        .ok()
        .and_then(|output| {
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .next()
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown version".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_s_closing_counts_are_read() {
        let line = "2026-11-26T21:06:47Z  INFO gateway: gateway stopped: gateway: connections \
                    open 0 accepted 2 refused 0 closed 2; commands local 3 update 17 bypass 5 \
                    cache-read 0 (answered by the device 0) rejected 0; updates acked";
        let counts = gateway_commands(line).unwrap();
        assert_eq!((counts.local, counts.update, counts.bypass), (3, 17, 5));
        assert!(gateway_commands("commands local x").is_none());
        assert!(gateway_commands("nothing here").is_none());
    }

    #[test]
    fn the_medium_names_a_file_system_and_a_source() {
        let text = medium_of(Path::new("/"));
        assert!(text.contains(" on "), "{text}");
    }
}
