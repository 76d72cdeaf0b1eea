"""Albumentations-compatible augmentation, in C++ (docs/augment.md lists the transforms and their settings).

    from osprey.augment import Pipeline
    pipe = Pipeline.load("pipeline.json")               # written by A.save(..., data_format="json"), or osprey's JSON
    pipe = Pipeline.from_albumentations(compose)        # an in-memory A.Compose (converted with A.to_dict)
    out = pipe(image=img, bboxes=boxes, category_ids=ids)
    out["image"], out["bboxes"], out["category_ids"]

A call takes the keys an Albumentations Compose takes (`image`, `bboxes` and the `label_fields` of its bbox_params)
and returns the same keys. Boxes are in the pipeline's bbox_params format (pascal_voc when it has none); extra values
after the 4 coordinates of a box are carried along, as in Albumentations. `seed=` makes a call reproducible; without
it the seed comes from Python's `random` module, so `random.seed` (and PyTorch's per-worker seeding in a DataLoader)
controls it. `mask=` (one array) and `masks=` (a list) of uint8 [H, W] or [H, W, C] move with the image (nearest
neighbour, 0 outside for constant borders), as Albumentations' defaults do. One call uses one thread, so DataLoader
workers do not oversubscribe the CPU; the GIL is released while it runs. `keypoints=` in keypoint_params' format
'xy' or 'yx' (extra values per point travel along) move with the warp; those that leave the image are removed
(remove_invisible) with their keypoint label fields. A pipeline that ends in Normalize returns a float32 image (uint8
when that step does not fire, as in Albumentations). Not supported: angle/scale keypoint formats, Mosaic (needs four
images: use `osprey augment`).
"""
from __future__ import annotations

import json
import os
import random
from typing import Any, Dict, List, Optional, Union

from . import _osprey
from ._osprey import Unsupported, InvalidArgument

__all__ = ["Pipeline"]


class Pipeline:
    """A parsed augmentation pipeline. Immutable; safe to call from several threads and to pickle (DataLoader spawn
    workers receive it by pickling: the JSON text travels, the native pipeline is rebuilt)."""

    def __init__(self, json_text: str) -> None:
        self._json = json_text
        self._native = _osprey.Pipeline(json_text)
        doc = json.loads(json_text)
        root = doc.get("transform", doc) if isinstance(doc, dict) else {}
        params = (root.get("bbox_params") if isinstance(root, dict) else None) or doc.get("bbox_params") or {}
        # AlbumentationsX writes coord_format where albumentations wrote format
        self.bbox_format: str = params.get("format") or params.get("coord_format") or "pascal_voc"
        self.label_fields: List[str] = list(params.get("label_fields") or [])
        kp = (root.get("keypoint_params") if isinstance(root, dict) else None) or {}
        self.keypoint_format: str = kp.get("format") or kp.get("coord_format") or "xy"
        self.keypoint_label_fields: List[str] = list(kp.get("label_fields") or [])
        self.remove_invisible: bool = kp.get("remove_invisible", True) is not False

    @classmethod
    def load(cls, path: Union[str, "os.PathLike[str]"]) -> "Pipeline":
        """Reads a pipeline file: osprey's JSON or what Albumentations' `A.save(..., data_format="json")` writes."""
        try:
            with open(os.fspath(path), encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise _osprey.NotFound(f"pipeline file {os.fspath(path)!r} does not exist") from None
        return cls(text)

    @classmethod
    def from_json(cls, text: str) -> "Pipeline":
        return cls(text)

    @classmethod
    def from_albumentations(cls, compose: Any) -> "Pipeline":
        """Converts an in-memory Albumentations transform (A.Compose, or a single transform) with its own `to_dict`."""
        import albumentations as A  # only needed here
        doc = A.to_dict(compose)
        return cls(json.dumps(doc))

    def describe(self) -> str:
        """One line per transform, indented by nesting."""
        return self._native.describe()

    def __call__(self, *, image: Any, bboxes: Any = None, seed: Optional[int] = None, **targets: Any
                 ) -> Dict[str, Any]:
        mask = targets.pop("mask", None)
        masks = targets.pop("masks", None)
        keypoints = targets.pop("keypoints", None)
        if keypoints is not None and self.keypoint_format not in ("xy", "yx"):
            raise Unsupported(f"keypoint format {self.keypoint_format!r}: osprey moves points only (formats 'xy' and "
                              "'yx'); angles and scales are not transformed")
        unknown = [k for k in targets if k not in self.label_fields and k not in self.keypoint_label_fields]
        if unknown:
            raise InvalidArgument(f"unknown keyword(s) {', '.join(sorted(unknown))}: the pipeline's bbox_params "
                                  f"label_fields are {self.label_fields}")
        if seed is None:
            seed = random.getrandbits(64)
        rows = [] if bboxes is None else list(bboxes)
        coords = [tuple(r[:4]) for r in rows]
        for name in self.label_fields:
            if name not in targets:
                raise InvalidArgument(f"missing label field {name!r} (the pipeline's bbox_params label_fields are "
                                      f"{self.label_fields})")
            if len(targets[name]) != len(rows):
                raise InvalidArgument(f"{name} has {len(targets[name])} entries for {len(rows)} bboxes")
        native_masks = ([mask] if mask is not None else []) + (list(masks) if masks is not None else [])
        points = None
        if keypoints is not None:
            # Albumentations' keypoints are pixel indices (the first pixel's centre is 0, 0); osprey's are continuous
            # coordinates (its centre is 0.5, 0.5).
            if any(len(p) < 2 for p in keypoints):
                raise InvalidArgument("keypoints: each point needs 2 numbers (x, y) before any extra values")
            xy = [(p[0], p[1]) if self.keypoint_format == "xy" else (p[1], p[0]) for p in keypoints]
            points = [(x + 0.5, y + 0.5) for x, y in xy]
        out_image, out_boxes, kept, out_masks, out_points = self._native.apply(
            image, coords, self.bbox_format, int(seed) & (2**64 - 1), native_masks, points)
        kept = kept.tolist()
        result: Dict[str, Any] = {"image": out_image}
        if mask is not None:
            result["mask"] = out_masks.pop(0)
        if masks is not None:
            result["masks"] = list(out_masks)
        if keypoints is not None:
            keep = [i for i, p in enumerate(out_points.tolist()) if p[2] > 0 or not self.remove_invisible]
            result["keypoints"] = []
            for i in keep:
                x, y = out_points[i, 0] - 0.5, out_points[i, 1] - 0.5
                head = (x, y) if self.keypoint_format == "xy" else (y, x)
                result["keypoints"].append(head + tuple(keypoints[i][2:]))
            for name in self.keypoint_label_fields:
                if name not in targets:
                    raise InvalidArgument(f"missing keypoint label field {name!r}")
                result[name] = [targets[name][i] for i in keep]
        boxes_out = []
        for b, k in zip(out_boxes.tolist(), kept):
            extra = tuple(rows[k][4:])
            boxes_out.append(tuple(b) + extra)
        result["bboxes"] = boxes_out
        for name in self.label_fields:
            labels = targets[name]
            result[name] = [labels[k] for k in kept]
        return result

    def __getstate__(self) -> Dict[str, str]:
        return {"json": self._json}

    def __setstate__(self, state: Dict[str, str]) -> None:
        self.__init__(state["json"])

    def __repr__(self) -> str:
        return "osprey.augment.Pipeline(\n" + self.describe() + ")"
