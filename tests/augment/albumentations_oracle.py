"""Runs Albumentations for the tests, in whichever venv runs this file (the project's .venv has 1.4.24,
.venv-alb2 has 2.x): `python albumentations_oracle.py JOB.json`. The job: {"transform": name, "params": {...},
"save": path} to save a one-step Compose as Albumentations' JSON; with "image" (a PNG), "boxes" ([[x0, y0, x1, y1]])
and "out_image"/"out_json" it also applies the pipeline and writes the image (an .npy "out_image" gets the array as
it is, for float results) and the boxes."""

import json
import os
import sys

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
import albumentations as A  # noqa: E402
import cv2  # noqa: E402
import numpy as np  # noqa: E402


def tuples(v):
    if isinstance(v, list):
        return tuple(tuples(x) for x in v)
    if isinstance(v, dict):
        return {k: tuples(x) for k, x in v.items()}
    return v


def main():
    job = json.load(open(sys.argv[1]))
    params = {k: tuples(v) for k, v in job.get("params", {}).items()}
    pipe = A.Compose([getattr(A, job["transform"])(p=1.0, **params)],
                     bbox_params=A.BboxParams(format="pascal_voc", label_fields=["labels"]))
    if "save" in job:
        A.save(pipe, job["save"], data_format="json")
    if "image" in job:
        image = cv2.cvtColor(cv2.imread(job["image"], cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
        boxes = job.get("boxes", [])
        out = pipe(image=image, bboxes=boxes, labels=list(range(len(boxes))))
        if job["out_image"].endswith(".npy"):  # float results (Normalize): the array as it is
            np.save(job["out_image"], out["image"])
        else:
            cv2.imwrite(job["out_image"], cv2.cvtColor(np.ascontiguousarray(out["image"]), cv2.COLOR_RGB2BGR))
        json.dump({"boxes": [list(map(float, b)) for b in out["bboxes"]], "version": A.__version__},
                  open(job["out_json"], "w"))


if __name__ == "__main__":
    main()
