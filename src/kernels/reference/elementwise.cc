// Reference kernels of the elementwise family. Broadcasting goes through BroadcastPlan (any rank); float32 inputs of
// one shape, or with a scalar operand, take plain loops.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/reference/dispatch.h"
#include "kernels/reference/reference.h"
#include "ops/activation.h"

namespace osprey {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMinElements = 1 << 16;

// ---------------------------------------------------------------------------------------------------------------
// Broadcasting: output index -> input element offsets.

// Numpy broadcasting of several inputs to one output shape. Output dims of size 1 are dropped, and adjacent dims are
// merged wherever every input walks them as one (both broadcast, or both contiguous), so `[2,3,4] + [4]` becomes one
// outer dim of 6 rows over an inner dim of 4. Per input, a dim's stride is 0 where the input is broadcast along it.
class BroadcastPlan {
 public:
  BroadcastPlan(const Node& node, const Shape& out, const std::vector<const Shape*>& inputs)
      : num_inputs_(static_cast<int>(inputs.size())) {
    const size_t rank = out.size();
    std::vector<std::vector<int64_t>> full(num_inputs_, std::vector<int64_t>(rank, 0));
    for (int k = 0; k < num_inputs_; ++k) {
      const Shape& in = *inputs[k];
      if (in.size() > rank) Mismatch(node, in, out);
      int64_t stride = 1;
      for (size_t j = rank; j-- > 0;) {
        size_t lead = rank - in.size();
        int64_t d = j < lead ? 1 : in[j - lead];
        if (d != out[j] && d != 1) Mismatch(node, in, out);
        full[k][j] = d == 1 ? 0 : stride;
        stride *= d;
      }
    }
    total_ = 1;
    for (int64_t d : out) total_ *= d;
    strides_.assign(num_inputs_, {});
    for (size_t j = 0; j < rank; ++j) {
      if (out[j] == 1) continue;
      bool merge = !dims_.empty();
      for (int k = 0; k < num_inputs_ && merge; ++k) merge = strides_[k].back() == full[k][j] * out[j];
      if (merge) {
        dims_.back() *= out[j];
        for (int k = 0; k < num_inputs_; ++k) strides_[k].back() = full[k][j];
      } else {
        dims_.push_back(out[j]);
        for (int k = 0; k < num_inputs_; ++k) strides_[k].push_back(full[k][j]);
      }
    }
  }

  // Calls row(out_offset, in_offsets, length, in_strides) once per innermost run of `length` output elements; input
  // k's element i of the run is at in_offsets[k] + i * in_strides[k]. Rank 0 is one run of length 1.
  template <class Row>
  void ForEachRow(Row&& row) const {
    ForEachRowIn(0, NumRows(), row);
  }

  // Number of innermost runs ForEachRow visits.
  int64_t NumRows() const {
    if (total_ == 0) return 0;
    return dims_.empty() ? 1 : total_ / dims_.back();
  }

  // ForEachRow restricted to runs [first, last), so disjoint ranges can run on different threads.
  template <class Row>
  void ForEachRowIn(int64_t first, int64_t last, Row&& row) const {
    if (first >= last) return;
    std::vector<int64_t> offsets(num_inputs_, 0), inner_strides(num_inputs_, 0);
    const int nd = static_cast<int>(dims_.size());
    if (nd == 0) {
      row(int64_t{0}, offsets.data(), int64_t{1}, inner_strides.data());
      return;
    }
    for (int k = 0; k < num_inputs_; ++k) inner_strides[k] = strides_[k][nd - 1];
    const int64_t inner = dims_[nd - 1];
    // Mixed-radix position of run `first` over the outer dims.
    std::vector<int64_t> counter(nd, 0);
    for (int64_t d = nd - 2, rem = first; d >= 0; --d) {
      counter[d] = rem % dims_[d];
      rem /= dims_[d];
      for (int k = 0; k < num_inputs_; ++k) offsets[k] += counter[d] * strides_[k][d];
    }
    for (int64_t out_offset = first * inner; out_offset < last * inner; out_offset += inner) {
      row(out_offset, offsets.data(), inner, inner_strides.data());
      for (int d = nd - 2; d >= 0; --d) {
        if (++counter[d] < dims_[d]) {
          for (int k = 0; k < num_inputs_; ++k) offsets[k] += strides_[k][d];
          break;
        }
        counter[d] = 0;
        for (int k = 0; k < num_inputs_; ++k) offsets[k] -= strides_[k][d] * (dims_[d] - 1);
      }
    }
  }

 private:
  [[noreturn]] static void Mismatch(const Node& node, const Shape& in, const Shape& out) {
    throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": input of shape " + ShapeToString(in) +
                                                 " does not broadcast to output shape " + ShapeToString(out));
  }

  int num_inputs_;
  int64_t total_ = 0;
  std::vector<int64_t> dims_;
  std::vector<std::vector<int64_t>> strides_;  // [input][merged dim]
};

