"""If, Loop and Scan end to end: osprey folds an If whose condition is known when it compiles (here a comparison of the
input's batch dim, as exporters emit for batch-dependent code); one whose condition depends on input data has both
branches compiled and runs the one its condition picks (refused by name when the branches' output shapes differ); it
unrolls a Loop whose trip count and conditions are known then (a constant count, a count from the input's shape as
tf.map_fn exports, a while-loop on the iteration number) and refuses a data-dependent or oversized one; it unrolls
Scan (forward and reverse, scan axes other than 0, two scan inputs).

Models are built with onnx.helper: the branches read an outer-scope value and hold their own initializers, and one
branch holds a nested If on the sequence length. Oracle: ONNX Runtime (CPU EP) on the same file and inputs, float32
within rtol 1e-5 + atol 1e-6 (the branch arithmetic is the same in both).
"""

import json
import subprocess
from pathlib import Path

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


@pytest.mark.parametrize("shape,sign", [((1, 3), 1), ((1, 3), -1), ((2, 6), 1), ((2, 6), -1), ((2, 3), -1)],
                         ids=["1x3+", "1x3-", "2x6+", "2x6-", "2x3-"])
def test_if_on_input_data_runs_the_branch_its_condition_picks(osprey_bin, work_dir, shape, sign):
    # cond = sum(x) > 0: then Relu(2x - 0.5), else (with L > 4 known when compiling) the row mean, else x - 1.
    path = if_model(work_dir / "if_data.onnx", data_condition=True)
    x = sign * np.abs(np.random.default_rng(sum(shape)).standard_normal(shape)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    tag = "x".join(map(str, shape)) + ("p" if sign > 0 else "n")
    proc, out_dir = run_osprey(osprey_bin, path, x, work_dir, tag)
    assert proc.returncode == 0, proc.stderr
    got = np.load(out_dir / "y.npy")
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_if_branch_outputs_with_an_empty_type_are_inferred(osprey_bin, work_dir):
    # PyTorch's exporter writes If branch outputs whose TypeProto has no kind set (Silero VAD): as good as no type.
    import onnx
    model = onnx.load(str(if_model(work_dir / "if_typed.onnx", data_condition=True)))
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                for output in attr.g.output:
                    output.type.CopyFrom(onnx.TypeProto())
                    assert output.HasField("type") and output.type.WhichOneof("value") is None
    path = work_dir / "if_untyped.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(7).standard_normal((2, 6)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    proc, out_dir = run_osprey(osprey_bin, path, x, work_dir, "untyped")
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(np.load(out_dir / "y.npy"), want, rtol=1e-5, atol=1e-6)


def _data_if_model(path, else_nodes, else_output):
    """y = If(sum(x) > 0) then x * 2 else <else_nodes> for x [2, 3]."""
    f = TensorProto.FLOAT
    then_branch = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["then_y"], name="double")], "then", [],
                                    [helper.make_tensor_value_info("then_y", f, None)], [_const("two", np.float32(2))])
    else_branch = helper.make_graph(else_nodes, "else", [], [helper.make_tensor_value_info(else_output, f, None)],
                                    [_const("new_shape", np.array([4], np.int64))])
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0, name="total"),
         helper.make_node("Greater", ["total", "zero_f"], ["cond"], name="positive"),
         helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch, name="if_data")],
        "data_if", [helper.make_tensor_value_info("x", f, [2, 3])], [helper.make_tensor_value_info("y", f, None)],
        [_const("zero_f", np.float32(0))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    save(model, str(path))
    return path


def test_if_on_input_data_with_branches_of_different_shapes_matches_onnxruntime(osprey_bin, work_dir):
    # The output shape follows the data ([2, 3] or [1, 1]), as ONNX Runtime runs it: osprey's plans have fixed shapes,
    # so the model runs cut at the If (runtime/segments.h), each branch a part of its own.
    path = _data_if_model(work_dir / "if_shapes.onnx",
                          [helper.make_node("ReduceSum", ["x"], ["else_y"], keepdims=1, name="row_sums")], "else_y")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for tag, x in (("then", np.ones((2, 3), np.float32)), ("else", -np.arange(6, dtype=np.float32).reshape(2, 3))):
        want = session.run(None, {"x": x})[0]
        proc, out_dir = run_osprey(osprey_bin, path, x, work_dir, "shapes_" + tag)
        assert proc.returncode == 0, proc.stderr
        got = np.load(out_dir / "y.npy")
        assert got.shape == want.shape, tag
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_if_on_input_data_with_a_branch_that_cannot_run_fails_only_when_taken(osprey_bin, work_dir):
    # The else branch reshapes 6 values to [4]: ONNX Runtime fails only when it runs it, and so does osprey.
    path = _data_if_model(work_dir / "if_bad.onnx",
                          [helper.make_node("Reshape", ["x", "new_shape"], ["else_y"], name="bad_reshape")], "else_y")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    proc, out_dir = run_osprey(osprey_bin, path, x, work_dir, "bad_then")
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.load(out_dir / "y.npy"), x * 2)
    with pytest.raises(Exception):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": -x})
    proc, _ = run_osprey(osprey_bin, path, -x, work_dir, "bad_else")
    assert proc.returncode == 1, proc.stderr
    assert "If 'if_data': the condition chose else_branch, which cannot run for these input shapes" in proc.stderr
    assert "bad_reshape" in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------------------------- Loop

