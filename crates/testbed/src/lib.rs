//! A testbed of hosts on one machine, for multi-host tests and benchmarks of an in-path PMNet
//! device (docs/testbed.md): three network namespaces — a client, a device that routes between
//! the two others, and a server — joined by two veth pairs, with fixed addresses.
//!
//! ```text
//!  [NAME-c] client             [NAME-d] device (router)                [NAME-s] server
//!   eth0 10.77.1.2/24  <---->  cl 10.77.1.1/24 | sv 10.77.2.1/24  <---->  eth0 10.77.2.2/24
//!   default via 10.77.1.1      ip_forward=1                          default via 10.77.2.1
//! ```
//!
//! The addresses exist only inside the namespaces, so testbeds with different names coexist.
//! [`Testbed::up`] builds one (or finds it built), [`Testbed::down`] removes it,
//! [`Testbed::guard`] gives a value that removes it when dropped (for tests). Programs run on a
//! host with [`Testbed::command`] (`ip netns exec`); code in this process with
//! [`Testbed::run_in`] or [`Testbed::enter`] (setns on the calling thread).

mod error;
mod ip;
mod mac;
mod netns;

use std::ffi::OsStr;
use std::fmt;
use std::net::Ipv4Addr;
use std::process::Command;
use std::str::FromStr;
use std::sync::Mutex;

pub use error::TestbedError;
pub use mac::MacAddr;

/// The client's address (its `eth0`).
pub const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 77, 1, 2);
/// The device's address on the client's link (its `cl`): the client's gateway.
pub const DEVICE_CLIENT_SIDE: Ipv4Addr = Ipv4Addr::new(10, 77, 1, 1);
/// The device's address on the server's link (its `sv`): the server's gateway.
pub const DEVICE_SERVER_SIDE: Ipv4Addr = Ipv4Addr::new(10, 77, 2, 1);
/// The server's address (its `eth0`).
pub const SERVER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 77, 2, 2);
/// The prefix length of both links (10.77.1.0/24 and 10.77.2.0/24).
pub const PREFIX_LEN: u8 = 24;
/// The client's interface, the client end of the client link.
pub const CLIENT_IF: &str = "eth0";
/// The device's interface on the client link.
pub const DEVICE_CLIENT_IF: &str = "cl";
/// The device's interface on the server link.
pub const DEVICE_SERVER_IF: &str = "sv";
/// The server's interface, the server end of the server link.
pub const SERVER_IF: &str = "eth0";
/// The MTU of every veth (native XDP on veth needs it at most about 3.5 KB).
pub const MTU: u32 = 1500;
/// The name `pmnet testbed` uses when none is given.
pub const DEFAULT_NAME: &str = "pmnet";

/// The longest testbed name accepted.
const MAX_NAME_LEN: usize = 64;

/// The files under /proc/sys set in every namespace (when present): no IPv6, so nothing but
/// the test's own traffic (no router solicitations, no MLD reports) crosses the links.
const NO_IPV6: [&str; 2] = [
    "/proc/sys/net/ipv6/conf/all/disable_ipv6",
    "/proc/sys/net/ipv6/conf/default/disable_ipv6",
];
/// The file that makes the device a router.
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// `ip netns add` run by two threads at once, the first time on a machine, can both mount the
/// namespace directory: one at a time in this process.
static NETNS_ADD: Mutex<()> = Mutex::new(());

/// One host of the testbed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Host {
    /// The client host: `eth0` 10.77.1.2, default route via the device.
    Client,
    /// The device host, a router between the client link (`cl`) and the server link (`sv`).
    Device,
    /// The server host: `eth0` 10.77.2.2, default route via the device.
    Server,
}

impl Host {
    /// The three hosts.
    pub const ALL: [Host; 3] = [Host::Client, Host::Device, Host::Server];

    /// The network namespace of this host in testbed `name`: `NAME-c`, `NAME-d` or `NAME-s`.
    pub fn netns(&self, name: &str) -> String {
        let suffix = match self {
            Host::Client => 'c',
            Host::Device => 'd',
            Host::Server => 's',
        };
        format!("{name}-{suffix}")
    }

