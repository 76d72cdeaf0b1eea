#!/usr/bin/env python3
"""The torch side of the device check (scripts/gpu-check, docs/gpu.md): export the zoo, time PyTorch eager.

Runs on the device machine's PyTorch venv (torch 2.11 + torchvision 0.26, onnx, numpy) and here on CPU (torch 1.13).

  gpu_zoo.py export --out DIR [--models a,b] [--jobs N] [--opset 17] [--deadline EPOCH]
      For each model writes into DIR (skipped when present, so a rerun on a warm machine costs nothing):
        NAME.onnx            opset 17 (TorchScript exporter, dynamo=False; the dynamo exporter at opset 18 if that
                             fails), input "input" [batch,3,H,W] float32 with a dynamic batch dim, output "logits"
        NAME.input.npy       the fixed input of the correctness check: seeded normal(0,1), batch 1
        NAME.torch_cpu.npy   PyTorch's fp32 CPU logits for that input
      Weights are tools/make_test_models.py's: torch.manual_seed(0) random init made realistic (random BatchNorm and
      LayerNorm parameters, calibrated BatchNorm statistics), so every kernel shows in the logits. Prints one JSON
      line per model: {"model", "ok", "seconds", "exporter", "opset", "error"}. Models run in --jobs processes.

  gpu_zoo.py bench-server --device cuda|cpu [--ref-dir DIR] [--no-cudnn-benchmark]
      Reads one JSON request per line on stdin, {"model", "batch", "precision": "fp32"|"fp16", "warmup", "iters",
      "target_s"}, and answers one JSON line on stdout: {"median_ms", "min_ms", "mean_ms", "iters", ...} or
      {"error"}. PyTorch eager as people run it for inference: model.eval(), channels_last, torch.no_grad(),
      cuDNN benchmark mode on (off with --no-cudnn-benchmark), fp32 with TF32 disabled (cuDNN and matmul), fp16 as
      model.half() with half inputs. Each iteration is timed alone with CUDA events and a synchronize (latency, as
      `osprey bench` measures it). When --ref-dir is given, the first request for a model also saves its logits on
      NAME.input.npy as NAME.torch_<device>_<precision>.npy there (a same-device reference for the fp16 check).
      Models stay built on the host between requests; one process serves the whole speed phase, so torch is
      imported once.
"""

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_test_models as mtm  # noqa: E402  (imports no torch at module level)

# The zoo of issue 16: name -> (torchvision keyword arguments, input size). Registered in make_test_models' table so
# its builder (seeded, realistic parameters) and input helpers work for the two architectures it does not list.
ZOO = {
    "resnet50": ({}, 224),
    "mobilenet_v2": ({}, 224),
    "mobilenet_v3_large": ({}, 224),
    "efficientnet_b0": ({}, 224),
    "densenet121": ({}, 224),
    "inception_v3": ({"aux_logits": False, "init_weights": True}, 299),
    "shufflenet_v2_x1_0": ({}, 224),
    "convnext_tiny": ({}, 224),
    "vit_b_16": ({}, 224),
    "regnet_y_400mf": ({}, 224),
}
for _name, _spec in ZOO.items():
    mtm.MODELS.setdefault(_name, _spec)

# Longest exports first, so parallel jobs end together.
EXPORT_ORDER = ["vit_b_16", "convnext_tiny", "inception_v3", "densenet121", "resnet50", "efficientnet_b0",
                "regnet_y_400mf", "mobilenet_v3_large", "mobilenet_v2", "shufflenet_v2_x1_0"]
INPUT_SEED = 20240616


def fixed_input(name: str, batch: int = 1):
    import numpy as np

    rng = np.random.default_rng(INPUT_SEED + sum(ord(c) for c in name))
    return rng.standard_normal(mtm.input_shape(name, batch), dtype=np.float32)


def paths(out: Path, name: str) -> dict:
    return {"onnx": out / f"{name}.onnx", "input": out / f"{name}.input.npy", "torch_cpu": out / f"{name}.torch_cpu.npy"}


def _save_npy(path: Path, array) -> None:
    import numpy as np

    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, array)
    os.replace(tmp, path)


