//! Counters in the Prometheus text format, and a tiny HTTP endpoint that serves them (and the
//! process's status as JSON).
//!
//! The event loop owns the state machines and their counters. The endpoint thread never
//! touches them: a scrape asks the loop for a fresh rendering ([`MetricsBoard::fresh`]), the
//! loop renders its [`Metrics`] (and status) at the end of its next turn, and the scrape gets
//! what was true then. The loop pays one relaxed atomic load per turn for this; it also
//! publishes every so often on its own, which is what a scrape gets if the loop does not answer
//! in time.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use pmnet_proto::LatencyHistogram;

use crate::Shutdown;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One line of a family: the suffix of the series name (`_bucket`, `_sum`, `_count` of a
/// histogram; empty otherwise), the rendered labels and the value.
#[derive(Debug, Clone)]
struct Sample {
    suffix: &'static str,
    labels: String,
    value: f64,
}

#[derive(Debug, Clone)]
struct Family {
    name: String,
    help: &'static str,
    kind: Kind,
    samples: Vec<Sample>,
}

/// A set of metric families being built, in the order they were first named.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    families: Vec<Family>,
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::default()
    }

    /// Add a sample of a monotonically increasing counter (`name` should end in `_total`).
    pub fn counter(&mut self, name: &str, help: &'static str, labels: &[(&str, &str)], value: u64) {
        self.sample(name, help, Kind::Counter, "", labels, value as f64);
    }

    /// Add a sample of a counter kept in seconds (a float).
    pub fn counter_seconds(
        &mut self,
        name: &str,
        help: &'static str,
        labels: &[(&str, &str)],
        seconds: f64,
    ) {
        self.sample(name, help, Kind::Counter, "", labels, seconds);
    }

    /// Add a latency histogram in seconds (`name` should end in `_seconds`): its cumulative
    /// `_bucket{le=...}` series, `_sum` and `_count`.
    pub fn histogram(
        &mut self,
        name: &str,
        help: &'static str,
        labels: &[(&str, &str)],
        histogram: &LatencyHistogram,
    ) {
        for (bound, count) in histogram.cumulative() {
            let le = if bound.is_infinite() {
                "+Inf".to_owned()
            } else {
                format!("{bound}")
            };
            let mut with_le: Vec<(&str, &str)> = labels.to_vec();
            with_le.push(("le", &le));
            self.sample(
                name,
                help,
                Kind::Histogram,
                "_bucket",
                &with_le,
                count as f64,
            );
        }
        self.sample(
            name,
            help,
            Kind::Histogram,
            "_sum",
            labels,
            histogram.sum_seconds(),
        );
        self.sample(
            name,
            help,
            Kind::Histogram,
            "_count",
            labels,
            histogram.count() as f64,
        );
    }

    /// Add what every process reports, under the names Prometheus's client libraries use:
    /// CPU time (user and system, all threads), memory, file descriptors and start time (from
    /// `/proc/self`, where there is one), and `pmnet_build_info`.
    pub fn add_process_metrics(&mut self) {
        self.counter_seconds(
            "process_cpu_seconds_total",
            "CPU time the process has used, user and system, all threads.",
            &[],
            process_cpu_seconds(),
        );
        let process = ProcessInfo::read();
        if let Some(bytes) = process.resident_memory_bytes {
            self.gauge(
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                &[],
                bytes as f64,
            );
        }
        if let Some(bytes) = process.virtual_memory_bytes {
            self.gauge(
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                &[],
                bytes as f64,
            );
        }
        if let Some(fds) = process.open_fds {
            self.gauge(
                "process_open_fds",
                "Open file descriptors.",
                &[],
                fds as f64,
            );
        }
        if let Some(fds) = process.max_fds {
            self.gauge(
                "process_max_fds",
                "Maximum number of open file descriptors (the soft limit).",
                &[],
                fds as f64,
            );
        }
        if let Some(seconds) = process.start_time_seconds {
            self.gauge(
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch, in seconds.",
                &[],
                seconds,
            );
        }
        let build = build_info();
        self.gauge(
            "pmnet_build_info",
            "The pmnet build: version, git commit, cargo profile and compiler (value always 1).",
            &[
                ("version", build.version),
                ("commit", build.commit),
                ("profile", build.profile),
                ("rustc", build.rustc),
            ],
            1.0,
        );
    }

    /// Add a sample of a value that goes up and down.
    pub fn gauge(&mut self, name: &str, help: &'static str, labels: &[(&str, &str)], value: f64) {
        self.sample(name, help, Kind::Gauge, "", labels, value);
    }

    fn sample(
        &mut self,
        name: &str,
        help: &'static str,
        kind: Kind,
        suffix: &'static str,
        labels: &[(&str, &str)],
        value: f64,
    ) {
        let sample = Sample {
            suffix,
            labels: render_labels(labels),
            value,
        };
        match self.families.iter_mut().find(|family| family.name == name) {
            Some(family) => family.samples.push(sample),
            None => self.families.push(Family {
                name: name.to_owned(),
                help,
                kind,
                samples: vec![sample],
            }),
        }
    }

    /// The value of the sample `name` with exactly `labels`, if there is one (for a
    /// histogram, name the series: `x_seconds_count`).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let labels = render_labels(labels);
        self.families.iter().find_map(|family| {
            let suffix = name.strip_prefix(family.name.as_str())?;
            family
                .samples
                .iter()
                .find(|sample| sample.suffix == suffix && sample.labels == labels)
                .map(|sample| sample.value)
        })
    }

    /// The sum of every sample of `name` (a counter or gauge).
    pub fn sum(&self, name: &str) -> f64 {
        self.families
            .iter()
            .filter(|family| family.name == name)
            .flat_map(|family| family.samples.iter().map(|sample| sample.value))
            .sum()
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        for family in &self.families {
            let kind = match family.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
            let _ = writeln!(out, "# TYPE {} {kind}", family.name);
            for sample in &family.samples {
                let _ = writeln!(
                    out,
                    "{}{}{} {}",
                    family.name, sample.suffix, sample.labels, sample.value
                );
            }
        }
        out
    }
}

