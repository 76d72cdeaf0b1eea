"""osprey heads train: tenants' heads on a backbone trained on digits 0-4 only (tools/make_demo_model.py --digits
0,1,2,3,4, cached), for classes it never saw (5-9), against scikit-learn and ONNX Runtime."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import make_demo_model  # noqa: E402
import make_test_models  # noqa: E402
BACKBONE = make_test_models.default_cache_dir() / "backbones" / "digits04"


@pytest.fixture(scope="module", autouse=True)
def backbone():
    """The digits 0-4 backbone, trained once (~20 s) and cached with the test models."""
    subprocess.run([sys.executable, str(REPO / "tools" / "make_demo_model.py"), "--digits", "0,1,2,3,4", "--name",
                    "digits04", "--out", str(BACKBONE.parent)], check=True, timeout=600)
    return BACKBONE
sys.path.insert(0, str(REPO / "tests"))
from pytest_support import cli_runner  # noqa: E402


def write_dataset(root: Path, classes: dict, per_class: int, seed: int = 0) -> Path:
    """An image folder from scikit-learn's digits: {folder name: digit}, `per_class` PNGs each, plus one broken file."""
    images, labels = make_demo_model.load_images()
    rng = np.random.default_rng(seed)
    for name, digit in classes.items():
        (root / name).mkdir(parents=True)
        idx = rng.permutation(np.flatnonzero(labels == digit))[:per_class]
        for k, i in enumerate(idx):
            Image.fromarray(images[i], mode="L").save(root / name / f"{k:04d}.png")
    (root / next(iter(classes)) / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    return root


@pytest.fixture(scope="module")
def trained(tmp_path_factory, osprey_bin):
    tmp = tmp_path_factory.mktemp("heads")
    data = write_dataset(tmp / "data", {"five": 5, "seven": 7, "nine": 9}, 60)
    repo = tmp / "repo"
    shutil.copytree(BACKBONE, repo / "digits")
    run = cli_runner(osprey_bin, 300)
    proc = run("heads", "train", "--backbone", repo / "digits", "--data", data, "--output", repo / "tenant_a",
               "--features-out", tmp / "features", "--threads", 2)
    assert proc.returncode == 0, proc.stderr
    return {"tmp": tmp, "data": data, "repo": repo, "out": Path(proc.stdout.strip()), "stderr": proc.stderr,
            "run": run}


def test_writes_a_model_directory(trained):
    out = trained["out"]
    assert out == trained["repo"] / "tenant_a" / "1"
    assert (out / "labels.txt").read_text().split() == ["five", "nine", "seven"]  # folder names, sorted
    assert (out / "config.json").read_text() == (BACKBONE / "1" / "config.json").read_text()
    report = json.loads((out / "train_report.json").read_text())
    assert report["classes"] == ["five", "nine", "seven"]
    assert report["images"] == 180 and len(report["unreadable"]) == 1
    assert "broken.png" in report["unreadable"][0]["file"]
    assert report["fit"]["converged"]
    assert report["accuracy"] >= 0.8  # 3 classes the backbone never saw; chance is 0.33
    assert "features" in trained["stderr"] and "fit" in trained["stderr"]  # progress lines


def test_backbone_weights_bit_identical(trained):
    base = onnx.load(str(BACKBONE / "1" / "model.onnx"))
    new = onnx.load(str(trained["out"] / "model.onnx"))
    old_inits = {i.name: onnx.numpy_helper.to_array(i) for i in base.graph.initializer}
    new_inits = {i.name: onnx.numpy_helper.to_array(i) for i in new.graph.initializer}
    assert old_inits.keys() == new_inits.keys()
    changed = [k for k in old_inits if old_inits[k].shape != new_inits[k].shape
               or not np.array_equal(old_inits[k], new_inits[k])]
    assert len(changed) == 2  # the classifier's weight and bias only
    for k in changed:
        assert 5 in old_inits[k].shape and 3 in new_inits[k].shape


def test_features_equal_truncated_backbone(trained):
    """osprey's features = ONNX Runtime on the backbone cut at the classifier's input (onnx.utils.Extractor)."""
    report = json.loads((trained["out"] / "train_report.json").read_text())
    feature = report["classifier"]["feature"]
    model = onnx.load(str(BACKBONE / "1" / "model.onnx"))
    input_name = model.graph.input[0].name
    cut = onnx.utils.Extractor(model).extract_model([input_name], [feature])
    session = ort.InferenceSession(cut.SerializeToString(), providers=["CPUExecutionProvider"])
    config = json.loads((BACKBONE / "1" / "config.json").read_text())
    pre = config.get("preprocess", config)
    mean, std = np.array(pre["mean"], np.float32), np.array(pre["std"], np.float32)
    files = sorted(p for p in (trained["data"]).rglob("*.png") if p.name != "broken.png")
    features = np.load(trained["tmp"] / "features" / "features.npy")
    assert features.shape == (180, report["classifier"]["feature_dim"])
    # Folder order: classes sorted, files sorted within each.
    for row, path in [(0, files[0]), (179, files[-1]), (70, files[70])]:
        x = np.asarray(Image.open(path), np.float32) / 255.0
        x = ((x - mean[0]) / std[0])[None, None]
        ref = session.run(None, {input_name: x})[0].reshape(-1)
        np.testing.assert_allclose(features[row], ref, rtol=1e-4, atol=1e-4)


def test_accuracy_matches_scikit_learn(trained):
    from sklearn.linear_model import LogisticRegression
    feats = trained["tmp"] / "features"
    x, y = np.load(feats / "features.npy"), np.load(feats / "labels.npy")
    val = np.load(feats / "validation.npy").astype(bool)
    clf = LogisticRegression(C=1.0, max_iter=5000).fit(x[~val], y[~val])
    sk_acc = float((clf.predict(x[val]) == y[val]).mean())
    ours = json.loads((trained["out"] / "train_report.json").read_text())["accuracy"]
    assert abs(ours - sk_acc) <= 0.01, f"osprey {ours:.4f} vs scikit-learn {sk_acc:.4f}"
    # Same objective, same optimum: the held-out probabilities agree too (the head read back from model.onnx).
    report = json.loads((trained["out"] / "train_report.json").read_text())
    model = onnx.load(str(trained["out"] / "model.onnx"))
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    (gemm,) = [n for n in model.graph.node if report["classifier"]["feature"] in n.input]
    assert gemm.op_type == "Gemm"
    w, b = inits[gemm.input[1]], inits[gemm.input[2]]
    transposed = any(a.name == "transB" and a.i == 1 for a in gemm.attribute)
    z = x[val] @ (w.T if transposed else w) + b
    ours_p = np.exp(z - z.max(axis=1, keepdims=True))
    ours_p /= ours_p.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(ours_p, clf.predict_proba(x[val]), atol=0.02)


def test_deterministic_and_new_versions(trained):
    run, repo = trained["run"], trained["repo"]
    proc = run("heads", "train", "--backbone", repo / "digits", "--data", trained["data"], "--output",
               repo / "tenant_a", "-q", "--threads", 2)
    assert proc.returncode == 0, proc.stderr
    second = Path(proc.stdout.strip())
    assert second == repo / "tenant_a" / "2"  # beside version 1, never over it
    assert (second / "model.onnx").read_bytes() == (trained["out"] / "model.onnx").read_bytes()


def test_classify_with_the_tenant(trained):
    run = trained["run"]
    files = sorted((trained["data"] / "seven").glob("0*.png"))[:5]
    proc = run("classify", trained["out"], *files, "--top-k", 1, "--json")
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)["results"]
    assert sum(r["top_k"][0]["label"] == "seven" for r in results) >= 4


