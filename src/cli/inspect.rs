//! `escha-convert inspect IN`.

use super::exit::{fail, print_json, print_out, FAILURE};
use crate::failure::ErrorCode;
use crate::inspect::{inspect, render};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// An Escha-W2 checkpoint directory or a single .safetensors file.
    #[arg(value_name = "IN")]
    pub input: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &InspectArgs) -> ExitCode {
    match inspect(&a.input) {
        Ok(r) if a.json => print_json(&r),
        Ok(r) => print_out(&render(&r)),
        Err(e) => fail(&e, ErrorCode::InputRefused, FAILURE),
    }
}
