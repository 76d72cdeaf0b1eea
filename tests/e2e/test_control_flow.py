"""If and Loop end to end: osprey folds an If whose condition is known when it compiles (here a comparison of the input's
batch dim, as exporters emit for batch-dependent code) and refuses one whose condition depends on input data; it
unrolls a Loop whose trip count and conditions are known then (a constant count, a count from the input's shape as
tf.map_fn exports, a while-loop on the iteration number) and refuses a data-dependent or oversized one.

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


# ---------------------------------------------------------------------------------------------------------------- Loop

def loop_model(path, kind):
    """Loops over x [N, L] as exporters write them.

    count: M = 4 (constant): h = h * 0.5 + float(i) + bias (bias an outer value), scan output relu(h) -> [4, N, L].
    shape: M = N (Shape -> Gather), the tf.map_fn form: row i of x (Gather on i), times 2 minus the running sum,
           scan output the rows -> [N, L], carried sum [L].
    while: no M, cond = i < 2 computed in the body (a while loop), carried h = h + 1 -> 3 iterations.
    data:  M = the int64 of x's first element: refused.
    huge:  M = 10^9 with a constant condition: refused before unrolling more than the limit.
    nested: 5000 x 5000 iterations of a loop in a loop (25M nodes): refused at the model-wide node limit.
    """
    f, i64, b = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    consts = [_const("bias", np.float32(0.25)), _const("half", np.float32(0.5)), _const("zero_i", np.int64(0)),
              _const("true", np.bool_(True))]
    nodes = []
    if kind == "count":
        consts.append(_const("M", np.int64(4)))
        body = helper.make_graph(
            [helper.make_node("Cast", ["i"], ["fi"], to=f, name="cast"),
             helper.make_node("Mul", ["h_in", "half"], ["h_half"], name="half"),
             helper.make_node("Add", ["h_half", "fi"], ["h_i"], name="add_i"),
             helper.make_node("Add", ["h_i", "bias"], ["h_out"], name="add_bias"),
             helper.make_node("Relu", ["h_out"], ["scan"], name="relu"),
             helper.make_node("Identity", ["c_in"], ["c_out"], name="cond")],
            "body", [helper.make_tensor_value_info("i", i64, []), helper.make_tensor_value_info("c_in", b, []),
                     helper.make_tensor_value_info("h_in", f, [None, None])],
            [helper.make_tensor_value_info("c_out", b, []), helper.make_tensor_value_info("h_out", f, [None, None]),
             helper.make_tensor_value_info("scan", f, [None, None])])
        nodes.append(helper.make_node("Loop", ["M", "true", "x"], ["h", "y"], body=body, name="loop"))
        outputs = {"h": 2, "y": 3}
    elif kind == "shape":
        nodes += [helper.make_node("Shape", ["x"], ["x_shape"], name="shape"),
                  helper.make_node("Gather", ["x_shape", "zero_i"], ["M"], axis=0, name="batch"),
                  helper.make_node("ReduceMean", ["x"], ["zeros_l"], axes=[0], keepdims=0, name="mean0"),
                  helper.make_node("Mul", ["zeros_l", "zero_f"], ["s0"], name="zeros")]
        consts.append(_const("zero_f", np.float32(0)))
        consts.append(_const("two", np.float32(2)))
        body = helper.make_graph(
            [helper.make_node("Gather", ["x", "i"], ["row"], axis=0, name="row"),
             helper.make_node("Mul", ["row", "two"], ["row2"], name="double"),
             helper.make_node("Sub", ["row2", "s_in"], ["scan"], name="minus_sum"),
             helper.make_node("Add", ["s_in", "row"], ["s_out"], name="running_sum"),
             helper.make_node("Identity", ["c_in"], ["c_out"], name="cond")],
            "body", [helper.make_tensor_value_info("i", i64, []), helper.make_tensor_value_info("c_in", b, []),
                     helper.make_tensor_value_info("s_in", f, [None])],
            [helper.make_tensor_value_info("c_out", b, []), helper.make_tensor_value_info("s_out", f, [None]),
             helper.make_tensor_value_info("scan", f, [None])])
        nodes.append(helper.make_node("Loop", ["M", "", "s0"], ["h", "y"], body=body, name="loop"))
        outputs = {"h": 1, "y": 2}
    elif kind == "while":
        consts.append(_const("two_i", np.int64(2)))
        consts.append(_const("one_f", np.float32(1)))
        body = helper.make_graph(
            [helper.make_node("Less", ["i", "two_i"], ["c_out"], name="less"),
             helper.make_node("Add", ["h_in", "one_f"], ["h_out"], name="inc")],
            "body", [helper.make_tensor_value_info("i", i64, []), helper.make_tensor_value_info("c_in", b, []),
                     helper.make_tensor_value_info("h_in", f, [None, None])],
            [helper.make_tensor_value_info("c_out", b, []), helper.make_tensor_value_info("h_out", f, [None, None])])
        nodes.append(helper.make_node("Loop", ["", "true", "x"], ["h"], body=body, name="loop"))
        outputs = {"h": 2}
    elif kind == "nested":
        consts.append(_const("M", np.int64(5000)))
        inner = helper.make_graph(
            [helper.make_node("Add", ["g_in", "bias"], ["g_out"], name="inc"),
             helper.make_node("Identity", ["d_in"], ["d_out"], name="cond")],
            "inner", [helper.make_tensor_value_info("j", i64, []), helper.make_tensor_value_info("d_in", b, []),
                      helper.make_tensor_value_info("g_in", f, [None, None])],
            [helper.make_tensor_value_info("d_out", b, []), helper.make_tensor_value_info("g_out", f, [None, None])])
        body = helper.make_graph(
            [helper.make_node("Loop", ["M", "true", "h_in"], ["h_out"], body=inner, name="inner_loop"),
             helper.make_node("Identity", ["c_in"], ["c_out"], name="cond")],
            "body", [helper.make_tensor_value_info("i", i64, []), helper.make_tensor_value_info("c_in", b, []),
                     helper.make_tensor_value_info("h_in", f, [None, None])],
            [helper.make_tensor_value_info("c_out", b, []), helper.make_tensor_value_info("h_out", f, [None, None])])
        nodes.append(helper.make_node("Loop", ["M", "true", "x"], ["h"], body=body, name="loop"))
        outputs = {"h": 2}
    else:
        if kind == "data":
            nodes += [helper.make_node("ReduceMax", ["x"], ["xmax"], keepdims=0, name="max"),
                      helper.make_node("Cast", ["xmax"], ["M"], to=i64, name="count")]
        else:
            consts.append(_const("M", np.int64(10**9)))
        body = helper.make_graph(
            [helper.make_node("Add", ["h_in", "bias"], ["h_out"], name="inc"),
             helper.make_node("Identity", ["c_in"], ["c_out"], name="cond")],
            "body", [helper.make_tensor_value_info("i", i64, []), helper.make_tensor_value_info("c_in", b, []),
                     helper.make_tensor_value_info("h_in", f, [None, None])],
            [helper.make_tensor_value_info("c_out", b, []), helper.make_tensor_value_info("h_out", f, [None, None])])
        nodes.append(helper.make_node("Loop", ["M", "true", "x"], ["h"], body=body, name="loop"))
        outputs = {"h": 2}
    graph = helper.make_graph(nodes, "loop_" + kind, [helper.make_tensor_value_info("x", f, ["N", "L"])],
                              [helper.make_tensor_value_info(o, f, [None] * r) for o, r in outputs.items()], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    checker.check_model(model)
    save(model, str(path))
    return path, list(outputs)


@pytest.mark.parametrize("kind", ["count", "shape", "while"])
@pytest.mark.parametrize("shape", [(1, 3), (3, 5)], ids=lambda s: "x".join(map(str, s)))
def test_loop_unrolls_and_agrees_with_onnxruntime(osprey_bin, work_dir, kind, shape):
    path, outputs = loop_model(work_dir / f"loop_{kind}.onnx", kind)
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    proc, out_dir = run_osprey(osprey_bin, path, x, work_dir, f"{kind}_" + "x".join(map(str, shape)))
    assert proc.returncode == 0, proc.stderr
    for name, w in zip(outputs, want):
        got = np.load(out_dir / f"{name}.npy")
        assert got.shape == w.shape, name
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("kind,message", [("data", "input 0 must be known when the model is compiled"),
                                          ("huge", "runs more than 10000 iterations"),
                                          ("nested", "200000 nodes in all")])
def test_loop_that_cannot_unroll_is_refused_naming_the_node(osprey_bin, work_dir, kind, message):
    path, _ = loop_model(work_dir / f"loop_{kind}.onnx", kind)
    proc, _ = run_osprey(osprey_bin, path, np.full((2, 3), 3, np.float32), work_dir, kind)
    assert proc.returncode == 1, proc.stderr
    assert "Loop 'loop" in proc.stderr and message in proc.stderr, proc.stderr  # (nested: 'loop/iteration_19/inner_loop')
