"""osprey-domain image ops through the real `osprey run` binary, compared with OpenCV, Pillow and numpy.

Images: scikit-image's bundled photos (astronaut, coffee, chelsea), synthetic noise and odd sizes (1x1, 3x1000,
4097x3). Each comparison states its tolerance and why. Fast kernels run by default; some cases also run with
--reference so the reference kernels meet the same oracles.
"""

import cv2
import numpy as np
import pytest
import skimage.data
from PIL import Image, ImageOps


def photo(name):
    return getattr(skimage.data, name)()


def noise(h, w, c=3, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, c), dtype=np.uint8)


def absdiff(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    return np.abs(a.astype(np.float64) - b.astype(np.float64))


def to_f32(img):
    return img.astype(np.float32) / 255.0


# Downscaling and upscaling of photos, plus the odd sizes of the issue: (image, (out_h, out_w)).
RESIZE_CASES = [
    ("astronaut", (300, 200)),   # down, non-integer factors
    ("coffee", (700, 901)),      # up
    ("chelsea", (150, 225)),     # down ~2x
    ("astronaut", (100, 700)),   # down in H, up in W
]
ODD_CASES = [((1, 1), (5, 5)), ((3, 1000), (7, 11)), ((4097, 3), (17, 2)), ((13, 7), (29, 4))]

CV_FLAGS = {"bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC, "area": cv2.INTER_AREA}


def resize_inputs():
    for name, size in RESIZE_CASES:
        yield pytest.param(photo(name), size, id=f"{name}->{size[0]}x{size[1]}")
    for (h, w), size in ODD_CASES:
        yield pytest.param(noise(h, w, seed=h * w), size, id=f"{h}x{w}->{size[0]}x{size[1]}")


@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "area"])
@pytest.mark.parametrize("image,size", list(resize_inputs()))
def test_resize_matches_opencv(run_op, image, size, mode):
    h, w = size
    ours = run_op("ResizeImage", image, height=h, width=w, mode=mode, antialias=0)
    expected = cv2.resize(image, (w, h), interpolation=CV_FLAGS[mode])
    # uint8: OpenCV interpolates in 11-bit fixed point (area: float weights), osprey in float then rounds: a value
    # may land on the other side of .5, so max abs diff <= 1.
    assert absdiff(ours, expected).max() <= 1
    # float32 (values in [0, 1]): same formulas, but OpenCV computes the source position in float32, whose ulp at
    # x ~ 1000 is 6e-5, and that much shifts the weights: max abs <= 1e-4.
    f = to_f32(image)
    ours_f = run_op("ResizeImage", f, height=h, width=w, mode=mode, antialias=0)
    assert absdiff(ours_f, cv2.resize(f, (w, h), interpolation=CV_FLAGS[mode])).max() <= 1e-4


def test_resize_reference_kernels_match_opencv(run_op):
    image = photo("chelsea")[:90, :131]
    for mode in CV_FLAGS:
        for h, w in [(40, 61), (200, 150)]:
            ours = run_op("ResizeImage", image, reference=True, height=h, width=w, mode=mode, antialias=0)
            # Same reason as above: rounding of the last bit.
            assert absdiff(ours, cv2.resize(image, (w, h), interpolation=CV_FLAGS[mode])).max() <= 1, (mode, h, w)


def nearest_index(n_in, n_out):
    # Half-pixel centres, exact in integers: floor((o + 0.5) * n_in / n_out).
    return ((2 * np.arange(n_out) + 1) * n_in) // (2 * n_out)


def near_tie_positions(n_in, n_out):
    # Outputs whose centre maps within 0.02 pixel above a source pixel boundary (exactly onto it included).
    return ((2 * np.arange(n_out) + 1) * n_in) % (2 * n_out) < 0.04 * n_out


@pytest.mark.parametrize("image,size", list(resize_inputs()))
def test_resize_nearest(run_op, image, size):
    h, w = size
    ours = run_op("ResizeImage", image, height=h, width=w, mode="nearest")
    rows, cols = nearest_index(image.shape[0], h), nearest_index(image.shape[1], w)
    # Oracle 1: the exact half-pixel gather computed here. A pure copy: exact.
    np.testing.assert_array_equal(ours, image[rows][:, cols])
    # Oracle 2: OpenCV INTER_NEAREST_EXACT and Pillow NEAREST use the same rule but compute the source coordinate in
    # 16-bit fixed point / accumulated floats, so where the centre lies on or within 0.02 pixel above a pixel
    # boundary they may pick the pixel one lower. Everywhere else: exact.
    keep = ~near_tie_positions(image.shape[0], h)[:, None] & ~near_tie_positions(image.shape[1], w)[None, :]
    cv = cv2.resize(image, (w, h), interpolation=cv2.INTER_NEAREST_EXACT)
    pil = np.asarray(Image.fromarray(image).resize((w, h), Image.NEAREST))
    np.testing.assert_array_equal(ours[keep], cv[keep])
    np.testing.assert_array_equal(ours[keep], pil[keep])


