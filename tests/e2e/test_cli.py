"""The osprey CLI end to end through the real binary: bad input gives a clear error, never a crash or a hang, and
the happy paths of run / inspect / bench / --help work.

Models are built here with onnx.helper (no torch). Oracle for the one numeric check: ONNX Runtime on the same model.
Every bad-input case must exit with code 1, print one message on stderr starting `osprey: error:` that names the
problem (asserted on key words), and finish within the CLI runner's timeout (60 s).
"""

import json
import re
import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

OPSET = 13
IR_VERSION = 8


def _save(model: onnx.ModelProto, path):
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def conv_model(path, channels=3, hidden=16):
    """x[N,3,8,8] -> Conv -> Relu -> Conv -> Relu -> GlobalAveragePool -> Flatten -> y[N,hidden].

    Op histogram: Conv 2, Relu 2, GlobalAveragePool 1, Flatten 1. Weights are large enough (~10 KB) that cutting the
    file in half lands inside the graph message.
    """
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((hidden, channels, 3, 3)).astype(np.float32) * 0.3
    b1 = rng.standard_normal(hidden).astype(np.float32) * 0.1
    w2 = rng.standard_normal((hidden, hidden, 3, 3)).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["y"], name="flatten"),
    ]
    graph = helper.make_graph(
        nodes, "small_conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", hidden])],
        initializer=[numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"),
                     numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    return _save(model, path)


def unknown_ops_model(path):
    graph = helper.make_graph(
        [helper.make_node("FooOp", ["x"], ["t"], name="foo_node"),
         helper.make_node("Relu", ["t"], ["u"], name="relu_node"),
         helper.make_node("BarOp", ["u"], ["y"], name="bar_node")],
        "unknown_ops",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.save(model, str(path))  # no check_model: the checker rightly rejects the unknown ops
    return path


@pytest.fixture
def small_model(work_dir):
    return conv_model(work_dir / "small.onnx")


@pytest.fixture
def good_input(work_dir):
    path = work_dir / "x.npy"
    np.save(path, np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32))
    return path


def assert_clean_error(proc, *keywords, any_of=()):
    """Exit code 1 (not a signal), one `osprey: error:` message on stderr containing every keyword
    (case-insensitive) and, if given, at least one of `any_of`."""
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}; stderr:\n{proc.stderr}"
    assert proc.returncode == 1, f"exit code {proc.returncode}, expected 1; stderr:\n{proc.stderr}"
    err = proc.stderr
    assert err.startswith("osprey: error:"), f"stderr does not start with 'osprey: error:':\n{err}"
    assert err.count("osprey: error:") == 1, f"expected a single error message:\n{err}"
    low = err.lower()
    for word in keywords:
        assert word.lower() in low, f"error message does not mention {word!r}:\n{err}"
    if any_of:
        assert any(w.lower() in low for w in any_of), f"error message mentions none of {any_of}:\n{err}"


def run_model(run_cli, model, work_dir, *inputs):
    args = ["run", model]
    for spec in inputs:
        args += ["--input", spec]
    return run_cli(*args, "--output-dir", work_dir / "out")


# ---------------------------------------------------------------- bad model files


