"""Model-local functions (ModelProto.functions) through `osprey run`, against ONNX Runtime 1.32, which inlines them too.

jax2onnx (default opset 23) writes every module decorated with @onnx_function as one: its DINOv3 ViTs are a call of
"VisionTransformer" holding calls of "Block", "MultiHeadAttention", "LayerScale"; onnxscript and PyTorch's TorchScript
exporter (export_modules_as_functions) write them as well. osprey inlines them when it imports the model
(src/onnx/onnx_functions.cc): attributes by reference from the call or the function's defaults, nested calls, calls in
If branches, outputs the caller leaves unnamed. Hostile files (a function calling itself, calls doubling at each level)
get a clear error.
"""

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from test_newest_opsets import f32, outputs_of, run_osprey

RNG = np.random.default_rng(3)


def act_function():
    """custom.Act(x) -> y = LeakyRelu(x, alpha) * gain: alpha by reference with a default, gain a Constant."""
    alpha = helper.make_attribute_ref("alpha", helper.AttributeProto.FLOAT)
    leaky = helper.make_node("LeakyRelu", ["x"], ["l"])
    leaky.attribute.append(alpha)
    return helper.make_function(
        "custom", "Act", ["x"], ["y"],
        [leaky, helper.make_node("Constant", [], ["gain"], value_float=1.5), helper.make_node("Mul", ["l", "gain"], ["y"])],
        [helper.make_opsetid("", 23)], attributes=[], attribute_protos=[helper.make_attribute("alpha", 0.2)])


def block_function():
    """custom.Block(x, w) -> (y, pre): y = Act(x @ w, alpha=alpha_out) + x; pre = x @ w (callers may leave it out)."""
    call = helper.make_node("Act", ["pre"], ["a"], domain="custom")
    call.attribute.append(helper.make_attribute_ref("alpha", helper.AttributeProto.FLOAT, "alpha_out"))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["pre"]), call, helper.make_node("Add", ["a", "x"], ["y"])]
    return helper.make_function("custom", "Block", ["x", "w"], ["y", "pre"], nodes, [helper.make_opsetid("", 23),
                                helper.make_opsetid("custom", 1)], attributes=["alpha_out"])


def save(path, nodes, inputs, outputs, functions, initializers=(), opset=23):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, functions=functions,
                              opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("custom", 1)])
    model.ir_version = 10
    path.write_bytes(model.SerializeToString())


def test_nested_functions_with_attribute_references_match_onnxruntime(osprey_bin, tmp_path):
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 8], (RNG.standard_normal(64) * 0.5).astype(np.float32))
    first = helper.make_node("Block", ["x", "w"], ["h", "pre"], domain="custom", name="first", alpha_out=0.05)
    second = helper.make_node("Block", ["h", "w"], ["y", ""], domain="custom", name="")  # alpha: Act's default
    # In an If branch too (its condition known only at run time).
    branch_call = helper.make_node("Act", ["y"], ["z_then"], domain="custom")
    then_g = helper.make_graph([branch_call], "then", [], [f32("z_then", [2, 8])])
    else_g = helper.make_graph([helper.make_node("Neg", ["y"], ["z_else"])], "else", [], [f32("z_else", [2, 8])])
    cond = helper.make_node("If", ["c"], ["z"], then_branch=then_g, else_branch=else_g)
    path = tmp_path / "functions.onnx"
    save(path, [first, second, cond], [f32("x", [2, 8]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
         [f32("y", [2, 8]), f32("pre", [2, 8]), f32("z", [2, 8])], [act_function(), block_function()], [w])
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        expected = session.run(None, feeds)
        got = outputs_of(osprey_bin, path, feeds, tmp_path, ["y", "pre", "z"])
        for name, g, e in zip(("y", "pre", "z"), got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6, err_msg=f"{name} (c={c})")


def expect_error(osprey_bin, path, tmp_path, *fragments):
    proc, _ = run_osprey(osprey_bin, path, {}, tmp_path, "--random-inputs")
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr


def test_hostile_functions_get_clear_errors(osprey_bin, tmp_path):
    # A function that calls itself.
    loop = helper.make_function("custom", "Loop", ["x"], ["y"], [helper.make_node("Loop", ["x"], ["y"],
                                domain="custom")], [helper.make_opsetid("", 23), helper.make_opsetid("custom", 1)])
    path = tmp_path / "recursive.onnx"
    save(path, [helper.make_node("Loop", ["x"], ["y"], domain="custom")], [f32("x", [2])], [f32("y", [2])], [loop])
    expect_error(osprey_bin, path, tmp_path, "nested more than 32 deep")
    # Each level calling the next twice: 2^30 nodes from a file of 31 small functions.
    levels = []
    for i in range(30):
        nodes = [helper.make_node(f"F{i + 1}", ["x"], ["t"], domain="custom"),
                 helper.make_node(f"F{i + 1}", ["t"], ["y"], domain="custom")]
        levels.append(helper.make_function("custom", f"F{i}", ["x"], ["y"], nodes,
                                           [helper.make_opsetid("", 23), helper.make_opsetid("custom", 1)]))
    levels.append(helper.make_function("custom", "F30", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])],
                                       [helper.make_opsetid("", 23)]))
    path = tmp_path / "doubling.onnx"
    save(path, [helper.make_node("F0", ["x"], ["y"], domain="custom")], [f32("x", [2])], [f32("y", [2])], levels)
    expect_error(osprey_bin, path, tmp_path, "expand to more than")
    # A subgraph inside a body; a function defined twice; a call with more inputs than the function declares.
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "b", [], [f32("z", [2])])
    nested = helper.make_function("custom", "Act", ["x"], ["y"], [helper.make_node(
        "If", ["c"], ["y"], then_branch=branch, else_branch=branch)], [helper.make_opsetid("", 23)])
    path = tmp_path / "subgraph.onnx"
    save(path, [helper.make_node("Act", ["x"], ["y"], domain="custom")], [f32("x", [2])], [f32("y", [2])], [nested])
    expect_error(osprey_bin, path, tmp_path, "a subgraph inside a function body is not supported")
    relu = helper.make_function("custom", "Act", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])],
                                [helper.make_opsetid("", 23)])
    path = tmp_path / "twice.onnx"
    save(path, [helper.make_node("Act", ["x"], ["y"], domain="custom")], [f32("x", [2])], [f32("y", [2])],
         [relu, relu])
    expect_error(osprey_bin, path, tmp_path, "is defined twice")
    path = tmp_path / "arity.onnx"
    save(path, [helper.make_node("Act", ["x", "x"], ["y"], domain="custom")], [f32("x", [2])], [f32("y", [2])],
         [relu])
    expect_error(osprey_bin, path, tmp_path, "the function declares 1 and 1")
    # A body written for another opset than the model's.
    other = helper.make_function("custom", "Act", ["x"], ["y"], [helper.make_node("Relu", ["x"], ["y"])],
                                 [helper.make_opsetid("", 17)])
    path = tmp_path / "other_opset.onnx"
    save(path, [helper.make_node("Act", ["x"], ["y"], domain="custom")], [f32("x", [2])], [f32("y", [2])], [other])
    expect_error(osprey_bin, path, tmp_path, "imports ONNX opset 17")
