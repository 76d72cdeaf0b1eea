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
