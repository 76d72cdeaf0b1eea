"""DeformConv (opset 19, 2-D) against torchvision.ops.deform_conv2d (ONNX Runtime has no CPU kernel for it): offsets
reaching outside the image, groups and offset groups, strides, dilations and pads, with and without bias and the
DCNv2 mask; and shapes that must be refused. ONNX's own node tests run in tests/conformance."""

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper
from torchvision.ops import deform_conv2d

import osprey

F = TensorProto.FLOAT


@pytest.mark.parametrize("group,offset_group,stride,dilation,pad,bias,mask",
                         [(1, 1, 1, 1, 0, False, False), (2, 2, 2, 1, 1, True, True), (1, 4, 1, 2, 2, True, False),
                          (4, 1, 2, 2, 1, False, True)])
def test_deform_conv_matches_torchvision(tmp_path, group, offset_group, stride, dilation, pad, bias, mask):
    rng = np.random.default_rng(group * 10 + offset_group)
    n, c, h, w, oc, k = 2, 8, 9, 11, 12, 3
    oh = (h + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    ow = (w + 2 * pad - dilation * (k - 1) - 1) // stride + 1
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    weight = rng.standard_normal((oc, c // group, k, k)).astype(np.float32) * 0.2
    offset = rng.uniform(-4, 4, (n, offset_group * k * k * 2, oh, ow)).astype(np.float32)  # some taps fall outside
    b = rng.standard_normal(oc).astype(np.float32)
    m = rng.uniform(0, 1, (n, offset_group * k * k, oh, ow)).astype(np.float32)
    names = ["x", "w", "offset", "b" if bias else "", "mask" if mask else ""]
    graph = helper.make_graph(
        [helper.make_node("DeformConv", names, ["y"], group=group, offset_group=offset_group, strides=[stride] * 2,
                          dilations=[dilation] * 2, pads=[pad] * 4)], "dcn",
        [helper.make_tensor_value_info(name, F, None) for name in names if name],
        [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    path = tmp_path / "dcn.onnx"
    path.write_bytes(model.SerializeToString())
    feeds = {"x": x, "w": weight, "offset": offset}
    if bias:
        feeds["b"] = b
    if mask:
        feeds["mask"] = m
    got = osprey.load_onnx(str(path), threads=1).run(feeds)["y"]
    want = deform_conv2d(torch.from_numpy(x), torch.from_numpy(offset), torch.from_numpy(weight),
                         torch.from_numpy(b) if bias else None, stride=stride, padding=pad, dilation=dilation,
                         mask=torch.from_numpy(m) if mask else None).numpy()
    assert got.shape == want.shape == (n, oc, oh, ow)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

    with pytest.raises(osprey.InvalidArgument, match="offset must be"):
        osprey.load_onnx(str(path), threads=1).run({**feeds, "offset": offset[:, :-2]})
