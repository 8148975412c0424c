//! The write-path breakdown of both engines, in the layout of Table 1 of "Packets as
//! Persistent In-Memory Data Structures": request preparation, checksum, data copy, buffer
//! allocation and insertion, persistence — per write, for several value sizes, in one run.
//!
//! What is timed is the storage engine alone, from the moment the request is in memory (in a
//! store slot for the packet engine, in a socket buffer for the conventional one) until it is
//! durable. Receiving it (the kernel's copy into the slot or the socket buffer) and the PMNet
//! header check on receipt are networking, the same for both engines, and reported on a line
//! of their own.

use std::path::PathBuf;
use std::time::Instant;

use pmnet_pm::{MediumInfo, MmapOptions, MmapRegion, PmRegion};
use pmnet_store::Request;
use pmnet_wire::{Header, Packet, PacketType};

use crate::breakdown::{mark_cost_ns, ticks, ticks_per_ns, Phase, PHASES};
use crate::{EngineKind, Store, StoreConfig};

/// How to run the breakdown.
#[derive(Debug, Clone)]
pub struct BreakdownOptions {
    /// Where the store files go (emulated PM: a DRAM file system such as /dev/shm).
    pub dir: PathBuf,
    pub mmap: MmapOptions,
    /// Value sizes to measure, in bytes.
    pub value_lens: Vec<usize>,
    /// Timed writes per engine and size (after as many untimed ones to warm up).
    pub writes: usize,
    /// Distinct keys the writes overwrite at random (the store holds all of them).
    pub key_count: usize,
    /// Largest datagram the client sends (requests above it travel as several fragments).
    pub max_datagram_len: usize,
}

impl Default for BreakdownOptions {
    fn default() -> Self {
        BreakdownOptions {
            dir: PathBuf::from("/dev/shm"),
            mmap: MmapOptions::default(),
            value_lens: vec![64, 1024, 4096],
            writes: 20_000,
            key_count: 2_000,
            max_datagram_len: pmnet_wire::DEFAULT_MAX_DATAGRAM_LEN,
        }
    }
}

/// One engine at one value size.
#[derive(Debug, Clone)]
pub struct BreakdownRow {
    pub engine: EngineKind,
    pub value_len: usize,
    pub datagram_count: usize,
    /// Mean ns per write of each phase, in [`PHASES`] order.
    pub phase_ns: [f64; 6],
    /// Mean ns per write, measured around the whole engine call (includes what the phase marks
    /// do not split).
    pub total_ns: f64,
    pub writes: usize,
    /// Reopening the store afterwards: recovery time, keys and verified bytes.
    pub recovery_ms: f64,
    pub recovered_keys: usize,
    pub recovered_verified_bytes: u64,
}

impl BreakdownRow {
    pub fn phase(&self, phase: Phase) -> f64 {
        self.phase_ns[PHASES.iter().position(|p| *p == phase).unwrap_or(0)]
    }

    /// Checksum + copy + allocation and insertion: what the packet store sets out to remove.
    pub fn data_management_core_ns(&self) -> f64 {
        self.phase(Phase::Checksum) + self.phase(Phase::Copy) + self.allocation_and_insertion_ns()
    }

    /// Table 1's "buffer allocation and insertion".
    pub fn allocation_and_insertion_ns(&self) -> f64 {
        self.phase(Phase::Allocate) + self.phase(Phase::Insert)
    }

    /// The four data-management lines of Table 1 (request preparation included).
    pub fn data_management_ns(&self) -> f64 {
        self.phase(Phase::Prepare) + self.data_management_core_ns()
    }
}

/// The result of [`run_breakdown`].
#[derive(Debug, Clone)]
pub struct BreakdownReport {
    pub medium: MediumInfo,
    pub rows: Vec<BreakdownRow>,
    /// Mean ns of the PMNet CRC32C check on receipt, per value size (networking: both engines).
    pub receipt_check_ns: Vec<(usize, f64)>,
    pub mark_cost_ns: f64,
    pub options: BreakdownOptions,
}

struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