// out[i] = f(a[.], b[.]) over the broadcast of a and b. Safe when out aliases an input of the output's shape.
template <class A, class B, class R, class F>
void BinaryMap(const Node& node, const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const A* pa = a.data<A>();
  const B* pb = b.data<B>();
  R* po = out.data<R>();
  const int64_t n = out.numel();
  if constexpr (std::is_same_v<A, float> && std::is_same_v<B, float> && std::is_same_v<R, float>) {
    if (a.shape() == out.shape() && b.shape() == out.shape()) {
#pragma omp parallel for if (n >= kParallelMinElements) schedule(static)
      for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], pb[i]);
      return;
    }
  }
  // Float results never throw (integer division by zero does), and an exception must not leave a parallel region
  // (even one with a false `if` clause), so only float loops are ever written inside one.
  constexpr bool kParallelSafe = std::is_same_v<A, float> && std::is_same_v<R, float>;
  const bool parallel = kParallelSafe && n >= kParallelMinElements;
  if (a.shape() == out.shape() && b.numel() == 1) {
    const B s = pb[0];
    if constexpr (kParallelSafe) {
#pragma omp parallel for if (parallel) schedule(static)
      for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], s);
    } else {
      for (int64_t i = 0; i < n; ++i) po[i] = f(pa[i], s);
    }
    return;
  }
  if (b.shape() == out.shape() && a.numel() == 1) {
    const A s = pa[0];
    if constexpr (kParallelSafe) {
#pragma omp parallel for if (parallel) schedule(static)
      for (int64_t i = 0; i < n; ++i) po[i] = f(s, pb[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) po[i] = f(s, pb[i]);
    }
    return;
  }
  BroadcastPlan plan(node, out.shape(), {&a.shape(), &b.shape()});
  auto row = [&](int64_t o, const int64_t* off, int64_t len, const int64_t* st) {
    const A* ra = pa + off[0];
    const B* rb = pb + off[1];
    R* ro = po + o;
    if (st[0] == 1 && st[1] == 1) {
      for (int64_t i = 0; i < len; ++i) ro[i] = f(ra[i], rb[i]);
    } else if (st[0] == 1 && st[1] == 0) {
      const B s = rb[0];
      for (int64_t i = 0; i < len; ++i) ro[i] = f(ra[i], s);
    } else if (st[0] == 0 && st[1] == 1) {
      const A s = ra[0];
      for (int64_t i = 0; i < len; ++i) ro[i] = f(s, rb[i]);
    } else {
      for (int64_t i = 0; i < len; ++i) ro[i] = f(ra[i * st[0]], rb[i * st[1]]);
    }
  };
  const int64_t rows = plan.NumRows();
  if constexpr (kParallelSafe) {
    if (parallel && rows > 1) {
      // Contiguous blocks of rows per thread: rows write disjoint output ranges.
#pragma omp parallel
      {
        const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
        plan.ForEachRowIn(rows * t / threads, rows * (t + 1) / threads, row);
      }
      return;
    }
  }
  plan.ForEachRow(row);
}

// ---------------------------------------------------------------------------------------------------------------
// Dtype dispatch: calls f(T{}) for the tensor's element type.

template <class F>
void DispatchAll(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32:
      f(float{});
      return;
    case DType::kF16:
      f(Float16{});
      return;
    case DType::kBF16:
      f(BFloat16{});
      return;
    case DType::kI8:
      f(int8_t{});
      return;
    case DType::kU8:
      f(uint8_t{});
      return;
    case DType::kI32:
      f(int32_t{});
      return;
    case DType::kI64:
      f(int64_t{});
      return;
    case DType::kBool:
      f(bool{});
      return;
  }
}

void CheckF32(const KernelContext& ctx, int input) {
  if (ctx.In(input).dtype() != DType::kF32) UnsupportedDType(ctx.node, ctx.In(input).dtype());
}

// ---------------------------------------------------------------------------------------------------------------
// Integer arithmetic without undefined behaviour: signed overflow wraps (two's complement), division by zero is an
// error, and INT_MIN / -1 wraps instead of trapping.

template <class T>
T WrapAdd(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <class T>
T WrapSub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) - static_cast<U>(b)));
}
template <class T>
T WrapMul(T a, T b) {
  // uint8/int8 promote to int, where the product cannot overflow; wider types multiply as unsigned.
  if constexpr (sizeof(T) < sizeof(int)) {
    return static_cast<T>(static_cast<int>(a) * static_cast<int>(b));
  } else {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  }
}
template <class T>
T WrapNeg(T a) {
  return WrapSub(T{0}, a);
}

[[noreturn]] void DivisionByZero(const Node& node) {
  throw Error(ErrorCode::kInvalidArgument, node.Describe() + ": integer division by zero");
}

template <class T>
T IntDiv(const Node& node, T a, T b) {
  if (b == 0) DivisionByZero(node);
  if constexpr (std::is_signed_v<T>) {
    if (b == -1) return WrapNeg(a);
  }
  return static_cast<T>(a / b);  // C truncates toward zero
}

// fmod = 0: the result takes the divisor's sign (Python's %); fmod = 1: the dividend's (C's %).
template <class T>
T IntMod(const Node& node, T a, T b, bool fmod) {
  if (b == 0) DivisionByZero(node);
  if constexpr (std::is_signed_v<T>) {
    if (b == -1) return 0;
    T r = static_cast<T>(a % b);
    if (!fmod && r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);
    return r;
  } else {
    return static_cast<T>(a % b);
  }
}

