"""`osprey decode` against Pillow (and numpy where Pillow is not the right oracle) on synthetic and real photos.

Tolerances: JPEG vs Pillow's libjpeg mean |diff| <= 1.0 and max <= 8; lossy WebP mean <= 1.5; PNG, BMP and lossless
WebP exact. Bad input must exit 1 with a clear message (never a signal) within 30 s.
"""

import struct
import zlib

import numpy as np
import pytest
from PIL import Image, ImageOps

cv2 = pytest.importorskip("cv2")
skdata = pytest.importorskip("skimage.data")


def smooth_rgb(h, w):
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    r = 127.5 + 127.5 * np.sin(x / max(w, 1) * 3.1 + y / max(h, 1) * 1.3)
    g = 255.0 * x / max(w - 1, 1)
    b = 255.0 * (0.5 + 0.5 * np.cos(y / max(h, 1) * 4.0))
    return np.clip(np.stack([r, g, b], -1) + 0.5, 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def astronaut():
    return skdata.astronaut()  # 512x512 RGB photo bundled with scikit-image


def assert_close(actual, expected, mean_tol, max_tol):
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    diff = np.abs(actual.astype(np.int32) - expected.astype(np.int32))
    assert diff.mean() <= mean_tol and diff.max() <= max_tol, f"mean diff {diff.mean():.3f}, max {diff.max()}"


def pil_array(image, mode):
    a = np.asarray(image.convert(mode))
    return a[:, :, None] if a.ndim == 2 else a


JPEG_TOL = dict(mean_tol=1.0, max_tol=8)
MODES = {1: "L", 3: "RGB", 4: "RGBA"}


# ---- JPEG ----

@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("source", ["smooth", "astronaut"])
def test_jpeg_rgb(decode, tmp_path, astronaut, source, channels):
    pixels = smooth_rgb(120, 160) if source == "smooth" else astronaut
    path = tmp_path / "img.jpg"
    Image.fromarray(pixels).save(path, quality=95)
    out, stdout = decode(path, "--channels", channels)
    assert "jpeg" in stdout
    assert_close(out, pil_array(Image.open(path), MODES[channels]), **JPEG_TOL)


@pytest.mark.parametrize("channels", [1, 3])
def test_jpeg_gray(decode, tmp_path, astronaut, channels):
    path = tmp_path / "gray.jpg"
    Image.fromarray(astronaut).convert("L").save(path, quality=95)
    out, _ = decode(path, "--channels", channels)
    assert_close(out, pil_array(Image.open(path), MODES[channels]), **JPEG_TOL)


@pytest.mark.parametrize("source", ["smooth", "astronaut"])
def test_jpeg_cmyk(decode, tmp_path, astronaut, source):
    pixels = smooth_rgb(96, 130) if source == "smooth" else astronaut
    path = tmp_path / "cmyk.jpg"
    Image.fromarray(pixels).convert("CMYK").save(path, quality=95)
    assert Image.open(path).mode == "CMYK"
    out, stdout = decode(path)
    assert "cmyk" in stdout
    assert_close(out, pil_array(Image.open(path), "RGB"), **JPEG_TOL)


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("source", ["smooth", "astronaut"])
def test_jpeg_exif_orientation(decode, tmp_path, astronaut, source, orientation):
    pixels = smooth_rgb(90, 150) if source == "smooth" else astronaut[:, :400]  # not square: swaps are visible
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / f"orient{orientation}.jpg"
    Image.fromarray(pixels).save(path, quality=95, exif=exif)
    decoded = Image.open(path)
    decoded.load()
    out, stdout = decode(path)
    assert_close(out, pil_array(ImageOps.exif_transpose(decoded), "RGB"), **JPEG_TOL)
    if orientation != 1:
        assert "applied" in stdout
    raw, _ = decode(path, "--no-exif")
    assert_close(raw, pil_array(decoded, "RGB"), **JPEG_TOL)


def test_jpeg_exif_big_endian(decode, tmp_path):
    # Pillow writes little-endian EXIF; build a Motorola-order APP1 by hand (orientation 6 = rotate clockwise).
    pixels = smooth_rgb(40, 70)
    base = tmp_path / "base.jpg"
    Image.fromarray(pixels).save(base, quality=95)
    data = base.read_bytes()
    tiff = b"MM\x00\x2a" + struct.pack(">I", 8) + struct.pack(">H", 1) + struct.pack(">HHIHH", 0x0112, 3, 1, 6, 0)
    tiff += struct.pack(">I", 0)
    app1 = b"\xff\xe1" + struct.pack(">H", 2 + 6 + len(tiff)) + b"Exif\x00\x00" + tiff
    path = tmp_path / "mm.jpg"
    path.write_bytes(data[:2] + app1 + data[2:])
    out, _ = decode(path)
    assert_close(out, np.asarray(Image.open(base).convert("RGB").transpose(Image.Transpose.ROTATE_270)), **JPEG_TOL)


def test_jpeg_dct_scaling(decode, tmp_path):
    pixels = smooth_rgb(1500, 2000)
    path = tmp_path / "big.jpg"
    Image.fromarray(pixels).save(path, quality=95)
    out, stdout = decode(path, "--min-size", "256x192")
    assert out.shape == (375, 500, 3), out.shape  # 1/4 is the smallest of 1/2, 1/4, 1/8 keeping >= 256x192
    assert "1/4" in stdout
    draft = Image.open(path)
    draft.draft("RGB", (256, 192))
    assert draft.size == (500, 375)
    assert_close(out, pil_array(draft, "RGB"), **JPEG_TOL)
    full = Image.open(path).convert("RGB").resize((500, 375), Image.Resampling.BOX)
    assert_close(out, np.asarray(full), mean_tol=2.0, max_tol=24)

    half, _ = decode(path, "--min-size", "900x700")
    assert half.shape == (750, 1000, 3)
    full_size, stdout = decode(path)
    assert full_size.shape == (1500, 2000, 3) and "dct scaling: none" in stdout


def test_jpeg_dct_scaling_respects_orientation(decode, tmp_path):
    # Orientation 6 swaps axes: --min-size is about the oriented output (W=300 needs stored height >= 300).
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "rot.jpg"
    Image.fromarray(smooth_rgb(1200, 1600)).save(path, quality=95, exif=exif)
    out, _ = decode(path, "--min-size", "300x400")
    assert out.shape == (400, 300, 3)  # stored 1600x1200 at 1/4 = 400x300, rotated


# ---- PNG ----

def png_source(mode, h=37, w=53):
    rgb = smooth_rgb(h, w)
    if mode == "RGB":
        return Image.fromarray(rgb)
    if mode == "RGBA":
        alpha = (np.arange(h * w).reshape(h, w) * 7 % 256).astype(np.uint8)
        return Image.fromarray(np.dstack([rgb, alpha]))
    if mode == "L":
        return Image.fromarray(rgb).convert("L")
    if mode == "LA":
        return Image.fromarray(np.dstack([rgb[:, :, 0], rgb[:, :, 1]]), "LA")
    if mode in ("P", "Ptrns"):
        image = Image.fromarray(rgb).quantize(colors=200)
        if mode == "Ptrns":
            image.info["transparency"] = bytes([0, 64, 128, 255] * 50)
        return image
    raise ValueError(mode)


@pytest.mark.filterwarnings("ignore:Palette images with Transparency")
@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("mode", ["L", "LA", "P", "Ptrns", "RGB", "RGBA"])
def test_png_8bit(decode, tmp_path, mode, channels):
    image = png_source(mode)
    path = tmp_path / f"{mode}.png"
    if mode == "Ptrns":
        image.save(path, transparency=image.info["transparency"])
    else:
        image.save(path)
    out, _ = decode(path, "--channels", channels)
    np.testing.assert_array_equal(out, pil_array(Image.open(path), MODES[channels]))


@pytest.mark.parametrize("channels_in", [1, 3, 4])
def test_png_16bit(decode, tmp_path, channels_in):
    # 16-bit samples become 8-bit by keeping the high byte (Pillow's RGB;16B unpacking): oracle is numpy >> 8.
    rng = np.random.default_rng(channels_in)
    values = rng.integers(0, 65536, size=(21, 34, channels_in), dtype=np.uint16)
    path = tmp_path / "deep.png"
    bgr = values[:, :, 0] if channels_in == 1 else values[:, :, [2, 1, 0, 3][:channels_in]]
    assert cv2.imwrite(str(path), bgr)
    expected8 = (values >> 8).astype(np.uint8)
    rgb = np.repeat(expected8, 3, axis=2) if channels_in == 1 else expected8[:, :, :3]
    out, _ = decode(path, "--channels", 3)
    np.testing.assert_array_equal(out, rgb)
    if channels_in == 4:
        out4, _ = decode(path, "--channels", 4)
        np.testing.assert_array_equal(out4, expected8)
    if channels_in == 1:
        gray, _ = decode(path, "--channels", 1)
        np.testing.assert_array_equal(gray, expected8)


def test_png_astronaut(decode, tmp_path, astronaut):
    path = tmp_path / "astronaut.png"
    Image.fromarray(astronaut).save(path)
    out, _ = decode(path)
    np.testing.assert_array_equal(out, astronaut)
    gray, _ = decode(path, "--channels", 1)
    np.testing.assert_array_equal(gray, pil_array(Image.fromarray(astronaut), "L"))


# ---- WebP ----

def test_webp_lossless(decode, tmp_path, astronaut):
    path = tmp_path / "lossless.webp"
    Image.fromarray(astronaut).save(path, lossless=True)
    out, stdout = decode(path)
    assert "webp" in stdout
    np.testing.assert_array_equal(out, astronaut)
    out4, _ = decode(path, "--channels", 4)
    np.testing.assert_array_equal(out4, pil_array(Image.open(path), "RGBA"))


def test_webp_lossless_alpha(decode, tmp_path):
    image = png_source("RGBA")
    path = tmp_path / "alpha.webp"
    image.save(path, lossless=True, exact=True)
    out4, _ = decode(path, "--channels", 4)
    np.testing.assert_array_equal(out4, np.asarray(image))
    out3, _ = decode(path, "--channels", 3)
    np.testing.assert_array_equal(out3, np.asarray(image)[:, :, :3])


@pytest.mark.parametrize("source", ["smooth", "astronaut"])
def test_webp_lossy(decode, tmp_path, astronaut, source):
    pixels = smooth_rgb(100, 140) if source == "smooth" else astronaut
    path = tmp_path / "lossy.webp"
    Image.fromarray(pixels).save(path, quality=90)
    out, _ = decode(path)
    assert_close(out, pil_array(Image.open(path), "RGB"), mean_tol=1.5, max_tol=255)


# ---- BMP ----

def write_bmp_top_down(path, rgb):
    h, w, _ = rgb.shape
    stride = (w * 3 + 3) // 4 * 4
    rows = np.zeros((h, stride), np.uint8)
    rows[:, : w * 3] = rgb[:, :, ::-1].reshape(h, w * 3)
    info = struct.pack("<IiiHHIIiiII", 40, w, -h, 1, 24, 0, rows.size, 2835, 2835, 0, 0)
    header = b"BM" + struct.pack("<IHHI", 14 + 40 + rows.size, 0, 0, 14 + 40)
    path.write_bytes(header + info + rows.tobytes())


@pytest.mark.parametrize("kind", ["24", "32", "8pal", "8gray", "topdown"])
def test_bmp(decode, tmp_path, kind):
    rgb = smooth_rgb(29, 47)  # 47 * 3 = 141: rows need padding
    path = tmp_path / f"{kind}.bmp"
    if kind == "24":
        Image.fromarray(rgb).save(path)
    elif kind == "32":
        Image.fromarray(np.dstack([rgb, np.full(rgb.shape[:2], 9, np.uint8)])).save(path)
    elif kind == "8pal":
        Image.fromarray(rgb).quantize(colors=100).save(path)
    elif kind == "8gray":
        Image.fromarray(rgb).convert("L").save(path)
    else:
        write_bmp_top_down(path, rgb)
    for channels in (1, 3, 4):
        out, _ = decode(path, "--channels", channels)
        np.testing.assert_array_equal(out, pil_array(Image.open(path), MODES[channels]))
    if kind in ("24", "topdown"):
        np.testing.assert_array_equal(decode(path)[0], rgb)


def test_bmp_astronaut(decode, tmp_path, astronaut):
    path = tmp_path / "astronaut.bmp"
    Image.fromarray(astronaut).save(path)
    np.testing.assert_array_equal(decode(path)[0], astronaut)


# ---- odd sizes ----

@pytest.mark.parametrize("hw", [(1, 1), (3, 1000), (4097, 3)])
@pytest.mark.parametrize("fmt", ["jpg", "png", "bmp", "webp"])
def test_odd_sizes(decode, tmp_path, hw, fmt):
    rgb = smooth_rgb(*hw)
    path = tmp_path / f"odd.{fmt}"
    if fmt == "jpg":
        Image.fromarray(rgb).save(path, quality=95)
    elif fmt == "webp":
        Image.fromarray(rgb).save(path, lossless=True)
    else:
        Image.fromarray(rgb).save(path)
    out, _ = decode(path)
    assert out.shape == (hw[0], hw[1], 3)
    if fmt == "jpg":
        assert_close(out, pil_array(Image.open(path), "RGB"), **JPEG_TOL)
    else:
        np.testing.assert_array_equal(out, rgb)


# ---- bad input ----

def png_chunk(kind, payload):
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def huge_png():
    ihdr = struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 100)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")


