//! Why a run failed, as a stable code: what the `--json` failure document carries beside the
//! text of stderr's error line, so that a CI job can tell a refused input from a refused output,
//! a failed proof, a write error or an interruption without matching words. The codes are listed
//! in `docs/escha-convert.schema.json`; a code is never renamed or given another meaning.
//!
//! An error gets its class where the run knows what it was doing ([`Classify::class`]); the first
//! class given sticks, so an inner, more precise one is kept when an outer step classifies the
//! same error again. The class travels inside the `anyhow` error without changing its text.

use serde::Serialize;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

/// The class of a failure; serialized in snake case (`input_refused`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The command line is wrong: an unknown flag, a bad value, flags that do not go together.
    Usage,
    /// IN (or BASE, or merge's DIR) cannot be read or is not something this command takes.
    InputRefused,
    /// An input file changed while it was being read.
    InputChanged,
    /// OUT (or `--html FILE`) cannot be used: it exists, overlaps an input, another run holds it.
    OutputRefused,
    /// Writing the output failed part-way (a full disk, a file-size limit, a vanished directory);
    /// a full disk is this class wherever it is met.
    WriteFailed,
    /// `--verify-base` ran and its checks failed: nothing was written.
    VerifyFailed,
    /// The decoder asked for is not available on this machine or in this build.
    BackendUnavailable,
    /// Ctrl-C, SIGTERM or SIGHUP ended the run before its output was in place; any partial output
    /// was removed.
    Interrupted,
    /// A failure of no other class.
    Failed,
}

impl ErrorCode {
    /// Every code, in the order the schema lists them.
    pub const ALL: [ErrorCode; 9] = [
        ErrorCode::Usage,
        ErrorCode::InputRefused,
        ErrorCode::InputChanged,
        ErrorCode::OutputRefused,
        ErrorCode::WriteFailed,
        ErrorCode::VerifyFailed,
        ErrorCode::BackendUnavailable,
        ErrorCode::Interrupted,
        ErrorCode::Failed,
    ];

    /// The code as the JSON document spells it.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::Usage => "usage",
            ErrorCode::InputRefused => "input_refused",
            ErrorCode::InputChanged => "input_changed",
            ErrorCode::OutputRefused => "output_refused",
            ErrorCode::WriteFailed => "write_failed",
            ErrorCode::VerifyFailed => "verify_failed",
            ErrorCode::BackendUnavailable => "backend_unavailable",
            ErrorCode::Interrupted => "interrupted",
            ErrorCode::Failed => "failed",
        }
    }
}

/// An error with its class; shows exactly the text of the error it wraps.
#[derive(Debug)]
struct Classified {
    code: ErrorCode,
    error: anyhow::Error,
}

impl fmt::Display for Classified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.error)
    }
}

impl std::error::Error for Classified {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

/// `e` with class `code`, unless it has one already. A full disk, a full quota or a file-size
/// limit is `write_failed` wherever it is met (creating OUT's directory, its lock, a probe file):
/// the schema puts them there.
pub fn classified(e: anyhow::Error, code: ErrorCode) -> anyhow::Error {
    if code_of(&e).is_some() {
        e
    } else {
        let code = if out_of_space(&e) { ErrorCode::WriteFailed } else { code };
        anyhow::Error::new(Classified { code, error: e })
    }
}

/// The class of `e` as the failure document gives it: the class it was given, else
/// `write_failed` for a full disk, else `fallback`.
pub fn class_of(e: &anyhow::Error, fallback: ErrorCode) -> ErrorCode {
    code_of(e).unwrap_or(if out_of_space(e) { ErrorCode::WriteFailed } else { fallback })
}

/// Whether `e` was caused by a full disk, a full quota or a file-size limit.
fn out_of_space(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)))
}

/// The class an error was given, if any.
pub fn code_of(e: &anyhow::Error) -> Option<ErrorCode> {
    e.chain().find_map(|c| c.downcast_ref::<Classified>().map(|c| c.code))
}

/// Gives the error of a result its class.
pub trait Classify<T> {
    fn class(self, code: ErrorCode) -> anyhow::Result<T>;
}

