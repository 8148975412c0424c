//! The packet store's AF_XDP receive path (`pmnet server --engine packet --xdp IFACE`,
//! docs/inpath.md, "The packet store on AF_XDP"): an XDP program on the interface steers the
//! datagrams addressed to the server's listen address and port to an AF_XDP socket whose UMEM
//! is the store's data area ([`pmnet_pktstore::xsk_recv`]), so an update frame is written by the kernel into the slot
//! where it stays as the record. Everything not steered (other addresses, IP fragments, ARP,
//! ICMP) goes to the kernel and reaches the UDP socket as before; replies leave through the
//! UDP socket.
//!
//! When the store has too few free slots to keep the fill ring supplied (it is full), frames
//! would be dropped once the ring is empty, and no delete could reach the store to make room:
//! steering is then switched off, so datagrams go to the UDP socket (whose receive path copies
//! what does not fit into DRAM) until the fill ring is half full again.

use std::ffi::CString;
use std::net::{Ipv4Addr, SocketAddrV4};

use pmnet_pktstore::xsk_recv::{
    XskReceiveConfig, XskReceiveError, XskSlotReceiver, DEFAULT_FILL_TARGET,
};
use pmnet_xdp::{AttachMode, Steering, XdpError};

use super::*;

/// How often a store at the edge of full says that steering went off.
const STEERING_OFF_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// How a server receives with AF_XDP.
#[derive(Debug, Clone)]
pub struct ServerXdpOptions {
    /// The interface the server's datagrams arrive on.
    pub interface: String,
    /// Native (driver) XDP or generic (skb) XDP.
    pub mode: AttachMode,
    /// Slots kept on the fill ring (at most an eighth of the store's).
    pub fill_target: usize,
}

impl ServerXdpOptions {
    pub fn new(interface: &str, mode: AttachMode) -> ServerXdpOptions {
        ServerXdpOptions {
            interface: interface.to_owned(),
            mode,
            fill_target: DEFAULT_FILL_TARGET,
        }
    }
}

/// Counters of the AF_XDP path beyond the receiver's own.
#[derive(Debug, Clone, Default)]
pub(super) struct XdpRuntimeCounters {
    /// Times steering was switched off because the store could not supply the fill ring.
    pub(super) steering_off: u64,
}

/// The XDP program, the AF_XDP socket over the store and what is steered.
pub(super) struct XdpReceive {
    /// First: dropping it detaches the program (datagrams go to the kernel again) before the
    /// socket closes.
    pub(super) steering: Steering,
    pub(super) receiver: XskSlotReceiver,
    /// The destinations steered while the store supplies the fill ring.
    pub(super) steered: Vec<SocketAddrV4>,
    /// Steering is off: the store is full (see the module documentation).
    pub(super) off: bool,
    pub(super) counters: XdpRuntimeCounters,
    /// When steering off was last said.
    warned: Option<Instant>,
    /// What the banner says.
    pub(super) description: String,
}

impl std::fmt::Debug for XdpReceive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpReceive")
            .field("steered", &self.steered)
            .field("off", &self.off)
            .field("receiver", &self.receiver)
            .finish()
    }
}

fn xdp_error(interface: &str, what: &str, error: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Config(format!("--xdp {interface}: {what}: {error}"))
}

