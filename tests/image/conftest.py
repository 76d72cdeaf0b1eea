"""Fixtures for the image decoder tests: the osprey binary and a runner for `osprey decode`."""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 30


def osprey_bin_path() -> Path:
    return Path(os.environ.get("OSPREY_BIN", REPO / "build" / "bin" / "osprey"))


@pytest.fixture(scope="session")
def osprey_bin() -> Path:
    """The binary under test. A missing binary is a failure, not a skip."""
    path = osprey_bin_path()
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"osprey binary not found at {path}: build it or set OSPREY_BIN", pytrace=False)
    return path


@pytest.fixture(scope="session")
def run_cli(osprey_bin):
    """run_cli(*args) -> CompletedProcess (text); a hang past 30 s fails the test."""

    def run(*args, timeout=CLI_TIMEOUT_S):
        cmd = [str(osprey_bin)] + [str(a) for a in args]
        try:
            return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}")

    return run


@pytest.fixture
def decode(run_cli, tmp_path):
    """decode(image_path, *flags) -> (uint8 array, stdout); fails the test when osprey exits non-zero."""
    counter = [0]

    def run(image, *flags):
        counter[0] += 1
        out = tmp_path / f"decoded_{counter[0]}.npy"
        proc = run_cli("decode", image, "-o", out, *flags)
        assert proc.returncode == 0, f"osprey decode {image} {flags} failed ({proc.returncode}): {proc.stderr}"
        array = np.load(out)
        assert array.dtype == np.uint8 and array.ndim == 3
        return array, proc.stdout

    return run