impl<T, E: Into<anyhow::Error>> Classify<T> for Result<T, E> {
    fn class(self, code: ErrorCode) -> anyhow::Result<T> {
        self.map_err(|e| classified(e.into(), code))
    }
}

/// Set once the command line asked for `--json`: failures then also print their document on
/// stdout, the signal handlers included.
static JSON: AtomicBool = AtomicBool::new(false);

pub fn set_json(on: bool) {
    JSON.store(on, Ordering::SeqCst);
}

pub fn json() -> bool {
    JSON.load(Ordering::SeqCst)
}

/// The failure document: `{"schema_version": 1, "error": {"code", "message", "exit_status"}}`,
/// pretty-printed as every `--json` document, with a final newline.
pub fn error_document(code: ErrorCode, message: &str, exit_status: u8) -> String {
    let doc = serde_json::json!({
        "schema_version": crate::json::SCHEMA_VERSION,
        "error": {"code": code, "message": message, "exit_status": exit_status},
    });
    serde_json::to_string_pretty(&doc).expect("a JSON value serialises") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::warning::WarningCode;
    use anyhow::{anyhow, Context};

    fn schema() -> serde_json::Value {
        serde_json::from_str(include_str!("../docs/escha-convert.schema.json")).unwrap()
    }

    #[test]
    fn the_schema_lists_every_code_and_this_version() {
        let s = schema();
        let defs = &s["$defs"];
        let warnings: Vec<serde_json::Value> =
            WarningCode::ALL.iter().map(|c| serde_json::to_value(c).unwrap()).collect();
        assert_eq!(defs["warning"]["properties"]["code"]["enum"], serde_json::Value::from(warnings));
        let errors: Vec<serde_json::Value> = ErrorCode::ALL.iter().map(|c| serde_json::to_value(c).unwrap()).collect();
        assert_eq!(defs["error"]["properties"]["error"]["properties"]["code"]["enum"], serde_json::Value::from(errors));
        for kind in ["convert", "verify", "inspect", "merge", "error"] {
            let version = &defs[kind]["properties"]["schema_version"]["const"];
            assert_eq!(version.as_u64(), Some(crate::json::SCHEMA_VERSION), "{kind}");
            assert!(defs[kind]["required"].as_array().unwrap().contains(&"schema_version".into()), "{kind}");
        }
    }

    #[test]
    fn a_class_keeps_the_text_and_the_innermost_class_wins() {
        let e = Err::<(), _>(anyhow!("root cause")).context("reading x").class(ErrorCode::InputRefused).unwrap_err();
        assert_eq!(format!("{e:#}"), "reading x: root cause");
        assert_eq!(e.to_string(), "reading x");
        let e = classified(e.context("converting"), ErrorCode::WriteFailed);
        assert_eq!(format!("{e:#}"), "converting: reading x: root cause");
        assert_eq!(code_of(&e), Some(ErrorCode::InputRefused));
        assert_eq!(code_of(&anyhow!("plain")), None);
    }

    #[test]
    fn a_full_disk_is_write_failed_whatever_step_met_it() {
        let full = || anyhow::Error::new(std::io::Error::from_raw_os_error(libc::ENOSPC)).context("x: cannot create");
        assert_eq!(code_of(&classified(full(), ErrorCode::OutputRefused)), Some(ErrorCode::WriteFailed));
        assert_eq!(class_of(&full(), ErrorCode::Failed), ErrorCode::WriteFailed);
        let denied = anyhow::Error::new(std::io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(class_of(&denied, ErrorCode::OutputRefused), ErrorCode::OutputRefused);
    }

    #[test]
    fn names_are_the_serialized_codes() {
        for code in ErrorCode::ALL {
            assert_eq!(serde_json::to_value(code).unwrap(), code.name());
        }
    }

    #[test]
    fn the_document_carries_code_message_and_status() {
        let doc: serde_json::Value =
            serde_json::from_str(&error_document(ErrorCode::Usage, "bad \"flag\"", 2)).unwrap();
        assert_eq!(
            doc,
            serde_json::json!({"schema_version": 1, "error": {"code": "usage", "message": "bad \"flag\"", "exit_status": 2}})
        );
    }
}
