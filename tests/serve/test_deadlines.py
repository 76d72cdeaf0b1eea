"""Request deadlines: a client's parameters.timeout (Triton's, microseconds), a gRPC call's deadline and the server's
--max-request-seconds. A request still waiting when its deadline passes is answered 504 without running; a run past
it stops at its next step, and the stream it held serves the next request at once.

The model is the hostile case: a Loop whose trip count comes from the request (`steps`), each iteration a 512 x 512
MatMul, so a few bytes ask for up to 10,000 iterations (tens of seconds). Oracles: NumPy for the answers that complete,
the protocol's status codes and messages for the rest, and a follow-up request that must find the stream free (with a
deadline of its own shorter than what the stopped run would still have taken)."""

import json
import re
import threading
import time

import numpy as np
import onnx
import pytest
import pytest_support  # conftest.py put tests/ on the path
from onnx import TensorProto, helper, numpy_helper

N = 512
RNG = np.random.default_rng(29)
H0 = (RNG.standard_normal((N, N)) * 0.05).astype(np.float32)
W = (RNG.standard_normal((N, N)) / np.sqrt(N)).astype(np.float32)
LONG = 10000  # iterations: far longer than any deadline below (osprey's loop limit)


def spin_model() -> onnx.ModelProto:
    """y[N, 64] = x + mean(h), h = tanh(h @ W) repeated max(steps) times from H0 (pytest_support.spin_model)."""
    return pytest_support.spin_model(H0, W, 64)


def expected(x, steps):
    h = H0.astype(np.float64)
    for _ in range(int(np.max(steps))):
        h = np.tanh(h @ W.astype(np.float64))
    return x + h.mean()


def body(x, steps, timeout_us=None):
    b = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()},
                    {"name": "steps", "datatype": "INT64", "shape": [len(steps)], "data": list(steps)}]}
    if timeout_us is not None:
        b["parameters"] = {"timeout": timeout_us}
    return b


@pytest.fixture(scope="module")
def spin_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("deadline-repo")
    model = spin_model()
    onnx.checker.check_model(model)
    for name, config in [("spin", None), ("spin_batched", {"batching": {"max_batch_size": 8}})]:
        version = root / name / "1"
        version.mkdir(parents=True)
        onnx.save(model, str(version / "model.onnx"))
        if config:
            (version / "config.json").write_text(json.dumps(config))
    return root


def infer(server, model, x, steps, timeout_us=None):
    return server.json("POST", f"/v2/models/{model}/infer", body(x, steps, timeout_us))


def check_answer(status, answer, x, steps):
    assert status == 200, answer
    (out,) = answer["outputs"]
    got = np.array(out["data"], dtype=np.float32).reshape(out["shape"])
    np.testing.assert_allclose(got, expected(x, steps), rtol=1e-5, atol=1e-5)


def failures(server, model):
    stats = server.json("GET", f"/v2/models/{model}/stats")[1]["model_stats"][0]
    return stats["request_failure_count"], stats["execution_count"]


def test_client_timeout_stops_the_run_and_frees_the_stream(spin_repo, start_repo):
    server = start_repo(spin_repo, "--streams", 1)
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    check_answer(*infer(server, "spin", x, [3, 1]), x, [3, 1])  # a short loop completes, with or without a timeout
    check_answer(*infer(server, "spin", x, [2, 2], timeout_us=60_000_000), x, [2, 2])

    status, answer = infer(server, "spin", x, [LONG, 1], timeout_us=300_000)
    assert status == 504, answer
    message = answer["error"]
    assert message.startswith("deadline exceeded (parameters.timeout 300000 us): the run stopped after"), message
    assert re.search(r"before node '[^']*' \(\w+, step \d+ of \d+\)", message), message

    # The stream is free again: a request whose own deadline is far shorter than what the stopped loop had left.
    check_answer(*infer(server, "spin", x, [1, 1], timeout_us=5_000_000), x, [1, 1])


def test_bad_timeouts_are_refused(spin_repo, start_repo):
    server = start_repo(spin_repo)
    x = np.zeros((1, 64), np.float32)
    for bad in (-1, "1000", 1.5, [1]):
        status, answer = infer(server, "spin", x, [1], timeout_us=bad)
        assert status == 400 and "parameters.timeout must be a whole number of microseconds" in answer["error"], answer
    status, answer = infer(server, "spin", x, [1], timeout_us=0)  # 0: no timeout (Triton's convention)
    check_answer(status, answer, x, [1])
    status, answer = infer(server, "spin", x, [1], timeout_us=2**63 - 1)  # far: clamped, no overflow of the clock
    check_answer(status, answer, x, [1])


