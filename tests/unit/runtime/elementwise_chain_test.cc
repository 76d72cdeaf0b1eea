// Chains of unary activations and fake quantisations after an elementwise node, fused into it as steps (`_then`,
// ops/activation.h; runtime/fusion.cc FuseElementwiseChains) and applied by the fast elementwise kernels block by
// block. Oracle: the same graph compiled without fusion and with reference kernels only (QuantizeLinear,
// DequantizeLinear, Relu, Sigmoid as ONNX defines them). The fused node's reference path (plan and constant folding)
// and its validation are checked on their own.
#include <gtest/gtest.h>

#include "fusion_test_util.h"
#include "ops/activation.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::RandomTensor;

using testing::kFast;
using testing::kOracle;
constexpr float kScale = 0.05f;

// QuantizeLinear -> DequantizeLinear to uint8 with zero point `zp` (what ONNX Runtime's quantiser and tf2onnx write).
ValueRef QuantDequant(GraphBuilder& b, ValueRef v, uint8_t zp) {
  auto scale = b.Constant(Tensor::Scalar<float>(kScale));
  auto zero = b.Constant(Tensor::Scalar<uint8_t>(zp));
  return b.Op("DequantizeLinear", {b.Op("QuantizeLinear", {v, scale, zero}), scale, zero});
}

struct Result {
  std::vector<Tensor> outputs;
  std::vector<OpProfile> profile;
};

Result RunPlan(const Graph& g, const std::vector<TensorSpec>& specs, const std::vector<Tensor>& inputs,
               const CompileOptions& options) {
  Result r;
  r.outputs = Compile(g, specs, options)->Run(inputs, &r.profile);
  return r;
}

std::string Steps(const Result& r) {
  std::string s;
  for (const OpProfile& p : r.profile) s += " " + p.op_type + " (" + p.kernel + ")";
  return s;
}

TEST(ElementwiseChain, ResidualAddReluFakeQuantizeIsOnePassAndBitIdentical) {
  // A full-integer TFLite model's residual join: Add -> Relu -> Q -> DQ, at batch 2 so the kernel runs many units.
  const Shape shape{2, 16, 40, 40};
  GraphBuilder b("add_relu_qdq", 13);
  auto x = b.Input("x", DType::kF32, shape);
  auto r = b.Input("r", DType::kF32, shape);
  b.Output(QuantDequant(b, b.Op("Relu", {b.Op("Add", {x, r})}), 0), "y");
  const Graph g = b.Finish();
  const std::vector<TensorSpec> specs{{DType::kF32, shape}, {DType::kF32, shape}};
  const std::vector<Tensor> inputs{RandomTensor(shape, 1, -8.f, 8.f), RandomTensor(shape, 2, -8.f, 8.f)};
  const Result expected = RunPlan(g, specs, inputs, kOracle);
  const Result got = RunPlan(g, specs, inputs, kFast);
  ASSERT_EQ(got.profile.size(), 1u) << Steps(got);
  EXPECT_EQ(got.profile[0].kernel, "AddF32Fast") << Steps(got);
  ExpectTensorNear(got.outputs[0], expected.outputs[0], 0.f, 0.f);
}

TEST(ElementwiseChain, QuantisedSiluChainsWithinOneQuantisationStep) {
  // tf2onnx's SiLU of a full-integer model: s = QDQ(Sigmoid(x)); y = QDQ(x * s). The fast Sigmoid differs from the
  // reference in the last bits, so a value may land one quantisation step away.
  const Shape shape{1, 24, 56, 56};
  GraphBuilder b("silu_qdq", 13);
  auto x = b.Input("x", DType::kF32, shape);
  auto xq = QuantDequant(b, x, 128);
  auto s = QuantDequant(b, b.Op("Sigmoid", {xq}), 0);
  b.Output(QuantDequant(b, b.Op("Mul", {xq, s}), 128), "y");
  const Graph g = b.Finish();
  const std::vector<TensorSpec> specs{{DType::kF32, shape}};
  const std::vector<Tensor> inputs{RandomTensor(shape, 3, -6.f, 6.f)};
  const Result expected = RunPlan(g, specs, inputs, kOracle);
  const Result got = RunPlan(g, specs, inputs, kFast);
  size_t rounds = 0;
  for (const OpProfile& p : got.profile) rounds += p.op_type == "Round";
  EXPECT_EQ(rounds, 1u) << Steps(got);  // x's own pair; the Sigmoid and the Mul carry theirs
  EXPECT_EQ(got.profile.size(), 3u) << Steps(got);
  ExpectTensorNear(got.outputs[0], expected.outputs[0], 0.f, kScale * 1.001f);
}

