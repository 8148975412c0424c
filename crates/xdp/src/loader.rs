//! [`Steering`]: loads the XDP program built from `bpf/steer.c`, attaches it to an interface
//! through a bpf_link (so it goes away with the process, even a killed one) and fills its maps.

use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddrV4;

use aya::maps::{HashMap, MapData, PerCpuArray, XskMap};
use aya::programs::xdp::XdpLinkId;
use aya::programs::{ProgramError, Xdp, XdpFlags};
use aya::Ebpf;

use crate::netlink;
use crate::sys;
use crate::{XdpError, XskSocket};

/// Destinations the `steer` map holds (its `max_entries`).
pub const MAX_STEERED: usize = 1024;
/// Queues the `xsks` map holds (its `max_entries`).
pub const MAX_QUEUES: u32 = 64;

/// The program's name in steer.c (and in the kernel: `bpftool prog` shows it).
const PROGRAM_NAME: &str = "pmnet_steer";
const COUNTER_STEERED: u32 = 0;
const COUNTER_PASSED: u32 = 1;
const COUNTER_MALFORMED: u32 = 2;

#[cfg(not(pmnet_xdp_no_program))]
static PROGRAM: Option<&[u8]> = Some(aya::include_bytes_aligned!(concat!(
    env!("OUT_DIR"),
    "/steer.o"
)));
#[cfg(pmnet_xdp_no_program)]
static PROGRAM: Option<&[u8]> = None;

/// Where the XDP program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttachMode {
    /// In the driver, before an skb exists (`XDP_FLAGS_DRV_MODE`): what AF_XDP is fast with.
    Native,
    /// After the skb is built (`XDP_FLAGS_SKB_MODE`): works on any interface, slower.
    Generic,
}

impl AttachMode {
    fn flags(self) -> XdpFlags {
        match self {
            AttachMode::Native => XdpFlags::DRV_MODE,
            AttachMode::Generic => XdpFlags::SKB_MODE,
        }
    }

    fn name(self) -> &'static str {
        match self {
            AttachMode::Native => "native",
            AttachMode::Generic => "generic",
        }
    }
}

/// The program's counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SteerCounters {
    /// Frames redirected to an AF_XDP socket.
    pub steered: u64,
    /// Frames passed to the kernel: not IPv4/UDP, a fragment, not a steered destination, or no
    /// socket registered for the receive queue.
    pub passed: u64,
    /// Frames too short for the headers they announce (or an IPv4 header length below 20);
    /// passed to the kernel, which drops them.
    pub malformed: u64,
}

/// The XDP program attached to one interface, with its maps. Dropping it detaches the program.
pub struct Steering {
    ifname: String,
    ifindex: u32,
    mode: AttachMode,
    steer: HashMap<MapData, [u8; 8], u8>,
    xsks: XskMap<MapData>,
    counters: PerCpuArray<MapData, u64>,
    steered: BTreeSet<SocketAddrV4>,
    link: Option<XdpLinkId>,
    // Last: dropping it unloads the program (after the link is detached in `drop`).
    ebpf: Ebpf,
}

impl std::fmt::Debug for Steering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steering")
            .field("ifname", &self.ifname)
            .field("ifindex", &self.ifindex)
            .field("mode", &self.mode)
            .field("steered", &self.steered)
            .finish_non_exhaustive()
    }
}

/// Checks cheaply that steering can work here: the program is built in, the process has the
/// privileges, and the kernel has AF_XDP sockets. The runtime calls it to print a clear reason
/// before falling back to kernel UDP sockets.
pub fn available() -> Result<(), XdpError> {
    program()?;
    sys::check_capabilities().map_err(XdpError::Permission)?;
    // SAFETY: plain socket creation; closed at once.
    let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        let err = io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::EAFNOSUPPORT) => {
                XdpError::Unsupported("AF_XDP sockets (CONFIG_XDP_SOCKETS)".into())
            }
            _ => XdpError::from_errno(&err, || "cannot create an AF_XDP socket".into())
                .unwrap_or_else(|| XdpError::Unsupported(format!("AF_XDP socket: {err}"))),
        });
    }
    // SAFETY: `fd` is ours.
    unsafe { libc::close(fd) };
    Ok(())
}

fn program() -> Result<&'static [u8], XdpError> {
    PROGRAM.ok_or_else(|| XdpError::NotBuilt(env!("PMNET_XDP_NOT_BUILT").to_string()))
}

/// An error and its sources on one line.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The errno at the bottom of an error chain, if any.
fn errno(err: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return io.raw_os_error();
        }
        if let Some(aya::sys::SyscallError { io_error, .. }) = e.downcast_ref() {
            return io_error.raw_os_error();
        }
        current = e.source();
    }
    None
}

