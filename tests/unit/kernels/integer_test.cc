// ConvInteger / MatMulInteger on the float32 kernels (kernels/cpu/integer_kernels.cc). Oracle: the reference kernels'
// exact int32 results; with these sizes every partial sum stays far below 2^24, so the fast results must be equal.
#include <cstring>

#include "kernel_test_util.h"

namespace osprey::testing {
namespace {

// Deterministic 8-bit values covering the whole range.
template <class T>
Tensor Bytes(const Shape& shape, uint32_t seed) {
  Tensor t(std::is_same_v<T, uint8_t> ? DType::kU8 : DType::kI8, shape);
  uint32_t s = seed * 2654435761u + 7u;
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    t.data<T>()[i] = static_cast<T>(s >> 24);
  }
  return t;
}

template <class T>
Tensor Scalar8(int v) {
  Tensor t(std::is_same_v<T, uint8_t> ? DType::kU8 : DType::kI8, {});
  t.data<T>()[0] = static_cast<T>(v);
  return t;
}

void ExpectExact(const Node& node, const std::vector<Tensor>& inputs, const std::vector<bool>& constant,
                 const std::string& name) {
  std::vector<Tensor> expected = RunReferenceNode(node, inputs);
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, inputs, constant, outputs);
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  ASSERT_NE(kernel, nullptr);
  EXPECT_EQ(std::string(kernel->Name()), name);
  for (int run = 0; run < 2; ++run) {
    RunKernel(*kernel, node, inputs, outputs);
    ExpectTensorNear(outputs[0], expected[0], 0.f, 0.f);
  }
}

TEST(IntegerKernels, ConvIntegerUint8WeightsWithZeroPointsAsQuantizeDynamicWrites) {
  Node node = MakeNode("ConvInteger", 4, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})},
                                             {"strides", Attribute::Ints({2, 1})}});
  ExpectExact(node, {Bytes<uint8_t>({1, 5, 9, 8}, 1), Bytes<uint8_t>({7, 5, 3, 3}, 2), Scalar8<uint8_t>(131),
                     Scalar8<uint8_t>(119)},
              {false, true, false, true}, "ConvIntegerAsF32Dnnl");
}

TEST(IntegerKernels, ConvIntegerInt8PerChannelZeroPointsGroupsNoActivationZeroPoint) {
  Node node = MakeNode("ConvInteger", 4, 1, {{"group", Attribute::Int(2)}});
  Tensor zp(DType::kI8, {6});
  for (int i = 0; i < 6; ++i) zp.data<int8_t>()[i] = static_cast<int8_t>(i * 7 - 20);
  std::vector<Tensor> in{Bytes<int8_t>({2, 4, 6, 5}, 3), Bytes<int8_t>({6, 2, 2, 3}, 4), Tensor(), zp};
  ExpectExact(node, in, {false, true, false, true}, "ConvIntegerAsF32Dnnl");
}

TEST(IntegerKernels, MatMulIntegerPerColumnZeroPointsBatched) {
  Node node = MakeNode("MatMulInteger", 4, 1);
  Tensor zp(DType::kU8, {9});
  for (int i = 0; i < 9; ++i) zp.data<uint8_t>()[i] = static_cast<uint8_t>(100 + 5 * i);
  ExpectExact(node, {Bytes<uint8_t>({3, 4, 33}, 5), Bytes<uint8_t>({33, 9}, 6), Scalar8<uint8_t>(128), zp},
              {false, true, false, true}, "MatMulIntegerAsF32Dnnl");
}

TEST(IntegerKernels, DynamicQuantizeLinearBitIdentical) {
  // Mixed signs, all positive, all negative, all zero, halves that round to even, and NaN/inf among them.
  Node node = MakeNode("DynamicQuantizeLinear", 1, 3);
  std::vector<Tensor> cases{RandomTensor({3, 1000}, 1, -2.f, 5.f), RandomTensor({517}, 2, 0.5f, 3.f),
                            RandomTensor({64}, 3, -9.f, -1.f), Tensor::Zeros(DType::kF32, {40}),
                            // scale 1: exact halves, which round to even
                            Tensor::FromVector<float>({6}, {0.f, 0.5f, 1.5f, 2.5f, 3.5f, 255.f})};
  Tensor odd = RandomTensor({300}, 4);
  odd.data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
  odd.data<float>()[8] = std::numeric_limits<float>::infinity();
  cases.push_back(odd);
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE("case " + std::to_string(c));
    std::vector<Tensor> expected = RunReferenceNode(node, {cases[c]});
    std::vector<Tensor> outputs;
    std::unique_ptr<Kernel> kernel = CreateCpuKernel(MakeBuildContext(node, {cases[c]}, {false}, outputs));
    ASSERT_NE(kernel, nullptr);
    EXPECT_STREQ(kernel->Name(), "DynamicQuantizeLinearF32");
    RunKernel(*kernel, node, {cases[c]}, outputs);
    for (int k = 0; k < 3; ++k) {
      ASSERT_EQ(outputs[k].nbytes(), expected[k].nbytes());
      EXPECT_EQ(std::memcmp(outputs[k].raw(), expected[k].raw(), outputs[k].nbytes()), 0) << "output " << k;
    }
  }
}

TEST(IntegerKernels, DeclinedWhereTheReferenceRuns) {
  // Weights computed at run time, or a per-row activation zero point.
  Node mm = MakeNode("MatMulInteger", 4, 1);
  EXPECT_TRUE(FastKernelDeclines(mm, {Bytes<uint8_t>({4, 8}, 1), Bytes<uint8_t>({8, 3}, 2), Tensor(), Tensor()},
                                 {false, false, false, false}));
  Tensor rows(DType::kU8, {4});
  for (int i = 0; i < 4; ++i) rows.data<uint8_t>()[i] = static_cast<uint8_t>(i);
  EXPECT_TRUE(FastKernelDeclines(mm, {Bytes<uint8_t>({4, 8}, 1), Bytes<uint8_t>({8, 3}, 2), rows, Tensor()},
                                 {false, true, false, true}));
}

}  // namespace
}  // namespace osprey::testing