TEST(ElementwiseChain, BetweenConvolutionsAndSharedValuesStaySeparate) {
  // Between convolutions: Sub of two convolutions' outputs -> Relu -> Q -> DQ -> Conv. The
  // Relu's output is also a graph output, so the pair after it stays a step of its own.
  const Shape shape{1, 16, 20, 20};
  GraphBuilder b("nhwc", 13);
  auto x = b.Input("x", DType::kF32, shape);
  auto conv = [&](ValueRef in, uint32_t seed) {
    return b.Op("Conv", {in, b.Constant(RandomTensor({16, 16, 3, 3}, seed, -0.2f, 0.2f))},
                {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  };
  auto relu = b.Op("Relu", {b.Op("Sub", {conv(x, 4), conv(x, 5)})});
  b.Output(conv(QuantDequant(b, relu, 0), 9), "y");
  b.Output(relu, "relu");
  const Graph g = b.Finish();
  const std::vector<TensorSpec> specs{{DType::kF32, shape}};
  const std::vector<Tensor> inputs{RandomTensor(shape, 6, -2.f, 2.f)};
  const Result expected = RunPlan(g, specs, inputs, kOracle);
  const Result got = RunPlan(g, specs, inputs, kFast);
  size_t relus = 0, rounds = 0;
  for (const OpProfile& p : got.profile) {
    relus += p.op_type == "Relu";
    rounds += p.op_type == "Round";
  }
  EXPECT_EQ(relus, 0u) << Steps(got);
  EXPECT_EQ(rounds, 1u) << Steps(got);
  ASSERT_EQ(got.outputs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) ExpectTensorNear(got.outputs[i], expected.outputs[i], 1e-4f, kScale * 1.001f);
}

// ---- A node carrying steps as the pass writes them, on reference kernels and when folded.

Graph CarrierGraph(const std::vector<UnaryStep>& steps, bool constant_inputs, const std::string& op = "Add") {
  GraphBuilder b("carrier", 13);
  const Shape shape{3, 7};
  ValueRef x = constant_inputs ? b.Constant(RandomTensor(shape, 7, -3.f, 3.f)) : b.Input("x", DType::kF32, shape);
  Node n;
  n.op_type = op;
  WriteFusedSteps(n, steps);
  b.Output(b.Op(op, {x, b.Constant(RandomTensor(shape, 8, -3.f, 3.f))}, n.attrs), "y");
  return b.Finish();
}

TEST(ElementwiseChain, ReferenceKernelsAndConstantFoldingApplyTheSteps) {
  UnaryStep clip;
  clip.act = Activation{ActivationKind::kClip, -1.f, 2.f};
  UnaryStep fq;
  fq.fake_quantize = true;
  fq.scale = 0.25f;
  fq.lo = -3.f;
  fq.hi = 5.f;
  const std::vector<UnaryStep> steps{clip, fq};
  const Tensor x = RandomTensor({3, 7}, 7, -3.f, 3.f), c = RandomTensor({3, 7}, 8, -3.f, 3.f);
  std::vector<float> want(21);
  for (int i = 0; i < 21; ++i) {
    const float v = std::min(std::max(x.data<float>()[i] + c.data<float>()[i], -1.f), 2.f);
    want[i] = std::min(std::max(std::nearbyint(v / 0.25f), -3.f), 5.f) * 0.25f;  // hand-computed
  }
  const Tensor expected = Tensor::FromVector<float>({3, 7}, want);
  for (const CompileOptions& options : {kOracle, kFast}) {
    const std::vector<Tensor> run = Compile(CarrierGraph(steps, false), {{DType::kF32, {3, 7}}}, options)->Run({x});
    ExpectTensorNear(run[0], expected, 0.f, 0.f);
  }
  const std::vector<Tensor> folded = Compile(CarrierGraph(steps, true), {}, kOracle)->Run({});
  ExpectTensorNear(folded[0], expected, 0.f, 0.f);
}

TEST(ElementwiseChain, MalformedStepsAreRefused) {
  auto expect_error = [](const Graph& g, const std::string& needle) {
    try {
      Compile(g, {{DType::kF32, {3, 7}}}, kOracle);
      ADD_FAILURE() << "compiled; expected an error containing '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  UnaryStep relu;
  relu.act.kind = ActivationKind::kRelu;
  UnaryStep bad_fq;
  bad_fq.fake_quantize = true;
  bad_fq.scale = 0.f;
  expect_error(CarrierGraph({relu}, false, "Pow"), "op Pow cannot carry them");
  expect_error(CarrierGraph({bad_fq}, false), "finite scale > 0");
  expect_error(CarrierGraph(std::vector<UnaryStep>(9, relu), false), "1 to 8 steps");
  Graph g = CarrierGraph({relu}, false);
  g.nodes[0].attrs["_then"] = Attribute::Ints({55});
  expect_error(g, "unknown step code 55");
  g.nodes[0].attrs["_then"] = Attribute::Ints({1});
  g.nodes[0].attrs["_then_params"] = Attribute::Floats({0.f});
  expect_error(g, "3 values per step");
  // Steps on an int32 Add: the steps are float formulas.
  GraphBuilder b("int_carrier", 13);
  auto xi = b.Input("x", DType::kI32, {3, 7});
  Node n;
  WriteFusedSteps(n, {relu});
  b.Output(b.Op("Add", {xi, xi}, n.attrs), "y");
  try {
    Compile(b.Finish(), {{DType::kI32, {3, 7}}}, kOracle);
    ADD_FAILURE() << "compiled an int32 Add with fused steps";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("need one float32 output"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace osprey
