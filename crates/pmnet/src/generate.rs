//! `pmnet completions SHELL` and `pmnet man`: shell completions and manual pages, generated
//! from the command line's own definitions (so they name exactly the commands and options the
//! binary takes). The Debian package (scripts/build-deb.sh) installs what these print.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use clap_complete::Shell;

use crate::CliError;

#[derive(Debug, Clone, Args)]
#[command(after_help = "Examples:
  pmnet completions bash > /usr/share/bash-completion/completions/pmnet
  pmnet completions zsh > /usr/share/zsh/vendor-completions/_pmnet
  pmnet completions fish > ~/.config/fish/completions/pmnet.fish
  source <(pmnet completions bash)     # this shell only")]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_name = "SHELL")]
    pub shell: Shell,
}

#[derive(Debug, Clone, Args)]
#[command(after_help = "Examples:
  pmnet man | man -l -                 # read pmnet(1)
  pmnet man device | man -l -          # read pmnet-device(1)
  pmnet man --out /usr/local/share/man/man1")]
pub struct ManArgs {
    /// The command whose page to print (`device`, `log inspect`, …); default: pmnet(1), the
    /// page of the whole program. Ignored with --out.
    #[arg(value_name = "COMMAND")]
    pub command: Vec<String>,

    /// Write every page into this directory instead, one per command and subcommand
    /// (pmnet.1, pmnet-device.1, pmnet-log-inspect.1, …), and list them.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// The command line `cli` (`pmnet`'s) as the pages and completions describe it.
fn built(cli: clap::Command) -> clap::Command {
    let mut command = cli.disable_help_subcommand(true);
    command.build();
    command
}

/// `pmnet completions`; `cli` is `pmnet`'s command line.
pub fn run_completions(args: CompletionsArgs, cli: clap::Command) -> Result<ExitCode, CliError> {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut built(cli), "pmnet", &mut out);
    print(&out, "the completions")
}

/// `pmnet man`; `cli` is `pmnet`'s command line.
pub fn run_man(args: ManArgs, cli: clap::Command) -> Result<ExitCode, CliError> {
    let cli = built(cli);
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)
            .map_err(|error| format!("cannot make the directory {}: {error}", dir.display()))?;
        for path in write_pages(&cli, dir)? {
            println!("{}", path.display());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut page = cli;
    for (depth, name) in args.command.iter().enumerate() {
        let found = page
            .get_subcommands()
            .find(|sub| !sub.is_hide_set() && sub.get_name() == name)
            .cloned()
            .ok_or_else(|| {
                let known: Vec<&str> = page
                    .get_subcommands()
                    .filter(|sub| !sub.is_hide_set())
                    .map(clap::Command::get_name)
                    .collect();
                format!(
                    "no command `{}`; the commands{} are: {}",
                    args.command[..=depth].join(" "),
                    if depth == 0 {
                        String::new()
                    } else {
                        format!(" of `{}`", args.command[..depth].join(" "))
                    },
                    known.join(", ")
                )
            })?;
        page = found;
    }
    let mut out = Vec::new();
    man(page)
        .render(&mut out)
        .map_err(|error| format!("cannot render the page: {error}"))?;
    print(&out, "the page")
}

/// Write `out` to stdout; a reader that stops early (`| head`) is no error.
fn print(out: &[u8], what: &str) -> Result<ExitCode, CliError> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(out).and_then(|()| stdout.flush()) {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("cannot write {what}: {error}").into())
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}

fn man(command: clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(command)
        .source(format!("pmnet {}", env!("CARGO_PKG_VERSION")))
        .manual("pmnet manual")
}

/// Write the page of every command of `cli` that is not hidden (the benchmarks' are
/// pmnet-bench's) into `dir`; the paths written, pmnet.1 first.
fn write_pages(cli: &clap::Command, dir: &Path) -> Result<Vec<PathBuf>, CliError> {
    fn walk(
        command: &clap::Command,
        dir: &Path,
        written: &mut Vec<PathBuf>,
    ) -> Result<(), CliError> {
        let path = man(command.clone()).generate_to(dir).map_err(|error| {
            format!(
                "cannot write the page of {} into {}: {error}",
                command.get_display_name().unwrap_or(command.get_name()),
                dir.display()
            )
        })?;
        written.push(path);
        for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
            walk(sub, dir, written)?;
        }
        Ok(())
    }
    let mut written = Vec::new();
    walk(cli, dir, &mut written)?;
    Ok(written)
}
