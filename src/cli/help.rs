//! What `--help` shows after the arguments: each command's notes, examples and exit codes. The
//! codes are the constants of `exit.rs`, so the help, the man pages and the runs agree.

use super::exit::{FAILURE, INTERRUPTED, SUCCESS, USAGE};
use std::fmt::Write;

/// A command with a help page of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Page {
    Top,
    Convert,
    Inspect,
    Verify,
    Merge,
    Completions,
    Man,
}

impl Page {
    /// Every page, the top level first.
    pub const ALL: [Page; 7] =
        [Page::Top, Page::Convert, Page::Inspect, Page::Verify, Page::Merge, Page::Completions, Page::Man];

    /// The subcommand's name (`None` for the top level).
    pub fn name(self) -> Option<&'static str> {
        match self {
            Page::Top => None,
            Page::Convert => Some("convert"),
            Page::Inspect => Some("inspect"),
            Page::Verify => Some("verify"),
            Page::Merge => Some("merge"),
            Page::Completions => Some("completions"),
            Page::Man => Some("man"),
        }
    }
}

/// The exit codes a command ends with, and what each means for it.
pub fn exit_codes(page: Page) -> Vec<(u8, &'static str)> {
    let usage = (USAGE, "usage error (an unknown flag, a missing or invalid value)");
    let interrupted =
        (INTERRUPTED, "interrupted (Ctrl-C, SIGTERM, SIGHUP) before the output was in place; partial output removed");
    match page {
        Page::Top => vec![
            (SUCCESS, "success"),
            (FAILURE, "failure: bad input, a write error, a failed --verify-base or verify check, an incomplete merge"),
            (USAGE, "usage error, or verify could check nothing"),
            interrupted,
        ],
        Page::Convert => vec![
            (SUCCESS, "OUT written (with --dry-run: the plan printed)"),
            (FAILURE, "failure: bad input, OUT refused, a write error, a failed --verify-base (nothing written)"),
            usage,
            interrupted,
        ],
        Page::Inspect => vec![
            (SUCCESS, "described (problems found are listed, not an error)"),
            (FAILURE, "IN cannot be read or is not a checkpoint this tool reads"),
            usage,
        ],
        Page::Verify => vec![
            (SUCCESS, "every check passed"),
            (
                FAILURE,
                "a check failed, a tensor of IN is missing from BASE (without --allow-missing), no coded tensor was \
                 checked, or the --html page could not be written after the checks",
            ),
            (
                USAGE,
                "nothing could be checked (bad paths, a quantized BASE, an unwritable --html FILE), or a usage error",
            ),
            interrupted,
        ],
        Page::Merge => vec![
            (SUCCESS, "the model is whole; SHA256SUMS written"),
            (FAILURE, "a part or file is missing, damaged, or from another run (named)"),
            usage,
            interrupted,
        ],
        Page::Completions => vec![(SUCCESS, "script printed"), (FAILURE, "stdout cannot be written"), usage],
        Page::Man => vec![(SUCCESS, "page(s) written"), (FAILURE, "DIR cannot be created or written"), usage],
    }
}