fn render_labels(labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let mut out = String::from("{");
    for (index, (name, value)) in labels.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        out.push_str(name);
        out.push_str("=\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
    out
}

/// What the loop last published: the metrics text and the status JSON.
#[derive(Debug, Default)]
struct Published {
    text: String,
    status: String,
    /// Counts publications, so that a scrape knows when a fresh one has arrived.
    generation: u64,
}

#[derive(Debug, Default)]
struct Shared {
    published: Mutex<Published>,
    arrived: Condvar,
    /// A scrape waits for a fresh publication.
    wanted: AtomicBool,
    /// A loop is running that will answer `wanted`.
    live: AtomicBool,
}

/// The last published metrics text and status, shared between the loop and the endpoint.
#[derive(Debug, Clone, Default)]
pub struct MetricsBoard {
    shared: Arc<Shared>,
}

/// How long a scrape waits for the loop to publish afresh before it takes the last
/// publication: longer than a blocking loop sleeps between turns.
pub const FRESH_WAIT: Duration = Duration::from_millis(500);

impl MetricsBoard {
    pub fn new() -> MetricsBoard {
        MetricsBoard::default()
    }

    /// Publish `metrics` (and keep the status last published).
    pub fn publish(&self, metrics: &Metrics) {
        self.store(metrics.render(), None);
    }

    /// Publish `metrics` and the status JSON `status`.
    pub fn publish_with_status(&self, metrics: &Metrics, status: String) {
        self.store(metrics.render(), Some(status));
    }

    fn store(&self, text: String, status: Option<String>) {
        if let Ok(mut published) = self.shared.published.lock() {
            published.text = text;
            if let Some(status) = status {
                published.status = status;
            }
            published.generation += 1;
        }
        self.shared.wanted.store(false, Ordering::Relaxed);
        self.shared.arrived.notify_all();
    }

    /// Whether a scrape waits for a fresh publication (the loop checks it every turn).
    #[inline]
    pub fn is_wanted(&self) -> bool {
        self.shared.wanted.load(Ordering::Relaxed)
    }

    /// Say whether a loop is running that answers [`MetricsBoard::fresh`].
    pub fn set_live(&self, live: bool) {
        self.shared.live.store(live, Ordering::Relaxed);
        if !live {
            self.shared.arrived.notify_all();
        }
    }

    /// The last published metrics text.
    pub fn text(&self) -> String {
        self.shared
            .published
            .lock()
            .map(|published| published.text.clone())
            .unwrap_or_default()
    }

    /// The last published status JSON (empty if none was).
    pub fn status(&self) -> String {
        self.shared
            .published
            .lock()
            .map(|published| published.status.clone())
            .unwrap_or_default()
    }

    /// Ask the loop (if one runs) to publish now, and wait for it at most `timeout`; then
    /// return the metrics text and the status as they are.
    pub fn fresh(&self, timeout: Duration) -> (String, String) {
        let Ok(mut published) = self.shared.published.lock() else {
            return (String::new(), String::new());
        };
        if self.shared.live.load(Ordering::Relaxed) {
            let seen = published.generation;
            self.shared.wanted.store(true, Ordering::Relaxed);
            let deadline = Instant::now() + timeout;
            while published.generation == seen && self.shared.live.load(Ordering::Relaxed) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                published = match self.shared.arrived.wait_timeout(published, left) {
                    Ok((guard, _)) => guard,
                    Err(_) => return (String::new(), String::new()),
                };
            }
        }
        (published.text.clone(), published.status.clone())
    }
}

