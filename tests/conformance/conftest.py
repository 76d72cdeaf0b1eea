"""Fixtures for the ONNX conformance run: where the osprey binary is and where the summary goes."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def osprey_bin_path() -> Path:
    return Path(os.environ.get("OSPREY_BIN", REPO / "build" / "bin" / "osprey"))


@pytest.fixture(scope="session")
def osprey_bin() -> Path:
    path = osprey_bin_path()
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"osprey binary not found at {path}: build it (`make build`) or set OSPREY_BIN", pytrace=False)
    return path


@pytest.fixture(scope="session")
def summary_path(osprey_bin) -> Path:
    """$OSPREY_CONFORMANCE_SUMMARY, else conformance-summary.txt in the build directory of the binary under test."""
    env = os.environ.get("OSPREY_CONFORMANCE_SUMMARY")
    if env:
        return Path(env)
    return osprey_bin.resolve().parent.parent / "conformance-summary.txt"
