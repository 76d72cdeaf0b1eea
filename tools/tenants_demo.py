"""make tenants-demo: three tenants ("bots") with 2, 3 and 5 classes, each a head trained on one shared backbone
from labelled images, served by one osprey process, classifying held-out images.

The backbone is the demo CNN trained on scikit-learn's handwritten digits 0-4 only (tools/make_demo_model.py
--digits 0,1,2,3,4); the tenants' classes are digits 5-9, which it never saw. Writes build/tenants-demo/."""
import argparse
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import make_demo_model  # noqa: E402

TENANTS = {"pairs": {"five": 5, "six": 6}, "trio": {"seven": 7, "eight": 8, "nine": 9},
           "all_new": {"five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "build" / "bin" / "osprey"))
    ap.add_argument("--out", default=str(REPO / "build" / "tenants-demo"))
    ap.add_argument("--train-per-class", type=int, default=120)
    args = ap.parse_args()
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    repo = out / "repo"
    print("tenants-demo: training the backbone on digits 0-4 (cached after the first run)", flush=True)
    cache = Path.home() / ".cache" / "osprey" / "models" / "backbones"
    subprocess.run([sys.executable, str(REPO / "tools" / "make_demo_model.py"), "--digits", "0,1,2,3,4", "--name",
                    "digits04", "--out", str(cache)], check=True)
    shutil.copytree(cache / "digits04", repo / "backbone")
    images, labels = make_demo_model.load_images()
    rng = np.random.default_rng(0)
    heldout = {}
    for tenant, classes in TENANTS.items():
        data = out / "data" / tenant
        heldout[tenant] = []
        for name, digit in classes.items():
            idx = rng.permutation(np.flatnonzero(labels == digit))
            (data / name).mkdir(parents=True)
            for k, i in enumerate(idx[:args.train_per_class]):
                Image.fromarray(images[i], mode="L").save(data / name / f"{k:04d}.png")
            for k, i in enumerate(idx[args.train_per_class:]):
                path = out / "heldout" / tenant / f"{name}_{k:03d}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(images[i], mode="L").save(path)
                heldout[tenant].append((path, name))
        proc = subprocess.run([args.bin, "heads", "train", "--backbone", str(repo / "backbone"), "--data", str(data),
                               "--output", str(repo / tenant), "--threads", "2"], capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(proc.stderr)
        report = json.loads((Path(proc.stdout.strip()) / "train_report.json").read_text())
        print(f"tenants-demo: {tenant}: {len(classes)} classes, {report['train_images']} training images, "
              f"validation accuracy {report['accuracy']:.3f}, features {report['seconds']['features']:.2f} s, "
              f"fit {report['seconds']['fit']:.2f} s", flush=True)

    server = subprocess.Popen([args.bin, "serve", "--model-repository", str(repo), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = None
        for line in server.stdout:
            m = re.search(r"http://[0-9.]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if port is None:
            sys.exit("tenants-demo: the server did not start")
        url = f"http://127.0.0.1:{port}"
        for tenant, items in heldout.items():
            correct = 0
            for path, name in items:
                req = urllib.request.Request(f"{url}/v2/models/{tenant}/classify", data=path.read_bytes(),
                                             headers={"Content-Type": "image/png"})
                top = json.load(urllib.request.urlopen(req, timeout=30))["results"][0]["top_k"][0]["label"]
                correct += top == name
            print(f"tenants-demo: {tenant}: held-out accuracy through the server {correct / len(items):.3f} "
                  f"({correct}/{len(items)} images)", flush=True)
        stats = json.load(urllib.request.urlopen(f"{url}/v2/models/stats", timeout=30))["model_stats"]
        for s in stats:
            print(f"tenants-demo: {s['name']}: weight bytes {s['weight_bytes']}, shared with others "
                  f"{s['shared_bytes']}, own {s['unique_bytes']}")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
