"""osprey: an inference engine, image decoder and augmentation tool for image models.

    import osprey
    model = osprey.Model("resnet50.onnx", threads=2)
    probs = model.run({"input": batch})["output"]          # NumPy in, NumPy out
    image = osprey.decode("photo.jpg")                       # uint8 [H, W, 3]
    osprey.classify("models/resnet50", ["photo.jpg"], top_k=3)

    from osprey.augment import Pipeline
    pipe = Pipeline.load("pipeline.json")                    # osprey's or Albumentations' JSON
    out = pipe(image=image, bboxes=boxes, category_ids=ids)

Errors are raised as subclasses of `osprey.Error` (InvalidArgument, NotFound, Unsupported, ResourceExhausted, ...),
each also a subclass of the matching builtin (ValueError, FileNotFoundError, NotImplementedError, MemoryError), with
the message the command line prints.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union


def _omp_wait_default() -> Optional[str]:
    """Sets osprey's default OpenMP wait policy (docs/performance.md) for the libgomp the native module is about to
    load, when the user set neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT and no libgomp is loaded yet (libgomp reads its
    environment once, at load). Returns the variable it set (removed again once the module is loaded, so child
    processes see the user's environment), or None."""
    if os.environ.get("OSPREY_OMP_DEFAULT") == "0" or "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return None
    try:
        with open("/proc/self/maps") as maps:
            if any("/libgomp" in line for line in maps):
                return None  # already initialised (by another package): too late to change it
    except OSError:
        return None
    os.environ["GOMP_SPINCOUNT"] = "1000"  # as the binaries (src/cli/omp_env.h)
    return "GOMP_SPINCOUNT"


_omp_set = _omp_wait_default()
try:
    from . import _osprey
finally:
    if _omp_set is not None:
        os.environ.pop(_omp_set, None)
from ._osprey import (Cancelled, DeadlineExceeded, Error, Internal, InvalidArgument, NotFound,  # noqa: F401,E402
                      ResourceExhausted, RunOptions, Unavailable, Unsupported)

__version__: str = _osprey.__version__

PathLike = Union[str, "os.PathLike[str]"]
Dim = Union[int, str, None]


class TensorInfo(NamedTuple):
    """A model input or output: its name, NumPy dtype name and shape (ints, symbolic names, or None when unknown)."""
    name: str
    dtype: str
    shape: Optional[Tuple[Dim, ...]]


class Model:
    """An ONNX model compiled for this machine (its CPU, or a GPU).

    `source` is a `.onnx` file, a model directory (`<name>` or `<name>/<version>`, docs/model-directory.md) or the
    bytes of a serialized ONNX model. `threads` is the number of threads one run uses (0 = all cores); `precision` is
    "fp32", "bf16" (Conv/Gemm/MatMul in bfloat16 where that measures faster, CPUs with AVX512_BF16), "auto" (bf16 where
    the CPU has it and it is faster, else fp32) or "fp16" (GPU); `device` is "cpu", "cuda"
    or "cuda:N" (an osprey built with CUDA, on a machine with an NVIDIA GPU; ops without a CUDA kernel run on the CPU).

    `run` is safe to call from several Python threads at once (the GIL is released while it runs). A plan is compiled
    on the first run of each input shape and cached.
    """

    def __init__(self, source: Union[PathLike, bytes], threads: int = 0, precision: str = "fp32",
                 device: str = "cpu") -> None:
        self._model = _osprey.Model(source, threads, precision, device)

    def run(self, *inputs: Any, run_options: Optional[RunOptions] = None, **named: Any) -> Dict[str, Any]:
        """Runs the model; returns {output name: numpy.ndarray} in the model's output order.

        Inputs: one dict {name: array}, arrays in the model's input order (positional, or one list), or name=array
        keywords. C-contiguous arrays of the right dtype are read in place; anything else NumPy can convert is
        converted once. Output arrays own osprey's buffers (no copy).

        `run_options` (an `osprey.RunOptions`): a `timeout` in seconds, and `terminate`, which another thread may set
        while the run is in progress; the run then stops before its next step and raises `osprey.DeadlineExceeded`
        (a TimeoutError) or `osprey.Cancelled`. A first run of a new input shape compiles before it runs steps: the
        compile is not interrupted. (A model input named "run_options" is given in the dict form.)
        """
        if run_options is None:
            return self._model.run(*inputs, **named)
        return self._model.run_with(run_options, *inputs, **named)

    __call__ = run

    @property
    def inputs(self) -> List[TensorInfo]:
        """The graph inputs (name, dtype, shape)."""
        return [TensorInfo(*i) for i in self._model.infos(False)]

    @property
    def outputs(self) -> List[TensorInfo]:
        """The graph outputs (name, dtype, shape)."""
        return [TensorInfo(*i) for i in self._model.infos(True)]

    def inspect(self) -> str:
        """The summary `osprey inspect` prints: inputs, outputs, op histogram, parameters (and preprocessing)."""
        return self._model.inspect()

    def memory(self) -> Dict[str, int]:
        """Bytes this model holds: weight_bytes, shared_weight_bytes (also held by another model), runtime_bytes
        (host: arenas, plan-private constants, the heap its plans' objects keep, measured at each plan's first run) and device_bytes (GPU: device arenas, weights' device copies)."""
        return dict(self._model.memory())

    def metadata(self) -> Dict[str, Any]:
        """What the ONNX file says about the model: producer_name, producer_version, graph_name, graph_description,
        domain, description, version, and custom_metadata_map (its metadata_props: {key: value})."""
        return dict(self._model.metadata())

    def __repr__(self) -> str:
        ins = ", ".join(f"{i.name}: {i.dtype}{list(i.shape) if i.shape is not None else '[?]'}" for i in self.inputs)
        return f"osprey.Model({self._model.path or '<bytes>'!s}; inputs {ins})"


def load_onnx(path: Union[PathLike, bytes], threads: int = 0, precision: str = "fp32",
              device: str = "cpu") -> Model:
    """Loads an ONNX model (file, model directory or bytes); the same as `Model(...)`."""
    return Model(path, threads=threads, precision=precision, device=device)


def decode(source: Union[PathLike, bytes, bytearray, memoryview], channels: int = 3,
           min_size: Optional[Tuple[int, int]] = None, max_pixels: int = 0) -> Any:
    """Decodes a JPEG, PNG, WebP or BMP image (a path or the encoded bytes) into a uint8 [H, W, channels] array.

    channels: 3 (RGB), 1 (gray) or 4 (RGBA). min_size=(width, height) lets JPEG decode at 1/2, 1/4 or 1/8 scale in
    the DCT domain while the result stays at least that large. max_pixels (default 100 million) refuses larger images
    before allocating. The EXIF orientation of JPEGs is applied. Raises osprey.InvalidArgument for broken files.
    """
    return _osprey.decode(source, channels, min_size, max_pixels)


class ClassScore(NamedTuple):
    """One class of a classification: index, label (labels.txt, or the index as text) and probability."""
    index: int
    label: str
    probability: float


class Classifier:
    """A model directory ready to classify images: its preprocessing (config.json, or derived from the input shape),
    the model, softmax and top-k, as `osprey classify` does."""

    def __init__(self, model_dir: PathLike, threads: int = 0, batch_size: int = 32) -> None:
        self._classifier = _osprey.Classifier(model_dir, threads, batch_size)

    def classify(self, images: Sequence[Union[PathLike, bytes, Any]], top_k: Optional[int] = None
                 ) -> List[List[ClassScore]]:
        """Top-k classes per image. Each image is a path, encoded bytes, or a decoded uint8 [H, W, C] RGB array."""
        if isinstance(images, (str, bytes, os.PathLike)) or getattr(images, "ndim", 0) == 3:
            images = [images]
        results = self._classifier.classify(list(images), int(top_k or 0))
        return [[ClassScore(*c) for c in r] for r in results]

    def preprocess(self, image: Any) -> Any:
        """The model's preprocessing of one decoded uint8 [H, W, C] image: a float32 array ([C, h, w] for NCHW)."""
        return self._classifier.preprocess(image)

    __call__ = preprocess

    @property
    def labels(self) -> List[str]:
        return list(self._classifier.labels())


def classify(model_dir: PathLike, images: Sequence[Union[PathLike, bytes, Any]], top_k: int = 5,
             threads: int = 0) -> List[List[ClassScore]]:
    """Classifies images (paths, bytes or uint8 arrays) with a model directory; top-k classes per image."""
    return Classifier(model_dir, threads=threads).classify(images, top_k)


__all__ = ["Model", "TensorInfo", "load_onnx", "decode", "classify", "Classifier", "ClassScore", "Error",
           "InvalidArgument", "NotFound", "Unsupported", "ResourceExhausted", "Unavailable", "Internal",
           "DeadlineExceeded", "Cancelled", "RunOptions", "__version__"]
