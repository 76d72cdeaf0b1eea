"""Hostile If and recurrent models (issue 11) through `osprey run`: each gets exit code 1 and a message naming what is
wrong, promptly, never a crash, a hang or a large allocation."""

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from pytest_support import cli_runner  # noqa: E402

TIMEOUT_S = 60


def save(path: Path, graph, opset=14) -> Path:
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def nested_if(depth: int):
    """`depth` If nodes, each one's then branch holding the next (else branches output x)."""
    out = helper.make_tensor_value_info

    def leaf(name):
        return helper.make_graph([helper.make_node("Identity", ["x"], [name])], name, [],
                                 [out(name, TensorProto.FLOAT, [1])])

    graph = leaf(f"y{depth}")
    for level in range(depth - 1, -1, -1):
        node = helper.make_node("If", ["cond"], [f"y{level}"], then_branch=graph, else_branch=leaf(f"e{level}"),
                                name=f"if_{level}")
        graph = helper.make_graph([node], f"level{level}", [], [out(f"y{level}", TensorProto.FLOAT, [1])])
    return graph.node[0]


def lstm_graph(x_dims, hidden_size_attr=None, lengths=None):
    """LSTM with input 1 and hidden 2 over x [seq, 1, 1]; optional hidden_size attribute and sequence_lens."""
    w = numpy_helper.from_array(np.ones((1, 8, 1), np.float32), "W")
    r = numpy_helper.from_array(np.ones((1, 8, 2), np.float32), "R")
    inits = [w, r]
    inputs = ["x", "W", "R"]
    if lengths is not None:
        inits.append(numpy_helper.from_array(np.array(lengths, np.int32), "lens"))
        inputs += ["", "lens"]
    attrs = {} if hidden_size_attr is None else {"hidden_size": hidden_size_attr}
    node = helper.make_node("LSTM", inputs, ["y"], name="lstm", **attrs)
    return helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
                             [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)


def test_hostile_if_and_recurrent_models(osprey_bin, tmp_path):
    run = cli_runner(osprey_bin, TIMEOUT_S)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y0", TensorProto.FLOAT, [1])
    cond = numpy_helper.from_array(np.array(True), "cond")
    cases = {
        # 20 nested Ifs (protobuf itself refuses files nested past 100 messages): refused at import.
        "nested_if": (helper.make_graph([nested_if(20)], "g", [x], [y], [cond]), "nested more than 8 deep"),
        "hidden_size_lies": (lstm_graph([3, 1, 1], hidden_size_attr=1 << 40), "hidden_size"),
        "negative_hidden_size": (lstm_graph([3, 1, 1], hidden_size_attr=-1), "hidden_size"),
        "sequence_lens_past_the_sequence": (lstm_graph([3, 1, 1], lengths=[1 << 30]), "sequence_lens[0]"),
        # An output declared int64 that computes float32: served, its metadata would say one type and its answers
        # another (ONNX Runtime refuses the model too).
        "output_type_lies": (helper.make_graph([helper.make_node("Identity", ["x"], ["y0"])], "g", [x],
                                               [helper.make_tensor_value_info("y0", TensorProto.INT64, [1])]),
                             "graph output 'y0' is declared int64 but the graph computes float32"),
    }
    for name, (graph, expected) in cases.items():
        path = save(tmp_path / f"{name}.onnx", graph)
        r = run("run", path, "--random-inputs", "--output-dir", tmp_path / f"{name}.out")
        assert r.returncode == 1, (name, r.returncode, r.stderr)
        assert "osprey: error:" in r.stderr and expected in r.stderr, (name, r.stderr)


