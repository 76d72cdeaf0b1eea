// Schemas and reference kernels of the nn op family. Oracles: values computed by hand, and naive loop formulas
// written out below (independent of the kernels' im2col/GEMM paths).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <vector>

#include "test_util.h"

namespace osprey {
namespace {

using testing::ExpectTensorNear;
using testing::MakeNode;
using testing::RandomTensor;
using testing::RunReferenceNode;

Tensor F32(Shape shape, std::vector<float> values) { return Tensor::FromVector<float>(std::move(shape), values); }

Attribute Ints(std::vector<int64_t> v) { return Attribute::Ints(std::move(v)); }

// ---------------------------------------------------------------- naive oracles

// Convolution parameters for the 3-D naive oracle; 1-D and 2-D cases are the same with leading size-1 dims.
struct ConvParams {
  int64_t group = 1;
  std::array<int64_t, 3> stride{1, 1, 1}, dilation{1, 1, 1}, pad_begin{0, 0, 0}, pad_end{0, 0, 0};
};

// y[n, m, o] = b[m] + sum_{c, k} x[n, g*C/g + c, o*s - pb + k*d] * w[m, c, k], zero outside the input.
// x is [N, C, D, H, W] and w is [M, C/group, KD, KH, KW]; returns [N, M, OD, OH, OW].
Tensor NaiveConv3d(const Tensor& x, const Tensor& w, const float* bias, const ConvParams& p) {
  const int64_t N = x.dim(0), C = x.dim(1), M = w.dim(0), Cg = C / p.group, Mg = M / p.group;
  int64_t in[3], k[3], out[3];
  for (int i = 0; i < 3; ++i) {
    in[i] = x.dim(2 + i);
    k[i] = w.dim(2 + i);
    out[i] = (in[i] + p.pad_begin[i] + p.pad_end[i] - ((k[i] - 1) * p.dilation[i] + 1)) / p.stride[i] + 1;
  }
  Tensor y(DType::kF32, {N, M, out[0], out[1], out[2]});
  const float* xd = x.data<float>();
  const float* wd = w.data<float>();
  float* yd = y.data<float>();
  int64_t yi = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t o0 = 0; o0 < out[0]; ++o0)
        for (int64_t o1 = 0; o1 < out[1]; ++o1)
          for (int64_t o2 = 0; o2 < out[2]; ++o2) {
            double sum = bias ? bias[m] : 0.0;
            const int64_t g = m / Mg;
            for (int64_t c = 0; c < Cg; ++c)
              for (int64_t k0 = 0; k0 < k[0]; ++k0)
                for (int64_t k1 = 0; k1 < k[1]; ++k1)
                  for (int64_t k2 = 0; k2 < k[2]; ++k2) {
                    int64_t i0 = o0 * p.stride[0] - p.pad_begin[0] + k0 * p.dilation[0];
                    int64_t i1 = o1 * p.stride[1] - p.pad_begin[1] + k1 * p.dilation[1];
                    int64_t i2 = o2 * p.stride[2] - p.pad_begin[2] + k2 * p.dilation[2];
                    if (i0 < 0 || i0 >= in[0] || i1 < 0 || i1 >= in[1] || i2 < 0 || i2 >= in[2]) continue;
                    float xv = xd[(((n * C + g * Cg + c) * in[0] + i0) * in[1] + i1) * in[2] + i2];
                    float wv = wd[(((m * Cg + c) * k[0] + k0) * k[1] + k1) * k[2] + k2];
                    sum += static_cast<double>(xv) * wv;
                  }
            yd[yi++] = static_cast<float>(sum);
          }
  return y;
}

// Conv in 2-D through the 3-D oracle ([N, C, H, W] viewed as [N, C, 1, H, W]).
Tensor NaiveConv2d(const Tensor& x, const Tensor& w, const float* bias, int64_t group, std::array<int64_t, 2> stride,
                   std::array<int64_t, 2> dilation, std::array<int64_t, 4> pads) {
  ConvParams p;
  p.group = group;
  p.stride = {1, stride[0], stride[1]};
  p.dilation = {1, dilation[0], dilation[1]};
  p.pad_begin = {0, pads[0], pads[1]};
  p.pad_end = {0, pads[2], pads[3]};
  Tensor y = NaiveConv3d(x.Reshaped({x.dim(0), x.dim(1), 1, x.dim(2), x.dim(3)}),
                         w.Reshaped({w.dim(0), w.dim(1), 1, w.dim(2), w.dim(3)}), bias, p);
  return y.Reshaped({y.dim(0), y.dim(1), y.dim(3), y.dim(4)});
}

// Transposed convolution as a scatter: every x[n, c, i] * w[c, m, k] lands on y[n, g*M/g + m, i*s - pb + k*d].
Tensor NaiveConvTranspose2d(const Tensor& x, const Tensor& w, const float* bias, int64_t group,
                            std::array<int64_t, 2> stride, std::array<int64_t, 2> dilation,
                            std::array<int64_t, 2> pad_begin, std::array<int64_t, 2> out) {
  const int64_t N = x.dim(0), C = x.dim(1), Cg = C / group, Mg = w.dim(1), M = Mg * group;
  Tensor y = Tensor::Zeros(DType::kF32, {N, M, out[0], out[1]});
  float* yd = y.data<float>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t i = 0; i < out[0] * out[1]; ++i) yd[(n * M + m) * out[0] * out[1] + i] = bias ? bias[m] : 0.f;
  const float* xd = x.data<float>();
  const float* wd = w.data<float>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t iy = 0; iy < x.dim(2); ++iy)
        for (int64_t ix = 0; ix < x.dim(3); ++ix)
          for (int64_t m = 0; m < Mg; ++m)
            for (int64_t ky = 0; ky < w.dim(2); ++ky)
              for (int64_t kx = 0; kx < w.dim(3); ++kx) {
                int64_t oy = iy * stride[0] - pad_begin[0] + ky * dilation[0];
                int64_t ox = ix * stride[1] - pad_begin[1] + kx * dilation[1];
                if (oy < 0 || oy >= out[0] || ox < 0 || ox >= out[1]) continue;
                int64_t oc = (c / Cg) * Mg + m;
                yd[((n * M + oc) * out[0] + oy) * out[1] + ox] += xd[((n * C + c) * x.dim(2) + iy) * x.dim(3) + ix] *
                                                                  wd[((c * Mg + m) * w.dim(2) + ky) * w.dim(3) + kx];
              }
  return y;
}

// ---------------------------------------------------------------- Conv

TEST(NnOpsConv, Basic3x3Input2x2KernelByHand) {
  Tensor x = F32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Tensor w = F32({1, 1, 2, 2}, {1, 2, 3, 4});
  Node node = MakeNode("Conv", 2, 1);
  auto out = RunReferenceNode(node, {x, w});
  // 1*1 + 2*2 + 4*3 + 5*4 = 37, then shifted windows.
  ExpectTensorNear(out[0], F32({1, 1, 2, 2}, {37, 47, 67, 77}));
  ExpectTensorNear(out[0], NaiveConv2d(x, w, nullptr, 1, {1, 1}, {1, 1}, {0, 0, 0, 0}));
}

TEST(NnOpsConv, BiasAndOddChannelsMatchNaive) {
  Tensor x = RandomTensor({2, 5, 7, 6}, 1);
  Tensor w = RandomTensor({13, 5, 3, 3}, 2);
  Tensor b = RandomTensor({13}, 3);
  Node node = MakeNode("Conv", 3, 1, {{"pads", Ints({1, 1, 1, 1})}});
  auto out = RunReferenceNode(node, {x, w, b});
  ExpectTensorNear(out[0], NaiveConv2d(x, w, b.data<float>(), 1, {1, 1}, {1, 1}, {1, 1, 1, 1}), 1e-4f, 1e-5f);
}

TEST(NnOpsConv, LargerThanOneGemmTileMatchesNaive) {
  // 37 output rows, 32*9 = 288 deep and 20*20 = 400 columns: tails in every GEMM tile dimension.
  Tensor x = RandomTensor({1, 32, 20, 20}, 4);
  Tensor w = RandomTensor({37, 32, 3, 3}, 5);
  Node node = MakeNode("Conv", 2, 1, {{"pads", Ints({1, 1, 1, 1})}});
  auto out = RunReferenceNode(node, {x, w});
  ExpectTensorNear(out[0], NaiveConv2d(x, w, nullptr, 1, {1, 1}, {1, 1}, {1, 1, 1, 1}), 1e-4f, 1e-4f);
}