PIL_FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}


def pil_resize_f32(image_f, size, resample):
    h, w = size
    chans = [np.asarray(Image.fromarray(image_f[..., c], mode="F").resize((w, h), resample))
             for c in range(image_f.shape[2])]
    return np.stack(chans, axis=-1)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("image,size", list(resize_inputs()))
def test_resize_antialias_matches_pillow(run_op, image, size, mode):
    h, w = size
    ours = run_op("ResizeImage", image, height=h, width=w, mode=mode, antialias=1)
    expected = np.asarray(Image.fromarray(image).resize((w, h), PIL_FILTERS[mode]))
    diff = absdiff(ours, expected)
    # uint8 vs Pillow: Pillow rounds AND clips to uint8 between its horizontal and vertical passes (bicubic
    # overshoot at sharp edges is clipped there), osprey keeps the intermediate in float: bilinear max abs <= 1,
    # bicubic max abs <= 24 at a few edge pixels, mean <= 0.5 for both. The float comparison below is the tight one.
    assert diff.max() <= (1 if mode == "bilinear" else 24)
    assert diff.mean() <= 0.5
    # Pillow's float ("F") images keep the intermediate in float: the same computation, max abs <= 1e-3 on [0, 255].
    image_f = image.astype(np.float32)
    ours_f = run_op("ResizeImage", image_f, height=h, width=w, mode=mode, antialias=1)
    assert absdiff(ours_f, pil_resize_f32(image_f, size, PIL_FILTERS[mode])).max() <= 1e-3


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_resize_antialias_single_axis_matches_pillow_uint8(run_op, mode):
    # Only the width changes, so Pillow makes one pass with no intermediate rounding: max abs <= 1 (last-bit rounding:
    # Pillow's 22-bit fixed-point weights vs osprey's float).
    image = photo("astronaut")
    for w in (157, 900):
        ours = run_op("ResizeImage", image, height=512, width=w, mode=mode, antialias=1)
        expected = np.asarray(Image.fromarray(image).resize((w, 512), PIL_FILTERS[mode]))
        assert absdiff(ours, expected).max() <= 1, w


def test_resize_batch_matches_single_images(run_op):
    batch = np.stack([photo("astronaut")[:300, :400], photo("coffee")[:300, :400]])
    ours = run_op("ResizeImage", batch, height=123, width=77, mode="bicubic", antialias=1)
    for i in range(2):
        np.testing.assert_array_equal(ours[i], run_op("ResizeImage", batch[i], height=123, width=77, mode="bicubic"))


def rotation_matrix(image, angle, scale):
    h, w = image.shape[:2]
    return cv2.getRotationMatrix2D((w / 2 - 0.3, h / 2 + 0.7), angle, scale)


