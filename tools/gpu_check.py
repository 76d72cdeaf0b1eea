#!/usr/bin/env python3
"""The phases of the device check (scripts/gpu-check runs this; docs/gpu.md, "The device check").

  export       tools/gpu_zoo.py export in the background (the zoo, fixed inputs, PyTorch CPU logits) into --zoo
  gpu_tests    the packed GoogleTest binary bin/gpu_tests (ctest label gpu), while the export runs
  idle         `osprey serve --device cuda --idle-unload S` on a one-model repository: nvidia-smi readings of the
               server process before any request, loaded, after idle release and after the next request; the cold
               (context re-created) request time against warm ones
  correctness  per model, one fixed input: `osprey run --device cuda` fp32 and fp16 against `osprey run` on the CPU
               (fp32: max |diff| / max |ref| <= 1e-3 and the same top-5; fp16: cosine >= 0.999 and the same top-1)
  speed        `osprey bench --device cuda` against PyTorch eager on the same GPU (gpu_zoo.py bench-server), batch 1
               and 32, fp32 (TF32 off on both sides) and fp16, median latency; column by column, so what is cut by
               the deadline is the last column, not the last models
  profile      `osprey bench --profile` of the cells where osprey is furthest behind PyTorch, into profile.txt

Every phase stops on its own deadline (each subprocess runs under a timeout derived from it) so the whole run ends
before --deadline; a model that fails is recorded and the next one runs. After every step the results are written
to OUT/gpu-check.json (raw numbers) and OUT/gpu-check.md (the tables), so a run cut short still reports.
"""

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PHASES = ["export", "gpu_tests", "idle", "correctness", "speed", "profile"]
# Seconds kept for each later phase when an earlier one sets its deadline.
RESERVE = {"export": 0, "gpu_tests": 0, "idle": 30, "correctness": 60, "speed": 120, "profile": 0}
FP32_REL_TOL = 1e-3
FP16_COS_MIN = 0.999


def now() -> float:
    return time.time()


def tail(text, n=1500) -> str:
    text = text or ""
    return text[-n:]


def geomean(values):
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


