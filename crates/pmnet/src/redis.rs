//! `pmnet redis-adaptor` and `pmnet gateway`: a real Redis behind PMNet, and unmodified Redis
//! clients in front of it (see docs/redis.md).

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use pmnet_redis::commands::Policy;
use pmnet_redis::{Adaptor, AdaptorOptions, Durability, Gateway, GatewayOptions};
use pmnet_runtime::Shutdown;

use crate::node::LoopArgs;
use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct RedisAdaptorArgs {
    /// Where devices reach the adaptor (UDP): the ADDR of `--server ID=ADDR` on the device.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7500", value_parser = crate::addr::parse_addr)]
    pub listen: SocketAddr,

    /// This server's id: the ID of `--server ID=ADDR` on the devices.
    #[arg(long, value_name = "ID", default_value_t = 1)]
    pub server_id: u16,

    /// A device in front of the adaptor (repeat for several). At start-up the adaptor polls
    /// each for requests it logged, and applies them before anything new.
    #[arg(long = "device", value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub devices: Vec<SocketAddr>,

    /// The redis-server to apply requests to. Run it with `--appendonly yes --appendfsync
    /// always` for the durability PMNet's acks promise.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:6379", value_parser = crate::addr::parse_addr)]
    pub redis: SocketAddr,

    /// A file whose first line is the password the adaptor gives Redis (`AUTH`), for a Redis
    /// with `requirepass` or ACL users.
    #[arg(long, value_name = "FILE")]
    pub redis_password_file: Option<std::path::PathBuf>,

    /// The ACL user the adaptor authenticates as (with `--redis-password-file`; default: the
    /// default user).
    #[arg(long, value_name = "USER", requires = "redis_password_file")]
    pub redis_user: Option<String>,

    /// Pipelined connections to Redis; each session always uses the same one.
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub redis_connections: usize,

    /// Key prefix of the per-session exactly-once records kept in Redis.
    #[arg(long, value_name = "PREFIX", default_value = pmnet_redis::script::DEFAULT_RECORD_PREFIX)]
    pub record_prefix: String,

    /// The Redis database (`SELECT` number) that holds the exactly-once records, out of the
    /// databases clients select (default: the last database Redis has, so a Redis with
    /// `databases 17` leaves clients 0 to 15); 0 keeps them with the data (then `KEYS`,
    /// `SCAN` and `DBSIZE` show them and `FLUSHDB`/`FLUSHALL` are refused). Records an
    /// earlier adaptor left in another database are moved here at start-up.
    #[arg(long, value_name = "N")]
    pub record_db: Option<u32>,

    /// Seconds Redis may be down before new bypass requests (reads, and writes answered with
    /// Redis's reply) get an error naming it at once instead of waiting (0: they wait);
    /// updates a device acked always wait and are applied when Redis answers again.
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0)]
    pub redis_down_after: f64,

    /// Requests taken from the protocol and not yet answered by Redis, at most.
    #[arg(long, value_name = "N", default_value_t = 16_384)]
    pub max_outstanding: usize,

    /// How long to wait for Redis to answer PING at start-up.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub startup_timeout: u64,

    /// Record reads in the session records too (each read then costs Redis a write and, with
    /// appendfsync always, an fsync). Needed only for PMNet clients other than `pmnet gateway`
    /// that do not answer retransmission requests for completed reads (see docs/redis.md).
    #[arg(long)]
    pub record_reads: bool,

    /// Seconds a session's exactly-once record stays in Redis after the session's last write
    /// (0: for ever). A request redone after its record expired would be applied again, so keep
    /// it well above any outage of the adaptor or Redis.
    #[arg(long, value_name = "SECONDS", default_value_t = pmnet_redis::script::DEFAULT_SESSION_TTL_SECS)]
    pub session_ttl: u64,

    #[command(flatten)]
    pub run: LoopArgs,
}

#[derive(Debug, Clone, Args)]
pub struct GatewayArgs {
    /// Where Redis clients connect (TCP, RESP).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:6380", value_parser = crate::addr::parse_addr)]
    pub listen: SocketAddr,

