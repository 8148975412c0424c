//! Joining a network namespace from this process: setns(2) on the file `ip netns add` made.

use std::os::fd::AsRawFd;
use std::path::PathBuf;

use crate::TestbedError;

/// Where `ip netns add NS` binds the namespace (iproute2's NETNS_RUN_DIR).
pub(crate) const NETNS_DIR: &str = "/var/run/netns";

/// The file of namespace `netns`.
pub(crate) fn path(netns: &str) -> PathBuf {
    PathBuf::from(NETNS_DIR).join(netns)
}

/// Whether namespace `netns` exists (as `ip netns` sees it: its file is there).
pub(crate) fn exists(netns: &str) -> bool {
    path(netns).exists()
}

/// Move the calling thread into network namespace `netns`. Only this thread moves; sockets it
/// opens afterwards belong to the namespace, whichever thread uses them later.
pub(crate) fn enter(netns: &str) -> Result<(), TestbedError> {
    let path = path(netns);
    let error = |source| TestbedError::Enter {
        netns: netns.to_owned(),
        path: path.clone(),
        source,
    };
    let file = std::fs::File::open(&path).map_err(error)?;
    // SAFETY: setns takes a file descriptor we own (open for the whole call) and a flag; it
    // changes only the calling thread's network namespace.
    let result = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if result != 0 {
        return Err(error(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Run `work` on a new thread inside network namespace `netns` and return what it returns.
/// The calling thread stays where it is.
pub(crate) fn run_in<T: Send>(
    netns: &str,
    work: impl FnOnce() -> T + Send,
) -> Result<T, TestbedError> {
    std::thread::scope(|scope| {
        let thread = std::thread::Builder::new()
            .name(format!("netns {netns}"))
            .spawn_scoped(scope, || {
                enter(netns)?;
                Ok(work())
            })
            .map_err(|source| TestbedError::Spawn {
                command: format!("a thread for network namespace {netns}"),
                source,
                hint: "",
            })?;
        thread.join().map_err(|_| TestbedError::ThreadPanicked {
            netns: netns.to_owned(),
        })?
    })
}

/// Write `1` to the sysctl file `path` (under /proc/sys/net) inside namespace `netns`. A file
/// under /proc/sys/net shows the namespace of the thread that opens it.
pub(crate) fn set_sysctl(netns: &str, path: &'static str) -> Result<(), TestbedError> {
    run_in(netns, || std::fs::write(path, "1\n"))?.map_err(|source| TestbedError::Sysctl {
        action: "write 1 to",
        path,
        netns: netns.to_owned(),
        source,
    })
}

/// The value of the sysctl file `path` inside namespace `netns`, trimmed.
pub(crate) fn sysctl(netns: &str, path: &'static str) -> Result<String, TestbedError> {
    run_in(netns, || std::fs::read_to_string(path))?
        .map(|text| text.trim().to_owned())
        .map_err(|source| TestbedError::Sysctl {
            action: "read",
            path,
            netns: netns.to_owned(),
            source,
        })
}
