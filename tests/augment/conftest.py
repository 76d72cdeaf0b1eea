"""Fixtures for `osprey augment` tests: synthetic detection datasets with solid coloured rectangles at known boxes."""

import json
import os
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")  # albumentations otherwise checks PyPI on import

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
from pytest_support import cli_runner, osprey_bin, osprey_bin_path  # noqa: E402,F401  (shared fixture)
COLORS = [(230, 20, 20), (20, 230, 20), (20, 20, 230)]  # RGB, one per category index


@pytest.fixture
def augment(osprey_bin):
    """augment(*args, timeout=120) -> CompletedProcess of `osprey augment ARGS` (text mode)."""

    return cli_runner(osprey_bin, 180, "augment")


def synthetic_image(rng: np.random.Generator, h: int, w: int):
    """An RGB image (grey background) with 1-3 non-overlapping coloured rectangles; returns (image, [(cat, x0, y0, x1, y1)])."""
    img = np.full((h, w, 3), 100, np.uint8)
    objects = []
    cells = [(0, 0), (1, 0), (0, 1), (1, 1)]
    rng.shuffle(cells)
    for cat in range(int(rng.integers(1, 4))):
        cx, cy = cells[cat]
        x0 = int(cx * w // 2 + rng.integers(4, w // 8))
        y0 = int(cy * h // 2 + rng.integers(4, h // 8))
        x1 = int(min(x0 + rng.integers(w // 6, w // 3), (cx + 1) * w // 2 - 2))
        y1 = int(min(y0 + rng.integers(h // 6, h // 3), (cy + 1) * h // 2 - 2))
        img[y0:y1, x0:x1] = COLORS[cat]
        objects.append((cat, x0, y0, x1, y1))
    return img, objects


def write_image(path: Path, img: np.ndarray):
    path.parent.mkdir(parents=True, exist_ok=True)
    ok = cv2.imwrite(str(path), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    assert ok, path


@pytest.fixture
def coco_dataset(tmp_path):
    """make(n, sizes=None, seed=0) -> path of annotations.json of a COCO dataset of synthetic images (PNG)."""

    def make(n=6, seed=0, root=None):
        rng = np.random.default_rng(seed)
        root = Path(root or tmp_path / "coco")
        images, annotations = [], []
        for i in range(n):
            h, w = int(rng.integers(120, 260)), int(rng.integers(120, 260))
            img, objs = synthetic_image(rng, h, w)
            name = f"img{i:03d}.png"
            write_image(root / "images" / name, img)
            images.append({"id": i + 1, "file_name": name, "width": w, "height": h})
            for cat, x0, y0, x1, y1 in objs:
                annotations.append({
                    "id": len(annotations) + 1, "image_id": i + 1, "category_id": cat + 1,
                    "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0,
                    "segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]],
                    "keypoints": [(x0 + x1) / 2, (y0 + y1) / 2, 2], "num_keypoints": 1})
        cats = [{"id": c + 1, "name": ["red", "green", "blue"][c], "keypoints": ["centre"], "skeleton": []}
                for c in range(3)]
        ann = root / "annotations.json"
        ann.write_text(json.dumps({"images": images, "annotations": annotations, "categories": cats}))
        return ann

    return make


@pytest.fixture
def yolo_dataset(tmp_path):
    """make(n, seed=0) -> folder of a YOLO dataset (images/, labels/, classes.txt) of synthetic JPEG images."""

    def make(n=6, seed=1, root=None):
        rng = np.random.default_rng(seed)
        root = Path(root or tmp_path / "yolo")
        for i in range(n):
            h, w = int(rng.integers(120, 260)), int(rng.integers(120, 260))
            img, objs = synthetic_image(rng, h, w)
            write_image(root / "images" / f"img{i:03d}.png", img)
            lines = [f"{cat} {(x0 + x1) / 2 / w:.6f} {(y0 + y1) / 2 / h:.6f} {(x1 - x0) / w:.6f} {(y1 - y0) / h:.6f}"
                     for cat, x0, y0, x1, y1 in objs]
            (root / "labels").mkdir(parents=True, exist_ok=True)
            (root / "labels" / f"img{i:03d}.txt").write_text("\n".join(lines) + "\n")
        (root / "classes.txt").write_text("red\ngreen\nblue\n")
        return root

    return make


def color_region(img: np.ndarray, cat: int):
    """(x0, y0, x1, y1, count) of the pixels near the category's colour (RGB image)."""
    d = np.abs(img.astype(np.int32) - np.array(COLORS[cat], np.int32)).sum(axis=2)
    ys, xs = np.nonzero(d < 90)
    if len(xs) == 0:
        return None
    return xs.min(), ys.min(), xs.max() + 1, ys.max() + 1, len(xs)


def iou(a, b):
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def read_rgb(path: Path) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert img is not None, path
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def tree_bytes(root: Path, exclude=("preview.png",)):
    """{relative path: bytes} of every file under root (the .osprey-augment bookkeeping excluded)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and not rel.startswith(".osprey-augment") and p.name not in exclude:
            out[rel] = p.read_bytes()
    return out
