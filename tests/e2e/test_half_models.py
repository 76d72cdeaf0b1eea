"""Half-precision models (float16, bfloat16), as exporters write them for GPUs and ONNX Runtime runs them on CPUs: osprey
computes them in float32 (runtime/promote_half.h), their inputs and outputs keeping their types.

- torchvision's MobileNetV2 made float16 the way onnxconverter-common's convert_float_to_float16 does (every float
  initializer, input, output and value type float16; with keep_io_types, float32 inputs and outputs and Casts to and
  from float16 around the body), against ONNX Runtime on the float16 model (max difference within 0.4% of the
  largest logit, top-1 equal) and on the float32 original (cosine >= 0.999, the issue's float16 bar).
- A small graph in bfloat16 (ORT has few bfloat16 CPU kernels) against NumPy in float32, within one bfloat16 step; an
  If on input data whose branches declare float16 outputs.
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import make_test_models

F32, F16, BF16 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16


def half_copy(model: onnx.ModelProto, keep_io_types: bool) -> onnx.ModelProto:
    """`model` with float32 made float16 everywhere, as convert_float_to_float16 writes it."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    for init in g.initializer:
        if init.data_type == F32:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    for vi in list(g.value_info) + ([] if keep_io_types else list(g.input) + list(g.output)):
        if vi.type.tensor_type.elem_type == F32:
            vi.type.tensor_type.elem_type = F16
    for node in g.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == F32:
                attr.i = F16
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == F32:  # Constant nodes (Clip's bounds)
                attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float16), attr.t.name))
    if keep_io_types:  # float32 in and out, Casts around the float16 body
        x, y = g.input[0].name, g.output[0].name
        for node in g.node:
            node.input[:] = [x + "_f16" if i == x else i for i in node.input]
            node.output[:] = [y + "_f16" if o == y else o for o in node.output]
        g.node.insert(0, helper.make_node("Cast", [x], [x + "_f16"], to=F16, name="input_cast"))
        g.node.append(helper.make_node("Cast", [y + "_f16"], [y], to=F32, name="output_cast"))
    return m


