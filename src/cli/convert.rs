//! `escha-convert convert IN OUT`: its arguments, their options, and the run.

use super::exit::{fail, print_json, print_out, usage, warn, FAILURE, USAGE};
use super::size::parse_size;
use super::values::{BackendArg, BiasArg, Bits, BitsParser, FormatArg, GgufTypeArg, Int8Arg, MtpArg, VocabArg};
use crate::backend::{Backend, BackendKind};
use crate::checkpoint::{locate, Located};
use crate::convert::{convert, render_plan, render_summary, ConvertOptions, FitMemory, PartSpec, VerifyRequest};
use crate::failure::{code_of, ErrorCode};
use crate::layout::{AutoBits, DenseDtype, GgufOptions, GgufType, MlxOptions, OutputFormat};
use crate::quant::affine::{AffineSpec, GROUP_SIZES};
use crate::signals;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::error::ErrorKind;
use clap::{Args, ValueHint};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// Input: an Escha-W2 checkpoint directory, a single .safetensors file, or a Hub id
    /// `org/name[@REVISION]` read from the local Hugging Face cache (never modified; nothing is
    /// downloaded). An existing local path is always a path.
    #[arg(value_name = "IN")]
    pub input: PathBuf,
    /// Output directory (created; written via a hidden staging directory and renamed when complete).
    #[arg(value_name = "OUT")]
    pub output: PathBuf,
    /// Output format.
    #[arg(long, value_enum, ignore_case = true, default_value_t = FormatArg::Bf16)]
    pub format: FormatArg,
    /// What to do with the bias tensors of coded linears.
    #[arg(long, value_enum, ignore_case = true, default_value_t = BiasArg::Auto)]
    pub bias: BiasArg,
    /// MLX affine bits per weight: 2, 3, 4, 5, 6, 8, or auto (each coded linear the fewest bits
    /// that keep the added error within --max-added-error · 2^-K) (`--format mlx`; default 4).
    #[arg(long, value_name = "BITS", value_parser = BitsParser, ignore_case = true)]
    pub bits: Option<Bits>,
    /// With --bits auto or --gguf-type auto: the largest error the quantization may add to a K-bit
    /// coded linear, as a fraction R of its trellis error 2^-K (default 0.5: at most +12% in total).
    #[arg(long, value_name = "R", value_parser = parse_added_error)]
    pub max_added_error: Option<f64>,
    /// With --bits auto or --gguf-type auto: measure each choice's error exactly (about 20 ns more
    /// per weight for MLX, 30 for GGUF) instead of estimating it from the group or block ranges.
    #[arg(long)]
    pub measure_error: bool,
    /// MLX affine group size (`--format mlx`; default 64).
    #[arg(long, value_parser = choice(&GROUP_SIZES))]
    pub group_size: Option<usize>,
    /// How int8 weights are written (`--format mlx` and `gguf`; default exact: MLX 8-bit affine
    /// or GGUF `Q8_0` holding exactly the stored values).
    #[arg(long, value_enum, ignore_case = true)]
    pub int8: Option<Int8Arg>,
    /// GGUF tensor type of everything llama.cpp does not keep in F32 (`--format gguf`; default bf16).
    #[arg(long, value_enum, ignore_case = true)]
    pub gguf_type: Option<GgufTypeArg>,
    /// The tokenizer in the GGUF file (`--format gguf`; default auto).
    #[arg(long, value_enum, ignore_case = true)]
    pub gguf_vocab: Option<VocabArg>,
    /// An importance matrix (llama-imatrix's GGUF file or its legacy .dat) that weighs each column's
    /// error as llama-quantize --imatrix does: the types and bytes it writes (`--format gguf`, a
    /// quantized --gguf-type), and the widths or types --max-size and --fit-memory choose (`--format
    /// gguf` or mlx).
    #[arg(long, value_name = "FILE")]
    pub imatrix: Option<PathBuf>,
    /// The MTP head (Hugging Face layout: `mtp.*` tensors in the main shards).
    #[arg(long, value_enum, ignore_case = true, default_value_t = MtpArg::Auto)]
    pub mtp: MtpArg,
    /// Largest shard, in tensor bytes: e.g. 5GB (or 5G), 500MB, 2GiB, or a number of bytes
    /// (default 5GB; 5GiB, mlx-lm's limit, for --format mlx).
    #[arg(long, value_parser = parse_size)]
    pub max_shard_size: Option<u64>,
    /// The most faithful model that fits: the model files (every `.safetensors` / `.gguf`) total at
    /// most SIZE (e.g. 11GB, 10.5GiB), each quantized tensor's encoding chosen to keep the largest
    /// added error of a coded linear as small as possible (`--format mlx` and `gguf`).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_size: Option<u64>,
    /// The most faithful model a machine with M of memory runs (e.g. 16GB, 24GiB): --max-size M less
    /// the K/V cache of --context tokens and the reserve (the linear-attention state, and --reserve
    /// for the runtime and the OS) (`--format mlx` and `gguf`).
    #[arg(long, value_name = "M", value_parser = parse_size, conflicts_with = "max_size", value_hint = ValueHint::Other)]
    pub fit_memory: Option<u64>,
    /// With --fit-memory: the tokens of context to leave room for (default 8192, or the model's
    /// `max_position_embeddings` when shorter).
    #[arg(long, value_name = "N", requires = "fit_memory", value_hint = ValueHint::Other,
          value_parser = clap::value_parser!(u64).range(1..=u64::from(u32::MAX)))]
    pub context: Option<u64>,
    /// With --fit-memory: memory kept for the runtime, the OS and other programs, in place of the
    /// default allowance (a third of M, at least 1GiB); the linear-attention state is counted
    /// besides it, whatever R is.
    #[arg(long, value_name = "R", requires = "fit_memory", value_parser = parse_reserve, value_hint = ValueHint::Other)]
    pub reserve: Option<u64>,
    /// Convert only output tensors whose name matches GLOB (`*` any run, `?` one character); repeatable.
    #[arg(long, value_name = "GLOB")]
    pub only: Vec<String>,
    /// Worker threads (default: one per core).
    #[arg(short = 'j', long)]
    pub threads: Option<usize>,
    /// Replace OUT when it holds an earlier output of this tool (and nothing else).
    #[arg(long)]
    pub force: bool,
    /// Print the plan (every output tensor, shards, sizes, memory estimate) and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// No progress, no warnings and no summary on stderr (errors are still printed).
    #[arg(short, long)]
    pub quiet: bool,
    /// In the summary, every tensor `--max-size` chose an encoding for (by default: each encoding
    /// with its count and bytes).
    #[arg(short, long)]
    pub verbose: bool,
    /// Print one JSON document on stdout (inputs, outputs, counts, bytes, timing, warnings).
    #[arg(long)]
    pub json: bool,
    /// Who decodes the trellis tiles (`--decoder` is accepted as another name).
    #[arg(long, value_enum, ignore_case = true, alias = "decoder", default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Decode tiles on the GPU through Metal: short for `--backend metal`.
    #[arg(long, conflicts_with = "backend")]
    pub metal: bool,
    /// Write part I of N of the full output (its share of the shards, by bytes, plus every other
    /// file), e.g. `--part 2/3` in a CI job matrix; the parts copied into one directory are the
    /// whole output, byte for byte.
    #[arg(long, value_name = "I/N")]
    pub part: Option<PartSpec>,
    /// Write SHA256SUMS for every file of OUT (with --part: SHA256SUMS.part-I-of-N for that part's
    /// files), in the format `sha256sum -c` reads.
    #[arg(long)]
    pub checksums: bool,
    /// Write no model card (README.md).
    #[arg(long)]
    pub no_card: bool,
    /// Prove the decode against the unquantized base model before OUT is moved into place: a
    /// failed check writes nothing and fails the run; a passing one is recorded in the model card. A
    /// directory, a .safetensors file or a Hub id `org/name[@REVISION]` in the local cache.
    #[arg(long, value_name = "BASE")]
    pub verify_base: Option<PathBuf>,
    /// With --verify-base: check N evenly spread 128×128 blocks per tensor (default 4).
    #[arg(long, value_name = "N", requires = "verify_base", conflicts_with = "verify_full",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub verify_sample: Option<u64>,
    /// With --verify-base: check every block of every tensor.
    #[arg(long, requires = "verify_base")]
    pub verify_full: bool,
}

