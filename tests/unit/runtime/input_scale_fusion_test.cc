// A squeeze-and-excitation gate, Mul(x, s) with s one factor per image and channel computed at run time, fused into
// the 1x1 Conv that reads the product: one Conv with `_input_scale` and s as input 7 (ops/conv_input_scale.h,
// runtime/fusion.cc FuseConvInputScale). osprey's 1x1 kernel scales its weights (few output channels) or each chunk of
// its input; oneDNN's path scales the input in a pass. Oracle: the same graph compiled without fusion and with
// reference kernels only. The fused node's shape rule and reference kernel are checked on their own too.
#include <gtest/gtest.h>

#include <algorithm>

#include "fusion_test_util.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::RandomTensor;
using testing::ScopedEnv;

using testing::kFast;
using testing::kOracle;

struct SeSpec {
  int64_t batch = 1;
  int64_t channels = 40, out = 24, size = 14;  // out < size^2: osprey's kernel scales its weights
  bool residual = false;                       // the projection adds the block's input (out == 16 then)
  bool scale_first = false;                    // Mul(s, x)
  bool escape = false;                         // the gated features are a graph output too
  bool window3 = false;                        // a 3x3 projection: not fused
};

// EfficientNet's block tail as torchvision exports it, between two convolutions (so its tensors are channels-last):
// the block input x0, its 1x1 expansion h, the gate s = Sigmoid(Conv(SiLU(Conv(GlobalAveragePool(h))))), the
// projection Conv(h * s) [+ x0], then a 1x1 convolution to 8 channels.
Graph SeGraph(const SeSpec& spec) {
  GraphBuilder b("se", 13);
  const int64_t c = spec.channels;
  auto x = b.Op("Conv", {b.Input("x", DType::kF32, {spec.batch, 16, spec.size, spec.size}),
                         b.Constant(RandomTensor({16, 16, 1, 1}, 10, -0.4f, 0.4f))});
  auto h = b.Op("Conv", {x, b.Constant(RandomTensor({c, 16, 1, 1}, 1, -0.4f, 0.4f)), b.Constant(RandomTensor({c}, 2))});
  h = b.Op("Mul", {h, b.Op("Sigmoid", {h})});
  auto squeezed = b.Op("GlobalAveragePool", {h});
  auto t = b.Op("Conv",
                {squeezed, b.Constant(RandomTensor({8, c, 1, 1}, 3, -0.5f, 0.5f)), b.Constant(RandomTensor({8}, 4))});
  t = b.Op("Mul", {t, b.Op("Sigmoid", {t})});
  auto s = b.Op("Sigmoid", {b.Op("Conv", {t, b.Constant(RandomTensor({c, 8, 1, 1}, 5, -1.f, 1.f)),
                                          b.Constant(RandomTensor({c}, 6, -1.f, 1.f))})});
  auto gated = spec.scale_first ? b.Op("Mul", {s, h}) : b.Op("Mul", {h, s});
  const int64_t k = spec.window3 ? 3 : 1;
  AttributeMap pads;
  if (spec.window3) pads["pads"] = Attribute::Ints({1, 1, 1, 1});
  auto y = b.Op(
      "Conv",
      {gated, b.Constant(RandomTensor({spec.out, c, k, k}, 7, -0.3f, 0.3f)), b.Constant(RandomTensor({spec.out}, 8))},
      pads);
  if (spec.residual) y = b.Op("Add", {y, x});
  b.Output(b.Op("Conv", {y, b.Constant(RandomTensor({8, spec.out, 1, 1}, 11, -0.4f, 0.4f))}), "y");
  if (spec.escape) b.Output(gated, "gated");
  return b.Finish();
}

// Runs `graph` with kFast and against the oracle; returns how many Mul steps the fast plan kept and the kernels its
// Conv steps ran on.
std::pair<size_t, std::string> RunAgainstOracle(const Graph& graph, const Shape& x_shape) {
  size_t muls = 0;
  std::string kernels;
  for (const OpProfile& p : testing::RunFastAgainstOracle(graph, x_shape)) {
    muls += p.op_type == "Mul";
    if (p.op_type == "Conv") kernels += " " + p.kernel;
  }
  return {muls, kernels};
}