def cosine(a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("keep_io_types", [False, True], ids=["float16-io", "float32-io"])
def test_float16_mobilenet_matches_onnxruntime(keep_io_types, ensure_model, run_cli, work_dir):
    paths = ensure_model("mobilenet_v2")
    model = onnx.load(str(paths["onnx"]))
    half_path = work_dir / "mobilenet_v2.fp16.onnx"
    onnx.save(half_copy(model, keep_io_types), str(half_path))
    x = np.load(paths["input1"])
    x_in = x if keep_io_types else x.astype(np.float16)
    np.save(work_dir / "x.npy", x_in)
    proc = run_cli("run", half_path, "--input", f"{make_test_models.INPUT_NAME}={work_dir / 'x.npy'}",
                   "--output-dir", work_dir / "out", "--threads", 2, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ours = np.load(work_dir / "out" / f"{make_test_models.OUTPUT_NAME}.npy")
    assert ours.dtype == x_in.dtype and ours.shape == (1, 1000)

    full = ort.InferenceSession(str(paths["onnx"]), providers=["CPUExecutionProvider"]).run(None, {
        make_test_models.INPUT_NAME: x})[0]
    half = ort.InferenceSession(str(half_path), providers=["CPUExecutionProvider"]).run(None, {
        make_test_models.INPUT_NAME: x_in})[0]
    assert half.dtype == ours.dtype
    # The float16 weights, which both engines share, set the distance from the float32 model (~1% of the largest
    # logit here); the arithmetic adds little: osprey's float32 arithmetic and ORT's float16 run end within a few
    # float16 steps of each other.
    assert cosine(ours, full) >= 0.999, cosine(ours, full)
    scale = float(np.abs(full).max())
    assert float(np.abs(ours.astype(np.float64) - half).max()) <= 4e-3 * scale
    assert int(np.argmax(ours)) == int(np.argmax(half))


def test_float16_classifier_classifies(ensure_model, run_cli, work_dir):
    # `classify` on a model directory whose image input is float16 (preprocessing computed in float32, then converted):
    # refused before ("expected float32 for image preprocessing"). Oracle: the float32 original's classify on the same
    # photos, preprocessing derived alike for both; the same top-1, its probability within 5% (float16 weights).
    import json
    from pathlib import Path

    model = onnx.load(str(ensure_model("mobilenet_v2")["onnx"]))
    photos = sorted((Path(__file__).resolve().parents[2] / "demo-datasets" / "photos" / "images").glob("*.jpg"))[:4]
    assert photos
    results = {}
    for name, m in (("fp32", model), ("fp16", half_copy(model, keep_io_types=False))):
        (work_dir / name / "1").mkdir(parents=True, exist_ok=True)
        onnx.save(m, str(work_dir / name / "1" / "model.onnx"))
        proc = run_cli("classify", work_dir / name, *photos, "--json", "--top-k", 3, "--threads", 2, timeout=300)
        assert proc.returncode == 0, proc.stderr
        results[name] = json.loads(proc.stdout)
    assert len(results["fp16"]["results"]) == len(photos)
    for full, half in zip(results["fp32"]["results"], results["fp16"]["results"]):
        top_full, top_half = full["top_k"][0], half["top_k"][0]
        assert top_half["index"] == top_full["index"], (full, half)
        assert abs(top_half["probability"] - top_full["probability"]) <= 0.05 * top_full["probability"], (full, half)


def to_bf16(a):
    """float32 -> bfloat16 bits, round to nearest even (as osprey's and ONNX's conversions do)."""
    bits = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(bits):
    return (np.asarray(bits, np.uint32) << 16).view(np.float32)


def test_bfloat16_graph_and_float16_branches(run_cli, work_dir):
    # bfloat16 weights and compute between Casts (NumPy has no bfloat16 arrays, so models keep float32 inputs), and
    # an If on input data whose branches declare float16 outputs, given back as float16.
    rng = np.random.default_rng(0)
    w = from_bf16(to_bf16(rng.standard_normal((16, 8)).astype(np.float32)))
    b = from_bf16(to_bf16(rng.standard_normal(8).astype(np.float32)))
    w_t = helper.make_tensor("w", BF16, w.shape, to_bf16(w).tobytes(), raw=True)
    b_t = helper.make_tensor("b", BF16, b.shape, to_bf16(b).tobytes(), raw=True)
    half_branch = lambda name, value: helper.make_graph(  # noqa: E731
        [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array([value], np.float16)))],
        name, [], [helper.make_tensor_value_info(name, F16, [1])])
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["xb"], to=BF16),
         helper.make_node("MatMul", ["xb", "w"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["zb"]),
         helper.make_node("Relu", ["zb"], ["yb"]),
         helper.make_node("Cast", ["zb"], ["z"], to=F32),
         helper.make_node("Cast", ["yb"], ["y"], to=F32),
         helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
         helper.make_node("Greater", ["total", "zero"], ["positive"]),
         helper.make_node("If", ["positive"], ["sign"], then_branch=half_branch("plus", 1.5),
                          else_branch=half_branch("minus", -2.5))],
        "bf16", [helper.make_tensor_value_info("x", F32, [4, 16])],
        [helper.make_tensor_value_info("y", F32, [4, 8]), helper.make_tensor_value_info("sign", F16, [1]),
         helper.make_tensor_value_info("z", F32, [4, 8])],
        [w_t, b_t, numpy_helper.from_array(np.array(0, np.float32), "zero")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = work_dir / "bf16.onnx"
    onnx.save(model, str(path))
    for k, sign in enumerate((1.0, -1.0)):
        x = from_bf16(to_bf16(sign * np.abs(rng.standard_normal((4, 16))).astype(np.float32)))
        np.save(work_dir / f"x{k}.npy", x)
        proc = run_cli("run", path, "--input", f"x={work_dir / f'x{k}.npy'}", "--output-dir", work_dir / f"out{k}")
        assert proc.returncode == 0, proc.stderr
        got = {name: np.load(work_dir / f"out{k}" / f"{name}.npy") for name in ("y", "z", "sign")}
        z = x @ w + b
        for name, want in (("z", z), ("y", np.maximum(z, 0))):
            assert got[name].dtype == np.float32 and got[name].shape == want.shape
            # Computed in float32: within one bfloat16 step of float32's result, whatever bfloat16 rounding the
            # model's own arithmetic would add.
            np.testing.assert_allclose(got[name], want, rtol=2 ** -7, atol=1e-6)
        assert got["sign"].dtype == np.float16 and float(got["sign"][0]) == (1.5 if sign > 0 else -2.5)
