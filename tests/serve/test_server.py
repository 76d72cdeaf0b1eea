"""`osprey serve` over HTTP: KServe v2 REST through tritonclient and raw requests, classify, limits, metrics, stop.

Oracles: `osprey run` on the same .npy (infer), `osprey classify --json` and the sample's file name (classify), and
the protocol documents for status codes and bodies."""

import http.client
import json
import re
import shutil
import signal
import socket
import subprocess
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from serve_support import MAX_BODY

RNG = np.random.default_rng(7)


def osprey_run(osprey_bin, demo_model, x, tmp_path):
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "out"
    subprocess.run([str(osprey_bin), "run", str(demo_model / "1" / "model.onnx"), "-i", f"image={tmp_path / 'x.npy'}",
                    "-o", str(out), "--threads", "1"], check=True, capture_output=True, timeout=120)
    return np.load(out / "logits.npy")


def test_health_and_server_metadata(server):
    assert server.json("GET", "/v2/health/live") == (200, {"live": True})
    assert server.json("GET", "/v2/health/ready") == (200, {"ready": True})
    status, meta = server.json("GET", "/v2")
    assert status == 200 and meta["name"] == "osprey"
    assert "binary_tensor_data" in meta["extensions"] and "model_repository" in meta["extensions"]


def test_start_line_has_url_and_curl_example(server):
    line = next(l for l in server.output().splitlines() if "listening on" in l)
    assert server.url in line and "curl" in line and "/v2/models/digits/classify" in line


def test_model_metadata(triton, server):
    meta = triton.get_model_metadata("digits")
    assert meta["name"] == "digits" and meta["platform"] == "onnx" and meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 1, 32, 32]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    assert server.json("GET", "/v2/models/digits/versions/1")[1]["name"] == "digits"
    assert server.request("GET", "/v2/models/digits/versions/7")[0] == 404


@pytest.mark.parametrize("binary", [False, True])
def test_infer_matches_osprey_run(triton, osprey_bin, demo_model, tmp_path, binary):
    x = RNG.standard_normal((3, 1, 32, 32)).astype(np.float32)
    expected = osprey_run(osprey_bin, demo_model, x, tmp_path)
    inp = httpclient.InferInput("image", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput("logits", binary_data=binary)
    result = triton.infer("digits", [inp], outputs=[out])
    got = result.as_numpy("logits")
    assert got.shape == (3, 10) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_binary_output_by_request_parameter_and_nested_json(server, osprey_bin, demo_model, tmp_path):
    x = RNG.standard_normal((2, 1, 32, 32)).astype(np.float32)
    expected = osprey_run(osprey_bin, demo_model, x, tmp_path)
    body = {"id": "r1", "parameters": {"binary_data_output": True},
            "inputs": [{"name": "image", "shape": [2, 1, 32, 32], "datatype": "FP32", "data": x.tolist()}]}
    status, headers, data = server.request("POST", "/v2/models/digits/infer", body)
    assert status == 200, data
    n = int(headers["inference-header-content-length"])
    header = json.loads(data[:n])
    assert header["id"] == "r1" and header["model_name"] == "digits"
    (out,) = header["outputs"]
    assert out["parameters"]["binary_data_size"] == 2 * 10 * 4 and len(data) - n == 80
    got = np.frombuffer(data[n:], dtype=np.float32).reshape(out["shape"])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_raw_binary_single_input(server, osprey_bin, demo_model, tmp_path):
    x = RNG.standard_normal((1, 1, 32, 32)).astype(np.float32)
    expected = osprey_run(osprey_bin, demo_model, x, tmp_path)
    status, _, data = server.request("POST", "/v2/models/digits/infer", x.tobytes(),
                                     {"Inference-Header-Content-Length": "0"})
    assert status == 200, data
    out = json.loads(data)["outputs"][0]
    np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(out["shape"]), expected, rtol=1e-5, atol=1e-5)


def test_repository_index_load_unload(triton, server):
    names = {m["name"]: m for m in triton.get_model_repository_index()}
    assert set(names) == {"digits", "digits2"}
    triton.load_model("digits2")
    assert triton.is_model_ready("digits2")
    ready = server.json("POST", "/v2/repository/index", {"ready": True})[1]
    assert "digits2" in {m["name"] for m in ready} and all(m["state"] == "READY" for m in ready)
    triton.unload_model("digits2")
    assert not triton.is_model_ready("digits2")
    state = {m["name"]: m["state"] for m in triton.get_model_repository_index()}
    assert state["digits2"] != "READY"
    triton.load_model("digits2")
    assert triton.is_model_ready("digits2")
    status, body = server.json("POST", "/v2/repository/models/nope/load")
    assert status == 404 and "nope" in body["error"]


