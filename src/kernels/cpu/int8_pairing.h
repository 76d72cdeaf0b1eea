// Input-channel pairing for oneDNN's int8 kernels where its products are not exact (AVX2 without VNNI: vpmaddubsw sums
// two adjacent u8 x s8 products in 16 bits, saturating; dnnl_conv_int8.cc, dnnl_matmul_int8.cc). The kernels place
// the input channels (a convolution's C, a MatMul's K) in pairs whose same-signed weight magnitudes sum to at most
// 128 for every output (255 * 128 < 32768), so every pair's sum fits: exact arithmetic at the price of a gather and
// a few zero channels.
#pragma once

#include <cstdint>
#include <vector>

namespace osprey::cpu {

/// Slots (a multiple of 16) -> the input channel placed there, -1 for an empty (zero-weight) slot. Whole groups of
/// 16: with other counts oneDNN's AVX2 int8 kernels (no VNNI) gave wrong sums (a MatMul, `gemm:jit`, with K 448 or
/// 500 paired into 4k + 2 slots) and, on 2 threads, results that changed from run to run (a 1x1 stride-2
/// convolution, `jit_uni_int8_1x1:avx2`, with 264 or 280 slots; QDQ ResNet-18's last downsample), where AVX-512 and
/// VNNI kernels did not (tests/unit/kernels/dnnl_conv_int8_test.cc, ...StridedPointwiseOddSlots). `by_channel`: the
/// int8 weights in [C][per_channel] order (each channel's weights for every output and tap). Pairs of channels
/// safe together, found greedily (the channel with the largest weights first, partners tried from the smallest up; a
/// bound on each channel's largest positive and negative weight accepts most pairs without the full test), else a zero
/// partner. Consecutive channels keep their order when they are safe together, so the kernels' copies stay runs
/// where the weights allow.
std::vector<int32_t> PairInputChannels(const std::vector<int8_t>& by_channel, int64_t per_channel);

}  // namespace osprey::cpu
