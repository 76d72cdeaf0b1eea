#!/usr/bin/env python3
"""Exports the torchvision architectures osprey is tested and benchmarked on, with seeded random weights.

Usage: tools/make_test_models.py [--only NAME ...] [--out DIR] [--force]

For each model NAME it writes, into DIR (default $OSPREY_MODEL_CACHE or ~/.cache/osprey/models):
  NAME.onnx          opset 13 (17 if 13 fails), input "input" [N,3,H,W] float32, output "logits"; batch is dynamic
  NAME.input1.npy    a seeded normal(0,1) image batch of 1
  NAME.input8.npy    a seeded normal(0,1) image batch of 8
Models whose three files exist are skipped, so a repeated `make test` costs nothing. Files are written to a temporary
name and renamed, so an interrupted run never leaves a half-written model that a later run would skip.

No network: weights are torch.manual_seed(0) random init, with the adjustments described in
_make_parameters_realistic() (random BatchNorm/LayerNorm parameters, calibrated BatchNorm statistics, no all-zero
layers) so that every kernel's result shows in the output. Everything is seeded: two runs write identical models.
"""

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

# name -> (torchvision constructor keyword arguments, input spatial size)
MODELS = {
    "resnet50": ({}, 224),
    "mobilenet_v2": ({}, 224),
    "inception_v3": ({"aux_logits": False, "init_weights": True}, 299),
    "efficientnet_b0": ({}, 224),
    "densenet121": ({}, 224),
    "shufflenet_v2_x1_0": ({}, 224),
    "squeezenet1_0": ({}, 224),
    "convnext_tiny": ({}, 224),
    "vit_b_16": ({}, 224),
}
# Exported only when named (`--only swin_t`, `bench/compare_cpu --models swin_t`), not by `make test`: architectures
# for checking that a speed-up is general (Swin's windowed attention with a position bias and shifted-window masks).
EXTRA_MODELS = {
    "swin_t": ({}, 224),
}
SPECS = {**MODELS, **EXTRA_MODELS}

INPUT_NAME = "input"
OUTPUT_NAME = "logits"
OPSETS = (13, 17)
INPUT_SEED = 1234


def default_cache_dir() -> Path:
    env = os.environ.get("OSPREY_MODEL_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "osprey" / "models"


def model_paths(name: str, out_dir: Path = None) -> dict:
    """Paths of the files make_test_models writes for `name`: keys onnx, input1, input8."""
    out_dir = Path(out_dir) if out_dir is not None else default_cache_dir()
    return {
        "onnx": out_dir / f"{name}.onnx",
        "input1": out_dir / f"{name}.input1.npy",
        "input8": out_dir / f"{name}.input8.npy",
    }


def input_shape(name: str, batch: int) -> tuple:
    size = SPECS[name][1]
    return (batch, 3, size, size)


def make_input(name: str, batch: int):
    """A deterministic normal(0,1) image batch (what a normalised real image looks like, statistically)."""
    import numpy as np

    # Seed depends on the model and batch so the two inputs differ but every run produces the same data.
    seed = INPUT_SEED + 7919 * batch + sum(ord(c) for c in name)
    rng = np.random.default_rng(seed)
    return rng.standard_normal(input_shape(name, batch), dtype=np.float32)


def _atomic_target(path: Path):
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o644)  # mkstemp creates 0600; the cache is meant to be shared like any downloaded model
    os.close(fd)
    return Path(tmp)


def _save_npy_atomic(path: Path, array) -> None:
    import numpy as np

    tmp = _atomic_target(path)
    try:
        with open(tmp, "wb") as f:
            np.save(f, array)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _make_parameters_realistic(model, name: str) -> None:
    """Replaces the parts of torchvision's init that would make a random-weight model a poor test of an engine.

    - BatchNorm: at init mean 0 / var 1 / weight 1 / bias 0, so folding it into a Conv is an identity and untested.
      Weight and bias become seeded random values; running mean/var are then calibrated on a seeded random batch
      (one forward pass with only the BatchNorm layers in training mode, cumulative average). Calibrated statistics
      are non-trivial (folding is exercised) and keep every layer's activations near unit scale, as in a trained
      network. Uncalibrated random statistics let deep models drift: inception_v3 (whose init is not fan-in scaled)
      reached logits of 1e12 and resnet50's logits became almost independent of the input.
    - LayerNorm: weight 1 / bias 0 at init; made random for the same reason.
    - Linear/Conv layers initialised to all zeros (ViT's classifier head) get their default random init, otherwise
      the model outputs constant zeros whatever the kernels compute.
    - ConvNeXt layer_scale is 1e-6 at init, which scales every residual block's contribution down to invisibility; a
      wrong kernel inside a block would not show in the output. It becomes seeded random values in [0.2, 0.6).
    """
    import torch

    generator = torch.Generator().manual_seed(1)
    batchnorms = []
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                c = module.num_features
                if module.weight is not None:
                    module.weight.copy_(torch.rand(c, generator=generator) + 0.5)  # in [0.5, 1.5)
                if module.bias is not None:
                    module.bias.copy_(torch.randn(c, generator=generator) * 0.2)
                batchnorms.append(module)
            elif isinstance(module, torch.nn.LayerNorm) and module.elementwise_affine:
                module.weight.copy_(torch.rand(module.weight.shape, generator=generator) + 0.5)
                module.bias.copy_(torch.randn(module.bias.shape, generator=generator) * 0.2)
            elif isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)) and not module.weight.any():
                torch.manual_seed(2)
                module.reset_parameters()
        for param_name, param in model.named_parameters():
            if param_name.endswith("layer_scale"):
                param.copy_(torch.rand(param.shape, generator=generator) * 0.4 + 0.2)

        if batchnorms:
            model.eval()
            for bn in batchnorms:
                bn.reset_running_stats()
                bn.momentum = None  # cumulative average: after one batch, exactly that batch's statistics
                bn.train()
            calibration = torch.randn(input_shape(name, 4), generator=generator)
            model(calibration)
            for bn in batchnorms:
                bn.momentum = 0.1
    model.eval()


