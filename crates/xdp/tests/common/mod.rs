//! Shared by the veth tests: two network namespaces joined by a veth pair, entering a
//! namespace on a thread, and when to skip.

#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::Command;

use pmnet_xdp::XdpError;

pub const A_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
pub const B_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
pub const STEERED_PORT: u16 = 7000;
pub const KERNEL_PORT: u16 = 7001;

/// Runs `ip` with `args`; the error carries its stderr.
pub fn ip(args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Two namespaces joined by a veth pair; deleted on drop (which also deletes the veth).
pub struct Pair {
    pub ns_a: String,
    pub ns_b: String,
    pub dev_a: String,
    pub dev_b: String,
}

impl Pair {
    pub fn create(tag: &str) -> Result<Pair, String> {
        let pid = std::process::id();
        let pair = Pair {
            ns_a: format!("pmx{tag}a{pid}"),
            ns_b: format!("pmx{tag}b{pid}"),
            dev_a: format!("px{tag}a{pid}"),
            dev_b: format!("px{tag}b{pid}"),
        };
        ip(&["netns", "add", &pair.ns_a])?;
        ip(&["netns", "add", &pair.ns_b])?;
        #[rustfmt::skip]
        ip(&["link", "add", &pair.dev_a, "netns", &pair.ns_a, "type", "veth",
             "peer", "name", &pair.dev_b, "netns", &pair.ns_b])?;
        for (ns, dev, addr) in [
            (&pair.ns_a, &pair.dev_a, "10.77.0.1/24"),
            (&pair.ns_b, &pair.dev_b, "10.77.0.2/24"),
        ] {
            ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(pair)
    }

    pub fn mac(ns: &str, dev: &str) -> [u8; 6] {
        let out = ip(&["-n", ns, "link", "show", dev]).unwrap();
        let text = out
            .split("link/ether ")
            .nth(1)
            .expect("an Ethernet address");
        let mut mac = [0u8; 6];
        for (byte, hex) in mac
            .iter_mut()
            .zip(text.split_whitespace().next().unwrap().split(':'))
        {
            *byte = u8::from_str_radix(hex, 16).unwrap();
        }
        mac
    }

    pub fn xdp_attached(ns: &str, dev: &str) -> bool {
        ip(&["-n", ns, "link", "show", dev])
            .unwrap()
            .contains("prog/xdp")
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.ns_a]);
        let _ = ip(&["netns", "del", &self.ns_b]);
    }
}

/// Runs `f` on a thread that entered network namespace `ns`; sockets created there stay in it.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let file = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
                // SAFETY: setns on this thread only, with a namespace fd we hold open.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns {ns}: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap()
    })
}

/// Why the test cannot run here, if it cannot.
pub fn skip_reason() -> Option<String> {
    // SAFETY: geteuid never fails.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("`ip` (iproute2) is missing".into());
    }
    match pmnet_xdp::available() {
        Err(XdpError::NotBuilt(why)) => Some(format!("XDP program not built: {why}")),
        Err(e @ XdpError::Unsupported(_)) => Some(e.to_string()),
        _ => None,
    }
}
