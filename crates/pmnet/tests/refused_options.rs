//! Options that cannot work are refused before anything starts: a configuration file with a
//! misspelt table or key or a value of the wrong kind, and a device told that it is its own
//! server. Real processes; each must exit non-zero with a message that says what to change.

mod common;

use std::path::Path;

use common::{args, free_udp_addr, run_pmnet};

/// Run `pmnet ARGS`, which must fail without a panic and without starting to serve, saying
/// every one of `hints` on stderr.
fn must_fail(list: &[&str], hints: &[&str]) {
    let (status, stdout, stderr) = run_pmnet(&args(list), None);
    let shown = format!("pmnet {}", list.join(" "));
    assert!(
        !status.success(),
        "{shown} succeeded\nstdout: {stdout}\nstderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{shown} panicked:\n{stderr}");
    assert!(
        !stdout.contains(" listening on "),
        "{shown} started:\n{stdout}"
    );
    for hint in hints {
        assert!(
            stderr.contains(hint),
            "{shown}: stderr does not mention {hint:?}:\n{stderr}"
        );
    }
}

fn write(path: &Path, text: &str) -> String {
    std::fs::write(path, text).unwrap();
    path.display().to_string()
}

#[test]
fn a_configuration_file_with_a_mistake_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let server = "1=127.0.0.1:9";

    let file = write(&dir.path().join("table.toml"), "[devise]\nslots = 64\n");
    must_fail(
        &["--config", &file, "device", "--server", server],
        &[
            &file,
            "line 1",
            "unknown table [devise]",
            "did you mean [device]?",
        ],
    );

    let file = write(
        &dir.path().join("key.toml"),
        "[device]\nserver = [\"1=127.0.0.1:9\"]\nslot = 64\n",
    );
    must_fail(
        &["--config", &file, "device"],
        &[
            &file,
            "line 3",
            "unknown option `slot` in [device]",
            "`slots`",
        ],
    );

    let file = write(
        &dir.path().join("negative.toml"),
        "[device]\nserver = [\"1=127.0.0.1:9\"]\nslots = -5\n",
    );
    must_fail(
        &["--config", &file, "device"],
        &[
            &file,
            "line 3",
            "`slots = -5`",
            "expected N",
            "0..=4294967295",
        ],
    );
}

#[test]
fn a_device_is_not_its_own_server() {
    let dir = tempfile::tempdir().unwrap();
    let own = free_udp_addr();
    let log = dir.path().join("device.log");
    let log = log.display().to_string();
    let listen = own.to_string();
    let itself = format!("1={own}");
    must_fail(
        &[
            "device",
            "--listen",
            &listen,
            "--server",
            &itself,
            "--log-file",
            &log,
        ],
        &["server 1", "own listen address", &listen],
    );
    // Listening on every address (which protected mode allows only with --insecure), reached
    // through loopback.
    let every = format!("0.0.0.0:{}", own.port());
    let through_loopback = format!("2=127.0.0.1:{}", own.port());
    must_fail(
        &[
            "device",
            "--insecure",
            "--listen",
            &every,
            "--server",
            "1=127.0.0.1:9",
            "--server",
            &through_loopback,
            "--log-file",
            &log,
        ],
        &["server 2", "own listen address"],
    );
    // Nothing was made of the log.
    assert!(!Path::new(&log).exists());
    must_fail(
        &[
            "device",
            "--listen",
            "127.0.0.1:0",
            "--server",
            "1=127.0.0.1:9",
            "--server",
            "1=127.0.0.1:10",
            "--log-file",
            &log,
        ],
        &["server id 1 is given twice"],
    );
}

#[test]
fn a_chain_member_that_cannot_work_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let listen = free_udp_addr().to_string();
    let other = free_udp_addr().to_string();
    let log = dir.path().join("d.log").display().to_string();
    let table = dir.path().join("c.table").display().to_string();
    let base = |extra: &[&str]| -> Vec<String> {
        let mut list: Vec<String> = [
            "device",
            "--listen",
            &listen,
            "--server",
            "1=127.0.0.1:9",
            "--log-file",
            &log,
            "--slots",
            "64",
            "--chain-table",
            &table,
        ]
        .iter()
        .map(|word| (*word).to_owned())
        .collect();
        list.extend(extra.iter().map(|word| (*word).to_owned()));
        list
    };
    let run = |extra: &[&str], hints: &[&str]| {
        let list = base(extra);
        let refs: Vec<&str> = list.iter().map(String::as_str).collect();
        must_fail(&refs, hints);
    };
    run(
        &["--chain-member", &other],
        &["not among the members", "--chain-me"],
    );
    // A table file that holds no table is never overwritten.
    std::fs::write(&table, b"not a table").unwrap();
    run(&["--chain-member", &listen], &[&table, "not a pmnet table"]);
    assert_eq!(std::fs::read(&table).unwrap(), b"not a table");
}

