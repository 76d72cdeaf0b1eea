"""Runs Albumentations for the tests, in whichever venv runs this file (the project's .venv has 1.4.24,
.venv-alb2 has 2.0.8; a venv with AlbumentationsX, which needs PyTorch, runs the 2.x tests with ALB2_PY set): `python albumentations_oracle.py JOB.json`. The job: {"transform": name, "params": {...},
"save": path} to save a one-step Compose as Albumentations' JSON; with "image" (a PNG), "boxes" ([[x0, y0, x1, y1]])
and "out_image"/"out_json" it also applies the pipeline and writes the image (an .npy "out_image" gets the array as
it is, for float results) and the boxes."""

import inspect
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


# AlbumentationsX's names for albumentations 2.0.8's (it ignores the old ones with a warning): a job written with the
# old names runs the same transform under either.
X_NAMES = {
    "Rotate": {"limit": "angle_range"}, "SafeRotate": {"limit": "angle_range"},
    "ColorJitter": {"brightness": "brightness_range", "contrast": "contrast_range", "saturation": "saturation_range",
                    "hue": "hue_range"},
    "RandomBrightnessContrast": {"brightness_limit": "brightness_range", "contrast_limit": "contrast_range",
                                 "ensure_safe_range": "ensure_safe_output"},
    "HueSaturationValue": {"hue_shift_limit": "hue_shift_range", "sat_shift_limit": "sat_shift_range",
                           "val_shift_limit": "val_shift_range"},
    "RandomGamma": {"gamma_limit": "gamma_range"},
    "GaussianBlur": {"blur_limit": "blur_range", "sigma_limit": "sigma_range"},
    "Blur": {"blur_limit": "blur_range"}, "MedianBlur": {"blur_limit": "blur_range"},
    "MotionBlur": {"blur_limit": "blur_range"}, "RandomScale": {"scale_limit": "scale_range"},
    "ShiftScaleRotate": {"rotate_limit": "rotate_range", "scale_limit": "scale_range",
                         "shift_limit_x": "shift_range_x", "shift_limit_y": "shift_range_y"},
    "CLAHE": {"clip_limit": "clip_range"}, "RandomShadow": {"num_shadows_limit": "num_shadows_range"},
    "GridDistortion": {"distort_limit": "distort_range"},
}
IS_X = "coord_format" in inspect.signature(A.BboxParams).parameters


def main():
    job = json.load(open(sys.argv[1]))
    params = {k: tuples(v) for k, v in job.get("params", {}).items()}
    if IS_X:
        names = X_NAMES.get(job["transform"], {})
        params = {names.get(k, k): v for k, v in params.items()}
    coords = "coord_format" if IS_X else "format"  # AlbumentationsX renamed it too
    pipe = A.Compose([getattr(A, job["transform"])(p=1.0, **params)],
                     bbox_params=A.BboxParams(**{coords: "pascal_voc"}, label_fields=["labels"]))
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
