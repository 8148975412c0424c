//! Watching pmnet as operators watch Redis and etcd: every long-running process type, started
//! with `--metrics 127.0.0.1:0` and given some traffic, serves metrics that Prometheus's own
//! linter (`promtool check metrics`, Debian's `prometheus` package) accepts without a problem,
//! with no series twice.
//!
//! promtool must be installed (scripts/test.sh installs it); where it is not and the `CI`
//! environment variable is unset, the test says so and passes.

mod common;
mod redis_harness;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{args, chain_member, free_udp_addr, run_pmnet, session, Cluster, Node};
use pmnet_runtime::metrics::scrape;
use pmnet_runtime::{AbdMode, AbdSession, AbdSessionConfig};
use pmnet_store::Request;

/// Where `program` is on `PATH`, if anywhere.
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|candidate| candidate.is_file())
    })
}

/// The promtool to check with; `None` (the test then passes, saying why) only when it is not
/// installed and this is not CI.
fn promtool() -> Option<PathBuf> {
    let found = on_path("promtool");
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "promtool is not installed, and CI must run this test: apt-get install -y prometheus \
             (scripts/test.sh does)"
        );
        eprintln!(
            "SKIPPED: promtool is not installed (apt-get install -y prometheus); the metrics \
             were not checked"
        );
    }
    found
}

/// The problems `promtool check metrics` finds in `text` (empty: none), and the series that
/// appear more than once (which promtool does not look for, and which Prometheus rejects at
/// every scrape).
fn problems(promtool: &PathBuf, text: &str) -> Vec<String> {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let output = child.wait_with_output().expect("promtool's output");
    let mut found: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&output.stderr).lines())
        .filter(|line| !line.trim().is_empty())
        .map(str::to_owned)
        .collect();
    if !output.status.success() && found.is_empty() {
        found.push(format!("promtool exited with {}", output.status));
    }
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        if let Some((series, _)) = line.rsplit_once(' ') {
            *seen.entry(series).or_default() += 1;
        }
    }
    found.extend(
        seen.into_iter()
            .filter(|(_, count)| *count > 1)
            .map(|(series, count)| format!("duplicate series ({count} times): {series}")),
    );
    found
}

/// Scrape every endpoint and check each; fail naming every process with a problem.
fn check_all(promtool: &PathBuf, endpoints: &[(String, SocketAddr)]) {
    let mut report = Vec::new();
    for (name, addr) in endpoints {
        let text = scrape(*addr, Duration::from_secs(10))
            .unwrap_or_else(|error| panic!("scrape {name} at {addr}: {error}"));
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{name}: not a full scrape:\n{text}"
        );
        let found = problems(promtool, &text);
        if !found.is_empty() {
            report.push(format!("{name} ({addr}):\n  {}", found.join("\n  ")));
        }
    }
    assert!(
        report.is_empty(),
        "promtool check metrics (and the duplicate check) found problems:\n{}",
        report.join("\n")
    );
}

fn metrics_of(node: &Node) -> SocketAddr {
    node.metrics
        .unwrap_or_else(|| panic!("{} serves no metrics", node.proc.name))
}

fn metrics_of_harness(proc: &Option<redis_harness::Proc>, name: &str) -> SocketAddr {
    proc.as_ref()
        .and_then(|proc| proc.metrics)
        .unwrap_or_else(|| panic!("the {name} serves no metrics"))
}