def _loop_body(name, nodes, carried_rank=2, scan_rank=0, p=""):
    """A Loop body reading (p+i, p+c_in, p+h_in) and writing (p+c_out, p+h_out[, p+scan])."""
    f, vi = TensorProto.FLOAT, helper.make_tensor_value_info
    inputs = [vi(p + "i", TensorProto.INT64, []), vi(p + "c_in", TensorProto.BOOL, []),
              vi(p + "h_in", f, [None] * carried_rank)]
    outputs = [vi(p + "c_out", TensorProto.BOOL, []), vi(p + "h_out", f, [None] * carried_rank)]
    if scan_rank:
        outputs.append(vi(p + "scan", f, [None] * scan_rank))
    return helper.make_graph(nodes, name, inputs, outputs)


def loop_model(path, kind):
    """Loops over x [N, L] as exporters write them.

    count: M = 4 (constant): h = h * 0.5 + float(i) + bias (bias an outer value), scan output relu(h) -> [4, N, L].
    shape: M = N (Shape -> Gather), the tf.map_fn form: row i of x (Gather on i), times 2 minus the running sum,
           scan output the rows -> [N, L], carried sum [L].
    while: no M, cond = i < 2 computed in the body (a while loop), carried h = h + 1 -> 3 iterations.
    data:  M = the int64 of x's maximum: not known when compiled, so the host runs the body per iteration.
    huge:  M = 10^9 with a constant condition: refused before unrolling more than the limit.
    nested: 5000 x 5000 iterations of a loop in a loop (25M nodes): refused at the model-wide node limit.
    """
    f, node = TensorProto.FLOAT, helper.make_node
    consts = [_const("bias", np.float32(0.25)), _const("half", np.float32(0.5)), _const("zero_i", np.int64(0)),
              _const("true", np.bool_(True)), _const("zero_f", np.float32(0)), _const("two", np.float32(2)),
              _const("two_i", np.int64(2)), _const("one_f", np.float32(1))]
    keep_cond = node("Identity", ["c_in"], ["c_out"], name="cond")
    increment = [node("Add", ["h_in", "bias"], ["h_out"], name="inc"), keep_cond]
    nodes, outputs, loop_inputs = [], {"h": 2}, ["M", "true", "x"]
    if kind == "count":
        consts.append(_const("M", np.int64(4)))
        body = _loop_body("body", [node("Cast", ["i"], ["fi"], to=f, name="cast"),
                                   node("Mul", ["h_in", "half"], ["h_half"], name="half"),
                                   node("Add", ["h_half", "fi"], ["h_i"], name="add_i"),
                                   node("Add", ["h_i", "bias"], ["h_out"], name="add_bias"),
                                   node("Relu", ["h_out"], ["scan"], name="relu"), keep_cond], scan_rank=2)
        outputs = {"h": 2, "y": 3}
    elif kind == "shape":
        nodes += [node("Shape", ["x"], ["x_shape"], name="shape"),
                  node("Gather", ["x_shape", "zero_i"], ["M"], axis=0, name="batch"),
                  node("ReduceMean", ["x"], ["mean_l"], axes=[0], keepdims=0, name="mean0"),
                  node("Mul", ["mean_l", "zero_f"], ["s0"], name="zeros")]
        body = _loop_body("body", [node("Gather", ["x", "i"], ["row"], axis=0, name="row"),
                                   node("Mul", ["row", "two"], ["row2"], name="double"),
                                   node("Sub", ["row2", "h_in"], ["scan"], name="minus_sum"),
                                   node("Add", ["h_in", "row"], ["h_out"], name="running_sum"), keep_cond],
                          carried_rank=1, scan_rank=1)
        loop_inputs, outputs = ["M", "", "s0"], {"h": 1, "y": 2}
    elif kind == "while":
        body = _loop_body("body", [node("Less", ["i", "two_i"], ["c_out"], name="less"),
                                   node("Add", ["h_in", "one_f"], ["h_out"], name="inc")])
        loop_inputs = ["", "true", "x"]
    elif kind == "nested":
        consts.append(_const("M", np.int64(5000)))
        inner = _loop_body("inner", [node("Add", ["g_h_in", "bias"], ["g_h_out"], name="inc"),
                                     node("Identity", ["g_c_in"], ["g_c_out"], name="cond")], p="g_")
        body = _loop_body("body", [node("Loop", ["M", "true", "h_in"], ["h_out"], body=inner, name="inner_loop"),
                                   keep_cond])
    elif kind == "endless":  # neither a trip count nor a condition
        body = _loop_body("body", increment)
        loop_inputs = ["", "", "x"]
    elif kind == "data":
        nodes += [node("ReduceMax", ["x"], ["xmax"], keepdims=0, name="max"),
                  node("Cast", ["xmax"], ["M"], to=TensorProto.INT64, name="count")]
        body = _loop_body("body", increment)
    else:
        consts.append(_const("M", np.int64(10**9)))
        body = _loop_body("body", increment)
    nodes.append(node("Loop", loop_inputs, list(outputs), body=body, name="loop"))
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
    expect_agreement(osprey_bin, work_dir, path, outputs, x, f"{kind}_" + "x".join(map(str, shape)))


