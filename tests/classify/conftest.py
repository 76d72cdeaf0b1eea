"""Fixtures for `osprey classify` tests: the binary, a CLI runner with a timeout, and the demo model directory."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from pytest_support import cli_runner, osprey_bin, osprey_bin_path  # noqa: E402,F401  (shared fixture)
CLI_TIMEOUT_S = 120


@pytest.fixture(scope="session")
def run_cli(osprey_bin):
    """run_cli(*args) -> CompletedProcess (text). Fails the test on a hang instead of blocking."""
    return cli_runner(osprey_bin, CLI_TIMEOUT_S)


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """demo-models/digits (made by scripts/setup; made here when missing)."""
    root = REPO / "demo-models"
    subprocess.run([sys.executable, str(REPO / "tools" / "make_demo_model.py"), "--out", str(root)], check=True,
                   timeout=600)
    return root / "digits"
