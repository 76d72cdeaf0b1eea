// A Concat along the channels and/or an inference BatchNormalization (with or without its ReLU) read only by a 1x1
// Conv, fused after the layout pass into the Conv's input: `_input_parts` (the Concat's inputs) and `_input_affine`
// (the normalisation's per-channel a, b; `_input_relu`) (ops/conv_input_scale.h, runtime/fusion.cc FuseConvInputs).
// osprey's 1x1 kernel forms each chunk of its input rows where it reads them. Oracle: the same graph compiled without
// fusion and with reference kernels only. The fused node's shape rule and reference kernel are checked on their own.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

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

struct DenseSpec {
  int64_t batch = 2, size = 48;
  std::vector<int64_t> parts{24, 40, 13};  // channels of the concatenated feature maps (none: no Concat)
  int64_t single = 80;                     // without parts: the channels of the two maps added
  bool norm = true;                        // a BatchNormalization before the 1x1 Conv
  bool relu = true;                        // and a ReLU after it
  int64_t out = 40;                        // the 1x1 Conv's output channels
  bool escape = false;                     // the concatenation is a graph output too
  bool window3 = false;                    // the Conv reading it is 3x3: not fused
};

// DenseNet's layer as torchvision exports it: feature maps made by convolutions (so they are channels-last),
// concatenated, normalised, ReLU, a 1x1 Conv, then a 1x1 Conv to 8 channels.
Graph DenseGraph(const DenseSpec& spec) {
  GraphBuilder b("dense", 13);
  auto x = b.Input("x", DType::kF32, {spec.batch, 16, spec.size, spec.size});
  std::vector<ValueRef> maps;
  int64_t channels = 0;
  int seed = 1;
  for (int64_t c : spec.parts.empty() ? std::vector<int64_t>{spec.single, spec.single} : spec.parts) {
    maps.push_back(b.Op("Conv", {x, b.Constant(RandomTensor({c, 16, 1, 1}, seed++, -0.4f, 0.4f)),
                                 b.Constant(RandomTensor({c}, seed++))}));
    channels += c;
  }
  // Without parts, a residual sum (pre-activation ResNets): a normalisation right after a Conv folds into it.
  if (spec.parts.empty()) channels = spec.single;
  ValueRef h = spec.parts.empty() ? b.Op("Add", maps) : b.Op("Concat", maps, {{"axis", Attribute::Int(1)}});
  const ValueRef joined = h;
  if (spec.norm) {
    h = b.Op(
        "BatchNormalization",
        {h, b.Constant(RandomTensor({channels}, 20, 0.5f, 1.5f)), b.Constant(RandomTensor({channels}, 21)),
         b.Constant(RandomTensor({channels}, 22, -0.5f, 0.5f)), b.Constant(RandomTensor({channels}, 23, 0.5f, 2.f))});
  }
  if (spec.relu) h = b.Op("Relu", {h});
  const int64_t k = spec.window3 ? 3 : 1;
  AttributeMap pads;
  if (spec.window3) pads["pads"] = Attribute::Ints({1, 1, 1, 1});
  auto y = b.Op("Conv",
                {h, b.Constant(RandomTensor({spec.out, channels, k, k}, 24, -0.2f, 0.2f)),
                 b.Constant(RandomTensor({spec.out}, 25))},
                pads);
  b.Output(b.Op("Conv", {y, b.Constant(RandomTensor({8, spec.out, 1, 1}, 26, -0.4f, 0.4f))}), "y");
  if (spec.escape) b.Output(joined, "joined");
  return b.Finish();
}

struct Steps {
  size_t concats = 0, norms = 0;
  std::string kernels;  // of the Conv steps
};

Steps RunAgainstOracle(const Graph& graph, const Shape& x_shape) {
  Steps s;
  for (const OpProfile& p : testing::RunFastAgainstOracle(graph, x_shape)) {
    s.concats += p.op_type == "Concat";
    s.norms += p.op_type == "BatchNormalization";
    if (p.op_type == "Conv") s.kernels += " " + p.kernel;
  }
  return s;
}

// osprey's 1x1 kernel (and so the fusion) needs AVX-512.
bool PointwiseKernelHere() { return __builtin_cpu_supports("avx512f"); }

