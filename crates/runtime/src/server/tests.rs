//! The server runtime over real sockets, with both engines.

use pmnet_store::{Reply, Request};

use super::*;
use crate::{ClientSession, SessionOptions};

fn start(
    path: &std::path::Path,
    engine: EngineKind,
    format: bool,
) -> (Shutdown, SocketAddr, std::thread::JoinHandle<(u64, u64)>) {
    let options = ServerOptions {
        server_id: 1,
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        devices: Vec::new(),
        replicas: Vec::new(),
        store: Some(StoreOptions {
            path: path.to_path_buf(),
            size_bytes: 8 << 20,
            max_sessions: 256,
            format,
            mmap: MmapOptions::default(),
            growth: Default::default(),
        }),
        gap_fill_after: None,
        loop_options: LoopOptions {
            report_interval: None,
            ..LoopOptions::default()
        },
        keys: None,
        max_ops_per_s: None,
        follow: None,
    };
    let shutdown = Shutdown::new();
    let server_shutdown = shutdown.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let mut server =
            ServerRuntime::open_with_engine(options, Some(engine), server_shutdown).unwrap();
        tx.send(server.addresses().data).unwrap();
        server.run().unwrap();
        let in_place = match &server.app {
            ServerApp::Engine(store) => store.stats().records_received_in_place,
            _ => 0,
        };
        (in_place, server.socket.counters().received_total())
    });
    let addr = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    (shutdown, addr, handle)
}

#[test]
fn both_engines_serve_and_recover_through_the_server() {
    for engine in [EngineKind::Packet, EngineKind::Conventional] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let (shutdown, addr, handle) = start(&path, engine, true);
        let mut session = ClientSession::open(SessionOptions::new(1, addr)).unwrap();
        // 3000-byte values travel as three fragments, each received into its own slot.
        let value: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
        for index in 0..50u32 {
            let key = format!("key{index}").into_bytes();
            let request = Request::Set {
                key: &key,
                value: &value,
            }
            .to_bytes();
            session.update(&request).unwrap();
        }
        let del = Request::Del { key: b"key7" }.to_bytes();
        session.update(&del).unwrap();
        shutdown.request();
        let (in_place, received) = handle.join().unwrap();
        // Every datagram counted, whichever path received it (the packet store's own
        // receive into its slots included): 50 SETs of three fragments and a DEL at least.
        assert!(received >= 151, "{engine:?}: {received} datagrams counted");
        if engine == EngineKind::Packet {
            // How many depends on timing (a request whose fragments wait too long is
            // applied from its bytes); in practice all 51.
            assert!(
                (1..=51).contains(&in_place),
                "requests became records in place: {in_place}"
            );
        }
        let (shutdown, addr, handle) = start(&path, engine, false);
        let mut session = ClientSession::open(SessionOptions::new(1, addr)).unwrap();
        let get = |session: &mut ClientSession, key: &[u8]| match session
            .bypass(&Request::Get { key }.to_bytes())
            .unwrap()
        {
            pmnet_proto::Completion::Replied { reply, .. } => Reply::decode(&reply).unwrap(),
            other => panic!("GET completed without a reply: {other:?}"),
        };
        assert_eq!(get(&mut session, b"key3"), Reply::Value(value.clone()));
        assert_eq!(get(&mut session, b"key7"), Reply::NotFound);
        shutdown.request();
        handle.join().unwrap();
    }
}

#[test]
fn cache_reads_pay_for_an_emulated_capacity_as_requests_do() {
    let dir = tempfile::tempdir().unwrap();
    let options = ServerOptions {
        server_id: 1,
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        devices: Vec::new(),
        replicas: Vec::new(),
        store: Some(StoreOptions {
            path: dir.path().join("data"),
            size_bytes: 8 << 20,
            max_sessions: 256,
            format: true,
            mmap: MmapOptions::default(),
            growth: Default::default(),
        }),
        gap_fill_after: None,
        loop_options: LoopOptions {
            report_interval: None,
            ..LoopOptions::default()
        },
        keys: None,
        max_ops_per_s: Some(1_000_000),
        follow: None,
    };
    let shutdown = Shutdown::new();
    let server_shutdown = shutdown.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let mut server =
            ServerRuntime::open_with_engine(options, Some(EngineKind::Packet), server_shutdown)
                .unwrap();
        tx.send(server.addresses().data).unwrap();
        server.run().unwrap();
        server.metrics()
    });
    let addr = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let mut session = ClientSession::open(SessionOptions::new(1, addr)).unwrap();
    let set = Request::Set {
        key: b"k",
        value: b"v",
    }
    .to_bytes();
    session.update(&set).unwrap();
    let get = Request::Get { key: b"k" }.to_bytes();
    for _ in 0..20 {
        let (reply, device) = session.cache_read(b"k", &get).unwrap();
        assert_eq!(device, 0, "the server answered");
        assert_eq!(Reply::decode(&reply).unwrap(), Reply::Value(b"v".to_vec()));
    }
    shutdown.request();
    let metrics = handle.join().unwrap();
    // The update and the 20 reads, each paid for (retransmissions, if any, pay too).
    let paid = metrics
        .value("pmnet_server_capacity_paid_total", &[])
        .unwrap();
    assert!(paid >= 21.0, "{paid}");
}
