"""The peers as users install them: a venv (.venv-peers) with the newest onnxruntime and openvino from PyPI.

The project's .venv pins older versions so the tests stay reproducible; benchmarks compare against what
`pip install onnxruntime openvino` gives today. `reexec()` (called first by the benchmark scripts) creates the venv on
first use (about a minute), upgrades it when it is older than a week, and re-runs the script under it.
OSPREY_BENCH_PINNED=1 runs under .venv (the pinned versions) instead. Models are exported with .venv's torch
(`export_python()`), which the peers' venv does not have.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEERS = REPO / ".venv-peers"
PROJECT_PYTHON = REPO / ".venv" / "bin" / "python"
PACKAGES = ["onnxruntime", "openvino", "numpy", "onnx", "scikit-image"]
MAX_AGE_S = 7 * 24 * 3600


def _ensure_peers() -> Path:
    python = PEERS / "bin" / "python"
    stamp = PEERS / ".upgraded"
    fresh = stamp.exists() and time.time() - stamp.stat().st_mtime < MAX_AGE_S
    if python.exists() and fresh:
        return python
    base = shutil.which("python3") or sys.executable
    if not python.exists():
        print(f"peers: creating {PEERS} (newest {', '.join(PACKAGES)} from PyPI)", file=sys.stderr, flush=True)
        subprocess.run([base, "-m", "venv", str(PEERS)], check=True)
    else:
        print(f"peers: upgrading {PEERS} (older than a week)", file=sys.stderr, flush=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", *PACKAGES], check=True)
    stamp.touch()
    return python


def peers_python() -> Path:
    """The python of the peers' venv (or .venv with OSPREY_BENCH_PINNED=1), creating it when needed."""
    return PROJECT_PYTHON if os.environ.get("OSPREY_BENCH_PINNED") == "1" else _ensure_peers()


def reexec(script: str) -> None:
    """Re-runs `script` under the peers' venv (or .venv with OSPREY_BENCH_PINNED=1) unless it already runs there."""
    if os.environ.get("OSPREY_BENCH_PEERS_EXEC"):
        return
    python = peers_python()
    os.environ["OSPREY_BENCH_PEERS_EXEC"] = "1"
    os.execv(str(python), [str(python), script] + sys.argv[1:])


def export_python() -> str:
    """A python with torch and torchvision, for tools/make_test_models.py."""
    return str(PROJECT_PYTHON if PROJECT_PYTHON.exists() else sys.executable)
