"""ImageDecoder (opset 20): encoded bytes in the graph, decoded by osprey's JPEG/PNG/WebP/BMP decoders, against
Pillow (the ONNX reference's decoder). The output's size follows the bytes, so the model is cut at the op and the
preprocessing after it compiles per image size. A stream that cannot be decoded gives an empty [0, 0, C] tensor, as
the spec says; a format osprey does not read, or an image over the decoders' pixel limit, is refused by name.
"""

import io
import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

import osprey


def encode(image, fmt, **kw):
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kw)
    return np.frombuffer(buf.getvalue(), np.uint8)


def photo(w, h, seed):
    """A smooth colour image with some detail (JPEG's chroma subsampling and rounding matter on it)."""
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(seed)
    rgb = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x * y) % 256], axis=2).astype(np.int32)
    rgb = np.clip(rgb + rng.integers(-20, 20, rgb.shape), 0, 255).astype(np.uint8)
    return Image.fromarray(rgb)


def model(tmp_path, pixel_format, preprocess):
    """bytes -> ImageDecoder -> (preprocess: float, CHW, resized to 24 x 24, per-channel mean) or the pixels."""
    node = helper.make_node
    nodes = [node("ImageDecoder", ["bytes"], ["hwc"], pixel_format=pixel_format)]
    inits = []
    if preprocess:
        nodes += [node("Cast", ["hwc"], ["f"], to=TensorProto.FLOAT),
                  node("Transpose", ["f"], ["chw"], perm=[2, 0, 1]),
                  node("Unsqueeze", ["chw", "zero"], ["nchw"]),
                  node("Resize", ["nchw", "", "", "size"], ["small"], mode="linear"),
                  node("ReduceMean", ["small", "axes"], ["y"], keepdims=0)]
        inits = [numpy_helper.from_array(np.array([0], np.int64), "zero"),
                 numpy_helper.from_array(np.array([1, 3 if pixel_format != "Grayscale" else 1, 24, 24], np.int64),
                                         "size"),
                 numpy_helper.from_array(np.array([2, 3], np.int64), "axes")]
    out = "y" if preprocess else "hwc"
    graph = helper.make_graph(nodes, "decode", [helper.make_tensor_value_info("bytes", TensorProto.UINT8, ["n"])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT if preprocess else TensorProto.UINT8,
                                                             None)], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    m.ir_version = 9
    path = tmp_path / f"decode_{pixel_format}_{preprocess}.onnx"
    path.write_bytes(m.SerializeToString())
    return osprey.load_onnx(str(path), threads=1)


@pytest.mark.parametrize("fmt,kw", [("JPEG", {"quality": 90}), ("PNG", {}), ("WEBP", {"lossless": True}),
                                    ("BMP", {})])
@pytest.mark.parametrize("pixel_format", ["RGB", "BGR", "Grayscale"])
def test_decoded_pixels_equal_pillows(tmp_path, fmt, kw, pixel_format):
    m = model(tmp_path, pixel_format, preprocess=False)
    for size in [(40, 30), (17, 23)]:  # one model, two image sizes
        data = encode(photo(*size, seed=size[0]), fmt, **kw)
        got = m.run({"bytes": data})["hwc"]
        img = Image.open(io.BytesIO(data.tobytes()))
        want = np.array(img.convert("L"))[:, :, None] if pixel_format == "Grayscale" else np.array(img)
        if pixel_format == "BGR":
            want = want[:, :, ::-1]
        assert got.shape == want.shape == (size[1], size[0], 1 if pixel_format == "Grayscale" else 3)
        np.testing.assert_array_equal(got, want)


def test_preprocessing_after_the_decoder_compiles_per_image_size(tmp_path):
    m = model(tmp_path, "RGB", preprocess=True)
    for size in [(64, 48), (50, 90), (64, 48)]:
        data = encode(photo(*size, seed=3), "PNG")
        got = m.run({"bytes": data})["y"]
        pixels = np.array(Image.open(io.BytesIO(data.tobytes()))).astype(np.float32)
        # Resize to 24 x 24 changes the mean a little; the per-channel means stay within a grey level
        np.testing.assert_allclose(got[0], pixels.mean(axis=(0, 1)), atol=2.0)


def test_streams_that_cannot_be_decoded(tmp_path):
    m = model(tmp_path, "RGB", preprocess=False)
    good = encode(photo(32, 32, seed=1), "JPEG")
    for bad in [good[:100], np.frombuffer(b"not an image at all", np.uint8), np.zeros(0, np.uint8)]:
        assert m.run({"bytes": bad})["hwc"].shape == (0, 0, 3)  # the spec's empty matrix
    # a PNG header claiming 100,000 x 100,000 pixels: over the decoders' limit, refused by it before allocating
    bomb = bytearray(encode(Image.new("RGB", (8, 8)), "PNG").tobytes())
    bomb[16:24] = (100000).to_bytes(4, "big") * 2
    bomb[29:33] = zlib.crc32(bytes(bomb[12:29])).to_bytes(4, "big")  # IHDR's checksum, so only the size is wrong
    with pytest.raises(osprey.ResourceExhausted, match="over the limit of 100 megapixels .ImageDecoder's pixel limit"):
        m.run({"bytes": np.frombuffer(bytes(bomb), np.uint8)})
    with pytest.raises(osprey.InvalidArgument, match='pixel_format must be "RGB", "BGR" or "Grayscale", got "HSV"'):
        model(tmp_path, "HSV", preprocess=False).run({"bytes": good})
    with pytest.raises(osprey.Unsupported, match="a TIFF image; osprey decodes JPEG, PNG, WebP and BMP"):
        m.run({"bytes": encode(photo(8, 8, seed=2), "TIFF")})