@pytest.mark.parametrize("mode,flag", [("bilinear", cv2.INTER_LINEAR), ("nearest", cv2.INTER_NEAREST)])
@pytest.mark.parametrize("name", ["astronaut", "coffee"])
def test_warp_affine_matches_opencv(run_op, name, mode, flag):
    image = photo(name)
    m = rotation_matrix(image, 23.0, 0.8)
    h, w = 333, 419
    attrs = dict(matrix=m.flatten().astype(np.float32).tolist(), height=h, width=w, mode=mode, border_value=40.0)
    m32 = np.array(attrs["matrix"], dtype=np.float64).reshape(2, 3)
    expected = cv2.warpAffine(image, m32, (w, h), flags=flag | cv2.WARP_INVERSE_MAP,
                              borderMode=cv2.BORDER_CONSTANT, borderValue=(40, 40, 40))
    ours = run_op("WarpAffine", image, **attrs)
    diff = absdiff(ours, expected)
    if mode == "bilinear":
        # OpenCV quantises the source position to 1/32 pixel (INTER_BITS = 5) and uses 15-bit weights; osprey uses
        # the exact position. The error is at most |local gradient| / 64 + rounding: on photos, mean <= 0.5 and
        # max abs <= 5 (255 / 64 + 1).
        assert diff.mean() <= 0.5
        assert diff.max() <= 5
        # On a smooth image the position quantisation is invisible: max abs <= 1.
        yy, xx = np.mgrid[0:200, 0:300]
        smooth = np.stack([xx * 0.8, yy * 1.1, (xx + yy) * 0.4], -1).astype(np.uint8)
        ours_s = run_op("WarpAffine", smooth, **attrs)
        exp_s = cv2.warpAffine(smooth, m32, (w, h), flags=flag | cv2.WARP_INVERSE_MAP,
                               borderMode=cv2.BORDER_CONSTANT, borderValue=(40, 40, 40))
        # Only where all four taps are inside: a tap mixing in the border value sees a step, not a smooth ramp.
        yo, xo = np.mgrid[0:h, 0:w]
        xs, ys = m32[0, 0] * xo + m32[0, 1] * yo + m32[0, 2], m32[1, 0] * xo + m32[1, 1] * yo + m32[1, 2]
        inner = (xs >= 0.1) & (xs <= smooth.shape[1] - 1.1) & (ys >= 0.1) & (ys <= smooth.shape[0] - 1.1)
        assert inner.sum() > 1000
        assert absdiff(ours_s, exp_s)[inner].max() <= 1
    else:
        # Nearest: OpenCV rounds the position in 10-bit fixed point; only pixels whose source coordinate lies within
        # 1/1024 of a half-integer may pick the neighbour. At most 0.5% of pixels differ.
        assert (diff.max(axis=-1) > 0).mean() <= 0.005


def test_warp_affine_float_and_reference(run_op):
    image = to_f32(photo("chelsea"))
    m = np.array([[1.0, 0.0, 10.25], [0.0, 1.0, -5.5]], dtype=np.float32)  # positions exact in 1/32 pixel
    attrs = dict(matrix=m.flatten().tolist(), height=280, width=440, border_value=0.25)
    expected = cv2.warpAffine(image, m.astype(np.float64), (440, 280), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                              borderMode=cv2.BORDER_CONSTANT, borderValue=(0.25, 0.25, 0.25))
    # Positions on the 1/32 grid, so OpenCV's quantisation is exact: float rounding only.
    assert absdiff(run_op("WarpAffine", image, **attrs), expected).max() <= 1e-5
    assert absdiff(run_op("WarpAffine", image, reference=True, **attrs), expected).max() <= 1e-5


@pytest.mark.parametrize("src,dst,code,channels", [
    ("RGB", "GRAY", cv2.COLOR_RGB2GRAY, 3),
    ("BGR", "GRAY", cv2.COLOR_BGR2GRAY, 3),
    ("RGB", "BGR", cv2.COLOR_RGB2BGR, 3),
    ("GRAY", "RGB", cv2.COLOR_GRAY2RGB, 1),
    ("RGBA", "GRAY", cv2.COLOR_RGBA2GRAY, 4),
    ("BGRA", "RGB", cv2.COLOR_BGRA2RGB, 4),
])
def test_color_convert_matches_opencv(run_op, src, dst, code, channels):
    rgb = photo("coffee")
    image = {1: rgb[..., :1], 3: rgb, 4: np.concatenate([rgb, rgb[..., :1]], axis=-1)}[channels]
    image = np.ascontiguousarray(image)
    expected = cv2.cvtColor(image, code)
    if expected.ndim == 2:
        expected = expected[..., None]
    ours = run_op("ColorConvert", image, **{"from": src, "to": dst})
    # uint8: OpenCV's 15-bit fixed-point weights, implemented the same way: exact.
    np.testing.assert_array_equal(ours, expected)
    # float32: 0.299 R + 0.587 G + 0.114 B in float on both sides.
    f = to_f32(image)
    expected_f = cv2.cvtColor(f, code)
    if expected_f.ndim == 2:
        expected_f = expected_f[..., None]
    assert absdiff(run_op("ColorConvert", f, **{"from": src, "to": dst}), expected_f).max() <= 1e-6


def test_gray_matches_pillow(run_op):
    image = photo("astronaut")
    ours = run_op("ColorConvert", image, **{"from": "RGB", "to": "GRAY"})[..., 0]
    # Pillow's "L" uses 16-bit weights, OpenCV (and osprey) 15-bit: max abs <= 1.
    assert absdiff(ours, np.asarray(Image.fromarray(image).convert("L"))).max() <= 1


