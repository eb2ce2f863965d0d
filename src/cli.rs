//! Command-line definitions (clap), separate from the work they trigger.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "escha-convert",
    version,
    about = "Convert Escha-W2 (EXL3 trellis) checkpoints to dense bf16/f16 safetensors",
    long_about = "Convert Escha-W2 (EXL3 trellis) checkpoints to dense bf16/f16 safetensors in Hugging Face \
layout.\n\n`escha-convert IN OUT` is short for `escha-convert convert IN OUT`.\n\nExit codes: 0 success, \
1 failure (bad input, write error), 2 usage error, 130 interrupted."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Decode every tensor and write a dense checkpoint (the default command).
    Convert(ConvertArgs),
    /// Describe a checkpoint: architecture, coded projections, bits per weight, problems.
    Inspect(InspectArgs),
    /// Check a decode against the unquantized base model (exit 0 pass, 1 fail, 2 usage).
    Verify(VerifyArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Dense bfloat16, Hugging Face layout.
    Bf16,
    /// Dense float16, Hugging Face layout.
    F16,
    /// MLX layout, affine-quantized (`--bits`, `--group-size`, `--int8`), as `mlx_lm.convert -q`
    /// writes it; mlx-lm loads it directly.
    Mlx,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Int8Choice {
    /// Repack int8 weights exactly as 8-bit affine (F32 scales): no new rounding.
    Exact,
    /// Quantize their bf16 dequantization at `--bits`/`--group-size` like every other layer.
    Requant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BiasMode {
    /// Leave coded linears' bias tensors out (the reference serving runtime never applies them).
    Drop,
    /// Write them as `<module>.bias`.
    Keep,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// The fastest CPU decoder; the GPU only when asked for.
    Auto,
    /// The fastest decoder this CPU supports (bit-identical to the scalar one).
    Cpu,
    /// The scalar reference decoder.
    Scalar,
    /// The Metal GPU kernel (macOS, a build with `--features metal`; bit-identical too).
    Metal,
}

#[derive(Args, Debug)]
#[command(after_help = "Norms are written exactly as stored: Hugging Face Qwen3.5 norms are zero-centred and \
HF runtimes (transformers, mlx-lm loading HF layout) add the 1 themselves. --format mlx folds the 1 in \
(mlx-lm's own layout), quantizes each coded weight from its bf16 rounding (byte-identical to \
`mlx_lm.convert -q` run on the bf16 export) and writes no MTP head.")]
pub struct ConvertArgs {
    /// Input: an Escha-W2 checkpoint directory or a single .safetensors file (never modified).
    #[arg(value_name = "IN")]
    pub input: PathBuf,
    /// Output directory (created; written via a hidden staging directory and renamed when complete).
    #[arg(value_name = "OUT")]
    pub output: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Bf16)]
    pub format: Format,
    /// What to do with the bias tensors of coded linears.
    #[arg(long, value_enum, default_value_t = BiasMode::Drop)]
    pub bias: BiasMode,
    /// MLX affine bits per weight (`--format mlx`; default 4).
    #[arg(long, value_parser = ["2", "3", "4", "5", "6", "8"])]
    pub bits: Option<String>,
    /// MLX affine group size (`--format mlx`; default 64).
    #[arg(long, value_parser = ["32", "64", "128"])]
    pub group_size: Option<String>,
    /// How int8 weights become MLX (`--format mlx`; default exact).
    #[arg(long, value_enum)]
    pub int8: Option<Int8Choice>,
    /// Largest shard, in tensor bytes: e.g. 5GB, 500MB, 2GiB, or a number of bytes (default 5GB;
    /// 5GiB, mlx-lm's limit, for --format mlx).
    #[arg(long, value_parser = parse_size)]
    pub max_shard_size: Option<u64>,
    /// Convert only output tensors whose name matches GLOB (`*` any run, `?` one character); repeatable.
    #[arg(long, value_name = "GLOB")]
    pub only: Vec<String>,
    /// Worker threads (default: one per core).
    #[arg(short = 'j', long)]
    pub threads: Option<usize>,
    /// Replace OUT if it exists and is not empty.
    #[arg(long)]
    pub force: bool,
    /// Print the plan (every output tensor, shards, sizes, memory estimate) and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// No progress and no summary on stderr.
    #[arg(short, long)]
    pub quiet: bool,
    /// Print one JSON document on stdout (inputs, outputs, counts, bytes, timing, warnings).
    #[arg(long)]
    pub json: bool,
    /// Who decodes the trellis tiles (`--decoder` is accepted as another name).
    #[arg(long, value_enum, alias = "decoder", default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// Decode tiles on the GPU through Metal: short for `--backend metal`.
    #[arg(long, conflicts_with = "backend")]
    pub metal: bool,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// An Escha-W2 checkpoint directory or a single .safetensors file.
    #[arg(value_name = "IN")]
    pub input: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The Escha-W2 checkpoint (directory or .safetensors file).
    #[arg(value_name = "IN")]
    pub input: PathBuf,
    /// The unquantized base model: HF layout (bf16/f16/f32 or fp8 e4m3 with weight_scale_inv) or
    /// MLX layout bf16; a directory or a .safetensors file.
    #[arg(long, value_name = "BASE")]
    pub base: PathBuf,
    /// Check only tensors whose output name matches GLOB; repeatable.
    #[arg(long, value_name = "GLOB")]
    pub only: Vec<String>,
    /// Check N evenly spread 128-row output blocks per tensor instead of whole tensors.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub sample: Option<u64>,
    /// Fail when the ratio of the relative error to the Shannon bound exceeds R.
    #[arg(long, value_name = "R", default_value_t = 2.0)]
    pub max_ratio: f64,
    /// Fail when the element-wise correlation is below C (default 0.8 for K≤2, 0.9 for K≥3).
    #[arg(long, value_name = "C")]
    pub min_corr: Option<f64>,
    /// Worker threads (default: one per core).
    #[arg(short = 'j', long)]
    pub threads: Option<usize>,
    /// Print one JSON document with every figure instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the report as one self-contained HTML page (charts, sortable tables) to FILE,
    /// whether the checks pass or not.
    #[arg(long, value_name = "FILE", value_parser = parse_html_dest)]
    pub html: Option<PathBuf>,
}

/// `--html FILE`: refused at once when FILE could not be written at the end of a long check.
fn parse_html_dest(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    if p.file_name().is_none() || p.is_dir() {
        return Err(format!("{s}: not a file name"));
    }
    if !dir.is_dir() {
        return Err(format!("{}: no such directory", dir.display()));
    }
    Ok(p)
}

/// Parses "5GB" (10^9), "2GiB" (2^30), "500MB", "64KiB" or a plain byte count.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        other => return Err(format!("unknown size unit {other:?} in {s:?}")),
    };
    let v = n * mult;
    if v < 1.0 {
        return Err(format!("size {s:?} must be at least one byte"));
    }
    Ok(v as u64)
}

/// Rewrites `escha-convert IN OUT …` to `escha-convert convert IN OUT …`.
pub fn with_default_command(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    const KNOWN: &[&str] = &["convert", "inspect", "verify", "help"];
    if let Some(first) = args.get(1).and_then(|a| a.to_str()) {
        if !first.starts_with('-') && !KNOWN.contains(&first) {
            args.insert(1, "convert".into());
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("5GB"), Ok(5_000_000_000));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1.5MB"), Ok(1_500_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("5XB").is_err());
        assert!(parse_size("0").is_err());
    }
}