    /// "client", "device" or "server".
    pub fn as_str(&self) -> &'static str {
        match self {
            Host::Client => "client",
            Host::Device => "device",
            Host::Server => "server",
        }
    }

    /// The gateway of this host's default route (none for the device).
    pub fn gateway(&self) -> Option<Ipv4Addr> {
        match self {
            Host::Client => Some(DEVICE_CLIENT_SIDE),
            Host::Device => None,
            Host::Server => Some(DEVICE_SERVER_SIDE),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Host {
    type Err = String;

    fn from_str(text: &str) -> Result<Host, String> {
        Host::ALL
            .into_iter()
            .find(|host| host.as_str() == text)
            .ok_or_else(|| format!("{text:?} is not a host: client, device or server"))
    }
}

/// One interface of a testbed as it is: its host, name, address and MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interface {
    /// The host it is on.
    pub host: Host,
    /// Its name inside the host's namespace.
    pub name: &'static str,
    /// Its IPv4 address.
    pub addr: Ipv4Addr,
    /// The prefix length of its address.
    pub prefix_len: u8,
    /// Its MAC address (chosen by the kernel when the testbed was built).
    pub mac: MacAddr,
}

/// The interfaces of every testbed, client link first: host, name, address.
pub const LAYOUT: [(Host, &str, Ipv4Addr); 4] = [
    (Host::Client, CLIENT_IF, CLIENT_ADDR),
    (Host::Device, DEVICE_CLIENT_IF, DEVICE_CLIENT_SIDE),
    (Host::Device, DEVICE_SERVER_IF, DEVICE_SERVER_SIDE),
    (Host::Server, SERVER_IF, SERVER_ADDR),
];

/// Check that `name` can name a testbed: 1 to 64 ASCII letters, digits, `-`, `_` and `.`, not
/// starting with `-` or `.` (it becomes file names under /var/run/netns).
pub fn check_name(name: &str) -> Result<(), TestbedError> {
    let reason = if name.is_empty() {
        Some("it is empty")
    } else if name.len() > MAX_NAME_LEN {
        Some("it is longer than 64 characters")
    } else if name.starts_with(['-', '.']) {
        Some("it starts with '-' or '.'")
    } else if !name
        .bytes()
        .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.'))
    {
        Some("only ASCII letters, digits, '-', '_' and '.' are allowed")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(TestbedError::InvalidName {
            name: name.to_owned(),
            reason,
        }),
        None => Ok(()),
    }
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether testbeds can be built here: running as root, `ip` installed, and a network
/// namespace can be made (and is removed again). Tests skip with this error's message when it
/// fails.
pub fn available() -> Result<(), TestbedError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static PROBES: AtomicU32 = AtomicU32::new(0);
    if !is_root() {
        return Err(TestbedError::NotRoot);
    }
    ip::run(&["-V"])?;
    let probe = format!(
        "pmnet-probe-{}-{}",
        std::process::id(),
        PROBES.fetch_add(1, Ordering::Relaxed)
    );
    add_netns(&probe)?;
    ip::run(&["netns", "delete", &probe])?;
    Ok(())
}

/// The names of the network namespaces on this machine (`ip netns list`).
pub fn netns_list() -> Result<Vec<String>, TestbedError> {
    ip::run(&["netns", "list"]).map(|output| ip::parse_netns_list(&output))
}

fn add_netns(netns: &str) -> Result<(), TestbedError> {
    let _one_at_a_time = NETNS_ADD
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    ip::run(&["netns", "add", netns]).map(drop)
}

/// A testbed that is up: its name and its interfaces as they are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Testbed {
    name: String,
    interfaces: [Interface; 4],
}