/// The datagrams a client sends for `payload`.
fn client_datagrams(
    session_id: u64,
    seq: u32,
    payload: &[u8],
    max_datagram_len: usize,
) -> Vec<Vec<u8>> {
    let fragment_len = max_datagram_len - pmnet_wire::HEADER_LEN;
    let count = payload.len().div_ceil(fragment_len).max(1);
    (0..count)
        .map(|index| {
            let mut header = Header::new(PacketType::UpdateRequest, 1, session_id, seq);
            header.fragment_index = index as u16;
            header.fragment_count = count as u16;
            let start = index * fragment_len;
            let end = ((index + 1) * fragment_len).min(payload.len());
            header.encode(&payload[start..end])
        })
        .collect()
}

fn key_for(index: u64) -> Vec<u8> {
    format!("user{index:08}").into_bytes()
}

/// One engine's store under the breakdown.
struct Subject {
    engine: EngineKind,
    store: Store<MmapRegion>,
    path: PathBuf,
    _guard: TempFile,
    value: Vec<u8>,
    seq: u32,
    rng: u64,
    lent: Vec<crate::ReceiveSlot>,
    datagram_count: usize,
}

const SESSION_ID: u64 = 0x5EED;

impl Subject {
    fn new(
        engine: EngineKind,
        value_len: usize,
        options: &BreakdownOptions,
        path: PathBuf,
    ) -> Result<Subject, String> {
        let slots_per_value = value_len.div_ceil(1024) + 1;
        let data_len = (options.key_count * 3 + 4096) * slots_per_value * 2048 + (8 << 20);
        let guard = TempFile(path.clone());
        let region = MmapRegion::create(&path, data_len, options.mmap)
            .map_err(|error| format!("cannot create {}: {error}", path.display()))?;
        let store = Store::format(region, StoreConfig::new(engine))
            .map_err(|error| format!("cannot format a store: {error}"))?;
        Ok(Subject {
            engine,
            store,
            path,
            _guard: guard,
            value: (0..value_len).map(|i| (i * 7 + 3) as u8).collect(),
            seq: 0,
            rng: 0x9E37_79B9_7F4A_7C15,
            lent: Vec::new(),
            datagram_count: 0,
        })
    }

    /// One write of key `key_index`; returns the ticks the engine took.
    fn write(&mut self, key_index: u64, options: &BreakdownOptions) -> Result<u64, String> {
        self.seq += 1;
        let seq = self.seq;
        let key = key_for(key_index);
        let request = Request::Set {
            key: &key,
            value: &self.value,
        }
        .to_bytes();
        let datagrams = client_datagrams(SESSION_ID, seq, &request, options.max_datagram_len);
        self.datagram_count = datagrams.len();
        let store = &mut self.store;
        let (reply, elapsed) = match self.engine {
            EngineKind::Packet => {
                // The network's part, untimed: the kernel copies each datagram into the slot
                // the runtime lent for it, and the protocol checks its CRC.
                store.lend_receive_slots(datagrams.len(), &mut self.lent);
                if self.lent.len() != datagrams.len() {
                    return Err("the packet store ran out of receive slots".to_owned());
                }
                for (slot, datagram) in self.lent.iter().zip(&datagrams) {
                    store
                        .write_received(slot.slot, datagram, 0)
                        .map_err(|reject| reject.reason.to_owned())?;
                }
                let slots: Vec<u32> = self.lent.iter().map(|slot| slot.slot).collect();
                std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
                let start = ticks();
                let reply = store
                    .stage_received(SESSION_ID, seq, &slots)
                    .map_err(|reject| reject.reason.to_owned())?
                    .map_err(|no_space| format!("a write found {no_space}"))?;
                store.commit();
                (reply, ticks() - start)
            }
            EngineKind::Conventional => {
                // The request as the protocol layer hands it over: reassembled in DRAM.
                let mut payload = Vec::with_capacity(request.len());
                for datagram in &datagrams {
                    payload.extend_from_slice(Packet::new_unchecked(datagram).payload());
                }
                std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
                let start = ticks();
                let reply = store
                    .stage_request(SESSION_ID, seq, &payload)
                    .map_err(|no_space| format!("a write found {no_space}"))?;
                store.commit();
                (reply, ticks() - start)
            }
        };
        if reply.first() != Some(&0) {
            return Err(format!("a write failed: {reply:?}"));
        }
        Ok(elapsed)
    }