#[test]
fn a_chain_controller_that_cannot_work_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let listen = free_udp_addr().to_string();
    let member = free_udp_addr().to_string();
    // No member at a first start.
    let state = dir.path().join("first.state").display().to_string();
    must_fail(
        &["chain-controller", "--listen", &listen, "--state", &state],
        &["--member"],
    );
    // A damaged state file: named, with what to do.
    let damaged = write(
        &dir.path().join("damaged.state"),
        "PMNCTRL1 not a state at all",
    );
    must_fail(
        &[
            "chain-controller",
            "--listen",
            &listen,
            "--member",
            &member,
            "--state",
            &damaged,
        ],
        &[&damaged, "move it aside"],
    );
    // Seventeen members.
    let many: Vec<String> = (0..17).map(|_| free_udp_addr().to_string()).collect();
    let mut list = vec!["chain-controller", "--listen", &listen, "--state", &state];
    for member in &many {
        list.extend(["--member", member.as_str()]);
    }
    must_fail(&list, &["1 to 16 members"]);
    // A device told both to follow a controller and to use fixed chains.
    let log = dir.path().join("device.log").display().to_string();
    must_fail(
        &[
            "device",
            "--listen",
            &member,
            "--server",
            &format!("1={}", free_udp_addr()),
            "--log-file",
            &log,
            "--chain-controller",
            &listen,
            "--chain-member",
            &member,
        ],
        &["--chain-controller", "--chain-member"],
    );
}

#[test]
fn a_memory_node_or_abd_device_that_cannot_work_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let listen = free_udp_addr().to_string();
    let other = free_udp_addr().to_string();
    let file = dir.path().join("m.lines").display().to_string();
    let memnode = |extra: &[&str], hints: &[&str]| {
        let mut list = vec!["memnode", "--listen", &listen, "--file", &file];
        list.extend_from_slice(extra);
        must_fail(&list, hints);
    };
    memnode(&["--lines", "0"], &["--lines 0"]);
    memnode(&["--peer", &listen], &["this node's own address"]);
    // A file that holds no line store is never overwritten.
    std::fs::write(&file, b"not lines").unwrap();
    memnode(&[], &[&file, "not a pmnet table", "move it aside"]);
    assert_eq!(std::fs::read(&file).unwrap(), b"not lines");
    std::fs::remove_file(&file).unwrap();
    // A file of another size than --lines says.
    let mut made = common::Node::start(
        "memnode",
        args(&[
            "memnode", "--listen", &listen, "--file", &file, "--lines", "8",
        ]),
    );
    made.proc.stop();
    memnode(&["--lines", "16"], &["holds 8 lines, not the 16"]);

    let device = |extra: &[&str], hints: &[&str]| {
        let mut list = vec!["device", "--listen", &listen];
        list.extend_from_slice(extra);
        must_fail(&list, hints);
    };
    device(
        &["--abd-node", &other, "--abd-node", &other],
        &["each named once"],
    );
    device(&["--abd-node", &listen], &["the device's own address"]);
    device(
        &["--abd-node", &other, "--cache"],
        &["--cache keeps the reads of the servers", "--server"],
    );
    device(&[], &["--server"]);
}

#[test]
fn a_device_on_af_xdp_that_cannot_work_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("device.log").display().to_string();
    let listen = free_udp_addr().to_string();
    let base = [
        "device",
        "--listen",
        &listen,
        "--server",
        "1=127.0.0.1:9",
        "--log-file",
        &log,
    ];
    let with = |more: &[&'static str]| -> Vec<String> {
        base.iter()
            .map(|arg| arg.to_string())
            .chain(more.iter().map(|arg| arg.to_string()))
            .collect()
    };
    let check = |more: &[&'static str], hints: &[&str]| {
        let list = with(more);
        let list: Vec<&str> = list.iter().map(String::as_str).collect();
        must_fail(&list, hints);
    };
    check(&["--in-path"], &["--xdp"]);
    check(&["--xdp-mode", "generic"], &["--xdp"]);
    check(
        &["--xdp", "lo", "--xdp-mode", "turbo"],
        &["turbo", "native"],
    );
    check(
        &["--xdp", "lo", "--workers", "2"],
        &["--workers 2", "one worker"],
    );
    if pmnet_runtime::xdp_available().is_ok() {
        // Only where AF_XDP can run: elsewhere the device serves on its UDP socket instead.
        check(
            &["--xdp", "nosuch0"],
            &["interface nosuch0", "no such interface"],
        );
    }
}
