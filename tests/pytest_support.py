"""Shared by the pytest folders' conftest.py files: where the osprey binary is, as a session fixture.

Each conftest does `sys.path.insert(0, <tests>)` and `from pytest_support import ...`; importing the fixture into a
conftest registers it there."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def osprey_bin_path() -> Path:
    """$OSPREY_BIN (set by ctest to the build's binary) or build/bin/osprey."""
    return Path(os.environ.get("OSPREY_BIN", REPO / "build" / "bin" / "osprey"))


@pytest.fixture(scope="session")
def osprey_bin() -> Path:
    """The binary under test. A missing binary is a failure, not a skip: these tests exist to exercise it."""
    path = osprey_bin_path()
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"osprey binary not found at {path}: build it (`make build`) or set OSPREY_BIN", pytrace=False)
    return path


def cli_runner(binary: Path, default_timeout: float, *prefix):
    """run(*args, timeout=default_timeout, env=None) -> CompletedProcess (text) of `binary *prefix *args` (`env`:
    variables set on top of this process's environment); a hang fails the test (naming the command) instead of
    blocking the suite."""
    import os
    import subprocess

    def run(*args, timeout=default_timeout, env=None):
        cmd = [str(binary), *map(str, prefix), *map(str, args)]
        try:
            return subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout,
                                  env={**os.environ, **env} if env else None)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`{' '.join(cmd)}` did not finish within {timeout} s", pytrace=False)

    return run


@pytest.fixture(scope="session")
def ensure_model():
    """ensure_model(name) -> dict of paths (onnx, input1, input8) of a test model (tools/make_test_models.py); exports
    it into the model cache first when it is missing."""
    import subprocess
    import sys
    sys.path.insert(0, str(REPO / "tools"))
    import make_test_models
    cache = make_test_models.default_cache_dir()

    def ensure(name):
        paths = make_test_models.model_paths(name, cache)
        if not all(p.exists() for p in paths.values()):
            subprocess.run([sys.executable, str(REPO / "tools" / "make_test_models.py"), "--only", name,
                            "--out", str(cache)], check=True, timeout=900)
        return paths

    return ensure


_ORT_U8S8_EXACT = None


def ort_u8s8_exact() -> bool:
    """Whether ONNX Runtime's uint8 x int8 products are exact on this CPU. Without VNNI (AVX2: Zen 3, older Xeons)
    its kernels sum adjacent products in 16 bits (vpmaddubsw), saturating: 255 x 127 + 255 x 127 gives 32767, as ORT's
    quantisation docs warn. There ORT is no oracle for int8 products with large weights; osprey's are exact
    (kernels/cpu/int8_pairing.h, integer_kernels.cc). Probed once: a MatMulInteger of 255s by 127s."""
    global _ORT_U8S8_EXACT
    if _ORT_U8S8_EXACT is None:
        import numpy as np
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
        k = 64
        graph = helper.make_graph([helper.make_node("MatMulInteger", ["A", "B"], ["Y"])], "u8s8_probe",
                                  [helper.make_tensor_value_info("A", TensorProto.UINT8, [1, k])],
                                  [helper.make_tensor_value_info("Y", TensorProto.INT32, [1, 1])],
                                  [numpy_helper.from_array(np.full((k, 1), 127, np.int8), "B")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        got = int(session.run(None, {"A": np.full((1, k), 255, np.uint8)})[0][0, 0])
        _ORT_U8S8_EXACT = got == 255 * 127 * k
    return _ORT_U8S8_EXACT
