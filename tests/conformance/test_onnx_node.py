"""ONNX backend node tests (shipped inside the onnx package) run through the real `osprey run` binary.

Oracle: the expected outputs stored next to each test model (onnx/backend/test/data/node/<test>/test_data_set_*/).
Each test ends up in one of three classes:
  passed           every output matches (floats: rtol 1e-3, atol 1e-5; integers and bool: exact; dtype and shape exact)
  failed           wrong values, wrong shape/dtype, a missing output, an error, a crash or a hang
  not implemented  osprey reports `unsupported op(s)`, or the test needs something osprey does not have by design:
                   dtypes without an osprey/.npy form (float64, strings, uint16/32/64, int16, complex, bfloat16,
                   float8, int4), sequence/optional/map values, non-default domains (model-local functions are
                   inlined), or an opset outside osprey's range.
The pytest test fails when a test of an implemented op fails and is not listed in exclusions.txt. Not implemented
tests never fail it; excluded tests that pass are reported so the exclusion can be removed.

Inputs osprey needs when it compiles (a Reshape's shape, Reduce axes, Pad pads, Tile repeats, Resize sizes...) are
graph inputs in these tests; osprey resolves shapes at compile time (like TensorRT), refuses them as data-dependent,
and the test is rerun with exactly those inputs (found from the node the error names) turned into initializers
holding the test's values. The summary counts these runs.

Models whose opset is newer than osprey's newest (include/osprey/onnx.h kMaxOnnxOpset) are run at that opset when
every op they use has the same signature (attributes, inputs, outputs) at both (opsets that only widen type
constraints, as 22 and 25 did).

The suite runs twice in `make test`: on .venv's onnx 1.17 (its wheel holds the data) and on .venv-onnx's newest onnx
(opsets up to 28; tools/onnx_node_data.py writes its data, which newer wheels no longer ship).

Environment: OSPREY_BIN (binary), OSPREY_CONFORMANCE_FILTER (regex on test names, for quick runs),
OSPREY_CONFORMANCE_SUMMARY (summary file; default <build dir>/conformance-summary.txt), OSPREY_CONFORMANCE_DATA
(the node tests' data directory; default the installed onnx package's).
Also runnable as a script: `.venv/bin/python tests/conformance/test_onnx_node.py [--filter REGEX] [--bin PATH]`.
"""

import collections
import concurrent.futures
import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.defs
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
EXCLUSIONS_FILE = HERE / "exclusions.txt"
# onnx <= 1.18 ships the node tests' data in its wheel; newer wheels ship only the generators
# (tools/onnx_node_data.py writes the data of the installed onnx into a directory given here).
NODE_TEST_DIR = Path(os.environ.get("OSPREY_CONFORMANCE_DATA")
                     or Path(onnx.__file__).parent / "backend" / "test" / "data" / "node")

RTOL = 1e-3
ATOL = 1e-5
WORKERS = 2
TIMEOUT_S = 60

TP = onnx.TensorProto
SUPPORTED_DTYPES = {TP.FLOAT, TP.FLOAT16, TP.INT8, TP.UINT8, TP.INT32, TP.INT64, TP.BOOL}
MIN_OPSET = 7


def max_opset() -> int:
    """osprey's newest default-domain opset, read from the header so the two never drift apart."""
    header = (REPO / "include" / "osprey" / "onnx.h").read_text()
    match = re.search(r"kMaxOnnxOpset\s*=\s*(\d+)", header)
    return int(match.group(1)) if match else 21


@dataclasses.dataclass
class Result:
    name: str
    status: str  # "passed" | "failed" | "not implemented"
    op: str  # the op under test (for expanded tests, the function op they expand)
    detail: str = ""
    kind: str = ""  # for failures: mismatch, shape, dtype, output, error, unsupported, crash, timeout
    missing_ops: tuple = ()
    downgraded: bool = False
    constant_inputs: tuple = ()  # graph inputs given as initializers because osprey needs them at compile time
    seconds: float = 0.0


