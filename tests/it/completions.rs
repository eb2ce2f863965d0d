//! Shell completions as a shell uses them: the script of `escha-convert completions SHELL` loaded
//! into bash, zsh and fish, asked what completes a partly typed command line, and held to the
//! command's own definition: every subcommand's flags, and the values of every flag and argument
//! that has a fixed set of them.
//!
//! A shell that is not installed is skipped with the reason printed, except under `CI=true`,
//! where .ci/run installs bash, zsh and fish and a missing one fails the test.

use crate::common::{escha_convert, stderr};
use clap::CommandFactory;
use escha_convert::cli::Cli;
use std::fmt::Write;
use std::path::Path;
use std::process::Command;

const BIN: &str = "escha-convert";

/// A partly typed command line (the last word is the one being completed) and words its
/// completions must include.
struct Query {
    words: Vec<String>,
    want: Vec<String>,
}

fn query(words: &[&str], want: &[&str]) -> Query {
    Query {
        words: std::iter::once(BIN).chain(words.iter().copied()).map(String::from).collect(),
        want: want.iter().map(|w| (*w).to_string()).collect(),
    }
}

/// What a user tabs for: the subcommands, then per subcommand its flags (after `--`), the values of
/// each flag that has a fixed set, and the values of its positional arguments.
fn queries() -> Vec<Query> {
    let mut cli = Cli::command();
    cli.build();
    let visible = |values: Vec<clap::builder::PossibleValue>| -> Vec<String> {
        values.into_iter().filter(|v| !v.is_hide_set()).map(|v| v.get_name().to_string()).collect()
    };
    let subcommands: Vec<&clap::Command> = cli.get_subcommands().filter(|s| !s.is_hide_set()).collect();
    let names: Vec<&str> = subcommands.iter().map(|s| s.get_name()).collect();
    let mut out = vec![
        query(&[""], &names),
        // The ones a newcomer types first.
        query(&["convert", "--for"], &["--format"]),
        query(&["convert", "--format", ""], &["bf16", "f16", "mlx", "gguf", "exl3"]),
        query(&["verify", "--b"], &["--base"]),
        query(&["completions", ""], &["bash", "zsh", "fish", "elvish", "powershell"]),
    ];
    // clap's own `help` subcommand takes the other subcommands' names, no flags.
    for sub in subcommands.into_iter().filter(|s| s.get_name() != "help") {
        let name = sub.get_name();
        let args: Vec<&clap::Arg> = sub.get_arguments().filter(|a| !a.is_hide_set()).collect();
        let flags: Vec<String> = args.iter().filter_map(|a| a.get_long()).map(|l| format!("--{l}")).collect();
        assert!(flags.iter().any(|f| f == "--help"), "{name}: {flags:?}");
        out.push(Query { words: vec![BIN.into(), name.into(), "--".into()], want: flags });
        for arg in args {
            let values = visible(arg.get_possible_values());
            if values.is_empty() || !arg.get_action().takes_values() {
                continue;
            }
            let words = match arg.get_long() {
                Some(long) => vec![BIN.into(), name.into(), format!("--{long}"), String::new()],
                None => vec![BIN.into(), name.into(), String::new()],
            };
            out.push(Query { words, want: values });
        }
    }
    out
}

/// The completion script for `shell`, written into `dir`.
fn script(dir: &Path, shell: &str) -> std::path::PathBuf {
    let o = escha_convert().args(["completions", shell]).output().unwrap();
    assert!(o.status.success(), "{shell}: {}", stderr(&o));
    let path = dir.join(format!("{BIN}.{shell}"));
    std::fs::write(&path, &o.stdout).unwrap();
    path
}

/// Whether `shell` runs here; says why not when it does not, and fails instead under `CI=true`.
fn installed(shell: &str) -> bool {
    let runs = Command::new(shell).arg("-c").arg("true").output().is_ok_and(|o| o.status.success());
    if !runs {
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{shell} is not installed (.ci/run installs it)");
        eprintln!("skipped: {shell} is not installed");
    }
    runs
}

