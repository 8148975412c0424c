//! `pmnet testbed up|down|status|exec`: a testbed of hosts in network namespaces on this
//! machine — a client, a device routing between the client and the server, and a server —
//! for trying and measuring PMNet across hosts on one machine (docs/testbed.md).

use std::ffi::OsString;
use std::fmt::Write as _;
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use pmnet_testbed::{Host, Testbed, TestbedError};

use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct TestbedArgs {
    #[command(subcommand)]
    pub command: TestbedCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum TestbedCommand {
    /// Build the testbed (or find it built): namespaces NAME-c, NAME-d and NAME-s, a veth link
    /// from the client (10.77.1.2) to the device (10.77.1.1) and one from the device
    /// (10.77.2.1) to the server (10.77.2.2), the device forwarding between them. Prints the
    /// hosts and example commands. A testbed found only partly built is rebuilt. Needs root.
    Up(NameArgs),
    /// Take the testbed down: delete its namespaces and their links (nothing to do when it is
    /// not there). Needs root.
    Down(NameArgs),
    /// Whether the testbed is up, and its hosts, addresses and MAC addresses. Exit status: 0
    /// when it is up, 1 when it is not (or only partly). Needs root.
    Status(NameArgs),
    /// Run a command on a host of the testbed (in its network namespace, with `ip netns
    /// exec`), with this terminal's input and output: this process becomes the command, so its
    /// signals and exit status are the command's.
    /// Example: `pmnet testbed exec client -- ping -c 1 10.77.2.2`. Needs root.
    Exec(ExecArgs),
}

#[derive(Debug, Clone, Args)]
pub struct NameArgs {
    /// The testbed's name: its namespaces are NAME-c, NAME-d and NAME-s. Testbeds with
    /// different names coexist (the same addresses, each inside its own namespaces).
    #[arg(long, value_name = "NAME", default_value = pmnet_testbed::DEFAULT_NAME)]
    pub name: String,
}

#[derive(Debug, Clone, Args)]
pub struct ExecArgs {
    /// The host to run the command on.
    #[arg(value_name = "HOST", value_enum)]
    pub host: HostArg,

    #[command(flatten)]
    pub name: NameArgs,

    /// The command and its arguments, after `--`.
    #[arg(value_name = "COMMAND", last = true, required = true)]
    pub command: Vec<OsString>,
}

/// A host of the testbed, on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HostArg {
    /// The client host (10.77.1.2).
    Client,
    /// The device host, routing between client and server (10.77.1.1 and 10.77.2.1).
    Device,
    /// The server host (10.77.2.2).
    Server,
}

impl From<HostArg> for Host {
    fn from(host: HostArg) -> Host {
        match host {
            HostArg::Client => Host::Client,
            HostArg::Device => Host::Device,
            HostArg::Server => Host::Server,
        }
    }
}

/// Exit status of `status` for a testbed that is not up.
const EXIT_NOT_UP: u8 = 1;

pub fn run(args: TestbedArgs) -> Result<ExitCode, CliError> {
    match args.command {
        TestbedCommand::Up(args) => {
            let existed = Testbed::exists(&args.name);
            let testbed = Testbed::up(&args.name)?;
            let verb = if existed { "is up (reused)" } else { "is up" };
            print!("{}", describe(&testbed, verb));
            print!("{}", examples(&testbed));
            Ok(ExitCode::SUCCESS)
        }
        TestbedCommand::Down(args) => {
            let existed = Testbed::exists(&args.name);
            Testbed::down(&args.name)?;
            if existed {
                println!("testbed {} is down: its namespaces are deleted", args.name);
            } else {
                println!("testbed {} was not up: nothing to do", args.name);
            }
            Ok(ExitCode::SUCCESS)
        }
        TestbedCommand::Status(args) => match Testbed::open(&args.name) {
            Ok(testbed) => {
                print!("{}", describe(&testbed, "is up"));
                Ok(ExitCode::SUCCESS)
            }
            Err(error @ (TestbedError::NotUp { .. } | TestbedError::Incomplete { .. })) => {
                println!("{error}");
                Ok(ExitCode::from(EXIT_NOT_UP))
            }
            Err(error) => Err(error.into()),
        },
        TestbedCommand::Exec(args) => exec(args),
    }
}

