//! `pmnet completions SHELL` and `pmnet man`: generated from the command line's definitions,
//! they name its real commands and options.

use std::process::Command;

fn pmnet(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_pmnet"))
        .args(args)
        .output()
        .expect("pmnet runs");
    assert!(
        output.status.success(),
        "pmnet {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

#[test]
fn completions_name_the_commands_and_their_options() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = pmnet(&["completions", shell]);
        for word in [
            "device",
            "server",
            "redis-adaptor",
            "memnode",
            "--log-file",
            "--key-file",
            "--config",
        ] {
            // fish names a long option without its dashes: `-l log-file`.
            let word = if shell == "fish" {
                word.trim_start_matches('-')
            } else {
                word
            };
            assert!(script.contains(word), "{shell}: no {word}");
        }
    }
    assert!(pmnet(&["completions", "bash"]).contains("complete -F _pmnet"));
    assert!(pmnet(&["completions", "zsh"]).starts_with("#compdef pmnet"));
    assert!(pmnet(&["completions", "fish"]).contains("complete -c pmnet"));
}

#[test]
fn the_bash_completion_is_valid_bash() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pmnet.bash");
    std::fs::write(&path, pmnet(&["completions", "bash"])).unwrap();
    match Command::new("bash").arg("-n").arg(&path).output() {
        Ok(output) => assert!(
            output.status.success(),
            "bash -n: {}",
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(error) => eprintln!("no bash to check the completion with: {error}"),
    }
}

#[test]
fn a_page_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let listed = pmnet(&["man", "--out", out]);
    let names: Vec<&str> = listed
        .lines()
        .map(|line| line.rsplit('/').next().unwrap())
        .collect();
    assert_eq!(names[0], "pmnet.1", "{listed}");
    for name in [
        "pmnet-device.1",
        "pmnet-server.1",
        "pmnet-gateway.1",
        "pmnet-redis-adaptor.1",
        "pmnet-log-inspect.1",
        "pmnet-completions.1",
        "pmnet-man.1",
    ] {
        assert!(names.contains(&name), "no {name} in {names:?}");
    }
    // The benchmarks are pmnet-bench's.
    assert!(
        !names.iter().any(|name| name.contains("bench")),
        "{names:?}"
    );
    let files = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(files, names.len());

    let device = std::fs::read_to_string(dir.path().join("pmnet-device.1")).unwrap();
    assert!(device.contains(".TH pmnet-device 1"), "{device:.400}");
    for option in [
        "\\-\\-log\\-file",
        "\\-\\-server",
        "\\-\\-config",
        "\\-\\-key\\-file",
    ] {
        assert!(device.contains(option), "pmnet-device.1: no {option}");
    }
    let top = std::fs::read_to_string(dir.path().join("pmnet.1")).unwrap();
    assert!(top.contains("pmnet\\-device(1)"), "{top}");
    // One page on stdout, the same as the file.
    assert_eq!(pmnet(&["man", "device"]), device);
    assert_eq!(pmnet(&["man"]), top);
}

#[test]
fn an_unknown_command_has_no_page() {
    let output = Command::new(env!("CARGO_BIN_EXE_pmnet"))
        .args(["man", "log", "nope"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no command `log nope`; the commands of `log` are: inspect"),
        "{stderr}"
    );
}
