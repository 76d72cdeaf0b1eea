"""Models at opsets 22-28 (what PyTorch 2.15 writes at opset_version=23, and the ops ONNX added since opset 21) through
`osprey run`, against ONNX Runtime 1.32 and onnx's reference evaluator (.venv-onnx: the newest onnx and ORT).

PyTorch's exporter at opset 23 writes scaled_dot_product_attention as ONNX's Attention op (ViT, DINOv2, CLIP, DETR,
SegFormer) and RMSNorm as RMSNormalization; osprey lowers these function ops to the ops that define them when it
compiles (runtime/function_ops.cc), so its attention fusion still makes one kernel of them. The conformance suite runs
onnx's own node tests of every new op (tests/conformance on .venv-onnx); these tests add whole blocks as exporters
write them, the paths the node tests leave out (a constant all-true mask, masks known at compile time with fully
masked rows, fused vs reference kernels), and hostile sizes.
"""

import subprocess

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

TIMEOUT_S = 120
RNG = np.random.default_rng(46)


def save(path, nodes, inputs, outputs, initializers=(), opset=23):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    path.write_bytes(model.SerializeToString())
    return model


def run_osprey(osprey_bin, model_path, feeds, work, *extra):
    out_dir = work / ("out" + "".join(extra).replace("-", "_"))
    out_dir.mkdir(exist_ok=True)
    args = [str(osprey_bin), "run", str(model_path), "--output-dir", str(out_dir), "--threads", "2", *extra]
    for name, value in feeds.items():
        npy = work / f"{name}.npy"
        np.save(npy, value)
        args += ["--input", f"{name}={npy}"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S)
    return proc, out_dir


def outputs_of(osprey_bin, model_path, feeds, work, names, *extra):
    proc, out_dir = run_osprey(osprey_bin, model_path, feeds, work, *extra)
    assert proc.returncode == 0, proc.stderr
    return [np.load(out_dir / f"{n}.npy") for n in names]


