//! What can go wrong building, checking or using a testbed.

use std::path::PathBuf;

/// An error of the testbed: which `ip` command failed and what it said, or which check failed.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// The testbed's name cannot make namespace names.
    #[error("testbed name {name:?} is not valid: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Not running as root: namespaces and veth links need CAP_SYS_ADMIN and CAP_NET_ADMIN.
    #[error(
        "the testbed needs root (it makes network namespaces and veth links); run this as root, \
         for example with sudo"
    )]
    NotRoot,
    /// A program (`ip`, or a command run in a namespace) could not be started.
    #[error("cannot run `{command}`: {source}{hint}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why it did not start.
        source: std::io::Error,
        /// A hint for the user (empty or starting with "; ").
        hint: &'static str,
    },
    /// A command ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status, as text.
        status: String,
        /// What it wrote to stderr (trimmed), or a note that it wrote nothing.
        stderr: String,
    },
    /// A command's output was not what the testbed expected.
    #[error("cannot read the output of `{command}`: {problem}; its output was: {output:?}")]
    Output {
        /// The command line.
        command: String,
        /// What was missing or wrong.
        problem: String,
        /// The output.
        output: String,
    },
    /// None of the testbed's namespaces exists.
    #[error(
        "testbed {name:?} is not up (there are no namespaces {name}-c, {name}-d and {name}-s); \
         start it with `pmnet testbed up --name {name}`"
    )]
    NotUp {
        /// The testbed's name.
        name: String,
    },
    /// Some of the testbed exists, but not all of it, or not as it should be.
    #[error(
        "testbed {name:?} is only partly set up: {problem}; `pmnet testbed up --name {name}` \
         rebuilds it"
    )]
    Incomplete {
        /// The testbed's name.
        name: String,
        /// The first thing found missing or wrong.
        problem: String,
    },
    /// The calling thread could not join a namespace.
    #[error("cannot enter network namespace {netns} ({}): {source}", path.display())]
    Enter {
        /// The namespace.
        netns: String,
        /// Its file.
        path: PathBuf,
        /// What setns or open said.
        source: std::io::Error,
    },
    /// A sysctl file inside a namespace could not be read or written.
    #[error("cannot {action} {path} in network namespace {netns}: {source}")]
    Sysctl {
        /// "read" or "write 1 to".
        action: &'static str,
        /// The file under /proc/sys.
        path: &'static str,
        /// The namespace.
        netns: String,
        /// What the file system said.
        source: std::io::Error,
    },
    /// A thread running code inside a namespace panicked.
    #[error("the thread working in network namespace {netns} panicked")]
    ThreadPanicked {
        /// The namespace.
        netns: String,
    },
}
