//! A device and a server on loopback, as threads of this process, with their files in a
//! temporary place (under /dev/shm by default) that is removed when the system stops.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use pmnet_pktstore::EngineKind;
use pmnet_pm::MmapOptions;
use pmnet_runtime::{
    DeviceAddresses, DeviceOptions, DeviceRuntime, LogOptions, LoopOptions, Metrics, ServerOptions,
    ServerRuntime, Shutdown, StoreOptions, WaitMode,
};

/// How long a starting thread may take to bind its sockets and open its file.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What a loopback system is made of.
#[derive(Debug, Clone)]
pub struct LoopbackConfig {
    pub server_id: u16,
    pub device_id: u16,
    /// The server runs the ideal handler instead of a store.
    pub ideal: bool,
    /// The server's `pmnet-pktstore` engine; `None` for the key-value store (`--engine kv`).
    pub engine: Option<EngineKind>,
    pub mmap: MmapOptions,
    /// Where the log and data files go.
    pub dir: PathBuf,
    pub slots: u32,
    pub slot_size: u32,
    pub data_bytes: u64,
    pub max_sessions: u32,
    pub wait: WaitMode,
    pub device_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    /// Authenticate every datagram with these keys (`None`: no authentication).
    pub keys: Option<pmnet_runtime::KeySet>,
    /// The device packs what it sends the server into batches.
    pub batch: bool,
    /// How long a batch of update requests may wait for more (`pmnet device --batch-hold-us`).
    pub batch_hold: Duration,
    /// Device workers (`pmnet device --workers`): independent devices the clients' sessions
    /// are spread over.
    pub device_workers: u16,
    /// Servers behind the device (a rack: ids `server_id..server_id + servers`).
    pub servers: u16,
    /// Every server's emulated capacity (`pmnet server --max-ops-per-s`).
    pub server_max_ops_per_s: Option<u64>,
    /// The device's shortest resend timeout (`None`: its default).
    pub resend_timeout: Option<Duration>,
    /// The device runs the read cache in front of its log (`pmnet device --cache`).
    pub cache: Option<super::cache::CacheSettings>,
}

/// Where the parts of a system listen.
#[derive(Debug, Clone)]
pub struct SystemAddresses {
    /// The device's PMNet port (logging on); of its first worker when there are several.
    pub device: SocketAddr,
    /// The PMNet ports of the other workers.
    pub device_workers: Vec<SocketAddr>,
    /// The device's forward port (logging off: a plain switch).
    pub forward: SocketAddr,
    /// The device's UDP echo port.
    pub echo: SocketAddr,
    /// The first server.
    pub server: SocketAddr,
    /// Every server, in id order (the first is `server`).
    pub servers: Vec<SocketAddr>,
}

/// What the device and the server counted, when they stopped.
#[derive(Debug)]
pub struct SystemCounters {
    /// Every device worker's counters.
    pub device: Vec<Metrics>,
    /// Every server's counters.
    pub servers: Vec<Metrics>,
}

/// A running device and server. Stop it with [`LoopbackSystem::stop`]; dropping it stops it too.
#[derive(Debug)]
pub struct LoopbackSystem {
    shutdown: Shutdown,
    device: Vec<JoinHandle<Metrics>>,
    servers: Vec<JoinHandle<Metrics>>,
    files: Vec<PathBuf>,
    pub addresses: SystemAddresses,
    pub device_medium: String,
    pub server_medium: String,
    /// The device's and the server's threads (their CPU time is read from `/proc`).
    pub device_tids: Vec<i32>,
    pub server_tids: Vec<i32>,
}

/// Removes a file when dropped (and, for a server's data file, its forward log).
#[derive(Debug)]
pub(super) struct FileGuard(pub(super) Option<PathBuf>);

impl Drop for FileGuard {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(pmnet_runtime::forward_log_path(&path));
            let _ = std::fs::remove_file(path);
        }
    }
}

pub(super) fn temp_path(dir: &Path, what: &str) -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let index = NEXT.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("pmnet-bench-{}-{index}.{what}", std::process::id()))
}

/// Run `body` with only warnings and errors logged from this thread: the runtimes' start and
/// stop lines would interleave with the benchmark's own output.
fn quietly<T>(body: impl FnOnce() -> T) -> T {
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(std::io::stderr)
        .with_target(false)
        .finish();
    tracing::subscriber::with_default(subscriber, body)
}

