#!/usr/bin/env python3
"""Exports tests/e2e/data/tf2onnx_map_fn_while.onnx: TensorFlow control flow as tf2onnx writes it (two ONNX Loops).

A tf.function over x [N, 8, 8, 3]: tf.map_fn standardises each image (a Loop whose trip count tf2onnx computes from
the input's shape, with a scan output), then a tf.while_loop runs `relu(v * 0.5 + 0.1)` while i < 3 (a Loop with no
trip count whose condition the body computes). Needs .venv-tf (tensorflow-cpu, tf2onnx; see bench/README.md):
    .venv-tf/bin/python tools/export_tf_loops.py
Made with TensorFlow 2.21 and tf2onnx 1.17, opset 13. The committed file is what the test reads; this script is how
it was made.
"""

import sys
from pathlib import Path

import tensorflow as tf
import tf2onnx

OUT = Path(__file__).resolve().parent.parent / "tests" / "e2e" / "data" / "tf2onnx_map_fn_while.onnx"


@tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 3], tf.float32, name="x")])
def per_image(x):
    y = tf.map_fn(lambda im: (im - tf.reduce_mean(im)) / (tf.math.reduce_std(im) + 1e-3), x)
    i = tf.constant(0)

    def cond(i, v):
        return i < 3

    def body(i, v):
        return i + 1, tf.nn.relu(v * 0.5 + 0.1)

    _, z = tf.while_loop(cond, body, [i, y])
    return tf.identity(z, name="y")


def main() -> int:
    model, _ = tf2onnx.convert.from_function(per_image, input_signature=per_image.input_signature, opset=13,
                                             output_path=str(OUT))
    print(f"{OUT}: ops {sorted({n.op_type for n in model.graph.node})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