#[test]
fn the_linter_accepts_what_every_process_type_serves() {
    let Some(promtool) = promtool() else { return };
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut endpoints: Vec<(String, SocketAddr)> = Vec::new();

    // A device with its read cache in front of a server: updates, reads, cache reads.
    let cluster = Cluster::start_with_device_options(&["--cache"]);
    let mut client = session(cluster.device_addr);
    for index in 0..20 {
        let key = format!("key-{}", index % 4);
        client
            .update(
                &Request::Set {
                    key: key.as_bytes(),
                    value: b"v",
                }
                .to_bytes(),
            )
            .expect("SET completes");
    }
    client
        .bypass(&Request::Get { key: b"key-0" }.to_bytes())
        .expect("GET completes");
    let device = cluster.device_addr.to_string();
    for command in [
        &["set", "greeting", "hello"][..],
        &["get", "greeting"],
        &["get", "none"],
    ] {
        let mut list = vec!["client", "--device", &device];
        list.extend_from_slice(command);
        let (status, stdout, stderr) = run_pmnet(&args(&list), None);
        assert!(
            status.success(),
            "pmnet client {command:?}: {stdout}{stderr}"
        );
    }
    endpoints.push(("device".into(), metrics_of(cluster.device())));
    endpoints.push(("server".into(), metrics_of(cluster.server())));

    // The Redis gateway and adaptor in front of a real redis-server.
    let system = redis_harness::System::start_full(
        &["--cache", "--metrics", "127.0.0.1:0"],
        &["--device-cache", "--metrics", "127.0.0.1:0"],
        false,
    );
    let mut redis = system.gateway_client();
    for command in [
        &["SET", "a", "1"][..],
        &["GET", "a"],
        &["INCR", "n"],
        &["MSET", "b", "2", "c", "3"],
        &["GET", "missing"],
        &["PING"],
    ] {
        redis.command(command).expect("the gateway answers");
    }
    endpoints.push((
        "redis device".into(),
        metrics_of_harness(&system.device, "device"),
    ));
    endpoints.push((
        "gateway".into(),
        metrics_of_harness(&system.gateway, "gateway"),
    ));
    endpoints.push((
        "redis-adaptor".into(),
        metrics_of_harness(&system.adaptor, "adaptor"),
    ));

    // A memory node and a device coordinating it: a write and a read.
    let memnode_addr = free_udp_addr();
    let memnode = Node::start(
        "memnode",
        args(&[
            "memnode",
            "--listen",
            &memnode_addr.to_string(),
            "--lines",
            "64",
            "--file",
            &dir.path().join("node.lines").display().to_string(),
            "--metrics",
            "127.0.0.1:0",
            "--report-interval",
            "1",
        ]),
    );
    memnode.wait_metric("pmnet_memnode_member", "", "is a member", |v| v == 1.0);
    let abd_addr = free_udp_addr();
    let abd_device = Node::start(
        "abd device",
        args(&[
            "device",
            "--listen",
            &abd_addr.to_string(),
            "--abd-lines",
            "64",
            "--abd-node",
            &memnode_addr.to_string(),
            "--metrics",
            "127.0.0.1:0",
        ]),
    );
    let mut abd = AbdSession::open(AbdSessionConfig {
        mode: AbdMode::Device(abd_addr),
        lines: 64,
        keys: None,
    })
    .expect("a socket");
    abd.write(3, &[7u8; 64])
        .expect("the socket works")
        .expect("the line written");
    assert_eq!(
        abd.read(3, 1)
            .expect("the socket works")
            .expect("the line read"),
        vec![7u8; 64]
    );
    // Its report line is a memory node's own: membership, lines held, queries and stores.
    let report = common::poll_until("the memory node's report line", || {
        let stderr = memnode.proc.stderr();
        stderr
            .lines()
            .rev()
            .find(|line| line.contains(&format!("memnode {memnode_addr}: ")))
            .filter(|line| line.contains("lines held 1 of 64"))
            .map(str::to_owned)
            .ok_or(stderr)
    });
    for wanted in ["member (counts in quorums)", "queries ", "stores ", "acks "] {
        assert!(report.contains(wanted), "no {wanted:?} in {report}");
    }
    assert!(!report.contains("device"), "{report}");
    endpoints.push(("memnode".into(), metrics_of(&memnode)));
    endpoints.push(("abd device".into(), metrics_of(&abd_device)));

    // The chain store's controller (state in a file) and a member reporting to it.
    let controller_addr = free_udp_addr();
    let member_addr = free_udp_addr();
    let chain_controller = Node::start(
        "chain-controller",
        args(&[
            "chain-controller",
            "--listen",
            &controller_addr.to_string(),
            "--member",
            &member_addr.to_string(),
            "--chain-length",
            "1",
            "--groups",
            "2",
            "--state",
            &dir.path().join("chain.state").display().to_string(),
            "--metrics",
            "127.0.0.1:0",
            "--report-interval",
            "0",
        ]),
    );
    let member = chain_member(
        1,
        member_addr,
        &["--chain-controller".to_owned(), controller_addr.to_string()],
        dir.path(),
    );
    chain_controller.wait_metric(
        "pmnet_chain_controller_statuses_total",
        "",
        "a member's status",
        |v| v > 0.0,
    );
    endpoints.push(("chain-controller".into(), metrics_of(&chain_controller)));
    endpoints.push(("chain member".into(), metrics_of(&member)));

    // `pmnet controller` on a real etcd, where one is installed.
    let mut _etcd = None;
    let mut _controller = None;
    if on_path("etcd").is_some() {
        let etcd = pmnet_etcd::LocalEtcd::start(
            "etcd",
            &dir.path().join("etcd"),
            "127.0.0.1:0".parse().expect("address"),
            Duration::from_secs(30),
        )
        .expect("start etcd");
        let controller = Node::start(
            "controller",
            args(&[
                "controller",
                "--etcd",
                &etcd.endpoint().to_string(),
                "--cluster",
                "monitoring",
                "--listen",
                &free_udp_addr().to_string(),
                "--groups",
                "2",
                "--chain-length",
                "1",
                "--member",
                &free_udp_addr().to_string(),
                "--metrics",
                "127.0.0.1:0",
                "--report-interval",
                "0",
            ]),
        );
        endpoints.push(("controller".into(), metrics_of(&controller)));
        _etcd = Some(etcd);
        _controller = Some(controller);
    } else {
        assert!(
            std::env::var_os("CI").is_none(),
            "etcd is not installed, and CI must run this test: apt-get install -y etcd-server"
        );
        eprintln!("etcd is not installed: `pmnet controller` was not checked");
    }

    check_all(&promtool, &endpoints);
}

