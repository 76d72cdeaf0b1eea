"""A data loader from Python: read + decode + the detection pipeline of bench/augment.py (RandomResizedCrop(800) ->
flip -> Affine -> ColorJitter -> GaussianBlur -> Resize(640), saved by Albumentations, read by osprey) over real JPEG
photos, with W worker processes (multiprocessing, as a DataLoader's workers). Each worker hands back the image's
shape, a checksum and the boxes (a DataLoader passes tensors through shared memory; pickling 1.2 MB images through
a pipe would time the pipe: --return-images does that). osprey: osprey.decode + osprey.augment.Pipeline; peer: cv2.imread + Albumentations with
cv2.setNumThreads(1). Prints images/s and the ratio osprey/Albumentations (above 1: osprey faster).

Run it with the venv that has the Albumentations to compare (default: .venv-alb2, Albumentations 2.x as
`pip install albumentations` gives today): bench/python_loader [--images 200] [--workers 2] [--rounds 3]"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "build" / "python"))
sys.path.insert(0, str(REPO / "bench"))

import albumentations as A  # noqa: E402
import cv2  # noqa: E402
import numpy as np  # noqa: E402

import augment as bench_augment  # noqa: E402  (bench/augment.py: the pipeline and the dataset maker)
import osprey  # noqa: E402
from osprey.augment import Pipeline  # noqa: E402

_STATE = {}


def _init(kind, pipeline_json, return_images):
    cv2.setNumThreads(1)
    _STATE["kind"] = kind
    _STATE["return_images"] = return_images
    _STATE["pipe"] = Pipeline.from_json(pipeline_json) if kind == "osprey" else bench_augment.pipeline()


def _item(job):
    path, boxes, seed = job
    if _STATE["kind"] == "osprey":
        img = osprey.decode(path)
        out = _STATE["pipe"](image=img, bboxes=boxes, labels=[1] * len(boxes), seed=seed)
    else:
        img = cv2.cvtColor(cv2.imread(path, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        out = _STATE["pipe"](image=img, bboxes=boxes, labels=[1] * len(boxes))
    image = out["image"]
    boxes = np.asarray(out["bboxes"], dtype=np.float32)
    if _STATE["return_images"]:
        return image, boxes
    return image.shape, int(image[::97, ::89].sum()), boxes


def run(kind, jobs, workers, pipeline_json, return_images):
    with mp.get_context("fork").Pool(workers, initializer=_init,
                                     initargs=(kind, pipeline_json, return_images)) as pool:
        pool.map(_item, jobs[: workers * 2], chunksize=1)  # warm up the workers
        start = time.perf_counter()
        n = 0
        for item in pool.imap(_item, jobs, chunksize=4):
            n += len(item[-1]) >= 0
        return len(jobs) / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--return-images", action="store_true", help="send every image array back to the parent")
    args = ap.parse_args()
    # Before the parent uses OpenCV: a pool thread created here would deadlock cv2 in the forked workers.
    cv2.setNumThreads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data"
        bench_augment.make_dataset(root, args.images, 1280, 960)
        coco = json.loads((root / "annotations.json").read_text())
        by_image = {}
        for a in coco["annotations"]:
            by_image.setdefault(a["image_id"], []).append(a["bbox"])
        jobs = []
        for im in coco["images"]:
            w, h = im["width"], im["height"]
            boxes = [[max(0, b[0]), max(0, b[1]), min(b[2], w - max(0, b[0])), min(b[3], h - max(0, b[1]))]
                     for b in by_image.get(im["id"], [])]
            jobs.append((str(root / "images" / im["file_name"]), boxes, im["id"]))
        saved = Path(tmp) / "pipeline.json"
        A.save(bench_augment.pipeline(), str(saved), data_format="json")
        pipeline_json = saved.read_text()
        print(f"{args.images} JPEG photos ~1280x960, Albumentations {A.__version__}, OpenCV {cv2.__version__}, "
              f"osprey {osprey.__version__}; images/s, median of {args.rounds} rounds", flush=True)
        for workers in [int(w) for w in args.workers.split(",")]:
            o = statistics.median(run("osprey", jobs, workers, pipeline_json, args.return_images) for _ in range(args.rounds))
            a = statistics.median(run("albumentations", jobs, workers, pipeline_json, args.return_images) for _ in range(args.rounds))
            print(f"workers {workers}: osprey {o:7.1f}  albumentations {a:7.1f}  ratio {o / a:.2f}", flush=True)


if __name__ == "__main__":
    main()
