//! `pmnet redis-up`: a Redis behind PMNet on one host in one command. It starts a device, the
//! adaptor and the gateway (and, with `--start-redis DIR`, a redis-server with `appendfsync
//! always`) as child processes of this one, each started exactly as docs/redis.md tells a user
//! to, places them on CPUs so that they do not disturb each other (`--cpu auto`), prints where
//! clients connect, and stops them all on Ctrl-C or when any of them stops.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use pmnet_redis::resp::{SyncClient, Value};
use pmnet_runtime::Shutdown;

use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct RedisUpArgs {
    /// The redis-server PMNet goes in front of (ignored with `--start-redis`, which starts one
    /// on a free port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:6379", value_parser = crate::addr::parse_addr)]
    pub redis: SocketAddr,

    /// Start a redis-server of its own (`--appendonly yes --appendfsync always`) with its files
    /// in DIR, and stop it on exit.
    #[arg(long, value_name = "DIR")]
    pub start_redis: Option<PathBuf>,

    /// Where Redis clients connect (the gateway).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:6380", value_parser = crate::addr::parse_addr)]
    pub listen: SocketAddr,

    /// The device's UDP address.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7400", value_parser = crate::addr::parse_addr)]
    pub device_listen: SocketAddr,

    /// The adaptor's UDP address.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7500", value_parser = crate::addr::parse_addr)]
    pub adaptor_listen: SocketAddr,

    /// The device's persistent log (a file on /dev/shm is memory that survives a crash of the
    /// process but not of the host; on a disk it is written with fdatasync; a file on a
    /// DAX-mounted PM device is real PM). Default: pmnet-redis-device.log in --dir.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,

    /// The directory of the device's log when --log-file is not given (see `pmnet device
    /// --help`: $STATE_DIRECTORY, /var/lib/pmnet for root, else ~/.local/state/pmnet).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// CPU placement: `auto` puts the client side (gateway and device) and the server side
    /// (adaptor, and the redis-server it starts) on different CPUs when the host has two or
    /// more; `none` leaves it to the kernel.
    #[arg(long, value_name = "auto|none", default_value = "auto")]
    pub cpu: String,

    /// The gateway and the device spin on their sockets instead of sleeping until a datagram
    /// or a connection's bytes arrive: lower latency for few clients (a SET at one client
    /// about 1.3x faster on 2 vCPUs), at the price of the client side's CPU, always busy, even
    /// when idle.
    #[arg(long)]
    pub busy_poll: bool,

    /// The gateway and the device spin this many microseconds after their last work before
    /// they sleep (0: sleep at once): a client's next request finds them awake, and idle they
    /// cost no CPU. `--busy-poll` overrides it.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = DEFAULT_SPIN_US)]
    pub spin_us: u32,

    /// A file whose first line is the password clients must give the gateway (`AUTH`).
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,

    /// A file whose first line is the password the adaptor and the gateway give Redis
    /// (`AUTH`), for a Redis (`--redis`) with `requirepass` or ACL users.
    #[arg(long, value_name = "FILE")]
    pub redis_password_file: Option<PathBuf>,

    /// The ACL user the adaptor and the gateway authenticate to Redis as (with
    /// `--redis-password-file`).
    #[arg(long, value_name = "USER", requires = "redis_password_file")]
    pub redis_user: Option<String>,

    /// Authenticate PMNet's datagrams with this deployment key file (`pmnet keygen`): the
    /// gateway, the device and the adaptor all get it. Needed for any --listen,
    /// --device-listen or --adaptor-listen other hosts reach (protected mode; see --insecure).
    #[arg(long, value_name = "FILE")]
    pub key_file: Option<PathBuf>,

    /// Let the gateway, the device and the adaptor listen on addresses other hosts reach
    /// without --key-file: PMNet's traffic is then not authenticated (each warns of it).
    #[arg(long)]
    pub insecure: bool,

    /// The PMNet server side: `module` (inside redis-server, crates/redis-module: no process
    /// between the device and Redis, requests applied without per-client I/O), `adaptor` (a
    /// process of its own, for a Redis that cannot load modules, managed Redis among them), or
    /// `auto`: the module when it can be used — with `--start-redis` when libpmnet_redis_module.so
    /// is found, in front of a running Redis when that Redis has it loaded (else the adaptor,
    /// saying how to load it).
    #[arg(long, value_name = "auto|module|adaptor", default_value = "auto")]
    pub server_side: String,

    /// The Redis module (libpmnet_redis_module.so; default: beside this binary, as `cargo build -p
    /// pmnet` leaves it in target/<profile>/deps/, or /usr/lib/pmnet/).
    #[arg(long, value_name = "FILE")]
    pub module: Option<PathBuf>,

    /// Run the device's read cache: hot keys' `GET`s are answered by the device, kept
    /// coherent with every write (docs/cache.md; the device starts fetching hot keys 12 s
    /// after it starts).
    #[arg(long)]
    pub cache: bool,
}

