"""ElasticTransform against Albumentations 1.4.24 (.venv) and 2.x (.venv-alb2).

Albumentations draws its noise with numpy's generator and osprey with its own seeded source, so the two fields can
never be equal pixel for pixel. What is compared instead:
- files written by either version load (every parameter, both noise distributions);
- alpha = 0 (the only deterministic setting) is the identity in both, image and box;
- the displacement field's statistics: per-pixel standard deviation and the correlation at lags sigma, 2 sigma and
  3 sigma, measured the same way for both tools by warping a coordinate image (R = x, G = y) and reading where each
  output pixel came from (tolerances: std within 12 %, correlation within 0.08);
- boxes and keypoints move with the pixels (a drawn rectangle's output box against the bounds of the warped rectangle,
  IoU >= 0.9; a keypoint on a drawn dot within 1 pixel of a pixel of the warped dot);
- bad parameters are refused by name.
"""

import json
import subprocess

import cv2
import numpy as np
import pytest

from field_stats import SIZE, coordinate_image, field_statistics
from test_albumentations_versions import VENVS, astronaut, iou, oracle
from test_augment_cli import read_rgb, write_pipeline



def coco(root, images, objects=None):
    """A COCO dataset under root of the given RGB images (name -> array) with objects (name -> [(box, keypoints)])."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    entries, anns = [], []
    for i, (name, img) in enumerate(images.items()):
        cv2.imwrite(str(root / "images" / name), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
        entries.append({"id": i + 1, "file_name": name, "width": img.shape[1], "height": img.shape[0]})
        for box, kps in (objects or {}).get(name, []):
            ann = {"id": len(anns) + 1, "image_id": i + 1, "category_id": 1,
                   "bbox": [box[0], box[1], box[2] - box[0], box[3] - box[1]]}
            if kps:
                ann["keypoints"] = [v for x, y in kps for v in (x, y, 2)]
            anns.append(ann)
    cats = [{"id": 1, "name": "thing", "keypoints": ["k"] * max([len(k) for v in (objects or {}).values()
                                                                 for _, k in v] or [0])}]
    if not cats[0]["keypoints"]:
        del cats[0]["keypoints"]
    (root / "annotations.json").write_text(json.dumps({"images": entries, "annotations": anns, "categories": cats}))
    return root / "annotations.json"


ALBU_FIELDS = r"""
import json, os, sys
os.environ["NO_ALBUMENTATIONS_UPDATE"] = "1"
import albumentations as A, numpy as np
job = json.load(open(sys.argv[1]))
img = np.load(job["image"])
t = A.Compose([A.ElasticTransform(p=1.0, **job["params"])])
A.save(t, job["save"], data_format="json")
np.save(job["out"], np.stack([t(image=img)["image"] for _ in range(job["n"])]))
"""


def albumentations_fields(version, params, n, tmp_path):
    """Albumentations `version` warping the coordinate image n times: (outputs, the saved pipeline's path)."""
    src, out, save, job = (tmp_path / f"coords-{version}.npy", tmp_path / f"theirs-{version}.npy",
                           tmp_path / f"p-{version}.json", tmp_path / f"fields-{version}.json")
    np.save(src, coordinate_image())
    job.write_text(json.dumps({"image": str(src), "params": params, "save": str(save), "out": str(out), "n": n}))
    r = subprocess.run([str(VENVS[version]), "-c", ALBU_FIELDS, str(job)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return list(np.load(out)), save


def osprey_fields(augment, pipeline, n, tmp_path):
    root = tmp_path / "coords"
    annotations = coco(root, {"c.png": coordinate_image()})
    out = tmp_path / "ours"
    r = augment("--pipeline", pipeline, "--input", annotations, "--output", out, "--image-format", "png",
                "--copies", str(n), "--seed", "11")
    assert r.returncode == 0, r.stderr
    return [read_rgb(out / "images" / f"c_{k}.png") for k in range(n)]


LOADS = [{}, {"alpha": 50, "sigma": 5}, {"alpha": 30, "sigma": 4, "approximate": True, "same_dxdy": True},
         {"alpha": 20, "sigma": 3, "noise_distribution": "uniform", "interpolation": 0}]


@pytest.mark.parametrize("version", ["1.4", "2.x"])
def test_elastic_loads(augment, coco_dataset, tmp_path, version):
    dataset = coco_dataset(n=2)
    params = LOADS + ([{"alpha": 40, "sigma": 5, "border_mode": 2, "fill": 0}] if version == "2.x" else [])
    failures = []
    for i, p in enumerate(params):
        save = tmp_path / f"e{i}.json"
        oracle(version, {"transform": "ElasticTransform", "params": p, "save": str(save)}, tmp_path)
        r = augment("--pipeline", save, "--input", dataset, "--output", tmp_path / f"out{i}")
        if r.returncode != 0:
            failures.append(f"{p}: {r.stderr.strip()[-400:]}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("version", ["1.4", "2.x"])
def test_alpha_zero_is_identity(augment, tmp_path, version):
    root, box = astronaut(tmp_path)
    saved, out_image, out_json = tmp_path / "p.json", tmp_path / "theirs.png", tmp_path / "theirs.json"
    oracle(version, {"transform": "ElasticTransform", "params": {"alpha": 0, "sigma": 5}, "save": str(saved),
                     "image": str(root / "images" / "a.png"), "boxes": [box], "out_image": str(out_image),
                     "out_json": str(out_json)}, tmp_path)
    out = tmp_path / "out"
    r = augment("--pipeline", saved, "--input", root / "annotations.json", "--output", out, "--image-format", "png")
    assert r.returncode == 0, r.stderr
    source, ours, theirs = (read_rgb(root / "images" / "a.png"), read_rgb(out / "images" / "a_0.png"),
                            read_rgb(out_image))
    assert np.array_equal(ours, source) and np.array_equal(theirs, source)
    b = json.loads((out / "annotations.json").read_text())["annotations"][0]["bbox"]
    ours_box = [b[0], b[1], b[0] + b[2], b[1] + b[3]]
    theirs_box = json.loads(out_json.read_text())["boxes"][0]
    # 2.x's box is the bounds of the box's pixel mask (pixel indices round(x0) .. round(x1)): osprey gives the same.
    assert iou(ours_box, box) >= 0.99 and iou(theirs_box, box) >= 0.99, (ours_box, theirs_box)
    if version == "2.x":
        assert ours_box == theirs_box


# (alpha, sigma, extra): settings whose displacement has a standard deviation of a few pixels in each version (2.x
# divides the noise by its largest magnitude, about 4.5 here; 1.4.24 does not).
STATS = {
    "1.4": [(40, 4, {}), (45, 8, {}), (300, 6, {"approximate": True}), (70, 5, {"noise_distribution": "uniform"})],
    "2.x": [(200, 4, {}), (600, 10, {}), (200, 4, {"approximate": True}), (120, 5, {"noise_distribution": "uniform"}),
            (200, 5, {"same_dxdy": True})],
}
STD_TOLERANCE, CORR_TOLERANCE = 0.12, 0.08


@pytest.mark.parametrize("version,alpha,sigma,extra", [(v, *s) for v, ss in STATS.items() for s in ss],
                         ids=[f"{v}-{a}-{s}-{'-'.join(e) or 'default'}" for v, ss in STATS.items() for a, s, e in ss])
def test_field_statistics_match(augment, tmp_path, version, alpha, sigma, extra):
    n = 12
    params = {"alpha": alpha, "sigma": sigma, **extra}
    theirs, saved = albumentations_fields(version, params, n, tmp_path)
    ours = osprey_fields(augment, saved, n, tmp_path)
    (s_ours, c_ours), (s_theirs, c_theirs) = field_statistics(ours, sigma), field_statistics(theirs, sigma)
    report = f"std {s_ours:.3f} vs {s_theirs:.3f}, correlation {c_ours} vs {c_theirs}"
    print(report)
    assert s_theirs > 1.0, report  # the setting must move pixels measurably
    assert abs(s_ours / s_theirs - 1) <= STD_TOLERANCE, report
    for k in c_ours:
        assert abs(c_ours[k] - c_theirs[k]) <= CORR_TOLERANCE, (k, report)
    if extra.get("same_dxdy"):  # one field for both axes: dx == dy wherever both are measured
        for img in ours:
            y, x = np.mgrid[0:SIZE, 0:SIZE]
            v = img[..., 2] == 128
            assert np.abs((img[..., 0].astype(int) - x) - (img[..., 1].astype(int) - y))[v].max() <= 1


def test_boxes_and_keypoints_follow_pixels(augment, tmp_path):
    img = np.full((240, 320, 3), 90, np.uint8)
    rects = [(60, 50, 150, 130), (190, 120, 290, 210)]
    dots = [(100, 90), (240, 165)]  # one dot inside each rectangle, on pixel centres
    for (x0, y0, x1, y1), (dx, dy) in zip(rects, dots):
        img[y0:y1, x0:x1] = (230, 40, 40)
        img[dy - 1:dy + 2, dx - 1:dx + 2] = (40, 40, 230)
    objects = {"r.png": [((x0, y0, x1, y1), [(dx + 0.5, dy + 0.5)]) for (x0, y0, x1, y1), (dx, dy) in zip(rects, dots)]}
    annotations = coco(tmp_path / "ds", {"r.png": img}, objects)
    pipe = write_pipeline(tmp_path, {"type": "Compose", "transforms": [
        {"type": "ElasticTransform", "alpha": 60, "sigma": 6, "p": 1}]})
    out = tmp_path / "out"
    r = augment("--pipeline", pipe, "--input", annotations, "--output", out, "--image-format", "png", "--copies", "5")
    assert r.returncode == 0, r.stderr
    anns = json.loads((out / "annotations.json").read_text())["annotations"]
    moved = 0
    for k in range(5):
        warped = read_rgb(out / "images" / f"r_{k}.png").astype(int)
        moved += np.abs(warped - img).mean()
        red = (warped[..., 0] > 150) & (warped[..., 2] < 100)
        blue = (warped[..., 2] > 150) & (warped[..., 0] < 100)
        mine = [a for a in anns if a["image_id"] == k + 1]
        assert len(mine) == 2
        for a, (x0, y0, x1, y1), (dx, dy) in zip(mine, rects, dots):
            # the warped rectangle (red or the blue dot inside it) near the original
            region = np.zeros_like(red)
            region[max(0, y0 - 25):y1 + 25, max(0, x0 - 25):x1 + 25] = True
            ys, xs = np.nonzero((red | blue) & region)
            truth = [xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]
            b = a["bbox"]
            assert iou([b[0], b[1], b[0] + b[2], b[1] + b[3]], truth) >= 0.9, (b, truth)
            region[:] = False
            region[dy - 12:dy + 13, dx - 12:dx + 13] = True
            ys, xs = np.nonzero(blue & region)
            kx, ky = a["keypoints"][0], a["keypoints"][1]
            # the keypoint lands on the warped dot (which a strong field stretches to several times its size)
            near = np.hypot(kx - (xs + 0.5), ky - (ys + 0.5)).min()
            assert near <= 1.0, (kx, ky, list(zip(xs, ys)))
    assert moved / 5 > 1  # the warp did move pixels


@pytest.mark.parametrize("params,words", [
    ({"alpha": -1}, "alpha"),
    ({"sigma": 0.5}, "sigma"),
    ({"sigma": 100000}, "sigma"),
    ({"noise_distribution": "poisson"}, "noise_distribution"),
    ({"interpolation": 2}, "interpolation"),
    ({"border_mode": 3}, "border_mode"),
    ({"alpha_affine": 50}, "alpha_affine"),
    ({"approximate": "yes"}, "approximate"),
    ({"fill": [1, 2, 3]}, "fill"),
])
def test_bad_parameters_refused(augment, coco_dataset, tmp_path, params, words):
    pipe = write_pipeline(tmp_path, {"type": "Compose", "transforms": [dict(type="ElasticTransform", p=1, **params)]})
    r = augment("--pipeline", pipe, "--input", coco_dataset(n=1), "--output", tmp_path / "out")
    assert r.returncode == 1 and words in r.stderr, (params, r.stderr)