TEST(ConvInputFusion, ConcatAndNormalisationFuseIntoThe1x1Conv) {
  for (const DenseSpec& spec :
       {DenseSpec{},                                                         // parts, affine and ReLU
        DenseSpec{.relu = false},                                            // no ReLU
        DenseSpec{.norm = false, .relu = false},                             // parts only (SqueezeNet, YOLO)
        DenseSpec{.parts = {}},                                              // affine only (a pre-activation ResNet)
        DenseSpec{.batch = 1, .size = 24, .parts = {320, 256}, .out = 520},  // group by group (2.4 MB of weights)
        DenseSpec{.batch = 2, .size = 44, .parts = {320, 256}, .out = 464},  // and over 8 MB of rows: per work item
        DenseSpec{.batch = 3, .size = 24, .parts = {16, 16, 16, 16, 16, 16, 16, 16, 16, 17}, .out = 16}}) {
    SCOPED_TRACE("batch " + std::to_string(spec.batch) + ", " + std::to_string(spec.parts.size()) + " parts, norm " +
                 std::to_string(spec.norm) + ", relu " + std::to_string(spec.relu) + ", out " +
                 std::to_string(spec.out));
    const Steps fused = RunAgainstOracle(DenseGraph(spec), {spec.batch, 16, spec.size, spec.size});
    if (!PointwiseKernelHere()) continue;
    EXPECT_EQ(fused.concats, 0u) << fused.kernels;
    EXPECT_EQ(fused.norms, 0u) << fused.kernels;
    EXPECT_NE(fused.kernels.find("ConvF32Pointwise"), std::string::npos) << fused.kernels;
    // Switched off, the same graph keeps its Concat and normalisation steps.
    ScopedEnv off("OSPREY_FUSE_INPUTS", "0");
    const Steps plain = RunAgainstOracle(DenseGraph(spec), {spec.batch, 16, spec.size, spec.size});
    EXPECT_EQ(plain.concats, spec.parts.empty() ? 0u : 1u);
    EXPECT_EQ(plain.norms, spec.norm ? 1u : 0u);
  }
}

TEST(ConvInputFusion, StaysWhereItCannotFuse) {
  // The concatenation is also a graph output; the Conv reading it is 3x3; the input is small enough to stay in a
  // cache between the passes (kMinFusedInputBytes).
  for (const DenseSpec& spec : {DenseSpec{.escape = true}, DenseSpec{.window3 = true}, DenseSpec{.size = 16}}) {
    const Steps s = RunAgainstOracle(DenseGraph(spec), {spec.batch, 16, spec.size, spec.size});
    EXPECT_EQ(s.concats, 1u) << s.kernels;
  }
}

// ---- The fused node itself (what the pass writes), on reference kernels: against Concat, affine, ReLU, Conv.

const Shape kPartA{2, 3, 5, 4}, kPartB{2, 4, 5, 4};

// `drop`: attributes to leave out; `scale`: an input scale at input 7 too; `no_shift`: input 9 left out.
struct FusedNodeOptions {
  AttributeMap extra;
  std::vector<std::string> drop;
  bool scale = false, no_shift = false;
};

Graph FusedNodeGraph(const Shape& b_shape, const Shape& affine_shape, const FusedNodeOptions& o = {}) {
  GraphBuilder b("fused", 13);
  auto pa = b.Input("a", DType::kF32, kPartA);
  auto pb = b.Input("b", DType::kF32, b_shape);
  AttributeMap attrs{{"_input_parts", Attribute::Ints({3, 4})},
                     {"_input_affine", Attribute::Int(1)},
                     {"_input_relu", Attribute::Int(1)}};
  for (auto& [k, v] : o.extra) attrs[k] = v;
  for (const std::string& k : o.drop) attrs.erase(k);
  b.Output(b.Op("Conv",
                {pa, b.Constant(RandomTensor({6, 7, 1, 1}, 1)), b.Constant(RandomTensor({6}, 2)), ValueRef{},
                 ValueRef{}, ValueRef{}, ValueRef{}, o.scale ? b.Constant(RandomTensor({1, 7, 1, 1}, 5)) : ValueRef{},
                 b.Constant(RandomTensor(affine_shape, 3)),
                 o.no_shift ? ValueRef{} : b.Constant(RandomTensor(affine_shape, 4)), pb},
                attrs),
           "y");
  return b.Finish();
}

