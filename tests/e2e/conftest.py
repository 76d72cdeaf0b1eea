"""Fixtures for end-to-end tests over the real osprey binary: its path, a CLI runner with a timeout, test models."""

import datetime
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from pytest_support import cli_runner, ensure_model, osprey_bin, osprey_bin_path  # noqa: E402,F401  (shared fixtures)
CLI_TIMEOUT_S = 60

sys.path.insert(0, str(REPO / "tools"))
import make_test_models  # noqa: E402  (no torch import at module level: cheap)


@pytest.fixture(scope="session")
def build_dir(osprey_bin) -> Path:
    """Build directory of the binary under test (<build>/bin/osprey): where reports are written."""
    return osprey_bin.resolve().parent.parent


@pytest.fixture
def work_dir(tmp_path) -> Path:
    return tmp_path


@pytest.fixture(scope="session")
def run_cli(osprey_bin):
    """run_cli(*args, timeout=60) -> CompletedProcess (text). Fails the test on a hang instead of blocking."""
    return cli_runner(osprey_bin, CLI_TIMEOUT_S)


@pytest.fixture(scope="session")
def model_cache() -> Path:
    return make_test_models.default_cache_dir()



# ---- agreement table: rows added by test_architectures, printed at the end and appended to <build>/ort-agreement.txt
AGREEMENT_ROWS = []
AGREEMENT_HEADER = (f"{'model':20s} {'batch':>5s} {'max abs err':>12s} {'max |ref|':>10s} {'rel err':>10s} "
                    f"{'bound':>10s} {'top-5':>6s} {'osprey s':>9s}")


@pytest.fixture(scope="session")
def agreement_rows():
    return AGREEMENT_ROWS


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not AGREEMENT_ROWS:
        return
    lines = ["osprey vs ONNX Runtime (unoptimised graph, CPU EP) on seeded random-weight torchvision models",
             AGREEMENT_HEADER] + AGREEMENT_ROWS
    terminalreporter.write_sep("-", "ORT agreement")
    for line in lines:
        terminalreporter.write_line(line)
    build = osprey_bin_path().resolve().parent.parent
    if build.is_dir():
        stamp = datetime.datetime.now().isoformat(timespec="seconds")
        with open(build / "ort-agreement.txt", "a") as f:
            f.write(f"# {stamp}\n" + "\n".join(lines) + "\n\n")
