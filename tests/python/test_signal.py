"""DFT, STFT and MelWeightMatrix (ops/signal.h) against ONNX Runtime and NumPy: forward and inverse transforms of
real and complex signals along every axis, one-sided, zero-padded and cut by dft_length, lengths that are powers of
two (the FFT) and not (the direct sum, primes included); the complex-to-real inverse PyTorch exports torch.fft.irfft
as; a Fourier-convolution block as torch.fft.rfft2 / irfft2 export it (LaMa); STFT with and without a window; the
mel filter bank; and requests that must be refused clearly (a one-sided transform of a complex signal, a prime
length too long to sum directly).
"""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import osprey

F = TensorProto.FLOAT


def save(tmp_path, name, nodes, inputs, outputs, inits=(), opset=20):
    graph = helper.make_graph(nodes, name, inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


def both(path, feeds, rtol=2e-4, atol=2e-4):
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = osprey.load_onnx(path, threads=1).run(feeds)
    for w, g in zip(want, got.values()):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol * max(1.0, float(np.abs(w).max())))
    return list(got.values())


def dft_model(tmp_path, shape, axis, inverse, onesided, length=None, opset=20):
    inputs = ["x", "n" if length is not None else ""]
    inits = [numpy_helper.from_array(np.array(length, np.int64), "n")] if length is not None else []
    attrs = {"inverse": inverse, "onesided": onesided}
    if opset >= 20:
        inputs.append("axis")
        inits.append(numpy_helper.from_array(np.array(axis, np.int64), "axis"))
    else:
        attrs["axis"] = axis
    name = "dft_" + "_".join(str(v) for v in [*shape, axis, inverse, onesided, length, opset]).replace("-", "m")
    return save(tmp_path, name,
                [helper.make_node("DFT", inputs, ["y"], **attrs)], [helper.make_tensor_value_info("x", F, shape)],
                [helper.make_tensor_value_info("y", F, None)], inits, opset)