/// Largest HTTP request head read from a scraper.
const MAX_REQUEST_LEN: usize = 8192;

/// Serve `board` over HTTP on `addr` from a thread of its own, until `shutdown`: `/status`
/// answers with the status JSON, any other path with the metrics. Returns the bound address
/// (useful with port 0).
pub fn serve_metrics(
    addr: SocketAddr,
    board: MetricsBoard,
    shutdown: Shutdown,
) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let local_addr = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    thread::Builder::new()
        .name("pmnet-metrics".into())
        .spawn(move || {
            while !shutdown.is_requested() {
                match listener.accept() {
                    Ok((stream, _)) => {
                        // A misbehaving scraper only affects its own connection.
                        let _ = answer(stream, &board);
                    }
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                        let _ = crate::wait::wait_for_sockets(
                            &[(std::os::fd::AsRawFd::as_raw_fd(&listener), false)],
                            Duration::from_millis(100),
                        );
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        })?;
    Ok(local_addr)
}

fn answer(mut stream: TcpStream, board: &MetricsBoard) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    stream.set_write_timeout(Some(Duration::from_secs(1)))?;
    let mut request = Vec::new();
    let mut buffer = [0u8; 1024];
    while !request.windows(4).any(|window| window == b"\r\n\r\n")
        && !request.windows(2).any(|window| window == b"\n\n")
    {
        let count = stream.read(&mut buffer)?;
        if count == 0 {
            break;
        }
        request.extend_from_slice(&buffer[..count]);
        if request.len() > MAX_REQUEST_LEN {
            break;
        }
    }
    let path = request_path(&request);
    let (metrics, status) = board.fresh(FRESH_WAIT);
    let (code, content_type, body) = if path == "/status" {
        if status.is_empty() {
            (
                "404 Not Found",
                "text/plain",
                "this process publishes no status\n".to_owned(),
            )
        } else {
            ("200 OK", "application/json", status)
        }
    } else {
        ("200 OK", "text/plain; version=0.0.4", metrics)
    };
    let head = format!(
        "HTTP/1.1 {code}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Server: pmnet\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}

/// The path of an HTTP request head (`GET /status?x HTTP/1.1` gives `/status`), "/" if none.
fn request_path(request: &[u8]) -> String {
    let head = String::from_utf8_lossy(request);
    let target = head
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .unwrap_or("/");
    target
        .split(['?', '#'])
        .next()
        .unwrap_or("/")
        .trim_end_matches('/')
        .to_owned()
}

/// An HTTP response from a pmnet endpoint.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code (200, 404, ...).
    pub code: u16,
    /// Whether the response came from a pmnet endpoint (its `Server: pmnet` header).
    pub from_pmnet: bool,
    pub body: String,
}

/// GET `path` from the endpoint at `addr`.
pub fn get(addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: pmnet\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes())?;
    let mut response = Vec::new();
    stream.take(64 << 20).read_to_end(&mut response)?;
    let response = String::from_utf8_lossy(&response);
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| invalid("not an HTTP response"))?;
    let mut lines = head.lines();
    let code = lines
        .next()
        .filter(|line| line.starts_with("HTTP/"))
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| invalid("not an HTTP response"))?;
    let from_pmnet = lines.any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("server") && value.trim() == "pmnet"
        })
    });
    Ok(Response {
        code,
        from_pmnet,
        body: body.to_owned(),
    })
}

/// Fetch the metrics text from `addr` (a small HTTP GET), for tests and `pmnet bench`.
pub fn scrape(addr: SocketAddr, timeout: Duration) -> io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: pmnet\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    match response.split_once("\r\n\r\n") {
        Some((_, body)) => Ok(body.to_owned()),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "metrics response without a body",
        )),
    }
}