/// Blocks per tensor `--verify-base` checks unless told otherwise.
const VERIFY_SAMPLE: usize = 4;

/// `--reserve`: a size, or none at all.
fn parse_reserve(s: &str) -> Result<u64, String> {
    let number = s.trim().trim_end_matches(|c: char| c.is_ascii_alphabetic());
    if number.parse::<f64>() == Ok(0.0) {
        return Ok(0);
    }
    parse_size(s)
}

/// `--max-added-error`: a positive, finite fraction.
fn parse_added_error(s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|r| r.is_finite() && *r > 0.0)
        .ok_or_else(|| format!("{s:?}: expected a positive number, e.g. 0.5"))
}

/// A value parser that accepts exactly `values` and lists them in `--help` and in errors.
fn choice<T: Copy + ToString + std::str::FromStr + Send + Sync + Clone + 'static>(
    values: &[T],
) -> impl TypedValueParser<Value = T> {
    let names: Vec<String> = values.iter().map(T::to_string).collect();
    PossibleValuesParser::new(names).map(|s| s.parse().ok().expect("a listed value parses"))
}

/// Why arguments make no run: a combination clap cannot express (a usage error, exit 2), or an
/// IN or BASE that cannot be located (a Hub id the cache does not hold, exit 1).
pub enum ArgsError {
    Usage(clap::Error),
    Input(anyhow::Error),
}