def test_server_limit_applies_to_every_request(spin_repo, start_repo):
    server = start_repo(spin_repo, "--max-request-seconds", 0.3)
    x = np.ones((1, 64), np.float32)
    check_answer(*infer(server, "spin", x, [2]), x, [2])
    status, answer = infer(server, "spin", x, [LONG])
    assert status == 504 and answer["error"].startswith("deadline exceeded (--max-request-seconds 0.3)"), answer
    # A client cannot ask for more than the server allows; a shorter timeout of its own wins.
    status, answer = infer(server, "spin", x, [LONG], timeout_us=100_000_000)
    assert status == 504 and "--max-request-seconds 0.3" in answer["error"], answer
    status, answer = infer(server, "spin", x, [LONG], timeout_us=100_000)
    assert status == 504 and "parameters.timeout 100000 us" in answer["error"], answer
    # The failures are counted as failed requests in Triton's statistics.
    assert failures(server, "spin")[0] == 3


@pytest.mark.parametrize("model", ["spin", "spin_batched"])
def test_a_request_that_waits_past_its_deadline_is_not_run(spin_repo, start_repo, model):
    """With one stream busy on a long run, a request with a short timeout waits and is answered 504 without running
    (for a stream, or in the batching queue); the long run then stops at its own deadline."""
    server = start_repo(spin_repo, "--streams", 1, "--http-threads", 4)
    x = np.ones((1, 64), np.float32)
    check_answer(*infer(server, model, x, [1]), x, [1])  # loads and compiles
    _, executions_before = failures(server, model)
    long_answer = {}

    def long_request():
        long_answer["r"] = infer(server, model, x, [LONG], timeout_us=2_000_000)

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.3)  # the long run holds the stream (if not yet, the short request below still waits behind it)
    status, answer = infer(server, model, x, [1], timeout_us=200_000)
    t.join()
    assert status == 504, answer
    assert re.search(r"not run, it waited [\d.]+ ms (for a stream|in its queue)", answer["error"]), answer
    status, answer = long_answer["r"]
    assert status == 504 and "parameters.timeout 2000000 us): the run stopped" in answer["error"], answer
    # The short request never ran: only the long one's (stopped) execution was added.
    _, executions_after = failures(server, model)
    assert executions_after - executions_before <= 1
    check_answer(*infer(server, model, x, [1], timeout_us=5_000_000), x, [1])


def grpc_spin(spin_repo, start_repo):
    """(tritonclient.grpc, a client of a new server on the spin model with one stream, inputs(steps) for it)."""
    grpcclient = pytest.importorskip("tritonclient.grpc")
    server = start_repo(spin_repo, "--grpc-port", 0, "--streams", 1)
    port = int(re.search(r"gRPC on 127\.0\.0\.1:(\d+)", server.output()).group(1))

    def inputs(steps):
        a = grpcclient.InferInput("x", [1, 64], "FP32")
        a.set_data_from_numpy(np.ones((1, 64), np.float32))
        b = grpcclient.InferInput("steps", [1], "INT64")
        b.set_data_from_numpy(np.array([steps], np.int64))
        return [a, b]

    return grpcclient, grpcclient.InferenceServerClient(f"127.0.0.1:{port}"), inputs


def test_grpc_deadline_stops_the_run(spin_repo, start_repo):
    from tritonclient.utils import InferenceServerException

    _, client, inputs = grpc_spin(spin_repo, start_repo)

    ok = client.infer("spin", inputs(2)).as_numpy("y")
    np.testing.assert_allclose(ok, expected(np.ones((1, 64), np.float32), [2]), rtol=1e-5, atol=1e-5)
    with pytest.raises(InferenceServerException, match="Deadline Exceeded|DEADLINE_EXCEEDED"):
        client.infer("spin", inputs(LONG), client_timeout=0.3)
    # tritonclient's own `timeout` (microseconds) travels as parameters.timeout
    with pytest.raises(InferenceServerException, match="deadline exceeded \\(parameters.timeout 300000 us\\)"):
        client.infer("spin", inputs(LONG), timeout=300_000)
    # The server stopped the first run too: the stream is free for a request with a 5 s deadline of its own.
    ok = client.infer("spin", inputs(1), client_timeout=5).as_numpy("y")
    np.testing.assert_allclose(ok, expected(np.ones((1, 64), np.float32), [1]), rtol=1e-5, atol=1e-5)


