"""`osprey serve --precision`: the default precision of models whose config.json does not name one.

Oracle: numpy (float64) of the weights written into each model. Two models with the same weights, one with
config.json "precision": "fp32", served with `--precision bf16` and OSPREY_TUNE=0 (bf16 wherever oneDNN has it, not
chosen by timing, so the test does not depend on which form is faster here): the model without a precision runs its
MatMuls in bf16 (within bf16's rounding of the oracle and visibly off fp32), the other in fp32 (within fp32 rounding).
On a CPU without AVX512_BF16 `--precision bf16` cannot compile the first model (its load fails, naming the CPU), and
`--precision auto` serves both in fp32."""

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from test_memory import infer


def write_model(repo: Path, name: str, config: str = None):
    rng = np.random.default_rng(7)
    w1 = rng.standard_normal((256, 128)).astype(np.float32) / 16
    w2 = rng.standard_normal((128, 10)).astype(np.float32) / 11
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("MatMul", ["h", "W2"], ["y"])]
    graph = helper.make_graph(nodes, name, [x], [y], [numpy_helper.from_array(w1, "W1"),
                                                      numpy_helper.from_array(w2, "W2")])
    d = repo / name / "1"
    d.mkdir(parents=True)
    (d / "model.onnx").write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
                                   .SerializeToString())
    if config is not None:
        (d / "config.json").write_text(config)
    return w1.astype(np.float64), w2.astype(np.float64)


def cpu_has_bf16() -> bool:
    return "avx512_bf16" in Path("/proc/cpuinfo").read_text()


def test_server_precision_default_and_config_override(start_repo, tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    w1, w2 = write_model(repo, "default")
    write_model(repo, "pinned", '{"precision": "fp32"}')
    x = np.random.default_rng(3).standard_normal((4, 256)).astype(np.float32)
    want = x.astype(np.float64) @ w1 @ w2
    scale = np.abs(want).max()
    if not cpu_has_bf16():
        server = start_repo(repo, "--precision", "bf16")
        status, body = infer(server, "default", x)
        assert status != 200 and "AVX512_BF16" in str(body), (status, body)
        server = start_repo(repo, "--precision", "auto")
        for model in ("default", "pinned"):
            status, y = infer(server, model, x)
            assert status == 200, y
            np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * scale)
        return
    monkeypatch.setenv("OSPREY_TUNE", "0")
    server = start_repo(repo, "--precision", "bf16")
    status, pinned = infer(server, "pinned", x)
    assert status == 200, pinned
    np.testing.assert_allclose(pinned, want, rtol=1e-4, atol=1e-4 * scale)
    status, default = infer(server, "default", x)
    assert status == 200, default
    error = np.abs(default - want).max() / scale
    assert 1e-5 < error < 2e-2, error  # bf16 really ran, and only bf16's rounding


def test_tensor_model_config_json(start_repo, tmp_path):
    """A tensor model's config.json may set serving fields only (here "precision"); one that describes image
    preprocessing, or names a bad precision, fails to load with the file named."""
    repo = tmp_path / "repo"
    w1, w2 = write_model(repo, "plain", '{"precision": "auto", "description": "a tensor model"}')
    write_model(repo, "image_config", '{"preprocess": {"height": 224, "width": 224}}')
    write_model(repo, "bad_precision", '{"precision": "int4"}')
    server = start_repo(repo)
    x = np.random.default_rng(5).standard_normal((2, 256)).astype(np.float32)
    status, y = infer(server, "plain", x)
    assert status == 200, y
    want = x.astype(np.float64) @ w1 @ w2
    np.testing.assert_allclose(y, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())  # auto: bf16's rounding at most
    for model, words in (("image_config", ["config.json", "rank 4"]), ("bad_precision", ["config.json", "precision"])):
        status, body = infer(server, model, x)
        assert status != 200 and all(w in str(body) for w in words), (model, status, body)
