//! Automatic failover of replicated servers, as a user starts it (docs/replication.md,
//! "Automatic failover"): a real etcd (started by the test), two `pmnet controller
//! --device-chain … --replica-server …` on it (one leads), a device in front of a primary
//! `pmnet server` with two replica servers, every one with `--controller`, and three clients
//! writing under load, one of them incrementing a counter. A replica is SIGKILLed: the
//! controller takes it out of the primary's list and the primary goes on without it (a restart
//! in place). The primary is SIGKILLed: the replica furthest along is promoted in place and the
//! device forwards to it. No request fails, every write acknowledged before, during and after
//! is read back from the new primary, and the counter holds exactly the increments that were
//! answered. (How long each failover took is printed, not checked.)

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::writes::{following, outage, read_back, wait_for_writes, writer, Session, Writes};
use common::{free_udp_addr, Node, Proc};

fn s(text: impl ToString) -> String {
    text.to_string()
}

fn server(
    name: &str,
    listen: SocketAddr,
    devices: &[SocketAddr],
    replicas: &[SocketAddr],
    controllers: [SocketAddr; 2],
    dir: &std::path::Path,
) -> Node {
    let mut args = vec![
        s("server"),
        s("--listen"),
        s(listen),
        s("--server-id"),
        s(1),
        s("--data-file"),
        s(dir.join(format!("{name}.data")).display()),
        s("--data-mib"),
        s(16),
        s("--controller"),
        s(controllers[0]),
        s("--controller"),
        s(controllers[1]),
        s("--report-interval"),
        s(0),
    ];
    for device in devices {
        args.extend([s("--device"), s(device)]);
    }
    for replica in replicas {
        args.extend([s("--replica"), s(replica)]);
    }
    Node::start(name, args)
}

/// A session incrementing `counter` until `stop`: how many increments were answered, and the
/// errors.
fn incrementer(
    first: SocketAddr,
    controller: [SocketAddr; 2],
    stop: Arc<AtomicBool>,
    times: Arc<Mutex<Vec<Instant>>>,
) -> std::thread::JoinHandle<(u64, Vec<String>)> {
    std::thread::spawn(move || {
        let mut session = Session::start(&following(first, &controller));
        let (mut answered, mut errors) = (0u64, Vec::new());
        while !stop.load(Ordering::Relaxed) {
            let line = session.ask("incr counter");
            if line.trim() == format!("(integer) {}", answered + 1) {
                answered += 1;
                times.lock().unwrap().push(Instant::now());
            } else {
                errors.push(format!("incr {}: {line}", answered + 1));
            }
        }
        (answered, errors)
    })
}

