"""Fixtures for the ONNX conformance run: where the osprey binary is and where the summary goes."""

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from pytest_support import osprey_bin, osprey_bin_path  # noqa: E402,F401  (shared fixture)


@pytest.fixture(scope="session")
def summary_path(osprey_bin) -> Path:
    """$OSPREY_CONFORMANCE_SUMMARY, else conformance-summary.txt in the build directory of the binary under test."""
    env = os.environ.get("OSPREY_CONFORMANCE_SUMMARY")
    if env:
        return Path(env)
    return osprey_bin.resolve().parent.parent / "conformance-summary.txt"
