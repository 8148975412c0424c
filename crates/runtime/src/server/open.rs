//! Opening a server: its data file (created, reopened or refused), its application and its
//! socket.

use super::*;

/// Damaged records described one per warning line at start-up, at most; a summary counts all.
const DAMAGED_RECORDS_LOGGED: usize = 32;

/// Say at WARN what recovery of the store found damaged and lost.
fn log_store_damage(path: &std::path::Path, app: &ServerApp) {
    match app {
        ServerApp::Kv(store) => match store.recovery().rejected {
            Some(rejected) if rejected.valid_record_follows => tracing::warn!(
                "data file {}: replay stopped at a damaged record at offset {} ({:?}) that valid \
                 ones follow: the updates recorded after it were acknowledged and are lost",
                path.display(),
                rejected.offset_bytes,
                rejected.reason
            ),
            Some(rejected) => tracing::info!(
                "data file {}: the last record was torn (offset {}, {:?}): a request that was \
                 never acknowledged; dropped",
                path.display(),
                rejected.offset_bytes,
                rejected.reason
            ),
            None => {}
        },
        ServerApp::Engine(store) => {
            let report = store.recovery();
            for corruption in report.corrupt_records.iter().take(DAMAGED_RECORDS_LOGGED) {
                tracing::warn!(
                    "data file {}: damaged record lost: {corruption}; dropped from the index, \
                     never served",
                    path.display()
                );
            }
            let count = report.corrupt_records.len();
            if count > 0 {
                tracing::warn!(
                    "data file {}: {count} stored records were damaged and are lost{}",
                    path.display(),
                    if count > DAMAGED_RECORDS_LOGGED {
                        format!(" ({} not listed above)", count - DAMAGED_RECORDS_LOGGED)
                    } else {
                        String::new()
                    }
                );
            }
            if let Some(broken) = &report.index_broken {
                tracing::warn!(
                    "data file {}: the index is broken ({broken}): the keys after the damage \
                     are lost",
                    path.display()
                );
            }
        }
        ServerApp::Ideal(_) => {}
    }
}

/// The length of the file at `path`, or `None` if there is none.
fn existing_len(path: &std::path::Path) -> Result<Option<u64>, RuntimeError> {
    match std::fs::metadata(path) {
        Ok(metadata) => Ok(Some(metadata.len())),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(RuntimeError::DataFile {
            path: path.to_path_buf(),
            source: pmnet_pm::PmError::Io {
                path: path.to_path_buf(),
                action: "open",
                source,
            },
        }),
    }
}

/// The size of a new data file, as this machine can map it.
fn new_len(options: &StoreOptions) -> Result<usize, RuntimeError> {
    usize::try_from(options.size_bytes).map_err(|_| {
        RuntimeError::Config(format!(
            "data size {} bytes does not fit this machine's address space; ask for less",
            options.size_bytes
        ))
    })
}

/// The error for an existing data file that holds no store the server can open: it may hold
/// acknowledged updates, so it is never formatted over unless `--format` says so. `problem`
/// is what opening it reported; a blank (all-zero) start of the file is said as such.
fn unusable_store(
    path: &std::path::Path,
    file_len: u64,
    engine: &str,
    problem: String,
) -> RuntimeError {
    let mut head = Vec::new();
    if let Ok(file) = std::fs::File::open(path) {
        use std::io::Read;
        let _ = file.take(4096).read_to_end(&mut head);
    }
    let problem = if file_len == 0 {
        "it is empty (0 bytes): it was truncated, or never held a store".to_owned()
    } else if !head.is_empty() && head.iter().all(|byte| *byte == 0) {
        format!("its superblock is blank (all zero): it was erased or never written ({problem})")
    } else {
        problem
    };
    RuntimeError::StoreUnusable {
        path: path.to_path_buf(),
        file_len,
        engine: engine.to_owned(),
        problem,
    }
}

