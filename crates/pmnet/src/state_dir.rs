//! The state directory: where a process keeps the files it is not given a path for (a
//! device's log, a server's store, a chain member's table, a memory node's lines). In order:
//!
//! 1. `--dir DIR`;
//! 2. `$STATE_DIRECTORY`, which systemd sets for a unit with `StateDirectory=` (its first
//!    entry: the packaged units say `StateDirectory=pmnet`, so `/var/lib/pmnet`);
//! 3. `/var/lib/pmnet` for root;
//! 4. `$XDG_STATE_HOME/pmnet`, else `$HOME/.local/state/pmnet`, for anyone else;
//! 5. the current directory, when none of those can be named.
//!
//! The directory is made (mode 0750) when a default file is first placed in it. Files keep the
//! names they had under `/dev/shm` before (`pmnet-device-1.log`, …), so `--dir /dev/shm` puts
//! them where earlier versions did: in memory, lost on reboot, as the banner then says.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The state directory of a root process (and of the packaged units).
pub const SYSTEM_STATE_DIR: &str = "/var/lib/pmnet";

/// The state directory as the rules above give it, from the environment's values.
pub fn resolve(
    explicit: Option<&Path>,
    systemd: Option<OsString>,
    root: bool,
    xdg_state_home: Option<OsString>,
    home: Option<OsString>,
) -> PathBuf {
    if let Some(dir) = explicit {
        return dir.to_path_buf();
    }
    let non_empty = |value: Option<OsString>| value.filter(|value| !value.is_empty());
    if let Some(systemd) = non_empty(systemd) {
        // `StateDirectory=a b` gives `…/a:…/b`.
        let text = systemd.to_string_lossy().into_owned();
        if let Some(first) = text.split(':').find(|part| !part.is_empty()) {
            return PathBuf::from(first);
        }
    }
    if root {
        return PathBuf::from(SYSTEM_STATE_DIR);
    }
    if let Some(xdg) = non_empty(xdg_state_home) {
        return PathBuf::from(xdg).join("pmnet");
    }
    if let Some(home) = non_empty(home) {
        return PathBuf::from(home).join(".local/state/pmnet");
    }
    PathBuf::from(".")
}

/// This process's state directory (`--dir`, else as the environment gives it).
pub fn state_dir(explicit: Option<&Path>) -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    resolve(
        explicit,
        std::env::var_os("STATE_DIRECTORY"),
        root,
        std::env::var_os("XDG_STATE_HOME"),
        std::env::var_os("HOME"),
    )
}

/// The default path of a file named `name` in the state directory, which is made if missing
/// (a failure is left to the file's own open, whose error names the path).
pub fn default_file(explicit_dir: Option<&Path>, name: &str) -> PathBuf {
    let dir = state_dir(explicit_dir);
    if !dir.is_dir() {
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o750);
        let _ = builder.create(&dir);
    }
    dir.join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(text: &str) -> Option<OsString> {
        Some(OsString::from(text))
    }

    #[test]
    fn the_directory_follows_the_option_then_systemd_then_the_user() {
        let explicit = Path::new("/srv/pmnet");
        assert_eq!(
            resolve(Some(explicit), os("/var/lib/x"), true, None, None),
            explicit
        );
        assert_eq!(
            resolve(
                None,
                os("/var/lib/pmnet:/var/lib/other"),
                false,
                None,
                os("/home/a")
            ),
            Path::new("/var/lib/pmnet")
        );
        assert_eq!(
            resolve(None, os(""), true, None, os("/root")),
            Path::new(SYSTEM_STATE_DIR)
        );
        assert_eq!(
            resolve(None, None, false, os("/home/a/.state"), os("/home/a")),
            Path::new("/home/a/.state/pmnet")
        );
        assert_eq!(
            resolve(None, None, false, os(""), os("/home/a")),
            Path::new("/home/a/.local/state/pmnet")
        );
        assert_eq!(resolve(None, None, false, None, None), Path::new("."));
    }

    #[test]
    fn a_default_file_makes_its_directory() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("a/b");
        let path = default_file(Some(&dir), "pmnet-device-1.log");
        assert_eq!(path, dir.join("pmnet-device-1.log"));
        assert!(dir.is_dir());
    }
}