def stft_model(tmp_path, name, signal_shape, n, hop, window, onesided=1):
    """An STFT of a signal `x` of `signal_shape`: frames of n points every hop, a Hann window when `window`."""
    inits = [numpy_helper.from_array(np.array(hop, np.int64), "step"),
             numpy_helper.from_array(np.array(n, np.int64), "n")]
    if window:
        inits.append(numpy_helper.from_array(np.hanning(n).astype(np.float32), "win"))
    return save(tmp_path, name,
                [helper.make_node("STFT", ["x", "step", "win" if window else "", "n"], ["y"], onesided=onesided)],
                [helper.make_tensor_value_info("x", F, list(signal_shape))],
                [helper.make_tensor_value_info("y", F, None)], inits, opset=17)


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("length", [None, 6, 40])  # as given, cut, zero-padded
@pytest.mark.parametrize("n", [16, 15, 17])  # the FFT, the direct sum, a prime
@pytest.mark.parametrize("case", ["real", "real_onesided", "complex", "complex_inverse", "real_axis0"])
def test_dft_matches_onnxruntime_and_numpy(tmp_path, opset, length, n, case):
    rng = np.random.default_rng(n)
    parts = 2 if case.startswith("complex") else 1
    axis = 0 if case == "real_axis0" else 1
    shape = [n, 3, parts] if axis == 0 else [2, n, 3, parts]
    x = rng.standard_normal(shape).astype(np.float32)
    path = dft_model(tmp_path, shape, axis, int(case == "complex_inverse"), int(case == "real_onesided"), length,
                     opset)
    got = both(path, {"x": x})[0]
    z = x[..., 0] + (1j * x[..., 1] if parts == 2 else 0)
    m = length or n
    ref = np.fft.ifft(z, n=m, axis=axis) if case == "complex_inverse" else np.fft.fft(z, n=m, axis=axis)
    if case == "real_onesided":
        ref = np.take(ref, range(m // 2 + 1), axis=axis)
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("n", [20, 21, 16])
def test_inverse_onesided_is_complex_to_real_as_onnxruntime_reads_it(tmp_path, n):
    """torch.fft.irfft exports as DFT(inverse=1, onesided=1): n // 2 + 1 complex bins in, n real points out, as the
    newest ONNX Runtime reads it (1.32; the pinned 1.20 refuses the pair, so NumPy's irfft is the oracle here)."""
    bins = n // 2 + 1
    x = np.random.default_rng(n).standard_normal((3, bins, 2)).astype(np.float32)
    got = osprey.load_onnx(dft_model(tmp_path, [3, bins, 2], 1, 1, 1, n), threads=1).run({"x": x})["y"]
    assert got.shape == (3, n, 1)
    np.testing.assert_allclose(got[..., 0], np.fft.irfft(x[..., 0] + 1j * x[..., 1], n=n, axis=1), rtol=1e-4,
                               atol=1e-5)
    # without dft_length: 2 x (bins - 1) points
    got = osprey.load_onnx(dft_model(tmp_path, [3, bins, 2], 1, 1, 1), threads=1).run({"x": x})["y"]
    assert got.shape == (3, 2 * (bins - 1), 1)


def test_fourier_convolution_block_as_torch_exports_it(tmp_path):
    """rfft2 (a one-sided DFT on the last axis, a full one on the other), a 1x1 convolution over the real and
    imaginary parts, irfft2 (an inverse DFT, then complex-to-real), as torch.onnx.export(dynamo=True) writes LaMa's
    spectral transform."""
    rng = np.random.default_rng(0)
    c, h, w = 4, 24, 20
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
             [("w_len", w), ("h_len", h), ("ax3", 3), ("ax2", 2), ("minus1", [-1]), ("zero", [0]), ("one", [1]),
              ("sel0", 0), ("sel1", 1)]]
    inits += [numpy_helper.from_array(rng.standard_normal((2 * c, 2 * c, 1, 1)).astype(np.float32) * 0.3, "cw"),
              numpy_helper.from_array(rng.standard_normal(2 * c).astype(np.float32) * 0.1, "cb")]
    node = helper.make_node
    nodes = [node("Unsqueeze", ["x", "minus1"], ["x1"]),
             node("DFT", ["x1", "w_len", "ax3"], ["f1"], inverse=0, onesided=1),
             node("DFT", ["f1", "h_len", "ax2"], ["f2"], inverse=0, onesided=0),
             node("Gather", ["f2", "sel0"], ["re"], axis=4), node("Gather", ["f2", "sel1"], ["im"], axis=4),
             node("Concat", ["re", "im"], ["cat"], axis=1),
             node("Conv", ["cat", "cw", "cb"], ["conv"]), node("Relu", ["conv"], ["act"]),
             node("Split", ["act"], ["r", "i"], axis=1, num_outputs=2),
             node("Unsqueeze", ["r", "minus1"], ["r1"]), node("Unsqueeze", ["i", "minus1"], ["i1"]),
             node("Concat", ["r1", "i1"], ["spec"], axis=-1),
             node("DFT", ["spec", "", "ax2"], ["g1"], inverse=1, onesided=0),
             node("DFT", ["g1", "w_len", "ax3"], ["g2"], inverse=1, onesided=1),
             node("Squeeze", ["g2", "minus1"], ["y"])]
    path = save(tmp_path, "ffc", nodes, [helper.make_tensor_value_info("x", F, [1, c, h, w])],
                [helper.make_tensor_value_info("y", F, None)], inits)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    got = osprey.load_onnx(path, threads=1).run({"x": x})["y"]
    # NumPy: rfft2, the 1x1 convolution and ReLU over [real, imaginary] channels, irfft2
    f = np.fft.rfft2(x.astype(np.float64))
    cat = np.concatenate([f.real, f.imag], axis=1)
    cw, cb = (numpy_helper.to_array(t) for t in inits[-2:])
    act = np.maximum(np.einsum("oi,nihw->nohw", cw[:, :, 0, 0], cat) + cb[None, :, None, None], 0)
    want = np.fft.irfft2(act[:, :c] + 1j * act[:, c:], s=(h, w))
    assert got.shape == (1, c, h, w)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("window", [True, False])
@pytest.mark.parametrize("onesided", [1, 0])
@pytest.mark.parametrize("frame", [64, 25])
def test_stft_matches_onnxruntime_and_numpy(tmp_path, window, onesided, frame):
    rng = np.random.default_rng(frame)
    signal = rng.standard_normal((2, 300, 1)).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(16, np.int64), "step"),
             numpy_helper.from_array(np.array(frame, np.int64), "frame")]
    win = np.hanning(frame).astype(np.float32)
    if window:
        inits.append(numpy_helper.from_array(win, "win"))
    path = save(tmp_path, f"stft_{window}_{onesided}_{frame}",
                [helper.make_node("STFT", ["x", "step", "win" if window else "", "frame"], ["y"], onesided=onesided)],
                [helper.make_tensor_value_info("x", F, [2, 300, 1])], [helper.make_tensor_value_info("y", F, None)],
                inits, opset=17)
    got = both(path, {"x": signal})[0]
    frames = 1 + (300 - frame) // 16
    segments = np.stack([signal[:, f * 16:f * 16 + frame, 0] for f in range(frames)], axis=1)
    ref = np.fft.fft(segments * (win if window else 1), axis=-1)[..., :frame // 2 + 1 if onesided else frame]
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.mark.parametrize("bins,n,rate,lo,hi", [(8, 256, 8000, 0.0, 4000.0), (40, 512, 16000, 20.0, 7600.0),
                                              (80, 400, 16000, 0.0, 8000.0)])
def test_mel_weight_matrix_matches_onnxruntime(tmp_path, bins, n, rate, lo, hi):
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in [("b", bins), ("n", n), ("r", rate)]]
    inits += [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in [("lo", lo), ("hi", hi)]]
    path = save(tmp_path, f"mel_{bins}_{n}", [helper.make_node("MelWeightMatrix", ["b", "n", "r", "lo", "hi"], ["y"])],
                [], [helper.make_tensor_value_info("y", F, None)], inits, opset=17)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {})[0]
    got = osprey.load_onnx(path, threads=1).run({})["y"]
    assert got.shape == (n // 2 + 1, bins)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_bad_transforms_are_refused_clearly(tmp_path):
    with pytest.raises(osprey.InvalidArgument, match="one-sided transform needs a real input"):
        osprey.load_onnx(dft_model(tmp_path, [2, 8, 2], 1, 0, 1), threads=1).run(
            {"x": np.zeros((2, 8, 2), np.float32)})
    with pytest.raises(osprey.InvalidArgument, match="needs a complex input holding 11 bins"):
        osprey.load_onnx(dft_model(tmp_path, [2, 8, 2], 1, 1, 1, 20), threads=1).run(
            {"x": np.zeros((2, 8, 2), np.float32)})
    with pytest.raises(osprey.InvalidArgument, match="not the last"):
        osprey.load_onnx(dft_model(tmp_path, [2, 8, 1], -1, 0, 0), threads=1).run(
            {"x": np.zeros((2, 8, 1), np.float32)})
    # a prime length of 100,003 points over 4 signals of 8 points: ~4e10 multiply-adds directly, a basis of 6.4 MB
    # (over the matrix product's 4 MiB); refused at once
    model = osprey.load_onnx(dft_model(tmp_path, [8, 4, 1], 0, 0, 0, 100003), threads=1)
    with pytest.raises(osprey.Unsupported, match="not a power of two"):
        model.run({"x": np.zeros((8, 4, 1), np.float32)})
    # 3 points zero-padded to 100,003 take the matrix product (3 basis rows, cheap), along the dim before the last and
    # along an axis with dims after it
    for shape, axis in [((4, 3, 1), 1), ((3, 4, 1), 0)]:
        x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
        got = osprey.load_onnx(dft_model(tmp_path, list(shape), axis, 0, 0, 100003), threads=1).run({"x": x})["y"]
        ref = np.fft.fft(x[..., 0].astype(np.float64), n=100003, axis=axis)
        np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], ref, rtol=0, atol=1e-5 * np.abs(ref).max())
    # 65,536 points zero-padded to 2^44: a basis of 2^16 x 2^45 floats, whose byte count wraps int64 (the matrix
    # product must decline, not build it); the 128 TiB output is refused by the allocator's limit
    model = osprey.load_onnx(dft_model(tmp_path, [1, 65536, 1], 1, 0, 0, 1 << 44), threads=1)
    with pytest.raises(osprey.ResourceExhausted, match="out of host memory"):
        model.run({"x": np.zeros((1, 65536, 1), np.float32)})
    # 1,000,003 points over 4,096 signals: a 32 GB output, refused by the allocator's limit
    model = osprey.load_onnx(dft_model(tmp_path, [4096, 3, 1], 1, 0, 0, 1000003), threads=1)
    with pytest.raises(osprey.ResourceExhausted, match="out of host memory"):
        model.run({"x": np.zeros((4096, 3, 1), np.float32)})


