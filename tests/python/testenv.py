"""What the Python tests need from their environment, and what happens when it is missing.

Run by hand, a test whose package (MLX, mlx-lm, torch, transformers) or escha-convert binary is missing is
skipped with the reason. Under CI=true (set by GitHub Actions, GitLab CI and most other services) the same
thing fails the run, so that a broken set-up cannot pass as a green run in which nothing ran; conftest.py
also turns any other skip into a failure there.
"""

import importlib
import os

import pytest

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def unavailable(reason):
    """Skip (fail under CI) because something the test needs is not there. Usable at module level."""
    if IN_CI:
        pytest.fail(f"{reason} [CI=true: a missing test dependency fails the run]", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require(module):
    """Import `module` and return it, or skip (fail under CI) with the import error."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        unavailable(f"cannot import {module} ({e}); scripts/test.sh installs tests/python/requirements.txt")
