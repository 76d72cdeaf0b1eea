"""Col2Im (PyTorch's F.fold), MaxUnpool and Det against PyTorch, ONNX Runtime and NumPy, and their bad inputs.
ONNX's own node tests for them run in tests/conformance; these cover strides, dilations and pads together, 3-D
unpooling, indices from a real MaxPool, batched determinants, and indices or sizes that must be refused."""

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as TF
from onnx import TensorProto, helper, numpy_helper

import osprey

F = TensorProto.FLOAT


def load(tmp_path, name, nodes, inputs, outputs, inits=(), opset=18):
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path), osprey.load_onnx(str(path), threads=1)


@pytest.mark.parametrize("image,block,stride,dilation,pad", [((9, 7), (3, 2), (2, 1), (1, 2), (1, 0)),
                                                             ((8, 8), (2, 2), (2, 2), (1, 1), (0, 0)),
                                                             ((5, 11), (3, 3), (1, 3), (2, 1), (2, 1))])
def test_col2im_matches_torch_fold(tmp_path, image, block, stride, dilation, pad):
    c = 3
    blocks = [(image[d] + 2 * pad[d] - dilation[d] * (block[d] - 1) - 1) // stride[d] + 1 for d in range(2)]
    x = np.random.default_rng(sum(image)).standard_normal((2, c * block[0] * block[1], blocks[0] * blocks[1]))
    x = x.astype(np.float32)
    _, m = load(tmp_path, "col2im", [helper.make_node("Col2Im", ["x", "image", "block"], ["y"], strides=list(stride),
                                                       dilations=list(dilation), pads=[pad[0], pad[1]] * 2)],
                [helper.make_tensor_value_info("x", F, list(x.shape))], [helper.make_tensor_value_info("y", F, None)],
                [numpy_helper.from_array(np.array(image, np.int64), "image"),
                 numpy_helper.from_array(np.array(block, np.int64), "block")])
    want = TF.fold(torch.from_numpy(x), image, block, dilation=dilation, padding=pad, stride=stride).numpy()
    np.testing.assert_allclose(m.run({"x": x})["y"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dims", [2, 3])
def test_max_unpool_of_a_real_max_pool_matches_onnxruntime_and_torch(tmp_path, dims):
    shape = [2, 3] + [8, 6, 4][:dims]
    x = np.random.default_rng(dims).standard_normal(shape).astype(np.float32)
    kernel, stride = [2] * dims, [2] * dims
    path, m = load(tmp_path, f"unpool{dims}",
                   [helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=kernel, strides=stride),
                    helper.make_node("MaxUnpool", ["p", "i"], ["y"], kernel_shape=kernel, strides=stride)],
                   [helper.make_tensor_value_info("x", F, shape)], [helper.make_tensor_value_info("y", F, None)])
    got = m.run({"x": x})["y"]
    np.testing.assert_array_equal(got, ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0])
    pool, unpool = (TF.max_pool2d, TF.max_unpool2d) if dims == 2 else (TF.max_pool3d, TF.max_unpool3d)
    p, i = pool(torch.from_numpy(x), kernel, stride, return_indices=True)
    np.testing.assert_array_equal(got, unpool(p, i, kernel, stride).numpy())


def test_max_unpool_to_a_larger_output_reads_indices_into_it_as_onnxruntime(tmp_path):
    x = np.array([[[[5, 6], [7, 8]]]], np.float32)
    idx = np.array([[[[5, 7], [13, 15]]]], np.int64)
    path, m = load(tmp_path, "unpool_shape",
                   [helper.make_node("MaxUnpool", ["x", "i", "shape"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
                   [helper.make_tensor_value_info("x", F, [1, 1, 2, 2]),
                    helper.make_tensor_value_info("i", TensorProto.INT64, [1, 1, 2, 2])],
                   [helper.make_tensor_value_info("y", F, None)],
                   [numpy_helper.from_array(np.array([1, 1, 5, 5], np.int64), "shape")])
    got = m.run({"x": x, "i": idx})["y"]
    want = np.zeros(25, np.float32)
    want[idx.ravel()] = x.ravel()  # flat into the 5 x 5 output, as PyTorch's max_unpool2d(output_size=) too
    np.testing.assert_array_equal(got, want.reshape(1, 1, 5, 5))
    with pytest.raises(osprey.InvalidArgument, match="index 25 at 3 is outside the output's 25 elements"):
        m.run({"x": x, "i": np.array([[[[5, 7], [13, 25]]]], np.int64)})
    with pytest.raises(osprey.InvalidArgument, match="outside"):
        m.run({"x": x, "i": np.array([[[[-1, 7], [13, 15]]]], np.int64)})


def test_det_matches_numpy_and_bad_sizes_are_refused(tmp_path):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 4, 5, 5)).astype(np.float32)
    x[0, 0] = 0  # singular
    x[0, 1, 2] = x[0, 1, 0]  # two equal rows
    _, m = load(tmp_path, "det", [helper.make_node("Det", ["x"], ["y"])],
                [helper.make_tensor_value_info("x", F, None)],
                [helper.make_tensor_value_info("y", F, None)])
    got = m.run({"x": x})["y"]
    assert got.shape == (3, 4)
    np.testing.assert_allclose(got, np.linalg.det(x.astype(np.float64)), rtol=1e-4, atol=1e-5)
    assert got[0, 0] == 0
    with pytest.raises(osprey.InvalidArgument, match="square matrices"):
        m.run({"x": np.zeros((2, 3), np.float32)})
    _, m = load(tmp_path, "col2im_bad", [helper.make_node("Col2Im", ["x", "image", "block"], ["y"])],
                [helper.make_tensor_value_info("x", F, None)], [helper.make_tensor_value_info("y", F, None)],
                [numpy_helper.from_array(np.array([4, 4], np.int64), "image"),
                 numpy_helper.from_array(np.array([2, 2], np.int64), "block")])
    with pytest.raises(osprey.InvalidArgument, match="must be the number of blocks, 9"):
        m.run({"x": np.zeros((1, 4, 8), np.float32)})