fn privileged(err: &(dyn std::error::Error + 'static), what: &str) -> Option<XdpError> {
    matches!(errno(err), Some(libc::EPERM) | Some(libc::EACCES))
        .then(|| XdpError::Permission(format!("{what}: {}", chain(err))))
}

/// Loads the object and the program into the kernel (not attached).
fn load() -> Result<Ebpf, XdpError> {
    let mut ebpf = Ebpf::load(program()?).map_err(|e| {
        privileged(&e, "cannot create the XDP maps").unwrap_or_else(|| XdpError::Load(chain(&e)))
    })?;
    let xdp = xdp_program(&mut ebpf)?;
    xdp.load().map_err(|e| {
        if let ProgramError::LoadError {
            io_error,
            verifier_log,
        } = &e
        {
            if matches!(
                io_error.raw_os_error(),
                Some(libc::EPERM) | Some(libc::EACCES)
            ) {
                return XdpError::Permission(format!("cannot load the XDP program: {io_error}"));
            }
            return XdpError::Load(format!("{io_error}; verifier log: {verifier_log}"));
        }
        privileged(&e, "cannot load the XDP program").unwrap_or_else(|| XdpError::Load(chain(&e)))
    })?;
    Ok(ebpf)
}

fn xdp_program(ebpf: &mut Ebpf) -> Result<&mut Xdp, XdpError> {
    let program = ebpf
        .program_mut(PROGRAM_NAME)
        .ok_or_else(|| XdpError::Load(format!("no program {PROGRAM_NAME} in the object")))?;
    program
        .try_into()
        .map_err(|e: ProgramError| XdpError::Load(chain(&e)))
}

fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<aya::maps::Map, XdpError> {
    ebpf.take_map(name).ok_or_else(|| XdpError::Map {
        map: name,
        cause: "missing from the object".into(),
    })
}

fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> XdpError {
    move |e| XdpError::Map {
        map,
        cause: chain(&e),
    }
}

impl Steering {
    /// Loads the program and attaches it to `ifname` in `mode` through a bpf_link. A
    /// `pmnet_steer` program left attached the legacy way (netlink) is replaced; any other
    /// attached program is left alone and reported as [`XdpError::Busy`].
    pub fn attach(ifname: &str, mode: AttachMode) -> Result<Steering, XdpError> {
        available()?;
        let ifindex = sys::ifindex(ifname)?;
        let mut ebpf = load()?;
        let attach_err = |e: &ProgramError| -> XdpError {
            privileged(e, &format!("cannot attach XDP to {ifname}")).unwrap_or_else(|| {
                let mut cause = chain(e);
                if mode == AttachMode::Native && errno(e) == Some(libc::EOPNOTSUPP) {
                    cause.push_str(" (the driver has no native XDP: use generic mode)");
                }
                XdpError::Attach {
                    ifname: ifname.to_string(),
                    mode: mode.name(),
                    cause,
                }
            })
        };
        let link = {
            let xdp = xdp_program(&mut ebpf)?;
            match xdp.attach_to_if_index(ifindex, mode.flags()) {
                Ok(link) => link,
                Err(e) if matches!(errno(&e), Some(libc::EBUSY) | Some(libc::EEXIST)) => {
                    replace_leftover(ifname, ifindex)?;
                    xdp.attach_to_if_index(ifindex, mode.flags())
                        .map_err(|e| attach_err(&e))?
                }
                Err(e) => return Err(attach_err(&e)),
            }
        };
        let steer = HashMap::try_from(take_map(&mut ebpf, "steer")?).map_err(map_err("steer"))?;
        let xsks = XskMap::try_from(take_map(&mut ebpf, "xsks")?).map_err(map_err("xsks"))?;
        let counters =
            PerCpuArray::try_from(take_map(&mut ebpf, "counters")?).map_err(map_err("counters"))?;
        tracing::debug!(ifname, ifindex, mode = mode.name(), "XDP program attached");
        Ok(Steering {
            ifname: ifname.to_string(),
            ifindex,
            mode,
            steer,
            xsks,
            counters,
            steered: BTreeSet::new(),
            link: Some(link),
            ebpf,
        })
    }

    /// [`available`]: whether steering can work here, and if not why.
    pub fn available() -> Result<(), XdpError> {
        available()
    }

    /// The interface the program is attached to.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The interface's index.
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The attach mode.
    pub fn mode(&self) -> AttachMode {
        self.mode
    }

    /// Steers IPv4/UDP datagrams to `addr` (destination address and port) to the AF_XDP
    /// sockets. At most [`MAX_STEERED`] destinations.
    pub fn steer(&mut self, addr: SocketAddrV4) -> Result<(), XdpError> {
        if !self.steered.contains(&addr) && self.steered.len() >= MAX_STEERED {
            return Err(XdpError::Map {
                map: "steer",
                cause: format!("full ({MAX_STEERED} destinations)"),
            });
        }
        self.steer
            .insert(key(addr), 1, 0)
            .map_err(map_err("steer"))?;
        self.steered.insert(addr);
        Ok(())
    }

    /// Stops steering `addr`: its datagrams go to the kernel again.
    pub fn unsteer(&mut self, addr: SocketAddrV4) -> Result<(), XdpError> {
        if self.steered.remove(&addr) {
            self.steer.remove(&key(addr)).map_err(map_err("steer"))?;
        }
        Ok(())
    }

    /// The steered destinations.
    pub fn steered(&self) -> impl Iterator<Item = SocketAddrV4> + '_ {
        self.steered.iter().copied()
    }

    /// Registers `socket` to receive the steered frames arriving on receive queue `queue`. The
    /// socket must be bound to this interface and queue (the kernel delivers a redirected frame
    /// only to a socket bound to the queue it arrived on).
    pub fn register(&mut self, queue: u32, socket: &XskSocket) -> Result<(), XdpError> {
        if queue >= MAX_QUEUES {
            return Err(XdpError::Map {
                map: "xsks",
                cause: format!("queue {queue} beyond the map's {MAX_QUEUES}"),
            });
        }
        if socket.ifindex() != self.ifindex || socket.queue() != queue {
            return Err(XdpError::Map {
                map: "xsks",
                cause: format!(
                    "socket is bound to {} queue {}, not {} queue {queue}",
                    socket.ifname(),
                    socket.queue(),
                    self.ifname
                ),
            });
        }
        self.xsks
            .set(queue, socket.raw_fd(), 0)
            .map_err(map_err("xsks"))
    }

    /// The program's counters, summed over CPUs (zeros if the map cannot be read).
    pub fn counters(&self) -> SteerCounters {
        let read = |index: u32| -> u64 {
            self.counters
                .get(&index, 0)
                .map(|values| values.iter().fold(0u64, |sum, v| sum.wrapping_add(*v)))
                .unwrap_or(0)
        };
        SteerCounters {
            steered: read(COUNTER_STEERED),
            passed: read(COUNTER_PASSED),
            malformed: read(COUNTER_MALFORMED),
        }
    }
}

