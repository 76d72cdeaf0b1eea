"""Models from another exporter: the ONNX model zoo's Caffe2-era classifiers (opset 9) against ONNX Runtime.

The onnx package ships "light" copies of them (onnx/backend/test/data/light: DenseNet-121, Inception v1 and v2,
ResNet-50, ShuffleNet, SqueezeNet) whose weights were replaced by ConstantOfShape nodes; with constant weights every
output is the same, so this test gives each weight seeded random values instead (He-scaled; BatchNormalization
scales and variances in [0.5, 1.5]) and compares the logits (the final Softmax dropped: random weights saturate it).
These graphs are written as Caffe2 wrote them, not as torch.onnx or tf2onnx do: LRN, Sum of two inputs for the
residuals, Dropout, BatchNormalization with Unsqueezed parameters, Reshape to [1, -1] before Gemm, initializers also
listed as graph inputs. AlexNet, VGG-19 and ZFNet-512 are left out: their fully connected weights alone are 250-550
MB per model.

Oracle: ONNX Runtime with graph optimisations disabled (test_architectures.py says why), same input. Tolerance as in
test_architectures.py: max |osprey - ORT| <= 2e-4 * max |ORT| + 1e-5, and the same top-5 classes. Measured: at most
7.4e-7 relative on these six.
"""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

LIGHT_DIR = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = ["densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet", "squeezenet"]
REL_TOL = 2e-4
ABS_TOL = 1e-5


def with_random_weights(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """The model with each ConstantOfShape weight replaced by a seeded random initializer, and the logits as output."""
    rng = np.random.default_rng(seed)
    constants = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    positive = {n.input[i] for n in model.graph.node if n.op_type == "BatchNormalization" for i in (1, 4)}
    if model.graph.node[-1].op_type == "Softmax":
        model.graph.output[0].name = model.graph.node[-1].input[0]
        model.graph.node.pop()
    kept = []
    for node in model.graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in constants:
            kept.append(node)
            continue
        shape = [int(d) for d in constants[node.input[0]]]
        if node.output[0] in positive:
            value = rng.uniform(0.5, 1.5, shape)
        elif len(shape) == 1:
            value = rng.standard_normal(shape) * 0.1
        else:
            value = rng.standard_normal(shape) * np.sqrt(2.0 / np.prod(shape[1:]))
        model.graph.initializer.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return model


@pytest.mark.parametrize("name", MODELS)
def test_caffe2_export_matches_onnxruntime(name, run_cli, work_dir):
    source = LIGHT_DIR / f"light_{name}.onnx"
    if not source.exists():
        pytest.skip(f"{source} is not in this onnx package")
    model = with_random_weights(onnx.load(str(source)), seed=0)
    initializers = {i.name for i in model.graph.initializer}
    (graph_input,) = [i for i in model.graph.input if i.name not in initializers]
    shape = [d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    model_path, input_path, out_dir = work_dir / f"{name}.onnx", work_dir / "x.npy", work_dir / "out"
    onnx.save(model, str(model_path))
    np.save(input_path, x)
    out_dir.mkdir()

    proc = run_cli("run", model_path, "--input", f"{graph_input.name}={input_path}", "--output-dir", out_dir,
                   "--threads", 2, timeout=300)
    assert proc.returncode == 0, f"osprey run failed (exit {proc.returncode}):\n{proc.stderr}"
    (produced,) = sorted(out_dir.glob("*.npy"))
    ours = np.load(produced)

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3  # the light models list unused initializers
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    ref = session.run(None, {graph_input.name: x})[0]

    assert ours.shape == ref.shape and ours.dtype == np.float32, f"got {ours.dtype}{ours.shape}, want {ref.shape}"
    scale = float(np.abs(ref).max())
    err = float(np.abs(ours.astype(np.float64) - ref).max())
    assert err <= REL_TOL * scale + ABS_TOL, f"{name}: max |osprey - ORT| {err:.3e}, max |ORT| {scale:.3g}"
    top5 = lambda v: list(np.argsort(-v.reshape(v.shape[0], -1), axis=1, kind="stable")[0, :5])  # noqa: E731
    assert top5(ours) == top5(ref)
