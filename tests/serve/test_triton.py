"""Operating osprey like Triton (issue 13): tritonclient.grpc and tritonclient.http against the real server (metadata,
config, statistics, infer, the classification extension, repository), config.pbtxt, warmup, model states with reasons
and the log. Oracles: ONNX Runtime on the same model file, the config files written here, and hand-counted requests."""

import json
import re
import shutil
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import numpy_helper
from tritonclient.utils import InferenceServerException

RNG = np.random.default_rng(13)


def copy_model(root: Path, name: str, demo_model: Path, versions=("1",), config_json=None, pbtxt=None):
    for v in versions:
        d = root / name / v
        d.mkdir(parents=True)
        shutil.copy(demo_model / "1" / "model.onnx", d / "model.onnx")
        config = json.loads((demo_model / "1" / "config.json").read_text())
        config.update(config_json or {})
        (d / "config.json").write_text(json.dumps(config))
    shutil.copy(demo_model / "labels.txt", root / name / "labels.txt")
    if pbtxt is not None:
        (root / name / "config.pbtxt").write_text(pbtxt)
    return root / name


@pytest.fixture
def triton_server(tmp_path, demo_model, start_repo):
    """A server over `digits` and `tiny` copies, REST + gRPC, with the access log on."""
    repo = tmp_path / "repo"
    copy_model(repo, "digits", demo_model)
    copy_model(repo, "other", demo_model)
    server = start_repo(repo, "--grpc-port", 0, "--access-log")
    server.grpc_port = int(re.search(r"gRPC on 127\.0\.0\.1:(\d+)", server.output()).group(1))
    server.demo = demo_model
    return server