def safe_name(name: str) -> str:
    """Output file stem the CLI uses: '/' and other characters unsafe in file names become '_'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _version(text: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def load_exclusions(path: Path = EXCLUSIONS_FILE) -> dict:
    """`test_name [onnx<X.Y]  # reason` per line; blank lines and lines starting with '#' are ignored. With
    `onnx<X.Y` the exclusion applies only to the node tests of onnx versions before X.Y (their expected data)."""
    exclusions = {}
    if not path.exists():
        return exclusions
    for line in path.read_text().splitlines():
        body, _, reason = line.partition("#")
        words = body.split()
        if not words:
            continue
        if len(words) > 1 and words[1].startswith("onnx<") and _version(onnx.__version__) >= _version(words[1][5:]):
            continue
        exclusions[words[0]] = reason.strip()
    return exclusions


def _dtype_name(elem_type: int) -> str:
    return TP.DataType.Name(elem_type).lower()


def _schema_signature(schema):
    attrs = [(n, a.type, a.required, a.default_value.SerializeToString()) for n, a in sorted(schema.attributes.items())]
    return attrs, [(i.name, i.option) for i in schema.inputs], [(o.name, o.option) for o in schema.outputs]


def not_implemented_reason(model: onnx.ModelProto, newest_opset: int):
    """Why osprey cannot run this model by design, or None. May lower the model's opset in place (see module doc)."""
    for vi in list(model.graph.input) + list(model.graph.output):
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":
            return f"{kind.replace('_type', '')} values"
        if vi.type.tensor_type.elem_type not in SUPPORTED_DTYPES:
            return f"dtype {_dtype_name(vi.type.tensor_type.elem_type)}"
    for init in model.graph.initializer:
        if init.data_type not in SUPPORTED_DTYPES:
            return f"dtype {_dtype_name(init.data_type)}"
    local_functions = {(f.domain, f.name) for f in model.functions}
    for node in model.graph.node:
        if (node.domain, node.op_type) in local_functions:
            continue  # inlined when imported (src/onnx/onnx_functions.cc)
        if node.domain not in ("", "ai.onnx"):
            return f"domain {node.domain}"
        for attr in node.attribute:
            subgraph = attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            if subgraph and node.op_type not in ("If", "Loop", "Scan"):
                return "subgraph"
            if node.op_type == "Cast" and attr.name == "to" and attr.i not in SUPPORTED_DTYPES:
                return f"dtype {_dtype_name(attr.i)}"
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type not in SUPPORTED_DTYPES:
                return f"dtype {_dtype_name(attr.t.data_type)}"
    for imp in model.opset_import:
        if imp.domain not in ("", "ai.onnx"):
            continue
        if imp.version < MIN_OPSET:
            return f"opset {imp.version}"
        if imp.version > newest_opset:
            for node in model.graph.node:
                try:
                    new = onnx.defs.get_schema(node.op_type, imp.version, "")
                    old = onnx.defs.get_schema(node.op_type, newest_opset, "")
                except onnx.defs.SchemaError:
                    return f"opset {imp.version}"
                if _schema_signature(new) != _schema_signature(old):
                    return f"opset {imp.version}"
            imp.version = newest_opset
    return None


def op_under_test(test_dir: Path, model: onnx.ModelProto) -> str:
    """The op a test is about: its single node's op, or for `_expanded` tests the op of the unexpanded sibling."""
    sibling = re.sub(r"_expanded(_ver\d+)?$", "", test_dir.name)
    if sibling != test_dir.name and (test_dir.parent / sibling / "model.onnx").exists():
        model = onnx.load(str(test_dir.parent / sibling / "model.onnx"), load_external_data=False)
    ops = sorted({n.op_type for n in model.graph.node})
    return ops[0] if len(ops) == 1 else "+".join(ops) if ops else "(none)"


def _load_value(path: Path):
    tensor = TP()
    tensor.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(tensor)


def compare(name: str, actual: np.ndarray, expected: np.ndarray):
    """None when `actual` matches `expected`, else (kind, message)."""
    if actual.dtype != expected.dtype:
        return "dtype", f"output '{name}': dtype {actual.dtype}, expected {expected.dtype}"
    if actual.shape != expected.shape:
        return "shape", f"output '{name}': shape {actual.shape}, expected {expected.shape}"
    if expected.dtype.kind == "f":
        a = actual.astype(np.float64)
        e = expected.astype(np.float64)
        bad = ~np.isclose(a, e, rtol=RTOL, atol=ATOL, equal_nan=True)
    else:
        a, e = actual, expected
        bad = a != e
    if not bad.any():
        return None
    idx = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
    return "mismatch", (f"output '{name}': {int(bad.sum())} of {bad.size} values differ; "
                        f"first at {list(idx)}: got {a[idx]!r}, expected {e[idx]!r}")