@pytest.mark.parametrize("name", ["3_0.png", "7_1.png", "0_0.png"])
def test_classify_sample(server, osprey_bin, demo_model, name):
    path = demo_model / "samples" / name
    status, body = server.json("POST", "/v2/models/digits/classify", path.read_bytes(), {"Content-Type": "image/png"})
    assert status == 200, body
    cli = json.loads(subprocess.run([str(osprey_bin), "classify", str(demo_model), str(path), "--json"],
                                    capture_output=True, text=True, check=True, timeout=120).stdout)
    top = body["results"][0]["top_k"]
    assert top[0]["label"] == name.split("_")[0]
    assert [c["label"] for c in top] == [c["label"] for c in cli["results"][0]["top_k"]]
    np.testing.assert_allclose([c["probability"] for c in top], [c["probability"] for c in cli["results"][0]["top_k"]],
                               rtol=1e-4, atol=1e-6)
    status, body = server.json("POST", "/v2/models/digits/classify?top_k=1", path.read_bytes(),
                               {"Content-Type": "image/png"})
    assert status == 200 and len(body["results"][0]["top_k"]) == 1


def test_classify_corrupt_image_is_400_with_message(server, demo_model):
    png = (demo_model / "samples" / "3_0.png").read_bytes()
    status, body = server.json("POST", "/v2/models/digits/classify", png[:60], {"Content-Type": "image/png"})
    assert status == 400 and "png" in body["error"].lower()
    status, body = server.json("POST", "/v2/models/digits/classify", b"not an image at all",
                               {"Content-Type": "image/jpeg"})
    assert status == 400 and "image" in body["error"]


def test_unknown_model_is_404(server, triton):
    status, body = server.json("POST", "/v2/models/nope/infer", {"inputs": []})
    assert status == 404 and "nope" in body["error"]
    assert server.request("GET", "/v2/models/nope")[0] == 404
    with pytest.raises(InferenceServerException):
        triton.get_model_metadata("nope")


def test_body_over_max_body_size_is_413(server):
    status, _, data = server.request("POST", "/v2/models/digits/infer", b"x" * (MAX_BODY + 1))
    assert status == 413 and "max-body-size" in json.loads(data)["error"]
    assert server.request("GET", "/v2/health/live")[0] == 200  # still serving


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace (Debian package strace)")
def test_a_large_body_is_read_in_large_pieces(server, tmp_path):
    # Beast reads no more than its buffer has room for (at least 512 bytes): a header-sized buffer read a 600 KB
    # tensor 512 bytes a system call, 1,200 calls and 4.5 ms. Counted with strace on the real server: a 900 KB body
    # must take few reads (64 KiB each: 14), however the kernel splits the stream.
    trace = tmp_path / "strace.txt"
    tracer = subprocess.Popen(["strace", "-f", "-e", "trace=recvmsg,recvfrom,read", "-o", str(trace), "-p",
                               str(server.proc.pid)], stderr=subprocess.PIPE, text=True)
    try:
        said = ""
        for _ in range(200):  # strace says "attached" once per thread
            line = tracer.stderr.readline()
            said += line
            if "attached" in line or not line:
                break
        time.sleep(0.5)
        if tracer.poll() is not None:  # no ptrace here (a container's seccomp, yama ptrace_scope)
            pytest.skip(f"strace cannot attach to the server: {said.strip()}")
        status, _, _ = server.request("POST", "/v2/models/no_such_model/infer", b"\0" * (900 * 1024))
        assert status == 404
    finally:
        tracer.send_signal(signal.SIGINT)
        tracer.wait(timeout=30)
    reads = [line for line in trace.read_text().splitlines() if re.search(r"(recvmsg|recvfrom|read)\(", line)]
    assert 0 < len(reads) <= 64, f"{len(reads)} reads for a 900 KB body:\n" + "\n".join(reads[:5])


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b'{"inputs": 3}', b"[" * 100000])
def test_malformed_request_is_400(server, body):
    status, _, data = server.request("POST", "/v2/models/digits/infer", body)
    assert status == 400 and json.loads(data)["error"]


def good_input():
    return {"name": "image", "shape": [1, 1, 32, 32], "datatype": "FP32", "data": [0.5] * 1024}


