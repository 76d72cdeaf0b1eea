#!/usr/bin/env python3
"""Writes osprey's demo detection dataset (COCO layout) from the photos bundled with scikit-image (no download).

Four real photos (astronaut, coffee, chelsea the cat, rocket), each with hand-drawn boxes, and polygons for a few
objects. Output (default: <repo>/demo-datasets/photos):

    images/<name>.jpg     JPEG quality 95
    annotations.json      COCO: images, annotations (bbox, area, iscrowd, some polygons), categories

Does nothing when annotations.json exists (scripts/setup calls it on every run); --force rewrites.
"""

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CATEGORIES = ["face", "helmet", "flag", "spacecraft", "patch", "cup", "saucer", "spoon", "cat", "eye", "nose", "tower"]
# name -> [(category, x0, y0, x1, y1, polygon or None)] in pixels of the scikit-image photo.
OBJECTS = {
    "astronaut": [("face", 150, 15, 302, 190, None), ("helmet", 278, 343, 510, 512, None),
                  ("flag", 0, 0, 97, 512, None), ("spacecraft", 355, 0, 470, 285, None),
                  ("patch", 133, 348, 210, 423, [172, 348, 200, 358, 210, 385, 200, 413, 172, 423, 143, 413, 133, 385,
                                                 143, 358])],
    "coffee": [("cup", 172, 17, 410, 300, None), ("saucer", 76, 70, 480, 390, None), ("spoon", 325, 65, 425, 327, None)],
    "chelsea": [("cat", 0, 0, 400, 300, None), ("eye", 136, 85, 208, 147, None), ("eye", 292, 110, 343, 163, None),
                ("nose", 230, 222, 293, 265, [230, 225, 293, 225, 262, 265])],
    "rocket": [("spacecraft", 287, 127, 360, 408, None), ("tower", 0, 0, 90, 427, None),
               ("tower", 165, 122, 208, 420, None), ("tower", 437, 122, 470, 427, None),
               ("tower", 556, 0, 640, 427, None)],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "demo-datasets" / "photos"))
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    if (out / "annotations.json").exists() and not args.force:
        return
    from PIL import Image
    from skimage import data

    (out / "images").mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for i, (name, objects) in enumerate(OBJECTS.items()):
        pixels = getattr(data, name)()
        Image.fromarray(pixels).save(out / "images" / f"{name}.jpg", quality=95)
        h, w = pixels.shape[:2]
        images.append({"id": i + 1, "file_name": f"{name}.jpg", "width": w, "height": h})
        for cat, x0, y0, x1, y1, poly in objects:
            ann = {"id": len(annotations) + 1, "image_id": i + 1, "category_id": CATEGORIES.index(cat) + 1,
                   "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0), "iscrowd": 0}
            if poly:
                ann["segmentation"] = [poly]
            annotations.append(ann)
    cats = [{"id": i + 1, "name": n} for i, n in enumerate(CATEGORIES)]
    (out / "annotations.json").write_text(json.dumps({"images": images, "annotations": annotations,
                                                      "categories": cats}, indent=1))
    print(f"make_demo_dataset: wrote {len(images)} photos, {len(annotations)} boxes to {out}")


if __name__ == "__main__":
    main()