TEST(NnOpsConv, PointwiseMatchesNaive) {
  Tensor x = RandomTensor({2, 13, 5, 3}, 6);
  Tensor w = RandomTensor({5, 13, 1, 1}, 7);
  auto out = RunReferenceNode(MakeNode("Conv", 2, 1), {x, w});
  ExpectTensorNear(out[0], NaiveConv2d(x, w, nullptr, 1, {1, 1}, {1, 1}, {0, 0, 0, 0}), 1e-4f, 1e-5f);
}

TEST(NnOpsConv, GroupedMatchesNaive) {
  Tensor x = RandomTensor({1, 6, 5, 5}, 8);
  Tensor w = RandomTensor({9, 2, 3, 3}, 9);  // group 3: 2 input and 3 output channels per group
  Tensor b = RandomTensor({9}, 10);
  Node node = MakeNode("Conv", 3, 1, {{"group", Attribute::Int(3)}});
  auto out = RunReferenceNode(node, {x, w, b});
  ExpectTensorNear(out[0], NaiveConv2d(x, w, b.data<float>(), 3, {1, 1}, {1, 1}, {0, 0, 0, 0}), 1e-4f, 1e-5f);
}

TEST(NnOpsConv, DepthwiseByHandAndWithMultiplier) {
  // Depthwise 1x1 kernels scale each channel by its own weight.
  Tensor x = F32({1, 3, 1, 2}, {1, 2, 3, 4, 5, 6});
  Tensor w = F32({3, 1, 1, 1}, {10, 20, 30});
  auto out = RunReferenceNode(MakeNode("Conv", 2, 1, {{"group", Attribute::Int(3)}}), {x, w});
  ExpectTensorNear(out[0], F32({1, 3, 1, 2}, {10, 20, 60, 80, 150, 180}));

  Tensor x2 = RandomTensor({2, 5, 9, 7}, 11);
  Tensor w2 = RandomTensor({10, 1, 3, 3}, 12);  // channel multiplier 2
  Node node =
      MakeNode("Conv", 2, 1, {{"group", Attribute::Int(5)}, {"pads", Ints({1, 1, 1, 1})}, {"strides", Ints({2, 2})}});
  auto out2 = RunReferenceNode(node, {x2, w2});
  ExpectTensorNear(out2[0], NaiveConv2d(x2, w2, nullptr, 5, {2, 2}, {1, 1}, {1, 1, 1, 1}), 1e-4f, 1e-5f);
}

TEST(NnOpsConv, DilationByHandAndNaive) {
  // 1-D: x = 1..5, kernel [1, 1] with dilation 2 sums x[i] + x[i + 2].
  Tensor x = F32({1, 1, 5}, {1, 2, 3, 4, 5});
  Tensor w = F32({1, 1, 2}, {1, 1});
  auto out = RunReferenceNode(MakeNode("Conv", 2, 1, {{"dilations", Ints({2})}}), {x, w});
  ExpectTensorNear(out[0], F32({1, 1, 3}, {4, 6, 8}));

  Tensor x2 = RandomTensor({1, 3, 9, 8}, 13);
  Tensor w2 = RandomTensor({4, 3, 3, 2}, 14);
  auto out2 =
      RunReferenceNode(MakeNode("Conv", 2, 1, {{"dilations", Ints({2, 3})}, {"pads", Ints({2, 1, 1, 2})}}), {x2, w2});
  ExpectTensorNear(out2[0], NaiveConv2d(x2, w2, nullptr, 1, {1, 1}, {2, 3}, {2, 1, 1, 2}), 1e-4f, 1e-5f);
}

TEST(NnOpsConv, AsymmetricPadsByHand) {
  // 1-D x = [1, 2, 3], kernel [1, 1], pads begin 0, end 2: windows [1,2] [2,3] [3,0] [0,0].
  Tensor x = F32({1, 1, 3}, {1, 2, 3});
  Tensor w = F32({1, 1, 2}, {1, 1});
  auto out = RunReferenceNode(MakeNode("Conv", 2, 1, {{"pads", Ints({0, 2})}}), {x, w});
  ExpectTensorNear(out[0], F32({1, 1, 4}, {3, 5, 3, 0}));

  Tensor x2 = RandomTensor({1, 2, 6, 5}, 15);
  Tensor w2 = RandomTensor({3, 2, 3, 3}, 16);
  auto out2 = RunReferenceNode(MakeNode("Conv", 2, 1, {{"pads", Ints({0, 2, 1, 0})}}), {x2, w2});
  ExpectTensorNear(out2[0], NaiveConv2d(x2, w2, nullptr, 1, {1, 1}, {1, 1}, {0, 2, 1, 0}), 1e-4f, 1e-5f);
}

TEST(NnOpsConv, StridesMatchNaive) {
  Tensor x = RandomTensor({1, 3, 11, 10}, 17);
  Tensor w = RandomTensor({4, 3, 3, 3}, 18);
  auto out =
      RunReferenceNode(MakeNode("Conv", 2, 1, {{"strides", Ints({2, 3})}, {"pads", Ints({1, 1, 1, 1})}}), {x, w});
  ASSERT_EQ(out[0].shape(), (Shape{1, 4, 6, 4}));
  ExpectTensorNear(out[0], NaiveConv2d(x, w, nullptr, 1, {2, 3}, {1, 1}, {1, 1, 1, 1}), 1e-4f, 1e-5f);
}

TEST(NnOpsConv, AutoPadSameUpperLowerAndValid) {
  // in 6, kernel 3, stride 2: out = ceil(6 / 2) = 3, total pad = (3 - 1) * 2 + 3 - 6 = 1.
  // SAME_UPPER puts it at the end (pads 0, 1), SAME_LOWER at the start (1, 0).
  Tensor x = RandomTensor({1, 2, 6, 6}, 19);
  Tensor w = RandomTensor({3, 2, 3, 3}, 20);
  auto upper = RunReferenceNode(
      MakeNode("Conv", 2, 1, {{"auto_pad", Attribute::String("SAME_UPPER")}, {"strides", Ints({2, 2})}}), {x, w});
  ExpectTensorNear(upper[0], NaiveConv2d(x, w, nullptr, 1, {2, 2}, {1, 1}, {0, 0, 1, 1}), 1e-4f, 1e-5f);
  auto lower = RunReferenceNode(
      MakeNode("Conv", 2, 1, {{"auto_pad", Attribute::String("SAME_LOWER")}, {"strides", Ints({2, 2})}}), {x, w});
  ExpectTensorNear(lower[0], NaiveConv2d(x, w, nullptr, 1, {2, 2}, {1, 1}, {1, 1, 0, 0}), 1e-4f, 1e-5f);
  // 1-D by hand: x = 1..4, kernel [1, 1, 1], stride 1, SAME_UPPER: total pad 2 -> 1 each side.
  auto same1d = RunReferenceNode(MakeNode("Conv", 2, 1, {{"auto_pad", Attribute::String("SAME_UPPER")}}),
                                 {F32({1, 1, 4}, {1, 2, 3, 4}), F32({1, 1, 3}, {1, 1, 1})});
  ExpectTensorNear(same1d[0], F32({1, 1, 4}, {3, 6, 9, 7}));
  auto valid = RunReferenceNode(
      MakeNode("Conv", 2, 1, {{"auto_pad", Attribute::String("VALID")}, {"pads", Ints({5, 5, 5, 5})}}), {x, w});
  ExpectTensorNear(valid[0], NaiveConv2d(x, w, nullptr, 1, {1, 1}, {1, 1}, {0, 0, 0, 0}), 1e-4f, 1e-5f);
}

