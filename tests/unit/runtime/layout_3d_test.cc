// Channels-last rank-5 activations (AssignLayouts with rank 5, runtime/layout.cc): between 3-D convolutions, pools
// and batch norms, video and volume networks keep NDHWC tensors; the elementwise ops between them run on the physical
// shapes, and a Keras model's NDHWC <-> NCDHW Transposes of such values are copies. Oracle: the reference kernels on
// the graph as written (no fusion); the fast plan's kernels show which path was taken.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "fusion_test_util.h"
#include "osprey/graph.h"

namespace osprey {
namespace {

using testing::RandomTensor;
using testing::RunFastAgainstOracle;

ValueRef Conv3d(GraphBuilder& b, ValueRef x, int64_t cin, int64_t cout, std::vector<int64_t> window, AttributeMap attrs,
                uint32_t seed) {
  return b.Op("Conv",
              {x, b.Constant(RandomTensor({cout, cin, window[0], window[1], window[2]}, seed, -0.5f, 0.5f)),
               b.Constant(RandomTensor({cout}, seed + 1, -0.5f, 0.5f))},
              attrs);
}

Tensor F32Vector(std::vector<float> v) { return Tensor::FromVector<float>({static_cast<int64_t>(v.size())}, v); }

std::map<std::string, int> KernelCounts(const std::vector<OpProfile>& profile) {
  std::map<std::string, int> counts;
  for (const OpProfile& p : profile) ++counts[p.kernel];
  return counts;
}

// A Keras video block as tf2onnx writes it, on an NDHWC input [2, 4, 10, 9, 3]: Transpose to NCDHW, a 3 x 3 x 3 stem
// with batch norm and Relu, a (1, 3, 3) max pool, a (2+1)-D pair (1 x 3 x 3 strided, then 3 x 1 x 1) with a strided
// 1 x 1 x 1 projection added, a per-channel scale [C, 1, 1, 1] and a bias along W ([W], viewed channels-last), an
// InstanceNorm and LeakyReLU (nnU-Net's), a 2 x 2 x 2 average pool, and a Transpose back to NDHWC as the output; `tap`
// also makes the stem's output a graph output (written plain).
Graph KerasVideoBlock(bool tap) {
  GraphBuilder b("keras_video", 13);
  auto x = b.Input("x", DType::kF32, {2, 4, 10, 9, 3});
  auto y = b.Op("Transpose", {x}, {{"perm", Attribute::Ints({0, 4, 1, 2, 3})}});
  y = Conv3d(b, y, 3, 8, {3, 3, 3}, {{"pads", Attribute::Ints({1, 1, 1, 1, 1, 1})}}, 1);
  y = b.Op("BatchNormalization", {y, b.Constant(RandomTensor({8}, 2, 0.5f, 1.5f)), b.Constant(RandomTensor({8}, 3)),
                                  b.Constant(RandomTensor({8}, 4)), b.Constant(RandomTensor({8}, 5, 0.5f, 1.5f))});
  y = b.Op("Relu", {y});
  if (tap) b.Output(y, "stem");
  y = b.Op("MaxPool", {y},
           {{"kernel_shape", Attribute::Ints({1, 3, 3})},
            {"strides", Attribute::Ints({1, 2, 2})},
            {"pads", Attribute::Ints({0, 1, 1, 0, 1, 1})}});  // [2, 8, 4, 5, 5]
  auto s = Conv3d(b, y, 8, 16, {1, 3, 3},
                  {{"pads", Attribute::Ints({0, 1, 1, 0, 1, 1})}, {"strides", Attribute::Ints({1, 2, 2})}}, 6);
  s = Conv3d(b, b.Op("Relu", {s}), 16, 16, {3, 1, 1}, {{"pads", Attribute::Ints({1, 0, 0, 1, 0, 0})}}, 8);
  auto skip = Conv3d(b, y, 8, 16, {1, 1, 1}, {{"strides", Attribute::Ints({1, 2, 2})}}, 10);  // [2, 16, 4, 3, 3]
  y = b.Op("Relu", {b.Op("Add", {s, skip})});
  y = b.Op("Mul", {y, b.Constant(RandomTensor({16, 1, 1, 1}, 12, 0.5f, 1.5f))});
  y = b.Op("Add", {y, b.Constant(RandomTensor({3}, 13))});
  y = b.Op("InstanceNormalization",
           {y, b.Constant(RandomTensor({16}, 14, 0.5f, 1.5f)), b.Constant(RandomTensor({16}, 15))});
  y = b.Op("LeakyRelu", {y});
  y = b.Op("AveragePool", {y}, {{"kernel_shape", Attribute::Ints({2, 2, 2})}});  // [2, 16, 2, 1, 1]
  b.Output(b.Op("Transpose", {y}, {{"perm", Attribute::Ints({0, 2, 3, 4, 1})}}), "y");
  return b.Finish();
}

TEST(Layout3d, KerasVideoBlockStaysChannelsLast) {
  for (bool tap : {false, true}) {
    SCOPED_TRACE(tap);
    const std::map<std::string, int> kernels =
        KernelCounts(RunFastAgainstOracle(KerasVideoBlock(tap), {2, 4, 10, 9, 3}));
    // Both Transposes are copies of channels-last bytes, and no value is reordered between layers.
    EXPECT_EQ(kernels.count("TransposeLayoutCopy") ? kernels.at("TransposeLayoutCopy") : 0, 2);
    EXPECT_EQ(kernels.count("LayoutReorderF32"), 0u);
    EXPECT_EQ(kernels.count("TransposeCpu"), 0u);
  }
  setenv("OSPREY_NDHWC", "0", 1);
  const std::map<std::string, int> plain = KernelCounts(RunFastAgainstOracle(KerasVideoBlock(true), {2, 4, 10, 9, 3}));
  unsetenv("OSPREY_NDHWC");
  EXPECT_EQ(plain.count("TransposeLayoutCopy"), 0u);
  EXPECT_EQ(plain.count("TransposeCpu") ? plain.at("TransposeCpu") : 0, 2);
}

// nnU-Net's shape on [1, 2, 6, 8, 10]: Conv3d -> InstanceNorm -> LeakyReLU, a strided Conv3d down, ConvTranspose3d
// back up and a trilinear Resize of it, both concatenated with the skip along channels, a last Conv3d: channels-last
// from the first layer to the last.
TEST(Layout3d, UNetLevelStaysChannelsLast) {
  GraphBuilder b("unet_level", 13);
  auto x = b.Input("x", DType::kF32, {1, 2, 6, 8, 10});
  auto block = [&](ValueRef v, int64_t cin, int64_t cout, uint32_t seed, AttributeMap attrs) {
    attrs["pads"] = Attribute::Ints({1, 1, 1, 1, 1, 1});
    auto c = Conv3d(b, v, cin, cout, {3, 3, 3}, attrs, seed);
    auto n = b.Op("InstanceNormalization", {c, b.Constant(RandomTensor({cout}, seed + 2, 0.5f, 1.5f)),
                                            b.Constant(RandomTensor({cout}, seed + 3))});
    return b.Op("LeakyRelu", {n});
  };
  auto skip = block(x, 2, 4, 1, {});
  auto down = block(skip, 4, 8, 11, {{"strides", Attribute::Ints({2, 2, 2})}});  // [1, 8, 3, 4, 5]
  auto up = b.Op("ConvTranspose",
                 {down, b.Constant(RandomTensor({8, 4, 2, 2, 2}, 21, -0.5f, 0.5f)), b.Constant(RandomTensor({4}, 22))},
                 {{"strides", Attribute::Ints({2, 2, 2})}});  // [1, 4, 6, 8, 10]
  auto trilinear = b.Op("Resize", {down, ValueRef{}, b.Constant(F32Vector({1, 1, 2, 2, 2}))},
                        {{"mode", Attribute::String("linear")}});  // [1, 8, 6, 8, 10], as MONAI's U-Nets upsample
  auto merged = b.Op("Concat", {up, skip, trilinear}, {{"axis", Attribute::Int(1)}});
  b.Output(Conv3d(b, merged, 16, 3, {1, 1, 1}, {}, 31), "y");
  const std::map<std::string, int> kernels = KernelCounts(RunFastAgainstOracle(b.Finish(), {1, 2, 6, 8, 10}));
  EXPECT_EQ(kernels.count("LayoutReorderF32"), 0u);
  EXPECT_EQ(kernels.count("ConcatF32Nhwc") ? kernels.at("ConcatF32Nhwc") : 0, 1);
  EXPECT_EQ(kernels.count("ResizeF32Nhwc") ? kernels.at("ResizeF32Nhwc") : 0, 1);
}

TEST(Layout3d, OperandsThatCannotBeViewedChannelsLast) {
  // A 2-D Conv's channels-last output [4, 3, 5, 6] added to a 3-D Conv's [1, 4, 3, 5, 6] (broadcast over a new leading
  // axis: its bytes are not the rank-5 value's channels-last order), and a constant varying along depth [3, 1, 1]:
  // both Adds must run on plain data.
  GraphBuilder b("mixed_ranks", 13);
  auto v = b.Input("v", DType::kF32, {1, 2, 3, 5, 6});
  auto three_d = Conv3d(b, v, 2, 4, {3, 3, 3}, {{"pads", Attribute::Ints({1, 1, 1, 1, 1, 1})}}, 1);
  auto image = b.Op("Reshape", {v, b.Constant(Tensor::FromVector<int64_t>({4}, {2, 3, 5, 6}))});
  auto two_d = b.Op("Conv", {image, b.Constant(RandomTensor({3, 3, 3, 3}, 3, -0.5f, 0.5f))},
                    {{"pads", Attribute::Ints({1, 1, 1, 1})}});  // [2, 3, 5, 6]
  auto two_d_4 = b.Op("Conv", {b.Op("Concat", {two_d, two_d}, {{"axis", Attribute::Int(0)}}),
                               b.Constant(RandomTensor({3, 3, 1, 1}, 4, -0.5f, 0.5f))});  // [4, 3, 5, 6]
  auto y = b.Op("Add", {three_d, two_d_4});
  y = b.Op("Add", {y, b.Constant(RandomTensor({3, 1, 1}, 5))});
  b.Output(Conv3d(b, y, 4, 2, {1, 1, 1}, {}, 6), "y");
  const Tensor in = RandomTensor({1, 2, 3, 5, 6}, 9, -2.f, 2.f);
  const Graph graph = b.Finish();
  const std::vector<TensorSpec> specs{{DType::kF32, {1, 2, 3, 5, 6}}};
  const std::vector<Tensor> want = Compile(graph, specs, testing::kOracle)->Run({in});
  const std::vector<Tensor> got = Compile(graph, specs, testing::kFast)->Run({in});
  ASSERT_EQ(got.size(), 1u);
  testing::ExpectTensorNear(got[0], want[0], 1e-4f, 1e-4f);
}

}  // namespace
}  // namespace osprey