/// Open the data file at `options.path` for a store of kind `kind`: a new store when the file
/// does not exist (made under a staging name, published once formatted), erased when
/// `options.format` is set, otherwise recovered with `open` — an error naming the file if it
/// holds no usable store. Also says whether the store is new.
fn open_data_file<S>(
    options: &StoreOptions,
    kind: &str,
    format: impl Fn(MmapRegion) -> Result<S, RuntimeError>,
    open: impl FnOnce(MmapRegion) -> Result<S, String>,
) -> Result<(S, bool), RuntimeError> {
    let path = &options.path;
    let file_error = |source| RuntimeError::DataFile {
        path: path.clone(),
        source,
    };
    let Some(file_len) = existing_len(path)? else {
        let (region, new_file) =
            MmapRegion::create_new(path, new_len(options)?, options.mmap).map_err(file_error)?;
        let store = format(region)?;
        new_file.publish().map_err(file_error)?;
        tracing::info!(
            "data file {} did not exist: created an empty {kind} store of {} bytes",
            path.display(),
            options.size_bytes
        );
        return Ok((store, true));
    };
    if options.format {
        tracing::warn!(
            "--format: erasing the store {} (whatever it held is gone)",
            path.display()
        );
        let region =
            MmapRegion::create(path, new_len(options)?, options.mmap).map_err(file_error)?;
        return Ok((format(region)?, true));
    }
    if file_len == 0 {
        return Err(unusable_store(path, 0, kind, String::new()));
    }
    let region = MmapRegion::open(path, options.mmap).map_err(file_error)?;
    let store = open(region).map_err(|problem| unusable_store(path, file_len, kind, problem))?;
    Ok((store, false))
}

/// Open a `pmnet-pktstore` engine at `options.path` ([`open_data_file`]); a file holding the
/// other engine is an error.
fn open_engine(
    options: &StoreOptions,
    engine: EngineKind,
) -> Result<(Store<MmapRegion>, bool), RuntimeError> {
    let path = &options.path;
    let mut config = StoreConfig::new(engine);
    config.max_sessions = options.max_sessions.max(128);
    let format = |region| {
        Store::format(region, config).map_err(|error| {
            RuntimeError::Config(format!(
                "data file {}: {error}; point --data-file at another file, or pass --format to \
                 erase it and start an empty {} store",
                path.display(),
                engine.name()
            ))
        })
    };
    let open = |region| Store::open(region).map_err(|error| error.to_string());
    let (store, formatted) = open_data_file(options, engine.name(), format, open)?;
    if store.engine() != engine {
        return Err(RuntimeError::Config(format!(
            "data file {} holds a {} store, not {}: choose --engine {}, or pass --format",
            path.display(),
            store.engine().name(),
            engine.name(),
            store.engine().name()
        )));
    }
    Ok((store, formatted))
}

/// Grow the store's data file to `options.growth.to_bytes` if it asks for that and the file is
/// shorter (a restart in place to grow: [`ServerRuntime::check_growth`]): the file made longer
/// and synced, then the growth word stored and made durable (`Store::grow`). A crash at any
/// point leaves the store as it was or grown. A failure (a full disk) is said, and the store
/// opens as it was and grows no more in this run: updates that do not fit wait in the
/// devices' logs, as in a store that may not grow.
fn grow_data_file(options: &mut StoreOptions) {
    let Some(target) = options.growth.to_bytes.take() else {
        return;
    };
    let path = options.path.clone();
    let Ok(Some(file_len)) = existing_len(&path) else {
        return;
    };
    if file_len >= target {
        return;
    }
    let grown = usize::try_from(target)
        .map_err(|_| format!("{target} bytes do not fit this machine's address space"))
        .and_then(|len| MmapRegion::extend(&path, len, options.mmap).map_err(|e| e.to_string()))
        .and_then(|mut region| Store::grow(&mut region).map_err(|e| e.to_string()));
    match grown {
        Ok((before, after)) => tracing::warn!(
            "data file {}: the store grew from {} to {} MiB of data space ({} bytes of file)",
            path.display(),
            before.data_len >> 20,
            after.data_len >> 20,
            target
        ),
        Err(error) => {
            tracing::warn!(
                "data file {}: cannot grow the store to {} MiB: {error}. It stays at {} MiB and \
                 grows no more until the server is started again; updates that do not fit wait \
                 in the devices' logs (nothing acknowledged is lost) until deletes make room",
                path.display(),
                target >> 20,
                file_len >> 20
            );
            options.growth.max_bytes = file_len;
        }
    }
}

