"""Recurrent models end to end: torch.nn.LSTM and torch.nn.GRU exported with torch.onnx.export, run by `osprey run`.

Models: two layers, bidirectional, batch_first, seeded random weights, with the batch and sequence dims dynamic (the
exporter computes the initial states from Shape(x), which osprey folds when it compiles). A third model is the LSTM
with its input's batch dim rewritten to dim_value -1, as some exporters write dynamic dims.

Oracle: ONNX Runtime (CPU EP, graph optimisations off) on the same file and inputs; float32 agreement within
rtol 1e-4 + atol 1e-5 (measured max abs error ~1e-6).
"""

import json
import os
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from pytest_support import ort_u8s8_exact  # conftest.py put tests/ on the path

INPUT_SIZE = 12
HIDDEN = 16
TIMEOUT_S = 120
CACHE_VERSION = 1


def _export(module, path, input_names, output_names):
    import torch

    x = torch.randn(2, 5, INPUT_SIZE)
    torch.onnx.export(module, (x,), str(path), opset_version=14, input_names=input_names, output_names=output_names,
                      dynamic_axes={"x": {0: "batch", 1: "seq"}, output_names[0]: {0: "batch", 1: "seq"}})


class _Recurrent:
    """A torch recurrent layer returning all of its outputs, so Y_h / Y_c are checked too."""

    def __new__(cls, kind):
        import torch

        class Wrapper(torch.nn.Module):
            def __init__(self):
                super().__init__()
                layer = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
                self.rnn = layer(INPUT_SIZE, HIDDEN, num_layers=2, bidirectional=True, batch_first=True)

            def forward(self, x):
                y, state = self.rnn(x)
                return (y,) + (tuple(state) if isinstance(state, tuple) else (state,))

        return Wrapper()


@pytest.fixture(scope="module")
def recurrent_models(model_cache):
    """{'lstm': path, 'gru': path}, exported once into the model cache."""
    import torch

    model_cache.mkdir(parents=True, exist_ok=True)
    paths = {}
    for seed, kind in enumerate(("lstm", "gru")):
        path = model_cache / f"recurrent_{kind}_v{CACHE_VERSION}.onnx"
        if not path.exists():
            torch.manual_seed(seed)
            module = _Recurrent(kind).eval()
            outputs = ["y", "h", "c"] if kind == "lstm" else ["y", "h"]
            tmp = path.with_suffix(".tmp.onnx")
            _export(module, tmp, ["x"], outputs)
            tmp.rename(path)
        paths[kind] = path
    return paths


def run_osprey(osprey_bin, model_path, x, work_dir, tag, env=None, extra=()):
    inp = work_dir / f"{tag}.x.npy"
    np.save(inp, x)
    out_dir = work_dir / f"{tag}.out"
    proc = subprocess.run([str(osprey_bin), "run", str(model_path), "--input", f"x={inp}", "--output-dir",
                           str(out_dir), "--threads", "2", *extra], capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    return out_dir


def run_ort(model_path, x):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {"x": x})))


def assert_agrees(osprey_bin, model_path, work_dir, batch, seq, seed, env=None):
    x = np.random.default_rng(seed).standard_normal((batch, seq, INPUT_SIZE)).astype(np.float32)
    expected = run_ort(model_path, x)
    out_dir = run_osprey(osprey_bin, model_path, x, work_dir, f"{model_path.stem}.{batch}x{seq}", env)
    for name, want in expected.items():
        got = np.load(out_dir / f"{name}.npy")
        assert got.shape == want.shape, f"{name}: shape {got.shape}, ONNX Runtime {want.shape}"
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"output {name}")


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("batch,seq", [(1, 7), (3, 4)])
def test_torch_recurrent_agrees_with_onnxruntime(osprey_bin, recurrent_models, work_dir, kind, batch, seq):
    model = onnx.load(str(recurrent_models[kind]))
    ops = {n.op_type for n in model.graph.node}
    assert kind.upper() in ops, f"the export has no {kind.upper()} node: {sorted(ops)}"
    assert_agrees(osprey_bin, recurrent_models[kind], work_dir, batch, seq, seed=batch * 10 + seq)


def test_input_dim_minus_one_is_dynamic(osprey_bin, recurrent_models, work_dir):
    model = onnx.load(str(recurrent_models["lstm"]))
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    dim.Clear()
    dim.dim_value = -1
    path = work_dir / "lstm_minus_one.onnx"
    onnx.save(model, str(path))
    for batch in (1, 4):
        assert_agrees(osprey_bin, path, work_dir, batch, 6, seed=batch)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_single_thread_steps_in_a_two_thread_plan_agree(osprey_bin, recurrent_models, work_dir, kind):
    # OSPREY_STEP_THREADS=1 puts every small compute step (here the recurrent layers and the MatMuls/Gemms around
    # them) on one thread without timing, so the plan switches thread counts between steps; =0 keeps all on two.
    for setting, expect_single in (("1", True), ("0", False)):
        env = {**os.environ, "OSPREY_STEP_THREADS": setting}
        assert_agrees(osprey_bin, recurrent_models[kind], work_dir, 2, 5, seed=3, env=env)
        proc = subprocess.run([str(osprey_bin), "bench", str(recurrent_models[kind]), "--threads", "2", "--dims",
                               "seq=5", "--iters", "2", "--warmup", "0", "--json"], capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=env)
        assert proc.returncode == 0, proc.stderr
        single = json.loads(proc.stdout)["single_thread_steps"]
        assert (single > 0) == expect_single, f"OSPREY_STEP_THREADS={setting}: {single} single-thread steps"


