#!/usr/bin/env python3
"""Export Keras applications (and four recurrent Keras models) to ONNX with tf2onnx: issue 11's TensorFlow set.

Usage: .venv-tf/bin/python tools/export_keras.py [--models a,b,...] [--opsets 13,17] [--int8] [--out DIR] [--force]

Needs a venv with TensorFlow and tf2onnx (`python3 -m venv .venv-tf && .venv-tf/bin/pip install tensorflow-cpu tf2onnx
onnxruntime`). Each model is built with `weights=None` (this machine reaches no weight download) and a fixed seed,
so the export is the same architecture and the same random weights every time; it is traced as a tf.function with a
dynamic batch dim (NHWC input `input:0`, as Keras defines it) and converted by tf2onnx, which emits what TF models
bring: Transposes around convolutions, explicit Pads for "same" padding with stride 2, BatchNorm as Mul/Add, ReLU6 as
Clip, Sigmoid/HardSwish, Erf GELU. Written to DIR/<name>.opset<k>.onnx (DIR: $OSPREY_MODEL_CACHE/../keras, default
~/.cache/osprey/keras) and skipped when present. With onnxruntime installed, each export is checked against Keras's
own output on one random batch.

`--int8`: the other way TensorFlow models reach ONNX quantised: each model (logits, no softmax) through TFLite's
full-integer quantisation (TFLiteConverter, Optimize.DEFAULT, TFLITE_BUILTINS_INT8, 8 random calibration images in
[-1, 1]; per-channel int8 weights, int8 activations with zero points) and then tf2onnx --tflite (opset 17, QDQ form:
QuantizeLinear / DequantizeLinear around float ops), batch 1. Written to DIR/<name>.int8.onnx.

Besides the applications, nine models written for this set (WRITTEN; not in the default list, which `bench/keras`
times as the applications; `bench/keras --models crnn_lstm,... --opsets 17` times them; float only, no `--int8`):
- a CRNN text-line recogniser (32 x 128 grey input, three Conv3x3 + ReLU + MaxPool at 64 / 128 / 256 channels, the
  width as time: 32 steps of 1024 features, two Bidirectional LSTM or GRU of 256, Dense(97) softmax): crnn_lstm,
  crnn_gru; a text classifier (64 int32 token ids, Embedding(5000, 128), one LSTM or GRU of 512, Dense(4)):
  text_lstm, text_gru. tf2onnx writes Keras's LSTM as ONNX LSTM, its GRU (reset_after=True) as a Loop;
- vit_tiny: 16x16 patches of 224 x 224 as a Conv2D of 192, a learned position embedding, four pre-norm blocks
  (LayerNormalization, MultiHeadAttention of 3 heads x 64, Dense(768) with GELU's tanh form, Dense(192)), mean pool,
  Dense(1000); text_transformer: 128 int32 tokens, Embedding(8000, 256) + position, two post-norm blocks (4 heads x
  64, ReLU MLP of 1024), mean pool, Dense(4). tf2onnx writes Keras 3's LayerNormalization as its moments
  (GlobalAveragePool on [N, T, C]) and x * inv + (-mean * inv + beta), MultiHeadAttention's einsums as
  Transpose/Reshape/MatMul, GELU as Pow(x, 3) ... Tanh. (Keras's exact GELU arrives as Erfc, which tf2onnx 1.17
  cannot convert.) LayerNormalization gets random gamma and beta, as a trained one has;
- kws_conv1d: a keyword spotter on 16000 samples: Conv1D(64, 80, stride 4) + BatchNorm + ReLU, MaxPool1D(4), four
  SeparableConv1D (64 / 128 / 128 / 256, kernel 3, dilation 1 / 2 / 4 / 8) + BatchNorm + swish, Conv1D(256, 3,
  stride 2) + ReLU, global max pool, Dense(12). tf2onnx writes each 1-D layer as a [N, C, 1, W] Conv between
  Unsqueeze/Transpose and Squeeze/Transpose;
- video_3d: 16 frames of 112 x 112 x 3 (NDHWC): Conv3D(32, 3, stride 1 x 2 x 2) + BatchNorm + ReLU, MaxPooling3D
  (1, 3, 3), two (2+1)-D blocks (1 x 3 x 3 then 3 x 1 x 1 Conv3D with BatchNorm, a strided 1 x 1 x 1 projection added),
  AveragePooling3D(2), global average, Dense(400); unet_3d: a 32 x 64 x 64 x 1 volume, a 3-D U-Net of two levels
  (Conv3D + BatchNorm + ReLU pairs at 16 / 32 / 64 channels, MaxPooling3D(2), UpSampling3D(2) and Conv3DTranspose(2,
  stride 2) up, skip Concatenates), a 1 x 1 x 1 Conv3D with a voxel softmax. tf2onnx writes one NDHWC -> NCDHW
  Transpose at the input and UpSampling3D as Tile / Reshape / Slice.
"""