impl Testbed {
    /// Build testbed `name`, or return it if it is already up as it should be. One that is
    /// only partly there (an earlier `up` interrupted, an interface deleted) is removed and
    /// built again. Needs root. Testbeds of different names can be built at once, from any
    /// threads or processes; `up` and `down` of one name must not run at the same time.
    pub fn up(name: &str) -> Result<Testbed, TestbedError> {
        match Testbed::open(name) {
            Ok(testbed) => return Ok(testbed),
            Err(TestbedError::NotUp { .. }) => {}
            Err(TestbedError::Incomplete { problem, .. }) => {
                tracing::info!("testbed {name} is only partly set up ({problem}): rebuilding it");
                Testbed::down(name)?;
            }
            Err(error) => return Err(error),
        }
        if let Err(error) = build(name) {
            // Leave nothing half-built behind; the first error is the one to report.
            if let Err(cleanup) = Testbed::down(name) {
                tracing::warn!("removing the half-built testbed {name}: {cleanup}");
            }
            return Err(error);
        }
        Testbed::open(name)
    }

    /// Testbed `name` as it is, checked: every namespace, interface, address and route in
    /// place and up, and the device forwarding. [`TestbedError::NotUp`] when none of its
    /// namespaces exists, [`TestbedError::Incomplete`] when something is missing or wrong.
    pub fn open(name: &str) -> Result<Testbed, TestbedError> {
        check_name(name)?;
        if !is_root() {
            return Err(TestbedError::NotRoot);
        }
        let missing: Vec<String> = Host::ALL
            .iter()
            .map(|host| host.netns(name))
            .filter(|netns| !netns::exists(netns))
            .collect();
        if missing.len() == Host::ALL.len() {
            return Err(TestbedError::NotUp {
                name: name.to_owned(),
            });
        }
        let incomplete = |problem: String| TestbedError::Incomplete {
            name: name.to_owned(),
            problem,
        };
        if !missing.is_empty() {
            return Err(incomplete(format!(
                "network namespace {} is missing",
                missing.join(" and ")
            )));
        }
        // A check whose `ip` command fails (no such device, say) finds the testbed incomplete;
        // an `ip` that cannot run at all is its own error.
        let checked = |result: Result<String, TestbedError>| match result {
            Err(error @ TestbedError::Command { .. }) => Err(incomplete(error.to_string())),
            other => other,
        };
        for host in Host::ALL {
            let netns = host.netns(name);
            let lo = checked(ip::run(&["-n", &netns, "-o", "link", "show", "dev", "lo"]))?;
            if !ip::parse_link_up(&lo) {
                return Err(incomplete(format!("lo is down in {netns}")));
            }
            if let Some(gateway) = host.gateway() {
                let routes = checked(ip::run(&["-n", &netns, "-4", "route", "show", "default"]))?;
                if ip::parse_default_gateway(&routes) != Some(gateway) {
                    return Err(incomplete(format!(
                        "{netns} has no default route via {gateway}"
                    )));
                }
            }
        }
        let device = Host::Device.netns(name);
        let forwarding = netns::sysctl(&device, IP_FORWARD)?;
        if forwarding != "1" {
            return Err(incomplete(format!(
                "{device} does not forward (ip_forward is {forwarding})"
            )));
        }
        let mut interfaces = [Interface {
            host: Host::Client,
            name: CLIENT_IF,
            addr: CLIENT_ADDR,
            prefix_len: PREFIX_LEN,
            mac: MacAddr::default(),
        }; 4];
        for (interface, (host, ifname, addr)) in interfaces.iter_mut().zip(LAYOUT) {
            let netns = host.netns(name);
            let show = ["-n", &netns, "-o", "link", "show", "dev", ifname];
            let link = checked(ip::run(&show))?;
            if !ip::parse_link_up(&link) || !ip::parse_lower_up(&link) {
                return Err(incomplete(format!("{ifname} in {netns} is not up")));
            }
            let mac = ip::parse_mac(&link).ok_or_else(|| TestbedError::Output {
                command: ip::command_line("ip", &show),
                problem: "no link/ether address".to_owned(),
                output: link.clone(),
            })?;
            let addrs = checked(ip::run(&[
                "-n", &netns, "-o", "-4", "addr", "show", "dev", ifname,
            ]))?;
            if !ip::parse_ipv4_addrs(&addrs).contains(&(addr, PREFIX_LEN)) {
                return Err(incomplete(format!(
                    "{ifname} in {netns} does not have {addr}/{PREFIX_LEN}"
                )));
            }
            *interface = Interface {
                host,
                name: ifname,
                addr,
                prefix_len: PREFIX_LEN,
                mac,
            };
        }
        Ok(Testbed {
            name: name.to_owned(),
            interfaces,
        })
    }

