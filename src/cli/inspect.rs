//! `escha-convert inspect IN`.

use super::exit::{fail, print_json, print_out, FAILURE};
use crate::checkpoint::locate;
use crate::failure::ErrorCode;
use crate::inspect::{inspect, render, InspectReport};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// An Escha-W2 checkpoint directory, a single .safetensors file, or a Hub id
    /// `org/name[@REVISION]` read from the local Hugging Face cache (nothing is downloaded).
    #[arg(value_name = "IN")]
    pub input: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &InspectArgs) -> ExitCode {
    let input = match locate(&a.input) {
        Ok(l) => l,
        Err(e) => return fail(&e, ErrorCode::InputRefused, FAILURE),
    };
    match inspect(&input.path).map(|r| InspectReport { hub: input.hub, ..r }) {
        Ok(r) if a.json => print_json(&r),
        Ok(r) => print_out(&render(&r)),
        Err(e) => fail(&e, ErrorCode::InputRefused, FAILURE),
    }
}
