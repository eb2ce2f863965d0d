//! What the user asks a conversion for.

use crate::layout::OutputFormat;
use std::path::PathBuf;

#[derive(Clone, Debug)]
pub struct ConvertOptions {
    pub input: PathBuf,
    pub output: PathBuf,
    pub format: OutputFormat,
    /// Write the bias tensors of coded linears (dropped by default).
    pub keep_bias: bool,
    /// Largest shard in tensor bytes; the format's default when `None`.
    pub max_shard_size: Option<u64>,
    /// `--only` globs over output names (empty: everything).
    pub only: Vec<String>,
    pub threads: Option<usize>,
    pub force: bool,
    pub dry_run: bool,
    pub progress: bool,
}
