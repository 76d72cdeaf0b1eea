// ConvInteger / MatMulInteger on oneDNN's int8 kernels (where the CPU sums int8 products exactly) and on the float32
// kernels (kernels/cpu/integer_kernels.cc). Oracle: the reference kernels' exact int32 results; with these sizes every
// partial sum stays far below 2^24, so both kernels' results must be equal.
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>

#include "kernel_test_util.h"
#include "kernels/cpu/cpu_kernels.h"

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

// Every kernel: the int8 one where this CPU's int8 products are exact (VNNI or AMX; OSPREY_INT8_PAIRING=1 makes
// osprey treat them as inexact, as on a CPU without VNNI), else the int16 one where the CPU has AVX2, and the float32
// one (OSPREY_INT16=0, or no AVX2). An empty name: that kernel must decline.
void ExpectExact(const Node& node, const std::vector<Tensor>& inputs, const std::vector<bool>& constant,
                 const std::string& int8_name, const std::string& int16_name, const std::string& float_name) {
  std::vector<Tensor> expected = RunReferenceNode(node, inputs);
  for (const auto& [force_inexact, int16_switch] : {std::pair{"0", "1"}, {"1", "1"}, {"1", "0"}}) {
    setenv("OSPREY_INT8_PAIRING", force_inexact, 1);
    setenv("OSPREY_INT16", int16_switch, 1);
    const bool int8 = Int8ProductsExact() && !int8_name.empty();
    const bool int16 =
        !int8 && std::string(int16_switch) == "1" && __builtin_cpu_supports("avx2") && !int16_name.empty();
    SCOPED_TRACE(std::string("OSPREY_INT8_PAIRING=") + force_inexact + " OSPREY_INT16=" + int16_switch);
    std::vector<Tensor> outputs;
    KernelBuildContext bc = MakeBuildContext(node, inputs, constant, outputs);
    std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
    unsetenv("OSPREY_INT8_PAIRING");
    unsetenv("OSPREY_INT16");
    ASSERT_NE(kernel, nullptr);
    EXPECT_EQ(std::string(kernel->Name()), int8 ? int8_name : int16 ? int16_name : float_name);
    for (int run = 0; run < 2; ++run) {
      RunKernel(*kernel, node, inputs, outputs);
      ExpectTensorNear(outputs[0], expected[0], 0.f, 0.f);
    }
  }
}

TEST(IntegerKernels, ConvIntegerUint8WeightsWithZeroPointsAsQuantizeDynamicWrites) {
  Node node = MakeNode("ConvInteger", 4, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})},
                                             {"strides", Attribute::Ints({2, 1})}});
  ExpectExact(
      node,
      {Bytes<uint8_t>({1, 5, 9, 8}, 1), Bytes<uint8_t>({7, 5, 3, 3}, 2), Scalar8<uint8_t>(131), Scalar8<uint8_t>(119)},
      {false, true, false, true}, "ConvIntegerInt8Dnnl", "ConvIntegerInt16Avx2", "ConvIntegerAsF32Dnnl");
}

// Per-channel uint8 weight zero points far from 128 (w - w_zp outside int8: the int8 kernel's window sums), batch 2,
// dilation, a rectangular kernel with stride and asymmetric padding; then int8 weights and no activation zero point.
TEST(IntegerKernels, ConvIntegerWindowSumsPaddingDilationBatch) {
  Node node = MakeNode("ConvInteger", 4, 1, {{"pads", Attribute::Ints({2, 0, 1, 3})},
                                             {"strides", Attribute::Ints({1, 2})},
                                             {"dilations", Attribute::Ints({2, 1})}});
  Tensor zp(DType::kU8, {10});
  for (int i = 0; i < 10; ++i) zp.data<uint8_t>()[i] = static_cast<uint8_t>(i * 27);
  ExpectExact(node, {Bytes<uint8_t>({2, 19, 11, 13}, 7), Bytes<uint8_t>({10, 19, 3, 2}, 8), Scalar8<uint8_t>(200), zp},
              {false, true, false, true}, "ConvIntegerInt8Dnnl", "ConvIntegerInt16Avx2", "ConvIntegerAsF32Dnnl");
  Node same = MakeNode("ConvInteger", 4, 1, {{"auto_pad", Attribute::String("SAME_UPPER")}});
  Tensor zp8(DType::kI8, {6});
  for (int i = 0; i < 6; ++i) zp8.data<int8_t>()[i] = static_cast<int8_t>(i * 50 - 125);
  ExpectExact(same, {Bytes<uint8_t>({1, 8, 7, 9}, 9), Bytes<int8_t>({6, 8, 3, 3}, 10), Tensor(), zp8},
              {false, true, false, true}, "ConvIntegerInt8Dnnl", "ConvIntegerInt16Avx2", "ConvIntegerAsF32Dnnl");
}

