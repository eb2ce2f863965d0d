"""The MLX quantization step of `mlx_lm.convert -q`, applied to a dense bf16 checkpoint: every
weight matrix MLX can quantize goes through `mx.quantize`, and the result is written in mlx-lm's
shards. Used by scripts/bench-convert.sh as the path a user would take without escha-convert
(bf16 conversion, then MLX quantization) on checkpoints too partial for mlx-lm to build a model.

    python3 scripts/mlx_quantize_baseline.py SRC_DIR DST_DIR [BITS] [GROUP_SIZE]
"""

import glob
import json
import os
import sys

import mlx.core as mx
from mlx_lm.utils import make_shards

src, dst = sys.argv[1], sys.argv[2]
bits = int(sys.argv[3]) if len(sys.argv) > 3 else 4
group_size = int(sys.argv[4]) if len(sys.argv) > 4 else 64
mx.set_default_device(mx.cpu)

weights = {}
for f in sorted(glob.glob(os.path.join(src, "model*.safetensors"))):
    weights.update(mx.load(f))
out = {}
for name, w in weights.items():
    if name.endswith(".weight") and w.ndim >= 2 and w.shape[-1] % group_size == 0:
        q, s, b = mx.quantize(w, group_size=group_size, bits=bits)
        stem = name[: -len(".weight")]
        out[name], out[stem + ".scales"], out[stem + ".biases"] = q, s, b
    else:
        out[name] = w
os.makedirs(dst, exist_ok=True)
shards = make_shards(out)
for i, shard in enumerate(shards):
    mx.save_safetensors(os.path.join(dst, f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"), shard, metadata={"format": "mlx"})
    del shard
with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump({"quantization": {"group_size": group_size, "bits": bits}}, f)
