// LiftToRank4 (runtime/fusion_1d.cc): rank-3 convolutions, pools and batch normalisations with the elementwise
// ops between them run as rank-4 nodes on [N, C, 1, W], and 3-D ones with a unit depth window over [N, C, 1, H, W] as
// rank-4 nodes on [N, C, H, W]. Oracle: the reference kernels on the graph as written.
#include <gtest/gtest.h>

#include <cstdlib>

#include "fusion_test_util.h"
#include "osprey/graph.h"

namespace osprey {
namespace {

using testing::RandomTensor;
using testing::RunFastAgainstOracle;

// Steps of a profile that are Reshapes: the graphs below have none, so each is a view the lift wrote.
int Reshapes(const std::vector<OpProfile>& profile) {
  int n = 0;
  for (const OpProfile& p : profile) n += p.op_type == "Reshape";
  return n;
}

ValueRef Conv1d(GraphBuilder& b, ValueRef x, int64_t cin, int64_t cout, int64_t group, int64_t k, AttributeMap attrs,
                uint32_t seed) {
  attrs["group"] = Attribute::Int(group);
  return b.Op("Conv",
              {x, b.Constant(RandomTensor({cout, cin / group, k}, seed, -0.5f, 0.5f)),
               b.Constant(RandomTensor({cout}, seed + 1, -0.5f, 0.5f))},
              attrs);
}

// A TCN-like stack on [2, 8, 31]: a depthwise Conv reading a value that stays plain (a Concat), a dilated Conv, a
// dilated depthwise Conv with a residual Add, pools with ceil mode and padding, a batch norm that cannot fold, a
// strided 1x1 Conv, a per-channel scale and a bias along W; `tap` also makes a Conv's output a graph output (written
// back as rank 3 as well as passed on as rank 4).
Graph OneDimensionalNet(bool tap) {
  GraphBuilder b("net_1d", 13);
  auto x = b.Input("x", DType::kF32, {2, 8, 31});
  auto y = b.Op("Concat", {x, b.Op("Neg", {x})}, {{"axis", Attribute::Int(1)}});  // [2, 16, 31]
  y = b.Op("Relu", {Conv1d(b, y, 16, 16, 16, 5, {{"pads", Attribute::Ints({2, 2})}}, 10)});
  y = b.Op("Relu",
           {Conv1d(b, y, 16, 16, 1, 3, {{"pads", Attribute::Ints({2, 2})}, {"dilations", Attribute::Ints({2})}}, 20)});
  if (tap) b.Output(y, "tap");
  auto d = Conv1d(b, y, 16, 16, 16, 3, {{"pads", Attribute::Ints({4, 4})}, {"dilations", Attribute::Ints({4})}}, 30);
  y = b.Op("Relu", {b.Op("Add", {d, y})});  // [2, 16, 31]
  y = b.Op("MaxPool", {y},
           {{"kernel_shape", Attribute::Ints({2})},
            {"strides", Attribute::Ints({2})},
            {"ceil_mode", Attribute::Int(1)}});  // [2, 16, 16]
  y = b.Op("BatchNormalization", {y, b.Constant(RandomTensor({16}, 1, 0.5f, 1.5f)), b.Constant(RandomTensor({16}, 2)),
                                  b.Constant(RandomTensor({16}, 3)), b.Constant(RandomTensor({16}, 4, 0.5f, 1.5f))});
  y = b.Op("AveragePool", {y},
           {{"kernel_shape", Attribute::Ints({3})},
            {"pads", Attribute::Ints({1, 1})},
            {"count_include_pad", Attribute::Int(1)}});                     // [2, 16, 16]
  y = Conv1d(b, y, 16, 12, 1, 1, {{"strides", Attribute::Ints({2})}}, 40);  // [2, 12, 8]
  y = b.Op("Mul", {y, b.Constant(RandomTensor({12, 1}, 50, 0.5f, 1.5f))});
  y = b.Op("Add", {y, b.Constant(RandomTensor({8}, 51))});
  b.Output(y, "y");
  return b.Finish();
}

TEST(LiftOneDimensional, NetworkRunsAsRank4) {
  // Lifted: one Reshape to rank 4 at the input, one back at the output, one more for the tapped output.
  for (bool tap : {false, true}) {
    SCOPED_TRACE(tap);
    EXPECT_EQ(Reshapes(RunFastAgainstOracle(OneDimensionalNet(tap), {2, 8, 31})), tap ? 3 : 2);
  }
  setenv("OSPREY_FUSE_1D", "0", 1);
  EXPECT_EQ(Reshapes(RunFastAgainstOracle(OneDimensionalNet(true), {2, 8, 31})), 0);
  unsetenv("OSPREY_FUSE_1D");
}

TEST(LiftOneDimensional, WeightKnownOnlyAtRunTime) {
  // The middle Conv's weight is a graph input (as some exporters list weights): it is re-shaped by a Reshape step.
  GraphBuilder b("runtime_weight_1d", 13);
  auto x = b.Input("x", DType::kF32, {2, 8, 30});
  auto w = b.Input("w", DType::kF32, {8, 8, 3});
  auto y = b.Op("Relu", {Conv1d(b, x, 8, 8, 1, 3, {{"pads", Attribute::Ints({1, 1})}}, 1)});
  y = b.Op("Relu", {b.Op("Conv", {y, w}, {{"pads", Attribute::Ints({2, 2})}, {"dilations", Attribute::Ints({2})}})});
  y = Conv1d(b, y, 8, 4, 1, 1, {}, 2);
  b.Output(y, "y");
  const Graph graph = b.Finish();
  const std::vector<TensorSpec> specs{{DType::kF32, {2, 8, 30}}, {DType::kF32, {8, 8, 3}}};
  const std::vector<Tensor> in{RandomTensor({2, 8, 30}, 3, -2.f, 2.f), RandomTensor({8, 8, 3}, 4, -0.5f, 0.5f)};
  const std::vector<Tensor> want = Compile(graph, specs, testing::kOracle)->Run(in);
  std::vector<OpProfile> profile;
  const std::vector<Tensor> got = Compile(graph, specs, testing::kFast)->Run(in, &profile);
  ASSERT_EQ(got.size(), 1u);
  testing::ExpectTensorNear(got[0], want[0], 1e-4f, 1e-4f);
  EXPECT_EQ(Reshapes(profile), 3);  // x, w, y
}

TEST(LiftOneDimensional, TwoLayersStayRank3) {
  // Fewer than three convolutions and pools between plain values: the reorders would cost more than they save.
  GraphBuilder b("pair_1d", 13);
  auto x = b.Input("x", DType::kF32, {2, 8, 40});
  auto y = Conv1d(b, x, 8, 8, 8, 3, {{"pads", Attribute::Ints({8, 8})}, {"dilations", Attribute::Ints({8})}}, 1);
  y = b.Op("Relu", {Conv1d(b, y, 8, 16, 1, 1, {}, 2)});
  b.Output(y, "y");
  EXPECT_EQ(Reshapes(RunFastAgainstOracle(b.Finish(), {2, 8, 40})), 0);
}

ValueRef Conv3d(GraphBuilder& b, ValueRef x, int64_t cin, int64_t cout, int64_t group, std::vector<int64_t> window,
                AttributeMap attrs, uint32_t seed) {
  attrs["group"] = Attribute::Int(group);
  return b.Op("Conv",
              {x, b.Constant(RandomTensor({cout, cin / group, window[0], window[1], window[2]}, seed, -0.5f, 0.5f)),
               b.Constant(RandomTensor({cout}, seed + 1, -0.5f, 0.5f))},
              attrs);
}

// A one-frame video network on [2, 3, 1, 13, 12] (RivaGAN's form): a first layer of 3 channels with a 1 x 5 x 5 window,
// a Tanh, a strided grouped Conv, a residual Add, a per-channel scale [C, 1, 1, 1], a batch norm, pools with unit-depth
// windows (ceil mode, padding), a broadcast bias along W, and a graph output tapped in the middle.
Graph UnitDepthNet(bool tap) {
  GraphBuilder b("net_unit_depth", 13);
  auto x = b.Input("x", DType::kF32, {2, 3, 1, 13, 12});
  auto y = b.Op("Tanh", {Conv3d(b, x, 3, 8, 1, {1, 5, 5}, {{"pads", Attribute::Ints({0, 2, 1, 0, 2, 3})}}, 10)});
  if (tap) b.Output(y, "tap");
  auto d = Conv3d(b, y, 8, 8, 4, {1, 3, 3},
                  {{"pads", Attribute::Ints({0, 1, 1, 0, 1, 1})}, {"dilations", Attribute::Ints({3, 1, 1})}}, 20);
  y = b.Op("Relu", {b.Op("Add", {d, y})});
  y = b.Op("Mul", {y, b.Constant(RandomTensor({8, 1, 1, 1}, 30, 0.5f, 1.5f))});
  y = b.Op("MaxPool", {y},
           {{"kernel_shape", Attribute::Ints({1, 2, 2})},
            {"strides", Attribute::Ints({1, 2, 2})},
            {"ceil_mode", Attribute::Int(1)}});  // [2, 8, 1, 7, 6]
  y = b.Op("BatchNormalization", {y, b.Constant(RandomTensor({8}, 1, 0.5f, 1.5f)), b.Constant(RandomTensor({8}, 2)),
                                  b.Constant(RandomTensor({8}, 3)), b.Constant(RandomTensor({8}, 4, 0.5f, 1.5f))});
  y = b.Op("AveragePool", {y},
           {{"kernel_shape", Attribute::Ints({1, 3, 3})},
            {"pads", Attribute::Ints({0, 1, 1, 0, 1, 1})},
            {"count_include_pad", Attribute::Int(1)}});
  y = Conv3d(b, y, 8, 5, 1, {1, 1, 1}, {{"strides", Attribute::Ints({2, 2, 1})}}, 40);  // [2, 5, 1, 4, 6]
  y = b.Op("Add", {y, b.Constant(RandomTensor({6}, 51))});
  b.Output(y, "y");
  return b.Finish();
}

TEST(LiftToRank4, UnitDepthNetworkRunsAsRank4) {
  for (bool tap : {false, true}) {
    SCOPED_TRACE(tap);
    EXPECT_EQ(Reshapes(RunFastAgainstOracle(UnitDepthNet(tap), {2, 3, 1, 13, 12})), tap ? 3 : 2);
  }
  setenv("OSPREY_FUSE_3D", "0", 1);
  EXPECT_EQ(Reshapes(RunFastAgainstOracle(UnitDepthNet(true), {2, 3, 1, 13, 12})), 0);
  unsetenv("OSPREY_FUSE_3D");
}

TEST(LiftToRank4, DepthThatIsNotAUnitStaysRank5) {
  // A 3-tap depth window padded over a one-frame input (only its middle tap reads data; a pool counting the padding
  // divides by all three), and an input of two frames: each stays a 3-D layer.
  {
    GraphBuilder b("depth_window", 13);
    auto x = b.Input("x", DType::kF32, {1, 3, 1, 9, 9});
    b.Output(Conv3d(b, x, 3, 4, 1, {3, 3, 3}, {{"pads", Attribute::Ints({1, 1, 1, 1, 1, 1})}}, 1), "y");
    EXPECT_EQ(Reshapes(RunFastAgainstOracle(b.Finish(), {1, 3, 1, 9, 9})), 0);
  }
  {
    GraphBuilder b("depth_pad", 13);
    auto x = b.Input("x", DType::kF32, {1, 3, 1, 9, 9});
    b.Output(b.Op("AveragePool", {x},
                  {{"kernel_shape", Attribute::Ints({3, 2, 2})},
                   {"pads", Attribute::Ints({1, 0, 0, 1, 0, 0})},
                   {"count_include_pad", Attribute::Int(1)}}),
             "y");  // [1, 3, 1, 8, 8], each a twelfth of four inputs
    EXPECT_EQ(Reshapes(RunFastAgainstOracle(b.Finish(), {1, 3, 1, 9, 9})), 0);
  }
  {
    GraphBuilder b("two_frames", 13);
    auto x = b.Input("x", DType::kF32, {1, 3, 2, 9, 9});
    b.Output(Conv3d(b, x, 3, 4, 1, {1, 3, 3}, {{"pads", Attribute::Ints({0, 1, 1, 0, 1, 1})}}, 1), "y");
    EXPECT_EQ(Reshapes(RunFastAgainstOracle(b.Finish(), {1, 3, 2, 9, 9})), 0);
  }
}

TEST(LiftToRank4, UnitDepthWeightKnownOnlyAtRunTimeAndAutoPad) {
  // A 1 x 3 x 3 weight that is a graph input (re-shaped by a Reshape step) and SAME_UPPER padding at stride 1, 2, 2.
  GraphBuilder b("runtime_weight_unit_depth", 13);
  auto x = b.Input("x", DType::kF32, {2, 4, 1, 9, 10});
  auto w = b.Input("w", DType::kF32, {6, 4, 1, 3, 3});
  auto y = b.Op(
      "Relu",
      {b.Op("Conv", {x, w}, {{"auto_pad", Attribute::String("SAME_UPPER")}, {"strides", Attribute::Ints({1, 2, 2})}})});
  b.Output(y, "y");  // [2, 6, 1, 5, 5]
  const Graph graph = b.Finish();
  const std::vector<TensorSpec> specs{{DType::kF32, {2, 4, 1, 9, 10}}, {DType::kF32, {6, 4, 1, 3, 3}}};
  const std::vector<Tensor> in{RandomTensor({2, 4, 1, 9, 10}, 3, -2.f, 2.f), RandomTensor({6, 4, 1, 3, 3}, 4)};
  const std::vector<Tensor> want = Compile(graph, specs, testing::kOracle)->Run(in);
  std::vector<OpProfile> profile;
  const std::vector<Tensor> got = Compile(graph, specs, testing::kFast)->Run(in, &profile);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].shape(), (Shape{2, 6, 1, 5, 5}));
  testing::ExpectTensorNear(got[0], want[0], 1e-4f, 1e-4f);
  EXPECT_EQ(Reshapes(profile), 3);  // x, w, y
}

}  // namespace
}  // namespace osprey