def ort_logits(demo_model, x):
    session = ort.InferenceSession(str(demo_model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def test_grpc_metadata_infer_and_errors(triton_server, demo_model):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{triton_server.grpc_port}")
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta.name == "osprey" and "classification" in meta.extensions
    m = client.get_model_metadata("digits")
    assert m.inputs[0].name == "image" and list(m.inputs[0].shape) == [-1, 1, 32, 32]
    assert not client.is_model_ready("digits")  # metadata did not load it
    x = RNG.random((3, 1, 32, 32), dtype=np.float32)
    inp = grpcclient.InferInput("image", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)  # raw_input_contents
    result = client.infer("digits", [inp])
    out = result.as_numpy(m.outputs[0].name)
    np.testing.assert_allclose(out, ort_logits(demo_model, x), rtol=1e-4, atol=1e-4)
    assert client.is_model_ready("digits")
    # Errors are gRPC status codes with osprey's message.
    with pytest.raises(InferenceServerException) as e:
        client.get_model_metadata("nope")
    assert "StatusCode.NOT_FOUND" in str(e.value.status()) and "nope" in e.value.message()
    bad = grpcclient.InferInput("image", [1, 3, 32, 32], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.float32))
    with pytest.raises(InferenceServerException) as e:
        client.infer("digits", [bad])
    assert "INVALID_ARGUMENT" in str(e.value.status()) and "does not match" in e.value.message()
    # Shapes whose byte count wraps are refused as over REST.
    huge = grpcclient.InferInput("image", [1 << 60, 1, 32, 32], "FP32")
    huge._raw_content = b""
    with pytest.raises(InferenceServerException) as e:
        client.infer("digits", [huge])
    assert "INVALID_ARGUMENT" in str(e.value.status()) or "RESOURCE_EXHAUSTED" in str(e.value.status())
    assert client.is_server_live()


def test_classification_extension_grpc_and_http(triton_server, demo_model):
    labels = (demo_model / "labels.txt").read_text().split()
    x = RNG.random((2, 1, 32, 32), dtype=np.float32)
    expected = ort_logits(demo_model, x)
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{triton_server.grpc_port}")
    h = httpclient.InferenceServerClient(f"127.0.0.1:{triton_server.port}")
    gi = grpcclient.InferInput("image", list(x.shape), "FP32")
    gi.set_data_from_numpy(x)
    hi = httpclient.InferInput("image", list(x.shape), "FP32")
    hi.set_data_from_numpy(x, binary_data=True)
    answers = [g.infer("digits", [gi], outputs=[grpcclient.InferRequestedOutput("logits", class_count=3)]),
               h.infer("digits", [hi], outputs=[httpclient.InferRequestedOutput("logits", class_count=3)])]
    for result in answers:
        strings = result.as_numpy("logits")
        assert strings.shape == (2, 3)
        for row in range(2):
            top = np.argsort(-expected[row])[:3]
            for k in range(3):
                score, index, label = strings[row, k].decode().split(":")
                assert int(index) == top[k]
                assert abs(float(score) - expected[row, top[k]]) < 1e-4
                assert label == labels[top[k]]


def test_config_and_statistics(triton_server):
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{triton_server.grpc_port}")
    h = httpclient.InferenceServerClient(f"127.0.0.1:{triton_server.port}")
    config = h.get_model_config("digits")
    assert config["name"] == "digits" and config["max_batch_size"] == 256
    assert config["input"] == [{"name": "image", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [1, 32, 32]}]
    assert config["output"][0]["dims"] == [10] and config["output"][0]["label_filename"] == "labels.txt"
    gconfig = g.get_model_config("digits", as_json=True)["config"]
    assert gconfig["input"][0]["dims"] == ["1", "32", "32"] and gconfig["max_batch_size"] == 256
    assert not g.is_model_ready("digits")  # config did not load it either
    x = np.zeros((4, 1, 32, 32), np.float32)
    hi = httpclient.InferInput("image", list(x.shape), "FP32")
    hi.set_data_from_numpy(x)
    for _ in range(2):
        h.infer("digits", [hi])
    with pytest.raises(InferenceServerException):
        h.infer("digits", [httpclient.InferInput("image", [1, 3, 2, 2], "FP32").set_data_from_numpy(
            np.zeros((1, 3, 2, 2), np.float32))])
    gi = grpcclient.InferInput("image", list(x.shape), "FP32")
    gi.set_data_from_numpy(x)
    g.infer("digits", [gi])
    stats = h.get_inference_statistics("digits")["model_stats"][0]
    assert stats["name"] == "digits" and stats["version"] == "1"
    assert stats["inference_stats"]["success"]["count"] == 3
    assert stats["inference_stats"]["fail"]["count"] == 1
    assert stats["execution_count"] == 3 and stats["inference_count"] == 12
    assert stats["inference_stats"]["compute_infer"]["ns"] > 0 and stats["last_inference"] > 0
    gstats = g.get_inference_statistics("digits", as_json=True)["model_stats"][0]
    assert int(gstats["inference_count"]) == 12 and int(gstats["inference_stats"]["success"]["count"]) == 3
    everything = h.get_inference_statistics()["model_stats"]
    assert sorted(s["name"] for s in everything) == ["digits", "other"]


def test_repository_load_unload_and_states(triton_server):
    g = grpcclient.InferenceServerClient(f"127.0.0.1:{triton_server.grpc_port}")
    h = httpclient.InferenceServerClient(f"127.0.0.1:{triton_server.port}")
    index = {m["name"]: m for m in h.get_model_repository_index()}
    assert index["other"]["state"] == "UNAVAILABLE" and index["other"]["reason"] == "not loaded yet"
    g.load_model("other")
    assert g.is_model_ready("other") and h.is_model_ready("other")
    g.unload_model("other")
    index = {m.name: m for m in g.get_model_repository_index().models}
    assert index["other"].state == "UNAVAILABLE" and index["other"].reason == "unloaded: by request"
    # A configuration given with the load replaces config.pbtxt, as in Triton (model_analyzer's remote mode loads each
    # variant so): the served configuration shows it until a load without one goes back to the repository's.
    base = h.get_model_config("other")
    variant = dict(base, max_batch_size=2, dynamic_batching={"max_queue_delay_microseconds": "1000"},
                   instance_group=[{"count": 2, "kind": "KIND_GPU"}], optimization={"priority": "PRIORITY_MAX"})
    h.load_model("other", config=json.dumps(variant))
    assert h.is_model_ready("other")
    served = h.get_model_config("other")
    assert served["max_batch_size"] == 2 and served["dynamic_batching"]["max_queue_delay_microseconds"] == 1000
    assert g.get_model_config("other").config.max_batch_size == 2
    x = RNG.standard_normal((2, 1, 32, 32)).astype(np.float32)
    inp = httpclient.InferInput("image", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_allclose(h.infer("other", [inp]).as_numpy("logits"), ort_logits(triton_server.demo, x),
                               rtol=1e-4, atol=1e-4)
    time.sleep(0.2)
    assert served["instance_group"][0]["count"] == 2  # two concurrent runs (its kind is not used)
    assert re.search(r"config_ignored: load 'other': .*ModelConfig.optimization.*ModelInstanceGroup.kind KIND_GPU",
                     triton_server.output()), triton_server.output()[-3000:]
    # A configuration that does not fit the model fails the load naming the field; camelCase JSON names work too.
    with pytest.raises(InferenceServerException) as e:
        g.load_model("other", config=json.dumps({"maxBatchSize": 2, "input": [{"name": "nope", "dataType": "TYPE_FP32",
                                                                             "dims": ["1"]}]}))
    assert "input 'nope'" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        h.load_model("other", config="{not json")
    assert "parameter 'config': not JSON" in e.value.message()
    status, _, body = triton_server.request("POST", "/v2/repository/models/other/load",
                                            {"parameters": {"config": "{}", "file:1/model.onnx": "AAAA"}})
    assert status == 400 and b"loads model files from its repository only" in body
    status, _, body = triton_server.request("POST", "/v2/repository/models/other/load",
                                            {"parameters": {"config": {"max_batch_size": 2}}})
    assert status == 400 and b"parameter 'config' must be a string" in body
    deep = '{"dynamic_batching": ' * 100 + "{}" + "}" * 100  # nested past the JSON depth limit, refused before parsing
    status, _, body = triton_server.request("POST", "/v2/repository/models/other/load",
                                            {"parameters": {"config": deep}})
    assert status == 400 and b"nested" in body, body
    with pytest.raises(InferenceServerException) as e:  # a name not in the repository: nothing is kept for it
        h.load_model("nope", config=json.dumps({"max_batch_size": 2}))
    assert "not found" in e.value.message()
    h.load_model("other")  # back to the repository's configuration
    assert h.get_model_config("other")["max_batch_size"] == base["max_batch_size"] != 2
    with pytest.raises(InferenceServerException) as e:
        g.load_model("nope")
    assert "NOT_FOUND" in str(e.value.status())
    log = triton_server.output()
    assert "model_loaded: model 'other' version 1 ready" in log
    assert "model_unloaded: model 'other' version 1 unloaded (unloaded: by request)" in log


def test_log_records_requests_and_failures(triton_server):
    status, _, _ = triton_server.request("POST", "/v2/models/nope/infer", {"inputs": []})
    assert status == 404
    status, _, body = triton_server.request("POST", "/v2/models/digits/infer", b"")
    assert status == 400 and b"empty" in body  # an empty infer body is an error, not 200
    triton_server.request("GET", "/v2/health/ready")
    time.sleep(0.2)
    log = triton_server.output()
    assert "warning request_failed: POST /v2/models/nope/infer -> 404" in log and "model=nope" in log
    assert "reason=model 'nope' not found in the repository" in log
    assert "request_failed: POST /v2/models/digits/infer -> 400" in log
    assert re.search(r"info request: GET /v2/health/ready -> 200 bytes_in=0 bytes_out=\d+ us=\d+", log)
    assert "info start: osprey serve" in log and "max_images=128" in log


def test_json_log_and_parameters_warning(tmp_path, demo_model, start_repo):
    repo = tmp_path / "repo"
    copy_model(repo, "digits", demo_model)
    server = start_repo(repo, "--log-format", "json")
    body = {"parameters": {"sequence_id": 3},
            "inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 32, 32], "data": [0.0] * 1024}]}
    status, _, _ = server.request("POST", "/v2/models/digits/infer", body)
    assert status == 200
    time.sleep(0.2)
    lines = [json.loads(l) for l in server.output().splitlines() if l.startswith("{")]
    events = {l["event"] for l in lines}
    assert "start" in events
    assert all({"time", "level", "event", "message"} <= set(l) for l in lines)
    warning = [l for l in lines if l["event"] == "parameter_ignored"]
    assert warning and warning[0]["parameters"] == ["sequence_id"] and warning[0]["level"] == "warning"
    loaded = [l for l in lines if l["event"] == "model_loaded"]
    assert loaded and loaded[0]["model"] == "digits" and loaded[0]["weight_bytes"] > 0


def test_eviction_and_idle_reasons_are_logged(tmp_path, demo_model, start_repo):
    repo = tmp_path / "repo"
    for name in ("a", "b"):
        copy_model(repo, name, demo_model)
    # b's weights differ from a's (identical copies would share their weights and both fit).
    b = onnx.load(str(repo / "b" / "1" / "model.onnx"))
    for init in b.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.001 if init.data_type == 1 else
                                              numpy_helper.to_array(init), init.name))
    onnx.save(b, str(repo / "b" / "1" / "model.onnx"))
    size = (demo_model / "1" / "model.onnx").stat().st_size
    # Room for one model (its weights and their packed copy), not two.
    server = start_repo(repo, "--memory-budget", int(size * 2.6), "--memory-budget-rss", "off", "--idle-unload", 1)
    x = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 32, 32], "data": [0.0] * 1024}]}
    assert server.request("POST", "/v2/models/a/infer", x)[0] == 200
    assert server.request("POST", "/v2/models/b/infer", x)[0] == 200
    status, index = server.json("POST", "/v2/repository/index", {})
    reasons = {m["name"]: m["reason"] for m in index}
    assert reasons["a"].startswith("evicted: memory budget"), reasons
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        reasons = {m["name"]: m["reason"] for m in server.json("POST", "/v2/repository/index", {})[1]}
        if reasons["b"].startswith("idle"):
            break
        time.sleep(0.2)
    assert reasons["b"].startswith("idle: unused for 1 s"), reasons
    log = server.output()
    assert "unloaded (evicted: memory budget" in log and "unloaded (idle: unused for 1 s" in log


