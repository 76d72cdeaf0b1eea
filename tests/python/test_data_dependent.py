"""Data-dependent output shapes (NonMaxSuppression, NonZero, Compress): a model is cut at such ops and the parts after
them are compiled for the shapes each run gives (runtime/segments.h). A detector-style graph (scores from a small
network, NMS, the kept boxes gathered and rescaled after it, a NonZero branch, a Compress) against ONNX Runtime on many
random inputs through one loaded model, so the number of kept boxes changes from run to run; a second cut inside the
part after the first; hostile NMS inputs; an If and a Loop (tf.map_fn's per-class NMS) holding such ops.
"""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import osprey


def detector(path, boxes=64, classes=3):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, classes)).astype(np.float32)
    init = [numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array([50], np.int64), "max_out"),
            numpy_helper.from_array(np.array([0.45], np.float32), "iou"),
            numpy_helper.from_array(np.array([0.35], np.float32), "score_min"),
            numpy_helper.from_array(np.array(2, np.int64), "two"),
            numpy_helper.from_array(np.array([0], np.int64), "zero"),
            numpy_helper.from_array(np.array([2.0, 2.0, 2.0, 2.0], np.float32), "scale"),
            numpy_helper.from_array(np.array(0.8, np.float32), "hi"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(np.array([8], np.int64), "eight")]
    nodes = [
        # scores [1, classes, boxes] from features [1, boxes, 8]
        helper.make_node("MatMul", ["feat", "w"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["prob"]),
        helper.make_node("Transpose", ["prob"], ["scores"], perm=[0, 2, 1]),
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "score_min"], ["sel"]),
        # after the cut: the kept boxes, their scores, rescaled
        helper.make_node("Gather", ["sel", "two"], ["box_idx"], axis=1),
        helper.make_node("Squeeze", ["boxes", "zero"], ["boxes2d"]),
        helper.make_node("Gather", ["boxes2d", "box_idx"], ["kept"], axis=0),
        helper.make_node("Mul", ["kept", "scale"], ["kept_scaled"]),
        helper.make_node("GatherND", ["scores", "sel"], ["kept_scores"]),
        # a second data-dependent op after the first: the kept scores above 0.8
        helper.make_node("Greater", ["kept_scores", "hi"], ["confident"]),
        helper.make_node("Compress", ["kept_scaled", "confident"], ["confident_boxes"], axis=0),
        # a value from the part before the cut that only shapes determine (the box count, divided by 8), read as
        # Slice's `ends` after it: compiled into that part as a constant
        helper.make_node("Shape", ["boxes"], ["boxes_shape"]),
        helper.make_node("Gather", ["boxes_shape", "one"], ["n_boxes"]),
        helper.make_node("Div", ["n_boxes", "eight"], ["n_head"]),
        helper.make_node("Slice", ["kept_scores", "zero", "n_head", "zero"], ["kept_head"]),
        # an independent branch: where the probabilities exceed 0.8
        helper.make_node("Greater", ["prob", "hi"], ["mask"]),
        helper.make_node("NonZero", ["mask"], ["where"]),
    ]
    graph = helper.make_graph(
        nodes, "detector",
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, boxes, 4]),
         helper.make_tensor_value_info("feat", TensorProto.FLOAT, [1, boxes, 8])],
        [helper.make_tensor_value_info("sel", TensorProto.INT64, None),
         helper.make_tensor_value_info("kept_scaled", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("kept_scores", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("confident_boxes", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("where", TensorProto.INT64, None),
         helper.make_tensor_value_info("kept_head", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("prob", TensorProto.FLOAT, None)],
        init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def random_boxes(rng, n):
    centre = rng.uniform(0, 100, (1, n, 2)).astype(np.float32)
    size = rng.uniform(5, 30, (1, n, 2)).astype(np.float32)
    # corners [y1, x1, y2, x2], some given flipped (NMS accepts either order)
    boxes = np.concatenate([centre - size / 2, centre + size / 2], axis=2)[:, :, [1, 0, 3, 2]]
    flip = rng.random(n) < 0.2
    boxes[0, flip] = boxes[0, flip][:, [2, 3, 0, 1]]
    return boxes


def run_both(model, session, feeds):
    """Runs osprey and ONNX Runtime on `feeds`, checks every output (shapes exactly, values to float32 rounding) and
    returns ORT's by name."""
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    got = model.run(feeds)
    for name, w in want.items():
        assert got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-6, err_msg=name)
    return want


def test_detector_matches_onnxruntime_as_the_kept_count_changes(tmp_path):
    path = tmp_path / "detector.onnx"
    detector(path)
    model = osprey.load_onnx(str(path), threads=1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    counts = set()
    for _ in range(12):
        feeds = {"boxes": random_boxes(rng, 64), "feat": rng.standard_normal((1, 64, 8)).astype(np.float32) * 1.5}
        counts.add(run_both(model, session, feeds)["sel"].shape[0])
    assert len(counts) > 3, f"the kept count should vary across inputs, got {sorted(counts)}"


def test_nothing_kept_and_everything_kept(tmp_path):
    path = tmp_path / "detector.onnx"
    detector(path)
    model = osprey.load_onnx(str(path), threads=1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    boxes = random_boxes(np.random.default_rng(2), 64)
    # Features whose logits are -50 (then +50) for every class: no score over the threshold, so the parts after the
    # cuts run on empty tensors; then every box over it.
    w = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)  # detector()'s weights
    direction = w @ np.linalg.solve(w.T @ w, np.ones(3, np.float32))  # feat @ w = 1 for each class
    counts = [run_both(model, session, {"boxes": boxes, "feat": np.tile(v * direction, (1, 64, 1)).astype(np.float32)})
              ["sel"].shape[0] for v in (-50, 50)]
    assert counts[0] == 0 and counts[1] > 0, counts


def nms_model(path, center=0):
    graph = helper.make_graph(
        [helper.make_node("NonMaxSuppression", ["b", "s", "m", "i"], ["sel"], center_point_box=center)],
        "nms",
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("m", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("i", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("sel", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def test_hostile_nms_inputs_are_refused_clearly(tmp_path):
    path = tmp_path / "nms.onnx"
    nms_model(path)
    model = osprey.load_onnx(str(path), threads=1)
    ok = {"b": np.zeros((1, 3, 4), np.float32), "s": np.zeros((1, 2, 3), np.float32),
          "m": np.array([5], np.int64), "i": np.array([0.5], np.float32)}
    assert model.run(ok)["sel"].shape == (6, 3)  # nothing overlaps (empty boxes): all kept
    with pytest.raises(osprey.InvalidArgument, match="boxes must be"):
        model.run({**ok, "s": np.zeros((1, 2, 4), np.float32)})  # scores for 4 boxes, 3 boxes
    with pytest.raises(osprey.InvalidArgument, match="too much work"):
        # 2^13 boxes x 2^12 classes x 2^13 kept: ~2^38 IoU tests asked for
        model.run({"b": np.zeros((1, 8192, 4), np.float32), "s": np.zeros((1, 4096, 8192), np.float32),
                   "m": np.array([1 << 40], np.int64), "i": np.array([0.5], np.float32)})
    assert model.run({**ok, "m": np.array([-3], np.int64)})["sel"].shape == (0, 3)  # negative: none


def test_if_with_data_dependent_branches_and_outer_constants(tmp_path):
    """torchvision's detectors: If(no boxes left) -> empty, else NMS; the branch reads outer values (here the Slice's
    axes, a top-level Constant) that must fold when the branch is compiled."""
    then_graph = helper.make_graph([helper.make_node("NonZero", ["x"], ["y"])], "then", [],
                                   [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    else_graph = helper.make_graph(
        [helper.make_node("Greater", ["x", "half"], ["m"]),
         helper.make_node("Compress", ["x", "m"], ["kept"]),
         helper.make_node("Slice", ["kept", "starts", "ends", "axes"], ["first"]),
         helper.make_node("Cast", ["first"], ["y2"], to=TensorProto.INT64)], "else", [],
        [helper.make_tensor_value_info("y2", TensorProto.INT64, None)])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["axes"], value=numpy_helper.from_array(np.array([0], np.int64))),
         helper.make_node("If", ["c"], ["out"], then_branch=then_graph, else_branch=else_graph)], "branchy",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("out", TensorProto.INT64, None)],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half"),
         numpy_helper.from_array(np.array([0], np.int64), "starts"),
         numpy_helper.from_array(np.array([2], np.int64), "ends")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "branchy.onnx"
    path.write_bytes(model.SerializeToString())
    m = osprey.load_onnx(str(path), threads=1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for c in (True, False):
        for x in (np.array([0, 1, 0, 2, 3, 0], np.float32), np.array([0.9, 0, 7, 0.1, 0, 4], np.float32)):
            feeds = {"c": np.array(c), "x": x}
            want = session.run(None, feeds)[0]
            got = m.run(feeds)["out"]
            assert got.shape == want.shape and (got == want).all(), (c, x, got, want)


def per_class_nms(path, classes=3, keep=10):
    """tf.map_fn over classes as tf2onnx writes it: a Loop whose body carries its own counter (not the iteration
    number), slices that class's scores at it, runs NMS, gathers the kept scores and pads them to `keep`; the scores
    and boxes are carried through unchanged and a float sum of what was kept is carried too."""
    T = TensorProto
    body = helper.make_graph(
        [helper.make_node("Add", ["c", "one"], ["c_next"]),
         helper.make_node("Add", ["c", "one"], ["c_end"]),
         helper.make_node("Slice", ["scores", "c", "c_end", "one"], ["col"]),  # [boxes, 1]
         helper.make_node("Transpose", ["col"], ["col_t"], perm=[1, 0]),
         helper.make_node("Unsqueeze", ["col_t", "zero"], ["s3"]),  # [1, 1, boxes]
         helper.make_node("Unsqueeze", ["boxes", "zero"], ["b3"]),  # [1, boxes, 4]
         helper.make_node("NonMaxSuppression", ["b3", "s3", "max_out", "iou", "score_min"], ["sel"]),
         helper.make_node("Gather", ["sel", "two"], ["idx"], axis=1),  # [k]
         helper.make_node("Squeeze", ["col", "one"], ["col1"]),
         helper.make_node("Gather", ["col1", "idx"], ["kept"]),
         helper.make_node("ReduceSum", ["kept"], ["kept_sum"], keepdims=0),
         helper.make_node("Add", ["total", "kept_sum"], ["total_next"]),
         helper.make_node("Shape", ["kept"], ["k"]),
         helper.make_node("Sub", ["keep", "k"], ["missing"]),
         helper.make_node("Concat", ["zero", "missing"], ["pads"], axis=0),
         helper.make_node("Pad", ["kept", "pads"], ["padded"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["scores"], ["scores_out"]),
         helper.make_node("Identity", ["boxes"], ["boxes_out"])], "body",
        [helper.make_tensor_value_info("i", T.INT64, []),
         helper.make_tensor_value_info("cond_in", T.BOOL, []),
         helper.make_tensor_value_info("c", T.INT64, [1]),
         helper.make_tensor_value_info("total", T.FLOAT, []),
         helper.make_tensor_value_info("scores", T.FLOAT, None),
         helper.make_tensor_value_info("boxes", T.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []),
         helper.make_tensor_value_info("c_next", T.INT64, [1]),
         helper.make_tensor_value_info("total_next", T.FLOAT, []),
         helper.make_tensor_value_info("scores_out", T.FLOAT, None),
         helper.make_tensor_value_info("boxes_out", T.FLOAT, None),
         helper.make_tensor_value_info("padded", T.FLOAT, [keep])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "c0", "total0", "scores_in", "boxes_in"],
                          ["c_final", "total_final", "scores_final", "boxes_final", "per_class"], body=body)],
        "per_class_nms",
        [helper.make_tensor_value_info("boxes_in", T.FLOAT, [64, 4]),
         helper.make_tensor_value_info("scores_in", T.FLOAT, [64, classes]),
         helper.make_tensor_value_info("trips", T.INT64, [])],
        [helper.make_tensor_value_info("per_class", T.FLOAT, None),
         helper.make_tensor_value_info("total_final", T.FLOAT, None),
         helper.make_tensor_value_info("c_final", T.INT64, None)],
        [numpy_helper.from_array(np.array([0], np.int64), "c0"),
         numpy_helper.from_array(np.array(0, np.float32), "total0"),
         numpy_helper.from_array(np.array([1], np.int64), "one"),
         numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array(2, np.int64), "two"),
         numpy_helper.from_array(np.array([keep], np.int64), "keep"),
         numpy_helper.from_array(np.array([keep], np.int64), "max_out"),
         numpy_helper.from_array(np.array([0.5], np.float32), "iou"),
         numpy_helper.from_array(np.array([0.3], np.float32), "score_min")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())


def test_loop_with_a_data_dependent_body_matches_onnxruntime(tmp_path):
    path = tmp_path / "per_class_nms.onnx"
    per_class_nms(path)
    model = osprey.load_onnx(str(path), threads=1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    kept = set()
    for trips in (3, 3, 2, 1, 3, 0):
        feeds = {"boxes_in": random_boxes(rng, 64)[0], "scores_in": rng.uniform(0, 1, (64, 3)).astype(np.float32),
                 "trips": np.array(trips, np.int64)}
        want = run_both(model, session, feeds)
        assert want["per_class"].shape == (trips, 10)  # no iterations: [0, 10], the shape the body declares
        kept.add(int((want["per_class"] > 0).sum()))
    assert len(kept) > 2, f"the kept count should vary across inputs, got {sorted(kept)}"
    # each iteration may compile a body of its own: a trip count past the budget is refused before the first one
    with pytest.raises(osprey.Unsupported, match="1000000 iterations of a body of 19 nodes"):
        model.run({**feeds, "trips": np.array(1000000, np.int64)})


def test_loop_scan_output_changing_shape_and_scan_bodies_are_refused_clearly(tmp_path):
    T = TensorProto
    body = helper.make_graph(
        [helper.make_node("Greater", ["v", "i_f"], ["m"]),
         helper.make_node("Cast", ["i"], ["i_f"], to=T.FLOAT),
         helper.make_node("NonZero", ["m"], ["nz"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["v"], ["v_out"])], "body",
        [helper.make_tensor_value_info("i", T.INT64, []),
         helper.make_tensor_value_info("cond_in", T.BOOL, []),
         helper.make_tensor_value_info("v", T.FLOAT, [4])],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []),
         helper.make_tensor_value_info("v_out", T.FLOAT, [4]),
         helper.make_tensor_value_info("nz", T.INT64, None)])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "x"], ["v_final", "scan"], body=body)], "loopy",
        [helper.make_tensor_value_info("x", T.FLOAT, [4])],
        [helper.make_tensor_value_info("scan", T.INT64, None)],
        [numpy_helper.from_array(np.array(3, np.int64), "trips")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "loopy.onnx"
    path.write_bytes(model.SerializeToString())
    m = osprey.load_onnx(str(path), threads=1)
    # x > i keeps 3, 2, 1 elements in iterations 0, 1, 2: the scan output cannot be stacked
    with pytest.raises(osprey.InvalidArgument, match="each iteration must give one type and shape"):
        m.run({"x": np.array([0.5, 1.5, 2.5, 3.5], np.float32)})
    # the same NonZero in a Scan body is refused by name
    scan_body = helper.make_graph(
        [helper.make_node("NonZero", ["e"], ["nz"]), helper.make_node("Identity", ["s"], ["s_out"])], "scan_body",
        [helper.make_tensor_value_info("s", T.FLOAT, [1]), helper.make_tensor_value_info("e", T.FLOAT, [4])],
        [helper.make_tensor_value_info("s_out", T.FLOAT, [1]), helper.make_tensor_value_info("nz", T.INT64, None)])
    graph = helper.make_graph(
        [helper.make_node("Scan", ["s0", "xs"], ["s_final", "nzs"], body=scan_body, num_scan_inputs=1)], "scanny",
        [helper.make_tensor_value_info("xs", T.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("nzs", T.INT64, None)],
        [numpy_helper.from_array(np.array([0], np.float32), "s0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "scanny.onnx"
    path.write_bytes(model.SerializeToString())
    m = osprey.load_onnx(str(path), threads=1)
    with pytest.raises(osprey.Unsupported, match="not inside a Scan body"):
        m.run({"xs": np.array([[0, 1, 0, 2], [1, 1, 0, 0]], np.float32)})


def test_loop_on_a_run_time_trip_count_checks_its_declared_types(tmp_path):
    """A trip count given as an input is not known when compiled, so the host runs the loop; a body whose scan output
    is declared float but computes int64 (the iteration number) is refused when it runs, as ONNX Runtime refuses it
    when it loads."""
    T = TensorProto
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["i"], ["s"])], "body",
        [helper.make_tensor_value_info("i", T.INT64, []), helper.make_tensor_value_info("cond_in", T.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []), helper.make_tensor_value_info("s", T.FLOAT, [])])
    # (the condition omitted at the end of the node's inputs, as ONNX Runtime accepts)
    graph = helper.make_graph([helper.make_node("Loop", ["trips", ""], ["scan"], body=body)], "typed",
                              [helper.make_tensor_value_info("trips", T.INT64, [])],
                              [helper.make_tensor_value_info("scan", T.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "typed.onnx"
    path.write_bytes(model.SerializeToString())
    m = osprey.load_onnx(str(path), threads=1)
    assert m.run({"trips": np.array(0, np.int64)})["scan"].shape == (0,)
    with pytest.raises(osprey.InvalidArgument, match="output 's' is declared float32 but the graph computes int64"):
        m.run({"trips": np.array(2, np.int64)})


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("is_sorted", [1, 0])
def test_unique_matches_onnxruntime(tmp_path, axis, is_sorted):
    """Unique's four outputs, with parts after the cut (the counts summed, Y doubled), on inputs with repeated values
    and repeated rows/columns, as ONNX Runtime gives them."""
    T = TensorProto
    attrs = {"sorted": is_sorted} if axis is None else {"sorted": is_sorted, "axis": axis}
    graph = helper.make_graph(
        [helper.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"], **attrs),
         helper.make_node("ReduceSum", ["counts"], ["total"], keepdims=0),
         helper.make_node("Add", ["y", "y"], ["y2"])], "unique",
        [helper.make_tensor_value_info("x", T.INT64, [6, 4])],
        [helper.make_tensor_value_info(n, T.INT64, None) for n in ("y", "first", "inverse", "counts", "total", "y2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "unique.onnx"
    path.write_bytes(model.SerializeToString())
    m = osprey.load_onnx(str(path), threads=1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(4)
    for _ in range(4):
        x = rng.integers(0, 3, (6, 4)).astype(np.int64)
        x[3] = x[1]  # a repeated row
        x[:, 2] = x[:, 0]  # a repeated column
        run_both(m, session, {"x": x})


def test_unique_of_floats_with_nans_matches_numpy(tmp_path):
    graph = helper.make_graph([helper.make_node("Unique", ["x"], ["y", "first", "inverse", "counts"])], "unique_f",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [9])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT if n == "y" else TensorProto.INT64,
                                                             None) for n in ("y", "first", "inverse", "counts")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "unique_f.onnx"
    path.write_bytes(model.SerializeToString())
    x = np.array([2.5, np.nan, -1, 2.5, 0, np.nan, -1, 7, -0.0], np.float32)
    got = osprey.load_onnx(str(path), threads=1).run({"x": x})
    y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True)
    np.testing.assert_array_equal(got["y"], y)  # NaN last, once (numpy >= 1.21 folds NaNs together)
    np.testing.assert_array_equal(got["first"], first)
    np.testing.assert_array_equal(got["inverse"], inverse.ravel())
    np.testing.assert_array_equal(got["counts"], counts)


def test_host_loop_counts_the_loops_its_body_unrolls(tmp_path):
    """A loop run on the host compiles its body anew per iteration when it reads the iteration number; a body that
    unrolls a constant 5,000-iteration loop costs that per iteration, so 50 iterations (~500,000 nodes compiled) are
    refused before the first, while 3 run and give i + 5,000 (hand-computed)."""
    T = TensorProto
    inner = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Add", ["h", "one"], ["h_out"])], "inner",
        [helper.make_tensor_value_info("j", T.INT64, []), helper.make_tensor_value_info("c_in", T.BOOL, []),
         helper.make_tensor_value_info("h", T.FLOAT, [])],
        [helper.make_tensor_value_info("c_out", T.BOOL, []), helper.make_tensor_value_info("h_out", T.FLOAT, [])],
        [numpy_helper.from_array(np.array(1, np.float32), "one")])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=T.FLOAT),
         helper.make_node("Loop", ["m", "", "fi"], ["s"], body=inner)], "body",
        [helper.make_tensor_value_info("i", T.INT64, []), helper.make_tensor_value_info("cond_in", T.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []), helper.make_tensor_value_info("s", T.FLOAT, [])],
        [numpy_helper.from_array(np.array(5000, np.int64), "m")])
    graph = helper.make_graph([helper.make_node("Loop", ["trips", ""], ["scan"], body=body)], "nested",
                              [helper.make_tensor_value_info("trips", T.INT64, [])],
                              [helper.make_tensor_value_info("scan", T.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "nested.onnx"
    path.write_bytes(model.SerializeToString())
    m = osprey.load_onnx(str(path), threads=1)
    with pytest.raises(osprey.Unsupported, match="50 iterations of a body of 10003 nodes"):
        m.run({"trips": np.array(50, np.int64)})
    np.testing.assert_array_equal(m.run({"trips": np.array(3, np.int64)})["scan"], [5000, 5001, 5002])


def test_unique_axis_out_of_range_and_loop_carried_type_change_are_refused(tmp_path):
    T = TensorProto
    graph = helper.make_graph([helper.make_node("Unique", ["x"], ["y"], axis=2)], "unique_bad",
                              [helper.make_tensor_value_info("x", T.INT64, [3, 4])],
                              [helper.make_tensor_value_info("y", T.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "unique_bad.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(osprey.InvalidArgument, match="axis 2 is out of range for rank 2"):
        osprey.load_onnx(str(path), threads=1).run({"x": np.zeros((3, 4), np.int64)})
    # a carried value that enters as float and leaves as int64 (a run-time trip count: the host runs the loop)
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["i"], ["v_out"])],
        "body", [helper.make_tensor_value_info("i", T.INT64, []), helper.make_tensor_value_info("cond_in", T.BOOL, []),
                 helper.make_tensor_value_info("v", T.FLOAT, [])],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []), helper.make_tensor_value_info("v_out", T.INT64, [])])
    graph = helper.make_graph([helper.make_node("Loop", ["trips", "", "v0"], ["v_final"], body=body)], "retyped",
                              [helper.make_tensor_value_info("trips", T.INT64, [])],
                              [helper.make_tensor_value_info("v_final", T.FLOAT, None)],
                              [numpy_helper.from_array(np.array(0, np.float32), "v0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "retyped.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(osprey.InvalidArgument, match="carried value 0 enters the body as float32 and leaves it as int64"):
        osprey.load_onnx(str(path), threads=1).run({"trips": np.array(2, np.int64)})


def test_too_many_cuts_are_refused_when_loaded(tmp_path):
    # 1,100 NonZero in a chain: each would nest another cut; osprey stops at 1,024 with a clear error, not a crash.
    nodes, value = [], "x"
    for i in range(1100):
        nodes.append(helper.make_node("NonZero", [value], [f"nz{i}"]))
        nodes.append(helper.make_node("Cast", [f"nz{i}"], [f"f{i}"], to=TensorProto.FLOAT))
        value = f"f{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info(value, TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path = tmp_path / "chain.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(osprey.Unsupported, match="1100 data-dependent ops"):
        osprey.load_onnx(str(path), threads=1)
