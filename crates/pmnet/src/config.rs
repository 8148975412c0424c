//! The `--config FILE` option: a TOML file with a table per command whose keys are the long
//! option names. The file's options go in front of the command line's, and the command line
//! wins: a single-valued option given in both takes the command line's value; a list option
//! (`--server`, `--device`) gets the file's entries and then the command line's.
//!
//! ```toml
//! [device]
//! listen = "0.0.0.0:7400"
//! server = ["1=10.0.0.3:7500"]
//! log-file = "/dev/shm/pmnet-device.log"
//! busy-poll = true
//! ```

use std::ffi::OsString;
use std::path::Path;

use clap::{CommandFactory, FromArgMatches};

use crate::Cli;

/// Parse the command line; if it names a configuration file, parse again with the file's
/// options inserted after the command name.
pub fn parse_with_config_file() -> Result<Cli, clap::Error> {
    let argv: Vec<OsString> = std::env::args_os().collect();
    // The file is read before the command line is parsed: it may hold options the command
    // requires (`server = [...]` for a device), without which parsing alone would fail.
    let (Some(path), Some((position, table))) = (config_path(&argv), command_name(&argv)) else {
        return parse(&argv);
    };
    let from_file = match options_from_file(&path, &table) {
        Ok(options) => options,
        Err(message) => {
            return Err(Cli::command().error(clap::error::ErrorKind::InvalidValue, message));
        }
    };
    let mut merged = argv[..=position].to_vec();
    merged.extend(from_file.into_iter().map(OsString::from));
    merged.extend_from_slice(&argv[position + 1..]);
    let cli = parse(&merged).map_err(|error| {
        // Say where a bad option came from: the message alone would point at the command line.
        let message = format!(
            "{}\n(options were read from [{table}] in {} as well as from the command line)",
            error.render().to_string().trim_end(),
            path.display()
        );
        Cli::command().error(error.kind(), message)
    })?;
    debug_assert_eq!(cli.command.config_table(), table);
    Ok(cli)
}

fn parse(argv: &[OsString]) -> Result<Cli, clap::Error> {
    let command = Cli::command().mut_subcommands(|sub| sub.args_override_self(true));
    let matches = command.try_get_matches_from(argv)?;
    Cli::from_arg_matches(&matches)
}

/// The value of `--config FILE` or `--config=FILE`, wherever it is on the command line.
fn config_path(argv: &[OsString]) -> Option<std::path::PathBuf> {
    let mut tokens = argv.iter().skip(1);
    let mut found = None;
    while let Some(token) = tokens.next() {
        let text = token.to_string_lossy();
        if text == "--" {
            break;
        }
        if text == "--config" {
            found = tokens.next().map(std::path::PathBuf::from);
        } else if let Some(value) = text.strip_prefix("--config=") {
            found = Some(std::path::PathBuf::from(value));
        }
    }
    found
}

/// Index in `argv` and name of the command (the first token that is not a global option), if
/// it names one. Its configuration table has the same name.
fn command_name(argv: &[OsString]) -> Option<(usize, String)> {
    let mut index = 1;
    while index < argv.len() {
        let token = argv[index].to_string_lossy();
        if token == "--config" {
            index += 2;
            continue;
        }
        if !token.starts_with('-') {
            return Cli::command()
                .get_subcommands()
                .any(|command| command.get_name() == token)
                .then(|| (index, token.into_owned()));
        }
        index += 1;
    }
    None
}

/// The options of table `[table]` of the TOML file at `path`, as command-line tokens.
pub fn options_from_file(path: &Path, table: &str) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        format!(
            "cannot read the configuration file {}: {error}; fix the path given to --config",
            path.display()
        )
    })?;
    options_from_text(&text, table)
        .map_err(|message| format!("configuration file {}: {message}", path.display()))
}

fn options_from_text(text: &str, table: &str) -> Result<Vec<String>, String> {
    let document: toml::Table = text
        .parse()
        .map_err(|error: toml::de::Error| format!("not valid TOML: {}", error.message()))?;
    let Some(section) = document.get(table) else {
        return Ok(Vec::new());
    };
    let Some(section) = section.as_table() else {
        return Err(format!(
            "`{table}` must be a table ([{table}] followed by `option = value` lines)"
        ));
    };
    let mut tokens = Vec::new();
    for (key, value) in section {
        let flag = format!("--{key}");
        match value {
            toml::Value::Boolean(true) => tokens.push(flag),
            toml::Value::Boolean(false) => {}
            toml::Value::Array(items) => {
                for item in items {
                    tokens.push(flag.clone());
                    tokens.push(scalar(key, item)?);
                }
            }
            other => {
                tokens.push(flag);
                tokens.push(scalar(key, other)?);
            }
        }
    }
    Ok(tokens)
}

fn scalar(key: &str, value: &toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(text) => Ok(text.clone()),
        toml::Value::Integer(number) => Ok(number.to_string()),
        toml::Value::Float(number) => Ok(number.to_string()),
        toml::Value::Boolean(flag) => Ok(flag.to_string()),
        _ => Err(format!(
            "option `{key}`: use a string, a number, a boolean or a list of those"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_becomes_options() {
        let text = r#"
            [device]
            listen = "0.0.0.0:7400"
            server = ["1=10.0.0.3:7500", "2=10.0.0.4:7500"]
            busy-poll = true
            format = false
            slots = 1024
            [server]
            listen = "ignored"
        "#;
        let tokens = options_from_text(text, "device").unwrap();
        assert_eq!(
            tokens,
            [
                "--busy-poll",
                "--listen",
                "0.0.0.0:7400",
                "--server",
                "1=10.0.0.3:7500",
                "--server",
                "2=10.0.0.4:7500",
                "--slots",
                "1024"
            ]
        );
        assert!(options_from_text(text, "client").unwrap().is_empty());
    }

    #[test]
    fn the_file_and_command_are_found_before_parsing() {
        let argv =
            |tokens: &[&str]| -> Vec<OsString> { tokens.iter().map(OsString::from).collect() };
        let line = argv(&[
            "pmnet", "--config", "a.toml", "-v", "device", "--slots", "1",
        ]);
        assert_eq!(config_path(&line), Some("a.toml".into()));
        assert_eq!(command_name(&line), Some((4, "device".to_owned())));
        let line = argv(&["pmnet", "server", "--config=b.toml"]);
        assert_eq!(config_path(&line), Some("b.toml".into()));
        assert_eq!(command_name(&line), Some((1, "server".to_owned())));
        assert_eq!(config_path(&argv(&["pmnet", "device"])), None);
        assert_eq!(
            command_name(&argv(&["pmnet", "--config", "c", "nope"])),
            None
        );
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        assert!(options_from_text("device = 3", "device")
            .unwrap_err()
            .contains("must be a table"));
        assert!(options_from_text("[device\n", "device")
            .unwrap_err()
            .contains("not valid TOML"));
        assert!(options_from_text("[device]\nx = {a = 1}", "device")
            .unwrap_err()
            .contains("option `x`"));
    }

    #[test]
    fn the_command_line_wins_over_the_file() {
        let argv: Vec<OsString> = [
            "pmnet",
            "device",
            "--listen",
            "127.0.0.1:1",
            "--server",
            "1=127.0.0.1:2",
            "--listen",
            "127.0.0.1:3",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let cli = parse(&argv).unwrap();
        let crate::Command::Device(args) = cli.command else {
            panic!("parsed as another command");
        };
        assert_eq!(args.listen.to_string(), "127.0.0.1:3");
        assert_eq!(command_name(&argv), Some((1, "device".to_owned())));
    }
}
