// Channel shuffle fusion (src/runtime/fusion_patterns.cc), the _ChannelShuffle op (src/ops/internal_ops.cc,
// kernels/reference/internal.cc) and the channel-axis data-movement kernels (kernels/cpu/channel_kernels.cc).
// Oracles: values computed by hand for the reference kernel; for the fused and channels-last plans, the same graph
// compiled unfused with reference kernels only (every node one ONNX op exactly as written). Plan profiles show which
// kernels ran, so the tests also check that the channels-last path was taken (no reorders around the shuffle).
#include <gtest/gtest.h>

#include <map>

#include "fusion_test_util.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::RandomTensor;

using testing::kOracle;

Tensor I64(std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return Tensor::FromVector<int64_t>({n}, v);
}

ValueRef Conv(GraphBuilder& b, ValueRef x, int64_t out_channels, int64_t in_channels, int64_t k, uint32_t seed) {
  const int64_t pad = k / 2;
  return b.Op("Conv", {x, b.Constant(RandomTensor({out_channels, in_channels, k, k}, seed))},
              {{"pads", Attribute::Ints({pad, pad, pad, pad})}});
}

// Concat -> Reshape [N, g, C/g, H, W] -> Transpose(0, 2, 1, 3, 4) -> Reshape [N, C, H, W], as torchvision exports it.
ValueRef Shuffle(GraphBuilder& b, const std::vector<ValueRef>& parts, const Shape& shape, int64_t groups) {
  ValueRef x = parts.size() == 1 ? parts[0] : b.Op("Concat", parts, {{"axis", Attribute::Int(1)}});
  const int64_t n = shape[0], c = shape[1], h = shape[2], w = shape[3];
  auto grouped = b.Op("Reshape", {x, b.Constant(I64({n, groups, c / groups, h, w}))});
  auto swapped = b.Op("Transpose", {grouped}, {{"perm", Attribute::Ints({0, 2, 1, 3, 4})}});
  return b.Op("Reshape", {swapped, b.Constant(I64({n, c, h, w}))});
}

ValueRef ChannelSlice(GraphBuilder& b, ValueRef x, int64_t first, int64_t end) {
  return b.Op("Slice", {x, b.Constant(I64({first})), b.Constant(I64({end})), b.Constant(I64({1}))});
}

struct PlanRun {
  std::vector<Tensor> outputs;
  std::map<std::string, int> kernels;   // kernel name -> steps
  std::map<std::string, int> op_types;  // op type -> steps
  int Kernel(const std::string& name) const { return kernels.count(name) ? kernels.at(name) : 0; }
  int Op(const std::string& name) const { return op_types.count(name) ? op_types.at(name) : 0; }
};

PlanRun RunPlan(const Graph& g, const std::vector<Tensor>& inputs, const CompileOptions& options) {
  std::vector<TensorSpec> specs;
  for (const Tensor& t : inputs) specs.push_back({t.dtype(), t.shape()});
  std::vector<OpProfile> profile;
  PlanRun r;
  r.outputs = Compile(g, specs, options)->Run(inputs, &profile);
  for (const OpProfile& p : profile) {
    ++r.kernels[p.kernel];
    ++r.op_types[p.op_type];
  }
  return r;
}

// Runs `g` fused with fast kernels and fused with reference kernels; both must match the unfused reference plan.
// Returns the fast run.
PlanRun ExpectMatchesOracle(const Graph& g, const std::vector<Tensor>& inputs) {
  const PlanRun want = RunPlan(g, inputs, kOracle);
  const PlanRun reference = RunPlan(g, inputs, {.num_threads = 2, .fast_kernels = false, .fuse = true});
  const PlanRun fast = RunPlan(g, inputs, {.num_threads = 2, .fast_kernels = true, .fuse = true});
  EXPECT_EQ(reference.outputs.size(), want.outputs.size());
  EXPECT_EQ(fast.outputs.size(), want.outputs.size());
  for (size_t i = 0; i < want.outputs.size() && i < fast.outputs.size() && i < reference.outputs.size(); ++i) {
    SCOPED_TRACE("output " + std::to_string(i));
    ExpectTensorNear(reference.outputs[i], want.outputs[i], 1e-5f, 1e-6f);
    ExpectTensorNear(fast.outputs[i], want.outputs[i], 1e-4f, 1e-4f);
  }
  return fast;
}

