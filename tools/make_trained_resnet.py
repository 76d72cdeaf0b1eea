#!/usr/bin/env python3
"""Trains a real architecture (torchvision ResNet-18, unmodified, 10 classes) on real images and exports it.

For the bf16 accuracy check of issue 5 we need a *trained* standard architecture: random-weight networks score
classes too closely for a top-1 comparison to mean anything, and nothing may be downloaded (no pretrained weights).
So: scikit-learn's bundled handwritten digits (1797 real 8x8 scans, upscaled to 32x32, gray replicated to RGB), a
seeded 80/20 split (the same as tools/make_demo_model.py), a few epochs of SGD (~30 s on two cores). Output, in the
test-model cache (~/.cache/osprey/models or $OSPREY_MODEL_CACHE):

    resnet18_digits.onnx            opset 13, input "input" float32 [N, 3, 32, 32], output "logits" [N, 10]
    resnet18_digits.heldout.npy     the held-out images, float32 [n, 3, 32, 32], normalised as trained
    resnet18_digits.labels.npy      their labels, int64 [n]
    resnet18_digits.json            held-out accuracy and training time

Does nothing when the files exist; --force retrains.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_demo_model  # noqa: E402  (load_images, SEED: the same data and split)
import make_test_models  # noqa: E402  (default_cache_dir)

NAME = "resnet18_digits"


def paths(out: Path) -> dict:
    return {k: out / f"{NAME}{suffix}" for k, suffix in
            [("onnx", ".onnx"), ("images", ".heldout.npy"), ("labels", ".labels.npy"), ("meta", ".json")]}


def ensure(out: Path = None, force: bool = False, epochs: int = 6, log=print) -> dict:
    out = Path(out or make_test_models.default_cache_dir())
    p = paths(out)
    if not force and all(v.exists() for v in p.values()):
        return p
    import numpy as np
    import torch
    import torchvision

    start = time.time()
    torch.manual_seed(make_demo_model.SEED)
    torch.set_num_threads(2)
    images, labels = make_demo_model.load_images()
    perm = np.random.default_rng(make_demo_model.SEED).permutation(len(labels))
    n_test = len(labels) // 5
    test_idx, train_idx = perm[:n_test], perm[n_test:]
    x = np.repeat((images.astype(np.float32) / 255.0 - 0.5)[:, None] / 0.5, 3, axis=1)  # [n, 3, 32, 32] in [-1, 1]
    xt, yt = torch.from_numpy(x[train_idx]), torch.from_numpy(labels[train_idx])
    net = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=epochs * ((len(train_idx) + 63) // 64))
    loss_fn = torch.nn.CrossEntropyLoss()
    for epoch in range(epochs):
        net.train()
        order = torch.randperm(len(train_idx))
        for i in range(0, len(order), 64):
            b = order[i:i + 64]
            opt.zero_grad()
            loss = loss_fn(net(xt[b]), yt[b])
            loss.backward()
            opt.step()
            sched.step()
        log(f"make_trained_resnet: epoch {epoch + 1}/{epochs} loss {loss.item():.3f}")
    net.eval()
    with torch.no_grad():
        pred = net(torch.from_numpy(x[test_idx])).argmax(1).numpy()
    acc = float((pred == labels[test_idx]).mean())
    out.mkdir(parents=True, exist_ok=True)
    tmp = p["onnx"].with_suffix(".onnx.tmp")
    torch.onnx.export(net, torch.zeros(1, 3, 32, 32), str(tmp), input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "N"}, "logits": {0: "N"}}, opset_version=13)
    tmp.replace(p["onnx"])
    np.save(p["images"], x[test_idx].astype(np.float32))
    np.save(p["labels"], labels[test_idx].astype(np.int64))
    p["meta"].write_text(json.dumps({"heldout_accuracy": acc, "heldout_images": int(n_test), "epochs": epochs,
                                     "train_seconds": round(time.time() - start, 1)}))
    log(f"make_trained_resnet: held-out accuracy {acc:.4f} on {n_test} images ({time.time() - start:.0f} s)")
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--epochs", type=int, default=6)
    args = ap.parse_args()
    ensure(args.out, args.force, args.epochs)


if __name__ == "__main__":
    main()