ODD_IMAGES = [(1, 1), (3, 1000), (4097, 3), (13, 7)]


@pytest.mark.parametrize("hw", ODD_IMAGES + [(512, 512)], ids=str)
def test_flip_rotate_crop_exact(run_op, hw):
    image = photo("astronaut") if hw == (512, 512) else noise(*hw, seed=3)
    pil = Image.fromarray(image)
    # Pure data movement: every comparison is exact.
    np.testing.assert_array_equal(run_op("FlipImage", image), np.asarray(ImageOps.mirror(pil)))
    np.testing.assert_array_equal(run_op("FlipImage", image, horizontal=0, vertical=1), np.asarray(ImageOps.flip(pil)))
    np.testing.assert_array_equal(run_op("FlipImage", image, horizontal=1, vertical=1), image[::-1, ::-1])
    for k in (1, 2, 3, 4, -1):
        np.testing.assert_array_equal(run_op("Rotate90", image, k=k), np.rot90(image, k))
    h, w = hw
    top, left, ch, cw = h // 3, w // 4, max(1, h // 2), max(1, w // 2)
    np.testing.assert_array_equal(run_op("CropImage", image, top=top, left=left, height=ch, width=cw),
                                  image[top:top + ch, left:left + cw])


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad_matches_numpy(run_op, mode):
    for image in (noise(13, 7, seed=5), photo("chelsea"), noise(3, 1000, seed=6)):
        pads = dict(top=2, bottom=1, left=3, right=5)
        ours = run_op("PadImage", image, mode=mode, value=17.0, **pads)
        widths = ((2, 1), (3, 5), (0, 0))
        expected = (np.pad(image, widths, mode="constant", constant_values=17) if mode == "constant"
                    else np.pad(image, widths, mode=mode))
        np.testing.assert_array_equal(ours, expected)  # data movement: exact


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_normalize(run_op, layout, dtype):
    mean, std, scale = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225], 1 / 255
    for image in (photo("astronaut"), noise(4097, 3, seed=7), noise(1, 1, seed=8)):
        x = image.astype(dtype)
        ours = run_op("NormalizeImage", x, scale=scale, mean=mean, std=std, layout=layout)
        expected = (x.astype(np.float64) * np.float32(scale) - mean) / std
        if layout == "CHW":
            expected = expected.transpose(2, 0, 1)
        assert ours.dtype == np.float32
        # float32 arithmetic (x * scale - mean) / std vs float64: a few ulps of values of magnitude <= 2.7.
        assert absdiff(ours, expected).max() <= 2e-6
        ref = run_op("NormalizeImage", x, reference=True, scale=scale, mean=mean, std=std, layout=layout)
        np.testing.assert_array_equal(ours, ref)  # the uint8 lookup table uses the reference's exact expression


def test_normalize_batch_and_layout_ops(run_op):
    batch = np.stack([photo("astronaut")[:200, :300], photo("coffee")[:200, :300]])
    ours = run_op("NormalizeImage", batch, scale=2.0, mean=[1.0, 2.0, 3.0], std=[4.0, 5.0, 6.0])
    expected = ((batch.astype(np.float32) * 2 - np.float32([1, 2, 3])) / np.float32([4, 5, 6])).transpose(0, 3, 1, 2)
    assert absdiff(ours, expected).max() <= 1e-5
    chw = run_op("HwcToChw", batch)
    np.testing.assert_array_equal(chw, batch.transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(run_op("ChwToHwc", chw), batch)
    single = to_f32(photo("chelsea"))
    np.testing.assert_array_equal(run_op("HwcToChw", single), single.transpose(2, 0, 1))


@pytest.mark.parametrize("op,attrs,message", [
    ("CropImage", dict(top=500, left=0, height=100, width=10), "inside the 512x512 image"),
    ("ResizeImage", dict(height=10, width=10, mode="lanczos"), "lanczos"),
    ("ColorConvert", {"from": "GRAY", "to": "RGB"}, "channel"),
    ("WarpAffine", dict(matrix=[1.0, 0.0], height=4, width=4), "6 floats"),
])
def test_bad_attributes_are_clear_errors(run_op, op, attrs, message):
    with pytest.raises(RuntimeError, match=message):
        run_op(op, photo("astronaut"), **attrs)
