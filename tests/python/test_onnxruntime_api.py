"""osprey.onnxruntime: ONNX Runtime's session API on osprey, checked against onnxruntime itself (same calls, same
models, compared results, metadata and refusals)."""
import os
import subprocess
import sys
import warnings

import numpy as np
import onnxruntime
import pytest

import onnx_models
import osprey
import osprey.onnxruntime as ort


def both(source, **kwargs):
    """The same session from osprey.onnxruntime and from onnxruntime."""
    theirs_options = onnxruntime.SessionOptions()
    theirs_options.intra_op_num_threads = 2
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    ours = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"], **kwargs)
    theirs = onnxruntime.InferenceSession(source, theirs_options, providers=["CPUExecutionProvider"])
    return ours, theirs


def describe(args):
    return [(a.name, a.type, a.shape) for a in args]


def test_a_zoo_model_through_the_same_calls(ensure_model):
    paths = ensure_model("mobilenet_v2")
    ours, theirs = both(str(paths["onnx"]))
    assert describe(ours.get_inputs()) == describe(theirs.get_inputs())
    assert describe(ours.get_outputs()) == describe(theirs.get_outputs())
    assert ours.get_providers() == ["CPUExecutionProvider"]
    x = np.load(paths["input8"])
    name = ours.get_inputs()[0].name
    (got,) = ours.run(None, {name: x})
    (want,) = theirs.run(None, {name: x})
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, atol=1e-3 * float(np.abs(want).max()), rtol=0)
    assert (got.argmax(1) == want.argmax(1)).all()


def test_bytes_output_names_and_several_inputs():
    source = onnx_models.two_inputs()
    ours, theirs = both(source)
    assert describe(ours.get_inputs()) == describe(theirs.get_inputs())  # tensor(float), tensor(int64)
    feeds = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.arange(6, dtype=np.int64).reshape(2, 3) - 2}
    for names in (None, [], ["p"], ["p", "s"]):
        got, want = ours.run(names, feeds), theirs.run(names, feeds)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    assert ours.run(["s"], feeds, ort.RunOptions())[0].shape == (2, 3)


def test_wrong_names_are_refused_as_onnxruntime_refuses_them():
    ours, theirs = both(onnx_models.two_inputs())
    good = {"a": np.ones((2, 3), np.float32), "b": np.ones((2, 3), np.int64)}
    cases = [({"a": good["a"]}, None, "missing"),                   # an input left out
             (dict(good, c=np.ones((2, 3), np.float32)), None, "Invalid input name"),
             (good, ["q"], "Invalid output name")]
    for feeds, names, words in cases:
        with pytest.raises(Exception):
            theirs.run(names, feeds)  # the oracle refuses it too
        with pytest.raises(ValueError, match=words):
            ours.run(names, feeds)
    with pytest.raises(osprey.NotFound):
        ort.InferenceSession("/nonexistent/model.onnx")


def test_providers_this_machine_cannot_run_fall_back_to_the_cpu():
    source = onnx_models.add_one()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        session = ort.InferenceSession(source, providers=[("TensorrtExecutionProvider", {}), "CPUExecutionProvider"])
    assert session.get_providers() == ["CPUExecutionProvider"]
    assert any("TensorrtExecutionProvider" in str(w.message) for w in caught)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.warns(RuntimeWarning, match="CUDAExecutionProvider"):
            session = ort.InferenceSession(source, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        assert session.get_providers() == ["CPUExecutionProvider"] and ort.get_device() == "CPU"
    (y,) = session.run(None, {"x": np.zeros((3, 4), np.float32)})
    np.testing.assert_array_equal(y, np.ones((3, 4), np.float32))


def test_session_options_are_accepted_as_onnxruntime_code_sets_them():
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(onnx_models.add_one(), sess_options=options)
    assert session.get_session_options() is options
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert session.get_overridable_initializers() == []
    (y,) = session.run(None, {"x": np.full((2, 4), 2, np.float32)})
    np.testing.assert_array_equal(y, np.full((2, 4), 3, np.float32))


def test_model_metadata_as_onnxruntime_reads_it():
    """PaddleOCR's recognisers keep their character list in metadata_props; RapidOCR reads it through
    get_modelmeta().custom_metadata_map."""
    import onnx
    model = onnx.load_from_string(onnx_models.add_one())
    model.producer_name, model.producer_version, model.domain = "paddle2onnx", "1.2.3", "ai.test"
    model.doc_string, model.model_version, model.graph.doc_string = "a model", 7, "its graph"
    for key, value in [("character", "a\nb\nc\n\u00e9\n\u4e2d"), ("shape", "[3, 48, 320]"), ("empty", "")]:
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    ours, theirs = both(model.SerializeToString())
    mine, want = ours.get_modelmeta(), theirs.get_modelmeta()
    for field in ("producer_name", "graph_name", "graph_description", "domain", "description", "version",
                  "custom_metadata_map"):
        assert getattr(mine, field) == getattr(want, field), field
    assert mine.custom_metadata_map["character"].split("\n")[-1] == "\u4e2d"
    assert osprey.Model(onnx_models.add_one()).metadata()["custom_metadata_map"] == {}
    # Bytes that are not UTF-8 (the file is not checked when parsed) read as U+FFFD, not an exception.
    bad = model.SerializeToString().replace(b"[3, 48, 320]", b"[3, \xff\xfe, 320]")
    assert osprey.Model(bad).metadata()["custom_metadata_map"]["shape"] == "[3, \ufffd\ufffd, 320]"


def test_lists_take_the_inputs_dtype_as_onnxruntime_converts_them():
    ours, theirs = both(onnx_models.two_inputs())
    feeds = {"a": [[0.5, 1, 2], [3, 4, 5]], "b": [[1, 2, 3], [4, 5, 6]]}  # Python lists: float32 and int64 inputs
    for g, w in zip(ours.run(None, feeds), theirs.run(None, feeds)):
        np.testing.assert_array_equal(g, w)
    with pytest.raises(ValueError, match="int64"):  # an array of another dtype is refused, as ONNX Runtime refuses it
        ours.run(None, {"a": np.ones((2, 3), np.float32), "b": np.ones((2, 3), np.float32)})


def test_install_answers_import_onnxruntime_for_packages_you_do_not_edit():
    script = """
import osprey.onnxruntime as shim
shim.install()
import onnxruntime
from onnxruntime.capi import _pybind_state as C
assert onnxruntime is shim and C.get_available_providers()[-1] == "CPUExecutionProvider"
onnxruntime.disable_telemetry_events()
onnxruntime.set_default_logger_severity(3)
from packaging.version import Version
assert Version(onnxruntime.__version__) >= Version("1.16")
print("ok")
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
