// A Concat along channels whose output only a BatchNormalization reads, fused into one Concat carrying the
// normalisation (`_scale` / `_shift` and the activation; runtime/fusion.cc FuseConcatBatchNorm, kernels/cpu/
// batchnorm.cc). Oracle: the same graph compiled without fusion and with reference kernels only. The fused node's
// reference kernel and shape rule are also checked on their own.
#include <gtest/gtest.h>

#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::RandomTensor;

const CompileOptions kOracle{.num_threads = 2, .fast_kernels = false, .fuse = false};
const CompileOptions kFast{.num_threads = 2, .fast_kernels = true, .fuse = true};

struct Block {
  int64_t batch = 2, size = 9;
  std::vector<int64_t> pieces{16, 5, 17};  // channels of the concatenated tensors (odd: vector tails)
  bool through_conv = true;  // each piece comes out of a Conv (channels-last plans); else graph inputs (plain)
  std::string act = "Relu";  // the BatchNormalization's activation: "" for none, or an ONNX activation op
  bool concat_output_too = false;  // the concatenation is also a graph output: nothing to fuse
  int64_t axis = 1;
};

std::vector<TensorSpec> Specs(const Block& p) {
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < p.pieces.size(); ++i)
    specs.push_back({DType::kF32, {p.batch, p.through_conv ? 3 : p.pieces[i], p.size, p.size}});
  return specs;
}

std::vector<Tensor> Inputs(const Block& p) {
  std::vector<Tensor> inputs;
  for (const TensorSpec& s : Specs(p)) inputs.push_back(RandomTensor(s.shape, 7 + inputs.size(), -2.f, 2.f));
  return inputs;
}

// Pieces -> Concat -> BatchNormalization -> activation -> Conv 1x1 (a DenseNet layer's start).
Graph BlockGraph(const Block& p) {
  GraphBuilder b("dense", 13);
  std::vector<ValueRef> parts;
  int64_t channels = 0;
  for (size_t i = 0; i < p.pieces.size(); ++i) {
    const std::string name = "x" + std::to_string(i);
    const int64_t c = p.pieces[i];
    auto x = b.Input(name, DType::kF32, Specs(p)[i].shape);
    parts.push_back(p.through_conv ? b.Op("Conv", {x, b.Constant(RandomTensor({c, 3, 3, 3}, 20 + i)),
                                                   b.Constant(RandomTensor({c}, 40 + i))},
                                          {{"pads", Attribute::Ints({1, 1, 1, 1})}})
                                   : x);
    channels += c;
  }
  auto cat = b.Op("Concat", parts, {{"axis", Attribute::Int(p.axis)}});
  const int64_t c = p.axis == 1 ? channels : p.pieces[0];
  auto y = b.Op("BatchNormalization",
                {cat, b.Constant(RandomTensor({c}, 1, 0.5f, 1.5f)), b.Constant(RandomTensor({c}, 2)),
                 b.Constant(RandomTensor({c}, 3)), b.Constant(RandomTensor({c}, 4, 0.1f, 2.f))},
                {{"epsilon", Attribute::Float(1e-3f)}});
  if (p.act == "LeakyRelu") y = b.Op("LeakyRelu", {y}, {{"alpha", Attribute::Float(0.1f)}});
  else if (!p.act.empty()) y = b.Op(p.act, {y});
  b.Output(b.Op("Conv", {y, b.Constant(RandomTensor({8, c, 1, 1}, 5)), b.Constant(RandomTensor({8}, 6))}), "y");
  if (p.concat_output_too) b.Output(cat, "cat");
  return b.Finish();
}

// Compiles the block with fast kernels and fusion; expects the oracle's outputs and whether a fused Concat ran
// (kernel `fused_kernel`, no BatchNormalization step) or the two nodes stayed apart.
void ExpectBlock(const Block& p, const std::string& fused_kernel) {
  const Graph graph = BlockGraph(p);
  const std::vector<Tensor> inputs = Inputs(p);
  const std::vector<Tensor> expected = Compile(graph, Specs(p), kOracle)->Run(inputs);
  auto plan = Compile(graph, Specs(p), kFast);
  std::vector<OpProfile> profile;
  const std::vector<Tensor> got = plan->Run(inputs, &profile);
  std::string names, concat_kernel;
  bool bn_step = false;
  for (const OpProfile& s : profile) {
    names += " " + s.op_type + " (" + s.kernel + ")";
    if (s.op_type == "Concat") concat_kernel = s.kernel;
    bn_step = bn_step || s.op_type == "BatchNormalization";
  }
  if (fused_kernel.empty()) {
    EXPECT_TRUE(bn_step) << names;
  } else {
    EXPECT_FALSE(bn_step) << names;
    EXPECT_EQ(concat_kernel, fused_kernel) << names;
  }
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) ExpectTensorNear(got[i], expected[i], 1e-4f, 1e-4f);  // oneDNN sums in another order
}

TEST(ConcatBatchNormFusion, DenseNetLayerBecomesOneChannelsLastPass) {
  Block p;
  ExpectBlock(p, "ConcatBatchNormF32Nhwc");
  p.pieces = {64, 32, 32, 32};  // DenseNet's shapes: whole vectors
  p.size = 14;
  ExpectBlock(p, "ConcatBatchNormF32Nhwc");
  p.batch = 1;
  p.size = 48;  // large enough for the parallel path
  ExpectBlock(p, "ConcatBatchNormF32Nhwc");
}

