"""osprey.Model from Python: agreement with ONNX Runtime, zero-copy in and out, threads, errors."""
import os
import subprocess
import sys
import threading

import numpy as np
import onnxruntime as ort
import pytest

import onnx_models
import osprey

ZOO = ["mobilenet_v2", "squeezenet1_0", "shufflenet_v2_x1_0"]


def ort_run(model_path, feeds):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


@pytest.mark.parametrize("name", ZOO)
def test_zoo_matches_onnxruntime(name, ensure_model):
    paths = ensure_model(name)
    x = np.load(paths["input1"])
    model = osprey.Model(paths["onnx"], threads=2)
    feeds = {model.inputs[0].name: x}
    ours = model.run(feeds)
    ref = ort_run(paths["onnx"], feeds)
    assert list(ours) == list(ref)
    for key in ref:
        assert ours[key].dtype == ref[key].dtype and ours[key].shape == ref[key].shape
        scale = float(np.abs(ref[key]).max())
        np.testing.assert_allclose(ours[key], ref[key], atol=1e-3 * scale + 1e-4, rtol=0)
    # Positional and keyword forms give the same result.
    np.testing.assert_array_equal(model.run(x)[key], ours[key])
    np.testing.assert_array_equal(model(**feeds)[key], ours[key])


def test_metadata_and_inspect(ensure_model):
    paths = ensure_model("mobilenet_v2")
    model = osprey.load_onnx(paths["onnx"])
    (inp,) = model.inputs
    assert inp.dtype == "float32" and inp.shape[1:] == (3, 224, 224) and isinstance(inp.shape[0], str)
    assert model.outputs[0].dtype == "float32"
    text = model.inspect()
    assert "Conv" in text and inp.name in text
    before = model.memory()
    assert before["device_bytes"] == 0 and before["weight_bytes"] > 3_000_000  # MobileNetV2: 3.5M parameters
    model.run({inp.name: np.zeros((1, 3, 224, 224), np.float32)})
    after = model.memory()
    assert after["device_bytes"] == 0 and after["weight_bytes"] == before["weight_bytes"]  # a CPU model: no GPU bytes


def test_several_inputs_dtypes_and_bytes_source():
    model = osprey.Model(onnx_models.two_inputs())
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
    out = model.run(a, b)
    np.testing.assert_array_equal(out["s"], a + b)
    np.testing.assert_array_equal(out["p"], a * b)
    assert model.run([a, b])["s"].tolist() == out["s"].tolist()
    assert model.run({"a": a, "b": b})["p"].tolist() == out["p"].tolist()
    # Non-contiguous and list inputs are converted once.
    big = np.zeros((2, 6), dtype=np.float32)
    big[:, ::2] = a
    np.testing.assert_array_equal(model.run(big[:, ::2], b.tolist())["s"], a + b)
    # A list takes the input's dtype (float32 here, where NumPy alone would make float64), as ONNX Runtime converts
    # lists; an array of another dtype is refused, naming it.
    np.testing.assert_array_equal(model.run({"a": a.tolist(), "b": b})["p"], a * b)
    with pytest.raises(osprey.InvalidArgument, match="float64 arrays are not supported"):
        model.run({"a": a.astype(np.float64), "b": b})


def test_input_read_in_place():
    """A contiguous float32 input is read where it is: osprey's allocator sees the output, not a copy of the input."""
    model = osprey.Model(onnx_models.add_one())
    x = np.ones((1 << 20, 4), dtype=np.float32)  # 16 MiB
    model.run(x[:2])  # compile first
    osprey._osprey.reset_peak()
    base = osprey._osprey.host_bytes_live()
    y = model.run(x)["y"]
    grown = osprey._osprey.host_bytes_peak() - base
    assert y[0, 0] == 2.0
    assert x.nbytes <= grown < 2 * x.nbytes, f"osprey allocated {grown} bytes for a {x.nbytes}-byte input"


def test_output_owns_osprey_buffer():
    model = osprey.Model(onnx_models.add_one())
    y = model.run(np.zeros((1000, 4), dtype=np.float32))["y"]
    assert not y.flags.owndata and y.base is not None  # memory belongs to the osprey buffer the base holds
    assert y.ctypes.data % 64 == 0  # osprey's 64-byte aligned allocation, not a NumPy copy
    assert y.flags.writeable and y.flags.c_contiguous
    live = osprey._osprey.host_bytes_live()
    del y
    assert osprey._osprey.host_bytes_live() <= live - 16000  # dropping the array frees osprey's buffer


def test_outputs_never_alias_model_state():
    """A constant or an input passed straight through comes back as a copy: writing to it changes nothing."""
    model = osprey.Model(onnx_models.constant_output())
    out = model.run(np.ones(3, dtype=np.float32))
    out["c"][:] = 0
    assert model.run(np.ones(3, dtype=np.float32))["c"].tolist() == [7, 8, 9]
    ident = osprey.Model(onnx_models.identity())
    x = np.ones((2, 2), dtype=np.float32)
    y = ident.run(x)["y"]
    y[0, 0] = 5
    assert x[0, 0] == 1


def test_eight_threads_on_one_model(ensure_model):
    paths = ensure_model("squeezenet1_0")
    model = osprey.Model(paths["onnx"], threads=1)
    name = model.inputs[0].name
    rng = np.random.default_rng(1)
    shape = [d if isinstance(d, int) else 1 for d in model.inputs[0].shape]
    inputs = [rng.random(shape, dtype=np.float32) for _ in range(8)]
    expected = [model.run({name: v}) for v in inputs]
    errors = []

    def worker(i):
        try:
            for _ in range(5):
                got = model.run({name: inputs[i]})
                for k in got:
                    np.testing.assert_array_equal(got[k], expected[i][k])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors


