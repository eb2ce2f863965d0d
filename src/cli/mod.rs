//! The command line: clap definitions, each subcommand's arguments turned into its options in
//! one place, and what the commands print and how they exit. `main.rs` only calls [`main`]. Clap
//! stays here: flags whose values are library enums spell them in `values.rs`.
//!
//! Output formats: dense bf16 or f16 safetensors in Hugging Face layout, MLX-affine safetensors,
//! GGUF for llama.cpp, or EXL3 safetensors for exllamav3. Exit codes: the constants of `exit.rs`, listed per command in each
//! command's help (`help.rs`).

mod completions;
mod convert;
mod exit;
mod help;
mod inspect;
mod merge;
mod size;
mod values;
mod verify;

pub use completions::{CompletionsArgs, ManArgs};
pub use convert::ConvertArgs;
pub use help::{exit_codes, Page};
pub use inspect::InspectArgs;
pub use merge::MergeArgs;
pub use verify::VerifyArgs;

use clap::{CommandFactory, Parser, Subcommand};
use help::{after_help, after_long_help};
use std::ffi::OsString;
use std::process::ExitCode;

/// `--version`: the version alone. `--version` in full (clap's long version): the commit, the
/// cargo features, the target and the profile of the build, from build.rs.
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ncommit:   ",
    env!("ESCHA_BUILD_COMMIT"),
    "\nfeatures: ",
    env!("ESCHA_BUILD_FEATURES"),
    "\ntarget:   ",
    env!("ESCHA_BUILD_TARGET"),
    "\nprofile:  ",
    env!("ESCHA_BUILD_PROFILE"),
);

#[derive(Parser, Debug)]
#[command(
    name = "escha-convert",
    version,
    long_version = LONG_VERSION,
    about = "Convert Escha-W2 (EXL3 trellis) checkpoints to dense bf16/f16 safetensors, MLX-affine safetensors, GGUF or EXL3",
    long_about = "Convert Escha-W2 (EXL3 trellis) checkpoints to dense bf16/f16 safetensors in Hugging Face \
layout, to MLX-affine safetensors that mlx-lm loads (--format mlx), to GGUF that llama.cpp loads \
(--format gguf), or to native EXL3 that exllamav3 loads (--format exl3).\n\n`escha-convert IN OUT` is short \
for `escha-convert convert IN OUT`, with flags anywhere (`escha-convert -q IN OUT`).\n\nIN and BASE are paths, or Hub ids `org/name[@REVISION]` read from the \
local Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub); an existing path is \
always a path, and nothing is downloaded (`hf download org/name` puts a repository there).",
    after_help = after_help(Page::Top),
    after_long_help = after_long_help(Page::Top)
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Decode every tensor and write a bf16/f16, MLX, GGUF or EXL3 checkpoint (the default command).
    #[command(after_help = after_help(Page::Convert), after_long_help = after_long_help(Page::Convert))]
    Convert(ConvertArgs),
    /// Describe a checkpoint: architecture, coded projections, bits per weight, problems.
    #[command(after_help = after_help(Page::Inspect), after_long_help = after_long_help(Page::Inspect))]
    Inspect(InspectArgs),
    /// Check a decode against the unquantized base model: a verdict, as a table, JSON or an HTML page.
    #[command(after_help = after_help(Page::Verify), after_long_help = after_long_help(Page::Verify))]
    Verify(VerifyArgs),
    /// Check and join the parts of a split conversion copied into one directory; writes SHA256SUMS.
    #[command(after_help = after_help(Page::Merge), after_long_help = after_long_help(Page::Merge))]
    Merge(MergeArgs),
    /// Print the shell completion script for bash, zsh, fish, elvish or powershell.
    #[command(after_help = after_help(Page::Completions), after_long_help = after_long_help(Page::Completions))]
    Completions(CompletionsArgs),
    /// Print the man page, or write every page (one per subcommand) into DIR.
    #[command(after_help = after_help(Page::Man), after_long_help = after_long_help(Page::Man))]
    Man(ManArgs),
}