/// How long the gateway and the device spin after their last work by default (µs).
pub const DEFAULT_SPIN_US: u32 = 200;

/// The wait options of the gateway and the device.
fn wait_args(args: &RedisUpArgs) -> Vec<String> {
    if args.busy_poll {
        vec!["--busy-poll".to_owned()]
    } else {
        vec!["--spin-us".to_owned(), args.spin_us.to_string()]
    }
}

/// Where each part runs: (gateway, device, adaptor, redis-server).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Placement {
    gateway: Option<usize>,
    device: Option<usize>,
    adaptor: Option<usize>,
    redis: Option<usize>,
}

fn placement(mode: &str, cpus: usize) -> Result<Placement, CliError> {
    match mode {
        "none" => Ok(Placement {
            gateway: None,
            device: None,
            adaptor: None,
            redis: None,
        }),
        "auto" if cpus >= 4 => Ok(Placement {
            gateway: Some(0),
            device: Some(1),
            adaptor: Some(2),
            redis: Some(3),
        }),
        // The client side on one CPU, the server side on the other: measured the best split
        // on two vCPUs (docs/redis.md).
        "auto" if cpus >= 2 => Ok(Placement {
            gateway: Some(0),
            device: Some(0),
            adaptor: Some(1),
            redis: Some(1),
        }),
        "auto" => placement("none", cpus),
        other => Err(format!("--cpu {other}: use auto or none").into()),
    }
}

fn show(cpu: Option<usize>) -> String {
    cpu.map_or_else(|| "any CPU".to_owned(), |cpu| format!("CPU {cpu}"))
}

/// A child process, stopped (SIGTERM, then SIGKILL) when dropped.
struct Part {
    name: &'static str,
    child: Child,
}

impl Part {
    fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SAFETY: kill(2) on our own child's pid with SIGTERM; no memory is involved.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Part {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Start `pmnet ARGS`, pass its output on prefixed with its name, and wait for its
/// "listening on" line.
fn start_pmnet(name: &'static str, args: &[String]) -> Result<Part, CliError> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(exe);
    command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    die_with_this_process(&mut command);
    let mut child = command
        .spawn()
        .map_err(|error| format!("cannot start the {name}: {error}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (ready, listening) = mpsc::channel();
    std::thread::spawn(move || {
        let mut said = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            println!("[{name}] {line}");
            if !said && line.contains(" listening on ") {
                let _ = ready.send(());
                said = true;
            }
        }
    });
    let mut part = Part { name, child };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match listening.recv_timeout(Duration::from_millis(100)) {
            Ok(()) => return Ok(part),
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                if let Ok(Some(status)) = part.child.try_wait() {
                    return Err(format!("the {name} stopped at start-up ({status})").into());
                }
            }
            Err(_) => {
                part.stop();
                return Err(format!("the {name} did not start within 60 s").into());
            }
        }
    }
}

/// The child is sent SIGTERM (and stops as on Ctrl-C) when this process dies, whatever kills
/// it: a SIGKILLed redis-up leaves no device, adaptor, gateway or redis-server behind.
fn die_with_this_process(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    // SAFETY: between fork and exec only prctl(2) and getppid(2) run: no allocation, no lock.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // This process died before the line above: nothing would stop the child.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("pmnet redis-up exited"));
            }
            Ok(())
        });
    }
}

fn pin_command(command: &mut Command, cpu: Option<usize>) {
    use std::os::unix::process::CommandExt;
    let Some(cpu) = cpu else { return };
    // SAFETY: between fork and exec only sched_setaffinity(2) runs, on a stack-local set; it
    // allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            Ok(())
        });
    }
}

