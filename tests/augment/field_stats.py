"""Statistics of a random displacement field, read from warped coordinate images (R = x, G = y, B = 128): shared by
test_albumentations_elastic.py and record_albumentationsx.py (numpy only)."""

import numpy as np

SIZE = 256  # coordinate images: one grey level per pixel along each axis


def coordinate_image():
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    return np.stack([x, y, np.full_like(x, 128)], axis=-1).astype(np.uint8)


def field_statistics(images, sigma):
    """(std of the displacement over both axes, {lag: correlation along x and y}) of warped coordinate images; pixels
    that sampled outside the image (B != 128, or a coordinate at the edge) are left out."""
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    dxs, valids = [], []
    for img in images:
        img = img.astype(np.int64)
        valid = (img[..., 2] == 128) & (img[..., 0] > 0) & (img[..., 0] < SIZE - 1) & (img[..., 1] > 0) & \
                (img[..., 1] < SIZE - 1)
        dxs += [img[..., 0] - x, img[..., 1] - y]
        valids += [valid, valid]
    var = np.mean([np.mean(d[v] ** 2) for d, v in zip(dxs, valids)])
    corr = {}
    for k in (1, 2, 3):
        lag = int(round(k * sigma))
        num = []
        for d, v in zip(dxs, valids):
            both_x = v[:, :-lag] & v[:, lag:]
            both_y = v[:-lag] & v[lag:]
            num += [np.mean((d[:, :-lag] * d[:, lag:])[both_x]), np.mean((d[:-lag] * d[lag:])[both_y])]
        corr[k] = float(np.mean(num) / var)
    return float(np.sqrt(var)), corr