@pytest.mark.parametrize("kind", ["count", "shape", "while"])
def test_loops_known_when_compiled_stay_unrolled(osprey_bin, work_dir, kind):
    """Loops whose trip count and conditions follow shapes and constants are unrolled into the plan (their steps are
    named by iteration), not run on the host per iteration as a loop on input data is."""
    path, _ = loop_model(work_dir / f"loop_{kind}.onnx", kind)
    proc = subprocess.run([str(osprey_bin), "bench", str(path), "--iters", "2", "--warmup", "0", "--profile", "--json",
                           "--top", "0", "--dims", "N=2", "--dims", "L=3"], capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    names = [n["node"] for n in json.loads(proc.stdout)["profile"]["top_nodes"]]
    assert any(n.startswith("loop/iteration_0/") for n in names), names


def expect_agreement(osprey_bin, work_dir, path, outputs, x, tag):
    """osprey's outputs `outputs` of model `path` on x equal ONNX Runtime's (float32, rtol 1e-5 + atol 1e-6)."""
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    proc, out_dir = run_osprey(osprey_bin, path, x, work_dir, tag)
    assert proc.returncode == 0, proc.stderr
    for name, w in zip(outputs, want):
        got = np.load(out_dir / f"{name}.npy")
        assert got.shape == w.shape, name
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("top", [-2.5, 0.5, 3.7, 9.2])
def test_loop_whose_trip_count_follows_input_data_runs_on_the_host(osprey_bin, work_dir, top):
    """M = int(max(x)): 0 (also for a negative M), 3 or 9 iterations; the scan-free loop carries h = h + 0.25."""
    path, outputs = loop_model(work_dir / "loop_data.onnx", "data")
    x = np.random.default_rng(7).uniform(-3, top, (2, 3)).astype(np.float32)
    x[0, 0] = top
    expect_agreement(osprey_bin, work_dir, path, outputs, x, f"data_{top}")


def test_loop_on_input_data_past_the_budget_is_refused_before_it_runs(osprey_bin, work_dir):
    path, _ = loop_model(work_dir / "loop_data.onnx", "data")
    proc, _ = run_osprey(osprey_bin, path, np.full((2, 3), 1e9, np.float32), work_dir, "data_huge")
    assert proc.returncode == 1, proc.stderr
    assert "Loop 'loop': 1000000000 iterations of a body of 2 nodes: more than osprey runs for one loop" in \
        proc.stderr, proc.stderr


@pytest.mark.parametrize("kind,message", [("huge", "runs more than 10000 iterations"),
                                          ("nested", "200000 nodes in all"),
                                          ("endless", "neither a trip count nor a condition")])
def test_loop_that_cannot_unroll_is_refused_naming_the_node(osprey_bin, work_dir, kind, message):
    path, _ = loop_model(work_dir / f"loop_{kind}.onnx", kind)
    proc, _ = run_osprey(osprey_bin, path, np.full((2, 3), 3, np.float32), work_dir, kind)
    assert proc.returncode == 1, proc.stderr
    # (a nested loop is named by its path: 'loop/iteration_19/inner_loop')
    assert "Loop 'loop" in proc.stderr and message in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------------------------- Scan

def scan_model(path, kind):
    """Scan over x [N, L] (opset 16).

    cumsum:  state s [L] (zeros), scan input x along axis 0: s += row, scan output s * bias -> [N, L].
    reverse: scan input x along axis 1, reversed (columns last to first), state [N]; scan output the running sum
             minus the column, stacked along axis 1 in reverse order -> [N, L]; a second scan input x * 2 (forward)
             is added to the column.
    """
    f, node, vi = TensorProto.FLOAT, helper.make_node, helper.make_tensor_value_info
    consts = [_const("bias", np.float32(0.5)), _const("zero_f", np.float32(0)), _const("two", np.float32(2))]
    if kind in ("cumsum", "direction2"):  # direction2: scan_input_directions = [2] (only 0 and 1 mean anything)
        nodes = [node("ReduceMean", ["x"], ["mean_l"], axes=[0], keepdims=0, name="mean0"),
                 node("Mul", ["mean_l", "zero_f"], ["s0"], name="zeros")]
        body = helper.make_graph(
            [node("Add", ["s_in", "row"], ["s_out"], name="add"), node("Mul", ["s_out", "bias"], ["y"], name="scale")],
            "body", [vi("s_in", f, [None]), vi("row", f, [None])], [vi("s_out", f, [None]), vi("y", f, [None])])
        directions = {"scan_input_directions": [2]} if kind == "direction2" else {}
        nodes.append(node("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1, name="scan", **directions))
        outputs = {"s": 1, "ys": 2}
    elif kind == "unequal":  # x along axis 0 (N steps) and along axis 1 (L steps): refused when N != L
        nodes = [node("ReduceMean", ["x"], ["mean_l"], axes=[0], keepdims=0, name="mean0"),
                 node("Mul", ["mean_l", "zero_f"], ["s0"], name="zeros")]
        body = helper.make_graph(
            [node("Add", ["s_in", "row"], ["s_out"], name="add"), node("Add", ["s_out", "col"], ["y"], name="col")],
            "body", [vi("s_in", f, [None]), vi("row", f, [None]), vi("col", f, [None])],
            [vi("s_out", f, [None]), vi("y", f, [None])])
        nodes.append(node("Scan", ["s0", "x", "x"], ["s", "ys"], body=body, num_scan_inputs=2,
                          scan_input_axes=[0, 1], name="scan"))
        outputs = {"s": 1, "ys": 2}
    else:
        nodes = [node("ReduceMean", ["x"], ["mean_n"], axes=[1], keepdims=0, name="mean1"),
                 node("Mul", ["mean_n", "zero_f"], ["s0"], name="zeros"),
                 node("Mul", ["x", "two"], ["x2"], name="double")]
        body = helper.make_graph(
            [node("Add", ["col", "col2"], ["both"], name="both"),
             node("Add", ["s_in", "both"], ["s_out"], name="add"),
             node("Sub", ["s_out", "col"], ["y"], name="minus")],
            "body", [vi("s_in", f, [None]), vi("col", f, [None]), vi("col2", f, [None])],
            [vi("s_out", f, [None]), vi("y", f, [None])])
        nodes.append(node("Scan", ["s0", "x", "x2"], ["s", "ys"], body=body, num_scan_inputs=2,
                          scan_input_axes=[1, 1], scan_input_directions=[1, 0], scan_output_axes=[1],
                          scan_output_directions=[1], name="scan"))
        outputs = {"s": 1, "ys": 2}
    graph = helper.make_graph(nodes, "scan_" + kind, [vi("x", f, ["N", "L"])],
                              [vi(o, f, [None] * r) for o, r in outputs.items()], consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    model.ir_version = 8
    checker.check_model(model)
    save(model, str(path))
    return path, list(outputs)


@pytest.mark.parametrize("kind", ["cumsum", "reverse"])
@pytest.mark.parametrize("shape", [(1, 3), (4, 5)], ids=lambda s: "x".join(map(str, s)))
def test_scan_unrolls_and_agrees_with_onnxruntime(osprey_bin, work_dir, kind, shape):
    path, outputs = scan_model(work_dir / f"scan_{kind}.onnx", kind)
    x = np.random.default_rng(sum(shape) + 7).standard_normal(shape).astype(np.float32)
    expect_agreement(osprey_bin, work_dir, path, outputs, x, f"scan_{kind}_" + "x".join(map(str, shape)))


@pytest.mark.parametrize("kind,shape,message", [
    ("cumsum", (10001, 2), "runs 10001 iterations"),        # the length is the scan input's dim: bounded all the same
    ("unequal", (3, 4), "scan inputs of different lengths (3 and 4)"),
    ("direction2", (3, 4), "scan_input_directions holds 2 (0 = forward, 1 = reverse)"),  # ONNX Runtime refuses it too
])
def test_scan_that_cannot_unroll_is_refused_naming_the_node(osprey_bin, work_dir, kind, shape, message):
    path, _ = scan_model(work_dir / f"scan_{kind}.onnx", kind)
    proc, _ = run_osprey(osprey_bin, path, np.ones(shape, np.float32), work_dir, f"scan_{kind}_refused")
    assert proc.returncode == 1, proc.stderr
    assert "Scan 'scan'" in proc.stderr and message in proc.stderr, proc.stderr


@pytest.mark.parametrize("batch", [1, 4])
def test_tf2onnx_map_fn_and_while_loop_agree_with_onnxruntime(osprey_bin, work_dir, batch):
    """TensorFlow control flow as another exporter writes it: tf.map_fn (a Loop whose trip count tf2onnx computes from
    the input's shape, with a scan output) then tf.while_loop (no trip count, a condition computed in the body).
    The model was exported by tools/export_tf_loops.py (TensorFlow 2.21, tf2onnx 1.17)."""
    path = Path(__file__).resolve().parent / "data" / "tf2onnx_map_fn_while.onnx"
    x = np.random.default_rng(batch).standard_normal((batch, 8, 8, 3)).astype(np.float32)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"x": x})[0]
    inp = work_dir / "x.npy"
    np.save(inp, x)
    proc = subprocess.run([str(osprey_bin), "run", str(path), "--input", f"x={inp}", "--output-dir",
                           str(work_dir / "out"), "--threads", "1"], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    files = sorted((work_dir / "out").glob("*.npy"))  # one output ('Identity:0', written under a safe file name)
    assert len(files) == 1, files
    got = np.load(files[0])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_tf2onnx_per_class_nms_in_a_loop_agrees_with_onnxruntime(osprey_bin, work_dir, seed):
    """tf.map_fn over classes with tf.image.non_max_suppression in each iteration, as a TensorFlow detector's
    post-processing is written (tools/export_tf_loops.py): a Loop whose body holds a NonMaxSuppression and carries its
    own class counter. osprey cuts the model at the Loop and runs the body per iteration; the kept count changes with
    the seed."""
    path = Path(__file__).resolve().parent / "data" / "tf2onnx_map_fn_nms.onnx"
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 100, (100, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + rng.uniform(5, 30, (100, 2)).astype(np.float32)], axis=1)
    scores = rng.uniform(0, 1, (100, 3)).astype(np.float32) ** (1 + 6 * seed)  # fewer over 0.3 as the seed grows
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"boxes": boxes, "scores": scores})[0]
    np.save(work_dir / "boxes.npy", boxes)
    np.save(work_dir / "scores.npy", scores)
    proc = subprocess.run([str(osprey_bin), "run", str(path), "--input", f"boxes={work_dir / 'boxes.npy'}", "--input",
                           f"scores={work_dir / 'scores.npy'}", "--output-dir", str(work_dir / "out"), "--threads",
                           "1"], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    files = sorted((work_dir / "out").glob("*.npy"))
    assert len(files) == 1, files
    got = np.load(files[0])
    assert got.shape == want.shape == (3, 10)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tf2onnx_padded_nms_loops_on_box_data_agree_with_onnxruntime(osprey_bin, work_dir, seed):
    """tf.image.non_max_suppression_padded (tools/export_tf_loops.py): TensorFlow's own NMS as nested Loops whose
    conditions follow the boxes (no NonMaxSuppression op); not unrollable when compiled, so the host runs them."""
    path = Path(__file__).resolve().parent / "data" / "tf2onnx_padded_nms.onnx"
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0, 1, (200, 2)).astype(np.float32)
    boxes = np.concatenate([corner, corner + rng.uniform(0.02, 0.2, (200, 2)).astype(np.float32)], axis=1)
    scores = rng.uniform(0, 1, 200).astype(np.float32) ** (1 + 20 * seed)  # fewer over 0.2 as the seed grows
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = sess.run(None, {"boxes": boxes, "scores": scores})
    np.save(work_dir / "boxes.npy", boxes)
    np.save(work_dir / "scores.npy", scores)
    proc = subprocess.run([str(osprey_bin), "run", str(path), "--input", f"boxes={work_dir / 'boxes.npy'}", "--input",
                           f"scores={work_dir / 'scores.npy'}", "--output-dir", str(work_dir / "out"), "--threads",
                           "1"], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    files = sorted((work_dir / "out").glob("*.npy"))  # 'Identity:0' (selected), 'Identity_1:0' (valid count)
    assert len(files) == 2, files
    for got, w in zip([np.load(f) for f in files], want):
        assert got.shape == w.shape
        np.testing.assert_array_equal(got, w)


def test_if_on_input_data_where_neither_branch_compiles_is_refused(osprey_bin, work_dir):
    # Both branches reshape 6 values to [4]: no plan for either, so the model is refused when it loads, with both.
    path = _data_if_model(work_dir / "if_neither.onnx",
                          [helper.make_node("Reshape", ["x", "new_shape"], ["else_y"], name="bad_else")], "else_y")
    import onnx
    model = onnx.load(str(path))
    if_node = next(n for n in model.graph.node if n.op_type == "If")
    then_graph = next(a for a in if_node.attribute if a.name == "then_branch").g
    then_graph.initializer.append(_const("new_shape", np.array([4], np.int64)))
    del then_graph.node[:]
    then_graph.node.append(helper.make_node("Reshape", ["x", "new_shape"], ["then_y"], name="bad_then"))
    onnx.save(model, str(path))
    proc, _ = run_osprey(osprey_bin, path, np.ones((2, 3), np.float32), work_dir, "neither")
    assert proc.returncode == 1, proc.stderr
    assert "If 'if_data': neither branch compiles" in proc.stderr and "bad_then" in proc.stderr and \
        "bad_else" in proc.stderr, proc.stderr


def test_data_if_inside_a_long_loop_hits_the_subgraph_budget(osprey_bin, work_dir):
    # 9000 unrolled iterations, each with a data-dependent If whose branches hold 10 nodes each: every iteration
    # compiles both branches, so the model-wide subgraph budget (shared with Loop unrolling) stops it by name.
    f = TensorProto.FLOAT

    def chain(prefix, out):
        nodes, cur = [], "v"
        for i in range(10):
            nxt = out if i == 9 else f"{prefix}{i}"
            nodes.append(helper.make_node("Relu", [cur], [nxt], name=f"{prefix}_relu{i}"))
            cur = nxt
        return helper.make_graph(nodes, prefix, [], [helper.make_tensor_value_info(out, f, None)])

    body = helper.make_graph(
        [helper.make_node("ReduceSum", ["v"], ["s"], keepdims=0, name="sum"),
         helper.make_node("Greater", ["s", "zero"], ["c"], name="positive"),
         helper.make_node("If", ["c"], ["v2"], then_branch=chain("t", "ty"), else_branch=chain("e", "ey"),
                          name="inner_if"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going")],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []), helper.make_tensor_value_info("v", f, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("v2", f, None)],
        [_const("zero", np.float32(0))])
    graph = helper.make_graph([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body, name="long_loop")], "g",
                              [helper.make_tensor_value_info("x", f, [2, 3])], [helper.make_tensor_value_info("y", f, None)],
                              [_const("M", np.int64(9000))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = work_dir / "loop_data_if.onnx"
    save(model, str(path))
    proc, _ = run_osprey(osprey_bin, path, np.ones((2, 3), np.float32), work_dir, "loop_if")
    assert proc.returncode == 1, proc.stderr
    assert "inner_if" in proc.stderr and "compiles at most 200000" in proc.stderr, proc.stderr