TEST(NnOpsConv, ThreeDMatchesNaive) {
  Tensor x = RandomTensor({1, 3, 4, 5, 6}, 21);
  Tensor w = RandomTensor({2, 3, 2, 3, 2}, 22);
  Tensor b = RandomTensor({2}, 23);
  Node node =
      MakeNode("Conv", 3, 1,
               {{"pads", Ints({1, 0, 1, 0, 1, 1})}, {"strides", Ints({1, 2, 1})}, {"kernel_shape", Ints({2, 3, 2})}});
  auto out = RunReferenceNode(node, {x, w, b});
  ConvParams p;
  p.pad_begin = {1, 0, 1};
  p.pad_end = {0, 1, 1};
  p.stride = {1, 2, 1};
  ExpectTensorNear(out[0], NaiveConv3d(x, w, b.data<float>(), p), 1e-4f, 1e-5f);
}

TEST(NnOpsConv, FusedResidualAndReluEqualsSeparateOps) {
  Tensor x = RandomTensor({1, 3, 5, 5}, 24);
  Tensor w = RandomTensor({4, 3, 3, 3}, 25);
  Tensor b = RandomTensor({4}, 26);
  Tensor residual = RandomTensor({1, 4, 5, 5}, 27);
  AttributeMap attrs = {{"pads", Ints({1, 1, 1, 1})}};
  Tensor plain = RunReferenceNode(MakeNode("Conv", 3, 1, attrs), {x, w, b})[0];
  AttributeMap fused_attrs = attrs;
  fused_attrs["_residual"] = Attribute::Int(1);
  fused_attrs["_activation"] = Attribute::String("Relu");
  Tensor fused = RunReferenceNode(MakeNode("Conv", 4, 1, fused_attrs), {x, w, b, residual})[0];
  Tensor expected(DType::kF32, plain.shape());
  for (int64_t i = 0; i < plain.numel(); ++i)
    expected.data<float>()[i] = std::max(0.f, plain.data<float>()[i] + residual.data<float>()[i]);
  ExpectTensorNear(fused, expected, 1e-5f, 1e-6f);

  // LeakyRelu without residual: activation after bias.
  AttributeMap leaky = attrs;
  leaky["_activation"] = Attribute::String("LeakyRelu");
  leaky["_alpha"] = Attribute::Float(0.1f);
  Tensor leaky_out = RunReferenceNode(MakeNode("Conv", 3, 1, leaky), {x, w, b})[0];
  for (int64_t i = 0; i < plain.numel(); ++i) {
    float v = plain.data<float>()[i];
    EXPECT_NEAR(leaky_out.data<float>()[i], v >= 0 ? v : 0.1f * v, 1e-6f);
  }
}

TEST(NnOpsConv, BadInputsThrow) {
  Tensor x = RandomTensor({1, 4, 5, 5}, 28);
  // X has 4 channels, W expects 3.
  EXPECT_THROW(RunReferenceNode(MakeNode("Conv", 2, 1), {x, RandomTensor({2, 3, 3, 3}, 29)}), Error);
  // group 3 does not divide 4 input channels.
  EXPECT_THROW(
      RunReferenceNode(MakeNode("Conv", 2, 1, {{"group", Attribute::Int(3)}}), {x, RandomTensor({3, 1, 3, 3}, 30)}),
      Error);
  // group 2 does not divide 3 output channels.
  EXPECT_THROW(
      RunReferenceNode(MakeNode("Conv", 2, 1, {{"group", Attribute::Int(2)}}), {x, RandomTensor({3, 2, 3, 3}, 31)}),
      Error);
  Tensor w = RandomTensor({2, 4, 3, 3}, 32);
  EXPECT_THROW(RunReferenceNode(MakeNode("Conv", 3, 1), {x, w, RandomTensor({3}, 33)}), Error);  // bias size
  EXPECT_THROW(RunReferenceNode(MakeNode("Conv", 2, 1, {{"kernel_shape", Ints({2, 2})}}), {x, w}), Error);
  EXPECT_THROW(RunReferenceNode(MakeNode("Conv", 2, 1, {{"strides", Ints({0, 1})}}), {x, w}), Error);
  EXPECT_THROW(RunReferenceNode(MakeNode("Conv", 2, 1, {{"pads", Ints({1, 1})}}), {x, w}), Error);
  EXPECT_THROW(RunReferenceNode(MakeNode("Conv", 2, 1, {{"auto_pad", Attribute::String("SAME")}}), {x, w}), Error);
  EXPECT_THROW(RunReferenceNode(MakeNode("Conv", 2, 1), {RandomTensor({1, 4, 2, 2}, 34), w}), Error);  // too small
  EXPECT_THROW(RunReferenceNode(MakeNode("Conv", 2, 1), {RandomTensor({4, 5, 5}, 35), w}), Error);     // rank
  EXPECT_THROW(RunReferenceNode(MakeNode("Conv", 2, 1),
                                {Tensor::FromVector<int64_t>({1, 4, 3, 3}, std::vector<int64_t>(36)), w}),
               Error);  // dtype
  // Residual of the wrong shape, and a residual input without the attribute.
  AttributeMap fused = {{"_residual", Attribute::Int(1)}};
  EXPECT_THROW(RunReferenceNode(MakeNode("Conv", 4, 1, fused), {x, w, Tensor(), RandomTensor({1, 2, 3, 4}, 36)}),
               Error);
  EXPECT_THROW(RunReferenceNode(MakeNode("Conv", 4, 1), {x, w, Tensor(), RandomTensor({1, 2, 3, 3}, 37)}), Error);
  EXPECT_THROW(RunReferenceNode(MakeNode("Conv", 2, 1, {{"_activation", Attribute::String("Swish")}}), {x, w}), Error);
}

// ---------------------------------------------------------------- ConvTranspose

TEST(NnOpsConvTranspose, SmallCasesByHand) {
  Tensor x = F32({1, 1, 2, 2}, {1, 2, 3, 4});
  Tensor w = F32({1, 1, 2, 2}, {1, 1, 1, 1});
  // Stride 1: each input spreads over a 2x2 block, overlapping.
  auto s1 = RunReferenceNode(MakeNode("ConvTranspose", 2, 1), {x, w});
  ExpectTensorNear(s1[0], F32({1, 1, 3, 3}, {1, 3, 2, 4, 10, 6, 3, 7, 4}));
  // Stride 2: blocks tile without overlap.
  auto s2 = RunReferenceNode(MakeNode("ConvTranspose", 2, 1, {{"strides", Ints({2, 2})}}), {x, w});
  ExpectTensorNear(s2[0], F32({1, 1, 4, 4}, {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}));
  // Stride 2 with pads 1 on every side crops the border; bias adds 0.5.
  auto cropped =
      RunReferenceNode(MakeNode("ConvTranspose", 3, 1, {{"strides", Ints({2, 2})}, {"pads", Ints({1, 1, 1, 1})}}),
                       {x, w, F32({1}, {0.5f})});
  ExpectTensorNear(cropped[0], F32({1, 1, 2, 2}, {1.5f, 2.5f, 3.5f, 4.5f}));
}

TEST(NnOpsConvTranspose, GroupsPadsDilationsOutputPaddingMatchNaive) {
  Tensor x = RandomTensor({2, 4, 3, 4}, 40);
  Tensor w = RandomTensor({4, 3, 3, 2}, 41);  // group 2: 2 in, 3 out channels per group -> 6 outputs
  Tensor b = RandomTensor({6}, 42);
  Node node = MakeNode("ConvTranspose", 3, 1,
                       {{"group", Attribute::Int(2)},
                        {"strides", Ints({2, 3})},
                        {"dilations", Ints({2, 1})},
                        {"pads", Ints({1, 0, 2, 1})},
                        {"output_padding", Ints({1, 2})}});
  auto out = RunReferenceNode(node, {x, w, b});
  // out = s * (in - 1) + output_padding + (k - 1) * d + 1 - pad_begin - pad_end
  std::array<int64_t, 2> expected_out = {2 * 2 + 1 + 2 * 2 + 1 - 3, 3 * 3 + 2 + 1 + 1 - 1};
  ASSERT_EQ(out[0].shape(), (Shape{2, 6, expected_out[0], expected_out[1]}));
  ExpectTensorNear(out[0], NaiveConvTranspose2d(x, w, b.data<float>(), 2, {2, 3}, {2, 1}, {1, 0}, expected_out), 1e-4f,
                   1e-5f);
}

