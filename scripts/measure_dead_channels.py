"""How much zeroing the dead MoE channels saves when re-quantizing `down_proj` to MLX affine.

Converts the MoE fixture to bf16 and to MLX (escha-convert zeroes the down_proj input columns of
channels whose gate and up rows are exactly zero), quantizes the bf16 down_proj with plain
`mx.quantize` (no zeroing), and compares both dequantized weights with the bf16 weight over the
live columns, the only ones that ever meet a non-zero activation.

    python3 scripts/measure_dead_channels.py [BITS] [GROUP_SIZE]
"""

import glob
import subprocess
import sys
import tempfile
from pathlib import Path

import mlx.core as mx

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "target" / "release" / "escha-convert"
bits = int(sys.argv[1]) if len(sys.argv) > 1 else 4
gs = int(sys.argv[2]) if len(sys.argv) > 2 else 64
mx.set_default_device(mx.cpu)


def load(d):
    w = {}
    for f in glob.glob(str(d / "model*.safetensors")):
        w.update(mx.load(f))
    return w


with tempfile.TemporaryDirectory() as tmp:
    bf16, mlx_out = Path(tmp) / "bf16", Path(tmp) / "mlx"
    fixture = ROOT / "fixtures" / "moe"
    subprocess.run([BIN, fixture, bf16, "--quiet"], check=True)
    subprocess.run([BIN, fixture, mlx_out, "--format", "mlx", "--bits", str(bits), "--group-size", str(gs), "--quiet"], check=True)
    dense, ours = load(bf16), load(mlx_out)
    totals = {"with zeroing": [0.0, 0.0], "plain mx.quantize": [0.0, 0.0]}
    for name in sorted(k for k in dense if k.endswith("mlp.experts.down_proj")):
        w = dense[name].astype(mx.float32)  # [E, H, I]
        gate_up = dense[name.replace("down_proj", "gate_up_proj")].astype(mx.float32)  # [E, 2I, H]
        inter = w.shape[-1]
        alive = mx.logical_or(mx.any(gate_up[:, :inter] != 0, axis=-1), mx.any(gate_up[:, inter:] != 0, axis=-1))  # [E, I]
        mask = alive[:, None, :].astype(mx.float32)
        stem = name.replace("model.language_model.", "language_model.model.").replace("experts.down_proj", "switch_mlp.down_proj")
        ours_w = mx.dequantize(ours[stem + ".weight"], ours[stem + ".scales"], ours[stem + ".biases"], gs, bits).astype(mx.float32)
        q, s, b = mx.quantize(dense[name], gs, bits)
        plain_w = mx.dequantize(q, s, b, gs, bits).astype(mx.float32)
        norm = mx.sum((w * mask) ** 2).item()
        for label, got in (("with zeroing", ours_w), ("plain mx.quantize", plain_w)):
            totals[label][0] += mx.sum(((got - w) * mask) ** 2).item()
            totals[label][1] += norm
    print(f"MoE fixture down_proj, {bits} bits, group {gs}, relative error over live columns:")
    for label, (err, norm) in totals.items():
        print(f"  {label:<18} {(err / norm) ** 0.5:.5f}")
