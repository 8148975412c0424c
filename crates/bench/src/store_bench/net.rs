//! `--xdp`: the server's and the client's network namespaces, joined by a veth pair.

use std::net::Ipv4Addr;

/// Two network namespaces joined by a veth pair, removed when dropped: the server's (its end
/// `sv`, 10.78.0.2/24) and the client's (`cl`, 10.78.0.1/24).
pub(super) struct NetPair {
    pub(super) server_ns: String,
    pub(super) client_ns: String,
}

pub(super) const NET_SERVER_IF: &str = "sv";
pub(super) const NET_SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
const NET_CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 1);

impl NetPair {
    pub(super) fn up() -> Result<NetPair, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("--xdp makes network namespaces and attaches XDP: run as root".into());
        }
        remove_stale_pairs();
        let pid = std::process::id();
        let pair = NetPair {
            server_ns: format!("pmnet-sb-{pid}-s"),
            client_ns: format!("pmnet-sb-{pid}-c"),
        };
        let (s, c) = (pair.server_ns.as_str(), pair.client_ns.as_str());
        let server_cidr = format!("{NET_SERVER_IP}/24");
        let client_cidr = format!("{NET_CLIENT_IP}/24");
        for command in [
            vec!["netns", "add", s],
            vec!["netns", "add", c],
            vec![
                "-n",
                s,
                "link",
                "add",
                NET_SERVER_IF,
                "type",
                "veth",
                "peer",
                "name",
                "cl",
                "netns",
                c,
            ],
            vec!["-n", s, "addr", "add", &server_cidr, "dev", NET_SERVER_IF],
            vec!["-n", c, "addr", "add", &client_cidr, "dev", "cl"],
            vec!["-n", s, "link", "set", "lo", "up"],
            vec!["-n", c, "link", "set", "lo", "up"],
            vec!["-n", s, "link", "set", NET_SERVER_IF, "up"],
            vec!["-n", c, "link", "set", "cl", "up"],
        ] {
            ip(&command)?;
        }
        Ok(pair)
    }
}

/// Remove the namespaces of earlier runs whose process is gone (killed before its `Drop`).
fn remove_stale_pairs() {
    let Ok(entries) = std::fs::read_dir("/var/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("pmnet-sb-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

impl Drop for NetPair {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it, and so the pair.
        for ns in [&self.server_ns, &self.client_ns] {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Run `ip ARGS`; its error output on failure.
fn ip(args: &[&str]) -> Result<(), String> {
    let output = std::process::Command::new("ip")
        .args(args)
        .output()
        .map_err(|error| format!("cannot run `ip` (iproute2): {error}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Move the calling thread into network namespace `ns` (sockets it opens afterwards belong to
/// it).
pub(super) fn enter_netns(ns: &str) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let path = format!("/var/run/netns/{ns}");
    let file = std::fs::File::open(&path).map_err(|error| format!("{path}: {error}"))?;
    // SAFETY: setns with a descriptor we own for the call; it moves only this thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(format!("setns {path}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}
