// Reference kernels of the reduction family: Reduce*, ArgMax/ArgMin, TopK. Float reductions accumulate in double;
// integer sums and products wrap like the fixed-width type does.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/reference/dispatch.h"
#include "kernels/reference/reference.h"
#include "ops/op_registry.h"
#include "ops/reduce_axes.h"

namespace osprey {
namespace {

// Float32, int32 and int64: the dtypes of the arithmetic reductions.

template <class T>
constexpr bool kIsFloat = std::is_floating_point_v<T>;

template <class T>
T SaturateToInt(double v) {
  if (std::isnan(v)) return 0;
  constexpr double lo = static_cast<double>(std::numeric_limits<T>::lowest());
  constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
  if (v <= lo) return std::numeric_limits<T>::lowest();
  if (v >= hi) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

// ---------------------------------------------------------------------------------------------------------------
// Reduce*: which axes, and a walk over the input that names each element's output slot.

std::vector<bool> ReducedAxes(const KernelContext& ctx) {
  return ReduceAxesMask(ctx.node, ctx.opset, ctx.In(0).rank(), ctx.HasIn(1) ? &ctx.In(1) : nullptr);
}

// The input (row-major, contiguous) with size-1 dims dropped and neighbouring dims of the same kind (reduced or
// kept) merged. out_strides are 0 along reduced dims, so an input position maps to its output slot by a dot product.
class ReduceWalk {
 public:
  ReduceWalk(const Shape& in, const std::vector<bool>& mask) {
    for (size_t i = 0; i < in.size(); ++i) {
      (mask[i] ? reduced_count_ : kept_count_) *= in[i];
      if (in[i] == 1) continue;
      if (!dims_.empty() && reduced_.back() == mask[i]) {
        dims_.back() *= in[i];
      } else {
        dims_.push_back(in[i]);
        reduced_.push_back(mask[i]);
      }
    }
    out_strides_.assign(dims_.size(), 0);
    int64_t stride = 1;
    for (size_t i = dims_.size(); i-- > 0;) {
      if (reduced_[i]) continue;
      out_strides_[i] = stride;
      stride *= dims_[i];
    }
    total_ = 1;
    for (int64_t d : dims_) total_ *= d;
  }

  // Number of input elements folded into each output element.
  int64_t reduced_count() const { return reduced_count_; }
  // Number of output elements.
  int64_t kept_count() const { return kept_count_; }

  // Calls visit(out_index, value) for every input element, in input order.
  template <class T, class Visit>
  void ForEach(const T* x, Visit&& visit) const {
    if (total_ == 0) return;
    const int nd = static_cast<int>(dims_.size());
    if (nd == 0) {
      visit(int64_t{0}, x[0]);
      return;
    }
    const int64_t inner = dims_[nd - 1];
    const bool inner_reduced = reduced_[nd - 1];
    std::vector<int64_t> counter(nd, 0);
    int64_t out_base = 0;
    for (int64_t in_offset = 0; in_offset < total_; in_offset += inner) {
      const T* row = x + in_offset;
      if (inner_reduced) {
        for (int64_t i = 0; i < inner; ++i) visit(out_base, row[i]);
      } else {
        for (int64_t i = 0; i < inner; ++i) visit(out_base + i, row[i]);
      }
      for (int d = nd - 2; d >= 0; --d) {
        if (++counter[d] < dims_[d]) {
          out_base += out_strides_[d];
          break;
        }
        counter[d] = 0;
        out_base -= out_strides_[d] * (dims_[d] - 1);
      }
    }
  }

 private:
  std::vector<int64_t> dims_;
  std::vector<bool> reduced_;
  std::vector<int64_t> out_strides_;
  int64_t total_ = 1;
  int64_t reduced_count_ = 1;
  int64_t kept_count_ = 1;
};

// acc[o] = init; step(acc[o], x) for each x folded into o; out[o] = finish(acc[o], count).
template <class T, class Acc, class Step, class Finish>
void Reduce(KernelContext& ctx, Acc init, Step step, Finish finish) {
  const Tensor& in = ctx.In(0);
  Tensor& out = ctx.Out(0);
  ReduceWalk walk(in.shape(), ReducedAxes(ctx));
  const int64_t count = walk.reduced_count();
  OSPREY_CHECK(out.numel() == walk.kept_count());
  std::vector<Acc> acc(out.numel(), init);
  walk.ForEach(in.data<T>(), [&](int64_t o, T v) { step(acc[o], v); });
  T* y = out.data<T>();
  for (int64_t o = 0; o < out.numel(); ++o) y[o] = finish(acc[o], count);
}

// Float sums accumulate in double; integer sums in uint64 so that overflow wraps instead of being undefined.
template <class T>
using SumAcc = std::conditional_t<kIsFloat<T>, double, uint64_t>;

template <class T>
T FromSum(SumAcc<T> acc) {
  return static_cast<T>(acc);  // integers: modular, as the fixed-width sum would be
}

template <class T>
SumAcc<T> Widen(T v) {
  if constexpr (kIsFloat<T>)
    return static_cast<double>(v);
  else
    return static_cast<uint64_t>(static_cast<int64_t>(v));
}

void ReduceSumKernel(KernelContext& ctx) {
  DispatchArithmetic(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    Reduce<T>(
        ctx, SumAcc<T>{0}, [](SumAcc<T>& a, T v) { a += Widen(v); },
        [](SumAcc<T> a, int64_t) { return FromSum<T>(a); });
  });
}

void ReduceMeanKernel(KernelContext& ctx) {
  DispatchArithmetic(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    Reduce<T>(
        ctx, SumAcc<T>{0}, [](SumAcc<T>& a, T v) { a += Widen(v); },
        [](SumAcc<T> a, int64_t count) -> T {
          if constexpr (kIsFloat<T>) {
            return static_cast<T>(a / static_cast<double>(count));  // empty: 0/0 = NaN
          } else {
            return count == 0 ? T{0} : static_cast<T>(static_cast<int64_t>(a) / count);
          }
        });
  });
}

void ReduceProdKernel(KernelContext& ctx) {
  DispatchArithmetic(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    Reduce<T>(
        ctx, SumAcc<T>{1}, [](SumAcc<T>& a, T v) { a *= Widen(v); },
        [](SumAcc<T> a, int64_t) { return FromSum<T>(a); });
  });
}

