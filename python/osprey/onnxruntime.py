"""ONNX Runtime's Python API on osprey: code written for `onnxruntime` runs on osprey with one changed import.

    import osprey.onnxruntime as ort                 # instead of: import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession("model.onnx", options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    (probs,) = session.run(None, {name: batch})

What it covers (the calls inference code makes): `InferenceSession` (a path or the model's bytes; `sess_options`,
`providers`; `get_inputs`, `get_outputs`, `get_overridable_initializers`, `get_providers`, `get_provider_options`,
`get_session_options`, `get_modelmeta`, `run`, `set_providers`), `SessionOptions` (`intra_op_num_threads` is used;
the other fields are accepted and do not change anything: osprey always optimises the graph fully and runs its nodes
in order), `RunOptions` (`terminate` stops a run in progress; the rest accepted), `GraphOptimizationLevel`,
`ExecutionMode`, `get_available_providers`, `get_device`.
Packages you do not edit: `osprey.onnxruntime.install()` before importing them makes their `import onnxruntime`
give this module. Errors are osprey's (`osprey.InvalidArgument`, a `ValueError`, ...), with ONNX Runtime's wording
where inputs or outputs are named wrongly. Not covered: OrtValue and IO binding, training, custom op libraries,
profiling.

Providers: "CUDAExecutionProvider" runs on the GPU where this osprey was built with CUDA and a GPU is present, else
(as ONNX Runtime does) on the CPU with a warning; "CPUExecutionProvider" on the CPU; any other provider is skipped
with a warning, as ONNX Runtime skips a provider it was not built with.
"""
from __future__ import annotations

import enum
import sys
import types
import warnings
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _osprey, InvalidArgument, Model, Unavailable, Unsupported
from . import __version__ as osprey_version  # noqa: F401

# The ONNX Runtime API this module follows, for packages that compare onnxruntime.__version__; osprey's own version is
# osprey_version.
__version__ = "1.20.0+osprey"

_CPU = "CPUExecutionProvider"
_CUDA = "CUDAExecutionProvider"

# NumPy dtype names (osprey.TensorInfo.dtype) as ONNX Runtime's NodeArg.type spells them.
_TYPES = {"float32": "tensor(float)", "float16": "tensor(float16)", "bfloat16": "tensor(bfloat16)",
          "float64": "tensor(double)", "int8": "tensor(int8)", "uint8": "tensor(uint8)", "int16": "tensor(int16)",
          "uint16": "tensor(uint16)", "int32": "tensor(int32)", "uint32": "tensor(uint32)", "int64": "tensor(int64)",
          "uint64": "tensor(uint64)", "bool": "tensor(bool)", "string": "tensor(string)"}


class GraphOptimizationLevel(enum.IntEnum):
    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


class SessionOptions:
    """ONNX Runtime's session options. `intra_op_num_threads` (0 = all cores) is the threads of one run; the rest
    is accepted for compatibility and does not change what osprey does."""

    def __init__(self) -> None:
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.optimized_model_filepath = ""
        self.use_deterministic_compute = False
        self._configs: Dict[str, str] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._configs[key] = value

    def get_session_config_entry(self, key: str) -> str:
        return self._configs[key]


