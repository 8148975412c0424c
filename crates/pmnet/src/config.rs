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

use clap::Parser;

/// Parse the command line `argv` as a `T`; if it names a configuration file, parse again with
/// the file's options inserted after the command name. `tables` is the command whose
/// subcommands name the file's tables: `T`'s own, and those of the other binary (`pmnet`'s
/// and `pmnet-bench`'s commands share one file). A hidden subcommand's table is another
/// binary's to check.
pub fn parse_with_config_file<T: Parser>(
    argv: &[OsString],
    tables: &clap::Command,
) -> Result<T, clap::Error> {
    // The file is read before the command line is parsed: it may hold options the command
    // requires (`server = [...]` for a device), without which parsing alone would fail.
    let (Some(path), Some((position, table))) = (config_path(argv), command_name::<T>(argv)) else {
        return parse(argv);
    };
    let from_file = match options_from_file(&path, &table, tables) {
        Ok(options) => options,
        Err(message) => {
            return Err(T::command().error(clap::error::ErrorKind::InvalidValue, message));
        }
    };
    let mut merged = argv[..=position].to_vec();
    merged.extend(from_file.into_iter().map(OsString::from));
    merged.extend_from_slice(&argv[position + 1..]);
    parse(&merged).map_err(|error| {
        // Say where a bad option came from: the message alone would point at the command line.
        let message = format!(
            "{}\n(options were read from [{table}] in {} as well as from the command line)",
            error.render().to_string().trim_end(),
            path.display()
        );
        T::command().error(error.kind(), message)
    })
}

fn parse<T: Parser>(argv: &[OsString]) -> Result<T, clap::Error> {
    let command = T::command().mut_subcommands(|sub| sub.args_override_self(true));
    let matches = command.try_get_matches_from(argv)?;
    T::from_arg_matches(&matches)
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
fn command_name<T: Parser>(argv: &[OsString]) -> Option<(usize, String)> {
    let mut index = 1;
    while index < argv.len() {
        let token = argv[index].to_string_lossy();
        if token == "--config" {
            index += 2;
            continue;
        }
        if !token.starts_with('-') {
            return T::command()
                .get_subcommands()
                .any(|command| command.get_name() == token)
                .then(|| (index, token.into_owned()));
        }
        index += 1;
    }
    None
}

/// The options of table `[table]` of the TOML file at `path`, as command-line tokens.
/// `tables` names the tables, as in [`parse_with_config_file`].
pub fn options_from_file(
    path: &Path,
    table: &str,
    tables: &clap::Command,
) -> Result<Vec<String>, String> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        format!(
            "cannot read the configuration file {}: {error}; fix the path given to --config",
            path.display()
        )
    })?;
    options_from_text(&text, table, tables)
        .map_err(|message| format!("configuration file {}, {message}", path.display()))
}

