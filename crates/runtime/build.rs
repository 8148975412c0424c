//! Records how the binary is built, for `pmnet_build_info`: the git commit (when built from a
//! git checkout; "unknown" from a tarball), cargo's profile and the compiler's version.

use std::process::Command;

fn main() {
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    // Rebuild when HEAD moves (a commit, a checkout); without git nothing is watched but this.
    println!("cargo:rerun-if-changed=build.rs");
    // (Only files that exist: a missing one would rerun this script on every build.)
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for path in watched {
        if let Some(file) = git(&["rev-parse", "--git-path", &path]) {
            if std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(&file)
                .exists()
            {
                println!("cargo:rerun-if-changed={file}");
            }
        }
    }
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".to_owned());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let rustc_version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|output| output.status.success())
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .map(|text| text.trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=PMNET_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=PMNET_PROFILE={profile}");
    println!("cargo:rustc-env=PMNET_RUSTC_VERSION={rustc_version}");
}

/// The trimmed output of `git ARGS` run in this crate's directory, if it succeeds.
fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    (output.status.success() && !text.is_empty()).then_some(text)
}