def test_lstm_quantized_by_quantize_dynamic(osprey_bin, recurrent_models, work_dir):
    # ONNX Runtime's quantize_dynamic turns the LSTM into com.microsoft.DynamicQuantizeLSTM (int8 weights, activations
    # quantised on the fly). osprey computes its products as ORT does (int8 weights, X and each step's h quantised to
    # uint8: kernels/recurrent_cell.h), so it must be about as close to the float model as ORT's quantised run is, and
    # much closer to that run: measured (2026-12-04) 6e-8 to 9e-8 from ORT, whose own distance from the float model is
    # 9e-4 to 4e-3 (the float LSTM on the dequantised weights, what osprey ran before, was that far from ORT). Where
    # ORT's uint8 x int8 products saturate (AVX2 without VNNI: pytest_support.ort_u8s8_exact) the close oracle is
    # osprey's reference kernels (exact int32 loops) instead: measured 0.028 from ORT there (2026-12-07, Zen 3).
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = work_dir / "lstm.dynamic.onnx"
    quantize_dynamic(str(recurrent_models["lstm"]), str(quantized), op_types_to_quantize=["LSTM"],
                     weight_type=QuantType.QInt8)
    ops = {(n.domain, n.op_type) for n in onnx.load(str(quantized)).graph.node}
    assert ("com.microsoft", "DynamicQuantizeLSTM") in ops, sorted(ops)
    x = np.random.default_rng(5).standard_normal((2, 6, INPUT_SIZE)).astype(np.float32)
    float_y = run_ort(recurrent_models["lstm"], x)
    session = ort.InferenceSession(str(quantized), providers=["CPUExecutionProvider"])
    ort_q = dict(zip([o.name for o in session.get_outputs()], session.run(None, {"x": x})))
    exact_ort = ort_u8s8_exact()
    close_dir = None if exact_ort else run_osprey(osprey_bin, quantized, x, work_dir, "lstm_reference",
                                                  extra=["--reference"])
    out_dir = run_osprey(osprey_bin, quantized, x, work_dir, "lstm_dynamic")
    for name, want in float_y.items():
        got = np.load(out_dir / f"{name}.npy")
        close = ort_q[name] if exact_ort else np.load(close_dir / f"{name}.npy")
        ort_error = np.abs(ort_q[name] - want).max()
        to_close = np.abs(got - close).max()
        print(f"{name}: osprey {np.abs(got - want).max():.2e} and ORT {ort_error:.2e} from the float model, "
              f"osprey {np.abs(got - ort_q[name]).max():.2e} from ORT, {to_close:.2e} from its close oracle")
        assert ort_error > 0, "the quantised model should differ from the float one"
        assert np.abs(got - want).max() <= 2 * ort_error + 1e-4, f"{name}: osprey {np.abs(got - want).max()}, " \
                                                                f"ONNX Runtime {ort_error} from the float model"
        assert to_close <= 0.05 * ort_error + 1e-5, \
            f"{name}: osprey {to_close} from {'ORT' if exact_ort else 'its reference kernels'}' quantised run"


def test_bad_dynamic_quantize_lstm_is_a_clear_error(osprey_bin, recurrent_models, work_dir):
    # A W_scale of the wrong length, and weights computed at run time: named errors, never a crash.
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = work_dir / "lstm.dynamic.onnx"
    quantize_dynamic(str(recurrent_models["lstm"]), str(quantized), op_types_to_quantize=["LSTM"],
                     weight_type=QuantType.QInt8)
    x = np.ones((1, 3, INPUT_SIZE), np.float32)
    np.save(work_dir / "x.npy", x)
    for case in ("scale_length", "runtime_weights"):
        model = onnx.load(str(quantized))
        node = next(n for n in model.graph.node if n.op_type == "DynamicQuantizeLSTM")
        if case == "scale_length":
            init = next(i for i in model.graph.initializer if i.name == node.input[8])
            init.CopyFrom(onnx.numpy_helper.from_array(np.ones(3, np.float32), init.name))
        else:  # W becomes a graph input: known only when the model runs
            init = next(i for i in model.graph.initializer if i.name == node.input[1])
            np.save(work_dir / "w.npy", onnx.numpy_helper.to_array(init))
            model.graph.input.append(onnx.helper.make_tensor_value_info("w_in", init.data_type, list(init.dims)))
            node.input[1] = "w_in"
        path = work_dir / f"{case}.onnx"
        onnx.save(model, str(path))
        inputs = ["--input", f"x={work_dir / 'x.npy'}"]
        if case == "runtime_weights":
            inputs += ["--input", f"w_in={work_dir / 'w.npy'}"]
        proc = subprocess.run([str(osprey_bin), "run", str(path), *inputs, "--output-dir", str(work_dir / case)],
                              capture_output=True, text=True, timeout=TIMEOUT_S)
        assert proc.returncode == 1, proc.stderr
        want = "W's scale must be float32" if case == "scale_length" else "W must be a constant"
        assert want in proc.stderr, proc.stderr