PBTXT = """
name: "digits"
platform: "onnxruntime_onnx"
max_batch_size: 8
version_policy: { specific: { versions: [1, 3] } }
input [ { name: "image" data_type: TYPE_FP32 dims: [ 1, 32, 32 ] } ]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }
model_warmup [ { name: "w" batch_size: 4 inputs { key: "image" value: { data_type: TYPE_FP32 dims: [ 1, 32, 32 ] random_data: true } } } ]
"""


def test_config_pbtxt_is_read_and_ignored_fields_named(tmp_path, demo_model, start_repo):
    repo = tmp_path / "repo"
    copy_model(repo, "digits", demo_model, versions=("1", "2", "3"), pbtxt=PBTXT)
    server = start_repo(repo, "--grpc-port", 0)
    h = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    config = h.get_model_config("digits")
    assert config["max_batch_size"] == 8
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert config["version_policy"] == {"specific": {"versions": [1, 3]}}
    assert config["model_warmup"][0]["batch_size"] == 4
    # version_policy: 3 is the newest allowed, 2 is not served.
    assert h.get_model_metadata("digits")["versions"] == ["3"]
    status, _, body = server.request("GET", "/v2/models/digits/versions/2")
    assert status == 404 and b"version_policy" in body
    x = np.zeros((1, 1, 32, 32), np.float32)
    hi = httpclient.InferInput("image", list(x.shape), "FP32")
    hi.set_data_from_numpy(x)
    assert h.infer("digits", [hi], model_version="1").get_response()["model_version"] == "1"
    log = server.output()
    assert "config_ignored" in log
    assert "ModelConfig.optimization" in log, log
    assert "instance_group" not in log.split("config_ignored")[1].split("\n")[0]  # its count is used now
    assert h.get_model_config("digits")["instance_group"][0]["count"] == 2
    assert "model_warmup: model 'digits'" in log


