"""Random, often malformed Loop, Scan and If models against osprey, with ONNX Runtime as the oracle where osprey runs.

Each seed builds one model with onnx.helper (trip counts constant, from the input's shape, from input data, negative,
huge or absent; conditions constant, computed, missing or of the wrong type; 0-3 carried values through Identity, Neg,
Concat (doubling per iteration), Add, Unsqueeze, ReduceSum, Shape or Reshape; scan outputs of declared types right or
wrong; bodies with a missing input or an extra output; Scan with random axes, directions and counts; If on input
data, a shape, a constant or a wrong-typed/shaped condition, with branches that agree or not in type and shape,
nest data-dependent Ifs, return an outer value, or have too many or no outputs), runs
`osprey run` on it (30 s, 8 GiB address space) and sorts the outcome:
  CRASH                      a signal or a hang: always a bug
  both run: DIFFER           osprey and ONNX Runtime disagree (shape, or values beyond rtol 1e-5 + atol 1e-6)
  osprey runs, ORT refuses   worth a look: osprey accepts a model ONNX Runtime finds invalid
  osprey refuses / both run: agree
ONNX Runtime is asked only where osprey ran (on what osprey refuses it may run for ever: a 2^63 trip count).
Usage: .venv/bin/python fuzz/control_flow_models.py [--first 0] [--count 200] [--work /tmp/osprey-cf]
(300 seeds take ~3 minutes; the tenth session's run found Scan directions other than 0/1 accepted, now refused.
Where a model has one, osprey and ONNX Runtime also run it on -x, so that a data-dependent If takes its other branch.)
"""

import argparse
import os
import random
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save

F, I, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
REPO = Path(__file__).resolve().parents[1]


def vi(name, t, shape): return helper.make_tensor_value_info(name, t, shape)