UNSUPPORTED_OP_RE = re.compile(r"unsupported op", re.IGNORECASE)
OP_IN_MESSAGE_RE = re.compile(r"([A-Za-z0-9_.]+) \(node '")


COMPILE_TIME_RE = re.compile(r"(\S+) '([^']*)': input (\d+) must be known when the model is compiled")
MAX_CONSTANTIFY_ROUNDS = 6


def _scoped_nodes(graph, prefix: str = "") -> list:
    """(osprey's name, node, inner) for every node, If branches included: the importer names an unnamed node
    <op>_<index in its graph>, and a node inlined from a folded If '<if name>/<then_branch|else_branch>/<its name>';
    `inner` lists the nodes of the If branches under the node (empty for other nodes)."""
    found = []
    for i, n in enumerate(graph.node):
        name = prefix + (n.name or f"{n.op_type}_{i}")
        inner = []
        for attr in n.attribute:
            if n.op_type == "If" and attr.type == onnx.AttributeProto.GRAPH:
                inner += _scoped_nodes(attr.g, f"{name}/{attr.name}/")
        found.append((name, n, [m for _, m, _ in inner]))
        found += inner
    return found


def _graph_inputs_feeding(model: onnx.ModelProto, message: str, feeds: dict) -> set:
    """Graph inputs that the value named in a `must be known when the model is compiled` error is computed from."""
    match = COMPILE_TIME_RE.search(message)
    if not match:
        return set()
    op_type, node_name, index = match.group(1), match.group(2), int(match.group(3))
    scoped = _scoped_nodes(model.graph)
    node = next((n for name, n, _ in scoped if name == node_name), None)
    if node is None or node.op_type != op_type or index >= len(node.input):
        return set()
    # Value names are unique across an ONNX model's scopes, so one map serves the branches too. A value an If
    # computes depends on its condition and on every value its branches read.
    producers = {out: (n, inner) for _, n, inner in scoped for out in n.output}
    found, pending, seen = set(), [node.input[index]], set()
    while pending:
        value = pending.pop()
        if value in seen or not value:
            continue
        seen.add(value)
        if value in feeds:
            found.add(value)
        elif value in producers:
            producer, inner = producers[value]
            pending.extend(producer.input)
            for m in inner:
                pending.extend(m.input)
    return found


def _run_cli(osprey_bin: Path, model_path: Path, feeds: dict, work: Path, tag: str):
    args = [str(osprey_bin), "run", str(model_path)]
    for i, (name, value) in enumerate(feeds.items()):
        npy = work / f"{tag}.input_{i}.npy"
        np.save(npy, value)
        args += ["--input", f"{name}={npy}"]
    out_dir = work / f"{tag}.out"
    out_dir.mkdir()
    args += ["--output-dir", str(out_dir), "--threads", "1"]
    proc = subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=TIMEOUT_S)
    return proc, out_dir


