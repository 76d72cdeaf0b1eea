"""Augmentation image ops (docs/augment.md) through the real `osprey run` binary, compared with OpenCV 4.10 and
Albumentations 1.4.24 / albucore functional code.

Images: scikit-image's bundled photos (astronaut, chelsea, coffee) and odd-sized noise. Each comparison states its
tolerance and why. Fast kernels run by default; some cases also run with --reference.
"""

import os

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

import albucore  # noqa: E402
import cv2  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import skimage.data  # noqa: E402
from albumentations.augmentations import functional as AF  # noqa: E402


def photo(name, h=None, w=None):
    img = getattr(skimage.data, name)()
    return np.ascontiguousarray(img[:h, :w])


def noise(h, w, c=3, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, c), dtype=np.uint8)


def absdiff(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    return np.abs(a.astype(np.float64) - b.astype(np.float64))


# ---------------------------------------------------------------- WarpPerspective

CV_BORDERS = {"constant": cv2.BORDER_CONSTANT, "replicate": cv2.BORDER_REPLICATE, "reflect": cv2.BORDER_REFLECT,
              "reflect101": cv2.BORDER_REFLECT_101}
CV_INTERP = {"bilinear": cv2.INTER_LINEAR, "nearest": cv2.INTER_NEAREST}


def random_matrix(rng, h, w, perspective):
    # Rotation + scale + shear + translation about the centre, plus (optionally) a perspective row; float32 values
    # (what the ONNX attribute holds), given to OpenCV as the same float64 numbers.
    a = rng.uniform(-0.6, 0.6)
    s = rng.uniform(0.7, 1.4)
    m = np.array([[s * np.cos(a), -s * np.sin(a) + rng.uniform(-0.2, 0.2), 0],
                  [s * np.sin(a), s * np.cos(a), 0], [0, 0, 1]])
    m[0, 2] = w / 2 - m[0, 0] * w / 2 - m[0, 1] * h / 2 + rng.uniform(-20, 20)
    m[1, 2] = h / 2 - m[1, 0] * w / 2 - m[1, 1] * h / 2 + rng.uniform(-20, 20)
    if perspective:
        m[2, 0], m[2, 1] = rng.uniform(-8e-4, 8e-4, size=2)
    return m.astype(np.float32).astype(np.float64)


def warp_inputs():
    gray = cv2.cvtColor(photo("chelsea"), cv2.COLOR_RGB2GRAY)[..., None]
    yield pytest.param(photo("astronaut", 300, 360), id="astronaut-rgb")
    yield pytest.param(gray, id="chelsea-gray")
    yield pytest.param(np.ascontiguousarray(np.dstack([photo("coffee", 150, 170), noise(150, 170, 1)])),
                       id="coffee-rgba")
    yield pytest.param(noise(7, 5, seed=3), id="noise-7x5")


@pytest.mark.parametrize("perspective", [False, True], ids=["affine", "perspective"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("border", list(CV_BORDERS))
@pytest.mark.parametrize("image", list(warp_inputs()))
def test_warp_perspective_matches_opencv(run_op, image, border, mode, perspective):
    h, w = image.shape[:2]
    rng = np.random.default_rng(h * w + len(border) + 7 * perspective)
    m = random_matrix(rng, h, w, perspective)
    out_h, out_w = h + 13, w - 2 if w > 3 else w + 4
    ours = run_op("WarpPerspective", image, matrix=m.ravel().tolist(), height=out_h, width=out_w, mode=mode,
                  border_mode=border, border_value=114.0)
    expected = cv2.warpPerspective(image, m, (out_w, out_h), flags=CV_INTERP[mode] | cv2.WARP_INVERSE_MAP,
                                   borderMode=CV_BORDERS[border], borderValue=(114, 114, 114, 114))
    expected = expected.reshape(ours.shape)
    # uint8: osprey uses OpenCV's arithmetic (position rounded to 1/32 pixel, ties to even; exact integer bilinear
    # weights), so the result is bit-exact, except where a position lies within ~1e-12 of a rounding tie and the two
    # sum their doubles in a different order (OpenCV works in blocks of 64 pixels): allow 0.05% of pixels to differ.
    diff = absdiff(ours, expected)
    assert (diff > 0).mean() <= 5e-4, (diff.max(), (diff > 0).sum())
    # float32 (values in [0, 1]): OpenCV's float weights vs osprey's; same positions.
    f = image.astype(np.float32) / 255
    ours_f = run_op("WarpPerspective", f, matrix=m.ravel().tolist(), height=out_h, width=out_w, mode=mode,
                    border_mode=border, border_value=0.5)
    expected_f = cv2.warpPerspective(f, m, (out_w, out_h), flags=CV_INTERP[mode] | cv2.WARP_INVERSE_MAP,
                                     borderMode=CV_BORDERS[border], borderValue=(0.5, 0.5, 0.5, 0.5))
    diff_f = absdiff(ours_f, expected_f.reshape(ours_f.shape))
    assert (diff_f > 1e-5).mean() <= 5e-4, diff_f.max()


def test_warp_perspective_reference_kernel_matches_opencv(run_op):
    image = photo("chelsea", 120, 150)
    rng = np.random.default_rng(5)
    for perspective in (False, True):
        m = random_matrix(rng, 120, 150, perspective)
        for border in ("constant", "reflect101"):
            ours = run_op("WarpPerspective", image, reference=True, matrix=m.ravel().tolist(), height=100, width=170,
                          border_mode=border)
            expected = cv2.warpPerspective(image, m, (170, 100), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                                           borderMode=CV_BORDERS[border])
            assert (absdiff(ours, expected) > 0).mean() <= 5e-4  # as above


# ---------------------------------------------------------------- GaussianBlur

BLUR_CASES = [(3, 3, 0, 0), (5, 5, 0, 0), (7, 7, 0, 0), (9, 9, 0, 0), (0, 0, 1.0, 0), (0, 0, 2.5, 0),
              (5, 11, 0, 0), (0, 0, 0.8, 3.0), (15, 15, 4.0, 0), (3, 1, 0, 0)]


@pytest.mark.parametrize("kx,ky,sx,sy", BLUR_CASES)
@pytest.mark.parametrize("image", [pytest.param(photo("astronaut", 256, 300), id="astronaut"),
                                   pytest.param(noise(5, 41, 1, seed=2), id="noise-5x41x1")])
def test_gaussian_blur_matches_opencv(run_op, image, kx, ky, sx, sy):
    attrs = dict(ksize_x=kx, ksize_y=ky, sigma_x=float(sx), sigma_y=float(sy))
    ours = run_op("GaussianBlur", image, **attrs)
    expected = cv2.GaussianBlur(image, (kx, ky), sigmaX=sx, sigmaY=sy, borderType=cv2.BORDER_REFLECT_101)
    expected = expected.reshape(ours.shape)
    # uint8: OpenCV computes in fixed point (taps in 1/256, error-diffused); osprey uses the same taps and integers.
    np.testing.assert_array_equal(ours, expected)
    # float32: same taps in float (OpenCV's float path: kernel size from 4 sigma, taps in float32): 1e-5.
    f = image.astype(np.float32) / 255
    ours_f = run_op("GaussianBlur", f, **attrs)
    expected_f = cv2.GaussianBlur(f, (kx, ky), sigmaX=sx, sigmaY=sy, borderType=cv2.BORDER_REFLECT_101)
    assert absdiff(ours_f, expected_f.reshape(ours_f.shape)).max() <= 1e-5


@pytest.mark.parametrize("kx,ky", [(3, 3), (5, 5), (1, 7), (9, 4), (15, 15)])
def test_box_blur_matches_opencv(run_op, kx, ky):
    # cv2.blur: the window mean, BORDER_REFLECT_101. uint8: osprey sums in float, OpenCV in integers with a fixed-point
    # scale, so a value may round the other way: within 1, no bias. float32: 1e-5.
    image = photo("astronaut", 120, 150)
    ours = run_op("BoxBlur", image, ksize_x=kx, ksize_y=ky)
    expected = cv2.blur(image, (kx, ky), borderType=cv2.BORDER_REFLECT_101).reshape(ours.shape)
    diff = ours.astype(np.int64) - expected
    assert np.abs(diff).max() <= 1 and abs(diff.mean()) <= 0.01
    f = image.astype(np.float32) / 255
    ours_f = run_op("BoxBlur", f, ksize_x=kx, ksize_y=ky)
    expected_f = cv2.blur(f, (kx, ky), borderType=cv2.BORDER_REFLECT_101).reshape(ours_f.shape)
    assert absdiff(ours_f, expected_f).max() <= 1e-5
    np.testing.assert_array_equal(run_op("BoxBlur", image, reference=True, ksize_x=kx, ksize_y=ky), ours)


def test_gaussian_blur_reference_kernel_matches_opencv(run_op):
    image = photo("coffee", 60, 90)
    for kx, ky, sx, sy in [(5, 5, 0, 0), (0, 0, 1.7, 0)]:
        ours = run_op("GaussianBlur", image, reference=True, ksize_x=kx, ksize_y=ky, sigma_x=sx, sigma_y=sy)
        expected = cv2.GaussianBlur(image, (kx, ky), sigmaX=sx, sigmaY=sy)
        np.testing.assert_array_equal(ours, expected)  # as above


# ---------------------------------------------------------------- colour (Albumentations / albucore arithmetic)

def f32(x):
    # Attributes are float32: give Albumentations the same number.
    return float(np.float32(x))


COLOR_IMAGES = [pytest.param(photo("astronaut", 200, 230), id="astronaut"),
                pytest.param(photo("coffee", 120, 160), id="coffee"),
                pytest.param(noise(9, 13, seed=4), id="noise")]


def assert_hsv_close(ours, expected, what):
    # OpenCV 4.10's uint8 HSV -> RGB: its SIMD body (AVX2: 32 pixels at a time) truncates x * 255, its scalar tail
    # (the last W mod 32 pixels of each row) rounds. osprey truncates everywhere (bit-exact with the SIMD body on all
    # 180 x 256 x 256 HSV values): exact on the body, at most 1 below on the tail columns.
    body = ours.shape[1] // 32 * 32
    diff = expected.astype(np.int64) - ours
    assert np.array_equal(ours[:, :body], expected[:, :body]), (what, np.abs(diff[:, :body]).max())
    if body < ours.shape[1]:
        assert diff[:, body:].min() >= 0 and diff[:, body:].max() <= 1, what


def test_hsv_conversion_model_is_opencv_on_every_value():
    # The arithmetic the ShiftHSV kernel uses for HSV -> RGB (float32, 1 - s*h fused, truncation), on every HSV
    # value in rows of 64 (the SIMD body), against cv2.
    h, s, v = np.meshgrid(np.arange(180), np.arange(256), np.arange(256), indexing="ij")
    hsv = np.stack([h, s, v], -1).reshape(-1, 64, 3).astype(np.uint8)
    expected = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB).reshape(-1, 3)
    f = np.float32
    hf, sf, vf = h.ravel().astype(f), s.ravel().astype(f) * f(1 / 255), v.ravel().astype(f) * f(1 / 255)
    hh = hf * f(6.0 / 180)
    sector = np.floor(hh).astype(int)
    hh = hh - sector.astype(f)
    t2 = vf * (1 - sf.astype(np.float64) * hh).astype(f)
    t3 = vf * (1 - sf.astype(np.float64) * (f(1) - hh)).astype(f)
    tab = np.stack([vf, vf * (f(1) - sf), t2, t3], -1)
    order = np.array([[1, 3, 0], [1, 0, 2], [3, 0, 1], [0, 2, 1], [0, 1, 3], [2, 1, 0]])[sector]  # b, g, r
    rgb = np.stack([np.take_along_axis(tab, order[:, j:j + 1], 1)[:, 0] for j in (2, 1, 0)], -1)
    np.testing.assert_array_equal((rgb * f(255)).astype(np.uint8), expected)


@pytest.mark.parametrize("image", COLOR_IMAGES)
def test_shift_hsv_matches_albumentations(run_op, image):
    rng = np.random.default_rng(image.shape[0])
    for hue, sat, val in [(0, 0, 0), (180, 0, 0), (12.6, 0, 0), (-17.3, 25.9, -30.2), (0, -40.5, 0),
                          tuple(rng.uniform(-40, 40, size=3))]:
        hue, sat, val = f32(hue), f32(sat), f32(val)
        ours = run_op("ShiftHSV", image, hue=hue, saturation=sat, value=val)
        # OpenCV's uint8 RGB -> HSV tables (exact), Albumentations' hue LUT (floor of the mod) and albucore's
        # truncated integer shifts (exact), OpenCV's HSV -> RGB (see assert_hsv_close).
        assert_hsv_close(ours, AF.shift_hsv(image, hue, sat, val), (hue, sat, val))
    # hue = 180 is a pure RGB -> HSV -> RGB round trip: OpenCV's conversions themselves.
    round_trip = cv2.cvtColor(cv2.cvtColor(image, cv2.COLOR_RGB2HSV), cv2.COLOR_HSV2RGB)
    assert_hsv_close(run_op("ShiftHSV", image, hue=180.0), round_trip, "round trip")


@pytest.mark.parametrize("image", COLOR_IMAGES)
def test_color_jitter_hue_matches_albumentations(run_op, image):
    for factor in (0.1, -0.25, 0.5, 0.03):
        factor = f32(factor)
        ours = run_op("ShiftHSV", image, hue=f32(180 * factor))
        # ColorJitter hue: H + 180 * factor; osprey gets hue = float32(180 * factor), which may differ from the
        # double by 1 ulp (matters only where that crosses an integer: not for these factors).
        assert_hsv_close(ours, AF.adjust_hue_torchvision(image.copy(), factor), factor)


@pytest.mark.parametrize("image", COLOR_IMAGES + [pytest.param(photo("camera", 100, 120)[..., None], id="gray")])
def test_adjust_contrast_matches_albumentations(run_op, image):
    for factor in (0.0, 0.5, 0.8, 1.0, 1.3, 2.0):
        factor = f32(factor)
        ours = run_op("AdjustContrast", image, factor=factor)
        expected = AF.adjust_contrast_torchvision(image, factor).reshape(ours.shape)
        # Same float32 lookup table as albucore (truncating), same uint8 gray mean: exact.
        assert absdiff(ours, expected).max() == 0, factor


@pytest.mark.parametrize("image", COLOR_IMAGES)
def test_adjust_saturation_matches_albumentations(run_op, image):
    for factor in (0.0, 0.4, 1.0, 1.5, 3.0):
        factor = f32(factor)
        ours = run_op("AdjustSaturation", image, factor=factor)
        expected = AF.adjust_saturation_torchvision(image, factor)
        # cv2.addWeighted's arithmetic (float32 x * f + gray * (1 - f), rounded half to even): exact.
        assert absdiff(ours, expected).max() == 0, factor


@pytest.mark.parametrize("image", COLOR_IMAGES)
def test_lookup_table_as_albumentations_gamma_and_brightness_contrast(run_op, image):
    for gamma in (0.5, 0.8, 1.7):
        # RandomGamma's table exactly as Albumentations builds it (truncated to uint8).
        table = ((np.arange(0, 256.0 / 255, 1.0 / 255) ** gamma) * 255).astype(np.uint8)[:256]
        ours = run_op("LookupTable", image, table=table.astype(int).tolist())
        assert absdiff(ours, AF.gamma_transform(image, gamma)).max() == 0, gamma
    for alpha, beta in [(1.2, 10.0), (0.7, -20.0), (1.0, 51.0)]:
        # RandomBrightnessContrast: albucore.multiply_add's float32 table, truncated.
        table = np.clip(np.arange(0, 256, dtype=np.float32) * alpha + beta, 0, 255).astype(np.uint8)
        ours = run_op("LookupTable", image, table=table.astype(int).tolist())
        assert absdiff(ours, albucore.multiply_add(image, alpha, beta)).max() == 0, (alpha, beta)
    # One table per channel: numpy indexing.
    tables = np.random.default_rng(1).integers(0, 256, size=(3, 256))
    ours = run_op("LookupTable", image, table=tables.ravel().tolist())
    expected = np.stack([tables[c][image[..., c]] for c in range(3)], axis=-1)
    np.testing.assert_array_equal(ours, expected)


# ---------------------------------------------------------------- FillRects, AddGaussianNoise

def test_fill_rects_matches_numpy(run_op):
    image = photo("astronaut", 100, 120)
    rects = [[10, 20, 30, 50], [-5, 100, 8, 200], [90, -3, 140, 7], [40, 40, 40, 60]]
    ours = run_op("FillRects", image, rects=sum(rects, []), fill=[1.0, 114.0, 255.0])
    expected = image.copy()
    for t, l, b, r in rects:
        expected[max(t, 0):max(b, 0), max(l, 0):max(r, 0)] = (1, 114, 255)
    np.testing.assert_array_equal(ours, expected)
    ours_one = run_op("FillRects", image, rects=[0, 0, 2, 3], fill=[7])
    expected = image.copy()
    expected[:2, :3] = 7
    np.testing.assert_array_equal(ours_one, expected)


def test_add_gaussian_noise_statistics_and_determinism(run_op):
    grey = np.full((300, 400, 3), 128, np.uint8)
    a = run_op("AddGaussianNoise", grey, mean=0.0, std=12.0, per_channel=1, seed=1234)
    b = run_op("AddGaussianNoise", grey, mean=0.0, std=12.0, per_channel=1, seed=1234)
    c = run_op("AddGaussianNoise", grey, mean=0.0, std=12.0, per_channel=1, seed=1235)
    np.testing.assert_array_equal(a, b)  # same seed: same image
    assert (a != c).mean() > 0.9  # another seed: other noise
    d = a.astype(np.float64) - 128
    # 360,000 samples: standard errors 0.02 (mean) and 0.014 (std); rounding adds 1/12 to the variance.
    assert abs(d.mean()) < 0.1
    assert abs(d.std() - np.sqrt(144 + 1 / 12)) < 0.1
    # Normal shape: share within 1 and 2 sigma (68.3%, 95.4%; rounding widens them slightly).
    assert abs((np.abs(d) <= 12).mean() - 0.683) < 0.02
    assert abs((np.abs(d) <= 24).mean() - 0.954) < 0.01
    # The reference kernel is the same generator.
    np.testing.assert_array_equal(run_op("AddGaussianNoise", grey, reference=True, mean=0.0, std=12.0, seed=1234), a)
    # mean shifts; per_channel = 0 draws once per pixel.
    e = run_op("AddGaussianNoise", grey, mean=-6.0, std=12.0, per_channel=0, seed=9).astype(np.float64) - 128
    assert np.all(e[..., 0] == e[..., 1]) and np.all(e[..., 1] == e[..., 2])
    assert abs(e.mean() + 6) < 0.15
    # Saturation at the ends.
    white = run_op("AddGaussianNoise", np.full((50, 50, 3), 250, np.uint8), mean=0.0, std=30.0, seed=3)
    assert white.max() == 255 and (white == 255).mean() > 0.3


def test_bad_attributes_are_clear_errors(run_op):
    image = noise(8, 8)
    with pytest.raises(RuntimeError, match="'ksize_x' must be odd"):
        run_op("GaussianBlur", image, ksize_x=4, ksize_y=3)
    with pytest.raises(RuntimeError, match="9 floats"):
        run_op("WarpPerspective", image, matrix=[1.0, 0.0, 0.0], height=4, width=4)
    with pytest.raises(RuntimeError, match="RGB image"):
        run_op("ShiftHSV", image[..., :1], hue=3.0)
