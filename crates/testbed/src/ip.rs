//! Running `ip` (iproute2) and reading what it prints.

use std::net::Ipv4Addr;
use std::process::{Command, ExitStatus};

use crate::{MacAddr, TestbedError};

/// Run `ip ARGS...` and return its standard output; an error says which command failed and
/// what it wrote to stderr.
pub(crate) fn run(args: &[&str]) -> Result<String, TestbedError> {
    let command = command_line("ip", args);
    tracing::debug!("{command}");
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|source| TestbedError::Spawn {
            command: command.clone(),
            hint: if source.kind() == std::io::ErrorKind::NotFound {
                "; is iproute2 installed (the `ip` command)?"
            } else {
                ""
            },
            source,
        })?;
    if !output.status.success() {
        return Err(TestbedError::Command {
            command,
            status: status_text(output.status),
            stderr: stderr_text(&output.stderr),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A command line as a user would type it.
pub(crate) fn command_line(program: &str, args: &[&str]) -> String {
    let mut line = program.to_owned();
    for arg in args {
        line.push(' ');
        line.push_str(arg);
    }
    line
}

/// An exit status in words: "exit status 2" or "killed by signal 9".
pub(crate) fn status_text(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    }
}

/// What a command wrote to stderr, trimmed, or a note that it wrote nothing.
pub(crate) fn stderr_text(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr).trim().to_owned();
    if text.is_empty() {
        "it wrote nothing to stderr".to_owned()
    } else {
        text
    }
}

/// The names in the output of `ip netns list` (lines like `pmnet-c (id: 3)` or `pmnet-c`).
pub(crate) fn parse_netns_list(output: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The IPv4 addresses with their prefix lengths in the output of `ip -o -4 addr show`
/// (`2: eth0    inet 10.77.1.2/24 scope global eth0\       valid_lft forever ...`).
pub(crate) fn parse_ipv4_addrs(output: &str) -> Vec<(Ipv4Addr, u8)> {
    let mut found = Vec::new();
    let mut words = output.split_whitespace();
    while let Some(word) = words.next() {
        if word != "inet" {
            continue;
        }
        let Some((addr, prefix)) = words.next().and_then(|cidr| cidr.split_once('/')) else {
            continue;
        };
        if let (Ok(addr), Ok(prefix)) = (addr.parse(), prefix.parse()) {
            found.push((addr, prefix));
        }
    }
    found
}

/// The MAC address in the output of `ip -o link show dev IF` (`... link/ether 12:75:... brd
/// ff:ff:...`).
pub(crate) fn parse_mac(output: &str) -> Option<MacAddr> {
    let mut words = output.split_whitespace();
    while let Some(word) = words.next() {
        if word == "link/ether" {
            return words.next()?.parse().ok();
        }
    }
    None
}

/// Whether the link in the output of `ip -o link show dev IF` is administratively up (its
/// flags, `<BROADCAST,MULTICAST,UP,LOWER_UP>`, hold UP).
pub(crate) fn parse_link_up(output: &str) -> bool {
    flags(output).any(|flag| flag == "UP")
}

/// Whether the link in the output of `ip -o link show dev IF` has a carrier (LOWER_UP: for a
/// veth, its peer is up too).
pub(crate) fn parse_lower_up(output: &str) -> bool {
    flags(output).any(|flag| flag == "LOWER_UP")
}

fn flags(output: &str) -> impl Iterator<Item = &str> {
    let inside = output
        .split_once('<')
        .and_then(|(_, rest)| rest.split_once('>'))
        .map_or("", |(flags, _)| flags);
    inside.split(',').filter(|flag| !flag.is_empty())
}

/// The gateway of the default route in the output of `ip -4 route show default`
/// (`default via 10.77.1.1 dev eth0`).
pub(crate) fn parse_default_gateway(output: &str) -> Option<Ipv4Addr> {
    output.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        if words.next()? != "default" {
            return None;
        }
        while let Some(word) = words.next() {
            if word == "via" {
                return words.next()?.parse().ok();
            }
        }
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINK: &str = "2: cl@if2: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue \
        state UP mode DEFAULT group default qlen 1000\\    link/ether 12:75:75:a6:dd:90 brd \
        ff:ff:ff:ff:ff:ff link-netns tt-b\n";

    #[test]
    fn reads_netns_list() {
        let output = "pmnet-s (id: 2)\npmnet-d (id: 1)\nother\n\n";
        assert_eq!(parse_netns_list(output), ["pmnet-s", "pmnet-d", "other"]);
        assert!(parse_netns_list("").is_empty());
    }

    #[test]
    fn reads_addresses() {
        let output = "2: eth0    inet 10.77.1.2/24 scope global eth0\\       valid_lft forever \
                      preferred_lft forever\n3: eth1    inet 192.168.0.9/16 brd 192.168.255.255 \
                      scope global eth1\n";
        assert_eq!(
            parse_ipv4_addrs(output),
            [
                (Ipv4Addr::new(10, 77, 1, 2), 24),
                (Ipv4Addr::new(192, 168, 0, 9), 16)
            ]
        );
        assert!(parse_ipv4_addrs("").is_empty());
        assert!(parse_ipv4_addrs("inet garbage inet").is_empty());
    }

    #[test]
    fn reads_links() {
        assert_eq!(
            parse_mac(LINK),
            Some(MacAddr([0x12, 0x75, 0x75, 0xa6, 0xdd, 0x90]))
        );
        assert!(parse_link_up(LINK));
        assert!(parse_lower_up(LINK));
        let down = "2: eth0@if2: <BROADCAST,MULTICAST> mtu 1500 qdisc noop state DOWN";
        assert!(!parse_link_up(down));
        assert!(!parse_lower_up(down));
        let no_carrier = "2: eth0@if2: <NO-CARRIER,BROADCAST,MULTICAST,UP> mtu 1500";
        assert!(parse_link_up(no_carrier));
        assert!(!parse_lower_up(no_carrier));
        let lo = "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 link/loopback 00:00:00:00:00:00";
        assert!(parse_link_up(lo));
        assert_eq!(parse_mac(lo), None);
        assert_eq!(parse_mac(""), None);
    }

    #[test]
    fn reads_default_routes() {
        assert_eq!(
            parse_default_gateway("default via 10.77.1.1 dev eth0 \n"),
            Some(Ipv4Addr::new(10, 77, 1, 1))
        );
        assert_eq!(
            parse_default_gateway("10.77.1.0/24 dev eth0 proto kernel scope link\n"),
            None
        );
        assert_eq!(parse_default_gateway("default dev eth0 scope link\n"), None);
        assert_eq!(parse_default_gateway(""), None);
    }

    #[test]
    fn names_commands_and_statuses() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            command_line("ip", &["netns", "add", "x-c"]),
            "ip netns add x-c"
        );
        assert_eq!(status_text(ExitStatus::from_raw(2 << 8)), "exit status 2");
        assert_eq!(status_text(ExitStatus::from_raw(9)), "killed by signal 9");
        assert_eq!(
            stderr_text(b"  RTNETLINK answers: File exists\n"),
            "RTNETLINK answers: File exists"
        );
        assert_eq!(stderr_text(b"\n"), "it wrote nothing to stderr");
    }
}
