//! `pmnet coord-bench --read-scaling`: does read capacity grow with the chain? Three members,
//! each limited to the same emulated capacity (`pmnet device --chain-max-ops-per-s`), a
//! read-mostly workload of Zipf-distributed keys, measured twice on the same members, seed
//! and clients: reads at the tail only (NetChain) and reads spread over every member of the
//! key's group (CRAQ: a member holding a committed version answers, a dirty key is read at
//! the tail).

use std::time::Duration;

use pmnet_netchain::ReadFrom;
use pmnet_runtime::Shutdown;

use super::cpu::run_phase;
use super::load::{self, CoordClient, Op, Phase};
use super::netchain::ChainStore;
use super::plan::{Plan, ScalingPlan, System};
use super::report::{ResultRow, ScalingSummary};
use pmnet::loadgen::{KeyDistribution, PopularityKind, Workload};
use pmnet::CliError;

/// The target of issue 22: reads from any member serve this many times the throughput of
/// reads at the tail.
pub const TARGET: f64 = 2.5;

/// A client waits this long before sending a request again: longer than any queue at a
/// capacity-limited member, so that no resend takes a token a first request could have.
const RETRANSMIT_TIMEOUT: Duration = Duration::from_millis(200);

/// What a read-scaling run gives the report.
#[derive(Debug)]
pub struct ScalingOutcome {
    pub rows: Vec<ResultRow>,
    pub summary: ScalingSummary,
    pub durability: String,
    pub interrupted: bool,
}

fn reads_name(reads: ReadFrom) -> &'static str {
    match reads {
        ReadFrom::AnyMember => "any-member",
        ReadFrom::Tail => "tail",
    }
}

/// Each member's share of the requests it took between two scrapes.
fn shares(before: &[f64], after: &[f64]) -> Vec<f64> {
    let taken: Vec<f64> = before
        .iter()
        .zip(after)
        .map(|(before, after)| (after - before).max(0.0))
        .collect();
    let total: f64 = taken.iter().sum();
    taken
        .iter()
        .map(|taken| {
            if total > 0.0 {
                (taken / total * 1000.0).round() / 1000.0
            } else {
                0.0
            }
        })
        .collect()
}

pub fn run(
    plan: &Plan,
    scaling: &ScalingPlan,
    shutdown: &Shutdown,
) -> Result<ScalingOutcome, CliError> {
    eprintln!(
        "netchain: starting 3 members, each at most {} chain requests/s ...",
        scaling.member_max_ops_per_s
    );
    let store = ChainStore::start(&plan.netchain, shutdown)?;
    let durability = format!(
        "3 members, {} virtual group(s), each at most {} chain requests/s (emulated: a token \
         bucket in front of the member); tables on {}",
        store.groups, scaling.member_max_ops_per_s, store.medium
    );
    eprintln!("netchain: running ({durability})");
    eprintln!(
        "netchain: writing {} keys of {} bytes ...",
        plan.keys, plan.value_size
    );
    let mut loaders = (0..plan.keys.min(16) as u32)
        .map(|index| {
            store
                .client(index, ReadFrom::AnyMember, RETRANSMIT_TIMEOUT)
                .map(|client| Box::new(client) as Box<dyn CoordClient>)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let value = load::value_of(plan.seed, plan.value_size);
    load::preload(&mut loaders, plan.keys, &value, shutdown)?;
    drop(loaders);
    let workload = Workload {
        keys: plan.keys,
        distribution: KeyDistribution::Zipf,
        zipf_exponent: scaling.zipf,
        update_ratio: scaling.write_ratio,
        value_len: plan.value_size,
        servers: 1,
        popularity: PopularityKind::Static,
        change_every: Duration::from_secs(10),
        change_count: 1,
    };
    let phase = Phase {
        op: Op::Mixed,
        workload,
        seed: plan.seed,
        warmup: plan.warmup,
        duration: plan.duration,
        client_cpu: plan.pin.map(|(clients, _)| clients),
    };
    let mut rows = Vec::new();
    let mut interrupted = false;
    for reads in [ReadFrom::Tail, ReadFrom::AnyMember] {
        let mut clients = (0..scaling.clients)
            .map(|index| {
                store
                    .client(index, reads, RETRANSMIT_TIMEOUT)
                    .map(|client| Box::new(client) as Box<dyn CoordClient>)
            })
            .collect::<Result<Vec<_>, _>>()?;
        eprintln!(
            "  netchain  reads at {:<10} {} clients: {:.1} s warm-up, {:.1} s measured ...",
            reads_name(reads),
            scaling.clients,
            plan.warmup.as_secs_f64(),
            plan.duration.as_secs_f64()
        );
        let before = store.member_counters("pmnet_chain_requests_total")?;
        let (measured, cpu) = run_phase(&mut clients, &phase, shutdown, &store.pids())?;
        let after = store.member_counters("pmnet_chain_requests_total")?;
        if measured.interrupted {
            interrupted = true;
            break;
        }
        let mut row = ResultRow::new(System::Netchain, Op::Mixed, scaling.clients, &measured);
        row.reads_from = Some(reads_name(reads));
        row.cpu_us_per_op = Some(cpu);
        row.reads_per_s = Some((measured.reads as f64 / measured.seconds.max(1e-9)).round());
        row.member_request_shares = Some(shares(&before, &after));
        eprintln!(
            "  netchain  reads at {:<10} {} clients: {}; members took {:?} of the requests",
            reads_name(reads),
            scaling.clients,
            row.brief(),
            row.member_request_shares.as_deref().unwrap_or_default()
        );
        rows.push(row);
    }
    let throughput = |reads: ReadFrom| {
        rows.iter()
            .find(|row| row.reads_from == Some(reads_name(reads)))
            .map_or(0.0, |row| row.ops_per_s)
    };
    let (tail, any) = (throughput(ReadFrom::Tail), throughput(ReadFrom::AnyMember));
    let ratio = if tail > 0.0 {
        (any / tail * 100.0).round() / 100.0
    } else {
        0.0
    };
    let summary = ScalingSummary {
        members: 3,
        groups: store.groups,
        member_max_ops_per_s: scaling.member_max_ops_per_s,
        write_ratio: scaling.write_ratio,
        zipf: scaling.zipf,
        clients: scaling.clients,
        tail_ops_per_s: tail,
        any_member_ops_per_s: any,
        ratio,
        target: TARGET,
        met: ratio >= TARGET,
    };
    Ok(ScalingOutcome {
        rows,
        summary,
        durability,
        interrupted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_each_member_s_part_of_what_all_took() {
        assert_eq!(
            shares(&[10.0, 0.0, 5.0], &[60.0, 50.0, 105.0]),
            [0.25, 0.25, 0.5]
        );
        assert_eq!(shares(&[1.0, 1.0], &[1.0, 1.0]), [0.0, 0.0]);
    }
}
