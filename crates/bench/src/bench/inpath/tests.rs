//! The plan `pmnet bench --in-path`'s options make, and the ratios and medians of its report
//! (the run itself: tests/inpath_bench.rs).

use super::report::{medians, ratios, CpuPerOp, Record};
use super::*;
use crate::bench::args::tests::parse;

fn plan(args: &[&str]) -> Result<InPathPlan, String> {
    let mut all = vec!["--in-path"];
    all.extend_from_slice(args);
    InPathPlan::from_args(&parse(&all)?)
}

#[test]
fn the_options_make_a_plan_of_every_part_in_an_order_that_restarts_least() {
    let plan = plan(&["--seed", "3"]).unwrap();
    assert_eq!(
        (
            plan.load_clients,
            plan.capacity_clients,
            plan.capacity_window
        ),
        (16, 4, 16)
    );
    assert_eq!(plan.seed, 3);
    assert!(plan.datagram_bytes > pmnet_wire::HEADER_LEN);
    let steps = plan.steps();
    assert_eq!(steps.len(), 12);
    // Each configuration of processes comes once: no device, in path, busy-polling, proxy.
    let mut roles: Vec<DeviceRole> = Vec::new();
    for step in &steps {
        if roles.last() != Some(&step.role) {
            assert!(!roles.contains(&step.role), "{:?} again", step.role);
            roles.push(step.role);
        }
    }
    assert_eq!(roles.len(), 4);
    let only = super::tests::plan(&["--in-path-parts", "latency", "--clients", "8"]).unwrap();
    assert!(only.steps().iter().all(|step| step.part == Part::Latency));
    assert_eq!(only.load_clients, 8);
    // Each step's clients go where the step says.
    let latency = only.steps()[1];
    let client_plan = only.client_plan(&latency).unwrap();
    assert_eq!(client_plan.modes, [Mode::Pmnet]);
    assert_eq!((client_plan.clients, client_plan.window), (1, 1));
    let busy = only.steps()[3];
    assert!(busy.busy_poll());
    assert_eq!(
        only.client_plan(&busy).unwrap().wait,
        pmnet_runtime::WaitMode::BusyPoll
    );
}

#[test]
fn options_that_do_not_fit_are_refused_with_a_reason() {
    for (args, expected) in [
        (&["--capacity"][..], "--capacity"),
        (
            &["--device", "127.0.0.1:7400"][..],
            "addresses of running parts",
        ),
        (&["--requests", "100"][..], "--requests"),
        (&["--busy-poll"][..], "--busy-poll"),
        (&["--servers", "2"][..], "a rack"),
        (&["--abd"][..], "--abd"),
        (&["--update-ratio", "0.5"][..], "updates only"),
        (&["--dir", "/nonexistent/dir"][..], "not a directory"),
    ] {
        let error = plan(args).err().unwrap();
        assert!(error.contains(expected), "{args:?}: {error}");
    }
    assert!(parse(&["--in-path-parts", "everything"]).is_err());
}

fn record(part: &'static str, system: &'static str, op: &'static str, figure: f64) -> Record {
    Record {
        part,
        system,
        op,
        wait: "blocking",
        datapath: "",
        clients: None,
        window: None,
        p50_us: Some(figure),
        p99_us: Some(figure * 2.0),
        p999_us: None,
        mean_us: None,
        ops_per_s: (op != "tcp-bulk").then_some(figure),
        mb_per_s: (op == "tcp-bulk").then_some(figure),
        count: 1,
        seconds: 1.0,
        loss: None,
        cpu_us_per_op: CpuPerOp {
            device: Some(figure / 10.0),
            server: Some(figure / 5.0),
            ..CpuPerOp::default()
        },
        device_cpus: None,
        server_cpus: None,
        others_cpus: 0.0,
        failed: 0,
        retransmissions: 0,
        warnings: Vec::new(),
        rounds: Vec::new(),
    }
}

#[test]
fn ratios_compare_each_pair_against_its_target() {
    let results = vec![
        record("forwarding", "kernel", "udp-flow", 100.0),
        record("forwarding", "in-path", "udp-flow", 95.0),
        record("forwarding", "kernel", "tcp-bulk", 100.0),
        record("forwarding", "in-path", "tcp-bulk", 50.0),
        record("capacity", "in-path", "update", 300.0),
        record("capacity", "proxy-udp", "update", 100.0),
        record("latency", "echo", "echo", 10.0),
        record("latency", "in-path", "update", 12.0),
        record("load", "baseline", "update", 100.0),
        record("load", "in-path", "update", 150.0),
    ];
    let ratios = ratios(&results);
    let find = |part: &str, measure: &str| {
        ratios
            .iter()
            .find(|r| r.part == part && r.measure == measure)
            .unwrap_or_else(|| panic!("{part} {measure}: {ratios:#?}"))
    };
    assert_eq!(find("forwarding", "UDP datagrams/s").value, 0.95);
    assert!(find("forwarding", "UDP datagrams/s").met);
    assert!(!find("forwarding", "TCP MB/s").met);
    assert_eq!(find("capacity", "updates/s").value, 3.0);
    assert!(find("latency", "p50").met, "1.2 ≤ 1.3");
    assert!(!find("load", "updates/s").met, "1.5 < 2");
    assert!(!find("load", "p99").met, "300 > 200");
    // The device's 15 µs against the baseline server's 20 µs.
    assert_eq!(find("load", "CPU µs per update").value, 0.75);
    // No busy-poll results, no busy-poll ratio.
    assert_eq!(ratios.len(), 7);
}

#[test]
fn the_median_round_is_reported_with_every_rounds_figure() {
    let rounds = vec![
        record("capacity", "in-path", "update", 5.0),
        record("capacity", "proxy-udp", "update", 1.0),
        record("capacity", "in-path", "update", 9.0),
        record("capacity", "in-path", "update", 7.0),
    ];
    let results = medians(rounds);
    assert_eq!(results.len(), 2);
    assert_eq!(results[0].ops_per_s, Some(7.0));
    assert_eq!(results[0].rounds, [5.0, 9.0, 7.0]);
    assert!(results[1].rounds.is_empty(), "one round: no list");
}
