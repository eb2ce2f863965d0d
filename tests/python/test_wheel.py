"""The Python wheel (pyproject.toml: maturin's `bin` bindings, the binary alone, as ruff and uv ship):
maturin builds it, pip installs it into a fresh virtual environment, and the `escha-convert` that
puts on that environment's PATH converts the bundled fixtures to the same bytes as the cargo-built
binary under test ($ESCHA_CONVERT).

The wheel is built with the release profile in the crate's own target directory ($CARGO_TARGET_DIR,
else target/), and maturin's cargo invocation is the one `cargo build --release --locked` makes, so
neither build repeats the other: after the README's `cargo run --release` maturin only packages the
binary, and in .ci/run the release build this test makes is the one scripts/test-aarch64.sh uses
next. `--strip false` is what keeps the two invocations identical: pyproject.toml strips the wheels
it publishes, and stripping here would relink target/release/escha-convert.
"""

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from testenv import require, unavailable

# The release build from nothing (dependencies included) took 194 s on a 2-core machine busy with
# other builds; packaging an up-to-date build, about a second.
BUILD_TIMEOUT = 3600
TIMEOUT = 300

# Fixture, then options: the dense and the MoE fixture, through the three writers (HF bf16, MLX affine,
# GGUF with a K-quant mixture), each output file compared byte for byte.
CONVERSIONS = [
    ("dense", []),
    ("dense", ["--format", "mlx"]),
    ("moe", ["--format", "gguf", "--gguf-type", "q4_k_m"]),
    ("moe", ["--format", "mlx", "--bits", "auto"]),
]


def run(cmd, what, timeout=TIMEOUT, **kw):
    try:
        r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} did not finish in {timeout} s")
    assert r.returncode == 0, f"{what} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def cargo_package(repo_root):
    with open(repo_root / "Cargo.toml", "rb") as f:
        return tomllib.load(f)["package"]


@pytest.fixture(scope="module")
def wheel(repo_root, tmp_path_factory):
    """The wheel maturin builds from the checkout (release profile, the crate's target directory)."""
    require("maturin")
    if shutil.which("cargo") is None:
        unavailable("cargo not found on PATH: maturin builds the wheel with it")
    out = tmp_path_factory.mktemp("wheel")
    run([sys.executable, "-m", "maturin", "build", "--release", "--locked", "--strip", "false", "--out", out],
        "maturin build", timeout=BUILD_TIMEOUT, cwd=repo_root)
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, f"maturin wrote {[w.name for w in wheels]}, not one wheel"
    return wheels[0]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """A fresh virtual environment with the wheel installed: its bin directory (Scripts on Windows)."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    run([sys.executable, "-m", "venv", venv], "python -m venv")
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    run([bindir / "python", "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
         "--disable-pip-version-check", wheel], "pip install of the wheel")
    return bindir


def env_with(bindir):
    """The environment an activated venv gives: its bin directory first on PATH."""
    path = f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "VIRTUAL_ENV": str(bindir.parent)}


def files(root):
    """Every file under root (hidden ones included): relative path -> bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_wheel_metadata_and_contents(wheel, cargo_package):
    version = cargo_package["version"]
    assert wheel.name.startswith(f"escha_convert-{version}-py3-none-"), wheel.name
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = Parser().parsestr(z.read(f"escha_convert-{version}.dist-info/METADATA").decode())
    # The binary and the metadata: no Python package, nothing that imports.
    exe = "escha-convert.exe" if os.name == "nt" else "escha-convert"
    assert f"escha_convert-{version}.data/scripts/{exe}" in names
    assert all(n.startswith((f"escha_convert-{version}.data/scripts/", f"escha_convert-{version}.dist-info/"))
               for n in names), names
    assert f"escha_convert-{version}.dist-info/licenses/LICENSE" in names
    assert meta["Name"] == "escha-convert"
    assert meta["Version"] == version
    assert meta["Summary"] == cargo_package["description"]
    assert meta["License-Expression"] == cargo_package["license"] == "MIT"
    assert meta["Requires-Python"]
    assert meta.get_all("Classifier")
    assert meta.get_payload().lstrip().startswith("# escha-convert")  # README.md as the description


def test_installed_command_is_on_path(installed, cargo_package):
    env = env_with(installed)
    found = shutil.which("escha-convert", path=env["PATH"])
    assert found is not None and Path(found).parent == installed, found
    r = run(["escha-convert", "-V"], "escha-convert -V", env=env)
    assert r.stdout.split() == ["escha-convert", cargo_package["version"]]
    # --version adds the commit, features, target and profile of the build, one a line.
    r = run(["escha-convert", "--version"], "escha-convert --version", env=env)
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["escha-convert", cargo_package["version"]]
    assert [line.split(":")[0] for line in lines[1:]] == ["commit", "features", "target", "profile"], r.stdout


@pytest.mark.parametrize("fixture,options", CONVERSIONS, ids=[" ".join([f, *o]) for f, o in CONVERSIONS])
def test_installed_command_writes_the_same_bytes(installed, escha_convert, repo_root, tmp_path, fixture, options):
    src = repo_root / "fixtures" / fixture
    ours = tmp_path / "cargo"
    theirs = tmp_path / "wheel"
    run([escha_convert, "convert", src, ours, "--quiet", *options], f"{escha_convert} {fixture} {options}")
    run(["escha-convert", "convert", src, theirs, "--quiet", *options], f"installed escha-convert {fixture} {options}",
        env=env_with(installed))
    a, b = files(ours), files(theirs)
    assert sorted(a) == sorted(b)
    assert len(a) >= 2
    differ = [name for name in a if a[name] != b[name]]
    assert not differ, f"the installed command wrote different bytes in {differ}"