/// `text` percent-encoded for a URL's query string.
fn url_encoded(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// GET `path` from the HTTP server at `addr` (HTTP/1.0: the answer is neither chunked nor kept
/// alive): the status code and the body.
fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    Ok((code, body.to_owned()))
}

/// A Prometheus of the test's own (`/usr/bin/prometheus`), scraping `targets` every second;
/// killed when dropped.
struct Prometheus {
    child: std::process::Child,
    addr: SocketAddr,
}

impl Prometheus {
    fn start(program: &std::path::Path, dir: &std::path::Path, targets: &[SocketAddr]) -> Self {
        let config = dir.join("prometheus.yml");
        let listed: Vec<String> = targets.iter().map(|addr| format!("'{addr}'")).collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: pmnet\n    static_configs:\n      \
                 - targets: [{}]\n",
                listed.join(", ")
            ),
        )
        .expect("write the configuration");
        let port = redis_harness::free_tcp_port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log file");
        let child = Command::new(program)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let prometheus = Prometheus { child, addr };
        common::poll_until("prometheus ready", || match http_get(addr, "/-/ready") {
            Ok((200, _)) => Ok(()),
            other => Err(format!(
                "{other:?}; log: {}",
                std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
            )),
        });
        prometheus
    }

    /// The result of instant query `expr`: `Ok(series)` once it succeeded, `Err` with why not.
    fn query(&self, expr: &str) -> Result<Vec<serde_json::Value>, String> {
        let (code, body) = http_get(
            self.addr,
            &format!("/api/v1/query?query={}", url_encoded(expr)),
        )
        .map_err(|error| format!("query: {error}"))?;
        let json: serde_json::Value =
            serde_json::from_str(&body).map_err(|error| format!("{code}: {error}: {body}"))?;
        if json["status"] != "success" {
            return Err(format!("{code}: {body}"));
        }
        Ok(json["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every panel's targets in a Grafana dashboard: (panel title, refId, expr), rows' panels
/// included.
fn dashboard_targets(dashboard: &serde_json::Value) -> Vec<(String, String, String)> {
    fn walk(panels: &[serde_json::Value], out: &mut Vec<(String, String, String)>) {
        for panel in panels {
            let title = panel["title"].as_str().unwrap_or("(untitled)").to_owned();
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("panel {title:?}: a target without an expr"));
                out.push((
                    title.clone(),
                    target["refId"].as_str().unwrap_or("?").to_owned(),
                    expr.to_owned(),
                ));
            }
            walk(panel["panels"].as_array().map_or(&[], Vec::as_slice), out);
        }
    }
    let mut out = Vec::new();
    walk(
        dashboard["panels"].as_array().map_or(&[], Vec::as_slice),
        &mut out,
    );
    out
}

/// `expr` with the dashboard's variables as Grafana substitutes them: every instance
/// (`$instance`'s "All", its `allValue` `.*`), and a `$__rate_interval` of four scrape
/// intervals (Grafana's least for a 1 s scrape interval).
fn substituted(expr: &str) -> String {
    expr.replace("${instance}", ".*")
        .replace("$instance", ".*")
        .replace("${__rate_interval}", "4s")
        .replace("$__rate_interval", "4s")
}

#[test]
fn every_query_of_the_grafana_dashboard_has_data_in_a_real_prometheus() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/grafana/pmnet.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the dashboard"))
            .expect("the dashboard is JSON");
    let targets = dashboard_targets(&dashboard);
    assert!(targets.len() >= 20, "{targets:?}");
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("template variables")
        .iter()
        .filter_map(|variable| variable["name"].as_str())
        .collect();
    assert!(
        variables.contains(&"datasource") && variables.contains(&"instance"),
        "{variables:?}"
    );
    for (title, ref_id, expr) in &targets {
        assert!(
            !substituted(expr).contains('$'),
            "panel {title:?} {ref_id}: a variable the test does not substitute: {expr}"
        );
    }
    let Some(program) = on_path("prometheus") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "prometheus is not installed, and CI must run this test: apt-get install -y \
             prometheus (scripts/test.sh does)"
        );
        eprintln!("SKIPPED: prometheus is not installed; the dashboard's queries were not run");
        return;
    };

    // A device with its cache in front of a server, and a gateway in front of Redis; traffic
    // on both until the queries are answered.
    let cluster = Cluster::start_with_device_options(&["--cache"]);
    let system = redis_harness::System::start_full(
        &["--metrics", "127.0.0.1:0"],
        &["--metrics", "127.0.0.1:0"],
        false,
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = {
        let (stop, device) = (stop.clone(), cluster.device_addr);
        let mut redis = system.gateway_client();
        std::thread::spawn(move || {
            let mut client = session(device);
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let key = format!("key-{}", n % 8);
                client
                    .update(
                        &Request::Set {
                            key: key.as_bytes(),
                            value: b"v",
                        }
                        .to_bytes(),
                    )
                    .expect("SET completes");
                client
                    .bypass(
                        &Request::Get {
                            key: key.as_bytes(),
                        }
                        .to_bytes(),
                    )
                    .expect("GET completes");
                redis
                    .command(&["SET", &key, "v"])
                    .expect("the gateway answers");
                redis.command(&["GET", &key]).expect("the gateway answers");
                n += 1;
            }
        })
    };
    // A datagram that is no PMNet request, to the device and to the server: each drops it,
    // and the panels of drops by reason have a reason to show.
    let junk = std::net::UdpSocket::bind("127.0.0.1:0").expect("a socket");
    for addr in [cluster.device_addr, cluster.server_addr] {
        junk.send_to(b"not pmnet", addr).expect("send");
    }

    let dir = tempfile::tempdir().expect("temporary directory");
    let prometheus = Prometheus::start(
        &program,
        dir.path(),
        &[
            metrics_of(cluster.device()),
            metrics_of(cluster.server()),
            metrics_of_harness(&system.gateway, "gateway"),
            metrics_of_harness(&system.adaptor, "adaptor"),
        ],
    );
    // Every target is up, and no scrape held a series twice.
    common::poll_until("every target scraped", || {
        let up = prometheus.query("up == 1")?;
        if up.len() == 4 {
            Ok(())
        } else {
            Err(format!("{} of 4 targets up: {up:?}", up.len()))
        }
    });

    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut waiting: Vec<&(String, String, String)> = targets.iter().collect();
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    while !waiting.is_empty() && std::time::Instant::now() < deadline {
        waiting.retain(|(title, ref_id, expr)| {
            let name = format!("panel {title:?}, target {ref_id}");
            match prometheus.query(&substituted(expr)) {
                Ok(series) if !series.is_empty() => false,
                Ok(_) => {
                    last.insert(name, format!("no data: {expr}"));
                    true
                }
                Err(error) => {
                    last.insert(name, format!("{error}: {expr}"));
                    true
                }
            }
        });
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    traffic.join().expect("the traffic ran");
    let failed: Vec<String> = waiting
        .iter()
        .map(|(title, ref_id, _)| {
            let name = format!("panel {title:?}, target {ref_id}");
            format!("{name}: {}", last.get(&name).cloned().unwrap_or_default())
        })
        .collect();
    assert!(
        failed.is_empty(),
        "queries of docs/grafana/pmnet.json with no data after 60 s:\n{}",
        failed.join("\n")
    );
    // Prometheus counts the scrapes that held a series twice (what promtool does not check).
    let (_, own) = http_get(prometheus.addr, "/metrics").expect("Prometheus's own metrics");
    let duplicates = pmnet_runtime::metrics::find_sample(
        &own,
        "prometheus_target_scrapes_sample_duplicate_timestamp_total",
        "",
    );
    assert_eq!(duplicates, Some(0.0), "scrapes with a series twice");
}
