//! The testbed of a `pmnet bench --in-path` run and the processes on it: `pmnet server` on the
//! server host, `pmnet device` on the router, each started as a user starts it (`ip netns exec
//! NS pmnet ...`, the product's own options), stopped (SIGTERM) when no longer wanted, on
//! errors and on Ctrl-C; the testbed, of a name of the run's own, taken down at the end by its
//! guard. Every configuration starts from a fresh log and store, and is checked before it is
//! measured: an update through it acked as expected and read back from the server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use pmnet_proto::Completion;
use pmnet_runtime::{ClientSession, SessionOptions, Shutdown};
use pmnet_store::{Reply, Request};
use pmnet_testbed::{
    Host, Testbed, TestbedGuard, DEVICE_CLIENT_SIDE, DEVICE_SERVER_SIDE, SERVER_ADDR,
};

use crate::procs::{cpu_seconds_of, find_program, run_dir, Proc};
use pmnet::CliError;

/// The server's port (what in-path clients address).
pub const SERVER_PORT: u16 = 7500;
/// The device's port (what proxy-mode clients address, and servers reach the device at).
pub const DEVICE_PORT: u16 = 7400;
/// The device's UDP echo port (on its kernel socket, on the client link).
pub const ECHO_PORT: u16 = 7401;
/// How long a process may take to print its banner.
const START_PATIENCE: Duration = Duration::from_secs(30);

/// Where in-path clients send (the server), proxy-mode clients (the device) and echo clients.
pub fn server_addr() -> SocketAddr {
    SocketAddr::from((SERVER_ADDR, SERVER_PORT))
}
pub fn proxy_addr() -> SocketAddr {
    SocketAddr::from((DEVICE_CLIENT_SIDE, DEVICE_PORT))
}
pub fn echo_addr() -> SocketAddr {
    SocketAddr::from((DEVICE_CLIENT_SIDE, ECHO_PORT))
}

/// The device, if any, and how it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceRole {
    /// No device process: the router forwards in the kernel, clients talk to the server.
    None,
    /// `pmnet device --xdp cl,sv --in-path`, blocking or busy-polling.
    InPath { busy_poll: bool },
    /// Today's device on its UDP socket, clients addressing it (`pmnet device` without --xdp).
    Proxy,
}

impl DeviceRole {
    pub fn datapath(self) -> &'static str {
        match self {
            DeviceRole::None => "none (kernel IP forwarding)",
            DeviceRole::InPath { .. } => "AF_XDP, in path",
            DeviceRole::Proxy => "UDP socket, proxy (clients address the device)",
        }
    }
}

/// The processes' options that come from `pmnet bench`'s.
#[derive(Debug, Clone)]
pub struct ProcOptions {
    pub flush: String,
    pub persist_latency_ns: u64,
    pub ideal: bool,
    pub engine: String,
    pub data_mib: u64,
    pub slots: u32,
    pub batch_hold_us: u64,
    pub no_batch: bool,
    pub device_cpu: Option<usize>,
    pub server_cpu: Option<usize>,
    /// The in-path device's --xdp-mode.
    pub xdp_mode: String,
    /// Where the log and store files go.
    pub dir: PathBuf,
}

/// The testbed and what runs on it. Fields drop in order: the processes before the testbed.
pub struct Bed {
    device: Option<Proc>,
    server: Option<Proc>,
    role: Option<DeviceRole>,
    testbed: TestbedGuard,
    files: tempfile::TempDir,
    exe: PathBuf,
    ip: PathBuf,
    options: ProcOptions,
    starts: u32,
    /// How far the device's and the server's logs have been read for warnings.
    read_to: [usize; 2],
    /// Every distinct command started, as typed on its host.
    pub commands: Vec<String>,
    /// The device's last report line of each run of a device (counters over its life).
    pub device_reports: Vec<String>,
    /// The banners' medium lines: the device's log and the server's store.
    pub device_medium: Option<String>,
    pub server_medium: Option<String>,
    /// The in-path device's datapath line.
    pub datapath: Option<String>,
}

