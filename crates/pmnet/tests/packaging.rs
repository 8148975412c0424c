//! The packaged services (packaging/, scripts/build-deb.sh): each systemd unit runs its
//! command with its configuration file, every sample configuration parses, and the sample
//! one-host deployment works together — started here as the units start it (the state
//! directory in $STATE_DIRECTORY), on free ports instead of the samples' fixed ones.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{pmnet_bin, poll_until, Proc};

/// The commands that run as services: one unit and one sample configuration each.
const SERVICES: &[&str] = &[
    "device",
    "server",
    "gateway",
    "redis-adaptor",
    "controller",
    "memnode",
];

fn packaging() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging")
}

fn sample(command: &str) -> PathBuf {
    packaging().join(format!("etc/{command}-local.toml"))
}

fn names_in(dir: &Path, suffix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(suffix))
        .collect();
    names.sort();
    names
}

#[test]
fn every_unit_runs_its_command_with_its_configuration() {
    let mut expected: Vec<String> = SERVICES
        .iter()
        .map(|command| format!("pmnet-{command}@.service"))
        .collect();
    expected.sort();
    assert_eq!(names_in(&packaging().join("systemd"), ".service"), expected);
    for command in SERVICES {
        let path = packaging().join(format!("systemd/pmnet-{command}@.service"));
        let text = std::fs::read_to_string(&path).unwrap();
        let settings: Vec<(&str, &str)> = text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| line.split_once('='))
            .collect();
        let value = |key: &str| -> Vec<&str> {
            settings
                .iter()
                .filter(|(k, _)| *k == key)
                .map(|(_, v)| *v)
                .collect()
        };
        let unit = path.display();
        assert_eq!(
            value("ExecStart"),
            [format!(
                "/usr/bin/pmnet {command} --config /etc/pmnet/{command}-%i.toml"
            )],
            "{unit}"
        );
        for (key, wanted) in [
            ("User", "pmnet"),
            ("Group", "pmnet"),
            ("StateDirectory", "pmnet"),
            ("ConfigurationDirectory", "pmnet"),
            ("Restart", "on-failure"),
            ("NoNewPrivileges", "yes"),
            ("ProtectSystem", "strict"),
            ("ProtectHome", "yes"),
            ("PrivateTmp", "yes"),
            ("WantedBy", "multi-user.target"),
        ] {
            assert_eq!(value(key), [wanted], "{unit}: {key}");
        }
        assert_eq!(
            value("RestrictAddressFamilies"),
            ["AF_INET AF_INET6 AF_UNIX AF_NETLINK"],
            "{unit}"
        );
        assert!(sample(command).is_file(), "{unit}: no sample configuration");
    }
    assert_eq!(
        names_in(&packaging().join("systemd"), ".service")
            .iter()
            .filter(|name| {
                let text = std::fs::read_to_string(packaging().join("systemd").join(name)).unwrap();
                text.contains("\nLimitMEMLOCK=infinity\n")
            })
            .count(),
        3,
        "the device, the server and the memory node map their files and may lock memory"
    );
}

#[test]
fn every_sample_configuration_parses() {
    let mut expected: Vec<String> = SERVICES
        .iter()
        .map(|command| format!("{command}-local.toml"))
        .collect();
    expected.sort();
    assert_eq!(names_in(&packaging().join("etc"), ".toml"), expected);
    for command in SERVICES {
        let path = sample(command);
        let text = std::fs::read_to_string(&path).unwrap();
        let table: toml::Table = text.parse().unwrap();
        assert_eq!(
            table.keys().collect::<Vec<_>>(),
            [command],
            "{}: one table, [{command}]",
            path.display()
        );
        // The file's keys and values are checked before --help is printed.
        let output = Command::new(pmnet_bin())
            .args([command, "--config"])
            .arg(&path)
            .arg("--help")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        // Every commented-out option names a real one too.
        let commented: String = text
            .lines()
            .filter_map(|line| line.strip_prefix("# "))
            .filter(|line| {
                line.split_once(" = ").is_some_and(|(key, _)| {
                    !key.is_empty()
                        && key
                            .chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                })
            })
            .map(|line| format!("{line}\n"))
            .collect();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), format!("[{command}]\n{commented}")).unwrap();
        let output = Command::new(pmnet_bin())
            .args([command, "--config"])
            .arg(file.path())
            .arg("--help")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}, the commented-out options:\n{commented}\n{}",
            path.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// A loopback port free for both UDP and TCP a moment ago, below the ephemeral range.
