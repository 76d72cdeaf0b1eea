"""Models ONNX Runtime saved after optimising them (SessionOptions.optimized_model_filepath at ORT_ENABLE_EXTENDED, its
documented offline mode), through `osprey run`, against ONNX Runtime 1.32 running the same file.

ORT's optimiser writes com.microsoft FusedConv (Conv [+ Z] + activation), FusedGemm, FusedMatMul (alpha, transposes
and transBatch, its MatmulTransposeFusion of attention's K and V kept [T, B x N, h]), DynamicQuantizeMatMul and, in
the default domain, SimplifiedLayerNormalization (an RMS norm); osprey lowers each to default-domain ops when it
compiles (runtime/contrib_ops.cc, function_ops.cc). The ops are checked one by one on their attribute combinations,
then whole zoo models ORT optimised. NCHWc models (ORT_ENABLE_ALL) are refused with advice.
"""

import os
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from pytest_support import ort_u8s8_exact
from test_newest_opsets import f32, outputs_of, run_osprey

RNG = np.random.default_rng(7)
MS = "com.microsoft"


def ms_model(path, node, inputs, initializers=(), opset=17):
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    path.write_bytes(model.SerializeToString())


def check_against_ort(osprey_bin, tmp_path, path, feeds, rtol=1e-5, atol=1e-5):
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    (got,) = outputs_of(osprey_bin, path, feeds, tmp_path, ["Y"])
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


FUSED_MATMUL = {
    # name: (A shape, B shape, attributes)
    "plain_alpha": ((3, 5), (5, 4), {"alpha": 0.125}),
    "trans_a_b": ((2, 5, 3), (2, 4, 5), {"transA": 1, "transB": 1}),
    "batch_b_trans_b": ((12, 1, 8), (16, 12, 8), {"transBatchB": 1, "transB": 1}),  # ORT's attention K [T, B N, h]
    "batch_b": ((12, 1, 16), (16, 12, 8), {"transBatchB": 1}),  # ... and V
    "batch_a_rank4": ((5, 2, 3, 4), (2, 3, 4, 6), {"transBatchA": 1, "alpha": 2.0}),
    "batch_both_trans_both": ((4, 2, 3, 5), (6, 2, 3, 4), {"transBatchA": 1, "transBatchB": 1, "transA": 1,
                                                           "transB": 1}),
    "broadcast": ((2, 3, 4, 5), (5, 6), {}),
}


@pytest.mark.parametrize("case", sorted(FUSED_MATMUL))
def test_fused_matmul_matches_onnxruntime(osprey_bin, tmp_path, case):
    a_shape, b_shape, attrs = FUSED_MATMUL[case]
    path = tmp_path / "m.onnx"
    op = "TransposeMatMul" if case == "trans_a_b" else "FusedMatMul"  # the older name, the same kernel in ORT
    ms_model(path, helper.make_node(op, ["A", "B"], ["Y"], domain=MS, **attrs),
             [f32("A", a_shape), f32("B", b_shape)])
    feeds = {"A": RNG.standard_normal(a_shape).astype(np.float32),
             "B": RNG.standard_normal(b_shape).astype(np.float32)}
    check_against_ort(osprey_bin, tmp_path, path, feeds)


ACTIVATIONS = [("Relu", []), ("Clip", [0.0, 6.0]), ("LeakyRelu", [0.1]), ("HardSigmoid", [0.2, 0.5]),
               ("Sigmoid", []), ("Tanh", [])]


@pytest.mark.parametrize("activation,params", ACTIVATIONS)
@pytest.mark.parametrize("with_sum", [False, True])
def test_fused_conv_matches_onnxruntime(osprey_bin, tmp_path, activation, params, with_sum):
    inits = [numpy_helper.from_array((RNG.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32), "W"),
             numpy_helper.from_array(RNG.standard_normal(8).astype(np.float32), "B")]
    inputs = [f32("X", [1, 4, 9, 9])]
    names = ["X", "W", "B"]
    if with_sum:
        inputs.append(f32("Z", [1, 8, 5, 5]))
        names.append("Z")
    extra = {"activation_params": params} if params else {}
    node = helper.make_node("FusedConv", names, ["Y"], domain=MS, activation=activation, strides=[2, 2],
                            pads=[1, 1, 1, 1], **extra)
    path = tmp_path / "c.onnx"
    ms_model(path, node, inputs, inits)
    feeds = {"X": RNG.standard_normal((1, 4, 9, 9)).astype(np.float32)}
    if with_sum:
        feeds["Z"] = RNG.standard_normal((1, 8, 5, 5)).astype(np.float32)
    check_against_ort(osprey_bin, tmp_path, path, feeds)


@pytest.mark.parametrize("activation,attrs", [("Relu", {}), ("LeakyRelu", {"activation_alpha": 0.2}),
                                              ("Tanh", {}), ("Sigmoid", {})])
def test_fused_gemm_matches_onnxruntime(osprey_bin, tmp_path, activation, attrs):
    inits = [numpy_helper.from_array(RNG.standard_normal((6, 10)).astype(np.float32), "B"),
             numpy_helper.from_array(RNG.standard_normal(6).astype(np.float32), "C")]
    node = helper.make_node("FusedGemm", ["A", "B", "C"], ["Y"], domain=MS, activation=activation, transB=1,
                            alpha=0.5, beta=2.0, **attrs)
    path = tmp_path / "g.onnx"
    ms_model(path, node, [f32("A", [3, 10])], inits)
    check_against_ort(osprey_bin, tmp_path, path, {"A": RNG.standard_normal((3, 10)).astype(np.float32)})


