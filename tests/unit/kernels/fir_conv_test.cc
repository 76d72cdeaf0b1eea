// The FIR filter-bank and 1-D depthwise convolution (kernels/cpu/fir_conv.cc: one input channel under 1-8 filters, or
// one filter per channel, along one axis). Oracle:
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

TEST(FirConv, DepthwiseOneDimensional) {
  // Silero VAD's layer (258 channels of 8 samples, 5 taps, pads 2), with its fused Relu; a conformer's (a batch of 2,
  // 64 channels of 300 frames, 31 taps: vectorised across outputs, in threads); strided, SAME padding, [N, C, 1, L].
  ExpectFir({{"group", Attribute::Int(258)}, {"pads", Ints({2, 2})}, {"_activation", Attribute::String("Relu")}},
            {1, 258, 8}, {258, 1, 5}, true);
  ExpectFir({{"group", Attribute::Int(64)}, {"pads", Ints({15, 15})}}, {2, 64, 300}, {64, 1, 31}, true);
  ExpectFir({{"group", Attribute::Int(16)}, {"strides", Ints({2})}, {"pads", Ints({1, 1})}}, {1, 16, 101}, {16, 1, 3},
            false);
  ExpectFir({{"group", Attribute::Int(8)}, {"auto_pad", Attribute::String("SAME_UPPER")}}, {3, 8, 1, 77}, {8, 1, 1, 6},
            true);
  // A fused activation the reference computes with libm (Sigmoid), and a long row against its own filter: outputs in
  // the 32-wide blocks, the 8-wide ones and one by one, windows cut by the padding at both ends.
  ExpectFir({{"group", Attribute::Int(3)}, {"pads", Ints({4, 6})}, {"_activation", Attribute::String("Sigmoid")}},
            {1, 3, 1000}, {3, 1, 9}, true);
  ExpectFir(
      {{"pads", Ints({4, 6})}, {"_activation", Attribute::String("LeakyRelu")}, {"_alpha", Attribute::Float(0.1f)}},
      {1, 1, 45}, {2, 1, 9}, true);
}

TEST(FirConv, DilatedAtStrideOne) {
  // A TCN's dilated depthwise layer as PyTorch exports it (dilation 8, "same" pads: the windows reach 8 and 16 samples
  // into the padding), in the 32-, 8- and one-wide blocks; a dilated filter bank with windows cut at both ends.
  ExpectFir({{"group", Attribute::Int(16)},
             {"dilations", Ints({8})},
             {"pads", Ints({8, 8})},
             {"_activation", Attribute::String("Relu")}},
            {2, 16, 301}, {16, 1, 3}, true);
  ExpectFir({{"group", Attribute::Int(4)}, {"dilations", Ints({1, 3})}, {"pads", Ints({0, 5, 0, 7})}}, {1, 4, 1, 53},
            {4, 1, 1, 5}, false);
  ExpectFir({{"dilations", Ints({5})}, {"pads", Ints({9, 2})}}, {1, 1, 12}, {3, 1, 4}, true);
}

TEST(FirConv, DeclinedOutsideItsCase) {
  EXPECT_TRUE(Offered({}, {1, 1, 100}, {8, 1, 5}));
  EXPECT_FALSE(Offered({}, {1, 1, 100}, {9, 1, 5}));                         // a wide bank: oneDNN's GEMM
  EXPECT_FALSE(Offered({}, {1, 2, 100}, {4, 2, 5}));                         // two input channels
  EXPECT_TRUE(Offered({{"dilations", Ints({2})}}, {1, 1, 100}, {4, 1, 5}));  // dilated
  EXPECT_FALSE(Offered({{"dilations", Ints({2})}, {"strides", Ints({2})}}, {1, 1, 100}, {4, 1, 5}));  // and strided
  EXPECT_FALSE(Offered({}, {1, 1, 8, 100}, {4, 1, 3, 5}));                                            // 2-D
  EXPECT_TRUE(Offered({{"group", Attribute::Int(4)}}, {1, 4, 100}, {4, 1, 5}));                       // depthwise
  EXPECT_FALSE(Offered({{"group", Attribute::Int(4)}}, {1, 4, 100}, {8, 1, 5}));        // two filters per channel
  EXPECT_FALSE(Offered({{"group", Attribute::Int(2)}}, {1, 4, 100}, {4, 2, 5}));        // grouped, not depthwise
  EXPECT_FALSE(Offered({{"group", Attribute::Int(4)}}, {1, 4, 6, 100}, {4, 1, 3, 5}));  // 2-D depthwise: oneDNN
}

}  // namespace
}  // namespace osprey::testing
