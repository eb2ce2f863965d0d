"""A heavy-tailed importance matrix in llama-imatrix's GGUF format for every weight matrix of a
checkpoint's GGUF conversion (the tensors `escha-convert IN - --format gguf --dry-run --json`
lists, but the embedding and the convolutions, which llama-imatrix records no entry for): each
input column's mean squared activation log-normal (sigma 2.5), as real matrices' few loud columns
are. For benchmarks on the synthetic checkpoints, which no text has run through.

    .venv/bin/python scripts/synthetic_imatrix.py IN OUT.imatrix.gguf [ESCHA_CONVERT]
"""

import json
import subprocess
import sys
import tempfile

import gguf
import numpy as np


def main(src, out, binary="target/release/escha-convert"):
    with tempfile.TemporaryDirectory() as tmp:
        plan = subprocess.run([binary, src, f"{tmp}/plan", "--format", "gguf", "--gguf-vocab", "none",
                               "--dry-run", "--json", "--quiet"], check=True, capture_output=True, text=True)
    rng = np.random.default_rng(0x1A7)
    w = gguf.GGUFWriter(out, arch="imatrix")
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", ["synthetic heavy-tailed"])
    w.add_uint32("imatrix.chunk_count", 100)
    w.add_uint32("imatrix.chunk_size", 512)
    for t in json.loads(plan.stdout)["tensors"]:
        shape = t["shape"]
        # llama-imatrix records the matrix multiplications' weights: not the embedding (a row
        # lookup) nor the linear-attention convolution.
        name = t["name"]
        if len(shape) < 2 or not name.endswith(".weight") or name == "token_embd.weight" or ".ssm_conv1d." in name:
            continue
        cols, mats = shape[-1], (shape[0] if len(shape) == 3 else 1)
        counts = np.full(mats, 51200.0)
        mean_square = np.exp(rng.normal(0.0, 2.5, size=(mats, cols))) * 1e-2
        w.add_tensor(f"{t['name']}.in_sum2", (mean_square * counts[:, None]).astype(np.float32))
        w.add_tensor(f"{t['name']}.counts", counts.astype(np.float32).reshape(-1, 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
