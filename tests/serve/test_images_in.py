"""Images straight in: multipart classify, BYTES inputs to infer (JSON base64 and the binary extension), and the
plan-cache counters in /metrics.

Oracles: the label in each sample's file name (demo-models/digits/samples/<label>_<i>.png), the binary-BYTES variant
for the JSON-BYTES logits (same bytes, same preprocessing, so equal exactly), and the classify endpoint's top-1."""

import base64
import json
import re

import numpy as np
import onnx
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper

from serve_support import Server

BOUNDARY = "osprey-test-boundary-7f3a"


def samples(demo_model, names):
    return [(n, (demo_model / "samples" / n).read_bytes()) for n in names]


def multipart(parts, boundary=BOUNDARY):
    """parts: (field name, filename or None, bytes) -> body bytes."""
    body = b"preamble to ignore\r\n"
    for field, filename, data in parts:
        disposition = f'form-data; name="{field}"' + (f'; filename="{filename}"' if filename else "")
        body += (f"--{boundary}\r\nContent-Disposition: {disposition}\r\nContent-Type: image/png\r\n\r\n").encode()
        body += data + b"\r\n"
    return body + f"--{boundary}--\r\n".encode()


def classify_multipart(server, body, boundary=BOUNDARY):
    return server.json("POST", "/v2/models/digits/classify", body,
                       {"Content-Type": f"multipart/form-data; boundary={boundary}"})


def label_of(name):
    return int(name.split("_")[0])


def test_multipart_three_images_in_order(server, demo_model):
    names = ["3_0.png", "7_1.png", "0_1.png"]
    body = multipart([("images", n, data) for n, data in samples(demo_model, names)])
    status, answer = classify_multipart(server, body)
    assert status == 200, answer
    assert answer["model"] == "digits" and answer["version"] == "1"
    assert [r["image"] for r in answer["results"]] == names
    for name, result in zip(names, answer["results"]):
        assert result["top_k"][0]["index"] == label_of(name), result
        assert len(result["top_k"]) == 3


def test_multipart_one_corrupt_part(server, demo_model):
    (name, good), = samples(demo_model, ["5_0.png"])
    body = multipart([("a", name, good), ("b", "broken.png", good[:50])])
    status, answer = classify_multipart(server, body)
    assert status == 200, answer
    ok, bad = answer["results"]
    assert ok["image"] == name and ok["top_k"][0]["index"] == 5 and "error" not in ok
    assert bad["image"] == "broken.png" and "png" in bad["error"].lower() and "top_k" not in bad


def test_multipart_field_name_when_no_filename(server, demo_model):
    (_, data), = samples(demo_model, ["2_0.png"])
    status, answer = classify_multipart(server, multipart([("digit", None, data)]))
    assert status == 200 and answer["results"][0]["image"] == "digit"


def test_multipart_all_parts_bad_is_400(server):
    status, answer = classify_multipart(server, multipart([("a", "x.png", b"nope"), ("b", "y.png", b"nope")]))
    assert status == 400 and "error" in answer and len(answer["results"]) == 2


def test_malformed_multipart_is_400(server, demo_model):
    (_, data), = samples(demo_model, ["1_0.png"])
    good = multipart([("a", "1_0.png", data)])
    cases = [
        (good, "multipart/form-data"),                                       # no boundary
        (good, "multipart/form-data; boundary=other"),                        # boundary never occurs
        (f"--{BOUNDARY}--\r\n".encode(), f"multipart/form-data; boundary={BOUNDARY}"),  # no parts
        (good[:-len(f"--{BOUNDARY}--\r\n") - 2], f"multipart/form-data; boundary={BOUNDARY}"),  # unterminated
        (f"--{BOUNDARY}\r\nContent-Type: image/png".encode(), f"multipart/form-data; boundary={BOUNDARY}"),
        (b"", f"multipart/form-data; boundary={BOUNDARY}"),
    ]
    for body, content_type in cases:
        status, answer = server.json("POST", "/v2/models/digits/classify", body, {"Content-Type": content_type})
        assert status == 400 and "multipart" in answer["error"], (content_type, body[:40], answer)


def test_multipart_too_many_parts_is_400(server):
    body = multipart([("a", None, b"x")] * 300)
    status, answer = classify_multipart(server, body)
    assert status == 400 and "parts" in answer["error"]