import argparse
import os
import sys
import time
from pathlib import Path

# name -> (keras.applications constructor, input size)
MODELS = {
    "mobilenet_v2": ("MobileNetV2", 224),
    "mobilenet_v3_small": ("MobileNetV3Small", 224),
    "mobilenet_v3_large": ("MobileNetV3Large", 224),
    "efficientnet_b0": ("EfficientNetB0", 224),
    "convnext_tiny": ("ConvNeXtTiny", 224),
    "resnet50": ("ResNet50", 224),
    "densenet121": ("DenseNet121", 224),
    "nasnet_mobile": ("NASNetMobile", 224),
    "xception": ("Xception", 299),
    "inception_v3": ("InceptionV3", 299),
    "resnet50_v2": ("ResNet50V2", 224),
    "efficientnet_v2_b0": ("EfficientNetV2B0", 224),
    "efficientnet_b1": ("EfficientNetB1", 240),
    "mobilenet": ("MobileNet", 224),
}


def _crnn(keras, cell):
    inp = keras.Input((32, 128, 1), name="input")
    x = inp
    for channels, pool in ((64, (2, 2)), (128, (2, 2)), (256, (2, 1))):
        x = keras.layers.Conv2D(channels, 3, padding="same", activation="relu")(x)
        x = keras.layers.MaxPooling2D(pool)(x)
    x = keras.layers.Permute((2, 1, 3))(x)  # [N, W=32, H=4, C=256]: the width is time
    x = keras.layers.Reshape((32, 4 * 256))(x)
    for _ in range(2):
        x = keras.layers.Bidirectional(getattr(keras.layers, cell)(256, return_sequences=True))(x)
    return keras.Model(inp, keras.layers.Dense(97, activation="softmax")(x))


def _text(keras, cell):
    inp = keras.Input((64,), dtype="int32", name="input")
    x = keras.layers.Embedding(5000, 128)(inp)
    x = getattr(keras.layers, cell)(512)(x)
    return keras.Model(inp, keras.layers.Dense(4)(x))


def _layer_norm(keras, **kw):
    return keras.layers.LayerNormalization(gamma_initializer=keras.initializers.RandomNormal(1.0, 0.1),
                                           beta_initializer=keras.initializers.RandomNormal(0.0, 0.1), **kw)


def _encoder_block(keras, x, heads, ff, pre_norm):
    layers, width = keras.layers, x.shape[-1]
    if pre_norm:
        y = _layer_norm(keras, epsilon=1e-6)(x)
        x = layers.Add()([x, layers.MultiHeadAttention(heads, 64)(y, y)])
        y = layers.Dense(ff)(_layer_norm(keras, epsilon=1e-6)(x))
        y = layers.Activation(lambda t: keras.activations.gelu(t, approximate=True))(y)
        return layers.Add()([x, layers.Dense(width)(y)])
    x = _layer_norm(keras)(layers.Add()([x, layers.MultiHeadAttention(heads, 64)(x, x)]))
    y = layers.Dense(width)(layers.Dense(ff, activation="relu")(x))
    return _layer_norm(keras)(layers.Add()([x, y]))


def _position_embedding(keras, x):
    class PositionEmbedding(keras.layers.Layer):
        def build(self, shape):
            self.table = self.add_weight(shape=(1,) + tuple(shape[1:]), initializer="random_normal")

        def call(self, v):
            return v + self.table

    return PositionEmbedding()(x)


def _vit_tiny(keras):
    inp = keras.Input((224, 224, 3), name="input")
    x = keras.layers.Reshape((196, 192))(keras.layers.Conv2D(192, 16, strides=16)(inp))
    x = _position_embedding(keras, x)
    for _ in range(4):
        x = _encoder_block(keras, x, 3, 768, True)
    x = keras.layers.GlobalAveragePooling1D()(_layer_norm(keras, epsilon=1e-6)(x))
    return keras.Model(inp, keras.layers.Dense(1000)(x))


def _text_transformer(keras):
    inp = keras.Input((128,), dtype="int32", name="input")
    x = _position_embedding(keras, keras.layers.Embedding(8000, 256)(inp))
    for _ in range(2):
        x = _encoder_block(keras, x, 4, 1024, False)
    return keras.Model(inp, keras.layers.Dense(4)(keras.layers.GlobalAveragePooling1D()(x)))


