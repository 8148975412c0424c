//! The chain store under keys, as docs/security.md and docs/netchain.md tell a user to run it:
//! `pmnet keygen`, then the same `--key-file` on every member, on the controller and on
//! `pmnet kv`. What holds the key is served; a put sent without it is dropped by the member,
//! counted by reason and never applied.

mod common;

use std::net::SocketAddr;
use std::path::Path;

use common::{args, chain_member, free_udp_addr, poll_until, run_pmnet, Node, Proc};

const GROUPS: u16 = 4;

fn keygen(dir: &Path, name: &str) -> String {
    let path = dir.join(name).display().to_string();
    let (status, _, stderr) = run_pmnet(&args(&["keygen", "--out", &path]), None);
    assert!(status.success(), "{stderr}");
    path
}

/// `pmnet kv` with `options` (its routing and key) and then `words`: (success, stdout,
/// stderr).
fn kv(options: &[String], words: &[&str]) -> (bool, String, String) {
    let mut all: Vec<String> = vec!["kv".to_owned()];
    all.extend(options.iter().cloned());
    all.extend(words.iter().map(|word| (*word).to_owned()));
    let (status, stdout, stderr) = run_pmnet(&all, None);
    (status.success(), stdout.trim().to_owned(), stderr)
}

fn with_key(options: &[String], key: &str) -> Vec<String> {
    let mut options = options.to_vec();
    options.extend(["--key-file".to_owned(), key.to_owned()]);
    options
}

/// Datagrams a member's pipeline dropped for `reason`.
fn member_drops(node: &Node, reason: &str) -> f64 {
    node.metric(
        "pmnet_device_dropped_total",
        &format!("port=\"pmnet\",reason=\"{reason}\""),
    )
    .unwrap_or(0.0)
}

#[test]
fn kv_with_the_members_key_is_served_and_a_put_without_it_is_dropped_counted_and_not_applied() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let key = keygen(dir.path(), "pmnet.key");
    let members = [free_udp_addr(), free_udp_addr(), free_udp_addr()];
    let mut membership: Vec<String> = members
        .iter()
        .flat_map(|member| ["--chain-member".to_owned(), member.to_string()])
        .collect();
    membership.extend(["--chain-groups".to_owned(), GROUPS.to_string()]);
    membership.extend(["--key-file".to_owned(), key.clone()]);
    let nodes: Vec<Node> = (0..3)
        .map(|index| chain_member(index as u16 + 1, members[index], &membership, dir.path()))
        .collect();
    assert!(
        nodes[0]
            .banner
            .iter()
            .any(|line| line.contains("traffic: authenticated")),
        "{:?}",
        nodes[0].banner
    );
    let mut routing: Vec<String> = vec![
        "--groups".to_owned(),
        GROUPS.to_string(),
        "--timeout-ms".to_owned(),
        "3000".to_owned(),
    ];
    for member in &members {
        routing.extend(["--member".to_owned(), member.to_string()]);
    }
    let keyed = with_key(&routing, &key);

    let (ok, out, err) = kv(&keyed, &["put", "greeting", "hello"]);
    assert!(ok && out.starts_with("OK (version 1)"), "{out}\n{err}");
    let (ok, out, err) = kv(&keyed, &["get", "greeting"]);
    assert!(ok && out == "hello", "{out}\n{err}");
    let (ok, out, err) = kv(&keyed, &["lock", "leader", "--owner", "alice"]);
    assert!(ok && out.starts_with("locked by alice"), "{out}\n{err}");

    // Without the key: the head drops the put (counted by reason), nothing is applied, and
    // the command says what to check.
    let head_drops_before: f64 = nodes
        .iter()
        .map(|n| member_drops(n, "unauthenticated"))
        .sum();
    let mut unkeyed = routing.clone();
    unkeyed[3] = "500".to_owned();
    let (ok, out, err) = kv(&unkeyed, &["put", "greeting", "forged"]);
    assert!(!ok, "an unkeyed put succeeded: {out}\n{err}");
    assert!(
        err.contains("no answer") && err.contains("--key-file"),
        "says what to check: {err}"
    );
    let (ok, _, err) = kv(&unkeyed, &["put", "fresh", "forged"]);
    assert!(!ok, "{err}");
    poll_until("the members count the unauthenticated puts", || {
        let drops: f64 = nodes
            .iter()
            .map(|n| member_drops(n, "unauthenticated"))
            .sum();
        if drops >= head_drops_before + 2.0 {
            Ok(())
        } else {
            Err(format!("{drops} unauthenticated drops"))
        }
    });
    assert!(
        nodes
            .iter()
            .any(|node| node.proc.stderr().contains("failed authentication")),
        "a member warns of the datagrams that failed authentication"
    );
    let (ok, out, err) = kv(&keyed, &["get", "greeting"]);
    assert!(
        ok && out == "hello",
        "the forged put was applied: {out}\n{err}"
    );
    let (ok, out, err) = kv(&keyed, &["get", "fresh"]);
    assert!(
        ok && out == "(nil)",
        "the forged put was applied: {out}\n{err}"
    );
    // Another deployment's key: dropped too (its tag does not verify).
    let other = keygen(dir.path(), "other.key");
    let mut other_options = with_key(&routing, &other);
    other_options[3] = "500".to_owned();
    let (ok, out, err) = kv(&other_options, &["put", "greeting", "forged"]);
    assert!(!ok, "{out}\n{err}");
    poll_until("the members count the bad tags", || {
        let drops: f64 = nodes.iter().map(|n| member_drops(n, "bad_tag")).sum();
        if drops >= 1.0 {
            Ok(())
        } else {
            Err(format!("{drops} bad_tag drops"))
        }
    });
    let (ok, out, err) = kv(&keyed, &["get", "greeting"]);
    assert!(ok && out == "hello", "{out}\n{err}");
}

