//! The benchmarks' commands (`pmnet bench`, `pmnet eval`, …) live in the `pmnet-bench` binary
//! (crates/bench), so that the product's binary links none of their clients and plotting.
//! `pmnet` keeps their names as hidden commands that run `pmnet-bench` with the same
//! arguments: the `pmnet-bench` next to this executable, else the first on `PATH`.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use crate::CliError;

/// The benchmarks' binary.
pub const BENCH_BINARY: &str = "pmnet-bench";

/// The commands `pmnet` hands to [`BENCH_BINARY`].
pub const BENCH_COMMANDS: [&str; 7] = [
    "bench",
    "redis-bench",
    "store-bench",
    "drain-bench",
    "eval",
    "session-bench",
    "coord-bench",
];

/// `pmnet help COMMAND` for a benchmark's command: the arguments that ask `pmnet-bench` for
/// that command's help (`COMMAND --help`), so that it is the one that answers.
pub fn help_of_bench(argv: &[OsString]) -> Option<Vec<OsString>> {
    match argv {
        [program, help, command]
            if help == "help" && BENCH_COMMANDS.iter().any(|c| command == c) =>
        {
            Some(vec![
                program.clone(),
                command.clone(),
                OsString::from("--help"),
            ])
        }
        _ => None,
    }
}

/// A hidden command's arguments: whatever follows its name, for `pmnet-bench` to parse.
#[derive(Debug, Clone, Args)]
pub struct Forwarded {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<OsString>,
}

/// Run `pmnet-bench` with this process's arguments (`argv` without the program's name) and
/// return its exit status. On Unix the process becomes `pmnet-bench` (exec), so its exit
/// code and signals are the user's directly.
pub fn to_bench(argv: &[OsString]) -> Result<ExitCode, CliError> {
    let here = std::env::current_exe().ok();
    let path = std::env::var_os("PATH");
    let Some(program) = find_bench(here.as_deref(), path.as_deref()) else {
        return Err(not_found(here.as_deref()).into());
    };
    let mut command = std::process::Command::new(&program);
    command.args(argv.iter().skip(1));
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        let error = command.exec();
        Err(format!("cannot run {}: {error}", program.display()).into())
    }
    #[cfg(not(unix))]
    {
        let status = command
            .status()
            .map_err(|error| format!("cannot run {}: {error}", program.display()))?;
        Ok(status
            .code()
            .and_then(|code| u8::try_from(code).ok())
            .map_or(ExitCode::FAILURE, ExitCode::from))
    }
}

/// `pmnet-bench` next to `exe` (this program), else in a directory of `path` (`PATH`).
pub fn find_bench(exe: Option<&Path>, path: Option<&OsStr>) -> Option<PathBuf> {
    let beside = exe
        .and_then(Path::parent)
        .map(|dir| dir.join(BENCH_BINARY))
        .filter(|candidate| is_program(candidate));
    beside.or_else(|| {
        std::env::split_paths(path?)
            .map(|dir| dir.join(BENCH_BINARY))
            .find(|candidate| is_program(candidate))
    })
}

fn is_program(path: &Path) -> bool {
    path.metadata().is_ok_and(|meta| meta.is_file())
}

fn not_found(exe: Option<&Path>) -> String {
    let beside = exe.and_then(Path::parent).map_or_else(
        || "this program's directory".to_owned(),
        |dir| dir.display().to_string(),
    );
    format!(
        "the benchmarks are in the {BENCH_BINARY} binary, found neither in {beside} nor on \
         PATH; build it with `cargo build --release -p {BENCH_BINARY}` (it goes next to pmnet, \
         in target/release) and run this again, or run {BENCH_BINARY} directly"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_binary_is_found_beside_this_one_first_then_on_the_path() {
        let beside = tempfile::tempdir().unwrap();
        let on_path = tempfile::tempdir().unwrap();
        let exe = beside.path().join("pmnet");
        let path = std::env::join_paths([on_path.path()]).unwrap();
        assert_eq!(find_bench(Some(&exe), Some(&path)), None);
        std::fs::write(on_path.path().join(BENCH_BINARY), "").unwrap();
        assert_eq!(
            find_bench(Some(&exe), Some(&path)),
            Some(on_path.path().join(BENCH_BINARY))
        );
        std::fs::write(beside.path().join(BENCH_BINARY), "").unwrap();
        assert_eq!(
            find_bench(Some(&exe), Some(&path)),
            Some(beside.path().join(BENCH_BINARY))
        );
        assert_eq!(
            find_bench(None, None),
            None,
            "nothing to look in, nothing found"
        );
    }

    #[test]
    fn a_missing_bench_binary_is_reported_with_how_to_build_it() {
        let message = not_found(Some(Path::new("/opt/pmnet/bin/pmnet")));
        assert!(message.contains("/opt/pmnet/bin"), "{message}");
        assert!(
            message.contains("cargo build --release -p pmnet-bench"),
            "{message}"
        );
    }
}
