// What tf2onnx writes for Keras models, compiled: batch normalisation left as Mul/Add after a (depthwise) Conv folded
// into the Conv (and the activation behind it fused), an NHWC Pad in front of a Transpose moved behind it and folded
// into the Conv, and NHWC <-> NCHW Transposes of channels-last data run as copies. Oracle: the same graph compiled
// without fusion and with reference kernels only; the fused plan's step count shows what was folded.
#include <gtest/gtest.h>

#include "fusion_test_util.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::RandomTensor;

using testing::kOracle;

// `fast_steps`: the count with fast kernels where it differs (unary steps fused into elementwise nodes,
// FuseElementwiseChains, happen for them only).
void ExpectFusedSteps(const Graph& graph, const Shape& input, size_t fused_steps, size_t fast_steps = 0) {
  const std::vector<TensorSpec> specs{{DType::kF32, input}};
  const std::vector<Tensor> inputs{RandomTensor(input, 7, -2.f, 2.f)};
  auto oracle = Compile(graph, specs, kOracle);
  const std::vector<Tensor> expected = oracle->Run(inputs);
  for (bool fast : {false, true}) {
    SCOPED_TRACE(fast ? "fast kernels" : "reference kernels");
    auto fused = Compile(graph, specs, CompileOptions{.num_threads = 2, .fast_kernels = fast, .fuse = true});
    std::vector<OpProfile> profile;
    fused->Run(std::vector<Tensor>{RandomTensor(input, 7, -2.f, 2.f)}, &profile);
    std::string steps;
    for (const OpProfile& p : profile) steps += " " + p.op_type;
    EXPECT_EQ(fused->num_steps(), fast && fast_steps ? fast_steps : fused_steps)
        << "unfused plan has " << oracle->num_steps() << " steps; fused:" << steps;
    const std::vector<Tensor> got = fused->Run(inputs);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i) ExpectTensorNear(got[i], expected[i], 1e-5f, 1e-5f);
  }
}

ValueRef Conv(GraphBuilder& b, ValueRef x, int64_t cin, int64_t cout, int64_t group, AttributeMap attrs = {},
              uint32_t seed = 1) {
  attrs["group"] = Attribute::Int(group);
  return b.Op("Conv", {x, b.Constant(RandomTensor({cout, cin / group, 3, 3}, seed, -0.5f, 0.5f))}, attrs);
}

TEST(TfPatterns, DepthwiseConvMulAddClipBecomesOneConv) {
  // MobileNetV2 as tf2onnx writes it: Conv -> Mul([1, C, 1, 1]) -> Add([1, C, 1, 1]) -> Clip(0, 6), twice.
  GraphBuilder b("dw_bn", 13);
  auto x = b.Input("x", DType::kF32, {1, 16, 12, 12});
  auto y = x;
  for (int k = 0; k < 2; ++k) {
    y = Conv(b, y, 16, 16, 16, {{"pads", Attribute::Ints({1, 1, 1, 1})}}, 1 + k);
    y = b.Op("Mul", {y, b.Constant(RandomTensor({1, 16, 1, 1}, 10 + k, 0.5f, 1.5f))});
    y = b.Op("Add", {y, b.Constant(RandomTensor({1, 16, 1, 1}, 20 + k))});
    y = b.Op("Clip", {y, b.Constant(Tensor::Scalar<float>(0.f)), b.Constant(Tensor::Scalar<float>(6.f))});
  }
  b.Output(y, "y");
  ExpectFusedSteps(b.Finish(), {1, 16, 12, 12}, 2);
}