def test_errors(trained, tmp_path):
    run = trained["run"]
    one_class = tmp_path / "one"
    (one_class / "only").mkdir(parents=True)
    Image.new("L", (32, 32)).save(one_class / "only" / "a.png")
    proc = run("heads", "train", "--backbone", trained["repo"] / "digits", "--data", one_class, "--output",
               tmp_path / "out")
    assert proc.returncode == 1 and "at least two" in proc.stderr
    proc = run("heads", "train", "--backbone", trained["repo"] / "digits", "--data", trained["data"], "--output",
               tmp_path / "out", "--features", "nope")
    assert proc.returncode == 1 and "not the classifier's input" in proc.stderr
    proc = run("heads", "train", "--backbone", tmp_path / "missing", "--data", trained["data"], "--output",
               tmp_path / "out")
    assert proc.returncode == 1


def test_five_tenants_share_the_backbone(trained, osprey_bin, tmp_path):
    """Five tenants (3..5 classes) trained on one backbone, served from one process: the backbone's weights are held
    once (server stats), and each tenant answers its own classes."""
    sys.path.insert(0, str(REPO / "tests" / "serve"))
    from serve_support import Server
    run, data_root = trained["run"], tmp_path / "data"
    repo = tmp_path / "repo"
    tenants = {"t2": {"a": 5, "b": 6}, "t3": {"c": 7, "d": 8, "e": 9}, "t4": {"w": 5, "x": 6, "y": 7, "z": 8},
               "t5": {"n5": 5, "n6": 6, "n7": 7, "n8": 8, "n9": 9}, "u3": {"p": 9, "q": 5, "r": 6}}
    for name, classes in tenants.items():
        data = write_dataset(data_root / name, classes, 30, seed=len(name) + len(classes))
        proc = run("heads", "train", "--backbone", trained["repo"] / "digits", "--data", data, "--output", repo / name,
                   "-q", "--threads", 2)
        assert proc.returncode == 0, proc.stderr
    server = Server(osprey_bin, repo)
    try:
        for name, classes in tenants.items():
            label, digit = next(iter(sorted(classes.items())))
            image = sorted((data_root / name / label).glob("0*.png"))[0].read_bytes()
            status, _, body = server.request("POST", f"/v2/models/{name}/classify", image,
                                             {"Content-Type": "image/png"})
            assert status == 200, body
            assert json.loads(body)["results"][0]["top_k"][0]["label"] in classes, body
        stats = server.json("GET", "/v2/models/stats")[1]["model_stats"]
        one = stats[0]["weight_bytes"]
        held = max(s["shared_bytes"] for s in stats) + sum(s["unique_bytes"] for s in stats)
        assert all(s["shared_bytes"] > 0.9 * s["weight_bytes"] for s in stats), stats
        print(f"five tenants hold {held} weight bytes, one tenant {one} ({held / one:.3f}x)")
        assert held <= 1.15 * one, f"five tenants hold {held} weight bytes, one tenant {one}"
    finally:
        server.kill()


