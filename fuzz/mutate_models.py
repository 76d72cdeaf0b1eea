"""Structured mutation fuzz: real ONNX models with one to three mutations each through `osprey bench`.

Seeds are the ONNX files under --models (default: the PyPI models `bench/pypi_models` caches, else ONNX's node test
models), each under --max-mb. A case applies 1-3 of: an attribute set to an edge value (0, -1, 2^31 - 1, 2^31,
2^62, NaN, inf, another enum string; an ints entry changed, dropped or added), an initializer with an edge value,
fewer elements, dims that lie about its data or another dtype, a graph input dim set to 0, 1, 2, 3, 2^31 or 2^40, and
rewiring (an input replaced by another value, dropped or added, an op type swapped). It then runs `osprey bench
--iters 1 --warmup 0` (--timeout seconds, an 8 GiB address space) and keeps, under --work, every case that
  dies by a signal or an exit code other than 0 (ran), 1 (a clear error) or 2 (usage): a finding, always a bug
  (the exit status is 1 when there is one);
  outlives the timeout: listed as slow, not a finding (a mutation may ask for a legitimately huge computation, or
  `osprey bench` may fill a declared 2^31-element input before the compile refuses it); look at them.
Each case kept is saved as finding<N>_<seed model>.onnx or slow<N>_<seed model>.onnx, its mutations on stdout.
`make test` runs it for FUZZ_SECONDS with seed 1 on ONNX's node test models (always installed with the onnx package),
so its cases are the same on every run; `make fuzz` for a minute on the PyPI models.
Usage: .venv/bin/python fuzz/mutate_models.py [--seconds 300] [--seed 1] [--models DIR] [--work DIR] [--reference]
The thirty-fourth session's first 20 minutes found four crashes, all fixed and kept in
tests/hostile/test_hostile_graphs.py (docs/performance.md, "Thirty-fourth session").
"""

import argparse
import copy
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

REPO = Path(__file__).resolve().parents[1]
INTS = [0, -1, 1, 2, 3, 7, 255, 65536, 2**31 - 1, 2**31, 2**40, 2**62, -2**62, -(2**31)]
FLOATS = [0.0, -1.0, 1.0, 1e30, -1e30, float("nan"), float("inf"), float("-inf"), 1e-30, 0.5]
STRINGS = [b"", b"NOTSET", b"SAME_UPPER", b"VALID", b"reflect", b"edge", b"wrap", b"linear", b"cubic", b"nearest",
           b"half_pixel", b"tf_crop_and_resize", b"xyz" * 50]