TEST(NnOpsConvTranspose, OutputShapeAndAutoPad) {
  Tensor x = RandomTensor({1, 2, 3, 3}, 43);
  Tensor w = RandomTensor({2, 3, 3, 3}, 44);
  // output_shape larger than the natural 9x7 output: the extra row/column stays at the end (zero pads at start).
  auto shaped = RunReferenceNode(
      MakeNode("ConvTranspose", 2, 1, {{"strides", Ints({3, 2})}, {"output_shape", Ints({10, 8})}}), {x, w});
  ExpectTensorNear(shaped[0], NaiveConvTranspose2d(x, w, nullptr, 1, {3, 2}, {1, 1}, {0, 0}, {10, 8}), 1e-4f, 1e-5f);
  // SAME_UPPER with stride 2: out = 6, total pad = 2 * 2 + 3 - 6 = 1 -> begin 0; SAME_LOWER -> begin 1.
  auto upper = RunReferenceNode(
      MakeNode("ConvTranspose", 2, 1, {{"strides", Ints({2, 2})}, {"auto_pad", Attribute::String("SAME_UPPER")}}),
      {x, w});
  ExpectTensorNear(upper[0], NaiveConvTranspose2d(x, w, nullptr, 1, {2, 2}, {1, 1}, {0, 0}, {6, 6}), 1e-4f, 1e-5f);
  auto lower = RunReferenceNode(
      MakeNode("ConvTranspose", 2, 1, {{"strides", Ints({2, 2})}, {"auto_pad", Attribute::String("SAME_LOWER")}}),
      {x, w});
  ExpectTensorNear(lower[0], NaiveConvTranspose2d(x, w, nullptr, 1, {2, 2}, {1, 1}, {1, 1}, {6, 6}), 1e-4f, 1e-5f);
}

TEST(NnOpsConvTranspose, BadInputsThrow) {
  EXPECT_THROW(RunReferenceNode(MakeNode("ConvTranspose", 2, 1),
                                {RandomTensor({1, 3, 2, 2}, 45), RandomTensor({2, 1, 2, 2}, 46)}),
               Error);  // W[0] must equal X channels
  EXPECT_THROW(RunReferenceNode(MakeNode("ConvTranspose", 2, 1, {{"group", Attribute::Int(2)}}),
                                {RandomTensor({1, 3, 2, 2}, 47), RandomTensor({3, 1, 2, 2}, 48)}),
               Error);  // group does not divide channels
  EXPECT_THROW(RunReferenceNode(MakeNode("ConvTranspose", 2, 1, {{"pads", Ints({2, 2, 2, 2})}}),
                                {RandomTensor({1, 1, 1, 1}, 49), RandomTensor({1, 1, 2, 2}, 50)}),
               Error);  // output would be empty
}

// ---------------------------------------------------------------- normalisations

TEST(NnOpsNorm, BatchNormalizationMatchesFormula) {
  Tensor x = RandomTensor({2, 3, 4, 5}, 60);
  Tensor scale = F32({3}, {0.5f, 2.f, -1.f});
  Tensor bias = F32({3}, {0.1f, 0.f, 1.f});
  Tensor mean = F32({3}, {0.2f, -0.3f, 0.f});
  Tensor var = F32({3}, {1.f, 0.25f, 4.f});
  const float eps = 1e-3f;
  auto out = RunReferenceNode(MakeNode("BatchNormalization", 5, 1, {{"epsilon", Attribute::Float(eps)}}),
                              {x, scale, bias, mean, var});
  Tensor expected(DType::kF32, x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t c = (i / 20) % 3;
    float s = scale.data<float>()[c], b = bias.data<float>()[c], m = mean.data<float>()[c], v = var.data<float>()[c];
    expected.data<float>()[i] = (x.data<float>()[i] - m) / std::sqrt(v + eps) * s + b;
  }
  ExpectTensorNear(out[0], expected, 1e-5f, 1e-6f);

  // Rank 2 [N, C].
  Tensor x2 = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  auto out2 = RunReferenceNode(MakeNode("BatchNormalization", 5, 1, {{"epsilon", Attribute::Float(0.f)}}),
                               {x2, scale, bias, mean, var});
  ExpectTensorNear(out2[0],
                   F32({2, 3}, {(1 - 0.2f) * 0.5f + 0.1f, (2 + 0.3f) / 0.5f * 2.f, (3 - 0.f) / 2.f * -1.f + 1.f,
                                (4 - 0.2f) * 0.5f + 0.1f, (5 + 0.3f) / 0.5f * 2.f, (6 - 0.f) / 2.f * -1.f + 1.f}));
}

TEST(NnOpsNorm, BatchNormalizationTrainingModeUsesTheBatchStatistics) {
  // training_mode = 1 (opset 15): Y from X's own per-channel mean and biased variance over N, H, W; outputs 1 and 2
  // the running statistics input * momentum + current * (1 - momentum). Oracle: those sums by hand.
  Tensor x = RandomTensor({2, 3, 2, 2}, 61), p = F32({3}, {1, 1, 1});
  Tensor scale = F32({3}, {1.f, 2.f, 0.5f}), bias = F32({3}, {0.f, -1.f, 3.f});
  Tensor mean = F32({3}, {0.1f, 0.2f, 0.3f}), var = F32({3}, {1.f, 2.f, 3.f});
  auto out = RunReferenceNode(MakeNode("BatchNormalization", 5, 3,
                                       {{"training_mode", Attribute::Int(1)},
                                        {"momentum", Attribute::Float(0.75f)},
                                        {"epsilon", Attribute::Float(1e-3f)}}),
                              {x, scale, bias, mean, var}, 15);
  ASSERT_EQ(out.size(), 3u);
  for (int64_t c = 0; c < 3; ++c) {
    double m = 0, v = 0;
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t i = 0; i < 4; ++i) m += x.data<float>()[(n * 3 + c) * 4 + i] / 8.0;
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t i = 0; i < 4; ++i) v += std::pow(x.data<float>()[(n * 3 + c) * 4 + i] - m, 2) / 8.0;
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t i = 0; i < 4; ++i) {
        const int64_t k = (n * 3 + c) * 4 + i;
        EXPECT_NEAR(out[0].data<float>()[k],
                    (x.data<float>()[k] - m) / std::sqrt(v + 1e-3) * scale.data<float>()[c] + bias.data<float>()[c],
                    1e-5);
      }
    EXPECT_NEAR(out[1].data<float>()[c], mean.data<float>()[c] * 0.75 + m * 0.25, 1e-6);
    EXPECT_NEAR(out[2].data<float>()[c], var.data<float>()[c] * 0.75 + v * 0.25, 1e-6);
  }
  EXPECT_THROW(RunReferenceNode(MakeNode("BatchNormalization", 5, 3), {x, p, p, p, p}), Error);  // not training
  EXPECT_THROW(RunReferenceNode(MakeNode("BatchNormalization", 5, 1), {x, F32({2}, {1, 1}), p, p, p}), Error);
}

TEST(NnOpsNorm, InstanceNormalizationMatchesFormula) {
  Tensor x = RandomTensor({2, 3, 5}, 62);
  Tensor scale = F32({3}, {1.f, 2.f, 0.5f}), bias = F32({3}, {0.f, -1.f, 3.f});
  auto out = RunReferenceNode(MakeNode("InstanceNormalization", 3, 1, {{"epsilon", Attribute::Float(1e-2f)}}),
                              {x, scale, bias});
  Tensor expected(DType::kF32, x.shape());
  for (int64_t p = 0; p < 6; ++p) {
    const float* xp = x.data<float>() + p * 5;
    double mean = 0, var = 0;
    for (int i = 0; i < 5; ++i) mean += xp[i] / 5.0;
    for (int i = 0; i < 5; ++i) var += (xp[i] - mean) * (xp[i] - mean) / 5.0;
    for (int i = 0; i < 5; ++i)
      expected.data<float>()[p * 5 + i] = static_cast<float>(
          (xp[i] - mean) / std::sqrt(var + 1e-2) * scale.data<float>()[p % 3] + bias.data<float>()[p % 3]);
  }
  ExpectTensorNear(out[0], expected, 1e-5f, 1e-5f);
}

