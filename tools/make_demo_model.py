#!/usr/bin/env python3
"""Trains osprey's built-in demo classifier and writes it as a model directory.

The model is a small CNN trained with torch on scikit-learn's bundled 8x8 handwritten digits data set (1797 images,
shipped inside the scikit-learn wheel: no download), upscaled to 32x32 grayscale. Training is seeded and single-run
deterministic; it takes a few seconds on two cores. Output (default: <repo>/demo-models):

    digits/1/model.onnx     opset 13, input "image" float32 [N, 1, 32, 32], output "logits" [N, 10]
    digits/1/config.json    preprocessing: GRAY, exact resize to 32x32, scale 1/255, the training set's mean/std
    digits/labels.txt       "0".."9"
    digits/samples/<label>_<i>.png   held-out images (never trained on), 32x32 grayscale PNG
    digits/1/metrics.json   held-out accuracy

Does nothing when the files exist (scripts/setup calls it on every run); --force retrains.
"""

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NAME = "digits"
VERSION = "1"
SIZE = 32
SEED = 20240601
SAMPLES_PER_CLASS = 2


def expected_files(out: Path, name: str = NAME):
    d = out / name
    return [d / VERSION / "model.onnx", d / VERSION / "config.json", d / "labels.txt", d / VERSION / "metrics.json",
            d / "samples"]


def load_images():
    """The digits data set as uint8 [n, 32, 32] images (8x8 values 0..16 scaled to 0..255, bilinear upscale)."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = np.clip(np.rint(digits.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    big = np.stack([np.asarray(Image.fromarray(im, mode="L").resize((SIZE, SIZE), Image.BILINEAR)) for im in small])
    return big, digits.target.astype(np.int64)


def build_net(classes: int = 10):
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 16x16
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 8x8
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 4x4
        nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, classes))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "demo-models")
    parser.add_argument("--force", action="store_true", help="retrain even when the files exist")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--digits", default="0,1,2,3,4,5,6,7,8,9",
                        help="train on these digits only (e.g. 0,1,2,3,4: a backbone for tenants with unseen classes)")
    parser.add_argument("--name", default=NAME, help="model name (folder under --out)")
    args = parser.parse_args()
    digits = sorted({int(d) for d in args.digits.split(",")})
    if not args.force and all(p.exists() for p in expected_files(args.out, args.name)):
        return 0

    import numpy as np
    import torch
    from PIL import Image

    start = time.time()
    torch.manual_seed(SEED)
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    images, labels = load_images()
    keep = np.isin(labels, digits)
    images, labels = images[keep], np.searchsorted(digits, labels[keep]).astype(np.int64)

    # Held-out split: a seeded permutation, 20% test.
    perm = np.random.default_rng(SEED).permutation(len(labels))
    n_test = len(labels) // 5
    test_idx, train_idx = perm[:n_test], perm[n_test:]
    x_all = images.astype(np.float32) / 255.0
    mean = float(x_all[train_idx].mean())
    std = float(x_all[train_idx].std())
    to_tensor = lambda idx: torch.from_numpy(((x_all[idx] - mean) / std)[:, None, :, :].astype(np.float32))
    x_train, y_train = to_tensor(train_idx), torch.from_numpy(labels[train_idx])
    x_test, y_test = to_tensor(test_idx), torch.from_numpy(labels[test_idx])

    net = build_net(len(digits))
    opt = torch.optim.Adam(net.parameters(), lr=2e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(SEED)
    for _ in range(args.epochs):
        net.train()
        order = torch.randperm(len(y_train), generator=gen)
        for i in range(0, len(order), 64):
            b = order[i:i + 64]
            opt.zero_grad()
            loss_fn(net(x_train[b]), y_train[b]).backward()
            opt.step()
    net.eval()
    with torch.no_grad():
        predicted = net(x_test).argmax(1)
    accuracy = float((predicted == y_test).float().mean())

    model_dir = args.out / args.name / VERSION
    model_dir.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(net, x_test[:1], str(model_dir / "model.onnx"), opset_version=13, input_names=["image"],
                      output_names=["logits"], dynamic_axes={"image": {0: "N"}, "logits": {0: "N"}})
    config = {
        "input": "image",
        "preprocess": {"resize": "exact", "resize_mode": "bilinear", "height": SIZE, "width": SIZE,
                       "color": "GRAY", "scale": 1.0 / 255.0, "mean": [mean], "std": [std], "layout": "NCHW"},
        "postprocess": {"softmax": True, "top_k": 3},
    }
    (model_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (args.out / args.name / "labels.txt").write_text("".join(f"{d}\n" for d in digits))

    samples = args.out / args.name / "samples"
    samples.mkdir(exist_ok=True)
    for index, digit in enumerate(digits):
        chosen = [i for i in test_idx if labels[i] == index][:SAMPLES_PER_CLASS]
        for k, i in enumerate(chosen):
            Image.fromarray(images[i], mode="L").save(samples / f"{digit}_{k}.png")
    metrics = {"dataset": "sklearn.datasets.load_digits (8x8, upscaled to 32x32)", "train": int(len(train_idx)),
               "test": int(n_test), "test_accuracy": accuracy, "epochs": args.epochs, "seed": SEED,
               "train_seconds": round(time.time() - start, 1), "torch": torch.__version__}
    (model_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(f"make_demo_model: {args.name}: held-out accuracy {accuracy:.4f} on {n_test} images "
          f"({metrics['train_seconds']} s) -> {model_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