def huge_bmp():
    info = struct.pack("<IiiHHIIiiII", 40, 60000, 60000, 1, 24, 0, 0, 2835, 2835, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + 40 + 64, 0, 0, 54) + info + b"\x00" * 64


def truncated(tmp_path, fmt):
    path = tmp_path / f"full.{fmt}"
    image = Image.fromarray(smooth_rgb(64, 80))
    if fmt == "webp":
        image.save(path, quality=90)
    else:
        image.save(path)
    data = path.read_bytes()
    return data[: len(data) // 2]


BAD_INPUTS = {
    "truncated_jpeg": (lambda tmp: truncated(tmp, "jpg"), "truncated JPEG"),
    "truncated_png": (lambda tmp: truncated(tmp, "png"), "truncated PNG"),
    "truncated_webp": (lambda tmp: truncated(tmp, "webp"), "truncated WebP"),
    "truncated_bmp": (lambda tmp: truncated(tmp, "bmp"), "truncated BMP"),
    "garbage": (lambda tmp: bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)), "not an image"),
    "html": (lambda tmp: b"<html><body>not a picture</body></html>", "first bytes 3c 68 74 6d"),
    "zero_size": (lambda tmp: b"", "empty"),
    "huge_png": (lambda tmp: huge_png(), "60000x60000 = 3600 megapixels, over the limit of 100 megapixels"),
    "huge_bmp": (lambda tmp: huge_bmp(), "60000x60000 = 3600 megapixels, over the limit of 100 megapixels"),
    "jpeg_magic_only": (lambda tmp: b"\xff\xd8\xff\xe0" + b"\x00" * 20, "JPEG"),
    "png_signature_only": (lambda tmp: b"\x89PNG\r\n\x1a\n", "PNG"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input(run_cli, tmp_path, name):
    make, expected = BAD_INPUTS[name]
    path = tmp_path / "bad.bin"
    path.write_bytes(make(tmp_path))
    proc = run_cli("decode", path, "-o", tmp_path / "out.npy")
    assert proc.returncode == 1, f"exit {proc.returncode}: {proc.stderr}"
    assert expected in proc.stderr, proc.stderr
    assert "osprey: error:" in proc.stderr
    assert not (tmp_path / "out.npy").exists()


def test_max_megapixels_flag(run_cli, decode, tmp_path):
    path = tmp_path / "img.png"
    Image.fromarray(smooth_rgb(300, 400)).save(path)  # 0.12 megapixels
    proc = run_cli("decode", path, "-o", tmp_path / "out.npy", "--max-megapixels", "0.1")
    assert proc.returncode == 1 and "over the limit of 0.1 megapixels" in proc.stderr, proc.stderr
    assert decode(path, "--max-megapixels", "0.12")[0].shape == (300, 400, 3)


def test_missing_file_and_help(run_cli, tmp_path):
    proc = run_cli("decode", tmp_path / "nope.jpg", "-o", tmp_path / "out.npy")
    assert proc.returncode == 1 and "cannot open" in proc.stderr
    proc = run_cli("decode", "--help")
    assert proc.returncode == 0 and "--min-size" in proc.stdout and "--channels" in proc.stdout
    proc = run_cli("decode", tmp_path / "x.jpg", "-o", tmp_path / "o.npy", "--channels", "2")
    assert proc.returncode == 2
