//! The processes the benchmarks start, the ports and directories they get, and the machine
//! they run on; the `pmnet` binary they start the product's processes from
//! ([`pmnet_program`]).
//!
//! Every child runs in a process group of its own (a Ctrl-C at the terminal reaches this
//! process only, which stops the children in order) and is killed by the kernel if this
//! process dies first (`PR_SET_PDEATHSIG`). Its output goes to a log file in the run's
//! directory, whose last lines an error quotes. Directories are named
//! `pmnet-coord-bench-<PID>-…`, so that the next run removes what a killed run left.

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pmnet_runtime::Shutdown;

use pmnet::CliError;

/// The prefix of every directory the benchmark makes.
pub const DIR_PREFIX: &str = "pmnet-coord-bench-";

/// How long a child may take to stop after SIGTERM before it is killed.
const STOP_PATIENCE: Duration = Duration::from_secs(10);

/// Ports handed out by this process (none twice).
static PORTS_GIVEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// `count` loopback ports that are free for both TCP and UDP now, none handed out before by
/// this process. They are drawn below Linux's ephemeral range (32768 and up), so that the
/// sockets other processes bind to port 0 meanwhile cannot take them before the child that
/// is given one binds it.
pub fn free_ports(count: usize) -> Result<Vec<u16>, CliError> {
    let mut given = PORTS_GIVEN
        .lock()
        .unwrap_or_else(|error| error.into_inner());
    let given = given.get_or_insert_with(HashSet::new);
    let mut ports = Vec::with_capacity(count);
    let mut tries = 0;
    while ports.len() < count {
        tries += 1;
        if tries > 10_000 {
            return Err("no free loopback ports between 20000 and 32767".into());
        }
        let port = rand::random_range(20_000..32_768u16);
        if given.contains(&port) {
            continue;
        }
        let tcp = TcpListener::bind(("127.0.0.1", port));
        let udp = UdpSocket::bind(("127.0.0.1", port));
        if tcp.is_ok() && udp.is_ok() {
            given.insert(port);
            ports.push(port);
        }
    }
    Ok(ports)
}

/// 127.0.0.1:`port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// A new directory `DIR_PREFIX<PID>-<what>-XXXX` under `parent`, removed when dropped.
pub fn run_dir(parent: &Path, what: &str) -> Result<tempfile::TempDir, CliError> {
    tempfile::Builder::new()
        .prefix(&format!("{DIR_PREFIX}{}-{what}-", std::process::id()))
        .tempdir_in(parent)
        .map_err(|error| {
            format!(
                "cannot make a directory under {} for {what}: {error}",
                parent.display()
            )
            .into()
        })
}