/// The options of a `redis-server` on 127.0.0.1:`port` whose every write is durable before
/// its reply (append-only file in `dir`, fsync'd on every write; no snapshots), in the
/// foreground.
pub fn durable_redis_args(port: u16, dir: &std::path::Path) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--dir",
        &dir.display().to_string(),
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--save",
        "",
        "--daemonize",
        "no",
        "--loglevel",
        "warning",
        // Redis's usual 16 databases for the clients, and one more for the adaptor's
        // exactly-once records (the adaptor keeps them in the last database).
        "--databases",
        "17",
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect()
}

/// The server side `redis-up` runs.
#[derive(Debug, Clone)]
enum Side {
    /// The module, from this file.
    Module(PathBuf),
    /// The adaptor, and why.
    Adaptor(String),
}

/// The server side `--server-side` asks for, with the module's file when it is the module.
fn server_side(args: &RedisUpArgs) -> Result<Side, CliError> {
    let found = module_file(args.module.as_deref());
    match (args.server_side.as_str(), found) {
        ("adaptor", _) => Ok(Side::Adaptor(
            "asked for with --server-side adaptor".to_owned(),
        )),
        ("module" | "auto", Ok(path)) => Ok(Side::Module(path)),
        ("module", Err(why)) => Err(format!("--server-side module: {why}").into()),
        ("auto", Err(why)) => Ok(Side::Adaptor(why)),
        (other, _) => Err(format!("--server-side {other}: use auto, module or adaptor").into()),
    }
}

/// The module's file: `explicit`, or beside this binary, or where the Debian package puts it.
pub fn module_file(explicit: Option<&std::path::Path>) -> Result<PathBuf, String> {
    module_file_beside(explicit, std::env::current_exe().ok().as_deref())
}