/// Parses `args` (the program name first) and runs the command.
///
/// Under `--json` a failure prints the failure document on stdout. A command line clap refuses
/// has no parsed `--json` yet: the document is printed when `--json` is among the words before a
/// `--`, the words clap reads as flags.
pub fn main(args: Vec<OsString>) -> ExitCode {
    let args = with_default_command(args);
    crate::failure::set_json(json_requested(&args));
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => return exit::usage(&e),
    };
    crate::failure::set_json(match &cli.command {
        Command::Convert(a) => a.json,
        Command::Inspect(a) => a.json,
        Command::Verify(a) => a.json,
        Command::Merge(a) => a.json,
        Command::Completions(_) | Command::Man(_) => false,
    });
    match cli.command {
        Command::Convert(a) => convert::run(a),
        Command::Inspect(a) => inspect::run(&a),
        Command::Verify(a) => verify::run(&a),
        Command::Merge(a) => merge::run(&a),
        Command::Completions(a) => completions::run_completions(&a),
        Command::Man(a) => completions::run_man(&a),
    }
}

/// Whether the command line asks for `--json`, before clap has read it.
fn json_requested(args: &[OsString]) -> bool {
    args.iter().skip(1).take_while(|a| *a != "--").any(|a| a == "--json")
}

/// Rewrites the short form `escha-convert [FLAGS] IN OUT …` to `escha-convert convert [FLAGS] IN
/// OUT …`. The first word that is not a flag of convert or a flag's value decides: a subcommand
/// name (or `help`) is that subcommand; a word after `--` is always IN; so is an existing path,
/// and any other word unless it is a typo of a subcommand (a letter or two from one), which is
/// left to clap to suggest the subcommand meant. IN that is not there is then said to be missing
/// by convert, with the names close to it. Anything before such a word that is not a flag of
/// convert (`--help`, `--version`, a typo) leaves the whole line to clap.
pub fn with_default_command(mut args: Vec<OsString>) -> Vec<OsString> {
    if first_positional(&args).is_some_and(|(i, after_dashes)| after_dashes || is_input(&args[i])) {
        args.insert(1, "convert".into());
    }
    args
}

/// Whether `word`, the first positional word, is IN of the short form rather than a subcommand.
fn is_input(word: &OsString) -> bool {
    let text = word.to_string_lossy();
    let cli = Cli::command();
    if text == "help" || cli.find_subcommand(text.as_ref()).is_some() {
        return false;
    }
    if std::path::Path::new(word).exists() || text.contains(['/', '.']) {
        return true;
    }
    let typo = |name: &str| crate::checkpoint::closeness(&text, name).is_some();
    let typo_of_one = cli.get_subcommands().map(clap::Command::get_name).chain(["help"]).any(typo);
    !typo_of_one
}

