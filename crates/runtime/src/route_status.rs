//! The device chains' planner in a controller's status page, metrics and report line
//! (docs/replication.md, "Automatic failover").

use pmnet_proto::route::Planner;
use pmnet_proto::Time;

use crate::metrics::Metrics;

/// Each chain as planned: its devices in order, its server, spares, devices taken out, and
/// how long ago each node was last heard.
pub fn planner_status(planner: &Planner, now: Time) -> serde_json::Value {
    let chains: Vec<serde_json::Value> = planner
        .chains()
        .map(|(server_id, route, spares, removed)| {
            let named = |devices: &[(u16, std::net::SocketAddr)]| {
                devices
                    .iter()
                    .map(|(id, address)| serde_json::json!({"id": id, "addr": address.to_string()}))
                    .collect::<Vec<_>>()
            };
            let heard: serde_json::Map<String, serde_json::Value> = planner
                .heard(server_id, now)
                .into_iter()
                .map(|(address, ago)| (address.to_string(), serde_json::json!(ago.as_secs_f64())))
                .collect();
            serde_json::json!({
                "server_id": server_id,
                "server": route.server.to_string(),
                "replicas": route.replicas.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "devices": named(&route.devices),
                "spares": named(spares),
                "removed": named(removed),
                "last_heard_seconds_ago": heard,
            })
        })
        .collect();
    let counters = planner.counters();
    serde_json::json!({
        "epoch": planner.epoch(),
        "chains": chains,
        "counters": {
            "statuses": counters.statuses,
            "routes_sent": counters.routes_sent,
            "client_questions": counters.client_questions,
            "devices_removed": counters.devices_removed,
            "spares_joined": counters.spares_joined,
            "primaries_replaced": counters.primaries_replaced,
            "replicas_removed": counters.replicas_removed,
            "dropped": planner.drops().values().sum::<u64>(),
        },
    })
}

pub fn planner_metrics(out: &mut Metrics, planner: &Planner) {
    let counters = planner.counters();
    for (name, help, value) in [
        (
            "pmnet_controller_node_statuses_total",
            "Statuses received from devices, servers and clients of device chains.",
            counters.statuses,
        ),
        (
            "pmnet_controller_routes_sent_total",
            "Routes sent to the nodes of device chains.",
            counters.routes_sent,
        ),
        (
            "pmnet_controller_client_questions_total",
            "Clients' questions where their chain starts.",
            counters.client_questions,
        ),
        (
            "pmnet_controller_devices_removed_total",
            "Devices taken out of their chain (no status for --suspect-after-ms).",
            counters.devices_removed,
        ),
        (
            "pmnet_controller_spares_joined_total",
            "Spare devices put into a chain.",
            counters.spares_joined,
        ),
        (
            "pmnet_controller_primaries_replaced_total",
            "Lost primary servers replaced by their replica furthest along.",
            counters.primaries_replaced,
        ),
        (
            "pmnet_controller_replicas_removed_total",
            "Replica servers taken out of their primary's list (no status).",
            counters.replicas_removed,
        ),
    ] {
        out.counter(name, help, &[], value);
    }
    out.gauge(
        "pmnet_controller_device_chains_epoch",
        "The device chains' plan's epoch.",
        &[],
        planner.epoch() as f64,
    );
    for (server_id, route, _, _) in planner.chains() {
        out.gauge(
            "pmnet_controller_chain_devices",
            "Devices in a chain, by its server id.",
            &[("server_id", &server_id.to_string())],
            route.devices.len() as f64,
        );
    }
    for (reason, value) in planner.drops() {
        out.counter(
            "pmnet_controller_node_statuses_dropped_total",
            "Datagrams of device chains the controller dropped, by reason.",
            &[("reason", reason)],
            *value,
        );
    }
}

/// `device chains: epoch E; server 1 [a > b > c]; N statuses, M routes, K taken out`.
pub fn planner_report(planner: &Planner) -> String {
    let chains: Vec<String> = planner
        .chains()
        .map(|(server_id, route, _, _)| {
            let devices: Vec<String> = route
                .devices
                .iter()
                .map(|(id, address)| format!("{id}@{address}"))
                .collect();
            format!("server {server_id} [{}]", devices.join(" > "))
        })
        .collect();
    let counters = planner.counters();
    format!(
        "device chains: epoch {}; {}; {} statuses, {} routes, {} taken out, {} spares joined, {} \
         primaries replaced, {} replicas taken out, {} dropped",
        planner.epoch(),
        chains.join(", "),
        counters.statuses,
        counters.routes_sent,
        counters.devices_removed,
        counters.spares_joined,
        counters.primaries_replaced,
        counters.replicas_removed,
        planner.drops().values().sum::<u64>()
    )
}
