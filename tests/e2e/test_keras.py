"""Keras applications exported with tf2onnx (tools/export_keras.py) end to end: `osprey run` against ONNX Runtime.

The export set needs TensorFlow (`.venv-tf`, see tools/export_keras.py), which `make test` does not install: models
missing from the cache (~/.cache/osprey/keras) are skipped. These graphs carry what the torchvision exports do not:
NHWC inputs, Transposes around convolutions (MobileNetV3: 106 of them, tf2onnx's transpose optimiser fails on it),
explicit Pads, batch normalisation as Mul/Add after depthwise convolutions, ReLU6 as Clip, hard-swish as
Add/Clip/Mul, Sigmoid gates. Oracle and tolerance as in test_architectures.py (ORT with optimisations disabled;
max |osprey - ORT| <= 2e-4 * max |ORT| + 1e-5 and the same top-5 per image).
"""

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import export_keras  # noqa: E402  (imports TensorFlow only when exporting)

REL_TOL = 2e-4
ABS_TOL = 1e-5
CASES = [(m, o, b) for m in export_keras.DEFAULT_MODELS for o in (13, 17) for b in (1, 2)
         if not (o == 17 and b == 2)]


@pytest.mark.parametrize("name,opset,batch", CASES, ids=[f"{n}-opset{o}-b{b}" for n, o, b in CASES])
def test_keras_matches_onnxruntime(name, opset, batch, run_cli, work_dir):
    model = export_keras.model_path(export_keras.default_dir(), name, opset)
    if not model.exists():
        pytest.skip(f"{model} not exported (.venv-tf/bin/python tools/export_keras.py)")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    size = export_keras.MODELS[name][1]
    x = np.random.default_rng(batch).uniform(0, 255, (batch, size, size, 3)).astype(np.float32)
    np.save(work_dir / "x.npy", x)
    out_dir = work_dir / "out"
    out_dir.mkdir()
    proc = run_cli("run", model, "--input", f"{input_name}={work_dir / 'x.npy'}", "--output-dir", out_dir,
                   "--threads", 2, timeout=300)
    assert proc.returncode == 0, f"osprey run failed (exit {proc.returncode}):\n{proc.stderr}"
    written = sorted(out_dir.glob("*.npy"))  # one output; its file name is the sanitised output name
    assert len(written) == 1, written
    ours = np.load(written[0])
    ref = session.run(None, {input_name: x})[0]
    assert ours.shape == ref.shape and np.isfinite(ours).all()
    err = float(np.abs(ours.astype(np.float64) - ref).max())
    bound = REL_TOL * float(np.abs(ref).max()) + ABS_TOL
    assert err <= bound, f"{name} opset {opset} batch {batch}: max |osprey - ORT| = {err:.3e} > {bound:.3e}"
    top5_ours = np.argsort(-ours, axis=1, kind="stable")[:, :5]
    top5_ref = np.argsort(-ref, axis=1, kind="stable")[:, :5]
    assert (top5_ours == top5_ref).all(), f"{name}: top-5 differs"