/// Real command lines for the page, each with what it does.
pub fn examples(page: Page) -> &'static [(&'static str, &'static str)] {
    match page {
        Page::Top => &[
            ("escha-convert ./Escha-W2-27B out/27b-bf16", "Dense bf16, Hugging Face layout (short for convert)"),
            ("escha-convert ./Escha-W2-27B out/27b-gguf --format gguf --gguf-type q4_k_m", "GGUF for llama.cpp"),
            ("escha-convert inspect ./Escha-W2-27B", "Describe a checkpoint"),
            (
                "escha-convert verify ./Escha-W2-27B --base ./Qwen3.5-27B --html report.html",
                "Prove the decode against the unquantized base",
            ),
            (
                "escha-convert completions bash > ~/.local/share/bash-completion/completions/escha-convert",
                "Shell completion for bash (zsh, fish, elvish, powershell alike)",
            ),
        ],
        Page::Convert => &[
            ("escha-convert ./Escha-W2-27B out/27b-bf16", "Dense bf16, Hugging Face layout"),
            (
                "escha-convert ./Escha-W2-27B out/27b-mlx --format mlx --bits auto",
                "MLX, each coded linear at the width it needs",
            ),
            (
                "escha-convert ./Escha-W2-27B out/27b-11gb --format mlx --max-size 11GB",
                "MLX, the most faithful model whose files fit in 11 GB",
            ),
            (
                "escha-convert ./Escha-W2-27B out/27b-16gb --format gguf --fit-memory 16GB",
                "GGUF, the most faithful model a 16 GB machine runs with 8192 tokens of context",
            ),
            (
                "escha-convert ./Escha-W2-35B-A3B out/35b-gguf --format gguf --gguf-type q4_k_m",
                "GGUF for llama.cpp, quantized to Q4_K_M in the same pass",
            ),
            (
                "escha-convert ./Escha-W2-27B out/27b --verify-base ./Qwen3.5-27B --checksums",
                "Convert, prove against the base before OUT is moved into place, checksum",
            ),
            (
                "escha-convert -q ./Escha-W2-27B out/part2 --part 2/3 --checksums",
                "Part 2 of 3 of a split job (flags may come first); then merge",
            ),
        ],
        Page::Inspect => &[
            ("escha-convert inspect ./Escha-W2-27B", "Layers, coded projections, bits per weight, problems found"),
            ("escha-convert inspect ./Escha-W2-27B/model-00001-of-00006.safetensors", "One file of a checkpoint"),
            ("escha-convert inspect ./Escha-W2-35B-A3B --json", "As one JSON document"),
        ],
        Page::Verify => &[
            ("escha-convert verify ./Escha-W2-27B --base ./Qwen3.5-27B", "Every tensor, whole, against the bf16 base"),
            (
                "escha-convert verify ./Escha-W2-27B --base ./Qwen3.5-27B-FP8 --sample 4",
                "A quick pass: 4 sampled blocks per tensor, against the fp8 base",
            ),
            (
                "escha-convert verify ./Escha-W2-27B --base ./Qwen3.5-27B --html report.html",
                "Also write the report as an HTML page",
            ),
            (
                "escha-convert verify ./Escha-W2-35B-A3B --base ./Qwen3.5-35B-A3B --only '*.mlp.*' --json",
                "Only the MLP tensors, as one JSON document",
            ),
        ],
        Page::Merge => &[
            (
                "cp -a part1/. part2/. part3/. out/",
                "Copy the parts into one directory, the hidden marker file included",
            ),
            ("escha-convert merge out/", "Check the parts and write SHA256SUMS"),
            ("escha-convert merge out/ --json", "The same, one JSON document"),
        ],
        Page::Completions => &[
            (
                "escha-convert completions bash > ~/.local/share/bash-completion/completions/escha-convert",
                "Bash: bash-completion loads it when the command is first completed",
            ),
            (
                "escha-convert completions zsh > ~/.zfunc/_escha-convert",
                "Zsh: a directory in fpath (fpath+=(~/.zfunc) before compinit)",
            ),
            ("escha-convert completions fish > ~/.config/fish/completions/escha-convert.fish", "Fish"),
            ("escha-convert completions powershell >> $PROFILE", "PowerShell: appended to the profile"),
        ],
        Page::Man => &[
            ("escha-convert man | man -l -", "Read the main page now"),
            (
                "escha-convert man ~/.local/share/man/man1",
                "Install every page (escha-convert.1, escha-convert-convert.1, …)",
            ),
            ("escha-convert man /usr/local/share/man/man1", "Install every page system-wide (as root)"),
        ],
    }
}

