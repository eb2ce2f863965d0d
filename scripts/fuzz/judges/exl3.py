"""The exl3 judge (exllamav3), in two parts.

* exllamav3's loader: `Config.from_directory(OUT)` and `Model.from_config` build the model, and
  every module's own `load()` on the CPU finds its tensors, each coded linear as an EXL3 linear
  (trellis `[in/16, out/16, 16K]` int16, suh `[in]` and svh `[out]` float16). exllamav3's CUDA
  extension is replaced by an inert stand-in (as tests/python/test_exl3.py does): no kernel runs,
  and the tensor storage is what the loader parses in Python. Tensors no module reads are a
  warning.
* The values: the same input converted to bf16 (same --mtp and --bias) is the reference. Each
  trellis is decoded independently (scripts/numpy_decode.py: states, codebook, tile permutation;
  the 128-point Hadamards and the suh/svh scales here, in float64) and must equal the reference's
  weight (per-expert linears against their expert's half of the fused `gate_up_proj`, or its
  `down_proj`) to within bf16 rounding: |exl3 - bf16| <= 2^-7 max(|exl3|, |bf16|) (one bf16 step),
  plus 2^-16 of the tensor's largest magnitude for float32 noise near zero. The margin covers
  bf16's rounding (2^-8 relative at most) and the f16 rounding of the folded scales (2^-11
  relative each; the dense fixture's s_in and s_out are not 1, so its values move). Every other
  tensor must equal the reference's to the same bound, and the two outputs must hold the same
  tensors.
"""

import re
import sys
import types
from pathlib import Path

import numpy as np

from .. import process
from . import stored
from .workers import judge_in_worker

EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)$")
MARKERS = (".trellis", ".suh", ".svh", ".mcg", ".mul1")


def available(ctx):
    return None


def reference_opts(opts):
    """The bf16 conversion's options for the same input: the format swapped, the rest kept."""
    opts = list(opts)
    opts[opts.index("--format") + 1] = "bf16"
    return opts


def check(ctx, case, res, out):
    ref = case.dir / "ref-bf16"
    cmd, rc, err = case.convert(ctx, ref, reference_opts(case.opts))
    if rc != 0:
        res.problems.append(
            f"the exl3 conversion exits 0 but the bf16 conversion of the same input ({' '.join(map(str, cmd[3:]))}) "
            f"gives {rc}: {process.first_error_line(err)}"
        )
        res.signature = f"bf16 reference conversion exit {rc}: {process.first_error_line(err)[:120]}"
        res.client_stderr = err
        return
    judge_in_worker(ctx, "exl3", res, {"out": str(out), "ref": str(ref)})


# ---- the independent decode ------------------------------------------------------------------


def hadamard128():
    h = np.array([[1.0]])
    while h.shape[0] < 128:
        h = np.block([[h, h], [h, -h]])
    return h


H128 = hadamard128()