// Enough pixels and taps for several pixel blocks on two threads (the int16 kernel gathers 80 pixels at a time here,
// runs that start and end inside output rows), an odd K (3 x 5 x 5 taps: the zero row of the last pair), stride 2 with
// padding that clips at both ends, int8 activations with a zero point; then MatMul rows that fill 4-row blocks unevenly
// and columns past a panel.
TEST(IntegerKernels, ConvIntegerManyPixelBlocksOddDepth) {
  Node node = MakeNode("ConvInteger", 4, 1, {{"pads", Attribute::Ints({1, 2, 2, 1})}});
  ExpectExact(node,
              {Bytes<uint8_t>({2, 64, 30, 31}, 13), Bytes<uint8_t>({17, 64, 3, 3}, 14), Scalar8<uint8_t>(77),
               Scalar8<uint8_t>(140)},
              {false, true, false, true}, "ConvIntegerInt8Dnnl", "ConvIntegerInt16Avx2", "ConvIntegerAsF32Dnnl");
  Node strided =
      MakeNode("ConvInteger", 4, 1, {{"pads", Attribute::Ints({2, 2, 2, 2})}, {"strides", Attribute::Ints({2, 2})}});
  ExpectExact(
      strided,
      {Bytes<int8_t>({1, 3, 41, 37}, 15), Bytes<int8_t>({5, 3, 5, 5}, 16), Scalar8<int8_t>(-9), Scalar8<int8_t>(4)},
      {false, true, false, true}, "", "ConvIntegerInt16Avx2", "ConvIntegerAsF32Dnnl");
  Node matmul = MakeNode("MatMulInteger", 4, 1);
  ExpectExact(
      matmul,
      {Bytes<uint8_t>({2, 7, 301}, 17), Bytes<uint8_t>({301, 37}, 18), Scalar8<uint8_t>(255), Scalar8<uint8_t>(0)},
      {false, true, false, true}, "MatMulIntegerInt8Dnnl", "MatMulIntegerInt16Avx2", "MatMulIntegerAsF32Dnnl");
  // K past int16_gemm.cc's slice of 768 (three slices, the last odd; zero points mid-range: the float32 kernel is exact
  // only below 2^24), and a deep 3x3 layer on a small image (its
  // output channels split over the threads, K 900 in two slices).
  ExpectExact(
      matmul,
      {Bytes<uint8_t>({5, 1601}, 19), Bytes<uint8_t>({1601, 20}, 20), Scalar8<uint8_t>(120), Scalar8<uint8_t>(131)},
      {false, true, false, true}, "MatMulIntegerInt8Dnnl", "MatMulIntegerInt16Avx2", "MatMulIntegerAsF32Dnnl");
  Node deep = MakeNode("ConvInteger", 4, 1, {{"pads", Attribute::Ints({1, 1, 1, 1})}});
  ExpectExact(deep,
              {Bytes<uint8_t>({1, 100, 5, 6}, 21), Bytes<uint8_t>({22, 100, 3, 3}, 22), Scalar8<uint8_t>(128),
               Scalar8<uint8_t>(128)},
              {false, true, false, true}, "ConvIntegerInt8Dnnl", "ConvIntegerInt16Avx2", "ConvIntegerAsF32Dnnl");
  // K 33,026: past what the int16 kernel's int32 sums hold in the worst case (33,025 x 255 x 255), so it declines and
  // the float32 kernel runs (the int8 one declines past 16,384).
  ExpectExact(
      matmul,
      {Bytes<uint8_t>({1, 33026}, 23), Bytes<uint8_t>({33026, 3}, 24), Scalar8<uint8_t>(128), Scalar8<uint8_t>(128)},
      {false, true, false, true}, "", "", "MatMulIntegerAsF32Dnnl");
}

