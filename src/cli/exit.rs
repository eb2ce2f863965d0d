//! How commands end: errors and warnings on stderr, reports on stdout, exit codes. Under `--json`
//! stdout carries exactly one document: the report, or on failure the failure document
//! (`{"schema_version", "error": {"code", "message", "exit_status"}}`) beside stderr's error line.

use crate::failure::{self, class_of, error_document, ErrorCode};
use crate::text::escape_controls;
use std::io::Write;
use std::process::ExitCode;

/// Exit code of a run that did what it was asked.
pub const SUCCESS: u8 = 0;
/// Exit code of a run that failed (bad input, write error, failed checks).
pub const FAILURE: u8 = 1;
/// Exit code of a usage error (clap's own, for arguments it refuses), or of a verify that could
/// check nothing.
pub const USAGE: u8 = 2;
/// Exit code of a run ended by Ctrl-C, SIGTERM or SIGHUP, after its partial output was removed.
pub use crate::signals::INTERRUPTED_EXIT as INTERRUPTED;

/// Prints `e` with its causes on stderr (control characters escaped) and returns `status`; under
/// `--json` also the failure document on stdout, coded with the class `e` was given where it
/// arose, else `write_failed` for a full disk, else `class`.
pub fn fail(e: &anyhow::Error, class: ErrorCode, status: u8) -> ExitCode {
    // The outcome is decided (what failed was undone): a signal now must not add a document.
    crate::signals::reporting();
    let message = error_line(e);
    if failure::json() {
        let _ = write_stdout(&error_document(class_of(e, class), &message, status));
    }
    ExitCode::from(status)
}

/// Prints `e` on stderr and returns the text printed after `escha-convert: error: `.
fn error_line(e: &anyhow::Error) -> String {
    let message = escape_controls(&format!("{e:#}")).into_owned();
    let _ = writeln!(std::io::stderr(), "escha-convert: error: {message}");
    message
}

/// A command line clap (or the checks of a command's flags) refused: clap's own message on
/// stderr as ever and, under `--json`, the failure document (code `usage`) on stdout. `--help`
/// and `--version` print what they print and exit 0.
pub fn usage(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    let _ = e.print();
    let status = u8::try_from(e.exit_code()).unwrap_or(USAGE);
    if failure::json() {
        let message = match e.kind() {
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => "no command given (see --help)".to_string(),
            _ => usage_message(&e.render().to_string()),
        };
        let _ = write_stdout(&error_document(ErrorCode::Usage, &message, status));
    }
    ExitCode::from(status)
}

/// The error of clap's rendered message, without its `error: `: its first paragraph (the line,
/// and the arguments listed under it), on one line.
fn usage_message(rendered: &str) -> String {
    let paragraph: Vec<&str> = rendered
        .lines()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
    let text = paragraph.join(" ");
    escape_controls(text.strip_prefix("error: ").unwrap_or(&text)).into_owned()
}

/// Prints a warning on stderr.
pub fn warn(w: &str) {
    let _ = writeln!(std::io::stderr(), "escha-convert: warning: {}", escape_controls(w));
}

fn write_stdout(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|()| out.flush())
}

/// Writes `text` to stdout. A reader that went away (`| head -c1`) ends the output quietly:
/// the work is done, only the rest of the printing is skipped.
pub fn print_out(text: &str) -> ExitCode {
    // The work is done: a signal now lets the report finish rather than add a second document.
    crate::signals::reporting();
    match write_stdout(text) {
        // No failure document: stdout is what failed (and may hold part of a document).
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            error_line(&e.into());
            ExitCode::from(FAILURE)
        }
        _ => ExitCode::SUCCESS,
    }
}

/// Prints `value` as one pretty JSON document on stdout, `schema_version` first.
pub fn print_json(value: &impl serde::Serialize) -> ExitCode {
    match crate::json::document(value).and_then(|doc| serde_json::to_string_pretty(&doc)) {
        Ok(text) => print_out(&(text + "\n")),
        Err(e) => fail(&e.into(), ErrorCode::Failed, FAILURE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usage_message_is_clap_s_error_line() {
        let rendered = "error: unexpected argument '--frmat' found\n\n  tip: a similar argument exists: '--format'\n";
        assert_eq!(usage_message(rendered), "unexpected argument '--frmat' found");
        assert_eq!(usage_message("\nerror: x\n"), "x");
        let rendered = "error: the following required arguments were not provided:\n  <IN>\n  <OUT>\n\nUsage: …\n";
        assert_eq!(usage_message(rendered), "the following required arguments were not provided: <IN> <OUT>");
    }
}
