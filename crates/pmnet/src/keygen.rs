//! `pmnet keygen`: a new deployment key file for `--key-file`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use pmnet_auth::{DeploymentKey, KeySet, KEY_LEN};

use crate::CliError;

#[derive(Debug, Clone, Args)]
pub struct KeygenArgs {
    /// The new key's id (rotate by giving the next key another id).
    #[arg(long, value_name = "ID", default_value_t = 1)]
    pub id: u16,

    /// Write the key file here (mode 0600) instead of printing it.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,

    /// Replace an existing file.
    #[arg(long)]
    pub force: bool,

    /// Also encrypt payloads (AES-256-GCM; off by default: every datagram is authenticated,
    /// its payload in clear). Writes the line `encrypt payloads` into the file.
    #[arg(long)]
    pub encrypt: bool,
}

pub fn run(args: KeygenArgs) -> Result<ExitCode, CliError> {
    let mut secret = [0u8; KEY_LEN];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut secret))
        .map_err(|error| format!("cannot read random bytes from /dev/urandom: {error}"))?;
    let text = KeySet::new(vec![DeploymentKey::new(args.id, secret)])
        .encrypting_payloads(args.encrypt)
        .to_file_text();
    let Some(path) = &args.out else {
        print!("{text}");
        return Ok(ExitCode::SUCCESS);
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    if args.force {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(|error| {
        if error.kind() == std::io::ErrorKind::AlreadyExists {
            format!(
                "{} exists: pass --force to replace it (every endpoint using the old key must \
                 get the new file)",
                path.display()
            )
        } else {
            format!("cannot create {}: {error}", path.display())
        }
    })?;
    #[cfg(unix)]
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    file.write_all(text.as_bytes())?;
    eprintln!(
        "pmnet keygen: key {} written to {} (mode 0600); give every device, server, client, \
         gateway and adaptor of the deployment `--key-file {}`",
        args.id,
        path.display(),
        path.display()
    );
    Ok(ExitCode::SUCCESS)
}
