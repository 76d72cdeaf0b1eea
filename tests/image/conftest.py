"""Fixtures for the image decoder tests: the osprey binary and a runner for `osprey decode`."""

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from pytest_support import cli_runner, osprey_bin, osprey_bin_path  # noqa: E402,F401  (shared fixture)
CLI_TIMEOUT_S = 30


@pytest.fixture(scope="session")
def run_cli(osprey_bin):
    """run_cli(*args) -> CompletedProcess (text); a hang past 30 s fails the test."""
    return cli_runner(osprey_bin, CLI_TIMEOUT_S)


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