/// Open the key-value store at `options.path` ([`open_data_file`]).
fn open_store(options: &StoreOptions) -> Result<(KvStore<MmapRegion>, bool), RuntimeError> {
    let config = KvConfig {
        max_sessions: options.max_sessions,
    };
    let format = |region| {
        KvStore::format(region, config).map_err(|source| RuntimeError::Store {
            path: options.path.clone(),
            source,
        })
    };
    let open = |region| KvStore::open(region).map_err(|error| error.to_string());
    open_data_file(options, "kv", format, open)
}

impl ServerRuntime {
    /// Bind the socket, open the application, and start the server (which polls its devices).
    pub fn open(options: ServerOptions, shutdown: Shutdown) -> Result<ServerRuntime, RuntimeError> {
        ServerRuntime::open_with_engine(options, None, shutdown)
    }

    /// [`ServerRuntime::open`] with a `pmnet-pktstore` engine instead of the key-value store
    /// (`None`: the key-value store). Ignored with the ideal handler (`store: None`).
    pub fn open_with_engine(
        options: ServerOptions,
        engine: Option<EngineKind>,
        shutdown: Shutdown,
    ) -> Result<ServerRuntime, RuntimeError> {
        ServerRuntime::open_with_xdp(options, engine, None, shutdown)
    }

