//! The per-write breakdown of both engines (Table 1's layout), run `--breakdown-runs` times:
//! printed, and kept for `--json`.

use pmnet_pktstore::bench::{
    run_breakdown, BreakdownOptions, BreakdownReport, BreakdownRow, PAPER_TABLE_1_US,
};
use pmnet_pktstore::breakdown::Phase;
use pmnet_pktstore::EngineKind;
use pmnet_pm::MmapOptions;
use serde::Serialize;

use super::args::StoreBenchArgs;
use pmnet::CliError;

/// The share of the conventional engine's checksum + copy + allocation/insertion time the
/// packet store is to remove at 1 KB.
pub(super) const REMOVED_SHARE_TARGET: f64 = 0.8;

/// The breakdown as `--json` writes it: the median run's table and the spread over the runs.
#[derive(Debug, Serialize)]
pub(super) struct BreakdownJson {
    /// Breakdown runs made.
    pub(super) runs: usize,
    /// The value size the share removed is judged on (1024 if measured, else the first size).
    pub(super) judged_size: usize,
    /// The share removed at `judged_size` (a fraction) of the median run, whose rows these are.
    pub(super) removed_share_median: f64,
    pub(super) removed_share_min: f64,
    pub(super) removed_share_max: f64,
    /// Every run's share removed at `judged_size`, ascending.
    removed_shares: Vec<f64>,
    medium: String,
    /// What one phase mark costs (subtracted from the phases).
    mark_cost_ns: f64,
    /// Distinct keys the writes overwrite.
    keys: usize,
    /// Per value size: what the packet store removes, and the check on receipt (networking,
    /// both engines, not in the rows).
    sizes: Vec<SizeJson>,
    /// One row per engine and value size, in the table's order.
    pub(super) rows: Vec<RowJson>,
    /// Table 1 of the paper (NoveLSM, 1 KB write, Optane), under the rows' names.
    paper_1k: PaperJson,
}

/// One engine at one value size: the table's lines, ns per write. The per-step columns are
/// the `*_ns` fields at this level; what sums or splits them is nested.
#[derive(Debug, Serialize)]
pub(super) struct RowJson {
    pub(super) engine: &'static str,
    pub(super) value_bytes: usize,
    /// Datagrams a request of this size travels in.
    datagrams: usize,
    prepare_ns: f64,
    checksum_ns: f64,
    copy_ns: f64,
    /// Table 1's "buffer allocation and insertion".
    alloc_insert_ns: f64,
    persist_ns: f64,
    /// Measured around the whole engine call (includes what the phase marks do not split).
    pub(super) total_ns: f64,
    alloc_insert_parts: AllocInsertJson,
    sums: SumsJson,
    /// Timed writes behind the row.
    writes: usize,
    /// Reopening the store afterwards.
    recovery_ms: f64,
    recovered_keys: usize,
    recovered_verified_bytes: u64,
}

#[derive(Debug, Serialize)]
struct AllocInsertJson {
    allocation_ns: f64,
    insertion_ns: f64,
}

#[derive(Debug, Serialize)]
struct SumsJson {
    /// The four data-management lines of Table 1.
    data_management_ns: f64,
    /// What the packet store sets out to remove.
    checksum_copy_alloc_insert_ns: f64,
}

#[derive(Debug, Serialize)]
struct SizeJson {
    value_bytes: usize,
    /// Checksum + copy + allocation/insertion of each engine.
    conventional_checksum_copy_alloc_insert_ns: Option<f64>,
    packet_checksum_copy_alloc_insert_ns: Option<f64>,
    /// The share of it the packet store removes (a fraction).
    removed_share: Option<f64>,
    /// The PMNet CRC32C check on receipt.
    receipt_check_ns: Option<f64>,
}

#[derive(Debug, Serialize)]
struct PaperJson {
    prepare_ns: f64,
    checksum_ns: f64,
    copy_ns: f64,
    alloc_insert_ns: f64,
    data_management_ns: f64,
    persist_ns: f64,
}

impl RowJson {
    fn new(row: &BreakdownRow) -> RowJson {
        RowJson {
            engine: row.engine.name(),
            value_bytes: row.value_len,
            datagrams: row.datagram_count,
            prepare_ns: row.phase(Phase::Prepare),
            checksum_ns: row.phase(Phase::Checksum),
            copy_ns: row.phase(Phase::Copy),
            alloc_insert_ns: row.allocation_and_insertion_ns(),
            persist_ns: row.phase(Phase::Persist),
            total_ns: row.total_ns,
            alloc_insert_parts: AllocInsertJson {
                allocation_ns: row.phase(Phase::Allocate),
                insertion_ns: row.phase(Phase::Insert),
            },
            sums: SumsJson {
                data_management_ns: row.data_management_ns(),
                checksum_copy_alloc_insert_ns: row.data_management_core_ns(),
            },
            writes: row.writes,
            recovery_ms: row.recovery_ms,
            recovered_keys: row.recovered_keys,
            recovered_verified_bytes: row.recovered_verified_bytes,
        }
    }
}