def test_models_from_the_mutation_fuzzer(osprey_bin, tmp_path):
    """What a structured mutation fuzz of the PyPI models (thirty-fourth session) crashed on, each reduced to one node:
    a batch dim of 0 broadcast against a 2-D MatMul weight (the reference kernel ran one batch into an empty output), a
    Conv stride of 2^31 - 1 and a MaxPool pad of 2^31 (oneDNN divided by zero sizing its kernels), Squeeze and Pad
    naming axis 0 of a scalar (read past the shape). Legal ones run and match ONNX Runtime; the others get a clear
    error."""
    import onnxruntime as ort

    run = cli_runner(osprey_bin, TIMEOUT_S)
    vi = helper.make_tensor_value_info
    f32 = lambda a, name: numpy_helper.from_array(np.asarray(a, np.float32), name)  # noqa: E731
    i64 = lambda a, name: numpy_helper.from_array(np.asarray(a, np.int64), name)  # noqa: E731
    rng = np.random.default_rng(0)
    y = vi("y", TensorProto.FLOAT, None)

    def check(name, graph, x, expected_error=None, reference=False):
        path = save(tmp_path / f"{name}.onnx", graph, opset=17)
        np.save(tmp_path / f"{name}.x.npy", x)
        out = tmp_path / f"{name}.out"
        r = run("run", path, "--input", f"x={tmp_path / f'{name}.x.npy'}", "--output-dir", out,
                *(["--reference"] if reference else []))
        if expected_error:
            assert r.returncode == 1, (name, r.returncode, r.stderr)
            assert "osprey: error:" in r.stderr and expected_error in r.stderr, (name, r.stderr)
            return
        assert r.returncode == 0, (name, r.returncode, r.stderr)
        want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        got = np.load(out / "y.npy")
        assert got.shape == want.shape, (name, got.shape, want.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)

    # onnx-asr's Whisper front end with its batch dim set to 0.
    matmul = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                               [vi("x", TensorProto.FLOAT, [0, 3000, 201])], [y], [f32(rng.random((201, 80)), "w")])
    for reference in (False, True):
        check("matmul_empty_batch", matmul, np.zeros((0, 3000, 201), np.float32), reference=reference)
    # MediaPipe's hand_recrop: a 64 -> 32 2x2 Conv with one stride made 2^31 - 1.
    conv = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, (1 << 31) - 1], kernel_shape=[2, 2])], "g",
        [vi("x", TensorProto.FLOAT, [1, 64, 16, 16])], [y], [f32(rng.random((32, 64, 2, 2)) - 0.5, "w")])
    check("conv_huge_stride", conv, rng.random((1, 64, 16, 16), np.float32))
    pool = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2], pads=[1 << 31, 0, 0, 0]),
         helper.make_node("Conv", ["p", "w"], ["y"], kernel_shape=[3, 3])], "g",
        [vi("x", TensorProto.FLOAT, [1, 32, 8, 8])], [y], [f32(rng.random((8, 32, 3, 3)), "w")])
    check("maxpool_huge_pad", pool, rng.random((1, 32, 8, 8), np.float32), "out of host memory")
    scalar = vi("x", TensorProto.FLOAT, [])
    squeeze = helper.make_graph([helper.make_node("Squeeze", ["x", "a"], ["y"])], "g", [scalar], [y],
                                [i64([0], "a")])
    check("squeeze_scalar", squeeze, np.float32(1), "cannot squeeze axis 0 of a scalar")
    pad = helper.make_graph([helper.make_node("Pad", ["x", "p", "", "a"], ["y"])], "g", [scalar], [y],
                            [i64([1, 1], "p"), i64([0], "a")])
    check("pad_scalar_axes", pad, np.float32(1), "name axis 0 of a scalar")


