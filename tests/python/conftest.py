"""Fixtures for the Python package's tests: `osprey` imported from the build (build/python, assembled by the _osprey
target), test models from the shared cache, the CLI binary for message comparisons."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("OSPREY_BUILD_DIR", REPO / "build"))
sys.path.insert(0, str(BUILD / "python"))
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from pytest_support import cli_runner, osprey_bin, osprey_bin_path  # noqa: E402,F401  (shared fixture)
import make_test_models  # noqa: E402


@pytest.fixture(scope="session")
def run_cli(osprey_bin):
    return cli_runner(osprey_bin, 120)


@pytest.fixture(scope="session")
def ensure_model():
    """ensure_model(name) -> dict of paths (onnx, input1, input8); exports the model first when it is missing."""
    cache = make_test_models.default_cache_dir()

    def ensure(name):
        paths = make_test_models.model_paths(name, cache)
        if not all(p.exists() for p in paths.values()):
            subprocess.run([sys.executable, str(REPO / "tools" / "make_test_models.py"), "--only", name,
                            "--out", str(cache)], check=True, timeout=900)
        return paths

    return ensure
