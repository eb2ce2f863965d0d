"""Mutations of the shard headers and the index that keep the files well formed (renamed,
dropped, added or moved tensors, the index, the metadata), and a few raw byte edits."""

import re
import struct

import numpy as np

from ..checkpoint import NP, PREFIX, Shard, layer_of, short
from . import kind

# shard headers: semantic edits that keep the files well formed

HUGE_LAYERS = [
    4,
    5,
    31,
    255,
    3999999999,
    4294967295,
    4294967296,
    18446744073709551615,
    18446744073709551616,
    99999999999999999999,
]


def rename_tensors(ck, renames, update_index=True):
    """Renames tensors (old -> new) in whichever shard holds them, and in the index."""
    for p in ck.shard_paths():
        try:
            s = Shard(p)
        except (ValueError, KeyError, TypeError, struct.error):
            continue
        hit = False
        for t in s.tensors:
            if t[0] in renames:
                t[0] = renames[t[0]]
                hit = True
        if hit:
            s.write(p)
    if update_index:

        def fix(wm):
            for old, new in renames.items():
                if old in wm:
                    wm[new] = wm.pop(old)

        ck.index_edit(fix)


@kind(3)
def st_rename_tensor_layer(ck, rng):
    t = ck.pick_tensor(rng, r"\.layers\.\d+\.")
    layer = layer_of(t[1])
    new = rng.choice(HUGE_LAYERS + ["-1", "01", "x", str(3 - layer if layer is not None else 0)])
    name = re.sub(r"\.layers\.\d+\.", f".layers.{new}.", t[1], count=1)
    upd = rng.random() < 0.85
    rename_tensors(ck, {t[1]: name}, upd)
    return f"{ck.rel(t[0])}: rename {t[1]} -> {name}{'' if upd else ' (index not updated)'}"


@kind(3)
def st_rename_layer(ck, rng):
    tensors = ck.all_tensors()
    src = rng.choice([0, 1, 2, 3])
    op = rng.choice(["move", "move", "swap"])
    if op == "swap":
        dst = rng.choice([x for x in (0, 1, 2, 3) if x != src])
        renames = {}
        for _, n, _, _ in tensors:
            if n.startswith(PREFIX) and layer_of(n) in (src, dst):
                other = dst if layer_of(n) == src else src
                renames[n] = re.sub(r"\.layers\.\d+\.", f".layers.{other}.", n, count=1)
        rename_tensors(ck, renames)
        return f"shards: layers {src} and {dst} swapped ({len(renames)} tensors)"
    dst = rng.choice(HUGE_LAYERS)
    renames = {
        n: re.sub(r"\.layers\.\d+\.", f".layers.{dst}.", n, count=1)
        for _, n, _, _ in tensors
        if n.startswith(PREFIX) and layer_of(n) == src
    }
    rename_tensors(ck, renames)
    return f"shards: layer {src} renamed to layer {dst} ({len(renames)} tensors)"


@kind(1)
def st_rename_mtp_layer(ck, rng):
    tensors = [t for t in ck.all_tensors() if t[1].startswith("mtp.layers.")]
    if not tensors:
        return "no mtp tensors"
    dst = rng.choice([1, 2, 3999999999, 18446744073709551616])
    renames = {n: n.replace("mtp.layers.0.", f"mtp.layers.{dst}.", 1) for _, n, _, _ in tensors}
    rename_tensors(ck, renames)
    return f"shards: mtp.layers.0 renamed to mtp.layers.{dst}"


@kind(3)
def st_drop_tensor(ck, rng):
    pattern = rng.choice(
        [
            ".",
            ".",
            r"escha_(s_in|s_out|config)$",
            r"weight_scale$",
            r"norm\.weight$",
            r"^mtp\.",
            r"conv1d|A_log|dt_bias|in_proj_[ab]",
            r"mlp\.gate\.weight|shared_expert",
        ]
    )
    t = ck.pick_tensor(rng, pattern) or ck.pick_tensor(rng)
    ck.edit_shard(t[0], lambda s: s.tensors.remove(s.find(t[1])))
    upd = rng.random() < 0.85
    if upd:
        ck.index_edit(lambda wm: wm.pop(t[1], None))
    return f"{ck.rel(t[0])}: drop {t[1]}{'' if upd else ' (index not updated)'}"