impl Bed {
    /// Build testbed `name` (taken down again when the bed is dropped).
    pub fn up(name: &str, options: ProcOptions) -> Result<Bed, CliError> {
        pmnet_testbed::available().map_err(|e| format!("no testbed here: {e}"))?;
        pmnet_runtime::xdp_available()
            .map_err(|e| format!("the AF_XDP datapath cannot run here: {e}"))?;
        let ip = find_program("ip").ok_or("`ip` (iproute2) is not on PATH")?;
        let exe = crate::procs::pmnet_program()?;
        let testbed =
            Testbed::guard(name).map_err(|e| format!("cannot build testbed {name}: {e}"))?;
        let files = run_dir(&options.dir, "inpath")?;
        Ok(Bed {
            device: None,
            server: None,
            role: None,
            testbed,
            files,
            exe,
            ip,
            options,
            starts: 0,
            read_to: [0; 2],
            commands: Vec::new(),
            device_reports: Vec::new(),
            device_medium: None,
            server_medium: None,
            datapath: None,
        })
    }

    pub fn testbed(&self) -> &Testbed {
        &self.testbed
    }

    pub fn device_pid(&self) -> Option<u32> {
        self.device.as_ref().map(Proc::pid)
    }

    pub fn server_pid(&self) -> Option<u32> {
        self.server.as_ref().map(Proc::pid)
    }

    /// CPU seconds of the device and the server so far (`None` for one that does not run).
    pub fn cpu_seconds(&self) -> (Option<f64>, Option<f64>) {
        (
            self.device_pid().and_then(cpu_seconds_of),
            self.server_pid().and_then(cpu_seconds_of),
        )
    }