// Float -> integer with NaN -> 0 and out-of-range values clamped, instead of undefined behaviour.
template <class T>
T SaturateToInt(double v) {
  if (std::isnan(v)) return 0;
  constexpr double lo = static_cast<double>(std::numeric_limits<T>::lowest());
  constexpr double hi = static_cast<double>(std::numeric_limits<T>::max());
  if (v <= lo) return std::numeric_limits<T>::lowest();
  if (v >= hi) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

template <class T>
T IntPow(const Node& node, T base, double exponent) {
  if (exponent >= 0 && exponent == std::floor(exponent) && exponent < 64) {
    int64_t e = static_cast<int64_t>(exponent);
    T result = 1, b = base;
    while (e > 0) {  // square-and-multiply keeps int64 exact where double would round
      if (e & 1) result = WrapMul(result, b);
      b = WrapMul(b, b);
      e >>= 1;
    }
    return result;
  }
  if (base == 0 && exponent < 0) DivisionByZero(node);
  return SaturateToInt<T>(std::pow(static_cast<double>(base), exponent));
}

// ---------------------------------------------------------------------------------------------------------------
// Binary kernels.

template <class T>
constexpr bool kIsFloat = std::is_floating_point_v<T>;

template <class Op>
void NumericBinary(KernelContext& ctx, Op op) {
  DispatchNumeric(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    BinaryMap<T, T, T>(ctx.node, ctx.In(0), ctx.In(1), ctx.Out(0), [&](T a, T b) -> T { return op(a, b); });
  });
}

void AddKernel(KernelContext& ctx) {
  NumericBinary(ctx, [](auto a, auto b) -> decltype(a) {
    if constexpr (kIsFloat<decltype(a)>)
      return a + b;
    else
      return WrapAdd(a, b);
  });
}
void SubKernel(KernelContext& ctx) {
  NumericBinary(ctx, [](auto a, auto b) -> decltype(a) {
    if constexpr (kIsFloat<decltype(a)>)
      return a - b;
    else
      return WrapSub(a, b);
  });
}
void MulKernel(KernelContext& ctx) {
  NumericBinary(ctx, [](auto a, auto b) -> decltype(a) {
    if constexpr (kIsFloat<decltype(a)>)
      return a * b;
    else
      return WrapMul(a, b);
  });
}
void DivKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  NumericBinary(ctx, [&node](auto a, auto b) -> decltype(a) {
    if constexpr (kIsFloat<decltype(a)>)
      return a / b;
    else
      return IntDiv(node, a, b);
  });
}
void ModKernel(KernelContext& ctx) {
  const Node& node = ctx.node;
  const bool fmod = node.GetInt("fmod", 0) != 0;
  NumericBinary(ctx, [&node, fmod](auto a, auto b) -> decltype(a) {
    if constexpr (kIsFloat<decltype(a)>) {
      auto r = std::fmod(a, b);  // NaN for an infinite a, a zero or NaN b; a for an infinite b
      if (fmod) return r;
      // fmod = 0 (opset 28): a - floor(a / b) * b, the sign of b; a zero takes b's sign.
      if (r == 0) return std::copysign(decltype(a){0}, b);
      return (r < 0) != (b < 0) ? r + b : r;
    } else
      return IntMod(node, a, b, fmod);
  });
}

template <class F>
void MapF32(KernelContext& ctx, F f);

// Float32 x ** e for a scalar e that has an exact cheaper form (LayerNorm exports square with
// Pow(d, 2)). Returns false when the general path must run.
bool PowScalarF32(KernelContext& ctx) {
  const Tensor& base = ctx.In(0);
  const Tensor& exponent = ctx.In(1);
  if (base.dtype() != DType::kF32 || exponent.numel() != 1 || base.shape() != ctx.Out(0).shape()) return false;
  double e = 0;
  if (exponent.dtype() == DType::kF32)
    e = exponent.data<float>()[0];
  else if (exponent.dtype() == DType::kI64 || exponent.dtype() == DType::kI32)
    e = static_cast<double>(exponent.GetAsInt(0));
  else
    return false;
  if (e == 2) {
    MapF32(ctx, [](float x) { return x * x; });
  } else if (e == 1) {
    MapF32(ctx, [](float x) { return x; });
  } else if (e == 0.5) {
    // pow(x, 0.5) differs from sqrt only at -0 (+0, not -0) and -inf (+inf, not NaN).
    MapF32(ctx, [](float x) { return x == -INFINITY ? INFINITY : std::sqrt(x) + 0.f; });
  } else {
    return false;
  }
  return true;
}

void PowKernel(KernelContext& ctx) {
  if (PowScalarF32(ctx)) return;
  const Node& node = ctx.node;
  DispatchNumeric(node, ctx.In(0).dtype(), [&](auto base_tag) {
    using T = decltype(base_tag);
    DispatchNumeric(node, ctx.In(1).dtype(), [&](auto exp_tag) {
      using E = decltype(exp_tag);
      BinaryMap<T, E, T>(node, ctx.In(0), ctx.In(1), ctx.Out(0), [&node](T a, E b) -> T {
        if constexpr (kIsFloat<T>) {
          return std::pow(a, static_cast<float>(b));
        } else {
          return IntPow(node, a, static_cast<double>(b));
        }
      });
    });
  });
}