// GroupNormalization of [1, 4, 2] in 2 groups (channels 0-1 and 2-3): opset 18 takes scale/bias per group, opset 21
// per channel; num_groups must divide the channels.
TEST(NnOpsNorm, GroupNormalizationPerGroupAndPerChannel) {
  const Tensor x = F32({1, 4, 2}, {1, 2, 3, 4, 10, 10, 10, 14});
  // Group 0: 1..4, mean 2.5, variance 1.25; group 1: 10, 10, 10, 14, mean 11, variance 3.
  const double inv0 = 1 / std::sqrt(1.25 + 1e-5), inv1 = 1 / std::sqrt(3 + 1e-5);
  Node n = MakeNode("GroupNormalization", 3, 1, {{"num_groups", Attribute::Int(2)}});
  Tensor want18(DType::kF32, {1, 4, 2}), want21(DType::kF32, {1, 4, 2});
  const float s18[2] = {2, -1}, b18[2] = {0.5f, 3}, s21[4] = {1, 2, 3, 4}, b21[4] = {0, 1, 0, -1};
  for (int i = 0; i < 8; ++i) {
    const int g = i / 4, c = i / 2;
    const double z = (x.data<float>()[i] - (g ? 11.0 : 2.5)) * (g ? inv1 : inv0);
    want18.data<float>()[i] = static_cast<float>(z * s18[g] + b18[g]);
    want21.data<float>()[i] = static_cast<float>(z * s21[c] + b21[c]);
  }
  ExpectTensorNear(RunReferenceNode(n, {x, F32({2}, {2, -1}), F32({2}, {0.5f, 3})}, 18)[0], want18, 1e-5f, 1e-5f);
  ExpectTensorNear(RunReferenceNode(n, {x, F32({4}, {1, 2, 3, 4}), F32({4}, {0, 1, 0, -1})}, 21)[0], want21, 1e-5f,
                   1e-5f);
  EXPECT_THROW(RunReferenceNode(n, {x, F32({4}, {1, 2, 3, 4}), F32({4}, {0, 1, 0, -1})}, 18), Error);  // per group
  EXPECT_THROW(RunReferenceNode(MakeNode("GroupNormalization", 3, 1, {{"num_groups", Attribute::Int(3)}}),
                                {x, F32({3}, {1, 1, 1}), F32({3}, {0, 0, 0})}, 18),
               Error);  // 3 does not divide 4
  EXPECT_THROW(RunReferenceNode(MakeNode("GroupNormalization", 3, 1), {x, F32({2}, {1, 1}), F32({2}, {0, 0})}, 18),
               Error);  // num_groups missing
}

// MeanVarianceNormalization over the default axes (N, H, W): per channel, (x - mean) / (std + 1e-9).
TEST(NnOpsNorm, MeanVarianceNormalizationPerChannel) {
  // [2, 2, 1, 2]: channel 0 holds 1, 3 (sample 0) and 5, 7 (sample 1): mean 4, std sqrt(5); channel 1 is constant 2.
  const Tensor x = F32({2, 2, 1, 2}, {1, 3, 2, 2, 5, 7, 2, 2});
  const float s = static_cast<float>(1 / (std::sqrt(5.0) + 1e-9));
  ExpectTensorNear(RunReferenceNode(MakeNode("MeanVarianceNormalization", 1, 1), {x}, 13)[0],
                   F32({2, 2, 1, 2}, {-3 * s, -1 * s, 0, 0, 1 * s, 3 * s, 0, 0}), 1e-6f, 1e-6f);
  EXPECT_THROW(RunReferenceNode(MakeNode("MeanVarianceNormalization", 1, 1, {{"axes", Attribute::Ints({4})}}), {x}, 13),
               Error);
}

// RoiAlign on a 4x4 ramp (value = 10 * row + col): a 2x2 box's one output cell averages its bilinear samples, which on
// a linear ramp is the value at the box's centre; max mode, output_half_pixel, and hostile rois and indices.
TEST(NnOpsRoiAlign, RampCentresAndHostileRois) {
  Tensor x(DType::kF32, {1, 1, 4, 4});
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) x.data<float>()[r * 4 + c] = static_cast<float>(10 * r + c);
  const Tensor rois = F32({1, 4}, {1, 1, 3, 3});  // x1, y1, x2, y2
  const Tensor index = Tensor::FromVector<int64_t>({1}, {0});
  // half_pixel: the box spans [0.5, 2.5] in pixel centres, centre 1.5 -> 10 * 1.5 + 1.5 = 16.5.
  Node avg = MakeNode("RoiAlign", 3, 1, {{"sampling_ratio", Attribute::Int(2)}});
  ExpectTensorNear(RunReferenceNode(avg, {x, rois, index}, 16)[0], F32({1, 1, 1, 1}, {16.5f}), 1e-6f, 1e-6f);
  // output_half_pixel (opset 10's rule): [1, 3], centre 2 -> 22.
  Node old = MakeNode("RoiAlign", 3, 1,
                      {{"sampling_ratio", Attribute::Int(2)},
                       {"coordinate_transformation_mode", Attribute::String("output_half_pixel")}});
  ExpectTensorNear(RunReferenceNode(old, {x, rois, index}, 16)[0], F32({1, 1, 1, 1}, {22.f}), 1e-6f, 1e-6f);
  // 2x2 output cells of a 2x2 box, one sample each, at (0.5 + 0.5 * i) + 0.5 ... -> the quarter centres.
  Node cells = MakeNode("RoiAlign", 3, 1,
                        {{"output_height", Attribute::Int(2)},
                         {"output_width", Attribute::Int(2)},
                         {"sampling_ratio", Attribute::Int(1)}});
  ExpectTensorNear(RunReferenceNode(cells, {x, rois, index}, 16)[0], F32({1, 1, 2, 2}, {11, 12, 21, 22}), 1e-5f, 1e-5f);
  EXPECT_THROW(RunReferenceNode(avg, {x, rois, Tensor::FromVector<int64_t>({1}, {1})}, 16), Error);  // no batch 1
  EXPECT_THROW(RunReferenceNode(avg, {x, F32({1, 4}, {0, 0, std::nanf(""), 3}), index}, 16), Error);
  EXPECT_THROW(RunReferenceNode(MakeNode("RoiAlign", 3, 1, {{"mode", Attribute::String("sum")}}), {x, rois, index}, 16),
               Error);
  EXPECT_THROW(
      RunReferenceNode(MakeNode("RoiAlign", 3, 1, {{"output_height", Attribute::Int(0)}}), {x, rois, index}, 16),
      Error);
  Node adaptive = MakeNode("RoiAlign", 3, 1);  // sampling_ratio 0: ceil(roi size / output size) per side
  EXPECT_THROW(RunReferenceNode(adaptive, {x, F32({1, 4}, {0, 0, 1e9f, 1e9f}), index}, 16), Error);  // 1e18 taps
}

// AffineGrid 2-D, 2x3 output, identity theta plus a translation: the base coordinates are -1 + (2i + 1) / L
// (align_corners 0) or -1 + 2i / (L - 1) (1), each moved by (0.5, -0.25).
TEST(NnOpsGrid, AffineGridBaseCoordinatesAndBadSizes) {
  const Tensor theta = F32({1, 2, 3}, {1, 0, 0.5f, 0, 1, -0.25f});
  auto size = Tensor::FromVector<int64_t>({4}, {1, 1, 2, 3});
  const float xs0[3] = {-2.f / 3, 0, 2.f / 3}, ys0[2] = {-0.5f, 0.5f}, xs1[3] = {-1, 0, 1}, ys1[2] = {-1, 1};
  for (int align = 0; align < 2; ++align) {
    Tensor want(DType::kF32, {1, 2, 3, 2});
    for (int h = 0; h < 2; ++h)
      for (int w = 0; w < 3; ++w) {
        want.data<float>()[(h * 3 + w) * 2] = (align ? xs1[w] : xs0[w]) + 0.5f;
        want.data<float>()[(h * 3 + w) * 2 + 1] = (align ? ys1[h] : ys0[h]) - 0.25f;
      }
    ExpectTensorNear(RunReferenceNode(MakeNode("AffineGrid", 2, 1, {{"align_corners", Attribute::Int(align)}}),
                                      {theta, size}, 20)[0],
                     want, 1e-6f, 1e-6f);
  }
  Node n = MakeNode("AffineGrid", 2, 1);
  EXPECT_THROW(RunReferenceNode(n, {theta, Tensor::FromVector<int64_t>({4}, {2, 1, 2, 3})}, 20), Error);     // N
  EXPECT_THROW(RunReferenceNode(n, {theta, Tensor::FromVector<int64_t>({4}, {1, 1, 0, 3})}, 20), Error);     // empty
  EXPECT_THROW(RunReferenceNode(n, {theta, Tensor::FromVector<int64_t>({5}, {1, 1, 2, 2, 3})}, 20), Error);  // 3-D
  EXPECT_THROW(
      RunReferenceNode(n, {theta, Tensor::FromVector<int64_t>({4}, {1, 1, int64_t{1} << 40, int64_t{1} << 40})}, 20),
      Error);  // too large
}

