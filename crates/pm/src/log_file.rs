//! The device log's file: made and formatted when it does not exist, recovered when it holds a
//! log, and refused otherwise.
//!
//! An existing file may hold entries whose clients were acknowledged, so nothing here formats
//! over one unless asked to ([`LogFileOptions::format`]): a file that is empty, shorter than its
//! layout, or whose superblock is blank, corrupt or not a log's is an error
//! ([`LogFileError::Unusable`]) that says what is wrong and how many slots still look like
//! intact entries. A new file is made under a staging name and appears under its own only once
//! it is formatted ([`MmapRegion::create_new`]), so a crash while making it leaves no file
//! rather than a blank one.

use std::io;
use std::path::{Path, PathBuf};

use crate::log::{check_layout, scan_for_entries, EntryScan, LogError, LogRecovery, PmLog};
use crate::mmap::{MmapOptions, MmapRegion, PmError};
use crate::region::PmRegion;

/// How to open the log's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogFileOptions {
    /// Geometry of a new (or erased) log; an existing log keeps its own.
    pub slot_count: u32,
    pub slot_size: u32,
    /// Erase an existing file and format an empty log on it, whatever it holds.
    pub format: bool,
    pub mmap: MmapOptions,
}

/// What [`open_log_file`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFileOpened {
    /// The file did not exist: it was made and formatted.
    Created,
    /// The file existed and was erased and formatted, as asked.
    Erased,
    /// The file held a log: its entries were recovered.
    Reopened,
}

/// Why the log's file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum LogFileError {
    /// The file could not be made, opened, sized or mapped (the message names it).
    #[error(transparent)]
    File(PmError),

    /// A new log could not be laid out (its geometry, for example).
    #[error("device log {}: {error}", path.display())]
    Format { path: PathBuf, error: LogError },

    /// The file exists but holds no log this build can open. It may hold acknowledged
    /// entries, so it is left as it is.
    #[error(
        "device log {} ({file_len} bytes) holds no usable log: {error}{}",
        path.display(),
        describe_scan(*scan)
    )]
    Unusable {
        path: PathBuf,
        file_len: u64,
        error: LogError,
        /// What a scan of the slots found, when the file is longer than a superblock.
        scan: Option<EntryScan>,
    },
}

impl LogFileError {
    /// Slots of an unusable file that still look like intact entries.
    pub fn intact_entries(&self) -> Option<u32> {
        match self {
            LogFileError::Unusable {
                scan: Some(scan), ..
            } => Some(scan.intact_entries),
            _ => None,
        }
    }
}

fn describe_scan(scan: Option<EntryScan>) -> String {
    match scan {
        None => String::new(),
        Some(EntryScan {
            intact_entries: 0, ..
        }) => "; no slot in it looks like an intact entry".to_owned(),
        Some(EntryScan {
            intact_entries,
            slot_size,
        }) => format!(
            "; {intact_entries} slot(s) in it still look like intact entries{} — logged updates \
             the server may not have applied",
            slot_size.map_or_else(String::new, |size| format!(" (slot size {size} bytes)"))
        ),
    }
}