class RunOptions(_osprey.RunOptions):
    """ONNX Runtime's run options. `terminate = True`, set from another thread, stops the runs using these options
    before their next step (`osprey.Cancelled`; ONNX Runtime raises its Fail with "Exiting due to terminate flag");
    osprey's `timeout` (seconds, 0 = none) is here too. The other fields are accepted and change nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.only_execute_path_to_fetches = False


class NodeArg:
    """A graph input or output as ONNX Runtime describes it: name, shape (ints, symbolic names, None where unknown)
    and type ("tensor(float)", ...)."""

    def __init__(self, name: str, dtype: str, shape: Optional[Sequence[Any]]) -> None:
        self.name = name
        self.type = _TYPES.get(dtype, f"tensor({dtype})")
        self.shape = list(shape) if shape is not None else None

    def __repr__(self) -> str:
        return f"NodeArg(name='{self.name}', type='{self.type}', shape={self.shape})"


class ModelMetadata:
    """What `InferenceSession.get_modelmeta()` returns: the ONNX file's producer_name, graph_name,
    graph_description, domain, description, version and custom_metadata_map (its metadata_props; PaddleOCR's
    recognisers keep their character list there)."""

    def __init__(self, fields: Dict[str, Any]) -> None:
        self.producer_name: str = fields["producer_name"]
        self.graph_name: str = fields["graph_name"]
        self.graph_description: str = fields["graph_description"]
        self.domain: str = fields["domain"]
        self.description: str = fields["description"]
        self.version: int = fields["version"]
        self.custom_metadata_map: Dict[str, str] = dict(fields["custom_metadata_map"])


def set_default_logger_severity(level: int) -> None:
    """Accepted for compatibility (osprey's library code logs nothing)."""


def set_default_logger_verbosity(level: int) -> None:
    """Accepted for compatibility."""


def disable_telemetry_events() -> None:
    """Accepted for compatibility: osprey sends no telemetry."""


def enable_telemetry_events() -> None:
    """Accepted for compatibility: osprey sends no telemetry."""


def get_available_providers() -> List[str]:
    """The providers osprey can run here: the CPU always, CUDA where it was built with CUDA and a GPU is present."""
    return [_CUDA, _CPU] if _osprey.cuda_devices() > 0 else [_CPU]


def get_device() -> str:
    return "GPU" if _osprey.cuda_devices() > 0 else "CPU"


def _provider_names(providers: Optional[Sequence[Any]]) -> List[str]:
    """Provider names from ONNX Runtime's forms: names, or (name, options) pairs."""
    names = []
    for p in providers or [_CPU]:
        names.append(p[0] if isinstance(p, (tuple, list)) else p)
    return names


class InferenceSession:
    """An ONNX model compiled by osprey behind ONNX Runtime's session API (see the module's docstring)."""

    def __init__(self, path_or_bytes: Union[str, bytes, Any], sess_options: Optional[SessionOptions] = None,
                 providers: Optional[Sequence[Any]] = None, provider_options: Optional[Sequence[Any]] = None,
                 **kwargs: Any) -> None:
        self._options = sess_options if sess_options is not None else SessionOptions()
        self._source = path_or_bytes
        self.set_providers(providers, provider_options)

    def set_providers(self, providers: Optional[Sequence[Any]] = None,
                      provider_options: Optional[Sequence[Any]] = None) -> None:
        """Compiles the model for the first provider that works here (the CPU when none does)."""
        threads = int(getattr(self._options, "intra_op_num_threads", 0) or 0)
        source = self._source if isinstance(self._source, (bytes, bytearray)) else str(self._source)
        if isinstance(source, bytearray):
            source = bytes(source)
        for name in _provider_names(providers):
            if name == _CUDA:
                try:
                    return self._use(Model(source, threads=threads, device="cuda"), [_CUDA, _CPU])
                except (Unsupported, Unavailable) as e:
                    warnings.warn(f"osprey: CUDAExecutionProvider is not available here ({e}); running on the CPU",
                                  RuntimeWarning, stacklevel=3)
            elif name != _CPU:
                warnings.warn(f"osprey: {name} is not an osprey provider; skipped (available: "
                              f"{', '.join(get_available_providers())})", RuntimeWarning, stacklevel=3)
        self._use(Model(source, threads=threads, device="cpu"), [_CPU])

    def _use(self, model: Model, providers: List[str]) -> None:
        self._model, self._providers = model, providers
        self._input_dtypes = {i.name: i.dtype for i in model.inputs}  # read once: `run` checks names against them

    def get_inputs(self) -> List[NodeArg]:
        return [NodeArg(*i) for i in self._model.inputs]

    def get_outputs(self) -> List[NodeArg]:
        return [NodeArg(*o) for o in self._model.outputs]

    def get_overridable_initializers(self) -> List[NodeArg]:
        return []  # osprey treats every initializer as a constant of the model

    def get_providers(self) -> List[str]:
        return list(self._providers)

    def get_provider_options(self) -> Dict[str, Dict[str, str]]:
        return {p: {} for p in self._providers}

    def get_session_options(self) -> SessionOptions:
        return self._options

    def get_modelmeta(self) -> ModelMetadata:
        return ModelMetadata(self._model.metadata())

    def run(self, output_names: Optional[Sequence[str]], input_feed: Dict[str, Any],
            run_options: Optional[RunOptions] = None) -> List[Any]:
        """Runs the model: a list of NumPy arrays, one per name of `output_names` (all outputs, in the model's order,
        when it is None or empty)."""
        dtypes = self._input_dtypes
        if input_feed.keys() != dtypes.keys():
            for name in input_feed:
                if name not in dtypes:
                    raise InvalidArgument(f"Invalid input name: {name} (the model's inputs: {', '.join(dtypes)})")
            missing = sorted(dtypes.keys() - input_feed.keys())
            raise InvalidArgument(f"Required inputs ({missing}) are missing from input feed ({sorted(input_feed)}).")
        # A list or a Python number takes the input's dtype, as ONNX Runtime converts them (Magika feeds lists of
        # ints to an int32 input): Model.run does that.
        feed = input_feed if isinstance(input_feed, dict) else dict(input_feed)
        outputs = self._model.run(feed, run_options=run_options) if run_options is not None else self._model.run(feed)
        if not output_names:
            return list(outputs.values())
        for name in output_names:
            if name not in outputs:
                raise InvalidArgument(f"Invalid output name: {name} (the model's outputs: {', '.join(outputs)})")
        return [outputs[name] for name in output_names]

    def end_profiling(self) -> str:
        return ""  # osprey's per-node times: `osprey bench --profile MODEL`


# `from onnxruntime.capi import _pybind_state as C` (NudeNet and others reach for it): the same functions there.
capi = types.ModuleType(__name__ + ".capi")
capi._pybind_state = types.ModuleType(__name__ + ".capi._pybind_state")
for _name in ("get_available_providers", "get_device", "set_default_logger_severity", "disable_telemetry_events",
              "enable_telemetry_events", "SessionOptions", "RunOptions", "GraphOptimizationLevel", "ExecutionMode"):
    setattr(capi._pybind_state, _name, globals()[_name])


def install() -> None:
    """Makes `import onnxruntime` give this module, for packages written for ONNX Runtime that you do not edit
    (RapidOCR, NudeNet, Magika, ...): call it before importing them. `onnxruntime.capi._pybind_state` is answered
    too."""
    sys.modules["onnxruntime"] = sys.modules[__name__]
    sys.modules["onnxruntime.capi"] = capi
    sys.modules["onnxruntime.capi._pybind_state"] = capi._pybind_state