// Pointwise (1 x 1, stride 1, no padding): the int16 kernel packs the input straight into panels. Batch 2, an odd K
// (301 channels: the zero row of the last pair), 667 pixels in several blocks with a short last panel; int8 and uint8
// activations. Then 1 x 1 with stride 2, which gathers as any window does.
TEST(IntegerKernels, ConvIntegerPointwise) {
  Node node = MakeNode("ConvInteger", 4, 1);
  ExpectExact(node,
              {Bytes<uint8_t>({2, 301, 23, 29}, 25), Bytes<uint8_t>({12, 301, 1, 1}, 26), Scalar8<uint8_t>(91),
               Scalar8<uint8_t>(133)},
              {false, true, false, true}, "ConvIntegerInt8Dnnl", "ConvIntegerInt16Avx2", "ConvIntegerAsF32Dnnl");
  ExpectExact(
      node,
      {Bytes<int8_t>({1, 9, 5, 7}, 27), Bytes<int8_t>({3, 9, 1, 1}, 28), Scalar8<int8_t>(-100), Scalar8<int8_t>(7)},
      {false, true, false, true}, "", "ConvIntegerInt16Avx2", "ConvIntegerAsF32Dnnl");
  Node strided = MakeNode("ConvInteger", 4, 1, {{"strides", Attribute::Ints({2, 2})}});
  ExpectExact(strided,
              {Bytes<uint8_t>({1, 33, 15, 16}, 29), Bytes<uint8_t>({5, 33, 1, 1}, 30), Scalar8<uint8_t>(3),
               Scalar8<uint8_t>(250)},
              {false, true, false, true}, "ConvIntegerInt8Dnnl", "ConvIntegerInt16Avx2", "ConvIntegerAsF32Dnnl");
}

TEST(IntegerKernels, ConvIntegerInt8PerChannelZeroPointsGroupsNoActivationZeroPoint) {
  Node node = MakeNode("ConvInteger", 4, 1, {{"group", Attribute::Int(2)}});
  Tensor zp(DType::kI8, {6});
  for (int i = 0; i < 6; ++i) zp.data<int8_t>()[i] = static_cast<int8_t>(i * 7 - 20);
  std::vector<Tensor> in{Bytes<int8_t>({2, 4, 6, 5}, 3), Bytes<int8_t>({6, 2, 2, 3}, 4), Tensor(), zp};
  // int8 activations and groups: the int8 kernel declines (uint8 activations, one group only).
  ExpectExact(node, in, {false, true, false, true}, "", "", "ConvIntegerAsF32Dnnl");
}

