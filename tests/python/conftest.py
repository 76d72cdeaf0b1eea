"""Fixtures for the Python package's tests: `osprey` imported from the build (build/python, assembled by the _osprey
target), test models from the shared cache, the CLI binary for message comparisons."""

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("OSPREY_BUILD_DIR", REPO / "build"))
sys.path.insert(0, str(BUILD / "python"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from pytest_support import cli_runner, ensure_model, osprey_bin, osprey_bin_path  # noqa: E402,F401  (shared fixtures)


@pytest.fixture(scope="session")
def run_cli(osprey_bin):
    return cli_runner(osprey_bin, 120)