@pytest.mark.parametrize("weights", ["int8", "uint8"])
def test_dynamic_quantize_matmul_matches_onnxruntime(osprey_bin, tmp_path, weights):
    """Oracle: the op's definition in NumPy (A quantised to uint8 as DynamicQuantizeLinear does, integer products,
    scales, bias), and ORT where its uint8 x int8 products are exact (not on AVX2 without VNNI: pytest_support)."""
    dtype = np.int8 if weights == "int8" else np.uint8
    low, high = (-128, 128) if weights == "int8" else (0, 256)
    b = RNG.integers(low, high, (16, 6)).astype(dtype)
    b_scale = (RNG.random(6) * 0.02 + 0.001).astype(np.float32)
    b_zero = np.full(6, 3 if weights == "int8" else 120, dtype)
    bias = RNG.standard_normal(6).astype(np.float32)
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(b_scale, "b_scale"),
             numpy_helper.from_array(b_zero, "b_zero"), numpy_helper.from_array(bias, "bias")]
    node = helper.make_node("DynamicQuantizeMatMul", ["A", "B", "b_scale", "b_zero", "bias"], ["Y"], domain=MS)
    path = tmp_path / "q.onnx"
    ms_model(path, node, [f32("A", [4, 16])], inits)
    a = RNG.standard_normal((4, 16)).astype(np.float32)
    low_a, high_a = min(0.0, float(a.min())), max(0.0, float(a.max()))
    a_scale = np.float32((high_a - low_a) / 255)
    a_zero = np.clip(np.round(-low_a / a_scale), 0, 255)
    qa = np.clip(np.round(a / a_scale) + a_zero, 0, 255)
    products = (qa - a_zero).astype(np.int64) @ (b.astype(np.int64) - b_zero.astype(np.int64))
    expected = products.astype(np.float32) * (a_scale * b_scale) + bias
    (got,) = outputs_of(osprey_bin, path, {"A": a}, tmp_path, ["Y"])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    if weights == "uint8" or ort_u8s8_exact():
        check_against_ort(osprey_bin, tmp_path, path, {"A": a}, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("opset", [13, 17])
def test_simplified_layer_normalization_matches_onnxruntime(osprey_bin, tmp_path, opset):
    """ORT's RMS norm in the default domain (ReduceMean's axes an attribute before opset 18), with 1 / rms."""
    node = helper.make_node("SimplifiedLayerNormalization", ["X", "scale"], ["Y", "inv"], axis=-1, epsilon=1e-5)
    graph = helper.make_graph([node], "g", [f32("X", [2, 5, 16])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "inv")],
                              [numpy_helper.from_array(RNG.standard_normal(16).astype(np.float32), "scale")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    path = tmp_path / "sln.onnx"
    path.write_bytes(model.SerializeToString())
    x = (RNG.standard_normal((2, 5, 16)) * 3).astype(np.float32)
    expected = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    got = outputs_of(osprey_bin, path, {"X": x}, tmp_path, ["Y", "inv"])
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def zoo_model(name) -> Path:
    cache = Path(os.environ.get("OSPREY_MODEL_CACHE", Path.home() / ".cache" / "osprey" / "models"))
    path = cache / f"{name}.onnx"
    if not path.exists():
        pytest.fail(f"{path} is missing: `make test` exports it first (tools/make_test_models.py)", pytrace=False)
    return path


@pytest.mark.parametrize("name", ["mobilenet_v2", "efficientnet_b0", "convnext_tiny"])
def test_zoo_models_ort_saved_optimised_agree_with_the_original(osprey_bin, tmp_path, name):
    """FusedConv with Clip (MobileNetV2), QuickGelu and FusedConv (EfficientNet), SimplifiedLayerNormalization and
    BiasGelu (ConvNeXt): osprey on ORT's saved file against ORT on the original."""
    original = zoo_model(name)
    saved = tmp_path / f"{name}.ort_extended.onnx"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(saved)
    ort.InferenceSession(str(original), options, providers=["CPUExecutionProvider"])
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(original), plain, providers=["CPUExecutionProvider"])
    x = np.load(original.with_suffix(".input1.npy"))
    expected = session.run(None, {session.get_inputs()[0].name: x})[0]
    (got,) = outputs_of(osprey_bin, saved, {session.get_inputs()[0].name: x}, tmp_path,
                        [session.get_outputs()[0].name])
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3 * float(np.abs(expected).max()))


def test_unknown_fused_activation_is_refused_by_name(osprey_bin, tmp_path):
    inits = [numpy_helper.from_array(np.zeros((2, 2, 1, 1), np.float32), "W")]
    path = tmp_path / "act.onnx"
    ms_model(path, helper.make_node("FusedConv", ["X", "W"], ["Y"], domain=MS, activation="Gelu"),
             [f32("X", [1, 2, 3, 3])], inits)
    proc, _ = run_osprey(osprey_bin, path, {}, tmp_path, "--random-inputs")
    assert proc.returncode == 1 and "activation 'Gelu' is not supported" in proc.stderr, proc.stderr


def test_nchwc_models_are_refused_with_advice(osprey_bin, tmp_path):
    saved = tmp_path / "nchwc.onnx"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(saved)
    options.log_severity_level = 3
    ort.InferenceSession(str(zoo_model("mobilenet_v2")), options, providers=["CPUExecutionProvider"])
    proc, _ = run_osprey(osprey_bin, saved, {}, tmp_path, "--random-inputs")
    assert proc.returncode == 1, proc.stderr
    assert "com.microsoft.nchwc" in proc.stderr and "ORT_ENABLE_EXTENDED" in proc.stderr, proc.stderr
