//! `escha-convert merge DIR`.

use super::exit::{fail, print_json, print_out, FAILURE};
use crate::failure::ErrorCode;
use crate::merge::merge;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct MergeArgs {
    /// The directory the parts (`--part I/N --checksums`) were copied into.
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
    /// Print one JSON document instead of a line.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &MergeArgs) -> ExitCode {
    crate::signals::install();
    match merge(&a.dir) {
        Ok(r) if a.json => print_json(&r),
        Ok(r) => print_out(&format!(
            "{}: {} parts merged; {} files checked and listed in SHA256SUMS\n",
            r.dir, r.parts, r.files
        )),
        // The parts are merge's input: a missing, extra or damaged file refuses DIR.
        Err(e) => fail(&e, ErrorCode::InputRefused, FAILURE),
    }
}