    /// The PMNet device in front of the adaptor (UDP). For a device run with `--workers`,
    /// every worker's address, comma-separated: each connection's session goes to one.
    #[arg(
        long,
        value_name = "ADDR[,ADDR...]",
        value_delimiter = ',',
        default_value = "127.0.0.1:7400",
        value_parser = crate::addr::parse_addr,
    )]
    pub device: Vec<SocketAddr>,

    /// The adaptor's server id (the ID of `--server ID=ADDR` on the device).
    #[arg(long, value_name = "ID", default_value_t = 1)]
    pub server_id: u16,

    /// Requests in flight per client connection at most (the PMNet window).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub window: u32,

    /// Client connections open at most; more are refused with an error.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub max_connections: usize,

    /// Send the writes whose reply is a count and that Redis cannot reject whatever the data
    /// holds (DEL, UNLINK, and EXPIRE/PEXPIRE without options) as PMNet updates answered `+OK`
    /// on the device's ack, instead of bypass requests answered with Redis's integer. Only for
    /// clients that do not use the integer. Writes that may fail on the data (LPUSH, INCR,
    /// HSET, …) always go as bypass.
    #[arg(long)]
    pub ack_counting_writes: bool,

    /// Seconds the path behind the gateway (device, adaptor, Redis) may leave the gateway's
    /// own PING unanswered before commands that need it get an error naming the part that
    /// is down, without being sent, and new connections are refused with it (0: never;
    /// commands then wait for their retransmissions to run out).
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0)]
    pub down_after: f64,

    /// A file whose first line is the password clients must give (`AUTH password`, `AUTH
    /// default password` or `HELLO 3 AUTH default password`) before any other command.
    /// Without it the gateway asks for none.
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<std::path::PathBuf>,

    /// The device runs a read cache (`pmnet device --cache`): send `GET key` as a cache read
    /// the device may answer, and every write keyed (or, for one that may change several
    /// keys, as a barrier) so that the cache stays coherent (docs/cache.md).
    #[arg(long)]
    pub device_cache: bool,

    /// Devices in series (`--device` is the first; each forwards to the next) whose
    /// PMNet-ACKs a write waits for before the client is answered: it then survives the
    /// permanent loss of all but one of them (docs/replication.md).
    #[arg(long, value_name = "R", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=i64::from(pmnet_proto::REPLICAS_MAX)))]
    pub replicas: u8,

    /// Fan-out replication: send every write at once to these devices as well as to
    /// `--device` (each run with `--server` the same server side, which names them all as
    /// devices); `--replicas` of them must ack (docs/replication.md, "Fan-out").
    #[arg(long, value_name = "ADDR[,ADDR...]", value_delimiter = ',',
          value_parser = crate::addr::parse_addr)]
    pub fan_out: Vec<SocketAddr>,

    /// A controller of the chain of devices that starts at `--device` (`pmnet controller
    /// --device-chain`): each session asks it where the chain starts when its writes go
    /// unanswered, and follows (docs/replication.md, "Automatic failover"). Repeat for each
    /// controller (at most 7).
    #[arg(long = "controller", value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub controllers: Vec<SocketAddr>,

    /// Client commands slower than this many microseconds (from the command parsed to its
    /// reply ready) enter the gateway's slow log (`SLOWLOG GET`); negative: none, 0: every
    /// command. Redis's `slowlog-log-slower-than`.
    #[arg(long, value_name = "MICROSECONDS", default_value_t = pmnet_redis::gateway::DEFAULT_SLOWLOG_SLOWER_THAN, allow_negative_numbers = true)]
    pub slowlog_log_slower_than: i64,

    /// Entries the gateway's slow log keeps at most (the oldest go). Redis's
    /// `slowlog-max-len`.
    #[arg(long, value_name = "N", default_value_t = pmnet_redis::gateway::DEFAULT_SLOWLOG_MAX_LEN)]
    pub slowlog_max_len: usize,
    /// The redis-server behind the adaptor. Commands that need Redis's own connection —
    /// blocking commands (BLPOP, BLMOVE, XREAD BLOCK, …), WAIT, WAITAOF, pub/sub, MONITOR,
    /// CLIENT TRACKING — and commands too large for a PMNet request go to it on a TCP
    /// connection of the client connection's own, after every earlier command of the
    /// connection is applied (docs/redis.md). Without it they are refused.
    #[arg(long, value_name = "ADDR", value_parser = crate::addr::parse_addr)]
    pub redis: Option<SocketAddr>,

    /// A file whose first line is the password the gateway gives Redis (`AUTH`) on its direct
    /// connections, for a Redis with `requirepass` or ACL users.
    #[arg(long, value_name = "FILE", requires = "redis")]
    pub redis_password_file: Option<std::path::PathBuf>,

    /// The ACL user of the direct connections (with `--redis-password-file`).
    #[arg(long, value_name = "USER", requires = "redis_password_file")]
    pub redis_user: Option<String>,

    /// Direct connections to Redis open at once at most; a command that would open one more
    /// gets Redis's "max number of clients reached".
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub max_direct_connections: usize,

    /// Bytes of one command's arguments at most (Redis's proto-max-bulk-len is 512 MB per
    /// argument); a larger command gets a protocol error and the connection closes.
    #[arg(long, value_name = "BYTES", default_value_t = pmnet_redis::resp::REDIS_MAX_BULK_LEN)]
    pub max_request_bytes: usize,

    /// Arguments of one command at most.
    #[arg(long, value_name = "N", default_value_t = pmnet_redis::resp::GATEWAY_MAX_ARGS)]
    pub max_request_args: usize,

    /// Bytes read from clients and not yet parsed, across every connection, at most; past it
    /// only the connection holding the most is read on (the others wait, they get no error).
    #[arg(long, value_name = "BYTES", default_value_t = pmnet_redis::gateway::DEFAULT_MAX_INPUT_BYTES)]
    pub max_input_bytes: usize,

    #[command(flatten)]
    pub run: LoopArgs,
}