    /// [`ServerRuntime::open_with_engine`], receiving with AF_XDP on an interface when `xdp`
    /// says so (the packet store only: frames land in its slots; see `xdp.rs`).
    pub fn open_with_xdp(
        mut options: ServerOptions,
        engine: Option<EngineKind>,
        xdp: Option<ServerXdpOptions>,
        shutdown: Shutdown,
    ) -> Result<ServerRuntime, RuntimeError> {
        let span = tracing::info_span!("server", id = options.server_id);
        let _entered = span.clone().entered();
        if let Some(ops_per_s) = options.max_ops_per_s {
            check_max_ops_per_s(ops_per_s).map_err(RuntimeError::Config)?;
        }
        if let Some(xdp) = &xdp {
            check_xdp_engine(xdp, &options, engine)?;
        }
        let socket = BatchSocket::bind(options.listen, options.loop_options.max_queued).map_err(
            |source| RuntimeError::Bind {
                what: "server",
                addr: options.listen,
                source,
            },
        )?;
        if let (Some(store_options), Some(_)) = (options.store.as_mut(), engine) {
            grow_data_file(store_options);
        }
        let (app, formatted) = match (&options.store, engine) {
            (Some(store_options), Some(engine)) => {
                let (store, formatted) = open_engine(store_options, engine)?;
                (ServerApp::Engine(Box::new(store)), formatted)
            }
            (Some(store_options), None) => {
                let (store, formatted) = open_store(store_options)?;
                (ServerApp::Kv(Box::new(store)), formatted)
            }
            (None, _) => (ServerApp::Ideal(IdealHandler::new()), false),
        };
        let (startup, sessions) = startup_report(&options, &app, formatted);
        let clock = Clock::new();
        let mut config = ServerConfig::new(options.server_id, options.devices.clone());
        config.auth = options.keys.clone().map(pmnet_auth::Authenticator::new);
        config.replicas = options.replicas.clone();
        config.boot_nonce = rand::random();
        config.follow = options.follow.clone();
        if let Some(gap_fill_after) = options.gap_fill_after {
            config.gap_fill_after = gap_fill_after;
        }
        // A server with a store keeps a forward log next to its data file: a primary's
        // forwards, a replica's requests from its primary. A server that is no primary and
        // has none yet makes it when a primary first sends it a request.
        let (server, forward_log) = match &options.store {
            Some(store_options)
                if options.replicas.is_empty()
                    && !forward::forward_log_path(&store_options.path).exists() =>
            {
                let opened = forward::unopened_forward_log();
                let (server, _) = Server::with_forward_log(config, clock.now(), sessions, opened);
                (server, None)
            }
            Some(store_options) => {
                let (log, opened, path, created) = forward::open_forward_log(store_options)?;
                let (server, recovery) =
                    Server::with_forward_log(config, clock.now(), sessions, opened);
                let file = forward::ForwardLogFile {
                    path,
                    log,
                    recovery,
                    created,
                };
                forward::report_forward_log(&file);
                (server, Some(file))
            }
            None => {
                if !options.replicas.is_empty() {
                    tracing::warn!(
                        "a primary without a store (the ideal handler) keeps no forward log: a \
                         request forwarded to the replicas and lost here in a crash may differ \
                         between them (docs/replication.md)"
                    );
                }
                (Server::new(config, clock.now(), sessions), None)
            }
        };
        let mut server = server;
        // Without keys: say so, at most once a minute, while other hosts send to it.
        server.warn_of_plain_traffic();
        let board = MetricsBoard::new();
        let run_stop = Shutdown::new();
        let metrics = start_metrics_patiently(&options.loop_options, &board, &run_stop)?;
        let addresses = ServerAddresses {
            data: socket.local_addr(),
            metrics,
        };
        let mut socket = socket;
        socket.report_unreachable();
        let devices = crate::peers::PeerWatch::new("device", "`pmnet device`", &options.devices);
        let replicas = crate::peers::PeerWatch::new(
            "replica",
            "`pmnet server --device <this server>`",
            &options.replicas,
        );
        let mut runtime = ServerRuntime {
            devices,
            replicas,
            span,
            options,
            clock,
            server,
            app,
            socket,
            startup,
            addresses,
            board,
            shutdown,
            run_stop,
            restart: None,
            growth_check_turns: 0,
            counters: RuntimeCounters::default(),
            receiver: None,
            received_slots: ReceivedSlots::default(),
            slot_scratch: Vec::new(),
            store_full_since: None,
            store_full_warned: None,
            peers: crate::peer_book::PeerBook::default(),
            bucket: None,
            capacity_starved: false,
            forward_log,
            xdp: None,
            udp_skipped: 0,
        };
        if let Some(ops_per_s) = runtime.options.max_ops_per_s {
            runtime.bucket = Some(TokenBucket::new(ops_per_s, runtime.clock.now()));
        }
        if matches!(&runtime.app, ServerApp::Engine(store) if store.engine() == EngineKind::Packet)
        {
            runtime.receiver = Some(Box::new(SlotReceiver::new()));
        }
        if let (Some(xdp), ServerApp::Engine(store)) = (&xdp, &mut runtime.app) {
            let busy_poll = runtime.options.loop_options.wait == crate::WaitMode::BusyPoll;
            let receive = xdp::XdpReceive::open(xdp, store, runtime.addresses.data, busy_poll)?;
            runtime.startup.receive =
                format!("{}; {}", receive.description, runtime.startup.receive);
            runtime.xdp = Some(Box::new(receive));
        }
        // The recovery polls to the devices go out now.
        if runtime.server.is_recovering() {
            tracing::debug!(
                devices = runtime.options.devices.len(),
                "recovery: polling the devices for requests they logged while this server was \
                 down; serving after every one has answered"
            );
        }
        runtime.drain();
        crate::publish_node(&runtime, &runtime.board);
        Ok(runtime)
    }
}

/// `--xdp` receives into the packet store's slots: refused, with what to do, for any other
/// application.
fn check_xdp_engine(
    xdp: &ServerXdpOptions,
    options: &ServerOptions,
    engine: Option<EngineKind>,
) -> Result<(), RuntimeError> {
    let running = match (&options.store, engine) {
        (None, _) => "the ideal handler (--ideal), which keeps no store",
        (Some(_), Some(EngineKind::Packet)) => return Ok(()),
        (Some(_), Some(EngineKind::Conventional)) => "the conventional engine",
        (Some(_), None) => "the append-only key-value store (--engine kv)",
    };
    Err(RuntimeError::Config(format!(
        "--xdp {}: the AF_XDP receive path puts frames straight into the packet store's slots,          and this server runs {running}: use --engine packet, or drop --xdp",
        xdp.interface
    )))
}