def _kws_conv1d(keras):
    layers = keras.layers
    inp = keras.Input((16000, 1), name="input")
    x = layers.Conv1D(64, 80, strides=4, padding="same")(inp)
    x = layers.MaxPooling1D(4)(layers.ReLU()(layers.BatchNormalization()(x)))
    for channels, dilation in ((64, 1), (128, 2), (128, 4), (256, 8)):
        x = layers.SeparableConv1D(channels, 3, padding="same", dilation_rate=dilation)(x)
        x = layers.Activation("swish")(layers.BatchNormalization()(x))
    x = layers.Conv1D(256, 3, strides=2, padding="same", activation="relu")(x)
    return keras.Model(inp, layers.Dense(12)(layers.GlobalMaxPooling1D()(x)))


def _video_3d(keras):
    """A small video classifier in Keras' channels-last 3-D layers: a full 3x3x3 stem, (2+1)-D factorised blocks with a
    residual, 3-D pools and a global average."""
    layers = keras.layers
    inp = keras.Input((16, 112, 112, 3), name="input")
    x = layers.Conv3D(32, 3, strides=(1, 2, 2), padding="same", use_bias=False)(inp)
    x = layers.ReLU()(layers.BatchNormalization()(x))
    x = layers.MaxPooling3D((1, 3, 3), strides=(1, 2, 2), padding="same")(x)
    for channels, stride in ((64, 1), (128, 2)):
        y = layers.Conv3D(channels, (1, 3, 3), strides=(1, stride, stride), padding="same", use_bias=False)(x)
        y = layers.ReLU()(layers.BatchNormalization()(y))
        y = layers.Conv3D(channels, (3, 1, 1), strides=(stride, 1, 1), padding="same", use_bias=False)(y)
        y = layers.BatchNormalization()(y)
        skip = layers.Conv3D(channels, 1, strides=stride, use_bias=False)(x)
        x = layers.ReLU()(layers.Add()([y, layers.BatchNormalization()(skip)]))
    x = layers.AveragePooling3D((2, 2, 2))(x)
    x = layers.GlobalAveragePooling3D()(x)
    return keras.Model(inp, layers.Dense(400)(x))


def _unet_3d(keras):
    """A small 3-D segmentation U-Net (medical volumes, channels last): Conv3D / BN / ReLU, MaxPooling3D,
    UpSampling3D and Conv3DTranspose, skip concatenations, a per-voxel softmax."""
    layers = keras.layers

    def block(x, channels):
        for _ in range(2):
            x = layers.Conv3D(channels, 3, padding="same", use_bias=False)(x)
            x = layers.ReLU()(layers.BatchNormalization()(x))
        return x

    inp = keras.Input((32, 64, 64, 1), name="input")
    e1 = block(inp, 16)
    e2 = block(layers.MaxPooling3D(2)(e1), 32)
    b = block(layers.MaxPooling3D(2)(e2), 64)
    d2 = block(layers.Concatenate()([layers.UpSampling3D(2)(b), e2]), 32)
    d1 = block(layers.Concatenate()([layers.Conv3DTranspose(16, 2, strides=2)(d2), e1]), 16)
    return keras.Model(inp, layers.Conv3D(3, 1, activation="softmax")(d1))


# name -> (builder(keras), input shape without the batch, input dtype)
WRITTEN = {
    "crnn_lstm": (lambda keras: _crnn(keras, "LSTM"), (32, 128, 1), "float32"),
    "crnn_gru": (lambda keras: _crnn(keras, "GRU"), (32, 128, 1), "float32"),
    "text_lstm": (lambda keras: _text(keras, "LSTM"), (64,), "int32"),
    "text_gru": (lambda keras: _text(keras, "GRU"), (64,), "int32"),
    "vit_tiny": (_vit_tiny, (224, 224, 3), "float32"),
    "text_transformer": (_text_transformer, (128,), "int32"),
    "kws_conv1d": (_kws_conv1d, (16000, 1), "float32"),
    "video_3d": (_video_3d, (16, 112, 112, 3), "float32"),
    "unet_3d": (_unet_3d, (32, 64, 64, 1), "float32"),
}
# ConvNeXtTiny does not convert with TF 2.21 / tf2onnx 1.17 (nested StatefulPartitionedCall left after freezing, Erfc).
DEFAULT_MODELS = ["mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0", "resnet50",
                  "mobilenet", "densenet121", "nasnet_mobile", "xception", "inception_v3", "resnet50_v2",
                  "efficientnet_v2_b0", "efficientnet_b1"]