class Check:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out)
        self.work = Path(args.work)
        self.zoo = Path(args.zoo)
        for d in (self.out, self.work, self.zoo):
            d.mkdir(parents=True, exist_ok=True)
        self.deadline = args.deadline or (now() + 480)
        self.models = [m for m in args.models.split(",") if m]
        self.phases = [p for p in args.phases.split(",") if p]
        self.lock = threading.RLock()
        self.started = now()
        self.r = {
            "meta": {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "dry_run": args.dry_run, "device": args.device, "models": self.models, "phases": self.phases,
                     "osprey": args.osprey, "deadline_in_s": round(self.deadline - now(), 1),
                     "batches": args.batches, "precisions": args.precisions},
            "phases": {}, "export": {}, "gpu_tests": {}, "idle": {}, "correctness": {}, "speed": {}, "problems": [],
        }
        self.export_proc = None
        self.export_thread = None

    # ---------------------------------------------------------------- bookkeeping
    def phase_deadline(self, phase: str, cap: float) -> float:
        later = self.phases[self.phases.index(phase) + 1:] if phase in self.phases else []
        # The later phases' reserves, but never more than 60% of the time left (a short --budget scales down).
        keep = min(sum(RESERVE.get(p, 0) for p in later), 0.6 * max(0.0, self.deadline - now()))
        return min(now() + cap, self.deadline - keep)

    def problem(self, where: str, what: str):
        line = " | ".join(x.strip() for x in f"{where}: {what}".strip().splitlines() if x.strip())
        with self.lock:
            self.r["problems"].append(line[:600])
        print(f"  PROBLEM {line[:600]}", flush=True)

    def save(self):
        with self.lock:
            self.r["meta"]["elapsed_s"] = round(now() - self.started, 1)
            data = json.dumps(self.r, indent=1, default=str)
            md = render_markdown(self.r)
        for name, text in (("gpu-check.json", data), ("gpu-check.md", md)):
            tmp = self.out / (name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, self.out / name)

    def osprey(self, *args, timeout: float, device=None, precision=None):
        """Runs the osprey CLI; returns (rc, stdout, stderr, seconds). rc 124 on timeout."""
        cmd = [self.args.osprey, *args]
        if device and device != "cpu":  # the CPU is the default: today's binary has no --device flag
            cmd += ["--device", device]
        if precision and precision != "fp32":
            cmd += ["--precision", precision]
        return run(cmd, timeout, env=osprey_env())

    # ---------------------------------------------------------------- export
    def start_export(self):
        if "export" not in self.phases:
            return
        self.r["phases"]["export"] = {"status": "running"}
        cmd = [sys.executable, str(HERE / "gpu_zoo.py"), "export", "--out", str(self.zoo), "--models",
               ",".join(self.models), "--jobs", str(self.args.export_jobs), "--deadline",
               str(self.phase_deadline("export", self.args.export_cap) - 5)]
        print(f"== export (background): {' '.join(cmd)}", flush=True)
        log = open(self.out / "export.log", "w")
        self.export_started = now()
        self.export_proc = track(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                                  start_new_session=True))

        def reader():
            for line in self.export_proc.stdout:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                with self.lock:
                    self.r["export"][rec.get("model", "?")] = rec
                status = "ok" if rec.get("ok") else "FAILED " + str(rec.get("error", ""))[:300]
                print(f"  export {rec.get('model')}: {status} ({rec.get('seconds', '?')} s, {rec.get('exporter', '')})",
                      flush=True)

        self.export_thread = threading.Thread(target=reader, daemon=True)
        self.export_thread.start()

    def wait_export(self):
        if self.export_proc is None:
            return
        limit = self.phase_deadline("export", self.args.export_cap) - now()
        try:
            self.export_proc.wait(timeout=max(1, limit))
        except subprocess.TimeoutExpired:
            kill_group(self.export_proc)
            self.problem("export", f"stopped at its deadline ({self.args.export_cap} s cap); models not exported "
                                   "are skipped")
        self.export_thread.join(timeout=5)
        for m in self.models:
            if m not in self.r["export"]:
                self.r["export"][m] = {"model": m, "ok": False, "error": "not exported (out of time or crashed)"}
            if not self.r["export"][m].get("ok"):
                self.problem(f"export {m}", str(self.r["export"][m].get("error", ""))[:300])
        ok = sum(1 for m in self.models if self.r["export"][m].get("ok"))
        self.r["phases"]["export"] = {"status": "ok" if ok == len(self.models) else "partial",
                                      "seconds": round(now() - self.export_started, 1),
                                      "note": f"{ok}/{len(self.models)} models"}
        self.save()

    def exported(self):
        if "export" not in self.phases:  # models from an earlier run on this machine
            return [m for m in self.models if (self.zoo / f"{m}.onnx").exists()
                    and (self.zoo / f"{m}.input.npy").exists()]
        return [m for m in self.models if self.r["export"].get(m, {}).get("ok")]

    # ---------------------------------------------------------------- gpu_tests
    def gpu_tests(self):
        t0 = now()
        binary = self.args.gpu_tests
        if not binary or not Path(binary).exists():
            self.r["gpu_tests"] = {"status": "not packed"}
            self.r["phases"]["gpu_tests"] = {"status": "skipped", "note": "no bin/gpu_tests in the pack"}
            print("== gpu_tests: not in the pack, skipped", flush=True)
            self.save()
            return
        limit = self.phase_deadline("gpu_tests", self.args.gpu_tests_cap) - now()
        print(f"== gpu_tests ({int(limit)} s at most)", flush=True)
        report = self.work / "gpu_tests.json"
        report.unlink(missing_ok=True)
        env = osprey_env()
        env.setdefault("OSPREY_REPO", str(HERE.parent))  # as ctest sets it
        rc, out, err, secs = run([binary, f"--gtest_output=json:{report}"], max(5, limit), env=env)
        (self.out / "gpu_tests.log").write_text(out + "\n" + err)
        res = {"rc": rc, "seconds": round(secs, 1)}
        if report.exists():
            try:
                g = json.loads(report.read_text())
                names_failed, names_skipped, total = [], [], 0
                for suite in g.get("testsuites", []):
                    for t in suite.get("testsuite", []):
                        total += 1
                        full = f"{suite.get('name')}.{t.get('name')}"
                        if t.get("failures"):
                            names_failed.append(full)
                        elif t.get("result") == "SKIPPED":
                            names_skipped.append(full)
                res.update(total=total, failed=len(names_failed), skipped=len(names_skipped),
                           passed=total - len(names_failed) - len(names_skipped), failed_names=names_failed[:50],
                           skipped_names=names_skipped[:50])
            except ValueError as e:
                res["parse_error"] = str(e)
        else:
            for line in out.splitlines():
                for key, tag in (("passed", "[  PASSED  ]"), ("failed", "[  FAILED  ]"), ("skipped", "[  SKIPPED ]")):
                    if line.startswith(tag) and "test" in line:
                        try:
                            res[key] = int(line[len(tag):].split()[0])
                        except (ValueError, IndexError):
                            pass
        if not self.args.dry_run and res.get("skipped") and not res.get("passed"):
            self.problem("gpu_tests", f"all {res['skipped']} tests skipped: the binary saw no device (gpu_tests.log)")
        if rc == 124:
            self.problem("gpu_tests", f"timed out after {int(limit)} s (see gpu_tests.log)")
        elif rc != 0:
            self.problem("gpu_tests", f"exit {rc}; failed: {', '.join(res.get('failed_names', [])[:10]) or tail(err, 300)}")
        self.r["gpu_tests"] = res
        self.r["phases"]["gpu_tests"] = {"status": "ok" if rc == 0 else "failed", "seconds": round(now() - t0, 1)}
        print(f"  gpu_tests: rc {rc}, passed {res.get('passed')}, failed {res.get('failed')}, "
              f"skipped {res.get('skipped')}", flush=True)
        self.save()

    # ---------------------------------------------------------------- idle release
    def idle(self):
        t0 = now()
        phase_end = self.phase_deadline("idle", self.args.idle_cap)
        avail = self.exported()
        model = self.args.idle_model if self.args.idle_model in avail else (avail[0] if avail else None)
        res = {"model": model, "idle_unload_s": self.args.idle_unload, "readings": [], "requests": {}}
        self.r["idle"] = res
        if model is None:
            self.r["phases"]["idle"] = {"status": "skipped", "note": "no exported model"}
            self.save()
            return
        print(f"== idle release: osprey serve --idle-unload {self.args.idle_unload} with {model}", flush=True)
        repo = self.work / "repo"
        version = repo / model / "1"
        version.mkdir(parents=True, exist_ok=True)
        link = version / "model.onnx"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(self.zoo / f"{model}.onnx")
        x = np.load(self.zoo / f"{model}.input.npy")
        port = free_port()
        cmd = [self.args.osprey, "serve", "--model-repository", str(repo), "--port", str(port), "--grpc-port", "-1",
               "--idle-unload", str(self.args.idle_unload), "--log-level", "info"]
        if self.args.device != "cpu":
            cmd += ["--device", self.args.device]
        res["command"] = " ".join(cmd)

        def reading(step, pid):
            apps = nvsmi_apps() if not self.args.dry_run else None
            used = nvsmi_used() if not self.args.dry_run else None
            rec = {"step": step, "t_s": round(now() - t0, 2), "gpu_used_mib": used,
                   "server_listed": (pid in apps) if apps is not None else None,
                   "server_mib": (apps.get(pid, 0) if apps is not None else None),
                   "apps": apps}
            res["readings"].append(rec)
            print(f"  {step}: server {rec['server_mib']} MiB (listed: {rec['server_listed']}), "
                  f"GPU used {used} MiB", flush=True)
            return rec

        reading("before the server starts", -1)
        log = open(self.out / "serve.log", "w")
        proc = track(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                      env=osprey_env()))
        res["pid"] = proc.pid
        base = f"http://127.0.0.1:{port}"
        try:
            ready_by = min(now() + 30, phase_end)
            while now() < ready_by:
                if proc.poll() is not None:
                    log.flush()
                    why = tail((self.out / "serve.log").read_text(errors="replace"), 400)
                    raise RuntimeError(f"server exited with {proc.returncode} before it was ready: {why}")
                if http_ok(base + "/v2/health/ready"):
                    break
                time.sleep(0.2)
            else:
                raise RuntimeError("server not ready within 30 s")
            res["ready_after_s"] = round(now() - t0, 2)
            time.sleep(0.5)
            reading("started, before any request", proc.pid)

            def infer(label):
                left = phase_end - now()
                if left < 2:
                    raise RuntimeError(f"out of time before request '{label}'")
                ms, y = kserve_infer(base, model, x, timeout=min(120, left))
                res["requests"].setdefault(label, []).append(round(ms, 2))
                return ms, y

            ms, y_first = infer("first (load)")
            reading("after the first request (loaded)", proc.pid)
            for _ in range(5):
                infer("warm")
            t_last = now()
            # Poll until the server's process leaves the GPU (idle release), at most idle_unload + 12 s.
            release_by = min(t_last + self.args.idle_unload + 12, phase_end - 10)
            released_at = None
            while now() < release_by and not self.args.dry_run:
                apps = nvsmi_apps()
                if apps is not None and proc.pid not in apps:
                    released_at = now()
                    break
                time.sleep(0.25)
            res["released_after_idle_s"] = round(released_at - t_last, 2) if released_at else None
            settle = t_last + self.args.idle_unload + 2 - now()
            if settle > 0:
                time.sleep(settle)
            res["index_after_idle"] = repository_index(base, model)
            reading(f"idle {round(now() - t_last, 1)} s (after idle unload)", proc.pid)
            ms_cold, y_cold = infer("after idle release (cold)")
            reading("after the next request", proc.pid)
            for _ in range(3):
                infer("warm after reload")
            res["cold_output_matches_first"] = bool(np.allclose(y_cold, y_first, rtol=1e-4, atol=1e-5))
            status = "ok"
        except Exception as e:  # noqa: BLE001 - record and go on to the next phase
            self.problem("idle", f"{type(e).__name__}: {e}")
            status = "failed"
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                kill_group(proc)
            log.close()
        req = res["requests"]
        res["summary"] = {
            "first_ms": (req.get("first (load)") or [None])[0],
            "warm_median_ms": median(req.get("warm")),
            "cold_after_release_ms": (req.get("after idle release (cold)") or [None])[0],
            "warm_after_reload_median_ms": median(req.get("warm after reload")),
        }
        idle_reading = next((r for r in res["readings"] if r["step"].startswith("idle")), None)
        if idle_reading and idle_reading["server_mib"] not in (None, 0):
            self.problem("idle", f"server still holds {idle_reading['server_mib']} MiB after idle unload")
        self.r["phases"]["idle"] = {"status": status, "seconds": round(now() - t0, 1)}
        self.save()

    # ---------------------------------------------------------------- correctness
    def correctness(self):
        t0 = now()
        phase_end = self.phase_deadline("correctness", self.args.correctness_cap)
        models = self.exported()
        print(f"== correctness: {len(models)} models, until +{int(phase_end - self.started)} s", flush=True)
        out_root = self.work / "outputs"
        cpu_pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

        def run_to(model, tag, device, precision):
            d = out_root / model / tag
            if d.exists():
                for f in d.glob("*.npy"):
                    f.unlink()
            d.mkdir(parents=True, exist_ok=True)
            left = phase_end - now()
            if left < 3:
                return {"error": "skipped: out of time"}, None
            args = ["run", str(self.zoo / f"{model}.onnx"), "--input", f"input={self.zoo / f'{model}.input.npy'}",
                    "--output-dir", str(d)]
            if device == "cpu":
                args += ["--threads", str(self.args.cpu_threads)]
            rc, out, err, secs = self.osprey(*args, timeout=min(self.args.call_cap, left), device=device,
                                             precision=precision)
            rec = {"rc": rc, "seconds": round(secs, 2)}
            if rc != 0:
                rec["error"] = ("timed out" if rc == 124 else f"exit {rc}") + ": " + tail(err.strip() or out, 800)
                return rec, None
            y = read_output(d)
            if y is None:
                rec["error"] = "no .npy output written"
            return rec, y

        # CPU references run one ahead in a thread, beside the GPU runs.
        futures = {m: cpu_pool.submit(run_to, m, "cpu", "cpu", "fp32") for m in models}
        for m in models:
            entry = {}
            self.r["correctness"][m] = entry
            gpu_precisions = [p for p in self.args.precisions.split(",") if p]
            if self.args.dry_run:
                gpu_precisions = ["fp32"]
                entry["fp16"] = {"skipped": "dry run (CPU has no fp16 mode)"}
            gpu = {p: run_to(m, f"{self.args.device}_{p}", self.args.device, p) for p in gpu_precisions}
            try:
                cpu_rec, ref = futures[m].result(timeout=max(1, phase_end - now()))
            except concurrent.futures.TimeoutError:
                cpu_rec, ref = {"error": "timed out"}, None
            entry["cpu"] = cpu_rec
            torch_ref = load_npy(self.zoo / f"{m}.torch_cpu.npy")
            if ref is not None and torch_ref is not None:
                entry["cpu_vs_torch"] = compare(ref, torch_ref)
            for p, (rec, y) in gpu.items():
                if y is not None and ref is not None:
                    rec.update(compare(y, ref))
                    if p == "fp32":
                        rec["pass"] = bool(rec["rel_err"] <= FP32_REL_TOL and rec["top5_agree"] and rec["finite"])
                    else:
                        rec["pass"] = bool(rec["cosine"] >= FP16_COS_MIN and rec["top1_same"] and rec["finite"])
                    if torch_ref is not None and p == "fp32":
                        rec["vs_torch_rel_err"] = compare(y, torch_ref)["rel_err"]
                elif "error" not in rec:
                    rec["error"] = "no CPU reference: " + str(cpu_rec.get("error", "?"))[:300]
                entry[p] = rec
                if "error" in rec:
                    self.problem(f"correctness {m} {p}", rec["error"])
                elif not rec.get("pass"):
                    self.problem(f"correctness {m} {p}", summarize_compare(rec, p))
            if "error" in cpu_rec:
                self.problem(f"correctness {m} cpu reference", cpu_rec["error"])
            print(f"  {m}: " + "; ".join(f"{p} " + (summarize_compare(entry[p], p) if "rel_err" in entry[p] else
                                                   str(entry[p].get('error') or entry[p].get('skipped'))[:200])
                                         for p in gpu_precisions + (["fp16"] if self.args.dry_run else [])
                                         if p in entry), flush=True)
            self.save()
        cpu_pool.shutdown(wait=False, cancel_futures=True)
        self.r["phases"]["correctness"] = {"status": "done", "seconds": round(now() - t0, 1)}
        self.save()

    # ---------------------------------------------------------------- speed
    def speed(self):
        t0 = now()
        phase_end = self.deadline - 3
        models = self.exported()
        batches = [int(b) for b in self.args.batches.split(",") if b]
        precisions = [p for p in self.args.precisions.split(",") if p]
        if self.args.dry_run:
            precisions = ["fp32"]
        columns = [(b, p) for p in precisions for b in batches]
        print(f"== speed: {len(models)} models x {columns}, until +{int(phase_end - self.started)} s", flush=True)
        torch = TorchWorker(self, phase_end)
        try:
            for batch, precision in columns:
                key = f"b{batch}_{precision}"
                for m in models:
                    cell = self.r["speed"].setdefault(m, {}).setdefault(key, {})
                    if phase_end - now() < 6:
                        cell["skipped"] = "out of time"
                        continue

                    def torch_cell():
                        return torch.request({"model": m, "batch": batch, "precision": precision,
                                              "warmup": self.args.warmup, "iters": self.args.iters,
                                              "target_s": self.args.target_s},
                                             timeout=min(self.args.call_cap, phase_end - now() - 3))

                    def osprey_cell(iters):
                        left = phase_end - now()
                        if left < 4:
                            return {"error": "skipped: out of time"}
                        rc, out, err, secs = self.osprey(
                            "bench", str(self.zoo / f"{m}.onnx"), "--batch", str(batch), "--iters", str(iters),
                            "--warmup", str(self.args.warmup), "--json", timeout=min(self.args.call_cap, left),
                            device=self.args.device, precision=precision)
                        ob = parse_json_line(out) if rc == 0 else None
                        if ob is None:
                            ob = {"error": ("timed out" if rc == 124 else f"exit {rc}") + ": "
                                  + tail(err.strip() or out, 600)}
                            self.problem(f"speed {m} {key} osprey", ob["error"])
                        ob["seconds"] = round(secs, 2)
                        return ob

                    # Where `osprey run` already failed on this model and precision, osprey goes first and PyTorch
                    # is timed only if osprey's bench works: a broken backend does not spend the lease on PyTorch.
                    failed_before = "error" in (self.r["correctness"].get(m, {}).get(precision) or {})
                    if failed_before:
                        iters = self.args.iters or 30
                        ob = osprey_cell(iters)
                        tq = ({"skipped": "osprey failed here and in the correctness phase"} if "error" in ob
                              else torch_cell())
                    else:
                        tq = torch_cell()
                        iters = tq.get("iters") or self.args.iters or 30
                        ob = osprey_cell(iters)
                    cell["torch"] = tq
                    cell["osprey"] = ob
                    if "error" in tq:
                        self.problem(f"speed {m} {key} torch", str(tq["error"])[:400])
                    o_ms, t_ms = ob.get("median_ms"), tq.get("median_ms")
                    if o_ms and t_ms:
                        cell["ratio"] = round(o_ms / t_ms, 4)
                    print(f"  {key} {m}: osprey {fmt(o_ms)} ms, torch {fmt(t_ms)} ms, ratio {fmt(cell.get('ratio'))}"
                          f" ({iters} iters)", flush=True)
                    self.save()
        finally:
            torch.close()
        # fp16 context: PyTorch's own fp16 logits against the fp32 CPU reference (the same input, same weights).
        for m in models:
            entry = self.r["correctness"].get(m)
            ref = read_output(self.work / "outputs" / m / "cpu")
            if entry is None or ref is None:
                continue
            for p in ("fp32", "fp16"):
                y = load_npy(self.zoo / f"{m}.torch_{'cpu' if self.args.device == 'cpu' else 'cuda'}_{p}.npy")
                if y is not None:
                    c = compare(y, ref)
                    entry[f"torch_gpu_{p}"] = {"rel_err": c["rel_err"], "cosine": c["cosine"],
                                               "top1_same": c["top1_same"]}
        self.r["phases"]["speed"] = {"status": "done", "seconds": round(now() - t0, 1)}
        self.save()

    # ---------------------------------------------------------------- profile
    def profile(self):
        """`osprey bench --profile` (per-op times; it synchronises after each step) for the cells where osprey is
        furthest behind PyTorch, into OUT/profile.txt: where the next round's time should go."""
        t0 = now()
        phase_end = self.deadline - 3
        cells = []
        for m, row in self.r["speed"].items():
            for key, cell in row.items():
                if cell.get("ratio"):
                    cells.append((cell["ratio"], m, key))
        if not cells:  # no speed figures (phase not run): the largest batch and last precision of each model
            key = f"b{self.args.batches.split(',')[-1]}_{self.args.precisions.split(',')[-1]}"
            cells = [(0, m, key) for m in self.exported()]
        cells.sort(reverse=True)
        cells = cells[:self.args.profile_cells]
        print(f"== profile: {[(m, k) for _, m, k in cells]}", flush=True)
        done = []
        with open(self.out / "profile.txt", "w") as f:
            for ratio, m, key in cells:
                left = phase_end - now()
                if left < 8:
                    self.problem("profile", f"out of time before {m} {key}")
                    break
                batch, precision = key[1:].split("_")
                rc, out, err, _ = self.osprey("bench", str(self.zoo / f"{m}.onnx"), "--batch", batch, "--iters", "10",
                                              "--warmup", "3", "--profile", "--top", "10",
                                              timeout=min(self.args.call_cap, left), device=self.args.device,
                                              precision=precision)
                f.write(f"=== {m} {key} (ratio {fmt(ratio)})\n" + (out if rc == 0 else f"exit {rc}: {tail(err, 800)}")
                        + "\n")
                f.flush()
                done.append(f"{m} {key}")
        self.r["phases"]["profile"] = {"status": "done", "seconds": round(now() - t0, 1),
                                       "note": f"{len(done)} profiles in profile.txt"}
        self.save()

    def run_all(self):
        self.save()
        self.start_export()
        if "gpu_tests" in self.phases:
            self.gpu_tests()
        self.wait_export()
        for phase, fn in (("idle", self.idle), ("correctness", self.correctness), ("speed", self.speed),
                          ("profile", self.profile)):
            if phase not in self.phases:
                continue
            if self.deadline - now() < 8:
                self.r["phases"][phase] = {"status": "skipped", "note": "out of time"}
                self.problem(phase, "skipped: out of time")
                continue
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a broken phase must not stop the report
                import traceback

                self.problem(phase, f"crashed: {type(e).__name__}: {e} {traceback.format_exc()[-800:]}")
                self.r["phases"][phase] = {"status": "crashed"}
                self.save()
        self.save()
        return 0


