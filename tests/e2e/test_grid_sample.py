"""GridSample (F.grid_sample in PyTorch exports, spatial transformers, flow warping) through `osprey run` against ONNX
Runtime on the same file: every mode x padding mode x align_corners, a grid reaching well outside [-1, 1] (where
border clamps, reflection folds the coordinate several times and zeros pads), and huge grid values (1e6: no
overflow, padding values out). The ONNX backend's 2-D GridSample tests run in tests/conformance too.
"""

import subprocess

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

TIMEOUT_S = 60


def grid_sample_model(path, mode, padding, align):
    graph = helper.make_graph(
        [helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding, align_corners=align)],
        "grid_sample",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5, 7]),
         helper.make_tensor_value_info("grid", TensorProto.FLOAT, [2, 4, 6, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4, 6])])
    with open(path, "wb") as f:
        f.write(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)]).SerializeToString())


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
def test_grid_sample_matches_onnxruntime(osprey_bin, work_dir, mode, padding, align):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32)
    grid = rng.uniform(-3.5, 3.5, (2, 4, 6, 2)).astype(np.float32)
    grid[1, 0, :3] = [[1e6, -1e6], [-1e6, 0.25], [0.5, 1e6]]  # far outside: padding values, no overflow
    model = work_dir / "grid_sample.onnx"
    grid_sample_model(model, mode, padding, align)
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x, "grid": grid})[0]
    np.save(work_dir / "x.npy", x)
    np.save(work_dir / "grid.npy", grid)
    proc = subprocess.run([str(osprey_bin), "run", str(model), "--input", f"x={work_dir / 'x.npy'}", "--input",
                           f"grid={work_dir / 'grid.npy'}", "--output-dir", str(work_dir / "out")],
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    got = np.load(work_dir / "out" / "y.npy")
    if mode != "nearest":
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    else:  # a coordinate exactly halfway between two pixels may round either way in float32: allow a few
        assert np.mean(np.isclose(got, want, rtol=1e-5, atol=1e-5)) >= 0.97
