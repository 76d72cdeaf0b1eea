// A pointwise Conv whose output only a 3x3 depthwise Conv reads, fused into one Conv with the depthwise part
// (ops/fused_depthwise.h, runtime/fusion.cc FuseConvDepthwise) for oneDNN's fused kernel. Oracle: the same graph
// compiled without fusion and with reference kernels only. The fused node's reference kernel and shape rule are also
// checked on their own, against the two separate Convs.
#include <gtest/gtest.h>

#include "fusion_test_util.h"
#include "kernels/cpu/cpu_kernels.h"
#include "ops/fused_depthwise.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::RandomTensor;

using testing::kFast;
using testing::kOracle;

struct Pair {
  int64_t in_c = 16, mid_c = 96, size = 112, stride = 2;
  bool pointwise_bias = true, depthwise_bias = true;
  std::string pointwise_act = "Clip", depthwise_act = "Clip";  // "" for none, or an ONNX activation op
  bool pointwise_output_too = false;                           // the pointwise output is also a graph output
  std::vector<int64_t> dw_pads{1, 1, 1, 1};                    // TensorFlow's "same" at stride 2: {0, 0, 1, 1}
};

ValueRef Activate(GraphBuilder& b, ValueRef v, const std::string& act) {
  if (act.empty()) return v;
  if (act == "Clip")
    return b.Op("Clip", {v, b.Constant(Tensor::Scalar<float>(0.f)), b.Constant(Tensor::Scalar<float>(6.f))});
  if (act == "Silu") return b.Op("Mul", {v, b.Op("Sigmoid", {v})});  // fused as SiLU
  return b.Op(act, {v});
}

// x -> Conv 1x1 (in_c -> mid_c) -> act -> Conv 3x3 depthwise (stride, pads 1) -> act.
Graph PairGraph(const Pair& p) {
  GraphBuilder b("pw_dw", 13);
  auto x = b.Input("x", DType::kF32, {1, p.in_c, p.size, p.size});
  std::vector<ValueRef> pw_in{x, b.Constant(RandomTensor({p.mid_c, p.in_c, 1, 1}, 1, -0.5f, 0.5f))};
  if (p.pointwise_bias) pw_in.push_back(b.Constant(RandomTensor({p.mid_c}, 2)));
  auto mid = Activate(b, b.Op("Conv", pw_in), p.pointwise_act);
  std::vector<ValueRef> dw_in{mid, b.Constant(RandomTensor({p.mid_c, 1, 3, 3}, 3, -0.5f, 0.5f))};
  if (p.depthwise_bias) dw_in.push_back(b.Constant(RandomTensor({p.mid_c}, 4)));
  auto y = b.Op("Conv", dw_in,
                {{"group", Attribute::Int(p.mid_c)},
                 {"pads", Attribute::Ints(p.dw_pads)},
                 {"strides", Attribute::Ints({p.stride, p.stride})}});
  b.Output(Activate(b, y, p.depthwise_act), "y");
  if (p.pointwise_output_too) b.Output(mid, "mid");
  return b.Finish();
}

// Compiles the pair with fast kernels and fusion; expects `steps` steps (1 when fused) and the oracle's outputs.
void ExpectPair(const Pair& p, size_t steps) {
  const Graph graph = PairGraph(p);
  const std::vector<TensorSpec> specs{{DType::kF32, {1, p.in_c, p.size, p.size}}};
  const std::vector<Tensor> inputs{RandomTensor({1, p.in_c, p.size, p.size}, 7, -2.f, 2.f)};
  const std::vector<Tensor> expected = Compile(graph, specs, kOracle)->Run(inputs);
  auto plan = Compile(graph, specs, kFast);
  std::vector<OpProfile> profile;
  const std::vector<Tensor> got = plan->Run(inputs, &profile);
  std::string names;
  for (const OpProfile& s : profile) names += " " + s.node_name + " (" + s.kernel + ")";
  EXPECT_EQ(plan->num_steps(), steps) << names;
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) ExpectTensorNear(got[i], expected[i], 1e-4f, 1e-4f);
}