    /// `count` overwrites of random keys; with `timed`, the per-phase means and the mean
    /// total (ns) of this chunk.
    fn chunk(
        &mut self,
        count: usize,
        options: &BreakdownOptions,
        mark_cost: f64,
    ) -> Result<([f64; 6], f64), String> {
        self.store.enable_breakdown();
        let mut total_ticks = 0u64;
        for _ in 0..count {
            let key_index = xorshift(&mut self.rng) % options.key_count as u64;
            total_ticks += self.write(key_index, options)?;
        }
        let breakdown = self.store.take_breakdown().unwrap_or_default();
        let mut phase_ns = [0.0; 6];
        for (slot, phase) in PHASES.iter().enumerate() {
            phase_ns[slot] = breakdown.mean_ns(*phase, mark_cost);
        }
        Ok((
            phase_ns,
            total_ticks as f64 / ticks_per_ns() / count.max(1) as f64,
        ))
    }

    /// Reopen the store and time its recovery.
    fn recover(self, options: &BreakdownOptions) -> Result<crate::RecoveryReport, String> {
        let Subject {
            store,
            path,
            _guard,
            ..
        } = self;
        drop(store);
        let region = MmapRegion::open(&path, options.mmap)
            .map_err(|error| format!("cannot reopen {}: {error}", path.display()))?;
        let reopened = Store::open(region).map_err(|error| format!("cannot recover: {error}"))?;
        let recovery = reopened.recovery().clone();
        if recovery.key_count != options.key_count || recovery.warning().is_some() {
            return Err(format!("recovery found something wrong: {recovery:?}"));
        }
        drop(reopened);
        drop(_guard);
        Ok(recovery)
    }
}

/// Chunks the timed writes are split into; the report gives the median of the chunk means,
/// so a preemption by another process spoils one chunk, not the figure.
const CHUNKS: usize = 10;

/// The median of `values` (the upper one of an even count); `None` when there are none.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied()
}

/// Both engines at one value size, their chunks alternating.
fn measure_size(
    value_len: usize,
    options: &BreakdownOptions,
    mark_cost: f64,
) -> Result<(Vec<BreakdownRow>, MediumInfo), String> {
    let mut subjects = Vec::new();
    for engine in [EngineKind::Conventional, EngineKind::Packet] {
        let path = options.dir.join(format!(
            "pmnet-store-bench-{}-{}-{value_len}.data",
            std::process::id(),
            engine.name()
        ));
        let mut subject = Subject::new(engine, value_len, options, path)?;
        // Fill every key, then as many untimed overwrites as timed ones: a store in steady
        // state, where each write also frees the record it replaces.
        for key_index in 0..options.key_count as u64 {
            subject.write(key_index, options)?;
        }
        subject.chunk(options.writes, options, mark_cost)?;
        subjects.push(subject);
    }
    let medium = subjects[0].store.region().medium();
    let chunk_len = options.writes.div_ceil(CHUNKS).max(1);
    let mut chunks: Vec<Vec<([f64; 6], f64)>> = vec![Vec::new(), Vec::new()];
    for _ in 0..CHUNKS {
        for (index, subject) in subjects.iter_mut().enumerate() {
            chunks[index].push(subject.chunk(chunk_len, options, mark_cost)?);
        }
    }
    let mut rows = Vec::new();
    for (subject, chunks) in subjects.into_iter().zip(chunks) {
        let mut phase_ns = [0.0; 6];
        for (slot, value) in phase_ns.iter_mut().enumerate() {
            *value = median(chunks.iter().map(|(phases, _)| phases[slot]).collect()).unwrap_or(0.0);
        }
        let total_ns = median(chunks.iter().map(|(_, total)| *total).collect()).unwrap_or(0.0);
        let engine = subject.engine;
        let datagram_count = subject.datagram_count;
        let recovery = subject.recover(options)?;
        rows.push(BreakdownRow {
            engine,
            value_len,
            datagram_count,
            phase_ns,
            total_ns,
            writes: chunk_len * CHUNKS,
            recovery_ms: recovery.duration.as_secs_f64() * 1e3,
            recovered_keys: recovery.key_count,
            recovered_verified_bytes: recovery.verified_bytes,
        });
    }
    Ok((rows, medium))
}