@kind(2)
def st_add_tensor(ck, rng):
    name, dtype, shape = rng.choice(
        [
            (f"{PREFIX}layers.0.mlp.extra.weight", "F16", [4]),
            ("model.visual.blocks.0.norm1.weight", "F16", [64]),
            ("mtp.layers.0.extra.weight", "F16", [128]),
            (f"{PREFIX}layers.3999999999.input_layernorm.weight", "F16", [128]),
            (f"{PREFIX}layers.4.input_layernorm.weight", "F16", [128]),
            ("lm_head.weight", "F16", [256, 128]),
            (f"{PREFIX}embed_tokens.weight", "F16", [256, 128]),
            (f"{PREFIX}layers.0.self_attn.q_proj.weight", "F16", [256, 128]),
            (f"{PREFIX}layers.0.mlp.up_proj.escha_x", "F32", [4]),
            ("mtp.layers.1.input_layernorm.weight", "F16", [128]),
            (f"{PREFIX}layers.0.linear_attn.norm.weight", "F16", [64]),
            ("", "F16", [1]),
            ("a\u0000b", "F16", [1]),
        ]
    )
    n = int(np.prod(shape))
    data = (np.full(n, 0.01, dtype="<f4").astype(NP[dtype])).tobytes()
    shards = ck.main_shards()
    p = rng.choice(shards)

    def edit(s):
        if s.find(name):
            s.find(name)[1:] = [dtype, shape, data]
        else:
            s.tensors.append([name, dtype, shape, data])

    ck.edit_shard(p, edit)
    ck.index_edit(lambda wm: wm.__setitem__(name, p.name))
    return f"{ck.rel(p)}: add {name!r} {dtype} {shape}"


@kind(1)
def st_metadata(ck, rng):
    p = rng.choice(ck.shard_paths())
    v = rng.choice([None, {"format": "tf"}, {"format": "pt", "x": "y" * 100_000}, {"format": 5}, {}, []])

    def edit(s):
        s.meta = v

    ck.edit_shard(p, edit)
    return f"{ck.rel(p)}: __metadata__ = {short(v)}"


@kind(1)
def st_move_tensor(ck, rng):
    shards = ck.main_shards()
    t = ck.pick_tensor(rng, ".", mtp=False)
    if len(shards) == 1:
        new = ck.root / "model-00002-of-00002.safetensors"
        s = Shard.__new__(Shard)
        s.meta, s.tensors = {"format": "pt"}, []
        s.write(new)
        shards.append(new)
    dst = rng.choice([p for p in shards if p != t[0]])
    holder = {}

    def take(s):
        x = s.find(t[1])
        s.tensors.remove(x)
        holder["x"] = x

    ck.edit_shard(t[0], take)
    ck.edit_shard(dst, lambda s: s.tensors.append(holder["x"]))
    ck.index_edit(lambda wm: wm.__setitem__(t[1], dst.name))
    return f"{t[1]} moved from {ck.rel(t[0])} to {ck.rel(dst)} (index updated)"


@kind(2)
def st_index(ck, rng):
    idx = ck.load("model.safetensors.index.json")
    wm = idx["weight_map"]
    op = rng.choice(["drop_entry", "wrong_shard", "phantom", "delete", "total_size", "empty_map"])
    if op == "delete":
        (ck.root / "model.safetensors.index.json").unlink()
        return "model.safetensors.index.json deleted"
    if op == "drop_entry":
        k = rng.choice(list(wm))
        del wm[k]
        desc = f"weight_map entry {k} dropped"
    elif op == "wrong_shard":
        k = rng.choice(list(wm))
        wm[k] = rng.choice(
            [s.name for s in ck.main_shards()] + ["mtp/model.safetensors", "model-00003-of-00003.safetensors"]
        )
        desc = f"weight_map {k} -> {wm[k]}"
    elif op == "phantom":
        wm[f"{PREFIX}layers.0.phantom.weight"] = ck.main_shards()[0].name
        desc = "phantom weight_map entry"
    elif op == "total_size":
        idx["metadata"] = {"total_size": rng.choice([0, -1, 2**64, "x"])}
        desc = f"metadata.total_size = {idx['metadata']['total_size']}"
    else:
        idx["weight_map"] = {}
        desc = "weight_map = {}"
    ck.save("model.safetensors.index.json", idx)
    return f"model.safetensors.index.json: {desc}"