def loop_model(r):
    n_carried = r.choice([0, 1, 2, 3])
    n_scan = r.choice([0, 1, 2])
    body_nodes, b_in, b_out = [], [vi("i", I, []), vi("c_in", B, [])], []
    # condition out
    cmode = r.choice(["id", "lt", "const", "missing", "float"])
    if cmode == "id": body_nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    elif cmode == "lt":
        body_nodes.append(helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.array(r.choice([0, 2, 7, -3]), np.int64))))
        body_nodes.append(helper.make_node("Less", ["i", "k"], ["c_out"]))
    elif cmode == "const": body_nodes.append(helper.make_node("Constant", [], ["c_out"], value=numpy_helper.from_array(np.array(r.random() < 0.5))))
    elif cmode == "float": body_nodes.append(helper.make_node("Cast", ["i"], ["c_out"], to=F))
    if cmode != "missing": b_out.append(vi("c_out", B, []))
    ops = ["Identity", "Neg", "Concat", "Add", "Unsqueeze", "ReduceSum", "Shape", "Reshape"]
    for k in range(n_carried):
        op = r.choice(ops)
        a, o = f"v{k}_in", f"v{k}_out"
        b_in.append(vi(a, F, None))
        if op == "Concat": body_nodes.append(helper.make_node("Concat", [a, a], [o], axis=r.choice([0, 1, -1, 5])))
        elif op == "Add": body_nodes.append(helper.make_node("Add", [a, "outer"], [o]))
        elif op == "Unsqueeze":
            body_nodes.append(helper.make_node("Constant", [], [f"ax{k}"], value=numpy_helper.from_array(np.array([0], np.int64))))
            body_nodes.append(helper.make_node("Unsqueeze", [a, f"ax{k}"], [o]))
        elif op == "ReduceSum": body_nodes.append(helper.make_node("ReduceSum", [a], [o], keepdims=r.choice([0, 1])))
        elif op == "Shape": body_nodes.append(helper.make_node("Shape", [a], [o]))
        elif op == "Reshape":
            body_nodes.append(helper.make_node("Constant", [], [f"sh{k}"], value=numpy_helper.from_array(np.array(r.choice([[-1], [2, -1], [0, 0, -1], [-1, -1]]), np.int64))))
            body_nodes.append(helper.make_node("Reshape", [a, f"sh{k}"], [o]))
        else: body_nodes.append(helper.make_node(op, [a], [o]))
        b_out.append(vi(o, F, None))
    for s in range(n_scan):
        src = r.choice(["i", "outer"] + [f"v{k}_out" for k in range(n_carried)])
        body_nodes.append(helper.make_node("Identity", [src], [f"s{s}"]))
        b_out.append(vi(f"s{s}", r.choice([F, I]), None))
    if r.random() < 0.1: b_in = b_in[:-1]  # malformed: missing body input
    if r.random() < 0.1: b_out = b_out + [vi("extra", F, None)]
    body = helper.make_graph(body_nodes, "body", b_in, b_out)
    mmode = r.choice(["const", "empty", "shape", "neg", "big", "data"])
    inits, nodes, loop_in = [], [], []
    if mmode == "const": inits.append(numpy_helper.from_array(np.array(r.choice([0, 1, 3, 17]), np.int64), "M")); loop_in.append("M")
    elif mmode == "neg": inits.append(numpy_helper.from_array(np.array(-5, np.int64), "M")); loop_in.append("M")
    elif mmode == "big": inits.append(numpy_helper.from_array(np.array(r.choice([10001, 2**40, 2**63 - 1]), np.int64), "M")); loop_in.append("M")
    elif mmode == "shape":
        nodes += [helper.make_node("Shape", ["x"], ["xs"]), helper.make_node("Gather", ["xs", "zero"], ["M"], axis=0)]
        inits.append(numpy_helper.from_array(np.array(0, np.int64), "zero")); loop_in.append("M")
    elif mmode == "data":
        nodes += [helper.make_node("ReduceSum", ["x"], ["xsum"], keepdims=0), helper.make_node("Cast", ["xsum"], ["M"], to=I)]
        loop_in.append("M")
    else: loop_in.append("")
    cin = r.choice(["true", "false", "empty"])
    if cin == "empty": loop_in.append("")
    else: inits.append(numpy_helper.from_array(np.array(cin == "true"), "cond")); loop_in.append("cond")
    for k in range(n_carried): loop_in.append("x")
    inits.append(numpy_helper.from_array(np.array([1.5, -2], np.float32), "outer"))
    outs = [f"y{k}" for k in range(n_carried + n_scan)]
    nodes.append(helper.make_node("Loop", loop_in, outs or ["dummy"], body=body))
    g = helper.make_graph(nodes, "g", [vi("x", F, [r.choice([1, 2, 3]), 2])], [vi(o, F, None) for o in (outs or ["dummy"])], inits)
    return g

def scan_model(r):
    n_state, n_scan_in = r.choice([0, 1, 2]), r.choice([0, 1, 2])
    b_in, b_out, nodes = [], [], []
    for k in range(n_state):
        b_in.append(vi(f"st{k}", F, None))
    for k in range(n_scan_in):
        b_in.append(vi(f"sc{k}", F, None))
    for k in range(n_state):
        src = "sc0" if n_scan_in and r.random() < 0.5 else f"st{k}"
        nodes.append(helper.make_node(r.choice(["Add", "Sub", "Mul"]), [f"st{k}", src], [f"st{k}_o"]))
        b_out.append(vi(f"st{k}_o", F, None))
    n_scan_out = r.choice([0, 1, 2])
    for k in range(n_scan_out):
        src = r.choice([f"st{j}" for j in range(n_state)] + [f"sc{j}" for j in range(n_scan_in)] or ["none"])
        nodes.append(helper.make_node("Identity", [src], [f"so{k}"]))
        b_out.append(vi(f"so{k}", F, None))
    body = helper.make_graph(nodes, "body", b_in, b_out)
    attrs = dict(num_scan_inputs=n_scan_in if r.random() < 0.9 else r.choice([-1, 0, 5, 2**31 - 1]))
    if r.random() < 0.5: attrs["scan_input_axes"] = [r.choice([0, 1, -1, 2, -3, 99]) for _ in range(max(n_scan_in, 0))]
    if r.random() < 0.4: attrs["scan_input_directions"] = [r.choice([0, 1, 2]) for _ in range(n_scan_in)]
    if r.random() < 0.4: attrs["scan_output_axes"] = [r.choice([0, 1, -1, 3]) for _ in range(n_scan_out)]
    if r.random() < 0.3: attrs["scan_output_directions"] = [r.choice([0, 1]) for _ in range(n_scan_out)]
    ins = ["x"] * n_state + ["x"] * n_scan_in
    outs = [f"y{k}" for k in range(n_state + n_scan_out)] or ["dummy"]
    attrs = {k: v for k, v in attrs.items() if not (isinstance(v, list) and not v)}
    g = helper.make_graph([helper.make_node("Scan", ins, outs, body=body, **attrs)], "g",
                          [vi("x", F, [r.choice([0, 1, 3]), r.choice([1, 2])])], [vi(o, F, None) for o in outs])
    return g

