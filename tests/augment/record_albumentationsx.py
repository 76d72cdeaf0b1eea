"""Records what AlbumentationsX does, for tests/augment/test_albumentationsx.py (which runs without it: it needs PyTorch,
a multi-GB install from PyPI). Run with a Python that has it, e.g. the bench venv:

    .venv-torch/bin/pip install albumentationsx==2.5.1
    .venv-torch/bin/python tests/augment/record_albumentationsx.py

Writes tests/augment/data/albumentationsx/: input.png (a 128x96 photo, written by the project's .venv beforehand:
the same file is read by both), for each case of CASES its pipeline as AlbumentationsX saves it (CASE.json), its
output image (CASE.png) and boxes (in results.json); the field statistics of its ElasticTransform and GridDistortion
(results.json "fields", the pipelines as NAME.json); and defaults/TRANSFORM.json, each transform osprey supports as
AlbumentationsX saves it with its default parameters."""

import inspect
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
import albumentations as A  # noqa: E402
import cv2  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from albumentations_oracle import X_NAMES, tuples  # noqa: E402
from corpus import CORPUS  # noqa: E402
from field_stats import coordinate_image, field_statistics  # noqa: E402

OUT = Path(__file__).resolve().parent / "data" / "albumentationsx"
BOX = [36.0, 28.0, 84.0, 70.0]  # x0, y0, x1, y1 in the 128x96 input
CORNER_BOX = [4.0, 6.0, 30.0, 36.0]  # near the top-left corner: mirrored copies show in reflected borders

# name: (transform, parameters in AlbumentationsX's names, box). Deterministic settings only: osprey's random numbers
# are its own, so a drawn value is pinned to one value here.
CASES = {
    "affine_shear_x": ("Affine", {"shear": {"x": (12, 12), "y": (0, 0)}}, BOX),
    "affine_translate": ("Affine", {"translate_percent": {"x": (0.1, 0.1), "y": (-0.05, -0.05)}}, BOX),
    "affine_rotate_scale": ("Affine", {"rotate": (17, 17), "scale": (0.9, 0.9)}, BOX),
    "affine_reflect": ("Affine", {"translate_px": {"x": (12, 12), "y": (10, 10)}, "border_mode": 4}, CORNER_BOX),
    "rotate": ("Rotate", {"angle_range": (20, 20), "border_mode": 0}, BOX),
    "rotate_reflect": ("Rotate", {"angle_range": (-20, -20), "border_mode": 2}, CORNER_BOX),
    "safe_rotate": ("SafeRotate", {"angle_range": (25, 25), "border_mode": 0}, BOX),
    "shift_scale_rotate": ("ShiftScaleRotate", {"shift_range_x": (0.05, 0.05), "shift_range_y": (-0.04, -0.04),
                                                "scale_range": (0.1, 0.1), "rotate_range": (12, 12),
                                                "border_mode": 0}, BOX),
    "random_scale": ("RandomScale", {"scale_range": (0.25, 0.25)}, BOX),
    "resize": ("Resize", {"height": 72, "width": 100}, BOX),
    "longest_max_size": ("LongestMaxSize", {"max_size": 100}, BOX),
    "pad_if_needed": ("PadIfNeeded", {"min_height": 120, "min_width": 150, "border_mode": 0, "fill": 0}, BOX),
    "center_crop": ("CenterCrop", {"height": 64, "width": 80}, BOX),
    "gaussian_blur_sigma": ("GaussianBlur", {"sigma_range": (1.5, 1.5)}, BOX),
    "gaussian_blur_size": ("GaussianBlur", {"blur_range": (5, 5), "sigma_range": (2, 2)}, BOX),
    "blur": ("Blur", {"blur_range": (5, 5)}, BOX),
    "median_blur": ("MedianBlur", {"blur_range": (5, 5)}, BOX),
    "gamma": ("RandomGamma", {"gamma_range": (70, 70)}, BOX),
    "jitter_saturation": ("ColorJitter", {"brightness_range": (1, 1), "contrast_range": (1, 1),
                                          "saturation_range": (1.5, 1.5), "hue_range": (0, 0)}, BOX),
    "jitter_hue": ("ColorJitter", {"brightness_range": (1, 1), "contrast_range": (1, 1), "saturation_range": (1, 1),
                                   "hue_range": (0.1, 0.1)}, BOX),
    "hue_saturation_value": ("HueSaturationValue", {"hue_shift_range": (10, 10), "sat_shift_range": (20, 20),
                                                    "val_shift_range": (-15, -15)}, BOX),
    "clahe": ("CLAHE", {"clip_range": (2, 2)}, BOX),
    "to_gray": ("ToGray", {}, BOX),
    # RandomBrightnessContrast's default model in AlbumentationsX (brightness_by_max false): torchvision's.
    "brightness_contrast": ("RandomBrightnessContrast", {"brightness_range": (0.15, 0.15),
                                                         "contrast_range": (-0.3, -0.3)}, BOX),
    "contrast_up": ("RandomBrightnessContrast", {"brightness_range": (-0.1, -0.1),
                                                 "contrast_range": (0.4, 0.4)}, BOX),
    "contrast_only": ("RandomBrightnessContrast", {"brightness_range": (0, 0), "contrast_range": (0.5, 0.5)}, BOX),
    "brightness_only": ("RandomBrightnessContrast", {"brightness_range": (0.3, 0.3), "contrast_range": (0, 0)}, BOX),
    "brightness_by_max": ("RandomBrightnessContrast", {"brightness_range": (0.1, 0.1), "contrast_range": (0.2, 0.2),
                                                       "brightness_by_max": True}, BOX),
}

