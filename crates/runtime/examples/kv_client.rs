//! The Rust client API end to end: a server and a PMNet device on loopback (in this process,
//! files in a temporary directory), and a [`ClientSession`] that updates and reads through the
//! device.
//!
//! ```sh
//! cargo run -p pmnet-runtime --example kv_client
//! ```
//!
//! Against processes started by hand (`pmnet server`, `pmnet device`), only the last part is
//! needed: `ClientSession::open(SessionOptions::new(SERVER_ID, DEVICE_ADDR))`.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use pmnet_pm::MmapOptions;
use pmnet_proto::Completion;
use pmnet_runtime::{
    ClientSession, DeviceOptions, DeviceRuntime, LogOptions, LoopOptions, ServerOptions,
    ServerRuntime, SessionOptions, Shutdown, StoreOptions,
};
use pmnet_store::{Reply, Request};

const SERVER_ID: u16 = 1;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let shutdown = Shutdown::new();

    // The server: the embedded key-value store in a mapped file.
    let mut server = ServerRuntime::open(
        ServerOptions {
            server_id: SERVER_ID,
            listen: loopback,
            devices: Vec::new(),
            replicas: Vec::new(),
            store: Some(StoreOptions {
                path: dir.path().join("store.pmem"),
                size_bytes: 16 << 20,
                max_sessions: 1024,
                format: true,
                mmap: MmapOptions::default(),
                growth: Default::default(),
            }),
            gap_fill_after: None,
            keys: None,
            loop_options: LoopOptions::default(),
            max_ops_per_s: None,
            follow: None,
        },
        shutdown.clone(),
    )?;
    let server_addr = server.addresses().data;
    println!("server medium: {}", server.startup().medium_text());

    // The device in front of it: its log in another mapped file.
    let mut device = DeviceRuntime::open(
        DeviceOptions {
            device_id: 1,
            listen: loopback,
            servers: vec![(SERVER_ID, server_addr)],
            previous_devices: Vec::new(),
            follow: None,
            log: Some(LogOptions {
                path: dir.path().join("device.log"),
                slot_count: 1024,
                slot_size: 512,
                format: true,
                mmap: MmapOptions::default(),
            }),
            forward_listen: None,
            echo_listen: None,
            max_resends_in_flight: None,
            resend_timeout: None,
            keys: None,
            batch: true,
            batch_hold: Duration::from_micros(200),
            xdp: None,
            loop_options: LoopOptions::default(),
        },
        shutdown.clone(),
    )?;
    let device_addr = device.addresses().data;
    println!("device medium: {}", device.startup().medium_text());

    let (done_tx, done_rx) = mpsc::channel();
    let server_thread = {
        let done = done_tx.clone();
        thread::spawn(move || done.send(server.run().map_err(|error| error.to_string())))
    };
    let device_thread =
        thread::spawn(move || done_tx.send(device.run().map_err(|e| e.to_string())));

    // The client: one session, through the device.
    let mut session = ClientSession::open(SessionOptions::new(SERVER_ID, device_addr))?;
    let set = Request::Set {
        key: b"greeting",
        value: b"hello",
    };
    match session.update(&set.to_bytes())? {
        Completion::Logged { device_id } => {
            println!("SET greeting hello: durable in the log of device {device_id}")
        }
        other => println!("SET greeting hello: {other:?}"),
    }
    let get = Request::Get { key: b"greeting" };
    if let Completion::Replied { reply, .. } = session.bypass(&get.to_bytes())? {
        match Reply::decode(&reply) {
            Ok(Reply::Value(value)) => {
                println!("GET greeting: {}", String::from_utf8_lossy(&value))
            }
            other => println!("GET greeting: {other:?}"),
        }
    }

    shutdown.request();
    for _ in 0..2 {
        done_rx.recv()??;
    }
    let _ = (server_thread.join(), device_thread.join());
    Ok(())
}