/// The index of the first word of `args` (after the program name) that is neither a flag that
/// convert takes nor such a flag's value, and whether a `--` came before it. `None` when there is
/// no such word, or a word before it is a flag convert does not take (`--help`, `-V`, a typo).
fn first_positional(args: &[OsString]) -> Option<(usize, bool)> {
    let cli = Cli::command();
    let convert = cli.find_subcommand("convert").expect("convert is a subcommand");
    let takes_value = |arg: &clap::Arg| arg.get_action().takes_values();
    let mut i = 1;
    while i < args.len() {
        let word = args[i].to_string_lossy();
        let word = word.as_ref();
        if word == "--" {
            return (i + 1 < args.len()).then_some((i + 1, true));
        }
        if let Some(long) = word.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((name, _)) => (name, true),
                None => (long, false),
            };
            let arg = convert
                .get_arguments()
                .find(|a| a.get_long() == Some(name) || a.get_all_aliases().is_some_and(|all| all.contains(&name)))?;
            i += if takes_value(arg) && !inline { 2 } else { 1 };
        } else if let Some(shorts) = word.strip_prefix('-').filter(|s| !s.is_empty()) {
            // A cluster: `-q`, `-qj4`, `-j 4`, `-j=4`.
            let mut next = 1;
            for (at, c) in shorts.char_indices() {
                let arg = convert.get_arguments().find(|a| a.get_short() == Some(c))?;
                if takes_value(arg) {
                    if at + c.len_utf8() == shorts.len() {
                        next = 2;
                    }
                    break;
                }
            }
            i += next;
        } else {
            return Some((i, false));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(args: &[&str]) -> Vec<String> {
        let args = args.iter().map(OsString::from).collect();
        with_default_command(args).into_iter().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn in_out_is_short_for_convert_and_subcommands_stay_themselves() {
        assert_eq!(words(&["e", "fixtures/dense", "out"]), ["e", "convert", "fixtures/dense", "out"]);
        assert_eq!(words(&["e", "org/name", "out"]), ["e", "convert", "org/name", "out"]);
        for sub in ["convert", "inspect", "verify", "merge", "completions", "man", "help"] {
            assert_eq!(words(&["e", sub, "x/y"]), ["e", sub, "x/y"]);
        }
        // A typo of a subcommand is left to clap, which suggests the subcommand meant; any other
        // bare word is IN, which convert says is missing.
        assert_eq!(words(&["e", "verfy", "x/y"]), ["e", "verfy", "x/y"]);
        assert_eq!(words(&["e", "Inspect", "x/y"]), ["e", "Inspect", "x/y"]);
        assert_eq!(words(&["e", "Escha-W2-27B", "out"]), ["e", "convert", "Escha-W2-27B", "out"]);
        assert_eq!(words(&["e", "dnse", "out"]), ["e", "convert", "dnse", "out"]);
        assert_eq!(words(&["e", "-q", "Escha-W2-27B", "out"]), ["e", "convert", "-q", "Escha-W2-27B", "out"]);
        assert_eq!(words(&["e", "--help"]), ["e", "--help"]);
        assert_eq!(words(&["e", "-V"]), ["e", "-V"]);
    }

    #[test]
    fn flags_may_come_before_in_in_the_short_form() {
        fn convert<'a>(rest: &[&'a str]) -> Vec<&'a str> {
            [&["e", "convert"][..], rest].concat()
        }
        for args in [
            &["-q", "a/in", "out"][..],
            &["a/in", "-q", "out"],
            &["--json", "--format", "mlx", "a/in", "out"],
            &["--format=gguf", "-qj", "4", "a/in", "out"],
            &["-j4", "a/in", "out"],
            &["-j=4", "a/in", "out"],
            // A flag's value named like a subcommand is a value.
            &["--only", "merge", "a/in", "out"],
            &["--decoder", "scalar", "a/in", "out"],
        ] {
            assert_eq!(words(&[&["e"][..], args].concat()), convert(args), "{args:?}");
        }
        // A path that is not UTF-8 is a path too.
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStringExt;
            let odd = OsString::from_vec(b"in/\xff".to_vec());
            let args = vec!["e".into(), "-q".into(), odd.clone(), "out".into()];
            assert_eq!(with_default_command(args), ["e".into(), "convert".into(), "-q".into(), odd, "out".into()]);
        }
        // After `--` the first word is IN, even named like a subcommand.
        assert_eq!(words(&["e", "--", "merge", "out"]), convert(&["--", "merge", "out"]));
        assert_eq!(words(&["e", "-q", "--", "merge", "out"]), convert(&["-q", "--", "merge", "out"]));
        // A subcommand after convert's flags, a flag convert does not take, help: left to clap.
        for args in
            [&["e", "-q", "merge", "x/y"][..], &["e", "--bogus", "a/in", "out"], &["e", "-h", "a/in"], &["e", "--"]]
        {
            assert_eq!(words(args), args, "{args:?}");
        }
    }

    #[test]
    fn value_names_ignore_case_where_no_two_differ_only_by_case() {
        let cli = Cli::command();
        let mut checked = 0;
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments() {
                let values: Vec<String> =
                    arg.get_possible_values().iter().map(|v| v.get_name().to_ascii_lowercase()).collect();
                if !arg.get_action().takes_values() || !values.iter().any(|v| v.contains(char::is_alphabetic)) {
                    continue;
                }
                let mut unique = values.clone();
                unique.sort();
                unique.dedup();
                assert_eq!(
                    unique.len(),
                    values.len(),
                    "{} {}: values differ only by case",
                    sub.get_name(),
                    arg.get_id()
                );
                assert!(arg.is_ignore_case_set(), "{} {}: ignore_case", sub.get_name(), arg.get_id());
                checked += 1;
            }
        }
        assert!(checked >= 9, "{checked}");
    }

    #[test]
    fn json_is_requested_by_the_flag_before_a_double_dash() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(json_requested(&args(&["e", "convert", "--json", "--frmat", "x"])));
        assert!(!json_requested(&args(&["e", "convert", "--", "--json"])));
        assert!(!json_requested(&args(&["--json", "convert"])));
        assert!(!json_requested(&args(&["e", "convert", "--only=--json"])));
    }
}