TEST(TfPatterns, PreActivationAffineBecomesBatchNorm) {
  // DenseNet / ResNetV2 as tf2onnx writes them: batch norm as Mul and Add of per-channel constants before a Relu,
  // not after a Conv, so nothing folds; it becomes one BatchNormalization step with the Relu fused. Forms: s * x + b,
  // x - m (Sub) before Clip, x * s alone before Relu. Not converted: a second constant that varies along W (not per
  // channel), a lone Mul with no activation after it.
  const Shape shape{2, 6, 5, 7};
  auto per_channel = [&](GraphBuilder& b, uint32_t seed) {
    return b.Constant(RandomTensor({1, 6, 1, 1}, seed, 0.5f, 1.5f));
  };
  {
    GraphBuilder b("pre_act", 13);
    auto x = b.Input("x", DType::kF32, shape);
    auto y = b.Op("Relu", {b.Op("Add", {b.Op("Mul", {per_channel(b, 1), x}), b.Constant(RandomTensor({6, 1, 1}, 2))})});
    auto pool = [&](ValueRef v) { return b.Op("MaxPool", {v}, {{"kernel_shape", Attribute::Ints({1, 1})}}); };
    y = pool(Conv(b, y, 6, 6, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})}}));
    y = b.Op("Clip", {b.Op("Sub", {y, per_channel(b, 3)}), b.Constant(Tensor::Scalar<float>(0.f)),
                      b.Constant(Tensor::Scalar<float>(1.f))});
    y = b.Op("Relu", {b.Op("Mul", {pool(y), per_channel(b, 4)})});
    b.Output(y, "y");
    // BatchNorm(Relu), Conv, MaxPool, BatchNorm(Clip), MaxPool, BatchNorm(Relu).
    ExpectFusedSteps(b.Finish(), shape, 6);
  }
  {
    GraphBuilder b("not_per_channel", 13);
    auto x = b.Input("x", DType::kF32, shape);
    auto y = b.Op("Relu", {b.Op("Add", {b.Op("Mul", {x, per_channel(b, 5)}), b.Constant(RandomTensor({7}, 6))})});
    y = b.Op("Mul", {b.Op("MaxPool", {y}, {{"kernel_shape", Attribute::Ints({1, 1})}}), per_channel(b, 7)});
    b.Output(b.Op("MaxPool", {y}, {{"kernel_shape", Attribute::Ints({1, 1})}}), "y");
    // Mul, Add, Relu, MaxPool, Mul, MaxPool: nothing to gain, nothing converted (the fast Add applies the Relu).
    ExpectFusedSteps(b.Finish(), shape, 6, 5);
  }
}

TEST(TfPatterns, ConstantFirstSubAndScalarForms) {
  // Mul by a scalar and by [C, 1, 1] fold; Sub with the conv output second (c - conv) does not.
  GraphBuilder b("affine_forms", 13);
  auto x = b.Input("x", DType::kF32, {2, 8, 9, 9});
  auto y = Conv(b, x, 8, 8, 1);
  y = b.Op("Mul", {b.Constant(Tensor::Scalar<float>(0.5f)), y});
  y = b.Op("Sub", {y, b.Constant(RandomTensor({8, 1, 1}, 3))});
  y = b.Op("Sub", {b.Constant(RandomTensor({8, 1, 1}, 4)), y});
  b.Output(y, "y");
  ExpectFusedSteps(b.Finish(), {2, 8, 9, 9}, 2);
}

TEST(TfPatterns, NonChannelConstantsStay) {
  // A constant varying along W is not a per-channel affine map: nothing folds.
  GraphBuilder b("not_per_channel", 13);
  auto x = b.Input("x", DType::kF32, {1, 4, 6, 6});
  auto y = b.Op("Mul", {Conv(b, x, 4, 4, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})}}),
                        b.Constant(RandomTensor({1, 1, 1, 6}, 5))});
  b.Output(y, "y");
  ExpectFusedSteps(b.Finish(), {1, 4, 6, 6}, 2);
}