TEST(InputScaleFusion, GateFusesIntoTheProjectionOnEitherKernel) {
  // OSPREY_POINTWISE=1: osprey's 1x1 kernel wherever it applies; 0: oneDNN's, scaling its input in a pass first.
  for (const char* pointwise : {"1", "0"}) {
    ScopedEnv env("OSPREY_POINTWISE", pointwise);
    for (const SeSpec& spec : {SeSpec{},                                  // weights scaled
                               SeSpec{.batch = 2},                        // per image
                               SeSpec{.batch = 2, .out = 40, .size = 5},  // input scaled (out >= pixels)
                               SeSpec{.batch = 3, .channels = 72, .out = 16, .size = 9, .residual = true},
                               SeSpec{.batch = 2, .out = 48, .size = 3, .residual = false, .scale_first = true}}) {
      SCOPED_TRACE(std::string("OSPREY_POINTWISE=") + pointwise + ", batch " + std::to_string(spec.batch) + ", " +
                   std::to_string(spec.channels) + " -> " + std::to_string(spec.out) + " on " +
                   std::to_string(spec.size) + "x" + std::to_string(spec.size) + (spec.residual ? ", residual" : ""));
      const auto [muls, kernels] = RunAgainstOracle(SeGraph(spec), {spec.batch, 16, spec.size, spec.size});
      // The two SiLUs fuse into their Convs: only the gate's Mul could remain, and it fused.
      EXPECT_EQ(muls, 0u) << kernels;
      if (std::string(pointwise) == "1" && __builtin_cpu_supports("avx512f")) {  // the 1x1 kernel is AVX-512
        EXPECT_NE(kernels.find("ConvF32Pointwise"), std::string::npos) << kernels;
      }
    }
  }
}

TEST(InputScaleFusion, StaysAMulWhereItCannotFuse) {
  // The gated features are also a graph output; the projection is 3x3.
  EXPECT_EQ(RunAgainstOracle(SeGraph({.escape = true}), {1, 16, 14, 14}).first, 1u);
  EXPECT_EQ(RunAgainstOracle(SeGraph({.window3 = true}), {1, 16, 14, 14}).first, 1u);
  // A factor per element, not per channel.
  GraphBuilder b("per_element", 13);
  auto x = b.Input("x", DType::kF32, {1, 8, 5, 5});
  auto s = b.Op("Sigmoid", {x});
  b.Output(b.Op("Conv", {b.Op("Mul", {x, s}), b.Constant(RandomTensor({4, 8, 1, 1}, 1))}), "y");
  EXPECT_EQ(RunAgainstOracle(b.Finish(), {1, 8, 5, 5}).first, 1u);
}

// ---- The fused node itself (what the pass writes), on reference kernels: against Mul then Conv.

Graph FusedNodeGraph(const Shape& scale_shape, AttributeMap extra = {}) {
  GraphBuilder b("fused", 13);
  auto x = b.Input("x", DType::kF32, {2, 5, 7, 6});
  AttributeMap attrs{{"_input_scale", Attribute::Int(1)}};
  for (auto& [k, v] : extra) attrs[k] = v;
  b.Output(b.Op("Conv",
                {x, b.Constant(RandomTensor({6, 5, 1, 1}, 1)), b.Constant(RandomTensor({6}, 2)), ValueRef{}, ValueRef{},
                 ValueRef{}, ValueRef{}, b.Constant(RandomTensor(scale_shape, 3))},
                attrs),
           "y");
  return b.Finish();
}

Graph SeparateGraph(const Shape& scale_shape) {
  GraphBuilder b("separate", 13);
  auto x = b.Input("x", DType::kF32, {2, 5, 7, 6});
  auto m = b.Op("Mul", {x, b.Constant(RandomTensor(scale_shape, 3))});
  b.Output(b.Op("Conv", {m, b.Constant(RandomTensor({6, 5, 1, 1}, 1)), b.Constant(RandomTensor({6}, 2))}), "y");
  return b.Finish();
}

TEST(InputScaleFusion, FusedNodeReferenceMatchesMulThenConv) {
  const std::vector<TensorSpec> specs{{DType::kF32, {2, 5, 7, 6}}};
  const std::vector<Tensor> inputs{RandomTensor({2, 5, 7, 6}, 9, -2.f, 2.f)};
  for (const Shape& scale : {Shape{2, 5, 1, 1}, Shape{1, 5, 1, 1}}) {
    SCOPED_TRACE("scale " + ShapeToString(scale));
    const std::vector<Tensor> expected = Compile(SeparateGraph(scale), specs, kOracle)->Run(inputs);
    const std::vector<Tensor> got = Compile(FusedNodeGraph(scale), specs, kOracle)->Run(inputs);
    ASSERT_EQ(got.size(), 1u);
    ExpectTensorNear(got[0], expected[0], 1e-6f, 1e-6f);
  }
}

TEST(InputScaleFusion, ShapeRuleRejectsMalformedFusedNodes) {
  const std::vector<TensorSpec> specs{{DType::kF32, {2, 5, 7, 6}}};
  auto expect_error = [&](const Graph& g, const std::string& needle) { testing::ExpectCompileError(g, specs, needle); };
  expect_error(FusedNodeGraph({2, 6, 1, 1}), "input scale (input 7) should have shape [2 or 1, 5, 1, 1]");
  expect_error(FusedNodeGraph({3, 5, 1, 1}), "input scale (input 7) should have shape");
  expect_error(FusedNodeGraph({2, 5, 7, 6}), "input scale (input 7) should have shape");
  expect_error(FusedNodeGraph({2, 5, 1, 1}, {{"_input_scale", Attribute::Int(0)}}),
               "input 7 is only allowed on a fused node with _input_scale = 1");
}

}  // namespace
}  // namespace osprey