def test_bad_pbtxt_and_missing_model_reported_at_start(tmp_path, demo_model, start_repo):
    repo = tmp_path / "repo"
    copy_model(repo, "digits", demo_model, pbtxt="max_batch_size: 4\ninput [ { name: \"nope\" } ]\n")
    copy_model(repo, "broken_json", demo_model, config_json={"preprocess": {"resize": "sideways"}})
    (repo / "empty").mkdir()
    server = start_repo(repo)
    time.sleep(0.2)
    log = server.output()
    assert "repository_problem: model 'empty' cannot be served: no version directory" in log
    assert "repository_problem: model 'broken_json' cannot be served" in log and "sideways" in log
    index = {m["name"]: m for m in server.json("POST", "/v2/repository/index", {})[1]}
    assert index["empty"]["reason"].startswith("invalid: no version directory")
    assert index["broken_json"]["reason"].startswith("invalid: ") and "sideways" in index["broken_json"]["reason"]
    status, _, body = server.request("POST", "/v2/repository/models/digits/load", {})
    assert status == 503 and b"config.pbtxt input 'nope'" in body
    index = {m["name"]: m for m in server.json("POST", "/v2/repository/index", {})[1]}
    assert index["digits"]["reason"].startswith("failed: ")
    assert "error model_load_failed: model 'digits' version 1 failed to load: config.pbtxt input 'nope'" in \
        server.output()


