// Quantised graphs compiled (src/runtime/fusion_qdq.cc): a QuantizeLinear -> DequantizeLinear pair on an activation
// becomes clip(round(x / s), lo, hi) * s (on the CPU one Round node carrying the pair) and must stay bit-identical;
// a QLinearConv with constant weights becomes a float Conv between DequantizeLinear and QuantizeLinear and may differ
// from the integer kernel by one output step.
// Oracle: the same graph compiled without fusion and with reference kernels only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "fusion_test_util.h"
#include "kernels/cpu/cpu_kernels.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::RandomTensor;

using testing::kOracle;

std::vector<Tensor> RunPlan(const Graph& graph, const Tensor& x, const CompileOptions& options,
                            std::vector<OpProfile>* profile = nullptr) {
  return Compile(graph, {{x.dtype(), x.shape()}}, options)->Run({x}, profile);
}

Graph QdqConvGraph(DType q_type) {
  GraphBuilder b("qdq", 13);
  auto x = b.Input("x", DType::kF32, {1, 8, 10, 10});
  auto scale = b.Constant(Tensor::Scalar<float>(0.05f));
  auto zp = q_type == DType::kI8 ? b.Constant(Tensor::Scalar<int8_t>(-3)) : b.Constant(Tensor::Scalar<uint8_t>(120));
  auto q = b.Op("QuantizeLinear", {x, scale, zp});
  auto dq = b.Op("DequantizeLinear", {q, scale, zp});
  auto y = b.Op("Conv", {dq, b.Constant(RandomTensor({8, 8, 3, 3}, 5, -0.3f, 0.3f))},
                {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  auto q2 = b.Op("QuantizeLinear", {y, scale, zp});
  b.Output(b.Op("DequantizeLinear", {q2, scale, zp}), "y");
  return b.Finish();
}

TEST(QdqFusion, QdqConvChainWithinOneStepOfReference) {
  // Values beyond the int8 range on purpose: saturation must survive the rewrite; halves of the scale test rounding.
  Tensor x = RandomTensor({1, 8, 10, 10}, 3, -9.f, 9.f);
  for (int64_t i = 0; i < 40; ++i) x.data<float>()[i] = 0.025f * static_cast<float>(i - 20);
  for (DType t : {DType::kI8, DType::kU8}) {
    SCOPED_TRACE(DTypeName(t));
    const Graph g = QdqConvGraph(t);
    const Tensor expected = RunPlan(g, x, kOracle)[0];
    std::vector<OpProfile> profile;
    const Tensor got = RunPlan(g, x, CompileOptions{.num_threads = 2, .fast_kernels = true, .fuse = true}, &profile)[0];
    bool rewritten = false;
    for (const OpProfile& p : profile) {
      EXPECT_NE(p.op_type, "QuantizeLinear");
      EXPECT_NE(p.op_type, "DequantizeLinear");
      rewritten = rewritten || p.kernel == "FakeQuantizeF32Fast";
    }
    EXPECT_TRUE(rewritten);
    // The Conv's summation order differs between the reference and oneDNN (PairAloneIsExact checks the pair alone):
    // equal wherever no rounding boundary of the second pair was crossed, else one step.
    ASSERT_EQ(got.numel(), expected.numel());
    int64_t off_by_one = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      const float d = std::abs(got.data<float>()[i] - expected.data<float>()[i]);
      EXPECT_LE(d, 0.05f * 1.0001f) << i;
      off_by_one += d > 0;
    }
    EXPECT_LE(off_by_one, got.numel() / 50);
  }
}

TEST(QdqFusion, PairAloneIsExact) {
  GraphBuilder b("pair", 13);
  auto x = b.Input("x", DType::kF32, {2, 3, 4, 5});
  auto scale = b.Constant(Tensor::Scalar<float>(0.07f));
  auto zp = b.Constant(Tensor::Scalar<int8_t>(7));
  auto q = b.Op("QuantizeLinear", {x, scale, zp});
  b.Output(b.Op("Relu", {b.Op("DequantizeLinear", {q, scale, zp})}), "y");
  const Graph g = b.Finish();
  Tensor x_value = RandomTensor({2, 3, 4, 5}, 9, -20.f, 20.f);
  // Halves of the scale and their neighbours: where x / s and x * (1 / s) round apart.
  for (int64_t k = 0; k < 40; ++k) {
    x_value.data<float>()[2 * k] = (static_cast<float>(k - 20) + 0.5f) * 0.07f;
    x_value.data<float>()[2 * k + 1] = std::nextafter(x_value.data<float>()[2 * k], 100.f);
  }
  const Tensor expected = RunPlan(g, x_value, kOracle)[0];
  // The fused pair on the fast kernel (one step, the Relu its fused step) and on the reference kernel.
  std::vector<OpProfile> profile;
  const Tensor got =
      RunPlan(g, x_value, CompileOptions{.num_threads = 2, .fast_kernels = true, .fuse = true}, &profile)[0];
  ASSERT_EQ(profile.size(), 1u);
  EXPECT_EQ(profile[0].kernel, "FakeQuantizeF32Fast");
  const Tensor got_reference =
      RunPlan(g, x_value, CompileOptions{.num_threads = 2, .fast_kernels = false, .fuse = true})[0];
  for (int64_t i = 0; i < got.numel(); ++i) {
    EXPECT_EQ(got.data<float>()[i], expected.data<float>()[i]) << i;
    EXPECT_EQ(got_reference.data<float>()[i], expected.data<float>()[i]) << i;
  }
}

// A pair after data movement of a value already on its grid (a channel shuffle between two pairs, as
// quantize_static writes ShuffleNet) changes nothing and is dropped; one with another scale or zero point is kept.
// Oracle: the unfused reference run, bit for bit (the saturated and the halfway values included).
TEST(QdqFusion, PairOnItsOwnGridIsDropped) {
  for (const bool same : {true, false}) {
    SCOPED_TRACE(same ? "same grid" : "another zero point");
    GraphBuilder b("shuffle", 13);
    auto x = b.Input("x", DType::kF32, {1, 8, 3, 3});
    auto scale = b.Constant(Tensor::Scalar<float>(0.07f));
    auto zp = b.Constant(Tensor::Scalar<int8_t>(7));
    auto zp2 = b.Constant(Tensor::Scalar<int8_t>(same ? 7 : 6));
    auto fq = b.Op("DequantizeLinear", {b.Op("QuantizeLinear", {x, scale, zp}), scale, zp});
    auto r = b.Op("Reshape", {fq, b.Constant(Tensor::FromVector<int64_t>({5}, {1, 2, 4, 3, 3}))});
    auto t = b.Op("Transpose", {r}, {{"perm", Attribute::Ints({0, 2, 1, 3, 4})}});
    auto back = b.Op("Reshape", {t, b.Constant(Tensor::FromVector<int64_t>({4}, {1, 8, 3, 3}))});
    auto pooled = b.Op("MaxPool", {back}, {{"kernel_shape", Attribute::Ints({2, 2})}});
    auto fq2 = b.Op("DequantizeLinear", {b.Op("QuantizeLinear", {pooled, scale, zp2}), scale, zp2});
    b.Output(b.Op("Add", {fq2, fq2}), "y");
    const Graph g = b.Finish();
    Tensor x_value = RandomTensor({1, 8, 3, 3}, 4, -20.f, 20.f);
    for (int64_t k = 0; k < 36; ++k) x_value.data<float>()[k] = (static_cast<float>(k - 18) + 0.5f) * 0.07f;
    const Tensor expected = RunPlan(g, x_value, kOracle)[0];
    for (const bool fast : {true, false}) {
      std::vector<OpProfile> profile;
      const Tensor got =
          RunPlan(g, x_value, CompileOptions{.num_threads = 2, .fast_kernels = fast, .fuse = true}, &profile)[0];
      int pairs = 0;
      for (const OpProfile& p : profile) pairs += p.op_type == "Round";
      EXPECT_EQ(pairs, same ? 1 : 2) << (fast ? "fast kernels" : "reference kernels");
      ASSERT_EQ(got.numel(), expected.numel());
      for (int64_t i = 0; i < got.numel(); ++i) EXPECT_EQ(got.data<float>()[i], expected.data<float>()[i]) << i;
    }
  }
}

// What quantize_dynamic writes: DynamicQuantizeLinear -> ConvInteger -> Add(int32 bias computed from the run-time
// scale, reshaped to [1, M, 1, 1]) -> Cast -> Mul(scale) (older ONNX Runtime; newer ones add a float bias after the
// Mul: `bias` false, here with a 1x1 output), and MatMulInteger -> Cast -> Mul. The chain becomes one node
// carrying `_dequantize` (the Add and Cast disappear) and stays bit-identical to the reference, with the fast kernels
// (int8 where the CPU's products are exact, float32 otherwise) and with the reference kernels.
Graph DynamicQuantGraph(bool conv, bool bias_add = true) {
  GraphBuilder b("dynamic", 13);
  auto x = b.Input("x", DType::kF32, conv ? std::vector<int64_t>{1, 5, 9, 8} : std::vector<int64_t>{3, 33});
  auto q = b.OpMulti("DynamicQuantizeLinear", {x}, 3);
  auto cast_to_float = AttributeMap{{"to", Attribute::Int(1)}};
  Tensor w(DType::kU8, conv ? Shape{7, 5, 3, 3} : Shape{33, 9});
  for (int64_t i = 0; i < w.numel(); ++i) w.data<uint8_t>()[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  const float w_scale = 0.013f;
  auto scale = b.Op("Mul", {q[1], b.Constant(Tensor::Scalar<float>(w_scale))});
  if (!conv) {
    Tensor zp(DType::kU8, {9});
    for (int i = 0; i < 9; ++i) zp.data<uint8_t>()[i] = static_cast<uint8_t>(60 + 17 * i);
    auto acc = b.Op("MatMulInteger", {q[0], b.Constant(w), q[2], b.Constant(zp)});
    b.Output(b.Op("Mul", {b.Op("Cast", {acc}, cast_to_float), scale}), "y");
    return b.Finish();
  }
  if (!bias_add) {  // a 9x8 kernel: a 1x1 output
    Tensor w_full(DType::kU8, {7, 5, 9, 8});
    for (int64_t i = 0; i < w_full.numel(); ++i) w_full.data<uint8_t>()[i] = static_cast<uint8_t>((i * 29 + 3) % 256);
    auto acc = b.Op("ConvInteger", {q[0], b.Constant(w_full), q[2], b.Constant(Tensor::Scalar<uint8_t>(40))});
    b.Output(b.Op("Mul", {b.Op("Cast", {acc}, cast_to_float), scale}), "y");
    return b.Finish();
  }
  auto acc = b.Op("ConvInteger", {q[0], b.Constant(w), q[2], b.Constant(Tensor::Scalar<uint8_t>(178))},
                  {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  Tensor bias(DType::kF32, {7});
  for (int i = 0; i < 7; ++i) bias.data<float>()[i] = 0.3f * static_cast<float>(i - 3);
  auto bias_q = b.Op("Cast", {b.Op("Floor", {b.Op("Div", {b.Constant(bias), scale})})},
                     {{"to", Attribute::Int(6)}});
  auto bias_4d = b.Op("Reshape", {bias_q, b.Constant(Tensor::FromVector<int64_t>({4}, {1, 7, 1, 1}))});
  auto sum = b.Op("Add", {acc, bias_4d});
  b.Output(b.Op("Mul", {b.Op("Cast", {sum}, cast_to_float), scale}), "y");
  return b.Finish();
}

TEST(QdqFusion, IntegerResultDequantizedInOnePass) {
  for (const int variant : {0, 1, 2}) {
    const bool conv = variant != 1, bias_add = variant == 0;
    SCOPED_TRACE(variant == 0 ? "ConvInteger" : variant == 1 ? "MatMulInteger" : "ConvInteger, 1x1 output, no Add");
    const Graph g = DynamicQuantGraph(conv, bias_add);
    const Tensor x = RandomTensor(conv ? Shape{1, 5, 9, 8} : Shape{3, 33}, 6, -3.f, 5.f);
    const Tensor expected = RunPlan(g, x, kOracle)[0];
    for (const bool fast : {true, false}) {
      std::vector<OpProfile> profile;
      const Tensor got =
          RunPlan(g, x, CompileOptions{.num_threads = 2, .fast_kernels = fast, .fuse = true}, &profile)[0];
      int integer_ops = 0, adds = 0, casts = 0;
      for (const OpProfile& p : profile) {
        integer_ops += p.op_type == "ConvInteger" || p.op_type == "MatMulInteger";
        adds += p.op_type == "Add";
        casts += p.op_type == "Cast";
      }
      EXPECT_EQ(integer_ops, 1);
      EXPECT_EQ(adds, 0) << (fast ? "fast kernels" : "reference kernels");
      EXPECT_EQ(casts, bias_add ? 1 : 0) << "only the bias's Cast to int32 is left";
      ASSERT_EQ(got.numel(), expected.numel());
      ASSERT_EQ(got.dtype(), DType::kF32);
      for (int64_t i = 0; i < got.numel(); ++i) EXPECT_EQ(got.data<float>()[i], expected.data<float>()[i]) << i;
    }
  }
}

// A model that writes the internal epilogue itself gets named errors, not a crash: `_dequantize` without its scale,
// and a fused bias without the attribute.
TEST(QdqFusion, DequantizeEpilogueIsChecked) {
  auto compile = [](bool attribute, bool scale) {
    GraphBuilder b("fused", 13);
    auto x = b.Input("x", DType::kU8, {2, 4});
    std::vector<ValueRef> in{x, b.Constant(Tensor::Zeros(DType::kI8, {4, 3})), b.Constant(Tensor::Scalar<uint8_t>(3)),
                             b.Constant(Tensor::Scalar<int8_t>(0)), b.Constant(Tensor::Scalar<int32_t>(5))};
    if (scale) in.push_back(b.Constant(Tensor::Scalar<float>(0.5f)));
    AttributeMap attrs;
    if (attribute) attrs["_dequantize"] = Attribute::Int(1);
    b.Output(b.Op("MatMulInteger", in, attrs), "y");
    return Compile(b.Finish(), {{DType::kU8, {2, 4}}}, kOracle);
  };
  auto expect_error = [&](bool attribute, bool scale, const std::string& words) {
    try {
      compile(attribute, scale);
      ADD_FAILURE() << "no error; expected one mentioning " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  expect_error(true, false, "_dequantize needs a float32 scale as input 5");
  expect_error(false, true, "need _dequantize = 1");
  Tensor x(DType::kU8, {2, 4});
  for (int i = 0; i < 8; ++i) x.data<uint8_t>()[i] = static_cast<uint8_t>(i);
  const std::vector<Tensor> out = compile(true, true)->Run({x});  // w = 0: y = float(0 + 5) * 0.5
  ASSERT_EQ(out[0].dtype(), DType::kF32);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(out[0].data<float>()[i], 2.5f);
}

// A model whose Round claims a fused pair with bad parts is refused at compile time, naming the attribute.
TEST(QdqFusion, FusedPairAttributesAreChecked) {
  auto compile = [](AttributeMap attrs) {
    GraphBuilder b("fq", 13);
    auto x = b.Input("x", DType::kF32, {2, 3});
    b.Output(b.Op("Round", {x}, attrs), "y");
    return Compile(b.Finish(), {{DType::kF32, {2, 3}}}, kOracle);
  };
  auto expect_error = [&](AttributeMap attrs, const std::string& words) {
    try {
      compile(std::move(attrs));
      ADD_FAILURE() << "no error; expected one mentioning " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  const AttributeMap good{{"_quant_scale", Attribute::Float(0.5f)},
                          {"_quant_lo", Attribute::Float(-128.f)},
                          {"_quant_hi", Attribute::Float(127.f)}};
  const std::vector<Tensor> out = compile(good)->Run({RandomTensor({2, 3}, 1, -200.f, 200.f)});
  EXPECT_EQ(out[0].numel(), 6);
  AttributeMap zero = good, nan = good, swapped = good, partial = good;
  zero["_quant_scale"] = Attribute::Float(0.f);
  nan["_quant_scale"] = Attribute::Float(std::nanf(""));
  swapped["_quant_lo"] = Attribute::Float(200.f);
  partial.erase("_quant_hi");
  expect_error(zero, "_quant_scale must be a finite value > 0");
  expect_error(nan, "_quant_scale must be a finite value > 0");
  expect_error(swapped, "_quant_lo must be <= _quant_hi");
  expect_error(partial, "together");
}

// A QLinearConv with constant symmetric int8 weights runs on the int8 convolution where FuseInt8 would put a QDQ
// one (6 input channels: only where the CPU's int8 products are exact), else on the float one between pairs.
TEST(QdqFusion, QLinearConvWithConstantWeightsRunsOnAFastConv) {
  GraphBuilder b("qlinearconv", 13);
  auto x = b.Input("x", DType::kU8, {1, 6, 9, 9});
  Tensor w(DType::kI8, {4, 6, 3, 3});
  for (int64_t i = 0; i < w.numel(); ++i) w.data<int8_t>()[i] = static_cast<int8_t>((i * 37) % 255 - 127);
  Tensor w_scale = Tensor::FromVector<float>({4}, {0.01f, 0.02f, 0.005f, 0.03f});
  Tensor bias = Tensor::FromVector<int32_t>({4}, {100, -2000, 0, 5000});
  auto y = b.Op("QLinearConv",
                {x, b.Constant(Tensor::Scalar<float>(0.02f)), b.Constant(Tensor::Scalar<uint8_t>(128)), b.Constant(w),
                 b.Constant(w_scale), b.Constant(Tensor::Zeros(DType::kI8, {4})),
                 b.Constant(Tensor::Scalar<float>(0.5f)), b.Constant(Tensor::Scalar<uint8_t>(100)), b.Constant(bias)},
                {{"pads", Attribute::Ints({1, 1, 1, 1})}, {"strides", Attribute::Ints({2, 2})}});
  b.Output(y, "y");
  const Graph g = b.Finish();
  Tensor x_value(DType::kU8, {1, 6, 9, 9});
  for (int64_t i = 0; i < x_value.numel(); ++i) x_value.data<uint8_t>()[i] = static_cast<uint8_t>((i * 91) % 256);
  const Tensor expected = RunPlan(g, x_value, kOracle)[0];
  std::vector<OpProfile> profile;
  const Tensor got =
      RunPlan(g, x_value, CompileOptions{.num_threads = 2, .fast_kernels = true, .fuse = true}, &profile)[0];
  const std::string want = Int8ProductsExact() ? "ConvInt8Dnnl" : "ConvF32Dnnl";
  bool fast_conv = false;
  for (const OpProfile& p : profile) fast_conv = fast_conv || (p.op_type == "Conv" && p.kernel == want);
  EXPECT_TRUE(fast_conv) << want;
  ASSERT_EQ(got.dtype(), DType::kU8);
  for (int64_t i = 0; i < got.numel(); ++i)
    EXPECT_LE(std::abs(int{got.data<uint8_t>()[i]} - int{expected.data<uint8_t>()[i]}), 1) << i;
}

}  // namespace
}  // namespace osprey