TEST(TfPatterns, NhwcPadThenTransposeFoldsIntoConv) {
  // MobileNetV3 as tf2onnx writes it when its transpose optimiser gives up: NHWC activations, Pad(bottom/right) ->
  // Transpose to NCHW -> stride-2 depthwise Conv -> Transpose back -> Mul([C]) -> Relu -> Transpose -> Conv.
  GraphBuilder b("nhwc_pad", 13);
  auto x = b.Input("x", DType::kF32, {1, 12, 12, 8});
  auto p = b.Op("Pad", {x, b.Constant(Tensor::FromVector<int64_t>({8}, {0, 0, 0, 0, 0, 1, 1, 0}))});
  auto t = b.Op("Transpose", {p}, {{"perm", Attribute::Ints({0, 3, 1, 2})}});
  auto c = Conv(b, t, 8, 8, 8, {{"strides", Attribute::Ints({2, 2})}});
  auto back = b.Op("Transpose", {c}, {{"perm", Attribute::Ints({0, 2, 3, 1})}});
  auto m = b.Op("Relu", {b.Op("Mul", {back, b.Constant(RandomTensor({8}, 6, 0.5f, 1.5f))})});
  auto t2 = b.Op("Transpose", {m}, {{"perm", Attribute::Ints({0, 3, 1, 2})}});
  auto c2 = Conv(b, t2, 8, 8, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})}}, 2);
  b.Output(c2, "y");
  // The Transpose of the input, then the Pad folds into the first Conv; the middle Transpose sinks below Mul and Relu
  // and cancels with the last one, and Mul and Relu fold into the first Conv: Transpose, Conv, Conv.
  ExpectFusedSteps(b.Finish(), {1, 12, 12, 8}, 3);
}

TEST(TfPatterns, KerasHardSwishAndHardSigmoid) {
  // Keras hard_swish x * relu6(x + 3) / 6 and hard_sigmoid relu6(x + 3) / 6 (an SE gate), as tf2onnx writes them,
  // behind NHWC Transposes: they become HardSwish / HardSigmoid, sink below the Transposes and fuse into the Convs.
  GraphBuilder b("hard", 13);
  auto x = b.Input("x", DType::kF32, {1, 8, 10, 10});
  auto scalar = [&](float v) { return b.Constant(Tensor::Scalar<float>(v)); };
  auto relu6 = [&](ValueRef v) { return b.Op("Clip", {b.Op("Add", {v, scalar(3.f)}), scalar(0.f), scalar(6.f)}); };
  auto c = Conv(b, x, 8, 8, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  auto t = b.Op("Transpose", {c}, {{"perm", Attribute::Ints({0, 2, 3, 1})}});
  auto hs = b.Op("Mul", {t, b.Op("Mul", {relu6(t), scalar(1.f / 6.f)})});
  auto t2 = b.Op("Transpose", {hs}, {{"perm", Attribute::Ints({0, 3, 1, 2})}});
  auto c2 = Conv(b, t2, 8, 8, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})}}, 2);
  auto t3 = b.Op("Transpose", {c2}, {{"perm", Attribute::Ints({0, 2, 3, 1})}});
  auto gate = b.Op("Div", {relu6(t3), scalar(6.f)});
  b.Output(b.Op("Mul", {gate, scalar(2.f)}), "y");
  // Conv(HardSwish), Conv(HardSigmoid), Transpose, Mul.
  ExpectFusedSteps(b.Finish(), {1, 8, 10, 10}, 4);
}

TEST(TfPatterns, PaddleHardSwish) {
  // PaddlePaddle's hard_swish as paddle2onnx writes it, (x * clip(x + 3, 0, 6)) / 6 (PP-OCR, PicoDet), and with
  // * (1/6) instead of / 6: each becomes HardSwish and fuses into its Conv. A chain whose Mul reads another tensor
  // than the Add's (x * clip(y + 3, 0, 6) / 6) is not a hard-swish and stays.
  GraphBuilder b("paddle_hard", 11);
  auto x = b.Input("x", DType::kF32, {1, 8, 10, 10});
  auto scalar = [&](float v) { return b.Constant(Tensor::Scalar<float>(v)); };
  auto relu6 = [&](ValueRef v) { return b.Op("Clip", {b.Op("Add", {v, scalar(3.f)}), scalar(0.f), scalar(6.f)}); };
  auto c = Conv(b, x, 8, 8, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  auto hs = b.Op("Div", {b.Op("Mul", {c, relu6(c)}), scalar(6.f)});
  auto c2 = Conv(b, hs, 8, 8, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})}}, 2);
  auto hs2 = b.Op("Mul", {b.Op("Mul", {relu6(c2), c2}), scalar(1.f / 6.f)});
  auto c3 = Conv(b, hs2, 8, 8, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})}}, 3);
  auto other = b.Op("Div", {b.Op("Mul", {c3, relu6(hs2)}), scalar(6.f)});
  b.Output(Conv(b, other, 8, 8, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})}}, 4), "y");
  // Conv(HardSwish), Conv(HardSwish), Conv; of the last chain, Add + Clip become one BatchNormalization step with the
  // Clip fused (AffineToBatchNorm), Mul and Div stay; Conv.
  ExpectFusedSteps(b.Finish(), {1, 8, 10, 10}, 7);
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

