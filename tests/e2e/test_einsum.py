"""Einsum end to end through `osprey run`: the oracle is numpy.einsum on the same inputs.

PyTorch's exporter writes attention as Einsum (torchvision's MaxViT: "B G H I D, B G H J D -> B G H I J" with spaces);
osprey lowers two-input contractions without repeated labels to Transpose/Reshape/MatMul when it compiles and runs the
rest (diagonals, traces, plain sums, three inputs, broadcast ellipses) on the reference kernel. The ONNX backend's own
Einsum tests are float64 only, which osprey does not have. Each case is checked with the lowering on and off
(OSPREY_EINSUM_MATMUL=0), so both paths meet the oracle. Hostile equations get a clear error, not a crash.
"""

import os
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, checker, helper

TIMEOUT_S = 60

# (equation, input shapes, dtype)
CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)], np.float32),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], np.float32),
    ("B G H I D, B G H J D -> B G H I J", [(1, 2, 3, 5, 4), (1, 2, 3, 6, 4)], np.float32),
    ("B G H I J, B G H J D -> B G H I D", [(1, 2, 3, 5, 6), (1, 2, 3, 6, 4)], np.float32),
    ("bhqd,bhkd->bqhk", [(2, 3, 4, 5), (2, 3, 6, 5)], np.float32),
    ("ik,kj", [(3, 4), (4, 2)], np.float32),
    ("abc,cd->dba", [(2, 3, 4), (4, 5)], np.float32),
    ("i,j->ij", [(3,), (4,)], np.float32),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)], np.float32),
    ("ij->ji", [(3, 4)], np.float32),
    ("ii->i", [(4, 4)], np.float32),
    ("ii", [(4, 4)], np.float32),
    ("ij->", [(3, 4)], np.float32),
    ("bii->bi", [(2, 3, 3)], np.float32),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 2)], np.float32),
    ("ijk,ik->j", [(2, 3, 4), (2, 4)], np.float32),
    ("ij,ij->i", [(3, 5), (3, 5)], np.float32),
    ("ij,jk->ik", [(3, 4), (4, 5)], np.int64),
]


def einsum_model(path, equation, shapes, dtype):
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.INT64
    names = [f"x{i}" for i in range(len(shapes))]
    graph = helper.make_graph([helper.make_node("Einsum", names, ["y"], equation=equation)], "einsum",
                              [helper.make_tensor_value_info(n, elem, list(s)) for n, s in zip(names, shapes)],
                              [helper.make_tensor_value_info("y", elem, None)])
    graph.output[0].type.tensor_type.ClearField("shape")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def run_osprey(osprey_bin, model, inputs, out_dir, env=None):
    args = [str(osprey_bin), "run", str(model), "--output-dir", str(out_dir), "--threads", "1"]
    for name, path in inputs:
        args += ["--input", f"{name}={path}"]
    return subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)


@pytest.mark.parametrize("lowering", ["1", "0"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].replace(' ', '')}-{np.dtype(c[2]).name}")
def test_einsum_matches_numpy(osprey_bin, work_dir, case, lowering):
    equation, shapes, dtype = case
    rng = np.random.default_rng(len(equation) + sum(map(len, shapes)))
    xs = [(rng.standard_normal(s) if dtype == np.float32 else rng.integers(-5, 6, s)).astype(dtype) for s in shapes]
    model = work_dir / "einsum.onnx"
    einsum_model(model, equation, shapes, dtype)
    inputs = []
    for i, x in enumerate(xs):
        np.save(work_dir / f"x{i}.npy", x)
        inputs.append((f"x{i}", work_dir / f"x{i}.npy"))
    env = dict(os.environ, OSPREY_EINSUM_MATMUL=lowering)
    proc = run_osprey(osprey_bin, model, inputs, work_dir / "out", env)
    assert proc.returncode == 0, proc.stderr
    got = np.load(work_dir / "out" / "y.npy")
    want = np.einsum(equation.replace(" ", ""), *[x.astype(np.float64) for x in xs]).astype(dtype)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("equation,shapes,message", [
    ("ij,jk->ik", [(3, 4), (5, 6)], "size"),           # j is 4 in one place, 5 in the other
    ("ij,jk->iz", [(3, 4), (4, 5)], "in no input"),     # an output label no input has
    ("ij->ii", [(3, 3)], "twice"),
    ("ijk->i", [(3, 4)], "names 3 dims"),
    ("i,j,k,l->", [(2048,), (2048,), (2048,), (2048,)], "limit"),  # 1.8e13 multiply-adds from 32 KiB of input
])
def test_einsum_refuses_bad_equations_clearly(osprey_bin, work_dir, equation, shapes, message):
    model = work_dir / "bad.onnx"
    names = [f"x{i}" for i in range(len(shapes))]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in zip(names, shapes)]
    graph = helper.make_graph([helper.make_node("Einsum", names, ["y"], equation=equation)], "einsum", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with open(model, "wb") as f:
        f.write(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    inputs = []
    for i, s in enumerate(shapes):
        np.save(work_dir / f"x{i}.npy", np.ones(s, np.float32))
        inputs.append((f"x{i}", work_dir / f"x{i}.npy"))
    proc = run_osprey(osprey_bin, model, inputs, work_dir / "out")
    assert proc.returncode != 0
    assert "Einsum" in proc.stderr and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.returncode < 128  # an error, not a crash
