"""A bounded fuzz run of `escha-convert IN OUT --format gguf|bf16|mlx|exl3` against the real clients.

The promise under test: exit 0 means OUT holds a model its client accepts; any other outcome is
exit 1 with an `escha-convert: error:` message and nothing left behind. Never a signal, never exit
101 (a panic), never a hang. The clients (judges/, one module each):

* gguf: llama.cpp's llama_logits (the suite's, tests/c/llama_logits.cpp) loads the file and gives
  finite logits; non-finite logits are diagnosed by converting the same input to f32 and bf16;
* bf16: transformers' AutoModelForCausalLM loads OUT (no missing or mismatched key) and one forward
  pass gives finite logits;
* mlx: mlx-lm's load_model(OUT, strict=True) and one forward pass, finite;
* exl3: exllamav3 builds the model from OUT and every module loads its tensors (its CUDA extension
  replaced by an inert stand-in), and an independent NumPy decode of every trellis equals the bf16
  conversion of the same input to within bf16 rounding.

Non-finite logits from a file whose every stored value is finite are the mutated model's values
overflowing, not the file: such cases are listed apart, not counted as failures.

Each case copies fixtures/dense or fixtures/moe into a temporary directory, applies one to three
structured mutations (mutations/: JSON-aware edits of config.json, the tokenizer and side files;
semantic edits of shard headers that keep the offsets consistent: renamed, dropped, added, moved,
reshaped or retyped tensors, biases, a whole layer removed with the config to match; numeric edits
that give extreme values; a few raw byte edits), converts it in one format with options drawn at
random, and hands every exit-0 output to that format's judge. The Python clients run in long-lived
worker processes (one per client and concurrent case), so a case costs a load and a forward pass,
not an interpreter start. Each conversion and judge has a timeout; conversions and llama_logits
run under a 2 GiB address-space limit, workers under 10 GiB (torch maps 3 GiB on import); after 10
timeouts the run starts no more cases.

Everything is derived from --seed, --formats and the case number: `--seed S --only N` re-runs case
N alone with the same mutations and options (add --keep to keep its directory). Case 1 carries a
chat template just over 16 MiB; case 0 and the cases from 2 on first walk every (mutation kind,
format) pair in a seeded order, so a run of more cases than kinds times formats tries each pair.

    .venv/bin/python -m scripts.fuzz [--cases N] [--seed S] [--only N[,M...]] [--formats gguf,bf16,mlx,exl3]
                                     [--jobs J] [--timeout SECONDS] [--bin PATH] [--llama-bin DIR] [--keep] [-v]

Run it from the repository root after `. "$(bash scripts/llama-cpp.sh --print-env)"` (ESCHA_LLAMA_BIN
names the directory holding llama_logits); the binary defaults to
${CARGO_TARGET_DIR:-target}/debug/escha-convert, the one `cargo test` builds. A longer run for a
maintainer (a few thousand cases, every format, another seed):

    .venv/bin/python -m scripts.fuzz --cases 10000 --seed 7 --jobs 2 > fuzz-10000.txt

A case costs about 0.22 s of CPU on the fixtures (conversions and llama_logits 0.17 s, the client
workers 0.04 s: a load and a forward pass; the driver 0.01 s), and starting the three workers about
12 s: the default 2000 cases take about 5 minutes on two cores, the run above about 20.

Exit status: 0 when no case failed, 1 listing every failing case (with the command that reproduces
it) and the failures classed by signature, format and mutation kind, 2 on bad arguments, a missing
binary or a client that cannot be loaded. The last line holds the counts:

    fuzz: cases 2000, exit 0 1400, exit 1 600, loaded 1400, failures 0
"""
