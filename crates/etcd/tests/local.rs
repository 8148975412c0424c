//! The client against a real one-member etcd (Debian's `etcd-server`), started by the test.

use std::time::{Duration, Instant};

use pmnet_etcd::{Etcd, LocalEtcd};

fn start() -> (tempfile::TempDir, LocalEtcd) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let etcd = LocalEtcd::start(
        "etcd",
        &dir.path().join("etcd"),
        "127.0.0.1:0".parse().expect("address"),
        Duration::from_secs(30),
    )
    .expect("start etcd (apt-get install etcd-server)");
    (dir, etcd)
}

#[test]
fn keys_transactions_and_leases_behave_as_etcd_documents() {
    let (_dir, local) = start();
    let mut etcd = Etcd::connect(&[local.endpoint()], Duration::from_secs(2)).expect("connect");
    assert_eq!(etcd.get(b"/t/a").expect("get"), None);
    etcd.put(b"/t/a", b"1", 0).expect("put");
    let a = etcd.get(b"/t/a").expect("get").expect("a value");
    assert_eq!(a.value, b"1");
    // Create only if absent.
    assert!(!etcd.create(b"/t/a", b"2", 0).expect("txn"));
    assert!(etcd.create(b"/t/b", b"2", 0).expect("txn"));
    // A write fenced by a key's creation: it goes while the guard is the one created, not
    // after the guard was deleted and created again.
    let guard = etcd.get(b"/t/b").expect("get").expect("b").create_revision;
    assert!(etcd
        .put_if_created(b"/t/b", guard, b"/t/state", b"x", 0)
        .expect("txn"));
    assert_eq!(etcd.delete(b"/t/b").expect("delete"), 1);
    assert!(etcd.create(b"/t/b", b"3", 0).expect("txn"));
    assert!(!etcd
        .put_if_created(b"/t/b", guard, b"/t/state", b"y", 0)
        .expect("txn"));
    assert_eq!(
        etcd.get(b"/t/state").expect("get").expect("state").value,
        b"x"
    );
    let keys: Vec<Vec<u8>> = etcd
        .get_prefix(b"/t/")
        .expect("range")
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    assert_eq!(keys, [&b"/t/a"[..], b"/t/b", b"/t/state"]);
    // A key under a lease lives while it is renewed and goes when it is revoked.
    let lease = etcd.grant_lease(1).expect("lease");
    assert_eq!(
        lease.ttl_s, 1,
        "the one-member etcd keeps a 1 s lease at 1 s"
    );
    assert!(etcd.create(b"/t/leader", b"me", lease.id).expect("txn"));
    assert!(etcd.keep_alive(lease.id).expect("keep alive") >= 1);
    etcd.revoke(lease.id).expect("revoke");
    assert_eq!(etcd.get(b"/t/leader").expect("get"), None);
    assert_eq!(etcd.keep_alive(lease.id).expect("keep alive"), 0);
}

#[test]
fn a_lease_not_renewed_expires_and_takes_its_keys() {
    let (_dir, local) = start();
    let mut etcd = Etcd::connect(&[local.endpoint()], Duration::from_secs(2)).expect("connect");
    let lease = etcd.grant_lease(1).expect("lease");
    assert!(etcd.create(b"/t/leader", b"me", lease.id).expect("txn"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while etcd.get(b"/t/leader").expect("get").is_some() {
        assert!(Instant::now() < deadline, "the lease never expired");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_client_moves_to_the_next_endpoint_and_says_which_failed() {
    let (_dir, local) = start();
    // The first endpoint has nothing listening.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a port");
    let mut etcd = Etcd::connect(&[dead, local.endpoint()], Duration::from_secs(2))
        .expect("connect to the second endpoint");
    assert_eq!(etcd.endpoint(), Some(local.endpoint()));
    etcd.put(b"/t/a", b"1", 0).expect("put");
    let error = Etcd::connect(&[dead], Duration::from_millis(500)).unwrap_err();
    assert!(
        error.0.contains("unreachable") && error.0.contains(&dead.to_string()),
        "{error}"
    );
}
