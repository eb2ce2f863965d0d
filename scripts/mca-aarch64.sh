#!/usr/bin/env bash
# Static throughput estimates for the aarch64 decode and reconstruction loops, with llvm-mca
# (docs/PERFORMANCE.md, section "aarch64 (NEON)", explains the method and the figures).
#
#   1. compiles the library for aarch64-unknown-linux-gnu to assembly as shipped (release
#      optimisation, one codegen unit, no LTO so that the library's own assembly is emitted);
#   2. cuts the innermost loops (label … backward branch) out of the functions below, checks each
#      loop's shape (how many bytes it stores per iteration, outside the stack), and runs
#      `llvm-mca -mcpu=apple-m1` on each as a loop body;
#   3. converts each loop's block reciprocal throughput (cycles per iteration) into cycles and ns
#      per weight at 3.2 GHz, and adds up decode, scatter and square transform.
#
# Usage: scripts/mca-aarch64.sh [CPU] [GHZ]   (defaults: apple-m1 3.2). Needs llvm-mca, python3,
# the aarch64 Rust target and linker (scripts/test-aarch64.sh installs them).
set -euo pipefail
cd "$(dirname "$0")/.."
cpu=${1:-apple-m1}
ghz=${2:-3.2}
target=aarch64-unknown-linux-gnu
out=$PWD/target/mca
mkdir -p "$out"
command -v llvm-mca >/dev/null || { echo "mca-aarch64: llvm-mca not found (Debian: apt-get install llvm)" >&2; exit 1; }

echo "== assembly ($target): the library as shipped" >&2
CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1 CARGO_TARGET_DIR=$out \
    cargo rustc --quiet --locked --release --target $target --lib -- --emit "asm=$out/lib.s"

echo "== llvm-mca -mcpu=$cpu ($(llvm-mca --version | grep -o 'LLVM version [0-9.]*'))" >&2
python3 - "$out" "$cpu" "$ghz" <<'EOF'
import re, subprocess, sys
from pathlib import Path

out, cpu, ghz = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
SQUARE = 128 * 128

def functions(path):
    """Symbol -> instruction and label lines (directives and comments dropped)."""
    funcs, cur = {}, None
    for line in path.read_text().splitlines():
        if re.match(r"^[_A-Za-z$][\w$.]*:$", line):
            cur = line[:-1]
            funcs[cur] = []
            continue
        if cur is None:
            continue
        s = line.split("//")[0].strip()
        if not s or (s.startswith(".") and not re.match(r"^\.LBB\w+:$", s)):
            continue
        funcs[cur].append(s)
    return funcs

def function(funcs, *needles):
    hits = [n for n in funcs if all(x in n for x in needles)]
    if len(hits) != 1:
        sys.exit(f"mca-aarch64: {len(hits)} functions match {needles}; update this script")
    return funcs[hits[0]]

def loops(body):
    """Innermost loops: the lines after label L up to a backward branch to L, with no other loop inside."""
    labels = {l[:-1]: i for i, l in enumerate(body) if l.endswith(":")}
    found = []
    for j, l in enumerate(body):
        m = re.match(r"^(?:b(?:\.\w+)?|cbn?z|tbn?z)\s.*?(\.LBB\w+)$", l)
        if m and m.group(1) in labels and labels[m.group(1)] < j:
            found.append((labels[m.group(1)], j))
    inner = [(i, j) for i, j in found if not any((a, b) != (i, j) and i <= a and b <= j for a, b in found)]
    return [body[i + 1 : j + 1] for i, j in inner]

REG_BYTES = {"q": 16, "d": 8, "x": 8, "s": 4, "w": 4, "h": 2, "b": 1}
LANE_BYTES = {"b": 1, "h": 2, "s": 4, "d": 8}

def stored_bytes(loop):
    """Bytes stored per iteration, stack (spill) stores left out."""
    n = 0
    for l in loop:
        m = re.match(r"^(stp|stnp|stu?r[bh]?|st[1-4])\s+(.*)$", l)
        if not m or "[sp" in l:
            continue
        op, args = m.groups()
        regs = args.split("[")[0]
        if op.startswith(("st1", "st2", "st3", "st4")):
            n += sum(int(k) * LANE_BYTES[t] for k, t in re.findall(r"v\d+\.(\d+)([bhsd])", regs))
        elif op.endswith("rb"):
            n += 1
        elif op.endswith("rh"):
            n += 2
        else:
            n += sum(REG_BYTES[r] for r in re.findall(r"\b([qdxsw])\d+\b", regs))
    return n

def mca(lines):
    r = subprocess.run(["llvm-mca", "-mtriple=aarch64-linux-gnu", f"-mcpu={cpu}", "-iterations=300"],
                       input="\n".join(lines) + "\n", capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"mca-aarch64: llvm-mca failed:\n{r.stderr}")
    get = lambda key: float(re.search(rf"^{key}:\s+([\d.]+)", r.stdout, re.M).group(1))
    return get("Block RThroughput"), get("Total Cycles") / get("Iterations"), int(get("Instructions") / get("Iterations"))

def has(loop, *mnemonics):
    return any(l.split()[0] in mnemonics for l in loop)

