"""Fixtures for the image-op tests: run one osprey-domain node through the real `osprey run` binary."""

import sys
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from pytest_support import osprey_bin, osprey_bin_path  # noqa: E402,F401  (shared fixture)
CLI_TIMEOUT_S = 60


_ONNX_DTYPES = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.float32): TensorProto.FLOAT}


@pytest.fixture
def run_op(osprey_bin, tmp_path):
    """run_op(op_type, image, reference=False, **attrs) -> numpy output of one osprey-domain node on `image`.

    The model has one input `image` of the array's exact shape and dtype, opset imports ("", 17) and ("osprey", 1).
    `reference=True` runs with --reference (reference kernels only) instead of the fast kernels.
    """
    counter = [0]

    def run(op_type, image, reference=False, **attrs):
        counter[0] += 1
        work = tmp_path / f"run{counter[0]}"
        work.mkdir()
        image = np.ascontiguousarray(image)
        node = helper.make_node(op_type, ["image"], ["out"], domain="osprey", **attrs)
        graph = helper.make_graph(
            [node], "image_op",
            [helper.make_tensor_value_info("image", _ONNX_DTYPES[image.dtype], list(image.shape))],
            [helper.make_tensor_value_info("out", TensorProto.UNDEFINED, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("osprey", 1)])
        onnx.save(model, work / "model.onnx")
        np.save(work / "image.npy", image)
        cmd = [str(osprey_bin), "run", str(work / "model.onnx"), "--input", f"image={work / 'image.npy'}",
               "--output-dir", str(work / "out")] + (["--reference"] if reference else [])
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=CLI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`{' '.join(cmd)}` did not finish within {CLI_TIMEOUT_S} s", pytrace=False)
        if proc.returncode != 0:
            raise RuntimeError(f"osprey run failed ({proc.returncode}): {proc.stderr.strip()}")
        return np.load(work / "out" / "out.npy")

    return run
