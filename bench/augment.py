"""osprey vs Albumentations: the same COCO dataset, the same pipeline (built with Albumentations and saved with A.save,
which osprey reads). Two measurements, each with one worker and then all cores (osprey: T threads; Albumentations: T
processes, the usual DataLoader-style setup, each with cv2.setNumThreads(1)):
  augment   images decoded once, untimed; time = augmenting image + boxes (what Albumentations' own benchmark times).
            osprey: build/bin/osprey_augment_bench (Pipeline::Apply); Albumentations: pipeline(image=, bboxes=, ...).
  end2end   read + decode, augment, encode JPEG q95 + write, annotations written: `osprey augment` vs a Python loop.
Prints images/s and the ratio osprey/Albumentations (above 1: osprey faster)."""

import argparse
import inspect
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import albumentations as A  # noqa: E402
import cv2  # noqa: E402
import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def pipeline():
    # AlbumentationsX (2.0.9 on) renamed GaussianBlur's blur_limit and BboxParams' format.
    x = "coord_format" in inspect.signature(A.BboxParams).parameters
    return A.Compose([
        A.RandomResizedCrop(size=(800, 800), scale=(0.3, 1.0), p=1.0),
        A.HorizontalFlip(p=0.5),
        A.Affine(scale=(0.9, 1.1), translate_percent=(-0.05, 0.05), rotate=(-10, 10), p=0.7),
        A.ColorJitter(p=0.8),
        A.GaussianBlur(**{"blur_range" if x else "blur_limit": (3, 5)}, p=0.5),
        A.Resize(640, 640, p=1.0),
    ], bbox_params=A.BboxParams(**{"coord_format" if x else "format": "coco"}, min_visibility=0.1,
                                label_fields=["labels"]))