/// Open the device log at `path`: a file that does not exist is made and formatted; one that
/// exists is erased and formatted if `options.format` is set, and recovered otherwise —
/// refused if it holds no usable log. Returns the log, what recovery found (nothing for a new
/// or erased log) and which of these happened.
pub fn open_log_file(
    path: &Path,
    options: &LogFileOptions,
) -> Result<(PmLog<MmapRegion>, LogRecovery, LogFileOpened), LogFileError> {
    let file_len = match std::fs::metadata(path) {
        Ok(metadata) => Some(metadata.len()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => None,
        Err(error) => return Err(LogFileError::File(PmError::from_io(path, "open", error))),
    };
    let format_error = |error| LogFileError::Format {
        path: path.to_path_buf(),
        error,
    };
    let len = PmLog::<MmapRegion>::required_region_len(options.slot_count, options.slot_size);
    let Some(file_len) = file_len else {
        // Check the geometry before making anything: formatting an empty region fails on it
        // first, if it is wrong.
        if let Err(error @ LogError::BadGeometry { .. }) = PmLog::format(
            crate::SimRegion::new(0),
            options.slot_count,
            options.slot_size,
        ) {
            return Err(format_error(error));
        }
        let (region, new_file) =
            MmapRegion::create_new(path, len, options.mmap).map_err(LogFileError::File)?;
        let log =
            PmLog::format(region, options.slot_count, options.slot_size).map_err(format_error)?;
        new_file.publish().map_err(LogFileError::File)?;
        return Ok((log, LogRecovery::default(), LogFileOpened::Created));
    };
    if options.format {
        let region = MmapRegion::create(path, len, options.mmap).map_err(LogFileError::File)?;
        let log =
            PmLog::format(region, options.slot_count, options.slot_size).map_err(format_error)?;
        return Ok((log, LogRecovery::default(), LogFileOpened::Erased));
    }
    let unusable = |error, scan| LogFileError::Unusable {
        path: path.to_path_buf(),
        file_len,
        error,
        scan,
    };
    if file_len == 0 {
        // Nothing to map.
        return Err(unusable(LogError::NoSuperblock { region_len: 0 }, None));
    }
    let region = MmapRegion::open(path, options.mmap).map_err(LogFileError::File)?;
    if let Err(error) = check_layout(region.bytes()) {
        let bytes = region.bytes();
        let scan = (bytes.len() > crate::log::SUPERBLOCK_SIZE).then(|| scan_for_entries(bytes));
        return Err(unusable(error, scan));
    }
    let (log, recovery) = PmLog::open(region).map_err(|error| unusable(error, None))?;
    Ok((log, recovery, LogFileOpened::Reopened))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;
    use crate::log::{EntryKey, SUPERBLOCK_SIZE};

    const SLOT_COUNT: u32 = 16;
    const SLOT_SIZE: u32 = 512;

    /// A directory of its own under the system's temporary directory, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            static COUNTER: AtomicU64 = AtomicU64::new(0);
            let unique = COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = std::env::temp_dir().join(format!(
                "pmnet-log-file-test-{}-{unique}-{name}",
                std::process::id()
            ));
            std::fs::create_dir_all(&path).unwrap();
            TempDir(path)
        }

        fn log(&self) -> PathBuf {
            self.0.join("device.log")
        }

        /// Every name in the directory.
        fn names(&self) -> Vec<String> {
            let mut names: Vec<String> = std::fs::read_dir(&self.0)
                .unwrap()
                .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn options(format: bool) -> LogFileOptions {
        LogFileOptions {
            slot_count: SLOT_COUNT,
            slot_size: SLOT_SIZE,
            format,
            mmap: MmapOptions::default(),
        }
    }

    fn key(n: u32) -> EntryKey {
        EntryKey {
            server_id: 1,
            session_id: 0xABC,
            seq: n,
            fragment_index: 0,
        }
    }

    /// A log file at `path` holding entries with seq 1 and 2 in slots 3 and 9.
    fn write_log(path: &Path) {
        let (mut log, _, opened) = open_log_file(path, &options(false)).unwrap();
        assert_eq!(opened, LogFileOpened::Created);
        log.write(3, &key(1), b"first update");
        log.write(9, &key(2), b"second update");
    }

    fn required_len() -> u64 {
        PmLog::<MmapRegion>::required_region_len(SLOT_COUNT, SLOT_SIZE) as u64
    }

    #[test]
    fn a_new_file_is_created_formatted_and_reopened() {
        let dir = TempDir::new("new");
        let path = dir.log();
        write_log(&path);
        assert_eq!(dir.names(), ["device.log"], "no staging file is left");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), required_len());

        let (_, recovery, opened) = open_log_file(&path, &options(false)).unwrap();
        assert_eq!(opened, LogFileOpened::Reopened);
        let seqs: Vec<u32> = recovery.entries.iter().map(|entry| entry.key.seq).collect();
        assert_eq!(seqs, [1, 2]);
    }

    #[test]
    fn format_erases_an_existing_log() {
        let dir = TempDir::new("format");
        let path = dir.log();
        write_log(&path);
        let (_, recovery, opened) = open_log_file(&path, &options(true)).unwrap();
        assert_eq!(opened, LogFileOpened::Erased);
        assert!(recovery.entries.is_empty());
        let (_, recovery, opened) = open_log_file(&path, &options(false)).unwrap();
        assert_eq!(opened, LogFileOpened::Reopened);
        assert!(recovery.entries.is_empty());
    }

    /// Each way an existing file can hold no usable log: refused, named, left as it is; and
    /// `format` starts an empty log on it.
    #[test]
    fn a_damaged_or_emptied_file_is_refused_unless_formatted() {
        type Damage = fn(&Path);
        let zero_superblock: Damage = |path| {
            let mut bytes = std::fs::read(path).unwrap();
            bytes[..64].fill(0);
            std::fs::write(path, bytes).unwrap();
        };
        let corrupt_superblock: Damage = |path| {
            let mut bytes = std::fs::read(path).unwrap();
            bytes[16] ^= 0x10; // the slot count
            std::fs::write(path, bytes).unwrap();
        };
        let other_magic: Damage = |path| {
            let mut bytes = std::fs::read(path).unwrap();
            bytes[..8].copy_from_slice(b"SQLite f");
            std::fs::write(path, bytes).unwrap();
        };
        let truncate_to_zero: Damage = |path| {
            std::fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_len(0)
                .unwrap();
        };
        let shorter_than_a_superblock: Damage = |path| {
            let bytes = std::fs::read(path).unwrap();
            std::fs::write(path, &bytes[..1000]).unwrap();
        };
        let shorter_than_its_layout: Damage = |path| {
            let bytes = std::fs::read(path).unwrap();
            std::fs::write(path, &bytes[..SUPERBLOCK_SIZE + 8 * SLOT_SIZE as usize]).unwrap();
        };
        let all_zero: Damage = |path| {
            let len = std::fs::metadata(path).unwrap().len() as usize;
            std::fs::write(path, vec![0u8; len]).unwrap();
        };
        let cases: [(&str, Damage, &str, Option<u32>); 7] = [
            (
                "zeroed superblock",
                zero_superblock,
                "blank (all zero)",
                Some(2),
            ),
            ("corrupt superblock", corrupt_superblock, "corrupt", Some(2)),
            ("another file", other_magic, "not a pmnet log", Some(2)),
            ("truncated to 0", truncate_to_zero, "empty (0 bytes)", None),
            ("short", shorter_than_a_superblock, "shorter than", None),
            // The entry in slot 9 is cut off; the one in slot 3 is still there.
            ("truncated", shorter_than_its_layout, "truncated", Some(1)),
            ("all zero", all_zero, "blank (all zero)", Some(0)),
        ];
        for (name, damage, problem, intact) in cases {
            let dir = TempDir::new("damaged");
            let path = dir.log();
            write_log(&path);
            damage(&path);
            let before = std::fs::read(&path).unwrap();

            let error = open_log_file(&path, &options(false)).unwrap_err();
            assert!(
                matches!(error, LogFileError::Unusable { .. }),
                "{name}: {error:?}"
            );
            let text = error.to_string();
            assert!(text.contains(&path.display().to_string()), "{name}: {text}");
            assert!(text.contains(problem), "{name}: {problem:?} not in {text}");
            assert_eq!(error.intact_entries(), intact, "{name}: {text}");
            if intact.is_some_and(|count| count > 0) {
                assert!(text.contains("look like intact entries"), "{name}: {text}");
            }
            assert_eq!(
                std::fs::read(&path).unwrap(),
                before,
                "{name}: the file changed"
            );
            assert_eq!(dir.names(), ["device.log"], "{name}");

            let (_, recovery, opened) = open_log_file(&path, &options(true)).unwrap();
            assert_eq!(opened, LogFileOpened::Erased, "{name}");
            assert!(recovery.entries.is_empty(), "{name}");
            assert_eq!(std::fs::metadata(&path).unwrap().len(), required_len());
            let (_, _, opened) = open_log_file(&path, &options(false)).unwrap();
            assert_eq!(opened, LogFileOpened::Reopened, "{name}");
        }
    }

    #[test]
    fn a_crash_while_making_a_file_leaves_none_under_its_name() {
        let dir = TempDir::new("staging");
        let path = dir.log();
        // What a crash before publishing leaves: a blank file under the staging name only.
        let (region, new_file) =
            MmapRegion::create_new(&path, 8192, MmapOptions::default()).unwrap();
        let staging = new_file.staging_path().to_path_buf();
        std::mem::forget(new_file);
        drop(region);
        assert!(staging.exists() && !path.exists());

        write_log(&path);
        assert_eq!(
            dir.names(),
            ["device.log"],
            "the stale staging file is gone"
        );
    }

    #[test]
    fn a_bad_geometry_makes_no_file() {
        let dir = TempDir::new("geometry");
        let mut bad = options(false);
        bad.slot_size = 100;
        let error = open_log_file(&dir.log(), &bad).unwrap_err();
        assert!(
            matches!(
                error,
                LogFileError::Format {
                    error: LogError::BadGeometry { .. },
                    ..
                }
            ),
            "{error:?}"
        );
        assert!(dir.names().is_empty());
    }

    #[test]
    fn a_file_in_use_is_neither_opened_nor_made_twice() {
        let dir = TempDir::new("in-use");
        let path = dir.log();
        write_log(&path);
        let (_held, _, _) = open_log_file(&path, &options(false)).unwrap();
        for format in [false, true] {
            let error = open_log_file(&path, &options(format)).unwrap_err();
            assert!(
                matches!(error, LogFileError::File(PmError::Locked { .. })),
                "{error:?}"
            );
        }
    }
}