TEST(NnOpsNorm, LayerNormalizationMatchesFormula) {
  Tensor x = RandomTensor({2, 3, 4}, 63);
  // axis -1: normalise rows of 4; Scale [4], B [4]; Mean and InvStdDev are [2, 3, 1].
  Tensor scale = RandomTensor({4}, 64), bias = RandomTensor({4}, 65);
  auto out = RunReferenceNode(MakeNode("LayerNormalization", 3, 3), {x, scale, bias});
  Tensor expected(DType::kF32, x.shape()), mean_t(DType::kF32, {2, 3, 1}), inv_t(DType::kF32, {2, 3, 1});
  for (int r = 0; r < 6; ++r) {
    const float* xr = x.data<float>() + r * 4;
    double mean = (xr[0] + xr[1] + xr[2] + xr[3]) / 4.0, var = 0;
    for (int i = 0; i < 4; ++i) var += (xr[i] - mean) * (xr[i] - mean) / 4.0;
    double inv = 1.0 / std::sqrt(var + 1e-5);
    for (int i = 0; i < 4; ++i)
      expected.data<float>()[r * 4 + i] =
          static_cast<float>((xr[i] - mean) * inv * scale.data<float>()[i] + bias.data<float>()[i]);
    mean_t.data<float>()[r] = static_cast<float>(mean);
    inv_t.data<float>()[r] = static_cast<float>(inv);
  }
  ExpectTensorNear(out[0], expected, 1e-5f, 1e-5f);
  ExpectTensorNear(out[1], mean_t, 1e-5f, 1e-6f);
  ExpectTensorNear(out[2], inv_t, 1e-5f, 1e-5f);

  // axis 1 with a broadcast Scale [1, 4] and no bias: normalise over the last 12 values of each batch.
  Tensor scale2 = RandomTensor({1, 4}, 66);
  auto out2 = RunReferenceNode(MakeNode("LayerNormalization", 2, 1, {{"axis", Attribute::Int(1)}}), {x, scale2});
  Tensor expected2(DType::kF32, x.shape());
  for (int n = 0; n < 2; ++n) {
    const float* xn = x.data<float>() + n * 12;
    double mean = 0, var = 0;
    for (int i = 0; i < 12; ++i) mean += xn[i] / 12.0;
    for (int i = 0; i < 12; ++i) var += (xn[i] - mean) * (xn[i] - mean) / 12.0;
    for (int i = 0; i < 12; ++i)
      expected2.data<float>()[n * 12 + i] =
          static_cast<float>((xn[i] - mean) / std::sqrt(var + 1e-5) * scale2.data<float>()[i % 4]);
  }
  ExpectTensorNear(out2[0], expected2, 1e-5f, 1e-5f);
  EXPECT_THROW(RunReferenceNode(MakeNode("LayerNormalization", 2, 1), {x, RandomTensor({3}, 67)}), Error);
}

TEST(NnOpsNorm, LRNMatchesFormula) {
  Tensor x = RandomTensor({1, 5, 2, 2}, 68);
  const float alpha = 0.01f, beta = 0.6f, bias = 2.f;
  auto out = RunReferenceNode(MakeNode("LRN", 1, 1,
                                       {{"size", Attribute::Int(3)},
                                        {"alpha", Attribute::Float(alpha)},
                                        {"beta", Attribute::Float(beta)},
                                        {"bias", Attribute::Float(bias)}}),
                              {x});
  Tensor expected(DType::kF32, x.shape());
  for (int c = 0; c < 5; ++c)
    for (int s = 0; s < 4; ++s) {
      double sq = 0;
      for (int j = std::max(0, c - 1); j <= std::min(4, c + 1); ++j) sq += std::pow(x.data<float>()[j * 4 + s], 2);
      expected.data<float>()[c * 4 + s] =
          static_cast<float>(x.data<float>()[c * 4 + s] / std::pow(bias + alpha / 3 * sq, beta));
    }
  ExpectTensorNear(out[0], expected, 1e-5f, 1e-6f);
}

// ---------------------------------------------------------------- MatMul / Gemm

// Plain triple loop: c[m, n] = sum_k a[m, k] * b[k, n].
std::vector<float> NaiveMatMul(const float* a, const float* b, int64_t m, int64_t k, int64_t n) {
  std::vector<float> c(m * n, 0.f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t t = 0; t < k; ++t) s += static_cast<double>(a[i * k + t]) * b[t * n + j];
      c[i * n + j] = static_cast<float>(s);
    }
  return c;
}

TEST(NnOpsMatMul, BatchedBroadcast) {
  // [2, 1, 3, 4] x [5, 4, 2] -> [2, 5, 3, 2]: A's batch i pairs with every B batch j.
  Tensor a = RandomTensor({2, 1, 3, 4}, 70), b = RandomTensor({5, 4, 2}, 71);
  auto out = RunReferenceNode(MakeNode("MatMul", 2, 1), {a, b});
  Tensor expected(DType::kF32, {2, 5, 3, 2});
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 5; ++j) {
      auto c = NaiveMatMul(a.data<float>() + i * 12, b.data<float>() + j * 8, 3, 4, 2);
      std::copy(c.begin(), c.end(), expected.data<float>() + (i * 5 + j) * 6);
    }
  ExpectTensorNear(out[0], expected, 1e-5f, 1e-6f);
}

TEST(NnOpsMatMul, VectorPromotionByHand) {
  Tensor v = F32({3}, {1, 2, 3});
  Tensor m = F32({3, 2}, {1, 2, 3, 4, 5, 6});
  ExpectTensorNear(RunReferenceNode(MakeNode("MatMul", 2, 1), {v, m})[0], F32({2}, {22, 28}));
  Tensor m2 = F32({2, 3}, {1, 0, 1, 0, 1, 0});
  ExpectTensorNear(RunReferenceNode(MakeNode("MatMul", 2, 1), {m2, v})[0], F32({2}, {4, 2}));
  ExpectTensorNear(RunReferenceNode(MakeNode("MatMul", 2, 1), {v, v})[0], Tensor::Scalar<float>(14));
  // 1-D times batched: [3] x [2, 3, 2] -> [2, 2].
  Tensor batched = F32({2, 3, 2}, {1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 1, 1});
  ExpectTensorNear(RunReferenceNode(MakeNode("MatMul", 2, 1), {v, batched})[0], F32({2, 2}, {22, 28, 3, 3}));
}

TEST(NnOpsMatMul, TileTailsAndFusedActivation) {
  Tensor a = RandomTensor({37, 300}, 72), b = RandomTensor({300, 261}, 73);
  auto plain = RunReferenceNode(MakeNode("MatMul", 2, 1), {a, b});
  ExpectTensorNear(plain[0], F32({37, 261}, NaiveMatMul(a.data<float>(), b.data<float>(), 37, 300, 261)), 1e-4f, 1e-4f);
  auto relu = RunReferenceNode(MakeNode("MatMul", 2, 1, {{"_activation", Attribute::String("Relu")}}), {a, b});
  for (int64_t i = 0; i < plain[0].numel(); ++i)
    ASSERT_EQ(relu[0].data<float>()[i], std::max(0.f, plain[0].data<float>()[i]));
  EXPECT_THROW(RunReferenceNode(MakeNode("MatMul", 2, 1), {RandomTensor({2, 3}, 74), RandomTensor({4, 2}, 75)}), Error);
  EXPECT_THROW(RunReferenceNode(MakeNode("MatMul", 2, 1), {RandomTensor({2, 2, 3}, 76), RandomTensor({3, 3, 2}, 77)}),
               Error);  // batch 2 vs 3
}

