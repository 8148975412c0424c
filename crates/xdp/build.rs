//! Compiles `bpf/steer.c` into `$OUT_DIR/steer.o` with clang (`-target bpf`).
//!
//! Without a working clang the crate still builds: a cargo warning says why, and the cfg
//! `pmnet_xdp_no_program` makes `Steering::attach` return `XdpError::NotBuilt` with the reason
//! (`PMNET_XDP_NOT_BUILT` at compile time) so the runtime can print a clear fallback message.
//! `CLANG` names another compiler binary.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(pmnet_xdp_no_program)");
    println!("cargo::rerun-if-changed=bpf/steer.c");
    println!("cargo::rerun-if-env-changed=CLANG");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let object = out.join("steer.o");
    match compile(Path::new("bpf/steer.c"), &object) {
        Ok(()) => println!("cargo::rustc-env=PMNET_XDP_NOT_BUILT="),
        Err(reason) => {
            // Installing clang later must rebuild the crate: watch the directories it would
            // appear in (scanned only while the program is missing).
            println!("cargo::rerun-if-env-changed=PATH");
            if let Some(path) = env::var_os("PATH") {
                for dir in env::split_paths(&path).filter(|dir| dir.is_dir()) {
                    println!("cargo::rerun-if-changed={}", dir.display());
                }
            }
            println!("cargo::warning=pmnet-xdp: the XDP program was not built ({reason}); AF_XDP steering is unavailable until clang is installed (apt-get install -y clang) and the crate rebuilt");
            println!("cargo::rustc-cfg=pmnet_xdp_no_program");
            println!("cargo::rustc-env=PMNET_XDP_NOT_BUILT={reason}");
        }
    }
}

fn compile(source: &Path, object: &Path) -> Result<(), String> {
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_string());
    let target = match env::var("CARGO_CFG_TARGET_ENDIAN").as_deref() {
        Ok("big") => "bpfeb",
        _ => "bpfel",
    };
    let mut command = Command::new(&clang);
    command.args(["-O2", "-g", "-Wall", "-Werror", "-target", target]);
    // With -target bpf clang does not search the multiarch directory that holds <asm/types.h>.
    for dir in multiarch_include_dirs() {
        command.arg("-I").arg(dir);
    }
    command.arg("-c").arg(source).arg("-o").arg(object);
    let output = command
        .output()
        .map_err(|e| format!("cannot run `{clang}`: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let first = stderr.lines().take(4).collect::<Vec<_>>().join(" / ");
        return Err(format!("`{clang}` failed on {}: {first}", source.display()));
    }
    Ok(())
}

fn multiarch_include_dirs() -> Vec<PathBuf> {
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let triple = match arch.as_str() {
        "x86_64" => "x86_64-linux-gnu",
        "aarch64" => "aarch64-linux-gnu",
        "riscv64" => "riscv64-linux-gnu",
        "powerpc64" => "powerpc64le-linux-gnu",
        "s390x" => "s390x-linux-gnu",
        "arm" => "arm-linux-gnueabihf",
        _ => "",
    };
    let mut dirs = Vec::new();
    if !triple.is_empty() {
        let dir = PathBuf::from("/usr/include").join(triple);
        if dir.join("asm").is_dir() {
            dirs.push(dir);
        }
    }
    dirs
}
