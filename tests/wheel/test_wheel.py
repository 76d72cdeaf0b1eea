"""The self-contained wheel: `make wheel`, installed into a fresh venv that has only NumPy, then run where the system's
shared libraries are hidden except the manylinux base set (glibc, libstdc++, libgcc_s, libz, libexpat): osprey's
dependencies (oneDNN, protobuf, ONNX, TurboJPEG, spng, WebP, gRPC, OpenMP) must come from the wheel itself.

The hiding uses a private mount namespace (`unshare -m`, root only): /usr/lib/x86_64-linux-gnu is replaced by a
folder holding copies of the allowed libraries. Without root the check runs without hiding, and says so."""
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("OSPREY_BUILD_DIR", REPO / "build"))
sys.path.insert(0, str(REPO / "tests" / "python"))
import onnx_models  # noqa: E402

# The libraries every manylinux system provides (auditwheel's policy) that Python and NumPy's wheel need here.
ALLOWED = ["libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libstdc++.so.6", "libgcc_s.so.1",
           "libz.so.1", "libexpat.so.1", "libutil.so.1", "libffi.so.8"]
LIBDIR = Path("/usr/lib/x86_64-linux-gnu")

CHECK = textwrap.dedent("""
    import json, os, sys, subprocess
    import numpy as np
    import osprey
    from osprey.augment import Pipeline
    model = osprey.Model(open(sys.argv[1], "rb").read())
    y = model.run(np.zeros((2, 4), np.float32))["y"]
    assert y.tolist() == [[1.0] * 4] * 2, y
    import osprey.onnxruntime as ort  # the ONNX Runtime API, without onnxruntime installed
    session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
    assert session.run(None, {"x": [[0.0] * 4]})[0].tolist() == [[1.0] * 4]
    img = osprey.decode(sys.argv[2])
    assert img.dtype == np.uint8 and img.ndim == 3
    pipe = Pipeline.from_json(json.dumps({"type": "Compose", "transforms": [{"type": "HorizontalFlip", "p": 1}]}))
    out = pipe(image=img, bboxes=[(0, 0, 10, 10)], seed=1)
    assert out["bboxes"][0][0] == img.shape[1] - 10, out["bboxes"]
    try:
        osprey.decode(b"junk")
    except osprey.InvalidArgument as e:
        pass
    libs = sorted({line.split()[-1] for line in open("/proc/self/maps") if ".so" in line.split()[-1]})
    print(json.dumps({"libs": libs, "osprey": osprey.__file__}))
""")


def run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 1800), **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_wheel_in_bare_venv(tmp_path):
    run(["make", "-C", str(REPO), "wheel", f"BUILD_DIR={BUILD}"])
    wheels = sorted((BUILD / "wheel" / "dist").glob("osprey-*manylinux*.whl"))
    assert len(wheels) == 1, f"expected one repaired manylinux wheel, found {wheels}"
    venv = tmp_path / "venv"
    run(["/usr/bin/python3", "-m", "venv", str(venv)])  # no system site packages: only what pip installs
    py = venv / "bin" / "python"
    run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "numpy", str(wheels[0])])
    model = tmp_path / "add_one.onnx"
    model.write_bytes(onnx_models.add_one())
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    photo = REPO / "demo-datasets" / "photos" / "images" / "astronaut.jpg"
    args = [str(py), str(script), str(model), str(photo)]

    hidden = os.geteuid() == 0 and shutil.which("unshare") is not None
    if hidden:
        allowed = tmp_path / "libs"
        allowed.mkdir()
        for name in ALLOWED + [p.name for p in LIBDIR.glob("ld-linux-x86-64.so.*")]:
            if (LIBDIR / name).exists():
                shutil.copy2(LIBDIR / name, allowed / name)
        inner = f"mount --bind {allowed} {LIBDIR} && exec " + " ".join(args)
        proc = run(["unshare", "-m", "sh", "-c", inner], cwd=tmp_path)
    else:
        proc = run(args, cwd=tmp_path)
    import json
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    site = str(venv)
    outside = [lib for lib in report["libs"] if not lib.startswith(site)
               and Path(lib).name not in ALLOWED and "ld-linux" not in lib and "python3" not in lib]
    assert not outside, f"libraries loaded from outside the wheel and the manylinux base set: {outside}"
    assert report["osprey"].startswith(site)
    proc = run([str(py), "-m", "osprey", "--version"], cwd=tmp_path)
    assert proc.stdout.startswith("osprey ")
    if not hidden:
        pytest.skip("checked without hiding the system libraries (needs root and unshare)")


def test_pip_install_from_clone(tmp_path):
    """`pip install .` as a user runs it (build isolation: scikit-build-core and nanobind come from PyPI), into a venv
    that sees the system's packages (the Debian -dev libraries this build links), then the package works."""
    venv = tmp_path / "venv"
    run(["/usr/bin/python3", "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    env = dict(os.environ, CXX="c++")
    run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "numpy", str(REPO)], env=env)
    model = tmp_path / "add_one.onnx"
    model.write_bytes(onnx_models.add_one())
    proc = run([str(py), "-c", "import sys, numpy as np, osprey; "
                "print(osprey.Model(sys.argv[1]).run(np.zeros((1, 4), np.float32))['y'].tolist(), osprey.__file__)",
                str(model)], cwd=tmp_path)
    assert proc.stdout.startswith("[[1.0, 1.0, 1.0, 1.0]]") and str(venv) in proc.stdout