fn size_json(report: &BreakdownReport, value_len: usize) -> SizeJson {
    let core = |engine: EngineKind| {
        report
            .rows
            .iter()
            .find(|row| row.engine == engine && row.value_len == value_len)
            .map(BreakdownRow::data_management_core_ns)
    };
    SizeJson {
        value_bytes: value_len,
        conventional_checksum_copy_alloc_insert_ns: core(EngineKind::Conventional),
        packet_checksum_copy_alloc_insert_ns: core(EngineKind::Packet),
        removed_share: report.removed_fraction(value_len),
        receipt_check_ns: report
            .receipt_check_ns
            .iter()
            .find(|(len, _)| *len == value_len)
            .map(|(_, ns)| *ns),
    }
}

fn paper_json() -> PaperJson {
    let ns = |index: usize| PAPER_TABLE_1_US[index].1 * 1000.0;
    PaperJson {
        prepare_ns: ns(0),
        checksum_ns: ns(1),
        copy_ns: ns(2),
        alloc_insert_ns: ns(3),
        data_management_ns: ns(4),
        persist_ns: ns(5),
    }
}

/// The per-write breakdown, run `--breakdown-runs` times: prints the median run's table, the
/// spread of the share removed, and the target; returns them.
pub(super) fn breakdown(args: &StoreBenchArgs) -> Result<BreakdownJson, CliError> {
    let options = BreakdownOptions {
        dir: args.dir.clone(),
        mmap: MmapOptions {
            flush: args.flush,
            added_latency_ns: 0,
        },
        value_lens: args.sizes.clone(),
        writes: args.writes.max(1),
        key_count: args.keys.max(1),
        ..BreakdownOptions::default()
    };
    let runs = args.breakdown_runs.max(1);
    // The size the target is judged on, else the first one measured.
    let judged = if args.sizes.contains(&1024) {
        1024
    } else {
        args.sizes.first().copied().unwrap_or(1024)
    };
    let mut reports = Vec::with_capacity(runs);
    for run in 0..runs {
        if runs > 1 {
            eprint!("\rbreakdown run {}/{runs}", run + 1);
        }
        let report = run_breakdown(&options)?;
        let removed = report.removed_fraction(judged).unwrap_or(0.0);
        reports.push((removed, report));
    }
    if runs > 1 {
        eprintln!();
    }
    reports.sort_by(|a, b| a.0.total_cmp(&b.0));
    let shares: Vec<f64> = reports.iter().map(|(removed, _)| *removed).collect();
    let (removed, report) = &reports[reports.len() / 2];
    let (min, max) = (
        shares.first().copied().unwrap_or(0.0),
        shares.last().copied().unwrap_or(0.0),
    );
    println!("{}", report.table());
    if runs > 1 {
        println!(
            "{judged}-byte share removed over {runs} breakdown runs: {:.1}–{:.1} %, median {:.1} % \
             (the table above is the median run)",
            min * 100.0,
            max * 100.0,
            removed * 100.0
        );
    }
    if judged == 1024 && report.removed_fraction(1024).is_some() {
        println!(
            "target: the packet store removes >= {:.0} % of the conventional engine's checksum + \
             copy + allocation/insertion time per 1 KB write: {:.1} % ({}{})",
            REMOVED_SHARE_TARGET * 100.0,
            removed * 100.0,
            if *removed >= REMOVED_SHARE_TARGET {
                "met"
            } else {
                "NOT met"
            },
            if runs > 1 { ", median of the runs" } else { "" }
        );
    }
    Ok(BreakdownJson {
        runs,
        judged_size: judged,
        removed_share_median: *removed,
        removed_share_min: min,
        removed_share_max: max,
        removed_shares: shares.clone(),
        medium: report.medium.to_string(),
        mark_cost_ns: report.mark_cost_ns,
        keys: options.key_count,
        sizes: options
            .value_lens
            .iter()
            .map(|len| size_json(report, *len))
            .collect(),
        rows: report.rows.iter().map(RowJson::new).collect(),
        paper_1k: paper_json(),
    })
}

impl BreakdownJson {
    pub(super) fn medium(&self) -> &str {
        &self.medium
    }

    /// Whether the judged share was measured at 1 KB, the size the target is for.
    pub(super) fn judges_the_target(&self) -> bool {
        self.judged_size == 1024
            && self
                .sizes
                .iter()
                .any(|size| size.value_bytes == 1024 && size.removed_share.is_some())
    }
}