fn free_port() -> u16 {
    for _ in 0..1000 {
        let port = rand::random_range(20_000..32_768u16);
        if UdpSocket::bind(("127.0.0.1", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
    panic!("no free port");
}

/// The sample deployment's files, each loopback port replaced by a free one (the same one in
/// every file) and /var/lib/pmnet by `state`.
fn rewritten_samples(state: &Path, into: &Path) -> (BTreeMap<u16, u16>, BTreeMap<String, PathBuf>) {
    let mut ports = BTreeMap::new();
    let mut files = BTreeMap::new();
    for command in SERVICES {
        let mut text = std::fs::read_to_string(sample(command)).unwrap();
        let mut rewritten = String::new();
        while let Some(at) = text.find("127.0.0.1:") {
            let digits: String = text[at + 10..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            let port: u16 = digits.parse().unwrap();
            let new = *ports.entry(port).or_insert_with(free_port);
            rewritten.push_str(&text[..at]);
            rewritten.push_str(&format!("127.0.0.1:{new}"));
            text = text[at + 10 + digits.len()..].to_owned();
        }
        rewritten.push_str(&text);
        let rewritten = rewritten.replace("/var/lib/pmnet", &state.display().to_string());
        let path = into.join(format!("{command}-local.toml"));
        std::fs::write(&path, rewritten).unwrap();
        files.insert(command.to_string(), path);
    }
    (ports, files)
}

/// `pmnet COMMAND --config FILE`, as its unit runs it: the state directory in
/// $STATE_DIRECTORY, the working directory in it.
fn start_service(command: &str, config: &Path, state: &Path) -> Proc {
    let mut process = Command::new(pmnet_bin());
    process
        .args([command, "--config"])
        .arg(config)
        .env("STATE_DIRECTORY", state)
        .current_dir(state);
    let mut proc = Proc::spawn_command(command, process);
    proc.wait_for_line("its banner", |line| line.contains("listening on"));
    proc
}

fn pmnet(args: &[&str]) -> Result<String, String> {
    let output = Command::new(pmnet_bin()).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if output.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

fn on_path(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|output| output.status.success())
}

/// One RESP command to `addr`, its reply.
fn resp(addr: SocketAddr, words: &[&str]) -> Result<String, String> {
    let mut stream = TcpStream::connect(addr).map_err(|error| error.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut request = format!("*{}\r\n", words.len());
    for word in words {
        request.push_str(&format!("${}\r\n{word}\r\n", word.len()));
    }
    stream
        .write_all(request.as_bytes())
        .map_err(|error| error.to_string())?;
    let mut reply = vec![0u8; 512];
    let count = stream.read(&mut reply).map_err(|error| error.to_string())?;
    Ok(String::from_utf8_lossy(&reply[..count]).into_owned())
}

#[test]
fn the_sample_deployment_works_together() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    let (ports, files) = rewritten_samples(&state, dir.path());
    let port = |sample: u16| ports[&sample];
    let addr = |sample: u16| format!("127.0.0.1:{}", port(sample));

    let mut running = Vec::new();
    running.push(start_service("server", &files["server"], &state));
    running.push(start_service("device", &files["device"], &state));
    let device = addr(7400);
    poll_until("an update acked through the sample device", || {
        pmnet(&["client", "--device", &device, "set", "greeting", "hello"])
            .and_then(|out| out.starts_with("OK").then_some(()).ok_or(out))
    });
    let got = pmnet(&["client", "--device", &device, "get", "greeting"]).unwrap();
    assert_eq!(got.trim(), "hello (from server 1)");
    assert!(state.join("pmnet-device-1.log").is_file());
    assert!(state.join("pmnet-server-1.data").is_file());

    running.push(start_service("memnode", &files["memnode"], &state));
    let node = addr(7800);
    poll_until("a line written to the sample memory node", || {
        pmnet(&["memory", "--node", &node, "write", "0", "hello"]).map(drop)
    });
    assert!(pmnet(&["memory", "--node", &node, "read", "0"])
        .unwrap()
        .contains("hello"));

    if on_path("etcd") {
        running.push(start_service("controller", &files["controller"], &state));
        assert!(state.join("controller-local.etcd").is_dir());
    } else {
        eprintln!("no etcd (Debian's etcd-server): the sample controller not started");
    }

    if on_path("redis-server") {
        let redis = port(6379);
        let redis_dir = dir.path().join("redis");
        std::fs::create_dir(&redis_dir).unwrap();
        let mut redis_server = Command::new("redis-server")
            .args([
                "--port",
                &redis.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .arg("--dir")
            .arg(&redis_dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let result = std::panic::catch_unwind(|| {
            let adaptor = start_service("redis-adaptor", &files["redis-adaptor"], &state);
            let gateway = start_service("gateway", &files["gateway"], &state);
            let gateway_addr: SocketAddr = addr(6380).parse().unwrap();
            poll_until("SET through the sample gateway", || {
                resp(gateway_addr, &["SET", "colour", "blue"])
                    .and_then(|reply| (reply == "+OK\r\n").then_some(()).ok_or(reply))
            });
            // Acked by the device at once; applied to Redis by the adaptor soon after.
            let redis_addr: SocketAddr = addr(6379).parse().unwrap();
            poll_until("the SET applied to Redis", || {
                resp(redis_addr, &["GET", "colour"])
                    .and_then(|reply| (reply == "$4\r\nblue\r\n").then_some(()).ok_or(reply))
            });
            (adaptor, gateway)
        });
        let _ = redis_server.kill();
        let _ = redis_server.wait();
        let (mut adaptor, mut gateway) =
            result.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        gateway.stop();
        adaptor.kill();
    } else {
        eprintln!("no redis-server: the sample adaptor and gateway not started");
    }

    // SIGTERM, as systemctl stop sends it: each stops cleanly.
    for mut proc in running.into_iter().rev() {
        proc.stop();
    }
}