def test_truncated_model(run_cli, small_model, work_dir, good_input):
    data = small_model.read_bytes()
    truncated = work_dir / "truncated.onnx"
    truncated.write_bytes(data[: len(data) // 2])
    proc = run_model(run_cli, truncated, work_dir, f"x={good_input}")
    assert_clean_error(proc, "truncated.onnx", any_of=("parse", "malformed", "invalid", "truncated", "corrupt"))


def test_garbage_model(run_cli, work_dir, good_input):
    garbage = work_dir / "garbage.onnx"
    garbage.write_bytes(np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    proc = run_model(run_cli, garbage, work_dir, f"x={good_input}")
    assert_clean_error(proc, "garbage.onnx", any_of=("parse", "malformed", "invalid", "not an onnx", "corrupt"))


def test_empty_model(run_cli, work_dir, good_input):
    empty = work_dir / "empty.onnx"
    empty.write_bytes(b"")
    proc = run_model(run_cli, empty, work_dir, f"x={good_input}")
    assert_clean_error(proc, any_of=("empty", "malformed", "invalid", "no graph", "parse"))


def test_missing_model_file(run_cli, work_dir, good_input):
    proc = run_model(run_cli, work_dir / "does_not_exist.onnx", work_dir, f"x={good_input}")
    assert_clean_error(proc, "does_not_exist.onnx", any_of=("cannot open", "not found", "no such file"))


@pytest.mark.parametrize("subcommand", ["run", "inspect", "bench"])
def test_unknown_ops_listed_in_one_message(run_cli, work_dir, subcommand):
    model = unknown_ops_model(work_dir / "unknown.onnx")
    if subcommand == "run":
        proc = run_cli("run", model, "--random-inputs", "--output-dir", work_dir / "out")
    elif subcommand == "bench":
        proc = run_cli("bench", model, "--iters", 1, "--warmup", 0)
    else:
        proc = run_cli("inspect", model)
    if subcommand == "inspect":
        # inspect describes the model (listing the unsupported ops on stdout) and exits 1.
        assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        text = proc.stdout
    else:
        assert_clean_error(proc, "unsupported")
        text = proc.stderr
    for word in ("FooOp", "foo_node", "BarOp", "bar_node"):
        assert word in text, f"{word!r} not named:\n{text}"
    assert "relu_node" not in text, f"a supported node is listed as unsupported:\n{text}"


# ---------------------------------------------------------------- bad inputs


def test_wrong_input_name(run_cli, small_model, work_dir, good_input):
    proc = run_model(run_cli, small_model, work_dir, f"nope={good_input}")
    assert_clean_error(proc, "'nope'", "no such input", "x")


def test_wrong_input_dtype(run_cli, small_model, work_dir):
    x = work_dir / "x_int32.npy"
    np.save(x, np.ones((2, 3, 8, 8), dtype=np.int32))
    proc = run_model(run_cli, small_model, work_dir, f"x={x}")
    assert_clean_error(proc, "int32", "float32")


def test_wrong_input_rank(run_cli, small_model, work_dir):
    x = work_dir / "x_rank3.npy"
    np.save(x, np.ones((3, 8, 8), dtype=np.float32))
    proc = run_model(run_cli, small_model, work_dir, f"x={x}")
    assert_clean_error(proc, "'x'", any_of=("rank", "dims", "dimensions"))


def test_wrong_fixed_dim(run_cli, small_model, work_dir):
    x = work_dir / "x_4ch.npy"
    np.save(x, np.ones((2, 4, 8, 8), dtype=np.float32))
    proc = run_model(run_cli, small_model, work_dir, f"x={x}")
    assert_clean_error(proc, "'x'", any_of=("dim", "shape"))
    assert re.search(r"\b3\b", proc.stderr) and re.search(r"\b4\b", proc.stderr), (
        f"message should give the expected (3) and the given (4) size:\n{proc.stderr}")


def test_missing_input(run_cli, small_model, work_dir):
    proc = run_cli("run", small_model, "--output-dir", work_dir / "out")
    assert_clean_error(proc, "missing input", "'x'")


def test_npy_bad_magic(run_cli, small_model, work_dir):
    bad = work_dir / "bad_magic.npy"
    bad.write_bytes(b"NOTNUMPY" + bytes(200))
    proc = run_model(run_cli, small_model, work_dir, f"x={bad}")
    assert_clean_error(proc, "bad_magic.npy", "magic")


def test_npy_truncated_data(run_cli, small_model, work_dir):
    full = work_dir / "full.npy"
    np.save(full, np.ones((2, 3, 8, 8), dtype=np.float32))
    data = full.read_bytes()
    cut = work_dir / "cut.npy"
    cut.write_bytes(data[: len(data) - 100])
    proc = run_model(run_cli, small_model, work_dir, f"x={cut}")
    assert_clean_error(proc, "cut.npy", "malformed")


def test_missing_npy_file(run_cli, small_model, work_dir):
    proc = run_model(run_cli, small_model, work_dir, f"x={work_dir / 'absent.npy'}")
    assert_clean_error(proc, "absent.npy", any_of=("cannot open", "not found", "no such file"))


def test_input_without_equals(run_cli, small_model, work_dir, good_input):
    proc = run_model(run_cli, small_model, work_dir, str(good_input))
    assert_clean_error(proc, "--input", any_of=("NAME=", "="))


def test_misspelt_option_is_named_before_a_missing_one(run_cli, small_model, work_dir, good_input):
    # CLI11 checks required options first: "--output-dir is required" alone hid the typo that caused it.
    proc = run_cli("run", small_model, "--input", f"x={good_input}", "--out-dir", work_dir / "out")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("osprey: error: unknown option --out-dir"), proc.stderr
    assert "--output-dir" in proc.stderr and "--help" in proc.stderr, proc.stderr


# ---------------------------------------------------------------- happy paths


def test_run_matches_onnxruntime(run_cli, small_model, work_dir, good_input):
    out = work_dir / "out"
    proc = run_cli("run", small_model, "--input", f"x={good_input}", "--output-dir", out, "--threads", 2)
    assert proc.returncode == 0, proc.stderr
    ours = np.load(out / "y.npy")
    ref = ort.InferenceSession(str(small_model), providers=["CPUExecutionProvider"]).run(
        None, {"x": np.load(good_input)})[0]
    assert ours.shape == ref.shape == (2, 16)
    np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-5)


def test_run_reference_kernels(run_cli, small_model, work_dir, good_input):
    fast, ref = work_dir / "fast", work_dir / "ref"
    assert run_cli("run", small_model, "--input", f"x={good_input}", "--output-dir", fast).returncode == 0
    proc = run_cli("run", small_model, "--input", f"x={good_input}", "--output-dir", ref, "--reference")
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(np.load(fast / "y.npy"), np.load(ref / "y.npy"), rtol=1e-4, atol=1e-5)


def test_run_random_inputs(run_cli, small_model, work_dir):
    out = work_dir / "out"
    proc = run_cli("run", small_model, "--random-inputs", "--output-dir", out)
    assert proc.returncode == 0, proc.stderr
    y = np.load(out / "y.npy")
    assert y.dtype == np.float32 and y.shape == (1, 16), y.shape  # symbolic batch defaults to 1
    assert np.isfinite(y).all()


def test_output_names_are_sanitized(run_cli, work_dir):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["head/out:0"], name="r")], "names",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("head/out:0", TensorProto.FLOAT, [4])])
    model = _save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION),
                  work_dir / "names.onnx")
    x = work_dir / "x.npy"
    np.save(x, np.array([-1, 2, -3, 4], dtype=np.float32))
    proc = run_cli("run", model, "--input", f"x={x}", "--output-dir", work_dir / "out")
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_array_equal(np.load(work_dir / "out" / "head_out_0.npy"), [0, 2, 0, 4])