def test_a_closed_connection_stops_its_run(spin_repo, start_repo):
    """A REST client that sends an expensive request and hangs up: the run stops at its next step (logged 499), so the
    stream serves the next request instead of spending the loop's tens of seconds for nobody."""
    import socket

    server = start_repo(spin_repo, "--streams", 1, "--access-log")
    x = np.ones((1, 64), np.float32)
    check_answer(*infer(server, "spin", x, [1]), x, [1])
    payload = json.dumps(body(x, [LONG])).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"POST /v2/models/spin/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        time.sleep(0.5)  # the run has started
    # Without the stop, this waits for the loop (tens of seconds) and gets 504 at its own 5 s deadline.
    check_answer(*infer(server, "spin", x, [2], timeout_us=5_000_000), x, [2])
    deadline = time.monotonic() + 10
    while "cancelled (the client closed the connection)" not in server.output() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert re.search(r"POST /v2/models/spin/infer.*499.*cancelled \(the client closed the connection\): the run "
                     r"stopped after", server.output()), server.output()[-2000:]
    assert failures(server, "spin")[0] == 1
    # A client that waits gets its answer as before (the watch does not mistake a slow run for a hang-up).
    check_answer(*infer(server, "spin", x, [40]), x, [40])


def test_a_cancelled_grpc_call_stops_its_run(spin_repo, start_repo):
    _, client, inputs = grpc_spin(spin_repo, start_repo)

    client.infer("spin", inputs(1))
    call = client.async_infer("spin", inputs(LONG), callback=lambda result, error: None)
    time.sleep(0.5)
    call.cancel()
    ok = client.infer("spin", inputs(2), client_timeout=5).as_numpy("y")
    np.testing.assert_allclose(ok, expected(np.ones((1, 64), np.float32), [2]), rtol=1e-5, atol=1e-5)


def test_instance_group_count_sets_a_models_concurrent_runs(spin_repo, tmp_path, start_repo):
    """Triton's instance_group count is the model's number of concurrent runs (--streams otherwise): with 2, a short
    request runs beside a long one; after a load with a configuration of count 1, it waits and misses its deadline."""
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(spin_repo / "spin", repo / "spin")
    (repo / "spin" / "config.pbtxt").write_text("instance_group [ { count: 2 kind: KIND_CPU } ]\n")
    server = start_repo(repo, "--streams", 1, "--http-threads", 4)
    x = np.ones((1, 64), np.float32)
    check_answer(*infer(server, "spin", x, [1]), x, [1])
    assert server.json("GET", "/v2/models/spin/config")[1]["instance_group"][0]["count"] == 2

    def beside_a_long_run():
        long_answer = {}
        t = threading.Thread(target=lambda: long_answer.setdefault("r", infer(server, "spin", x, [LONG], 1_500_000)))
        t.start()
        time.sleep(0.3)
        short = infer(server, "spin", x, [1], timeout_us=500_000)
        t.join()
        assert long_answer["r"][0] == 504
        return short

    status, answer = beside_a_long_run()
    check_answer(status, answer, x, [1])
    config = server.json("GET", "/v2/models/spin/config")[1]
    config["instance_group"] = [{"count": 1, "kind": "KIND_CPU"}]
    status, _, body_ = server.request("POST", "/v2/repository/models/spin/load",
                                      {"parameters": {"config": json.dumps(config)}})
    assert status == 200, body_
    assert server.json("GET", "/v2/models/spin/config")[1]["instance_group"][0]["count"] == 1
    status, answer = beside_a_long_run()
    assert status == 504 and "waited" in answer["error"] and "for a stream" in answer["error"], answer
    # Counts are bounded: a configuration asking for more than 64 concurrent runs is refused, naming it.
    config["instance_group"] = [{"count": 100000}]
    status, _, body_ = server.request("POST", "/v2/repository/models/spin/load",
                                      {"parameters": {"config": json.dumps(config)}})
    assert status == 400 and b"instance_group count 100000" in body_, body_
