"""Every `#pragma omp simd` loop of the fast CPU kernels vectorises (GCC's own report, not a timing).

A loop that GCC leaves scalar still gives the right answer, so no numerical test notices; the nineteenth session found
Sigmoid, Tanh, Erf, GELU, Exp, softmax and the LSTM gates 3-12x slower because a refactor turned exp's polynomial into
a loop over a constant array, which GCC -O2 does not unroll ("not vectorized: control flow in loop"). The same
message comes from a comparison under trapping-math, a store under a condition, or a call that may set errno. This
test compiles each kernel file again with the build's own command (compile_commands.json) plus
-fopt-info-vec-missed and fails on that message for the loop under any `#pragma omp simd` line. GCC places the
message on the loop's `for` line or on the first statement of its braced body (DynamicQuantizeLinear's loop, scalar
until the twentieth session, was reported on the line after its `for`), so both count.
"""

import json
import os
import re
import shlex
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("OSPREY_BIN", REPO / "build" / "bin" / "osprey"))
COMMANDS = BIN.parent.parent / "compile_commands.json"
KERNEL_DIRS = [REPO / "src" / "kernels" / "cpu", REPO / "src" / "kernels" / "reference"]


def simd_files():
    return sorted(p for d in KERNEL_DIRS for p in d.glob("*.cc") if "#pragma omp simd" in p.read_text())


def simd_loop_lines(path: Path):
    """1-based line numbers of the loop statement after each `#pragma omp simd`."""
    lines = path.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.strip().startswith("#pragma omp simd"):
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("for"):
                j += 1
            out.append(j + 1)
    return out


@pytest.fixture(scope="module")
def commands():
    if not COMMANDS.exists():
        pytest.skip(f"{COMMANDS} not found (configure the build first: make build)")
    return {Path(e["file"]).resolve(): e for e in json.loads(COMMANDS.read_text())}


@pytest.mark.parametrize("path", simd_files(), ids=lambda p: p.name)
def test_simd_loops_vectorise(commands, path):
    entry = commands.get(path.resolve())
    if entry is None:
        pytest.skip(f"{path.name} is not in this build")
    args = shlex.split(entry["command"]) if "command" in entry else list(entry["arguments"])
    if args and Path(args[0]).name == "ccache":
        args = args[1:]
    o = args.index("-o")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "vec.txt"
        args = args[:o] + ["-o", os.devnull, f"-fopt-info-vec-missed={report}"] + args[o + 2:]
        run = subprocess.run(args, cwd=entry["directory"], capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        text = report.read_text()
    scalar = set()
    for m in re.finditer(r"^(.*?):(\d+):\d+: missed: not vectorized: control flow in loop", text, re.M):
        if Path(m.group(1)).resolve() == path.resolve():
            scalar.add(int(m.group(2)))
    loops = simd_loop_lines(path)
    assert loops, f"no `#pragma omp simd` loop found in {path.name}"
    text_lines = path.read_text().splitlines()
    bad = sorted(line for line in loops
                 if line in scalar or (line + 1 in scalar and text_lines[line - 1].rstrip().endswith("{")))
    assert not bad, (f"{path.name}: the `#pragma omp simd` loops at lines {bad} stay scalar (GCC: control flow in "
                     "loop); see this test's docstring for the usual causes")