/// A word quoted for a POSIX shell (and for fish, which reads single quotes the same way).
fn quoted(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// Checks each query's answer (one line of words per query, in order) against what it wants.
fn check(shell: &str, queries: &[Query], answers: &[Vec<String>]) {
    assert_eq!(answers.len(), queries.len(), "{shell}: one answer per query");
    let mut wrong = Vec::new();
    for (q, got) in queries.iter().zip(answers) {
        let missing: Vec<&String> = q.want.iter().filter(|w| !got.contains(w)).collect();
        if !missing.is_empty() {
            wrong.push(format!("{:?} → {got:?}, missing {missing:?}", q.words.join(" ")));
        }
    }
    assert!(wrong.is_empty(), "{shell} completes:\n{}", wrong.join("\n"));
}

/// What bash offers for each query, in `dir` (the working directory), with the script loaded: as
/// bash calls a completion function, `COMP_WORDS` and `COMP_CWORD` set, then the function with the
/// command, the word being completed and the word before it; its answer is COMPREPLY.
fn bash_answers(dir: &Path, queries: &[Query]) -> Vec<Vec<String>> {
    let path = script(dir, "bash");
    let mut driver = format!(
        "source {}\nfunction=$(complete -p {BIN} | sed -E 's/.*-F ([^ ]+) .*/\\1/')\n\
         ask() {{\n  COMP_WORDS=(\"$@\"); COMP_CWORD=$(($# - 1)); COMPREPLY=()\n  \
         \"$function\" {BIN} \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\" 2>/dev/null\n  \
         echo \"${{COMPREPLY[*]}}\"\n}}\n",
        quoted(&path.to_string_lossy())
    );
    for q in queries {
        let words: Vec<String> = q.words.iter().map(|w| quoted(w)).collect();
        let _ = writeln!(driver, "ask {}", words.join(" "));
    }
    let o = Command::new("bash").arg("-c").arg(&driver).current_dir(dir).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).lines().map(|l| l.split_whitespace().map(String::from).collect()).collect()
}

#[test]
fn bash_completes_every_subcommand_flag_and_value() {
    if !installed("bash") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let queries = queries();
    let answers = bash_answers(tmp.path(), &queries);
    check("bash", &queries, &answers);
}

#[test]
fn bash_completes_the_short_form_and_never_offers_files_for_a_value() {
    if !installed("bash") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for file in ["model.safetensors", "11GB", "2"] {
        std::fs::write(tmp.path().join(file), "").unwrap();
    }
    let formats = ["bf16", "f16", "mlx", "gguf", "exl3"];
    let bits = ["2", "3", "4", "5", "6", "8", "auto"];
    let queries = vec![
        // `escha-convert IN OUT …` is convert: its flags, and their values.
        query(&["in", "out", "--max"], &["--max-size", "--max-shard-size", "--max-added-error"]),
        query(&["in", "out", "--format", ""], &formats),
        query(&["-q", "in", "out", "--gguf-type", ""], &["q4_k_m", "q5_k_m", "auto"]),
        query(&["in", "out", "--format", "mlx", "--bits", ""], &bits),
        // Flags before IN, and the first word: convert's flags beside the subcommands.
        query(&["--format", ""], &formats),
        query(&["--json", "--bits", ""], &bits),
        query(&["--ma"], &["--max-size", "--max-shard-size"]),
        query(&[""], &["convert", "inspect"]),
        query(&["convert", "in", "out", "--bits", ""], &bits),
    ];
    let answers = bash_answers(tmp.path(), &queries);
    check("bash", &queries, &answers);
    // A value that is free text (a size, a count, a glob, I/N): nothing, never the files here.
    let free: Vec<Query> = [
        "--max-size",
        "--max-shard-size",
        "--max-added-error",
        "--fit-memory",
        "--context",
        "--reserve",
        "--only",
        "-j",
        "--threads",
        "--part",
    ]
    .iter()
    .flat_map(|flag| [query(&["in", "out", flag, ""], &[]), query(&["convert", "in", "out", flag, ""], &[])])
    .chain([query(&["verify", "in", "--base", "b", "--sample", ""], &[])])
    .collect();
    let answers = bash_answers(tmp.path(), &free);
    for (q, got) in free.iter().zip(&answers) {
        assert!(got.iter().all(|w| !tmp.path().join(w).exists()), "{:?} offers files: {got:?}", q.words.join(" "));
    }
}