fn exec(args: ExecArgs) -> Result<ExitCode, CliError> {
    let testbed = Testbed::open(&args.name.name)?;
    let host = Host::from(args.host);
    let (program, rest) = args
        .command
        .split_first()
        .ok_or("no command given: put it after `--`")?;
    // Become the command (through `ip netns exec`, which execs it too): signals sent to this
    // process reach it, and its exit status is this process's. A wrapper that waited for a
    // child would leave the child running when killed.
    use std::os::unix::process::CommandExt;
    let error = testbed.command(host, program).args(rest).exec();
    Err(format!(
        "cannot run `ip netns exec {}`: {error}",
        testbed.netns(host)
    )
    .into())
}

/// The hosts, their namespaces, interfaces, addresses, MAC addresses and routes.
fn describe(testbed: &Testbed, verb: &str) -> String {
    let mut text = format!(
        "testbed {} {verb}: three hosts in network namespaces, the device routing between the \
         client and the server\n\n",
        testbed.name()
    );
    let _ = writeln!(
        text,
        "  {:<7} {:<12} {:<10} {:<14} {:<18} route",
        "host", "namespace", "interface", "address", "MAC"
    );
    for interface in testbed.interfaces() {
        let route = match (interface.host, interface.host.gateway()) {
            (_, Some(gateway)) => format!("default via {gateway}"),
            (Host::Device, None) if interface.name == pmnet_testbed::DEVICE_CLIENT_IF => {
                "forwards between cl and sv".to_owned()
            }
            _ => String::new(),
        };
        let address = format!("{}/{}", interface.addr, interface.prefix_len);
        let line = format!(
            "  {:<7} {:<12} {:<10} {:<14} {:<18} {route}",
            interface.host.as_str(),
            testbed.netns(interface.host),
            interface.name,
            address,
            interface.mac.to_string(),
        );
        let _ = writeln!(text, "{}", line.trim_end());
    }
    text
}

/// Commands to start PMNet on the testbed and to take it down.
fn examples(testbed: &Testbed) -> String {
    use pmnet_testbed::{DEVICE_CLIENT_SIDE, DEVICE_SERVER_SIDE, SERVER_ADDR};
    let name = testbed.name();
    let option = if name == pmnet_testbed::DEFAULT_NAME {
        String::new()
    } else {
        format!(" --name {name}")
    };
    let pmnet = pmnet_program();
    let exec = |host: &str, command: String| {
        format!("  {pmnet} testbed exec {host}{option} -- {command}\n")
    };
    // The hosts' addresses are not loopback: every process needs the deployment's key file
    // (protected mode), which the namespaces share with this host's file system.
    let key = format!("/tmp/pmnet-{name}.key");
    let mut text = format!(
        "\nMake the deployment's key file (once):\n  {pmnet} keygen --out {key}\n\
         Run commands on a host (each in a terminal of its own):\n"
    );
    text += &exec(
        "server",
        format!(
            "{pmnet} server --listen {SERVER_ADDR}:7500 --device {DEVICE_SERVER_SIDE}:7400 \
             --key-file {key}"
        ),
    );
    text += &exec(
        "device",
        format!(
            "{pmnet} device --listen 0.0.0.0:7400 --server 1={SERVER_ADDR}:7500 --key-file {key}"
        ),
    );
    text += &exec(
        "client",
        format!(
            "{pmnet} client --device {DEVICE_CLIENT_SIDE}:7400 --key-file {key} set greeting \
             hello"
        ),
    );
    let _ = writeln!(
        text,
        "(or `ip netns exec {} COMMAND`). Take it down with `{pmnet} testbed down{option}`.",
        testbed.netns(Host::Client)
    );
    text
}

/// How the examples name this program: `pmnet` when that is on the PATH, else its own path.
fn pmnet_program() -> String {
    let on_path = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("pmnet").is_file()));
    match std::env::current_exe() {
        Ok(exe) if !on_path => exe.display().to_string(),
        _ => "pmnet".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_map_to_the_testbeds() {
        assert_eq!(Host::from(HostArg::Client), Host::Client);
        assert_eq!(Host::from(HostArg::Device), Host::Device);
        assert_eq!(Host::from(HostArg::Server), Host::Server);
    }
}
