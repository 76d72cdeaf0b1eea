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


def spin_model(h0, w, width):
    """An ONNX model whose run the request sets the length of, for the tests that stop runs: y[N, width] = x + mean(h),
    h = tanh(h @ w) repeated max(steps) times from h0 (a Loop following the data, at most osprey's 10,000 iterations).
    Inputs x [N, width] float32 and steps [S] int64."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    n = h0.shape[0]
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("MatMul", ["h_in", "W"], ["hw"]),
         helper.make_node("Tanh", ["hw"], ["h_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [n, n])])
    nodes = [
        helper.make_node("ReduceMax", ["steps"], ["m"], keepdims=0),
        helper.make_node("Constant", [], ["true"], value=helper.make_tensor("t", TensorProto.BOOL, [], [True])),
        helper.make_node("Loop", ["m", "true", "H0"], ["h"], body=body),
        helper.make_node("ReduceMean", ["h"], ["s"], keepdims=0),
        helper.make_node("Add", ["x", "s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "spin",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width]),
         helper.make_tensor_value_info("steps", TensorProto.INT64, ["S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])],
        [numpy_helper.from_array(np.asarray(h0, np.float32), "H0"),
         numpy_helper.from_array(np.asarray(w, np.float32), "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
