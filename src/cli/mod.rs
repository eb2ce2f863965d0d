//! The command line: clap definitions, each subcommand's arguments turned into its options in
//! one place, and what the commands print and how they exit. `main.rs` only calls [`main`].
//!
//! Exit codes: 0 success, 1 failure (bad input, write error, failed checks), 2 usage error or
//! nothing checked, 130 interrupted.

mod convert;
mod exit;
mod inspect;
mod merge;
mod size;
mod verify;

pub use convert::ConvertArgs;
pub use inspect::InspectArgs;
pub use merge::MergeArgs;
pub use verify::VerifyArgs;

use clap::{CommandFactory, Parser, Subcommand};
use std::ffi::OsString;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "escha-convert",
    version,
    about = "Convert Escha-W2 (EXL3 trellis) checkpoints to dense bf16/f16 safetensors or MLX-affine safetensors",
    long_about = "Convert Escha-W2 (EXL3 trellis) checkpoints to dense bf16/f16 safetensors in Hugging Face \
layout, or to MLX-affine safetensors that mlx-lm loads (--format mlx).\n\n`escha-convert IN OUT` is short for \
`escha-convert convert IN OUT`.\n\nExit codes: 0 success, 1 failure (bad input, write error, a failed \
--verify-base or verify check), 2 usage error (or verify could check nothing), 130 interrupted."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Decode every tensor and write a dense or MLX checkpoint (the default command).
    Convert(ConvertArgs),
    /// Describe a checkpoint: architecture, coded projections, bits per weight, problems.
    Inspect(InspectArgs),
    /// Check a decode against the unquantized base model (exit 0 pass, 1 fail, 2 nothing checked).
    Verify(VerifyArgs),
    /// Check and join the parts of a split conversion copied into one directory; writes SHA256SUMS.
    Merge(MergeArgs),
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
    });
    match cli.command {
        Command::Convert(a) => convert::run(a),
        Command::Inspect(a) => inspect::run(&a),
        Command::Verify(a) => verify::run(&a),
        Command::Merge(a) => merge::run(&a),
    }
}

/// Whether the command line asks for `--json`, before clap has read it.
fn json_requested(args: &[OsString]) -> bool {
    args.iter().skip(1).take_while(|a| *a != "--").any(|a| a == "--json")
}

/// Rewrites `escha-convert IN OUT …` to `escha-convert convert IN OUT …` when IN is an existing
/// path or looks like one (a `/` or a `.` in it: a missing checkpoint, or a Hub repository id,
/// which convert then explains); a bare word is left to clap, which suggests the subcommand a typo
/// meant.
pub fn with_default_command(mut args: Vec<OsString>) -> Vec<OsString> {
    if let Some(first) = args.get(1) {
        let text = first.to_string_lossy();
        let subcommand = text == "help" || Cli::command().find_subcommand(text.as_ref()).is_some();
        let path = std::path::Path::new(first);
        let path_like = path.exists() || text.contains(['/', '.']);
        if !text.starts_with('-') && !subcommand && path_like {
            args.insert(1, "convert".into());
        }
    }
    args
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
        for sub in ["convert", "inspect", "verify", "merge", "help"] {
            assert_eq!(words(&["e", sub, "x/y"]), ["e", sub, "x/y"]);
        }
        // A bare word is left to clap, which suggests the subcommand a typo meant.
        assert_eq!(words(&["e", "verfy", "x/y"]), ["e", "verfy", "x/y"]);
        assert_eq!(words(&["e", "--help"]), ["e", "--help"]);
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