TEST(NnOpsGemm, TransposesAlphaBetaAndBroadcastC) {
  // A' = A^T is [2, 3], B' = B^T is [3, 2].
  Tensor a = F32({3, 2}, {1, 4, 2, 5, 3, 6});  // A' = [[1, 2, 3], [4, 5, 6]]
  Tensor b = F32({2, 3}, {1, 0, 1, 0, 1, 1});  // B' = [[1, 0], [0, 1], [1, 1]]
  // A'B' = [[4, 5], [10, 11]]
  AttributeMap attrs = {{"transA", Attribute::Int(1)},
                        {"transB", Attribute::Int(1)},
                        {"alpha", Attribute::Float(2.f)},
                        {"beta", Attribute::Float(0.5f)}};
  auto row = RunReferenceNode(MakeNode("Gemm", 3, 1, attrs), {a, b, F32({2}, {10, 20})});
  ExpectTensorNear(row[0], F32({2, 2}, {8 + 5, 10 + 10, 20 + 5, 22 + 10}));
  auto col = RunReferenceNode(MakeNode("Gemm", 3, 1, attrs), {a, b, F32({2, 1}, {10, 20})});
  ExpectTensorNear(col[0], F32({2, 2}, {8 + 5, 10 + 5, 20 + 10, 22 + 10}));
  auto scalar = RunReferenceNode(MakeNode("Gemm", 3, 1, attrs), {a, b, Tensor::Scalar<float>(4)});
  ExpectTensorNear(scalar[0], F32({2, 2}, {10, 12, 22, 24}));
  auto no_c =
      RunReferenceNode(MakeNode("Gemm", 2, 1), {F32({2, 3}, {1, 2, 3, 4, 5, 6}), F32({3, 2}, {1, 0, 0, 1, 1, 1})});
  ExpectTensorNear(no_c[0], F32({2, 2}, {4, 5, 10, 11}));
  auto fused = RunReferenceNode(MakeNode("Gemm", 3, 1,
                                         {{"_activation", Attribute::String("Clip")},
                                          {"_alpha", Attribute::Float(0.f)},
                                          {"_beta", Attribute::Float(6.f)}}),
                                {F32({1, 2}, {1, -1}), F32({2, 3}, {1, 0, 9, 0, 1, 0}), F32({1, 3}, {0, 0, 0})});
  ExpectTensorNear(fused[0], F32({1, 3}, {1, 0, 6}));
  // Odd sizes against the naive loop with transB (the usual Linear layer layout).
  Tensor x = RandomTensor({5, 13}, 78), w = RandomTensor({7, 13}, 79), bias = RandomTensor({7}, 80);
  auto linear = RunReferenceNode(MakeNode("Gemm", 3, 1, {{"transB", Attribute::Int(1)}}), {x, w, bias});
  std::vector<float> wt(13 * 7);
  for (int i = 0; i < 7; ++i)
    for (int j = 0; j < 13; ++j) wt[j * 7 + i] = w.data<float>()[i * 13 + j];
  auto expected = NaiveMatMul(x.data<float>(), wt.data(), 5, 13, 7);
  for (int i = 0; i < 35; ++i) expected[i] += bias.data<float>()[i % 7];
  ExpectTensorNear(linear[0], F32({5, 7}, expected), 1e-5f, 1e-5f);
  EXPECT_THROW(RunReferenceNode(MakeNode("Gemm", 3, 1), {x, F32({13, 7}, wt), F32({3}, {1, 2, 3})}),
               Error);                                                    // C does not broadcast to [5, 7]
  EXPECT_THROW(RunReferenceNode(MakeNode("Gemm", 2, 1), {x, w}), Error);  // 13 vs 7 without transB
}

// ---------------------------------------------------------------- pools

TEST(NnOpsPool, MaxPoolCeilModeAndIndicesByHand) {
  Tensor x = F32({1, 1, 4, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16});
  AttributeMap attrs = {{"kernel_shape", Ints({3, 3})}, {"strides", Ints({2, 2})}};
  auto floor_mode = RunReferenceNode(MakeNode("MaxPool", 1, 1, attrs), {x});
  ExpectTensorNear(floor_mode[0], F32({1, 1, 1, 1}, {11}));
  attrs["ceil_mode"] = Attribute::Int(1);
  auto ceil_mode = RunReferenceNode(MakeNode("MaxPool", 1, 2, attrs), {x});
  ExpectTensorNear(ceil_mode[0], F32({1, 1, 2, 2}, {11, 12, 15, 16}));
  ExpectTensorNear(ceil_mode[1], Tensor::FromVector<int64_t>({1, 1, 2, 2}, {10, 11, 14, 15}));
  // Column-major indices: h + w * H.
  attrs["storage_order"] = Attribute::Int(1);
  auto col_major = RunReferenceNode(MakeNode("MaxPool", 1, 2, attrs), {x});
  ExpectTensorNear(col_major[1],
                   Tensor::FromVector<int64_t>({1, 1, 2, 2}, {2 + 2 * 4, 2 + 3 * 4, 3 + 2 * 4, 3 + 3 * 4}));
  // A ceil-mode window that would start in the end padding is dropped: in 4, k 2, s 2, pads (0, 1) -> 2 outputs.
  auto dropped = RunReferenceNode(MakeNode("MaxPool", 1, 1,
                                           {{"kernel_shape", Ints({2})},
                                            {"strides", Ints({2})},
                                            {"pads", Ints({0, 1})},
                                            {"ceil_mode", Attribute::Int(1)}}),
                                  {F32({1, 1, 4}, {1, 5, 2, 3})});
  ExpectTensorNear(dropped[0], F32({1, 1, 2}, {5, 3}));
}

TEST(NnOpsPool, MaxPoolPadsAndChannelsByHand) {
  // Two channels, pads 1 everywhere, kernel 2, stride 2: windows rows {-1,0},{1,2} x cols {-1,0},{1,2}.
  Tensor x = F32({1, 2, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9, -1, -2, -3, -4, -5, -6, -7, -8, -9});
  auto out = RunReferenceNode(
      MakeNode("MaxPool", 1, 2,
               {{"kernel_shape", Ints({2, 2})}, {"strides", Ints({2, 2})}, {"pads", Ints({1, 1, 1, 1})}}),
      {x});
  ExpectTensorNear(out[0], F32({1, 2, 2, 2}, {1, 3, 7, 9, -1, -2, -4, -5}));
  // Indices count the batch and channel offsets (channel 1 starts at 9); padding never wins.
  ExpectTensorNear(out[1], Tensor::FromVector<int64_t>({1, 2, 2, 2}, {0, 2, 6, 8, 9, 10, 12, 13}));
  // Ties: the first maximum in scan order wins.
  auto ties = RunReferenceNode(MakeNode("MaxPool", 1, 2, {{"kernel_shape", Ints({2})}, {"strides", Ints({2})}}),
                               {F32({1, 1, 4}, {2, 2, 1, 1})});
  ExpectTensorNear(ties[0], F32({1, 1, 2}, {2, 1}));
  ExpectTensorNear(ties[1], Tensor::FromVector<int64_t>({1, 1, 2}, {0, 2}));
  // Dilation 2 on 1-D: window {i, i + 2}.
  auto dilated = RunReferenceNode(MakeNode("MaxPool", 1, 1, {{"kernel_shape", Ints({2})}, {"dilations", Ints({2})}}),
                                  {F32({1, 1, 5}, {3, 1, 2, 5, 0})});
  ExpectTensorNear(dilated[0], F32({1, 1, 3}, {3, 5, 2}));
}

