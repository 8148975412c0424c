//! `pmnet log inspect FILE`: what a device log holds, read offline and never written.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use pmnet_pm::{LogInspection, RecoveredEntry};
use serde_json::{json, Value};

use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    #[command(subcommand)]
    pub command: LogCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum LogCommand {
    /// List a device log's live entries and what is damaged, reading the file only (it is
    /// opened read-only: never formatted, repaired or freed). Exit status: 0 for an intact
    /// log, 2 for a log with damaged slots or cut short (reported), 1 for a file that holds no
    /// log.
    Inspect(InspectArgs),
}

#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// The device's log file (its --log-file).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,

    /// Print everything as JSON instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Bytes of each entry's payload shown in the preview.
    #[arg(long, value_name = "BYTES", default_value_t = 24)]
    pub preview: usize,
}

/// Exit status for a log that holds damaged slots or is cut short.
const EXIT_DAMAGED: u8 = 2;

pub fn run(args: LogArgs) -> Result<ExitCode, CliError> {
    match args.command {
        LogCommand::Inspect(args) => inspect(args),
    }
}

fn inspect(args: InspectArgs) -> Result<ExitCode, CliError> {
    let path = args.file.display().to_string();
    let mut bytes = Vec::new();
    std::fs::File::open(&args.file)
        .and_then(|mut file| file.read_to_end(&mut bytes))
        .map_err(|error| format!("cannot read {path}: {error}"))?;
    let inspection = pmnet_pm::inspect_log(&bytes)
        .map_err(|error| format!("{path} holds no pmnet device log: {error}"))?;
    let report = Report::new(&inspection, args.preview);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.json(&path))?);
    } else {
        print!("{}", report.text(&path));
    }
    Ok(
        if inspection.damaged.is_empty() && !inspection.is_truncated() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(EXIT_DAMAGED)
        },
    )
}

/// One live entry as shown.
struct Row {
    slot: u32,
    server_id: u16,
    session_id: u64,
    seq: u32,
    fragment: String,
    kind: String,
    packet_len: usize,
    payload_len: usize,
    return_address: Option<String>,
    preview: String,
}

impl Row {
    fn new(entry: &RecoveredEntry, preview_len: usize) -> Row {
        // The packet's own header says its type and fragment count; a packet that does not
        // parse is shown as it is (the log's CRC covers it: it was logged so).
        let (kind, fragment, payload) = match pmnet_wire::Header::parse(&entry.packet) {
            Ok((header, payload)) => (
                header.packet_type.name().to_owned(),
                format!("{}/{}", header.fragment_index, header.fragment_count),
                payload,
            ),
            Err(error) => (
                format!("unparsed ({error})"),
                format!("{}/?", entry.key.fragment_index),
                &entry.packet[..],
            ),
        };
        Row {
            slot: entry.slot,
            server_id: entry.key.server_id,
            session_id: entry.key.session_id,
            seq: entry.key.seq,
            fragment,
            kind,
            packet_len: entry.packet.len(),
            payload_len: payload.len(),
            return_address: entry.return_address.map(|addr| addr.to_string()),
            preview: preview(payload, preview_len),
        }
    }
}

/// The first `len` bytes of `payload`, printable ASCII as is and the rest as `\xNN`, with `…`
/// when cut.
fn preview(payload: &[u8], len: usize) -> String {
    let mut out = String::new();
    for byte in payload.iter().take(len) {
        match byte {
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(char::from(*byte)),
            _ => {
                let _ = write!(out, "\\x{byte:02x}");
            }
        }
    }
    if payload.len() > len {
        out.push('…');
    }
    out
}

struct Report<'a> {
    inspection: &'a LogInspection,
    rows: Vec<Row>,
    by_server: BTreeMap<u16, usize>,
    /// Per session: (highest seq, entries).
    by_session: BTreeMap<u64, (u32, usize)>,
}

