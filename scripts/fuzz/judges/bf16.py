"""The bf16 judge (transformers): `AutoModelForCausalLM.from_pretrained(OUT)` loads the output as
a user would (the class follows config.json's model type), on the CPU in float32 (the bf16
weights widened exactly), with no missing or mismatched key and no error message, and one forward
pass on a few tokens gives finite logits (mismatched sizes are asked for as loading info, not an
exception, so the verdict names the keys). Keys it reports as unexpected are a warning (it loads
without them). Non-finite logits with every stored value finite are the mutated model overflowing
in float32 (listed, not a failure); a stored non-finite value is a failure.
"""

from pathlib import Path

from . import stored
from .workers import judge_in_worker

TOKENS = [1, 17, 42, 99, 3, 128, 64, 7]


def available(ctx):
    return None


def check(ctx, case, res, out):
    judge_in_worker(ctx, "bf16", res, {"out": str(out)})


def nonfinite_logits(y, out, widened):
    """The verdict on logits `y` that are not all finite."""
    bad = ~y.isfinite()
    where = f"{int(bad.sum())} of {y.numel()} logits not finite"
    found = stored.nonfinite(Path(out))
    if found:
        return {
            "problem": f"{where}; non-finite values stored in the file: {'; '.join(found[:4])}",
            "signature": "non-finite logits: the file stores non-finite values",
        }
    return {"overflow": f"the model overflows in {widened} (every stored value finite)", "notes": [where]}


class Worker:
    def __init__(self):
        import torch
        import transformers

        torch.set_num_threads(1)
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        self.torch = torch
        self.transformers = transformers

    def judge(self, request):
        torch = self.torch
        out = request["out"]
        model, info = self.transformers.AutoModelForCausalLM.from_pretrained(
            out, output_loading_info=True, dtype=torch.float32, ignore_mismatched_sizes=True
        )
        reported = {k: sorted(map(str, v)) for k, v in info.items() if v}
        unexpected = reported.pop("unexpected_keys", None)
        warnings = [f"transformers ignores unexpected keys {unexpected[:4]}"] if unexpected else []
        if reported:
            what = ", ".join(f"{k} {v[:3]}{' …' if len(v) > 3 else ''}" for k, v in reported.items())
            return {
                "problem": f"transformers loads {type(model).__name__} with {what}",
                "signature": f"transformers reports {', '.join(sorted(reported))}",
                "warnings": warnings,
            }
        n = model.get_input_embeddings().num_embeddings
        tokens = [t % n for t in TOKENS] if n else TOKENS
        with torch.no_grad():
            y = model(torch.tensor([tokens])).logits
        verdict = {} if y.isfinite().all() else nonfinite_logits(y, out, "float32")
        verdict["warnings"] = warnings
        return verdict