TEST(ChannelShuffle, ReferenceKernelByHand) {
  // Inputs of 2 and 4 channels concatenate to X = [a0, a1, b0, b1, b2, b3]; with 2 groups shuffled channel k takes
  // X[(k % 2) * 3 + k / 2]: order 0, 3, 1, 4, 2, 5 = [a0, b1, a1, b2 | b0, b3] cut as split [4, 2].
  GraphBuilder b("shuffle_by_hand", 13);
  auto a = b.Input("a", DType::kF32, {2, 2, 1, 3});
  auto c = b.Input("b", DType::kF32, {2, 4, 1, 3});
  auto outs =
      b.OpMulti("_ChannelShuffle", {a, c}, 2, {{"groups", Attribute::Int(2)}, {"split", Attribute::Ints({4, 2})}});
  b.Output(outs[0], "first");
  b.Output(outs[1], "second");
  Graph g = b.Finish();
  // Element value: 100 * input + 10 * channel + position (batch item n adds 1000 * n).
  auto fill = [](Shape shape, float input) {
    Tensor t(DType::kF32, shape);
    float* p = t.data<float>();
    for (int64_t n = 0; n < shape[0]; ++n)
      for (int64_t ch = 0; ch < shape[1]; ++ch)
        for (int64_t x = 0; x < 3; ++x) *p++ = 1000.f * n + 100.f * input + 10.f * ch + x;
    return t;
  };
  const std::vector<Tensor> inputs = {fill({2, 2, 1, 3}, 1), fill({2, 4, 1, 3}, 2)};
  const std::vector<std::pair<float, float>> first = {{1, 0}, {2, 1}, {1, 1}, {2, 2}};  // (input, channel)
  const std::vector<std::pair<float, float>> second = {{2, 0}, {2, 3}};
  auto expected = [](const std::vector<std::pair<float, float>>& sources) {
    std::vector<float> v;
    for (int n = 0; n < 2; ++n)
      for (auto [input, ch] : sources)
        for (int x = 0; x < 3; ++x) v.push_back(1000.f * n + 100.f * input + 10.f * ch + x);
    return v;
  };
  for (bool fast : {false, true}) {
    SCOPED_TRACE(fast ? "fast kernel (plain)" : "reference kernel");
    const PlanRun r = RunPlan(g, inputs, {.num_threads = 2, .fast_kernels = fast, .fuse = true});
    ASSERT_EQ(r.outputs.size(), 2u);
    EXPECT_EQ(r.outputs[0].shape(), (Shape{2, 4, 1, 3}));
    EXPECT_EQ(r.outputs[0].ToFloatVector(), expected(first));
    EXPECT_EQ(r.outputs[1].shape(), (Shape{2, 2, 1, 3}));
    EXPECT_EQ(r.outputs[1].ToFloatVector(), expected(second));
    if (fast) {
      EXPECT_EQ(r.Kernel("ChannelShufflePlain"), 1);
    }
  }
}

TEST(ChannelShuffle, SchemaRejectsGroupsThatDoNotDivideTheChannels) {
  GraphBuilder b("bad_groups", 13);
  auto a = b.Input("a", DType::kF32, {1, 6, 2, 2});
  b.Output(b.Op("_ChannelShuffle", {a}, {{"groups", Attribute::Int(4)}}), "y");
  Graph g = b.Finish();
  try {
    Compile(g, {{DType::kF32, {1, 6, 2, 2}}}, kOracle);
    FAIL() << "groups 4 over 6 channels was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("groups"), std::string::npos) << e.what();
  }
}