@pytest.mark.parametrize("change,word", [
    ({"name": "pixels"}, "no such input"),
    ({"shape": [1, 1, 16, 64]}, "shape"),
    ({"shape": [1, 32, 32]}, "shape"),
    ({"datatype": "INT64", "data": [1] * 1024}, "datatype"),
    ({"datatype": "FP64"}, "FP64"),
    ({"data": [0.5] * 1023}, "values"),
    ({"data": ["a"] * 1024}, "number"),
])
def test_wrong_input_is_400(server, change, word):
    status, body = server.json("POST", "/v2/models/digits/infer", {"inputs": [{**good_input(), **change}]})
    assert status == 400 and word in body["error"], body


def test_bad_data_and_binary_parameters_are_400_naming_the_problem(server):
    cases = [
        # (input, expected words in the error): numbers, then BYTES (encoded images) through the same checks.
        ({"name": "image", "shape": [1, 1, 32, 32], "datatype": "FP32", "parameters": {"binary_data_size": -4}},
         "'binary_data_size' must be a non-negative integer"),
        ({"name": "image", "shape": [1, 1, 32, 32], "datatype": "FP32", "data": [0.5] * 1000},
         "1000 values in 'data' for shape [1, 1, 32, 32] (1024 elements)"),
        ({"name": "image", "shape": [1, 1, 32, 32], "datatype": "FP32"}, "needs 'data' or parameters.binary_data_size"),
        ({"name": "image", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": "x"}},
         "'binary_data_size' must be a non-negative integer"),
        ({"name": "image", "shape": [2], "datatype": "BYTES", "data": ["aGVsbG8="]},
         "1 values in 'data' for shape [2] (2 elements)"),
    ]
    for inp, words in cases:
        status, body = server.json("POST", "/v2/models/digits/infer", {"inputs": [inp]})
        assert status == 400 and words in body["error"], (inp, body)
    assert server.json("GET", "/v2/health/ready")[0] == 200


def test_bad_binary_sizes_are_400(server):
    header = json.dumps({"inputs": [{"name": "image", "shape": [1, 1, 32, 32], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4096}}]}).encode()
    for tail in (b"\0" * 100, b"\0" * 5000):
        status, _, data = server.request("POST", "/v2/models/digits/infer", header + tail,
                                         {"Inference-Header-Content-Length": str(len(header))})
        assert status == 400 and json.loads(data)["error"]
    status, _, _ = server.request("POST", "/v2/models/digits/infer", header,
                                  {"Inference-Header-Content-Length": str(len(header) + 10)})
    assert status == 400


def test_keep_alive_serves_several_requests_on_one_connection(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        for _ in range(3):
            conn.request("GET", "/v2/health/ready")
            r = conn.getresponse()
            assert r.status == 200 and json.loads(r.read()) == {"ready": True}
    finally:
        conn.close()


def test_stats_and_metrics(server, triton):
    x = np.zeros((1, 1, 32, 32), np.float32)
    inp = httpclient.InferInput("image", [1, 1, 32, 32], "FP32")
    inp.set_data_from_numpy(x)
    triton.infer("digits", [inp])
    status, stats = server.json("GET", "/v2/models/digits/stats")
    s = stats["model_stats"][0]
    assert status == 200 and s["weight_bytes"] > 0 and 0 <= s["shared_bytes"] <= s["weight_bytes"]
    status, _, text = server.request("GET", "/metrics")
    text = text.decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            values[key] = float(value)
    assert values['osprey_request_success_total{model="digits"}'] >= 1
    assert values['osprey_request_duration_us_bucket{model="digits",le="+Inf"}'] == \
        values['osprey_request_duration_us_count{model="digits"}']
    assert values["osprey_model_loads_total"] >= 1 and values["osprey_accounted_bytes_total"] > 0
    assert values['osprey_accounted_bytes{model="digits"}'] == s["weight_bytes"]
    assert values["process_resident_memory_bytes"] > 1 << 20


def test_sigterm_stops_with_exit_code_0(start_server):
    server = start_server("--load", "digits")
    assert server.json("GET", "/v2/models/digits/ready") == (200, {"name": "digits", "ready": True})
    # An idle keep-alive connection must not hold the stop up.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/v2/health/live")
    conn.getresponse().read()
    assert server.terminate() == 0
    conn.close()
    assert "stopped" in server.output()


def test_malformed_http_is_answered_and_server_keeps_serving(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GARBAGE\r\n\r\n")
        reply = s.recv(4096)
    assert reply.startswith(b"HTTP/1.1 400")
    assert server.request("GET", "/v2/health/live")[0] == 200


def test_slow_client_times_out(start_server):
    server = start_server("--read-timeout", "0.5")
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")  # header never finished
        assert s.recv(4096) == b""  # closed by the server (recv would raise on our own 20 s timeout)
    assert server.request("GET", "/v2/health/live")[0] == 200
