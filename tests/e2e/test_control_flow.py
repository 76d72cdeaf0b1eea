"""If end to end: osprey folds an If whose condition is known when it compiles (here a comparison of the input's batch
dim, as exporters emit for batch-dependent code) and refuses one whose condition depends on input data.

Models are built with onnx.helper: the branches read an outer-scope value and hold their own initializers, and one
branch holds a nested If on the sequence length. Oracle: ONNX Runtime (CPU EP) on the same file and inputs, float32
within rtol 1e-5 + atol 1e-6 (the branch arithmetic is the same in both).
"""

import subprocess

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, checker, helper, numpy_helper, save

TIMEOUT_S = 60


def _const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def if_model(path, data_condition=False):
    """y = If(N == 1) then Relu(x * 2 + b) else If(L > 4) then ReduceMean_L(x) broadcast else x - 1, for x [N, L]."""
    f = TensorProto.FLOAT
    inner_then = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[1], keepdims=1, name="mean"),
         helper.make_node("Expand", ["mean", "x_shape"], ["inner_then_y"], name="expand")],
        "inner_then", [], [helper.make_tensor_value_info("inner_then_y", f, [None, None])])
    inner_else = helper.make_graph(
        [helper.make_node("Sub", ["x", "one_f"], ["inner_else_y"], name="minus_one")],
        "inner_else", [], [helper.make_tensor_value_info("inner_else_y", f, [None, None])], [_const("one_f", np.float32(1))])
    then_branch = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["doubled"], name="double"),
         helper.make_node("Add", ["doubled", "bias"], ["biased"], name="bias"),
         helper.make_node("Relu", ["biased"], ["then_y"], name="relu")],
        "then", [], [helper.make_tensor_value_info("then_y", f, [None, None])],
        [_const("two", np.float32(2)), _const("bias", np.float32(-0.5))])
    else_branch = helper.make_graph(
        [helper.make_node("Gather", ["x_shape", "axis1"], ["length"], axis=0, name="length"),
         helper.make_node("Greater", ["length", "four"], ["long"], name="long"),
         helper.make_node("If", ["long"], ["else_y"], then_branch=inner_then, else_branch=inner_else,
                          name="if_long")],
        "else", [], [helper.make_tensor_value_info("else_y", f, [None, None])],
        [_const("axis1", np.int64(1)), _const("four", np.int64(4))])
    nodes = [helper.make_node("Shape", ["x"], ["x_shape"], name="shape")]
    if data_condition:
        nodes += [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0, name="total"),
                  helper.make_node("Greater", ["total", "zero_f"], ["cond"], name="positive")]
    else:
        nodes += [helper.make_node("Gather", ["x_shape", "axis0"], ["batch"], axis=0, name="batch"),
                  helper.make_node("Equal", ["batch", "one"], ["cond"], name="batch_is_1")]
    nodes.append(helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch,
                                  name="if_batch"))
    graph = helper.make_graph(
        nodes, "if_model", [helper.make_tensor_value_info("x", f, ["N", "L"])],
        [helper.make_tensor_value_info("y", f, [None, None])],
        [_const("axis0", np.int64(0)), _const("one", np.int64(1)), _const("zero_f", np.float32(0))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    checker.check_model(model)
    save(model, str(path))
    return path


def run_osprey(osprey_bin, model_path, x, work_dir, tag):
    inp = work_dir / f"{tag}.x.npy"
    np.save(inp, x)
    out_dir = work_dir / f"{tag}.out"
    return subprocess.run([str(osprey_bin), "run", str(model_path), "--input", f"x={inp}", "--output-dir",
                           str(out_dir), "--threads", "1"], capture_output=True, text=True, timeout=TIMEOUT_S), out_dir


@pytest.mark.parametrize("shape", [(1, 3), (1, 6), (2, 3), (3, 6)], ids=lambda s: "x".join(map(str, s)))
def test_if_on_shape_folds_and_agrees_with_onnxruntime(osprey_bin, work_dir, shape):
    path = if_model(work_dir / "if_shape.onnx")
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    proc, out_dir = run_osprey(osprey_bin, path, x, work_dir, "x".join(map(str, shape)))
    assert proc.returncode == 0, proc.stderr
    got = np.load(out_dir / "y.npy")
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_if_on_input_data_is_refused_naming_the_node(osprey_bin, work_dir):
    path = if_model(work_dir / "if_data.onnx", data_condition=True)
    proc, _ = run_osprey(osprey_bin, path, np.ones((2, 3), np.float32), work_dir, "data")
    assert proc.returncode == 1, proc.stderr
    assert "If 'if_batch': condition depends on input data" in proc.stderr, proc.stderr
    assert "known when the model is compiled" in proc.stderr
