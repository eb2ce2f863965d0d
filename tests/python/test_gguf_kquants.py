"""The K-quant GGUF types against llama.cpp itself and against the error budget `--gguf-type auto`
promises.

llama.cpp is scripts/llama-cpp.sh's (llama-cpp-python 0.3.36's vendor tree): ESCHA_LLAMA_CPP for
gguf-py, ESCHA_LLAMA_BIN for llama_logits and llama-quantize; without them every test is skipped (a
failure under CI=true), as in test_gguf.py, whose helpers (reader, decode, raw, run, report, ...) this
module imports. Files are read, and the reference and control models written, with that tree's gguf-py.
The fixtures' hidden size is 128, so the K types (256-value blocks) apply only to 256-wide rows
(dense: ssm_out, ffn_down; MoE: ssm_out, an int8 pair, so a K type only with `--int8 requant`); other
rows get llama-quantize's fallbacks (Q5_0, Q5_1, Q8_0).

1. `test_logits_within_quantization_error` (dense and moe x q4_k_m, q6_k, auto, and dense x q3_k_m,
   iq4_xs, with the default `--int8 exact`; moe x q4_k_m, q6_k with `--int8 requant`, the only MoE files with K-type tensors).
   llama.cpp must load the file, and its logits of TOKENS (all 16 positions x 256) must stay within
   what errors of that size do to this model. The bound is calibrated, not guessed:

   * REF: our `--gguf-type f32` file (same --int8) with every tensor F32 (the exact int8 pairs' Q8_0,
     w8 * scale, expanded), written with gguf-py's GGUFWriter copying every key and every tensor
     (names, order, ggml shapes), so that no matmul of the reference rounds anything. L0 = its logits.
   * Two error sources separate the file Q's logits from L0. (a) weights: every tensor of Q decodes
     (gguf-py) to W + dW; e_w = ||dW|| / ||W|| over the rows of W that are not all zero, per tensor.
     (b) activations: llama.cpp's CPU matmul rounds the activation operand to the weight type's
     vec_dot_type (ggml-cpu.c type_traits_cpu): Q8_K for Q4_K/Q5_K/Q6_K, Q8_0 (Q8_1: the same 8-bit
     grid) for Q8_0/Q5_0/Q5_1, BF16 for BF16, nothing for F32; token_embd is a row lookup, no matmul.
     To first order y = W x moves by dW x + W dx, and for perturbations independent of the other
     factor ||W dx|| / ||W x|| ~ ||dx|| / ||x||: the same as a weight perturbation of relative size
     e_a = ||dx|| / ||x||. e_a is computed (activation_error) by applying that rounding (8 bits on
     the block's absolute maximum: blocks of 256 for Q8_K, 32 for Q8_0; bf16 rounding) to samples of
     silu(g) * u, g and u standard normal: the SwiGLU product ffn_down sees, the heaviest-tailed
     input of these models and the largest e_a of the distributions tried (Q8_K / Q8_0: normal
     0.70 % / 0.54 %, Laplace 1.00 % / 0.67 %, SwiGLU 1.55 % / 0.89 %; BF16 0.17 %).
   * CONTROL: REF with every such tensor replaced by W + N, N Gaussian on the non-zero rows with
     ||N|| / ||W|| = sqrt(e_w^2 + e_a^2) exactly (independent errors add in variance), all F32 (so
     llama.cpp adds nothing of its own), for SEEDS noise draws: what a random perturbation of the
     size of Q's two error sources does to this model. c_max, c_rms: the largest over the draws of
     max |L - L0| and of rms(L - L0).
   * Asserted: max |L_Q - L0| <= SAFETY (3) x c_max and rms(L_Q - L0) <= SAFETY_RMS (2) x c_rms. The
     draws of the max spread up to ~1.8x in the dense model, and in the MoE they are bimodal (0.007 vs
     0.075 with e_w alone, as near-tied router logits flip an expert or not; the largest of SEEDS = 5
     draws covers it); the file is one deterministic sample with structure the noise lacks (block
     scales); the rms over 4096 logits spreads less (+-20 % in the dense draws), hence the smaller
     factor. Fixed seeds and one llama.cpp thread make the test deterministic. The rms check is the
     sharper one where the model is sensitive (moe q4_k_m --int8 requant: max deviations ~1.2-1.5 of
     max |L0| 1.67 in file and controls alike, rms 0.15 of rms(L0) 0.37).
   * Also asserted, isolating (a): DEQ, REF with Q's decoded values (all F32), must give
     max / rms within the same factors of the control with ||N|| / ||W|| = e_w only: the file's
     weight error acts on the model like noise of its size. L_Q - L_DEQ is llama.cpp's activation
     rounding (and kernel order) alone; printed.
   Measured (file vs largest control, max / rms; `-s` prints all): dense q4_k_m 0.68 vs 0.76 /
   0.100 vs 0.117, q6_k 0.21 vs 0.28 / 0.026 vs 0.034, auto 0.41 vs 0.37 / 0.062 vs 0.064; moe
   q4_k_m 0.12 vs 0.26 / 0.019 vs 0.030, q6_k 0.11 vs 0.25 / 0.015 vs 0.025, auto 0.11 vs 0.25 /
   0.014 vs 0.025; moe --int8 requant q4_k_m 1.47 vs 1.24 / 0.146 vs 0.152, q6_k 0.31 vs 0.29 /
   0.036 vs 0.034. Ratios 0.4-1.2 against bounds of 3 and 2. The size of each tensor's weight error
   itself is pinned down by tests 2 and 3 (bytes = llama-quantize's; errors = the JSON's and within
   budget); this test is about what llama.cpp makes of the file.

2. `test_auto_budget` (dense, moe; `--gguf-type auto --measure-error --json` at R = 0.5, the default,
   and at R = 0.03, where Q8_0 and BF16 are chosen, so that the MoE fixture, whose coded rows are all
   128 wide and so have only Q8_0 and BF16 as candidates, has a narrower candidate that fails): for
   every `width_choices` entry the chosen tensor of the auto file, decoded, against the f32 file's:
   the relative error over non-zero rows, in float64, equals `actual` (RTOL_ACTUAL) and is <= `budget`
   (= R * 2^-K; not asserted for the BF16 fallback, which is unconditional, though it holds here);
   `predicted` is within 30 % of `actual`. Every narrower candidate ([Q2_K, Q3_K, IQ4_XS, Q4_K, Q5_K,
   Q6_K, Q8_0, BF16] whose block, 256 or 32, divides the row), taken from our uniform file (`--gguf-type
   q4_k|q5_k|q6_k`, exactly that type for a 256-wide coded linear; `--gguf-type q8_0 --int8 requant`
   for Q8_0; for Q2_K, Q3_K, IQ4_XS, which have no uniform --gguf-type, `llama-quantize --pure` on our
   f32 file), has an error > budget; the chosen type's tensor is that uniform file's, byte for byte
   (one encoder). Per fixture at least one entry must have a narrower candidate, so the test is not
   vacuous (dense at R = 0.5: ffn_down, K = 3, Q5_K 0.0370 within 0.0625 where Q4_K has 0.0735; MoE at
   R = 0.03: ffn_down_exps, K = 3, BF16 0.0017 within 0.00375 where Q8_0 has 0.0055).

3. `test_matches_llama_quantize` (dense, moe x q4_k_m, q5_k_m, q2_k, q3_k_s, q3_k_m, q3_k_l, iq4_xs
   against llama-quantize's mixtures, and q4_k, q5_k, q6_k against `llama-quantize --pure`):
   llama-quantize without an imatrix calls ggml_quantize_chunk -> quantize_q4_K etc., which with
   quant_weights == NULL run quantize_row_*_ref (ggml-quants.c quantize_q2_K ... q6_K / q4_0 / q5_0 /
   q5_1; quantize_q8_0 always does; quantize_iq4_xs and quantize_iq4_nl their own 7-try search),
   the path this tool follows, so from the same f32 values the bytes must be identical:
   * types: our `--int8 requant` file vs llama-quantize on our `--gguf-type bf16 --int8 requant`
     file: the same tensor names, every tensor's ggml type, and general.file_type (for --pure Q4_K /
     Q5_K llama-quantize writes its Q4_K_M / Q5_K_M numbers, 15 / 17, and so does this tool);
   * bytes: the same file vs llama-quantize on our `--gguf-type f32 --int8 requant` file (both then
     quantize the same f32 values): every tensor byte-identical;
   * `--int8 exact` (the default): our int8 pairs stay exact Q8_0 (the `--gguf-type f32` file's Q8_0
     bytes), where llama-quantize would requantize them: they are left out of the comparison with
     llama-quantize and checked for exactness instead; every other tensor is the requant file's.
   Not compared, by design: tensor order (llama-quantize writes its loader's std::map order,
   weight_name_comparer: by layer, then name; ours is the converter's) and trailing ne of 1
   (llama-quantize writes ggml_n_dims dimensions: blk.N.ffn_gate_inp_shexp.weight [128, 1] becomes
   [128]; ours is the converter's).

llama_logits runs with one thread: the models are tiny, and on a loaded machine the second thread's
barrier waits cost seconds (the logits are bit-identical). The whole module takes about 30 s.

Run: `. "$(bash scripts/llama-cpp.sh --print-env)"`, then
`ESCHA_CONVERT=target/debug/escha-convert .venv/bin/python -m pytest tests/python/test_gguf_kquants.py -q`
(`-s` prints the measured numbers).
"""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from testenv import unavailable
from test_gguf import (  # noqa: F401  (llama_bin is a fixture)
    GT,
    LLAMA_BIN,
    TIMEOUT,
    TOKENS,
    decode,
    gguf,
    llama_bin,
    llama_cpp_limits,
    raw,
    reader,
    report,
    run,
    shape,
)