def pick(body, what, expect_bytes, count=1, where=lambda l: True):
    sel = [l for l in loops(body) if where(l)]
    if len(sel) != count:
        sys.exit(f"mca-aarch64: {what}: {len(sel)} loops found, {count} expected; update this script")
    for l in sel:
        if stored_bytes(l) != expect_bytes:
            sys.exit(f"mca-aarch64: {what}: a loop stores {stored_bytes(l)} bytes per iteration, "
                     f"{expect_bytes} expected; update this script")
    return sel

measured = {}  # loop name -> (instructions, rthroughput, simulated, weights per iteration)

def add(name, loop, weights_per_iteration):
    rthr, sim, n = mca(loop)
    measured[name] = (n, rthr, sim, weights_per_iteration)

lib = functions(out / "lib.s")

# NEON decoder (the vector decoder's aarch64 entry): the group loop (8 weights; all but the first
# 2 of a tile's 32 groups), one per K and codebook, told apart by their instructions.
neon = function(lib, "6vector5entry")
kinds = {"MUL1": lambda l: has(l, "uaddlp"), "3INST": lambda l: has(l, "mla"),
         "MCG": lambda l: has(l, "fcvtn") and not has(l, "uaddlp", "mla")}
for cb, where in kinds.items():
    per_k = pick(neon, f"NEON {cb} group loop", 32, count=8, where=where)
    add(f"NEON decode, {cb} (slowest of K=1..8)", max(per_k, key=lambda l: mca(l)[0]), 8)

# Portable decoder: the state loop (one state per iteration) and the codebook loop (8 values).
states = function(lib, "portable14extract_states")
state_loop = pick(states, "portable state loop", 2, where=lambda l: has(l, "strh"))[0]
portable = function(lib, "PortableDecoder", "12decode_tiles")
kinds = {"3INST": lambda l: has(l, "mla"), "MCG": lambda l: has(l, "fadd") and not has(l, "mla", "ucvtf"),
         "MUL1": lambda l: has(l, "ucvtf")}
for cb, where in kinds.items():
    add(f"portable decode, {cb} values", pick(portable, f"portable {cb} loop", 32, where=where)[0], 8)
add("portable decode, window extraction", state_loop, 1)

# The scatter into the square (shared): one 32-value block of one tile per iteration.
add("scatter into the square", pick(function(lib, "reconstruct18scatter_transposed"), "scatter loop", 128)[0], 32)

# NEON square (inlined into finish_square): pass 1 once per half row, passes 2 and 3 256 times per
# square (64 weights each), the scaling 4 weights per iteration.
fin = function(lib, "CodedLinear13finish_square")
add("NEON square, pass 1", pick(fin, "NEON pass 1", 256, where=lambda l: has(l, "ld2"))[0], SQUARE / 256)
pass2, pass3 = pick(fin, "NEON passes 2 and 3", 256, count=2, where=lambda l: has(l, "fadd") and not has(l, "fmul", "ld2"))
add("NEON square, pass 2", pass2, SQUARE / 256)
add("NEON square, pass 3", pass3, SQUARE / 256)
add("NEON square, scaling", pick(fin, "NEON scaling", 16, where=lambda l: has(l, "fmul"))[0], 4)

# Portable square (the vector-less CPUs' path): fwht128 (one straight block, once per row; it
# stores the row back after each stage), fwht_across_rows' loop (16 values of two rows per
# iteration; 7 stages x 64 row pairs x 136/8 iterations per square, padding columns included) and
# the scaling loop (8 values per iteration).
f128 = function(lib, "hadamard7fwht128")
if loops(f128) or stored_bytes(f128) % 512:
    sys.exit("mca-aarch64: fwht128 is no longer one straight block over 128 floats; update this script")
add("portable square, fwht128 (per row)", f128, 128)
add("portable square, fwht_across_rows", pick(function(lib, "hadamard16fwht_across_rows"), "fwht_across_rows loop", 64,
    where=lambda l: has(l, "fadd") and any(".4s" in x for x in l))[0], SQUARE / (7 * 64 * 17))
add("portable square, scaling", pick(function(lib, "transform_scaled_portable"), "portable scale loop", 32,
    where=lambda l: any(".4s" in x for x in l))[0], 8)

per_weight = lambda name, i: measured[name][i] / measured[name][3]  # cycles per weight; i = 1 or 2
print(f"| loop | instructions | block RThroughput (cycles) | simulated (cycles) | weights per iteration "
      f"| cycles per weight | ns per weight at {ghz} GHz |")
print("|---|---|---|---|---|---|---|")
for name, (n, rthr, sim, w) in measured.items():
    print(f"| {name} | {n} | {rthr:.2f} | {sim:.2f} | {w:.4g} | {rthr / w:.3f} | {rthr / w / ghz:.3f} |")

print()
print(f"| decoder, codebook | decode, ns/weight | reconstruction, ns/weight | reconstruction, ns/weight "
      f"from simulated cycles |")
print("|---|---|---|---|")
for impl in ["NEON", "portable"]:
    square = [k for k in measured if k.startswith(f"{impl} square")] + ["scatter into the square"]
    for cb in ["MCG", "3INST", "MUL1"]:
        dec = [k for k in measured if k.startswith(f"{impl} decode") and (cb in k or "window" in k)]
        d = sum(per_weight(k, 1) for k in dec)
        r = d + sum(per_weight(k, 1) for k in square)
        r_sim = sum(per_weight(k, 2) for k in dec + square)
        print(f"| {impl}, {cb} | {d / ghz:.3f} | {r / ghz:.3f} | {r_sim / ghz:.3f} |")
EOF