    /// The ends of the device's and the server's logs, for an error.
    pub fn log_tails(&self) -> String {
        [&self.device, &self.server]
            .into_iter()
            .flatten()
            .map(|proc| {
                format!(
                    "--- {} (its log's last lines):\n{}",
                    proc.name,
                    proc.log_tail(10)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The warnings and errors the device and the server logged since the last call (at most
    /// five of each, and how many more).
    pub fn new_warnings(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for (proc, read_to) in [&self.device, &self.server]
            .into_iter()
            .zip(&mut self.read_to)
        {
            let Some(proc) = proc else { continue };
            let text = proc.log_text();
            let fresh = text.get(*read_to..).unwrap_or("");
            *read_to = text.len();
            let lines: Vec<&str> = fresh
                .lines()
                .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
                .collect();
            for line in lines.iter().take(5) {
                out.push(format!("{}: {}", proc.name, line.trim()));
            }
            if lines.len() > 5 {
                out.push(format!("{}: ... and {} more", proc.name, lines.len() - 5));
            }
        }
        out
    }

    /// An error if the device or the server has exited: its status and the end of its log.
    pub fn check_running(&mut self) -> Result<(), CliError> {
        for proc in [&mut self.device, &mut self.server].into_iter().flatten() {
            proc.check_running()?;
        }
        Ok(())
    }

    /// Have `role` running, with a server (fronted by the device if there is one): started
    /// fresh unless it runs already, and checked.
    pub fn ensure(&mut self, role: DeviceRole, shutdown: &Shutdown) -> Result<(), CliError> {
        if self.role == Some(role) {
            return self.check_running();
        }
        self.stop();
        self.starts += 1;
        if role != DeviceRole::None {
            let device = self.start_device(role, shutdown)?;
            self.device = Some(device);
        }
        let server = self.start_server(role != DeviceRole::None, shutdown)?;
        self.server = Some(server);
        self.role = Some(role);
        self.check(role, shutdown)?;
        // What the processes said while starting (the server warns that its device is not
        // up yet when it starts first) is not the measurements'.
        self.new_warnings();
        Ok(())
    }

    /// Stop the device and the server; keep the device's last report line.
    pub fn stop(&mut self) {
        if let Some(mut device) = self.device.take() {
            device.stop();
            if let Some(line) = device
                .log_text()
                .lines()
                .rfind(|line| line.contains("device stopped") || line.contains("device 1:"))
            {
                let role = self.role.map_or("device", DeviceRole::datapath);
                self.device_reports.push(format!("{role}: {}", line.trim()));
            }
        }
        if let Some(mut server) = self.server.take() {
            server.stop();
        }
        self.role = None;
        self.read_to = [0; 2];
        for entry in std::fs::read_dir(self.files.path()).into_iter().flatten() {
            let Ok(entry) = entry else { continue };
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.ends_with(".log") && name.starts_with("device-") || name.ends_with(".data") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    fn spawn(
        &mut self,
        host: Host,
        name: &str,
        args: Vec<String>,
        shutdown: &Shutdown,
    ) -> Result<Proc, CliError> {
        let command = format!("{host} host: pmnet {}", args.join(" "));
        // The same command in every round: the run's directory and the files' numbers left out.
        let shown = command
            .replace(&self.files.path().display().to_string(), "DIR")
            .replace(&format!("server-{}.data", self.starts), "server-N.data")
            .replace(&format!("device-{}.log", self.starts), "device-N.log");
        if !self.commands.contains(&shown) {
            self.commands.push(shown);
        }
        let mut full = vec![
            "netns".to_owned(),
            "exec".to_owned(),
            self.testbed.netns(host),
            self.exe.display().to_string(),
        ];
        full.extend(args);
        let log = self
            .files
            .path()
            .join(format!("{name}-{}.out", self.starts));
        let mut proc = Proc::spawn(name, &self.ip, &full, &log, None)?;
        // The banner ends with the line naming the wait mode, the CPU and the metrics.
        let deadline = Instant::now() + START_PATIENCE;
        loop {
            proc.check_running()?;
            if proc.log_text().contains("metrics: ") {
                return Ok(proc);
            }
            if shutdown.is_requested() {
                return Err(format!("interrupted while {name} started").into());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{name} printed no banner within {} s; its log:\n{}",
                    START_PATIENCE.as_secs(),
                    proc.log_tail(20)
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn common_args(&self, args: &mut Vec<String>, cpu: Option<usize>) {
        let options = &self.options;
        // The testbed's hosts are namespaces of this machine, reached by no other host; the
        // in-path comparison measures traffic without keys (protected mode would refuse it).
        args.push("--insecure".to_owned());
        args.extend(["--flush".to_owned(), options.flush.clone()]);
        if options.persist_latency_ns > 0 {
            args.extend([
                "--persist-latency-ns".to_owned(),
                options.persist_latency_ns.to_string(),
            ]);
        }
        if let Some(cpu) = cpu {
            args.extend(["--cpu".to_owned(), cpu.to_string()]);
        }
    }

    fn start_device(&mut self, role: DeviceRole, shutdown: &Shutdown) -> Result<Proc, CliError> {
        let log = self
            .files
            .path()
            .join(format!("device-{}.log", self.starts));
        let mut args: Vec<String> = [
            "device",
            "--listen",
            &format!("0.0.0.0:{DEVICE_PORT}"),
            "--server",
            &format!("1={}", server_addr()),
        ]
        .map(str::to_owned)
        .to_vec();
        if let DeviceRole::InPath { .. } = role {
            args.extend(["--xdp", "cl,sv", "--in-path"].map(str::to_owned));
            if self.options.xdp_mode != "native" {
                args.extend(["--xdp-mode".to_owned(), self.options.xdp_mode.clone()]);
            }
        }
        args.extend([
            "--echo-listen".to_owned(),
            echo_addr().to_string(),
            "--log-file".to_owned(),
            log.display().to_string(),
            "--slots".to_owned(),
            self.options.slots.to_string(),
            "--batch-hold-us".to_owned(),
            self.options.batch_hold_us.to_string(),
        ]);
        if self.options.no_batch {
            args.push("--no-batch".to_owned());
        }
        if role == (DeviceRole::InPath { busy_poll: true }) {
            args.push("--busy-poll".to_owned());
        }
        self.common_args(&mut args, self.options.device_cpu);
        let device = self.spawn(Host::Device, "device", args, shutdown)?;
        let banner = device.log_text();
        let line = |label: &str| {
            banner
                .lines()
                .find_map(|line| line.trim().strip_prefix(label).map(str::to_owned))
        };
        self.device_medium = self.device_medium.take().or_else(|| line("medium: "));
        if let DeviceRole::InPath { .. } = role {
            self.datapath = self.datapath.take().or_else(|| line("datapath: "));
        }
        Ok(device)
    }

    fn start_server(&mut self, fronted: bool, shutdown: &Shutdown) -> Result<Proc, CliError> {
        let mut args: Vec<String> = ["server", "--listen", &server_addr().to_string()]
            .map(str::to_owned)
            .to_vec();
        if fronted {
            args.extend([
                "--device".to_owned(),
                SocketAddr::from((DEVICE_SERVER_SIDE, DEVICE_PORT)).to_string(),
            ]);
        }
        if self.options.ideal {
            args.push("--ideal".to_owned());
        } else {
            let data = self
                .files
                .path()
                .join(format!("server-{}.data", self.starts));
            args.extend([
                "--data-file".to_owned(),
                data.display().to_string(),
                "--data-mib".to_owned(),
                self.options.data_mib.to_string(),
                "--engine".to_owned(),
                self.options.engine.clone(),
            ]);
        }
        self.common_args(&mut args, self.options.server_cpu);
        let server = self.spawn(Host::Server, "server", args, shutdown)?;
        let banner = server.log_text();
        self.server_medium = self.server_medium.take().or_else(|| {
            if self.options.ideal {
                return Some("none (--ideal: replies OK, keeps nothing)".to_owned());
            }
            banner
                .lines()
                .find_map(|line| line.trim().strip_prefix("medium: ").map(str::to_owned))
        });
        Ok(server)
    }

    /// An update through the configuration, acked by the device (or answered by the server
    /// without one), then read back from the server.
    fn check(&mut self, role: DeviceRole, shutdown: &Shutdown) -> Result<(), CliError> {
        let peer = match role {
            DeviceRole::Proxy => proxy_addr(),
            _ => server_addr(),
        };
        let ideal = self.options.ideal;
        let checked = self
            .testbed
            .run_in(Host::Client, move || functional_check(peer, role, ideal))
            .map_err(|e| e.to_string())?;
        if shutdown.is_requested() {
            return Err("interrupted".into());
        }
        self.check_running()?;
        checked.map_err(|error| {
            format!(
                "the check of {} failed: {error}\n{}",
                role.datapath(),
                self.log_tails()
            )
            .into()
        })
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        self.stop();
    }
}

fn functional_check(peer: SocketAddr, role: DeviceRole, ideal: bool) -> Result<(), String> {
    let mut options = SessionOptions::new(1, peer);
    options.request_lifetime = Some(Duration::from_secs(10));
    if role == DeviceRole::None {
        options.peer_role = SessionOptions::SERVER_PEER;
    }
    let mut session =
        ClientSession::open(options).map_err(|e| format!("cannot open a session: {e}"))?;
    let (key, value) = (b"inpath:check".as_slice(), b"through the path".as_slice());
    let completion = session
        .update(&Request::Set { key, value }.to_bytes())
        .map_err(|e| format!("SET to {peer}: {e}"))?;
    match (role, completion) {
        (DeviceRole::None, Completion::Replied { .. }) => {}
        (DeviceRole::None, other) => {
            return Err(format!(
                "SET to {peer} completed with {other:?}, not the server's reply"
            ))
        }
        (_, Completion::Logged { .. }) => {}
        (_, other) => {
            return Err(format!(
                "SET to {peer} completed with {other:?}, not the device's PMNet-ACK"
            ))
        }
    }
    let completion = session
        .bypass(&Request::Get { key }.to_bytes())
        .map_err(|e| format!("GET from {peer}: {e}"))?;
    match completion {
        Completion::Replied { reply, .. } => match Reply::decode(&reply) {
            Ok(Reply::Value(found)) if found == value => Ok(()),
            // The ideal handler keeps nothing: any answer shows the server is reached.
            Ok(_) if ideal => Ok(()),
            other => Err(format!(
                "GET from {peer} returned {other:?}, not the value set"
            )),
        },
        other => Err(format!("GET from {peer} completed with {other:?}")),
    }
}
