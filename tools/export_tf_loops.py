#!/usr/bin/env python3
"""Exports tests/e2e/data/tf2onnx_map_fn_while.onnx: TensorFlow control flow as tf2onnx writes it (two ONNX Loops),
tests/e2e/data/tf2onnx_map_fn_nms.onnx: a per-class non-max suppression as TensorFlow detectors write it, and
tests/e2e/data/tf2onnx_padded_nms.onnx: tf.image.non_max_suppression_padded (TensorFlow's own NMS in while loops).

A tf.function over x [N, 8, 8, 3]: tf.map_fn standardises each image (a Loop whose trip count tf2onnx computes from
the input's shape, with a scan output), then a tf.while_loop runs `relu(v * 0.5 + 0.1)` while i < 3 (a Loop with no
trip count whose condition the body computes). Needs .venv-tf (tensorflow-cpu, tf2onnx; see bench/README.md):
    .venv-tf/bin/python tools/export_tf_loops.py
Made with TensorFlow 2.21 and tf2onnx 1.17, opset 13. The committed file is what the test reads; this script is how
it was made.

The second (opset 17): boxes [100, 4] and scores [100, 3]; tf.map_fn over the three classes runs
tf.image.non_max_suppression (at most 10 kept, IoU 0.5, score 0.3) on each class's scores and pads the kept scores to
10: a Loop whose body carries its own counter and holds a NonMaxSuppression (runtime/segments.cc cuts there).

The third (opset 17): boxes [200, 4], scores [200]; tf.image.non_max_suppression_padded (at most 25, IoU 0.5, score
0.2, padded): nested Loops whose conditions follow the boxes (the host runs them per iteration).
"""

import sys
from pathlib import Path

import tensorflow as tf
import tf2onnx

DATA = Path(__file__).resolve().parent.parent / "tests" / "e2e" / "data"
OUT = DATA / "tf2onnx_map_fn_while.onnx"
OUT_NMS = DATA / "tf2onnx_map_fn_nms.onnx"
OUT_PADDED = DATA / "tf2onnx_padded_nms.onnx"


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


@tf.function(input_signature=[tf.TensorSpec([100, 4], tf.float32, name="boxes"),
                              tf.TensorSpec([100, 3], tf.float32, name="scores")])
def per_class_nms(boxes, scores):
    def one_class(c):
        s = scores[:, c]
        kept = tf.gather(s, tf.image.non_max_suppression(boxes, s, max_output_size=10, iou_threshold=0.5,
                                                         score_threshold=0.3))
        return tf.pad(kept, [[0, 10 - tf.shape(kept)[0]]])

    return tf.identity(tf.map_fn(one_class, tf.range(3), fn_output_signature=tf.float32), name="kept")


@tf.function(input_signature=[tf.TensorSpec([200, 4], tf.float32, name="boxes"),
                              tf.TensorSpec([200], tf.float32, name="scores")])
def padded_nms(boxes, scores):
    selected, valid = tf.image.non_max_suppression_padded(boxes, scores, max_output_size=25, iou_threshold=0.5,
                                                          score_threshold=0.2, pad_to_max_output_size=True)
    return tf.identity(selected, name="selected"), tf.identity(valid, name="valid")


def main() -> int:
    model, _ = tf2onnx.convert.from_function(per_image, input_signature=per_image.input_signature, opset=13,
                                             output_path=str(OUT))
    print(f"{OUT}: ops {sorted({n.op_type for n in model.graph.node})}")
    model, _ = tf2onnx.convert.from_function(per_class_nms, input_signature=per_class_nms.input_signature, opset=17,
                                             output_path=str(OUT_NMS))
    print(f"{OUT_NMS}: ops {sorted({n.op_type for n in model.graph.node})}")
    model, _ = tf2onnx.convert.from_function(padded_nms, input_signature=padded_nms.input_signature, opset=17,
                                             output_path=str(OUT_PADDED))
    print(f"{OUT_PADDED}: ops {sorted({n.op_type for n in model.graph.node})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
