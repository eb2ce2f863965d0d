"""Shared fixtures for the Python tests."""

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# Helper modules next to the tests (escha_reference, testenv) import by bare name.
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

from testenv import IN_CI, unavailable  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI=true every collected test must run: a skip, whatever raised it, is reported as a failure."""
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which counts as a failure: {reason}"


@pytest.fixture(scope="session")
def repo_root():
    """The crate's root directory."""
    return REPO_ROOT


@pytest.fixture(scope="session")
def escha_convert(repo_root):
    """Path of the escha-convert binary: $ESCHA_CONVERT, else target/release/escha-convert (relative
    paths are taken from the repo root). Skips when it does not exist (fails under CI)."""
    p = Path(os.environ.get("ESCHA_CONVERT", "target/release/escha-convert"))
    if not p.is_absolute():
        p = repo_root / p
    if not p.is_file():
        unavailable(
            f"escha-convert binary not found at {p}: build it with `cargo build --release` "
            "(default target dir) or point ESCHA_CONVERT at it"
        )
    return p