// Whether oneDNN has its fused kernel for this pair on this CPU (it has for MobileNetV2's 16 -> 96 on 112x112 with
// AVX-512; on other shapes and ISAs it offers only its reference implementation, and the pair stays two steps).
bool FusesHere(const Pair& p) {
  Node fused;
  fused.op_type = "Conv";
  fused.inputs = {0, 1, p.pointwise_bias ? 2 : -1, -1, 3, p.depthwise_bias ? 4 : -1};
  fused.outputs = {5};
  fused.attrs["_dw_strides"] = Attribute::Ints({p.stride, p.stride});
  fused.attrs["_dw_pads"] = Attribute::Ints(p.dw_pads);
  const Tensor w = RandomTensor({p.mid_c, p.in_c, 1, 1}, 1), b = RandomTensor({p.mid_c}, 2),
               dw = RandomTensor({p.mid_c, 1, 3, 3}, 3), dwb = RandomTensor({p.mid_c}, 4);
  KernelBuildContext ctx{fused, 13};
  ctx.present = {true, true, p.pointwise_bias, false, true, p.depthwise_bias};
  ctx.input_dtypes.assign(6, DType::kF32);
  const int64_t out = (p.size + p.dw_pads[0] + p.dw_pads[2] - 3) / p.stride + 1;
  ctx.input_shapes = {{1, p.in_c, p.size, p.size}, w.shape(), b.shape(), {}, dw.shape(), dwb.shape()};
  ctx.input_values = {nullptr, &w, &b, nullptr, &dw, &dwb};
  ctx.output_dtypes = {DType::kF32};
  ctx.output_shapes = {{1, p.mid_c, out, out}};
  ctx.num_threads = 2;
  return CpuKernelFusesDepthwise(ctx);
}

TEST(DepthwiseFusion, MobileNetV2ExpandThenDepthwiseBecomesOneStep) {
  for (int64_t stride : {1, 2}) {
    SCOPED_TRACE("stride " + std::to_string(stride));
    Pair p;
    p.stride = stride;
    if (!FusesHere(p)) GTEST_SKIP() << "oneDNN offers no fused 1x1 + depthwise kernel for this shape on this CPU";
    ExpectPair(p, 1);
  }
}

TEST(DepthwiseFusion, TensorFlowSamePaddingAtStrideTwo) {
  // Keras exports pad a stride-2 depthwise convolution at the bottom and right only ({0, 0, 1, 1}).
  Pair p;
  p.dw_pads = {0, 0, 1, 1};
  if (!FusesHere(p)) GTEST_SKIP() << "oneDNN offers no fused 1x1 + depthwise kernel for this shape on this CPU";
  ExpectPair(p, 1);
  // Begin pads of 2 (or unequal ones) are not oneDNN's: two steps.
  p.dw_pads = {2, 2, 0, 0};
  ExpectPair(p, 2);
}

TEST(DepthwiseFusion, PointwiseWithoutBiasAndOtherActivations) {
  // oneDNN 3.2's fused kernel crashed when the pointwise convolution had no bias; the kernel passes zeros.
  Pair p;
  p.pointwise_bias = false;
  p.depthwise_bias = false;
  p.pointwise_act = "Relu";
  p.depthwise_act = "";
  if (!FusesHere(p)) GTEST_SKIP() << "oneDNN offers no fused 1x1 + depthwise kernel for this shape on this CPU";
  ExpectPair(p, 1);
  p.pointwise_act = "";
  p.depthwise_act = "HardSwish";
  ExpectPair(p, 1);
  // SiLU on both parts: the pointwise one stays oneDNN's post-op (the depthwise part reads it inside the primitive),
  // the last one the kernel applies itself where it has its fast pass (dnnl_conv.cc OwnSilu).
  p.pointwise_act = "Silu";
  p.depthwise_act = "Silu";
  ExpectPair(p, 1);
}

TEST(DepthwiseFusion, SharedIntermediateOrSmallShapesStayTwoSteps) {
  Pair shared;
  shared.pointwise_output_too = true;  // the intermediate tensor is needed anyway
  ExpectPair(shared, 2);
  Pair small;
  small.size = 14;
  small.in_c = 8;
  small.mid_c = 16;
  if (FusesHere(small)) GTEST_SKIP() << "oneDNN fuses even this small pair on this CPU";
  ExpectPair(small, 2);
}

// ---- The fused node itself (what the fusion pass writes), on reference kernels: against the two Convs.

Graph FusedNodeGraph(int64_t stride, bool bias, const Tensor& dw_weight, AttributeMap extra = {},
                     std::vector<int64_t> pads = {1, 1, 1, 1}) {
  GraphBuilder b("fused", 13);
  auto x = b.Input("x", DType::kF32, {2, 5, 9, 8});
  AttributeMap attrs{{"_activation", Attribute::String("Relu")},
                     {"_dw_strides", Attribute::Ints({stride, stride})},
                     {"_dw_pads", Attribute::Ints(pads)},
                     {"_dw_activation", Attribute::String("Clip")},
                     {"_dw_alpha", Attribute::Float(-1.f)},
                     {"_dw_beta", Attribute::Float(1.f)}};
  for (auto& [k, v] : extra) attrs[k] = v;
  std::vector<ValueRef> in{x, b.Constant(RandomTensor({6, 5, 1, 1}, 1)), b.Constant(RandomTensor({6}, 2)), ValueRef{},
                           b.Constant(dw_weight)};
  if (bias) in.push_back(b.Constant(RandomTensor({6}, 4)));
  b.Output(b.Op("Conv", in, attrs), "y");
  return b.Finish();
}