def test_bad_stft_and_mel_requests_are_refused_clearly(tmp_path):
    def stft(step, frame, window):
        inits = [numpy_helper.from_array(np.array(step, np.int64), "step"),
                 numpy_helper.from_array(np.array(frame, np.int64), "frame")]
        if window:
            inits.append(numpy_helper.from_array(np.ones(window, np.float32), "win"))
        path = save(tmp_path, f"stft_bad_{step}_{frame}_{window}",
                    [helper.make_node("STFT", ["x", "step", "win" if window else "", "frame"], ["y"])],
                    [helper.make_tensor_value_info("x", F, [1, 50, 1])], [helper.make_tensor_value_info("y", F, None)],
                    inits, opset=17)
        return osprey.load_onnx(path, threads=1).run({"x": np.zeros((1, 50, 1), np.float32)})

    with pytest.raises(osprey.InvalidArgument, match="frame_step must be >= 1, got 0"):
        stft(0, 16, 0)
    with pytest.raises(osprey.InvalidArgument, match=r"frame_length must be in \[1, 50\]"):
        stft(4, 64, 0)
    with pytest.raises(osprey.InvalidArgument, match="window has 8 values, frame_length is 16"):
        stft(4, 16, 8)
    # a signal is [batch, length, 1 or 2] or [batch, length]: rank 4 and rank 1 are refused
    for shape in ([1, 50, 1, 1], [50]):
        with pytest.raises(osprey.InvalidArgument, match=r"\[batch, length\]|rank >= 3"):
            osprey.load_onnx(stft_model(tmp_path, f"stft_rank{len(shape)}", shape, 16, 4, False), threads=1).run(
                {"x": np.zeros(shape, np.float32)})
    with pytest.raises(osprey.InvalidArgument, match="dft_length must be >= 1, got 0"):
        osprey.load_onnx(dft_model(tmp_path, [2, 8, 1], 1, 0, 0, 0), threads=1).run(
            {"x": np.zeros((2, 8, 1), np.float32)})

    def mel(n, rate, lo, hi):
        inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in [("b", 4), ("n", n), ("r", rate)]]
        inits += [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in [("lo", lo), ("hi", hi)]]
        path = save(tmp_path, f"mel_bad_{n}_{rate}_{int(lo)}_{int(hi)}",
                    [helper.make_node("MelWeightMatrix", ["b", "n", "r", "lo", "hi"], ["y"])], [],
                    [helper.make_tensor_value_info("y", F, None)], inits, opset=17)
        return osprey.load_onnx(path, threads=1).run({})

    with pytest.raises(osprey.InvalidArgument, match="upper_edge_hertz <= sample_rate / 2"):
        mel(64, 8000, 0.0, 5000.0)
    with pytest.raises(osprey.InvalidArgument, match="lower_edge_hertz < upper_edge_hertz"):
        mel(64, 8000, 3000.0, 1000.0)


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("n,length", [(512, None),   # WeSpeaker's frames (onnx-asr)
                                      (15, 40),      # zero-padded by dft_length
                                      (17, None),    # a prime
                                      (16, 6),       # cut by dft_length: the reference kernel
                                      (1024, None)])  # a basis over 4 MiB: the reference kernel
