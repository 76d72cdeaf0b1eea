// A Conv (with or without a fused residual) whose output only a PRelu with per-channel constant slopes reads, fused
// into one Conv with `_prelu` (ops/activation.h, runtime/fusion.cc FuseConvPRelu) that oneDNN runs with a prelu
// post-op. Oracle: the same graph compiled without fusion and with reference kernels only (PRelu's reference kernel
// is checked against ONNX's node tests by tests/conformance). The fused node's shape rule and reference kernel are
// checked on their own too.
#include <gtest/gtest.h>

#include "fusion_test_util.h"
#include "kernels/cpu/cpu_kernels.h"
#include "ops/activation.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::RandomTensor;

using testing::kFast;
using testing::kOracle;

// Slopes of both signs and sizes, so that a slope applied to the wrong channel or not at all shows.
Tensor Slopes(Shape shape, uint32_t seed) { return RandomTensor(std::move(shape), seed, -1.5f, 1.5f); }

struct Compiled {
  std::vector<Tensor> outputs;
  std::string kernels;  // " name (kernel)" per step
  size_t prelu_steps = 0;
};

Compiled Run(const Graph& graph, const Shape& x_shape, const CompileOptions& options) {
  auto plan = Compile(graph, {{DType::kF32, x_shape}}, options);
  std::vector<OpProfile> profile;
  Compiled c;
  c.outputs = plan->Run({RandomTensor(x_shape, 7, -2.f, 2.f)}, &profile);
  for (const OpProfile& s : profile) {
    c.kernels += " " + s.node_name + " (" + s.kernel + ")";
    if (s.op_type == "PRelu") ++c.prelu_steps;
  }
  return c;
}

// Expects the fast, fused plan to match the oracle and to keep `prelu_steps` PRelu steps.
void ExpectFused(const Graph& graph, const Shape& x_shape, size_t prelu_steps) {
  const Compiled expected = Run(graph, x_shape, kOracle);
  const Compiled got = Run(graph, x_shape, kFast);
  EXPECT_EQ(got.prelu_steps, prelu_steps) << got.kernels;
  ASSERT_EQ(got.outputs.size(), expected.outputs.size());
  for (size_t i = 0; i < got.outputs.size(); ++i) ExpectTensorNear(got.outputs[i], expected.outputs[i], 1e-4f, 1e-4f);
}

// Whether oneDNN runs a 3x3 32 -> 32 convolution with a per-channel prelu post-op on this CPU (every x86-64 JIT
// convolution of oneDNN 3 takes it; a CPU where none does keeps the PRelu steps).
bool FusesHere() {
  Node fused;
  fused.op_type = "Conv";
  fused.inputs = {0, 1, 2, -1, -1, -1, 3};
  fused.outputs = {4};
  fused.attrs["pads"] = Attribute::Ints({1, 1, 1, 1});
  fused.attrs["_prelu"] = Attribute::Int(1);
  const Tensor w = RandomTensor({32, 32, 3, 3}, 1), b = RandomTensor({32}, 2), s = Slopes({32}, 3);
  KernelBuildContext ctx{fused, 13};
  ctx.present = {true, true, true, false, false, false, true};
  ctx.input_dtypes.assign(7, DType::kF32);
  ctx.input_shapes = {{1, 32, 16, 16}, w.shape(), b.shape(), {}, {}, {}, s.shape()};
  ctx.input_values = {nullptr, &w, &b, nullptr, nullptr, nullptr, &s};
  ctx.output_dtypes = {DType::kF32};
  ctx.output_shapes = {{1, 32, 16, 16}};
  ctx.num_threads = 2;
  return CpuKernelFusesPRelu(ctx);
}