TEST(TfPatterns, ZeroPadBeforeMaxPoolFoldsAfterRelu) {
  // Keras ResNet: Relu -> Pad(1) -> MaxPool(3, stride 2). Without the Relu the Pad stays (zeros could win the max).
  for (bool relu : {true, false}) {
    SCOPED_TRACE(relu ? "after Relu" : "no Relu");
    GraphBuilder b("pad_maxpool", 13);
    auto x = b.Input("x", DType::kF32, {1, 4, 9, 9});
    auto c = Conv(b, x, 4, 4, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})}});
    auto r = relu ? b.Op("Relu", {c}) : c;
    auto p = b.Op("Pad", {r, b.Constant(Tensor::FromVector<int64_t>({8}, {0, 0, 1, 1, 0, 0, 1, 1}))});
    b.Output(b.Op("MaxPool", {p}, {{"kernel_shape", Attribute::Ints({3, 3})}, {"strides", Attribute::Ints({2, 2})}}),
             "y");
    ExpectFusedSteps(b.Finish(), {1, 4, 9, 9}, relu ? 2 : 3);
  }
}

TEST(TfPatterns, ReduceMeanOverNhwcViewBecomesGlobalAveragePool) {
  // Squeeze-excite in MobileNetV3 as tf2onnx writes it: Transpose to NHWC, ReduceMean(axes 1, 2, keepdims), back.
  GraphBuilder b("se", 13);
  auto x = b.Input("x", DType::kF32, {2, 8, 7, 7});
  auto t = b.Op("Transpose", {Conv(b, x, 8, 8, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})}})},
                {{"perm", Attribute::Ints({0, 2, 3, 1})}});
  auto m = b.Op("ReduceMean", {t}, {{"axes", Attribute::Ints({1, 2})}, {"keepdims", Attribute::Int(1)}});
  auto gate = b.Op("Transpose", {b.Op("Sigmoid", {b.Op("Transpose", {m}, {{"perm", Attribute::Ints({0, 3, 1, 2})}})})},
                   {{"perm", Attribute::Ints({0, 2, 3, 1})}});
  auto scaled = b.Op("Mul", {t, gate});
  b.Output(Conv(b, b.Op("Transpose", {scaled}, {{"perm", Attribute::Ints({0, 3, 1, 2})}}), 8, 8, 1, {}, 2), "y");
  // Conv, GlobalAveragePool, Sigmoid, Mul, Conv: every Transpose sinks into its inverse.
  ExpectFusedSteps(b.Finish(), {2, 8, 7, 7}, 5);
}

