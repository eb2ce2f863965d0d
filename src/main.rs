use clap::Parser;
use escha_convert::backend::{Backend, BackendKind};
use escha_convert::cli::{self, BackendChoice, BiasMode, Cli, Command, Format, Int8Choice};
use escha_convert::codec;
use escha_convert::convert::{convert, ConvertOptions};
use escha_convert::layout::mlx::{Int8Mode, MlxOptions};
use escha_convert::layout::DenseDtype;
use escha_convert::quant::mlx_affine::AffineSpec;
use escha_convert::verify::{self, VerifyOptions};
use escha_convert::{inspect, output, report};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse_from(cli::with_default_command(std::env::args_os().collect()));
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("escha-convert: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Convert(a) => {
            output::install_signal_cleanup();
            let backend = Backend::new(match (a.metal, a.backend) {
                (true, _) | (_, BackendChoice::Metal) => BackendKind::Metal,
                (_, BackendChoice::Auto) => BackendKind::Auto,
                (_, BackendChoice::Cpu) => BackendKind::Cpu,
                (_, BackendChoice::Scalar) => BackendKind::Scalar,
            })?;
            let decoder = backend.decoder();
            let opts = ConvertOptions {
                input: a.input,
                output: a.output,
                dtype: match a.format {
                    Format::Bf16 | Format::Mlx => DenseDtype::Bf16,
                    Format::F16 => DenseDtype::F16,
                },
                keep_bias: a.bias == BiasMode::Keep,
                max_shard_size: a.max_shard_size.unwrap_or(match a.format {
                    Format::Mlx => 5 << 30,
                    _ => 5_000_000_000,
                }),
                only: a.only,
                threads: a.threads,
                force: a.force,
                dry_run: a.dry_run,
                progress: !a.quiet && !a.json,
                mlx: mlx_options(a.format, a.bits.as_deref(), a.group_size.as_deref(), a.int8)?,
            };
            let r = convert(&opts, decoder)?;
            if !a.quiet {
                for w in &r.warnings {
                    eprintln!("escha-convert: warning: {w}");
                }
            }
            if a.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else if a.dry_run {
                print!("{}", report::render_plan(&r));
            } else if !a.quiet {
                eprint!("{}", report::render_summary(&r));
            }
        }
        Command::Inspect(a) => {
            let r = inspect::inspect(&a.input)?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", inspect::render(&r));
            }
        }
        Command::Verify(a) => {
            let opts = VerifyOptions {
                input: a.input,
                base: a.base,
                only: a.only,
                sample: a.sample.map(|n| n as usize),
                max_ratio: a.max_ratio,
                min_corr: a.min_corr,
                threads: a.threads,
            };
            // Exit 1 is reserved for failed checks: a run that could not check anything is 2.
            let r = match verify::verify(&opts, codec::best_decoder()) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("escha-convert: error: {e:#}");
                    return Ok(ExitCode::from(2));
                }
            };
            if a.json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                print!("{}", verify::render(&r));
            }
            if let Some(path) = &a.html {
                if let Err(e) = verify::write_html(&r, path) {
                    eprintln!("escha-convert: error: {e:#}");
                    return Ok(ExitCode::from(2));
                }
            }
            if !r.passed {
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--bits`, `--group-size` and `--int8` for `--format mlx` (refused with any other format).
fn mlx_options(
    format: Format,
    bits: Option<&str>,
    group_size: Option<&str>,
    int8: Option<Int8Choice>,
) -> anyhow::Result<Option<MlxOptions>> {
    if format != Format::Mlx {
        if bits.is_some() || group_size.is_some() || int8.is_some() {
            anyhow::bail!("--bits, --group-size and --int8 apply to --format mlx only");
        }
        return Ok(None);
    }
    let bits = bits.map_or(Ok(4), str::parse)?;
    let group_size = group_size.map_or(Ok(64), str::parse)?;
    let spec = AffineSpec::new(bits, group_size).map_err(anyhow::Error::msg)?;
    let int8 = match int8.unwrap_or(Int8Choice::Exact) {
        Int8Choice::Exact => Int8Mode::Exact,
        Int8Choice::Requant => Int8Mode::Requant,
    };
    Ok(Some(MlxOptions { spec, int8 }))
}