def if_branch(r, name, depth):
    """A branch graph (no inputs; reads the outer x and outer) with 1 output, or a malformed one."""
    kind = r.choice(["Identity", "Neg", "AddOuter", "ReduceSum", "Concat", "Flatten", "Cast", "Outer", "Relu",
                     "Nested", "TwoOutputs", "NoOutput"])
    o = f"{name}_y"
    nodes = []
    if kind == "Identity": nodes.append(helper.make_node("Identity", ["x"], [o]))
    elif kind == "Neg": nodes.append(helper.make_node("Neg", ["x"], [o]))
    elif kind == "AddOuter": nodes.append(helper.make_node("Add", ["x", "outer"], [o]))
    elif kind == "ReduceSum": nodes.append(helper.make_node("ReduceSum", ["x"], [o], keepdims=r.choice([0, 1])))
    elif kind == "Concat": nodes.append(helper.make_node("Concat", ["x", "x"], [o], axis=r.choice([0, 1])))
    elif kind == "Flatten": nodes.append(helper.make_node("Flatten", ["x"], [o], axis=r.choice([0, 1, 2])))
    elif kind == "Cast": nodes.append(helper.make_node("Cast", ["x"], [o], to=r.choice([I, F])))
    elif kind == "Outer": o = "outer"
    elif kind == "Relu": nodes.append(helper.make_node("Relu", ["x"], [o]))
    elif kind == "Nested" and depth < 3:
        nodes += [helper.make_node("ReduceMax", ["x"], [f"{name}_m"], keepdims=0),
                  helper.make_node("Greater", [f"{name}_m", "half"], [f"{name}_c"]),
                  helper.make_node("If", [f"{name}_c"], [o], then_branch=if_branch(r, name + "t", depth + 1),
                                   else_branch=if_branch(r, name + "e", depth + 1))]
    else: nodes.append(helper.make_node("Sigmoid", ["x"], [o]))
    outputs = [vi(o, r.choice([F, F, F, I]) if r.random() < 0.1 else F, None)]
    if kind == "TwoOutputs": outputs.append(vi(o, F, None))
    if kind == "NoOutput": outputs = []
    return helper.make_graph(nodes, name, [], outputs)


def if_model(r):
    """An If whose condition comes from input data (mostly), a shape, a constant, or a wrong-typed/shaped value."""
    nodes = []
    cmode = r.choice(["data", "data", "data", "shape", "const", "float", "vector", "int64"])
    if cmode == "data":
        nodes += [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                  helper.make_node("Greater", ["s", "zero"], ["cond"])]
    elif cmode == "shape":
        nodes += [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("ReduceProd", ["sh"], ["n"], keepdims=0),
                  helper.make_node("Greater", ["n", "two"], ["cond"])]
    elif cmode == "const": nodes.append(helper.make_node("Constant", [], ["cond"], value=numpy_helper.from_array(np.array(r.random() < 0.5))))
    elif cmode == "float": nodes.append(helper.make_node("ReduceSum", ["x"], ["cond"], keepdims=0))
    elif cmode == "vector": nodes.append(helper.make_node("Greater", ["x", "zero"], ["cond"]))
    else: nodes += [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0), helper.make_node("Cast", ["s"], ["cond"], to=I)]
    n_out = 1
    then_b, else_b = if_branch(r, "then", 0), if_branch(r, "else", 0)
    nodes.append(helper.make_node("If", ["cond"], ["y0"], then_branch=then_b, else_branch=else_b))
    inits = [numpy_helper.from_array(np.float32(0), "zero"), numpy_helper.from_array(np.int64(2), "two"),
             numpy_helper.from_array(np.float32(0.5), "half"),
             numpy_helper.from_array(np.array([1.5, -2], np.float32), "outer")]
    return helper.make_graph(nodes, "g", [vi("x", F, [r.choice([1, 2, 3]), 2])],
                             [vi(f"y{k}", F, None) for k in range(n_out)], inits)