// MediaPipe's residual block: depthwise 5x5 -> 1x1 -> Add(x) -> PRelu, then a 3x3 stride-2 Conv -> PRelu with slopes
// written [C, 1, 1], then a 1x1 Conv -> PRelu with one slope for all.
Graph BlockGraph() {
  GraphBuilder b("block", 13);
  auto x = b.Input("x", DType::kF32, {1, 32, 24, 24});
  auto dw =
      b.Op("Conv", {x, b.Constant(RandomTensor({32, 1, 5, 5}, 1, -0.3f, 0.3f)), b.Constant(RandomTensor({32}, 2))},
           {{"group", Attribute::Int(32)}, {"pads", Attribute::Ints({2, 2, 2, 2})}});
  auto pw =
      b.Op("Conv", {dw, b.Constant(RandomTensor({32, 32, 1, 1}, 3, -0.3f, 0.3f)), b.Constant(RandomTensor({32}, 4))});
  auto y = b.Op("PRelu", {b.Op("Add", {pw, x}), b.Constant(Slopes({1, 32, 1, 1}, 5))});
  auto down = b.Op("Conv", {y, b.Constant(RandomTensor({16, 32, 3, 3}, 6, -0.2f, 0.2f))},
                   {{"pads", Attribute::Ints({1, 1, 1, 1})}, {"strides", Attribute::Ints({2, 2})}});
  auto z = b.Op("PRelu", {down, b.Constant(Slopes({16, 1, 1}, 8))});
  auto last = b.Op("Conv", {z, b.Constant(RandomTensor({8, 16, 1, 1}, 9)), b.Constant(RandomTensor({8}, 10))});
  b.Output(b.Op("PRelu", {last, b.Constant(Slopes({1}, 11))}), "y");
  return b.Finish();
}

TEST(PReluFusion, MediaPipeBlockRunsWithoutPReluSteps) {
  if (!FusesHere()) GTEST_SKIP() << "oneDNN has no convolution with a prelu post-op on this CPU";
  ExpectFused(BlockGraph(), {1, 32, 24, 24}, 0);
}

