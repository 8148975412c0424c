//! The chain store's controller on etcd, as a user starts it: a real etcd (Debian's
//! `etcd-server`, started by the test), two `pmnet controller` processes on it (one leads, one
//! stands by) and three `pmnet device --chain-controller A --chain-controller B` members, with
//! clients naming both controllers writing and reading under load. The leading controller is
//! SIGKILLed: the other takes over from the state in etcd (a new epoch) and the chains serve
//! again; the first, started again, stands by; the second is stopped (SIGTERM) and gives the
//! leadership up, and the first leads again. Every key's history, across all of it, is
//! linearizable. (How long each takeover took is printed, not checked: timing belongs in
//! benchmarks.)

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{chain_member, free_udp_addr, run_pmnet, Node, Proc};
use pmnet_lincheck::{check_by_key, Register, RegisterInput, PENDING};

const GROUPS: u16 = 4;

/// Whether an epoch line shows every group with three members, none paused or joining.
fn whole(line: &str) -> bool {
    let Some((_, groups)) = line.split_once(": ") else {
        return false;
    };
    line.starts_with("epoch ")
        && groups.split("; ").count() == usize::from(GROUPS)
        && groups.split("; ").all(|group| {
            !group.contains("paused") && !group.contains(" +") && group.matches(" > ").count() == 2
        })
}

fn epoch_of(line: &str) -> u64 {
    line.strip_prefix("epoch ")
        .and_then(|rest| rest.split(':').next())
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("no epoch in {line:?}"))
}

fn controller_args(listen: SocketAddr, etcd: SocketAddr, members: &[SocketAddr]) -> Vec<String> {
    let mut list: Vec<String> = [
        "controller",
        "--etcd",
        &etcd.to_string(),
        "--cluster",
        "test",
        "--listen",
        &listen.to_string(),
        "--groups",
        &GROUPS.to_string(),
        "--metrics",
        "127.0.0.1:0",
        "--report-interval",
        "0",
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    for member in members {
        list.extend(["--member".to_owned(), member.to_string()]);
    }
    list
}

type History = common::ChainHistory;

#[test]
fn the_leading_controller_killed_or_stopped_is_replaced_from_etcd_and_every_history_is_linearizable(
) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let etcd = pmnet_etcd::LocalEtcd::start(
        "etcd",
        &dir.path().join("etcd"),
        "127.0.0.1:0".parse().expect("address"),
        Duration::from_secs(30),
    )
    .expect("start etcd (apt-get install etcd-server)");
    let (a, b) = (free_udp_addr(), free_udp_addr());
    let members: Vec<SocketAddr> = (0..3).map(|_| free_udp_addr()).collect();

    // A starts first and leads; B stands by.
    let leader = Node::start(
        "controller A",
        controller_args(a, etcd.endpoint(), &members),
    );
    assert!(
        leader.banner.iter().any(|line| line.contains("leads")),
        "{:?}",
        leader.banner
    );
    let mut leader = leader.proc;
    // B's metrics at an address of its own: it says it stands by, then that it leads.
    let b_metrics = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        probe.local_addr().expect("its address")
    };
    let mut b_args = controller_args(b, etcd.endpoint(), &members);
    let at = b_args
        .iter()
        .position(|arg| arg == "--metrics")
        .expect("--metrics");
    b_args[at + 1] = b_metrics.to_string();
    let mut standby = Proc::spawn("controller B", &b_args);
    standby.wait_for_line("B standing by", |line| {
        line.contains("standing by") && line.contains(&a.to_string())
    });
    let leading = |addr: SocketAddr| {
        let text = pmnet_runtime::metrics::scrape(addr, Duration::from_secs(5))
            .map_err(|error| error.to_string())?;
        pmnet_runtime::metrics::find_sample(&text, "pmnet_controller_leading", "")
            .ok_or_else(|| format!("no pmnet_controller_leading in:\n{text}"))
    };
    assert_eq!(leading(b_metrics), Ok(0.0), "a standby says it stands by");
    let membership = [
        "--chain-controller".to_owned(),
        a.to_string(),
        "--chain-controller".to_owned(),
        b.to_string(),
    ];
    let nodes: Vec<Node> = members
        .iter()
        .enumerate()
        .map(|(index, listen)| chain_member(index as u16 + 1, *listen, &membership, dir.path()))
        .collect();
    let first = leader.wait_for_line("chains of three", whole);

    // Four clients on their keys' mix of reads and writes, naming both controllers.
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(History::new()));
    let keys: Vec<Vec<u8>> = (0..8u8)
        .map(|index| format!("key{index}").into_bytes())
        .collect();
    let clients = common::chain_clients(4, 0xc0de_0000, &[a, b], &keys, started, &stop, &history);
    let writes_since = |since: u64| {
        history
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, op)| {
                op.call >= since && op.ret != PENDING && matches!(op.input, RegisterInput::Write(_))
            })
            .count()
    };
    common::poll_until("writes under way", || match writes_since(0) {
        0 => Err("no write completed yet".to_owned()),
        count => Ok(count),
    });

    // Kill the leader: B takes over once its lease ran out, from the state in etcd, with a
    // new epoch, and the writes go on.
    let killed_at = started.elapsed().as_nanos() as u64;
    leader.kill();
    standby.wait_for_line("B leading", |line| line.contains("leads"));
    let took_over = standby.wait_for_line("B's chains of three", whole);
    // The same address, now the leading runtime's.
    common::poll_until("B's metrics say it leads", || match leading(b_metrics) {
        Ok(1.0) => Ok(()),
        other => Err(format!("{other:?}")),
    });
    assert!(
        epoch_of(&took_over) > epoch_of(&first),
        "{took_over} after {first}"
    );
    let took_over_at = started.elapsed().as_nanos() as u64;
    common::poll_until(
        "writes completed after the takeover",
        || match writes_since(took_over_at) {
            0 => Err("none since".to_owned()),
            count => Ok(count),
        },
    );
    // The members said why they stopped answering, and that they answer again.
    common::poll_until("the members' words on the lapse", || {
        let said: String = nodes.iter().map(|node| node.proc.stderr()).collect();
        if said.contains("the controller's lease ran out")
            && said.contains("answering clients again")
        {
            Ok(())
        } else {
            Err(said)
        }
    });
    eprintln!(
        "B took over {:.0} ms after A was killed",
        (started.elapsed().as_nanos() as u64 - killed_at) as f64 / 1e6
    );

    // A, started again, stands by; B stopped gives the leadership up and A leads again.
    let mut again = Proc::spawn(
        "controller A again",
        &controller_args(a, etcd.endpoint(), &members),
    );
    again.wait_for_line("A standing by", |line| {
        line.contains("standing by") && line.contains(&b.to_string())
    });
    let stopped_at = started.elapsed().as_nanos() as u64;
    standby.signal(libc::SIGTERM);
    standby.wait_for_line("B giving up the leadership", |line| {
        line.contains("leadership given up")
    });
    again.wait_for_line("A leading again", |line| line.contains("leads"));
    let back = again.wait_for_line("A's chains of three", whole);
    assert!(
        epoch_of(&back) > epoch_of(&took_over),
        "{back} after {took_over}"
    );
    eprintln!(
        "A took over {:.0} ms after B was told to stop",
        (started.elapsed().as_nanos() as u64 - stopped_at) as f64 / 1e6
    );
    let resumed_at = started.elapsed().as_nanos() as u64;
    common::poll_until("writes completed under A again", || {
        match writes_since(resumed_at) {
            0 => Err("none since".to_owned()),
            count => Ok(count),
        }
    });
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().expect("a client thread");
    }

    // The state is in etcd, under the cluster's prefix, with the last epoch.
    let mut client = pmnet_etcd::Etcd::connect(&[etcd.endpoint()], Duration::from_secs(5))
        .expect("connect to etcd");
    let state = client
        .get(b"/pmnet/test/chain/state")
        .expect("read the state")
        .expect("a saved state");
    let layout = pmnet_netchain::decode_state(&state.value).expect("a state that decodes");
    assert!(
        layout.epoch >= epoch_of(&back),
        "{} < {}",
        layout.epoch,
        epoch_of(&back)
    );

    // `pmnet status` on the leader says where its state is.
    let metrics = again
        .stdout()
        .iter()
        .find_map(|line| {
            line.split_once("metrics: http://")
                .map(|(_, rest)| rest.split(['/', ' ']).next().unwrap_or("").to_owned())
        })
        .expect("a metrics address");
    let (status, out, err) = run_pmnet(&["status".to_owned(), metrics], None);
    assert!(status.success() && out.contains("etcd"), "{out}{err}");

    let history = Arc::try_unwrap(history).unwrap().into_inner().unwrap();
    let writes = history
        .iter()
        .filter(|(_, op)| matches!(op.input, RegisterInput::Write(_)))
        .count();
    eprintln!("{} operations, {writes} writes", history.len());
    let verdict = check_by_key(&Register::default(), &history, 50_000_000);
    assert!(
        verdict.is_linearizable(),
        "{verdict:?} ({} operations)",
        history.len()
    );
}