def build_model(name: str):
    import torch
    import torchvision

    kwargs, _ = SPECS[name]
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, **kwargs)
    _make_parameters_realistic(model, name)
    return model


def _dropouts_of_ratio_zero_as_identity(path: Path) -> None:
    """Dropout nodes whose ratio is a constant 0 become Identity (the same values in any mode). Swin's attention, as
    the exporter writes it, keeps F.dropout(p=0) in training mode, which OpenVINO refuses to read."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    constants = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant" and n.attribute}
    read = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    changed = False
    for node in model.graph.node:
        if node.op_type != "Dropout" or len(node.input) < 2 or node.input[1] not in constants:
            continue
        if numpy_helper.to_array(constants[node.input[1]].attribute[0].t).item() != 0.0:
            continue
        if len(node.output) > 1 and node.output[1] in read:
            continue  # the mask is read: left as it is
        node.op_type = "Identity"
        del node.input[1:]
        del node.output[1:]
        changed = True
    if changed:
        onnx.save(model, str(path))


def export_model(name: str, out_dir: Path, force: bool = False) -> str:
    """Exports `name` into out_dir unless its files exist. Returns 'skipped' or 'exported (opset N)'."""
    paths = model_paths(name, out_dir)
    if not force and all(p.exists() for p in paths.values()):
        return "skipped (exists)"

    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    model = build_model(name)
    dummy = torch.from_numpy(make_input(name, 1))
    last_error = None
    exported_opset = None
    tmp = _atomic_target(paths["onnx"])
    try:
        for opset in OPSETS:
            try:
                # Exported with autograd enabled on purpose: under no_grad, nn.MultiheadAttention (ViT) takes its
                # fused fast path, aten::_native_multi_head_attention, which the ONNX exporter cannot export.
                torch.onnx.export(
                    model,
                    dummy,
                    str(tmp),
                    opset_version=opset,
                    input_names=[INPUT_NAME],
                    output_names=[OUTPUT_NAME],
                    dynamic_axes={INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
                    do_constant_folding=True,
                )
                exported_opset = opset
                break
            except Exception as e:  # noqa: BLE001 - any exporter failure means "try the next opset"
                last_error = e
        if exported_opset is None:
            raise RuntimeError(f"{name}: export failed at opsets {OPSETS}: {last_error}")
        _dropouts_of_ratio_zero_as_identity(tmp)
        os.replace(tmp, paths["onnx"])
    finally:
        if tmp.exists():
            tmp.unlink()
    _save_npy_atomic(paths["input1"], make_input(name, 1))
    _save_npy_atomic(paths["input8"], make_input(name, 8))
    return f"exported (opset {exported_opset})"


def ensure_models(names, out_dir: Path = None, force: bool = False, log=print) -> None:
    out_dir = Path(out_dir) if out_dir is not None else default_cache_dir()
    for name in names:
        start = time.monotonic()
        status = export_model(name, out_dir, force=force)
        log(f"make_test_models: {name:20s} {status:22s} {time.monotonic() - start:6.1f} s", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=sorted(SPECS),
                        help="export only these models (default: all)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output directory (default: $OSPREY_MODEL_CACHE or ~/.cache/osprey/models)")
    parser.add_argument("--force", action="store_true", help="re-export even if the files exist")
    args = parser.parse_args(argv)

    names = args.only or list(MODELS)
    out_dir = args.out if args.out is not None else default_cache_dir()
    paths = [model_paths(n, out_dir) for n in names]
    if not args.force and all(p.exists() for ps in paths for p in ps.values()):
        print(f"make_test_models: all {len(names)} models present in {out_dir}")
        return 0

    import torch

    torch.set_num_threads(2)
    # The tracer warns about Python asserts on shapes (ViT's image-size check); they are constant for a fixed input size.
    warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
    start = time.monotonic()
    ensure_models(names, out_dir, force=args.force)
    print(f"make_test_models: done in {time.monotonic() - start:.1f} s ({out_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