TEST(PReluFusion, OnlyPerChannelConstantSlopesOfAPrivateConvOutputFuse) {
  if (!FusesHere()) GTEST_SKIP() << "oneDNN has no convolution with a prelu post-op on this CPU";
  const Shape x_shape{1, 8, 8, 8};
  auto conv = [](GraphBuilder& b, ValueRef x) {
    return b.Op("Conv", {x, b.Constant(RandomTensor({8, 8, 3, 3}, 1, -0.3f, 0.3f))},
                {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  };
  {
    // Slopes [8] broadcast along W (here as wide as the channels), not along the channels.
    GraphBuilder b("along_w", 13);
    auto x = b.Input("x", DType::kF32, x_shape);
    b.Output(b.Op("PRelu", {conv(b, x), b.Constant(Slopes({8}, 2))}), "y");
    SCOPED_TRACE("slopes along W");
    ExpectFused(b.Finish(), x_shape, 1);
  }
  {
    // One slope per pixel: not a per-channel post-op.
    GraphBuilder b("per_pixel", 13);
    auto x = b.Input("x", DType::kF32, x_shape);
    b.Output(b.Op("PRelu", {conv(b, x), b.Constant(Slopes({1, 8, 8, 8}, 3))}), "y");
    SCOPED_TRACE("slopes per pixel");
    ExpectFused(b.Finish(), x_shape, 1);
  }
  {
    // The convolution's output is also a graph output: it must exist before the PRelu.
    GraphBuilder b("shared", 13);
    auto x = b.Input("x", DType::kF32, x_shape);
    auto c = conv(b, x);
    b.Output(b.Op("PRelu", {c, b.Constant(Slopes({1, 8, 1, 1}, 4))}), "y");
    b.Output(c, "c");
    SCOPED_TRACE("conv output read elsewhere");
    ExpectFused(b.Finish(), x_shape, 1);
  }
  {
    // A Relu fused first: the PRelu after it stays a step of its own.
    GraphBuilder b("relu", 13);
    auto x = b.Input("x", DType::kF32, x_shape);
    b.Output(b.Op("PRelu", {b.Op("Relu", {conv(b, x)}), b.Constant(Slopes({1, 8, 1, 1}, 5))}), "y");
    SCOPED_TRACE("after a fused Relu");
    ExpectFused(b.Finish(), x_shape, 1);
  }
}

TEST(PReluFusion, SlopesGivenAtRunTimeStayAPReluStep) {
  GraphBuilder b("runtime_slopes", 13);
  auto x = b.Input("x", DType::kF32, {1, 4, 6, 6});
  auto s = b.Input("s", DType::kF32, {1, 4, 1, 1});
  b.Output(b.Op("PRelu", {b.Op("Conv", {x, b.Constant(RandomTensor({4, 4, 1, 1}, 1))}), s}), "y");
  auto plan = Compile(b.Finish(), {{DType::kF32, {1, 4, 6, 6}}, {DType::kF32, {1, 4, 1, 1}}}, kFast);
  EXPECT_EQ(plan->num_steps(), 2u);
}

// ---- The fused node itself (what the pass writes), on reference kernels: against Conv (+ residual) then PRelu.

Graph FusedNodeGraph(const Tensor& slopes, AttributeMap extra = {}) {
  GraphBuilder b("fused", 13);
  auto x = b.Input("x", DType::kF32, {2, 5, 7, 6});
  AttributeMap attrs{
      {"pads", Attribute::Ints({1, 1, 1, 1})}, {"_residual", Attribute::Int(1)}, {"_prelu", Attribute::Int(1)}};
  for (auto& [k, v] : extra) attrs[k] = v;
  b.Output(b.Op("Conv",
                {x, b.Constant(RandomTensor({6, 5, 3, 3}, 1)), b.Constant(RandomTensor({6}, 2)),
                 b.Constant(RandomTensor({2, 6, 7, 6}, 3)), ValueRef{}, ValueRef{}, b.Constant(slopes)},
                attrs),
           "y");
  return b.Finish();
}

Graph SeparateGraph(const Tensor& slopes) {
  GraphBuilder b("separate", 13);
  auto x = b.Input("x", DType::kF32, {2, 5, 7, 6});
  auto c = b.Op("Conv", {x, b.Constant(RandomTensor({6, 5, 3, 3}, 1)), b.Constant(RandomTensor({6}, 2))},
                {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  auto r = b.Op("Add", {c, b.Constant(RandomTensor({2, 6, 7, 6}, 3))});
  Tensor per_channel = slopes.numel() == 1 ? slopes : slopes.Reshaped({6, 1, 1});
  b.Output(b.Op("PRelu", {r, b.Constant(per_channel)}), "y");
  return b.Finish();
}

TEST(PReluFusion, FusedNodeReferenceMatchesConvAddPRelu) {
  const std::vector<TensorSpec> specs{{DType::kF32, {2, 5, 7, 6}}};
  const std::vector<Tensor> inputs{RandomTensor({2, 5, 7, 6}, 9, -2.f, 2.f)};
  for (const Tensor& slopes : {Slopes({6}, 4), Slopes({1}, 5)}) {
    SCOPED_TRACE("slopes " + ShapeToString(slopes.shape()));
    const std::vector<Tensor> expected = Compile(SeparateGraph(slopes), specs, kOracle)->Run(inputs);
    const std::vector<Tensor> got = Compile(FusedNodeGraph(slopes), specs, kOracle)->Run(inputs);
    ASSERT_EQ(got.size(), 1u);
    ExpectTensorNear(got[0], expected[0], 1e-6f, 1e-6f);
  }
}

TEST(PReluFusion, ShapeRuleRejectsMalformedFusedNodes) {
  const std::vector<TensorSpec> specs{{DType::kF32, {2, 5, 7, 6}}};
  auto expect_error = [&](const Graph& g, const std::string& needle) { testing::ExpectCompileError(g, specs, needle); };
  expect_error(FusedNodeGraph(Slopes({5}, 1)), "PRelu slope (input 6) should have shape [1] or [6]");
  expect_error(FusedNodeGraph(Slopes({6}, 1), {{"_activation", Attribute::String("Relu")}}),
               "a fused PRelu (_prelu) is the node's only activation");
  expect_error(FusedNodeGraph(Slopes({6}, 1), {{"_prelu", Attribute::Int(0)}}),
               "input 6 is only allowed on a fused node with _prelu = 1");
}

}  // namespace
}  // namespace osprey
