"""The GGUF judge (llama.cpp): the suite's llama_logits loads the exit-0 output (the first file of
a split set) and runs it on a few tokens; it must exit 0 with finite logits.

Non-finite logits are diagnosed: the file is scanned for non-finite stored values (weights, or the
fp16 scales of quantized blocks), and the same input is converted with --gguf-type f32 and run
again. When that f32 file gives non-finite logits too and neither file stores a non-finite value,
the mutated model itself overflows in llama.cpp's f32 arithmetic; when the f32 file is finite but a
quantized file is not, nothing stored is non-finite and the bf16 file of the same input is finite
too, the activations overflow llama.cpp's quantized matmuls (which round them to 8-bit blocks with
f16 scales: about 65504 x 127 at most). Such cases are listed, with the reason, not counted as
failures.
"""

import os
from pathlib import Path

import numpy as np

from .. import process
from .gguf_file import gguf_nonfinite, gguf_vocab, model_file

TOKENS = [1, 17, 42, 99, 3, 128, 64, 7]


def available(ctx):
    """None when llama_logits is there, else why not."""
    if not ctx.llama_bin or not (Path(ctx.llama_bin) / "llama_logits").is_file():
        return (
            f"no llama_logits in ESCHA_LLAMA_BIN ({ctx.llama_bin or 'unset'}): "
            "run scripts/llama-cpp.sh and source its env file"
        )
    return None


def llama(ctx, model, logits):
    """Runs llama_logits on `model`: (command, stderr, problem or None, logits or None)."""
    n_vocab = gguf_vocab(model)
    tokens = [t % n_vocab for t in TOKENS] if n_vocab else TOKENS
    cmd = [Path(ctx.llama_bin) / "llama_logits", "-t", "1", "-o", logits, model, ",".join(map(str, tokens))]
    env = dict(os.environ, GGML_NO_BACKTRACE="1")  # an assertion aborts at once instead of running gdb
    rc, err = process.run_killable(cmd, ctx.timeout, env)
    if rc == "timeout":
        return cmd, err, ("llama_logits timed out", f"llama_logits did not finish within {ctx.timeout:g} s"), None
    if rc != 0:
        what = process.signame(rc) if rc < 0 else f"exit {rc}"
        return (
            cmd,
            err,
            (f"llama.cpp {what}: {process.first_error_line(err)}", f"llama_logits {what} on the exit-0 output"),
            None,
        )
    try:
        n = int(err.strip().splitlines()[-1].rsplit("n_vocab=", 1)[1])
        y = np.fromfile(logits, dtype="<f4")
    except (IndexError, ValueError, OSError) as e:
        return cmd, err, ("llama_logits output unreadable", f"llama_logits' output unreadable: {e}"), None
    if y.size != len(tokens) * n:
        return (
            cmd,
            err,
            (
                "llama_logits wrote the wrong number of floats",
                f"llama_logits wrote {y.size} floats, want {len(tokens)} x {n}",
            ),
            None,
        )
    return cmd, err, None, y.reshape(len(tokens), n)


def with_type(opts, ty):
    """opts with --gguf-type set to ty."""
    opts = list(opts)
    opts[opts.index("--gguf-type") + 1] = ty
    return opts


def rerun(ctx, case, name, ty):
    """The same input converted with --gguf-type ty and run: (exit status, files, logits or None)."""
    out = case.dir / name
    _, rc, _ = case.convert(ctx, out, with_type(case.opts, ty))
    model, files = model_file(out) if rc == 0 else (None, [])
    y = llama(ctx, model, case.dir / f"{name}.f32")[3] if model else None
    return rc, files, y


def check(ctx, case, res, out):
    model, files = model_file(out)
    if model is None:
        res.problems.append(f"exit 0 but no model.gguf or model-00001-of-N.gguf in OUT: {[f.name for f in files]}")
        res.signature = "exit 0 without a GGUF"
        return
    res.client_cmd, res.client_stderr, problem, y = llama(ctx, model, case.dir / "logits.f32")
    if problem:
        res.signature, p = problem
        res.problems.append(p)
        return
    bad = ~np.isfinite(y)
    if not bad.any():
        res.loaded = True
        return
    k = int(np.argmax(bad))
    n = y.shape[1]
    p = f"{int(bad.sum())} of {y.size} logits not finite (first at position {k // n}, token {k % n}: {y.flat[k]})"
    # Diagnosis: does the file store a non-finite value (a broken file), and does the f32 conversion
    # of the same input give finite logits (then the types chosen lose it) or not (then the mutated
    # model itself overflows in llama.cpp's f32 arithmetic, which is not held against the conversion
    # when neither file stores a non-finite value)?
    stored = gguf_nonfinite(files)
    rc, ref_files, ref_y = rerun(ctx, case, "ref", "f32")
    ty = case.opts[case.opts.index("--gguf-type") + 1]
    if ref_y is None:
        res.notes.append(f"the f32 conversion of the same input did not load or run (escha-convert exit {rc})")
    elif np.isfinite(ref_y).all():
        res.notes.append(
            f"the f32 conversion of the same input gives finite logits (max |logit| {float(np.max(np.abs(ref_y))):.3g})"
        )
        # A quantized file whose every stored value is finite (and within what blocks hold: the tool
        # refuses the rest), whose bf16 conversion runs finite too: the NaN arises in llama.cpp's
        # quantized matmuls, which round the activations to 8-bit blocks with f16 scales, so an
        # activation beyond about 65504 x 127 overflows. That is the mutated model's values meeting
        # llama.cpp's kernels, not something the file can carry differently.
        if not stored and ty not in ("bf16", "f16", "f32"):
            _, _, bf16_y = rerun(ctx, case, "ref-bf16", "bf16")
            if bf16_y is not None and np.isfinite(bf16_y).all():
                res.overflow = "activations overflow llama.cpp's 8-bit activation blocks (bf16 and f32 files finite)"
                res.notes.append(f"{p}; {res.overflow}")
                return
    elif not stored and not gguf_nonfinite(ref_files):
        res.overflow = "the model overflows in f32 too"
        res.notes.append(
            f"{p}; the f32 conversion gives non-finite logits too, every stored value finite: the mutated model overflows"
        )
        return
    else:
        res.notes.append("the f32 conversion of the same input gives non-finite logits too")
    if stored:
        res.notes.append(
            "non-finite values stored in the file: " + "; ".join(stored[:4]) + (" …" if len(stored) > 4 else "")
        )
        res.signature = "non-finite logits: the file stores non-finite values"
    else:
        res.signature = "non-finite logits: every stored value finite, f32 conversion " + (
            "finite" if ref_y is not None else "did not run"
        )
    res.problems.append(p)
