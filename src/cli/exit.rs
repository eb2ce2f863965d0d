//! How commands end: errors on stderr, exit codes.

use std::process::ExitCode;

/// Exit code of a run that failed (bad input, write error, failed checks).
pub const FAILURE: u8 = 1;
/// Exit code of a usage error, or of a verify that could check nothing.
pub const USAGE: u8 = 2;

/// Prints `e` with its causes on stderr and returns `code`.
pub fn fail(e: &anyhow::Error, code: u8) -> ExitCode {
    eprintln!("escha-convert: error: {e:#}");
    ExitCode::from(code)
}

/// Prints `value` as one pretty JSON document on stdout.
pub fn print_json(value: &impl serde::Serialize) -> ExitCode {
    match serde_json::to_string_pretty(value) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e.into(), FAILURE),
    }
}