    /// Remove testbed `name`: delete its namespaces, and with them its links. Nothing to do
    /// (and no error) when it is not there. A process still running inside a namespace keeps
    /// that namespace alive, unnamed, until it exits; a new testbed of the same name is
    /// separate from it.
    pub fn down(name: &str) -> Result<(), TestbedError> {
        check_name(name)?;
        if !is_root() {
            return Err(TestbedError::NotRoot);
        }
        for host in Host::ALL {
            let netns = host.netns(name);
            if netns::exists(&netns) {
                ip::run(&["netns", "delete", &netns])?;
            }
        }
        Ok(())
    }

    /// Bring testbed `name` up and return a guard that takes it down when dropped (a test's
    /// testbed, removed even when the test panics).
    pub fn guard(name: &str) -> Result<TestbedGuard, TestbedError> {
        Testbed::up(name).map(|testbed| TestbedGuard { testbed })
    }

    /// Whether anything of testbed `name` is on this machine: any of its namespaces. (Whether
    /// it is whole and up: [`Testbed::open`].)
    pub fn exists(name: &str) -> bool {
        check_name(name).is_ok()
            && Host::ALL
                .iter()
                .any(|host| netns::exists(&host.netns(name)))
    }

    /// The testbed's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The network namespace of `host`.
    pub fn netns(&self, host: Host) -> String {
        host.netns(&self.name)
    }

    /// The four interfaces: client `eth0`, device `cl` and `sv`, server `eth0`.
    pub fn interfaces(&self) -> &[Interface; 4] {
        &self.interfaces
    }

    /// The interface called `ifname` on `host`.
    pub fn interface(&self, host: Host, ifname: &str) -> Option<&Interface> {
        self.interfaces
            .iter()
            .find(|interface| interface.host == host && interface.name == ifname)
    }

    /// The MAC address of the interface called `ifname` on `host`.
    pub fn mac(&self, host: Host, ifname: &str) -> Option<MacAddr> {
        self.interface(host, ifname).map(|interface| interface.mac)
    }

    /// A command that runs `program` on `host` (`ip netns exec NS program`): add its
    /// arguments, then spawn it. It inherits this process's stdio unless told otherwise.
    pub fn command(&self, host: Host, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec"])
            .arg(self.netns(host))
            .arg(program);
        command
    }

    /// Move the calling thread into `host`'s network namespace (setns), for good: sockets it
    /// opens from then on are that host's. Use it on a thread of its own (or see
    /// [`Testbed::run_in`]).
    pub fn enter(&self, host: Host) -> Result<(), TestbedError> {
        netns::enter(&self.netns(host))
    }

    /// Run `work` on a new thread inside `host`'s network namespace and return its result; the
    /// calling thread stays where it is. Sockets made in `work` stay the host's when returned.
    pub fn run_in<T: Send>(
        &self,
        host: Host,
        work: impl FnOnce() -> T + Send,
    ) -> Result<T, TestbedError> {
        netns::run_in(&self.netns(host), work)
    }
}

/// A testbed that is taken down when this is dropped; derefs to the [`Testbed`].
#[derive(Debug)]
pub struct TestbedGuard {
    testbed: Testbed,
}

impl TestbedGuard {
    /// The testbed, left up: the guard no longer takes it down.
    pub fn keep(self) -> Testbed {
        let this = std::mem::ManuallyDrop::new(self);
        this.testbed.clone()
    }
}

impl std::ops::Deref for TestbedGuard {
    type Target = Testbed;

