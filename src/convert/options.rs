//! What the user asks a conversion for.

use crate::checkpoint::HubSource;
use crate::layout::OutputFormat;
use crate::plan::PartSpec;
use std::path::PathBuf;

#[derive(Clone, Debug)]
pub struct ConvertOptions {
    /// IN: a directory or file (a Hub id's cache snapshot once located).
    pub input: PathBuf,
    /// The Hub id IN was given as, and the commit it resolved to.
    pub hub: Option<HubSource>,
    pub output: PathBuf,
    pub format: OutputFormat,
    /// Write the bias tensors of coded linears (dropped by default).
    pub keep_bias: bool,
    /// Largest shard in tensor bytes; the format's default when `None`.
    pub max_shard_size: Option<u64>,
    /// `--only` globs over output names (empty: everything).
    pub only: Vec<String>,
    /// Write only this part's shards of the full plan (and every file around them).
    pub part: Option<PartSpec>,
    /// Write `SHA256SUMS` (a part's own `SHA256SUMS.part-I-of-N`).
    pub checksums: bool,
    /// The options that shape the output bytes, as command-line flags with defaults spelled out:
    /// the model card records them and the marker fingerprints them.
    pub shaping_flags: String,
    /// Write the model card (`README.md`).
    pub card: bool,
    /// Prove the decode against a base model before the output is moved into place.
    pub verify: Option<VerifyRequest>,
    pub threads: Option<usize>,
    pub force: bool,
    pub dry_run: bool,
    pub progress: bool,
}

/// `--verify-base BASE`: the base model, and how many 128×128 blocks per tensor to check
/// (`None`: every block).
#[derive(Clone, Debug)]
pub struct VerifyRequest {
    pub base: PathBuf,
    /// The Hub id BASE was given as, and the commit it resolved to.
    pub hub: Option<HubSource>,
    pub sample: Option<usize>,
}
