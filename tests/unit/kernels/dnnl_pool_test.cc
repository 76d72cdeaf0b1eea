// Pooling (plain float32 rank 3 to 5: plain_pool.cc's rows; channels-last and 8-bit: oneDNN's) and softmax
// kernels. Oracle: the reference kernels, run on the same node and inputs.
#include <random>
#include <type_traits>

#include "kernel_test_util.h"

namespace osprey::testing {
namespace {

Attribute Ints(std::vector<int64_t> v) { return Attribute::Ints(std::move(v)); }

void ExpectPool(const std::string& op, const Shape& x, AttributeMap attrs, const std::string& name) {
  Node node = MakeNode(op, 1, 1, std::move(attrs));
  ExpectFastMatchesReference(node, {RandomTensor(x, 7)}, {false}, name);
}

TEST(DnnlPool, MaxPoolResNetStemStyle) {
  for (int64_t ceil : {0, 1}) {
    SCOPED_TRACE("ceil_mode " + std::to_string(ceil));
    ExpectPool("MaxPool", {2, 5, 7, 9},
               {{"kernel_shape", Ints({3, 3})},
                {"strides", Ints({2, 2})},
                {"pads", Ints({1, 1, 1, 1})},
                {"ceil_mode", Attribute::Int(ceil)}},
               "MaxPoolF32Rows");
  }
}

// Quantised models in QOperator form (ONNX Runtime's quantiser, the ONNX model zoo's int8 ResNets) pool uint8 or int8
// between QLinearConvs: oneDNN's int8 pooling is channels-last only, so plain tensors go through reorders. Exact.
template <class T>
Tensor IntegerTensor(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<T> v(static_cast<size_t>(NumElements(shape)));
  for (T& e : v) e = static_cast<T>(static_cast<int>(rng() % 256) + (std::is_signed_v<T> ? -128 : 0));
  return Tensor::FromVector<T>(shape, v);
}

TEST(DnnlPool, MaxPoolOfEightBitIntegers) {
  const AttributeMap stem = {{"kernel_shape", Ints({3, 3})}, {"strides", Ints({2, 2})}, {"pads", Ints({1, 1, 1, 1})}};
  ExpectFastMatchesReference(MakeNode("MaxPool", 1, 1, stem), {IntegerTensor<uint8_t>({1, 64, 56, 56}, 1)}, {false},
                             "MaxPoolU8Dnnl", 17, nullptr, 0.f);
  ExpectFastMatchesReference(MakeNode("MaxPool", 1, 1, stem), {IntegerTensor<int8_t>({2, 5, 7, 9}, 2)}, {false},
                             "MaxPoolS8Dnnl", 17, nullptr, 0.f);
  ExpectFastMatchesReference(
      MakeNode("MaxPool", 1, 1,
               {{"kernel_shape", Ints({2, 2})}, {"strides", Ints({2, 2})}, {"ceil_mode", Attribute::Int(1)}}),
      {IntegerTensor<uint8_t>({1, 13, 7, 9}, 3)}, {false}, "MaxPoolU8Dnnl", 17, nullptr, 0.f);
  // 1-D: no channels-last form here, the reference kernel.
  EXPECT_TRUE(FastKernelDeclines(MakeNode("MaxPool", 1, 1, {{"kernel_shape", Ints({3})}}),
                                 {IntegerTensor<int8_t>({2, 16, 40}, 4)}, {false}));
}

TEST(DnnlPool, MaxPoolCeilModeOverhang) {
  ExpectPool("MaxPool", {1, 13, 7, 9},
             {{"kernel_shape", Ints({2, 2})}, {"strides", Ints({2, 2})}, {"ceil_mode", Attribute::Int(1)}},
             "MaxPoolF32Rows");
  ExpectPool("MaxPool", {1, 3, 7, 9},
             {{"kernel_shape", Ints({3, 2})},
              {"strides", Ints({2, 3})},
              {"pads", Ints({0, 1, 1, 0})},
              {"ceil_mode", Attribute::Int(1)}},
             "MaxPoolF32Rows");
}

TEST(DnnlPool, MaxPoolDilated) {
  ExpectPool("MaxPool", {1, 5, 9, 11}, {{"kernel_shape", Ints({2, 3})}, {"dilations", Ints({2, 2})}}, "MaxPoolF32Rows");
  // Dilated and strided, with pads: interior columns at stride 3, edges on both sides.
  ExpectPool("MaxPool", {2, 3, 10, 40},
             {{"kernel_shape", Ints({3, 4})},
              {"strides", Ints({2, 3})},
              {"dilations", Ints({2, 3})},
              {"pads", Ints({2, 5, 1, 4})}},
             "MaxPoolF32Rows");
  // A window with no input element between its dilated taps (x has 2 columns; taps at -1 and 2): the reference.
  EXPECT_TRUE(FastKernelDeclines(
      MakeNode("MaxPool", 1, 1, {{"kernel_shape", Ints({2})}, {"dilations", Ints({3})}, {"pads", Ints({1, 2})}}),
      {RandomTensor({1, 2, 2}, 1)}, {false}));
}

TEST(DnnlPool, MaxPoolSameUpper) {
  ExpectPool("MaxPool", {1, 5, 7, 9},
             {{"kernel_shape", Ints({3, 3})}, {"strides", Ints({2, 2})}, {"auto_pad", Attribute::String("SAME_UPPER")}},
             "MaxPoolF32Rows");
}

TEST(DnnlPool, MaxPoolOneDimensional) {
  ExpectPool("MaxPool", {2, 3, 11}, {{"kernel_shape", Ints({3})}, {"strides", Ints({2})}, {"pads", Ints({1, 0})}},
             "MaxPoolF32Rows");
}

// Video networks' pools on [N, C, D, H, W] (S3D, R(2+1)D): the window's rows over depth and height combined first.
TEST(DnnlPool, ThreeDimensionalPools) {
  ExpectPool("MaxPool", {1, 3, 5, 6, 7}, {{"kernel_shape", Ints({2, 3, 2})}, {"strides", Ints({2, 2, 2})}},
             "MaxPoolF32Rows");
  for (int64_t include : {0, 1})
    ExpectPool("AveragePool", {1, 3, 5, 6, 7},
               {{"kernel_shape", Ints({3, 3, 3})},
                {"pads", Ints({1, 1, 1, 1, 1, 1})},
                {"ceil_mode", Attribute::Int(1)},
                {"count_include_pad", Attribute::Int(include)},
                {"strides", Ints({2, 2, 2})}},
               "AveragePoolF32Rows");
  // S3D's: 3 x 3 x 3 at stride 1 (threads share the rows), 1 x 3 x 3 at stride 1, 2, 2, and a dilated depth.
  ExpectPool("MaxPool", {1, 48, 4, 14, 14}, {{"kernel_shape", Ints({3, 3, 3})}, {"pads", Ints({1, 1, 1, 1, 1, 1})}},
             "MaxPoolF32Rows");
  ExpectPool("MaxPool", {2, 5, 3, 11, 12},
             {{"kernel_shape", Ints({1, 3, 3})}, {"strides", Ints({1, 2, 2})}, {"pads", Ints({0, 1, 1, 0, 1, 1})}},
             "MaxPoolF32Rows");
  ExpectPool("MaxPool", {1, 4, 7, 5, 6},
             {{"kernel_shape", Ints({2, 2, 2})}, {"dilations", Ints({3, 1, 2})}, {"pads", Ints({1, 0, 0, 2, 0, 1})}},
             "MaxPoolF32Rows");
  ExpectPool("AveragePool", {1, 4, 5, 6, 7},
             {{"kernel_shape", Ints({2, 3, 1})}, {"strides", Ints({1, 1, 2})}, {"pads", Ints({0, 1, 0, 1, 1, 0})}},
             "AveragePoolF32Rows");
}

TEST(DnnlPool, AveragePoolPaddingCountedOrNot) {
  for (int64_t include : {0, 1}) {
    for (int64_t ceil : {0, 1}) {
      for (int64_t pad : {0, 1}) {
        SCOPED_TRACE("count_include_pad " + std::to_string(include) + " ceil_mode " + std::to_string(ceil) + " pads " +
                     std::to_string(pad));
        const AttributeMap attrs = {{"kernel_shape", Ints({3, 3})},
                                    {"strides", Ints({2, 2})},
                                    {"pads", Ints({pad, 0, 0, pad})},
                                    {"count_include_pad", Attribute::Int(include)},
                                    {"ceil_mode", Attribute::Int(ceil)}};
        // count_include_pad never counts ceil_mode's overhang (which oneDNN's include-padding average would).
        ExpectPool("AveragePool", {2, 5, 7, 9}, attrs, "AveragePoolF32Rows");
      }
    }
  }
  // A window longer than the input, with ceil_mode (Hugging Face's EfficientNet head).
  ExpectPool("AveragePool", {1, 24, 7, 7},
             {{"kernel_shape", Ints({2560, 2560})},
              {"strides", Ints({2560, 2560})},
              {"count_include_pad", Attribute::Int(1)},
              {"ceil_mode", Attribute::Int(1)}},
             "AveragePoolF32Rows");
}

// PyTorch's MaxPool1d / AvgPool1d on [N, C, W] (oneDNN's plain 1-D pooling is a scalar loop per output): stride 1
// (the vectorised interior) and 2, pads, count_include_pad, rows long enough to be shared by the threads.
TEST(DnnlPool, OneDimensionalRows) {
  ExpectPool("MaxPool", {8, 16, 4000}, {{"kernel_shape", Ints({2})}, {"strides", Ints({2})}}, "MaxPoolF32Rows");
  ExpectPool("MaxPool", {2, 8, 301}, {{"kernel_shape", Ints({5})}, {"pads", Ints({2, 2})}}, "MaxPoolF32Rows");
  for (int64_t include : {0, 1})
    ExpectPool("AveragePool", {3, 8, 1001},
               {{"kernel_shape", Ints({3})}, {"pads", Ints({1, 1})}, {"count_include_pad", Attribute::Int(include)}},
               "AveragePoolF32Rows");
  ExpectPool(
      "AveragePool", {1, 4, 50},
      {{"kernel_shape", Ints({4})}, {"strides", Ints({3})}, {"pads", Ints({0, 2})}, {"ceil_mode", Attribute::Int(1)}},
      "AveragePoolF32Rows");
}

TEST(DnnlPool, AveragePoolSameLowerAndPlain) {
  ExpectPool("AveragePool", {1, 13, 7, 9},
             {{"kernel_shape", Ints({2, 2})}, {"auto_pad", Attribute::String("SAME_LOWER")}}, "AveragePoolF32Rows");
  ExpectPool("AveragePool", {1, 3, 7, 9}, {{"kernel_shape", Ints({7, 9})}}, "AveragePoolF32Rows");
}

// On plain data the global pools are row reductions (reduce_kernel.cc), rank 3 (magika's [1, 512, 508]) to 5; the
// channels-last cases are in nhwc_test.cc.
TEST(DnnlPool, GlobalPools) {
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"})
    for (const Shape& x : {Shape{2, 13, 7, 9}, Shape{1, 5, 11}, Shape{1, 2048, 7, 7}, Shape{1, 512, 508},
                           Shape{2, 3, 4, 5, 6}}) {
      SCOPED_TRACE(std::string(op) + " " + ShapeToString(x));
      ExpectPool(op, x, {}, "GlobalPoolF32Rows");
    }
}

TEST(DnnlPool, DeclinesMaxPoolWithIndices) {
  Node node = MakeNode("MaxPool", 1, 2, {{"kernel_shape", Ints({2, 2})}});
  EXPECT_TRUE(FastKernelDeclines(node, {RandomTensor({1, 3, 7, 9}, 1)}, {false}));
}

TEST(DnnlSoftmax, LastAxis) {
  for (const Shape& x : {Shape{3, 13}, Shape{2, 5, 7}, Shape{1, 1000}}) {
    SCOPED_TRACE(ShapeToString(x));
    Node softmax = MakeNode("Softmax", 1, 1, {});
    ExpectFastMatchesReference(softmax, {Scaled(RandomTensor(x, 9), 8.f)}, {false}, "SoftmaxF32Dnnl");
    Node log_softmax = MakeNode("LogSoftmax", 1, 1, {{"axis", Attribute::Int(-1)}});
    ExpectFastMatchesReference(log_softmax, {Scaled(RandomTensor(x, 9), 8.f)}, {false}, "LogSoftmaxF32Dnnl");
  }
}

TEST(DnnlSoftmax, OldOpsetLastAxisAndInnerAxis) {
  Node last = MakeNode("Softmax", 1, 1, {{"axis", Attribute::Int(2)}});
  ExpectFastMatchesReference(last, {RandomTensor({2, 5, 7}, 3)}, {false}, "SoftmaxF32Dnnl", /*opset=*/11);
  // Before opset 13, axis 1 of a 3-D tensor means "softmax over the flattened [5 * 7]": not a oneDNN axis.
  Node flattened = MakeNode("Softmax", 1, 1, {{"axis", Attribute::Int(1)}});
  EXPECT_TRUE(FastKernelDeclines(flattened, {RandomTensor({2, 5, 7}, 3)}, {false}, /*opset=*/11));
}

TEST(DnnlSoftmax, StridedAxisWhereOneDnnHasOnlyItsReference) {
  // YOLOv8's distribution-focal-loss softmax ([1, 16, 4, A] over axis 1) and other non-last axes with at least 8
  // positions behind them: osprey's own kernel (blocks of 256 positions: a partial last block, several per row), one
  // element along the axis, inputs large enough that the max must be subtracted first.
  const std::vector<std::pair<Shape, int64_t>> cases = {{{1, 16, 4, 2100}, 1}, {{2, 3, 9}, 1}, {{3, 7, 5, 300}, 1},
                                                        {{2, 4, 6, 50}, 2},    {{1, 1, 64}, 1}, {{2, 5, 8}, -2}};
  for (const auto& [x, axis] : cases)
    for (float scale : {8.f, 60.f}) {
      SCOPED_TRACE(ShapeToString(x) + " axis " + std::to_string(axis) + " scale " + std::to_string(scale));
      for (const char* op : {"Softmax", "LogSoftmax"}) {
        const Node node = MakeNode(op, 1, 1, {{"axis", Attribute::Int(axis)}});
        const std::vector<Tensor> inputs = {Scaled(RandomTensor(x, 11), scale)};
        const Tensor expected = RunReferenceNode(node, inputs)[0];
        std::vector<Tensor> outputs;
        KernelBuildContext bc = MakeBuildContext(node, inputs, {false}, outputs);
        std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
        ASSERT_NE(kernel, nullptr);
        EXPECT_EQ(std::string(kernel->Name()), std::string(op) + "F32Strided");
        RunKernel(*kernel, node, inputs, outputs);
        // Float exp, sums, log and reciprocal against the reference's double arithmetic: within 2e-5 relative
        // (measured up to about 7e-6) or 3e-7 absolute (log(sum) near 0), far tighter than the shared 1e-4.
        ExpectTensorNear(outputs[0], expected, 2e-5f, 3e-7f);
      }
    }
}

TEST(DnnlSoftmax, InnerAxisFallsBackOrMatches) {
  // oneDNN 2.6 has only a reference softmax over a non-innermost axis of a plain tensor: the factory declines.
  Node node = MakeNode("Softmax", 1, 1, {{"axis", Attribute::Int(1)}});
  ExpectMatchIfOffered(node, {RandomTensor({2, 5, 7}, 4)}, {false}, "SoftmaxF32Dnnl");
}

}  // namespace
}  // namespace osprey::testing
