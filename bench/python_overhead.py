"""Per-call overhead from Python: osprey.Model.run vs onnxruntime.InferenceSession.run on a tiny model (y = x + 1,
x float32 [1, 4]), same process, alternating rounds. Prints microseconds per call (median of rounds) and the ratio
osprey/ORT (below 1: osprey's call is cheaper). Usage: .venv/bin/python bench/python_overhead.py [--calls N]"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "build" / "python"))
sys.path.insert(0, str(REPO / "tests" / "python"))
import onnx_models  # noqa: E402
import osprey  # noqa: E402


def per_call_us(fn, calls):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000, help="calls per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    data = onnx_models.add_one(shape=(1, 4))
    x = np.ones((1, 4), dtype=np.float32)
    model = osprey.Model(data, threads=1)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    feeds = {"x": x}
    assert np.array_equal(model.run(feeds)["y"], session.run(None, feeds)[0])
    ours, theirs = [], []
    for _ in range(args.rounds):
        ours.append(per_call_us(lambda: model.run(feeds), args.calls))
        theirs.append(per_call_us(lambda: session.run(None, feeds), args.calls))
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"osprey {osprey.__version__}  Model.run                {o:8.2f} us/call")
    print(f"onnxruntime {ort.__version__}  InferenceSession.run  {t:8.2f} us/call")
    print(f"ratio osprey/ORT {o / t:.3f}  ({args.rounds} rounds x {args.calls} calls, medians)")


if __name__ == "__main__":
    main()
