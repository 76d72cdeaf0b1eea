"""`osprey augment` end to end: boxes follow the pixels (COCO and YOLO), photometric transforms agree with
Albumentations, Albumentations-serialised pipelines run, output is deterministic across thread counts, --resume and
--shard complete the same dataset, and bad input is reported per item."""

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from conftest import color_region, iou, read_rgb, tree_bytes, write_image

GEOMETRIC = {"type": "Compose", "transforms": [
    {"type": "HorizontalFlip", "p": 0.5},
    {"type": "Affine", "scale": [0.85, 1.15], "translate_percent": [-0.05, 0.05], "rotate": [-15, 15], "p": 0.8},
    {"type": "RandomRotate90", "p": 0.5},
    {"type": "LongestMaxSize", "max_size": 200, "p": 1},
    {"type": "PadIfNeeded", "min_height": 200, "min_width": 200, "border_mode": 0, "p": 1},
    {"type": "RandomBrightnessContrast", "brightness_limit": 0.05, "contrast_limit": 0.05, "p": 0.5}],
    "bbox_params": {"min_visibility": 0.2}}

PHOTO_AND_GEO = {"type": "Compose", "transforms": [
    {"type": "RandomResizedCrop", "size": [160, 160], "scale": [0.5, 1.0], "p": 1},
    {"type": "HorizontalFlip", "p": 0.5},
    {"type": "ColorJitter", "p": 0.8},
    {"type": "GaussianBlur", "blur_limit": [3, 5], "p": 0.5},
    {"type": "GaussNoise", "std_range": [0.02, 0.05], "p": 0.3},
    {"type": "CoarseDropout", "num_holes_range": [1, 2], "hole_height_range": [8, 16], "hole_width_range": [8, 16],
     "p": 0.3}]}


