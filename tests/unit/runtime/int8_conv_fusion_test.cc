// QDQ convolutions as ONNX Runtime's quantiser writes them (DequantizeLinear of int8 weights and int32 bias, Relu
// before the output's QuantizeLinear) compiled into int8 convolutions (src/runtime/fusion_qdq.cc FuseInt8,
// src/kernels/cpu/dnnl_conv_int8.cc). Oracle: the same graph compiled without fusion, reference kernels only.
// Bound: one output step (the int32 sum is requantised once where the graph rounds a float sum; rare).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "kernels/cpu/cpu_kernels.h"
#include "osprey/runtime.h"
#include "test_util.h"

namespace osprey {
namespace {

using testing::RandomTensor;

Tensor RandomInt8(const Shape& shape, uint32_t seed) {
  Tensor t(DType::kI8, shape);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-127, 127);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int8_t>()[i] = static_cast<int8_t>(d(rng));
  return t;
}

// x -> Q/DQ -> Conv 3x3 16->16 (per-tensor weights, bias) -> Relu -> Q/DQ -> Conv 1x1 16->24 (per-channel weights)
// -> Q/DQ -> Mul 1 -> y.
Graph Int8ConvGraph() {
  GraphBuilder b("int8conv", 13);
  auto x = b.Input("x", DType::kF32, {1, 16, 10, 10});
  auto xs = b.Constant(Tensor::Scalar<float>(0.05f));
  auto xz = b.Constant(Tensor::Scalar<int8_t>(-3));
  auto x_dq = b.Op("DequantizeLinear", {b.Op("QuantizeLinear", {x, xs, xz}), xs, xz});
  auto w1s = b.Constant(Tensor::Scalar<float>(0.004f));
  auto w1 = b.Op("DequantizeLinear", {b.Constant(RandomInt8({16, 16, 3, 3}, 7)), w1s, b.Constant(Tensor::Scalar<int8_t>(0))});
  std::vector<int32_t> bias(16);
  for (int i = 0; i < 16; ++i) bias[i] = 300 * i - 2000;
  auto b1 = b.Op("DequantizeLinear", {b.Constant(Tensor::FromVector<int32_t>({16}, bias)),
                                      b.Constant(Tensor::Scalar<float>(0.05f * 0.004f)),
                                      b.Constant(Tensor::Scalar<int32_t>(0))});
  auto y1 = b.Op("Relu", {b.Op("Conv", {x_dq, w1, b1}, {{"pads", Attribute::Ints({1, 1, 1, 1})}})});
  auto ys = b.Constant(Tensor::Scalar<float>(0.08f));
  auto yz = b.Constant(Tensor::Scalar<int8_t>(-128));
  auto y1_dq = b.Op("DequantizeLinear", {b.Op("QuantizeLinear", {y1, ys, yz}), ys, yz});
  std::vector<float> w2_scales(24);
  for (int i = 0; i < 24; ++i) w2_scales[i] = 0.002f + 0.0003f * static_cast<float>(i % 5);
  Tensor w2_zp(DType::kI8, {24});
  for (int i = 0; i < 24; ++i) w2_zp.data<int8_t>()[i] = 0;
  auto w2 = b.Op("DequantizeLinear",
                 {b.Constant(RandomInt8({24, 16, 1, 1}, 9)), b.Constant(Tensor::FromVector<float>({24}, w2_scales)),
                  b.Constant(w2_zp)},
                 {{"axis", Attribute::Int(0)}});
  auto y2 = b.Op("Conv", {y1_dq, w2});
  auto zs = b.Constant(Tensor::Scalar<float>(0.1f));
  auto zz = b.Constant(Tensor::Scalar<int8_t>(4));
  auto z = b.Op("DequantizeLinear", {b.Op("QuantizeLinear", {y2, zs, zz}), zs, zz});
  b.Output(b.Op("Mul", {z, b.Constant(Tensor::Scalar<float>(1.f))}), "y");
  return b.Finish();
}

TEST(Int8ConvFusion, QdqConvsRunOnInt8KernelWithinOneStep) {
  const Graph g = Int8ConvGraph();
  Tensor x = RandomTensor({1, 16, 10, 10}, 3, -6.f, 6.f);
  auto run = [&](const CompileOptions& o, std::vector<OpProfile>* profile) {
    return Compile(g, {{x.dtype(), x.shape()}}, o)->Run({x}, profile)[0];
  };
  const Tensor expected = run({.num_threads = 2, .fast_kernels = false, .fuse = false}, nullptr);
  std::vector<OpProfile> profile;
  const Tensor got = run({.num_threads = 2, .fast_kernels = true, .fuse = true}, &profile);
  int int8_convs = 0;
  for (const OpProfile& p : profile) {
    int8_convs += p.kernel == "ConvInt8Dnnl";
    EXPECT_NE(p.op_type, "QuantizeLinear");
    EXPECT_NE(p.op_type, "DequantizeLinear");
  }
  EXPECT_EQ(int8_convs, 2);
  ASSERT_EQ(got.numel(), expected.numel());
  int64_t off = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const float d = std::fabs(got.data<float>()[i] - expected.data<float>()[i]);
    EXPECT_LE(d, 0.1f * 1.001f) << i;
    off += d > 0.05f;
  }
  EXPECT_LE(off, got.numel() / 50);