#[test]
fn a_lost_replica_is_taken_out_a_lost_primary_replaced_and_every_acked_write_read_back() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let etcd = pmnet_etcd::LocalEtcd::start(
        "etcd",
        &dir.path().join("etcd"),
        "127.0.0.1:0".parse().expect("address"),
        Duration::from_secs(30),
    )
    .expect("start etcd (apt-get install etcd-server)");
    let controllers = [free_udp_addr(), free_udp_addr()];
    let (primary_addr, r1, r2, device_addr) = (
        free_udp_addr(),
        free_udp_addr(),
        free_udp_addr(),
        free_udp_addr(),
    );
    let controller_args = |listen: SocketAddr| {
        vec![
            s("controller"),
            s("--etcd"),
            s(etcd.endpoint()),
            s("--cluster"),
            s("servers"),
            s("--listen"),
            s(listen),
            s("--device-chain"),
            format!("1={primary_addr},1={device_addr}"),
            s("--replica-server"),
            format!("1={r1}"),
            s("--replica-server"),
            format!("1={r2}"),
            s("--suspect-after-ms"),
            s(150),
            s("--server-suspect-after-ms"),
            s(1000),
            s("--report-interval"),
            s(0),
        ]
    };
    let mut controller = Node::start("controller A", controller_args(controllers[0])).proc;
    let mut standby = Proc::spawn("controller B", &controller_args(controllers[1]));
    standby.wait_for_line("B standing by", |line| line.contains("standing by"));
    let replica1 = server(
        "replica1",
        r1,
        &[primary_addr],
        &[],
        controllers,
        dir.path(),
    );
    let mut replica2 = Some(server(
        "replica2",
        r2,
        &[primary_addr],
        &[],
        controllers,
        dir.path(),
    ));
    let mut primary = Some(server(
        "primary",
        primary_addr,
        &[device_addr],
        &[r1, r2],
        controllers,
        dir.path(),
    ));
    let _device = Node::start(
        "device",
        vec![
            s("device"),
            s("--listen"),
            s(device_addr),
            s("--server"),
            format!("1={primary_addr}"),
            s("--log-file"),
            s(dir.path().join("device.log").display()),
            s("--slots"),
            s(4096),
            s("--controller"),
            s(controllers[0]),
            s("--controller"),
            s(controllers[1]),
            s("--report-interval"),
            s(0),
        ],
    );
    common::poll_until("every node heard by the controller", || {
        let said = controller.stdout().join("\n");
        match [device_addr, primary_addr, r1, r2]
            .iter()
            .find(|address| !said.contains(&format!("{address} heard")))
        {
            None => Ok(()),
            Some(address) => Err(format!("{address} not heard yet")),
        }
    });

    let clients = 2;
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(Mutex::new(Writes::default()));
    let threads: Vec<_> = (0..clients)
        .map(|client| {
            let args = following(device_addr, &controllers);
            writer(client, args, stop.clone(), writes.clone())
        })
        .collect();
    let increment_times = Arc::new(Mutex::new(Vec::new()));
    let counter = incrementer(
        device_addr,
        controllers,
        stop.clone(),
        increment_times.clone(),
    );
    wait_for_writes(&writes, clients, Instant::now(), 20);

    // A replica: the primary goes on without it.
    let killed = Instant::now();
    replica2.take().expect("replica 2").proc.kill();
    controller.wait_for_line("replica 2 taken out", |line| {
        line.contains(&format!("replica server {r2}")) && line.contains("removed")
    });
    wait_for_writes(&writes, clients, killed, 20);
    println!(
        "replica killed: longest wait for an acknowledgement after it {:?}",
        outage(&writes, clients, killed)
    );

    // The primary: replica 1 (the only one left) is promoted; the device forwards to it.
    let killed = Instant::now();
    primary.take().expect("the primary").proc.kill();
    controller.wait_for_line("the primary replaced", |line| {
        line.contains(&format!("primary {primary_addr}"))
            && line.contains(&format!("replaced by its replica {r1}"))
    });
    wait_for_writes(&writes, clients, killed, 20);
    println!(
        "primary killed: longest wait for an acknowledgement after it {:?}",
        outage(&writes, clients, killed)
    );
    // Increments (answered by the server, not the device) go on with the new primary.
    common::poll_until("increments answered by the new primary", || {
        let times = increment_times.lock().unwrap();
        let after = times.iter().filter(|at| **at > killed).count();
        if after >= 20 {
            Ok(())
        } else {
            Err(format!("{after} increments answered since the kill"))
        }
    });
    {
        let times = increment_times.lock().unwrap();
        let first = times.iter().find(|at| **at > killed).map(|at| *at - killed);
        println!(
            "primary killed: the first increment answered {first:?} after it (the server \
             suspicion delay, 1 s here, and the promotion; a writer's updates are acked by the \
             device meanwhile)"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("a writer");
    }
    let (increments, counter_errors) = counter.join().expect("the incrementer");
    assert!(
        counter_errors.is_empty(),
        "increments failed: {counter_errors:?}"
    );

    let writes = writes.lock().unwrap();
    assert!(
        writes.errors.is_empty(),
        "writes failed: {:?}",
        writes.errors
    );
    let mut reader = Session::start(&following(device_addr, &[]));
    read_back(&mut reader, &writes);
    let line = reader.ask("get counter");
    assert_eq!(
        line.trim(),
        format!("{increments} (from server 1)"),
        "every increment answered applied exactly once"
    );
    drop(reader);
    drop(replica1);
    println!(
        "{} writes and {increments} increments answered across a replica's and the primary's \
         loss, each read back",
        writes.acked.len()
    );
}