/// The first line of a password file (without its line end); an empty one is refused.
fn read_password_file(path: &std::path::Path, option: &str) -> Result<Vec<u8>, CliError> {
    let text = std::fs::read(path)
        .map_err(|error| format!("{option} {}: cannot read it: {error}", path.display()))?;
    let line = text.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return Err(format!(
            "{option} {}: the first line is empty; it must hold the password",
            path.display()
        )
        .into());
    }
    Ok(line.to_vec())
}

fn report_interval(run: &LoopArgs) -> Option<Duration> {
    (run.report_interval > 0).then(|| Duration::from_secs(run.report_interval))
}

fn describe(run: &LoopArgs, metrics: Option<SocketAddr>) -> String {
    format!(
        "wait: {}; cpu: {}; metrics: {}",
        run.wait_mode().describe(),
        run.cpu
            .map_or_else(|| "not pinned".to_owned(), |cpu| format!("pinned to {cpu}")),
        metrics.map_or_else(|| "off".to_owned(), |addr| format!("http://{addr}/metrics")),
    )
}

/// Print lines to stdout at once (scripts and tests wait for the "listening on" line).
fn announce(lines: &[String]) {
    let mut out = std::io::stdout().lock();
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
    let _ = out.flush();
}

pub fn run_adaptor(args: RedisAdaptorArgs) -> Result<ExitCode, CliError> {
    let shutdown = Shutdown::on_signals()?;
    let mut options = AdaptorOptions::new(args.listen, args.redis);
    options.server_id = args.server_id;
    options.devices = args.devices.clone();
    options.connections = args.redis_connections;
    options.record_prefix = args.record_prefix.clone();
    options.record_db = args
        .record_db
        .unwrap_or(pmnet_redis::script::RECORD_DB_LAST);
    if let Some(path) = &args.redis_password_file {
        let password = read_password_file(path, "--redis-password-file")?;
        options.redis_auth = Some((args.redis_user.clone().map(String::into_bytes), password));
    }
    options.max_outstanding = args.max_outstanding.max(1);
    options.startup_timeout = Duration::from_secs(args.startup_timeout);
    if !(args.redis_down_after.is_finite() && args.redis_down_after >= 0.0) {
        return Err(format!(
            "--redis-down-after {}: give a number of seconds, 0 or more",
            args.redis_down_after
        )
        .into());
    }
    options.fail_fast_after =
        (args.redis_down_after > 0.0).then(|| Duration::from_secs_f64(args.redis_down_after));
    options.record_reads = args.record_reads;
    options.session_ttl = (args.session_ttl > 0).then(|| Duration::from_secs(args.session_ttl));
    options.wait = args.run.wait_mode();
    options.cpu = args.run.cpu;
    options.report_interval = report_interval(&args.run);
    options.metrics_listen = args.run.metrics;
    options.keys = args.run.keys()?;
    if let Some(ttl) = options.session_ttl {
        // A session's record must outlive any duplicate of its requests and any replay the
        // authenticator still accepts, as the server's own table does.
        let mut config = pmnet_proto::ServerConfig::new(0, Vec::new());
        config.auth = options.keys.clone().map(pmnet_proto::Authenticator::new);
        let least = config.session_keep().as_secs() + 1;
        if ttl.as_secs() < least {
            return Err(format!(
                "--session-ttl {}: at least {least} seconds (a session's record must outlive \
                 any duplicate or accepted replay of its requests: the longest request \
                 lifetime and twice the key file's replay window), or 0 to keep records for \
                 ever",
                ttl.as_secs()
            )
            .into());
        }
    }
    args.run.protect(
        "redis-adaptor",
        &[crate::protect::Listener::Addr("--listen", args.listen)],
        options.keys.as_ref(),
    )?;
    let adaptor_traffic = pmnet_runtime::auth_text(options.keys.as_ref());
    let mut adaptor = Adaptor::open(options, shutdown)?;
    let startup = adaptor.startup().clone();
    let mut lines = vec![
        format!(
            "pmnet redis-adaptor {} listening on {}",
            args.server_id,
            adaptor.local_addr()
        ),
        format!(
            "  redis: {} (Redis {}; {} session records loaded{})",
            args.redis,
            startup.redis_version,
            startup.sessions_recovered,
            if startup.records_skipped > 0 {
                format!(
                    ", {} keys under {:?} skipped: not session records",
                    startup.records_skipped, args.record_prefix
                )
            } else {
                String::new()
            }
        ),
        format!("  medium: {}", startup.durability_text()),
        format!("  traffic: {adaptor_traffic}"),
        match args.session_ttl {
            0 => format!(
                "  session records: {}<session> in database {} of {}, kept for ever \
                 (--session-ttl 0)",
                args.record_prefix, startup.record_db, startup.databases
            ),
            ttl => format!(
                "  session records: {}<session> in database {} of {}, expire {ttl} s after \
                 their session's last write",
                args.record_prefix, startup.record_db, startup.databases
            ),
        },
    ];
    if startup.durability() != Durability::FsyncAlways {
        lines.push(
            "  WARNING: a server-ACK then promises less than the device's log does; run Redis \
             with --appendonly yes --appendfsync always"
                .to_owned(),
        );
    }
    if args.devices.is_empty() {
        lines.push(
            "  devices: none (no recovery poll: requests a device logged while the adaptor was \
             down are only replayed by the device's own resend timer)"
                .to_owned(),
        );
    } else {
        let devices: Vec<String> = args.devices.iter().map(ToString::to_string).collect();
        lines.push(format!(
            "  devices: {} (polled for logged requests before serving)",
            devices.join(", ")
        ));
    }
    lines.push(format!(
        "  {} pipelined connections to Redis; {}",
        args.redis_connections,
        describe(&args.run, adaptor.metrics_addr())
    ));
    announce(&lines);
    adaptor.run()?;
    Ok(ExitCode::SUCCESS)
}

