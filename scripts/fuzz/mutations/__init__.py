"""The mutation kinds: each takes (ck, rng), edits the copied checkpoint and returns a description
of what it did. One module per concern (config, tokenizer and side files, shard headers, shapes,
dtypes, values); every kind registers itself with a weight. The registry is keyed by name and
always read in sorted order, so a seed draws the same kinds whichever module defines them."""

import random

KINDS = {}


def kind(weight=1.0):
    def reg(fn):
        KINDS[fn.__name__] = (fn, weight)
        return fn

    return reg


def family(name):
    """A kind's family, the prefix of its name: cfg, tok, tc, side, gen, st, w."""
    return name.split("_", 1)[0]


def kind_order(seed):
    names = sorted(KINDS)
    random.Random(f"{seed}:order").shuffle(names)
    return names


def weighted_kind(rng):
    names = sorted(KINDS)
    return rng.choices(names, weights=[KINDS[n][1] for n in names])[0]


def apply(ck, rng, name):
    """Applies kind `name` (or a pinned kind of PINNED): its description, or why it did not apply."""
    fn = PINNED.get(name) or KINDS[name][0]
    try:
        return f"{name}: {fn(ck, rng)}"
    except Exception as e:  # an earlier mutation can leave a file this one cannot edit
        return f"{name}: not applied ({type(e).__name__}: {e})"


# Registered on import; imported after KINDS and kind exist.
from . import config, dtypes, headers, shapes, tokenizer, values  # noqa: E402,F401

PINNED = {"chat_template_over_16mib": tokenizer.chat_template_over_16mib}
