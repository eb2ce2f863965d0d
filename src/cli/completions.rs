//! `escha-convert completions SHELL` and `escha-convert man [DIR]`: shell completion scripts and
//! man pages, generated from the same clap definitions as `--help`.

use super::exit::{fail, print_out, FAILURE};
use super::Cli;
use crate::failure::ErrorCode;
use anyhow::Context;
use clap::ValueHint;
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
    clap_complete::generate(shell, &mut completed_command(), BIN, &mut script);
    match shell {
        Shell::Bash => bash_short_form(&bash_states_agree(&String::from_utf8_lossy(&script))).into_bytes(),
        Shell::Fish => {
            script.extend(fish_positional_values().into_bytes());
            script
        }
        _ => script,
    }
}

/// The command as the scripts see it: a flag whose value is free text (a size, a number, a glob,
/// `I/N`) and not a path is marked so, and every shell then offers nothing for it rather than the
/// files of the working directory.
fn completed_command() -> clap::Command {
    fn free_text(arg: clap::Arg) -> clap::Arg {
        let free = arg.get_action().takes_values()
            && arg.get_long().is_some()
            && arg.get_possible_values().is_empty()
            && arg.get_value_hint() == ValueHint::Unknown;
        if free {
            arg.value_hint(ValueHint::Other)
        } else {
            arg
        }
    }
    Cli::command().mut_subcommands(|sub| sub.mut_args(free_text))
}

/// The short form in bash: `escha-convert [FLAGS] IN OUT …` is `convert`, so once a word after the
/// program is neither a subcommand nor `help` (a flag of convert, IN), the words that follow
/// complete as convert's; and the first word offers convert's flags beside the subcommands. The
/// script is changed at three places `clap_complete` writes; a script without them (another
/// version) is left as it is, and the completion tests fail.
fn bash_short_form(script: &str) -> String {
    let top = BIN.replace('-', "__");
    let convert = format!("{top}__subcmd__convert");
    let catch_all = "            *)\n                ;;\n        esac\n    done";
    let to_convert =
        format!("            {top},*)\n                cmd=\"{convert}\"\n                ;;\n{catch_all}");
    let cli = Cli::command();
    let flags: Vec<String> = cli
        .find_subcommand("convert")
        .expect("convert is a subcommand")
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_positional())
        .flat_map(|a| a.get_short().map(|c| format!("-{c}")).into_iter().chain(a.get_long().map(|l| format!("--{l}"))))
        .filter(|f| f != "-h" && f != "--help")
        .collect();
    let mut out = script.replacen(catch_all, &to_convert, 1);
    // Convert's state offered its flags for any word at position 2, where `convert IN` has IN and
    // the short form a flag's value (`escha-convert --format <TAB>`); the word before it decides.
    let arm = format!("        {convert})\n            opts=\"");
    if let Some(start) = out.find(&arm) {
        let position = " || ${COMP_CWORD} -eq 2 ]]";
        if let Some(at) = out[start..].find(position).map(|n| start + n) {
            out.replace_range(at..at + position.len(), " ]]");
        }
    }
    let opts = format!("        {top})\n            opts=\"");
    if let Some(start) = out.find(&opts).map(|at| at + opts.len()) {
        if let Some(end) = out[start..].find('"').map(|n| start + n) {
            out.insert_str(end, &format!(" {}", flags.join(" ")));
        }
    }
    out
}

/// `clap_complete`'s bash script names each subcommand's state twice, and for a program name with a
/// `-` the two disagree: the loop over the words sets `escha__convert__subcmd__verify`, while the
/// case arm that completes verify's flags reads `escha__subcmd__convert__subcmd__verify` (the `-`
/// spelled as the subcommand separator), so no arm below the top level ever matched (as of
/// `clap_complete` 4.6.12). The arms are renamed to the loop's spelling; a script that already
/// agrees is left as it is.
fn bash_states_agree(script: &str) -> String {
    let below = |program: String| format!("{program}__subcmd__");
    script.replace(&below(BIN.replace('-', "__subcmd__")), &below(BIN.replace('-', "__")))
}

/// `clap_complete`'s fish script completes subcommands and flags but not the values of positional
/// arguments (`completions SHELL` offered files): one line per value, under the same condition as
/// the subcommand's flags.
fn fish_positional_values() -> String {
    let using = format!("__fish_{}_using_subcommand", BIN.replace('-', "_"));
    let mut lines = String::new();
    for sub in Cli::command().get_subcommands().filter(|s| !s.is_hide_set()) {
        for arg in sub.get_positionals() {
            for value in arg.get_possible_values().iter().filter(|v| !v.is_hide_set()) {
                let (sub, value) = (sub.get_name(), value.get_name());
                let _ = writeln!(lines, "complete -c {BIN} -n \"{using} {sub}\" -f -a \"{value}\"");
            }
        }
    }
    lines
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