pub fn run_gateway(args: GatewayArgs) -> Result<ExitCode, CliError> {
    let shutdown = Shutdown::on_signals()?;
    let (&device, more_devices) = args
        .device
        .split_first()
        .ok_or("--device needs an address")?;
    let mut options = GatewayOptions::new(args.listen, device);
    options.more_devices = more_devices.to_vec();
    options.server_id = args.server_id;
    options.window = args.window;
    options.max_connections = args.max_connections.max(1);
    options.policy = Policy {
        ack_counting_writes: args.ack_counting_writes,
    };
    options.wait = args.run.wait_mode();
    options.cpu = args.run.cpu;
    options.report_interval = report_interval(&args.run);
    options.metrics_listen = args.run.metrics;
    options.keys = args.run.keys()?;
    args.run.protect(
        "gateway",
        &[crate::protect::Listener::Addr("--listen", args.listen)],
        options.keys.as_ref(),
    )?;
    if args.device_cache && !more_devices.is_empty() {
        return Err(
            "--device-cache needs one device address: a device's cache is coherent \
                    only for the writes that pass through it, and --workers splits them"
                .into(),
        );
    }
    options.device_cache = args.device_cache;
    options.replicas = args.replicas;
    crate::client::check_fan_out(&args.fan_out, more_devices.len(), args.replicas)?;
    crate::node::check_controllers(&args.controllers)?;
    options.controllers = args.controllers.clone();
    if !args.fan_out.is_empty() {
        if args.device_cache {
            return Err(
                "--fan-out and --device-cache do not go together: each device would \
                        order the keyed writes of its own copy"
                    .into(),
            );
        }
        options.fan_out = args.fan_out.clone();
    }
    if !(args.down_after.is_finite() && args.down_after >= 0.0) {
        return Err(format!(
            "--down-after {}: give a number of seconds, 0 or more",
            args.down_after
        )
        .into());
    }
    options.down_after =
        (args.down_after > 0.0).then(|| Duration::from_secs_f64(args.down_after.max(0.01)));
    options.slowlog_log_slower_than = args.slowlog_log_slower_than;
    options.slowlog_max_len = args.slowlog_max_len;
    if let Some(path) = &args.password_file {
        options.auth.password = Some(read_password_file(path, "--password-file")?);
    }
    if let Some(redis) = args.redis {
        let auth = match &args.redis_password_file {
            Some(path) => Some((
                args.redis_user.clone().map(String::into_bytes),
                read_password_file(path, "--redis-password-file")?,
            )),
            None => None,
        };
        options.direct = Some(pmnet_redis::gateway::DirectOptions {
            redis,
            auth,
            max_connections: args.max_direct_connections.max(1),
        });
    }
    options.max_request_bytes = args.max_request_bytes.max(1024);
    options.max_request_args = args.max_request_args.max(8);
    options.max_input_bytes = args.max_input_bytes.max(1 << 20);
    let traffic = pmnet_runtime::auth_text(options.keys.as_ref());
    let mut gateway = Gateway::open(options, shutdown)?;
    let mut lines = vec![
        format!("pmnet gateway listening on {}", gateway.local_addr()),
        format!(
            "  device: {} (server {}); window {} requests per connection; at most {} connections",
            args.device
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            args.server_id,
            args.window,
            args.max_connections
        ),
        "  medium: an update is answered when the device's PMNet-ACK says it is durable in the \
         device's log (its medium is in the device's banner); bypass commands are answered with \
         Redis's reply (durable as the adaptor's banner says)"
            .to_owned(),
        format!("  traffic: {traffic}"),
        format!(
            "  counting writes (LPUSH, DEL, INCR, …): {}",
            if args.ack_counting_writes {
                "PMNet updates answered +OK on the device's ack (--ack-counting-writes)"
            } else {
                "bypass, answered with Redis's reply"
            }
        ),
        format!(
            "  device cache: {}",
            if args.device_cache {
                "GET as cache reads the device may answer; writes keyed, multi-key writes as \
                 barriers (--device-cache)"
            } else {
                "not used (GET goes to Redis)"
            }
        ),
        match args.redis {
            Some(redis) => format!(
                "  direct: blocking commands, WAIT, pub/sub, MONITOR, CLIENT TRACKING and \
                 commands over {} bytes or {} words go to Redis at {redis} on a connection of \
                 the client's own, after every earlier command is applied (at most {} open)",
                pmnet_redis::gateway::PMNET_REQUEST_MAX,
                pmnet_redis::gateway::DIRECT_ABOVE_WORDS,
                args.max_direct_connections.max(1)
            ),
            None => "  direct: off (blocking commands, pub/sub, MONITOR, WAIT and commands \
                     over 1 MiB are refused; start with --redis ADDR)"
                .to_owned(),
        },
        format!(
            "  requests: at most {} bytes and {} arguments each; {} bytes of unparsed input \
             in all",
            args.max_request_bytes.max(1024),
            args.max_request_args.max(8),
            args.max_input_bytes.max(1 << 20)
        ),
        format!("  {}", describe(&args.run, gateway.metrics_addr())),
    ];
    if !args.fan_out.is_empty() || args.replicas > 1 {
        lines.insert(
            2,
            if args.fan_out.is_empty() {
                format!(
                    "  replication: a write is answered once {} devices in series acked it",
                    args.replicas
                )
            } else {
                format!(
                    "  replication: fan-out, every write also to {}; answered once {} of the {} \
                     devices acked it",
                    args.fan_out
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    args.replicas,
                    1 + args.fan_out.len()
                )
            },
        );
    }
    if !args.controllers.is_empty() {
        lines.insert(
            2,
            format!(
                "  failover: following the controllers {} (a session asks where its chain of \
                 devices starts when its writes go unanswered)",
                args.controllers
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    announce(&lines);
    gateway.run()?;
    Ok(ExitCode::SUCCESS)
}
