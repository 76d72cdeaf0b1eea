"""Einsum against numpy.einsum on 400 random equations (fixed seed): one to three inputs, letters repeated
(diagonals), sizes of 1 that broadcast, '...' anywhere, implicit and explicit outputs, now and then a wrong size or
stray characters. Each must either match numpy (both the MatMul lowering and the reference loop run, depending on the
equation) or, exactly where numpy refuses it, be refused with osprey.Error: never a crash, never a silent answer
numpy would not give.
"""

import random

import numpy as np
import osprey
from onnx import TensorProto, helper

LETTERS = "abcdeAB"


def random_case(rng):
    sizes = {c: rng.choice([1, 2, 3]) for c in LETTERS}
    terms, shapes = [], []
    for _ in range(rng.choice([1, 1, 2, 2, 2, 3])):
        term = "".join(rng.choice(LETTERS) for _ in range(rng.randint(0, 4)))
        shape = [sizes[c] for c in term]
        if rng.random() < 0.2:
            at = rng.randint(0, len(term))
            term = term[:at] + "..." + term[at:]
            shape = shape[:at] + [rng.choice([1, 2]) for _ in range(rng.randint(0, 2))] + shape[at:]
        if rng.random() < 0.1 and shape:
            shape[0] += 1
        terms.append(term)
        shapes.append(shape)
    equation = ",".join(terms)
    if rng.random() < 0.6:
        labels = sorted({c for c in equation if c.isalpha()})
        rng.shuffle(labels)
        equation += "->" + "".join(labels[:rng.randint(0, len(labels))])
        if "..." in equation and rng.random() < 0.7:
            equation += "..."
    if rng.random() < 0.05:
        equation = equation.replace(",", " , ") + "."
    return equation, shapes


def test_einsum_agrees_with_numpy_or_is_refused_where_numpy_refuses(tmp_path):
    rng = random.Random(20261204)
    agreed = refused = 0
    for case in range(400):
        equation, shapes = random_case(rng)
        names = [f"x{i}" for i in range(len(shapes))]
        inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip(names, shapes)]
        graph = helper.make_graph([helper.make_node("Einsum", names, ["y"], equation=equation)], "einsum", inputs,
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        graph.output[0].type.tensor_type.ClearField("shape")
        path = tmp_path / "einsum.onnx"
        path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
        xs = [np.random.default_rng(case).standard_normal(s).astype(np.float32) for s in shapes]
        try:
            want = np.einsum(equation, *xs)
        except ValueError:
            want = None
        try:
            got = osprey.load_onnx(str(path), threads=1).run(dict(zip(names, xs)))["y"]
        except osprey.Error:
            assert want is None, f"{equation} {shapes}: numpy computes it, osprey refused it"
            refused += 1
            continue
        assert want is not None, f"{equation} {shapes}: numpy refuses it, osprey computed {got.shape}"
        assert got.shape == np.shape(want), f"{equation} {shapes}"
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{equation} {shapes}")
        agreed += 1
    assert agreed > 300 and refused > 20  # the generator reaches both sides
