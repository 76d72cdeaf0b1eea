#include "ops/pad.h"

#include <algorithm>
#include <string>

namespace osprey {

bool ReadPadAmounts(const Node& node, int opset, int64_t rank, const std::function<const Tensor*(int)>& input,
                    PadAmounts* out) {
  auto fail = [&](const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + what);
  };
  std::vector<int64_t> pads, axes;
  if (opset < 11) {
    if (!node.Has("pads")) return false;
    pads = node.GetInts("pads");
  } else {
    const Tensor* p = input(1);
    if (!p) return false;
    pads = p->ToInt64Vector();
    if (node.inputs.size() > 3 && node.inputs[3] >= 0) {
      const Tensor* a = input(3);
      if (!a) return false;
      axes = a->ToInt64Vector();
    } else {
      for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
    }
  }
  if (opset < 11)
    for (int64_t d = 0; d < rank; ++d) axes.push_back(d);
  const size_t n = axes.size();
  if (pads.size() != 2 * n)
    fail("pads has " + std::to_string(pads.size()) + " entries, expected 2 x " + std::to_string(n) + " axes");
  out->begin.assign(rank, 0), out->end.assign(rank, 0);
  std::vector<char> seen(rank, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t a = axes[i] < 0 ? axes[i] + rank : axes[i];
    if (a < 0 || a >= rank) fail("axis " + std::to_string(axes[i]) + " is out of range for rank " + std::to_string(rank));
    if (seen[a]++) fail("axis " + std::to_string(axes[i]) + " is repeated");
    out->begin[a] = pads[i], out->end[a] = pads[i + n];
  }
  return true;
}

int64_t PadSourceIndex(const std::string& mode, int64_t i, int64_t n) {
  if (i >= 0 && i < n) return i;
  if (mode == "edge") return std::clamp<int64_t>(i, 0, n - 1);
  if (mode == "wrap") return ((i % n) + n) % n;
  const int64_t period = 2 * (n - 1);  // reflect
  if (period == 0) return 0;
  const int64_t s = ((i % period) + period) % period;
  return s >= n ? period - s : s;
}

std::vector<int64_t> PadSourceTable(const std::string& mode, int64_t n, int64_t begin, int64_t end) {
  const int64_t crop_begin = std::max<int64_t>(0, -begin), pad_begin = std::max<int64_t>(0, begin);
  const int64_t kept = n - crop_begin - std::max<int64_t>(0, -end), size = n + begin + end;
  if (kept < 0 || size <= 0 || (kept == 0 && mode != "constant")) return {};
  std::vector<int64_t> source(size);
  for (int64_t o = 0; o < size; ++o) {
    const int64_t i = o - pad_begin;
    const int64_t s = i >= 0 && i < kept ? i : mode == "constant" ? -1 : PadSourceIndex(mode, i, kept);
    source[o] = s < 0 ? -1 : s + crop_begin;
  }
  return source;
}

}  // namespace osprey
