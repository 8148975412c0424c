//! Automatic failover of devices in series, as a user starts it (docs/replication.md,
//! "Automatic failover"): a real etcd (started by the test), `pmnet controller --device-chain`
//! on it (two: one leads, one stands by), a chain of three `pmnet device --controller` in front of a `pmnet server
//! --controller`, a spare device, and three `pmnet client --controller --replicas 2` sessions
//! writing under load. The middle device is SIGKILLed: the controller takes it out and puts
//! the spare in before the server. The leading controller is SIGKILLed: the writes go on, and
//! the standby takes over from the plan in etcd. The spare, now the chain's last device, is
//! SIGKILLed: the
//! server asks the device before it from then on. The first device is SIGKILLed: the clients
//! ask the controller where the chain starts and follow. No write fails, and every write
//! acknowledged before, during and after is read back. (How long each failover took is
//! printed, not checked: timing belongs in benchmarks.)

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::writes::{following, outage, read_back, wait_for_writes, writer, Session, Writes};
use common::{free_udp_addr, pmnet_bin, Node, Proc};

fn s(text: impl ToString) -> String {
    text.to_string()
}

/// A device of the chain: `id` on `listen`, forwarding to `next`, after `previous`.
fn device(
    id: u16,
    listen: SocketAddr,
    next: SocketAddr,
    previous: Option<SocketAddr>,
    controller: [SocketAddr; 2],
    dir: &std::path::Path,
) -> Node {
    let mut args = vec![
        s("device"),
        s("--listen"),
        s(listen),
        s("--device-id"),
        s(id),
        s("--server"),
        format!("1={next}"),
        s("--log-file"),
        s(dir.join(format!("device{id}.log")).display()),
        s("--slots"),
        s(4096),
        s("--controller"),
        s(controller[0]),
        s("--controller"),
        s(controller[1]),
        s("--metrics"),
        s("127.0.0.1:0"),
        s("--report-interval"),
        s(0),
    ];
    if let Some(previous) = previous {
        args.extend([s("--previous-device"), format!("1={previous}")]);
    }
    Node::start(&format!("device {id}"), args)
}