@pytest.mark.parametrize("case", ["real", "real_onesided", "complex", "complex_inverse", "real_inverse"])
def test_dft_over_frames_as_one_matrix_product(tmp_path, run_cli, opset, n, length, case):
    """A DFT along the dim before the last, every signal a row (frames, as audio front ends transform them), runs as
    one matrix product (kernels/cpu/signal_kernels.cc: DftGemm) where its basis fits 4 MiB and no signal is cut.
    Oracles: NumPy in float64 (tighter than ONNX Runtime: a direct sum drifts) and ONNX Runtime; the profile says
    which kernel ran."""
    rng = np.random.default_rng(n + len(case))
    parts = 2 if case.startswith("complex") else 1
    shape = [2, 5, n, parts]
    x = rng.standard_normal(shape).astype(np.float32)
    inverse = int(case.endswith("inverse"))
    path = dft_model(tmp_path, shape, 2 if opset == 17 else -2, inverse, int(case == "real_onesided"), length, opset)
    got = osprey.load_onnx(path, threads=2).run({"x": x})["y"]
    z = x[..., 0].astype(np.float64) + (1j * x[..., 1] if parts == 2 else 0)
    m = length or n
    ref = np.fft.ifft(z, n=m, axis=2) if inverse else np.fft.fft(z, n=m, axis=2)
    if case == "real_onesided":
        ref = ref[:, :, :m // 2 + 1]
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], ref, rtol=0, atol=3e-6 * np.abs(ref).max())
    if n <= 17:  # ONNX Runtime sums directly where osprey's reference takes the FFT: too slow at 1024 x 10 rows
        both(path, {"x": x})
    np.save(tmp_path / "x.npy", x)
    r = run_cli("bench", path, "--input", f"x={tmp_path / 'x.npy'}", "--iters", "1", "--warmup", "0", "--profile")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ("DftGemm" in r.stdout) == (n != 1024 and length != 6), r.stdout