void PReluKernel(KernelContext& ctx) {
  DispatchSigned(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    BinaryMap<T, T, T>(ctx.node, ctx.In(0), ctx.In(1), ctx.Out(0), [](T x, T slope) -> T {
      if (!(x < 0)) return x;
      if constexpr (kIsFloat<T>)
        return x * slope;
      else
        return WrapMul(x, slope);
    });
  });
}

// Opset 28: a signed right shift is arithmetic; a shift by a negative amount or by the width or more gives what the
// sign extension alone gives (-1 for a right shift of a negative value, else 0); a left shift drops the bits shifted
// past the sign bit (done on the unsigned bits).
template <class T>
void BitShiftOf(KernelContext& ctx, bool left) {
  using U = std::make_unsigned_t<T>;
  constexpr int kBits = 8 * sizeof(T);
  BinaryMap<T, T, T>(ctx.node, ctx.In(0), ctx.In(1), ctx.Out(0), [left](T a, T b) {
    bool out_of_range = static_cast<int64_t>(b) >= kBits;
    if constexpr (std::is_signed_v<T>) out_of_range = out_of_range || b < 0;
    if (left) return out_of_range ? T{0} : static_cast<T>(static_cast<U>(static_cast<U>(a) << b));
    if (out_of_range) {
      if constexpr (std::is_signed_v<T>)
        if (a < 0) return static_cast<T>(-1);
      return T{0};
    }
    return static_cast<T>(a >> b);  // arithmetic for a signed T (C++20)
  });
}
void BitShiftKernel(KernelContext& ctx) {
  const bool left = ctx.node.GetString("direction", "") == "LEFT";
  switch (ctx.In(0).dtype()) {
    case DType::kU8: return BitShiftOf<uint8_t>(ctx, left);
    case DType::kI8: return BitShiftOf<int8_t>(ctx, left);
    case DType::kI32: return BitShiftOf<int32_t>(ctx, left);
    case DType::kI64: return BitShiftOf<int64_t>(ctx, left);
    default: UnsupportedDType(ctx.node, ctx.In(0).dtype());
  }
}

template <class Op>
void CompareKernel(KernelContext& ctx, Op op) {
  DType dtype = ctx.In(0).dtype();
  if (dtype == DType::kBool) {
    BinaryMap<bool, bool, bool>(ctx.node, ctx.In(0), ctx.In(1), ctx.Out(0), op);
    return;
  }
  DispatchNumeric(ctx.node, dtype, [&](auto tag) {
    using T = decltype(tag);
    BinaryMap<T, T, bool>(ctx.node, ctx.In(0), ctx.In(1), ctx.Out(0), op);
  });
}
void EqualKernel(KernelContext& ctx) {
  CompareKernel(ctx, [](auto a, auto b) { return a == b; });
}
void LessKernel(KernelContext& ctx) {
  CompareKernel(ctx, [](auto a, auto b) { return a < b; });
}
void GreaterKernel(KernelContext& ctx) {
  CompareKernel(ctx, [](auto a, auto b) { return a > b; });
}
void LessOrEqualKernel(KernelContext& ctx) {
  CompareKernel(ctx, [](auto a, auto b) { return a <= b; });
}
void GreaterOrEqualKernel(KernelContext& ctx) {
  CompareKernel(ctx, [](auto a, auto b) { return a >= b; });
}

template <class Op>
void LogicKernel(KernelContext& ctx, Op op) {
  for (int i = 0; i < 2; ++i)
    if (ctx.In(i).dtype() != DType::kBool) UnsupportedDType(ctx.node, ctx.In(i).dtype());
  BinaryMap<bool, bool, bool>(ctx.node, ctx.In(0), ctx.In(1), ctx.Out(0), op);
}
void AndKernel(KernelContext& ctx) {
  LogicKernel(ctx, [](bool a, bool b) { return a && b; });
}
void OrKernel(KernelContext& ctx) {
  LogicKernel(ctx, [](bool a, bool b) { return a || b; });
}
void XorKernel(KernelContext& ctx) {
  LogicKernel(ctx, [](bool a, bool b) { return a != b; });
}

// Bitwise ops (opset 18) on the integer dtypes, two's complement.
template <class Op>
void BitwiseKernel(KernelContext& ctx, Op op) {
  const DType dtype = ctx.In(0).dtype();
  if (dtype == DType::kF32) UnsupportedDType(ctx.node, dtype);
  DispatchNumeric(ctx.node, dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>)
      BinaryMap<T, T, T>(ctx.node, ctx.In(0), ctx.In(1), ctx.Out(0),
                         [&](T a, T b) { return static_cast<T>(op(a, b)); });
  });
}
void BitwiseAndKernel(KernelContext& ctx) {
  BitwiseKernel(ctx, [](auto a, auto b) { return a & b; });
}
void BitwiseOrKernel(KernelContext& ctx) {
  BitwiseKernel(ctx, [](auto a, auto b) { return a | b; });
}
void BitwiseXorKernel(KernelContext& ctx) {
  BitwiseKernel(ctx, [](auto a, auto b) { return a ^ b; });
}
void BitwiseNotKernel(KernelContext& ctx) {
  const DType dtype = ctx.In(0).dtype();
  if (dtype == DType::kF32) UnsupportedDType(ctx.node, dtype);
  DispatchNumeric(ctx.node, dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_integral_v<T>) {
      const T* x = ctx.In(0).template data<T>();
      T* y = ctx.Out(0).template data<T>();
      for (int64_t i = 0; i < ctx.In(0).numel(); ++i) y[i] = static_cast<T>(~x[i]);
    }
  });
}