def bytes_infer_json(server, images):
    body = {"inputs": [{"name": "image", "shape": [len(images)], "datatype": "BYTES",
                        "data": [base64.b64encode(d).decode() for d in images]}]}
    status, answer = server.json("POST", "/v2/models/digits/infer", body)
    assert status == 200, answer
    out = answer["outputs"][0]
    return np.array(out["data"], np.float32).reshape(out["shape"])


def test_infer_bytes_json_and_binary_agree(server, triton, demo_model):
    names = ["4_0.png", "9_1.png", "6_0.png"]
    images = [d for _, d in samples(demo_model, names)]
    logits_json = bytes_infer_json(server, images)
    assert logits_json.shape == (3, 10)
    assert list(logits_json.argmax(axis=1)) == [label_of(n) for n in names]

    inp = httpclient.InferInput("image", [len(images)], "BYTES")
    inp.set_data_from_numpy(np.array(images, dtype=np.object_), binary_data=True)
    result = triton.infer("digits", [inp], outputs=[httpclient.InferRequestedOutput("logits", binary_data=True)])
    logits_binary = result.as_numpy("logits")
    np.testing.assert_array_equal(logits_binary, logits_json)

    # The classify endpoint preprocesses the same way: its top-1 is the logits' argmax.
    for name, data, row in zip(names, images, logits_json):
        status, answer = server.json("POST", "/v2/models/digits/classify", data, {"Content-Type": "image/png"})
        assert status == 200 and answer["results"][0]["top_k"][0]["index"] == int(row.argmax())


def test_infer_bytes_errors(server, demo_model):
    (_, data), = samples(demo_model, ["8_0.png"])
    b64 = base64.b64encode(data).decode()
    bad = [
        {"name": "image", "shape": [1], "datatype": "BYTES", "data": ["***not base64***"]},
        {"name": "image", "shape": [1], "datatype": "BYTES", "data": [base64.b64encode(b"not an image").decode()]},
        {"name": "image", "shape": [2], "datatype": "BYTES", "data": [b64]},
        {"name": "image", "shape": [1], "datatype": "BYTES", "data": [7]},
    ]
    for inp in bad:
        status, answer = server.json("POST", "/v2/models/digits/infer", {"inputs": [inp]})
        assert status == 400 and "image" in answer["error"], (inp["data"], answer)
    # Binary BYTES whose length prefix runs past the data.
    header = json.dumps({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": 8}}]}).encode()
    status, _, body = server.request("POST", "/v2/models/digits/infer", header + b"\xff\x00\x00\x00abcd",
                                     {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and b"BYTES" in body


def write_tiny(repo):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])
    c = numpy_helper.from_array(np.ones((1, 16), np.float32), "c")
    graph = helper.make_graph([helper.make_node("Add", ["x", "c"], ["y"])], "tiny", [x], [y], [c])
    d = repo / "tiny" / "1"
    d.mkdir(parents=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(d / "model.onnx"))


def test_infer_bytes_on_non_image_model_is_400(osprey_bin, demo_model, tmp_path):
    repo = tmp_path / "repo"
    write_tiny(repo)
    server = Server(osprey_bin, repo)
    try:
        png = (demo_model / "samples" / "1_0.png").read_bytes()
        body = {"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": [base64.b64encode(png).decode()]}]}
        status, answer = server.json("POST", "/v2/models/tiny/infer", body)
        assert status == 400 and "BYTES" in answer["error"] and "preprocessing" in answer["error"], answer
    finally:
        server.kill()


def test_metrics_plan_cache_counters(server, demo_model):
    (_, data), = samples(demo_model, ["3_1.png"])
    bytes_infer_json(server, [data])
    bytes_infer_json(server, [data])
    status, _, text = server.request("GET", "/metrics")
    assert status == 200
    text = text.decode()
    hits = re.search(r'^osprey_plan_cache_hits_total\{model="digits"\} (\d+)$', text, re.M)
    misses = re.search(r'^osprey_plan_cache_misses_total\{model="digits"\} (\d+)$', text, re.M)
    assert hits and misses, text
    assert int(misses.group(1)) >= 1 and int(hits.group(1)) >= 1
    assert re.search(r'^osprey_accounted_bytes\{model="digits"\} [1-9]\d*$', text, re.M)