SEED = 11


def default_dir():
    cache = os.environ.get("OSPREY_MODEL_CACHE")
    base = Path(cache).parent if cache else Path.home() / ".cache" / "osprey"
    return base / "keras"


def model_path(out_dir, name, opset):
    return Path(out_dir) / f"{name}.opset{opset}.onnx"


def int8_path(out_dir, name):
    return Path(out_dir) / f"{name}.int8.onnx"


def export_int8(name, out_dir, force=False):
    path = int8_path(out_dir, name)
    if path.exists() and not force:
        return path
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import subprocess
    import numpy as np
    import tensorflow as tf
    import keras

    ctor, size = MODELS[name]
    keras.utils.set_random_seed(SEED)
    model = getattr(keras.applications, ctor)(weights=None, input_shape=(size, size, 3), classifier_activation=None)

    def calibration():
        rng = np.random.default_rng(0)
        for _ in range(8):
            yield [rng.uniform(-1, 1, (1, size, size, 3)).astype(np.float32)]

    start = time.perf_counter()
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = calibration
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    path.parent.mkdir(parents=True, exist_ok=True)
    tflite = path.with_suffix(".tflite")
    tflite.write_bytes(converter.convert())
    tmp = path.with_suffix(".tmp")
    subprocess.run([sys.executable, "-m", "tf2onnx.convert", "--tflite", str(tflite), "--output", str(tmp), "--opset",
                    "17"], check=True, capture_output=True)
    os.replace(tmp, path)
    print(f"{path}: exported in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return path


def export(name, opset, out_dir, force=False):
    path = model_path(out_dir, name, opset)
    if path.exists() and not force:
        return path
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    import keras
    import tf2onnx

    keras.utils.set_random_seed(SEED)
    if name in WRITTEN:
        build, shape, dtype = WRITTEN[name]
        model = build(keras)
    else:
        ctor, size = MODELS[name]
        model = getattr(keras.applications, ctor)(weights=None, input_shape=(size, size, 3))
        shape, dtype = (size, size, 3), "float32"
    spec = (tf.TensorSpec((None,) + shape, dtype, name="input"),)

    @tf.function(input_signature=spec)
    def forward(x):
        return model(x, training=False)

    start = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    if name in WRITTEN:
        # from_function keeps the layers' while loops whole, which tf2onnx rewrites to LSTM (or a Loop); the frozen
        # graph_def below is not readable by ONNX Runtime for these ("Invalid tensor data type 0").
        tf2onnx.convert.from_function(forward, input_signature=spec, opset=opset, output_path=str(tmp))
    else:
        # Freeze first: from_function leaves constants Keras captures from Python (EfficientNet's normalisation mean
        # and variance) as graph inputs.
        from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

        frozen = convert_variables_to_constants_v2(forward.get_concrete_function())
        tf2onnx.convert.from_graph_def(frozen.graph.as_graph_def(), input_names=[t.name for t in frozen.inputs],
                                       output_names=[t.name for t in frozen.outputs], opset=opset,
                                       output_path=str(tmp))
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    if ort is not None:
        rng = np.random.default_rng(0)
        x = rng.integers(0, 5000, (2,) + shape).astype(dtype) if dtype == "int32" else \
            rng.uniform(0, 255, (2,) + shape).astype(np.float32)
        want = forward(tf.constant(x)).numpy()
        session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
        got = session.run(None, {session.get_inputs()[0].name: x})[0]
        err = float(np.max(np.abs(got - want)))
        if err > 1e-3 * max(1.0, float(np.max(np.abs(want)))):
            raise RuntimeError(f"{name}: ONNX Runtime differs from Keras by {err}")
    os.replace(tmp, path)
    print(f"{path}: exported in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS),
                        help="comma list of " + ",".join(list(MODELS) + list(WRITTEN)))
    parser.add_argument("--opsets", default="13")
    parser.add_argument("--out", default=str(default_dir()))
    parser.add_argument("--int8", action="store_true", help="full-integer TFLite through tf2onnx --tflite instead")
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    for name in [m for m in args.models.split(",") if m]:
        if name not in MODELS and name not in WRITTEN:
            parser.error(f"unknown model {name}")
        if args.int8 and name in WRITTEN:
            parser.error(f"{name}: --int8 is for the applications only")
        if args.int8:
            print(export_int8(name, args.out, args.force))
            continue
        for opset in [int(o) for o in args.opsets.split(",") if o]:
            print(export(name, opset, args.out, args.force))


if __name__ == "__main__":
    main()