impl XdpReceive {
    /// Attach the program to `options.interface`, open the socket over `store` and steer the
    /// server's listen address (each IPv4 address of the interface when it listens on
    /// 0.0.0.0) and `port` to it.
    pub(super) fn open(
        options: &ServerXdpOptions,
        store: &mut Store<MmapRegion>,
        listen: SocketAddr,
        busy_poll: bool,
    ) -> Result<XdpReceive, RuntimeError> {
        let interface = options.interface.as_str();
        let SocketAddr::V4(listen) = listen else {
            return Err(RuntimeError::Config(format!(
                "--xdp {interface}: the AF_XDP receive path serves IPv4; the server listens on \
                 {listen}"
            )));
        };
        let steered: Vec<SocketAddrV4> = if listen.ip().is_unspecified() {
            interface_ipv4(interface)
                .into_iter()
                .map(|ip| SocketAddrV4::new(ip, listen.port()))
                .collect()
        } else {
            vec![listen]
        };
        if steered.is_empty() {
            return Err(RuntimeError::Config(format!(
                "--xdp {interface}: the server listens on {listen} and {interface} has no IPv4 \
                 address to steer (or there is no such interface): give --listen the address \
                 the server is reached at on {interface}"
            )));
        }
        let config = XskReceiveConfig {
            fill_target: options.fill_target,
            busy_poll,
            ..XskReceiveConfig::new(interface)
        };
        let mut steering = Steering::attach(interface, options.mode)
            .map_err(|error| xdp_error(interface, "cannot attach the XDP program", error))?;
        // SAFETY: the receiver lives in the server beside the store (`ServerRuntime::xdp`,
        // declared before `app` so it is dropped first) and is only used with it.
        let receiver = unsafe { XskSlotReceiver::open(store, &config) }.map_err(|error| {
            let hint = match &error {
                XskReceiveError::Socket(XdpError::Socket { op, .. })
                    if op.contains("XDP_UMEM_REG") =>
                {
                    " (the kernel pins the store's pages for as long as the socket lives, which \
                     it refuses for a file on a disk or DAX file system: put --data-file on \
                     tmpfs, e.g. /dev/shm)"
                }
                _ => "",
            };
            xdp_error(
                interface,
                "cannot receive into the store",
                format!("{error}{hint}"),
            )
        })?;
        // Past this point a failure closes the socket and gives its slots back.
        if let Err(error) = Self::check_and_steer(interface, &mut steering, &receiver, &steered) {
            receiver.close(store);
            return Err(error);
        }
        let placement = receiver.placement();
        let (_, fill_target) = receiver.fill_level();
        let description = format!(
            "AF_XDP on {interface} queue {} ({} XDP, {} mode): frames land in the store's \
             slots, the datagram where it stays as the record (UMEM = the store's data area, \
             {:.1} MiB pinned; {fill_target} slots on the fill ring; frames of at most {} \
             bytes); steering {}; everything else through the UDP socket",
            receiver.socket().queue(),
            match options.mode {
                AttachMode::Native => "native",
                AttachMode::Generic => "generic",
            },
            if receiver.socket().zero_copy() {
                "zero-copy"
            } else {
                "copy"
            },
            placement.umem_len as f64 / f64::from(1 << 20),
            placement.max_frame_len(),
            steered
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        tracing::info!(
            interface,
            steered = ?steered,
            umem_bytes = placement.umem_len,
            fill_target,
            "AF_XDP receive path attached"
        );
        Ok(XdpReceive {
            steering,
            receiver,
            steered,
            off: false,
            counters: XdpRuntimeCounters::default(),
            warned: None,
            description,
        })
    }

    /// Check that the interface's frames fit the slots, register the socket and steer.
    fn check_and_steer(
        interface: &str,
        steering: &mut Steering,
        receiver: &XskSlotReceiver,
        steered: &[SocketAddrV4],
    ) -> Result<(), RuntimeError> {
        let max_frame = receiver.placement().max_frame_len();
        if let Some(mtu) = interface_mtu(interface) {
            // An 802.1Q tag takes 4 more bytes.
            if mtu + 14 + 4 > max_frame {
                return Err(RuntimeError::Config(format!(
                    "--xdp {interface}: its MTU of {mtu} bytes lets frames of up to {} bytes \
                     arrive, and the store's slots take frames of at most {max_frame} bytes (the \
                     kernel drops longer ones): set the MTU to {} or less",
                    mtu + 18,
                    max_frame - 18
                )));
            }
        }
        steering
            .register(receiver.socket().queue(), receiver.socket())
            .map_err(|error| xdp_error(interface, "cannot register the AF_XDP socket", error))?;
        for addr in steered {
            steering
                .steer(*addr)
                .map_err(|error| xdp_error(interface, "cannot steer", error))?;
        }
        Ok(())
    }

    /// Steering off while the store cannot supply the fill ring, on again once it can.
    pub(super) fn follow_store(&mut self) {
        if !self.off && self.receiver.starved() {
            self.off = true;
            self.counters.steering_off += 1;
            for addr in &self.steered {
                if let Err(error) = self.steering.unsteer(*addr) {
                    tracing::warn!("AF_XDP: cannot stop steering {addr}: {error}");
                }
            }
            let (held, target) = self.receiver.fill_level();
            // A store at the edge of full may switch often: said once per interval.
            let now = Instant::now();
            if self
                .warned
                .is_none_or(|at| now.duration_since(at) >= STEERING_OFF_WARNING_INTERVAL)
            {
                self.warned = Some(now);
                tracing::warn!(
                    "AF_XDP: the store has no free slot for the fill ring ({held} of {target} \
                     posted): steering is off, datagrams go through the UDP socket until the \
                     store has room again (nothing is lost: what is dropped meanwhile is \
                     resent); {} time(s) so far",
                    self.counters.steering_off
                );
            }
        } else if self.off && self.receiver.recovered() {
            self.off = false;
            for addr in &self.steered {
                if let Err(error) = self.steering.steer(*addr) {
                    tracing::warn!("AF_XDP: cannot steer {addr} again: {error}");
                }
            }
            tracing::debug!("AF_XDP: the store has room again: steering is back on");
        }
    }
}

/// The IPv4 addresses of interface `name` (in this thread's network namespace).
fn interface_ipv4(name: &str) -> Vec<Ipv4Addr> {
    let mut found = Vec::new();
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a list the matching freeifaddrs releases.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return found;
    }
    let mut entry = list;
    while !entry.is_null() {
        // SAFETY: `entry` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*entry };
        entry = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a NUL-terminated name owned by the list.
        let ifa_name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        // SAFETY: ifa_addr points to a sockaddr of at least its family's size.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        if ifa_name.to_bytes() != name.as_bytes() || family != libc::AF_INET {
            continue;
        }
        // SAFETY: AF_INET: a sockaddr_in.
        let addr = unsafe { *(ifa.ifa_addr as *const libc::sockaddr_in) };
        found.push(Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)));
    }
    // SAFETY: the list from getifaddrs above, freed once.
    unsafe { libc::freeifaddrs(list) };
    found
}

