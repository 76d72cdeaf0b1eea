"""Albumentations 2.x's own Mosaic (saved by .venv-alb2) is refused with a message that says what it needs (its
metadata_key partner images, which a saved pipeline does not carry), how it differs, and the osprey Mosaic to write
instead, with the file's values; that suggested step loads and runs."""

import json
import re

import pytest

from test_albumentations_versions import oracle
from test_augment_cli import read_rgb, write_pipeline


@pytest.mark.parametrize("params,grid_note", [
    ({"target_size": [96, 128], "cell_shape": [96, 128], "center_range": [0.25, 0.75], "fill": 114}, False),
    ({}, False),  # 2.x's defaults: 512 x 512, center_range (0.3, 0.7), fill 0
    ({"grid_yx": [3, 3], "target_size": [90, 90], "cell_shape": [60, 60], "fit_mode": "contain",
      "metadata_key": "partners"}, True),
])
def test_albumentations2_mosaic_refused_with_the_osprey_step(augment, coco_dataset, tmp_path, params, grid_note):
    saved = tmp_path / "mosaic2.json"
    oracle("2.x", {"transform": "Mosaic", "params": params, "save": str(saved)}, tmp_path)
    spec = json.loads(saved.read_text())["transform"]["transforms"][0]
    assert spec["__class_fullname__"] == "Mosaic" and "metadata_key" in spec
    dataset = coco_dataset(n=4)
    r = augment("--pipeline", saved, "--input", dataset, "--output", tmp_path / "refused")
    assert r.returncode == 1, r.stderr
    err = r.stderr
    assert "Albumentations 2.x's Mosaic is not supported" in err and "metadata_key" in err, err
    assert f'"{spec["metadata_key"]}"' in err and "grid" in err and spec["fit_mode"] in err, err
    assert ("grid_yx [3, 3] has no osprey equivalent" in err) == grid_note, err
    assert "takes height, width" not in err  # the old message, which sent users to parameters 2.x does not have
    step = json.loads(re.search(r'(\{"type": "Mosaic".*?\})', err).group(1))
    h, w = spec["target_size"]
    assert step == {"type": "Mosaic", "height": h, "width": w, "center_range": spec["center_range"],
                    "fill": spec["fill"], "p": spec["p"]}
    # The suggested step is a working osprey pipeline.
    step["p"] = 1
    pipe = write_pipeline(tmp_path, {"type": "Compose", "transforms": [step]})
    out = tmp_path / "out"
    r = augment("--pipeline", pipe, "--input", dataset, "--output", out, "--image-format", "png")
    assert r.returncode == 0, r.stderr
    img = read_rgb(out / "images" / sorted(p.name for p in (out / "images").iterdir())[0])
    assert img.shape[:2] == (h, w)