def multipart(fields):
    """multipart/form-data body for [(field name, filename, bytes)]."""
    boundary = "osprey-test-boundary-7d1f"
    out = b""
    for name, filename, data in fields:
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\n"
                f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return out, f"multipart/form-data; boundary={boundary}"


def wait_done(server, name, timeout=120):
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, body = server.json("GET", f"/v2/repository/models/{name}/train/status")
        assert status == 200, body
        if body["state"] in ("done", "failed"):
            return body
        time.sleep(0.2)
    pytest.fail(f"training job for {name} did not finish in {timeout} s")


def test_http_training_job(trained, osprey_bin, tmp_path):
    sys.path.insert(0, str(REPO / "tests" / "serve"))
    from serve_support import Server
    repo = tmp_path / "repo"
    shutil.copytree(BACKBONE, repo / "digits")
    data = write_dataset(tmp_path / "data", {"six": 6, "eight": 8, "seven": 7}, 25, seed=5)
    fields = [(label.name, f.name, f.read_bytes()) for label in sorted(data.iterdir()) for f in sorted(label.iterdir())]
    body, content_type = multipart(fields)
    server = Server(osprey_bin, repo, "--allow-training", "--max-training-images", "100",
                    "--training-data-root", tmp_path)
    try:
        status, _, answer = server.request("POST", "/v2/repository/models/tenant/train?backbone=digits", body,
                                           {"Content-Type": content_type})
        assert status == 202, answer
        assert json.loads(answer)["classes"] == ["eight", "seven", "six"]
        done = wait_done(server, "tenant")
        assert done["state"] == "done", done
        assert done["version"] == "1" and len(done["report"]["unreadable"]) == 1  # the broken upload
        assert done["report"]["accuracy"] >= 0.8 and done["progress"]
        image = sorted((data / "seven").glob("0*.png"))[0].read_bytes()
        status, _, answer = server.request("POST", "/v2/models/tenant/classify", image, {"Content-Type": "image/png"})
        assert status == 200 and json.loads(answer)["results"][0]["top_k"][0]["label"] == "seven", answer
        assert not list((repo / ".training").iterdir())  # uploads deleted when the job ends

        # A server-side dataset under --training-data-root; a second version beside the first.
        status, answer = server.json("POST", "/v2/repository/models/tenant/train",
                                     {"backbone": "digits", "dataset": "data"})
        assert status == 202, answer
        assert wait_done(server, "tenant")["version"] == "2"

        # Refused: outside the data root, too many images, bad label, missing backbone, unknown model's status.
        status, answer = server.json("POST", "/v2/repository/models/tenant/train",
                                     {"backbone": "digits", "dataset": "../.."})
        assert status == 400 and "training-data-root" in answer["error"]
        many, ct = multipart([("a", f"{i}.png", b"x") for i in range(60)] + [("b", f"{i}.png", b"x") for i in range(60)])
        status, _, answer = server.request("POST", "/v2/repository/models/t2/train?backbone=digits", many,
                                           {"Content-Type": ct})
        assert status == 400, answer
        bad, ct = multipart([("../evil", "a.png", fields[0][2]), ("ok", "b.png", fields[1][2])])
        status, _, answer = server.request("POST", "/v2/repository/models/t3/train?backbone=digits", bad,
                                           {"Content-Type": ct})
        assert status == 400 and b"label" in answer, answer
        status, _, answer = server.request("POST", "/v2/repository/models/t4/train", body,
                                           {"Content-Type": content_type})
        assert status == 400 and b"backbone" in answer
        status, _, answer = server.request("POST", "/v2/repository/models/t5/train?backbone=nope", body,
                                           {"Content-Type": content_type})
        assert status == 404, answer
        assert server.json("GET", "/v2/repository/models/none/train/status")[0] == 404
        status, answer = server.json("POST", "/v2/repository/models/digits/train",
                                     {"backbone": "digits", "dataset": "data"})
        assert status == 400 and "own backbone" in answer["error"]
        deep = b"[" * 100000 + b"]" * 100000  # refused before parsing, as on the infer routes
        status, _, answer = server.request("POST", "/v2/repository/models/t6/train", deep,
                                           {"Content-Type": "application/json"})
        assert status == 400 and b"nested deeper" in answer, answer
    finally:
        server.kill()
    off = Server(osprey_bin, repo)
    try:
        status, _, answer = off.request("POST", "/v2/repository/models/x/train?backbone=digits", body,
                                        {"Content-Type": content_type})
        assert status == 404 and b"--allow-training" in answer
    finally:
        off.kill()


