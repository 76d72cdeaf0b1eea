"""Patterns found in models from Hugging Face transformers exported by PyTorch, each against an independent oracle.

- float64 constants: the dynamo exporter folds tables a model builds in float64 into DOUBLE initializers (RT-DETR's
  sine position embedding: DOUBLE -> Sin/Cos -> Concat -> Cast to float). osprey computes float64 as float32 (as
  OpenVINO's CPU plugin does); the oracle is NumPy in float64 (ONNX Runtime 1.20 has no float64 Cos kernel).
- AveragePool with ceil_mode: a window may be longer than the input (transformers' EfficientNet ends with
  AvgPool2d(2560, ceil_mode=True) on 7x7), and count_include_pad counts the declared padding but not ceil_mode's
  overhang past it. Oracle: PyTorch (ONNX >= 1.18 and ONNX Runtime 1.32 agree; the ONNX Runtime 1.20 of these tests
  still divides by the whole kernel, microsoft/onnxruntime#16203).
- Convolutions on tokens (SegFormer, PVTv2) and the NaN guard of scaled_dot_product_attention with a mask (ViT,
  DINOv2, DETR): values against PyTorch or ONNX Runtime, and the profile says the rewrite happened.
"""

import io

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import osprey

F, D = TensorProto.FLOAT, TensorProto.DOUBLE


def save(tmp_path, name, nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


@pytest.mark.parametrize("encoding", ["raw_data", "double_data"])
def test_float64_constants_are_computed_as_float32(tmp_path, encoding):
    # RT-DETR's table: positions x frequencies in float64, Sin and Cos, joined, cast to float, added to the features.
    table = np.outer(np.arange(20, dtype=np.float64), 1.0 / 10000 ** (np.arange(8) / 8.0))
    if encoding == "raw_data":
        angles = numpy_helper.from_array(table, "angles")
    else:
        angles = helper.make_tensor("angles", D, table.shape, table.ravel().tolist())
    scale = helper.make_tensor("scale", D, [], [0.5])
    nodes = [helper.make_node("Sin", ["angles"], ["sin"]), helper.make_node("Cos", ["angles"], ["cos"]),
             helper.make_node("Concat", ["sin", "cos"], ["table"], axis=1),
             helper.make_node("Cast", ["x"], ["x64"], to=D),  # float -> double -> float around a double Mul
             helper.make_node("Mul", ["x64", "scale"], ["half64"]),
             helper.make_node("Add", ["half64", "table"], ["sum64"]),
             helper.make_node("Cast", ["sum64"], ["y"], to=F)]
    path = save(tmp_path, "double", nodes, [helper.make_tensor_value_info("x", F, [20, 16])],
                [helper.make_tensor_value_info("y", F, [20, 16])], [angles, scale])
    x = np.random.default_rng(0).standard_normal((20, 16)).astype(np.float32)
    want = (x.astype(np.float64) * 0.5 + np.concatenate([np.sin(table), np.cos(table)], axis=1)).astype(np.float32)
    got = osprey.Model(path, threads=1).run({"x": x})["y"]
    assert got.dtype == np.float32
    # float32 arguments of Sin/Cos up to 19: one ulp of the argument (1.9e-6) moves the result as much.
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-6)


def test_a_float64_graph_input_takes_float32(tmp_path):
    path = save(tmp_path, "double_in", [helper.make_node("Cast", ["x"], ["y"], to=F)],
                [helper.make_tensor_value_info("x", D, [3])], [helper.make_tensor_value_info("y", F, [3])])
    model = osprey.Model(path, threads=1)
    np.testing.assert_array_equal(model.run({"x": np.array([1.5, -2, 3], np.float32)})["y"], [1.5, -2, 3])
    with pytest.raises(osprey.InvalidArgument, match="float64 arrays are not supported"):
        model.run({"x": np.array([1.5, -2, 3])})


# (input H, W), kernel, stride, pads (top/left = bottom/right), count_include_pad
POOLS = [((8, 8), 3, 2, 0, True), ((8, 8), 3, 2, 1, True), ((8, 8), 3, 2, 1, False), ((7, 9), (3, 2), (2, 3), 1, True),
         ((7, 7), 9, 9, 0, True), ((7, 7), 2560, 2560, 0, True), ((7, 5), (8, 6), 3, 0, False), ((6, 6), 2, 3, 0, True)]