  // The fused nodes through the reference kernels (fast_kernels off, fusion on): the reference Conv honours the
  // int8 attributes, so it agrees with the unfused graph too.
  const Tensor fused_reference = run({.num_threads = 2, .fast_kernels = false, .fuse = true}, nullptr);
  ASSERT_EQ(fused_reference.numel(), expected.numel());
  int64_t ref_off = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const float d = std::fabs(fused_reference.data<float>()[i] - expected.data<float>()[i]);
    EXPECT_LE(d, 0.1f * 1.001f) << i;
    ref_off += d > 0.05f;
    // Requantised: on the output's grid (scale 0.1), as the last Q/DQ pair puts it.
    const float steps = fused_reference.data<float>()[i] / 0.1f;
    EXPECT_NEAR(steps, std::nearbyint(steps), 1e-3f) << i;
  }
  EXPECT_LE(ref_off, expected.numel() / 50);
}

// x [2, 5, 32] -> Q/DQ (uint8, zero point 131) -> MatMul W [32, 24] (int8 per column, as quantize_static's
// per_channel writes a MatMul's B: DequantizeLinear axis 1) -> Q/DQ (uint8) -> Mul 1 -> y: a transformer's projection.
// With kInputB, B is a second input [2, 32, 24] between its own Q/DQ pair (uint8, zero point 140), as attention's
// products of two activations are. With kGemm, x is [10, 32] and the product a Gemm (transB: W [24, 32], int8 per
// row, axis 0) with an int32 bias dequantised at x_scale * w_scale[n], as quantize_static writes a Linear layer.
enum class MatMulCase { kConstantB, kInputB, kGemm };

Graph Int8MatMulGraph(MatMulCase which) {
  const bool b_input = which == MatMulCase::kInputB, gemm = which == MatMulCase::kGemm;
  GraphBuilder b("int8matmul", 13);
  auto x = b.Input("x", DType::kF32, gemm ? Shape{10, 32} : Shape{2, 5, 32});
  auto xs = b.Constant(Tensor::Scalar<float>(0.04f));
  auto xz = b.Constant(Tensor::Scalar<uint8_t>(131));
  auto x_dq = b.Op("DequantizeLinear", {b.Op("QuantizeLinear", {x, xs, xz}), xs, xz});
  if (b_input) {
    auto bx = b.Input("b", DType::kF32, {2, 32, 24});
    auto bs = b.Constant(Tensor::Scalar<float>(0.03f));
    auto bz = b.Constant(Tensor::Scalar<uint8_t>(140));
    auto b_dq = b.Op("DequantizeLinear", {b.Op("QuantizeLinear", {bx, bs, bz}), bs, bz});
    auto ys = b.Constant(Tensor::Scalar<float>(0.06f));
    auto yz = b.Constant(Tensor::Scalar<uint8_t>(120));
    auto y = b.Op("MatMul", {x_dq, b_dq});
    auto z = b.Op("DequantizeLinear", {b.Op("QuantizeLinear", {y, ys, yz}), ys, yz});
    b.Output(b.Op("Mul", {z, b.Constant(Tensor::Scalar<float>(1.f))}), "y");
    return b.Finish();
  }
  std::vector<float> w_scales(24);
  for (int i = 0; i < 24; ++i) w_scales[i] = 0.003f + 0.0004f * static_cast<float>(i % 7);
  Tensor w_zp(DType::kI8, {24});
  for (int i = 0; i < 24; ++i) w_zp.data<int8_t>()[i] = 0;
  auto w = b.Op("DequantizeLinear",
                {b.Constant(RandomInt8(gemm ? Shape{24, 32} : Shape{32, 24}, 11)),
                 b.Constant(Tensor::FromVector<float>({24}, w_scales)), b.Constant(w_zp)},
                {{"axis", Attribute::Int(gemm ? 0 : 1)}});
  ValueRef y;
  if (gemm) {
    std::vector<int32_t> bias(24);
    std::vector<float> bias_scales(24);
    for (int i = 0; i < 24; ++i) {
      bias[i] = 400 * i - 5000;
      bias_scales[i] = 0.04f * w_scales[i];
    }
    Tensor bias_zp(DType::kI32, {24});
    for (int i = 0; i < 24; ++i) bias_zp.data<int32_t>()[i] = 0;
    auto c = b.Op("DequantizeLinear",
                  {b.Constant(Tensor::FromVector<int32_t>({24}, bias)),
                   b.Constant(Tensor::FromVector<float>({24}, bias_scales)), b.Constant(bias_zp)},
                  {{"axis", Attribute::Int(0)}});
    y = b.Op("Gemm", {x_dq, w, c}, {{"transB", Attribute::Int(1)}});
  } else {
    y = b.Op("MatMul", {x_dq, w});
  }
  auto ys = b.Constant(Tensor::Scalar<float>(0.06f));
  auto yz = b.Constant(Tensor::Scalar<uint8_t>(120));
  auto z = b.Op("DequantizeLinear", {b.Op("QuantizeLinear", {y, ys, yz}), ys, yz});
  b.Output(b.Op("Mul", {z, b.Constant(Tensor::Scalar<float>(1.f))}), "y");
  return b.Finish();
}