def test_warmup_makes_the_first_request_warm(tmp_path, demo_model, start_repo):
    repo = tmp_path / "repo"
    copy_model(repo, "cold", demo_model)
    copy_model(repo, "warm", demo_model, config_json={"warmup": [1]})
    server = start_repo(repo, "--load", "cold", "--load", "warm")
    for name in ("cold", "warm"):
        body = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 32, 32], "data": [0.0] * 1024}]}
        assert server.request("POST", f"/v2/models/{name}/infer", body)[0] == 200
    metrics = server.request("GET", "/metrics")[2].decode()
    misses = dict(re.findall(r'osprey_plan_cache_misses_total\{model="(\w+)"\} (\d+)', metrics))
    # The warm model's plan was compiled at load: the request hit it. The cold one compiled on the request.
    hits = dict(re.findall(r'osprey_plan_cache_hits_total\{model="(\w+)"\} (\d+)', metrics))
    assert hits["warm"] == "1" and misses["warm"] == "1"
    assert hits["cold"] == "0" and misses["cold"] == "1"
    assert "model_warmup: model 'warm'" in server.output()


def test_config_files_are_rechecked_when_they_change(tmp_path, demo_model, start_repo):
    repo = tmp_path / "repo"
    d = copy_model(repo, "digits", demo_model, pbtxt="max_batch_size: [ oops\n")
    server = start_repo(repo)
    index = {m["name"]: m for m in server.json("POST", "/v2/repository/index", {})[1]}
    assert index["digits"]["reason"].startswith("invalid: ") and "line 1" in index["digits"]["reason"], index
    status, _, body = server.request("GET", "/v2/models/digits")
    assert status == 503 and b"config.pbtxt" in body and b"line 1" in body, body
    (d / "config.pbtxt").write_text("max_batch_size: 4\n")  # fixed: the next scan re-reads it
    index = {m["name"]: m for m in server.json("POST", "/v2/repository/index", {})[1]}
    assert index["digits"]["reason"] == "not loaded yet", index
    config = json.loads((d / "1" / "config.json").read_text())
    config["preprocess"] = {"layout": "CHWN"}
    (d / "1" / "config.json").write_text(json.dumps(config))  # broken: seen by the next scan too
    index = {m["name"]: m for m in server.json("POST", "/v2/repository/index", {})[1]}
    assert "CHWN" in index["digits"]["reason"], index