/// Measure both engines at every value size.
pub fn run_breakdown(options: &BreakdownOptions) -> Result<BreakdownReport, String> {
    if options.writes == 0 || options.key_count == 0 {
        return Err("writes and keys must be at least 1".to_owned());
    }
    let mark_cost = mark_cost_ns();
    let mut rows = Vec::new();
    let mut medium = None;
    let mut receipt_check_ns = Vec::new();
    for &value_len in &options.value_lens {
        if value_len > pmnet_store::codec::MAX_VALUE_LEN {
            return Err(format!("value size {value_len} is above the store's limit"));
        }
        let (size_rows, size_medium) = measure_size(value_len, options, mark_cost)?;
        rows.extend(size_rows);
        medium = Some(size_medium);
        let request = Request::Set {
            key: &key_for(1),
            value: &vec![1u8; value_len],
        }
        .to_bytes();
        let datagrams = client_datagrams(1, 1, &request, options.max_datagram_len);
        let rounds = 20_000;
        let start = Instant::now();
        let mut valid = 0;
        for _ in 0..rounds {
            for datagram in &datagrams {
                valid += usize::from(
                    Packet::new_unchecked(std::hint::black_box(datagram)).verify_checksum(),
                );
            }
        }
        assert_eq!(valid, rounds * datagrams.len());
        receipt_check_ns.push((value_len, start.elapsed().as_nanos() as f64 / rounds as f64));
    }
    Ok(BreakdownReport {
        medium: medium.ok_or("no value sizes given")?,
        rows,
        receipt_check_ns,
        mark_cost_ns: mark_cost,
        options: options.clone(),
    })
}

/// Table 1 of the paper (NoveLSM, 1 KB write, Optane, µs): for comparison.
pub const PAPER_TABLE_1_US: [(&str, f64); 6] = [
    ("request preparation", 0.70),
    ("checksum calculation", 1.77),
    ("data copy", 1.14),
    ("buffer allocation and insertion", 2.78),
    ("data management total", 6.39),
    ("flush CPU caches to PM", 1.94),
];

impl BreakdownReport {
    fn row(&self, engine: EngineKind, value_len: usize) -> Option<&BreakdownRow> {
        self.rows
            .iter()
            .find(|row| row.engine == engine && row.value_len == value_len)
    }

    /// Per-phase means in the layout of Table 1, one block per value size.
    pub fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "Storage engine write path, ns per write: median of {CHUNKS} chunk means, {} timed \
             writes per cell in chunks alternating between the engines, over {} keys \
             overwritten at random after {} untimed writes; one write per commit\nmedium: {}\n",
            self.options.writes.div_ceil(CHUNKS) * CHUNKS,
            self.options.key_count,
            self.options.writes,
            self.medium
        ));
        for &value_len in &self.options.value_lens {
            let (Some(conventional), Some(packet)) = (
                self.row(EngineKind::Conventional, value_len),
                self.row(EngineKind::Packet, value_len),
            ) else {
                continue;
            };
            out.push_str(&format!(
                "\n{value_len}-byte values ({} datagram{} of at most {} B):\n",
                packet.datagram_count,
                if packet.datagram_count == 1 { "" } else { "s" },
                self.options.max_datagram_len
            ));
            // The paper measured 1 KB writes.
            phase_lines(&mut out, conventional, packet, value_len == 1024);
            self.summary_lines(&mut out, conventional, packet);
        }
        out.push_str(&format!(
            "\n(phase timing by TSC marks; {:.1} ns per mark subtracted)\n",
            self.mark_cost_ns
        ));
        out
    }

    /// Below the phases of one value size: what the packet store removes, recovery, and the
    /// check on receipt.
    fn summary_lines(&self, out: &mut String, conventional: &BreakdownRow, packet: &BreakdownRow) {
        let value_len = packet.value_len;
        let core_conventional = conventional.data_management_core_ns();
        let core_packet = packet.data_management_core_ns();
        let removed = if core_conventional > 0.0 {
            100.0 * (1.0 - core_packet / core_conventional)
        } else {
            0.0
        };
        out.push_str(&format!(
            "  checksum + copy + allocation/insertion: conventional {core_conventional:.0} ns, \
             packet {core_packet:.0} ns: the packet store removes {removed:.1} %\n"
        ));
        out.push_str(&format!(
            "  recovery after reopening, {} keys: conventional {:.2} ms, packet {:.2} ms \
             (walks the persistent level 0, verifies every record's checksum, redoes the \
             last batch; no rebuild from a log)\n",
            packet.recovered_keys, conventional.recovery_ms, packet.recovery_ms
        ));
        if let Some((_, check)) = self
            .receipt_check_ns
            .iter()
            .find(|(len, _)| *len == value_len)
        {
            out.push_str(&format!(
                "  networking, both engines (not above): PMNet CRC32C check on receipt \
                 {check:.0} ns\n"
            ));
        }
    }

    /// The share of the conventional engine's checksum + copy + allocation/insertion time the
    /// packet store removes, at `value_len`.
    pub fn removed_fraction(&self, value_len: usize) -> Option<f64> {
        let conventional = self.row(EngineKind::Conventional, value_len)?;
        let packet = self.row(EngineKind::Packet, value_len)?;
        let core = conventional.data_management_core_ns();
        (core > 0.0).then(|| 1.0 - packet.data_management_core_ns() / core)
    }
}