// A one-hot embedding as JAX (magika) writes it: MatMul(Cast(Equal(idx[..., 1], arange(D))), W[D, K]) becomes a
// Gather of W's rows; an index outside [0, D) (negative, D, beyond) gives a zero row, as the one-hot product does.
// Oracle: W's rows picked by hand. Not rewritten: an arange that does not start at 0 (then the Equal stays).
TEST(TfPatterns, OneHotMatMulBecomesGather) {
  constexpr int64_t kDepth = 7, kWidth = 5;
  const Tensor w = RandomTensor({kDepth, kWidth}, 3);
  const std::vector<int32_t> idx{0, 6, 3, -1, 7, 100, 2, -7, 5, 1};
  for (DType dtype : {DType::kI32, DType::kI64})
    for (int start : {0, 1})
      for (bool arange_first : {false, true}) {
        SCOPED_TRACE(std::string(DTypeName(dtype)) + (start ? " arange from 1" : "") +
                     (arange_first ? " arange first" : ""));
        std::vector<int64_t> range(kDepth);
        for (int64_t k = 0; k < kDepth; ++k) range[k] = k + start;
        std::vector<int64_t> idx64(idx.begin(), idx.end());
        Tensor arange = dtype == DType::kI32
                            ? Tensor::FromVector<int32_t>({1, 1, kDepth}, std::vector<int32_t>(range.begin(), range.end()))
                            : Tensor::FromVector<int64_t>({1, 1, kDepth}, range);
        Tensor input = dtype == DType::kI32 ? Tensor::FromVector<int32_t>({2, 5, 1}, idx)
                                            : Tensor::FromVector<int64_t>({2, 5, 1}, idx64);
        GraphBuilder b("one_hot", 15);
        auto x = b.Input("idx", dtype, {2, 5, 1});
        auto a = b.Constant(arange);
        auto eq = b.Op("Equal", arange_first ? std::vector<ValueRef>{a, x} : std::vector<ValueRef>{x, a});
        auto hot = b.Op("Cast", {eq}, {{"to", Attribute::Int(1)}});
        b.Output(b.Op("MatMul", {hot, b.Constant(w)}), "y");
        const Graph graph = b.Finish();
        for (bool fast : {false, true}) {
          SCOPED_TRACE(fast ? "fast kernels" : "reference kernels");
          auto plan = Compile(graph, {{dtype, {2, 5, 1}}}, CompileOptions{.num_threads = 2, .fast_kernels = fast});
          std::vector<OpProfile> profile;
          const std::vector<Tensor> got = plan->Run(std::vector<Tensor>{input}, &profile);
          std::string ops;
          for (const OpProfile& p : profile) ops += " " + p.op_type;
          EXPECT_EQ(ops.find("Gather") != std::string::npos, start == 0) << ops;
          EXPECT_EQ(ops.find("Equal") != std::string::npos, start != 0) << ops;
          ASSERT_EQ(got.size(), 1u);
          ASSERT_EQ(got[0].shape(), (Shape{2, 5, kWidth}));
          for (size_t i = 0; i < idx.size(); ++i) {
            const int64_t row = idx[i] - start;
            for (int64_t k = 0; k < kWidth; ++k) {
              const float want = row >= 0 && row < kDepth ? w.data<float>()[row * kWidth + k] : 0.f;
              EXPECT_FLOAT_EQ(got[0].data<float>()[i * kWidth + k], want) << "index " << idx[i] << " column " << k;
            }
          }
        }
      }
}