class TorchWorker:
    """One `gpu_zoo.py bench-server` process for the speed phase; restarted after a timeout or a crash."""

    def __init__(self, check: Check, phase_end: float):
        self.check = check
        self.phase_end = phase_end
        self.proc = None
        self.failed_starts = 0
        self.log_path = check.out / "torch_bench.log"
        self.log = open(self.log_path, "a")

    def _start(self):
        device = self.check.args.device
        cmd = [sys.executable, str(HERE / "gpu_zoo.py"), "bench-server", "--device",
               "cpu" if device == "cpu" else device, "--ref-dir", str(self.check.zoo)]
        self.proc = track(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                           text=True, bufsize=1, start_new_session=True))
        hello = self._read(min(90, max(1, self.phase_end - now())))
        if hello is None or not hello.get("ready"):
            self.close()
            self.failed_starts += 1
            self.log.flush()
            try:
                why = " | ".join([x for x in self.log_path.read_text(errors="replace").splitlines() if x.strip()][-3:])
            except OSError:
                why = ""
            raise RuntimeError(f"PyTorch bench worker did not start ({self.failed_starts}x): {why}")
        self.check.r["meta"]["torch"] = {k: v for k, v in hello.items() if k != "ready"}
        print(f"  PyTorch: {self.check.r['meta']['torch']}", flush=True)

    def _read(self, timeout):
        end = now() + timeout
        while now() < end:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.05, end - now()))
            if not ready:
                continue
            line = self.proc.stdout.readline()
            if not line:
                return None
            line = line.strip()
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    continue
        return None

    def request(self, req: dict, timeout: float) -> dict:
        try:
            if self.proc is None or self.proc.poll() is not None:
                if self.failed_starts >= 2:
                    return {"error": "PyTorch bench worker failed to start twice; not retried"}
                self._start()
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            answer = self._read(max(1, timeout))
        except (RuntimeError, OSError, BrokenPipeError) as e:
            self.close()
            return {"error": str(e)}
        if answer is None:
            self.close()
            return {"error": f"no answer within {int(timeout)} s (worker restarted)"}
        return answer

    def close(self):
        if self.proc is not None:
            try:
                if self.proc.poll() is None:
                    self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
                    self.proc.stdin.flush()
                    self.proc.wait(timeout=5)
            except Exception:  # noqa: BLE001
                pass
            kill_group(self.proc)
            self.proc = None


