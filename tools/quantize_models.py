#!/usr/bin/env python3
"""Quantises a float ONNX model with ONNX Runtime's quantiser (`onnxruntime.quantization.quantize_static`, default
settings: int8 activations and weights, per-tensor, MinMax calibration) and caches the result beside the test models.

Usage: tools/quantize_models.py MODEL.onnx CALIBRATION.npy [--format qdq|qoperator|dynamic] [--out OUT.onnx]
                                [--samples N]

Formats: "qdq" (QuantizeLinear/DequantizeLinear pairs around float ops, what ORT recommends on x64), "qoperator"
(QLinearConv, QLinearMatMul and the com.microsoft ops QLinearAdd, QLinearGlobalAveragePool, QGemm) and "dynamic"
(`quantize_dynamic`: DynamicQuantizeLinear -> ConvInteger / MatMulInteger per Conv, MatMul and Gemm, uint8 weights
with a zero point, as ddddocr's model has; ONNX Runtime has no ConvInteger for int8 weights; no calibration).
The calibration reader feeds the first N images of CALIBRATION.npy ([n, C, H, W] float32, already normalised) one at
a time. The output is written to a temporary name and renamed, so an interrupted run never leaves a half-written
model that a later run would take for a cached one. Seeded by construction (MinMax calibration has no randomness).
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

FORMATS = ("qdq", "qoperator", "dynamic")


def quantized_path(model: Path, fmt: str, out_dir: Path = None) -> Path:
    model = Path(model)
    out_dir = Path(out_dir) if out_dir is not None else model.parent
    return out_dir / f"{model.stem}.{fmt}.onnx"


def ensure_quantized(model: Path, calibration, fmt: str, out: Path = None, samples: int = 32,
                     force: bool = False, per_channel: bool = False, preprocess: bool = False,
                     unsigned_activations: bool = False) -> Path:
    """Path of MODEL quantised in `fmt`; quantises it first when the cached file is missing (or force).
    `calibration`: a [n, ...] float32 array (one item per calibration run) or the path of a .npy holding one.
    `per_channel`: weights quantised per output channel (MatMul: per column), as transformer exports usually are.
    `preprocess`: run ONNX Runtime's `quant_pre_process` (shape inference, graph optimisation) first, as its docs
    recommend: without it a Gemm whose bias is computed in the graph keeps a float bias ORT cannot fuse.
    `unsigned_activations`: uint8 activations (ORT's recommendation on x86: its int8 kernels are u8 x s8; the default
    here, int8 activations, runs ORT's slower s8 x s8 path)."""
    import numpy as np
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    model = Path(model)
    out = Path(out) if out is not None else quantized_path(model, fmt)
    if out.exists() and not force:
        return out
    images = np.load(calibration) if isinstance(calibration, (str, Path)) else calibration
    input_name = onnx.load(str(model), load_external_data=False).graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{input_name: images[i:i + 1].astype(np.float32)} for i in range(min(samples, len(images)))])

        def get_next(self):
            return next(self.items, None)

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=out.name + ".", suffix=".tmp.onnx", dir=out.parent)
    os.fchmod(fd, 0o644)
    os.close(fd)
    try:
        source = model
        if preprocess:
            from onnxruntime.quantization.shape_inference import quant_pre_process
            source = Path(tmp).with_suffix(".pre.onnx")
            quant_pre_process(str(model), str(source))
        if fmt == "dynamic":
            from onnxruntime.quantization import quantize_dynamic
            quantize_dynamic(str(source), tmp, op_types_to_quantize=["Conv", "MatMul", "Gemm"],
                             per_channel=per_channel, weight_type=QuantType.QUInt8)
        else:
            quantize_static(str(source), tmp, Reader(),
                            quant_format=QuantFormat.QDQ if fmt == "qdq" else QuantFormat.QOperator,
                            per_channel=per_channel,
                            activation_type=QuantType.QUInt8 if unsigned_activations else QuantType.QInt8)
        os.replace(tmp, out)
    finally:
        for leftover in (tmp, str(Path(tmp).with_suffix(".pre.onnx"))):
            if os.path.exists(leftover):
                os.unlink(leftover)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("calibration", type=Path, help=".npy of normalised [n, C, H, W] float32 images")
    ap.add_argument("--format", choices=FORMATS, default="qdq")
    ap.add_argument("--out", type=Path, default=None, help="default: MODEL's folder, MODEL.<format>.onnx")
    ap.add_argument("--samples", type=int, default=32, help="calibration images (default 32)")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--per-channel", action="store_true", help="weights per output channel (default: per tensor)")
    ap.add_argument("--preprocess", action="store_true", help="ONNX Runtime's quant_pre_process first")
    ap.add_argument("--unsigned-activations", action="store_true", help="uint8 activations (default int8)")
    args = ap.parse_args(argv)
    print(ensure_quantized(args.model, args.calibration, args.format, args.out, args.samples, args.force,
                           args.per_channel, args.preprocess, args.unsigned_activations))
    return 0


if __name__ == "__main__":
    sys.exit(main())