def test_inspect_text(run_cli, small_model):
    proc = run_cli("inspect", small_model)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for word in ("inputs", "outputs", "float32"):
        assert word in text, f"{word!r} missing:\n{text}"
    assert re.search(r"^\s*x\s+float32", text, re.M), text
    assert re.search(r"^\s*y\s+float32", text, re.M), text
    for op, count in (("Conv", 2), ("Relu", 2), ("GlobalAveragePool", 1), ("Flatten", 1)):
        assert re.search(rf"^\s*{op}\s+{count}\s*$", text, re.M), f"histogram line '{op} {count}' missing:\n{text}"


def test_inspect_json(run_cli, small_model):
    proc = run_cli("inspect", small_model, "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert [i["name"] for i in info["inputs"]] == ["x"]
    assert info["inputs"][0]["dtype"] == "float32"
    assert info["inputs"][0]["dims"] == ["N", 3, 8, 8]
    assert [o["name"] for o in info["outputs"]] == ["y"]
    assert info["ops"] == {"Conv": 2, "Relu": 2, "GlobalAveragePool": 1, "Flatten": 1}
    assert info["unsupported_ops"] == [] and info["supported"] is True


def test_bench_json(run_cli, small_model):
    proc = run_cli("bench", small_model, "--batch", 3, "--threads", 1, "--warmup", 1, "--iters", 3, "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    for key in ("median_ms", "p90_ms", "min_ms", "mean_ms", "first_run_ms", "batch", "threads", "images_per_s"):
        assert key in result, f"{key} missing from {result}"
    assert result["batch"] == 3 and result["threads"] == 1
    assert 0 < result["min_ms"] <= result["median_ms"] <= result["p90_ms"]
    assert result["images_per_s"] > 0


def test_bench_with_an_input_file(run_cli, small_model, good_input):
    # The file's [2, 3, 8, 8] sets the batch; a name the model lacks is refused naming its inputs.
    proc = run_cli("bench", small_model, "--input", f"x={good_input}", "--iters", 2, "--warmup", 0, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["batch"] == 2
    proc = run_cli("bench", small_model, "--input", f"image={good_input}", "--iters", 1)
    assert_clean_error(proc, "--input 'image'", "its inputs are 'x'")


def test_bench_gap_idles_before_each_timed_run(run_cli, small_model):
    # --gap-ms: requests after a pause, as a server's arrive. The idle time is not timed; three gaps of 200 ms must
    # at least have elapsed (a lower bound, not a speed claim); refused with --streams, out of range refused.
    start = time.monotonic()
    proc = run_cli("bench", small_model, "--threads", 1, "--warmup", 0, "--iters", 3, "--gap-ms", 200, "--json")
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["gap_ms"] == 200 and elapsed >= 0.6
    assert result["median_ms"] < 200  # the gap is not in the timing
    proc = run_cli("bench", small_model, "--iters", 1, "--gap-ms", 5, "--streams", 2)
    assert_clean_error(proc, "--gap-ms is for latency mode")
    proc = run_cli("bench", small_model, "--iters", 1, "--gap-ms", -1)
    assert proc.returncode in (1, 2) and "--gap-ms" in proc.stderr, proc.stderr


def test_bench_bad_batch(run_cli, small_model):
    proc = run_cli("bench", small_model, "--batch", -2, "--iters", 1)
    assert proc.returncode in (1, 2), f"exit {proc.returncode} (1: error, 2: usage error)\n{proc.stderr}"
    assert proc.stderr.startswith("osprey: error:") and "batch" in proc.stderr, proc.stderr


@pytest.mark.parametrize("subcommand", [None, "run", "inspect", "bench"])
def test_help(run_cli, subcommand):
    args = ["--help"] if subcommand is None else [subcommand, "--help"]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout.lower()
    assert "usage" in text, proc.stdout
    if subcommand is None:
        for sub in ("run", "inspect", "bench"):
            assert sub in text
    elif subcommand == "run":
        assert "--input" in text and "--output-dir" in text and "--random-inputs" in text
    elif subcommand == "bench":
        assert "--batch" in text and "--iters" in text and "--json" in text
    else:
        assert "--json" in text


def test_unknown_subcommand(run_cli):
    proc = run_cli("frobnicate")
    assert proc.returncode == 2, f"exit {proc.returncode}, expected 2 (usage error)\n{proc.stderr}"
    assert proc.stderr.startswith("osprey: error:") and "--help" in proc.stderr, proc.stderr