/// Notes the long help (`--help`, and the man page) shows before the examples.
fn notes(page: Page) -> Option<&'static str> {
    match page {
        Page::Convert => Some(
            "Norms are written exactly as stored: Hugging Face Qwen3.5 norms are zero-centred and HF runtimes \
(transformers, mlx-lm loading HF layout) add the 1 themselves. --format mlx folds the 1 in (mlx-lm's own \
layout), quantizes each coded weight from its bf16 rounding (byte-identical to `mlx_lm.convert -q` run on \
the bf16 export) and writes no MTP head. --format gguf writes what llama.cpp's own converter writes, \
quantized in the same pass with --gguf-type. The Hugging Face layout writes a complete MTP head as mtp.* \
tensors in the main shards (also the 27B's separate mtp/ directory). --format exl3 writes the trellis codes \
exactly as stored, for exllamav3 (which adds the norms' 1 itself): s_in/s_out folded into its f16 channel \
scales (the largest change is reported), one module per expert.\n\nFlags may come before, between or \
after IN and OUT, in the short form too (`escha-convert -q IN OUT`); `--` ends the flags, so \
`escha-convert -- merge OUT` converts a directory named like a subcommand.",
        ),
        Page::Man => Some(
            "Without DIR, the main page (escha-convert.1) is printed on stdout. With DIR (created when missing), \
every page is written into it: escha-convert.1 and escha-convert-SUBCOMMAND.1 for each subcommand; their \
paths are printed.",
        ),
        Page::Completions => {
            Some("The script is printed on stdout; load it the way your shell loads completions (examples below).")
        }
        _ => None,
    }
}

/// Examples and exit codes: `-h`.
pub fn after_help(page: Page) -> String {
    let mut s = String::from("Examples:\n");
    for (command, what) in examples(page) {
        let _ = write!(s, "  # {what}\n  {command}\n");
    }
    s += "\nExit codes:\n";
    for (code, meaning) in exit_codes(page) {
        let _ = writeln!(s, "  {code:>3}  {meaning}");
    }
    s.pop();
    s
}

/// Notes, examples and exit codes: `--help` and the man pages.
pub fn after_long_help(page: Page) -> String {
    match notes(page) {
        Some(notes) => format!("{notes}\n\n{}", after_help(page)),
        None => after_help(page),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    /// An example's words up to a redirection or a pipe, quotes removed (no example needs more).
    fn words(line: &str) -> Vec<String> {
        let mut out = Vec::new();
        for w in line.split_whitespace() {
            if [">", ">>", "|"].contains(&w) {
                break;
            }
            out.push(w.trim_matches('\'').to_string());
        }
        out
    }

    #[test]
    fn every_example_parses_as_written() {
        for page in Page::ALL {
            for (line, _) in examples(page) {
                if !line.starts_with("escha-convert") {
                    continue;
                }
                let args = words(line).into_iter().map(std::ffi::OsString::from).collect();
                let args = super::super::with_default_command(args);
                let cli = super::super::Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{line}: {e}"));
                if let super::super::Command::Convert(a) = cli.command {
                    // The checks between flags that clap does not express (the examples' paths are
                    // not here: each is taken as found).
                    let found = |p: &std::path::Path| Ok(crate::checkpoint::Located { path: p.into(), hub: None });
                    let run = super::super::convert::ConvertRun::from_args(a, found);
                    assert!(run.is_ok(), "{line}: {}", run.err().unwrap());
                }
            }
        }
    }

    #[test]
    fn every_subcommand_has_a_page_and_every_page_lists_its_exit_codes() {
        let cmd = super::super::Cli::command();
        let names: Vec<&str> = cmd.get_subcommands().map(clap::Command::get_name).collect();
        let pages: Vec<&str> = Page::ALL.iter().filter_map(|p| p.name()).collect();
        assert_eq!(names, pages);
        for page in Page::ALL {
            let codes = exit_codes(page);
            assert_eq!(codes[0].0, SUCCESS);
            assert!(codes.iter().any(|(c, _)| *c == USAGE), "{page:?}");
            let text = after_help(page);
            for (code, meaning) in codes {
                assert!(text.contains(&format!("{code:>3}  {meaning}")), "{page:?}: {text}");
            }
        }
    }
}