// Shrink: x + bias below -lambd, x - bias above lambd, 0 between (computed in float, as the spec's function body).
void ShrinkKernel(KernelContext& ctx) {
  const float bias = ctx.node.GetFloat("bias", 0.f), lambd = ctx.node.GetFloat("lambd", 0.5f);
  DispatchNumeric(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = ctx.In(0).template data<T>();
    T* y = ctx.Out(0).template data<T>();
    for (int64_t i = 0; i < ctx.In(0).numel(); ++i) {
      const float v = static_cast<float>(x[i]);
      y[i] = v < -lambd ? static_cast<T>(v + bias) : v > lambd ? static_cast<T>(v - bias) : T{0};
    }
  });
}

// ---------------------------------------------------------------------------------------------------------------
// Variadic Min / Max / Sum / Mean: out = op(op(in0, in1), in2) ... with broadcasting at each step.

template <class T>
T MinOf(T a, T b) {
  if constexpr (kIsFloat<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  }
  return b < a ? b : a;
}
template <class T>
T MaxOf(T a, T b) {
  if constexpr (kIsFloat<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
  }
  return a < b ? b : a;
}

template <class T, class Op>
void VariadicFold(KernelContext& ctx, Op op) {
  const int n = static_cast<int>(ctx.inputs.size());
  Tensor& out = ctx.Out(0);
  // Inputs after the second are read after `out` is first written, so an input sharing out's buffer needs a copy.
  bool aliased = false;
  for (int i = 2; i < n; ++i) aliased = aliased || (ctx.In(i).raw() == out.raw() && out.numel() > 0);
  Tensor result = aliased ? Tensor(out.dtype(), out.shape()) : out;
  if (n == 1) {
    BroadcastPlan plan(ctx.node, result.shape(), {&ctx.In(0).shape()});
    const T* pi = ctx.In(0).data<T>();
    T* po = result.data<T>();
    plan.ForEachRow([&](int64_t o, const int64_t* off, int64_t len, const int64_t* st) {
      for (int64_t i = 0; i < len; ++i) po[o + i] = pi[off[0] + i * st[0]];
    });
  } else {
    // BinaryMap evaluates over result's (final) shape, to which every input broadcasts on its own.
    BinaryMap<T, T, T>(ctx.node, ctx.In(0), ctx.In(1), result, op);
    for (int i = 2; i < n; ++i) BinaryMap<T, T, T>(ctx.node, result, ctx.In(i), result, op);
  }
  if (aliased) std::memcpy(out.raw(), result.raw(), out.nbytes());
}

void MinKernel(KernelContext& ctx) {
  DispatchNumeric(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    VariadicFold<T>(ctx, [](T a, T b) { return MinOf(a, b); });
  });
}
void MaxKernel(KernelContext& ctx) {
  DispatchNumeric(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    VariadicFold<T>(ctx, [](T a, T b) { return MaxOf(a, b); });
  });
}
void SumKernel(KernelContext& ctx) {
  DispatchNumeric(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    VariadicFold<T>(ctx, [](T a, T b) -> T {
      if constexpr (kIsFloat<T>)
        return a + b;
      else
        return WrapAdd(a, b);
    });
  });
}
void MeanKernel(KernelContext& ctx) {
  CheckF32(ctx, 0);
  VariadicFold<float>(ctx, [](float a, float b) { return a + b; });
  const float count = static_cast<float>(ctx.inputs.size());
  float* p = ctx.Out(0).data<float>();
  for (int64_t i = 0; i < ctx.Out(0).numel(); ++i) p[i] /= count;
}

// ---------------------------------------------------------------------------------------------------------------
// Unary kernels.

template <class F>
void MapF32(KernelContext& ctx, F f) {
  CheckF32(ctx, 0);
  const float* x = ctx.In(0).data<float>();
  float* y = ctx.Out(0).data<float>();
  const int64_t n = ctx.In(0).numel();
  OSPREY_CHECK(ctx.Out(0).numel() == n);
#pragma omp parallel for if (n >= kParallelMinElements) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}

template <class F>
void MapSigned(KernelContext& ctx, F f) {
  DispatchSigned(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* x = ctx.In(0).template data<T>();
    T* y = ctx.Out(0).template data<T>();
    OSPREY_CHECK(ctx.Out(0).numel() == ctx.In(0).numel());
    for (int64_t i = 0; i < ctx.In(0).numel(); ++i) y[i] = f(x[i]);
  });
}

