"""Mutations of config.json: hostile numbers, layer types, heads, widths, vocabulary, experts,
special ids, rope, architecture names, the quantization config, broken files."""

from ..checkpoint import PREFIX, Raw, short
from . import kind

HOSTILE = [
    0,
    -1,
    1,
    2,
    3,
    7,
    129,
    2**31 - 1,
    2**31,
    2**32,
    2**53 + 1,
    2**63,
    2**64 + 1,
    1e30,
    1e308,
    Raw("1e400"),
    Raw("NaN"),
    0.5,
    1.5,
    -0.0,
    "4",
    "",
    None,
    True,
    [],
    {},
    [1, 2],
]


def set_config(ck, rng, key, values, top=0.15):
    """Sets key in text_config (or, with probability `top`, at the top level) to one of values."""
    cfg = ck.config()
    if cfg is None:
        return "config.json unreadable: nothing set"
    target = cfg if rng.random() < top else ck.text(cfg)
    where = "config.json" if target is cfg else "config.json text_config"
    v = rng.choice(values)
    old = target.get(key, "<absent>")
    target[key] = v
    ck.save("config.json", cfg)
    return f"{where}.{key}: {short(old, 30)} -> {short(v)}"


@kind(2)
def cfg_delete_key(ck, rng):
    cfg = ck.config()
    if rng.random() < 0.2:
        key = rng.choice(list(cfg))
        del cfg[key]
        ck.save("config.json", cfg)
        return f"config.json: delete {key}"
    tc = ck.text(cfg)
    key = rng.choice(list(tc))
    del tc[key]
    ck.save("config.json", cfg)
    return f"config.json: delete text_config.{key}"


