//! How commands end: errors and warnings on stderr, reports on stdout, exit codes.

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

/// Prints `e` with its causes on stderr (control characters escaped) and returns `code`.
pub fn fail(e: &anyhow::Error, code: u8) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "escha-convert: error: {}", escape_controls(&format!("{e:#}")));
    ExitCode::from(code)
}

/// Prints a warning on stderr.
pub fn warn(w: &str) {
    let _ = writeln!(std::io::stderr(), "escha-convert: warning: {}", escape_controls(w));
}

/// Writes `text` to stdout. A reader that went away (`| head -c1`) ends the output quietly:
/// the work is done, only the rest of the printing is skipped.
pub fn print_out(text: &str) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => fail(&e.into(), FAILURE),
        _ => ExitCode::SUCCESS,
    }
}

/// Prints `value` as one pretty JSON document on stdout.
pub fn print_json(value: &impl serde::Serialize) -> ExitCode {
    match serde_json::to_string_pretty(value) {
        Ok(text) => print_out(&(text + "\n")),
        Err(e) => fail(&e.into(), FAILURE),
    }
}