@pytest.mark.parametrize("shape,axis", [([2, 16, 3, 4], 1),   # dims after the axis (rfft2's first DFT: [N, H, W])
                                        ([17, 5], 0),          # the first axis, a prime length
                                        ([3, 8, 32, 1], 1)])   # LaMa's Fourier unit: H of [C, H, W]
@pytest.mark.parametrize("case", ["real", "real_onesided", "complex", "complex_inverse"])
def test_dft_along_an_axis_with_dims_after_it(tmp_path, run_cli, shape, axis, case):
    """A DFT along an axis with dims between it and the last (torch.fft.rfft2's along H, fft along dim 1 of
    [batch, n, channels]) gathers its signals into rows, takes the same matrix product as a DFT over frames, and
    scatters the bins back (DftGemm). Oracles: NumPy in float64 and ONNX Runtime; the profile says which kernel ran."""
    parts = 2 if case.startswith("complex") else 1
    shape = [*shape, parts]
    x = np.random.default_rng(len(shape) + axis + len(case)).standard_normal(shape).astype(np.float32)
    inverse = int(case.endswith("inverse"))
    path = dft_model(tmp_path, shape, axis, inverse, int(case == "real_onesided"))
    got = osprey.load_onnx(path, threads=2).run({"x": x})["y"]
    z = x[..., 0].astype(np.float64) + (1j * x[..., 1] if parts == 2 else 0)
    ref = np.fft.ifft(z, axis=axis) if inverse else np.fft.fft(z, axis=axis)
    if case == "real_onesided":
        ref = np.take(ref, np.arange(shape[axis] // 2 + 1), axis=axis)
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], ref, rtol=0, atol=3e-6 * np.abs(ref).max())
    both(path, {"x": x})
    np.save(tmp_path / "x.npy", x)
    r = run_cli("bench", path, "--input", f"x={tmp_path / 'x.npy'}", "--iters", "1", "--warmup", "0", "--profile")
    assert r.returncode == 0 and "DftGemm" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("shape,axis,length", [([2, 9], 1, None),       # 16 points from 9 bins, frames
                                               ([3, 17, 4], 1, None),    # 32 points, dims after the axis
                                               ([9, 5], 0, None),        # the first axis
                                               ([2, 8], 1, 15),          # an odd length: 15 points from 8 bins
                                               ([1, 8, 17, 32], 2, None)])  # irfft2's H of LaMa's [C, H, W]