Graph TwoConvsGraph(int64_t stride, bool bias, std::vector<int64_t> pads = {1, 1, 1, 1}) {
  GraphBuilder b("two", 13);
  auto x = b.Input("x", DType::kF32, {2, 5, 9, 8});
  auto mid = b.Op("Conv", {x, b.Constant(RandomTensor({6, 5, 1, 1}, 1)), b.Constant(RandomTensor({6}, 2))},
                  {{"_activation", Attribute::String("Relu")}});
  std::vector<ValueRef> in{mid, b.Constant(RandomTensor({6, 1, 3, 3}, 3))};
  if (bias) in.push_back(b.Constant(RandomTensor({6}, 4)));
  b.Output(b.Op("Conv", in,
                {{"group", Attribute::Int(6)},
                 {"pads", Attribute::Ints(pads)},
                 {"strides", Attribute::Ints({stride, stride})},
                 {"_activation", Attribute::String("Clip")},
                 {"_alpha", Attribute::Float(-1.f)},
                 {"_beta", Attribute::Float(1.f)}}),
           "y");
  return b.Finish();
}

TEST(DepthwiseFusion, FusedNodeReferenceMatchesTwoConvs) {
  const std::vector<TensorSpec> specs{{DType::kF32, {2, 5, 9, 8}}};
  const std::vector<Tensor> inputs{RandomTensor({2, 5, 9, 8}, 9, -2.f, 2.f)};
  for (int64_t stride : {1, 2}) {
    for (bool bias : {true, false}) {
      SCOPED_TRACE("stride " + std::to_string(stride) + (bias ? ", bias" : ", no bias"));
      const std::vector<Tensor> expected = Compile(TwoConvsGraph(stride, bias), specs, kOracle)->Run(inputs);
      const std::vector<Tensor> got =
          Compile(FusedNodeGraph(stride, bias, RandomTensor({6, 1, 3, 3}, 3)), specs, kOracle)->Run(inputs);
      ASSERT_EQ(got.size(), 1u);
      EXPECT_EQ(got[0].shape(), (Shape{2, 6, (9 - 1) / stride + 1, (8 - 1) / stride + 1}));
      ExpectTensorNear(got[0], expected[0], 1e-6f, 1e-6f);
    }
  }
  const std::vector<int64_t> same{0, 0, 1, 1};
  const std::vector<Tensor> expected = Compile(TwoConvsGraph(2, true, same), specs, kOracle)->Run(inputs);
  const std::vector<Tensor> got =
      Compile(FusedNodeGraph(2, true, RandomTensor({6, 1, 3, 3}, 3), {}, same), specs, kOracle)->Run(inputs);
  EXPECT_EQ(got[0].shape(), (Shape{2, 6, 4, 4}));
  ExpectTensorNear(got[0], expected[0], 1e-6f, 1e-6f);
}

TEST(DepthwiseFusion, FusedNodeShapeRuleRefusesBadParts) {
  const std::vector<TensorSpec> specs{{DType::kF32, {2, 5, 9, 8}}};
  auto expect_error = [&](const Graph& g, const std::string& needle) { testing::ExpectCompileError(g, specs, needle); };
  expect_error(FusedNodeGraph(1, true, RandomTensor({6, 1, 5, 5}, 3)), "[6, 1, 3, 3]");
  expect_error(FusedNodeGraph(1, true, RandomTensor({6, 1, 3, 3}, 3), {{"_dw_strides", Attribute::Ints({1})}}),
               "two _dw_strides");
  expect_error(FusedNodeGraph(1, true, RandomTensor({6, 1, 3, 3}, 3), {{"_dw_activation", Attribute::String("Nope")}}),
               "depthwise activation");
  expect_error(FusedNodeGraph(1, true, RandomTensor({6, 1, 3, 3}, 3), {{"_residual", Attribute::Int(1)}}),
               "residual");
  expect_error(FusedNodeGraph(1, true, RandomTensor({6, 1, 3, 3}, 3), {{"_int8", Attribute::Int(1)}}), "not int8");
  expect_error(FusedNodeGraph(0, true, RandomTensor({6, 1, 3, 3}, 3)), "strides");
  expect_error(FusedNodeGraph(1, true, RandomTensor({6, 1, 3, 3}, 3), {}, {1, 1, 1}), "pads");
  expect_error(FusedNodeGraph(int64_t{1} << 40, true, RandomTensor({6, 1, 3, 3}, 3)), "strides");
  // A model that hands a plain Conv five inputs: refused, not silently ignored.
  GraphBuilder b("five", 13);
  auto x = b.Input("x", DType::kF32, {2, 5, 9, 8});
  b.Output(b.Op("Conv", {x, b.Constant(RandomTensor({6, 5, 1, 1}, 1)), ValueRef{}, ValueRef{},
                         b.Constant(RandomTensor({6, 1, 3, 3}, 3))}),
           "y");
  expect_error(b.Finish(), "only allowed on a fused node with _dw_strides");
}

}  // namespace
}  // namespace osprey