/// Remove the directories under `parents` that a run of this benchmark that no longer runs
/// left behind (killed before it could clean up); how many.
pub fn remove_stale_dirs(parents: &[&Path]) -> usize {
    let mut removed = 0;
    for parent in parents {
        let Ok(entries) = std::fs::read_dir(parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(rest) = name.to_str().and_then(|name| name.strip_prefix(DIR_PREFIX)) else {
                continue;
            };
            let Some(pid) = rest
                .split('-')
                .next()
                .and_then(|pid| pid.parse::<u32>().ok())
            else {
                continue;
            };
            if Path::new(&format!("/proc/{pid}")).exists() {
                continue;
            }
            if std::fs::remove_dir_all(entry.path()).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// A child process of the benchmark: stopped (SIGTERM, then SIGKILL) when dropped.
#[derive(Debug)]
pub struct Proc {
    pub name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Start `program ARGS` with its output in `log`, on CPU `cpu` if one is given.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log: &Path,
        cpu: Option<usize>,
    ) -> Result<Proc, CliError> {
        let output = std::fs::File::create(log)
            .map_err(|error| format!("{name}: cannot make {}: {error}", log.display()))?;
        let errors = output.try_clone()?;
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(errors)
            .process_group(0);
        // SAFETY: between fork and exec only prctl(2), getppid(2) and sched_setaffinity(2)
        // run, on a stack-local CPU set: no allocation, no lock.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(cpu) = cpu {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                // The parent died before the line above: nobody would stop this child.
                if libc::getppid() == 1 {
                    return Err(std::io::Error::other("the benchmark exited"));
                }
                Ok(())
            });
        }
        let child = command
            .spawn()
            .map_err(|error| format!("cannot start {name} ({}): {error}", program.display()))?;
        Ok(Proc {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// An error if the process has exited: its status and the end of its log.
    pub fn check_running(&mut self) -> Result<(), CliError> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => Err(format!(
                "{} exited ({status}); the end of its log ({}):\n{}",
                self.name,
                self.log.display(),
                self.log_tail(20)
            )
            .into()),
        }
    }

    /// Everything the process wrote so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines of the process's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// SIGKILL at once (a crash), and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, a wait of at most [`STOP_PATIENCE`], then SIGKILL.
    pub fn stop(&mut self) {
        pmnet_etcd::stop_child(&mut self.child, STOP_PATIENCE);
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The process ids of `procs`.
pub fn pids(procs: &[Proc]) -> Vec<u32> {
    procs.iter().map(Proc::pid).collect()
}

/// Stop every process of `procs` (SIGTERM, then SIGKILL if it lingers).
pub fn stop_all(procs: &mut [Proc]) {
    for proc in procs {
        proc.stop();
    }
}

/// Call `ready` every 20 ms until it says yes, for at most `patience`; fails at once if a
/// process of `procs` exits or a signal asks the benchmark to stop. `what` names what is
/// waited for in the error.
pub fn wait_until(
    what: &str,
    patience: Duration,
    procs: &mut [Proc],
    shutdown: &Shutdown,
    mut ready: impl FnMut() -> Result<bool, CliError>,
) -> Result<(), CliError> {
    let deadline = Instant::now() + patience;
    let mut last_error = None;
    loop {
        for proc in procs.iter_mut() {
            proc.check_running()?;
        }
        if shutdown.is_requested() {
            return Err(format!("interrupted while waiting for {what}").into());
        }
        match ready() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(error) => last_error = Some(error.to_string()),
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> = procs
                .iter()
                .map(|proc| format!("--- {}:\n{}", proc.name, proc.log_tail(8)))
                .collect();
            return Err(format!(
                "{what}: not ready within {} s (last error: {}); the ends of the logs:\n{}",
                patience.as_secs(),
                last_error.as_deref().unwrap_or("none"),
                logs.join("\n")
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// CPU time process `pid` has used so far (all its threads, user and system), in seconds;
/// `None` if it cannot be read. The kernel counts it in clock ticks (10 ms at 100 Hz).
pub fn cpu_seconds_of(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name in parentheses (which may hold spaces): state is field 3,
    // utime and stime fields 14 and 15.
    let fields: Vec<&str> = text
        .get(text.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf(3) with a valid name reads a constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| ticks as f64 / per_second as f64)
}

/// CPU time the whole machine has been busy so far (every CPU, every process; idle and
/// I/O wait left out), in seconds.
pub fn machine_busy_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|line| line.starts_with("cpu "))?;
    // user nice system idle iowait irq softirq steal ...
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map_while(|field| field.parse().ok())
        .collect();
    let busy: u64 = ticks
        .iter()
        .enumerate()
        .filter(|(index, _)| !matches!(index, 3 | 4) && *index < 8)
        .map(|(_, ticks)| ticks)
        .sum();
    // SAFETY: sysconf(3) with a valid name reads a constant.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| busy as f64 / per_second as f64)
}

/// CPU time of every process of `pids` together, in seconds.
pub fn cpu_seconds_of_all(pids: &[u32]) -> f64 {
    pids.iter().filter_map(|&pid| cpu_seconds_of(pid)).sum()
}

/// The processes whose parent is `pid` now, each with its command line (the program and its
/// arguments), found by reading every process's `/proc/PID/stat` (the parent is its field 4).
pub fn children_of(pid: u32) -> Vec<(u32, Vec<String>)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parent_of = |child: u32| -> Option<u32> {
        let text = std::fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
        // After the command name in parentheses: state (field 3), then the parent (field 4).
        text.get(text.rfind(')')? + 1..)?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let mut children: Vec<(u32, Vec<String>)> = entries
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.file_name().to_str()?.parse().ok()?;
            (parent_of(child)? == pid).then_some(())?;
            let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).ok()?;
            let words = cmdline
                .split(|byte| *byte == 0)
                .filter(|word| !word.is_empty())
                .map(|word| String::from_utf8_lossy(word).into_owned())
                .collect();
            Some((child, words))
        })
        .collect();
    children.sort();
    children
}

/// The environment variable that names the `pmnet` binary to start.
pub const PMNET_BIN_VAR: &str = "PMNET_BIN";

/// The `pmnet` binary whose commands (device, server, memnode, …) the benchmarks start:
/// the one `PMNET_BIN` names, else the `pmnet` next to this executable (cargo puts both
/// binaries in target/<profile>/; a test's executable is in its deps/ directory, one below),
/// else the first on PATH.
pub fn pmnet_program() -> Result<PathBuf, CliError> {
    let exe = std::env::current_exe().ok();
    let path = std::env::var_os("PATH");
    find_pmnet(
        std::env::var_os(PMNET_BIN_VAR).as_deref(),
        exe.as_deref(),
        path.as_deref(),
    )
    .map_err(CliError::from)
}

/// [`pmnet_program`] given `PMNET_BIN`'s value, this executable and `PATH`.
fn find_pmnet(
    named: Option<&std::ffi::OsStr>,
    exe: Option<&Path>,
    path: Option<&std::ffi::OsStr>,
) -> Result<PathBuf, String> {
    if let Some(named) = named {
        let path = PathBuf::from(named);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "{PMNET_BIN_VAR}={}: no such file; name the pmnet binary to start",
                path.display()
            ))
        };
    }
    let beside = exe.and_then(Path::parent).and_then(|dir| {
        let above = dir.ends_with("deps").then(|| dir.parent()).flatten();
        [Some(dir), above]
            .into_iter()
            .flatten()
            .map(|dir| dir.join("pmnet"))
            .find(|candidate| candidate.is_file())
    });
    let on_path = || {
        std::env::split_paths(path?)
            .map(|dir| dir.join("pmnet"))
            .find(|candidate| candidate.is_file())
    };
    beside.or_else(on_path).ok_or_else(|| {
        format!(
            "the benchmarks start the pmnet binary's commands, and found no pmnet next to this \
             program ({}) nor on PATH; build it with `cargo build --release -p pmnet` (it goes \
             next to pmnet-bench, in target/release), or name it with {PMNET_BIN_VAR}=PATH",
            exe.map_or_else(|| "unknown".to_owned(), |exe| exe.display().to_string())
        )
    })
}

