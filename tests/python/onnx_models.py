"""Tiny ONNX graphs built with onnx.helper for the Python tests (shared by the test files and DataLoader workers)."""
import numpy as np
import onnx
from onnx import TensorProto, helper


def add_one(shape=("N", 4)) -> bytes:
    """y = x + 1 (float32, shape with a symbolic first dim)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])
    graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"])], "add_one", [x], [y], [one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


def two_inputs() -> bytes:
    """s = a + b, p = a * b; a float32 [2, 3], b int64 cast to float."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3])
    b = helper.make_tensor_value_info("b", TensorProto.INT64, [2, 3])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 3])
    p = helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Cast", ["b"], ["bf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["a", "bf"], ["s"]), helper.make_node("Mul", ["a", "bf"], ["p"])]
    graph = helper.make_graph(nodes, "two_inputs", [a, b], [s, p])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def constant_output() -> bytes:
    """Outputs a model constant directly (c) beside y = x * 2."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, [3])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    const = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("cv", TensorProto.FLOAT, [3], [7, 8, 9]))
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"]), const], "const_out", [x], [y, c], [two])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def identity() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def spin(n=256) -> bytes:
    """y[B, 4] = x + mean(h), h = tanh(h @ W) repeated max(steps) times from h0 = 0.01 (W = I / 2): a run whose length
    the input sets (pytest_support.spin_model), for the tests that stop runs."""
    from pytest_support import spin_model  # tests/: on the path through conftest.py
    return spin_model(np.full((n, n), 0.01, np.float32), np.eye(n, dtype=np.float32) / 2, 4).SerializeToString()