// The same embedding written with OneHot: float values [0, 1] (tf.one_hot), or int64 ones and a Cast (PyTorch's
// F.one_hot(x).float()). A negative index wraps once (-1 is the last row, -7 the first), beyond [-D, D) the row is
// zero. Oracle: W's rows picked by hand. Not rewritten: values other than [0, 1] (then OneHot and MatMul stay).
TEST(TfPatterns, OneHotOpMatMulBecomesGather) {
  constexpr int64_t kDepth = 7, kWidth = 5;
  const Tensor w = RandomTensor({kDepth, kWidth}, 4);
  const std::vector<int64_t> idx{0, 6, 3, -1, 7, 100, 2, -7, -8, 1};
  for (const char* form : {"float", "int64 + Cast", "on = 2"}) {
    SCOPED_TRACE(form);
    const bool cast = std::string(form) == "int64 + Cast";
    const float on = std::string(form) == "on = 2" ? 2.f : 1.f;
    GraphBuilder b("one_hot_op", 13);
    auto x = b.Input("idx", DType::kI64, {2, 5});
    auto values = cast ? b.Constant(Tensor::FromVector<int64_t>({2}, {0, 1}))
                       : b.Constant(Tensor::FromVector<float>({2}, {0.f, on}));
    auto hot = b.Op("OneHot", {x, b.Constant(Tensor::Scalar<int64_t>(kDepth)), values});
    if (cast) hot = b.Op("Cast", {hot}, {{"to", Attribute::Int(1)}});
    b.Output(b.Op("MatMul", {hot, b.Constant(w)}), "y");
    const Graph graph = b.Finish();
    for (bool fast : {false, true}) {
      SCOPED_TRACE(fast ? "fast kernels" : "reference kernels");
      auto plan = Compile(graph, {{DType::kI64, {2, 5}}}, CompileOptions{.num_threads = 2, .fast_kernels = fast});
      std::vector<OpProfile> profile;
      const std::vector<Tensor> got =
          plan->Run(std::vector<Tensor>{Tensor::FromVector<int64_t>({2, 5}, idx)}, &profile);
      std::string ops;
      for (const OpProfile& p : profile) ops += " " + p.op_type;
      EXPECT_EQ(ops.find("OneHot") == std::string::npos, on == 1.f) << ops;
      ASSERT_EQ(got[0].shape(), (Shape{2, 5, kWidth}));
      for (size_t i = 0; i < idx.size(); ++i) {
        const int64_t row = idx[i] < 0 ? idx[i] + kDepth : idx[i];
        for (int64_t k = 0; k < kWidth; ++k) {
          const float want = row >= 0 && row < kDepth ? on * w.data<float>()[row * kWidth + k] : 0.f;
          EXPECT_FLOAT_EQ(got[0].data<float>()[i * kWidth + k], want) << "index " << idx[i] << " column " << k;
        }
      }
    }
  }
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

TEST(TfPatterns, ElementwiseOnChannelsLastDataWithPlainOperands) {
  // Between two Convs the activations stay NHWC and elementwise ops run as layout-transparent steps on the fast
  // kernels, plain operands viewed as [N, H, W, C]: a per-channel [1, C, 1, 1], a per-pixel [1, 1, H, W] and a scalar.
  GraphBuilder b("transparent", 13);
  auto x = b.Input("x", DType::kF32, {2, 8, 6, 6});
  auto c = Conv(b, x, 8, 8, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  auto e = b.Op("Erf", {c});
  e = b.Op("Mul", {e, b.Op("Sigmoid", {c})});
  e = b.Op("Sub", {b.Constant(RandomTensor({1, 8, 1, 1}, 8)), e});
  e = b.Op("Add", {e, b.Constant(RandomTensor({1, 1, 6, 6}, 9))});
  e = b.Op("Div", {e, b.Constant(Tensor::Scalar<float>(3.f))});
  b.Output(Conv(b, b.Op("Gelu", {e}), 8, 8, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})}}, 2), "y");
  const Graph graph = b.Finish();
  // Conv, Erf, Sigmoid, Mul, Sub, Add, Div, Gelu, Conv; with fast kernels the Div applies the Gelu (on NHWC data).
  ExpectFusedSteps(graph, {2, 8, 6, 6}, 9, 8);
  auto plan = Compile(graph, {{DType::kF32, {2, 8, 6, 6}}}, CompileOptions{.num_threads = 2});
  EXPECT_EQ(plan->num_fast_steps(), plan->num_steps());  // every elementwise step on a fast kernel
}

}  // namespace
}  // namespace osprey

