// Input-channel pairing for oneDNN's int8 kernels on AVX2 without VNNI (int8_pairing.h).
#include "kernels/cpu/int8_pairing.h"

#include <algorithm>
#include <utility>

namespace osprey::cpu {
namespace {

// Whether weights channels a and b may share a vpmaddubsw pair: for every (output channel, tap) the positive parts
// and the negative parts of the two weights each sum to at most 128.
bool PairSafe(const std::vector<int8_t>& wt, int64_t per_channel, int64_t a, int64_t b) {
  const int8_t* wa = wt.data() + a * per_channel;
  const int8_t* wb = wt.data() + b * per_channel;
  for (int64_t k = 0; k < per_channel; ++k) {
    const int x = wa[k], y = wb[k];
    if (std::max(x, 0) + std::max(y, 0) > 128 || std::max(-x, 0) + std::max(-y, 0) > 128) return false;
  }
  return true;
}

}  // namespace

std::vector<int32_t> PairInputChannels(const std::vector<int8_t>& by_channel, int64_t per_channel) {
  std::vector<int32_t> slot_channel;
  const int64_t in_c = static_cast<int64_t>(by_channel.size()) / per_channel;
  std::vector<int> pos_max(in_c, 0), neg_max(in_c, 0);
  for (int64_t c = 0; c < in_c; ++c)
    for (int64_t k = 0; k < per_channel; ++k) {
      const int v = by_channel[c * per_channel + k];
      pos_max[c] = std::max(pos_max[c], v);
      neg_max[c] = std::max(neg_max[c], -v);
    }
  auto safe = [&](int64_t a, int64_t b) {
    if (pos_max[a] + pos_max[b] <= 128 && neg_max[a] + neg_max[b] <= 128) return true;
    return PairSafe(by_channel, per_channel, a, b);
  };
  std::vector<char> placed(in_c, 0);
  std::vector<int64_t> order(in_c);
  for (int64_t c = 0; c < in_c; ++c) order[c] = c;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return std::max(pos_max[a], neg_max[a]) > std::max(pos_max[b], neg_max[b]);
  });
  std::vector<std::pair<int64_t, int64_t>> pairs;
  // Natural pairs first (runs for the copy), then a matching of the rest.
  for (int64_t c = 0; c + 1 < in_c; c += 2)
    if (safe(c, c + 1)) {
      pairs.push_back({c, c + 1});
      placed[c] = placed[c + 1] = 1;
    }
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t a = order[i];
    if (placed[a]) continue;
    placed[a] = 1;
    int64_t partner = -1;
    int tries = 0;
    for (size_t j = order.size(); j-- > i + 1 && tries < 64;) {
      const int64_t b = order[j];
      if (placed[b]) continue;
      ++tries;
      if (safe(a, b)) {
        partner = b;
        break;
      }
    }
    if (partner >= 0) placed[partner] = 1;
    pairs.push_back({a, partner});
  }
  std::sort(pairs.begin(), pairs.end());
  for (const auto& [a, b] : pairs) {
    slot_channel.push_back(static_cast<int32_t>(a));
    slot_channel.push_back(static_cast<int32_t>(b));
  }
  while (slot_channel.size() % 16 != 0) slot_channel.push_back(-1);  // whole groups of 16 (int8_pairing.h)
  return slot_channel;
}

}  // namespace osprey::cpu