def test_empty_tensors_with_huge_dims_cost_nothing(osprey_bin, tmp_path):
    """An input of shape [2^40, 0] (zero bytes, so any request can send it where the model's dims are free) through
    ops whose kernels looped over the outer dims: 2^40 empty rows spun for hours (LayerNormalization, Concat, CumSum,
    TopK with k = 0, ReverseSequence, Unique along the empty axis; TopK and Split with their k / split given at run
    time, run on host tensors; BatchNormalization in training mode, whose running statistics are not empty),
    InstanceNormalization divided by N * C = 0. Each must finish promptly, on the fast and the reference kernels, with
    the output shapes numpy's rules give."""
    run = cli_runner(osprey_bin, 30)
    big = 1 << 40
    vi = helper.make_tensor_value_info
    i64 = lambda a, name: numpy_helper.from_array(np.asarray(a, np.int64), name)  # noqa: E731
    f32 = lambda a, name: numpy_helper.from_array(np.asarray(a, np.float32), name)  # noqa: E731
    node = helper.make_node
    two_d = (big, 0)
    cases = {
        # Its scale spans the normalised dims [2^40, 0]: an empty initializer of that shape.
        "layernorm": ([node("LayerNormalization", ["x", "s"], ["y"], axis=0)],
                      [helper.make_tensor("s", TensorProto.FLOAT, [big, 0], [])], two_d, {"y": (big, 0)}),
        "concat": ([node("Concat", ["x", "x"], ["y"], axis=1)], [], two_d, {"y": (big, 0)}),
        # Folded at compile time: a Concat of two empty [2^40, 0] initializers.
        "concat_folded": ([node("Concat", ["c", "c"], ["cc"], axis=1), node("Add", ["x", "cc"], ["y"])],
                          [helper.make_tensor("c", TensorProto.FLOAT, [big, 0], [])], two_d, {"y": (big, 0)}),
        "cumsum": ([node("CumSum", ["x", "a"], ["y"])], [i64(1, "a")], two_d, {"y": (big, 0)}),
        "topk": ([node("TopK", ["x", "k"], ["y", "i"], axis=1)], [i64([0], "k")], two_d, {"y": (big, 0)}),
        "reverse": ([node("ReverseSequence", ["x", "l"], ["y"], batch_axis=1, time_axis=0)],
                    [i64(np.zeros(0), "l")], two_d, {"y": (big, 0)}),
        "unique": ([node("Unique", ["x"], ["y", "first", "inverse", "counts"], axis=1)], [], two_d,
                   {"y": (big, 0), "inverse": (0,)}),
        "instance_norm": ([node("InstanceNormalization", ["x", "s", "b"], ["y"])],
                          [f32(np.ones(0), "s"), f32(np.zeros(0), "b")], (big, 0, 1, 1), {"y": (big, 0, 1, 1)}),
        "batchnorm_training": ([node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"],
                                     training_mode=1)],
                               [f32(np.ones(3), "s"), f32(np.zeros(3), "b"), f32(np.zeros(3), "m"),
                                f32(np.ones(3), "v")], (big, 3, 4, 0), {"y": (big, 3, 4, 0), "rm": (3,)}),
        "topk_k_input": ([node("TopK", ["x", "k"], ["y", "i"], axis=1)], [], two_d, {"y": (big, 0)}),
        "split_input": ([node("Split", ["x", "split"], ["y", "y2"], axis=1)], [], two_d, {"y": (big, 0)}),
    }
    run_time_inputs = {"topk_k_input": ("k", np.zeros(1, np.int64)), "split_input": ("split", np.zeros(2, np.int64))}
    for name, (nodes, inits, shape, want) in cases.items():
        outputs = [vi(o, TensorProto.INT64 if o in ("first", "inverse", "counts", "i") else TensorProto.FLOAT, None)
                   for o in nodes[-1].output]
        inputs = [vi("x", TensorProto.FLOAT, list(shape))]
        args = []
        if name in run_time_inputs:
            extra_name, value = run_time_inputs[name]
            inputs.append(vi(extra_name, TensorProto.INT64, list(value.shape)))
            np.save(tmp_path / f"{name}.{extra_name}.npy", value)
            args = ["--input", f"{extra_name}={tmp_path / f'{name}.{extra_name}.npy'}"]
        graph = helper.make_graph(nodes, name, inputs, outputs, inits)
        path = save(tmp_path / f"{name}.onnx", graph, opset=17 if name != "batchnorm_training" else 15)
        np.save(tmp_path / f"{name}.x.npy", np.zeros(shape, np.float32))
        for extra in ([], ["--reference"]):
            out = tmp_path / f"{name}{len(extra)}.out"
            r = run("run", path, "--input", f"x={tmp_path / f'{name}.x.npy'}", *args, "--output-dir", out, *extra)
            assert r.returncode == 0, (name, extra, r.returncode, r.stderr)
            for output, shape_wanted in want.items():
                assert np.load(out / f"{output}.npy").shape == shape_wanted, (name, extra, output)