@pytest.mark.parametrize("size,kernel,stride,pad,include", POOLS)
def test_average_pool_with_ceil_mode_matches_pytorch(tmp_path, size, kernel, stride, pad, include):
    pair = lambda v: list(v) if isinstance(v, tuple) else [v, v]  # noqa: E731
    x = np.random.default_rng(sum(size)).standard_normal((2, 3, *size)).astype(np.float32)
    # PyTorch refuses padding over half the kernel; these kernels longer than the input have none.
    want = torch.nn.functional.avg_pool2d(torch.from_numpy(x), pair(kernel), pair(stride), pad, ceil_mode=True,
                                          count_include_pad=include).numpy()
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=pair(kernel), strides=pair(stride),
                            pads=[pad] * 4, ceil_mode=1, count_include_pad=int(include))
    path = save(tmp_path, "pool", [node], [helper.make_tensor_value_info("x", F, x.shape)],
                [helper.make_tensor_value_info("y", F, None)])
    for threads in (1, 2):
        got = osprey.Model(path, threads=threads).run({"x": x})["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_efficientnet_head_exported_by_pytorch(tmp_path):
    """transformers' EfficientNetEncoder pools with nn.AvgPool2d(config.hidden_dim, ceil_mode=True): a 2560-wide window
    over the last 7x7 features, one output per channel, exported here by PyTorch's TorchScript exporter."""
    torch.manual_seed(0)
    head = torch.nn.Sequential(torch.nn.Conv2d(8, 32, 1), torch.nn.AvgPool2d(2560, ceil_mode=True),
                               torch.nn.Flatten(), torch.nn.Linear(32, 5)).eval()
    x = torch.randn(2, 8, 7, 7)
    buffer = io.BytesIO()
    torch.onnx.export(head, (x,), buffer, input_names=["x"], output_names=["y"], opset_version=17)
    path = tmp_path / "head.onnx"
    path.write_bytes(buffer.getvalue())
    with torch.no_grad():
        want = head(x).numpy()
    np.testing.assert_allclose(osprey.Model(str(path), threads=2).run({"x": x.numpy()})["y"], want, rtol=1e-5,
                               atol=1e-5)


class TokenConvolutions(torch.nn.Module):
    """SegFormer / PVTv2 blocks in small: Mix-FFN (a depthwise convolution on tokens, GELU after the tokens are back)
    and spatial-reduction attention's key/value convolution, tokens [B, N, C] viewed as an image and back."""

    def __init__(self, c=32, hidden=64, size=(12, 10)):
        super().__init__()
        self.size = size
        self.fc1, self.fc2 = torch.nn.Linear(c, hidden), torch.nn.Linear(hidden, c)
        self.dw = torch.nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.sr, self.norm, self.act = torch.nn.Conv2d(c, c, 2, stride=2), torch.nn.LayerNorm(c), torch.nn.GELU()

    def forward(self, x):
        b, _, c = x.shape
        h, w = self.size
        t = self.act(self.dw(self.fc1(x).transpose(1, 2).view(b, -1, h, w)).flatten(2).transpose(1, 2))
        y = self.fc2(t) + x
        kv = self.sr(y.permute(0, 2, 1).reshape(b, c, h, w)).reshape(b, c, -1).permute(0, 2, 1)
        return y, self.norm(kv)


def test_convolutions_on_tokens_run_without_transposes(tmp_path, run_cli):
    """Transpose [B, N, C] -> Reshape [B, C, H, W] (and back) becomes Reshape [B, H, W, C] -> a channels-last view, so
    no Transpose moves data (SegFormer-B0 at 512x512: 174 -> 113 ms), and the GELU behind the Transpose and Reshape is
    fused into the convolution. Oracle: PyTorch; the profile shows what ran."""
    torch.manual_seed(0)
    model = TokenConvolutions().eval()
    x = torch.randn(2, 120, 32)
    buffer = io.BytesIO()
    torch.onnx.export(model, (x,), buffer, input_names=["x"], output_names=["y", "kv"], opset_version=17)
    path = tmp_path / "tokens.onnx"
    path.write_bytes(buffer.getvalue())
    with torch.no_grad():
        want = [t.numpy() for t in model(x)]
    got = osprey.Model(str(path), threads=2).run({"x": x.numpy()})
    for name, ref in zip(["y", "kv"], want):
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5)
    np.save(tmp_path / "x.npy", x.numpy())
    r = run_cli("bench", path, "--input", f"x={tmp_path / 'x.npy'}", "--iters", "1", "--warmup", "0", "--profile",
                "--top", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    nodes = r.stdout.split("all nodes")[1]
    assert "TransposeCpu" not in nodes and "_LayoutReorder" not in nodes, nodes
    assert "Erf" not in nodes and "Gelu" not in nodes, nodes  # GELU fused into the depthwise convolution
    assert nodes.count("TransposeLayoutCopy") == 4, nodes


def attention_with_nan_guard(tmp_path, mask, runtime_mask=False):
    """softmax(q k^T / 8 + mask) v as PyTorch's dynamo exporter writes scaled_dot_product_attention with a mask: the
    probabilities go through Where(IsNaN(p), 0, p)."""
    b, h, t, d = 1, 2, 40, 16
    scale = numpy_helper.from_array(np.array(0.125, np.float32), "scale")
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    inits = [scale, zero] + ([] if runtime_mask else [numpy_helper.from_array(mask, "mask")])
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]), helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
             helper.make_node("Add", ["scaled", "mask"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
             helper.make_node("IsNaN", ["probs"], ["nan"]), helper.make_node("Where", ["nan", "zero", "probs"], ["p"]),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    inputs = [helper.make_tensor_value_info(n, F, [b, h, t, d]) for n in ("q", "k", "v")]
    if runtime_mask:
        inputs.append(helper.make_tensor_value_info("mask", F, list(mask.shape)))
    path = save(tmp_path, "sdpa", nodes, inputs, [helper.make_tensor_value_info("y", F, [b, h, t, d])], inits)
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal((b, h, t, d)).astype(np.float32) for n in ("q", "k", "v")}
    if runtime_mask:
        feeds["mask"] = mask
    return path, feeds


@pytest.mark.parametrize("case", ["zeros", "finite", "row_masked_with_inf", "runtime"])
def test_attention_nan_guard_of_the_dynamo_exporter(tmp_path, run_cli, case):
    """With a constant mask of finite values the guard changes nothing for finite activations: it is dropped (an
    all-zero mask too) and the attention runs as one kernel. A mask that masks a whole row with -inf, or one known
    only at run time, keeps it: that row's output is zeros, as ONNX Runtime gives. Oracle: ONNX Runtime."""
    mask = np.zeros((1, 1, 40, 40), np.float32)
    if case != "zeros":
        mask[..., ::3] = np.finfo(np.float32).min  # transformers' masked value: finite
    if case == "row_masked_with_inf":
        mask[..., 5, :] = -np.inf
    path, feeds = attention_with_nan_guard(tmp_path, mask, runtime_mask=case == "runtime")
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = osprey.Model(path, threads=2).run(feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if case == "row_masked_with_inf":
        assert not np.isnan(want).any() and np.all(got[:, :, 5] == 0)
    args = []
    for name, value in feeds.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["--input", f"{name}={tmp_path / f'{name}.npy'}"]
    r = run_cli("bench", path, *args, "--iters", "1", "--warmup", "0", "--profile", "--top", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    nodes = r.stdout.split("all nodes")[1]
    guarded = case in ("row_masked_with_inf", "runtime")
    assert ("IsNaN" in nodes) == guarded and ("_AttentionViews" in nodes) == (not guarded), nodes


def test_pool_windows_far_longer_than_the_input_cost_what_the_input_does(tmp_path):
    """ceil_mode lets a window of 2^30 (or pads of 2^30) reach a 7-pixel input: a pool walks only the taps that land
    in it (the reference kernel walked every tap: seconds per output, minutes in 3-D), and count_include_pad's divisor
    (2^90 taps here) does not overflow. Oracle: hand-computed values."""
    big = 1 << 30
    x = np.ones((1, 1, 7, 7, 7), np.float32)
    cases = [("MaxPool", {}, x[..., 0], [1.0]),
             ("AveragePool", {"count_include_pad": 1}, x[..., 0], [1.0]),
             # 3-D, pads 2^30 - 1: two windows per dim, 1 and 6 input taps each of 2^30 counted.
             ("AveragePool", {"count_include_pad": 1, "pads": [big - 1] * 6}, x,
              [a * b * c / 2.0 ** 90 for a in (1, 6) for b in (1, 6) for c in (1, 6)])]
    for op, attrs, data, want in cases:
        rank = data.ndim - 2
        node = helper.make_node(op, ["x"], ["y"], kernel_shape=[big] * rank, strides=[big] * rank, ceil_mode=1,
                                **attrs)
        path = save(tmp_path, f"{op}{rank}", [node], [helper.make_tensor_value_info("x", F, data.shape)],
                    [helper.make_tensor_value_info("y", F, None)], opset=19)
        got = osprey.Model(path, threads=2).run({"x": data})["y"]
        np.testing.assert_allclose(got.ravel(), want, rtol=1e-6)