def test_complex_to_real_dft_as_one_matrix_product(tmp_path, run_cli, shape, axis, length):
    """An inverse DFT from a one-sided spectrum back to real points (inverse and onesided: torch.fft.irfft's and
    irfft2's last step) folds the spectrum's conjugate half into its basis and runs as one matrix product (DftGemm).
    Oracles: NumPy's irfft in float64 and osprey's reference kernel (`osprey run --reference`); the profile says which
    kernel ran."""
    shape = [*shape, 2]
    x = np.random.default_rng(len(shape) + axis).standard_normal(shape).astype(np.float32)
    n = length or 2 * (shape[axis] - 1)
    path = dft_model(tmp_path, shape, axis, 1, 1, length)
    got = osprey.load_onnx(path, threads=2).run({"x": x})["y"]
    assert got.shape[-1] == 1 and got.shape[axis] == n, got.shape
    ref = np.fft.irfft(x[..., 0].astype(np.float64) + 1j * x[..., 1], n=n, axis=axis)
    np.testing.assert_allclose(got[..., 0], ref, rtol=0, atol=3e-6 * np.abs(ref).max())
    np.save(tmp_path / "x.npy", x)
    r = run_cli("run", path, "--reference", "--input", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(got, np.load(tmp_path / "out" / "y.npy"), rtol=0, atol=3e-6 * np.abs(ref).max())
    r = run_cli("bench", path, "--input", f"x={tmp_path / 'x.npy'}", "--iters", "1", "--warmup", "0", "--profile")
    assert r.returncode == 0 and "DftGemm" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("length,n,hop,parts,window", [(16000, 400, 160, 1, True),   # Whisper's front end
                                                       (3000, 512, 128, 1, False),
                                                       (900, 64, 24, 2, True),      # a complex signal
                                                       (500, 100, 50, 2, False),
                                                       (60000, 64, 16, 1, True)])   # 7494 rows: chunks and a tail
def test_stft_as_one_matrix_product_matches_numpy(tmp_path, run_cli, length, n, hop, parts, window):
    """The STFT kernel (kernels/cpu/signal_kernels.cc: frames times a window-weighted DFT basis, one GEMM) against NumPy
    in float64, tighter than ONNX Runtime manages (its direct sum over 400 points drifts ~3.5e-5 of the largest bin on
    30 s of audio; this one 7e-7), and named in the profile."""
    rng = np.random.default_rng(n + parts)
    signal = rng.standard_normal((2, length, parts)).astype(np.float32)
    win = np.hanning(n).astype(np.float32)
    path = stft_model(tmp_path, f"stft_gemm_{n}_{parts}_{length}", signal.shape, n, hop, window, int(parts == 1))
    got = osprey.load_onnx(path, threads=2).run({"x": signal})["y"]
    x = signal[..., 0].astype(np.float64) + (1j * signal[..., 1] if parts == 2 else 0)
    frames = np.stack([x[:, f * hop:f * hop + n] for f in range(1 + (length - n) // hop)], axis=1)
    ref = np.fft.fft(frames * (win.astype(np.float64) if window else 1), axis=-1)[..., :n // 2 + 1 if parts == 1 else n]
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], ref, rtol=0, atol=2e-6 * np.abs(ref).max())
    np.save(tmp_path / "x.npy", signal)
    r = run_cli("bench", path, "--input", f"x={tmp_path / 'x.npy'}", "--iters", "1", "--warmup", "0", "--profile")
    assert r.returncode == 0 and "StftGemm" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("length,n,hop,window", [(16000, 400, 160, True),  # the matrix-product kernel
                                                 (300, 25, 16, False)])     # small: the reference kernel too
def test_stft_of_a_signal_without_its_last_dim_is_real(tmp_path, run_cli, length, n, hop, window):
    """A [batch, length] signal (no trailing dim of 1), as onnx-asr's audio front ends feed the waveform and ONNX
    Runtime reads it: a real signal. Oracles: ONNX Runtime and NumPy."""
    rng = np.random.default_rng(length)
    signal = rng.standard_normal((2, length)).astype(np.float32)
    win = np.hanning(n).astype(np.float32)
    path = stft_model(tmp_path, f"stft_rank2_{length}_{n}", signal.shape, n, hop, window)
    got = both(path, {"x": signal})[0]
    frames = np.stack([signal[:, f * hop:f * hop + n] for f in range(1 + (length - n) // hop)], axis=1)
    ref = np.fft.rfft(frames.astype(np.float64) * (win if window else 1), axis=-1)
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], ref, rtol=0, atol=1e-4 * np.abs(ref).max())
    np.save(tmp_path / "x.npy", signal)  # the reference kernel, through the CLI
    r = run_cli("run", path, "--reference", "--input", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    reference = np.load(tmp_path / "out" / "y.npy")
    np.testing.assert_allclose(reference[..., 0] + 1j * reference[..., 1], ref, rtol=0, atol=1e-4 * np.abs(ref).max())


def test_stft_of_an_empty_batch_is_empty(tmp_path):
    inits = [numpy_helper.from_array(np.array(8, np.int64), "step"),
             numpy_helper.from_array(np.array(32, np.int64), "n")]
    path = save(tmp_path, "stft_empty", [helper.make_node("STFT", ["x", "step", "", "n"], ["y"])],
                [helper.make_tensor_value_info("x", F, [0, 100, 1])], [helper.make_tensor_value_info("y", F, None)],
                inits, opset=17)
    got = osprey.load_onnx(path, threads=2).run({"x": np.zeros((0, 100, 1), np.float32)})["y"]
    assert got.shape == (0, 9, 17, 2)
