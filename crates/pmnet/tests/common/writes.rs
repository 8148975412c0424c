//! Clients writing under load through `pmnet client` sessions that read their requests from
//! standard input (the failover tests): which writes were acknowledged and when, the longest
//! wait across a failure, and every acknowledged write read back.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{pmnet_bin, poll_until};

/// A `pmnet client ARGS` session: one request a line in, one answer a line out.
pub struct Session {
    child: Child,
    input: Option<ChildStdin>,
    output: BufReader<ChildStdout>,
}

impl Session {
    pub fn start(args: &[String]) -> Session {
        let mut child = Command::new(pmnet_bin())
            .arg("client")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a client");
        let input = child.stdin.take();
        let output = BufReader::new(child.stdout.take().expect("stdout"));
        Session {
            child,
            input,
            output,
        }
    }

    /// Send `request` (`set k v`, `get k`, `incr k`) and return the answer's line.
    pub fn ask(&mut self, request: &str) -> String {
        let input = self.input.as_mut().expect("stdin");
        writeln!(input, "{request}").expect("write a request");
        let mut line = String::new();
        self.output.read_line(&mut line).expect("read a reply");
        line
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // End of input ends the session.
        drop(self.input.take());
        let _ = self.child.wait();
    }
}

/// The arguments of a session to `first` that follows `controllers`.
pub fn following(first: SocketAddr, controllers: &[SocketAddr]) -> Vec<String> {
    let mut args = vec!["--device".to_owned(), first.to_string()];
    for controller in controllers {
        args.extend(["--controller".to_owned(), controller.to_string()]);
    }
    args
}

/// One client session's writes: (key, value, acknowledged at), and the errors it printed.
#[derive(Debug, Default)]
pub struct Writes {
    pub acked: Vec<(String, String, Instant)>,
    pub errors: Vec<String>,
}

/// A session (`args`) writing keys `c{client}-{n}` until `stop`.
pub fn writer(
    client: usize,
    args: Vec<String>,
    stop: Arc<AtomicBool>,
    writes: Arc<Mutex<Writes>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut session = Session::start(&args);
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let (key, value) = (format!("c{client}-{n}"), format!("v{n}"));
            let line = session.ask(&format!("set {key} {value}"));
            let mut writes = writes.lock().unwrap();
            if line.starts_with("OK") {
                writes.acked.push((key, value, Instant::now()));
            } else {
                writes.errors.push(format!("{key}: {line}"));
            }
        }
    })
}

/// Wait until every client acknowledged `more` writes after `since`.
pub fn wait_for_writes(writes: &Arc<Mutex<Writes>>, clients: usize, since: Instant, more: usize) {
    poll_until("writes acknowledged after the failure", || {
        let writes = writes.lock().unwrap();
        let counts: Vec<usize> = (0..clients)
            .map(|client| {
                writes
                    .acked
                    .iter()
                    .filter(|(key, _, at)| *at > since && key.starts_with(&format!("c{client}-")))
                    .count()
            })
            .collect();
        if counts.iter().all(|count| *count >= more) {
            Ok(())
        } else {
            Err(format!(
                "acked per client since: {counts:?}; errors {:?}",
                writes.errors
            ))
        }
    });
}

/// The longest any client went without an acknowledgement across `since` (the outage a
/// failure cost, as the clients saw it).
pub fn outage(writes: &Arc<Mutex<Writes>>, clients: usize, since: Instant) -> Duration {
    let writes = writes.lock().unwrap();
    (0..clients)
        .map(|client| {
            let times: Vec<Instant> = writes
                .acked
                .iter()
                .filter(|(key, _, _)| key.starts_with(&format!("c{client}-")))
                .map(|(_, _, at)| *at)
                .collect();
            times
                .windows(2)
                .filter(|pair| pair[1] > since)
                .map(|pair| pair[1] - pair[0].max(since))
                .max()
                .unwrap_or_default()
        })
        .max()
        .unwrap_or_default()
}

/// Every acknowledged write read back through `reader` with its value.
pub fn read_back(reader: &mut Session, writes: &Writes) {
    for (key, value, _) in &writes.acked {
        let line = reader.ask(&format!("get {key}"));
        // (Who answered it follows the value: a device's cache or the server.)
        let read = line.trim().rsplit_once(" (from ").map(|(read, _)| read);
        assert_eq!(
            read,
            Some(value.as_str()),
            "{key}: acknowledged, then read back as {line:?}"
        );
    }
}