#[test]
fn kv_refuses_a_key_file_it_cannot_use_naming_it() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let missing = dir.path().join("missing.key").display().to_string();
    let member = free_udp_addr().to_string();
    for command in [
        vec![
            "kv",
            "--member",
            &member,
            "--key-file",
            &missing,
            "get",
            "k",
        ],
        vec![
            "chain-controller",
            "--member",
            &member,
            "--key-file",
            &missing,
        ],
    ] {
        let (status, _, stderr) = run_pmnet(&args(&command), None);
        assert!(!status.success(), "{command:?}");
        assert!(
            stderr.contains(&missing) && stderr.contains("pmnet keygen"),
            "{command:?}: {stderr}"
        );
    }
}

/// Whether an epoch line of the controller shows every group with `length` members, none
/// paused or joining.
fn whole(line: &str, length: usize) -> bool {
    let Some((_, groups)) = line.split_once(": ") else {
        return false;
    };
    line.starts_with("epoch ")
        && groups.split("; ").count() == usize::from(GROUPS)
        && groups.split("; ").all(|group| {
            !group.contains("paused")
                && !group.contains(" +")
                && group.matches(" > ").count() + 1 == length
        })
}

#[test]
fn the_controller_under_keys_runs_the_chains_and_drops_what_is_not_sealed() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let key = keygen(dir.path(), "pmnet.key");
    let controller_addr = free_udp_addr();
    let members: Vec<SocketAddr> = (0..3).map(|_| free_udp_addr()).collect();
    let mut controller_args = args(&[
        "chain-controller",
        "--listen",
        &controller_addr.to_string(),
        "--groups",
        &GROUPS.to_string(),
        "--state",
        &dir.path().join("controller.state").display().to_string(),
        "--key-file",
        &key,
    ]);
    for member in &members {
        controller_args.extend(["--member".to_owned(), member.to_string()]);
    }
    let mut controller = Proc::spawn("chain-controller", &controller_args);
    controller.wait_for_line("its banner", |line| line.contains("listening on"));
    let traffic = controller.wait_for_line("its traffic line", |line| line.contains("traffic: "));
    assert!(traffic.contains("traffic: authenticated"), "{traffic}");
    let membership = args(&[
        "--chain-controller",
        &controller_addr.to_string(),
        "--key-file",
        &key,
    ]);
    let _nodes: Vec<Node> = (0..3)
        .map(|index| chain_member(index as u16 + 1, members[index], &membership, dir.path()))
        .collect();
    // The members' statuses verify at the controller and its grants at the members: the
    // chains are built.
    controller.wait_for_line("chains of three", |line| whole(line, 3));

    let routing = args(&[
        "--controller",
        &controller_addr.to_string(),
        "--timeout-ms",
        "3000",
    ]);
    let keyed = with_key(&routing, &key);
    let (ok, out, err) = kv(&keyed, &["put", "k", "v"]);
    assert!(ok && out.starts_with("OK (version 1)"), "{out}\n{err}");
    let (ok, out, err) = kv(&keyed, &["get", "k"]);
    assert!(ok && out == "v", "{out}\n{err}");

    // Without the key the controller answers nothing (its fetches are dropped), and says so.
    let unkeyed = args(&[
        "--controller",
        &controller_addr.to_string(),
        "--timeout-ms",
        "300",
    ]);
    let (ok, out, err) = kv(&unkeyed, &["get", "k"]);
    assert!(!ok, "{out}\n{err}");
    poll_until("the controller warns of the unauthenticated fetch", || {
        let stderr = controller.stderr();
        if stderr.contains("chain controller: dropped")
            && stderr.contains("failed authentication")
            && stderr.contains("unauthenticated")
        {
            Ok(())
        } else {
            Err(stderr)
        }
    });
    controller.stop();
    let stderr = controller.stderr();
    let last = stderr
        .lines()
        .find(|line| line.contains("chain-controller stopped"))
        .unwrap_or_else(|| panic!("no closing line: {stderr}"));
    assert!(
        last.contains("unauthenticated "),
        "the drops by reason: {last}"
    );
}
