#!/usr/bin/env python3
"""Writes an Escha-W2 checkpoint made of very many tiny tensors, for the tensor-count benchmark
(scripts/bench-many-tensors.sh): what the per-tensor costs of planning, unit splitting, writing
and indexing add up to when the weights themselves are negligible.

    python3 scripts/make_many_tensors.py OUT_DIR [TENSORS] [SHARDS]

TENSORS (default 400000, rounded up to whole layers) tiny float16 tensors, in layers of 1000: one `input_layernorm.weight`
[64] (a norm, +1 in MLX layout) and 333 unfused experts × gate/up/down `weight` [4, 64] (stacked
into `switch_mlp` in MLX layout), plus one coded linear (`self_attn.o_proj`, 128×128, K=2: codes
I16 [8, 8, 32], rin and rout F16 [128]) so that the checkpoint is an Escha one. Tensors are spread
over SHARDS (default 8) files with a model.safetensors.index.json. Standard library only.
"""
import json
import os
import struct
import sys

PER_LAYER = 1000
EXPERTS = (PER_LAYER - 1) // 3


def f16_bytes(values):
    return struct.pack(f"<{len(values)}e", *values)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 400_000
    shards = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    os.makedirs(out, exist_ok=True)

    # A handful of data patterns, reused: the contents do not matter, only that they are finite.
    norms = [f16_bytes([((i * 7 + j) % 31 - 15) / 256 for j in range(64)]) for i in range(8)]
    weights = [f16_bytes([((i * 13 + j) % 61 - 30) / 512 for j in range(4 * 64)]) for i in range(8)]

    tensors = []  # (name, dtype, shape, bytes)
    coded = "model.language_model.layers.0.self_attn.o_proj"
    k = 2
    codes = bytes((i * 2654435761 >> 7) & 0xFF for i in range(8 * 8 * 16 * k * 2))
    tensors.append((f"{coded}.escha_code", "I16", [8, 8, 16 * k], codes))
    tensors.append((f"{coded}.escha_rin", "F16", [128], f16_bytes([0.01 * (1 if j % 3 else -1) for j in range(128)])))
    tensors.append((f"{coded}.escha_rout", "F16", [128], f16_bytes([1.0 if j % 5 else -1.0 for j in range(128)])))
    layers = -(-count // PER_LAYER)  # whole layers, so that every expert stack is complete
    for layer in range(layers):
        stem = f"model.language_model.layers.{layer}"
        tensors.append((f"{stem}.input_layernorm.weight", "F16", [64], norms[layer % 8]))
        for e in range(EXPERTS):
            for p, proj in enumerate(("gate_proj", "up_proj", "down_proj")):
                tensors.append((f"{stem}.mlp.experts.{e}.{proj}.weight", "F16", [4, 64], weights[(e + p) % 8]))

    per_shard = -(-len(tensors) // shards)
    weight_map = {}
    total = 0
    for s in range(shards):
        part = tensors[s * per_shard:(s + 1) * per_shard]
        if not part:
            break
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        header, offset = {}, 0
        for name, dtype, shape, data in part:
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
            offset += len(data)
            weight_map[name] = file
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(out, file), "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for _, _, _, data in part:
                f.write(data)
        total += offset
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"model_type": "qwen3_5", "quantization_config": {"quant_method": "escha"}}, f)
    print(f"{len(tensors)} tensors ({total / 1e6:.1f} MB) in {shards} shards, {layers} layers: {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