@kind(2)
def cfg_number(ck, rng):
    cfg = ck.config()
    tc = ck.text(cfg)
    nums = [k for k, v in tc.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    key = rng.choice(nums)
    return set_config(ck, rng, key, HOSTILE, top=0.0)


@kind(2)
def cfg_layer_types(ck, rng):
    cfg = ck.config()
    tc = ck.text(cfg)
    lt = list(tc.get("layer_types", []))
    op = rng.choice(["set", "set", "drop", "append", "empty", "all_full", "all_linear", "reverse", "string", "long"])
    if op == "set" and lt:
        i = rng.randrange(len(lt))
        v = rng.choice(["full_attention", "linear_attention", "sliding_attention", "", "Full_Attention", None, 3])
        lt[i] = v
        desc = f"layer_types[{i}] = {short(v)}"
    elif op == "drop":
        lt = lt[:-1]
        desc = "layer_types: last entry dropped"
    elif op == "append":
        lt.append(rng.choice(["full_attention", "linear_attention"]))
        desc = f"layer_types: {lt[-1]} appended"
    elif op == "empty":
        lt = []
        desc = "layer_types = []"
    elif op == "all_full":
        lt = ["full_attention"] * len(lt)
        desc = "layer_types all full_attention"
    elif op == "all_linear":
        lt = ["linear_attention"] * len(lt)
        desc = "layer_types all linear_attention"
    elif op == "reverse":
        lt = lt[::-1]
        desc = "layer_types reversed"
    elif op == "string":
        lt = "linear_attention"
        desc = 'layer_types = "linear_attention"'
    else:
        lt = (lt * 3)[:8]
        desc = "layer_types: 8 entries"
    tc["layer_types"] = lt
    ck.save("config.json", cfg)
    return f"config.json text_config.{desc}"


@kind(1)
def cfg_attention_interval(ck, rng):
    return set_config(ck, rng, "full_attention_interval", [0, 1, 2, 3, 5, -4, 2**32, None, "4"], top=0.0)


@kind(3)
def cfg_heads(ck, rng):
    key = rng.choice(
        [
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
        ]
    )
    return set_config(ck, rng, key, [0, 1, 2, 3, 4, 8, 32, 64, 256, -1, 2**31, 2**32 + 1], top=0.0)


@kind(2)
def cfg_hidden(ck, rng):
    key = rng.choice(
        ["hidden_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"]
    )
    return set_config(ck, rng, key, [0, 1, 64, 127, 129, 256, 512, 2**31, 2**40], top=0.1)


@kind(2)
def cfg_vocab(ck, rng):
    return set_config(
        ck,
        rng,
        "vocab_size",
        [0, 1, 2, 200, 247, 248, 252, 253, 255, 257, 300, 512, 65536, 2**31, 2**32 + 256, -256],
        top=0.2,
    )


@kind(2)
def cfg_layers(ck, rng):
    return set_config(ck, rng, "num_hidden_layers", [0, 1, 3, 5, 8, 2**31, 3999999999, -1], top=0.1)


@kind(3)
def cfg_experts(ck, rng):
    key, values = rng.choice(
        [
            ("num_experts", [0, 1, 2, 3, 8, 256, -1]),
            ("num_experts_per_tok", [0, -1, 1, 3, 4, 5, 64, 2**31, 2**32 + 2]),
            ("num_experts_per_tok", [0, 4, 5]),
            ("decoder_sparse_step", [0, 2, 3, -1]),
            ("mlp_only_layers", [[0], [3], [0, 1, 2, 3], [9], [-1], "0"]),
            ("norm_topk_prob", [False, "yes", None, 2]),
        ]
    )
    return set_config(ck, rng, key, values, top=0.0)


@kind(3)
def cfg_special_ids(ck, rng):
    key = rng.choice(["bos_token_id", "eos_token_id", "pad_token_id"])
    values = [256, 257, 1000, -1, -2, 2**31, 2**32, 2**64, None, "2", 1.5, [2, 256], [], [2, 2], [-1], [2, 250]]
    return set_config(ck, rng, key, values, top=0.4)


@kind(2)
def cfg_rope(ck, rng):
    cfg = ck.config()
    tc = ck.text(cfg)
    rp = tc.get("rope_parameters")
    rp = rp if isinstance(rp, dict) else {}
    op = rng.choice(["theta", "partial", "mrope", "type", "delete", "legacy", "maxpos", "scaling", "yarn"])
    if op == "theta":
        v = rng.choice([0, -1, 1e-30, 1e308, "x", None, Raw("1e400")])
        rp["rope_theta"] = v
        desc = f"rope_parameters.rope_theta = {short(v)}"
    elif op == "partial":
        v = rng.choice([0, 0.0001, 1.0, 2.0, -0.25, 0.3])
        rp["partial_rotary_factor"] = v
        desc = f"rope_parameters.partial_rotary_factor = {v}"
    elif op == "mrope":
        v = rng.choice([[], [64, 64, 64], [0, 0, 0], [1], [-1, 11, 10], None])
        rp["mrope_section"] = v
        desc = f"rope_parameters.mrope_section = {short(v)}"
    elif op == "type":
        v = rng.choice(["yarn", "linear", "dynamic", "llama3", "mrope", "", None])
        rp["rope_type"] = v
        if rng.random() < 0.5:
            rp["factor"] = rng.choice([0, 4.0, -1, 1e30])
        desc = f"rope_parameters.rope_type = {short(v)}, factor {rp.get('factor', '<absent>')}"
    elif op == "yarn":
        # The Qwen3.6 card's long-context setting, with one parameter perhaps taken hostile.
        rp.update({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024})
        key, v = rng.choice(
            [
                (None, None),
                ("factor", rng.choice([0, -4.0, 1e30, "4", None])),
                ("original_max_position_embeddings", rng.choice([0, -1, 1024.5, 2**40, None])),
                ("beta_fast", rng.choice([0, -32, 16, 1e308])),
                ("beta_slow", rng.choice([0, 2, -1])),
                ("mscale", rng.choice([1, 0, -1])),
                ("attention_factor", rng.choice([1.0, 0, -1])),
                ("truncate", rng.choice([False, True, "no"])),
                ("type", rng.choice(["linear", "yarn"])),
            ]
        )
        if key is not None:
            rp[key] = v
        desc = f"rope_parameters yarn{'' if key is None else f', {key} = {short(v)}'}"
    elif op == "delete":
        tc.pop("rope_parameters", None)
        ck.save("config.json", cfg)
        return "config.json: delete text_config.rope_parameters"
    elif op == "legacy":
        tc.pop("rope_parameters", None)
        tc["rope_theta"] = rng.choice([10000000, 0, -5])
        tc["partial_rotary_factor"] = 0.25
        ck.save("config.json", cfg)
        return f"config.json: rope_parameters replaced by rope_theta {tc['rope_theta']} at text_config level"
    elif op == "maxpos":
        v = rng.choice([0, 1, 2**40, -1])
        tc["max_position_embeddings"] = v
        ck.save("config.json", cfg)
        return f"config.json text_config.max_position_embeddings = {v}"
    else:
        tc["rope_scaling"] = rng.choice(
            [
                {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
                {"rope_type": "linear", "factor": 0},
                {"type": "yarn", "factor": -2.0},
                "yarn",
            ]
        )
        ck.save("config.json", cfg)
        return f"config.json text_config.rope_scaling = {short(tc['rope_scaling'])}"
    tc["rope_parameters"] = rp
    ck.save("config.json", cfg)
    return f"config.json text_config.{desc}"


@kind(1)
def cfg_eps(ck, rng):
    return set_config(ck, rng, "rms_norm_eps", [0, -1e-6, 1e30, 1, "1e-6", None, 1e-45], top=0.0)


@kind(1)
def cfg_tie(ck, rng):
    return set_config(ck, rng, "tie_word_embeddings", [True, "true", None, 1], top=0.5)


@kind(1)
def cfg_mtp(ck, rng):
    return set_config(ck, rng, "mtp_num_hidden_layers", [0, 2, 3, -1, 2**31, None, "1"], top=0.1)


@kind(2)
def cfg_arch(ck, rng):
    cfg = ck.config()
    op = rng.choice(["model_type", "architectures", "text_model_type"])
    if op == "model_type":
        v = rng.choice(["qwen3_5_moe", "qwen3_5", "qwen3_next", "qwen3", "llama", "", None])
        cfg["model_type"] = v
    elif op == "architectures":
        v = rng.choice(
            [
                [],
                ["Qwen3_5ForCausalLM"],
                ["Qwen3_5MoeForConditionalGeneration"],
                ["Qwen3_5ForConditionalGeneration"],
                ["X"],
                "Qwen3_5ForCausalLM",
                None,
            ]
        )
        cfg["architectures"] = v
    else:
        v = rng.choice(["qwen3_5_moe_text", "qwen3_5_text", "qwen3_next", "", None])
        ck.text(cfg)["model_type"] = v
    ck.save("config.json", cfg)
    return f"config.json {op} = {short(v)}"


@kind(1)
def cfg_flatten(ck, rng):
    cfg = ck.config()
    tc = cfg.pop("text_config", None)
    if isinstance(tc, dict):
        for k, v in tc.items():
            cfg.setdefault(k, v)
    ck.save("config.json", cfg)
    return "config.json: text_config's keys moved to the top level"


TEXT_TYPES = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}


@kind(2)
def cfg_text_nesting(ck, rng):
    """Nested and flattened text configs: a flat text model (valid), a flat one that also carries a
    text_config, a text_config inside the text_config, a nested config whose top-level type is the
    text model's, a vision_config inside the text part."""
    cfg = ck.config()
    tc = cfg.get("text_config")
    if not isinstance(tc, dict):
        return "config.json has no text_config: nothing to nest or flatten"
    op = rng.choice(["flat_text", "flat_with_text_config", "text_in_text", "top_text_type", "vision_in_text"])
    if op in ("flat_text", "flat_with_text_config"):
        flat = dict(tc)
        flat["model_type"] = TEXT_TYPES.get(cfg.get("model_type"), tc.get("model_type"))
        arch = [a.replace("ForConditionalGeneration", "ForCausalLM") for a in cfg.get("architectures") or []]
        if arch:
            flat["architectures"] = arch
        for k in ("tie_word_embeddings", "quantization_config"):
            if k in cfg:
                flat[k] = cfg[k]
        if op == "flat_with_text_config":
            flat["text_config"] = dict(tc)
        ck.save("config.json", flat)
        return f"config.json flattened to the text model ({flat['model_type']}){' plus its text_config' if op != 'flat_text' else ''}"
    if op == "text_in_text":
        tc["text_config"] = dict(tc)
    elif op == "top_text_type":
        cfg["model_type"] = TEXT_TYPES.get(cfg.get("model_type"), "qwen3_5_text")
    else:
        tc["vision_config"] = cfg.get("vision_config", {"depth": 1})
    ck.save("config.json", cfg)
    return f"config.json: {op.replace('_', ' ')}"


@kind(2)
def cfg_quant(ck, rng):
    cfg = ck.config()
    q = cfg.get("quantization_config")
    op = rng.choice(["method", "bits", "ignore", "layer_meta", "delete", "meta_k"])
    if op == "delete":
        cfg.pop("quantization_config", None)
        desc = "delete quantization_config"
    elif op == "method":
        v = rng.choice(["escha", "eschamoe", "exl3", "gptq", "", None])
        q["quant_method"] = v
        desc = f"quantization_config.quant_method = {short(v)}"
    elif op == "bits":
        v = rng.choice([4, 0, -2, 16, "2"])
        q["bits"] = v
        desc = f"quantization_config.bits = {short(v)}"
    elif op == "ignore":
        v = rng.choice([[], ["lm_head"], ["model.language_model"], None, "lm_head"])
        q["ignore"] = v
        desc = f"quantization_config.ignore = {short(v)}"
    elif op == "layer_meta":
        q.pop("layer_meta", None)
        desc = "delete quantization_config.layer_meta"
    else:
        lm = q.get("layer_meta") or {}
        if lm:
            name = rng.choice(list(lm))
            field = rng.choice(["K", "in_features", "out_features", "bits"])
            v = rng.choice([0, 1, 9, 3, 1024, -1])
            lm[name][field] = v
            desc = f"quantization_config.layer_meta[{name}].{field} = {v}"
        else:
            q["layer_meta"] = {f"{PREFIX}layers.0.mlp.experts.gate_up_proj": {"K": 9}}
            desc = "quantization_config.layer_meta with K 9"
    ck.save("config.json", cfg)
    return f"config.json {desc}"


def pointers(v, at=()):
    out = []
    if isinstance(v, dict):
        for k, c in v.items():
            out += pointers(c, at + (k,))
    elif isinstance(v, list):
        for i, c in enumerate(v):
            out += pointers(c, at + (i,))
    out.append(at)
    return out


def replace_node(ck, rng, name):
    doc = ck.load(name)
    if doc is None:
        return f"{name} unreadable: nothing replaced"
    ps = [p for p in pointers(doc) if p]
    p = rng.choice(ps)
    v = rng.choice(HOSTILE)
    node = doc
    for k in p[:-1]:
        node = node[k]
    node[p[-1]] = v
    ck.save(name, doc)
    return f"{name}: node /{'/'.join(map(str, p))} = {short(v)}"


@kind(2)
def cfg_hostile_node(ck, rng):
    return replace_node(ck, rng, "config.json")


def break_file(ck, rng, name):
    p = ck.root / name
    op = rng.choice(["delete", "truncate", "empty", "list", "number", "bad_utf8"])
    if op == "delete":
        p.unlink(missing_ok=True)
    elif op == "truncate":
        b = p.read_bytes()
        p.write_bytes(b[: len(b) // 2])
    elif op == "empty":
        p.write_bytes(b"")
    elif op == "list":
        p.write_text("[]")
    elif op == "number":
        p.write_text("5")
    else:
        p.write_bytes(p.read_bytes().replace(b"{", b"{\xff\xfe", 1))
    return f"{name}: {op}"


@kind(1)
def cfg_broken(ck, rng):
    return break_file(ck, rng, "config.json")


@kind(1)
def cfg_activation(ck, rng):
    key, values = rng.choice(
        [
            ("attn_output_gate", [False, None, "yes"]),
            ("hidden_act", ["gelu", "relu", "unknown", None]),
            ("attention_bias", [True, "x"]),
        ]
    )
    return set_config(ck, rng, key, values, top=0.0)


@kind(1)
def cfg_vision(ck, rng):
    cfg = ck.config()
    v = rng.choice(["delete", None, {}, {"depth": 0}])
    if v == "delete":
        cfg.pop("vision_config", None)
    else:
        cfg["vision_config"] = v
    ck.save("config.json", cfg)
    return f"config.json vision_config: {short(v)}"


@kind(1)
def cfg_dtype(ck, rng):
    key = rng.choice(["dtype", "torch_dtype"])
    return set_config(ck, rng, key, ["float16", "float32", "int8", "float64", "", None, 5, "auto"], top=0.5)