/// The phases of one value size, the two engines side by side (and the paper's figures, with
/// `paper`), in the layout of Table 1.
fn phase_lines(out: &mut String, conventional: &BreakdownRow, packet: &BreakdownRow, paper: bool) {
    out.push_str(&format!(
        "  {:<12} {:<34} {:>12} {:>10}{}\n",
        "overhead",
        "operation",
        "conventional",
        "packet",
        if paper { "   paper (NoveLSM)" } else { "" }
    ));
    let paper_ns = |index: usize| {
        if paper {
            format!("   {:>8.0}", PAPER_TABLE_1_US[index].1 * 1000.0)
        } else {
            String::new()
        }
    };
    let line = |out: &mut String, group: &str, name: &str, a: f64, b: f64, paper: String| {
        out.push_str(&format!(
            "  {group:<12} {name:<34} {a:>12.0} {b:>10.0}{paper}\n"
        ));
    };
    line(
        out,
        "data mgmt.",
        Phase::Prepare.name(),
        conventional.phase(Phase::Prepare),
        packet.phase(Phase::Prepare),
        paper_ns(0),
    );
    line(
        out,
        "",
        Phase::Checksum.name(),
        conventional.phase(Phase::Checksum),
        packet.phase(Phase::Checksum),
        paper_ns(1),
    );
    line(
        out,
        "",
        Phase::Copy.name(),
        conventional.phase(Phase::Copy),
        packet.phase(Phase::Copy),
        paper_ns(2),
    );
    line(
        out,
        "",
        "buffer allocation and insertion",
        conventional.allocation_and_insertion_ns(),
        packet.allocation_and_insertion_ns(),
        paper_ns(3),
    );
    for phase in [Phase::Allocate, Phase::Insert] {
        line(
            out,
            "",
            &format!("  of which {}", phase.name()),
            conventional.phase(phase),
            packet.phase(phase),
            String::new(),
        );
    }
    out.push_str(&format!(
        "  {:<12} {:<34} {:>12.0} {:>10.0}{}\n",
        "",
        "= data management",
        conventional.data_management_ns(),
        packet.data_management_ns(),
        paper_ns(4)
    ));
    out.push_str(&format!(
        "  {:<12} {:<34} {:>12.0} {:>10.0}{}\n",
        "persistence",
        Phase::Persist.name(),
        conventional.phase(Phase::Persist),
        packet.phase(Phase::Persist),
        paper_ns(5)
    ));
    out.push_str(&format!(
        "  {:<12} {:<34} {:>12.0} {:>10.0}\n",
        "total", "engine, measured end to end", conventional.total_ns, packet.total_ns
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breakdown_runs_and_renders() {
        let dir = tempfile::tempdir().unwrap();
        let options = BreakdownOptions {
            dir: dir.path().to_path_buf(),
            value_lens: vec![64, 2000],
            writes: 200,
            key_count: 50,
            ..BreakdownOptions::default()
        };
        let report = run_breakdown(&options).unwrap();
        assert_eq!(report.rows.len(), 4);
        let table = report.table();
        assert!(table.contains("checksum calculation"));
        assert!(table.contains("medium:"));
        // The packet store computes no checksum and copies nothing on this path.
        for row in report
            .rows
            .iter()
            .filter(|r| r.engine == EngineKind::Packet)
        {
            assert_eq!(row.phase(Phase::Checksum), 0.0);
            assert_eq!(row.phase(Phase::Copy), 0.0);
            assert_eq!(row.datagram_count, if row.value_len == 64 { 1 } else { 2 });
        }
        assert!(report.removed_fraction(64).is_some());
    }
}