TEST(ChannelShuffle, ShuffleNetUnitsStayChannelsLast) {
  // Two ShuffleNet v2 units: a downsampling-free unit whose shuffle feeds two channel Slices (absorbed into the fused
  // node), then a second shuffle read directly by a Conv. Channels 12 (6 per branch), odd spatial size.
  GraphBuilder b("shufflenet_units", 13);
  const Shape shape = {2, 12, 7, 5};
  auto x = b.Input("x", DType::kF32, {2, 8, 7, 5});
  auto left = b.Op("Relu", {Conv(b, x, 6, 8, 1, 1)});
  auto right = b.Op("Relu", {Conv(b, b.Op("Relu", {Conv(b, x, 6, 8, 3, 2)}), 6, 6, 1, 3)});
  auto shuffled = Shuffle(b, {left, right}, shape, 2);
  auto keep = ChannelSlice(b, shuffled, 0, 6);
  auto work = ChannelSlice(b, shuffled, 6, 12);
  auto branch = b.Op("Relu", {Conv(b, Conv(b, work, 6, 6, 3, 4), 6, 6, 1, 5)});
  auto shuffled2 = Shuffle(b, {keep, branch}, shape, 2);
  b.Output(Conv(b, shuffled2, 4, 12, 1, 6), "y");
  Graph g = b.Finish();
  const PlanRun fast = ExpectMatchesOracle(g, {RandomTensor({2, 8, 7, 5}, 7)});
  EXPECT_EQ(fast.Kernel("ChannelShuffleF32Nhwc"), 2);
  for (const char* op : {"Concat", "Reshape", "Transpose", "Slice", "_LayoutReorder"}) EXPECT_EQ(fast.Op(op), 0) << op;
}

TEST(ChannelShuffle, SingleInputThreeGroupsWithAPartialSlice) {
  // No Concat in front (the shuffled tensor is one Conv output), 3 groups over 9 channels, and one Slice that does not
  // cover all channels: it stays a Slice, run channels-last.
  GraphBuilder b("three_groups", 13);
  auto x = b.Input("x", DType::kF32, {3, 4, 5, 6});
  auto shuffled = Shuffle(b, {Conv(b, x, 9, 4, 1, 1)}, {3, 9, 5, 6}, 3);
  auto part = ChannelSlice(b, shuffled, 2, 7);
  b.Output(Conv(b, part, 3, 5, 3, 2), "y");
  b.Output(b.Op("Relu", {Conv(b, shuffled, 2, 9, 1, 3)}), "z");
  Graph g = b.Finish();
  const PlanRun fast = ExpectMatchesOracle(g, {RandomTensor({3, 4, 5, 6}, 8)});
  EXPECT_EQ(fast.Kernel("ChannelShuffleF32Nhwc"), 1);
  EXPECT_EQ(fast.Kernel("SliceChannelsF32Nhwc"), 1);
  EXPECT_EQ(fast.Op("_LayoutReorder"), 0);
}

TEST(ChannelShuffle, ShuffleThatIsAGraphOutputIsPlain) {
  // The shuffled tensor is a graph output (so plain) and the Slices are not absorbed; values still match.
  GraphBuilder b("shuffle_output", 13);
  auto x = b.Input("x", DType::kF32, {1, 4, 3, 3});
  auto shuffled = Shuffle(b, {Conv(b, x, 5, 4, 1, 1), Conv(b, x, 5, 4, 3, 2)}, {1, 10, 3, 3}, 2);
  b.Output(shuffled, "shuffled");
  b.Output(Conv(b, ChannelSlice(b, shuffled, 5, 10), 2, 5, 1, 3), "y");
  Graph g = b.Finish();
  const PlanRun fast = ExpectMatchesOracle(g, {RandomTensor({1, 4, 3, 3}, 9)});
  EXPECT_EQ(fast.Op("_ChannelShuffle"), 1);
}