#[test]
fn fish_completes_every_subcommand_flag_and_value() {
    if !installed("fish") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = script(tmp.path(), "fish");
    let queries = queries();
    // `complete -C LINE` prints what fish offers for LINE, one candidate a line (a tab, then its
    // description); a line of its own separates the answers.
    let mut driver = format!("source {}\n", quoted(&path.to_string_lossy()));
    for q in &queries {
        let _ = writeln!(driver, "complete -C {}\necho '<end>'", quoted(&q.words.join(" ")));
    }
    let o = Command::new("fish")
        .args(["--no-config", "-c", &driver])
        .current_dir(tmp.path())
        .env("HOME", tmp.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let mut answers = vec![Vec::new()];
    for line in stdout.lines() {
        if line == "<end>" {
            answers.push(Vec::new());
        } else {
            answers.last_mut().unwrap().push(line.split('\t').next().unwrap_or_default().to_string());
        }
    }
    answers.pop();
    check("fish", &queries, &answers);
}

/// Loaded into an interactive zsh (`zsh -f -i`) before the line is typed: the completion system,
/// the script on `fpath`, and `compadd` wrapped so that every match zsh would offer is also printed
/// (`<m>WORD`); after the completion `<done>` is printed and the shell ends.
const ZSH_SETUP: &str = r#"PS1='' PROMPT='' RPROMPT=''
fpath=(${0:h} $fpath)
autoload -U compinit && compinit -u -D
bindkey '^I' complete-word
compadd() {
  if (( ${@[(I)-[OAD]*]} )); then
    builtin compadd "$@"
    return
  fi
  local -a found
  builtin compadd -O found "$@"
  local m
  for m in $found; do print -r -- "<m>$m"; done
  builtin compadd "$@"
}
finish() { print -r -- '<done>'; exit }
comppostfuncs=(finish)
print -r -- '<ready>'
"#;

/// `zsh -f ask.zsh SETUP LINE…`: for each LINE, a fresh interactive zsh on a terminal (`zpty`),
/// the line typed and Tab pressed; prints the matches, one a line, then `<end>`.
const ZSH_ASK: &str = r#"zmodload zsh/zpty
local out line
for line in "${@[2,-1]}"; do
  zpty shell zsh -f -i
  zpty -w shell "source ${(q)1}"
  while zpty -r shell out; do [[ $out == *'<ready>'* ]] && break; done
  zpty -w -n shell "$line"$'\t'
  while zpty -r shell out; do
    [[ $out == *'<done>'* ]] && break
    [[ $out == *'<m>'* ]] && print -r -- ${${out##*<m>}%%[$'\r\n']*}
  done
  print -r -- '<end>'
  zpty -d shell
done
"#;

#[test]
fn zsh_completes_every_subcommand_flag_and_value() {
    if !installed("zsh") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // zsh finds a completion function by its file name on `fpath`.
    std::fs::rename(script(tmp.path(), "zsh"), tmp.path().join(format!("_{BIN}"))).unwrap();
    let (setup, ask) = (tmp.path().join("setup.zsh"), tmp.path().join("ask.zsh"));
    std::fs::write(&setup, ZSH_SETUP).unwrap();
    std::fs::write(&ask, ZSH_ASK).unwrap();
    let queries = queries();
    let lines: Vec<String> = queries.iter().map(|q| q.words.join(" ")).collect();
    let mut cmd = Command::new("zsh");
    cmd.arg("-f").arg(&ask).arg(&setup).args(&lines).current_dir(tmp.path()).env("HOME", tmp.path());
    let o = crate::common::output_within(&mut cmd, std::time::Duration::from_secs(120)).expect("zsh answers");
    assert!(o.status.success(), "{}", stderr(&o));
    let mut answers = vec![Vec::new()];
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        if line == "<end>" {
            answers.push(Vec::new());
        } else {
            answers.last_mut().unwrap().push(line.to_string());
        }
    }
    answers.pop();
    check("zsh", &queries, &answers);
}