template <bool kMax>
void ReduceExtremeKernel(KernelContext& ctx) {
  if (ctx.In(0).dtype() == DType::kBool) {  // opset 20: any (max) / all (min); the empty set gives false / true
    Reduce<bool>(
        ctx, static_cast<uint8_t>(!kMax), [](uint8_t& a, bool v) { a = kMax ? (a || v) : (a && v); },
        [](uint8_t a, int64_t) { return a != 0; });
    return;
  }
  DispatchNumeric(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    // The empty set reduces to the identity: -inf / +inf for floats, the type's limits for integers.
    T init;
    if constexpr (kIsFloat<T>)
      init = kMax ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
    else
      init = kMax ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
    Reduce<T>(
        ctx, init,
        [](T& a, T v) {
          if constexpr (kIsFloat<T>) {
            if (std::isnan(a)) return;  // NaN propagates
            if (std::isnan(v)) {
              a = v;
              return;
            }
          }
          if (kMax ? a < v : v < a) a = v;
        },
        [](T a, int64_t) { return a; });
  });
}

void ReduceL1Kernel(KernelContext& ctx) {
  DispatchArithmetic(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    Reduce<T>(
        ctx, SumAcc<T>{0},
        [](SumAcc<T>& a, T v) {
          SumAcc<T> w = Widen(v);
          if constexpr (kIsFloat<T>)
            a += std::fabs(w);
          else
            a += v < 0 ? 0 - w : w;
        },
        [](SumAcc<T> a, int64_t) { return FromSum<T>(a); });
  });
}

void ReduceSumSquareKernel(KernelContext& ctx) {
  DispatchArithmetic(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    Reduce<T>(
        ctx, SumAcc<T>{0}, [](SumAcc<T>& a, T v) { a += Widen(v) * Widen(v); },
        [](SumAcc<T> a, int64_t) { return FromSum<T>(a); });
  });
}

void ReduceL2Kernel(KernelContext& ctx) {
  DispatchArithmetic(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    Reduce<T>(
        ctx, 0.0, [](double& a, T v) { a += static_cast<double>(v) * static_cast<double>(v); },
        [](double a, int64_t) -> T {
          if constexpr (kIsFloat<T>)
            return static_cast<T>(std::sqrt(a));
          else
            return SaturateToInt<T>(std::sqrt(a));
        });
  });
}

