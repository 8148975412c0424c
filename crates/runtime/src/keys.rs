//! Loading a deployment key file (see `pmnet-auth` and docs/security.md).

use std::path::Path;

use pmnet_auth::KeySet;

use crate::RuntimeError;

/// Read and parse the key file at `path`. Refused when group or others may read or write it
/// (the keys would not be secret); errors name the file, and the line at fault.
pub fn load_key_file(path: &Path) -> Result<KeySet, RuntimeError> {
    let shown = path.display();
    let metadata = std::fs::metadata(path).map_err(|error| {
        RuntimeError::Config(format!(
            "key file {shown}: {error}; create one with `pmnet keygen --out {shown}`"
        ))
    })?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(RuntimeError::Config(format!(
                "key file {shown} has mode {mode:03o}: group or others may read it, so its keys \
                 are not secret; run `chmod 600 {shown}`"
            )));
        }
    }
    let text = std::fs::read_to_string(path)
        .map_err(|error| RuntimeError::Config(format!("key file {shown}: {error}")))?;
    KeySet::parse(&text)
        .map_err(|error| RuntimeError::Config(format!("{shown}:{}: {}", error.line, error.message)))
}

/// The `traffic` label of a process's info metric: `unauthenticated`, `authenticated` or
/// `authenticated_encrypted`.
pub fn traffic_label(keys: Option<&KeySet>) -> &'static str {
    match keys {
        None => "unauthenticated",
        Some(keys) if keys.encrypts_payloads() => "authenticated_encrypted",
        Some(_) => "authenticated",
    }
}

/// What a start-up banner says of the traffic's authentication.
pub fn auth_text(keys: Option<&KeySet>) -> String {
    match keys {
        Some(keys) => format!(
            "authenticated (AES-256-GCM, 16-byte tag; payloads {}; key ids {}; sealing with {})",
            if keys.encrypts_payloads() {
                "encrypted"
            } else {
                "in clear (add `encrypt payloads` to the key file to encrypt them)"
            },
            keys.key_ids()
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            keys.sending_key_id()
        ),
        None => "NOT authenticated (no --key-file): anyone on the path can forge writes and \
                 acks"
            .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_key_file_is_read_only_when_private_and_errors_name_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, format!("key 1 {}\n", "ab".repeat(32))).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = load_key_file(&path).unwrap_err().to_string();
        assert!(
            error.contains("chmod 600") && error.contains("644"),
            "{error}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(load_key_file(&path).unwrap().key_ids(), vec![1]);
        std::fs::write(&path, "# keys\nkey one 00\n").unwrap();
        let error = load_key_file(&path).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!("{}:2:", path.display())),
            "{error}"
        );
        let missing = dir.path().join("none");
        assert!(load_key_file(&missing)
            .unwrap_err()
            .to_string()
            .contains("pmnet keygen"));
    }
}