class Int8MatMulFusion : public ::testing::TestWithParam<MatMulCase> {};

TEST_P(Int8MatMulFusion, RunsOnInt8KernelWithinOneStep) {
  const bool b_input = GetParam() == MatMulCase::kInputB;
  const Graph g = Int8MatMulGraph(GetParam());
  Tensor x = RandomTensor(GetParam() == MatMulCase::kGemm ? Shape{10, 32} : Shape{2, 5, 32}, 4, -5.f, 5.f);
  Tensor bx = RandomTensor({2, 32, 24}, 5, -4.f, 4.f);
  auto run = [&](const CompileOptions& o, std::vector<OpProfile>* profile) {
    if (b_input) return Compile(g, {{x.dtype(), x.shape()}, {bx.dtype(), bx.shape()}}, o)->Run({x, bx}, profile)[0];
    return Compile(g, {{x.dtype(), x.shape()}}, o)->Run({x}, profile)[0];
  };
  const Tensor expected = run({.num_threads = 2, .fast_kernels = false, .fuse = false}, nullptr);
  std::vector<OpProfile> profile;
  const Tensor got = run({.num_threads = 2, .fast_kernels = true, .fuse = true}, &profile);
  const Tensor fused_reference = run({.num_threads = 2, .fast_kernels = false, .fuse = true}, nullptr);
  int int8_matmuls = 0;
  for (const OpProfile& p : profile) int8_matmuls += p.kernel == "MatMulInt8Dnnl";
  // Constant weights on the int8 kernel everywhere (in safe pairs where oneDNN's int8 products are not exact: AVX2
  // without VNNI, or OSPREY_INT8_PAIRING=1); a run-time B only where they are exact (VNNI, AMX).
  EXPECT_EQ(int8_matmuls, !b_input || Int8ProductsExact() ? 1 : 0);
  for (const Tensor* t : {&got, &fused_reference}) {
    ASSERT_EQ(t->numel(), expected.numel());
    int64_t off = 0;
    for (int64_t i = 0; i < expected.numel(); ++i) {
      const float d = std::fabs(t->data<float>()[i] - expected.data<float>()[i]);
      EXPECT_LE(d, 0.06f * 1.001f) << i;
      off += d > 0.03f;
      const float steps = t->data<float>()[i] / 0.06f;  // on the output's grid
      EXPECT_NEAR(steps, std::nearbyint(steps), 1e-3f) << i;
    }
    EXPECT_LE(off, expected.numel() / 50);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Int8MatMulFusion,
                         ::testing::Values(MatMulCase::kConstantB, MatMulCase::kInputB, MatMulCase::kGemm),
                         [](const ::testing::TestParamInfo<MatMulCase>& info) {
                           return info.param == MatMulCase::kConstantB ? std::string("ConstantB")
                                  : info.param == MatMulCase::kInputB  ? std::string("InputB")
                                                                       : std::string("Gemm");
                         });

}  // namespace
}  // namespace osprey
