//! What the user asks a conversion for, and the flags that say it again in the output's marker and
//! model card.

use super::memory::{FitMemory, MemoryBudget};
use crate::checkpoint::HubSource;
use crate::layout::{BiasMode, DenseDtype, FlagWords, MtpMode, OutputFormat};
use crate::plan::PartSpec;
use crate::text::shell_word;
use std::path::PathBuf;

#[derive(Clone, Debug, PartialEq)]
pub struct ConvertOptions {
    /// IN: a directory or file (a Hub id's cache snapshot once located).
    pub input: PathBuf,
    /// The Hub id IN was given as, and the commit it resolved to.
    pub hub: Option<HubSource>,
    pub output: PathBuf,
    pub format: OutputFormat,
    /// What becomes of the bias tensors of coded linears (by default, what the source's runtime
    /// does with them).
    pub bias: BiasMode,
    /// Largest shard in tensor bytes; the format's default when `None`.
    pub max_shard_size: Option<u64>,
    /// `--max-size`: the model files' total in bytes; every quantized tensor's encoding is chosen
    /// to fit it.
    pub max_size: Option<u64>,
    /// `--fit-memory`: `max_size` from a machine's memory, less the client's caches and a reserve.
    pub fit_memory: Option<FitMemory>,
    /// `--imatrix`: the importance matrix the block types, and the size budget's choice, weigh each
    /// column's error by.
    pub imatrix: Option<PathBuf>,
    /// `--only` globs over output names (empty: everything).
    pub only: Vec<String>,
    /// Write only this part's shards of the full plan (and every file around them).
    pub part: Option<PartSpec>,
    /// Write `SHA256SUMS` (a part's own `SHA256SUMS.part-I-of-N`).
    pub checksums: bool,
    /// Write the model card (`README.md`).
    pub card: bool,
    /// Prove the decode against a base model before the output is moved into place.
    pub verify: Option<VerifyRequest>,
    pub threads: Option<usize>,
    pub force: bool,
    pub dry_run: bool,
    pub progress: bool,
}

impl ConvertOptions {
    /// `escha-convert convert IN OUT` with no other flag (dense bf16, a model card, one thread per
    /// core), except that no progress is drawn: the command line turns it on.
    pub fn new(input: PathBuf, output: PathBuf) -> ConvertOptions {
        ConvertOptions {
            input,
            hub: None,
            output,
            format: OutputFormat::Dense { dtype: DenseDtype::Bf16, mtp: MtpMode::Auto },
            bias: BiasMode::Auto,
            max_shard_size: None,
            max_size: None,
            fit_memory: None,
            imatrix: None,
            only: Vec::new(),
            part: None,
            checksums: false,
            card: true,
            verify: None,
            threads: None,
            force: false,
            dry_run: false,
            progress: false,
        }
    }

    /// The options that shape the output bytes, as the command-line flags that ask for them, every
    /// default spelled out: the model card records them and the marker fingerprints them (with
    /// the format's name), so the text of an option set never changes. BASE is named by its
    /// directory name or as `org/name@<commit>` (a card names no path of the machine that ran the
    /// job). How the run went (-j, --quiet, --json, --force, --backend, --part) changes no byte
    /// and is left out. The format and its own options are spelled by its layout
    /// ([`Layout::shaping_flags`](crate::layout::Layout::shaping_flags)), so the engine names none.
    pub fn shaping_flags(&self) -> String {
        let mut w = FlagWords::default();
        self.format.layout().shaping_flags(&mut w);
        // A fitted format names none of the widths or types: the size chose them.
        if let Some(size) = self.max_size {
            w.value("--max-size", &size.to_string());
        }
        if let Some(m) = self.fit_memory {
            w.value("--fit-memory", &m.memory.to_string());
            if let Some(n) = m.context {
                w.value("--context", &n.to_string());
            }
            if let Some(r) = m.reserve {
                w.value("--reserve", &r.to_string());
            }
        }
        if let Some(path) = &self.imatrix {
            // By file name (a card names no path of the machine); the card and --json add its sha256.
            let name = path.file_name().map_or_else(|| path.to_string_lossy(), |n| n.to_string_lossy());
            w.quoted("--imatrix", &name, &shell_word(&name));
        }
        w.value("--bias", self.bias.name());
        if let Some(size) = self.max_shard_size {
            w.value("--max-shard-size", &size.to_string());
        }
        for glob in &self.only {
            // Always quoted: a glob's `*` and `?` are the shell's too.
            w.quoted("--only", glob, &format!("'{}'", glob.replace('\'', r"'\''")));
        }
        if self.checksums {
            w.switch("--checksums");
        }
        if let Some(request) = &self.verify {
            let name = crate::card::source_arg(&request.base, request.hub.as_ref());
            w.quoted("--verify-base", &name, &shell_word(&name));
            match request.sample {
                None => w.switch("--verify-full"),
                Some(n) => w.value("--verify-sample", &n.to_string()),
            }
        }
        w.line()
    }