def write_pipeline(tmp_path: Path, spec, name="pipeline.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(spec))
    return p


def check_boxes_follow_pixels(img: np.ndarray, boxes):
    """boxes: [(category index, x0, y0, x1, y1)] in pixels. Every visible colour has its box with IoU >= 0.9."""
    checked = 0
    for cat in range(3):
        region = color_region(img, cat)
        mine = [b for b in boxes if b[0] == cat]
        if region is None or region[4] < 60:
            continue
        assert len(mine) == 1, f"colour {cat} visible ({region[4]} px) but boxes {mine}"
        assert iou(region[:4], mine[0][1:]) >= 0.9, f"colour {cat}: pixels {region[:4]} vs box {mine[0][1:]}"
        checked += 1
    slack = 0.01  # YOLO labels carry 6 decimals of the image size
    for b in boxes:
        assert -slack <= b[1] < b[3] <= img.shape[1] + slack and -slack <= b[2] < b[4] <= img.shape[0] + slack, b
    return checked


def test_coco_boxes_polygons_keypoints_follow_the_pixels(augment, coco_dataset, tmp_path):
    ann = coco_dataset(n=8)
    out = tmp_path / "out"
    r = augment("--pipeline", write_pipeline(tmp_path, GEOMETRIC), "--input", ann, "--output", out, "--copies", 3,
                "--seed", 5, "--progress", "lines")
    assert r.returncode == 0, r.stderr
    # Plain progress lines (not a terminal): the final one says everything was done, with a rate and an ETA.
    assert re.search(r"augment: 24/24 \(100\.0%\) [\d.]+ images/s, ETA", r.stderr), r.stderr
    assert "objects" in r.stdout and "0 failed" in r.stdout, r.stdout
    coco = json.loads((out / "annotations.json").read_text())
    assert len(coco["images"]) == 24
    assert [c["id"] for c in coco["categories"]] == [1, 2, 3]
    by_image = {}
    for a in coco["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a)
    checked = 0
    for im in coco["images"]:
        img = read_rgb(out / "images" / im["file_name"])
        assert img.shape[:2] == (im["height"], im["width"]) == (200, 200)
        anns = by_image.get(im["id"], [])
        boxes = [(a["category_id"] - 1, a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2],
                  a["bbox"][1] + a["bbox"][3]) for a in anns]
        checked += check_boxes_follow_pixels(img, boxes)
        for a in anns:
            # The polygon (the rectangle's outline) stays inside the box; the keypoint (its centre) is on its colour.
            xs, ys = a["segmentation"][0][0::2], a["segmentation"][0][1::2]
            x0, y0, w, h = a["bbox"]
            assert min(xs) >= x0 - 0.5 and max(xs) <= x0 + w + 0.5 and min(ys) >= y0 - 0.5 and max(ys) <= y0 + h + 0.5
            kx, ky, kv = a["keypoints"]
            if kv > 0:
                px = img[int(ky), int(kx)].astype(int)
                assert np.abs(px - np.array([(230, 20, 20), (20, 230, 20), (20, 20, 230)][a["category_id"] - 1])).sum() < 90
    assert checked >= 20


def test_yolo_boxes_follow_the_pixels(augment, yolo_dataset, tmp_path):
    root = yolo_dataset(n=8)
    out = tmp_path / "out"
    r = augment("--pipeline", write_pipeline(tmp_path, GEOMETRIC), "--input", root, "--output", out, "--copies", 2,
                "--image-format", "png")
    assert r.returncode == 0, r.stderr
    assert (out / "classes.txt").read_text().split() == ["red", "green", "blue"]
    images = sorted((out / "images").glob("*.png"))
    assert len(images) == 16
    checked = 0
    for p in images:
        img = read_rgb(p)
        h, w = img.shape[:2]
        boxes = []
        for line in (out / "labels" / (p.stem + ".txt")).read_text().split("\n"):
            if line.strip():
                c, cx, cy, bw, bh = line.split()
                cx, cy, bw, bh = float(cx) * w, float(cy) * h, float(bw) * w, float(bh) * h
                boxes.append((int(c), cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2))
        checked += check_boxes_follow_pixels(img, boxes)
    assert checked >= 12


def test_coco_to_yolo_maps_category_ids_to_indices(augment, coco_dataset, tmp_path):
    ann = coco_dataset(n=3)
    out = tmp_path / "out"
    r = augment("--pipeline", write_pipeline(tmp_path, {"type": "HorizontalFlip", "p": 1}), "--input", ann,
                "--output", out, "--output-format", "yolo")
    assert r.returncode == 0, r.stderr
    for p in sorted((out / "images").glob("*")):
        img = read_rgb(p)
        h, w = img.shape[:2]
        for line in (out / "labels" / (p.stem + ".txt")).read_text().split("\n"):
            if line.strip():
                parts = line.split()
                c = int(parts[0])
                assert c in (0, 1, 2)
                if len(parts) == 5:
                    cx, cy, bw, bh = (float(v) for v in parts[1:])
                    region = color_region(img, c)
                    assert iou(region[:4], ((cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w,
                                            (cy + bh / 2) * h)) >= 0.9


def astronaut_dataset(tmp_path: Path) -> Path:
    from skimage import data
    img = cv2.resize(data.astronaut(), (200, 160), interpolation=cv2.INTER_AREA)
    root = tmp_path / "one"
    write_image(root / "images" / "a.png", img)
    (root / "labels").mkdir(parents=True)
    (root / "labels" / "a.txt").write_text("0 0.5 0.5 0.4 0.4\n")
    (root / "classes.txt").write_text("thing\n")
    return root


PHOTOMETRIC_CASES = [
    # (osprey/albumentations transform with fixed parameters, max abs diff allowed, mean abs diff allowed)
    ({"type": "RandomBrightnessContrast", "brightness_limit": [0.1, 0.1], "contrast_limit": [0.2, 0.2]}, 1, 0.05),
    ({"type": "RandomBrightnessContrast", "brightness_limit": [-0.15, -0.15], "contrast_limit": [-0.3, -0.3]}, 1, 0.05),
    ({"type": "RandomGamma", "gamma_limit": [150, 150]}, 1, 0.05),
    ({"type": "RandomGamma", "gamma_limit": [70, 70]}, 1, 0.05),
    ({"type": "ColorJitter", "brightness": [1.3, 1.3], "contrast": [1, 1], "saturation": [1, 1], "hue": [0, 0]}, 1, 0.05),
    ({"type": "ColorJitter", "brightness": [1, 1], "contrast": [0.6, 0.6], "saturation": [1, 1], "hue": [0, 0]}, 1, 0.05),
    ({"type": "ColorJitter", "brightness": [1, 1], "contrast": [1, 1], "saturation": [1.6, 1.6], "hue": [0, 0]}, 1, 0.05),
    ({"type": "ColorJitter", "brightness": [1, 1], "contrast": [1, 1], "saturation": [1, 1], "hue": [0.1, 0.1]}, 3, 0.3),
    ({"type": "HueSaturationValue", "hue_shift_limit": [12, 12], "sat_shift_limit": [25, 25],
      "val_shift_limit": [-15, -15]}, 3, 0.3),
    ({"type": "ToGray"}, 1, 0.05),
    ({"type": "GaussianBlur", "blur_limit": [5, 5], "sigma_limit": [1.5, 1.5]}, 1, 0.05),
    ({"type": "GaussianBlur", "blur_limit": [3, 3], "sigma_limit": [0, 0]}, 1, 0.05),
    ({"type": "ImageCompression", "quality_range": [60, 60]}, 40, 1.0),
    ({"type": "Blur", "blur_limit": [5, 5]}, 1, 0.05),
    ({"type": "Blur", "blur_limit": [3, 3]}, 1, 0.05),
    ({"type": "MedianBlur", "blur_limit": [5, 5]}, 0, 0),
    ({"type": "MedianBlur", "blur_limit": [3, 3]}, 0, 0),
]


@pytest.mark.parametrize("spec,max_tol,mean_tol", PHOTOMETRIC_CASES,
                         ids=[c[0]["type"] + str(i) for i, c in enumerate(PHOTOMETRIC_CASES)])
def test_photometric_matches_albumentations(augment, tmp_path, spec, max_tol, mean_tol):
    import albumentations as A
    root = astronaut_dataset(tmp_path)
    out = tmp_path / "out"
    r = augment("--pipeline", write_pipeline(tmp_path, {"type": "Compose", "transforms": [dict(spec, p=1)]}),
                "--input", root, "--output", out, "--image-format", "png")
    assert r.returncode == 0, r.stderr
    ours = read_rgb(out / "images" / "a_0.png")
    src = read_rgb(root / "images" / "a.png")
    params = {k: (tuple(v) if isinstance(v, list) else v) for k, v in spec.items() if k != "type"}
    theirs = A.Compose([getattr(A, spec["type"])(p=1, **params)])(image=src)["image"]
    if spec["type"] == "ImageCompression":
        # Albumentations hands RGB to cv2.imencode as if it were BGR (its chroma then differs from a correct encode
        # by ~3 grey levels on average), so the pixel oracle is a correct OpenCV round trip at the same quality, and
        # the distortion must match Albumentations' own.
        q = spec["quality_range"][0]
        ok, enc = cv2.imencode(".jpg", cv2.cvtColor(src, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, q])
        distortion = np.abs(ours.astype(int) - src).mean()
        assert abs(distortion - np.abs(theirs.astype(int) - src).mean()) < 1.0, distortion
        theirs = cv2.cvtColor(cv2.imdecode(enc, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    diff = np.abs(ours.astype(int) - theirs.astype(int))
    assert diff.max() <= max_tol and diff.mean() <= mean_tol, (spec, diff.max(), diff.mean())


def test_albumentations_serialised_pipeline_runs(augment, coco_dataset, tmp_path):
    import albumentations as A
    pipe = A.Compose([
        A.RandomSizedBBoxSafeCrop(height=128, width=128, p=0.5), A.HorizontalFlip(p=0.5),
        A.Affine(scale=(0.9, 1.1), rotate=(-10, 10), p=0.5), A.OneOf([A.RandomGamma(), A.ColorJitter()], p=0.8),
        A.SomeOf([A.GaussianBlur(), A.GaussNoise(), A.ToGray()], n=2, p=0.5), A.ImageCompression(p=0.3),
        A.CoarseDropout(p=0.2)],
        bbox_params=A.BboxParams(format="coco", min_area=16, label_fields=["labels"]))
    path = tmp_path / "alb.json"
    A.save(pipe, str(path), data_format="json")
    out = tmp_path / "out"
    r = augment("--pipeline", path, "--input", coco_dataset(n=4), "--output", out, "--copies", 2)
    assert r.returncode == 0, r.stderr
    assert len(json.loads((out / "annotations.json").read_text())["images"]) == 8


def test_unknown_transform_is_named_before_any_work(augment, coco_dataset, tmp_path):
    import albumentations as A
    path = tmp_path / "alb.json"
    A.save(A.Compose([A.HorizontalFlip(), A.Emboss()]), str(path), data_format="json")
    out = tmp_path / "out"
    r = augment("--pipeline", path, "--input", coco_dataset(n=2), "--output", out)
    assert r.returncode != 0
    assert "Emboss" in r.stderr and "not supported" in r.stderr, r.stderr
    assert not out.exists()
    (tmp_path / "bad.json").write_text('{"type": "Compose", "transforms": [{"type": "Rotate", "limit": "x"}')
    r = augment("--pipeline", tmp_path / "bad.json", "--input", coco_dataset(n=2), "--output", out)
    assert r.returncode != 0 and "not valid JSON" in r.stderr, r.stderr
    assert not out.exists()


def test_same_seed_same_bytes_whatever_the_thread_count(augment, coco_dataset, tmp_path):
    ann = coco_dataset(n=10)
    pipe = write_pipeline(tmp_path, PHOTO_AND_GEO)
    trees = []
    for threads in (1, 2, 3):
        out = tmp_path / f"out{threads}"
        r = augment("--pipeline", pipe, "--input", ann, "--output", out, "--copies", 3, "--seed", 9, "--threads",
                    threads, "--image-format", "jpeg")
        assert r.returncode == 0, r.stderr
        trees.append(tree_bytes(out))
    assert len(trees[0]) == 31  # 30 images + annotations.json
    assert trees[0] == trees[1] == trees[2]
    r = augment("--pipeline", pipe, "--input", ann, "--output", tmp_path / "other", "--copies", 3, "--seed", 10)
    assert tree_bytes(tmp_path / "other") != trees[0]


def test_shards_cover_the_dataset_once(augment, yolo_dataset, tmp_path):
    root = yolo_dataset(n=7)
    pipe = write_pipeline(tmp_path, PHOTO_AND_GEO)
    whole = tmp_path / "whole"
    assert augment("--pipeline", pipe, "--input", root, "--output", whole, "--copies", 2).returncode == 0
    sharded = tmp_path / "sharded"
    for i in range(3):
        r = augment("--pipeline", pipe, "--input", root, "--output", sharded, "--copies", 2, "--shard", f"{i}/3",
                    "--resume")
        assert r.returncode == 0, r.stderr
    assert tree_bytes(sharded) == tree_bytes(whole)
    r = augment("--pipeline", pipe, "--input", root, "--output", tmp_path / "x", "--shard", "3/3")
    assert r.returncode != 0 and "0 <= I < N" in r.stderr


def test_resume_after_a_killed_run_gives_the_same_dataset(augment, osprey_bin, coco_dataset, tmp_path):
    ann = coco_dataset(n=24)
    spec = json.loads(json.dumps(PHOTO_AND_GEO))
    spec["transforms"].insert(0, {"type": "Resize", "height": 900, "width": 900, "p": 1})  # slow enough to interrupt
    spec["transforms"].append({"type": "GaussianBlur", "blur_limit": [15, 15], "p": 1})
    pipe = write_pipeline(tmp_path, spec)
    whole = tmp_path / "whole"
    assert augment("--pipeline", pipe, "--input", ann, "--output", whole, "--copies", 2, "--threads", 1,
                   "--image-format", "png").returncode == 0
    # A real kill: SIGKILL once some items are recorded.
    out = tmp_path / "out"
    proc = subprocess.Popen([str(osprey_bin), "augment", "--pipeline", str(pipe), "--input", str(ann), "--output",
                             str(out), "--copies", "2", "--threads", "1", "--image-format", "png"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = out / ".osprey-augment" / "records"

    def record_lines():
        return [line for log in sorted(records.glob("*.jsonl")) for line in log.read_text().splitlines(True)]

    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        if records.is_dir() and len(record_lines()) >= 5:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be interrupted"
    r = augment("--pipeline", pipe, "--input", ann, "--output", out, "--copies", 2, "--threads", 2, "--resume",
                "--image-format", "png")
    assert r.returncode == 0, r.stderr
    assert tree_bytes(out) == tree_bytes(whole)
    # A crash can also leave an image without its record (and a torn last line): --resume redoes that item.
    lines = record_lines()
    assert len(lines) == 48, len(lines)
    for log in records.glob("*.jsonl"):
        log.unlink()
    (records / "1-1-0.jsonl").write_text("".join(lines[:3] + lines[4:]) + lines[3][:20])
    (out / "annotations.json").unlink()
    r = augment("--pipeline", pipe, "--input", ann, "--output", out, "--copies", 2, "--resume", "--image-format", "png")
    assert r.returncode == 0, r.stderr
    assert "1 to do" in r.stdout, r.stdout
    assert tree_bytes(out) == tree_bytes(whole)
    # Without --resume a non-empty output folder is refused.
    r = augment("--pipeline", pipe, "--input", ann, "--output", out)
    assert r.returncode != 0 and "--resume" in r.stderr


def test_bad_items_are_reported_and_the_run_continues(augment, coco_dataset, tmp_path):
    ann = coco_dataset(n=6)
    root = ann.parent
    coco = json.loads(ann.read_text())
    (root / "images" / "img001.png").unlink()                      # missing image
    (root / "images" / "img002.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)  # corrupt image
    coco["annotations"].append({"id": 900, "image_id": 4, "category_id": 1, "bbox": [10, 10, -5, 20]})
    coco["annotations"].append({"id": 901, "image_id": 5, "category_id": 1, "bbox": [5000, 5000, 10, 10]})
    ann.write_text(json.dumps(coco))
    out = tmp_path / "out"
    r = augment("--pipeline", write_pipeline(tmp_path, GEOMETRIC), "--input", ann, "--output", out)
    assert r.returncode == 1, r.stderr
    assert "img001.png" in r.stderr and "img002.png" in r.stderr, r.stderr
    assert "900" in r.stderr and "901" in r.stderr, r.stderr
    assert "2 failed" in r.stdout, r.stdout
    written = json.loads((out / "annotations.json").read_text())
    assert sorted(im["file_name"] for im in written["images"]) == ["img000_0.png", "img003_0.png", "img004_0.png",
                                                                     "img005_0.png"]
    # A malformed annotation file stops the run before any work, with the file named.
    ann.write_text(ann.read_text()[:100])
    r = augment("--pipeline", write_pipeline(tmp_path, GEOMETRIC), "--input", ann, "--output", tmp_path / "out2")
    assert r.returncode != 0 and "annotations.json" in r.stderr, r.stderr
    assert not (tmp_path / "out2").exists()
    # Missing files are named, before any work.
    r = augment("--pipeline", tmp_path / "none.json", "--input", ann, "--output", tmp_path / "out3")
    assert r.returncode != 0 and "none.json" in r.stderr, r.stderr
    r = augment("--pipeline", write_pipeline(tmp_path, GEOMETRIC), "--input", tmp_path / "nowhere", "--output",
                tmp_path / "out3")
    assert r.returncode != 0 and "nowhere" in r.stderr and "does not exist" in r.stderr, r.stderr
    assert not (tmp_path / "out3").exists()


def test_preview_contact_sheet_and_help(augment, coco_dataset, tmp_path):
    out = tmp_path / "out"
    r = augment("--pipeline", write_pipeline(tmp_path, GEOMETRIC), "--input", coco_dataset(n=5), "--output", out,
                "--copies", 2, "--preview", 6)
    assert r.returncode == 0, r.stderr
    sheet = read_rgb(out / "preview.png")
    assert sheet.shape[0] >= 320 and sheet.shape[1] >= 3 * 320 - 3
    assert "preview.png" in r.stdout
    h = augment("--help")
    assert h.returncode == 0 and "--shard" in h.stdout and "--resume" in h.stdout
