"""The mlx judge (mlx-lm): `mlx_lm.utils.load_model(OUT, strict=True)` on the CPU builds the model
from config.json and loads every weight (none missing, none left over, every shape right), and one
forward pass on a few tokens gives finite logits. Non-finite logits with every stored value finite
are the mutated model's values overflowing (the forward is rerun with the weights widened to
float32 to say whether float32 overflows too; listed, not a failure); a stored non-finite value is
a failure.
"""

from pathlib import Path

import numpy as np

from . import stored
from .workers import judge_in_worker

TOKENS = [1, 17, 42, 99, 3, 128, 64, 7]


def available(ctx):
    return None


def check(ctx, case, res, out):
    judge_in_worker(ctx, "mlx", res, {"out": str(out)})


class Worker:
    def __init__(self):
        import mlx.core as mx
        from mlx.utils import tree_flatten, tree_map
        from mlx_lm.utils import load_model

        mx.set_default_device(mx.cpu)
        self.mx, self.load_model, self.tree_flatten, self.tree_map = mx, load_model, tree_flatten, tree_map

    def vocab(self, model):
        """The rows of the token embedding (its first dimension, quantized or not)."""
        for name, p in self.tree_flatten(model.parameters()):
            if name.endswith("embed_tokens.weight"):
                return p.shape[0]
        return None

    def forward(self, model, tokens):
        mx = self.mx
        return np.array(model(mx.array([tokens])).astype(mx.float32))

    def judge(self, request):
        mx = self.mx
        out = request["out"]
        model, _ = self.load_model(Path(out), strict=True)
        n = self.vocab(model)
        tokens = [t % n for t in TOKENS] if n else TOKENS
        y = self.forward(model, tokens)
        if np.isfinite(y).all():
            return {}
        where = f"{int((~np.isfinite(y)).sum())} of {y.size} logits not finite"
        found = stored.nonfinite(Path(out))
        if found:
            return {
                "problem": f"{where}; non-finite values stored in the file: {'; '.join(found[:4])}",
                "signature": "non-finite logits: the file stores non-finite values",
            }
        widened = self.tree_map(
            lambda x: x.astype(mx.float32) if mx.issubdtype(x.dtype, mx.floating) else x, model.parameters()
        )
        model.update(widened)
        finite32 = bool(np.isfinite(self.forward(model, tokens)).all())
        why = "activations overflow in bfloat16 (float32 finite)" if finite32 else "the model overflows in float32 too"
        return {"overflow": f"{why}; every stored value finite", "notes": [where]}