/// [`module_file`] beside the `pmnet` binary `exe` (in its directory or its deps/, the
/// newer if both), else where the Debian package puts it; the error names every place it
/// looked and how to build the module.
pub fn module_file_beside(
    explicit: Option<&std::path::Path>,
    exe: Option<&std::path::Path>,
) -> Result<PathBuf, String> {
    const NAME: &str = "libpmnet_redis_module.so";
    if let Some(path) = explicit {
        return if path.is_file() {
            Ok(path.to_path_buf())
        } else {
            Err(format!("--module {}: no such file", path.display()))
        };
    }
    let mut candidates = Vec::new();
    if let Some(dir) = exe.and_then(|exe| exe.parent().map(PathBuf::from)) {
        // `cargo build -p pmnet` refreshes deps/; a copy beside the binary may be older.
        let mut beside: Vec<PathBuf> = [dir.join(NAME), dir.join("deps").join(NAME)]
            .into_iter()
            .filter(|path| path.is_file())
            .collect();
        beside.sort_by_key(|path| std::fs::metadata(path).and_then(|m| m.modified()).ok());
        if let Some(newest) = beside.pop() {
            return Ok(newest);
        }
        candidates.push(dir.join(NAME));
        candidates.push(dir.join("deps").join(NAME));
    }
    candidates.push(PathBuf::from("/usr/lib/pmnet").join(NAME));
    candidates.iter().find(|path| path.is_file()).cloned().ok_or_else(|| {
        format!(
            "{NAME} was not found ({}; build it with `cargo build --release -p pmnet`, or name it with --module)",
            candidates
                .iter()
                .map(|path| path.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// The redis-server options that load the module (`module`) with its UDP socket on `listen`
/// and the device at `device` in front of it (and the deployment key, if any), as
/// docs/redis.md loads it: `--loadmodule FILE listen ADDR device ADDR [key-file PATH]`.
pub fn module_redis_args(
    module: &std::path::Path,
    listen: SocketAddr,
    device: SocketAddr,
    key_file: Option<&std::path::Path>,
) -> Vec<String> {
    let mut words = vec![
        "--loadmodule".to_owned(),
        module.display().to_string(),
        "listen".to_owned(),
        listen.to_string(),
        "device".to_owned(),
        device.to_string(),
    ];
    if let Some(key_file) = key_file {
        words.extend(["key-file".to_owned(), key_file.display().to_string()]);
    }
    words
}

/// Redis's `INFO pmnet` at `redis` (empty when no PMNet module is loaded), asked as the
/// adaptor and the gateway would ask (`--redis-password-file`, `--redis-user`).
fn module_info(redis: SocketAddr, args: &RedisUpArgs) -> Result<String, String> {
    let mut client = SyncClient::connect(redis, Duration::from_secs(5))
        .map_err(|error| format!("cannot reach Redis at {redis} (--redis): {error}"))?;
    if let Some(path) = &args.redis_password_file {
        let password = std::fs::read_to_string(path)
            .map_err(|error| format!("--redis-password-file {}: {error}", path.display()))?;
        let password = password.lines().next().unwrap_or_default().to_owned();
        let mut auth = vec!["AUTH".to_owned()];
        auth.extend(args.redis_user.clone());
        auth.push(password);
        client
            .command(&auth)
            .map_err(|error| format!("Redis at {redis}: AUTH: {error}"))?;
    }
    let reply = client
        .command(&["INFO", "pmnet"])
        .map_err(|error| format!("Redis at {redis}: {error}"))?;
    Ok(reply
        .as_bytes()
        .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
        .unwrap_or_default())
}

/// Field `name` of the module's `INFO pmnet` section (`pmnet_<name>:<value>`).
fn module_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| {
            line.strip_prefix("pmnet_")?
                .strip_prefix(name)?
                .strip_prefix(':')
        })
        .map(str::trim)
}

/// What the module says of Redis's persistence (`INFO pmnet`'s `pmnet_durability`), in words.
fn module_durability(status: &str) -> String {
    match module_field(status, "durability") {
        Some("always") => "Redis's append-only file, appendfsync always: every server-ACK leaves \
                           after Redis's write + fsync of it (survives process crash and power \
                           loss)"
            .to_owned(),
        Some("everysec") => "WEAKER THAN PMNET PROMISES: appendfsync everysec (a power loss \
                             loses up to ~1 s of acknowledged writes)"
            .to_owned(),
        Some("no") => "WEAKER THAN PMNET PROMISES: appendfsync no (a power loss loses \
                       acknowledged writes)"
            .to_owned(),
        Some("none") => "NOT DURABLE: Redis runs without an append-only file".to_owned(),
        _ => format!("unknown (Redis's INFO pmnet answered `{}`)", status.trim()),
    }
}

fn start_redis(
    dir: &PathBuf,
    cpu: Option<usize>,
    module_args: &[String],
) -> Result<(Part, SocketAddr), CliError> {
    std::fs::create_dir_all(dir)
        .map_err(|error| format!("--start-redis {}: {error}", dir.display()))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut command = Command::new("redis-server");
    command
        .args(durable_redis_args(port, dir))
        .args(module_args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    die_with_this_process(&mut command);
    pin_command(&mut command, cpu);
    let child = command.spawn().map_err(|error| {
        format!(
            "cannot start redis-server: {error} (install it: apt-get install redis-server; or \
             point --redis at a running one)"
        )
    })?;
    let mut part = Part {
        name: "redis-server",
        child,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let up = SyncClient::connect(addr, Duration::from_secs(1))
            .and_then(|mut client| client.command(&["PING"]))
            .is_ok_and(|reply| reply == Value::Simple(b"PONG".to_vec()));
        if up {
            return Ok((part, addr));
        }
        if let Ok(Some(status)) = part.child.try_wait() {
            return Err(format!("redis-server stopped at start-up ({status})").into());
        }
        if Instant::now() > deadline {
            part.stop();
            return Err("redis-server did not answer PING within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn cpu_args(cpu: Option<usize>) -> Vec<String> {
    cpu.map(|cpu| vec!["--cpu".to_owned(), cpu.to_string()])
        .unwrap_or_default()
}

pub fn run(args: RedisUpArgs) -> Result<ExitCode, CliError> {
    // Checked here, before anything starts: a bad key file, or protected mode.
    let keys = crate::node::keys_of(args.key_file.as_deref())?;
    {
        use crate::protect::Listener;
        crate::protect::check(
            "redis-up",
            &[
                Listener::Addr("--listen", args.listen),
                Listener::Addr("--device-listen", args.device_listen),
                Listener::Addr("--adaptor-listen", args.adaptor_listen),
            ],
            keys.is_some(),
            args.insecure,
        )?;
    }
    let shutdown = Shutdown::on_signals()?;
    let cpus = pmnet_runtime::online_cpu_count();
    let place = placement(&args.cpu, cpus)?;
    let mut parts: Vec<Part> = Vec::new();
    let side = server_side(&args)?;
    // Where the device sends: the module's socket inside Redis, or the adaptor's.
    let mut server_addr = args.adaptor_listen;
    let redis = match &args.start_redis {
        Some(dir) => {
            let module_args = match &side {
                Side::Module(path) => module_redis_args(
                    path,
                    args.adaptor_listen,
                    args.device_listen,
                    args.key_file.as_deref(),
                ),
                Side::Adaptor(_) => Vec::new(),
            };
            let (part, addr) = start_redis(dir, place.redis, &module_args)?;
            println!(
                "[redis-server] started on {addr} (appendonly yes, appendfsync always, files in {}, {})",
                dir.display(),
                show(place.redis)
            );
            parts.push(part);
            addr
        }
        None => args.redis,
    };
    // The module's `INFO pmnet`, asked once: where it listens (in front of a running Redis)
    // and what it says of Redis's persistence.
    let mut module_status = String::new();
    let side = match side {
        Side::Module(path) => {
            let status = module_info(redis, &args);
            let listen = (status.as_ref().ok())
                .and_then(|info| module_field(info, "listen"))
                .and_then(|addr| addr.parse().ok());
            let explicit = args.server_side == "module";
            match (args.start_redis.is_some(), status, listen) {
                (true, status, _) => {
                    module_status = status.unwrap_or_default();
                    Side::Module(path)
                }
                (false, Ok(status), Some(listen)) => {
                    server_addr = listen;
                    module_status = status;
                    Side::Module(path)
                }
                (false, Ok(_), None) => {
                    let how = format!(
                        "the PMNet module is not loaded in Redis at {redis}; to load it, add to \
                         its redis.conf `loadmodule {} listen {} device {}` and restart it",
                        path.display(),
                        args.adaptor_listen,
                        args.device_listen
                    );
                    if explicit {
                        return Err(format!("--server-side module: {how}").into());
                    }
                    Side::Adaptor(how)
                }
                (false, Err(why), _) if explicit => {
                    return Err(format!("--server-side module: {why}").into())
                }
                (false, Err(why), _) => Side::Adaptor(format!("{why} (the adaptor waits for it)")),
            }
        }
        side => side,
    };
    // The adaptor and the gateway (its direct connections) authenticate to Redis alike.
    let mut redis_auth_args: Vec<String> = Vec::new();
    if let Some(path) = &args.redis_password_file {
        redis_auth_args.extend([
            "--redis-password-file".to_owned(),
            path.display().to_string(),
        ]);
    }
    if let Some(user) = &args.redis_user {
        redis_auth_args.extend(["--redis-user".to_owned(), user.clone()]);
    }
    // One key for every part (or, with --insecure, leave to each to warn).
    let mut key_args: Vec<String> = args
        .key_file
        .iter()
        .flat_map(|path| ["--key-file".to_owned(), path.display().to_string()])
        .collect();
    if args.insecure {
        key_args.push("--insecure".to_owned());
    }
    let mut device = vec![
        "device".to_owned(),
        "--listen".to_owned(),
        args.device_listen.to_string(),
        "--server".to_owned(),
        format!("1={server_addr}"),
        "--log-file".to_owned(),
        (args.log_file.clone())
            .unwrap_or_else(|| {
                crate::state_dir::default_file(args.dir.as_deref(), "pmnet-redis-device.log")
            })
            .display()
            .to_string(),
    ];
    device.extend(cpu_args(place.device));
    device.extend(wait_args(&args));
    device.extend(key_args.iter().cloned());
    if args.cache {
        device.push("--cache".to_owned());
    }
    parts.push(start_pmnet("device", &device)?);
    let mut adaptor = vec![
        "redis-adaptor".to_owned(),
        "--listen".to_owned(),
        args.adaptor_listen.to_string(),
        "--redis".to_owned(),
        redis.to_string(),
        "--device".to_owned(),
        args.device_listen.to_string(),
    ];
    adaptor.extend(cpu_args(place.adaptor));
    adaptor.extend(key_args.iter().cloned());
    adaptor.extend(redis_auth_args.iter().cloned());
    let server_side_text = match &side {
        Side::Module(path) => format!(
            "the PMNet module inside redis-server ({}), on {server_addr}; persistence: {}",
            path.display(),
            module_durability(&module_status)
        ),
        Side::Adaptor(why) => {
            parts.push(start_pmnet("redis-adaptor", &adaptor)?);
            format!(
                "the adaptor (pmnet redis-adaptor) on {}: {why}",
                args.adaptor_listen
            )
        }
    };
    let mut gateway = vec![
        "gateway".to_owned(),
        "--listen".to_owned(),
        args.listen.to_string(),
        "--device".to_owned(),
        args.device_listen.to_string(),
        "--redis".to_owned(),
        redis.to_string(),
    ];
    gateway.extend(redis_auth_args.iter().cloned());
    gateway.extend(cpu_args(place.gateway));
    gateway.extend(wait_args(&args));
    gateway.extend(key_args.iter().cloned());
    if let Some(path) = &args.password_file {
        gateway.extend(["--password-file".to_owned(), path.display().to_string()]);
    }
    if args.cache {
        gateway.push("--device-cache".to_owned());
    }
    parts.push(start_pmnet("gateway", &gateway)?);
    println!(
        "pmnet redis-up: Redis at {redis} behind PMNet; clients connect to {} (e.g. `redis-cli \
         -p {}`)",
        args.listen,
        args.listen.port()
    );
    println!("  server side: {server_side_text}");
    println!(
        "  placement ({} CPUs, --cpu {}): gateway {}, device {}{}{}",
        cpus,
        args.cpu,
        show(place.gateway),
        show(place.device),
        if matches!(side, Side::Adaptor(_)) {
            format!(", adaptor {}", show(place.adaptor))
        } else {
            String::new()
        },
        if args.start_redis.is_some() {
            format!(", redis-server {}", show(place.redis))
        } else {
            String::new()
        }
    );
    println!("  Ctrl-C stops everything it started.");
    let mut stopped = None;
    while !shutdown.is_requested() && stopped.is_none() {
        for part in &mut parts {
            if let Ok(Some(status)) = part.child.try_wait() {
                stopped = Some((part.name, status));
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Stop in reverse order: clients' side first, Redis last.
    while let Some(mut part) = parts.pop() {
        part.stop();
    }
    match stopped {
        Some((name, status)) => {
            Err(format!("the {name} stopped ({status}); everything else was stopped too").into())
        }
        None => {
            println!("pmnet redis-up: stopped");
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_placement_splits_the_two_sides_when_there_are_cpus_for_it() {
        let two = placement("auto", 2).unwrap();
        assert_eq!((two.gateway, two.device), (Some(0), Some(0)));
        assert_eq!((two.adaptor, two.redis), (Some(1), Some(1)));
        let one = placement("auto", 1).unwrap();
        assert_eq!(one, placement("none", 1).unwrap());
        let many = placement("auto", 8).unwrap();
        assert_eq!(
            [many.gateway, many.device, many.adaptor, many.redis],
            [Some(0), Some(1), Some(2), Some(3)]
        );
        assert!(placement("sideways", 2).is_err());
    }

    #[test]
    fn the_modules_fields_are_read_from_its_info_section() {
        let info = "# pmnet\r\npmnet_listen:127.0.0.1:7500\r\npmnet_durability:always\r\n";
        assert_eq!(module_field(info, "listen"), Some("127.0.0.1:7500"));
        assert_eq!(module_field(info, "durability"), Some("always"));
        assert_eq!(module_field(info, "devices"), None);
        assert_eq!(module_field("", "listen"), None);
    }

    #[test]
    fn the_module_is_found_beside_the_pmnet_binary_or_the_places_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("pmnet");
        let missing = module_file_beside(None, Some(&exe)).unwrap_err();
        assert!(
            missing.contains(&dir.path().join("deps").display().to_string()),
            "{missing}"
        );
        assert!(
            missing.contains("cargo build --release -p pmnet"),
            "{missing}"
        );
        std::fs::create_dir(dir.path().join("deps")).unwrap();
        let module = dir.path().join("deps").join("libpmnet_redis_module.so");
        std::fs::write(&module, b"").unwrap();
        assert_eq!(module_file_beside(None, Some(&exe)), Ok(module.clone()));
        let args = module_redis_args(
            &module,
            "127.0.0.1:7500".parse().unwrap(),
            "127.0.0.1:7400".parse().unwrap(),
            None,
        );
        assert_eq!(args[0], "--loadmodule");
        assert_eq!(
            args[2..],
            ["listen", "127.0.0.1:7500", "device", "127.0.0.1:7400"]
        );
    }
}