float SigmoidOf(float x) {
  if (x >= 0) return 1.f / (1.f + std::exp(-x));
  const float e = std::exp(x);
  return e / (1.f + e);
}
float SoftplusOf(float x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

void SqrtKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::sqrt(x); });
}
void ExpKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::exp(x); });
}
void LogKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::log(x); });
}
void ErfKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::erf(x); });
}
void TanhKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::tanh(x); });
}
void SigmoidKernel(KernelContext& ctx) { MapF32(ctx, SigmoidOf); }
void ReciprocalKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return 1.f / x; });
}
void FloorKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::floor(x); });
}
void CeilKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::ceil(x); });
}
// nearbyint rounds halves to even under the default rounding mode, as ONNX Round requires.
// With `_quant_scale` (the runtime's fused QuantizeLinear -> DequantizeLinear pair, docs/architecture.md):
// y = clip(round(x / s), lo, hi) * s, step for step as the Div, Round, Clip and Mul kernels compute it.
void RoundKernel(KernelContext& ctx) {
  if (!ctx.node.Has("_quant_scale")) {
    MapF32(ctx, [](float x) { return std::nearbyint(x); });
    return;
  }
  const float s = ctx.node.GetFloat("_quant_scale", 1.f), lo = ctx.node.GetFloat("_quant_lo", 0.f),
              hi = ctx.node.GetFloat("_quant_hi", 0.f);
  MapF32(ctx, [s, lo, hi](float x) { return FakeQuantizeValue(x, s, lo, hi); });
}
void SinKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::sin(x); });
}
void CosKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::cos(x); });
}
void TanKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::tan(x); });
}
void AsinKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::asin(x); });
}
void AcosKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::acos(x); });
}
void AtanKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::atan(x); });
}
void SinhKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::sinh(x); });
}
void CoshKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::cosh(x); });
}
void AsinhKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::asinh(x); });
}
void AcoshKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::acosh(x); });
}
void AtanhKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return std::atanh(x); });
}
void SoftplusKernel(KernelContext& ctx) { MapF32(ctx, SoftplusOf); }
void SoftsignKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return x / (1.f + std::fabs(x)); });
}
void HardSwishKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return x * std::min(std::max(x / 6.f + 0.5f, 0.f), 1.f); });
}
void MishKernel(KernelContext& ctx) {
  MapF32(ctx, [](float x) { return x * std::tanh(SoftplusOf(x)); });
}

void LeakyReluKernel(KernelContext& ctx) {
  const float alpha = ctx.node.GetFloat("alpha", kLeakyReluAlpha);
  MapF32(ctx, [alpha](float x) { return x >= 0 ? x : x * alpha; });
}
void EluKernel(KernelContext& ctx) {
  const float alpha = ctx.node.GetFloat("alpha", 1.f);
  MapF32(ctx, [alpha](float x) { return x >= 0 ? x : alpha * std::expm1(x); });
}
void SeluKernel(KernelContext& ctx) {
  const float alpha = ctx.node.GetFloat("alpha", kSeluAlpha);
  const float gamma = ctx.node.GetFloat("gamma", kSeluGamma);
  MapF32(ctx, [alpha, gamma](float x) { return x > 0 ? gamma * x : gamma * alpha * std::expm1(x); });
}
void CeluKernel(KernelContext& ctx) {
  const float alpha = ctx.node.GetFloat("alpha", 1.f);
  if (alpha == 0.f) throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": attribute 'alpha' is 0");
  MapF32(ctx, [alpha](float x) { return std::max(0.f, x) + std::min(0.f, alpha * std::expm1(x / alpha)); });
}
void ThresholdedReluKernel(KernelContext& ctx) {
  const float alpha = ctx.node.GetFloat("alpha", 1.f);
  MapF32(ctx, [alpha](float x) { return x > alpha ? x : 0.f; });
}
void HardSigmoidKernel(KernelContext& ctx) {
  const float alpha = ctx.node.GetFloat("alpha", kHardSigmoidAlpha);
  const float beta = ctx.node.GetFloat("beta", kHardSigmoidBeta);
  MapF32(ctx, [alpha, beta](float x) { return std::min(std::max(alpha * x + beta, 0.f), 1.f); });
}
void GeluKernel(KernelContext& ctx) {
  if (ctx.node.GetString("approximate", "none") == "tanh") {
    MapF32(ctx, [](float x) {
      constexpr float kSqrt2OverPi = 0.7978845608028654f;
      return 0.5f * x * (1.f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
    });
  } else {
    MapF32(ctx, [](float x) { return 0.5f * x * (1.f + std::erf(x * 0.70710678118654752f)); });
  }
}

void NegKernel(KernelContext& ctx) {
  MapSigned(ctx, [](auto x) -> decltype(x) {
    if constexpr (kIsFloat<decltype(x)>)
      return -x;
    else
      return WrapNeg(x);
  });
}
void AbsKernel(KernelContext& ctx) {
  MapSigned(ctx, [](auto x) -> decltype(x) {
    if constexpr (kIsFloat<decltype(x)>)
      return std::fabs(x);
    else
      return x < 0 ? WrapNeg(x) : x;
  });
}
void SignKernel(KernelContext& ctx) {
  MapSigned(ctx, [](auto x) -> decltype(x) {
    using T = decltype(x);
    if constexpr (kIsFloat<T>) {
      if (std::isnan(x)) return x;
    }
    return static_cast<T>((x > 0) - (x < 0));
  });
}
void ReluKernel(KernelContext& ctx) {
  if (ctx.In(0).dtype() == DType::kF32) {
    MapF32(ctx, [](float x) { return x > 0 ? x : (x == x ? 0.f : x); });
    return;
  }
  MapSigned(ctx, [](auto x) -> decltype(x) { return x > 0 ? x : decltype(x){0}; });
}

void NotKernel(KernelContext& ctx) {
  if (ctx.In(0).dtype() != DType::kBool) UnsupportedDType(ctx.node, ctx.In(0).dtype());
  const bool* x = ctx.In(0).data<bool>();
  bool* y = ctx.Out(0).data<bool>();
  for (int64_t i = 0; i < ctx.In(0).numel(); ++i) y[i] = !x[i];
}

template <class F>
void PredicateF32(KernelContext& ctx, F f) {
  CheckF32(ctx, 0);
  const float* x = ctx.In(0).data<float>();
  bool* y = ctx.Out(0).data<bool>();
  for (int64_t i = 0; i < ctx.In(0).numel(); ++i) y[i] = f(x[i]);
}
void IsNaNKernel(KernelContext& ctx) {
  PredicateF32(ctx, [](float x) { return std::isnan(x); });
}
void IsInfKernel(KernelContext& ctx) {
  const bool positive = ctx.node.GetInt("detect_positive", 1) != 0;
  const bool negative = ctx.node.GetInt("detect_negative", 1) != 0;
  PredicateF32(ctx, [positive, negative](float x) { return std::isinf(x) && (x > 0 ? positive : negative); });
}

// ---------------------------------------------------------------------------------------------------------------
// Clip, Where, Cast.

void ClipKernel(KernelContext& ctx) {
  DispatchNumeric(ctx.node, ctx.In(0).dtype(), [&](auto tag) {
    using T = decltype(tag);
    T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
    if (ctx.opset < 11) {
      if constexpr (kIsFloat<T>) {
        lo = ctx.node.GetFloat("min", lo);
        hi = ctx.node.GetFloat("max", hi);
      }
    } else {
      for (int i = 1; i <= 2; ++i) {
        if (!ctx.HasIn(i)) continue;
        const Tensor& bound = ctx.In(i);
        if (bound.numel() != 1 || bound.dtype() != ctx.In(0).dtype())
          throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": " + (i == 1 ? "min" : "max") +
                                                       " must be a single " + DTypeName(ctx.In(0).dtype()) + ", got " +
                                                       DTypeName(bound.dtype()) + " of shape " +
                                                       ShapeToString(bound.shape()));
        (i == 1 ? lo : hi) = bound.template data<T>()[0];
      }
    }
    const T* x = ctx.In(0).template data<T>();
    T* y = ctx.Out(0).template data<T>();
    const int64_t n = ctx.In(0).numel();
    // min(max(x, lo), hi): when lo > hi every element becomes hi, as in ONNX Runtime. NaN passes through.
    for (int64_t i = 0; i < n; ++i) {
      T v = x[i] < lo ? lo : x[i];
      y[i] = hi < v ? hi : v;
    }
  });
}