def decode_linear(trellis, suh, svh, cb):
    """An EXL3 linear in Hugging Face orientation [out, in], float64: diag(suh)·Hn·Wb·Hn·diag(svh),
    transposed. Raises ValueError naming what does not fit."""
    from scripts import numpy_decode

    dtype, shape, data = trellis
    if dtype != "I16" or len(shape) != 3 or shape[2] % 16:
        raise ValueError(f"trellis is {dtype} {shape}, not I16 [in/16, out/16, 16K]")
    ti, tj, k = shape[0], shape[1], shape[2] // 16
    n_in, n_out = 16 * ti, 16 * tj
    if n_in % 128 or n_out % 128:
        raise ValueError(f"trellis {shape} is not whole 128-blocks")
    su, sv = stored.values(*suh), stored.values(*svh)
    if su is None or sv is None or su.shape != (n_in,) or sv.shape != (n_out,):
        raise ValueError(f"suh {suh[:2]} / svh {svh[:2]} do not fit the trellis {shape}")
    tiles = numpy_decode.decode(np.frombuffer(data, np.uint8), k, cb).astype(np.float64)
    wb = tiles.reshape(ti, tj, 16, 16).transpose(0, 2, 1, 3).reshape(n_in, n_out)
    m = np.einsum("ij,bjo->bio", H128, wb.reshape(n_in // 128, 128, n_out)).reshape(n_in, n_out)
    m = (m.reshape(n_in, n_out // 128, 128) @ H128).reshape(n_in, n_out) / 128.0
    return (su[:, None] * m * sv[None, :]).T


def reference_of(module, ref):
    """The reference's weight for EXL3 module `module`, [out, in] float64, and its name."""
    m = EXPERT.match(module)
    if not m:
        name = f"{module}.weight"
        return name, (stored.values(*ref[name]) if name in ref else None)
    stack, e, leaf = m.group(1), int(m.group(2)), m.group(3)
    name = f"{stack}.{'down_proj' if leaf == 'down_proj' else 'gate_up_proj'}"
    if name not in ref:
        return name, None
    w = stored.values(*ref[name])
    if w is None or w.ndim != 3 or e >= w.shape[0]:
        return name, None
    w = w[e]
    if leaf != "down_proj":
        half = w.shape[0] // 2
        w = w[:half] if leaf == "gate_proj" else w[half:]
    return f"{name}[{e}]{'' if leaf == 'down_proj' else ' ' + leaf}", w


def differs(a, b):
    """Where a and b are not equal to within bf16 rounding: None, or a description."""
    if a.shape != b.shape:
        return f"shape {list(a.shape)} against {list(b.shape)}"
    both_nan = np.isnan(a) & np.isnan(b)
    tol = 2.0**-7 * np.maximum(np.abs(a), np.abs(b)) + 2.0**-16 * (np.nanmax(np.abs(b)) if b.size else 0.0)
    with np.errstate(invalid="ignore"):
        bad = ~((np.abs(a - b) <= tol) | both_nan | (a == b))
    if not bad.any():
        return None
    k = int(np.argmax(bad))
    idx = np.unravel_index(k, a.shape)
    return f"{int(bad.sum())} of {a.size} values differ (first at {list(map(int, idx))}: {a[idx]:.6g} against {b[idx]:.6g})"


def compare(out, ref_dir):
    """Problems of the EXL3 output's values against the bf16 reference: a list of strings."""
    ours, ref = stored.tensors(Path(out)), stored.tensors(Path(ref_dir))
    problems, covered = [], set()
    modules = sorted(n[: -len(".trellis")] for n in ours if n.endswith(".trellis"))
    for module in modules:
        name, want = reference_of(module, ref)
        covered.add(name.split("[")[0])
        if want is None:
            problems.append(f"{module}: the bf16 output has no {name} to compare with")
            continue
        cb = 1 if f"{module}.mcg" in ours else 2 if f"{module}.mul1" in ours else 0
        try:
            got = decode_linear(ours[f"{module}.trellis"], ours.get(f"{module}.suh"), ours.get(f"{module}.svh"), cb)
        except (ValueError, TypeError) as e:
            problems.append(f"{module}: {e}")
            continue
        why = differs(got, want)
        if why:
            problems.append(f"{module} decoded against the bf16 {name}: {why}")
    for name, t in sorted(ours.items()):
        if name.endswith(MARKERS):
            continue
        covered.add(name)
        if name not in ref:
            problems.append(f"{name} is in the EXL3 output, not in the bf16 one")
            continue
        a, b = stored.values(*t), stored.values(*ref[name])
        why = "not a number type" if a is None or b is None else differs(a, b)
        if why:
            problems.append(f"{name} against the bf16 output: {why}")
    missing = sorted(set(ref) - covered)
    if missing:
        problems.append(f"the bf16 output has {missing[:3]}{' …' if len(missing) > 3 else ''}, the EXL3 output not")
    return problems


# ---- the worker ------------------------------------------------------------------------------


class _Inert:
    """Whatever the stand-in extension is asked for: callable, with any attribute, doing nothing."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Inert()

    def __getattr__(self, name):
        return _Inert()


def _stand_in_extension():
    ext = types.ModuleType("exllamav3_ext")
    ext.__getattr__ = lambda name: _Inert()
    wrapper = types.ModuleType("exllamav3.ext")
    wrapper.exllamav3_ext = ext
    return wrapper


class Worker:
    def __init__(self):
        # Before the package is imported: `exllamav3.ext` would otherwise compile the extension.
        sys.modules.setdefault("exllamav3.ext", _stand_in_extension())
        import torch
        from exllamav3 import Config, Model
        from exllamav3.modules import Linear

        torch.set_num_threads(1)
        self.torch, self.Config, self.Model, self.Linear = torch, Config, Model, Linear

    def load(self, out):
        """exllamav3 builds the model and loads every module: (problems, warnings)."""
        torch = self.torch
        config = self.Config.from_directory(out)
        try:
            model = self.Model.from_config(config)
            read = set()
            stc = config.stc
            for method in ("get_tensor", "get_codebook_marker"):
                original = getattr(stc, method)

                def recording(key, *args, _original=original, **kwargs):
                    result = _original(key, *args, **kwargs)
                    if result is not None:
                        read.add(key)
                    return result

                setattr(stc, method, recording)
            for module in model.modules:
                module.load(torch.device("cpu"))
        finally:
            config.stc.close()
        problems = []
        for m in model:
            if not isinstance(m, self.Linear) or m.quant_type != "exl3":
                continue
            inner = m.inner
            if inner.trellis.dtype != torch.int16 or tuple(inner.trellis.shape[:2]) != (
                m.in_features // 16,
                m.out_features // 16,
            ):
                problems.append(f"{m.key}: trellis {tuple(inner.trellis.shape)} for {m.in_features}x{m.out_features}")
            if (tuple(inner.suh.shape), tuple(inner.svh.shape)) != ((m.in_features,), (m.out_features,)):
                problems.append(f"{m.key}: suh {tuple(inner.suh.shape)}, svh {tuple(inner.svh.shape)}")
        unread = sorted(k for k in stored.tensors(Path(out)) if k not in read and not k.startswith("mtp."))
        warnings = [f"exllamav3 reads no {unread[:4]}"] if unread else []
        return problems, warnings

    def judge(self, request):
        problems, warnings = self.load(request["out"])
        if problems:
            return {
                "problem": "exllamav3 loads mis-shaped EXL3 linears: " + "; ".join(problems[:3]),
                "signature": "exllamav3 loads a mis-shaped EXL3 linear",
                "warnings": warnings,
            }
        problems = compare(request["out"], request["ref"])
        if problems:
            return {
                "problem": "the EXL3 output differs from the bf16 conversion: " + "; ".join(problems[:3]),
                "signature": "EXL3 values differ from the bf16 conversion: " + re.sub(r"\d+", "N", problems[0])[:100],
                "warnings": warnings,
            }
        return {"warnings": warnings}