class Mutator:
    def __init__(self, rng):
        self.r = rng

    def edge_int(self, v):
        return self.r.choice(INTS) if self.r.random() < 0.6 else v + self.r.choice([-2, -1, 1, 2])

    def attribute(self, g):
        nodes = [n for n in g.node if n.attribute]
        if not nodes:
            return False
        a = self.r.choice(self.r.choice(nodes).attribute)
        A = onnx.AttributeProto
        if a.type == A.INT:
            a.i = self.edge_int(a.i)
        elif a.type == A.INTS:
            ints = list(a.ints)
            roll = self.r.random()
            if roll < 0.5 and ints:
                k = self.r.randrange(len(ints))
                ints[k] = self.edge_int(ints[k])
            elif roll < 0.7 and ints:
                ints.pop(self.r.randrange(len(ints)))
            else:
                ints.append(self.r.choice(INTS))
            del a.ints[:]
            a.ints.extend(ints)
        elif a.type == A.FLOAT:
            a.f = self.r.choice(FLOATS)
        elif a.type == A.FLOATS:
            fl = list(a.floats) or [0.0]
            fl[self.r.randrange(len(fl))] = self.r.choice(FLOATS)
            del a.floats[:]
            a.floats.extend(fl)
        elif a.type == A.STRING:
            a.s = self.r.choice(STRINGS)
        else:
            return False
        return True

    def initializer(self, g):
        if not g.initializer:
            return False
        t = self.r.choice(list(g.initializer))
        arr = numpy_helper.to_array(t)
        roll = self.r.random()
        if arr.dtype in (np.int64, np.int32) and 0 < arr.size <= 16:
            a = arr.copy().reshape(-1)
            a[self.r.randrange(a.size)] = self.r.choice([0, -1, 1, 7, 1 << 30, 2**31 - 1, -(2**31)])
            if arr.dtype == np.int64 and self.r.random() < 0.3:
                a[self.r.randrange(a.size)] = self.r.choice([2**62, -(2**62), 2**63 - 1, -(2**63)])
            new = numpy_helper.from_array(a.reshape(arr.shape), t.name)
        elif roll < 0.4 and arr.size > 1:
            new = numpy_helper.from_array(arr.reshape(-1)[: max(1, arr.size // 2)], t.name)  # fewer elements
        elif roll < 0.6 and arr.dtype.kind == "f" and arr.size:
            a = arr.copy()
            a.reshape(-1)[self.r.randrange(a.size)] = self.r.choice(FLOATS)
            new = numpy_helper.from_array(a, t.name)
        elif roll < 0.8:
            new = copy.deepcopy(t)  # dims that lie about the data
            if new.dims:
                new.dims[self.r.randrange(len(new.dims))] = self.r.choice([0, 1, 2, 1 << 20, 1 << 40])
            else:
                new.dims.append(self.r.choice([0, 2, 1 << 40]))
        else:
            with np.errstate(all="ignore"):
                dtype = self.r.choice([np.float32, np.int64, np.uint8, np.float16, np.int32])
                new = numpy_helper.from_array(arr.astype(dtype), t.name)
        t.CopyFrom(new)
        return True

    def input_dims(self, g):
        constants = {t.name for t in g.initializer}
        inputs = [i for i in g.input if i.name not in constants and i.type.tensor_type.shape.dim]
        if not inputs:
            return False
        d = self.r.choice(self.r.choice(inputs).type.tensor_type.shape.dim)
        d.dim_value = self.r.choice([0, 1, 2, 3, 1 << 31, 1 << 40])
        return True

    def wiring(self, g):
        if not g.node:
            return False
        n = self.r.choice(list(g.node))
        values = [o for m in g.node for o in m.output] + [i.name for i in g.input] + [t.name for t in g.initializer]
        roll = self.r.random()
        if roll < 0.5 and n.input:
            n.input[self.r.randrange(len(n.input))] = self.r.choice(values)
        elif roll < 0.7 and n.input:
            del n.input[-1]
        elif roll < 0.8:
            n.input.append(self.r.choice(values))
        else:
            n.op_type = self.r.choice(sorted({m.op_type for m in g.node} | {
                "Reshape", "Expand", "Tile", "Pad", "Resize", "Slice", "Gather", "ConstantOfShape", "Range", "TopK",
                "NonZero", "Split", "Concat"}))
        return True

    def mutate(self, model):
        done = []
        for _ in range(self.r.choice([1, 1, 2, 3])):
            f = self.r.choice([self.attribute, self.attribute, self.initializer, self.input_dims, self.wiring])
            try:
                if f(model.graph):
                    done.append(f.__name__)
            except Exception:  # a mutation numpy or onnx cannot express: try another
                pass
        return done


def default_models():
    pypi = Path.home() / ".cache" / "osprey" / "pypi-models"
    return pypi if pypi.is_dir() else Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--models", type=Path, default=None, help="directory searched for *.onnx seeds")
    ap.add_argument("--max-mb", type=float, default=3, help="largest seed model (MB)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/osprey-mutate"))
    ap.add_argument("--timeout", type=float, default=30)
    ap.add_argument("--bin", default=os.environ.get("OSPREY_BIN", str(REPO / "build" / "bin" / "osprey")))
    ap.add_argument("--reference", action="store_true", help="run with --reference (reference kernels, no fusion)")
    args = ap.parse_args()
    models_dir = args.models or default_models()
    seeds = []
    for p in sorted(models_dir.rglob("*.onnx")):
        if p.stat().st_size <= args.max_mb * 1e6:
            try:
                seeds.append((p, onnx.load(str(p))))
            except Exception:
                pass
    if not seeds:
        sys.exit(f"no seed models under {models_dir} (run bench/pypi_models once, or pass --models)")
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"{len(seeds)} seed models from {models_dir}; {args.seconds:.0f} s; findings in {args.work}", flush=True)
    rng = random.Random(args.seed)
    mutator = Mutator(rng)

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    start, cases, findings, slow, outcomes = time.time(), 0, 0, 0, {}
    case = args.work / "case.onnx"
    while time.time() - start < args.seconds:
        path, base = rng.choice(seeds)
        model = copy.deepcopy(base)
        done = mutator.mutate(model)
        if not done:
            continue
        try:
            onnx.save(model, str(case))
        except Exception:
            continue
        cases += 1
        try:
            p = subprocess.run([args.bin, "bench", str(case), "--iters", "1", "--warmup", "0", "--threads", "2"] +
                               (["--reference"] if args.reference else []),
                               capture_output=True, timeout=args.timeout, preexec_fn=limit)
            rc, tail = p.returncode, p.stderr.decode(errors="replace").strip()[-300:]
        except subprocess.TimeoutExpired:
            rc, tail = "timeout", ""
        outcomes[rc] = outcomes.get(rc, 0) + 1
        if rc == "timeout":
            slow += 1
            keep = args.work / f"slow{slow}_{path.name}"
            os.replace(case, keep)
            print(f"SLOW (over {args.timeout:.0f} s) {path} {done} -> {keep}", flush=True)
        elif rc not in (0, 1, 2):
            findings += 1
            keep = args.work / f"finding{findings}_{path.name}"
            os.replace(case, keep)
            print(f"FINDING {rc} {path} {done} -> {keep}\n  {tail}", flush=True)
        if cases % 100 == 0:
            print(f"{cases} cases, {findings} findings, {time.time() - start:.0f} s", flush=True)
    print(f"{cases} cases, {findings} findings, {slow} slow; exit codes {outcomes}", flush=True)
    sys.exit(1 if findings else 0)


if __name__ == "__main__":
    main()