    /// [`Self::shaping_flags`] with `--bias` as a job resolved it for its input
    /// ([`BiasMode::resolved`]) and `--fit-memory`'s context and reserve as it resolved them: what
    /// the marker fingerprints and the card records.
    pub fn recorded_flags(&self, bias: BiasMode, memory: Option<&MemoryBudget>) -> String {
        let fit_memory = memory.map(MemoryBudget::asked).or(self.fit_memory);
        ConvertOptions { bias, fit_memory, ..self.clone() }.shaping_flags()
    }
}

/// `--verify-base BASE`: the base model, and how many 128×128 blocks per tensor to check
/// (`None`: every block).
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyRequest {
    pub base: PathBuf,
    /// The Hub id BASE was given as, and the commit it resolved to.
    pub hub: Option<HubSource>,
    pub sample: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{AutoBits, GgufOptions, GgufType, Int8Mode, MlxOptions};

    /// Option sets and the flags earlier releases recorded for them: the marker's fingerprint of
    /// an existing output must not change (`merge` compares them).
    #[test]
    fn the_flags_of_an_option_set_never_change() {
        // `--bias auto` is recorded as what it resolved to (`BiasMode::resolved`): `drop` for every
        // Escha input, the choice of the releases before `auto`.
        let plain = ConvertOptions { bias: BiasMode::Drop, ..ConvertOptions::new("/in/dense".into(), "/out".into()) };
        let with = |format| ConvertOptions { format, ..plain.clone() };
        let auto = |max_added_error, exact| Some(AutoBits { max_added_error, exact });
        let cases = [
            (plain.clone(), "--format bf16 --mtp auto --bias drop"),
            (ConvertOptions { bias: BiasMode::Auto, ..plain.clone() }, "--format bf16 --mtp auto --bias auto"),
            (
                ConvertOptions { bias: BiasMode::Keep, max_shard_size: Some(20000), checksums: true, ..plain.clone() },
                "--format bf16 --mtp auto --bias keep --max-shard-size 20000 --checksums",
            ),
            (
                ConvertOptions { only: vec!["*layers.1.*".into(), "it's".into()], ..plain.clone() },
                r"--format bf16 --mtp auto --bias drop --only '*layers.1.*' --only 'it'\''s'",
            ),
            (with(OutputFormat::Exl3 { mtp: MtpMode::Drop }), "--format exl3 --mtp drop --bias drop"),
            (
                with(OutputFormat::Mlx(MlxOptions { auto: auto(0.5, false), ..MlxOptions::DEFAULT })),
                "--format mlx --bits auto --max-added-error 0.5 --group-size 64 --int8 exact --bias drop",
            ),
            (
                with(OutputFormat::Gguf(GgufOptions {
                    ty: GgufType::Q4_K_M,
                    vocab: false,
                    int8: Int8Mode::Requant,
                    ..GgufOptions::DEFAULT
                })),
                "--format gguf --gguf-type q4_k_m --gguf-vocab none --int8 requant --mtp auto --bias drop",
            ),
            (
                with(OutputFormat::Gguf(GgufOptions {
                    ty: GgufType::Auto,
                    mtp: MtpMode::Drop,
                    auto: auto(0.7, true),
                    ..GgufOptions::DEFAULT
                })),
                "--format gguf --gguf-type auto --max-added-error 0.7 --measure-error --gguf-vocab auto --int8 exact \
                 --mtp drop --bias drop",
            ),
            (
                ConvertOptions {
                    format: OutputFormat::Mlx(MlxOptions::DEFAULT),
                    verify: Some(VerifyRequest { base: "/bases/dense-base".into(), hub: None, sample: Some(2) }),
                    ..plain.clone()
                },
                "--format mlx --bits 4 --group-size 64 --int8 exact --bias drop --verify-base dense-base \
                 --verify-sample 2",
            ),
            (
                ConvertOptions {
                    verify: Some(VerifyRequest { base: "/bases/dense-base".into(), hub: None, sample: None }),
                    ..plain.clone()
                },
                "--format bf16 --mtp auto --bias drop --verify-base dense-base --verify-full",
            ),
        ];
        let fitted = [
            (
                ConvertOptions {
                    format: OutputFormat::Mlx(MlxOptions { fitted: true, ..MlxOptions::DEFAULT }),
                    max_size: Some(11_000_000_000),
                    ..plain.clone()
                },
                "--format mlx --int8 exact --max-size 11000000000 --bias drop",
            ),
            (
                ConvertOptions {
                    format: OutputFormat::Gguf(GgufOptions {
                        ty: GgufType::Auto,
                        fitted: true,
                        ..GgufOptions::DEFAULT
                    }),
                    max_size: Some(10_000_000_000),
                    ..plain.clone()
                },
                "--format gguf --gguf-vocab auto --int8 exact --mtp auto --max-size 10000000000 --bias drop",
            ),
            (
                ConvertOptions {
                    format: OutputFormat::Mlx(MlxOptions { fitted: true, ..MlxOptions::DEFAULT }),
                    fit_memory: Some(FitMemory { memory: 16_000_000_000, context: Some(8192), reserve: Some(0) }),
                    ..plain.clone()
                },
                "--format mlx --int8 exact --fit-memory 16000000000 --context 8192 --reserve 0 --bias drop",
            ),
        ];
        for (options, flags) in cases.into_iter().chain(fitted) {
            assert_eq!(options.shaping_flags(), flags);
        }
    }
}