/// The MTU of interface `name` (SIOCGIFMTU, in this thread's network namespace).
fn interface_mtu(name: &str) -> Option<usize> {
    let c_name = CString::new(name).ok()?;
    let bytes = c_name.as_bytes_with_nul();
    if bytes.len() > libc::IF_NAMESIZE {
        return None;
    }
    // SAFETY: a zeroed ifreq is valid; the name fits (checked above).
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (to, from) in request.ifr_name.iter_mut().zip(bytes) {
        *to = *from as libc::c_char;
    }
    // SAFETY: plain socket creation; closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: SIOCGIFMTU reads the name and writes ifru_mtu of a valid ifreq.
    let result = unsafe { libc::ioctl(fd, libc::SIOCGIFMTU, &mut request) };
    // SAFETY: `fd` is ours.
    unsafe { libc::close(fd) };
    if result != 0 {
        return None;
    }
    // SAFETY: the kernel wrote the MTU in the union.
    let mtu = unsafe { request.ifr_ifru.ifru_mtu };
    usize::try_from(mtu).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_interface_has_its_address_and_mtu() {
        assert!(interface_ipv4("lo").contains(&Ipv4Addr::LOCALHOST));
        assert!(interface_ipv4("no-such-if0").is_empty());
        assert!(interface_mtu("lo").is_some_and(|mtu| mtu >= 1500));
        assert_eq!(interface_mtu("no-such-if0"), None);
        assert_eq!(interface_mtu("a-name-longer-than-sixteen"), None);
    }
}