TEST(ChannelKernels, ConcatAndSplitOfChannelsLastConvOutputs) {
  // DenseNet-like: odd channel counts (3, 5, 13) concatenated channels-last, then a Split (opset 13: sizes as input)
  // of the concatenation, each part read by a Conv.
  GraphBuilder b("concat_split", 13);
  auto x = b.Input("x", DType::kF32, {2, 3, 9, 7});
  auto cat = b.Op("Concat", {Conv(b, x, 3, 3, 1, 1), Conv(b, x, 5, 3, 3, 2), Conv(b, x, 13, 3, 1, 3)},
                  {{"axis", Attribute::Int(1)}});
  auto parts = b.OpMulti("Split", {cat, b.Constant(I64({4, 17}))}, 2, {{"axis", Attribute::Int(1)}});
  b.Output(Conv(b, parts[0], 2, 4, 1, 4), "y0");
  b.Output(Conv(b, parts[1], 3, 17, 3, 5), "y1");
  b.Output(Conv(b, cat, 2, 21, 1, 6), "y2");
  Graph g = b.Finish();
  const PlanRun fast = ExpectMatchesOracle(g, {RandomTensor({2, 3, 9, 7}, 10)});
  EXPECT_EQ(fast.Kernel("ConcatF32Nhwc"), 1);
  EXPECT_EQ(fast.Kernel("SplitChannelsF32Nhwc"), 1);
  EXPECT_EQ(fast.Op("_LayoutReorder"), 0);
}

TEST(ChannelKernels, LargeChannelsLastSplitInThreePartsRunsInParallel) {
  // Large enough for the parallel path (pixels shared among threads, every output written in one pass), as YOLO's
  // C2f blocks split a Conv's output.
  GraphBuilder b("split_large", 13);
  auto x = b.Input("x", DType::kF32, {1, 3, 64, 64});
  auto parts =
      b.OpMulti("Split", {Conv(b, x, 24, 3, 3, 1), b.Constant(I64({8, 5, 11}))}, 3, {{"axis", Attribute::Int(1)}});
  b.Output(Conv(b, parts[0], 4, 8, 3, 2), "y0");
  b.Output(Conv(b, parts[1], 3, 5, 1, 3), "y1");
  b.Output(Conv(b, parts[2], 2, 11, 3, 4), "y2");
  Graph g = b.Finish();
  const PlanRun fast = ExpectMatchesOracle(g, {RandomTensor({1, 3, 64, 64}, 13)});
  EXPECT_EQ(fast.Kernel("SplitChannelsF32Nhwc"), 1);
}

TEST(ChannelKernels, PlainConcatSliceOfGraphInputs) {
  // Plain tensors: Concat on axis 2 of float inputs and on axis 0 of int64 inputs, a channel Slice and a channel
  // Split of a plain input.
  GraphBuilder b("plain_concat", 13);
  auto p = b.Input("p", DType::kF32, {2, 3, 4, 5});
  auto q = b.Input("q", DType::kF32, {2, 3, 1, 5});
  auto i = b.Input("i", DType::kI64, {3, 2});
  auto j = b.Input("j", DType::kI64, {1, 2});
  b.Output(b.Op("Concat", {p, q, p}, {{"axis", Attribute::Int(2)}}), "f");
  b.Output(b.Op("Concat", {i, j}, {{"axis", Attribute::Int(0)}}), "ints");
  b.Output(ChannelSlice(b, p, 1, 3), "s");
  auto parts = b.OpMulti("Split", {p, b.Constant(I64({1, 2}))}, 2, {{"axis", Attribute::Int(1)}});
  b.Output(parts[0], "s0");
  b.Output(parts[1], "s1");
  Graph g = b.Finish();
  Tensor ints = Tensor::FromVector<int64_t>({3, 2}, {1, -2, 3, 4, 5, 6});
  Tensor more = Tensor::FromVector<int64_t>({1, 2}, {7, 8});
  const PlanRun fast =
      ExpectMatchesOracle(g, {RandomTensor({2, 3, 4, 5}, 11), RandomTensor({2, 3, 1, 5}, 12), ints, more});
  EXPECT_EQ(fast.Kernel("ConcatPlain"), 2);
  EXPECT_EQ(fast.Kernel("SliceChannelsF32"), 1);
  EXPECT_EQ(fast.Kernel("SplitChannelsF32"), 1);
  EXPECT_EQ(fast.outputs[1].ToInt64Vector(), (std::vector<int64_t>{1, -2, 3, 4, 5, 6, 7, 8}));
}

}  // namespace
}  // namespace osprey