impl Drop for Steering {
    fn drop(&mut self) {
        if let Some(link) = self.link.take() {
            if let Ok(xdp) = xdp_program(&mut self.ebpf) {
                if let Err(e) = xdp.detach(link) {
                    tracing::warn!(ifname = %self.ifname, error = %chain(&e), "XDP detach failed");
                }
            }
        }
    }
}

/// The `steer` map's key: address and port in network order, two bytes of padding.
fn key(addr: SocketAddrV4) -> [u8; 8] {
    let mut key = [0u8; 8];
    key[..4].copy_from_slice(&addr.ip().octets());
    key[4..6].copy_from_slice(&addr.port().to_be_bytes());
    key
}

/// The name of loaded program `id`, if it still exists.
fn program_name(id: u32) -> Option<String> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|info| info.id() == id)
        .map(|info| String::from_utf8_lossy(info.name()).into_owned())
}

/// Detaches a `pmnet_steer` program attached to `ifindex` the legacy way (left by an earlier
/// process); any other program, or one held by a live bpf_link, is [`XdpError::Busy`].
fn replace_leftover(ifname: &str, ifindex: u32) -> Result<(), XdpError> {
    let attached = netlink::attached(ifindex).map_err(|e| XdpError::Attach {
        ifname: ifname.to_string(),
        mode: "query",
        cause: format!("another XDP program is attached, and netlink cannot list it: {e}"),
    })?;
    for program in attached {
        let name = program_name(program.id).unwrap_or_else(|| "?".to_string());
        let busy = || XdpError::Busy {
            ifname: ifname.to_string(),
            program: name.clone(),
            id: program.id,
        };
        if name != PROGRAM_NAME {
            return Err(busy());
        }
        match netlink::set_xdp_fd(ifindex, -1, program.mode_flag) {
            Ok(()) => tracing::info!(
                ifname,
                id = program.id,
                "replaced a leftover {PROGRAM_NAME} program"
            ),
            // A live bpf_link (another running process) cannot be detached through netlink.
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Err(busy()),
            Err(e) => {
                return Err(XdpError::Attach {
                    ifname: ifname.to_string(),
                    mode: "detach",
                    cause: format!(
                        "cannot detach the leftover {PROGRAM_NAME} (id {}): {e}",
                        program.id
                    ),
                })
            }
        }
    }
    Ok(())
}

/// Test support: leaves a `pmnet_steer` program attached the legacy way (netlink), with no
/// process holding it, as a killed process's would be.
#[doc(hidden)]
pub mod testing {
    use std::os::fd::{AsFd, AsRawFd};

    use super::*;

    /// Attaches a program that outlives the call (detach with `ip link set dev X xdp off`).
    pub fn attach_unowned(ifname: &str, mode: AttachMode) -> Result<(), XdpError> {
        let ifindex = sys::ifindex(ifname)?;
        let mut ebpf = load()?;
        let xdp = xdp_program(&mut ebpf)?;
        let fd = xdp.fd().map_err(|e| XdpError::Load(chain(&e)))?;
        netlink::set_xdp_fd(ifindex, fd.as_fd().as_raw_fd(), mode.flags().bits()).map_err(|e| {
            XdpError::Attach {
                ifname: ifname.to_string(),
                mode: mode.name(),
                cause: e.to_string(),
            }
        })
    }
}