#[test]
fn without_etcd_the_controller_starts_one_of_its_own_and_says_so() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let listen = free_udp_addr();
    let mut args = controller_args(listen, "127.0.0.1:1".parse().unwrap(), &[free_udp_addr()]);
    let at = args.iter().position(|arg| arg == "--etcd").expect("--etcd");
    args.drain(at..at + 2);
    args.extend([
        "--etcd-dir".to_owned(),
        dir.path().join("etcd").display().to_string(),
        "--chain-length".to_owned(),
        "1".to_owned(),
    ]);
    let node = Node::start("controller", args);
    let banner = node.banner.join("\n");
    assert!(banner.contains("a one-member etcd of its own"), "{banner}");
    assert!(banner.contains("for one machine only"), "{banner}");
    let mut proc = node.proc;
    proc.signal(libc::SIGTERM);
    proc.wait_for_line("its last words", |line| {
        line.contains("leadership given up")
    });
    let status = proc
        .wait_timeout(Duration::from_secs(20))
        .expect("it exits");
    assert!(status.success(), "{status:?}");
    // Its etcd went with it: its data directory is free for the next start.
    let started = Node::start("controller again", {
        let mut again = controller_args(listen, "127.0.0.1:1".parse().unwrap(), &[]);
        let at = again
            .iter()
            .position(|arg| arg == "--etcd")
            .expect("--etcd");
        again.drain(at..at + 2);
        again.extend([
            "--etcd-dir".to_owned(),
            dir.path().join("etcd").display().to_string(),
            "--chain-length".to_owned(),
            "1".to_owned(),
        ]);
        again
    });
    // The members came from the state in its etcd (no --member this time).
    assert!(
        started
            .banner
            .iter()
            .any(|line| line.contains("chains: 1 members")),
        "{:?}",
        started.banner
    );
}
