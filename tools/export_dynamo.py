#!/usr/bin/env python3
"""Exports torchvision and timm models with PyTorch's current default ONNX exporter (torch.export + onnxscript, `dynamo=True`).

Usage: tools/export_dynamo.py [--only NAME ...] [--out DIR] [--force] [--exporter dynamo|torchscript] [--opset N]

Needs a Python with torch >= 2.5, torchvision and onnxscript (bench/torch_dynamo makes one in .venv-torch; the
project's .venv has Debian's torch 1.13, whose exporter is the TorchScript one tools/make_test_models.py uses). The
dynamo exporter writes different graphs from the same models: opset 18+, LayerNormalization and Gelu as ops,
GlobalAveragePool as ReduceMean, Swin's shifted-window masks as ScatterND/GatherND, MaxViT's attention as Einsum.
Weights are make_test_models' seeded ones (calibrated BatchNorm, random LayerNorm), batch 1, static shapes; each NAME
gets NAME.onnx and NAME.input1.npy in DIR (default ~/.cache/osprey/models-dynamo). Existing files are kept.

Names starting `hf-` are Hugging Face transformers architectures (vision models built from their default
configuration, random weights; input: the seeded normal image of make_test_models at the architecture's usual size);
a model the dynamo exporter refuses (BEiT, Swin) is exported with the TorchScript one, as for timm.

Names starting `timm-` are architectures from timm (PyPI; the most used library of image models, hundreds of
architectures nobody here tuned for: attention hybrids, re-parameterised nets, GroupNorm/GRN/weight-standardised layers,
TF "same" padding), random weights made realistic the same way, at their pretrained configuration's input size.
A model the dynamo exporter refuses is exported with the TorchScript one (`dynamo=False`, opset 17), as a user would;
the tool says which. `--exporter torchscript` uses the TorchScript exporter for every model (still what much code in
the wild calls: other graphs again, e.g. Flatten for view, BatchNormalization in training mode for weight
standardisation), by default into ~/.cache/osprey/models-torchscript.

`--opset N` asks the dynamo exporter for that opset (its default is 20; PyTorch 2.15 writes up to 23, where
scaled_dot_product_attention becomes ONNX's Attention op and RMSNorm RMSNormalization), by default into
~/.cache/osprey/models-dynamo-opsetN.
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_test_models as mtm  # noqa: E402

# name -> (constructor keyword arguments, input size); the zoo's nine plus architectures the zoo does not have.
EXTRA = {
    "mobilenet_v3_large": ({}, 224), "regnet_y_800mf": ({}, 224), "mnasnet1_0": ({}, 224),
    "efficientnet_v2_s": ({}, 224), "resnext50_32x4d": ({}, 224), "googlenet": ({"aux_logits": False,
                                                                                   "init_weights": True}, 224),
    "vgg11_bn": ({}, 224), "swin_t": ({}, 224), "swin_v2_t": ({}, 256), "maxvit_t": ({}, 224),
    "deeplabv3_mobilenet_v3_large": ({"weights_backbone": None, "aux_loss": False}, 320),
    "lraspp_mobilenet_v3_large": ({"weights_backbone": None}, 320),
    # Optical flow (GridSample, a convolutional GRU, coordinate grids split and joined): the two 256 x 128 frames side
    # by side in one 256 x 256 input; the output is the last refinement's flow.
    "raft_small": ({}, 256),
}
# timm architecture -> input size (its pretrained configuration's); exported as "timm-<architecture>".
TIMM = {
    "efficientnet_b0": 224, "mobilenetv3_large_100": 224, "mobilenetv4_conv_small": 224,
    "mobilenetv4_hybrid_medium": 256, "convnextv2_atto": 224, "resnet50d": 224, "tf_efficientnetv2_b0": 192,
    "ghostnetv2_100": 224, "repvgg_a0": 224, "mobilevit_xxs": 256, "efficientvit_b0": 224, "fastvit_t8": 256,
    "levit_128s": 224, "deit_tiny_patch16_224": 224, "edgenext_xx_small": 256, "poolformer_s12": 224,
    "hgnetv2_b0": 224, "rexnet_100": 224, "dla34": 224, "cs3darknet_s": 256, "hrnet_w18_small": 224,
    "inception_next_atto": 224, "efficientformerv2_s0": 224, "lcnet_050": 224, "ese_vovnet19b_dw": 224,
    "resnest14d": 224, "skresnet18": 224, "nf_regnet_b0": 192, "mixnet_s": 224, "selecsls42b": 224, "pit_ti_224": 224,
    "gcvit_xxtiny": 224, "regnetz_b16": 224, "coat_lite_tiny": 224, "tiny_vit_5m_224": 224, "efficientvit_m0": 224,
    "repvit_m0_9": 224, "starnet_s1": 224, "mambaout_femto": 224,
}
EXTRA.update({f"timm-{name}": ({}, size) for name, size in TIMM.items()})
# Hugging Face transformers architecture -> (config class, model class, input size, config overrides), built from
# the default configuration with random weights (the hub is not reached); exported as "hf-<name>". Their code is
# written for PyTorch, not for export: float64 position tables (RT-DETR), F.unfold/F.fold (MobileViTV2), a pooling
# window longer than the image (EfficientNet), convolutions on tokens (SegFormer, PVTv2), relative position biases
# (BEiT), interpolated position embeddings (DINOv2), detection heads (DETR, YOLOS, RT-DETR).
HF = {
    "vit": ("ViTConfig", "ViTForImageClassification", 224, {}),
    "deit": ("DeiTConfig", "DeiTForImageClassification", 224, {}),
    "beit": ("BeitConfig", "BeitForImageClassification", 224, {"use_relative_position_bias": True}),
    "dinov2": ("Dinov2Config", "Dinov2ForImageClassification", 224, {}),
    "swin": ("SwinConfig", "SwinForImageClassification", 224, {}),
    "swinv2": ("Swinv2Config", "Swinv2ForImageClassification", 256, {}),
    "convnextv2": ("ConvNextV2Config", "ConvNextV2ForImageClassification", 224, {}),
    "segformer": ("SegformerConfig", "SegformerForSemanticSegmentation", 512, {}),
    "dpt": ("DPTConfig", "DPTForDepthEstimation", 384, {}),
    "depth_anything": ("DepthAnythingConfig", "DepthAnythingForDepthEstimation", 518, {}),
    "glpn": ("GLPNConfig", "GLPNForDepthEstimation", 480, {}),
    "upernet": ("UperNetConfig", "UperNetForSemanticSegmentation", 512, {}),
    "detr": ("DetrConfig", "DetrForObjectDetection", 512, {"use_timm_backbone": False,
                                                            "use_pretrained_backbone": False}),
    "rt_detr": ("RTDetrConfig", "RTDetrForObjectDetection", 640, {"use_timm_backbone": False,
                                                                   "use_pretrained_backbone": False}),
    "yolos": ("YolosConfig", "YolosForObjectDetection", 512, {"num_detection_tokens": 100, "image_size": [512, 512]}),
    "mobilenet_v1": ("MobileNetV1Config", "MobileNetV1ForImageClassification", 224, {}),
    "mobilenet_v2": ("MobileNetV2Config", "MobileNetV2ForImageClassification", 224, {}),
    "mobilevit": ("MobileViTConfig", "MobileViTForImageClassification", 256, {}),
    "mobilevitv2": ("MobileViTV2Config", "MobileViTV2ForImageClassification", 256, {}),
    "efficientnet": ("EfficientNetConfig", "EfficientNetForImageClassification", 224, {}),
    "levit": ("LevitConfig", "LevitForImageClassification", 224, {}),
    "pvt_v2": ("PvtV2Config", "PvtV2ForImageClassification", 224, {}),
    "cvt": ("CvtConfig", "CvtForImageClassification", 224, {}),
    "clip_vision": ("CLIPVisionConfig", "CLIPVisionModelWithProjection", 224, {}),
    "siglip_vision": ("SiglipVisionConfig", "SiglipVisionModel", 224, {}),
    "regnet": ("RegNetConfig", "RegNetForImageClassification", 224, {}),
    "resnet": ("ResNetConfig", "ResNetForImageClassification", 224, {}),
    "poolformer": ("PoolFormerConfig", "PoolFormerForImageClassification", 224, {}),
    "focalnet": ("FocalNetConfig", "FocalNetForImageClassification", 224, {}),
    "hiera": ("HieraConfig", "HieraForImageClassification", 224, {}),
    "bit": ("BitConfig", "BitForImageClassification", 224, {}),
}
EXTRA.update({f"hf-{name}": ({}, spec[2]) for name, spec in HF.items()})
MODELS = dict(mtm.MODELS, **EXTRA)


def default_dir(exporter: str = "dynamo") -> Path:
    return Path(os.environ.get("OSPREY_CACHE", Path.home() / ".cache" / "osprey")) / f"models-{exporter}"


def build(name):
    import torch
    import torchvision

    kwargs, _ = MODELS[name]
    torch.manual_seed(0)
    if name.startswith("hf-"):
        import transformers

        config_class, model_class, _, overrides = HF[name[len("hf-"):]]
        inner = getattr(transformers, model_class)(getattr(transformers, config_class)(**overrides)).eval()

        class Outputs(torch.nn.Module):  # the model output's tensors (logits, boxes, depth, embeddings) as a tuple
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                out = self.inner(pixel_values=x)
                return tuple(getattr(out, k) for k in ("logits", "pred_boxes", "predicted_depth", "image_embeds",
                                                       "pooler_output") if getattr(out, k, None) is not None)
        model = Outputs(inner).eval()
        mtm._make_parameters_realistic(model, name)  # zero-initialised heads (EfficientNet, MobileViTV2) give zeros
        return model
    if name.startswith("timm-"):
        import timm
        model = timm.create_model(name[len("timm-"):], pretrained=False).eval()
        mtm._make_parameters_realistic(model, name)
        return model
    if name == "raft_small":
        class Flow(torch.nn.Module):  # one input, the two frames side by side; the final flow out
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                half = x.shape[-1] // 2
                return self.inner(x[..., :half], x[..., half:], num_flow_updates=6)[-1]
        model = Flow(torchvision.models.optical_flow.raft_small(weights=None, **kwargs))
        mtm._make_parameters_realistic(model, name)
        return model
    ctor = getattr(torchvision.models, name, None) or getattr(torchvision.models.segmentation, name)
    model = ctor(weights=None, **kwargs)
    if ctor.__module__.startswith("torchvision.models.segmentation"):
        class Out(torch.nn.Module):  # segmentation models return {"out": ...}
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                return self.inner(x)["out"]
        model = Out(model)
    mtm._make_parameters_realistic(model, name)
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", choices=sorted(MODELS), help="default: all")
    parser.add_argument("--out", type=Path, default=None, help="default ~/.cache/osprey/models-<exporter>")
    parser.add_argument("--force", action="store_true", help="export again even if the files exist")
    parser.add_argument("--exporter", choices=["dynamo", "torchscript"], default="dynamo")
    parser.add_argument("--opset", type=int, default=None, help="the dynamo exporter's opset (default: its own)")
    args = parser.parse_args(argv)
    args.out = args.out or default_dir(args.exporter + (f"-opset{args.opset}" if args.opset else ""))
    import numpy as np
    import torch

    torch.set_num_threads(2)
    mtm.SPECS.update(EXTRA)  # make_test_models' inputs and calibration read the input size from there
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name in args.only or list(MODELS):
        onnx_path, input_path = args.out / f"{name}.onnx", args.out / f"{name}.input1.npy"
        if onnx_path.exists() and input_path.exists() and not args.force:
            print(f"export_dynamo: {name:30s} present", flush=True)
            continue
        start = time.monotonic()
        try:
            x = torch.from_numpy(mtm.make_input(name, 1))
            model = build(name)
            tmp = onnx_path.with_suffix(".tmp")
            exporter = args.exporter
            try:
                if exporter != "dynamo":
                    raise RuntimeError("--exporter torchscript")
                opset = {"opset_version": args.opset} if args.opset else {}
                program = torch.onnx.export(model, (x,), dynamo=True, input_names=["input"],
                                            output_names=["logits"], verbose=False, **opset)
                program.save(str(tmp))
            except Exception as e:  # noqa: BLE001 -- then as a user would: the TorchScript exporter
                if exporter == "dynamo" and not name.startswith(("timm-", "hf-")):
                    raise
                if exporter == "dynamo":
                    exporter = f"torchscript (dynamo failed: {str(e).splitlines()[0][:120]})"
                torch.onnx.export(model, (x,), str(tmp), dynamo=False, opset_version=17, input_names=["input"],
                                  output_names=["logits"])
            os.replace(tmp, onnx_path)
            np.save(input_path, x.numpy())
            print(f"export_dynamo: {name:30s} exported by {exporter} ({time.monotonic() - start:.1f} s)", flush=True)
        except Exception as e:  # noqa: BLE001 -- one architecture the exporter cannot take is a result
            failed += 1
            print(f"export_dynamo: {name:30s} FAILED: {str(e).splitlines()[0][:200]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
