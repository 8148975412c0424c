//! Counters in the Prometheus text format, and a tiny HTTP endpoint that serves them.
//!
//! The event loop owns the state machines and their counters; every so often it renders a
//! [`Metrics`] snapshot and publishes it to a [`MetricsBoard`]. The endpoint thread only ever
//! reads the last published text, so a scrape never touches the data path.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use crate::Shutdown;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
}

#[derive(Debug, Clone)]
struct Family {
    name: String,
    help: &'static str,
    kind: Kind,
    samples: Vec<(String, f64)>,
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
        self.sample(name, help, Kind::Counter, labels, value as f64);
    }

    /// Add a sample of a counter kept in seconds (a float).
    pub fn counter_seconds(
        &mut self,
        name: &str,
        help: &'static str,
        labels: &[(&str, &str)],
        seconds: f64,
    ) {
        self.sample(name, help, Kind::Counter, labels, seconds);
    }

    /// Add what every process reports: its CPU time so far (user and system, all threads),
    /// under the name Prometheus's client libraries use.
    pub fn add_process_metrics(&mut self) {
        self.counter_seconds(
            "process_cpu_seconds_total",
            "CPU time the process has used, user and system, all threads.",
            &[],
            process_cpu_seconds(),
        );
    }

    /// Add a sample of a value that goes up and down.
    pub fn gauge(&mut self, name: &str, help: &'static str, labels: &[(&str, &str)], value: f64) {
        self.sample(name, help, Kind::Gauge, labels, value);
    }

    fn sample(
        &mut self,
        name: &str,
        help: &'static str,
        kind: Kind,
        labels: &[(&str, &str)],
        value: f64,
    ) {
        let labels = render_labels(labels);
        match self.families.iter_mut().find(|family| family.name == name) {
            Some(family) => family.samples.push((labels, value)),
            None => self.families.push(Family {
                name: name.to_owned(),
                help,
                kind,
                samples: vec![(labels, value)],
            }),
        }
    }

    /// The value of the sample `name` with exactly `labels`, if there is one.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let labels = render_labels(labels);
        self.families
            .iter()
            .find(|family| family.name == name)?
            .samples
            .iter()
            .find(|(sample_labels, _)| *sample_labels == labels)
            .map(|(_, value)| *value)
    }

    /// The sum of every sample of `name`.
    pub fn sum(&self, name: &str) -> f64 {
        self.families
            .iter()
            .filter(|family| family.name == name)
            .flat_map(|family| family.samples.iter().map(|(_, value)| *value))
            .sum()
    }

    /// The Prometheus text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        for family in &self.families {
            let kind = match family.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
            };
            let _ = writeln!(out, "# HELP {} {}", family.name, family.help);
            let _ = writeln!(out, "# TYPE {} {kind}", family.name);
            for (labels, value) in &family.samples {
                let _ = writeln!(out, "{}{labels} {value}", family.name);
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

/// The last published metrics text, shared between the loop and the endpoint.
#[derive(Debug, Clone, Default)]
pub struct MetricsBoard {
    text: Arc<Mutex<String>>,
}

impl MetricsBoard {
    pub fn new() -> MetricsBoard {
        MetricsBoard::default()
    }

    pub fn publish(&self, metrics: &Metrics) {
        let text = metrics.render();
        if let Ok(mut slot) = self.text.lock() {
            *slot = text;
        }
    }

    pub fn text(&self) -> String {
        self.text
            .lock()
            .map(|text| text.clone())
            .unwrap_or_default()
    }
}

/// Largest HTTP request head read from a scraper.
const MAX_REQUEST_LEN: usize = 8192;

/// Serve `board` over HTTP on `addr` (any path answers with the metrics) from a thread of its
/// own, until `shutdown`. Returns the bound address (useful with port 0).
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
    let body = board.text();
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
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
        shutdown.request();
    }
}