def test_errors_are_typed_with_cli_messages(tmp_path, run_cli):
    with pytest.raises(osprey.NotFound) as e:
        osprey.Model(tmp_path / "missing.onnx")
    assert isinstance(e.value, FileNotFoundError) and isinstance(e.value, osprey.Error)
    cli = run_cli("inspect", tmp_path / "missing.onnx")
    assert str(e.value) in cli.stderr

    model = osprey.Model(onnx_models.two_inputs())
    with pytest.raises(osprey.InvalidArgument, match="b") as e:
        model.run({"a": np.zeros((2, 3), np.float32)})
    assert isinstance(e.value, ValueError)
    with pytest.raises(osprey.InvalidArgument, match="shape|dim"):
        model.run(np.zeros((3, 3), np.float32), np.zeros((2, 3), np.int64))
    with pytest.raises(osprey.InvalidArgument, match="dtype|float"):
        model.run(np.zeros((2, 3), np.float64).astype(np.complex64), np.zeros((2, 3), np.int64))
    with pytest.raises(osprey.InvalidArgument):
        osprey.Model(b"not an onnx model")
    with pytest.raises(osprey.Unsupported, match="cpu"):
        osprey.Model(onnx_models.add_one(), device="cuda")
    with pytest.raises(osprey.InvalidArgument, match="auto"):  # the message lists the choices
        osprey.Model(onnx_models.add_one(), precision="fp8")
    # "auto" is accepted on every CPU (bf16 only where the CPU has it and it measures faster; nothing to choose here).
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    np.testing.assert_array_equal(osprey.Model(onnx_models.add_one(), precision="auto").run(x)["y"], x + 1)


def test_python_m_osprey(ensure_model):
    import subprocess
    import sys
    env = dict(**__import__("os").environ, PYTHONPATH=str(osprey.__file__).rsplit("/osprey/", 1)[0])
    proc = subprocess.run([sys.executable, "-m", "osprey", "--version"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("osprey "), proc.stderr
    proc = subprocess.run([sys.executable, "-m", "osprey", "inspect", str(ensure_model("mobilenet_v2")["onnx"])],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "Conv" in proc.stdout, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "osprey", "run"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2 and "required" in proc.stderr.lower()


DELETE_SCRIPT = """
import gc, sys
import numpy as np
import onnx
from onnx import TensorProto, helper
import osprey

def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

rng = np.random.default_rng(0)
w = rng.standard_normal((64, 65536)).astype(np.float32)  # 16 MiB of weights
k = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
graph = helper.make_graph(
    [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
     helper.make_node("GlobalAveragePool", ["r"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
     helper.make_node("MatMul", ["f", "w"], ["y"])], "big",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64, "h", "w"])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 65536])],
    [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()), helper.make_tensor("k", TensorProto.FLOAT, k.shape, k.ravel())])
data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
x = rng.standard_normal((8, 64, 128, 128)).astype(np.float32)  # 32 MiB: the run's intermediates are as large
warm = osprey.Model(data, threads=1)  # the same layers once at a small size: the code paged in before the measure
warm.run(x[:1, :, :16, :16].copy())
del warm
gc.collect()
before = rss_mib()
model = osprey.Model(data, threads=1)
y = model.run(x)["y"]
loaded = rss_mib()
del model, y
gc.collect()
print(before, loaded, rss_mib())
"""


def test_deleting_a_model_gives_its_memory_back():
    """`del model` frees the model's weights and plans and then, for a model of some size, the process's idle execution
    arenas and the heap's free pages (as the server does at unload): before, a 32 MiB run's arena stayed pooled for the
    life of the interpreter. Measured by the kernel's count of resident pages, in a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    proc = subprocess.run([sys.executable, "-c", DELETE_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    before, loaded, after = map(float, proc.stdout.split())
    assert loaded - before > 60, (before, loaded, after)  # weights, arena and output resident while loaded
    assert after - before < 8, (before, loaded, after)


EXIT_SCRIPT = """
import threading
import numpy as np
import onnx
from onnx import TensorProto, helper
import osprey

k = np.random.default_rng(0).standard_normal((64, 64, 3, 3)).astype(np.float32)
graph = helper.make_graph([helper.make_node("Conv", ["x", "k"], ["y"], pads=[1, 1, 1, 1])], "conv",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 96, 96])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 96, 96])],
                          [helper.make_tensor("k", TensorProto.FLOAT, k.shape, k.ravel())])
model = osprey.Model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
x = np.ones((1, 64, 96, 96), np.float32)
started = threading.Barrier(5)

def serve():
    started.wait()
    while True:
        model.run(x)

for _ in range(4):
    threading.Thread(target=serve, daemon=True).start()
started.wait()
model.run(x)
print("done")
"""


def test_program_exits_cleanly_while_daemon_threads_run_a_model():
    """A program that ends while daemon threads are inside `run` (a web app's workers) exits with status 0. CPython
    ends such a thread with pthread_exit when it takes the GIL back during exit, and the unwinding through osprey's
    GIL guard aborted the process ("terminate called without an active exception", status 134, every time here)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout.strip() == "done", (proc.returncode, proc.stderr[-2000:])
        assert "leaked" not in proc.stderr, proc.stderr[-2000:]