impl LoopbackSystem {
    /// Start the server, then the device in front of it; each binds 127.0.0.1 ports chosen by
    /// the kernel and formats a new file.
    pub fn start(config: &LoopbackConfig) -> Result<LoopbackSystem, String> {
        let shutdown = Shutdown::new();
        let log_path = temp_path(&config.dir, "log");
        // Guards remove the files if starting fails half-way.
        let workers = config.device_workers.max(1);
        let log_guards: Vec<FileGuard> = (0..workers)
            .map(|index| FileGuard(Some(pmnet_runtime::worker_log_path(&log_path, index))))
            .collect();
        let data_guards: Vec<FileGuard> = (0..config.servers.max(1))
            .map(|_| FileGuard(Some(temp_path(&config.dir, "data"))))
            .collect();
        let servers = start_servers(config, &data_guards, &shutdown)?;
        let server_ids: Vec<(u16, SocketAddr)> = servers
            .iter()
            .enumerate()
            .map(|(index, server)| (config.server_id + index as u16, server.addr))
            .collect();
        let mut devices: Vec<StartedDevice> = Vec::new();
        for index in 0..workers {
            let place = DevicePlace::anywhere();
            match start_device(
                config,
                log_path.clone(),
                index,
                &server_ids,
                place,
                &shutdown,
            ) {
                Ok(device) => devices.push(device),
                Err(message) => {
                    shutdown.request();
                    for device in devices {
                        let _ = device.thread.join();
                    }
                    for server in servers {
                        let _ = server.thread.join();
                    }
                    return Err(message);
                }
            }
        }
        let mut files = Vec::new();
        for mut guard in log_guards.into_iter().chain(data_guards) {
            files.extend(guard.0.take());
        }
        let first = &devices[0];
        let addresses = SystemAddresses {
            device: first.data,
            device_workers: devices[1..].iter().map(|device| device.data).collect(),
            forward: first.forward.expect("worker 0 has a forward port"),
            echo: first.echo.expect("worker 0 has an echo port"),
            server: servers[0].addr,
            servers: servers.iter().map(|server| server.addr).collect(),
        };
        let device_medium = first.medium.clone();
        let device_tids = devices.iter().map(|device| device.tid).collect();
        let server_medium = servers[0].medium.clone();
        let server_tids = servers.iter().map(|server| server.tid).collect();
        Ok(LoopbackSystem {
            shutdown,
            device: devices.into_iter().map(|device| device.thread).collect(),
            servers: servers.into_iter().map(|server| server.thread).collect(),
            files,
            addresses,
            device_medium,
            server_medium,
            device_tids,
            server_tids,
        })
    }