namespace osprey {
namespace {

// A Keras Conv1D block as tf2onnx writes it, on [N, W, C] data: Unsqueeze(1) -> Transpose(0, 3, 1, 2) -> Conv 1x3 ->
// Squeeze(2) -> Mul(k [C, 1]) (the batch norm's scale) -> Transpose(0, 2, 1) -> x * Sigmoid(x) -> Unsqueeze(1) ->
// Transpose(0, 3, 1, 2) -> the next Conv. `tap_inner`: the first Transpose(0, 2, 1)'s output is also a graph output;
// `w_scale`: the scale varies along W instead of C; `wc_mul`: then a Mul by a [W, C] constant (its elements in another
// order than the Conv output's [C, W]).
Graph Conv1dBlocks(bool tap_inner, bool w_scale, bool wc_mul = false) {
  GraphBuilder b("conv1d", 13);
  const int64_t c = 6, w = 20;
  auto axes = [&](int64_t a) { return b.Constant(Tensor::FromVector<int64_t>({1}, {a})); };
  auto conv = [&](ValueRef v, uint32_t seed) {
    return b.Op("Conv", {v, b.Constant(RandomTensor({c, c, 1, 3}, seed, -0.5f, 0.5f))},
                {{"pads", Attribute::Ints({0, 1, 0, 1})}});
  };
  auto perm = [](std::vector<int64_t> p) { return AttributeMap{{"perm", Attribute::Ints(std::move(p))}}; };
  auto x = b.Input("x", DType::kF32, {2, w, c});
  auto y = b.Op("Transpose", {b.Op("Unsqueeze", {x, axes(1)})}, perm({0, 3, 1, 2}));
  y = b.Op("Squeeze", {conv(y, 1), axes(2)});
  y = b.Op("Mul", {y, b.Constant(RandomTensor(w_scale ? Shape{1, w} : Shape{c, 1}, 3, 0.5f, 1.5f))});
  y = b.Op("Transpose", {y}, perm({0, 2, 1}));
  if (tap_inner) b.Output(y, "inner");
  if (wc_mul) y = b.Op("Mul", {y, b.Constant(RandomTensor({w, c}, 4, 0.5f, 1.5f))});
  y = b.Op("Mul", {y, b.Op("Sigmoid", {y})});
  y = b.Op("Transpose", {b.Op("Unsqueeze", {y, axes(1)})}, perm({0, 3, 1, 2}));
  y = b.Op("Transpose", {b.Op("Squeeze", {conv(y, 2), axes(2)})}, perm({0, 2, 1}));
  b.Output(y, "y");
  return b.Finish();
}

TEST(TfPatterns, Conv1dMovementChainCollapses) {
  // The Squeeze -> Mul -> Transpose -> SiLU -> Unsqueeze -> Transpose between the Convs leaves x in its own order: it
  // becomes Mul(k [C, 1, 1]) -> SiLU on the Conv's output, folded into it. Left: Unsqueeze, Transpose, Conv, Conv,
  // Squeeze, Transpose.
  ExpectFusedSteps(Conv1dBlocks(false, false), {2, 20, 6}, 6);
}

// The chain's end in x's order but not x's shape: the ops on x, then one Reshape (a); the end x itself, no op between:
// its readers read x (b), unless it is a graph output, which would need a copy: left (c).
TEST(TfPatterns, MovementChainEndsAsReshapeOrAsItsStart) {
  auto perm = [](std::vector<int64_t> p) { return AttributeMap{{"perm", Attribute::Ints(std::move(p))}}; };
  for (int form = 0; form < 3; ++form) {
    SCOPED_TRACE(form);
    GraphBuilder b("chain_end", 13);
    auto x = b.Input("x", DType::kF32, {2, 6, 20});
    auto y = b.Op("Transpose", {x}, perm({0, 2, 1}));
    if (form == 0) {
      y = b.Op("Relu", {y});
      y = b.Op("Unsqueeze", {y, b.Constant(Tensor::FromVector<int64_t>({1}, {1}))});
      y = b.Op("Transpose", {y}, perm({0, 3, 1, 2}));  // [2, 6, 1, 20]
      y = b.Op("Conv", {y, b.Constant(RandomTensor({6, 6, 1, 3}, 5, -0.5f, 0.5f))},
               {{"pads", Attribute::Ints({0, 1, 0, 1})}});
    } else {
      y = b.Op("Transpose", {y}, perm({0, 2, 1}));
      if (form == 1) y = b.Op("Softmax", {y}, {{"axis", Attribute::Int(-1)}});  // not elementwise: reads the end
    }
    b.Output(y, "y");
    // Unfused: 5, 3 and 2 steps.
    ExpectFusedSteps(b.Finish(), {2, 6, 20}, form == 0 ? 3 : form == 1 ? 1 : 2);
  }
}

TEST(TfPatterns, Conv1dMovementChainStaysWhenItCannotMove) {
  // The Transpose's output also a graph output: nothing collapses (13 steps, as unfused).
  ExpectFusedSteps(Conv1dBlocks(true, false), {2, 20, 6}, 13);
  // A scale along W moves to the Conv's output as [1, 1, 1, W]: not per channel, so the Mul stays, and the SiLU after
  // it; the movement around them still goes: Unsqueeze, Transpose, Conv, Mul, Sigmoid, Mul, Conv, Squeeze, Transpose.
  ExpectFusedSteps(Conv1dBlocks(false, true), {2, 20, 6}, 9);
  // A [W, C] constant would have to be transposed to move: the chain stops there, nothing collapses (14 steps).
  ExpectFusedSteps(Conv1dBlocks(false, false, true), {2, 20, 6}, 14);
}

}  // namespace
}  // namespace osprey
