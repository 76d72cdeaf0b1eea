"""osprey.decode, osprey.classify and osprey.augment.Pipeline from Python, against the CLI, Pillow and Albumentations."""
import io
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import osprey
from osprey.augment import Pipeline

REPO = Path(__file__).resolve().parents[2]
PHOTOS = sorted((REPO / "demo-datasets" / "photos" / "images").glob("*.jpg"))
DIGITS = REPO / "demo-models" / "digits"
SAMPLES = sorted((DIGITS / "samples").glob("*.png"))


def test_decode_matches_pillow_and_cli(tmp_path, run_cli):
    png = SAMPLES[0]
    ours = osprey.decode(png)
    assert ours.dtype == np.uint8 and ours.ndim == 3 and ours.shape[2] == 3
    np.testing.assert_array_equal(ours, np.asarray(Image.open(png).convert("RGB")))
    np.testing.assert_array_equal(osprey.decode(png.read_bytes()), ours)
    gray = osprey.decode(str(png), channels=1)
    np.testing.assert_array_equal(gray[..., 0], np.asarray(Image.open(png).convert("L")))
    photo = PHOTOS[0]
    full = osprey.decode(photo)
    assert run_cli("decode", photo, "-o", tmp_path / "x.npy").returncode == 0
    np.testing.assert_array_equal(np.load(tmp_path / "x.npy"), full)
    pil = np.asarray(Image.open(photo).convert("RGB")).astype(np.int16)
    assert np.abs(full.astype(np.int16) - pil).mean() < 1.0  # both libjpeg-turbo; IDCT/upsampling may differ by 1
    small = osprey.decode(photo, min_size=(full.shape[1] // 4, full.shape[0] // 4))
    assert full.shape[1] // 4 <= small.shape[1] < full.shape[1]


def test_decode_errors():
    with pytest.raises(osprey.InvalidArgument, match="unknown|format|not"):
        osprey.decode(b"definitely not an image")
    with pytest.raises(osprey.NotFound):
        osprey.decode("/no/such/file.jpg")
    buf = io.BytesIO()
    Image.new("RGB", (4000, 3000)).save(buf, format="PNG")
    with pytest.raises(osprey.InvalidArgument, match="max_pixels|pixels"):
        osprey.decode(buf.getvalue(), max_pixels=1_000_000)
    with pytest.raises(osprey.InvalidArgument):
        osprey.decode(SAMPLES[0], channels=2)


def test_classify_matches_cli(run_cli):
    files = SAMPLES[:6]
    proc = run_cli("classify", DIGITS, *files, "--top-k", 3, "--json")
    assert proc.returncode == 0, proc.stderr
    cli = json.loads(proc.stdout)
    ours = osprey.classify(DIGITS, files, top_k=3)
    arrays = osprey.classify(DIGITS, [osprey.decode(f, channels=1) for f in files], top_k=3)
    as_bytes = osprey.classify(DIGITS, [f.read_bytes() for f in files], top_k=3)
    cli_images = cli["results"]
    for i, f in enumerate(files):
        want = [(c["index"], c["label"]) for c in cli_images[i]["top_k"]]
        assert [(c.index, c.label) for c in ours[i]] == want
        assert [(c.index, c.label) for c in as_bytes[i]] == want
        assert arrays[i][0].label == ours[i][0].label
        assert abs(ours[i][0].probability - cli_images[i]["top_k"][0]["probability"]) < 1e-5
        assert f.name.split("_")[0] == ours[i][0].label  # the demo samples are named <digit>_<n>.png
    for bad in ({"batch_size": 0}, {"batch_size": 10**6}, {"threads": -1}):
        with pytest.raises(osprey.InvalidArgument):
            osprey.Classifier(DIGITS, **bad)
    pre = osprey.Classifier(DIGITS).preprocess(osprey.decode(files[0], channels=1))
    assert pre.dtype == np.float32 and pre.shape == (1, 32, 32)


def albumentations_pipeline():
    import albumentations as A
    return A.Compose([A.HorizontalFlip(p=1), A.CenterCrop(height=300, width=420, p=1),
                      A.Resize(height=240, width=320, p=1)],
                     bbox_params=A.BboxParams(format="coco", label_fields=["category_ids"], min_visibility=0.3))


def test_pipeline_matches_albumentations():
    import albumentations as A
    compose = albumentations_pipeline()
    image = osprey.decode(PHOTOS[1])
    h, w = image.shape[:2]
    boxes = [(50, 60, 100, 80), (w - 30, 10, 25, 40), (200, 150, 120, 90, "extra")]
    ids = [3, 5, 7]
    ref = compose(image=image, bboxes=[b[:4] for b in boxes], category_ids=ids)
    for pipe in (Pipeline.from_albumentations(compose), Pipeline.from_json(json.dumps(A.to_dict(compose)))):
        out = pipe(image=image, bboxes=boxes, category_ids=ids, seed=1)
        assert out["image"].shape == ref["image"].shape and out["image"].dtype == np.uint8
        diff = np.abs(out["image"].astype(np.int16) - ref["image"].astype(np.int16)).mean()
        assert diff <= 3, f"mean abs pixel difference {diff}"
        assert out["category_ids"] == list(ref["category_ids"])  # same boxes kept, same order
        assert len(out["bboxes"]) == len(ref["bboxes"])
        for ours, theirs in zip(out["bboxes"], ref["bboxes"]):
            np.testing.assert_allclose(ours[:4], theirs[:4], atol=1.0)
        assert out["bboxes"][-1][4] == "extra"  # values after the 4 coordinates travel with the box


def test_pipeline_load_seed_pickle_and_errors(tmp_path):
    pipe = Pipeline.load(REPO / "demo-datasets" / "detect.json")
    image = osprey.decode(PHOTOS[0])
    boxes = [(10, 20, 200, 220)]
    a = pipe(image=image, bboxes=boxes, seed=42)
    b = pipe(image=image, bboxes=boxes, seed=42)
    np.testing.assert_array_equal(a["image"], b["image"])
    assert a["bboxes"] == b["bboxes"]
    random.seed(7)
    c = pipe(image=image, bboxes=boxes)
    random.seed(7)
    d = pipe(image=image, bboxes=boxes)
    np.testing.assert_array_equal(c["image"], d["image"])
    import pickle
    e = pickle.loads(pickle.dumps(pipe))(image=image, bboxes=boxes, seed=42)
    np.testing.assert_array_equal(e["image"], a["image"])
    with pytest.raises(osprey.InvalidArgument):
        pipe(image=image.astype(np.float32))
    with pytest.raises(osprey.InvalidArgument):
        pipe(image=image, bboxes=[(10, 20, 5, 5)])  # x_max < x_min in pascal_voc
    with pytest.raises(osprey.InvalidArgument, match="4 numbers"):
        pipe(image=image, bboxes=[(10, 20, 30)])
    with pytest.raises(osprey.InvalidArgument, match="2 numbers"):
        pipe(image=image, keypoints=[(1.0, 2.0), (3.0,)])
    with pytest.raises(osprey.InvalidArgument, match="uint8"):
        pipe(image=image, mask=np.zeros(image.shape[:2], np.float32))
    with pytest.raises(osprey.Unsupported, match="Sharpen|supported"):
        Pipeline.from_json(json.dumps({"type": "Compose", "transforms": [{"type": "Sharpen", "p": 1}]}))
    with pytest.raises(osprey.NotFound):
        Pipeline.load(tmp_path / "missing.json")


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_two_workers(context):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    import loader_support
    pipe = Pipeline.load(REPO / "demo-datasets" / "detect.json")
    dataset = loader_support.PhotoBoxes(PHOTOS, pipe)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=context)
    items = list(loader)
    assert len(items) == len(dataset)
    for i, (img, boxes) in enumerate(items):
        direct = dataset[i]
        np.testing.assert_array_equal(img.numpy(), direct[0])  # same seed per item: same bytes in any process
        assert img.shape[-1] == 3 and img.dtype == torch.uint8


def test_masks_move_like_albumentations():
    import albumentations as A
    compose = A.Compose([A.HorizontalFlip(p=1), A.Affine(scale=1.1, rotate=10, translate_px={"x": 12, "y": -8}, p=1),
                         A.RandomBrightnessContrast(brightness_limit=(0.2, 0.2), contrast_limit=(0, 0), p=1),
                         A.Resize(height=200, width=260, p=1)])
    image = osprey.decode(PHOTOS[0])
    h, w = image.shape[:2]
    mask = np.zeros((h, w), np.uint8)
    mask[h // 4: h // 2, w // 3: 2 * w // 3] = 1
    mask[2 * h // 3:, : w // 4] = 2
    multi = np.stack([mask, 3 - mask], axis=-1)
    ref = compose(image=image, mask=multi, masks=[mask, 2 - mask // 2])
    pipe = Pipeline.from_albumentations(compose)
    out = pipe(image=image, mask=multi, masks=[mask, 2 - mask // 2], seed=3)
    assert out["mask"].shape == ref["mask"].shape == (200, 260, 2) and out["mask"].dtype == np.uint8
    assert (out["mask"] == ref["mask"]).mean() >= 0.99
    assert out["masks"][0].shape == (200, 260)
    for ours, theirs in zip(out["masks"], ref["masks"]):
        assert (ours == np.asarray(theirs)).mean() >= 0.99
    np.testing.assert_array_equal(out["masks"][0], out["mask"][..., 0])  # one warp for every mask
    assert set(np.unique(out["masks"][0])) <= {0, 1, 2}  # nearest: no blended labels
    diff = np.abs(out["image"].astype(np.int16) - ref["image"].astype(np.int16)).mean()
    assert diff <= 3, diff
    with pytest.raises(osprey.InvalidArgument, match="mask"):
        pipe(image=image, mask=mask[:10])
    dropout = Pipeline.from_albumentations(A.Compose([A.CoarseDropout(fill_mask=0, p=1)]))
    with pytest.raises(osprey.Unsupported, match="fill_mask"):
        dropout(image=image, mask=mask)


def test_keypoints_move_like_albumentations():
    import albumentations as A
    compose = A.Compose([A.HorizontalFlip(p=1), A.Affine(scale=1.2, rotate=15, translate_px={"x": 20, "y": 5}, p=1),
                         A.Resize(height=240, width=300, p=1)],
                        keypoint_params=A.KeypointParams(format="xy", label_fields=["kp_ids"]))
    image = osprey.decode(PHOTOS[2])
    h, w = image.shape[:2]
    points = [(10.0, 12.0, "a"), (w / 2, h / 2, "b"), (w - 3.0, h - 4.0, "c"), (w * 0.3, h * 0.7, "d"), (2.0, 2.0, "e")]
    ids = [0, 1, 2, 3, 4]
    ref = compose(image=image, keypoints=[p[:2] for p in points], kp_ids=ids)
    out = Pipeline.from_albumentations(compose)(image=image, keypoints=points, kp_ids=ids, seed=0)
    assert out["kp_ids"] == list(ref["kp_ids"]) and len(out["kp_ids"]) < 5  # same points kept, corners dropped
    for ours, theirs in zip(out["keypoints"], ref["keypoints"]):
        np.testing.assert_allclose(ours[:2], theirs[:2], atol=1.5)
        assert ours[2] in "abcde"  # extra values travel with the point
    yx = Pipeline.from_json(json.dumps({"type": "Compose", "transforms": [{"type": "HorizontalFlip", "p": 1}],
                                        "keypoint_params": {"format": "yx"}}))
    assert yx(image=image, keypoints=[(5.0, 7.0)])["keypoints"] == [(5.0, w - 1 - 7.0)]
    angles = Pipeline.from_json(json.dumps({"type": "Compose", "transforms": [{"type": "HorizontalFlip", "p": 1}],
                                            "keypoint_params": {"format": "xya"}}))
    with pytest.raises(osprey.Unsupported, match="xya"):
        angles(image=image, keypoints=[(5.0, 7.0, 0.3)])


def test_albumentationsx_files_keep_their_box_format():
    """AlbumentationsX writes bbox_params' format as `coord_format`: boxes given in it (YOLO here) come back in it. The
    file is AlbumentationsX's own HorizontalFlip as it saved it (tests/augment/data/albumentationsx), set to YOLO and
    p = 1; the oracle is the flip by hand (x_centre -> 1 - x_centre)."""
    saved = json.loads((REPO / "tests" / "augment" / "data" / "albumentationsx" / "defaults" /
                        "HorizontalFlip.json").read_text())
    assert saved["transform"]["bbox_params"]["coord_format"] == "pascal_voc"
    saved["transform"]["bbox_params"]["coord_format"] = "yolo"
    saved["transform"]["transforms"][0]["p"] = 1.0
    pipe = Pipeline.from_json(json.dumps(saved))
    assert pipe.bbox_format == "yolo"
    image = np.zeros((40, 60, 3), np.uint8)
    out = pipe(image=image, bboxes=[(0.25, 0.5, 0.2, 0.4)], labels=[1], seed=0)
    np.testing.assert_allclose(out["bboxes"][0][:4], (0.75, 0.5, 0.2, 0.4), atol=1e-6)