impl std::fmt::Display for ArgsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArgsError::Usage(e) => e.fmt(f),
            ArgsError::Input(e) => e.fmt(f),
        }
    }
}

/// Everything a conversion run needs, from the arguments.
pub struct ConvertRun {
    pub options: ConvertOptions,
    pub backend: BackendKind,
    pub json: bool,
    pub quiet: bool,
    pub verbose: bool,
}

impl TryFrom<ConvertArgs> for ConvertRun {
    type Error = ArgsError;

    fn try_from(a: ConvertArgs) -> Result<Self, ArgsError> {
        ConvertRun::from_args(a, locate)
    }
}

impl ConvertRun {
    /// The run `a` asks for, IN and BASE found by `locate`.
    pub(super) fn from_args(
        a: ConvertArgs,
        locate: impl Fn(&Path) -> anyhow::Result<Located>,
    ) -> Result<Self, ArgsError> {
        let format = checked_format(&a).map_err(ArgsError::Usage)?;
        let input = match locate(&a.input) {
            Ok(found) if found.hub.is_some() || std::fs::symlink_metadata(&found.path).is_ok() => found,
            other => match swapped(&a.input, &a.output) {
                Some(e) => return Err(ArgsError::Input(e)),
                None => other.map_err(ArgsError::Input)?,
            },
        };
        let base = a.verify_base.as_deref().map(locate).transpose().map_err(ArgsError::Input)?;
        let options = ConvertOptions {
            hub: input.hub,
            format,
            bias: a.bias.into(),
            max_shard_size: a.max_shard_size,
            max_size: a.max_size,
            fit_memory: a.fit_memory.map(|memory| FitMemory { memory, context: a.context, reserve: a.reserve }),
            imatrix: a.imatrix,
            only: a.only,
            part: a.part,
            checksums: a.checksums,
            card: !a.no_card,
            verify: base.map(|base| VerifyRequest {
                base: base.path,
                hub: base.hub,
                sample: (!a.verify_full).then(|| a.verify_sample.map_or(VERIFY_SAMPLE, |n| n as usize)),
            }),
            threads: a.threads,
            force: a.force,
            dry_run: a.dry_run,
            progress: !a.quiet && !a.json,
            ..ConvertOptions::new(input.path, a.output)
        };
        Ok(ConvertRun {
            options,
            backend: if a.metal { BackendKind::Metal } else { a.backend.into() },
            json: a.json,
            quiet: a.quiet,
            verbose: a.verbose,
        })
    }
}

/// The error for IN and OUT given the wrong way round (`escha-convert new-dir checkpoint`): IN is
/// not there, and OUT is an existing input checkpoint, not an earlier output of this tool.
fn swapped(input: &Path, output: &Path) -> Option<anyhow::Error> {
    if !looks_like_input(output) {
        return None;
    }
    let word = |p: &Path| crate::text::shell_word(&p.to_string_lossy()).into_owned();
    Some(anyhow::anyhow!(
        "{}: no such file or directory, and OUT {} is an existing checkpoint: the arguments look swapped (IN comes \
         first: escha-convert {} {})",
        input.display(),
        output.display(),
        word(output),
        word(input)
    ))
}