FIXTURES = ["dense", "moe"]
SAFETY = 3.0
SEEDS = 5
SAFETY_RMS = 2.0
RTOL_ACTUAL = 1e-6
PREDICTED_RTOL = 0.30
# --max-added-error values for test_auto_budget (see the docstring).
AUTO_R = [0.5, 0.03]

BLOCK = {"Q2_K": 256, "Q3_K": 256, "IQ4_XS": 256, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q8_0": 32, "BF16": 1}
CANDIDATES = ["Q2_K", "Q3_K", "IQ4_XS", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "BF16"]
# Our uniform file that holds a coded linear of 256-wide rows in exactly that type: (--gguf-type, --int8).
UNIFORM = {"Q4_K": ("q4_k", "exact"), "Q5_K": ("q5_k", "exact"), "Q6_K": ("q6_k", "exact"), "Q8_0": ("q8_0", "requant")}
# The low-bit types have no uniform --gguf-type (only llama-quantize's mixtures of them): their
# encoding of a coded linear is `llama-quantize --pure TYPE` on our f32 file, whose coded linears are
# the exact reconstruction in F32 (test_matches_llama_quantize holds our encoders to the same bytes).
PURE = {"Q2_K", "Q3_K", "IQ4_XS"}
# Our --gguf-type -> llama-quantize's type and whether --pure (one type, with its fallbacks) is given.
LLAMA_QUANTIZE = {
    "q4_k_m": ("Q4_K_M", False), "q5_k_m": ("Q5_K_M", False),
    "q4_k": ("Q4_K", True), "q5_k": ("Q5_K", True), "q6_k": ("Q6_K", True),
    "q2_k": ("Q2_K", False), "q3_k_s": ("Q3_K_S", False), "q3_k_m": ("Q3_K_M", False),
    "q3_k_l": ("Q3_K_L", False), "iq4_xs": ("IQ4_XS", False),
}

# llama.cpp's CPU vec_dot_type of each weight type (ggml-cpu.c type_traits_cpu): how the activation
# operand of a matmul with such a weight is rounded.
VEC_DOT = {
    GT.F32: None, GT.F16: "F16", GT.BF16: "BF16",
    GT.Q8_0: "Q8_0", GT.Q4_0: "Q8_0", GT.Q5_0: "Q8_0", GT.Q4_1: "Q8_0", GT.Q5_1: "Q8_0",  # Q8_1: Q8_0's grid
    GT.Q4_K: "Q8_K", GT.Q5_K: "Q8_K", GT.Q6_K: "Q8_K",
    GT.Q2_K: "Q8_K", GT.Q3_K: "Q8_K", GT.IQ4_XS: "Q8_K", GT.IQ4_NL: "Q8_0",
}
NOT_A_MATMUL = {"token_embd.weight"}  # ggml_get_rows: dequantized rows, no activation operand
# A weight type not in VEC_DOT is taken to round activations like Q8_K, the coarsest of them.

if not LLAMA_BIN or not (Path(LLAMA_BIN) / "llama-quantize").is_file():
    unavailable(f"ESCHA_LLAMA_BIN ({LLAMA_BIN or 'unset'}) has no llama-quantize: run scripts/llama-cpp.sh")


# ---- conversions ----------------------------------------------------------------------------------


class Workspace:
    """Every file the tests need, made once per session, cached by its arguments."""

    def __init__(self, repo_root, escha_convert, tmp):
        self.repo_root, self.bin, self.tmp = repo_root, escha_convert, tmp
        self.cache, self.values_cache = {}, {}

    def convert(self, fixture, ty, int8="exact", extra=()):
        """(path of our single GGUF file, the --json document or None)."""
        key = ("ours", fixture, ty, int8, *extra)
        if key not in self.cache:
            out = self.tmp / "-".join(str(k).lstrip("-") for k in key)
            cmd = [self.bin, self.repo_root / "fixtures" / fixture, out, "--quiet", "--format", "gguf"]
            cmd += ["--gguf-type", ty, "--int8", int8, *extra]
            r = run(cmd, f"escha-convert {' '.join(map(str, key[1:]))}")
            doc = json.loads(r.stdout) if "--json" in extra else None
            files = sorted(out.glob("*.gguf"))
            assert len(files) == 1, f"escha-convert {key}: want one .gguf file, got {[f.name for f in files]}"
            self.cache[key] = (files[0], doc)
        return self.cache[key]

    def path(self, fixture, ty, int8="exact"):
        return self.convert(fixture, ty, int8)[0]

    def uniform(self, fixture, block):
        """A file holding every 256-wide coded linear of `fixture` as `block` (see UNIFORM, PURE)."""
        if block in PURE:
            return self.llama_quantize(self.path(fixture, "f32", "requant"), block, True)
        return self.path(fixture, *UNIFORM[block])

    def llama_quantize(self, src, qtype, pure):
        key = ("lq", str(src), qtype, pure)
        if key not in self.cache:
            out = self.tmp / f"lq-{src.parent.name}-{qtype}{'-pure' if pure else ''}.gguf"
            cmd = [Path(LLAMA_BIN) / "llama-quantize", *(["--pure"] if pure else []), src, out, qtype, "2"]
            run(cmd, f"llama-quantize {' '.join(map(str, cmd[1:]))}")
            self.cache[key] = out
        return self.cache[key]

    def tensors(self, path):
        """{name: gguf ReaderTensor} of a GGUF file, read once."""
        key = ("tensors", str(path))
        if key not in self.cache:
            self.cache[key] = {t.name: t for t in reader(path).tensors}
        return self.cache[key]

    def values(self, path):
        """{name: (ggml type, ne, decoded float32 values, flat)} of a GGUF file."""
        if path not in self.values_cache:
            self.values_cache[path] = {n: (t.tensor_type, shape(t), decode(t)) for n, t in self.tensors(path).items()}
        return self.values_cache[path]

    def reference(self, fixture, int8):
        """REF: our --gguf-type f32 file with every tensor (the int8 pairs' exact Q8_0 too) as F32."""
        key = ("ref", fixture, int8)
        if key not in self.cache:
            out = self.tmp / f"ref-{fixture}-{int8}.gguf"
            write_f32_like(self.path(fixture, "f32", int8), out, {})
            self.cache[key] = out
        return self.cache[key]

    def logits(self, llama_bin, path):
        """llama.cpp's logits of every position of TOKENS (n_tokens x n_vocab), once per file, or the
        load/decode error as a string. test_gguf.logits with one thread: these models are tiny, and
        on a loaded machine a second thread's barrier waits cost seconds (the logits are the same)."""
        key = ("logits", str(path))
        if key not in self.cache:
            out = self.tmp / f"logits-{len(self.cache)}.f32"
            cmd = [llama_bin / "llama_logits", "-t", "1", "-o", out, path, ",".join(map(str, TOKENS))]
            try:
                r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.cache[key] = f"llama_logits timed out on {path}"
                return self.cache[key]
            if r.returncode != 0:
                errors = "\n".join(x for x in r.stderr.splitlines() if "unused tensor" not in x)
                self.cache[key] = (
                    f"llama.cpp could not run {path} (exit {r.returncode}):\n{errors[-4000:]}{llama_cpp_limits(path)}"
                )
                return self.cache[key]
            n_vocab = int(r.stderr.strip().splitlines()[-1].rsplit("n_vocab=", 1)[1])
            y = np.fromfile(out, dtype="<f4")
            assert y.size == len(TOKENS) * n_vocab, f"llama_logits wrote {y.size} floats, want {len(TOKENS)} x {n_vocab}"
            self.cache[key] = y.reshape(len(TOKENS), n_vocab)
        return self.cache[key]


@pytest.fixture(scope="session")
def kq(repo_root, escha_convert, tmp_path_factory):
    return Workspace(repo_root, escha_convert, tmp_path_factory.mktemp("gguf-kquants"))


def write_f32_like(src, dst, values):
    """A copy of GGUF `src`, every key-value pair (as gguf_new_metadata.py copies them) and every
    tensor in order with its name and ggml shape, every tensor F32: values[name] (flat float32, ggml
    order) where given, else src's own values decoded."""
    r = reader(src)
    w = gguf.GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for f in r.fields.values():
        if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF.") or f.name == "general.alignment":
            continue
        vtype = f.types[0]
        w.add_key_value(f.name, f.contents(), vtype, sub_type=f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        v = values.get(t.name)
        v = decode(t) if v is None else v
        w.add_tensor(t.name, np.asarray(v, np.float32).reshape(tuple(reversed(shape(t)))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---- errors ---------------------------------------------------------------------------------------


def norm(x):
    """Frobenius norm in float64 without BLAS (whose threads spin on a loaded machine)."""
    x = np.asarray(x, np.float64)
    return float(np.sqrt(np.sum(x * x)))


def nonzero_rows(w, ne0):
    """Boolean mask of the rows (ne0 values each) of flat w that are not all zero."""
    return np.any(w.reshape(-1, ne0) != 0, axis=1)


def rel_error(approx, exact, ne0):
    """||approx - exact|| / ||exact|| over the non-zero rows of exact, float64."""
    e = exact.astype(np.float64).reshape(-1, ne0)
    a = approx.astype(np.float64).reshape(-1, ne0)
    keep = nonzero_rows(exact, ne0)
    den = norm(e[keep])
    return float(norm(a[keep] - e[keep]) / den) if den else 0.0


_ACT = {}


def activation_error(vec_dot):
    """Relative RMS error ||q(x) - x|| / ||x|| of llama.cpp's activation rounding `vec_dot` on
    SwiGLU products silu(g) * u (g, u standard normal; see the module docstring)."""
    if vec_dot is None:
        return 0.0
    if vec_dot not in _ACT:
        rng = np.random.default_rng(12345)
        g, u = rng.standard_normal(1 << 20), rng.standard_normal(1 << 20)
        x = (g / (1 + np.exp(-g)) * u).astype(np.float32)
        if vec_dot in ("Q8_K", "Q8_0"):
            b = x.reshape(-1, 256 if vec_dot == "Q8_K" else 32).astype(np.float64)
            d = np.abs(b).max(axis=1, keepdims=True) / 127
            if vec_dot == "Q8_0":
                d = d.astype(np.float16).astype(np.float64)  # Q8_0 stores d as f16
            q = np.clip(np.rint(b / d), -127, 127) * d
            _ACT[vec_dot] = float(norm(q - b) / norm(b))
        else:
            ty = GT.BF16 if vec_dot == "BF16" else GT.F16
            q = gguf.quants.dequantize(gguf.quants.quantize(x.reshape(-1, 256), ty), ty).reshape(-1)
            _ACT[vec_dot] = float(norm(q.astype(np.float64) - x) / norm(x.astype(np.float64)))
    return _ACT[vec_dot]


def noisy(w, ne0, rel, rng):
    """w plus Gaussian noise on its non-zero rows with ||noise|| = rel * ||w|| over them (exactly)."""
    rows = w.astype(np.float64).reshape(-1, ne0)
    keep = nonzero_rows(w, ne0)
    n = rng.standard_normal(rows[keep].shape)
    n *= rel * norm(rows[keep]) / norm(n)
    out = rows.copy()
    out[keep] += n
    return out.astype(np.float32).reshape(-1)


def max_dev(a, b):
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


# ---- 1. llama.cpp logits within the quantization error --------------------------------------------


def rms_dev(a, b):
    return float(np.sqrt(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)))


LOGIT_CASES = [
    ("dense", ty, "exact") for ty in ("q4_k_m", "q6_k", "auto", "q3_k_m", "iq4_xs")
] + [("moe", ty, "exact") for ty in ("q4_k_m", "q6_k", "auto")] + [("moe", ty, "requant") for ty in ("q4_k_m", "q6_k")]


@pytest.mark.parametrize("fixture,ty,int8", LOGIT_CASES)
def test_logits_within_quantization_error(kq, llama_bin, fixture, ty, int8):
    qpath = kq.path(fixture, ty, int8)
    ref = kq.reference(fixture, int8)
    exact = kq.values(ref)
    quant = kq.values(qpath)
    what = f"{fixture} {ty} --int8 {int8}"
    problems = []
    if set(quant) != set(exact):
        report([f"tensor names differ from the f32 file: {sorted(set(quant) ^ set(exact))}"], what)

    # Per tensor: weight error e_w and activation-rounding error e_a (module docstring).
    errs = {}
    for name, (qt, ne, v) in quant.items():
        _, ene, w = exact[name]
        if ene != ne:
            problems.append(f"{name}: ne {ne} in the {ty} file, {ene} in the f32 file")
            continue
        if qt == GT.F32 and not np.array_equal(v, w):
            problems.append(f"{name}: F32 in the {ty} file but not the f32 file's values (max |diff| {max_dev(v, w):.3g})")
        e_w = 0.0 if qt == GT.F32 else rel_error(v, w, ne[0])
        e_a = 0.0 if name in NOT_A_MATMUL or len(ne) < 2 else activation_error(VEC_DOT.get(qt, "Q8_K"))
        if e_w or e_a:
            errs[name] = (qt, ne, e_w, e_a)
    report(problems, f"{what}: tensors vs the f32 file")

    tag = f"{fixture}-{ty}-{int8}"
    deq = kq.tmp / f"deq-{tag}.gguf"
    write_f32_like(ref, deq, {n: quant[n][2] for n, (_, _, e_w, _) in errs.items() if e_w})
    runs = {"ref": ref, "file": qpath, "deq": deq}
    for seed in range(SEEDS):
        for kind in ("w", "wa"):
            rng = np.random.default_rng([seed, len(kind)])
            vals = {}
            for n, (_, ne, e_w, e_a) in errs.items():
                rel = e_w if kind == "w" else float(np.hypot(e_w, e_a))
                if rel:
                    vals[n] = noisy(exact[n][2], ne[0], rel, rng)
            p = kq.tmp / f"control-{kind}-{seed}-{tag}.gguf"
            write_f32_like(ref, p, vals)
            runs[f"{kind}{seed}"] = p
    got = {k: kq.logits(llama_bin, p) for k, p in runs.items()}
    report([f"{k}: {v}" for k, v in got.items() if isinstance(v, str)], f"{what}: llama_logits")
    report([f"{k}: non-finite logits" for k, v in got.items() if not np.all(np.isfinite(v))], f"{what}: llama_logits")

    l0 = got["ref"]
    mx = {k: max_dev(v, l0) for k, v in got.items()}
    rm = {k: rms_dev(v, l0) for k, v in got.items()}
    c_max, c_rms = max(mx[f"wa{i}"] for i in range(SEEDS)), max(rm[f"wa{i}"] for i in range(SEEDS))
    w_max, w_rms = max(mx[f"w{i}"] for i in range(SEEDS)), max(rm[f"w{i}"] for i in range(SEEDS))
    as_written = kq.logits(llama_bin, kq.path(fixture, "f32", int8))
    by_type = {}
    for n, (qt, _, e_w, _) in errs.items():
        by_type.setdefault(qt.name, []).append(e_w)
    seeds = lambda d, k: ", ".join(f"{d[f'{k}{i}']:.4g}" for i in range(SEEDS))  # noqa: E731
    print(
        f"\n{what}: logits max |L0| {float(np.max(np.abs(l0))):.3g}, rms {rms_dev(l0, 0 * l0):.3g}\n"
        f"  file  max {mx['file']:.4g} rms {rm['file']:.4g} | control (e_w+e_a) max {seeds(mx, 'wa')} rms {seeds(rm, 'wa')}"
        f" -> ratios {mx['file'] / c_max:.2f} / {rm['file'] / c_rms:.2f}\n"
        f"  DEQ   max {mx['deq']:.4g} rms {rm['deq']:.4g} | control (e_w)     max {seeds(mx, 'w')} rms {seeds(rm, 'w')}"
        f" -> ratios {mx['deq'] / w_max:.2f} / {rm['deq'] / w_rms:.2f}\n"
        f"  activation rounding alone (file - DEQ) max {max_dev(got['file'], got['deq']):.4g}; the f32 file as written "
        f"{'(int8 pairs exact Q8_0) ' if int8 == 'exact' else ''}max "
        f"{max_dev(as_written, l0) if not isinstance(as_written, str) else as_written}\n"
        f"  tensors: {', '.join(f'{k} x{len(v)} e_w {min(v):.4f}-{max(v):.4f}' for k, v in sorted(by_type.items()))}; "
        f"e_a Q8_K {activation_error('Q8_K'):.4f} Q8_0 {activation_error('Q8_0'):.4f} BF16 {activation_error('BF16'):.5f}"
    )
    for label, key, cm, cr, ctl in (
        ("the file", "file", c_max, c_rms, "e_w and e_a"),
        ("the file's decoded weights (DEQ, all F32)", "deq", w_max, w_rms, "e_w only"),
    ):
        if not mx[key] <= SAFETY * cm:
            problems.append(
                f"{label}: max |L - L_ref| = {mx[key]:.4g} > {SAFETY} x {cm:.4g}, the largest over {SEEDS} Gaussian "
                f"controls of the same relative size ({ctl})"
            )
        if not rm[key] <= SAFETY_RMS * cr:
            problems.append(
                f"{label}: rms (L - L_ref) = {rm[key]:.4g} > {SAFETY_RMS} x {cr:.4g}, the largest over {SEEDS} Gaussian "
                f"controls of the same relative size ({ctl})"
            )
    report(problems, f"{what}: llama.cpp logits vs the f32 reference")


# ---- 2. auto meets its budget, the next narrower type does not -----------------------------------


def candidates(ne0):
    return [t for t in CANDIDATES if ne0 % BLOCK[t] == 0]


@pytest.mark.parametrize("fixture", FIXTURES)
def test_auto_budget(kq, fixture):
    exact = kq.values(kq.path(fixture, "f32"))
    problems, narrower_checked, lines = [], [], []
    for r_ in AUTO_R:
        extra = ("--measure-error", "--json", "--max-added-error", str(r_))
        path, doc = kq.convert(fixture, "auto", "exact", extra)
        choices = doc.get("width_choices") or []
        if not choices:
            problems.append(f"R={r_}: --json has no width_choices")
            continue
        auto = kq.values(path)
        for e in choices:
            keys = ("tensor", "gguf_type", "budget", "actual", "predicted")
            name, chosen, budget, actual, predicted = (e.get(k) for k in keys)
            if None in (name, chosen, budget, actual, predicted, e.get("k")):
                problems.append(f"R={r_}: width_choices entry lacks one of k, {', '.join(keys)}: {e}")
                continue
            where = f"R={r_} {name} (K={e['k']}, {chosen}, budget {budget:.5g})"
            if name not in auto or name not in exact:
                problems.append(f"{where}: not in the auto file or the f32 file")
                continue
            at, ne, v = auto[name]
            et, _, w = exact[name]
            if at.name != chosen:
                problems.append(f"{where}: the file holds it as {at.name}")
                continue
            if et != GT.F32:
                problems.append(f"{where}: {et.name} in the f32 file, want F32 (the exact reconstruction)")
                continue
            if abs(budget - r_ * 2.0 ** -e["k"]) > 1e-12:
                problems.append(f"{where}: budget {budget} != R * 2^-K = {r_ * 2.0 ** -e['k']}")
            err = rel_error(v, w, ne[0])
            if not abs(err - actual) <= RTOL_ACTUAL * max(err, 1e-30):
                problems.append(f"{where}: measured error {err:.9g}, JSON actual {actual}")
            if chosen != "BF16" and not err <= budget:
                problems.append(f"{where}: error {err:.6g} > budget")
            if not abs(predicted - actual) <= PREDICTED_RTOL * actual:
                problems.append(f"{where}: predicted {predicted:.6g} not within 30% of actual {actual:.6g}")
            cands = candidates(ne[0])
            if chosen not in cands:
                problems.append(f"{where}: {chosen} is not a candidate for rows of {ne[0]} ({cands})")
                continue
            # The chosen type's bytes are the uniform file's (the same encoder as the narrower ones below).
            if chosen in UNIFORM or chosen in PURE:
                ut = kq.tensors(kq.uniform(fixture, chosen))[name]
                mine = kq.tensors(path)[name]
                if ut.tensor_type.name != chosen:
                    problems.append(f"{where}: the uniform {chosen} file holds it as {ut.tensor_type.name}")
                elif not np.array_equal(raw(ut), raw(mine)):
                    problems.append(f"{where}: bytes differ from the uniform {chosen} file's")
            narrower = []
            for c in cands[: cands.index(chosen)]:
                u = kq.values(kq.uniform(fixture, c))
                ut, _, uv = u[name]
                if ut.name != c:
                    problems.append(f"{where}: the uniform {c} file holds it as {ut.name}")
                    continue
                ce = rel_error(uv, w, ne[0])
                narrower.append(f"{c} {ce:.5g}")
                narrower_checked.append((r_, name, chosen, c, ce, budget))
                if not ce > budget:
                    problems.append(
                        f"{where}: the narrower candidate {c} has error {ce:.6g} <= budget: auto should choose it"
                    )
            lines.append(
                f"R={r_} {name} K={e['k']}: {chosen} error {err:.5g} (actual {actual:.5g}, predicted {predicted:.5g}) "
                f"budget {budget:.5g}; narrower: {', '.join(narrower) or 'none'}"
            )
    print(f"\n{fixture} auto:\n  " + "\n  ".join(lines))
    if not narrower_checked:
        problems.append("no width choice had a narrower candidate: the test checked nothing about narrower types")
    report(problems, f"{fixture} --gguf-type auto")


# ---- 3. q4_k_m / q5_k_m: llama-quantize's types and bytes ------------------------------------------


def squeeze(ne):
    """ne without trailing 1s (llama-quantize writes ggml_n_dims dimensions)."""
    ne = list(ne)
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return ne


def file_type(path):
    f = reader(path).fields.get("general.file_type")
    return None if f is None else f.contents()


@pytest.mark.parametrize("mixture", list(LLAMA_QUANTIZE))
@pytest.mark.parametrize("fixture", FIXTURES)
def test_matches_llama_quantize(kq, fixture, mixture):
    m, pure = LLAMA_QUANTIZE[mixture]
    ours_path = kq.path(fixture, mixture, "requant")
    lq_bf16_path = kq.llama_quantize(kq.path(fixture, "bf16", "requant"), m, pure)
    lq_f32_path = kq.llama_quantize(kq.path(fixture, "f32", "requant"), m, pure)
    ours = {t.name: t for t in reader(ours_path).tensors}
    lq_bf16 = {t.name: t for t in reader(lq_bf16_path).tensors}
    lq_f32 = {t.name: t for t in reader(lq_f32_path).tensors}
    problems = []
    for who, other in (("llama-quantize(bf16)", lq_bf16), ("llama-quantize(f32)", lq_f32)):
        if set(ours) != set(other):
            problems.append(
                f"tensor names: only ours {sorted(set(ours) - set(other))}, only {who} {sorted(set(other) - set(ours))}"
            )
    if file_type(ours_path) != file_type(lq_bf16_path):
        problems.append(f"general.file_type ours {file_type(ours_path)}, llama-quantize {file_type(lq_bf16_path)}")
    counts = {}
    for n, t in ours.items():
        a, b = lq_bf16.get(n), lq_f32.get(n)
        if a is None or b is None:
            continue
        if squeeze(shape(t)) != squeeze(shape(a)):
            problems.append(f"{n}: ne ours {shape(t)} llama-quantize {shape(a)}")
            continue
        if t.tensor_type != a.tensor_type:
            problems.append(f"{n}: type ours {t.tensor_type.name}, llama-quantize {a.tensor_type.name} (from our bf16 file)")
            continue
        if b.tensor_type != t.tensor_type:
            problems.append(f"{n}: type ours {t.tensor_type.name}, llama-quantize {b.tensor_type.name} (from our f32 file)")
            continue
        if not np.array_equal(raw(t), raw(b)):
            x, y = decode(t), decode(b)
            i = int(np.argmax(x != y)) if np.any(x != y) else 0
            problems.append(
                f"{n} ({t.tensor_type.name}, ne {shape(t)}): {int(np.count_nonzero(raw(t) != raw(b)))} of "
                f"{raw(t).size} bytes "
                f"differ from llama-quantize's on the same f32 values; {int(np.count_nonzero(x != y))} values differ, "
                f"first at {i} (row {i // shape(t)[0]}): ours {x[i]!r} theirs {y[i]!r}, max |diff| {max_dev(x, y):.4g}"
            )
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1

    # --int8 exact: the int8 pairs stay exact Q8_0, everything else is the requant file's.
    exact = {t.name: t for t in reader(kq.path(fixture, mixture)).tensors}
    f32_exact = {t.name: t for t in reader(kq.path(fixture, "f32")).tensors}
    int8 = {n for n, t in f32_exact.items() if t.tensor_type == GT.Q8_0}
    if not int8:
        problems.append("the f32 file (--int8 exact) has no Q8_0 tensor, but the fixtures have int8 pairs")
    for n, t in exact.items():
        if n in int8:
            if t.tensor_type != GT.Q8_0 or not np.array_equal(raw(t), raw(f32_exact[n])):
                problems.append(
                    f"{n}: --int8 exact {mixture} gives {t.tensor_type.name}, not the exact Q8_0 of the f32 file"
                )
        elif n in ours and (t.tensor_type != ours[n].tensor_type or not np.array_equal(raw(t), raw(ours[n]))):
            problems.append(
                f"{n}: --int8 exact and requant differ ({t.tensor_type.name} vs {ours[n].tensor_type.name}), "
                "not an int8 pair"
            )
    print(
        f"\n{fixture} {mixture}: {len(ours)} tensors, types {dict(sorted(counts.items()))}, all types as llama-quantize "
        f"and bytes as llama-quantize on our f32 file: {not problems}; --int8 exact keeps {len(int8)} int8 pairs Q8_0"
    )
    report(problems, f"{fixture} {mixture} vs llama-quantize {'--pure ' if pure else ''}{m}")