/// `program` as found on PATH (or as given, if it names a path).
pub fn find_program(program: &str) -> Option<PathBuf> {
    pmnet_etcd::find_program(program)
}

/// The file system `path` is on, by name where it is a common one.
pub fn file_system(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let Ok(text) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return "unknown".to_owned();
    };
    // SAFETY: statfs(2) with a NUL-terminated path and a zeroed struct it fills in.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(text.as_ptr(), &mut stat) } != 0 {
        return "unknown".to_owned();
    }
    match stat.f_type as u64 {
        0xEF53 => "ext4".to_owned(),
        0x0102_1994 => "tmpfs (RAM)".to_owned(),
        0x794C_7630 => "overlayfs".to_owned(),
        0x5846_5342 => "xfs".to_owned(),
        0x9123_683E => "btrfs".to_owned(),
        other => format!("file system type {other:#x}"),
    }
}

/// The machine in one line: CPU model, CPUs online, kernel, load average.
pub fn machine_text() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|text| text.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".to_owned());
    let online = pmnet_runtime::online_cpu_count();
    let allowed = allowed_cpus();
    let affinity = if allowed.is_empty() || allowed.len() >= online {
        String::new()
    } else {
        let list: Vec<String> = allowed.iter().map(ToString::to_string).collect();
        format!(
            " (this run and everything it starts confined to CPU {}, e.g. by taskset)",
            list.join(",")
        )
    };
    format!("{model}, {online} CPUs online{affinity}, Linux {kernel}, load average {load}")
}