impl Report<'_> {
    fn new(inspection: &LogInspection, preview_len: usize) -> Report<'_> {
        let rows: Vec<Row> = inspection
            .entries
            .iter()
            .map(|entry| Row::new(entry, preview_len))
            .collect();
        let mut by_server = BTreeMap::new();
        let mut by_session = BTreeMap::new();
        for entry in &inspection.entries {
            *by_server.entry(entry.key.server_id).or_insert(0) += 1;
            let session = by_session.entry(entry.key.session_id).or_insert((0, 0));
            session.0 = session.0.max(entry.key.seq);
            session.1 += 1;
        }
        Report {
            inspection,
            rows,
            by_server,
            by_session,
        }
    }

    fn text(&self, path: &str) -> String {
        let log = self.inspection;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{path}: a pmnet device log of {} slots of {} bytes ({} bytes; the file has {})",
            log.slot_count, log.slot_size, log.required_len, log.region_len
        );
        if !self.rows.is_empty() {
            let _ = writeln!(
                out,
                "{:>8}  {:>6}  {:<18}  {:>10}  {:>5}  {:<7}  {:>7}  {:<21}  preview",
                "slot", "server", "session", "seq", "frag", "type", "payload", "return address"
            );
        }
        for row in &self.rows {
            let _ = writeln!(
                out,
                "{:>8}  {:>6}  {:<18}  {:>10}  {:>5}  {:<7}  {:>7}  {:<21}  {}",
                row.slot,
                row.server_id,
                format!("{:#018x}", row.session_id),
                row.seq,
                row.fragment,
                row.kind,
                row.payload_len,
                row.return_address.as_deref().unwrap_or("-"),
                row.preview
            );
        }
        let _ = writeln!(
            out,
            "summary: {} live entries in {} slots ({:.1}% used)",
            self.rows.len(),
            log.slot_count,
            100.0 * self.rows.len() as f64 / f64::from(log.slot_count)
        );
        if !self.by_server.is_empty() {
            let servers: Vec<String> = self
                .by_server
                .iter()
                .map(|(server, count)| format!("server {server}: {count}"))
                .collect();
            let _ = writeln!(out, "  by server: {}", servers.join(", "));
            let _ = writeln!(out, "  sessions: {}", self.by_session.len());
            for (session, (seq, count)) in &self.by_session {
                let _ = writeln!(
                    out,
                    "    {session:#018x}: highest seq {seq} ({count} entries)"
                );
            }
        }
        if log.is_truncated() {
            let _ = writeln!(
                out,
                "TRUNCATED: the file ends after {} of {} slots ({} bytes of {}); the slots past \
                 its end are missing",
                log.slots_present, log.slot_count, log.region_len, log.required_len
            );
        }
        if log.damaged.is_empty() {
            let _ = writeln!(out, "  damaged slots: none");
        } else {
            let _ = writeln!(
                out,
                "DAMAGED: {} slot(s) a device would reject and free when it opens the log:",
                log.damaged.len()
            );
            for slot in &log.damaged {
                let _ = writeln!(out, "  {slot}");
            }
        }
        out
    }

    fn json(&self, path: &str) -> Value {
        let log = self.inspection;
        let entries: Vec<Value> = self
            .rows
            .iter()
            .map(|row| {
                json!({
                    "slot": row.slot,
                    "server_id": row.server_id,
                    "session_id": row.session_id,
                    "seq": row.seq,
                    "fragment": row.fragment,
                    "type": row.kind,
                    "packet_len": row.packet_len,
                    "payload_len": row.payload_len,
                    "return_address": row.return_address,
                    "preview": row.preview,
                })
            })
            .collect();
        let damaged: Vec<Value> = log
            .damaged
            .iter()
            .map(|slot| {
                json!({
                    "slot": slot.slot,
                    "reason": slot.damage.to_string(),
                    "server_id": slot.key.server_id,
                    "session_id": slot.key.session_id,
                    "seq": slot.key.seq,
                    "packet_len": slot.packet_len,
                    "fields_verified": slot.fields_verified,
                })
            })
            .collect();
        let by_server: serde_json::Map<String, Value> = self
            .by_server
            .iter()
            .map(|(server, count)| (server.to_string(), (*count).into()))
            .collect();
        let sessions: Vec<Value> = self
            .by_session
            .iter()
            .map(|(session, (seq, count))| {
                json!({"session_id": session, "highest_seq": seq, "entries": count})
            })
            .collect();
        json!({
            "file": path,
            "slot_count": log.slot_count,
            "slot_size": log.slot_size,
            "file_len": log.region_len,
            "required_len": log.required_len,
            "truncated": log.is_truncated(),
            "slots_present": log.slots_present,
            "live_entries": self.rows.len(),
            "entries_by_server": by_server,
            "sessions": sessions,
            "entries": entries,
            "damaged": damaged,
        })
    }
}