# -------------------------------------------------------------------- helpers
CHILDREN_FILE = None  # WORK/children.pids: process groups started here, for scripts/gpu-check to reap


def track(proc):
    """Records a process started in its own session, so scripts/gpu-check can kill its group if this script is
    itself killed (the device tool does not end processes in another session when a command returns)."""
    if CHILDREN_FILE is not None:
        with open(CHILDREN_FILE, "a") as f:
            f.write(f"{proc.pid}\n")
    return proc


def osprey_env():
    """The environment of osprey's processes: OSPREY_LD_LIBRARY_PATH (set by scripts/gpu-check: the pack's lib/ and
    the CUDA libraries of PyTorch's venv) as LD_LIBRARY_PATH, for them alone."""
    env = dict(os.environ)
    if os.environ.get("OSPREY_LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["OSPREY_LD_LIBRARY_PATH"]
    return env


def run(cmd, timeout, env=None):
    t = now()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1, timeout), start_new_session=True,
                           env=env)
        return p.returncode, p.stdout, p.stderr, now() - t
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        return 124, out, err, now() - t
    except OSError as e:
        return 127, "", str(e), now() - t


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass
    try:
        proc.wait(timeout=5)
    except Exception:  # noqa: BLE001
        pass


def parse_json_line(text):
    for line in reversed((text or "").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def load_npy(path):
    try:
        return np.load(path)
    except (OSError, ValueError):
        return None


def read_output(d: Path):
    if not d.is_dir():
        return None
    preferred = d / "logits.npy"
    files = [preferred] if preferred.exists() else sorted(d.glob("*.npy"))
    return load_npy(files[0]) if files else None


def median(values):
    if not values:
        return None
    v = sorted(values)
    n = len(v)
    return round(v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2, 3)


def compare(y, ref) -> dict:
    """Agreement of one output with its reference, per the issue's gates (batch rows compared one by one)."""
    y = np.asarray(y, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if y.size != ref.size:
        return {"rel_err": float("inf"), "cosine": 0.0, "top5_agree": False, "top5_exact": False,
                "top1_same": False, "finite": bool(np.isfinite(y).all()),
                "note": f"shape {list(y.shape)} vs reference {list(ref.shape)}"}
    y = y.reshape(ref.shape)
    finite = bool(np.isfinite(y).all())
    diff = np.abs(y - ref)
    scale = float(np.abs(ref).max()) or 1e-30
    max_abs = float(diff.max()) if finite else float("inf")
    flat_y = y.reshape(-1)
    flat_r = ref.reshape(-1)
    denom = float(np.linalg.norm(flat_y) * np.linalg.norm(flat_r)) or 1e-30
    cosine = float(np.dot(flat_y, flat_r) / denom) if finite else 0.0
    rows_y = y.reshape(y.shape[0], -1) if y.ndim > 1 else y.reshape(1, -1)
    rows_r = ref.reshape(rows_y.shape)
    top5_exact = top5_agree = top1_same = True
    min_margin = float("inf")
    tie_tol = max(1e-4 * scale, 2 * max_abs) if finite else 0.0
    for ry, rr in zip(rows_y, rows_r):
        k = min(5, ry.size)
        ty = np.argsort(-ry, kind="stable")[:k]
        tr = np.argsort(-rr, kind="stable")[:k]
        top1_same &= bool(ty[0] == tr[0])
        if not np.array_equal(ty, tr):
            top5_exact = False
            # Tolerated: each rank's pick is within the tie tolerance of the reference's value at that rank.
            if not np.all(rr[ty] >= rr[tr] - tie_tol):
                top5_agree = False
        srt = np.sort(rr)[::-1]
        if srt.size > k:
            min_margin = min(min_margin, float(np.min(srt[:k] - srt[1:k + 1])) / scale)
    return {"rel_err": max_abs / scale, "max_abs_err": max_abs, "max_abs_ref": scale, "cosine": cosine,
            "top5_exact": bool(top5_exact), "top5_agree": bool(top5_agree and finite),
            "top1_same": bool(top1_same and finite), "finite": finite,
            "ref_top5_min_gap_rel": (None if min_margin == float("inf") else min_margin)}


def summarize_compare(rec, precision):
    if "rel_err" not in rec:
        return str(rec.get("error", ""))[:200]
    if precision == "fp32":
        return (f"rel {rec['rel_err']:.2e}, top-5 {'same' if rec['top5_exact'] else ('near-tie' if rec['top5_agree'] else 'DIFFERS')}"
                f"{'' if rec.get('pass') else ' FAIL'}")
    return (f"cosine {rec['cosine']:.6f}, top-1 {'same' if rec['top1_same'] else 'DIFFERS'}"
            f"{'' if rec.get('pass') else ' FAIL'}")


def fmt(v, digits=3):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_ok(url) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def kserve_infer(base, model, x, timeout):
    """KServe v2 infer with the binary tensor extension; returns (ms, first output as numpy)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    header = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    body = header + x.tobytes()
    req = urllib.request.Request(f"{base}/v2/models/{model}/infer", data=body, method="POST",
                                 headers={"Inference-Header-Content-Length": str(len(header)),
                                          "Content-Type": "application/octet-stream"})
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            payload = r.read()
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"infer: HTTP {e.code}: {e.read()[:300]!r}") from e
    ms = (time.perf_counter() - t) * 1e3
    answer = json.loads(payload)
    out = answer["outputs"][0]
    return ms, np.asarray(out["data"], dtype=np.float64).reshape(out["shape"])


def repository_index(base, model):
    try:
        req = urllib.request.Request(f"{base}/v2/repository/index", data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            for m in json.loads(r.read()):
                if m.get("name") == model:
                    return {"state": m.get("state"), "reason": m.get("reason")}
    except (urllib.error.URLError, OSError, ValueError) as e:
        return {"error": str(e)}
    return None


def nvsmi_apps():
    """{pid: MiB} of the compute processes nvidia-smi lists, or None when it cannot be read."""
    rc, out, _, _ = run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], 15)
    if rc != 0:
        return None
    apps = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            try:
                apps[int(parts[0])] = int(float(parts[1]))
            except ValueError:
                apps[int(parts[0])] = None
    return apps


def nvsmi_used():
    rc, out, _, _ = run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], 15)
    if rc != 0 or not out.strip():
        return None
    try:
        return int(float(out.strip().splitlines()[0]))
    except ValueError:
        return None


# -------------------------------------------------------------------- report
def render_markdown(r) -> str:
    m = r["meta"]
    lines = ["# osprey gpu-check" + (" (CPU DRY RUN: plumbing only, no GPU figures)" if m.get("dry_run") else ""), ""]
    gpu = m.get("gpu") or {}
    torch = m.get("torch") or {}
    lines.append(f"- started {m.get('started')}, {m.get('elapsed_s')} s elapsed at this writing; device `{m.get('device')}`"
                 f"{'; GPU ' + gpu.get('name', '') + ', driver ' + gpu.get('driver', '') if gpu else ''}")
    lines.append(f"- osprey: {m.get('osprey_version', '?')}; PyTorch {torch.get('torch', '?')}, cuDNN "
                 f"{torch.get('cudnn', '?')}, cudnn.benchmark {torch.get('cudnn_benchmark', '?')}, TF32 "
                 f"{'on' if torch.get('tf32') else 'off'}")
    phases = ", ".join(f"{k} {v.get('status')}" + (f" ({v['seconds']} s)" if "seconds" in v else "")
                       + (f" [{v['note']}]" if v.get("note") else "") for k, v in r["phases"].items())
    lines.append(f"- phases: {phases or 'none yet'}")
    lines.append("")

    # Zoo agreement
    lines += ["## Zoo agreement: osprey on the GPU vs osprey on the CPU", "",
              f"One fixed input per model (seeded normal, batch 1). fp32: max|diff|/max|ref| <= {FP32_REL_TOL:g} and "
              f"the same top-5 (a swap within a near-tie of the reference counts as the same, marked ~); fp16: "
              f"cosine >= {FP16_COS_MIN} and the same top-1. `torch fp16 cos`: PyTorch's own fp16 on the GPU against "
              "the same reference (what fp16 costs on this random-weight model).", "",
              "| model | fp32 rel err | fp32 top-5 | fp16 cosine | fp16 top-1 | torch fp16 cos | CPU vs torch rel | pass |",
              "|---|---|---|---|---|---|---|---|"]
    n_pass = n_rows = 0
    for model, e in r["correctness"].items():
        f32, f16 = e.get("fp32", {}), e.get("fp16", {})

        def cell(rec, key, fmt_):
            if key in rec:
                return fmt_(rec[key])
            if rec.get("error"):
                return "ERROR"
            if rec.get("skipped"):
                return "skipped"
            return "-"

        top5 = (lambda rec: "-" if "top5_agree" not in rec else
                ("yes" if rec["top5_exact"] else ("yes~" if rec["top5_agree"] else "NO")))(f32)
        ok32 = f32.get("pass")
        ok16 = f16.get("pass") if "skipped" not in f16 else True
        passed = bool(ok32 and ok16)
        n_rows += 1
        n_pass += passed
        tgf = e.get("torch_gpu_fp16", {})
        lines.append(f"| {model} | {cell(f32, 'rel_err', lambda v: f'{v:.2e}')} | {top5} | "
                     f"{cell(f16, 'cosine', lambda v: f'{v:.6f}')} | "
                     f"{cell(f16, 'top1_same', lambda v: 'yes' if v else 'NO')} | "
                     f"{fmt(tgf.get('cosine'), 6) if tgf else '-'} | "
                     f"{fmt(e.get('cpu_vs_torch', {}).get('rel_err'), 2)} | {'yes' if passed else 'NO'} |")
    lines += ["", f"{n_pass}/{n_rows} models pass both gates.", ""]

    # Speed
    cols = []
    for cells in r["speed"].values():
        for k in cells:
            if k not in cols:
                cols.append(k)
    if cols:
        lines += ["## Speed: osprey / PyTorch eager, median latency on the same GPU", "",
                  "Each cell: osprey ms / PyTorch ms = ratio (below 1: osprey faster). PyTorch eager: eval, "
                  "channels_last, no_grad, TF32 off in fp32, model.half() in fp16, CUDA-event timed per iteration. "
                  "osprey: `osprey bench --device cuda --precision P --batch B` median (same iteration count). "
                  "Targets (issue 16): geomean <= 0.8 at batch 1, <= 1.0 at batch 32.", "",
                  "| model | " + " | ".join(c.replace("_", " ") for c in cols) + " |",
                  "|---|" + "---|" * len(cols)]
        ratios = {c: [] for c in cols}
        for model, cells in r["speed"].items():
            row = []
            for c in cols:
                cellv = cells.get(c, {})
                o = (cellv.get("osprey") or {}).get("median_ms")
                t = (cellv.get("torch") or {}).get("median_ms")
                if cellv.get("ratio"):
                    ratios[c].append(cellv["ratio"])
                    row.append(f"{fmt(o)} / {fmt(t)} = **{cellv['ratio']:.2f}**")
                elif cellv.get("skipped"):
                    row.append("skipped")
                else:
                    t_skip = (cellv.get("torch") or {}).get("skipped")
                    row.append(f"{fmt(o) if o else 'ERR'} / {fmt(t) if t else ('-' if t_skip else 'ERR')}")
            lines.append(f"| {model} | " + " | ".join(row) + " |")
        lines.append("| **geomean** | " + " | ".join(
            (f"**{geomean(ratios[c]):.3f}** (n={len(ratios[c])})" if geomean(ratios[c]) else "-") for c in cols) + " |")
        # osprey's figure includes uploading the float32 host input and bringing the output back; PyTorch's above
        # starts and ends on the GPU. The same PyTorch run with those copies (host_io_median_ms), for comparison.
        io_ratios = {c: [] for c in cols}
        for cells in r["speed"].values():
            for c in cols:
                cellv = cells.get(c, {})
                o = (cellv.get("osprey") or {}).get("median_ms")
                t = (cellv.get("torch") or {}).get("host_io_median_ms")
                if o and t:
                    io_ratios[c].append(o / t)
        if any(io_ratios.values()):
            lines.append("| geomean vs PyTorch with host copies | " + " | ".join(
                (f"{geomean(io_ratios[c]):.3f} (n={len(io_ratios[c])})" if geomean(io_ratios[c]) else "-")
                for c in cols) + " |")
        lines.append("")
        # Steps that ran on the host (ops without a CUDA kernel), as `osprey bench --json` reports them.
        host = []
        for model, cells in r["speed"].items():
            for c, cellv in cells.items():
                ob = cellv.get("osprey") or {}
                hs = ob.get("host_steps")
                ds = ob.get("device_steps")
                n = len(hs) if isinstance(hs, (list, dict)) else hs
                nd = len(ds) if isinstance(ds, (list, dict)) else ds
                if n:
                    host.append(f"{model} {c}: {n} host steps (device steps: {fmt(nd)})")
        if host:
            lines += ["Steps on the host (CPU fallback) in the timed plans: " + "; ".join(host[:20]), ""]

    # Idle
    idle = r.get("idle") or {}
    if idle.get("readings"):
        lines += [f"## Idle release: `osprey serve --idle-unload {idle.get('idle_unload_s')}` with {idle.get('model')}",
                  "", "`nvidia-smi --query-compute-apps` for the server's pid (0 = not listed) and the GPU's total "
                  "used memory.", "", "| step | server process (MiB) | GPU used (MiB) |", "|---|---|---|"]
        for rd in idle["readings"]:
            srv = rd.get("server_mib")
            srv_s = "n/a (no nvidia-smi)" if srv is None else (f"{srv}" if rd.get("server_listed") else "0 (not listed)")
            if rd["step"].startswith("before the server"):
                srv_s = "-"
            lines.append(f"| {rd['step']} | {srv_s} | {fmt(rd.get('gpu_used_mib'))} |")
        s = idle.get("summary", {})
        lines += ["", f"Requests (ms): first (load) {fmt(s.get('first_ms'))}, warm median {fmt(s.get('warm_median_ms'))}, "
                      f"after idle release (context re-created) {fmt(s.get('cold_after_release_ms'))}, warm after "
                      f"reload {fmt(s.get('warm_after_reload_median_ms'))}. Released "
                      f"{fmt(idle.get('released_after_idle_s'))} s after the last request; index after idle: "
                      f"{idle.get('index_after_idle')}; cold output equals the first: "
                      f"{idle.get('cold_output_matches_first')}.", ""]

    gt = r.get("gpu_tests") or {}
    if gt:
        lines += ["## GPU unit tests (bin/gpu_tests)", ""]
        if gt.get("status") == "not packed":
            lines.append("Not in the pack (the build had no bin/gpu_tests).")
        else:
            lines.append(f"exit {gt.get('rc')}: {gt.get('passed')} passed, {gt.get('failed')} failed, "
                         f"{gt.get('skipped')} skipped ({gt.get('seconds')} s)."
                         + (f" Failed: {', '.join(gt.get('failed_names', []))}" if gt.get("failed_names") else ""))
        lines.append("")

    ex = r.get("export") or {}
    if ex:
        bad = {k: v for k, v in ex.items() if not v.get("ok")}
        lines += ["## Export", "", f"{len(ex) - len(bad)}/{len(ex)} models exported "
                  f"({', '.join(sorted({str(v.get('exporter', '?')).split(' (')[0] for v in ex.values() if v.get('ok')}))})."]
        lines += [f"- {k}: {str(v.get('error'))[:300]}" for k, v in bad.items()]
        lines.append("")

    if r.get("problems"):
        lines += ["## Problems", ""] + [f"- {p}" for p in r["problems"][:80]]
        if len(r["problems"]) > 80:
            lines.append(f"- ... {len(r['problems']) - 80} more in gpu-check.json")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description="osprey device check phases (see scripts/gpu-check)")
    p.add_argument("--osprey", required=True)
    p.add_argument("--gpu-tests", default=None, help="packed GoogleTest binary (bin/gpu_tests), if any")
    p.add_argument("--out", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--zoo", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--deadline", type=float, default=0, help="epoch seconds by which everything has ended")
    p.add_argument("--models", default="resnet50,mobilenet_v2,mobilenet_v3_large,efficientnet_b0,densenet121,"
                                        "inception_v3,shufflenet_v2_x1_0,convnext_tiny,vit_b_16,regnet_y_400mf")
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--batches", default="1,32")
    p.add_argument("--precisions", default="fp32,fp16")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=0, help="timed runs (0: from --target-s, 10..100)")
    p.add_argument("--target-s", type=float, default=0.6, help="timed seconds per measurement when --iters is 0")
    p.add_argument("--idle-model", default="resnet50")
    p.add_argument("--idle-unload", type=float, default=3)
    p.add_argument("--export-jobs", type=int, default=4)
    p.add_argument("--cpu-threads", type=int, default=8, help="threads of the CPU reference runs")
    p.add_argument("--export-cap", type=float, default=200)
    p.add_argument("--gpu-tests-cap", type=float, default=120)
    p.add_argument("--idle-cap", type=float, default=60)
    p.add_argument("--correctness-cap", type=float, default=150)
    p.add_argument("--call-cap", type=float, default=90, help="most seconds one osprey or torch call may take")
    p.add_argument("--profile-cells", type=int, default=4,
                   help="profile phase: how many of the slowest cells (osprey/PyTorch) to profile per op")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--keep-going", action="store_true", help="run the phases even when osprey --version fails")
    p.add_argument("--meta", action="append", default=[], help="KEY=JSON added to meta (preflight facts)")
    args = p.parse_args()
    global CHILDREN_FILE
    CHILDREN_FILE = Path(args.work) / "children.pids"
    # Killed by the script's timeout: SIGTERM becomes SystemExit, so the phases' finally blocks stop their servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    check = Check(args)
    for kv in args.meta:
        k, _, v = kv.partition("=")
        try:
            check.r["meta"][k] = json.loads(v)
        except ValueError:
            check.r["meta"][k] = v
    rc, out, err, _ = run([args.osprey, "--version"], 20, env=osprey_env())
    check.r["meta"]["osprey_version"] = (out or err).strip()[:200]
    if rc != 0 and not args.keep_going:
        check.problem("osprey", f"`osprey --version` fails (exit {rc}): {tail((err or out).strip(), 600)}; stopped "
                                "before the phases so the lease is not spent (--keep-going runs them anyway)")
        for phase in check.phases:
            check.r["phases"][phase] = {"status": "skipped", "note": "osprey does not start"}
        check.save()
        return 3
    if not args.dry_run:
        rc, out, _, _ = run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                             "--format=csv,noheader,nounits"], 20)
        if rc == 0 and out.strip():
            parts = [x.strip() for x in out.strip().splitlines()[0].split(",")]
            check.r["meta"]["gpu"] = dict(zip(["name", "driver", "memory_total_mib"], parts))
    return check.run_all()


if __name__ == "__main__":
    sys.exit(main())