/// What the server found at start-up (for its banner and reports), and the sessions its
/// application recovered (for exactly-once after a restart). Damage is logged here.
fn startup_report(
    options: &ServerOptions,
    app: &ServerApp,
    formatted: bool,
) -> (ServerStartup, Vec<RecoveredSession>) {
    let mut store_warning = None;
    let mut recovered_key_count = 0;
    if let ServerApp::Kv(store) = app {
        recovered_key_count = store.len();
        if let Some(rejected) = store.recovery().rejected {
            store_warning = Some(if rejected.valid_record_follows {
                format!(
                    "the store is CORRUPT at offset {}: replay stopped at a damaged record \
                     ({:?}) followed by valid ones; acknowledged requests after it are lost",
                    rejected.offset_bytes, rejected.reason
                )
            } else {
                format!(
                    "the store's last record was torn (offset {}, {:?}): a request that was \
                     never acknowledged; dropped",
                    rejected.offset_bytes, rejected.reason
                )
            });
        }
    }
    let mut recovery_note = None;
    if let ServerApp::Engine(store) = app {
        recovered_key_count = store.key_count();
        store_warning = store.recovery().warning();
        let report = store.recovery();
        recovery_note = Some(format!(
            "{} engine recovered {} keys and {} sessions in {:.3} ms (checksums of {} \
             bytes verified, {} index operations redone)",
            store.engine().name(),
            report.key_count,
            report.session_count,
            report.duration.as_secs_f64() * 1e3,
            report.verified_bytes,
            report.redone_ops
        ));
    }
    if let Some(store_options) = &options.store {
        log_store_damage(&store_options.path, app);
    }
    let sessions: Vec<RecoveredSession> = app
        .sessions()
        .into_iter()
        .map(|record| RecoveredSession {
            session_id: record.session_id,
            last_seq: record.last_seq,
            last_reply: record.last_reply,
            earlier_replies: Vec::new(),
        })
        .collect();
    let startup = ServerStartup {
        medium: app.medium(),
        data_path: options.store.as_ref().map(|store| store.path.clone()),
        formatted,
        recovered_session_count: sessions.len(),
        recovered_key_count,
        store_warning,
        engine: app.name(),
        recovery_note,
        capacity: capacity_text(app).map(|text| match (app, &options.store) {
            (ServerApp::Engine(store), Some(store_options))
                if store_options.growth.max_bytes
                    > pmnet_pm::PmRegion::len(store.region()) as u64 =>
            {
                format!(
                    "{text}; grows at {}% in use, up to {} MiB (--data-max-mib)",
                    store_options.growth.at_percent,
                    store_options.growth.max_bytes >> 20
                )
            }
            (ServerApp::Engine(_), Some(_)) => format!("{text}; does not grow (--data-max-mib)"),
            (ServerApp::Kv(_), Some(_)) => format!("{text}; the kv engine does not grow"),
            _ => text,
        }),
        receive: match app {
            ServerApp::Engine(store) if store.engine() == EngineKind::Packet => {
                "UDP socket (recvmmsg straight into free store slots)".to_owned()
            }
            _ => "UDP socket (recvmmsg)".to_owned(),
        },
    };
    (startup, sessions)
}

/// The metrics endpoint, bound again for up to a second while the port is still held: a
/// restart in place binds it while the last run's endpoint lets it go (it looks at its stop
/// flag every 100 ms).
fn start_metrics_patiently(
    options: &crate::LoopOptions,
    board: &MetricsBoard,
    stop: &Shutdown,
) -> Result<Option<std::net::SocketAddr>, RuntimeError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    loop {
        match start_metrics(options, board, stop) {
            Err(RuntimeError::Bind { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}