def test_feature_augmentation(trained, tmp_path):
    """--augment PIPELINE --copies K adds K augmented versions of each training image (never of held-out ones)."""
    pipeline = tmp_path / "aug.json"
    pipeline.write_text(json.dumps({"type": "Compose", "transforms": [
        {"type": "Affine", "scale": [0.9, 1.1], "rotate": [-10, 10], "p": 1},
        {"type": "RandomBrightnessContrast", "p": 0.5}]}))
    run = trained["run"]
    args = ["heads", "train", "--backbone", trained["repo"] / "digits", "--data", trained["data"], "--augment", pipeline,
            "--copies", 2, "--threads", 2]
    first = run(*args, "--output", tmp_path / "a")
    assert first.returncode == 0, first.stderr
    report = json.loads((Path(first.stdout.strip()) / "train_report.json").read_text())
    plain = json.loads((trained["out"] / "train_report.json").read_text())
    assert report["augmented_images"] == 2 * report["train_images"] == 2 * plain["train_images"]
    assert report["validation_images"] == plain["validation_images"]
    assert report["accuracy"] >= 0.8 and "augmentation" in first.stderr
    second = run(*args, "--output", tmp_path / "b")
    assert (Path(second.stdout.strip()) / "model.onnx").read_bytes() == \
        (Path(first.stdout.strip()) / "model.onnx").read_bytes()  # deterministic with augmentation too
    bad = run("heads", "train", "--backbone", trained["repo"] / "digits", "--data", trained["data"], "--augment",
              tmp_path / "missing.json", "--copies", 1, "--output", tmp_path / "c")
    assert bad.returncode == 1 and "missing.json" in bad.stderr
