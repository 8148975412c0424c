//! What the benchmark reads from the processes it measures: the medium of a running device or
//! server from its metrics endpoint, and what an in-process device and server counted, as notes.

use std::net::SocketAddr;
use std::time::Duration;

use pmnet_runtime::Metrics;

use super::plan::ExternalTargets;
use super::system::SystemCounters;

/// The labels of the first sample of `name` in a Prometheus text, unescaped.
fn sample_labels(text: &str, name: &str) -> Option<Vec<(String, String)>> {
    let prefix = format!("{name}{{");
    let line = text.lines().find(|line| line.starts_with(&prefix))?;
    let mut labels = Vec::new();
    let mut chars = line[prefix.len()..].chars();
    loop {
        let mut key = String::new();
        for c in chars.by_ref() {
            match c {
                '=' => break,
                '}' => return Some(labels),
                ',' => {}
                c => key.push(c),
            }
        }
        if chars.next() != Some('"') {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        labels.push((key, value));
    }
}

/// "medium via flush; guarantee" from the `*_info` gauge of a running process's metrics.
fn medium_from_metrics(text: &str, info: &str) -> Option<String> {
    let labels = sample_labels(text, info)?;
    let get = |key: &str| {
        labels
            .iter()
            .find(|(name, _)| name == key)
            .map(|(_, value)| value.as_str())
    };
    match (get("medium")?, get("flush"), get("guarantee")) {
        ("none", _, guarantee) => Some(format!("none: {}", guarantee.unwrap_or("nothing kept"))),
        (medium, Some(flush), Some(guarantee)) => {
            Some(format!("{medium} via {flush}; {guarantee}"))
        }
        (medium, _, _) => Some(medium.to_owned()),
    }
}

/// The media of running processes, from their metrics endpoints where given.
pub fn external_media(targets: &ExternalTargets) -> Result<(String, String), String> {
    let read = |addr: Option<SocketAddr>, info: &str, what: &str| -> Result<String, String> {
        let Some(addr) = addr else {
            return Ok(format!(
                "unknown: an external {what} (its start-up banner says; pass --{what}-metrics \
                 ADDR to have it read here)"
            ));
        };
        let text = pmnet_runtime::metrics::scrape(addr, Duration::from_secs(5))
            .map_err(|error| format!("cannot read the {what}'s metrics at {addr}: {error}"))?;
        medium_from_metrics(&text, info).ok_or_else(|| {
            format!("the metrics at {addr} have no {info} sample: is that a pmnet {what}?")
        })
    };
    Ok((
        read(targets.device_metrics, "pmnet_device_info", "device")?,
        read(targets.server_metrics, "pmnet_server_info", "server")?,
    ))
}

/// The value of a counter, 0 if absent.
fn counter(metrics: &Metrics, name: &str, labels: &[(&str, &str)]) -> u64 {
    metrics.value(name, labels).unwrap_or(0.0) as u64
}

/// A counter added up over several processes' (or workers') metrics.
fn counter_sum(all: &[Metrics], name: &str, labels: &[(&str, &str)]) -> u64 {
    all.iter()
        .map(|metrics| counter(metrics, name, labels))
        .sum()
}

impl SystemCounters {
    /// What is worth telling about a mode's run, in a few short phrases.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if !self.device.is_empty() {
            let device = &self.device;
            let pmnet = [("port", "pmnet")];
            let received = counter_sum(device, "pmnet_device_updates_received_total", &pmnet);
            if received > 0 {
                let logged = counter_sum(device, "pmnet_device_updates_logged_total", &pmnet);
                notes.push(format!(
                    "device{}: {logged} of {received} updates logged and acked early ({} log \
                     full, {} slot collisions, {} resent after a timeout)",
                    if device.len() > 1 {
                        format!(" ({} workers)", device.len())
                    } else {
                        String::new()
                    },
                    counter_sum(device, "pmnet_device_log_full_total", &pmnet),
                    counter_sum(device, "pmnet_device_log_collisions_total", &pmnet),
                    counter_sum(device, "pmnet_device_resend_timeouts_total", &pmnet),
                ));
            }
            let computed = counter_sum(
                device,
                "pmnet_device_seals_total",
                &[("port", "pmnet"), ("mac", "computed")],
            );
            let reused = counter_sum(
                device,
                "pmnet_device_seals_total",
                &[("port", "pmnet"), ("mac", "reused")],
            );
            if computed + reused > 0 {
                notes.push(format!(
                    "device sealed {} datagrams: {computed} with a MAC computed, {reused} \
                     forwarded with the trailer they came with",
                    computed + reused
                ));
            }
            let dropped: f64 = device
                .iter()
                .map(|metrics| {
                    metrics.sum("pmnet_device_dropped_all_total")
                        + metrics.sum("pmnet_socket_dropped_total")
                })
                .sum();
            if dropped > 0.0 {
                notes.push(format!("device dropped {dropped:.0} datagrams"));
            }
        }
        if !self.servers.is_empty() {
            let servers = &self.servers;
            let total = |name: &str| -> u64 {
                servers
                    .iter()
                    .map(|server| counter(server, name, &[]))
                    .sum()
            };
            let applied = total("pmnet_server_requests_applied_total");
            let compactions = total("pmnet_store_compactions_total");
            let gaps = total("pmnet_server_retransmit_requests_sent_total");
            let duplicates = total("pmnet_server_makeup_acks_sent_total")
                + total("pmnet_server_duplicates_in_progress_total");
            let dropped: f64 = servers
                .iter()
                .map(|server| {
                    server.sum("pmnet_server_dropped_total")
                        + server.sum("pmnet_socket_dropped_total")
                })
                .sum();
            let mut note = match servers.len() {
                1 => format!("server: {applied} requests applied"),
                count => format!("{count} servers: {applied} requests applied"),
            };
            let cache_reads = total("pmnet_server_cache_reads_answered_total");
            if cache_reads > 0 {
                note.push_str(&format!(", {cache_reads} cache reads answered"));
            }
            if duplicates > 0 {
                note.push_str(&format!(", {duplicates} duplicates answered or ignored"));
            }
            if compactions > 0 {
                note.push_str(&format!(", {compactions} store compactions"));
            }
            if gaps > 0 {
                note.push_str(&format!(", {gaps} retransmission requests for gaps"));
            }
            if dropped > 0.0 {
                note.push_str(&format!(", {dropped:.0} datagrams dropped"));
            }
            notes.push(note);
        }
        notes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_medium_of_a_running_process_is_read_from_its_metrics() {
        let text = "# HELP pmnet_device_info x\n# TYPE pmnet_device_info gauge\n\
                    pmnet_device_info{device_id=\"1\",medium=\"emulated-pm\",\
                    flush=\"clwb+sfence\",guarantee=\"durable across process crash, NOT \
                    power loss (\\\"DRAM\\\")\",wait=\"blocking\"} 1\n";
        assert_eq!(
            medium_from_metrics(text, "pmnet_device_info").unwrap(),
            "emulated-pm via clwb+sfence; durable across process crash, NOT power loss \
             (\"DRAM\")"
        );
        let ideal = "pmnet_server_info{server_id=\"1\",application=\"ideal\",medium=\"none\",\
                     flush=\"none\",guarantee=\"nothing kept\",wait=\"blocking\"} 1\n";
        assert_eq!(
            medium_from_metrics(ideal, "pmnet_server_info").unwrap(),
            "none: nothing kept"
        );
        assert!(medium_from_metrics("pmnet_other 1\n", "pmnet_device_info").is_none());
        assert!(medium_from_metrics("pmnet_device_info{medium=\"x", "pmnet_device_info").is_none());
    }
}