def weight(name, *shape, scale=0.1):
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def f32(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def encoder_block(path, tokens=50, dim=64, heads=4):
    """A pre-norm ViT block as PyTorch writes it at opset 23: LayerNorm, Q/K/V projections split into heads, Attention
    with the all-true bool mask transformers passes, heads merged, output projection, residual; then RMSNorm and a
    SwiGLU MLP (Llama-style, as in EVA-02 / DINOv3 blocks)."""
    hd = dim // heads
    inits = [weight("ln_s", dim, scale=1.0), weight("ln_b", dim), weight("wq", dim, dim), weight("wk", dim, dim),
             weight("wv", dim, dim), weight("wo", dim, dim), weight("rms_s", dim, scale=1.0),
             weight("wg", dim, 2 * dim), weight("wu", dim, 2 * dim), weight("wd", 2 * dim, dim),
             numpy_helper.from_array(np.array([1, tokens, heads, hd], np.int64), "split"),
             numpy_helper.from_array(np.array([1, tokens, dim], np.int64), "merge"),
             numpy_helper.from_array(np.ones((1, 1, tokens, tokens), bool), "mask")]
    nodes = [helper.make_node("LayerNormalization", ["x", "ln_s", "ln_b"], ["ln"], axis=-1, epsilon=1e-6)]
    for n in "qkv":
        nodes += [helper.make_node("MatMul", ["ln", f"w{n}"], [f"{n}p"]),
                  helper.make_node("Reshape", [f"{n}p", "split"], [f"{n}s"]),
                  helper.make_node("Transpose", [f"{n}s"], [f"{n}h"], perm=[0, 2, 1, 3])]
    nodes += [helper.make_node("Attention", ["qh", "kh", "vh", "mask"], ["att"], scale=float(hd) ** -0.5),
              helper.make_node("Transpose", ["att"], ["att_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["att_t", "merge"], ["att_m"]),
              helper.make_node("MatMul", ["att_m", "wo"], ["proj"]),
              helper.make_node("Add", ["x", "proj"], ["h"]),
              helper.make_node("RMSNormalization", ["h", "rms_s"], ["hn"], epsilon=1e-6),
              helper.make_node("MatMul", ["hn", "wg"], ["gate"]),
              helper.make_node("MatMul", ["hn", "wu"], ["up"]),
              helper.make_node("SwiGLU", ["gate", "up"], ["act"]),
              helper.make_node("MatMul", ["act", "wd"], ["down"]),
              helper.make_node("Add", ["h", "down"], ["y"])]
    return save(path, nodes, [f32("x", [1, tokens, dim])], [f32("y", [1, tokens, dim])], inits, opset=28)


def test_encoder_block_at_opset_28_matches_the_onnx_reference_and_fuses_its_attention(osprey_bin, tmp_path):
    """Oracle: onnx's reference evaluator (ONNX Runtime 1.32 has no Swish-24 kernel, which SwiGLU expands to)."""
    model_path = tmp_path / "block.onnx"
    encoder_block(model_path)
    x = RNG.standard_normal((1, 50, 64)).astype(np.float32)
    expected = ReferenceEvaluator(str(model_path)).run(None, {"x": x})[0]
    for extra in ((), ("--reference",)):
        (got,) = outputs_of(osprey_bin, model_path, {"x": x}, tmp_path, ["y"], *extra)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=f"osprey {extra}")
    # The lowered attention meets the fusion: one _AttentionViews kernel, no Softmax left.
    prof = subprocess.run([str(osprey_bin), "bench", str(model_path), "--iters", "1", "--warmup", "0", "--threads",
                           "1", "--profile"], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert prof.returncode == 0, prof.stderr
    assert "_AttentionViews" in prof.stdout and "Softmax" not in prof.stdout, prof.stdout


def attention_model(path, q_shape, k_shape, v_shape, attrs, mask=None, mask_const=None, past=None, outputs=1):
    """One Attention node; `mask` a (dtype, shape) graph input, `mask_const` a constant array, `past` the past
    key/value shapes."""
    inputs = [f32("Q", q_shape), f32("K", k_shape), f32("V", v_shape)]
    names = ["Q", "K", "V"]
    inits = []
    if mask is not None:
        inputs.append(helper.make_tensor_value_info("M", mask[0], mask[1]))
        names.append("M")
    elif mask_const is not None:
        inits.append(numpy_helper.from_array(mask_const, "M"))
        names.append("M")
    if past is not None:
        if len(names) == 3:
            names.append("")
        inputs += [f32("PK", past[0]), f32("PV", past[1])]
        names += ["PK", "PV"]
    out_names = ["Y", "present_key", "present_value", "qk"][:outputs]
    node = helper.make_node("Attention", names, out_names, **attrs)
    save(path, [node], inputs, [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in out_names], inits)
    return out_names


ATTENTION_CASES = {
    # name: (Q, K, V shapes, attributes, runtime mask (dtype, shape) or None, constant mask or None, past shapes, outputs)
    "4d_plain": ((2, 4, 7, 8), (2, 4, 9, 8), (2, 4, 9, 6), {}, None, None, None, 1),
    "3d_gqa_causal_past": ((2, 5, 32), (2, 5, 16), (2, 5, 12), {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1},
                           None, None, ((2, 2, 3, 8), (2, 2, 3, 6)), 3),
    "4d_float_runtime_mask_softcap_qk2": ((1, 2, 6, 8), (1, 2, 6, 8), (1, 2, 6, 8), {"softcap": 2.5,
                                          "qk_matmul_output_mode": 2}, (TensorProto.FLOAT, [1, 2, 6, 6]), None, None,
                                          4),
    "4d_bool_runtime_mask_short_keys": ((1, 2, 4, 8), (1, 2, 7, 8), (1, 2, 7, 8), {"scale": 0.3},
                                        (TensorProto.BOOL, [4, 5]), None, None, 1),
    "4d_constant_mask_fully_masked_row_qk3": ((1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 5, 8), {"qk_matmul_output_mode": 3},
                                              None, np.array([[1, 0, 1, 1, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1],
                                                              [0, 0, 0, 0, 1]], bool), None, 4),
    "4d_constant_float_mask_causal": ((1, 1, 5, 4), (1, 1, 5, 4), (1, 1, 5, 4), {"is_causal": 1}, None,
                                      (RNG.standard_normal((5, 5)) * 0.5).astype(np.float32), None, 1),
}


@pytest.mark.parametrize("case", sorted(ATTENTION_CASES))
def test_attention_matches_the_onnx_reference(osprey_bin, tmp_path, case):
    q_shape, k_shape, v_shape, attrs, mask, mask_const, past, outputs = ATTENTION_CASES[case]
    model_path = tmp_path / "attention.onnx"
    out_names = attention_model(model_path, q_shape, k_shape, v_shape, attrs, mask, mask_const, past, outputs)
    feeds = {"Q": RNG.standard_normal(q_shape).astype(np.float32), "K": RNG.standard_normal(k_shape).astype(np.float32),
             "V": RNG.standard_normal(v_shape).astype(np.float32)}
    if mask is not None:
        shape = mask[1]
        feeds["M"] = (RNG.random(shape) > 0.3 if mask[0] == TensorProto.BOOL
                      else RNG.standard_normal(shape).astype(np.float32))
        if mask[0] == TensorProto.BOOL:
            feeds["M"][1, :] = False  # a fully masked row: zeros, not NaN
    if past is not None:
        feeds["PK"] = RNG.standard_normal(past[0]).astype(np.float32)
        feeds["PV"] = RNG.standard_normal(past[1]).astype(np.float32)
    expected = ReferenceEvaluator(str(model_path)).run(None, feeds)
    for extra in ((), ("--reference",)):
        got = outputs_of(osprey_bin, model_path, feeds, tmp_path, out_names, *extra)
        for name, g, e in zip(out_names, got, expected):
            assert g.shape == e.shape, (name, extra)
            assert not np.isnan(g).any(), (name, extra)
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5, err_msg=f"{name} {extra}")


@pytest.mark.parametrize("three_d,interleaved,rotary_dim", [(True, False, 0), (False, True, 4), (False, False, 6)])
def test_rotary_embedding_matches_onnxruntime(osprey_bin, tmp_path, three_d, interleaved, rotary_dim):
    batch, heads, seq, head = 2, 3, 5, 8
    half = (rotary_dim or head) // 2
    x_shape = [batch, seq, heads * head] if three_d else [batch, heads, seq, head]
    angles = np.arange(16)[:, None] * (10000.0 ** (-np.arange(half) / half))[None, :]
    inits = [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos"),
             numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin")]
    attrs = {"interleaved": int(interleaved)}
    if three_d:
        attrs["num_heads"] = heads
    if rotary_dim:
        attrs["rotary_embedding_dim"] = rotary_dim
    node = helper.make_node("RotaryEmbedding", ["X", "cos", "sin", "pos"], ["Y"], **attrs)
    model_path = tmp_path / "rope.onnx"
    save(model_path, [node], [f32("X", x_shape), helper.make_tensor_value_info("pos", TensorProto.INT64, [batch, seq])],
         [f32("Y", x_shape)], inits)
    feeds = {"X": RNG.standard_normal(x_shape).astype(np.float32),
             "pos": RNG.integers(0, 16, (batch, seq)).astype(np.int64)}
    expected = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    (got,) = outputs_of(osprey_bin, model_path, feeds, tmp_path, ["Y"])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_opset_28_mod_floor_remainder_and_signed_shifts(osprey_bin, tmp_path):
    """Mod with fmod = 0 on floats (opset 28): the sign of the divisor, as numpy.mod; BitShift on int32: an
    arithmetic right shift, shifts by the width or more saturating to the sign (hand-computed)."""
    nodes = [helper.make_node("Mod", ["a", "b"], ["r"], fmod=0),
             helper.make_node("BitShift", ["s", "n"], ["right"], direction="RIGHT"),
             helper.make_node("BitShift", ["s", "n"], ["left"], direction="LEFT")]
    i32 = TensorProto.INT32
    model_path = tmp_path / "opset28.onnx"
    save(model_path, nodes, [f32("a", [6]), f32("b", [6]), helper.make_tensor_value_info("s", i32, [4]),
                             helper.make_tensor_value_info("n", i32, [4])],
         [f32("r", [6]), helper.make_tensor_value_info("right", i32, [4]),
          helper.make_tensor_value_info("left", i32, [4])], opset=28)
    feeds = {"a": np.array([5.5, -5.5, 5.5, -5.5, 0.0, 7.0], np.float32),
             "b": np.array([2.0, 2.0, -2.0, -2.0, -3.0, np.inf], np.float32),
             "s": np.array([-8, 8, -1, 1 << 30], np.int32), "n": np.array([1, 2, 40, 2], np.int32)}
    r, right, left = outputs_of(osprey_bin, model_path, feeds, tmp_path, ["r", "right", "left"])
    np.testing.assert_array_equal(r, [1.5, 0.5, -0.5, -1.5, 0.0, 7.0])
    assert np.signbit(r[4]), "a zero remainder takes the divisor's sign"
    np.testing.assert_array_equal(right, [-4, 2, -1, 1 << 28])
    np.testing.assert_array_equal(left, [-16, 32, 0, 0])  # 2^30 << 2 drops the bits past the sign bit


def expect_error(osprey_bin, model_path, feeds, work, *fragments):
    proc, _ = run_osprey(osprey_bin, model_path, feeds, work, "--random-inputs")
    assert proc.returncode == 1, (proc.returncode, proc.stderr)  # a clear error, not a crash
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr


def test_hostile_models_get_clear_errors(osprey_bin, tmp_path):
    # A causal attention over 8192 x 4096 pairs would need a 128 MiB constant mask: refused before it is made.
    path = tmp_path / "big.onnx"
    attention_model(path, (1, 1, 8192, 1), (1, 1, 4096, 1), (1, 1, 4096, 1), {"is_causal": 1})
    expect_error(osprey_bin, path, {}, tmp_path, "too many for a masked attention")
    # TensorScatter writing past the cache (linear mode), from a run-time index.
    path = tmp_path / "scatter.onnx"
    save(path, [helper.make_node("TensorScatter", ["cache", "update", "idx"], ["out"])],
         [f32("cache", [2, 4, 3]), f32("update", [2, 2, 3]), helper.make_tensor_value_info("idx", TensorProto.INT64,
                                                                                            [2])],
         [f32("out", [2, 4, 3])], opset=24)
    feeds = {"cache": np.zeros((2, 4, 3), np.float32), "update": np.ones((2, 2, 3), np.float32),
             "idx": np.array([0, (1 << 63) - 1], np.int64)}
    expect_error(osprey_bin, path, feeds, tmp_path, "do not fit the cache")
    # BitCast to a type of another width.
    path = tmp_path / "bitcast.onnx"
    save(path, [helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.INT64)], [f32("x", [3])],
         [helper.make_tensor_value_info("y", TensorProto.INT64, [3])], opset=26)
    expect_error(osprey_bin, path, {"x": np.zeros(3, np.float32)}, tmp_path, "types of one width")
    # An opset past osprey's newest: the supported range and how to convert.
    path = tmp_path / "future.onnx"
    save(path, [helper.make_node("Relu", ["x"], ["y"])], [f32("x", [3])], [f32("y", [3])], opset=29)
    expect_error(osprey_bin, path, {"x": np.zeros(3, np.float32)}, tmp_path, "opsets 7..28", "version_converter")


def test_malformed_new_ops_get_clear_errors(osprey_bin, tmp_path):
    """Each refusal the new ops' schemas and lowerings make, by its message (a clear error, exit code 1)."""
    cases = {
        "bitcast_to_double": ([helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.DOUBLE)],
                              [f32("x", [2])], 26, "BitCast to double is not supported"),
        "bitcast_to_bool": ([helper.make_node("BitCast", ["b"], ["y"], to=TensorProto.BOOL)],
                            [helper.make_tensor_value_info("b", TensorProto.UINT8, [2])], 26, "BitCast to bool"),
        "rope_odd_dim": ([helper.make_node("RotaryEmbedding", ["x", "c", "c"], ["y"], rotary_embedding_dim=3)],
                         [f32("x", [1, 2, 3, 8]), f32("c", [1, 3, 1])], 23, "must be even"),
        "rope_cache_shape": ([helper.make_node("RotaryEmbedding", ["x", "c", "c"], ["y"])],
                             [f32("x", [1, 2, 3, 8]), f32("c", [1, 3, 3])], 23, "without position_ids"),
        "rmsnorm_axis": ([helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=5)],
                         [f32("x", [2, 3, 4]), f32("s", [4])], 23, "out of range"),
        "swiglu_shapes": ([helper.make_node("SwiGLU", ["a", "b"], ["y"])], [f32("a", [2, 4]), f32("b", [2, 3])], 28,
                          "A and B must have the same shape"),
        "attention_3d_heads": ([helper.make_node("Attention", ["q", "q", "q"], ["y"])], [f32("q", [1, 4, 8])], 23,
                               "need q_num_heads and kv_num_heads"),
    }
    for name, (nodes, inputs, opset, fragment) in cases.items():
        path = tmp_path / f"{name}.onnx"
        save(path, nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)], opset=opset)
        expect_error(osprey_bin, path, {}, tmp_path, fragment)