/// The CPUs this process may run on (empty if that cannot be read).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is the empty set; sched_getaffinity fills it for this
    // process, and CPU_ISSET reads inside it (every index below CPU_SETSIZE).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_and_never_handed_out_twice() {
        let first = free_ports(20).unwrap();
        let second = free_ports(20).unwrap();
        let all: HashSet<u16> = first.iter().chain(&second).copied().collect();
        assert_eq!(all.len(), 40);
        assert!(all.iter().all(|port| (20_000..32_768).contains(port)));
    }

    #[test]
    fn a_dead_run_s_directories_are_removed_and_a_live_one_s_kept() {
        let parent = tempfile::tempdir().unwrap();
        let mine = run_dir(parent.path(), "etcd").unwrap();
        // No process has pid 4194304 or above (the kernel's limit, pid_max).
        let dead = parent
            .path()
            .join(format!("{DIR_PREFIX}4194304-zookeeper-abc"));
        std::fs::create_dir_all(dead.join("data")).unwrap();
        let other = parent.path().join("something-else");
        std::fs::create_dir(&other).unwrap();
        assert_eq!(remove_stale_dirs(&[parent.path()]), 1);
        assert!(!dead.exists());
        assert!(mine.path().exists());
        assert!(other.exists());
    }

    #[test]
    fn a_process_s_cpu_time_is_read_and_grows() {
        let pid = std::process::id();
        let before = cpu_seconds_of(pid).unwrap();
        let started = Instant::now();
        let mut spin = 0u64;
        while started.elapsed() < Duration::from_millis(50) {
            spin = std::hint::black_box(spin.wrapping_add(1));
        }
        assert!(cpu_seconds_of(pid).unwrap() > before);
        assert!(machine_busy_seconds().unwrap() > 0.0);
        assert!(!allowed_cpus().is_empty());
        assert_eq!(cpu_seconds_of(4_194_304), None);
    }

    #[test]
    fn a_child_is_found_with_its_command_line() {
        let dir = tempfile::tempdir().unwrap();
        let proc = Proc::spawn(
            "a sleeper",
            Path::new("/bin/sleep"),
            &["30".to_owned()],
            &dir.path().join("sleep.log"),
            None,
        )
        .unwrap();
        let children = children_of(std::process::id());
        let found = children.iter().find(|(pid, _)| *pid == proc.pid());
        assert_eq!(
            found.map(|(_, words)| words.as_slice()),
            Some(["/bin/sleep".to_owned(), "30".to_owned()].as_slice()),
            "{children:?}"
        );
        assert_eq!(children_of(4_194_304), Vec::new());
    }

    #[test]
    fn programs_are_found_on_the_path_or_not_at_all() {
        assert!(find_program("sh").is_some());
        assert!(find_program("/bin/sh").is_some());
        assert_eq!(find_program("pmnet-no-such-program"), None);
        assert_eq!(find_program("/nonexistent/etcd"), None);
    }

    #[test]
    fn a_child_that_exits_is_reported_with_the_end_of_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut proc = Proc::spawn(
            "a shell",
            Path::new("/bin/sh"),
            &["-c".to_owned(), "echo it went wrong; exit 3".to_owned()],
            &dir.path().join("sh.log"),
            Some(0),
        )
        .unwrap();
        let shutdown = Shutdown::new();
        let error = wait_until(
            "nothing",
            Duration::from_secs(30),
            std::slice::from_mut(&mut proc),
            &shutdown,
            || Ok(false),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("a shell exited"), "{error}");
        assert!(error.contains("it went wrong"), "{error}");
    }

    #[test]
    fn pmnet_is_the_named_one_else_the_one_beside_else_the_one_on_the_path() {
        let beside = tempfile::tempdir().unwrap();
        let on_path = tempfile::tempdir().unwrap();
        let deps = beside.path().join("deps");
        std::fs::create_dir(&deps).unwrap();
        let path = std::env::join_paths([on_path.path()]).unwrap();
        let exe = beside.path().join("pmnet-bench");
        let error = find_pmnet(None, Some(&exe), Some(&path)).unwrap_err();
        assert!(
            error.contains("cargo build --release -p pmnet") && error.contains("PMNET_BIN"),
            "{error}"
        );
        std::fs::write(on_path.path().join("pmnet"), "").unwrap();
        assert_eq!(
            find_pmnet(None, Some(&exe), Some(&path)).unwrap(),
            on_path.path().join("pmnet")
        );
        std::fs::write(beside.path().join("pmnet"), "").unwrap();
        assert_eq!(
            find_pmnet(None, Some(&exe), Some(&path)).unwrap(),
            beside.path().join("pmnet")
        );
        // A test's executable is in deps/: the pmnet one directory up.
        let test_exe = deps.join("forwarding-0123");
        assert_eq!(
            find_pmnet(None, Some(&test_exe), None).unwrap(),
            beside.path().join("pmnet")
        );
        let named = on_path.path().join("pmnet");
        assert_eq!(
            find_pmnet(Some(named.as_os_str()), Some(&exe), None).unwrap(),
            named
        );
        let missing = on_path.path().join("nope");
        let error = find_pmnet(Some(missing.as_os_str()), Some(&exe), None).unwrap_err();
        assert!(error.contains("no such file"), "{error}");
    }
}