def check(osprey_bin, ort, path, x, work, tag):
    """Runs osprey (and, where it runs, ONNX Runtime) on model `path` with input x; returns (kind, rc, err, ort_err)."""
    np.save(work / f"x{tag}.npy", x)
    out = work / f"o{tag}"

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
    try:
        p = subprocess.run([osprey_bin, "run", str(path), "-i", f"x={work / f'x{tag}.npy'}", "-o", str(out),
                            "--threads", "1"], capture_output=True, text=True, timeout=30, preexec_fn=limit)
        rc, err = p.returncode, (p.stderr.strip().splitlines() or [""])[-1]
    except subprocess.TimeoutExpired:
        rc, err = "TIMEOUT", ""
    ort_err, want = None, None
    if rc == 0:
        try:
            options = ort.SessionOptions()
            options.log_severity_level = 4
            sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})))
        except Exception as e:  # noqa: BLE001 (any refusal by the oracle)
            ort_err = str(e).splitlines()[0][:160]
    if rc not in (0, 1):
        return "CRASH", rc, err, ort_err
    if rc == 1:
        return "osprey refuses", rc, err, ort_err
    if ort_err:
        return "osprey runs, ORT refuses", rc, err, ort_err
    for name, w in want.items():
        got = np.load(out / f"{name}.npy")
        if got.shape != w.shape or not np.allclose(got, w, rtol=1e-5, atol=1e-6):
            return "both run: DIFFER", rc, err, ort_err
    return "both run: agree", rc, err, ort_err


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--first", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--count", type=int, default=200, help="models to try (default 200)")
    ap.add_argument("--work", default="/tmp/osprey-cf", help="folder for models, inputs and outputs")
    ap.add_argument("--bin", default=os.environ.get("OSPREY_BIN", str(REPO / "build" / "bin" / "osprey")))
    args = ap.parse_args()
    import onnxruntime as ort
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    counts = {}
    for s in range(args.first, args.first + args.count):
        r = random.Random(s)
        pick = r.random()
        g = loop_model(r) if pick < 0.4 else scan_model(r) if pick < 0.65 else if_model(r)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", r.choice([11, 13, 16, 19]))])
        m.ir_version = 8
        path = work / f"m{s}.onnx"
        save(m, str(path))
        dims = [d.dim_value for d in g.input[0].type.tensor_type.shape.dim]
        x = np.random.default_rng(s).standard_normal(dims).astype(np.float32)
        is_if = any(n.op_type == "If" for n in g.node)
        for variant, xv in enumerate([x, -x] if is_if else [x]):
            tag = f"{s}" if variant == 0 else f"{s}n"
            kind, rc, err, ort_err = check(args.bin, ort, path, xv, work, tag)
            counts[kind] = counts.get(kind, 0) + 1
            if kind in ("CRASH", "both run: DIFFER", "osprey runs, ORT refuses"):
                print(f"seed {tag}: {kind} (osprey rc {rc}: {err[:150]}) ORT: {ort_err}  model {path}", flush=True)
    print(f"{args.count} models: {counts}")
    return 1 if counts.get("CRASH") or counts.get("both run: DIFFER") else 0


if __name__ == "__main__":
    sys.exit(main())