# Random displacement fields, compared by their statistics (field_stats.py) over FIELD_WARPS warps of a coordinate image
# at lags of FIELD_LAG pixels: ElasticTransform, AlbumentationsX's own (a B-spline control grid), and GridDistortion.
FIELDS = {
    "elastic_default": ("ElasticTransform", {}),
    "elastic_coarse": ("ElasticTransform", {"displacement_range": (0.04, 0.04), "control_grid_shape": (5, 5)}),
    "elastic_fine": ("ElasticTransform", {"displacement_range": (0.01, 0.015), "control_grid_shape": (12, 12)}),
    "grid_default": ("GridDistortion", {}),
    "grid_strong": ("GridDistortion", {"num_steps": 5, "distort_range": (-0.5, 0.5)}),
}
FIELD_WARPS, FIELD_LAG = 64, 16

# Every transform osprey supports (corpus.py), in AlbumentationsX's names, and those test_albumentations_versions.py
# covers in files of its own.
DEFAULTS = {name: {X_NAMES.get(name, {}).get(k, k): tuples(v) for k, v in params.items()}
            for name, params in CORPUS.items()}
DEFAULTS.update({"MotionBlur": {}, "CLAHE": {}, "RandomShadow": {}, "GridDistortion": {}, "ElasticTransform": {}})


def compose(transform, params):
    assert "coord_format" in inspect.signature(A.BboxParams).parameters, "run this with AlbumentationsX"
    return A.Compose([getattr(A, transform)(p=1.0, **params)],
                     bbox_params=A.BboxParams(coord_format="pascal_voc", label_fields=["labels"]))


def main():
    image = cv2.cvtColor(cv2.imread(str(OUT / "input.png"), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    results = {"version": A.__version__}
    for name, (transform, params, box) in CASES.items():
        pipe = compose(transform, params)
        A.save(pipe, str(OUT / f"{name}.json"), data_format="json")
        out = pipe(image=image, bboxes=[box], labels=[0])
        cv2.imwrite(str(OUT / f"{name}.png"), cv2.cvtColor(np.ascontiguousarray(out["image"]), cv2.COLOR_RGB2BGR),
                    [cv2.IMWRITE_PNG_COMPRESSION, 9])
        results[name] = {"box": box, "boxes": [[round(float(v), 3) for v in b] for b in out["bboxes"]]}
    results["fields"] = {}
    for name, (transform, params) in FIELDS.items():
        pipe = A.Compose([getattr(A, transform)(p=1.0, **params)], seed=7)
        A.save(pipe, str(OUT / f"{name}.json"), data_format="json")
        warps = [pipe(image=coordinate_image())["image"] for _ in range(FIELD_WARPS)]
        std, corr = field_statistics(warps, FIELD_LAG)
        results["fields"][name] = {"std": round(std, 4), "corr": {k: round(v, 4) for k, v in corr.items()}}
    (OUT / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (OUT / "defaults").mkdir(exist_ok=True)
    for transform, params in DEFAULTS.items():
        A.save(compose(transform, params), str(OUT / "defaults" / f"{transform}.json"), data_format="json")
    print(f"recorded AlbumentationsX {A.__version__}: {len(CASES)} cases, {len(DEFAULTS)} defaults in {OUT}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