template <class T>
void WhereTyped(KernelContext& ctx) {
  const Tensor& cond = ctx.In(0);
  const bool* pc = cond.data<bool>();
  const T* px = ctx.In(1).data<T>();
  const T* py = ctx.In(2).data<T>();
  T* po = ctx.Out(0).data<T>();
  BroadcastPlan plan(ctx.node, ctx.Out(0).shape(), {&cond.shape(), &ctx.In(1).shape(), &ctx.In(2).shape()});
  plan.ForEachRow([&](int64_t o, const int64_t* off, int64_t len, const int64_t* st) {
    for (int64_t i = 0; i < len; ++i)
      po[o + i] = pc[off[0] + i * st[0]] ? px[off[1] + i * st[1]] : py[off[2] + i * st[2]];
  });
}

void WhereKernel(KernelContext& ctx) {
  if (ctx.In(0).dtype() != DType::kBool) UnsupportedDType(ctx.node, ctx.In(0).dtype());
  if (ctx.In(1).dtype() != ctx.In(2).dtype() || ctx.Out(0).dtype() != ctx.In(1).dtype())
    throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": X and Y must have the same dtype");
  // Where only moves elements, so it works on every dtype by element size.
  switch (DTypeSize(ctx.In(1).dtype())) {
    case 1:
      WhereTyped<uint8_t>(ctx);
      break;
    case 2:
      WhereTyped<uint16_t>(ctx);
      break;
    case 4:
      WhereTyped<uint32_t>(ctx);
      break;
    case 8:
      WhereTyped<uint64_t>(ctx);
      break;
    default:
      UnsupportedDType(ctx.node, ctx.In(1).dtype());
  }
}

template <class T>
constexpr bool kIsHalf = std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>;

template <class S>
float AsFloat(S s) {
  if constexpr (std::is_same_v<S, Float16>) {
    return HalfToFloat(s.bits);
  } else if constexpr (std::is_same_v<S, BFloat16>) {
    return BFloat16ToFloat(s.bits);
  } else {
    return static_cast<float>(s);
  }
}

// One element of Cast. Float -> integer truncates toward zero and saturates (NaN -> 0); integer -> narrower integer
// wraps; anything -> bool is "!= 0" (NaN -> true); float16/bfloat16 round to nearest even.
template <class D, class S>
D ConvertElement(S s) {
  constexpr bool kSrcFloat = kIsHalf<S> || std::is_floating_point_v<S>;
  if constexpr (std::is_same_v<D, S>) {
    return s;
  } else if constexpr (std::is_same_v<D, bool>) {
    if constexpr (kSrcFloat)
      return AsFloat(s) != 0.f;
    else
      return s != 0;
  } else if constexpr (std::is_same_v<D, Float16>) {
    return Float16{FloatToHalf(AsFloat(s))};
  } else if constexpr (std::is_same_v<D, BFloat16>) {
    return BFloat16{FloatToBFloat16(AsFloat(s))};
  } else if constexpr (std::is_floating_point_v<D>) {
    return static_cast<D>(AsFloat(s));
  } else if constexpr (kSrcFloat) {
    return SaturateToInt<D>(AsFloat(s));
  } else {
    return static_cast<D>(s);
  }
}

