"""Implementation choices timed under CPU load are provisional: used, marked in the tuning cache, and timed again.

The kernels time oneDNN's implementations at build time and remember the fastest in a cache file
($OSPREY_TUNE_CACHE; dnnl_common.cc). A timing taken while other processes compete for the CPUs can pick a slower
implementation, and a cache would keep it forever. These tests run the real binary beside real CPU-bound processes
(more spinners than cores, so this process's threads must wait for a CPU) and read the cache file it wrote.

Oracle: the file's lines (`hash position name candidates [provisional]`). Under load most carry "provisional" (a
timing shorter than a time slice may still run undisturbed); a later process re-times exactly the provisional ones
(it appends a line for each such hash again); a file of final lines is not extended.
"""

import multiprocessing
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def spin():
    while True:
        pass


def bench(osprey_bin, model, cache: Path):
    env = dict(os.environ, OSPREY_TUNE_CACHE=str(cache), OMP_NUM_THREADS="2")
    r = subprocess.run([str(osprey_bin), "bench", str(model), "--iters", "1", "--warmup", "0", "--threads", "2"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r


def lines(cache: Path):
    return [line.split() for line in cache.read_text().splitlines() if line.strip()]


@pytest.mark.skipif(not Path("/proc/self/schedstat").exists(),
                    reason="this kernel does not expose schedstat (CONFIG_SCHED_INFO); the tuner then trusts timings")
def test_choices_timed_under_load_are_provisional_and_timed_again(osprey_bin, ensure_model, tmp_path):
    model = ensure_model("mobilenet_v2")["onnx"]  # 52 convolutions and a Gemm: 53 timings
    cache = tmp_path / "tuning.tsv"
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(2 * (os.cpu_count() or 2))]
    for p in spinners:
        p.start()
    try:
        bench(osprey_bin, model, cache)
    finally:
        for p in spinners:
            p.kill()
            p.join()
    under_load = lines(cache)
    assert len(under_load) >= 20, cache.read_text()
    # A timing shorter than a time slice may run undisturbed even so; most do not.
    provisional = {f[0] for f in under_load if f[-1] == "provisional"}
    assert len(provisional) >= len(under_load) // 4, cache.read_text()

    # A later process times every provisional choice again (whatever the load now: each hash gets a new line), and
    # no final one.
    bench(osprey_bin, model, cache)
    after = lines(cache)
    again = {f[0] for f in after[len(under_load):]}
    assert again == provisional, cache.read_text()

    # Final choices are trusted: a file holding only them is not extended.
    final = tmp_path / "final.tsv"
    final.write_text("".join(" ".join(f[:4]) + "\n" for f in after))
    bench(osprey_bin, model, final)
    assert len(lines(final)) == len(after), final.read_text()