TEST(NnOpsPool, AveragePoolCountIncludePad) {
  Tensor x = F32({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  AttributeMap attrs = {{"kernel_shape", Ints({2, 2})}, {"pads", Ints({1, 1, 1, 1})}};
  auto exclude = RunReferenceNode(MakeNode("AveragePool", 1, 1, attrs), {x});
  // Row 0 of the 4x4 output: windows over rows {-1, 0}; only row 0 counts.
  ExpectTensorNear(exclude[0],
                   F32({1, 1, 4, 4}, {1, 1.5f, 2.5f, 3, 2.5f, 3, 4, 4.5f, 5.5f, 6, 7, 7.5f, 7, 7.5f, 8.5f, 9}));
  attrs["count_include_pad"] = Attribute::Int(1);
  auto include = RunReferenceNode(MakeNode("AveragePool", 1, 1, attrs), {x});
  ExpectTensorNear(include[0], F32({1, 1, 4, 4}, {0.25f, 0.75f, 1.25f, 0.75f, 1.25f, 3, 4, 2.25f, 2.75f, 6, 7, 3.75f,
                                                  1.75f, 3.75f, 4.25f, 2.25f}));
  // ceil_mode: the last window [3, 4, overhang] divides by its 2 values; count_include_pad counts declared padding
  // only, never the overhang past it (ONNX >= 1.18, ONNX Runtime 1.32 and PyTorch; ONNX Runtime 1.20 gave 7 / 3).
  AttributeMap ceil = {{"kernel_shape", Ints({3})}, {"strides", Ints({2})}, {"ceil_mode", Attribute::Int(1)}};
  Tensor x1 = F32({1, 1, 4}, {1, 2, 3, 4});
  ExpectTensorNear(RunReferenceNode(MakeNode("AveragePool", 1, 1, ceil), {x1})[0], F32({1, 1, 2}, {2, 3.5f}));
  ceil["count_include_pad"] = Attribute::Int(1);
  ExpectTensorNear(RunReferenceNode(MakeNode("AveragePool", 1, 1, ceil), {x1})[0], F32({1, 1, 2}, {2, 3.5f}));
  // Padded by 1 each side: windows [pad 1 2], [2 3 4], [4 pad overhang] -> 3/3, 9/3, 4/2.
  ceil["pads"] = Ints({1, 1});
  ExpectTensorNear(RunReferenceNode(MakeNode("AveragePool", 1, 1, ceil), {x1})[0], F32({1, 1, 3}, {1, 3, 2}));
  // A window longer than the input (Hugging Face's EfficientNet: AvgPool2d(2560, ceil_mode=True) on 7x7) gives one
  // output, the mean; without ceil_mode it does not fit.
  AttributeMap longer = {{"kernel_shape", Ints({2560})},
                         {"strides", Ints({2560})},
                         {"ceil_mode", Attribute::Int(1)},
                         {"count_include_pad", Attribute::Int(1)}};
  ExpectTensorNear(RunReferenceNode(MakeNode("AveragePool", 1, 1, longer), {x1})[0], F32({1, 1, 1}, {2.5f}));
  longer["ceil_mode"] = Attribute::Int(0);
  EXPECT_THROW(RunReferenceNode(MakeNode("AveragePool", 1, 1, longer), {x1}), Error);
  // Strided 1-D with SAME_UPPER: in 5, k 3, s 2 -> out 3, total pad 2 -> 1 each side.
  auto same = RunReferenceNode(
      MakeNode("AveragePool", 1, 1,
               {{"kernel_shape", Ints({3})}, {"strides", Ints({2})}, {"auto_pad", Attribute::String("SAME_UPPER")}}),
      {F32({1, 1, 5}, {1, 2, 3, 4, 5})});
  ExpectTensorNear(same[0], F32({1, 1, 3}, {1.5f, 3, 4.5f}));
}

TEST(NnOpsPool, GlobalPoolsAndLpPool) {
  Tensor x = F32({1, 2, 2, 2}, {1, 2, 3, 4, -1, -5, 2, 0});
  ExpectTensorNear(RunReferenceNode(MakeNode("GlobalAveragePool", 1, 1), {x})[0], F32({1, 2, 1, 1}, {2.5f, -1}));
  ExpectTensorNear(RunReferenceNode(MakeNode("GlobalMaxPool", 1, 1), {x})[0], F32({1, 2, 1, 1}, {4, 2}));
  auto lp = RunReferenceNode(MakeNode("LpPool", 1, 1, {{"kernel_shape", Ints({2, 2})}}), {x});
  ExpectTensorNear(lp[0], F32({1, 2, 1, 1}, {std::sqrt(30.f), std::sqrt(30.f)}));
  EXPECT_THROW(RunReferenceNode(MakeNode("MaxPool", 1, 1), {x}), Error);  // kernel_shape missing
  EXPECT_THROW(RunReferenceNode(MakeNode("MaxPool", 1, 1, {{"kernel_shape", Ints({3, 3})}}), {x}), Error);  // too big
}

// ---------------------------------------------------------------- softmax family

TEST(NnOpsSoftmax, Opset11CoercesTo2DOpset13UsesOneAxis) {
  Tensor x = RandomTensor({2, 3, 4}, 90, -3.f, 3.f);
  const float* xd = x.data<float>();
  Node node = MakeNode("Softmax", 1, 1, {{"axis", Attribute::Int(1)}});
  // Opset 11: each batch's 12 values form one distribution.
  Tensor expected11(DType::kF32, x.shape());
  for (int n = 0; n < 2; ++n) {
    double sum = 0;
    for (int i = 0; i < 12; ++i) sum += std::exp(xd[n * 12 + i]);
    for (int i = 0; i < 12; ++i)
      expected11.data<float>()[n * 12 + i] = static_cast<float>(std::exp(xd[n * 12 + i]) / sum);
  }
  ExpectTensorNear(RunReferenceNode(node, {x}, 11)[0], expected11, 1e-5f, 1e-7f);
  // Opset 13: distributions along axis 1 only (3 values, stride 4).
  Tensor expected13(DType::kF32, x.shape());
  for (int n = 0; n < 2; ++n)
    for (int k = 0; k < 4; ++k) {
      double sum = 0;
      for (int c = 0; c < 3; ++c) sum += std::exp(xd[n * 12 + c * 4 + k]);
      for (int c = 0; c < 3; ++c)
        expected13.data<float>()[n * 12 + c * 4 + k] = static_cast<float>(std::exp(xd[n * 12 + c * 4 + k]) / sum);
    }
  ExpectTensorNear(RunReferenceNode(node, {x}, 13)[0], expected13, 1e-5f, 1e-7f);
  // Default axis: 1 before opset 13 (same as above), -1 from 13.
  ExpectTensorNear(RunReferenceNode(MakeNode("Softmax", 1, 1), {x}, 11)[0], expected11, 1e-5f, 1e-7f);
  Tensor last = RunReferenceNode(MakeNode("Softmax", 1, 1), {x}, 13)[0];
  for (int r = 0; r < 6; ++r) {
    double sum = 0;
    for (int i = 0; i < 4; ++i) sum += std::exp(xd[r * 4 + i]);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(last.data<float>()[r * 4 + i], std::exp(xd[r * 4 + i]) / sum, 1e-6);
  }
  EXPECT_THROW(RunReferenceNode(MakeNode("Softmax", 1, 1, {{"axis", Attribute::Int(3)}}), {x}, 13), Error);
}

TEST(NnOpsSoftmax, LogSoftmaxAndHardmax) {
  Tensor x = F32({2, 3}, {1, 2, 3, 5, 5, -1});
  auto log = RunReferenceNode(MakeNode("LogSoftmax", 1, 1), {x}, 13);
  for (int r = 0; r < 2; ++r) {
    const float* xr = x.data<float>() + r * 3;
    double lse = std::log(std::exp(xr[0]) + std::exp(xr[1]) + std::exp(xr[2]));
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(log[0].data<float>()[r * 3 + i], xr[i] - lse, 1e-5);
  }
  // Large inputs must not overflow (max is subtracted first).
  auto big = RunReferenceNode(MakeNode("Softmax", 1, 1), {F32({2}, {1000, 1000})}, 13);
  ExpectTensorNear(big[0], F32({2}, {0.5f, 0.5f}));
  // Hardmax: first maximum wins ties.
  ExpectTensorNear(RunReferenceNode(MakeNode("Hardmax", 1, 1), {x}, 13)[0], F32({2, 3}, {0, 0, 1, 1, 0, 0}));
  // Opset 11, axis 0: one distribution over all six values.
  ExpectTensorNear(RunReferenceNode(MakeNode("Hardmax", 1, 1, {{"axis", Attribute::Int(0)}}), {x}, 11)[0],
                   F32({2, 3}, {0, 0, 0, 1, 0, 0}));
}

}  // namespace
}  // namespace osprey