Graph SeparateGraph() {
  GraphBuilder b("separate", 13);
  auto joined = b.Op("Concat", {b.Input("a", DType::kF32, kPartA), b.Input("b", DType::kF32, kPartB)},
                     {{"axis", Attribute::Int(1)}});
  auto scaled = b.Op("Mul", {joined, b.Constant(RandomTensor({1, 7, 1, 1}, 3))});
  auto shifted = b.Op("Add", {scaled, b.Constant(RandomTensor({1, 7, 1, 1}, 4))});
  b.Output(b.Op("Conv",
                {b.Op("Relu", {shifted}), b.Constant(RandomTensor({6, 7, 1, 1}, 1)), b.Constant(RandomTensor({6}, 2))}),
           "y");
  return b.Finish();
}

TEST(ConvInputFusion, FusedNodeReferenceMatchesConcatAffineReluConv) {
  const std::vector<TensorSpec> specs{{DType::kF32, kPartA}, {DType::kF32, kPartB}};
  const std::vector<Tensor> inputs{RandomTensor(kPartA, 9, -2.f, 2.f), RandomTensor(kPartB, 10, -2.f, 2.f)};
  const std::vector<Tensor> expected = Compile(SeparateGraph(), specs, kOracle)->Run(inputs);
  const std::vector<Tensor> got = Compile(FusedNodeGraph(kPartB, {7}), specs, kOracle)->Run(inputs);
  ASSERT_EQ(got.size(), 1u);
  ExpectTensorNear(got[0], expected[0], 1e-6f, 1e-6f);
  // Written in a model file, the node compiles in a fast plan too (it stays plain, on the reference kernel).
  const std::vector<Tensor> fast = Compile(FusedNodeGraph(kPartB, {7}), specs, kFast)->Run(inputs);
  ASSERT_EQ(fast.size(), 1u);
  ExpectTensorNear(fast[0], expected[0], 1e-6f, 1e-6f);
}

TEST(ConvInputFusion, ShapeRuleRejectsMalformedFusedNodes) {
  auto expect_error = [&](const Graph& g, const Shape& b_shape, const std::string& needle) {
    testing::ExpectCompileError(g, {{DType::kF32, kPartA}, {DType::kF32, b_shape}}, needle);
  };
  expect_error(FusedNodeGraph({2, 5, 5, 4}, {7}), {2, 5, 5, 4}, "part 1 (input 10) should have shape [2, 4, 5, 4]");
  expect_error(FusedNodeGraph({2, 4, 5, 3}, {7}), {2, 4, 5, 3}, "part 1 (input 10) should have shape");
  expect_error(FusedNodeGraph(kPartB, {8}), kPartB, "input affine (input 8) should have shape [7]");
  expect_error(FusedNodeGraph(kPartB, {7}, {.extra = {{"_input_parts", Attribute::Ints({3, 4, 2})}}}), kPartB,
               "_input_parts lists 3 parts");
  expect_error(FusedNodeGraph(kPartB, {7}, {.extra = {{"_input_parts", Attribute::Ints({7})}}}), kPartB,
               "_input_parts should list 2 to 256");
  expect_error(FusedNodeGraph(kPartB, {7}, {.extra = {{"_input_affine", Attribute::Int(0)}}}), kPartB,
               "inputs 8 and 9 and _input_relu are only allowed on a fused node with _input_affine = 1");
  expect_error(FusedNodeGraph(kPartB, {7}, {.drop = {"_input_parts"}}), kPartB,
               "inputs 10 and on are only allowed with _input_parts");
  expect_error(FusedNodeGraph(kPartB, {7}, {.no_shift = true}), kPartB, "_input_affine is set but input 9 is missing");
  expect_error(FusedNodeGraph(kPartB, {7}, {.extra = {{"_input_scale", Attribute::Int(1)}}, .scale = true}), kPartB,
               "needs a 2-D convolution without _dw_strides, _int8 or _input_scale");
}

}  // namespace
}  // namespace osprey
