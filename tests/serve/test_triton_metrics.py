"""Triton's Prometheus metric families (nv_inference_*, nv_cpu_*) in /metrics and on --metrics-port, so the Grafana
dashboards, alerts and autoscalers written against Triton read osprey unchanged.

Oracles: Prometheus' own parser (prometheus_client) for the format and types, hand-counted requests and rows, the
statistics extension (/v2/models/{m}/stats, tested against hand counts in test_triton.py) for the durations, and
/proc/meminfo for the memory figures."""

import json
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from test_deadlines import LONG, body as spin_body, spin_model

RNG = np.random.default_rng(31)
COUNTERS = ["nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
            "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
            "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
            "nv_inference_compute_output_duration_us"]


def scrape(server, port=None):
    """{family name: (type, {(model, version): value})} plus unlabelled samples under key None."""
    if port is None:
        status, _, data = server.request("GET", "/metrics")
    else:
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        status, data = r.status, r.read()
        conn.close()
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(data.decode()):
        if not family.name.startswith("nv_"):
            continue
        values = {}
        for sample in family.samples:
            key = (sample.labels["model"], sample.labels["version"]) if "model" in sample.labels else None
            values[key] = sample.value
        out[family.name] = (family.type, values)
    return out


def infer_body(x):
    return {"inputs": [{"name": "image", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}


@pytest.fixture
def metrics_server(tmp_path, demo_model, start_repo):
    repo = tmp_path / "repo"
    for name, batching in [("digits", None), ("digits_b", {"max_batch_size": 8, "max_queue_delay_us": 50000})]:
        d = repo / name / "1"
        d.mkdir(parents=True)
        shutil.copy(demo_model / "1" / "model.onnx", d / "model.onnx")
        config = json.loads((demo_model / "1" / "config.json").read_text())
        if batching:
            config["batching"] = batching
        (d / "config.json").write_text(json.dumps(config))
    server = start_repo(repo, "--metrics-port", 0, "--http-threads", 16)
    server.metrics_port = int(re.search(r"metrics on 127\.0\.0\.1:(\d+)", server.output()).group(1))
    return server


def test_triton_families_count_what_was_asked(metrics_server):
    server = metrics_server
    for _ in range(3):
        x = RNG.standard_normal((2, 1, 32, 32)).astype(np.float32)
        assert server.json("POST", "/v2/models/digits/infer", infer_body(x))[0] == 200
    bad = np.zeros((1, 3, 32, 32), np.float32)  # 3 channels where the model takes 1
    assert server.json("POST", "/v2/models/digits/infer", infer_body(bad))[0] == 400
    # Eight batch-1 requests at once to the batched copy: fewer executions than requests.
    barrier = threading.Barrier(8)

    def send(_):
        barrier.wait()
        x = RNG.standard_normal((1, 1, 32, 32)).astype(np.float32)
        return server.json("POST", "/v2/models/digits_b/infer", infer_body(x))[0]

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(send, range(8))) == [200] * 8

    metrics = scrape(server)
    for name in COUNTERS:
        assert metrics[name][0] == "counter", name
    assert metrics["nv_inference_pending_request_count"][0] == "gauge"

    def value(name, model):
        return metrics[name][1][(model, "1")]

    assert value("nv_inference_request_success", "digits") == 3
    assert value("nv_inference_request_failure", "digits") == 1
    assert value("nv_inference_count", "digits") == 6
    assert value("nv_inference_exec_count", "digits") == 3
    assert value("nv_inference_request_success", "digits_b") == 8
    assert value("nv_inference_count", "digits_b") == 8
    assert 1 <= value("nv_inference_exec_count", "digits_b") < 8
    for model in ("digits", "digits_b"):
        assert value("nv_inference_pending_request_count", model) == 0
        stats = server.json("GET", f"/v2/models/{model}/stats")[1]["model_stats"][0]
        assert value("nv_inference_exec_count", model) == stats["execution_count"]
        assert value("nv_inference_count", model) == stats["inference_count"]
        inference = stats["inference_stats"]
        for name, key in [("nv_inference_request_duration_us", "success"), ("nv_inference_queue_duration_us", "queue"),
                          ("nv_inference_compute_infer_duration_us", "compute_infer")]:
            assert value(name, model) == pytest.approx(inference[key]["ns"] / 1000, abs=1.0), (name, model)
        assert value("nv_inference_compute_infer_duration_us", model) > 0
        assert value("nv_inference_request_duration_us", model) >= value("nv_inference_compute_infer_duration_us",
                                                                          model)

    # CPU families: the machine's memory as /proc/meminfo has it, a utilisation share.
    meminfo = dict(re.findall(r"^(\w+):\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M))
    assert metrics["nv_cpu_memory_total_bytes"][1][None] == int(meminfo["MemTotal"]) * 1024
    assert 0 < metrics["nv_cpu_memory_used_bytes"][1][None] < metrics["nv_cpu_memory_total_bytes"][1][None]
    assert 0.0 <= metrics["nv_cpu_utilization"][1][None] <= 1.0

    # --metrics-port: the same families, and nothing but /metrics.
    on_port = scrape(server, server.metrics_port)
    assert on_port["nv_inference_count"][1][("digits", "1")] == 6
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=30)
    conn.request("GET", "/v2/health/ready")
    r = conn.getresponse()
    assert r.status == 404 and "--metrics-port" in r.read().decode()
    conn.close()


def test_pending_requests_are_a_gauge(tmp_path, start_repo):
    """Two requests waiting behind a long run read 2, and 0 once they ran."""
    version = tmp_path / "repo" / "spin" / "1"
    version.mkdir(parents=True)
    onnx.save(spin_model(), str(version / "model.onnx"))
    server = start_repo(tmp_path / "repo", "--streams", 1, "--http-threads", 8)
    x = np.ones((1, 64), np.float32)
    assert server.json("POST", "/v2/models/spin/infer", spin_body(x, [1]))[0] == 200
    answers = []

    def send(steps, timeout_us):
        answers.append(server.json("POST", "/v2/models/spin/infer", spin_body(x, steps, timeout_us))[0])

    threads = [threading.Thread(target=send, args=([LONG], 3_000_000))]
    threads[0].start()
    time.sleep(0.5)  # the long run holds the stream
    threads += [threading.Thread(target=send, args=([1], 20_000_000)) for _ in range(2)]
    for t in threads[1:]:
        t.start()
    deadline = time.monotonic() + 2.0
    pending = 0
    while time.monotonic() < deadline and pending < 2:
        pending = scrape(server)["nv_inference_pending_request_count"][1][("spin", "1")]
        time.sleep(0.05)
    assert pending == 2
    for t in threads:
        t.join()
    assert sorted(answers) == [200, 200, 504]  # the long one stopped at its deadline, then both ran
    metrics = scrape(server)
    assert metrics["nv_inference_pending_request_count"][1][("spin", "1")] == 0
    assert metrics["nv_inference_request_failure"][1][("spin", "1")] == 1