def make_dataset(root: Path, n: int, width: int, height: int):
    """n JPEG photos (scikit-image samples, resized, jittered in size by +-20%) with 3-6 random boxes each."""
    from skimage import data
    sources = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket(), data.cat()]
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    images, annotations = [], []
    for i in range(n):
        w = int(width * rng.uniform(0.8, 1.2))
        h = int(height * rng.uniform(0.8, 1.2))
        img = cv2.resize(sources[i % len(sources)], (w, h), interpolation=cv2.INTER_LINEAR)
        name = f"{i:05d}.jpg"
        cv2.imwrite(str(root / "images" / name), cv2.cvtColor(img, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])
        images.append({"id": i + 1, "file_name": name, "width": w, "height": h})
        for _ in range(int(rng.integers(3, 7))):
            bw, bh = rng.uniform(0.1, 0.4) * w, rng.uniform(0.1, 0.4) * h
            x, y = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": 1,
                                "bbox": [round(x, 2), round(y, 2), round(bw, 2), round(bh, 2)], "iscrowd": 0})
    (root / "annotations.json").write_text(json.dumps(
        {"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "thing"}]}))


_WORKER = {}


def _init_worker(images_dir: str, out_dir: str):
    cv2.setNumThreads(1)
    _WORKER.update(pipe=pipeline(), images=Path(images_dir), out=Path(out_dir))


def _albumentations_item(item):
    """One image through Albumentations, end to end; returns its output annotation records."""
    im, anns = item
    img = cv2.cvtColor(cv2.imread(str(_WORKER["images"] / im["file_name"]), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    boxes = [a["bbox"] for a in anns]
    # Albumentations refuses boxes that stick out of the image; clip them as osprey does.
    h, w = img.shape[:2]
    boxes = [[max(0, b[0]), max(0, b[1]), min(b[2], w - max(0, b[0])), min(b[3], h - max(0, b[1]))] for b in boxes]
    res = _WORKER["pipe"](image=img, bboxes=boxes, labels=[1] * len(boxes))
    out = res["image"]
    cv2.imwrite(str(_WORKER["out"] / im["file_name"]), cv2.cvtColor(out, cv2.COLOR_RGB2BGR),
                [cv2.IMWRITE_JPEG_QUALITY, 95])
    return [{"image_id": im["id"], "bbox": [float(v) for v in b], "category_id": 1} for b in res["bboxes"]]


_MEM = {}


def _init_mem_worker():
    cv2.setNumThreads(1)
    _MEM["pipe"] = pipeline()


def _albumentations_mem(i):
    img, boxes = _MEM["samples"][i % len(_MEM["samples"])]
    res = _MEM["pipe"](image=img, bboxes=boxes, labels=[1] * len(boxes))
    return len(res["bboxes"])


def load_samples(root: Path):
    coco = json.loads((root / "annotations.json").read_text())
    by_image = {}
    for a in coco["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a["bbox"])
    samples = []
    for im in coco["images"]:
        img = cv2.cvtColor(cv2.imread(str(root / "images" / im["file_name"]), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        h, w = img.shape[:2]
        boxes = [[max(0, b[0]), max(0, b[1]), min(b[2], w - max(0, b[0])), min(b[3], h - max(0, b[1]))]
                 for b in by_image.get(im["id"], [])]
        samples.append((img, boxes))
    return samples


def run_albumentations_mem(root: Path, workers: int, repeats: int) -> float:
    """images/s of the transform alone, images decoded beforehand."""
    _MEM["samples"] = load_samples(root)
    n = len(_MEM["samples"]) * repeats
    if workers == 1:
        _init_mem_worker()
        for i in range(8):
            _albumentations_mem(i)
        t0 = time.perf_counter()
        for i in range(n):
            _albumentations_mem(i)
        return n / (time.perf_counter() - t0)
    with mp.get_context("fork").Pool(workers, _init_mem_worker) as pool:
        pool.map(_albumentations_mem, range(8 * workers), chunksize=1)  # warm every worker
        t0 = time.perf_counter()
        pool.map(_albumentations_mem, range(n), chunksize=8)
        return n / (time.perf_counter() - t0)


def run_osprey_mem(bench_bin: Path, pipe_json: Path, root: Path, workers: int, repeats: int) -> float:
    r = subprocess.run([str(bench_bin), "--pipeline", str(pipe_json), "--input", str(root / "annotations.json"),
                        "--threads", str(workers), "--repeats", str(repeats)], check=True, capture_output=True,
                       text=True)
    return json.loads(r.stdout)["images_per_s"]


def run_albumentations(root: Path, out: Path, workers: int) -> float:
    coco = json.loads((root / "annotations.json").read_text())
    by_image = {}
    for a in coco["annotations"]:
        by_image.setdefault(a["image_id"], []).append(a)
    items = [(im, by_image.get(im["id"], [])) for im in coco["images"]]
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    if workers == 1:
        _init_worker(str(root / "images"), str(out))
        results = [_albumentations_item(it) for it in items]
    else:
        with mp.get_context("fork").Pool(workers, _init_worker, (str(root / "images"), str(out))) as pool:
            results = pool.map(_albumentations_item, items, chunksize=4)
    anns = [a for r in results for a in r]
    (out / "annotations.json").write_text(json.dumps({"images": coco["images"], "annotations": anns}))
    return time.perf_counter() - t0


def run_osprey(binary: Path, pipe_json: Path, root: Path, out: Path, threads: int) -> float:
    t0 = time.perf_counter()
    subprocess.run([str(binary), "augment", "--pipeline", str(pipe_json), "--input", str(root / "annotations.json"),
                    "--output", str(out), "--threads", str(threads), "--image-format", "jpeg", "--quality", "95",
                    "--progress", "none"], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--images", type=int, default=200, help="images in the synthetic dataset (default 200)")
    ap.add_argument("--size", default="1280x960", help="mean source image size WxH (default 1280x960)")
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}", help="worker counts to compare (default 1,all)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per engine and worker count; the best is kept")
    ap.add_argument("--bin", default=os.environ.get("OSPREY_BIN", str(REPO / "build" / "bin" / "osprey")))
    ap.add_argument("--keep", help="keep the dataset and outputs in this folder")
    ap.add_argument("--load", type=int, default=0,
                    help="CPU-bound processes (`while True: pass`) running beside while measuring (default 0)")
    args = ap.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="osprey-bench-augment-"))
    try:
        root = work / "dataset"
        if not (root / "annotations.json").exists():
            make_dataset(root, args.images, width, height)
        pipe_json = work / "pipeline.json"
        A.save(pipeline(), str(pipe_json), data_format="json")
        print(f"bench/augment: {args.images} JPEG images ~{width}x{height}, pipeline (Albumentations {A.__version__}, "
              f"read by osprey from {pipe_json.name}):")
        print("  RandomResizedCrop(800) -> HorizontalFlip -> Affine -> ColorJitter -> GaussianBlur -> Resize(640)")
        print("  best of", args.repeats, "runs per row;", args.load, "CPU-bound processes beside\n")
        load = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
        print("| measurement | workers | Albumentations images/s | osprey images/s | osprey / Albumentations |")
        print("|---|---|---|---|---|")
        bench_bin = Path(args.bin).parent / "osprey_augment_bench"
        for t in (int(v) for v in args.threads.split(",")):
            ra = max(run_albumentations_mem(root, t, 2) for _ in range(args.repeats))
            ro = max(run_osprey_mem(bench_bin, pipe_json, root, t, 2) for _ in range(args.repeats))
            print(f"| augment (in memory) | {t} | {ra:.1f} | {ro:.1f} | {ro / ra:.2f}x |", flush=True)
        for t in (int(v) for v in args.threads.split(",")):
            best_a = best_o = float("inf")
            for r in range(args.repeats):
                for d in ("out_a", "out_o"):
                    shutil.rmtree(work / d, ignore_errors=True)
                best_a = min(best_a, run_albumentations(root, work / "out_a", t))
                best_o = min(best_o, run_osprey(Path(args.bin), pipe_json, root, work / "out_o", t))
            ra, ro = args.images / best_a, args.images / best_o
            print(f"| end to end (decode, augment, encode JPEG, write) | {t} | {ra:.1f} | {ro:.1f} | {ro / ra:.2f}x |",
                  flush=True)
    finally:
        for p in locals().get("load", []):
            p.kill()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
