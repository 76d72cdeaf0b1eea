// The FIR filter-bank convolution (kernels/cpu/fir_conv.cc: one input channel, 1-8 filters along one axis). Oracle:
// the reference Conv kernel on the same node and inputs (ExpectFastMatchesReference: two runs, other buffers).
#include "kernel_test_util.h"
#include "kernels/cpu/dnnl_common.h"

namespace osprey::testing {
namespace {

Attribute Ints(std::vector<int64_t> v) { return Attribute::Ints(std::move(v)); }

void ExpectFir(AttributeMap attrs, const Shape& x, const Shape& w, bool bias, uint32_t seed = 3) {
  const Node node = MakeNode("Conv", bias ? 3 : 2, 1, std::move(attrs));
  std::vector<Tensor> in{RandomTensor(x, seed), RandomTensor(w, seed + 1)};
  if (bias) in.push_back(RandomTensor({w[0]}, seed + 2));
  ExpectFastMatchesReference(node, in, {false, true, true}, "FirConvF32");
}

bool Offered(AttributeMap attrs, const Shape& x, const Shape& w) {
  const Node node = MakeNode("Conv", 2, 1, std::move(attrs));
  std::vector<Tensor> in{RandomTensor(x, 1), RandomTensor(w, 2)}, outputs;
  KernelBuildContext bc = MakeBuildContext(node, in, {false, true}, outputs);
  return cpu::CreateFirConv(bc) != nullptr;
}

TEST(FirConv, AResamplerAsOnnxAsrExportsIt) {
  // 48 -> 8 kHz: one 80-tap filter every 6 samples over a second, pads 37 and 43 ([N, 1, 1, L]).
  ExpectFir({{"strides", Ints({1, 6})}, {"pads", Ints({0, 37, 0, 43})}}, {1, 1, 1, 48000}, {1, 1, 1, 80}, false);
}

TEST(FirConv, SeveralFiltersWithBiasOverABatchInThreads) {
  // [N, 1, L], 3 filters of 31 taps, stride 4: 3 x 3 x 6,000 x 31 multiply-adds, shared among threads.
  ExpectFir({{"strides", Ints({4})}, {"pads", Ints({15, 15})}}, {3, 1, 24000}, {3, 1, 31}, true);
}

TEST(FirConv, WindowsPartlyOrWhollyInThePadding) {
  // 3 taps with 10 zeros each side of a 5-sample signal: the first and last windows see only padding (the bias).
  ExpectFir({{"pads", Ints({10, 10})}}, {2, 1, 5}, {2, 1, 3}, true);
  // More taps than samples, every window cut at both ends.
  ExpectFir({{"pads", Ints({8, 8})}}, {1, 1, 4}, {8, 1, 12}, false);
}

TEST(FirConv, AutoPadSameAndOddLengths) {
  ExpectFir({{"auto_pad", Attribute::String("SAME_UPPER")}, {"strides", Ints({3})}}, {1, 1, 1001}, {5, 1, 17}, true);
  ExpectFir({{"auto_pad", Attribute::String("VALID")}, {"strides", Ints({1, 7})}}, {2, 1, 1, 333}, {1, 1, 1, 9}, false);
}

TEST(FirConv, DeclinedOutsideItsCase) {
  EXPECT_TRUE(Offered({}, {1, 1, 100}, {8, 1, 5}));
  EXPECT_FALSE(Offered({}, {1, 1, 100}, {9, 1, 5}));                          // a wide bank: oneDNN's GEMM
  EXPECT_FALSE(Offered({}, {1, 2, 100}, {4, 2, 5}));                          // two input channels
  EXPECT_FALSE(Offered({{"dilations", Ints({2})}}, {1, 1, 100}, {4, 1, 5}));  // dilated
  EXPECT_FALSE(Offered({}, {1, 1, 8, 100}, {4, 1, 3, 5}));                    // 2-D
  EXPECT_FALSE(Offered({{"_activation", Attribute::String("Relu")}}, {1, 1, 100}, {4, 1, 5}));  // a fused activation
}

}  // namespace
}  // namespace osprey::testing
