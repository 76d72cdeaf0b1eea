"""3-D layers as video and volume networks hold them, through `osprey run` against ONNX Runtime on the same file:
- a one-frame network (RivaGAN's watermark models: Conv3d with 1 x k x k windows over [N, C, 1, H, W]), which the
  compile runs as 2-D layers (runtime/fusion_1d.cc, LiftToRank4), with a grouped layer, a residual Add, a per-channel
  scale and unit-depth pools;
- 16-frame clips through S3D's and R(2+1)D's layer kinds (a 1 x 3 x 3 spatial and a 3 x 1 x 1 temporal Conv3d, 3-D
  max and average pools at strides 1 and 2 with padding counted or not, ceil mode, a trilinear upsampling), whose
  plain pools and resize run on the row kernels (kernels/cpu/plain_pool.cc, resize_kernel.cc).
Inputs are seeded; weights are drawn so the outputs depend on every layer (ReLUs keep about half their inputs).
"""

import subprocess

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

TIMEOUT_S = 60
RNG = np.random.default_rng(11)


def weight(name, shape):
    fan_in = int(np.prod(shape[1:]))
    return numpy_helper.from_array((RNG.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32), name)


def one_frame_model():
    """[2, 3, 1, 20, 18] -> [2, 6, 1, 5, 5]."""
    init = [weight("w1", [8, 3, 1, 5, 5]), weight("b1", [8]), weight("w2", [8, 2, 1, 3, 3]),
            numpy_helper.from_array(RNG.uniform(0.5, 1.5, (8, 1, 1, 1)).astype(np.float32), "s"),
            weight("w3", [6, 8, 1, 3, 3])]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[0, 2, 2, 0, 2, 2]),
        helper.make_node("Tanh", ["c1"], ["t1"]),
        helper.make_node("Conv", ["t1", "w2"], ["c2"], group=4, pads=[0, 1, 1, 0, 1, 1]),
        helper.make_node("Add", ["c2", "t1"], ["r"]),
        helper.make_node("Relu", ["r"], ["r1"]),
        helper.make_node("Mul", ["r1", "s"], ["m"]),
        helper.make_node("MaxPool", ["m"], ["p"], kernel_shape=[1, 2, 2], strides=[1, 2, 2], ceil_mode=1),
        helper.make_node("Conv", ["p", "w3"], ["c3"], strides=[1, 2, 2], pads=[0, 1, 1, 0, 1, 1]),
        helper.make_node("AveragePool", ["c3"], ["y"], kernel_shape=[1, 3, 3], pads=[0, 1, 1, 0, 1, 1],
                         count_include_pad=1),
    ]
    return nodes, init, [2, 3, 1, 20, 18]


def clip_model():
    """[1, 3, 16, 24, 24]: S3D's separable layers and 3-D pools, R(2+1)D's temporal layer, a U-Net's upsampling."""
    init = [weight("w1", [12, 3, 1, 3, 3]), weight("w2", [12, 12, 3, 1, 1]), weight("b2", [12]),
            weight("w3", [8, 12, 3, 3, 3])]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], strides=[1, 2, 2], pads=[0, 1, 1, 0, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 0, 0, 1, 0, 0]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("MaxPool", ["r2"], ["p1"], kernel_shape=[3, 3, 3], pads=[1, 1, 1, 1, 1, 1]),
        helper.make_node("MaxPool", ["p1"], ["p2"], kernel_shape=[2, 3, 3], strides=[2, 2, 2], pads=[0, 1, 1, 0, 1, 1]),
        helper.make_node("Conv", ["p2", "w3"], ["c3"], pads=[1, 1, 1, 1, 1, 1]),
        helper.make_node("AveragePool", ["c3"], ["a1"], kernel_shape=[3, 3, 3], pads=[1, 1, 1, 1, 1, 1],
                         count_include_pad=0),
        helper.make_node("AveragePool", ["a1"], ["a2"], kernel_shape=[2, 2, 2], strides=[2, 2, 2], ceil_mode=1),
        helper.make_node("Resize", ["a2", "", "scales"], ["y"], mode="linear"),
    ]
    init.append(numpy_helper.from_array(np.array([1, 1, 2, 2, 2], np.float32), "scales"))
    return nodes, init, [1, 3, 16, 24, 24]


@pytest.mark.parametrize("make", [one_frame_model, clip_model], ids=["one_frame", "clip"])
def test_video_layers_match_onnxruntime(osprey_bin, work_dir, make):
    nodes, init, shape = make()
    graph = helper.make_graph(nodes, make.__name__, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], init)
    model = work_dir / "video.onnx"
    model.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.save(work_dir / "x.npy", x)
    proc = subprocess.run([str(osprey_bin), "run", str(model), "--input", f"x={work_dir / 'x.npy'}", "--output-dir",
                           str(work_dir / "out")], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    got = np.load(work_dir / "out" / "y.npy")
    assert got.shape == want.shape
    assert np.abs(want).max() > 0.05  # the layers reach the output
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * np.abs(want).max())