TEST(ConcatBatchNormFusion, PlainTensorsAndOtherActivations) {
  Block p;
  p.through_conv = false;  // graph inputs are plain: the plain kernel
  for (const char* act : {"Relu", "", "LeakyRelu", "Sigmoid", "HardSwish"}) {
    SCOPED_TRACE(std::string("activation '") + act + "'");
    p.act = act;
    ExpectBlock(p, "ConcatBatchNormF32");
  }
  p.act = "Tanh";
  p.through_conv = true;
  ExpectBlock(p, "ConcatBatchNormF32Nhwc");
}

TEST(ConcatBatchNormFusion, SharedConcatOrOtherAxisStayTwoSteps) {
  Block shared;
  shared.concat_output_too = true;  // the concatenation is needed anyway
  ExpectBlock(shared, "");
  Block height;
  height.through_conv = false;
  height.pieces = {6, 6};
  height.axis = 2;  // concatenated along H: the normalisation is not per concatenated channel
  ExpectBlock(height, "");
}

// ---- The fused node itself, on reference kernels: against Concat + BatchNormalization written out.

Graph FusedConcatGraph(AttributeMap attrs, int64_t axis = 1, DType dtype = DType::kF32) {
  GraphBuilder b("fused", 13);
  auto x0 = b.Input("x0", dtype, {2, 3, 4, 5});
  auto x1 = b.Input("x1", dtype, {2, 2, 4, 5});
  attrs["axis"] = Attribute::Int(axis);
  b.Output(b.Op("Concat", {x0, x1}, attrs), "y");
  return b.Finish();
}

TEST(ConcatBatchNormFusion, FusedNodeReferenceMatchesConcatThenNormalisation) {
  const std::vector<float> a{0.5f, -1.f, 2.f, 1.5f, 0.25f}, b{0.1f, 0.2f, -0.3f, 0.f, 1.f};
  const std::vector<TensorSpec> specs{{DType::kF32, {2, 3, 4, 5}}, {DType::kF32, {2, 2, 4, 5}}};
  const std::vector<Tensor> inputs{RandomTensor({2, 3, 4, 5}, 1, -2.f, 2.f), RandomTensor({2, 2, 4, 5}, 2, -2.f, 2.f)};
  const std::vector<Tensor> got =
      Compile(FusedConcatGraph({{"_scale", Attribute::Floats(a)},
                                {"_shift", Attribute::Floats(b)},
                                {"_activation", Attribute::String("Clip")},
                                {"_alpha", Attribute::Float(-1.f)},
                                {"_beta", Attribute::Float(1.f)}}),
              specs, kOracle)
          ->Run(inputs);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0].shape(), (Shape{2, 5, 4, 5}));
  // Hand-computed: y[n, c, i] = clip(concat[n, c, i] * a[c] + b[c], -1, 1).
  const float* y = got[0].data<float>();
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 5; ++c)
      for (int64_t i = 0; i < 20; ++i) {
        const Tensor& src = c < 3 ? inputs[0] : inputs[1];
        const int64_t sc = c < 3 ? c : c - 3, sch = c < 3 ? 3 : 2;
        const float v = src.data<float>()[(n * sch + sc) * 20 + i] * a[c] + b[c];
        ASSERT_EQ(y[(n * 5 + c) * 20 + i], std::min(std::max(v, -1.f), 1.f)) << n << " " << c << " " << i;
      }
}

TEST(ConcatBatchNormFusion, FusedNodeShapeRuleRefusesBadParts) {
  const std::vector<TensorSpec> specs{{DType::kF32, {2, 3, 4, 5}}, {DType::kF32, {2, 2, 4, 5}}};
  auto expect_error = [&](const Graph& graph, const std::string& words,
                          const std::vector<TensorSpec>& input_specs) {
    try {
      Compile(graph, input_specs, kOracle);
      ADD_FAILURE() << "no error; expected one mentioning " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  const Attribute five = Attribute::Floats({1, 1, 1, 1, 1});
  expect_error(FusedConcatGraph({{"_scale", Attribute::Floats({1, 1})}, {"_shift", five}}), "5 values", specs);
  expect_error(FusedConcatGraph({{"_scale", five}}), "5 values", specs);
  expect_error(FusedConcatGraph({{"_scale", five}, {"_shift", five}, {"_activation", Attribute::String("Nope")}}),
               "unknown fused activation", specs);
  const std::vector<TensorSpec> rows{{DType::kF32, {2, 3, 4, 5}}, {DType::kF32, {2, 3, 2, 5}}};
  expect_error(FusedConcatGraph({{"_scale", five}, {"_shift", five}}, 2), "along axis 1", rows);
  const std::vector<TensorSpec> ints{{DType::kI32, {2, 3, 4, 5}}, {DType::kI32, {2, 2, 4, 5}}};
  expect_error(FusedConcatGraph({{"_scale", five}, {"_shift", five}}, 1, DType::kI32), "float32", ints);
}

}  // namespace
}  // namespace osprey
