"""Shared fixtures for the Python tests."""

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# Helper modules next to the tests (escha_reference) import by bare name.
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def repo_root():
    """The crate's root directory."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def escha_convert(repo_root):
    """Path of the escha-convert binary: $ESCHA_CONVERT, else target/release/escha-convert (relative
    paths are taken from the repo root). Skips when it does not exist."""
    p = Path(os.environ.get("ESCHA_CONVERT", "target/release/escha-convert"))
    if not p.is_absolute():
        p = repo_root / p
    if not p.is_file():
        pytest.skip(
            f"escha-convert binary not found at {p}: build it with `cargo build --release` "
            "(default target dir) or point ESCHA_CONVERT at it"
        )
    return p