@kind(1)
def st_raw_bytes(ck, rng):
    p = rng.choice(ck.shard_paths())
    b = bytearray(p.read_bytes())
    n = struct.unpack("<Q", b[:8])[0]
    op = rng.choice(["header_byte", "truncate", "header_len", "data_tail"])
    if op == "header_byte":
        at = 8 + rng.randrange(n)
        b[at] = rng.randrange(256)
        desc = f"header byte {at} = {b[at]}"
    elif op == "truncate":
        keep = rng.randrange(len(b))
        b = b[:keep]
        desc = f"cut to {keep} bytes"
    elif op == "header_len":
        v = rng.choice([0, n - 8, n + 8, len(b), 2**63])
        b[:8] = struct.pack("<Q", v)
        desc = f"header length {n} -> {v}"
    else:
        b += bytes(rng.choice([1, 8, 4096]))
        desc = "bytes appended after the data"
    p.write_bytes(bytes(b))
    return f"{ck.rel(p)}: {desc}"


@kind(2)
def st_bias(ck, rng):
    """A bias added to (or replaced on) a linear: its own width or another, in a float dtype or
    not, with ordinary or extreme values (beyond f16, which exllamav3 narrows biases to)."""
    t = ck.pick_tensor(rng, r"\.(escha_code|weight_int8|weight)$")
    module = re.sub(r"\.(escha_code|weight_int8|weight)$", "", t[1])
    rout = next((x for x in ck.all_tensors() if x[1] == f"{module}.escha_rout"), None)
    width = rout[3][-1] if rout else (t[3][0] if t[3] else 1)
    shape = rng.choice([[width], [width], [width + 1], [width // 2 or 1], [width, 1], [], [4, width]])
    dtype = rng.choice(["F16", "F16", "BF16", "F32", "F64", "I32"])
    value = rng.choice([0.01, -0.5, 70000.0, 1e30, float("nan"), 0.0])
    n = int(np.prod(shape)) if shape else 1
    with np.errstate(all="ignore"):
        if dtype == "BF16":
            f = np.full(n, value, dtype="<f4")
            data = ((f.view("<u4") + 0x8000) >> 16).astype("<u2").tobytes()
        else:
            data = np.full(n, value, dtype="<f8").astype(NP[dtype]).tobytes()
    name = f"{module}.bias"

    def edit(s):
        if s.find(name):
            s.find(name)[1:] = [dtype, shape, data]
        else:
            s.tensors.append([name, dtype, shape, data])

    ck.edit_shard(t[0], edit)
    ck.index_edit(lambda wm: wm.__setitem__(name, ck.rel(t[0])) if t[0].parent == ck.root else None)
    return f"{ck.rel(t[0])}: {name} = {dtype} {shape} of {value:g}"


@kind(2)
def st_drop_layer(ck, rng):
    """One block before the last removed, the later blocks renumbered down, and the config to match
    (layer count, layer types, the full-attention interval): a smaller model that is still whole
    (its last block, the full-attention one, kept), so the conversion should succeed and its
    output load."""
    cfg = ck.config()
    tc = ck.text(cfg)
    n = tc.get("num_hidden_layers")
    if not isinstance(n, int) or n < 2:
        return "no layer count to shrink"
    k = rng.randrange(n - 1)
    gone = f"{PREFIX}layers.{k}."
    dropped = 0
    for p in ck.shard_paths():
        s = Shard(p)
        keep = [t for t in s.tensors if not t[0].startswith(gone)]
        if len(keep) != len(s.tensors):
            dropped += len(s.tensors) - len(keep)
            s.tensors = keep
            s.write(p)
    ck.index_edit(lambda wm: [wm.pop(x) for x in [x for x in wm if x.startswith(gone)]])
    # In ascending layer order: the index is renamed entry by entry, each into a name just vacated.
    later = sorted(
        (layer_of(name), name)
        for _, name, _, _ in ck.all_tensors()
        if name.startswith(PREFIX) and (layer_of(name) or 0) > k
    )
    renames = {name: name.replace(f"{PREFIX}layers.{i}.", f"{PREFIX}layers.{i - 1}.", 1) for i, name in later}
    rename_tensors(ck, renames)
    tc["num_hidden_layers"] = n - 1
    if isinstance(tc.get("layer_types"), list):
        tc["layer_types"] = tc["layer_types"][:k] + tc["layer_types"][k + 1 :]
        if tc["layer_types"][-1:] == ["full_attention"] and "full_attention" not in tc["layer_types"][:-1]:
            tc["full_attention_interval"] = n - 1
    if isinstance(tc.get("mlp_only_layers"), list):
        tc["mlp_only_layers"] = [x - (x > k) for x in tc["mlp_only_layers"] if x != k]
    ck.save("config.json", cfg)
    return f"layer {k} dropped ({dropped} tensors), later layers renumbered, num_hidden_layers {n - 1}"