void CastInto(const Node& node, const Tensor& in, Tensor& out) {
  OSPREY_CHECK(in.numel() == out.numel());
  if (in.dtype() == out.dtype()) {
    if (in.nbytes() && in.raw() != out.raw()) std::memmove(out.raw(), in.raw(), in.nbytes());
    return;
  }
  DispatchAll(in.dtype(), [&](auto src_tag) {
    using S = decltype(src_tag);
    DispatchAll(out.dtype(), [&](auto dst_tag) {
      using D = decltype(dst_tag);
      const S* src = static_cast<const S*>(in.raw());
      D* dst = static_cast<D*>(out.raw());
      for (int64_t i = 0; i < in.numel(); ++i) dst[i] = ConvertElement<D>(src[i]);
    });
  });
}

void CastKernel(KernelContext& ctx) { CastInto(ctx.node, ctx.In(0), ctx.Out(0)); }
void BitCastKernel(KernelContext& ctx) {
  if (ctx.Out(0).nbytes() != ctx.In(0).nbytes()) throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": size");
  if (ctx.Out(0).raw() != ctx.In(0).raw()) std::memcpy(ctx.Out(0).raw(), ctx.In(0).raw(), ctx.In(0).nbytes());
}

}  // namespace

void AddElementwiseReferenceKernels(ReferenceKernelTable& t) {
  t.Add("Add", AddKernel);
  t.Add("Sub", SubKernel);
  t.Add("Mul", MulKernel);
  t.Add("Div", DivKernel);
  t.Add("Mod", ModKernel);
  t.Add("Pow", PowKernel);
  t.Add("PRelu", PReluKernel);
  t.Add("BitShift", BitShiftKernel);
  t.Add("Equal", EqualKernel);
  t.Add("Less", LessKernel);
  t.Add("Greater", GreaterKernel);
  t.Add("LessOrEqual", LessOrEqualKernel);
  t.Add("GreaterOrEqual", GreaterOrEqualKernel);
  t.Add("And", AndKernel);
  t.Add("Or", OrKernel);
  t.Add("Xor", XorKernel);
  t.Add("BitwiseAnd", BitwiseAndKernel);
  t.Add("BitwiseOr", BitwiseOrKernel);
  t.Add("BitwiseXor", BitwiseXorKernel);
  t.Add("BitwiseNot", BitwiseNotKernel);
  t.Add("Shrink", ShrinkKernel);
  t.Add("Min", MinKernel);
  t.Add("Max", MaxKernel);
  t.Add("Sum", SumKernel);
  t.Add("Mean", MeanKernel);
  t.Add("Sqrt", SqrtKernel);
  t.Add("Exp", ExpKernel);
  t.Add("Log", LogKernel);
  t.Add("Erf", ErfKernel);
  t.Add("Tanh", TanhKernel);
  t.Add("Sigmoid", SigmoidKernel);
  t.Add("Reciprocal", ReciprocalKernel);
  t.Add("Floor", FloorKernel);
  t.Add("Ceil", CeilKernel);
  t.Add("Round", RoundKernel);
  t.Add("Sin", SinKernel);
  t.Add("Cos", CosKernel);
  t.Add("Tan", TanKernel);
  t.Add("Asin", AsinKernel);
  t.Add("Acos", AcosKernel);
  t.Add("Atan", AtanKernel);
  t.Add("Sinh", SinhKernel);
  t.Add("Cosh", CoshKernel);
  t.Add("Asinh", AsinhKernel);
  t.Add("Acosh", AcoshKernel);
  t.Add("Atanh", AtanhKernel);
  t.Add("Softplus", SoftplusKernel);
  t.Add("Softsign", SoftsignKernel);
  t.Add("HardSwish", HardSwishKernel);
  t.Add("Mish", MishKernel);
  t.Add("LeakyRelu", LeakyReluKernel);
  t.Add("Elu", EluKernel);
  t.Add("Selu", SeluKernel);
  t.Add("Celu", CeluKernel);
  t.Add("ThresholdedRelu", ThresholdedReluKernel);
  t.Add("HardSigmoid", HardSigmoidKernel);
  t.Add("Gelu", GeluKernel);
  t.Add("Neg", NegKernel);
  t.Add("Abs", AbsKernel);
  t.Add("Sign", SignKernel);
  t.Add("Relu", ReluKernel);
  t.Add("Not", NotKernel);
  t.Add("IsNaN", IsNaNKernel);
  t.Add("IsInf", IsInfKernel);
  t.Add("Clip", ClipKernel);
  t.Add("Where", WhereKernel);
  t.Add("Cast", CastKernel);
  t.Add("BitCast", BitCastKernel);
  t.Add("CastLike", CastKernel);
}

}  // namespace osprey
