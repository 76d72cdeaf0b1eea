#include "ops/slice.h"

#include <algorithm>
#include <climits>
#include <string>

namespace osprey {

namespace {
std::string IntsText(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}
}  // namespace

bool ReadSliceArgs(const Node& node, int opset, const std::function<const Tensor*(int)>& input, SliceArgs* args) {
  *args = {};
  if (opset < 10) {
    if (!node.Has("starts") || !node.Has("ends")) return false;
    args->starts = node.GetInts("starts");
    args->ends = node.GetInts("ends");
    args->axes = node.GetInts("axes");
    return true;
  }
  const Tensor* starts = input(1);
  const Tensor* ends = input(2);
  if (!starts || !ends) return false;
  args->starts = starts->ToInt64Vector();
  args->ends = ends->ToInt64Vector();
  if (const Tensor* axes = input(3)) args->axes = axes->ToInt64Vector();
  if (const Tensor* steps = input(4)) args->steps = steps->ToInt64Vector();
  return true;
}

SliceRange ResolveSlice(const Shape& in, const SliceArgs& args, const Node& node) {
  const int64_t rank = static_cast<int64_t>(in.size());
  const size_t n = args.starts.size();
  auto fail = [&](const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": " + what);
  };
  if (args.ends.size() != n)
    fail("starts " + IntsText(args.starts) + " and ends " + IntsText(args.ends) + " differ in length");
  std::vector<int64_t> axes = args.axes;
  if (axes.empty()) {
    if (static_cast<int64_t>(n) > rank)
      fail(std::to_string(n) + " starts given for an input of rank " + std::to_string(rank) + " " +
           ShapeToString(in));
    for (size_t i = 0; i < n; ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (axes.size() != n) fail("axes " + IntsText(axes) + " and starts " + IntsText(args.starts) + " differ in length");
  std::vector<int64_t> steps = args.steps.empty() ? std::vector<int64_t>(n, 1) : args.steps;
  if (steps.size() != n)
    fail("steps " + IntsText(steps) + " and starts " + IntsText(args.starts) + " differ in length");
  SliceRange r;
  r.first.assign(rank, 0);
  r.step.assign(rank, 1);
  r.out = in;
  std::vector<char> seen(rank, 0);
  for (size_t i = 0; i < n; ++i) {
    int64_t a = axes[i];
    if (a < -rank || a >= rank)
      fail("axis " + std::to_string(a) + " is out of range for an input of rank " + std::to_string(rank));
    if (a < 0) a += rank;
    if (seen[a]) fail("axes " + IntsText(axes) + " repeat an axis");
    seen[a] = 1;
    const int64_t dim = in[a], st = steps[i];
    int64_t s = args.starts[i], e = args.ends[i];
    if (st == 0) fail("steps " + IntsText(steps) + " contain 0");
    r.step[a] = st;
    if (dim == 0) {
      r.out[a] = 0;
      continue;
    }
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    int64_t diff;
    int64_t abs_step;
    if (st > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      diff = e - s;
      abs_step = st;
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      diff = s - e;
      abs_step = st == INT64_MIN ? INT64_MAX : -st;
    }
    r.out[a] = diff <= 0 ? 0 : 1 + (diff - 1) / abs_step;
    r.first[a] = s;
  }
  return r;
}

}  // namespace osprey