def _onnx_export(model, dummy, target: Path, opset: int) -> str:
    """TorchScript exporter (dynamo=False) at `opset`; the dynamo exporter (opset >= 18) if that fails."""
    import inspect

    import torch

    kwargs = dict(input_names=["input"], output_names=["logits"],
                  dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}}, do_constant_folding=True)
    has_dynamo = "dynamo" in inspect.signature(torch.onnx.export).parameters
    try:
        # With autograd enabled on purpose: under no_grad nn.MultiheadAttention (ViT) takes its fused fast path,
        # which the TorchScript exporter cannot export.
        if has_dynamo:
            torch.onnx.export(model, (dummy,), str(target), opset_version=opset, dynamo=False, **kwargs)
        else:
            torch.onnx.export(model, (dummy,), str(target), opset_version=opset, **kwargs)
        return f"torchscript opset {opset}"
    except Exception as first:  # noqa: BLE001
        if not has_dynamo:
            raise
        try:
            torch.onnx.export(model, (dummy,), str(target), opset_version=max(opset, 18), dynamo=True,
                              external_data=False, **kwargs)
            return f"dynamo opset {max(opset, 18)} (torchscript failed: {str(first)[:200]})"
        except Exception as second:  # noqa: BLE001
            raise RuntimeError(f"torchscript exporter: {first}; dynamo exporter: {second}") from second


def export_one(name: str, out: str, opset: int, threads: int) -> dict:
    start = time.time()
    result = {"model": name, "ok": False}
    try:
        import torch

        torch.set_num_threads(max(1, threads))
        out_dir = Path(out)
        p = paths(out_dir, name)
        if all(q.exists() for q in p.values()):
            result.update(ok=True, exporter="cached")
        else:
            model = mtm.build_model(name)
            x = fixed_input(name)
            tmp = p["onnx"].with_name(p["onnx"].name + ".tmp")
            result["exporter"] = _onnx_export(model, torch.from_numpy(x), tmp, opset)
            with torch.no_grad():
                ref = model(torch.from_numpy(x)).numpy()
            os.replace(tmp, p["onnx"])
            _save_npy(p["input"], x)
            _save_npy(p["torch_cpu"], ref)
            result["ok"] = True
        result["onnx_mb"] = round(p["onnx"].stat().st_size / 1e6, 1)
    except Exception as e:  # noqa: BLE001 - one model's failure is recorded, the others go on
        result["error"] = f"{type(e).__name__}: {e}"[:2000]
    result["seconds"] = round(time.time() - start, 1)
    return result


def cmd_export(args) -> int:
    import concurrent.futures
    import multiprocessing

    names = [n for n in EXPORT_ORDER if n in args.models] + [n for n in args.models if n not in EXPORT_ORDER]
    unknown = [n for n in names if n not in mtm.MODELS]
    for n in unknown:
        print(json.dumps({"model": n, "ok": False, "error": "unknown model"}), flush=True)
    names = [n for n in names if n not in unknown]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    jobs = max(1, min(args.jobs, len(names)))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    failures = len(unknown)
    if jobs == 1:
        for n in names:
            cached = all(q.exists() for q in paths(Path(args.out), n).values())
            if args.deadline and time.time() > args.deadline and not cached:
                print(json.dumps({"model": n, "ok": False, "error": "skipped: out of time"}), flush=True)
                failures += 1
                continue
            r = export_one(n, args.out, args.opset, threads)
            failures += not r["ok"]
            print(json.dumps(r), flush=True)
        return 1 if failures else 0
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = {pool.submit(export_one, n, args.out, args.opset, threads): n for n in names}
        for f in concurrent.futures.as_completed(futures):
            try:
                r = f.result()
            except Exception as e:  # noqa: BLE001 - a worker that died
                r = {"model": futures[f], "ok": False, "error": f"worker failed: {e}"}
            failures += not r["ok"]
            print(json.dumps(r), flush=True)
    return 1 if failures else 0