#[test]
fn lost_devices_are_taken_out_of_their_chain_a_spare_joins_and_every_acked_write_is_read_back() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let etcd = pmnet_etcd::LocalEtcd::start(
        "etcd",
        &dir.path().join("etcd"),
        "127.0.0.1:0".parse().expect("address"),
        Duration::from_secs(30),
    )
    .expect("start etcd (apt-get install etcd-server)");
    let controller_addr = free_udp_addr();
    let standby_addr = free_udp_addr();
    let server_addr = free_udp_addr();
    let d: Vec<SocketAddr> = (0..4).map(|_| free_udp_addr()).collect();
    let controller_args = |listen: SocketAddr| {
        vec![
            s("controller"),
            s("--etcd"),
            s(etcd.endpoint()),
            s("--cluster"),
            s("failover"),
            s("--listen"),
            s(listen),
            s("--device-chain"),
            format!("1={server_addr},1={},2={},3={}", d[0], d[1], d[2]),
            s("--spare-device"),
            format!("1:4={}", d[3]),
            s("--suspect-after-ms"),
            s(150),
            s("--report-interval"),
            s(0),
        ]
    };
    let mut controller = Node::start("controller A", controller_args(controller_addr)).proc;
    let mut standby = Proc::spawn("controller B", &controller_args(standby_addr));
    standby.wait_for_line("B standing by", |line| line.contains("standing by"));
    let _server = Node::start(
        "server",
        vec![
            s("server"),
            s("--listen"),
            s(server_addr),
            s("--server-id"),
            s(1),
            s("--device"),
            s(d[2]),
            s("--data-file"),
            s(dir.path().join("server.data").display()),
            s("--data-mib"),
            s(16),
            s("--controller"),
            s(controller_addr),
            s("--controller"),
            s(standby_addr),
            s("--report-interval"),
            s(0),
        ],
    );
    let controllers = [controller_addr, standby_addr];
    let mut devices: Vec<Option<Node>> = vec![
        Some(device(1, d[0], d[1], None, controllers, dir.path())),
        Some(device(2, d[1], d[2], Some(d[0]), controllers, dir.path())),
        Some(device(
            3,
            d[2],
            server_addr,
            Some(d[1]),
            controllers,
            dir.path(),
        )),
        Some(device(4, d[3], server_addr, None, controllers, dir.path())),
    ];
    common::poll_until("every node heard by the controller", || {
        let said = controller.stdout().join("\n");
        match d
            .iter()
            .chain([&server_addr])
            .find(|address| !said.contains(&format!("{address} heard")))
        {
            None => Ok(()),
            Some(address) => Err(format!("{address} not heard yet")),
        }
    });

    // A client asking more acks than the chain has devices is refused before it sends.
    let refused = Command::new(pmnet_bin())
        .args([
            s("client"),
            s("--device"),
            s(d[0]),
            s("--controller"),
            s(controllers[0]),
            s("--controller"),
            s(controllers[1]),
            s("--replicas"),
            s(4),
            s("set"),
            s("too-many"),
            s("acks"),
        ])
        .output()
        .expect("run a client");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && said.contains("--replicas 4 asks for more devices' acks than the 3"),
        "{said}"
    );

    let clients = 3;
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(Mutex::new(Writes::default()));
    let threads: Vec<_> = (0..clients)
        .map(|client| {
            let mut args = following(d[0], &controllers);
            args.extend([s("--replicas"), s(2)]);
            writer(client, args, stop.clone(), writes.clone())
        })
        .collect();
    wait_for_writes(&writes, clients, Instant::now(), 20);

    // The middle device: taken out, the spare put in before the server.
    let killed = Instant::now();
    devices[1].take().expect("device 2").proc.kill();
    controller.wait_for_line("device 2 taken out", |line| {
        line.contains("device 2 (") && line.contains("removed")
    });
    controller.wait_for_line("the spare put in", |line| {
        line.contains("spare device 4") && line.contains("joined after device 3")
    });
    wait_for_writes(&writes, clients, killed, 20);
    println!(
        "middle device killed: longest wait for an acknowledgement after it {:?}",
        outage(&writes, clients, killed)
    );
    // The spare works: it logged what came after it joined.
    let spare = devices[3].as_ref().expect("device 4");
    spare.wait_metric(
        "pmnet_device_updates_logged_total",
        r#"port="pmnet""#,
        "the spare logs updates",
        |value| value > 0.0,
    );

    // The leading controller: the data path does not need it; the standby takes over from
    // the plan in etcd and handles the next failure.
    let killed = Instant::now();
    controller.kill();
    let mut controller = standby;
    controller.wait_for_line("B leads", |line| line.contains(" leads "));
    wait_for_writes(&writes, clients, killed, 20);
    println!(
        "leading controller killed: longest wait for an acknowledgement after it {:?}, \
         standby leading after {:?}",
        outage(&writes, clients, killed),
        killed.elapsed()
    );
    controller.wait_for_line("B's plan (the middle device out, the spare in)", |line| {
        line.contains("device chain of server 1")
            && line.contains(&format!("1@{} > 3@{} > 4@{} > server", d[0], d[2], d[3]))
    });

    // The chain's last device (the spare): the server asks the one before it from now on.
    let killed = Instant::now();
    devices[3].take().expect("device 4").proc.kill();
    controller.wait_for_line("device 4 taken out", |line| {
        line.contains("device 4 (") && line.contains("removed")
    });
    wait_for_writes(&writes, clients, killed, 20);
    println!(
        "last device killed: longest wait for an acknowledgement after it {:?}",
        outage(&writes, clients, killed)
    );

    // The first device: the clients ask the controller where the chain starts.
    let killed = Instant::now();
    devices[0].take().expect("device 1").proc.kill();
    controller.wait_for_line("device 1 taken out", |line| {
        line.contains("device 1 (") && line.contains("removed")
    });
    wait_for_writes(&writes, clients, killed, 20);
    println!(
        "first device killed: longest wait for an acknowledgement after it {:?}",
        outage(&writes, clients, killed)
    );
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("a writer");
    }

    let writes = writes.lock().unwrap();
    assert!(
        writes.errors.is_empty(),
        "writes failed: {:?}",
        writes.errors
    );
    // Every acknowledged write, read back through what is left of the chain.
    read_back(&mut Session::start(&following(d[2], &[])), &writes);
    println!(
        "{} writes acknowledged across three device losses, each read back",
        writes.acked.len()
    );
}
