"""What each case is: the fixture, the output format, the mutation kinds and the options, all a
pure function of the run's seed, the case number and the formats the run covers, so that
`--seed S --only N` re-runs case N alone."""

import random

from .mutations import kind_order, weighted_kind

FIXTURES = ("dense", "moe")
FORMATS = ("gguf", "bf16", "mlx", "exl3")


def format_options(fmt, rng):
    """The options a case of format `fmt` is converted with (--format first)."""
    opts = ["--format", fmt]
    if fmt == "gguf":
        opts += ["--gguf-type", rng.choices(["q4_k_m", "q8_0", "auto", "bf16"], weights=[3, 2.5, 2.5, 2])[0]]
        if rng.random() < 0.25:
            opts += ["--gguf-vocab", "none"]
    elif fmt == "mlx":
        opts += ["--bits", rng.choices(["2", "3", "4", "5", "6", "8", "auto"], weights=[1, 1, 3, 1, 1, 2, 1])[0]]
        opts += ["--group-size", rng.choice(["32", "64", "128"])]
        if rng.random() < 0.3:
            opts += ["--int8", "requant"]
    elif rng.random() < 0.4:  # bf16, exl3
        opts += ["--bias", "keep"]
    if rng.random() < 0.25:
        opts += ["--max-shard-size", rng.choice(["200K", "200K", "100K", "300KB", "64KiB"])]
    r = rng.random()
    if r < 0.25:
        opts += ["--mtp", "drop"]
    elif r < 0.5 and fmt != "mlx":  # the MLX layout has no MTP head: keep is a usage error there
        opts += ["--mtp", "keep"]
    return opts


def plan_case(seed, i, formats):
    """(rng, fixture, format, mutation kinds, options) of case i.

    Case 1 always carries a chat template just over 16 MiB (in GGUF when the run covers it). Case 0
    and the cases from 2 on first walk every (kind, format) pair once, kinds in a seeded order, so a
    run of more cases than kinds times formats tries every kind in every format."""
    order = kind_order(seed)
    rng = random.Random(f"{seed}:{i}")
    fixture = rng.choice(FIXTURES)
    j = i - (i > 1)
    if i == 1:
        fmt = "gguf" if "gguf" in formats else formats[0]
        kinds = ["chat_template_over_16mib"]
    elif j < len(order) * len(formats):
        fmt = formats[j % len(formats)]
        kinds = [order[j // len(formats)]]
    else:
        fmt = rng.choice(formats)
        kinds = [weighted_kind(rng)]
    while rng.random() < 0.3 and len(kinds) < 3:
        kinds.append(weighted_kind(rng))
    return rng, fixture, fmt, kinds, format_options(fmt, rng)
