"""A Dataset for the DataLoader tests (importable by spawn workers): decodes a photo with osprey and augments it."""
import numpy as np

import osprey
from osprey.augment import Pipeline


class PhotoBoxes:
    def __init__(self, paths, pipeline: Pipeline):
        self.paths = list(paths)
        self.pipeline = pipeline

    def __len__(self):
        return len(self.paths) * 2

    def __getitem__(self, i):
        image = osprey.decode(self.paths[i % len(self.paths)])
        h, w = image.shape[:2]
        out = self.pipeline(image=image, bboxes=[(w * 0.25, h * 0.25, w * 0.75, h * 0.75, i)], seed=i)
        return out["image"], np.asarray(out["bboxes"], dtype=np.float32)