TEST(IntegerKernels, MatMulIntegerPerColumnZeroPointsBatched) {
  Node node = MakeNode("MatMulInteger", 4, 1);
  Tensor zp(DType::kU8, {9});
  for (int i = 0; i < 9; ++i) zp.data<uint8_t>()[i] = static_cast<uint8_t>(100 + 5 * i);
  ExpectExact(node, {Bytes<uint8_t>({3, 4, 33}, 5), Bytes<uint8_t>({33, 9}, 6), Scalar8<uint8_t>(128), zp},
              {false, true, false, true}, "MatMulIntegerInt8Dnnl", "MatMulIntegerInt16Avx2", "MatMulIntegerAsF32Dnnl");
  // int8 weights with one zero point, a vector times a matrix.
  ExpectExact(node, {Bytes<uint8_t>({70}, 11), Bytes<int8_t>({70, 5}, 12), Scalar8<uint8_t>(3), Scalar8<int8_t>(-77)},
              {false, true, false, true}, "MatMulIntegerInt8Dnnl", "MatMulIntegerInt16Avx2", "MatMulIntegerAsF32Dnnl");
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
  // Large enough to be split between two threads (the minimum and the maximum in different halves).
  Tensor big = RandomTensor({200003}, 5, -1.f, 1.f);
  big.data<float>()[10] = -3.f;
  big.data<float>()[150000] = 7.f;
  big.data<float>()[150001] = std::numeric_limits<float>::quiet_NaN();
  cases.push_back(big);
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

// QuantizeLinear / DequantizeLinear with one scale and zero point: the bytes and floats of the reference kernel.
void ExpectSameBytes(const Node& node, const std::vector<Tensor>& inputs, const char* name) {
  std::vector<Tensor> expected = RunReferenceNode(node, inputs);
  std::vector<Tensor> outputs;
  std::vector<bool> constant(inputs.size(), true);
  constant[0] = false;
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(MakeBuildContext(node, inputs, constant, outputs));
  ASSERT_NE(kernel, nullptr);
  EXPECT_STREQ(kernel->Name(), name);
  RunKernel(*kernel, node, inputs, outputs);
  ASSERT_EQ(outputs[0].nbytes(), expected[0].nbytes());
  EXPECT_EQ(std::memcmp(outputs[0].raw(), expected[0].raw(), outputs[0].nbytes()), 0);
}

TEST(IntegerKernels, QuantizeAndDequantizeLinearPerTensorBitIdentical) {
  // Halves (to even), saturation both ways, NaN (the zero point) and infinities; a large tensor in two threads.
  Tensor x = RandomTensor({3, 1000}, 6, -40.f, 40.f);
  const float specials[] = {0.f,
                            0.25f,
                            0.75f,
                            1.25f,
                            -0.25f,
                            -0.75f,
                            1e9f,
                            -1e9f,
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  for (size_t i = 0; i < std::size(specials); ++i) x.data<float>()[i] = specials[i];
  const Tensor big = RandomTensor({300001}, 7, -3.f, 3.f);
  const Tensor scale = Tensor::Scalar<float>(0.5f), small = Tensor::Scalar<float>(0.0123f);
  const Node q3 = MakeNode("QuantizeLinear", 3, 1), q2 = MakeNode("QuantizeLinear", 2, 1);
  for (const Tensor& in : {x, big}) {
    ExpectSameBytes(q3, {in, scale, Scalar8<uint8_t>(128)}, "QuantizeLinearF32");
    ExpectSameBytes(q3, {in, small, Scalar8<uint8_t>(3)}, "QuantizeLinearF32");
    ExpectSameBytes(q3, {in, scale, Scalar8<int8_t>(-5)}, "QuantizeLinearF32");
    ExpectSameBytes(q2, {in, small}, "QuantizeLinearF32");  // uint8, zero point 0
  }
  const Node d3 = MakeNode("DequantizeLinear", 3, 1);
  ExpectSameBytes(d3, {Bytes<uint8_t>({2, 777}, 8), small, Scalar8<uint8_t>(131)}, "DequantizeLinearF32");
  ExpectSameBytes(d3, {Bytes<int8_t>({300001}, 9), scale, Scalar8<int8_t>(-7)}, "DequantizeLinearF32");
  ExpectSameBytes(MakeNode("DequantizeLinear", 2, 1), {Bytes<int8_t>({99}, 10), small}, "DequantizeLinearF32");
  // Per-axis scales, or a scale known only at run time: the reference kernel.
  EXPECT_TRUE(FastKernelDeclines(MakeNode("QuantizeLinear", 2, 1, {{"axis", Attribute::Int(0)}}),
                                 {x, Tensor::FromVector<float>({3}, {0.5f, 1.f, 2.f})}, {false, true}));
  EXPECT_TRUE(FastKernelDeclines(q2, {x, scale}, {false, false}));
  // A zero, negative or infinite scale: the reference kernel's arithmetic (x / 0 saturates, NaN to the zero point).
  for (float odd : {0.f, -0.5f, std::numeric_limits<float>::infinity()})
    EXPECT_TRUE(FastKernelDeclines(q2, {x, Tensor::Scalar<float>(odd)}, {false, true})) << odd;
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
