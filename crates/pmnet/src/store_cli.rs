//! `pmnet store grow`: a stopped server's store made larger offline (a running server grows its
//! own, up to `--data-max-mib`; docs/storage.md, "Growing a store").

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use pmnet_pktstore::Store;
use pmnet_pm::{MmapRegion, PmError};

use crate::node::MediumArgs;
use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    #[command(subcommand)]
    pub command: StoreCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum StoreCommand {
    /// Grow a server's store (packet or conventional engine) to a larger data file, while the
    /// server is stopped: the file is made longer and synced, then one durable 8-byte store
    /// gives the store the new space. A crash at any point leaves it as it was or grown.
    Grow(GrowArgs),
    /// Copy a stopped server's store (packet or conventional engine) into a new data file of
    /// another size: every key, and every session's exactly-once record, so that the copy
    /// answers every client as the original would. Shrinks a store that grew, or compacts one
    /// whose keys were deleted. The original is left as it was; swap the files by hand.
    Compact(CompactArgs),
}

#[derive(Debug, Clone, Args)]
pub struct CompactArgs {
    /// The server's data file (its --data-file).
    #[arg(long, value_name = "PATH")]
    pub data_file: PathBuf,

    /// The new data file (must not exist).
    #[arg(long, value_name = "PATH")]
    pub to: PathBuf,

    /// The new data file's size in MiB.
    #[arg(long, value_name = "MIB")]
    pub data_mib: u64,

    #[command(flatten)]
    pub medium: MediumArgs,
}

#[derive(Debug, Clone, Args)]
pub struct GrowArgs {
    /// The server's data file (its --data-file; default pmnet-server-<ID>.data in --dir).
    #[arg(long, value_name = "PATH")]
    pub data_file: Option<PathBuf>,

    /// The server whose default data file it is, when --data-file is not given.
    #[arg(long, value_name = "ID", default_value_t = 1)]
    pub server_id: u16,

    /// The data file's new size in MiB (larger than it is).
    #[arg(long, value_name = "MIB")]
    pub to_mib: u64,

    #[command(flatten)]
    pub medium: MediumArgs,
}

pub fn run(args: StoreArgs) -> Result<ExitCode, CliError> {
    match args.command {
        StoreCommand::Grow(args) => grow(args),
        StoreCommand::Compact(args) => compact(args),
    }
}

fn compact(args: CompactArgs) -> Result<ExitCode, CliError> {
    let mmap = args.medium.mmap_options();
    let source_region = MmapRegion::open(&args.data_file, mmap).map_err(|error| match error {
        PmError::Locked { .. } => format!("{error}. Stop the server first"),
        other => other.to_string(),
    })?;
    let source = Store::open(source_region)
        .map_err(|error| format!("{}: {error}", args.data_file.display()))?;
    let geometry = *source.geometry();
    let len = usize::try_from(args.data_mib.saturating_mul(1 << 20))
        .map_err(|_| format!("--data-mib {}: too large for this machine", args.data_mib))?;
    let (region, new_file) = MmapRegion::create_new(&args.to, len, mmap)?;
    let mut config = pmnet_pktstore::StoreConfig::new(geometry.engine);
    config.max_sessions = geometry.max_sessions;
    if geometry.engine == pmnet_pktstore::EngineKind::Packet {
        config.slot_size = geometry.slot_size as usize;
    }
    let mut target = Store::format(region, config)
        .map_err(|error| format!("--to {}: {error}", args.to.display()))?;
    let report = source.copy_into(&mut target).map_err(|error| {
        format!(
            "copying {} into {}: {error}; nothing was published at {}",
            args.data_file.display(),
            args.to.display(),
            args.to.display()
        )
    })?;
    let medium = pmnet_pm::PmRegion::medium(target.region());
    drop(target);
    new_file.publish()?;
    println!(
        "{}: copied into {} ({} MiB of file, was {} MiB): {} keys, {} sessions' records",
        args.data_file.display(),
        args.to.display(),
        args.data_mib,
        pmnet_pm::PmRegion::len(source.region()) >> 20,
        report.keys,
        report.sessions
    );
    println!("  medium: {medium}");
    println!(
        "  to use it: stop nothing more (the server is stopped), move {} aside and {} in its \
         place, and start the server",
        args.data_file.display(),
        args.to.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn grow(args: GrowArgs) -> Result<ExitCode, CliError> {
    let path = args.data_file.clone().unwrap_or_else(|| {
        (args.medium).default_file(&format!("pmnet-server-{}.data", args.server_id))
    });
    let file_len = std::fs::metadata(&path)
        .map_err(|error| format!("{}: {error}; name the server's --data-file", path.display()))?
        .len();
    let target = args.to_mib.saturating_mul(1 << 20);
    if target <= file_len {
        return Err(format!(
            "--to-mib {}: {} is {} MiB already; give a larger size (a store is never shrunk)",
            args.to_mib,
            path.display(),
            file_len >> 20
        )
        .into());
    }
    let len = usize::try_from(target)
        .map_err(|_| format!("--to-mib {}: too large for this machine", args.to_mib))?;
    let mut region = MmapRegion::extend(&path, len, args.medium.mmap_options()).map_err(
        |error| match error {
            PmError::Locked { .. } => format!(
                "{error}. A running server grows its store by itself (--data-max-mib); stop it \
                 to grow the store by hand"
            ),
            other => other.to_string(),
        },
    )?;
    let medium = pmnet_pm::PmRegion::medium(&region);
    let (before, after) = Store::grow(&mut region).map_err(|error| {
        format!(
            "{}: {error} (the file is now {target} bytes; the store in it is unchanged)",
            path.display()
        )
    })?;
    drop(region);
    // Opened again as a server would: the grown store recovers, and says what it holds.
    let region = MmapRegion::open(&path, args.medium.mmap_options())?;
    let store = Store::open(region)
        .map_err(|error| format!("{}: the grown store does not open: {error}", path.display()))?;
    // The packet store's keys take a slot each up to a slot's payload; the conventional
    // engine's, a block of their size (told for 100 bytes).
    let size = match after.engine {
        pmnet_pktstore::EngineKind::Packet => store.one_slot_key_and_value_len(),
        pmnet_pktstore::EngineKind::Conventional => 100,
    };
    println!(
        "{}: the {} store grew from {} to {} MiB of data space ({} keys kept; room for {} keys \
         of up to {size} bytes of key and value)",
        path.display(),
        after.engine.name(),
        before.data_len >> 20,
        after.data_len >> 20,
        store.key_count(),
        store.key_capacity(size),
    );
    println!("  medium: {medium}");
    Ok(ExitCode::SUCCESS)
}