/// The tokens of table `[table]` of `text` for the subcommand of `cli` with that name. Every
/// table must name a command and every key one of its long options, in any table: a misspelt
/// name is an error, not an option silently left out. The keys of `[table]` are checked
/// against their option's type and values as the command line would check them. Errors start
/// with the line they are about.
fn options_from_text(text: &str, table: &str, cli: &clap::Command) -> Result<Vec<String>, String> {
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let spanned = toml::de::DeTable::parse(text).map_err(|error| match error.span() {
        Some(span) => format!(
            "line {}: not valid TOML: {}",
            line_of(span.start),
            error.message()
        ),
        None => format!("not valid TOML: {}", error.message()),
    })?;
    let document: toml::Table = text
        .parse()
        .map_err(|error: toml::de::Error| format!("not valid TOML: {}", error.message()))?;

    let tables: Vec<&str> = cli.get_subcommands().map(clap::Command::get_name).collect();
    let mut tokens = Vec::new();
    for (name, section) in spanned.get_ref() {
        let line = line_of(name.span().start);
        let name = name.get_ref().as_ref();
        let Some(command) = cli.find_subcommand(name) else {
            return Err(format!(
                "line {line}: unknown table [{name}]{}; the tables are named after the commands: \
                 {}",
                suggestion(name, tables.iter().copied(), |t| format!("[{t}]")),
                tables
                    .iter()
                    .map(|t| format!("[{t}]"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        if command.is_hide_set() {
            // Another binary's command (a benchmark's, in `pmnet`): that binary checks it.
            continue;
        }
        let toml::de::DeValue::Table(keys) = section.get_ref() else {
            return Err(format!(
                "line {line}: `{name}` must be a table ([{name}] followed by `option = value` \
                 lines)"
            ));
        };
        let values = document
            .get(name)
            .and_then(toml::Value::as_table)
            .expect("both parses of the text agree");
        for key in keys.keys() {
            let line = line_of(key.span().start);
            let key = key.get_ref().as_ref();
            let arg = find_option(cli, command, key).ok_or_else(|| {
                let options = command
                    .get_arguments()
                    .chain(cli.get_arguments().filter(|arg| arg.is_global_set()))
                    .filter_map(clap::Arg::get_long)
                    .filter(|long| *long != "config");
                format!(
                    "line {line}: unknown option `{key}` in [{name}]{}; `pmnet {name} --help` \
                     lists the options (a key is a long option name without its dashes)",
                    suggestion(key, options, |o| format!("`{o}`"))
                )
            })?;
            if name == table {
                let value = &values[key];
                tokens.extend(
                    option_tokens(command, arg, key, value)
                        .map_err(|message| format!("line {line}: `{key} = {value}`: {message}"))?,
                );
            }
        }
    }
    Ok(tokens)
}

/// The option `key` names for `command`: one of its own, or a global one of `cli` (but not
/// `--config` itself).
fn find_option<'c>(
    cli: &'c clap::Command,
    command: &'c clap::Command,
    key: &str,
) -> Option<&'c clap::Arg> {
    let named = |arg: &&clap::Arg| arg.get_long() == Some(key);
    command.get_arguments().find(named).or_else(|| {
        cli.get_arguments()
            .filter(|arg| arg.is_global_set() && arg.get_long() != Some("config"))
            .find(named)
    })
}

/// " (did you mean X?)" for the candidate closest to `wrong`, if one is close.
fn suggestion<'a>(
    wrong: &str,
    candidates: impl Iterator<Item = &'a str>,
    show: impl Fn(&str) -> String,
) -> String {
    candidates
        .map(|candidate| (edit_distance(wrong, candidate), candidate))
        .filter(|(distance, candidate)| *distance <= 2.max(candidate.len() / 3))
        .min()
        .map_or_else(String::new, |(_, candidate)| {
            format!(" (did you mean {}?)", show(candidate))
        })
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, a_char) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, b_char) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(a_char != *b_char);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

/// The command-line tokens for `key = value`, checked as the command line would check them.
fn option_tokens(
    command: &clap::Command,
    arg: &clap::Arg,
    key: &str,
    value: &toml::Value,
) -> Result<Vec<String>, String> {
    let flag = format!("--{key}");
    let takes_values = arg.get_action().takes_values();
    let counts = matches!(arg.get_action(), clap::ArgAction::Count);
    match value {
        toml::Value::Boolean(on) if !takes_values => Ok(if *on { vec![flag] } else { vec![] }),
        toml::Value::Integer(times) if counts => match usize::try_from(*times) {
            Ok(times) if times <= 3 => Ok(vec![flag; times]),
            _ => Err("expected true, false or a count from 0 to 3".to_owned()),
        },
        _ if !takes_values => Err("this option is a switch: expected true or false".to_owned()),
        toml::Value::Boolean(_) => Err(format!(
            "expected a value ({}), not true or false",
            value_name(arg)
        )),
        toml::Value::Array(items) => {
            if !matches!(arg.get_action(), clap::ArgAction::Append) {
                return Err(format!(
                    "expected one value ({}), not a list",
                    value_name(arg)
                ));
            }
            let mut tokens = Vec::new();
            for item in items {
                tokens.push(checked_token(command, arg, key, item)?);
            }
            Ok(tokens)
        }
        other => Ok(vec![checked_token(command, arg, key, other)?]),
    }
}

/// `--key=VALUE`, once the option's own parser accepts VALUE. Written with `=` so that a
/// value starting with `-` stays a value.
fn checked_token(
    command: &clap::Command,
    arg: &clap::Arg,
    key: &str,
    value: &toml::Value,
) -> Result<String, String> {
    let text = match value {
        toml::Value::String(text) => text.clone(),
        toml::Value::Integer(number) => number.to_string(),
        toml::Value::Float(number) => number.to_string(),
        _ => {
            return Err(format!(
                "expected {} as a string, a number or a list of those",
                value_name(arg)
            ))
        }
    };
    let token = format!("--{key}={text}");
    // The command alone with this one option (nothing required): only the value's own
    // checks can fail.
    let probe = command
        .clone()
        .mut_args(|arg| arg.required(false))
        .subcommand_required(false)
        .no_binary_name(true);
    if let Err(error) = probe.try_get_matches_from([token.as_str()]) {
        use clap::error::ErrorKind;
        if matches!(
            error.kind(),
            ErrorKind::InvalidValue | ErrorKind::ValueValidation | ErrorKind::InvalidUtf8
        ) {
            let rendered = error.render().to_string();
            let first = rendered.lines().next().unwrap_or_default();
            return Err(format!(
                "expected {}: {}",
                value_name(arg),
                first.trim_start_matches("error: ")
            ));
        }
    }
    Ok(token)
}

/// How the option's help names its value (`N`, `ADDR`, ...).
fn value_name(arg: &clap::Arg) -> String {
    let name = arg
        .get_value_names()
        .and_then(|names| names.first())
        .map_or_else(|| "VALUE".to_owned(), ToString::to_string);
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .map(|value| value.get_name().to_owned())
        .collect();
    if possible.is_empty() {
        name
    } else {
        format!("{name}: one of {}", possible.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use crate::cli::{Cli, Command};

    fn options(text: &str, table: &str) -> Result<Vec<String>, String> {
        options_from_text(text, table, &Cli::command())
    }

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
            listen = "ignored: only the keys of other tables are checked"
        "#;
        let tokens = options(text, "device").unwrap();
        assert_eq!(
            tokens,
            [
                "--busy-poll",
                "--listen=0.0.0.0:7400",
                "--server=1=10.0.0.3:7500",
                "--server=2=10.0.0.4:7500",
                "--slots=1024"
            ]
        );
        assert!(options(text, "client").unwrap().is_empty());
        // Global options too.
        assert_eq!(
            options("[server]\nverbose = 2\nquiet = false", "server").unwrap(),
            ["--verbose", "--verbose"]
        );
    }

    #[test]
    fn a_misspelt_table_or_key_is_an_error_naming_its_line() {
        let error = options("[device]\nslots = 8\n\n[devise]\nslots = 8\n", "device").unwrap_err();
        assert!(
            error.starts_with("line 4: unknown table [devise]"),
            "{error}"
        );
        assert!(error.contains("did you mean [device]?"), "{error}");
        assert!(error.contains("[server]"), "{error}");
        // Whichever command reads the file.
        assert_eq!(
            options("[devise]\nslots = 8\n", "server").unwrap_err(),
            options("[devise]\nslots = 8\n", "device").unwrap_err()
        );

        let error = options("[device]\nslots = 8\nslot-sise = 512\n", "device").unwrap_err();
        assert!(
            error.starts_with("line 3: unknown option `slot-sise` in [device]"),
            "{error}"
        );
        assert!(error.contains("did you mean `slot-size`?"), "{error}");
        // In another command's table as well.
        let error = options("[server]\ndata-mb = 8\n", "device").unwrap_err();
        assert!(
            error.starts_with("line 2: unknown option `data-mb` in [server]"),
            "{error}"
        );
        assert!(error.contains("`data-mib`"), "{error}");
        for key in ["config", "help", "no-such-option"] {
            let error = options(&format!("[device]\n{key} = \"x\""), "device").unwrap_err();
            assert!(
                error.contains(&format!("unknown option `{key}`")),
                "{error}"
            );
        }
        // A top-level key is a table that does not exist.
        let error = options("slots = 8\n", "device").unwrap_err();
        assert!(
            error.starts_with("line 1: unknown table [slots]"),
            "{error}"
        );
    }

    #[test]
    fn a_value_of_the_wrong_kind_says_what_is_expected() {
        let error = options("[device]\n\nslots = -5\n", "device").unwrap_err();
        assert!(
            error.starts_with("line 3: `slots = -5`: expected N"),
            "{error}"
        );
        assert!(error.contains("0..=4294967295"), "{error}");

        let error = options("[device]\nslots = \"many\"\n", "device").unwrap_err();
        assert!(
            error.starts_with("line 2: `slots = \"many\"`: expected N"),
            "{error}"
        );

        let error = options("[device]\nlisten = 7400\n", "device").unwrap_err();
        assert!(
            error.starts_with("line 2: `listen = 7400`: expected ADDR"),
            "{error}"
        );

        let error = options("[device]\nserver = [\"1=x\"]\n", "device").unwrap_err();
        assert!(error.contains("IP:PORT"), "{error}");

        let error = options("[device]\nbusy-poll = \"yes\"\n", "device").unwrap_err();
        assert!(
            error.contains("a switch: expected true or false"),
            "{error}"
        );

        let error = options("[device]\nslots = true\n", "device").unwrap_err();
        assert!(
            error.contains("expected a value (N), not true or false"),
            "{error}"
        );

        let error = options("[device]\nlisten = [\"127.0.0.1:1\"]\n", "device").unwrap_err();
        assert!(
            error.contains("expected one value (ADDR), not a list"),
            "{error}"
        );

        let error = options("[server]\nengine = \"fast\"\n", "server").unwrap_err();
        assert!(error.contains("one of packet, conventional, kv"), "{error}");

        // A value that starts with a dash stays a value.
        assert_eq!(
            options("[device]\nlog-file = \"-odd.log\"", "device").unwrap(),
            ["--log-file=-odd.log"]
        );
    }

    #[test]
    fn the_file_and_command_are_found_before_parsing() {
        let argv =
            |tokens: &[&str]| -> Vec<OsString> { tokens.iter().map(OsString::from).collect() };
        let line = argv(&[
            "pmnet", "--config", "a.toml", "-v", "device", "--slots", "1",
        ]);
        assert_eq!(config_path(&line), Some("a.toml".into()));
        assert_eq!(command_name::<Cli>(&line), Some((4, "device".to_owned())));
        let line = argv(&["pmnet", "server", "--config=b.toml"]);
        assert_eq!(config_path(&line), Some("b.toml".into()));
        assert_eq!(command_name::<Cli>(&line), Some((1, "server".to_owned())));
        assert_eq!(config_path(&argv(&["pmnet", "device"])), None);
        assert_eq!(
            command_name::<Cli>(&argv(&["pmnet", "--config", "c", "nope"])),
            None
        );
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        assert!(options("device = 3", "device")
            .unwrap_err()
            .contains("line 1: `device` must be a table"));
        assert!(options("[device]\nslots = 1\n[device\n", "device")
            .unwrap_err()
            .starts_with("line 3: not valid TOML"));
        assert!(options("[device]\nlisten = {a = 1}", "device")
            .unwrap_err()
            .contains("line 2: `listen = { a = 1 }`: expected ADDR as a string"));
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
        let cli: Cli = parse(&argv).unwrap();
        let Command::Device(args) = cli.command else {
            panic!("parsed as another command");
        };
        assert_eq!(args.listen.to_string(), "127.0.0.1:3");
        assert_eq!(command_name::<Cli>(&argv), Some((1, "device".to_owned())));
    }
}
