"""Model manager behaviour through the real `osprey serve`: LRU eviction under --memory-budget, idle unload, load
failure isolation, memory given back to the OS after unloads, weight sharing between models, and a keep-alive burst.

Oracles: the repository index and /metrics counters (protocol state), numpy matmuls of the weights written into each
test model (infer results), and the process's VmRSS from /proc/<pid>/status (memory)."""

import http.client
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


MiB = 1 << 20
IN = 512
HIDDEN = 2048
OUT = 10


def weights(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) / np.sqrt(shape[0])


def write_model(repo, name, backbone_seed, head_seed, hidden=HIDDEN, inputs=IN):
    """<repo>/<name>/1/model.onnx: y = (x @ W1) @ W2 with x FP32 [N, inputs], a seeded backbone W1 [inputs, hidden]
    and a seeded head W2 [hidden, OUT]. Returns (W1, W2)."""
    w1, w2 = weights(backbone_seed, (inputs, hidden)), weights(head_seed, (hidden, OUT))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", inputs])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", OUT])
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="backbone"),
             helper.make_node("MatMul", ["h", "W2"], ["y"], name="head")]
    graph = helper.make_graph(nodes, name, [x], [y], [numpy_helper.from_array(w1, "W1"),
                                                      numpy_helper.from_array(w2, "W2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    d = repo / name / "1"
    d.mkdir(parents=True)
    onnx.save(model, str(d / "model.onnx"))
    return w1, w2


def write_tiny(repo, name="tiny"):
    """y = x + c with x FP32 [N, 16]; returns c."""
    c = np.arange(16, dtype=np.float32).reshape(1, 16) * 0.5
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])
    graph = helper.make_graph([helper.make_node("Add", ["x", "c"], ["y"])], name, [x], [y],
                              [numpy_helper.from_array(c, "c")])
    d = repo / name / "1"
    d.mkdir(parents=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(d / "model.onnx"))
    return c


def infer(server, model, x):
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    status, data = server.json("POST", f"/v2/models/{model}/infer", body)
    if status != 200:
        return status, data
    out = data["outputs"][0]
    return status, np.array(out["data"], np.float32).reshape(out["shape"])


def states(server):
    status, index = server.json("POST", "/v2/repository/index", {})
    assert status == 200, index
    return {m["name"]: m for m in index}


def metric(server, name):
    status, _, text = server.request("GET", "/metrics")
    assert status == 200
    m = re.search(rf"^{re.escape(name)} (\S+)$", text.decode(), re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def rss_bytes(server):
    for line in open(f"/proc/{server.proc.pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


X = np.random.default_rng(3).standard_normal((2, IN)).astype(np.float32)


def test_lru_eviction_and_reload(start_repo, tmp_path):
    repo = tmp_path / "repo"
    w = {n: write_model(repo, n, 10 + i, 20 + i) for i, n in enumerate("ABC")}
    # One model's accounted bytes after a request (weights, their packed forms, the arena), measured on an
    # unbudgeted server.
    probe = start_repo(repo)
    # Not the demo repository: the start line's example asks for a model's metadata, which any model answers.
    line = next(l for l in probe.output().splitlines() if "listening on" in l)
    assert f"curl -s {probe.url}/v2/models/A " in line and "--data-binary" not in line, line
    assert probe.request("POST", "/v2/repository/models/A/load")[0] == 200
    loaded = metric(probe, "osprey_accounted_bytes_total")
    assert loaded >= IN * HIDDEN * 4
    assert infer(probe, "A", X)[0] == 200
    one = metric(probe, "osprey_accounted_bytes_total")
    assert one > loaded, "the packed weights and the arena of the first request are accounted"
    probe.kill()

    # The accounted bytes' LRU alone: the resident-memory rule (on by default) would also evict where this small
    # server's RSS passes budget + 10% + 20 MiB, which depends on the host (tested with RSS injected in
    # tests/unit/serve, ModelManagerTest.ResidentMemoryAboveTheCeiling*).
    server = start_repo(repo, "--memory-budget", int(2.5 * one), "--memory-budget-rss", "off")
    assert metric(server, "osprey_resident_ceiling_bytes") == 0
    for name in "ABC":
        status, y = infer(server, name, X)
        assert status == 200, y
        np.testing.assert_allclose(y, X @ w[name][0] @ w[name][1], rtol=1e-4, atol=1e-4)
    s = states(server)
    assert s["A"]["state"] != "READY" and s["B"]["state"] == "READY" and s["C"]["state"] == "READY", s
    assert metric(server, "osprey_model_evictions_total") == 1
    assert metric(server, "osprey_accounted_bytes_total") <= 2.5 * one
    status, y = infer(server, "A", X)  # reloaded (evicting B, the least recently used)
    assert status == 200, y
    np.testing.assert_allclose(y, X @ w["A"][0] @ w["A"][1], rtol=1e-4, atol=1e-4)
    s = states(server)
    assert s["A"]["state"] == "READY" and s["B"]["state"] != "READY" and s["C"]["state"] == "READY", s
    assert metric(server, "osprey_model_evictions_total") == 2
    assert metric(server, "osprey_model_loads_total") == 4


def write_weightless(repo, name, width=4096):
    """y = (relu(x) + sigmoid(relu(x))) * sigmoid(relu(x)) for x FP32 [N, width]: no weights, only execution memory."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", width])
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Mul", ["c", "b"], ["y"])]
    d = repo / name / "1"
    d.mkdir(parents=True)
    onnx.save(helper.make_model(helper.make_graph(nodes, name, [x], [y]),
                                opset_imports=[helper.make_opsetid("", 17)]), str(d / "model.onnx"))


def test_models_running_in_turn_share_one_arena(start_repo, tmp_path):
    # Execution arenas are shared by the process's models (runtime/arena_pool.h): A and B, weightless models of the
    # same shape, run in turn and hold one arena between them even when arenas are kept (--arena-idle 0).
    repo = tmp_path / "repo"
    for name in "AB":
        write_weightless(repo, name)
    x = np.random.default_rng(5).standard_normal((16, 4096)).astype(np.float32)
    server = start_repo(repo, "--arena-idle", 0, "--memory-budget", 64 << 20, "--memory-budget-rss", "off")
    assert infer(server, "A", x)[0] == 200
    one = metric(server, "osprey_accounted_bytes_total")
    assert one >= 16 * 4096 * 4, "a request's arena is accounted"
    for _ in range(3):
        for name in "BA":
            status, y = infer(server, name, x)
            assert status == 200, y
            a = np.maximum(x, 0)
            b = 1 / (1 + np.exp(-a))
            np.testing.assert_allclose(y, (a + b) * b, rtol=1e-5, atol=1e-6)
    # B adds its pooled output buffer and its plan's objects (a few KiB of heap, measured at its first run), not a
    # second arena (at least x.nbytes more).
    assert metric(server, "osprey_accounted_bytes_total") <= one + x.nbytes + (64 << 10)
    s = states(server)
    assert s["A"]["state"] == "READY" and s["B"]["state"] == "READY", s


def test_budget_enforced_after_requests_grow_memory(start_repo, tmp_path):
    # A model's first request packs its weights (accounted once made): loading B fits the budget, B's request then
    # pushes the accounted bytes over it, and the housekeeping thread evicts the least recently used model (A), not
    # the one just used.
    repo = tmp_path / "repo"
    w = {n: write_model(repo, n, 30 + i, 40 + i) for i, n in enumerate("AB")}
    probe = start_repo(repo)
    assert probe.request("POST", "/v2/repository/models/A/load")[0] == 200
    loaded = metric(probe, "osprey_accounted_bytes_total")
    assert infer(probe, "A", X)[0] == 200
    ran = metric(probe, "osprey_accounted_bytes_total")
    assert ran - loaded >= IN * HIDDEN * 4 // 2, "the packed weights of the first request are accounted"
    probe.kill()

    budget = int(ran + loaded + (ran - loaded) // 2)
    rss_rule = start_repo(repo, "--memory-budget", budget)  # on by default: its ceiling on /metrics
    assert metric(rss_rule, "osprey_memory_budget_bytes") == budget
    assert metric(rss_rule, "osprey_resident_ceiling_bytes") == budget + budget // 10 + (20 << 20)
    rss_rule.kill()
    server = start_repo(repo, "--memory-budget", budget, "--memory-budget-rss", "off")  # the accounted bytes' rule
    assert metric(server, "osprey_memory_budget_bytes") == budget
    assert infer(server, "A", X)[0] == 200
    status, y = infer(server, "B", X)  # loads without evicting A, then grows past the budget
    assert status == 200, y
    np.testing.assert_allclose(y, X @ w["B"][0] @ w["B"][1], rtol=1e-4, atol=1e-4)
    deadline = time.monotonic() + 10
    while states(server)["A"]["state"] == "READY":
        assert time.monotonic() < deadline, "A still READY 10 s after the accounted bytes passed the budget"
        time.sleep(0.05)
    s = states(server)
    assert s["A"]["reason"].startswith("evicted: memory budget"), s
    assert s["B"]["state"] == "READY", s
    assert metric(server, "osprey_accounted_bytes_total") <= budget


def test_idle_unload(start_repo, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "A", 1, 2, hidden=64)
    server = start_repo(repo, "--idle-unload", 0.5)
    assert infer(server, "A", X)[0] == 200
    deadline = time.monotonic() + 20
    while states(server)["A"]["state"] == "READY":
        assert time.monotonic() < deadline, "model still READY 20 s after its last request with --idle-unload 0.5"
        time.sleep(0.1)
    assert metric(server, "osprey_model_unloads_total") >= 1
    assert infer(server, "A", X)[0] == 200  # loads again on demand


def test_load_failure_isolation(start_repo, tmp_path):
    repo = tmp_path / "repo"
    wa = write_model(repo, "A", 1, 2, hidden=64)
    wb = write_model(repo, "B", 3, 4, hidden=64)
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.onnx").write_bytes(b"this is not an onnx protobuf \x00\xff" * 10)
    server = start_repo(repo)
    status, body = server.json("POST", "/v2/models/broken/infer",
                               {"inputs": [{"name": "x", "shape": [1, IN], "datatype": "FP32", "data": [0.0] * IN}]})
    assert status == 503, body
    assert body["error"] and "broken" in body["error"]
    entry = states(server)["broken"]
    assert entry["state"] != "READY" and entry["reason"], entry
    assert metric(server, "osprey_model_load_failures_total") >= 1
    for name, w in (("A", wa), ("B", wb)):
        status, y = infer(server, name, X)
        assert status == 200, y
        np.testing.assert_allclose(y, X @ w[0] @ w[1], rtol=1e-4, atol=1e-4)
    status, body = server.json("POST", "/v2/repository/models/broken/load")
    assert status >= 400 and body["error"]
    assert server.proc.poll() is None


def test_memory_given_back_after_unload(start_repo, tmp_path):
    repo = tmp_path / "repo"
    hidden = 4 * HIDDEN  # 16 MiB backbone per model, 80 MiB for the five: the tolerance below is a quarter of that
    names = [f"m{i}" for i in range(5)]
    for i, n in enumerate(names):
        write_model(repo, n, 100 + i, 200 + i, hidden=hidden)
    server = start_repo(repo)
    # Warm the HTTP path (buffers, threads) before the baseline.
    for _ in range(20):
        server.json("POST", "/v2/repository/index", {})
    baseline = rss_bytes(server)
    for n in names:
        assert server.request("POST", f"/v2/repository/models/{n}/load")[0] == 200
    loaded = rss_bytes(server)
    assert loaded - baseline >= 60 * MiB, (baseline, loaded)  # the weights really were resident
    for n in names:
        assert server.request("POST", f"/v2/repository/models/{n}/unload")[0] == 200
    assert all(m["state"] != "READY" for m in states(server).values())
    after = rss_bytes(server)
    tolerance = max(0.03 * baseline, 20 * MiB)
    print(f"RSS baseline {baseline / MiB:.1f} MiB, loaded {loaded / MiB:.1f} MiB, after unload {after / MiB:.1f} MiB")
    assert after - baseline <= tolerance, (baseline, loaded, after)


def test_execution_memory_of_a_large_request_is_given_back_when_idle(start_repo, tmp_path):
    """A large request's execution memory (its arena and the kernels' per-thread scratch: a convolution on plain NCHW
    tensors reorders through the scratch) is counted in /metrics while it waits for reuse and freed after --arena-idle
    seconds unused: the gauge goes to 0 and RSS comes back down. Before, each request thread kept its scratch at the
    size of the largest request it had run, for the life of the server, in no account."""
    d = tmp_path / "repo" / "conv" / "1"
    d.mkdir(parents=True)
    k = weights(5, (32, 32, 3, 3))
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("GlobalAveragePool", ["c"], ["y"])],
        "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 32, 96, 96])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32, 1, 1])], [numpy_helper.from_array(k, "k")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(d / "model.onnx"))
    server = start_repo(tmp_path / "repo", "--arena-idle", 1)
    x = np.random.default_rng(4).standard_normal((8, 32, 96, 96)).astype(np.float32)  # 9 MiB
    status, y = infer(server, "conv", x)
    assert status == 200 and y.shape == (8, 32, 1, 1), y
    held = metric(server, "osprey_shared_execution_bytes")
    # The arena of the intermediate [8, 32, 96, 96] (9 MiB) and the input's reorder in the scratch (9 MiB).
    assert held >= 17 * MiB, held
    peak = rss_bytes(server)
    deadline = time.time() + 20
    while metric(server, "osprey_shared_execution_bytes") > 0 and time.time() < deadline:
        time.sleep(0.25)
    assert metric(server, "osprey_shared_execution_bytes") == 0
    assert rss_bytes(server) <= peak - held / 2, (peak, held, rss_bytes(server))


def test_shared_backbone_counted_once(start_repo, tmp_path):
    repo = tmp_path / "repo"
    names = [f"t{i}" for i in range(5)]
    # A backbone of 2048 inputs (16 MiB) against 10-class heads: the proportion of a real backbone to its heads. Each
    # head's own packed copy is not small where oneDNN packs B in 64-column blocks (AVX-512: 10 columns padded to 64,
    # 6.4x the head), so with a 4 MiB backbone the heads alone would be 7% each.
    inputs = 4 * IN
    w = {n: write_model(repo, n, 42, 300 + i, inputs=inputs) for i, n in enumerate(names)}  # same backbone, own head
    x = np.random.default_rng(3).standard_normal((2, inputs)).astype(np.float32)
    # Each tenant has run (so its kernels have packed their weights, and its arena exists): the backbone's packed
    # form is shared like the backbone itself, and both are accounted.
    server = start_repo(repo, "--arena-idle", 0)
    assert server.request("POST", f"/v2/repository/models/{names[0]}/load")[0] == 200
    loaded = metric(server, "osprey_accounted_bytes_total")
    assert infer(server, names[0], x)[0] == 200
    one = metric(server, "osprey_accounted_bytes_total")
    assert one >= loaded + inputs * HIDDEN * 4, ("the backbone's packed form is accounted", loaded, one)
    for n in names[1:]:
        assert server.request("POST", f"/v2/repository/models/{n}/load")[0] == 200
        assert infer(server, n, x)[0] == 200
    total = metric(server, "osprey_accounted_bytes_total")
    print(f"accounted bytes: one model {one:.0f}, five sharing a backbone {total:.0f} ({total / one:.3f}x)")
    assert total <= 1.15 * one, (one, total)
    status, stats = server.json("GET", f"/v2/models/{names[1]}/stats")
    assert status == 200, stats
    st = stats["model_stats"][0]
    assert st["shared_bytes"] >= inputs * HIDDEN * 4 and st["unique_bytes"] >= HIDDEN * OUT * 4, st
    for n in names:  # each model still answers with its own head
        status, y = infer(server, n, x)
        assert status == 200, y
        np.testing.assert_allclose(y, x @ w[n][0] @ w[n][1], rtol=1e-4, atol=1e-4)


def test_burst_keep_alive(start_repo, tmp_path):
    repo = tmp_path / "repo"
    c = write_tiny(repo)
    server = start_repo(repo, "--load", "tiny")
    local = threading.local()
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": x.ravel().tolist()}]})
    expected = (x + c).ravel().tolist()
    errors = []

    def one(_):
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            conn.request("POST", "/v2/models/tiny/infer", body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            if r.status != 200 or json.loads(data)["outputs"][0]["data"] != expected:
                errors.append((r.status, data[:200]))
        except Exception as e:  # noqa: BLE001 - every failure counts as an error
            errors.append(repr(e))
            local.conn = None
            conn.close()

    deadline = time.monotonic() + 240
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(one, range(1000)))
        rss_1k = rss_bytes(server)
        list(pool.map(one, range(9000)))
        rss_10k = rss_bytes(server)
    assert time.monotonic() < deadline, "burst took longer than 240 s"
    print(f"burst: RSS after 1,000 requests {rss_1k / MiB:.1f} MiB, after 10,000 {rss_10k / MiB:.1f} MiB")
    assert errors == [], errors[:5]
    assert rss_10k <= rss_1k + 8 * MiB, (rss_1k, rss_10k)
    assert metric(server, 'osprey_request_success_total{model="tiny"}') == 10000
