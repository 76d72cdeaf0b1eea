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
controls it. One call uses one thread, so DataLoader workers do not oversubscribe the CPU; the GIL is released while
it runs. Not supported yet: keypoints, masks (raise osprey.Unsupported), Mosaic (use `osprey augment`).
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
        self.bbox_format: str = params.get("format") or "pascal_voc"
        self.label_fields: List[str] = list(params.get("label_fields") or [])
        keypoint_params = root.get("keypoint_params") if isinstance(root, dict) else None
        self._has_keypoint_params = bool(keypoint_params)

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
        for key in ("keypoints", "masks", "mask"):
            if key in targets and targets[key] is not None:
                raise Unsupported(f"{key}= is not supported by osprey's Python pipeline yet (boxes and their label "
                                  "fields are); use Albumentations for this call or drop the key")
        unknown = [k for k in targets if k not in self.label_fields and k not in ("keypoints", "masks", "mask")]
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
        out_image, out_boxes, kept = self._native.apply(image, coords, self.bbox_format, int(seed) & (2**64 - 1))
        kept = kept.tolist()
        result: Dict[str, Any] = {"image": out_image}
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