void ReduceLogSumKernel(KernelContext& ctx) {
  if (ctx.In(0).dtype() != DType::kF32) UnsupportedDType(ctx.node, ctx.In(0).dtype());
  Reduce<float>(
      ctx, 0.0, [](double& a, float v) { a += v; }, [](double a, int64_t) { return static_cast<float>(std::log(a)); });
}

void ReduceLogSumExpKernel(KernelContext& ctx) {
  if (ctx.In(0).dtype() != DType::kF32) UnsupportedDType(ctx.node, ctx.In(0).dtype());
  const Tensor& in = ctx.In(0);
  Tensor& out = ctx.Out(0);
  ReduceWalk walk(in.shape(), ReducedAxes(ctx));
  OSPREY_CHECK(out.numel() == walk.kept_count());
  // Subtracting each slot's maximum keeps exp() finite; a non-finite maximum (empty, all -inf, +inf, NaN) is summed
  // unshifted, which yields -inf, +inf or NaN as it should.
  std::vector<double> max(out.numel(), -std::numeric_limits<double>::infinity());
  walk.ForEach(in.data<float>(), [&](int64_t o, float v) { max[o] = std::max<double>(max[o], v); });
  for (double& m : max)
    if (!std::isfinite(m)) m = 0;
  std::vector<double> sum(out.numel(), 0.0);
  walk.ForEach(in.data<float>(), [&](int64_t o, float v) { sum[o] += std::exp(static_cast<double>(v) - max[o]); });
  float* y = out.data<float>();
  for (int64_t o = 0; o < out.numel(); ++o) y[o] = static_cast<float>(max[o] + std::log(sum[o]));
}

// ---------------------------------------------------------------------------------------------------------------
// ArgMax / ArgMin / TopK work on [outer, axis, inner] views.

struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
};

AxisView ViewAround(const Shape& shape, int64_t axis) {
  AxisView v;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    if (i < axis)
      v.outer *= shape[i];
    else if (i == axis)
      v.n = shape[i];
    else
      v.inner *= shape[i];
  }
  return v;
}

// Strict "a ranks before b": for largest, b < a; otherwise a < b. NaN ranks before every number either way, so
// ArgMax and ArgMin both pick the first NaN, as numpy does. Equal values do not rank before each other.
template <class T>
bool RanksBefore(T a, T b, bool largest) {
  if constexpr (kIsFloat<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && !std::isnan(b);
  }
  return largest ? b < a : a < b;
}

template <bool kMax>
void ArgReduceKernel(KernelContext& ctx) {
  DispatchNumeric(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    const Tensor& in = ctx.In(0);
    const int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", 0), in.rank(), ctx.node);
    const bool last = ctx.node.GetInt("select_last_index", 0) != 0;
    const AxisView v = ViewAround(in.shape(), axis);
    if (v.n == 0)
      throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": cannot take the arg of an empty axis");
    OSPREY_CHECK(ctx.Out(0).numel() == v.outer * v.inner);
    const T* x = in.data<T>();
    int64_t* y = ctx.Out(0).data<int64_t>();
    for (int64_t o = 0; o < v.outer; ++o) {
      for (int64_t i = 0; i < v.inner; ++i) {
        const T* p = x + o * v.n * v.inner + i;
        int64_t best = 0;
        for (int64_t j = 1; j < v.n; ++j) {
          const T c = p[j * v.inner], b = p[best * v.inner];
          // A later index wins ties only with select_last_index.
          if (RanksBefore(c, b, kMax) || (last && !RanksBefore(b, c, kMax))) best = j;
        }
        y[o * v.inner + i] = best;
      }
    }
  });
}