def run_test(test_dir: Path, osprey_bin: Path, work_root: Path, newest_opset: int) -> Result:
    """Runs one node test. Inputs osprey needs at compile time (shape, axes, pads, repeats, sizes...: osprey resolves
    shapes when it compiles, as TensorRT does) are turned into initializers holding the test's values and the test is
    rerun; such tests are marked `constant_inputs`."""
    start = time.monotonic()
    model = onnx.load(str(test_dir / "model.onnx"), load_external_data=False)
    op = op_under_test(test_dir, model)
    original_opset = {i.domain: i.version for i in model.opset_import}
    reason = not_implemented_reason(model, newest_opset)
    if reason:
        return Result(test_dir.name, "not implemented", op, reason)
    downgraded = {i.domain: i.version for i in model.opset_import} != original_opset
    result = dict(name=test_dir.name, op=op, downgraded=downgraded)

    work = Path(tempfile.mkdtemp(prefix=test_dir.name + ".", dir=work_root))
    initializers = {i.name for i in model.graph.initializer}
    input_names = [i.name for i in model.graph.input if i.name not in initializers]
    output_names = [o.name for o in model.graph.output]
    constantified = []

    for data_set in sorted(test_dir.glob("test_data_set_*")):
        input_files = sorted(data_set.glob("input_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
        feeds = {input_names[i]: _load_value(pb) for i, pb in enumerate(input_files) if i < len(input_names)}
        run_model = model
        model_path = test_dir / "model.onnx"
        if downgraded:
            model_path = work / "model.onnx"
            onnx.save(model, str(model_path))
        for round_ in range(MAX_CONSTANTIFY_ROUNDS + 1):
            try:
                proc, out_dir = _run_cli(osprey_bin, model_path, feeds, work, f"{data_set.name}.{round_}")
            except subprocess.TimeoutExpired:
                return Result(**result, status="failed", detail=f"no result after {TIMEOUT_S} s", kind="timeout")
            stderr = proc.stderr.strip()
            to_fix = _graph_inputs_feeding(run_model, stderr, feeds) if proc.returncode == 1 else set()
            if not to_fix or round_ == MAX_CONSTANTIFY_ROUNDS:
                break
            fixed = onnx.ModelProto()
            fixed.CopyFrom(run_model)
            kept_inputs = [vi for vi in fixed.graph.input if vi.name not in to_fix]
            del fixed.graph.input[:]
            fixed.graph.input.extend(kept_inputs)
            for name in sorted(to_fix):
                fixed.graph.initializer.append(numpy_helper.from_array(feeds.pop(name), name))
                constantified.append(name)
            run_model = fixed
            model_path = work / f"{data_set.name}.model{round_}.onnx"
            onnx.save(run_model, str(model_path))
        if constantified:
            result["constant_inputs"] = tuple(constantified)

        if proc.returncode != 0:
            if proc.returncode == 1 and UNSUPPORTED_OP_RE.search(stderr):
                missing = tuple(sorted(set(OP_IN_MESSAGE_RE.findall(stderr.split("unsupported op", 1)[-1]))))
                return Result(**result, status="not implemented", detail="missing op " + ", ".join(missing or ("?",)),
                              missing_ops=missing)
            if proc.returncode == 1:
                kind = "unsupported" if re.search(r"unsupported|not supported", stderr, re.I) else "error"
            else:
                kind = "crash"
            last_line = stderr.splitlines()[-1] if stderr else f"(no message, exit code {proc.returncode})"
            return Result(**result, status="failed", detail=f"exit {proc.returncode}: {last_line[:300]}", kind=kind)
        output_files = sorted(data_set.glob("output_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
        for i, pb in enumerate(output_files):
            name = output_names[i]
            produced = out_dir / f"{safe_name(name)}.npy"
            if not produced.exists():
                found = sorted(p.name for p in out_dir.iterdir())
                return Result(**result, status="failed", detail=f"no file for output '{name}' (found {found})",
                              kind="output")
            try:
                actual = np.load(produced, allow_pickle=False)
            except ValueError as e:
                return Result(**result, status="failed", detail=f"unreadable {produced.name}: {e}", kind="output")
            problem = compare(name, actual, _load_value(pb))
            if problem:
                return Result(**result, status="failed", detail=problem[1], kind=problem[0])
    return Result(**result, status="passed", seconds=time.monotonic() - start)


def run_all(osprey_bin: Path, name_filter: str = None, workers: int = WORKERS, progress=None) -> list:
    tests = sorted(p for p in NODE_TEST_DIR.iterdir() if (p / "model.onnx").exists())
    if name_filter:
        tests = [t for t in tests if re.search(name_filter, t.name)]
    newest = max_opset()
    results = []
    with tempfile.TemporaryDirectory(prefix="osprey-conformance.") as work_root:
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(run_test, t, osprey_bin, Path(work_root), newest) for t in tests]
            for n, future in enumerate(concurrent.futures.as_completed(futures), 1):
                results.append(future.result())
                if progress and n % 200 == 0:
                    progress(f"conformance: {n}/{len(tests)} tests run")
    return sorted(results, key=lambda r: r.name)


def format_summary(results: list, exclusions: dict, seconds: float) -> str:
    by_status = collections.Counter(r.status for r in results)
    failed = [r for r in results if r.status == "failed"]
    unexpected = [r for r in failed if r.name not in exclusions]
    now_passing = [r for r in results if r.status == "passed" and r.name in exclusions]
    lines = [
        f"ONNX backend node tests (onnx {onnx.__version__}) through osprey: {len(results)} tests in {seconds:.0f} s",
        f"  passed           {by_status['passed']:5d}",
        f"  failed           {by_status['failed']:5d}   ({len(failed) - len(unexpected)} excluded, "
        f"{len(unexpected)} not excluded)",
        f"  not implemented  {by_status['not implemented']:5d}",
        f"  (run at opset {max_opset()} after an opset bump that changed only types: "
        f"{sum(r.downgraded for r in results)})",
        f"  (run with shape-determining inputs as initializers: {sum(bool(r.constant_inputs) for r in results)}, "
        f"of which passed {sum(bool(r.constant_inputs) and r.status == 'passed' for r in results)})",
        "",
    ]

    per_op = collections.defaultdict(collections.Counter)
    for r in results:
        per_op[r.op][r.status] += 1
    failing_ops = sorted((op for op, c in per_op.items() if c["failed"]), key=lambda op: (-per_op[op]["failed"], op))
    if failing_ops:
        lines.append(f"Failures by op ({len(failing_ops)} ops):")
        lines.append(f"  {'op':32s} {'failed':>6s} {'passed':>6s} {'not impl':>8s}")
        for op in failing_ops:
            c = per_op[op]
            lines.append(f"  {op[:32]:32s} {c['failed']:6d} {c['passed']:6d} {c['not implemented']:8d}")
        lines.append("")

    if failed:
        lines.append("Failed tests (kind, detail):")
        for r in failed:
            mark = f"  [excluded: {exclusions[r.name] or 'no reason'}]" if r.name in exclusions else ""
            lines.append(f"  {r.name}  {r.kind}: {r.detail}{mark}")
        lines.append("")

    if now_passing:
        lines.append("Excluded tests that now pass (remove them from exclusions.txt):")
        lines += [f"  {r.name}" for r in now_passing]
        lines.append("")
    known = {r.name for r in results}
    stale = sorted(n for n in exclusions if n not in known)
    if stale and len(results) > 1000:  # only meaningful for a full run, not a filtered one
        lines.append("Exclusions naming no test: " + ", ".join(stale))
        lines.append("")

    missing = collections.Counter()
    reasons = collections.Counter()
    for r in results:
        if r.status != "not implemented":
            continue
        if r.missing_ops:
            missing.update(r.missing_ops)
        else:
            reasons[r.detail] += 1
    if missing:
        lines.append(f"Ops osprey lacks ({len(missing)}), by number of tests:")
        lines.append("  " + ", ".join(f"{op} {n}" for op, n in sorted(missing.items(), key=lambda x: (-x[1], x[0]))))
        lines.append("")
    if reasons:
        lines.append("Not implemented by design, by reason:")
        lines.append("  " + ", ".join(f"{why} {n}" for why, n in sorted(reasons.items(), key=lambda x: (-x[1], x[0]))))
        lines.append("")
    return "\n".join(lines)


def test_onnx_node_conformance(osprey_bin, summary_path):
    exclusions = load_exclusions()
    start = time.monotonic()
    results = run_all(osprey_bin, os.environ.get("OSPREY_CONFORMANCE_FILTER"), progress=print)
    assert results, f"no ONNX node tests found under {NODE_TEST_DIR}"
    summary = format_summary(results, exclusions, time.monotonic() - start)
    print("\n" + summary)
    summary_path.parent.mkdir(parents=True, exist_ok=True)
    summary_path.write_text(summary + "\n")

    unexpected = [r for r in results if r.status == "failed" and r.name not in exclusions]
    listing = "\n".join(f"  {r.name} ({r.op}) {r.kind}: {r.detail}" for r in unexpected[:60])
    more = f"\n  ... and {len(unexpected) - 60} more" if len(unexpected) > 60 else ""
    assert not unexpected, (f"{len(unexpected)} ONNX node tests of implemented ops fail and are not in "
                            f"{EXCLUSIONS_FILE.name} (full summary: {summary_path}):\n{listing}{more}")


def main(argv=None) -> int:
    import argparse

    sys.path.insert(0, str(HERE))
    from conftest import osprey_bin_path

    parser = argparse.ArgumentParser(description="Run the ONNX backend node tests through osprey and summarise.")
    parser.add_argument("--bin", type=Path, default=osprey_bin_path(), help="osprey binary")
    parser.add_argument("--filter", default=None, help="regex on test names")
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("-v", "--verbose", action="store_true", help="also list every test and its class")
    args = parser.parse_args(argv)
    start = time.monotonic()
    results = run_all(args.bin, args.filter, args.workers, progress=print)
    if args.verbose:
        for r in results:
            print(f"{r.status:16s} {r.name:60s} {r.op:24s} {r.detail}")
    exclusions = load_exclusions()
    print(format_summary(results, exclusions, time.monotonic() - start))
    return 1 if any(r.status == "failed" and r.name not in exclusions for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
