"""Fixtures for the tests on the newest onnx and ONNX Runtime (.venv-onnx, scripts/setup): the osprey binary."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from pytest_support import osprey_bin  # noqa: E402,F401  (shared fixture)
