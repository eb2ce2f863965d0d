"""The judges: one module per client, each deciding whether an exit-0 output is accepted by the
client that format is for.

* `gguf` (llama.cpp): llama_logits loads the file and gives finite logits; non-finite logits are
  diagnosed by converting the same input again (f32, bf16);
* `bf16` (transformers): AutoModelForCausalLM loads OUT and one forward pass gives finite logits;
* `mlx` (mlx-lm): `mlx_lm.utils.load_model(OUT, strict=True)` and one forward pass, finite;
* `exl3` (exllamav3): every module of the model exllamav3 builds from OUT loads its tensors, and an
  independent NumPy decode of each trellis equals the bf16 conversion of the same input to within
  bf16 rounding.

The Python clients run in long-lived worker processes (`workers.py`, `serve.py`), one per client
and concurrent case, fed output paths; llama.cpp is a binary run per case. Every judge sets the
fields of the case's `Result`: `loaded` when the client accepted the output, `overflow` when
non-finite logits come from the mutated model's own values (not a failure), else `problems` and a
`signature` that classes the failure.
"""

from dataclasses import dataclass, field
from pathlib import Path

from .. import process


@dataclass
class Context:
    """What every judge may use: the binary, the limits, llama.cpp, the worker pools."""

    binary: str
    timeout: float
    llama_bin: str | None
    work: Path
    pools: dict = field(default_factory=dict)


@dataclass
class Case:
    """One case's converted input and options, so a judge can convert the same input again."""

    i: int
    src: Path
    opts: list
    dir: Path

    def convert(self, ctx, out, opts):
        return process.convert(ctx.binary, self.src, out, opts, ctx.timeout)


def judge_module(fmt):
    """The judge of output format `fmt`."""
    from . import bf16, exl3, gguf, mlx

    return {"gguf": gguf, "bf16": bf16, "mlx": mlx, "exl3": exl3}[fmt]
