// oneDNN int8 convolution for QDQ models (src/kernels/cpu/dnnl_conv_int8.cc): a Conv with `_int8` attributes reading
// dequantised float input and writing DequantizeLinear(QuantizeLinear(conv)). Oracle: the reference QLinearConv kernel
// (int32 sums, float requantisation, half to even) on the int8 tensors, dequantised. Bound: one output step (the two
// scale the int32 sum in a different float order, which can move a value across a rounding boundary; rare).
// Full-range activations and weights check the kernel's answer to vpmaddubsw's 16-bit saturation on AVX2.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "kernel_test_util.h"
#include "kernels/cpu/dnnl_common.h"

namespace osprey::testing {
namespace {

Attribute Ints(std::vector<int64_t> v) { return Attribute::Ints(std::move(v)); }

struct Case {
  bool x_signed, y_signed;
  int x_zp, x_lo, x_hi, y_zp;
  bool per_channel, bias;
  int w_lo = -127, w_hi = 127;
  int big_channels = 0;  // the first input channels' weights all 127: no safe partner (pairing leaves zero slots)
};

Tensor Int8(bool is_signed, const Shape& shape, int lo, int hi, uint32_t seed) {
  Tensor t(is_signed ? DType::kI8 : DType::kU8, shape);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int v = d(rng);
    if (is_signed)
      t.data<int8_t>()[i] = static_cast<int8_t>(v);
    else
      t.data<uint8_t>()[i] = static_cast<uint8_t>(v);
  }
  return t;
}

int At(const Tensor& t, int64_t i) { return t.dtype() == DType::kI8 ? t.data<int8_t>()[i] : t.data<uint8_t>()[i]; }

Tensor ZeroPoint(bool is_signed, int zp) {
  return is_signed ? Tensor::Scalar<int8_t>(static_cast<int8_t>(zp)) : Tensor::Scalar<uint8_t>(static_cast<uint8_t>(zp));
}

// Runs the int8 kernel (input layout `layout`) and the reference; returns how many outputs differ (by one step).
int64_t Compare(const Case& c, const Shape& x_shape, const Shape& w_shape, AttributeMap attrs, uint32_t seed,
                Layout layout = Layout::kPlain, std::string* impl = nullptr) {
  const int64_t m = w_shape[0];
  const float x_scale = 0.02f, y_scale = 0.37f;
  std::vector<float> ws(c.per_channel ? m : 1);
  for (size_t i = 0; i < ws.size(); ++i) ws[i] = 0.004f + 0.0007f * static_cast<float>(i % 7);
  Tensor xq = Int8(c.x_signed, x_shape, c.x_lo, c.x_hi, seed);
  Tensor wq = Int8(true, w_shape, c.w_lo, c.w_hi, seed + 1);
  const int64_t taps = wq.numel() / (w_shape[0] * w_shape[1]);
  for (int64_t o = 0; o < w_shape[0]; ++o)
    for (int64_t k = 0; k < c.big_channels * taps; ++k) wq.data<int8_t>()[o * w_shape[1] * taps + k] = 127;
  std::vector<int32_t> bq(m);
  for (int64_t i = 0; i < m; ++i) bq[i] = static_cast<int32_t>((i * 7919) % 4001) - 2000;
  Tensor w_scale = c.per_channel ? Tensor::FromVector<float>({m}, ws) : Tensor::Scalar<float>(ws[0]);
  Tensor w_zp(DType::kI8, w_scale.shape());
  for (int64_t i = 0; i < w_zp.numel(); ++i) w_zp.data<int8_t>()[i] = 0;

  // Reference: QLinearConv on the integers, then DequantizeLinear.
  std::vector<Tensor> qin{xq, Tensor::Scalar<float>(x_scale), ZeroPoint(c.x_signed, c.x_zp), wq, w_scale, w_zp,
                          Tensor::Scalar<float>(y_scale), ZeroPoint(c.y_signed, c.y_zp)};
  if (c.bias) qin.push_back(Tensor::FromVector<int32_t>({m}, bq));
  Node qnode = MakeNode("QLinearConv", static_cast<int>(qin.size()), 1, attrs);
  const Tensor yq = RunReferenceNode(qnode, qin, 17)[0];

  // The fused Conv: float input (x_q dequantised), float weights and bias (DequantizeLinear's values).
  Tensor xf(DType::kF32, x_shape), wf(DType::kF32, w_shape), bf(DType::kF32, {m});
  for (int64_t i = 0; i < xf.numel(); ++i) xf.data<float>()[i] = static_cast<float>(At(xq, i) - c.x_zp) * x_scale;
  const int64_t per_m = wq.numel() / m;
  for (int64_t i = 0; i < wf.numel(); ++i) wf.data<float>()[i] = static_cast<float>(At(wq, i)) * ws[c.per_channel ? i / per_m : 0];
  for (int64_t i = 0; i < m; ++i) bf.data<float>()[i] = static_cast<float>(bq[i]) * (x_scale * ws[c.per_channel ? i : 0]);
  AttributeMap cattrs = attrs;
  cattrs["_int8"] = Attribute::Int(1);
  cattrs["_int8_x_scale"] = Attribute::Float(x_scale);
  cattrs["_int8_x_zero_point"] = Attribute::Int(c.x_zp);
  cattrs["_int8_x_signed"] = Attribute::Int(c.x_signed);
  cattrs["_int8_y_scale"] = Attribute::Float(y_scale);
  cattrs["_int8_y_zero_point"] = Attribute::Int(c.y_zp);
  cattrs["_int8_y_signed"] = Attribute::Int(c.y_signed);
  cattrs["_int8_w_scale"] = Attribute::Floats(ws);
  std::vector<Tensor> in{xf, wf, c.bias ? bf : Tensor()};
  Node node = MakeNode("Conv", 3, 1, cattrs);
  std::vector<Tensor> outputs;
  KernelBuildContext bc = MakeBuildContext(node, in, {false, true, true}, outputs);
  Tensor physical = xf;
  if (layout == Layout::kNhwc) {
    bc.input_layouts = {Layout::kNhwc, Layout::kPlain, Layout::kPlain};
    bc.output_layouts = {Layout::kNhwc};
    const int64_t n = x_shape[0], ch = x_shape[1], hw = x_shape[2] * x_shape[3];
    physical = Tensor(DType::kF32, {n, x_shape[2], x_shape[3], ch});
    for (int64_t b = 0; b < n; ++b)
      for (int64_t k = 0; k < ch; ++k)
        for (int64_t p = 0; p < hw; ++p)
          physical.data<float>()[(b * hw + p) * ch + k] = xf.data<float>()[(b * ch + k) * hw + p];
    const Shape& y = outputs[0].shape();
    outputs[0] = Tensor(DType::kF32, {y[0], y[2], y[3], y[1]});
  }
  std::unique_ptr<Kernel> kernel = CreateCpuKernel(bc);
  EXPECT_NE(kernel, nullptr);
  if (!kernel) return -1;
  EXPECT_EQ(std::string(kernel->Name()), "ConvInt8Dnnl");
  if (impl) *impl = cpu::DnnlConvInt8Implementation(*kernel);
  std::vector<Tensor> run_in{physical, wf, c.bias ? bf : Tensor()};
  int64_t differ = 0;
  for (int run = 0; run < 2; ++run) {
    if (run == 1) {  // the second run writes a fresh output (a kernel keeping its first run's buffer fails)
      outputs[0] = Tensor(DType::kF32, outputs[0].shape());
      std::fill(outputs[0].data<float>(), outputs[0].data<float>() + outputs[0].numel(),
                std::numeric_limits<float>::quiet_NaN());
    }
    RunKernel(*kernel, node, run_in, outputs);
    const Tensor& got = outputs[0];
    const int64_t n = yq.dim(0), ch = yq.dim(1), hw = yq.dim(2) * yq.dim(3);
    differ = 0;
    float max_diff = 0;
    for (int64_t i = 0; i < yq.numel(); ++i) {
      const float want = static_cast<float>(At(yq, i) - c.y_zp) * y_scale;
      int64_t j = i;
      if (layout == Layout::kNhwc) {
        const int64_t b = i / (ch * hw), k = (i / hw) % ch, p = i % hw;
        j = (b * hw + p) * ch + k;
      }
      (void)n;
      float d = std::fabs(got.data<float>()[j] - want);
      if (std::isnan(d)) d = std::numeric_limits<float>::infinity();  // an element the kernel did not write
      max_diff = std::max(max_diff, d);
      differ += d > 0.5f * y_scale;
    }
    EXPECT_LE(max_diff, y_scale * 1.001f) << "seed " << seed << ", " << differ << " of " << yq.numel() << " differ";
  }
  return differ;
}

AttributeMap Pad1() { return {{"kernel_shape", Ints({3, 3})}, {"pads", Ints({1, 1, 1, 1})}}; }

// Full-range activations and weights: without the channel pairing, oneDNN's AVX2 kernel saturates (errors of 7-19
// steps measured), and with s8 input it halves the weights (9% of outputs one step off).
// On a machine with VNNI or AMX the channels stay in order (exact 32-bit sums); OSPREY_INT8_PAIRING=1 forces the
// pairing there, so both placements are checked on such a machine (on one without, both runs pair).
TEST(DnnlConvInt8, FullRangeSignedActivationsAfterRelu) {
  for (const char* pairing : {"0", "1"}) {
    setenv("OSPREY_INT8_PAIRING", pairing, 1);
    std::string impl;
    const int64_t d = Compare({true, true, -128, -128, 127, -128, false, true}, {1, 32, 9, 11}, {48, 32, 3, 3}, Pad1(),
                              1, Layout::kNhwc, &impl);
    std::printf("OSPREY_INT8_PAIRING=%s: oneDNN implementation %s; %lld of %d outputs one step off\n", pairing,
                impl.c_str(), static_cast<long long>(d), 48 * 9 * 11);
    EXPECT_EQ(impl.find("ref"), std::string::npos);
    EXPECT_LE(d, 48 * 9 * 11 / 100) << "OSPREY_INT8_PAIRING=" << pairing;
  }
  unsetenv("OSPREY_INT8_PAIRING");
}

TEST(DnnlConvInt8, SignedAnyZeroPointPerChannelPlain) {
  EXPECT_LE(Compare({true, true, -14, -128, 127, 5, true, true}, {2, 16, 8, 8}, {24, 16, 3, 3}, Pad1(), 3), 24);
}

TEST(DnnlConvInt8, UnsignedActivations) {
  EXPECT_LE(Compare({false, false, 0, 0, 255, 0, true, true}, {1, 16, 8, 8}, {32, 16, 1, 1}, {}, 5, Layout::kNhwc), 20);
  EXPECT_LE(Compare({false, true, 128, 0, 255, -3, false, false}, {1, 16, 8, 8}, {32, 16, 3, 3}, Pad1(), 7), 20);
}

TEST(DnnlConvInt8, StridedAsymmetricPadsOddChannels) {
  EXPECT_LE(Compare({true, true, -128, -128, 127, -128, true, true}, {1, 7, 13, 9}, {16, 7, 3, 2},
                    {{"strides", Ints({2, 2})}, {"pads", Ints({0, 1, 2, 1})}}, 9, Layout::kNhwc),
            10);
}

// ResNet's downsample (1x1, stride 2) where pairing leaves zero partners: oneDNN's AVX2 kernel
// (jit_uni_int8_1x1:avx2) read stale bytes when the slot count was not a multiple of 16 (264 or 280 slots here: outputs
// tens of steps off, changing from run to run on 2 threads; int8_pairing.h). Also run with ONEDNN_MAX_CPU_ISA=AVX2
// (ctest int8_avx2_kernels), so a VNNI host checks that path too.
TEST(DnnlConvInt8, StridedPointwiseOddSlots) {
  Case c{false, false, 0, 0, 255, 0, true, true, -40, 40};
  for (int big : {1, 3, 17}) {  // 258, 262 and 274 slots before the rounding up
    c.big_channels = big;
    EXPECT_LE(Compare(c, {16, 256, 2, 2}, {512, 256, 1, 1}, {{"strides", Ints({2, 2})}}, 13 + big, Layout::kNhwc), 80)
        << big << " channels without a partner";
  }
}

TEST(DnnlConvInt8, FirstLayerThreeChannels7x7) {
  EXPECT_LE(Compare({true, true, -14, -128, 127, -128, false, true}, {1, 3, 20, 20}, {8, 3, 7, 7},
                    {{"strides", Ints({2, 2})}, {"pads", Ints({3, 3, 3, 3})}}, 11),
            10);
}

}  // namespace
}  // namespace osprey::testing