class TorchBench:
    def __init__(self, device: str, ref_dir, cudnn_benchmark: bool):
        import torch

        self.torch = torch
        self.device = device
        self.ref_dir = Path(ref_dir) if ref_dir else None
        self.models = {}  # name -> fp32 model on the host
        self.saved_refs = set()
        if device.startswith("cuda"):
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.benchmark = cudnn_benchmark
            try:
                torch.set_float32_matmul_precision("highest")
            except AttributeError:
                pass
            torch.cuda.init()

    def info(self) -> dict:
        torch = self.torch
        info = {"torch": torch.__version__, "device": self.device,
                "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                "cudnn_benchmark": bool(torch.backends.cudnn.benchmark)}
        if self.device.startswith("cuda"):
            info["gpu"] = torch.cuda.get_device_name(torch.device(self.device))
            info["tf32"] = bool(torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)
        return info

    def _sync(self):
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def _time_once(self, model, x) -> float:
        torch = self.torch
        if self.device.startswith("cuda"):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            model(x)
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t = time.perf_counter()
        model(x)
        return (time.perf_counter() - t) * 1e3

    def run(self, req: dict) -> dict:
        torch = self.torch
        name, batch, precision = req["model"], int(req["batch"]), req.get("precision", "fp32")
        if name not in mtm.MODELS:
            raise ValueError(f"unknown model {name}")
        t0 = time.time()
        if name not in self.models:  # all kept on the host (the zoo is ~1.3 GB in fp32)
            self.models[name] = mtm.build_model(name)
        build_s = time.time() - t0
        dtype = torch.float16 if precision == "fp16" else torch.float32
        model = self.models[name]
        dev_model = None
        try:
            import copy

            dev_model = copy.deepcopy(model).to(self.device, memory_format=torch.channels_last).to(dtype).eval()
            with torch.no_grad():
                self._save_reference(name, dev_model, dtype, precision)
                shape = mtm.input_shape(name, batch)
                gen = torch.Generator().manual_seed(batch)
                x = torch.randn(shape, generator=gen).to(self.device, dtype=dtype)
                x = x.contiguous(memory_format=torch.channels_last)
                warmup = max(1, int(req.get("warmup", 10)))
                t = time.time()
                for _ in range(warmup):
                    dev_model(x)
                self._sync()
                per_iter = (time.time() - t) / warmup
                iters = int(req.get("iters", 0))
                if iters <= 0:  # from the target time: at least 10, at most 100
                    iters = max(10, min(100, int(float(req.get("target_s", 1.0)) / max(per_iter, 1e-6))))
                times = sorted(self._time_once(dev_model, x) for _ in range(iters))
                # The same with the copies osprey's figure includes: a float32 host input uploaded, the output
                # brought back to the host (wall clock; .cpu() waits for the GPU).
                x_host = torch.randn(shape, generator=gen)
                e2e = []
                for _ in range(iters):
                    t = time.perf_counter()
                    xd = x_host.to(self.device).to(dtype).contiguous(memory_format=torch.channels_last)
                    dev_model(xd).float().cpu()
                    e2e.append((time.perf_counter() - t) * 1e3)
                e2e.sort()
        finally:
            del dev_model
            if self.device.startswith("cuda"):
                torch.cuda.empty_cache()
        return {"model": name, "batch": batch, "precision": precision, "iters": iters, "warmup": warmup,
                "median_ms": round(times[len(times) // 2] if len(times) % 2 else
                                   (times[len(times) // 2 - 1] + times[len(times) // 2]) / 2, 4),
                "min_ms": round(times[0], 4), "mean_ms": round(sum(times) / len(times), 4),
                "host_io_median_ms": round(e2e[len(e2e) // 2] if len(e2e) % 2 else
                                           (e2e[len(e2e) // 2 - 1] + e2e[len(e2e) // 2]) / 2, 4),
                "warmup_ms_per_iter": round(per_iter * 1e3, 3), "build_s": round(build_s, 2),
                "seconds": round(time.time() - t0, 2)}

    def _save_reference(self, name, dev_model, dtype, precision):
        if self.ref_dir is None or (name, precision) in self.saved_refs:
            return
        self.saved_refs.add((name, precision))
        src = self.ref_dir / f"{name}.input.npy"
        if not src.exists():
            return
        import numpy as np

        x = self.torch.from_numpy(np.load(src)).to(self.device, dtype=dtype)
        x = x.contiguous(memory_format=self.torch.channels_last)
        y = dev_model(x).float().cpu().numpy()
        kind = "cuda" if self.device.startswith("cuda") else "cpu"
        _save_npy(self.ref_dir / f"{name}.torch_{kind}_{precision}.npy", y)


def cmd_bench_server(args) -> int:
    bench = TorchBench(args.device, args.ref_dir, not args.no_cudnn_benchmark)
    print(json.dumps({"ready": True, **bench.info()}), flush=True)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            req = json.loads(line)
            if req.get("quit"):
                break
            answer = bench.run(req)
        except Exception as e:  # noqa: BLE001 - answer the error, serve the next request
            answer = {"error": f"{type(e).__name__}: {e}"[:2000], "trace": traceback.format_exc()[-1500:]}
        print(json.dumps(answer), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", required=True)
    e.add_argument("--models", default=",".join(ZOO))
    e.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    e.add_argument("--opset", type=int, default=17)
    e.add_argument("--deadline", type=float, default=0, help="epoch seconds after which no new export starts")
    b = sub.add_parser("bench-server")
    b.add_argument("--device", default="cuda")
    b.add_argument("--ref-dir", default=None)
    b.add_argument("--no-cudnn-benchmark", action="store_true")
    args = parser.parse_args()
    if args.cmd == "export":
        args.models = [m for m in args.models.split(",") if m]
        return cmd_export(args)
    return cmd_bench_server(args)


if __name__ == "__main__":
    sys.exit(main())
