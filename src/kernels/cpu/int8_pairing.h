// Input-channel pairing for oneDNN's int8 kernels where its products are not exact (AVX2 without VNNI: vpmaddubsw sums
// two adjacent u8 x s8 products in 16 bits, saturating; dnnl_conv_int8.cc, dnnl_matmul_int8.cc). The kernels place
// the input channels (a convolution's C, a MatMul's K) in pairs whose same-signed weight magnitudes sum to at most
// 128 for every output (255 * 128 < 32768), so every pair's sum fits: exact arithmetic at the price of a gather and
// a few zero channels.
#pragma once

#include <cstdint>
#include <vector>

namespace osprey::cpu {

/// Slots (an even count) -> the input channel placed there, -1 for an empty (zero-weight) slot. `by_channel`: the
/// int8 weights in [C][per_channel] order (each channel's weights for every output and tap). Pairs of channels safe
/// together, found greedily (the channel with the largest weights first, partners tried from the smallest up; a bound
/// on each channel's largest positive and negative weight accepts most pairs without the full test), else a zero
/// partner. Consecutive channels keep their order when they are safe together, so the kernels' copies stay runs
/// where the weights allow.
std::vector<int32_t> PairInputChannels(const std::vector<int8_t>& by_channel, int64_t per_channel);

}  // namespace osprey::cpu
