import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from pytest_support import cli_runner, osprey_bin, osprey_bin_path  # noqa: E402,F401  (shared fixture)