void TopKKernel(KernelContext& ctx) {
  DispatchNumeric(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    const Tensor& in = ctx.In(0);
    const int64_t axis = NormalizeAxis(ctx.node.GetInt("axis", -1), in.rank(), ctx.node);
    const bool largest = ctx.node.GetInt("largest", 1) != 0;
    const AxisView v = ViewAround(in.shape(), axis);
    // K was validated and baked into the output shapes at compile time.
    const int64_t k = ctx.Out(0).dim(axis);
    OSPREY_CHECK(k >= 0 && k <= v.n && ctx.Out(1).dim(axis) == k && ctx.Out(1).dtype() == DType::kI64);
    const T* x = in.data<T>();
    T* values = ctx.Out(0).data<T>();
    int64_t* indices = ctx.Out(1).data<int64_t>();
    std::vector<int64_t> order(v.n);
    for (int64_t o = 0; o < v.outer; ++o) {
      for (int64_t i = 0; i < v.inner; ++i) {
        const T* p = x + o * v.n * v.inner + i;
        std::iota(order.begin(), order.end(), 0);
        // Ties keep the lower index first, so the order is total and the result deterministic.
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
          const T va = p[a * v.inner], vb = p[b * v.inner];
          // NaN counts as the largest value: first for largest=1, last for largest=0.
          const bool a_first = largest ? RanksBefore(va, vb, true) : RanksBefore(vb, va, true);
          const bool b_first = largest ? RanksBefore(vb, va, true) : RanksBefore(va, vb, true);
          if (a_first != b_first) return a_first;
          return a < b;
        });
        for (int64_t j = 0; j < k; ++j) {
          const int64_t dst = (o * k + j) * v.inner + i;
          values[dst] = p[order[j] * v.inner];
          indices[dst] = order[j];
        }
      }
    }
  });
}

// CumSum (CumProd, opset 26) along `axis` (input 1, negative from the end): exclusive starts each sum at 0 (product
// at 1) without the element itself, reverse runs from the end. Accumulates in double (float32) or int64 per position.
template <bool kProduct>
void CumulativeKernel(KernelContext& ctx) {
  const Tensor& x = ctx.In(0);
  Tensor& y = ctx.Out(0);
  if (y.shape() != x.shape()) throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": output shape mismatch");
  const int64_t rank = x.rank();
  const int64_t raw_axis = ctx.In(1).GetAsInt(0);
  if (raw_axis < -rank || raw_axis >= rank)
    throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": axis " + std::to_string(raw_axis) +
                                                 " is out of range for rank " + std::to_string(rank));
  const int64_t axis = raw_axis < 0 ? raw_axis + rank : raw_axis;
  const bool exclusive = ctx.node.GetInt("exclusive", 0) != 0, reverse = ctx.node.GetInt("reverse", 0) != 0;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.dim(d);
  for (int64_t d = axis + 1; d < rank; ++d) inner *= x.dim(d);
  const int64_t n = x.dim(axis);
  auto run = [&](auto zero) {
    using T = decltype(zero);
    using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
    const T* in = x.data<T>();
    T* out = y.data<T>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        Acc acc = kProduct ? 1 : 0;
        auto step_in = [&acc](T v) {
          if constexpr (kProduct && std::is_integral_v<Acc>)  // wraps as the element type would, without UB
            acc = static_cast<Acc>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(static_cast<Acc>(v)));
          else if constexpr (kProduct)
            acc *= v;
          else
            acc += v;
        };
        for (int64_t step = 0; step < n; ++step) {
          const int64_t k = reverse ? n - 1 - step : step;
          const int64_t at = (o * n + k) * inner + i;
          if (exclusive) {
            out[at] = static_cast<T>(acc);
            step_in(in[at]);
          } else {
            step_in(in[at]);
            out[at] = static_cast<T>(acc);
          }
        }
      }
  };
  DispatchArithmetic(ctx.node, x.dtype(), run);
}

}  // namespace

void AddReductionReferenceKernels(ReferenceKernelTable& t) {
  t.Add("ReduceSum", ReduceSumKernel);
  t.Add("CumSum", CumulativeKernel<false>);
  t.Add("CumProd", CumulativeKernel<true>);
  t.Add("ReduceMean", ReduceMeanKernel);
  t.Add("ReduceProd", ReduceProdKernel);
  t.Add("ReduceMax", ReduceExtremeKernel<true>);
  t.Add("ReduceMin", ReduceExtremeKernel<false>);
  t.Add("ReduceL1", ReduceL1Kernel);
  t.Add("ReduceL2", ReduceL2Kernel);
  t.Add("ReduceSumSquare", ReduceSumSquareKernel);
  t.Add("ReduceLogSum", ReduceLogSumKernel);
  t.Add("ReduceLogSumExp", ReduceLogSumExpKernel);
  t.Add("ArgMax", ArgReduceKernel<true>);
  t.Add("ArgMin", ArgReduceKernel<false>);
  t.Add("TopK", TopKKernel);
}

}  // namespace osprey