    fn deref(&self) -> &Testbed {
        &self.testbed
    }
}

impl Drop for TestbedGuard {
    fn drop(&mut self) {
        if let Err(error) = Testbed::down(&self.testbed.name) {
            eprintln!(
                "pmnet-testbed: taking testbed {} down: {error}",
                self.testbed.name
            );
        }
    }
}

/// Build testbed `name` from nothing.
fn build(name: &str) -> Result<(), TestbedError> {
    let [client, device, server] = Host::ALL.map(|host| host.netns(name));
    for netns in [&client, &device, &server] {
        add_netns(netns)?;
        for path in NO_IPV6 {
            // A kernel without IPv6 has no such file: nothing to turn off.
            if let Err(error) = netns::set_sysctl(netns, path) {
                tracing::debug!("{error}");
            }
        }
        ip::run(&["-n", netns, "link", "set", "dev", "lo", "up"])?;
    }
    netns::set_sysctl(&device, IP_FORWARD)?;
    let mtu = MTU.to_string();
    // Each veth pair is made inside the device's namespace with its peer put straight into
    // the other host's: no interface ever appears in the caller's namespace, so no temporary
    // names there can clash with another testbed's or be left behind.
    for (peer, local_if, peer_if) in [
        (&client, DEVICE_CLIENT_IF, CLIENT_IF),
        (&server, DEVICE_SERVER_IF, SERVER_IF),
    ] {
        ip::run(&[
            "-n", &device, "link", "add", local_if, "mtu", &mtu, "type", "veth", "peer", "name",
            peer_if, "mtu", &mtu, "netns", peer,
        ])?;
    }
    for (host, ifname, addr) in LAYOUT {
        let netns = host.netns(name);
        let cidr = format!("{addr}/{PREFIX_LEN}");
        ip::run(&["-n", &netns, "addr", "add", &cidr, "dev", ifname])?;
        ip::run(&["-n", &netns, "link", "set", "dev", ifname, "up"])?;
    }
    for host in [Host::Client, Host::Server] {
        if let Some(gateway) = host.gateway() {
            let via = gateway.to_string();
            let netns = host.netns(name);
            ip::run(&["-n", &netns, "route", "add", "default", "via", &via])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_namespaces() {
        assert_eq!(Host::Client.netns("pmnet"), "pmnet-c");
        assert_eq!(Host::Device.netns("tb-7"), "tb-7-d");
        assert_eq!(Host::Server.netns("x"), "x-s");
        for host in Host::ALL {
            assert_eq!(host.as_str().parse::<Host>(), Ok(host));
            assert_eq!(host.to_string(), host.as_str());
        }
        assert!("router".parse::<Host>().is_err());
    }

    #[test]
    fn checks_names() {
        for good in ["pmnet", "t-123", "a.b_c", "X9", &"n".repeat(64)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "-x", ".x", "a/b", "a b", "é", &"n".repeat(65)] {
            let error = check_name(bad).unwrap_err();
            assert!(
                matches!(error, TestbedError::InvalidName { .. }),
                "{bad}: {error}"
            );
        }
        assert!(!Testbed::exists("../etc"));
    }

    #[test]
    fn lays_out_two_links() {
        // Each link's two ends share a /24; the two links do not.
        let net = |addr: Ipv4Addr| u32::from(addr) >> (32 - PREFIX_LEN);
        assert_eq!(net(CLIENT_ADDR), net(DEVICE_CLIENT_SIDE));
        assert_eq!(net(SERVER_ADDR), net(DEVICE_SERVER_SIDE));
        assert_ne!(net(CLIENT_ADDR), net(SERVER_ADDR));
        assert_eq!(Host::Client.gateway(), Some(DEVICE_CLIENT_SIDE));
        assert_eq!(Host::Server.gateway(), Some(DEVICE_SERVER_SIDE));
        assert_eq!(Host::Device.gateway(), None);
        assert_eq!(
            LAYOUT
                .iter()
                .filter(|(host, ..)| *host == Host::Device)
                .count(),
            2
        );
    }
}