/// The value of `name{labels}` in a scraped text (`labels` as written, e.g. `reason="x"`;
/// empty for none).
pub fn find_sample(text: &str, name: &str, labels: &str) -> Option<f64> {
    let wanted = if labels.is_empty() {
        name.to_owned()
    } else {
        format!("{name}{{{labels}}}")
    };
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (series == wanted).then(|| value.parse().ok()).flatten()
        })
}

/// CPU time this process has used so far, user and system, in seconds.
pub fn process_cpu_seconds() -> f64 {
    // SAFETY: a zeroed rusage is valid, and getrusage only writes into it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid pointer.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// What `/proc/self` says about the process (`None` where it cannot be read).
#[derive(Debug, Clone, Default)]
pub struct ProcessInfo {
    pub resident_memory_bytes: Option<u64>,
    pub virtual_memory_bytes: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub start_time_seconds: Option<f64>,
}

impl ProcessInfo {
    pub fn read() -> ProcessInfo {
        // SAFETY: sysconf has no preconditions.
        let page_size = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok();
        let statm = std::fs::read_to_string("/proc/self/statm").ok();
        let mut pages = statm
            .as_deref()
            .unwrap_or("")
            .split_whitespace()
            .map(|field| field.parse::<u64>().ok());
        let virtual_pages = pages.next().flatten();
        let resident_pages = pages.next().flatten();
        let bytes = |pages: Option<u64>| Some(pages? * page_size?);
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            // The directory's own descriptor is among them while it is read.
            .map(|entries| (entries.count() as u64).saturating_sub(1));
        // SAFETY: a zeroed rlimit is valid, and getrlimit only writes into it.
        let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: RLIMIT_NOFILE with a valid pointer.
        let max_fds = (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0)
            .then_some(limit.rlim_cur as u64);
        ProcessInfo {
            resident_memory_bytes: bytes(resident_pages),
            virtual_memory_bytes: bytes(virtual_pages),
            open_fds,
            max_fds,
            start_time_seconds: process_start_time_seconds(),
        }
    }
}

/// When the process started, in seconds since the Unix epoch: the boot time of `/proc/stat`
/// plus the start of `/proc/self/stat` (in clock ticks since boot). Read once.
pub fn process_start_time_seconds() -> Option<f64> {
    static START: std::sync::OnceLock<Option<f64>> = std::sync::OnceLock::new();
    *START.get_or_init(|| {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name (field 2) is in parentheses and may hold spaces: count after it.
        let after_name = &stat[stat.rfind(')')? + 1..];
        // Field 22 (starttime) is the 20th after the name.
        let ticks: f64 = after_name.split_whitespace().nth(19)?.parse().ok()?;
        let boot: f64 = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|line| line.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        // SAFETY: sysconf has no preconditions.
        let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        (ticks_per_second > 0).then(|| boot + ticks / ticks_per_second as f64)
    })
}

/// How this binary was built.
#[derive(Debug, Clone, Copy)]
pub struct BuildInfo {
    pub version: &'static str,
    /// The short git commit, or "unknown" when built outside a git checkout.
    pub commit: &'static str,
    /// "debug" or "release" (cargo's profile).
    pub profile: &'static str,
    /// `rustc --version`, or "unknown".
    pub rustc: &'static str,
}

pub fn build_info() -> BuildInfo {
    BuildInfo {
        version: env!("CARGO_PKG_VERSION"),
        commit: env!("PMNET_GIT_COMMIT"),
        profile: env!("PMNET_PROFILE"),
        rustc: env!("PMNET_RUSTC_VERSION"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_process_reports_the_cpu_it_used() {
        let before = process_cpu_seconds();
        // Use some CPU: at least what the process clock then shows.
        let mut spin = 0u64;
        while process_cpu_seconds() - before < 0.01 {
            spin = std::hint::black_box(spin.wrapping_add(1));
        }
        let mut metrics = Metrics::new();
        metrics.add_process_metrics();
        let text = metrics.render();
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{text}"
        );
        let seconds = find_sample(&text, "process_cpu_seconds_total", "").unwrap();
        assert!(seconds >= before + 0.01, "{seconds} after {before}");
    }

    #[test]
    fn renders_families_once_with_escaped_labels() {
        let mut metrics = Metrics::new();
        metrics.counter("pmnet_x_total", "Xs.", &[("reason", "a\"b")], 3);
        metrics.counter("pmnet_x_total", "Xs.", &[("reason", "c")], 4);
        metrics.gauge("pmnet_y", "Y.", &[], 1.5);
        let text = metrics.render();
        assert_eq!(
            text,
            "# HELP pmnet_x_total Xs.\n# TYPE pmnet_x_total counter\n\
             pmnet_x_total{reason=\"a\\\"b\"} 3\npmnet_x_total{reason=\"c\"} 4\n\
             # HELP pmnet_y Y.\n# TYPE pmnet_y gauge\npmnet_y 1.5\n"
        );
        assert_eq!(
            find_sample(&text, "pmnet_x_total", "reason=\"c\""),
            Some(4.0)
        );
        assert_eq!(find_sample(&text, "pmnet_y", ""), Some(1.5));
        assert_eq!(metrics.sum("pmnet_x_total"), 7.0);
    }

    #[test]
    fn histograms_render_cumulative_buckets_sum_and_count() {
        let mut histogram = LatencyHistogram::new();
        histogram.record(Duration::from_micros(3));
        histogram.record(Duration::from_millis(2));
        let mut metrics = Metrics::new();
        metrics.histogram("pmnet_t_seconds", "T.", &[("port", "p")], &histogram);
        let text = metrics.render();
        assert!(
            text.contains("# TYPE pmnet_t_seconds histogram\n"),
            "{text}"
        );
        let bucket = |le: &str| {
            find_sample(
                &text,
                "pmnet_t_seconds_bucket",
                &format!("port=\"p\",le=\"{le}\""),
            )
        };
        assert_eq!(bucket("0.000005"), Some(1.0), "{text}");
        assert_eq!(bucket("0.001"), Some(1.0), "{text}");
        assert_eq!(bucket("0.0025"), Some(2.0), "{text}");
        assert_eq!(bucket("+Inf"), Some(2.0), "{text}");
        assert_eq!(
            find_sample(&text, "pmnet_t_seconds_count", "port=\"p\""),
            Some(2.0)
        );
        let sum = find_sample(&text, "pmnet_t_seconds_sum", "port=\"p\"").unwrap();
        assert!((sum - 0.002003).abs() < 1e-9, "{sum}");
        assert_eq!(
            metrics.value("pmnet_t_seconds_count", &[("port", "p")]),
            Some(2.0)
        );
    }

    #[test]
    fn a_scrape_waits_for_the_loop_to_publish_afresh() {
        let board = MetricsBoard::new();
        let mut metrics = Metrics::new();
        metrics.counter("pmnet_n_total", "N.", &[], 1);
        board.publish(&metrics);
        board.set_live(true);
        // A loop that publishes only when asked, with what it counted by then.
        let loop_board = board.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let looping = thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                if loop_board.is_wanted() {
                    let mut metrics = Metrics::new();
                    metrics.counter("pmnet_n_total", "N.", &[], 2);
                    loop_board.publish_with_status(&metrics, "{\"pmnet_status\":1}".into());
                }
                thread::yield_now();
            }
        });
        let (text, status) = board.fresh(Duration::from_secs(30));
        assert_eq!(find_sample(&text, "pmnet_n_total", ""), Some(2.0));
        assert_eq!(status, "{\"pmnet_status\":1}");
        stop.store(true, Ordering::Relaxed);
        looping.join().unwrap();
        // No loop running: the last publication at once.
        board.set_live(false);
        let (text, _) = board.fresh(Duration::from_secs(30));
        assert_eq!(find_sample(&text, "pmnet_n_total", ""), Some(2.0));
    }

    #[test]
    fn the_endpoint_serves_what_was_published() {
        let board = MetricsBoard::new();
        let shutdown = Shutdown::new();
        let addr = serve_metrics(
            "127.0.0.1:0".parse().unwrap(),
            board.clone(),
            shutdown.clone(),
        )
        .unwrap();
        let mut metrics = Metrics::new();
        metrics.counter("pmnet_z_total", "Z.", &[], 42);
        board.publish(&metrics);
        let text = scrape(addr, Duration::from_secs(5)).unwrap();
        assert_eq!(find_sample(&text, "pmnet_z_total", ""), Some(42.0));
        // No status published: /status is a pmnet 404; then the status as published.
        let response = get(addr, "/status", Duration::from_secs(5)).unwrap();
        assert_eq!((response.code, response.from_pmnet), (404, true));
        board.publish_with_status(&metrics, "{\"pmnet_status\":1}".into());
        let response = get(addr, "/status?x=1", Duration::from_secs(5)).unwrap();
        assert_eq!(response.code, 200);
        assert_eq!(response.body, "{\"pmnet_status\":1}");
        shutdown.request();
    }
}
