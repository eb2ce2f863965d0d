"""Mutations of tensor shapes: the header's shape changed over the same bytes, or the first
dimension resized with the data cut or extended to match."""

import numpy as np

from . import kind


@kind(3)
def st_reshape(ck, rng):
    """Shape changed, bytes kept (header only)."""
    t = ck.pick_tensor(rng)
    shape = list(t[3])
    n = int(np.prod(shape)) if shape else 1
    choices = []
    if len(shape) >= 2:
        choices.append(shape[::-1])
        choices.append([shape[0] * shape[1]] + shape[2:])
    if n % 2 == 0:
        choices.append([n // 2, 2])
        choices.append([2, n // 2])
    choices.append([1] + shape)
    choices.append(shape + [1])
    choices.append([n])
    if n == 1:
        choices.append([])
    new = rng.choice(choices)

    def edit(s):
        s.find(t[1])[2] = new

    ck.edit_shard(t[0], edit)
    return f"{ck.rel(t[0])}: {t[1]} shape {shape} -> {new} (same bytes)"


@kind(3)
def st_resize(ck, rng):
    """The first dimension shrunk or grown, data cut or zero/copy-extended to match."""
    pattern = rng.choice(
        [
            ".",
            r"norm\.weight$",
            r"embed_tokens|lm_head",
            r"escha_code$",
            r"escha_(s_in|s_out|rin|rout)$",
            r"conv1d|in_proj_[ab]|mlp\.gate\.weight",
        ]
    )
    t = ck.pick_tensor(rng, pattern) or ck.pick_tensor(rng)
    shape = list(t[3])
    if not shape:
        shape = [1]
    d0 = shape[0]
    new0 = rng.choice([d0 // 2, d0 - 1, d0 + 1, d0 * 2, d0 + 44, 1])
    new0 = max(new0, 1)

    def edit(s):
        x = s.find(t[1])
        row = len(x[3]) // d0 if d0 else 0
        data = (
            x[3][: new0 * row]
            if new0 <= d0
            else x[3] + x[3][: (new0 - d0) * row] + bytes(max(0, (new0 - 2 * d0) * row))
        )
        x[2] = [new0] + shape[1:]
        x[3] = data

    ck.edit_shard(t[0], edit)
    return f"{ck.rel(t[0])}: {t[1]} shape {t[3]} -> {[new0] + shape[1:]} (data resized)"