/// A `.safetensors` file, or a directory with `config.json` and `.safetensors` files and no marker
/// of this tool (an earlier output, which `--force` may replace, is a fine OUT).
fn looks_like_input(path: &Path) -> bool {
    /// Entries of OUT looked at, at most.
    const MAX_ENTRIES: usize = 10_000;
    let Ok(meta) = std::fs::metadata(path) else { return false };
    if meta.is_file() {
        return path.extension().is_some_and(|e| e == "safetensors");
    }
    let has = |name: &str| std::fs::symlink_metadata(path.join(name)).is_ok();
    meta.is_dir()
        && has("config.json")
        && !has(crate::output::MARKER_FILE)
        && std::fs::read_dir(path).is_ok_and(|entries| {
            entries
                .take(MAX_ENTRIES)
                .filter_map(Result::ok)
                .any(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        })
}

/// The output format the flags ask for, or the usage error of a combination clap cannot express.
fn checked_format(a: &ConvertArgs) -> Result<OutputFormat, clap::Error> {
    let usage = |msg: String| clap::Error::raw(ErrorKind::ArgumentConflict, msg + "\n");
    let fitted = a.max_size.is_some() || a.fit_memory.is_some();
    let budget = if a.fit_memory.is_some() { "--fit-memory" } else { "--max-size" };
    Ok(match a.format {
        FormatArg::Bf16 | FormatArg::F16 | FormatArg::Exl3
            if a.bits.is_some() || a.group_size.is_some() || a.int8.is_some() =>
        {
            return Err(usage(
                "--bits, --group-size and --int8 apply to --format mlx (and --int8 to gguf) only".into(),
            ));
        }
        FormatArg::Gguf if a.bits.is_some() || a.group_size.is_some() => {
            return Err(usage("--bits and --group-size apply to --format mlx only; GGUF types are --gguf-type".into()));
        }
        f if f != FormatArg::Gguf && (a.gguf_type.is_some() || a.gguf_vocab.is_some()) => {
            return Err(usage("--gguf-type and --gguf-vocab apply to --format gguf only".into()));
        }
        f if f != FormatArg::Gguf && f != FormatArg::Mlx && a.imatrix.is_some() => {
            return Err(usage("--imatrix applies to --format gguf and mlx only".into()));
        }
        FormatArg::Mlx if a.imatrix.is_some() && !fitted => {
            return Err(usage(
                "--imatrix with --format mlx weighs the errors the size budget chooses widths by (MLX's affine \
                 quantization takes no matrix, and --bits, fixed or auto, chooses nothing by it): add --max-size SIZE \
                 or --fit-memory M"
                    .into(),
            ));
        }
        FormatArg::Gguf
            if a.imatrix.is_some()
                && !fitted
                && a.gguf_type.is_none_or(|t| !GgufType::from(t).is_quantized_by_llama()) =>
        {
            return Err(usage(
                "--imatrix weighs the types llama-quantize makes: give --gguf-type q2_k, q3_k_s, q3_k_m, q3_k_l, q4_k, \
                 q4_k_m, q5_k, q5_k_m, q6_k, iq4_xs, iq2_xxs, iq2_xs, iq2_s, iq2_m, iq3_xxs, iq3_xs, iq3_s, iq3_m or \
                 q2_k_s, or --max-size or --fit-memory (not auto, which does not weigh by it yet)"
                    .into(),
            ));
        }
        FormatArg::Bf16 | FormatArg::F16 | FormatArg::Exl3 if fitted => {
            return Err(usage(format!(
                "{budget} applies to --format mlx and gguf only: bf16, f16 and exl3 store every weight at one fixed \
                 size, so there is nothing to choose"
            )));
        }
        _ if fitted
            && (a.bits.is_some()
                || a.group_size.is_some()
                || a.gguf_type.is_some()
                || a.max_added_error.is_some()
                || a.measure_error) =>
        {
            let other = [
                (a.bits.is_some(), "--bits"),
                (a.group_size.is_some(), "--group-size"),
                (a.gguf_type.is_some(), "--gguf-type"),
                (a.max_added_error.is_some(), "--max-added-error"),
                (a.measure_error, "--measure-error"),
            ]
            .into_iter()
            .find_map(|(set, flag)| set.then_some(flag))
            .unwrap_or_default();
            return Err(usage(format!(
                "{budget} and {other} conflict: {budget} chooses every quantized tensor's encoding to fit a size; \
                 give one or the other"
            )));
        }
        _ if a.bits != Some(Bits::Auto)
            && a.gguf_type != Some(GgufTypeArg::Auto)
            && (a.max_added_error.is_some() || a.measure_error) =>
        {
            return Err(usage(
                "--max-added-error and --measure-error apply to --bits auto and --gguf-type auto only".into(),
            ));
        }
        FormatArg::Bf16 => OutputFormat::Dense { dtype: DenseDtype::Bf16, mtp: a.mtp.into() },
        FormatArg::F16 => OutputFormat::Dense { dtype: DenseDtype::F16, mtp: a.mtp.into() },
        FormatArg::Exl3 => OutputFormat::Exl3 { mtp: a.mtp.into() },
        FormatArg::Mlx if a.mtp == MtpArg::Keep => {
            return Err(usage("--mtp keep: the MLX layout carries no MTP head (mlx-lm has none)".into()));
        }
        FormatArg::Mlx => {
            let default = MlxOptions::DEFAULT;
            let fixed = match a.bits {
                Some(Bits::Fixed(b)) => b,
                // Layers that are not coded linears (int8 with --int8 requant, plain weights).
                Some(Bits::Auto) | None => default.spec.bits,
            };
            let spec = AffineSpec::new(fixed, a.group_size.unwrap_or(default.spec.group_size)).map_err(usage)?;
            let auto = (a.bits == Some(Bits::Auto)).then(|| auto_budget(a));
            OutputFormat::Mlx(MlxOptions { spec, int8: a.int8.map_or(default.int8, Into::into), auto, fitted })
        }
        FormatArg::Gguf => {
            let default = GgufOptions::DEFAULT;
            // --max-size chooses per tensor, as auto does: the file type follows the choices.
            let ty = if fitted { GgufType::Auto } else { a.gguf_type.map_or(default.ty, Into::into) };
            OutputFormat::Gguf(GgufOptions {
                ty,
                int8: a.int8.map_or(default.int8, Into::into),
                vocab: a.gguf_vocab.map_or(default.vocab, |v| v == VocabArg::Auto),
                mtp: a.mtp.into(),
                auto: (ty == GgufType::Auto && !fitted).then(|| auto_budget(a)),
                fitted,
                imatrix: a.imatrix.is_some(),
            })
        }
    })
}

/// The budget of `--bits auto` or `--gguf-type auto`.
fn auto_budget(a: &ConvertArgs) -> AutoBits {
    AutoBits { max_added_error: a.max_added_error.unwrap_or(AutoBits::DEFAULT.max_added_error), exact: a.measure_error }
}

pub fn run(args: ConvertArgs) -> ExitCode {
    let run = match ConvertRun::try_from(args) {
        Ok(run) => run,
        Err(ArgsError::Usage(e)) => return usage(&e),
        Err(ArgsError::Input(e)) => return fail(&e, ErrorCode::InputRefused, FAILURE),
    };
    signals::install();
    let backend = match Backend::new(run.backend) {
        Ok(b) => b,
        Err(e) => return fail(&e.into(), ErrorCode::BackendUnavailable, FAILURE),
    };
    let report = match convert(&run.options, backend.decoder()) {
        Ok(r) => r,
        // A value the model cannot take (`--context` past its positions, a memory that holds nothing).
        Err(e) if code_of(&e) == Some(ErrorCode::Usage) => return fail(&e, ErrorCode::Usage, USAGE),
        Err(e) => return fail(&e, ErrorCode::Failed, FAILURE),
    };
    if !run.quiet {
        report.warnings.iter().for_each(|w| warn(&w.message));
    }
    if run.json {
        return print_json(&report);
    }
    if run.options.dry_run {
        return print_out(&render_plan(&report));
    }
    if !run.quiet {
        let _ = write!(std::io::stderr(), "{}", render_summary(&report, run.verbose));
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::super::{Cli, Command};
    use super::*;
    use crate::checkpoint::HubSource;
    use crate::layout::{BiasMode, Int8Mode, MtpMode};
    use crate::quant::affine::BITS;
    use clap::{Parser, ValueEnum};
    use proptest::prelude::*;
    use std::ffi::OsString;

    /// The words a POSIX shell makes of `line`: unquoted runs, `'…'` and `\x` (enough for what
    /// `shaping_flags` writes).
    fn shell_words(line: &str) -> Vec<String> {
        let (mut words, mut word, mut in_word) = (Vec::new(), String::new(), false);
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                ' ' if in_word => {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
                ' ' => {}
                '\'' => {
                    in_word = true;
                    word.extend(chars.by_ref().take_while(|&q| q != '\''));
                }
                '\\' => {
                    in_word = true;
                    word.extend(chars.next());
                }
                c => {
                    in_word = true;
                    word.push(c);
                }
            }
        }
        if in_word {
            words.push(word);
        }
        words
    }

    fn hub() -> impl Strategy<Value = HubSource> {
        ("[a-z0-9]{1,8}/[a-zA-Z0-9._-]{1,12}", proptest::option::of("[a-z0-9]{1,8}"), "[0-9a-f]{40}")
            .prop_map(|(id, revision, commit)| HubSource { id, revision, commit })
    }

    /// IN or BASE as located: a directory (any name a directory can have) or a Hub snapshot.
    fn located() -> impl Strategy<Value = Located> {
        let dir = prop_oneof!["[-a-z0-9 '\"\\\\=.@*]{1,10}", "[^/\u{0}]{1,10}"]
            .prop_filter("a name", |n| n != "." && n != "..")
            .prop_map(|name| Located { path: Path::new("/nowhere/bases").join(name), hub: None });
        let snapshot = hub().prop_map(|h| Located {
            path: PathBuf::from(format!("/hub/models--{}/snapshots/{}", h.id.replace('/', "--"), h.commit)),
            hub: Some(h),
        });
        prop_oneof![dir, snapshot]
    }

    fn budget() -> impl Strategy<Value = AutoBits> {
        (f64::MIN_POSITIVE..1e300, any::<bool>())
            .prop_map(|(max_added_error, exact)| AutoBits { max_added_error, exact })
    }

    fn int8() -> impl Strategy<Value = Int8Mode> {
        proptest::sample::select(Int8Arg::value_variants()).prop_map(Int8Mode::from)
    }

    fn mtp() -> impl Strategy<Value = MtpMode> {
        proptest::sample::select(MtpArg::value_variants()).prop_map(MtpMode::from)
    }

    /// Every output format the command line can ask for.
    fn format() -> impl Strategy<Value = OutputFormat> {
        let dense = (any::<bool>(), mtp()).prop_map(|(bf16, mtp)| OutputFormat::Dense {
            dtype: if bf16 { DenseDtype::Bf16 } else { DenseDtype::F16 },
            mtp,
        });
        let exl3 = mtp().prop_map(|mtp| OutputFormat::Exl3 { mtp });
        let widths = proptest::sample::select(BITS.to_vec());
        let mlx = (widths, proptest::sample::select(GROUP_SIZES.to_vec()), int8(), proptest::option::of(budget()))
            .prop_map(|(bits, group_size, int8, auto)| {
                // Under --bits auto the fixed width (of layers that are not coded linears) is the default.
                let bits = if auto.is_some() { MlxOptions::DEFAULT.spec.bits } else { bits };
                OutputFormat::Mlx(MlxOptions { spec: AffineSpec { bits, group_size }, int8, auto, fitted: false })
            });
        let types = proptest::sample::select(GgufTypeArg::value_variants()).prop_map(GgufType::from);
        let gguf = (types, int8(), any::<bool>(), mtp(), budget(), any::<bool>()).prop_map(
            |(ty, int8, vocab, mtp, budget, imatrix)| {
                OutputFormat::Gguf(GgufOptions {
                    ty,
                    int8,
                    vocab,
                    mtp,
                    auto: (ty == GgufType::Auto).then_some(budget),
                    fitted: false,
                    imatrix: imatrix && ty.is_quantized_by_llama(),
                })
            },
        );
        prop_oneof![dense, exl3, mlx, gguf]
    }

    /// `--fit-memory M [--context N] [--reserve R]`.
    fn fit_memory() -> impl Strategy<Value = FitMemory> {
        let context = proptest::option::of(1u64..=u64::from(u32::MAX));
        let reserve = proptest::option::of(prop_oneof![Just(0u64), 1u64..=1 << 53]);
        (1u64..=1 << 53, context, reserve).prop_map(|(memory, context, reserve)| FitMemory { memory, context, reserve })
    }

    /// Options the command line can make, with every flag that shapes the output drawn.
    fn options() -> impl Strategy<Value = (ConvertOptions, Located, Option<Located>)> {
        // Mostly the characters a shell or clap treats specially; any character now and then.
        let glob = prop_oneof!["[-a-z0-9 '\"\\\\=.*?]{0,10}", "[^\u{0}]{0,10}"];
        let verify = proptest::option::of((located(), proptest::option::of(1usize..100_000)));
        (
            located(),
            format(),
            prop_oneof![Just(BiasMode::Auto), Just(BiasMode::Drop), Just(BiasMode::Keep)],
            // Sizes are read through f64: every whole number up to 2^53 is one.
            proptest::option::of(1u64..=1 << 53),
            proptest::collection::vec(glob, 0..3),
            any::<bool>(),
            verify,
            proptest::option::of(1u64..=1 << 53),
            proptest::option::of(fit_memory()),
            any::<bool>(),
        )
            .prop_map(
                |(input, format, bias, max_shard_size, only, checksums, verify, max_size, fit_memory, weighed)| {
                    let base = verify.as_ref().map(|(base, _)| base.clone());
                    // --max-size (or else --fit-memory) chooses every width (MLX) or type (GGUF) itself.
                    let fit_memory = fit_memory.filter(|_| max_size.is_none());
                    let fitted = max_size.is_some() || fit_memory.is_some();
                    let (format, max_size, fit_memory) = match format {
                        OutputFormat::Mlx(o) if fitted => (
                            OutputFormat::Mlx(MlxOptions { int8: o.int8, fitted: true, ..MlxOptions::DEFAULT }),
                            max_size,
                            fit_memory,
                        ),
                        OutputFormat::Gguf(o) if fitted => (
                            OutputFormat::Gguf(GgufOptions {
                                ty: GgufType::Auto,
                                auto: None,
                                fitted: true,
                                imatrix: false,
                                ..o
                            }),
                            max_size,
                            fit_memory,
                        ),
                        format => (format, None, None),
                    };
                    // Recorded by its file name, which names it again here.
                    let imatrix = match format {
                        OutputFormat::Gguf(GgufOptions { imatrix: true, .. }) => Some(PathBuf::from("matrix 'x'.gguf")),
                        // An MLX size budget weighs its widths by one.
                        OutputFormat::Mlx(MlxOptions { fitted: true, .. }) if weighed => {
                            Some(PathBuf::from("matrix 'x'.gguf"))
                        }
                        _ => None,
                    };
                    let options = ConvertOptions {
                        hub: input.hub.clone(),
                        format,
                        bias,
                        max_shard_size,
                        max_size,
                        fit_memory,
                        imatrix,
                        only,
                        checksums,
                        verify: verify.map(|(base, sample)| VerifyRequest { base: base.path, hub: base.hub, sample }),
                        ..ConvertOptions::new(input.path.clone(), PathBuf::from("OUT"))
                    };
                    (options, input, base)
                },
            )
    }

    proptest! {
        /// The flags an output records, given to the command line again, ask for the same options:
        /// the model card's command makes the same output, and the marker's fingerprint names it.
        #[test]
        fn shaping_flags_parse_back_to_the_same_options((options, input, base) in options()) {
            let flags = options.shaping_flags();
            let mut args: Vec<OsString> = ["escha-convert", "convert", "IN", "OUT"].map(OsString::from).to_vec();
            args.extend(shell_words(&flags).into_iter().map(OsString::from));
            let cli = Cli::try_parse_from(&args).map_err(|e| TestCaseError::fail(format!("{flags}: {e}")))?;
            let Command::Convert(a) = cli.command else { panic!("convert") };
            // BASE is recorded by name: the name must come back, and locates where it was.
            let base_name = base.as_ref().map(|b| crate::card::source_arg(&b.path, b.hub.as_ref()));
            let locate = |p: &Path| match p.as_os_str().to_str() {
                Some("IN") => Ok(input.clone()),
                name if name.is_some() && name == base_name.as_deref() => Ok(base.clone().expect("a base")),
                _ => Err(anyhow::anyhow!("{} is neither IN nor BASE", p.display())),
            };
            let run = ConvertRun::from_args(a, locate).map_err(|e| TestCaseError::fail(format!("{flags}: {e}")))?;
            // The command line draws progress unless told not to.
            prop_assert_eq!(run.options, ConvertOptions { progress: true, ..options }, "{}", flags);
        }
    }

    #[test]
    fn shell_words_unquote_as_a_shell_does() {
        assert_eq!(
            shell_words("--only 'it'\\''s' --x  y --only='-a b'"),
            ["--only", "it's", "--x", "y", "--only=-a b"]
        );
        assert_eq!(shell_words("--only ''"), ["--only", ""]);
    }
}