def test_grpc_typed_contents(triton_server, demo_model):
    """ModelInfer with typed contents (fp32_contents) instead of raw_input_contents: the same answer."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    x = RNG.random((2, 1, 32, 32), dtype=np.float32)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(f"127.0.0.1:{triton_server.grpc_port}"))
    request = service_pb2.ModelInferRequest(model_name="digits")
    tensor = request.inputs.add(name="image", datatype="FP32", shape=list(x.shape))
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    answer = stub.ModelInfer(request)
    out = np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(list(answer.outputs[0].shape))
    np.testing.assert_allclose(out, ort_logits(demo_model, x), rtol=1e-4, atol=1e-4)
    half = service_pb2.ModelInferRequest(model_name="digits")
    half.inputs.add(name="image", datatype="FP16", shape=[1, 1, 32, 32]).contents.fp32_contents.extend([0.0] * 1024)
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(half)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "raw_input_contents" in e.value.details()


def test_names_that_clients_percent_encode(tmp_path, demo_model, start_repo):
    """tritonclient quotes model names in URLs ('tenant one+é' -> 'tenant%20one%2B%C3%A9'): the server decodes each path
    segment (and query parts) after splitting, so an encoded '/' cannot reach the file system and a bad escape is a
    400 naming the rule."""
    name = "tenant one+é"
    repo = tmp_path / "repo"
    copy_model(repo, name, demo_model)
    server = start_repo(repo, "--grpc-port", 0, "--access-log", "--log-format", "json")
    grpc_port = int(re.search(r"gRPC on 127\.0\.0\.1:(\d+)", server.output()).group(1))
    x = RNG.random((1, 1, 32, 32), dtype=np.float32)
    expected = ort_logits(demo_model, x)
    http = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}")
    assert http.get_model_metadata(name)["name"] == name
    inp = httpclient.InferInput("image", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    np.testing.assert_allclose(http.infer(name, [inp]).as_numpy("logits"), expected, rtol=1e-4, atol=1e-4)
    assert http.is_model_ready(name)
    http.unload_model(name)
    assert not http.is_model_ready(name)
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    ginp = grpcclient.InferInput("image", list(x.shape), "FP32")
    ginp.set_data_from_numpy(x)
    np.testing.assert_allclose(grpc.infer(name, [ginp]).as_numpy("logits"), expected, rtol=1e-4, atol=1e-4)
    # Query parts are decoded too; a lower-case escape is as good as an upper-case one.
    status, _, data = server.request("GET", "/v2/models/tenant%20one%2b%c3%a9/versions/1/ready")
    assert status == 200, data
    for path, code, word in [("/v2/models/a%2F..%2Fb", 404, "not a valid model name"),
                             ("/v2/models/%2e%2e", 404, "not a valid model name"),
                             ("/v2/models/bad%zzname", 400, "percent-encoding"),
                             ("/v2/models/bad%", 400, "percent-encoding"),
                             ("/v2/models/x?version=%4", 400, "percent-encoding")]:
        status, _, data = server.request("GET", path)
        assert status == code and word in json.loads(data)["error"], (path, status, data)
    assert server.request("GET", "/v2/health/live")[0] == 200
    # The access log names the model as it was decoded; a bad escape's line keeps what was sent.
    time.sleep(0.2)
    lines = [json.loads(l) for l in server.output().splitlines() if l.startswith("{")]
    models = {l.get("model") for l in lines if l["event"] in ("request", "request_failed")}
    assert name in models and "bad%zzname" in models and "tenant%20one%2B%C3%A9" not in models, models


def test_grpc_calls_beyond_the_workers_wait_for_their_turn(triton_server, demo_model):
    """More concurrent gRPC calls than --workers (4) are held and served, as perf_analyzer's --concurrency-range needs
    (with gRPC's default completion queue per core, the 4th concurrent call got "Server Threadpool Exhausted")."""
    from concurrent.futures import ThreadPoolExecutor

    xs = [RNG.standard_normal((1, 1, 32, 32)).astype(np.float32) for _ in range(12)]
    barrier = __import__("threading").Barrier(len(xs))

    def call(x):
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{triton_server.grpc_port}")
        inp = grpcclient.InferInput("image", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        barrier.wait()
        return client.infer("digits", [inp]).as_numpy("logits")

    with ThreadPoolExecutor(len(xs)) as pool:
        outs = list(pool.map(call, xs))
    for x, out in zip(xs, outs):
        np.testing.assert_allclose(out, ort_logits(demo_model, x), rtol=1e-4, atol=1e-4)
