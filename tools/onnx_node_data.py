#!/usr/bin/env python3
"""Writes the ONNX backend node tests' data (model.onnx and test_data_set_*/ per test) of the installed onnx package.

onnx wheels up to 1.18 ship this data in onnx/backend/test/data/node; newer ones ship only the test cases' generators
(onnx/backend/test/case/node), which this runs. The conformance suite (tests/conformance) reads the data from there,
so by default it is written into that directory of the running Python's onnx, and nothing is done when it is already
present. scripts/setup runs it in .venv-onnx (the newest onnx and ONNX Runtime).

Usage: .venv-onnx/bin/python tools/onnx_node_data.py [--out DIR] [--force]
"""

import argparse
import os
import sys
import time
import warnings
from pathlib import Path


def main(argv=None) -> int:
    import onnx

    default = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default, help="default: %(default)s")
    parser.add_argument("--force", action="store_true", help="write again even if the directory holds tests")
    args = parser.parse_args(argv)
    if not args.force and args.out.is_dir() and any(args.out.glob("test_*/model.onnx")):
        print(f"onnx_node_data: {args.out} already holds the node tests of onnx {onnx.__version__}")
        return 0
    start = time.monotonic()
    from onnx.backend.test import cmd_tools
    import onnx.backend.test.case.model as model_cases
    import onnx.backend.test.case.node as node_cases

    # cmd_tools.generate_data writes <out>/<kind>/<name> for the cases model_cases.collect_testcases returns; given
    # the node cases (kind "node") and the parent directory, it writes exactly the layout older wheels ship.
    model_cases.collect_testcases = node_cases.collect_testcases
    tmp = args.out.parent / (args.out.name + ".tmp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators' own numpy warnings (log(0), 1/0 on purpose)
        cmd_tools.generate_data(argparse.Namespace(output=str(tmp)))
    written = tmp / "node"
    if not written.is_dir():
        print(f"onnx_node_data: onnx {onnx.__version__} generated no node tests", file=sys.stderr)
        return 1
    if args.out.exists():
        import shutil

        shutil.rmtree(args.out)
    os.replace(written, args.out)
    os.rmdir(tmp)
    count = sum(1 for _ in args.out.glob("test_*/model.onnx"))
    print(f"onnx_node_data: {count} node tests of onnx {onnx.__version__} in {args.out} "
          f"({time.monotonic() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
