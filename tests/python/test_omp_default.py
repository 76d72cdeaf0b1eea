"""`import osprey` applies osprey's default OpenMP wait (GOMP_SPINCOUNT=1000, python/osprey/__init__.py) to the libgomp
its native module loads, unless the user set OMP_WAIT_POLICY/GOMP_SPINCOUNT or a libgomp is already loaded; the
variable does not stay in os.environ. Observed through libgomp itself: OMP_DISPLAY_ENV=verbose makes it print the
values it read when it was loaded (on stderr). Each case runs in a fresh interpreter."""

import os
import re
import subprocess
import sys

import pytest
from conftest import BUILD

OMP_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OSPREY_OMP_DEFAULT", "OMP_DISPLAY_ENV")
SCRIPT = """
import os, sys
if sys.argv[1] == "preload":
    import ctypes
    ctypes.CDLL("libgomp.so.1")
import osprey
print(os.environ.get("GOMP_SPINCOUNT"), os.environ.get("OMP_WAIT_POLICY"))
"""


def import_osprey(preload="no", **extra):
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    env.update(OMP_DISPLAY_ENV="verbose", PYTHONPATH=str(BUILD / "python"), **extra)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, preload], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    counts = re.findall(r"GOMP_SPINCOUNT = '(\d+)'", proc.stderr)
    assert len(counts) == 1, proc.stderr
    return counts[0], proc.stdout.split()


def test_default_applied_and_removed_from_environ():
    spin, after = import_osprey()
    assert spin == "1000"
    assert after == ["None", "None"]  # subprocesses of the user's program see the user's environment


@pytest.mark.parametrize("var,value,spin", [("GOMP_SPINCOUNT", "20000", "20000"),
                                            ("OMP_WAIT_POLICY", "active", "30000000000")])
def test_user_setting_wins(var, value, spin):
    got, after = import_osprey(**{var: value})
    assert got == spin
    assert value in after


def test_not_applied_when_libgomp_already_loaded():
    spin, _ = import_osprey("preload")
    assert spin == "300000"  # libgomp's own default: it was initialised before osprey could set anything


def test_opt_out():
    spin, _ = import_osprey(OSPREY_OMP_DEFAULT="0")
    assert spin == "300000"


RUN_SCRIPT = """
import ctypes, os, sys
import numpy as np
import onnx
from onnx import TensorProto, helper
if sys.argv[1] == "global":
    ctypes.CDLL("libgomp.so.1", mode=os.RTLD_GLOBAL)  # as a package that puts libgomp in the global scope would
elif sys.argv[1] == "local":
    ctypes.CDLL("libgomp.so.1")
import osprey
w = np.random.default_rng(0).standard_normal((32, 16, 3, 3)).astype(np.float32)
graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 64, 64])],
                          [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel())])
model = osprey.Model(onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString(),
                     threads=2)
x = np.ones((1, 16, 64, 64), np.float32)
y = model.run(x)["y"]
expected = w.sum(axis=(1, 2, 3))  # the centre pixel sees every tap of a ones input
assert np.allclose(y[0, :, 32, 32], expected, rtol=1e-4), (y[0, :, 32, 32], expected)
print("ok")
"""


@pytest.mark.parametrize("preload,ours", [("no", True), ("local", True), ("global", False)])
def test_module_runs_on_osprey_runtime(preload, ours):
    """The native module carries osprey's OpenMP runtime (src/threads) and exports it, so its libdnnl binds to it; a
    libgomp loaded privately (ctypes' default) changes nothing; one already in the global scope takes both."""
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    env.update(PYTHONPATH=str(BUILD / "python"), OSPREY_OMP_DEBUG="1")
    proc = subprocess.run([sys.executable, "-c", RUN_SCRIPT, preload], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    regions = re.search(r"osprey: openmp: (\d+) regions", proc.stderr)
    if ours:
        assert regions and int(regions.group(1)) > 0, proc.stderr
    else:
        assert regions is None, proc.stderr


def tuning_keys(preload, cache):
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARS}
    env.update(PYTHONPATH=str(BUILD / "python"), OSPREY_TUNE_CACHE=str(cache))
    env.pop("OSPREY_TUNE", None)
    proc = subprocess.run([sys.executable, "-c", RUN_SCRIPT, preload], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    return {line.split()[0] for line in cache.read_text().splitlines() if line.strip()}


def test_choices_timed_on_a_libgomp_that_took_over_are_its_own(tmp_path):
    """Kernel choices hold for the threading runtime they were timed on (core/timing_context.h). Where a libgomp in the
    global scope runs the module's regions (PyTorch imported first), the choices are libgomp's, not those of osprey's
    runtime; a libgomp loaded privately runs nothing, so its choices are osprey's."""
    ours = tuning_keys("no", tmp_path / "no.tsv")
    assert ours, "the Conv's kernel choice was not timed"
    assert tuning_keys("local", tmp_path / "local.tsv") == ours
    assert not tuning_keys("global", tmp_path / "global.tsv") & ours