    /// Stop both threads (each finishes the batch in hand), remove the files, and return what
    /// they counted.
    pub fn stop(mut self) -> SystemCounters {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> SystemCounters {
        self.shutdown.request();
        let device = self
            .device
            .drain(..)
            .filter_map(|handle| handle.join().ok())
            .collect();
        let servers = self
            .servers
            .drain(..)
            .filter_map(|handle| handle.join().ok())
            .collect();
        for path in self.files.drain(..) {
            // A server's data file has its forward log next to it.
            let _ = std::fs::remove_file(pmnet_runtime::forward_log_path(&path));
            let _ = std::fs::remove_file(path);
        }
        SystemCounters { device, servers }
    }
}

impl Drop for LoopbackSystem {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

/// The loop options of a part of the system: the system's wait mode, pinned to `cpu`, no
/// reports and no metrics endpoint.
fn loop_options(config: &LoopbackConfig, cpu: Option<usize>) -> LoopOptions {
    LoopOptions {
        wait: config.wait,
        cpu,
        report_interval: None,
        metrics_listen: None,
        ..LoopOptions::default()
    }
}

/// A loopback address with a port the kernel chooses.
fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A started server thread: where it listens and its medium.
pub(super) struct StartedServer {
    pub(super) thread: JoinHandle<Metrics>,
    pub(super) addr: SocketAddr,
    pub(super) medium: String,
    pub(super) tid: i32,
}

/// Start a server thread for each of `data_files` (ids counting up from the config's), and
/// wait until each listens; if one does not, stop those that did.
fn start_servers(
    config: &LoopbackConfig,
    data_files: &[FileGuard],
    shutdown: &Shutdown,
) -> Result<Vec<StartedServer>, String> {
    let mut servers: Vec<StartedServer> = Vec::new();
    for (index, file) in data_files.iter().enumerate() {
        let data_path = file.0.clone().unwrap_or_default();
        match start_server(config, index as u16, data_path, shutdown) {
            Ok(server) => servers.push(server),
            Err(message) => {
                shutdown.request();
                for server in servers {
                    let _ = server.thread.join();
                }
                return Err(message);
            }
        }
    }
    Ok(servers)
}

/// Start server thread `index` (id `server_id + index`), with its store (or the ideal
/// handler) in a new file at `data_path`, and wait until it listens.
fn start_server(
    config: &LoopbackConfig,
    index: u16,
    data_path: PathBuf,
    shutdown: &Shutdown,
) -> Result<StartedServer, String> {
    let place = ServerPlace {
        server_id: config.server_id + index,
        listen: loopback(),
        devices: Vec::new(),
        replicas: Vec::new(),
    };
    start_server_at(config, place, data_path, shutdown)
}

/// Where a server goes and who it knows.
#[derive(Debug, Clone)]
pub(super) struct ServerPlace {
    pub(super) server_id: u16,
    pub(super) listen: SocketAddr,
    /// Its `--device`s.
    pub(super) devices: Vec<SocketAddr>,
    /// Its `--replica`s.
    pub(super) replicas: Vec<SocketAddr>,
}

/// Start a server thread at `place`, with its store (or the ideal handler) in a new file at
/// `data_path`, and wait until it listens.
pub(super) fn start_server_at(
    config: &LoopbackConfig,
    place: ServerPlace,
    data_path: PathBuf,
    shutdown: &Shutdown,
) -> Result<StartedServer, String> {
    let index = place.server_id.wrapping_sub(config.server_id);
    let server_options = ServerOptions {
        server_id: place.server_id,
        listen: place.listen,
        devices: place.devices,
        replicas: place.replicas,
        store: (!config.ideal).then_some(StoreOptions {
            path: data_path,
            size_bytes: config.data_bytes,
            max_sessions: config.max_sessions,
            format: true,
            mmap: config.mmap,
            growth: Default::default(),
        }),
        gap_fill_after: None,
        loop_options: loop_options(config, config.server_cpu),
        keys: config.keys.clone(),
        max_ops_per_s: config.server_max_ops_per_s,
        follow: None,
    };
    let (server_tx, server_rx) = mpsc::channel();
    let server_shutdown = shutdown.clone();
    let engine = config.engine;
    let server = std::thread::Builder::new()
        .name(format!("pmnet-server-{index}"))
        .spawn(move || quietly(|| run_server(server_options, engine, server_shutdown, server_tx)))
        .map_err(|error| format!("cannot start the server thread: {error}"))?;
    match server_rx.recv_timeout(START_TIMEOUT) {
        Ok(Ok((addr, medium, tid))) => Ok(StartedServer {
            thread: server,
            addr,
            medium,
            tid,
        }),
        Ok(Err(error)) => {
            let _ = server.join();
            Err(format!("the server did not start: {error}"))
        }
        Err(_) => {
            shutdown.request();
            let _ = server.join();
            Err("the server did not start in time".into())
        }
    }
}

/// The server thread: open the server, say where it listens (or why it did not open), run it
/// until shutdown; returns what it counted.
fn run_server(
    options: ServerOptions,
    engine: Option<EngineKind>,
    shutdown: Shutdown,
    started: mpsc::Sender<Result<(SocketAddr, String, i32), String>>,
) -> Metrics {
    let mut server = match ServerRuntime::open_with_engine(options, engine, shutdown) {
        Ok(server) => server,
        Err(error) => {
            let _ = started.send(Err(error.to_string()));
            return Metrics::new();
        }
    };
    let _ = started.send(Ok((
        server.addresses().data,
        server.startup().medium_text(),
        super::cpu::current_tid(),
    )));
    if let Err(error) = server.run() {
        tracing::error!("server: {error}");
    }
    server.metrics()
}

/// A started device thread: where it listens and its medium.
pub(super) struct StartedDevice {
    pub(super) thread: JoinHandle<Metrics>,
    /// The PMNet port.
    pub(super) data: SocketAddr,
    forward: Option<SocketAddr>,
    echo: Option<SocketAddr>,
    pub(super) medium: String,
    pub(super) tid: i32,
}

/// Where a device listens, and the devices before it in a chain (`--previous-device`).
pub(super) struct DevicePlace {
    pub(super) listen: SocketAddr,
    pub(super) previous_devices: Vec<(u16, SocketAddr)>,
}

impl DevicePlace {
    /// On a loopback port the kernel chooses, with no device before it.
    pub(super) fn anywhere() -> DevicePlace {
        DevicePlace {
            listen: loopback(),
            previous_devices: Vec::new(),
        }
    }
}

/// Start the device thread in front of `servers` (id, address), at `place`, with its log in
/// a new file at `log_path`, and wait until it listens on its PMNet, forward and echo ports.
/// On failure the device thread is stopped (the caller stops the server).
pub(super) fn start_device(
    config: &LoopbackConfig,
    log_path: PathBuf,
    worker: u16,
    servers: &[(u16, SocketAddr)],
    place: DevicePlace,
    shutdown: &Shutdown,
) -> Result<StartedDevice, String> {
    let device_options = DeviceOptions {
        device_id: config.device_id,
        listen: place.listen,
        servers: servers.to_vec(),
        previous_devices: place.previous_devices,
        follow: None,
        log: Some(LogOptions {
            path: log_path,
            slot_count: config.slots,
            slot_size: config.slot_size,
            format: true,
            mmap: config.mmap,
        }),
        forward_listen: Some(loopback()),
        echo_listen: Some(loopback()),
        max_resends_in_flight: None,
        resend_timeout: config.resend_timeout,
        loop_options: loop_options(config, config.device_cpu),
        keys: config.keys.clone(),
        batch: config.batch,
        batch_hold: config.batch_hold,
        xdp: None,
    }
    .for_worker(worker, pmnet_runtime::online_cpu_count())?;
    let front: Box<dyn pmnet_proto::FrontFunction> = match &config.cache {
        Some(cache) => Box::new(cache.function(device_options.device_id)?),
        None => Box::new(pmnet_proto::Nothing),
    };
    let (device_tx, device_rx) = mpsc::channel();
    let device_shutdown = shutdown.clone();
    let device = std::thread::Builder::new()
        .name(format!("pmnet-device-{worker}"))
        .spawn(move || quietly(|| run_device(device_options, front, device_shutdown, device_tx)))
        .map_err(|error| format!("cannot start the device thread: {error}"))?;
    let fail = |message: String, device: JoinHandle<Metrics>| {
        shutdown.request();
        let _ = device.join();
        Err(message)
    };
    let (addresses, medium, tid) = match device_rx.recv_timeout(START_TIMEOUT) {
        Ok(Ok(started)) => started,
        Ok(Err(error)) => return fail(format!("the device did not start: {error}"), device),
        Err(_) => return fail("the device did not start in time".into(), device),
    };
    if worker == 0 && (addresses.forward.is_none() || addresses.echo.is_none()) {
        return fail("the device opened no forward or echo port".into(), device);
    }
    Ok(StartedDevice {
        thread: device,
        data: addresses.data,
        forward: addresses.forward,
        echo: addresses.echo,
        medium,
        tid,
    })
}

/// The device thread (with `front` in front of its log): open the device, say where it listens (or why it did not open), run it
/// until shutdown; returns what it counted.
fn run_device(
    options: DeviceOptions,
    front: Box<dyn pmnet_proto::FrontFunction>,
    shutdown: Shutdown,
    started: mpsc::Sender<Result<(DeviceAddresses, String, i32), String>>,
) -> Metrics {
    let mut device = match DeviceRuntime::open_with_front(options, shutdown, front) {
        Ok(device) => device,
        Err(error) => {
            let _ = started.send(Err(error.to_string()));
            return Metrics::new();
        }
    };
    let _ = started.send(Ok((
        device.addresses(),
        device.startup().medium_text(),
        super::cpu::current_tid(),
    )));
    if let Err(error) = device.run() {
        tracing::error!("device: {error}");
    }
    device.metrics()
}

/// Remove files an earlier benchmark left in `dir` when it was killed before it could (named
/// `pmnet-bench-<pid>-*` with no process `<pid>` alive). Returns how many were removed.
pub fn remove_stale_files(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    // Bounded: a directory with more entries than this is not scanned to the end.
    for entry in entries.take(100_000).flatten() {
        let name = entry.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|name| name.strip_prefix("pmnet-bench-"))
        else {
            continue;
        };
        let Some(pid) = rest
            .split('-')
            .next()
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_files_of_dead_processes_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        // No process has pid 4_000_000_000 (above the kernel's pid limit).
        let stale = dir.path().join("pmnet-bench-4000000000-0.log");
        let live = dir
            .path()
            .join(format!("pmnet-bench-{}-0.log", std::process::id()));
        let other = dir.path().join("unrelated.log");
        for path in [&stale, &live, &other] {
            std::fs::write(path, b"x").unwrap();
        }
        assert_eq!(remove_stale_files(dir.path()), 1);
        assert!(!stale.exists());
        assert!(live.exists() && other.exists());
    }
}
