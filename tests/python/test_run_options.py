"""Runs stopped from Python: osprey.RunOptions (timeout, terminate) on Model.run, and ONNX Runtime's RunOptions.terminate
through osprey.onnxruntime. The model's length follows its input (onnx_models.spin: a Loop of MatMul + Tanh steps), so
a run that ignored its options would finish (seconds of work) instead of raising; no timing is asserted."""
import threading
import time

import numpy as np
import pytest

import onnx_models
import osprey
import osprey.onnxruntime as ort

LONG = 10_000  # Loop iterations (osprey's limit for one loop): seconds of work, past every stop below


@pytest.fixture(scope="module")
def spin():
    return osprey.Model(onnx_models.spin(), threads=1)


def expected(x, steps):
    h = np.full((256, 256), 0.01)
    for _ in range(steps):
        h = np.tanh(h / 2)  # h @ (I / 2)
    return x + h.mean()


def feeds(steps):
    return {"x": np.arange(8, dtype=np.float32).reshape(2, 4), "steps": np.array([steps], np.int64)}


def test_options_that_do_not_fire_change_nothing(spin):
    options = osprey.RunOptions()
    options.timeout = 600
    got = spin.run(feeds(5), run_options=options)["y"]
    np.testing.assert_allclose(got, expected(feeds(5)["x"], 5), rtol=1e-5, atol=1e-6)
    assert not options.terminate and options.timeout == 600


def test_a_timeout_stops_the_run_before_its_next_step(spin):
    spin.run(feeds(1))  # compiled: the deadline then covers steps only
    options = osprey.RunOptions()
    options.timeout = 0.2
    with pytest.raises(osprey.DeadlineExceeded) as raised:
        spin.run(feeds(LONG), run_options=options)
    assert isinstance(raised.value, TimeoutError)
    assert "RunOptions.timeout 0.2 s" in str(raised.value) and "stopped after" in str(raised.value)
    # The model runs again normally afterwards.
    np.testing.assert_allclose(spin.run(feeds(2))["y"], expected(feeds(2)["x"], 2), rtol=1e-5, atol=1e-6)


def test_terminate_from_another_thread_stops_the_run(spin):
    options = osprey.RunOptions()
    outcome = {}

    def run():
        try:
            spin.run(feeds(LONG), run_options=options)
            outcome["result"] = "finished"
        except osprey.Error as e:
            outcome["error"] = e

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.3)
    options.terminate = True
    worker.join(timeout=120)
    assert not worker.is_alive(), "the run did not stop"
    assert isinstance(outcome.get("error"), osprey.Cancelled), outcome
    assert "RunOptions.terminate was set" in str(outcome["error"])


def test_terminate_set_before_the_run_stops_it_at_once(spin):
    options = osprey.RunOptions()
    options.terminate = True
    with pytest.raises(osprey.Cancelled):
        spin.run(feeds(LONG), run_options=options)


def test_bad_timeouts_are_refused():
    options = osprey.RunOptions()
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(osprey.InvalidArgument, match="RunOptions.timeout"):
            options.timeout = bad


def test_onnxruntime_run_options_terminate():
    session = ort.InferenceSession(onnx_models.spin(), providers=["CPUExecutionProvider"])
    options = ort.RunOptions()
    options.log_severity_level = 3  # ONNX Runtime's other fields are accepted
    (y,) = session.run(None, feeds(3), options)
    np.testing.assert_allclose(y, expected(feeds(3)["x"], 3), rtol=1e-5, atol=1e-6)
    timer = threading.Timer(0.3, lambda: setattr(options, "terminate", True))
    timer.start()
    with pytest.raises(osprey.Cancelled):
        session.run(None, feeds(LONG), options)
    timer.join()
