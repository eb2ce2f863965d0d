//! `escha-convert completions SHELL` and `escha-convert man [DIR]`: shell completion scripts and
//! man pages, generated from the same clap definitions as `--help`.

use super::exit::{fail, print_out, FAILURE};
use super::Cli;
use crate::failure::ErrorCode;
use anyhow::Context;
use clap::{Args, CommandFactory};
use clap_complete::Shell;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_name = "SHELL", value_enum, ignore_case = true)]
    pub shell: Shell,
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write every page into DIR (created when missing) instead of printing the main page.
    #[arg(value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// The program's name in scripts and pages.
const BIN: &str = "escha-convert";

/// The completion script for `shell`.
pub fn completion_script(shell: Shell) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), BIN, &mut script);
    script
}

/// Every man page, file name and text: `escha-convert.1` first, then one per subcommand.
pub fn man_pages() -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut commands = vec![cmd.clone()];
    commands.extend(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
    commands
        .into_iter()
        .map(|c| {
            let page = clap_mangen::Man::new(c).manual("escha-convert manual");
            let mut text = Vec::new();
            page.render(&mut text).context("cannot render the man page")?;
            Ok((page.get_filename(), text))
        })
        .collect()
}

pub fn run_completions(a: &CompletionsArgs) -> ExitCode {
    print_out(&String::from_utf8_lossy(&completion_script(a.shell)))
}

pub fn run_man(a: &ManArgs) -> ExitCode {
    let pages = match man_pages() {
        Ok(p) => p,
        Err(e) => return fail(&e, ErrorCode::Failed, FAILURE),
    };
    match &a.dir {
        None => print_out(&String::from_utf8_lossy(&pages[0].1)),
        Some(dir) => match write_pages(dir, &pages) {
            Ok(written) => print_out(&written),
            Err(e) => fail(&e, ErrorCode::WriteFailed, FAILURE),
        },
    }
}

/// Writes `pages` into `dir`, each replaced whole; returns the paths written, one a line.
fn write_pages(dir: &Path, pages: &[(String, Vec<u8>)]) -> anyhow::Result<String> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let mut written = String::new();
    for (name, text) in pages {
        let path = dir.join(name);
        crate::output::file::write_whole(&path, text)?;
        let _ = writeln!(written, "{}", path.display());
    }
    Ok(written)
}
