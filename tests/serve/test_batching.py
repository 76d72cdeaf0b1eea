"""Dynamic batching, streams and the per-model queue limit of `osprey serve`.

Oracles: ONNX Runtime on each request's own input (every request must get exactly its own rows back), the request
count (batches must be fewer than requests), and the protocol's 503 + Retry-After for a full queue."""

import json
import re
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest


RNG = np.random.default_rng(11)


def make_repository(root, demo_model, models):
    """models: {name: batching dict or None}; each a copy of the demo model with that batching config."""
    base_config = json.loads((demo_model / "1" / "config.json").read_text())
    for name, batching in models.items():
        version = root / name / "1"
        version.mkdir(parents=True)
        shutil.copy(demo_model / "1" / "model.onnx", version / "model.onnx")
        config = dict(base_config)
        if batching is not None:
            config["batching"] = batching
        (version / "config.json").write_text(json.dumps(config))
    return root


def infer_body(x):
    return {"inputs": [{"name": "image", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}


def metric_samples(text, name, model):
    """{suffix (bucket le / sum / count): value} of one histogram for one model."""
    out = {}
    for line in text.splitlines():
        m = re.match(rf'{name}_(bucket|sum|count)\{{model="{model}"(?:,le="([^"]+)")?\}} (\S+)$', line)
        if m:
            out[m.group(2) if m.group(1) == "bucket" else m.group(1)] = float(m.group(3))
    return out


def test_config_rejects_bad_batching(tmp_path, demo_model, osprey_bin):
    import subprocess

    root = make_repository(tmp_path / "repo", demo_model, {"bad": {"max_batch_size": -1}})
    r = subprocess.run([str(osprey_bin), "inspect", str(root / "bad")], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "batching.max_batch_size" in (r.stdout + r.stderr)


@pytest.mark.parametrize("streams", [1, 2])
def test_concurrent_requests_get_their_own_rows(tmp_path, demo_model, start_repo, streams):
    root = make_repository(tmp_path / "repo", demo_model,
                           {"digits": {"max_batch_size": 8, "max_queue_delay_us": 20000}})
    server = start_repo(root, "--http-threads", 32, "--streams", streams)
    session = ort.InferenceSession(str(demo_model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    sizes = [1 if i % 2 == 0 else 3 for i in range(32)]
    inputs = [RNG.standard_normal((n, 1, 32, 32)).astype(np.float32) for n in sizes]
    # Warm up (model load, plan compile) so the burst below really arrives together.
    assert server.request("POST", "/v2/models/digits/infer", infer_body(inputs[0]))[0] == 200
    before = metric_samples(server.request("GET", "/metrics")[2].decode(), "osprey_batch_size", "digits")

    barrier = threading.Barrier(len(inputs))

    def send(x):
        barrier.wait()
        return server.json("POST", "/v2/models/digits/infer", infer_body(x))

    with ThreadPoolExecutor(len(inputs)) as pool:
        answers = list(pool.map(send, inputs))
    for x, (status, body) in zip(inputs, answers):
        assert status == 200, body
        (out,) = body["outputs"]
        assert out["name"] == "logits" and out["shape"] == [x.shape[0], 10]
        got = np.array(out["data"], dtype=np.float32).reshape(out["shape"])
        expected = session.run(None, {"image": x})[0]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)

    metrics = server.request("GET", "/metrics")[2].decode()
    after = metric_samples(metrics, "osprey_batch_size", "digits")
    runs = after["count"] - before["count"]
    rows = after["sum"] - before["sum"]
    assert rows == sum(sizes)
    assert runs < len(inputs), f"no batches formed: {runs} runs for {len(inputs)} requests"
    assert after["8"] - after["4"] > before["8"] - before["4"], "no batch of 5..8 rows"  # more than one request each
    assert after["+Inf"] == after["8"], "a batch exceeded max_batch_size"
    for name in ("osprey_queue_duration_us", "osprey_compute_duration_us"):
        assert metric_samples(metrics, name, "digits")["count"] >= len(inputs) + 1, name
    assert server.terminate() == 0  # the executors stop with the server


def binary_request(x):
    """(body, headers) of a KServe binary-tensor request: a JSON header, then the raw float32 bytes (cheap to parse)."""
    header = json.dumps({"inputs": [{"name": "image", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def burst(server, model, x, n):
    barrier = threading.Barrier(n)
    # Binary bodies: parsing them is negligible next to the model run, so on a busy machine the requests still pile up
    # in the queue instead of being serialised by JSON parsing.
    body, headers = binary_request(x)

    def send(_):
        barrier.wait()
        return server.request("POST", f"/v2/models/{model}/infer", body, headers)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(send, range(n)))


@pytest.mark.parametrize("model", ["slow", "direct"])
def test_full_queue_answers_503_with_retry_after(tmp_path, demo_model, start_repo, model):
    # "slow": each batch waits 300 ms for companions that cannot join it (3 + 3 rows > 4), so the queue stays full.
    # "direct": no batching, one stream, large inputs: one runs, one waits, the rest find the queue full.
    root = make_repository(tmp_path / "repo", demo_model,
                           {"slow": {"max_batch_size": 4, "max_queue_delay_us": 300000}, "direct": None})
    server = start_repo(root, "--max-queue", 1, "--streams", 1, "--http-threads", 16, "--max-batch-size", 0)
    x = RNG.standard_normal((3 if model == "slow" else 1024, 1, 32, 32)).astype(np.float32)
    assert server.request("POST", f"/v2/models/{model}/infer", infer_body(x))[0] == 200
    for attempt in range(3):  # a burst is timing: on a loaded machine retry before calling it a failure
        answers = burst(server, model, x, 12)
        statuses = [status for status, _, _ in answers]
        if 503 in statuses:
            break
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(503) >= 1 and statuses.count(200) >= 1, statuses
    for status, headers, body in answers:
        if status == 503:
            assert headers.get("retry-after") == "1"
            # Either the model's queue (--max-queue) or the workers' queue (--workers + --max-queue) was full.
            error = json.loads(body)["error"]
            assert "queue is full" in error or "waiting for a worker" in error, error
    # The server still answers normally afterwards.
    assert server.request("POST", f"/v2/models/{model}/infer", infer_body(x))[0] == 200


def test_streams_run_requests_concurrently(tmp_path, demo_model, start_repo):
    root = make_repository(tmp_path / "repo", demo_model, {"digits": None})
    server = start_repo(root, "--streams", 2, "--max-queue", 64, "--http-threads", 8)
    session = ort.InferenceSession(str(demo_model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = [RNG.standard_normal((2, 1, 32, 32)).astype(np.float32) for _ in range(8)]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda x: server.json("POST", "/v2/models/digits/infer", infer_body(x)), inputs))
    for x, (status, body) in zip(inputs, answers):
        assert status == 200, body
        got = np.array(body["outputs"][0]["data"], dtype=np.float32).reshape(2, 10)
        np.testing.assert_allclose(got, session.run(None, {"image": x})[0], rtol=1e-4, atol=1e-4)
