// Fast float32 elementwise kernels: unary activations and maths (Relu, LeakyRelu, Clip, Sigmoid, Tanh, HardSigmoid,
// HardSwish, Elu, Selu, Celu, Gelu, Erf, Exp, Log, Neg, Abs, Sqrt, Reciprocal) and binary
// Add/Sub/Mul/Div/PRelu/Max/Min with numpy broadcasting.
//
// One generic path driven by op traits: each op is a small inlined functor (its formula identical to the reference
// kernel's, or a vector_math.h approximation for the transcendental ones), and the row loops are templates over the
// functor that the compiler vectorises (`omp simd`). The row functions are compiled for AVX-512, AVX2 and the
// baseline, and the best one is picked when the program starts (GCC target_clones), as in batchnorm.cc.
//
// Broadcasting is classified when the kernel runs, from the tensors it is given (so the same kernel serves a node
// on plain tensors and a layout-transparent node on channels-last data, whose plain operands arrive as [N, H, W, C]
// views): output dims of size 1 are dropped and adjacent dims merged wherever both inputs walk them alike, leaving
// an innermost run in which each input is either contiguous (stride 1) or one repeated value (stride 0). Same shape,
// scalar, per-channel NCHW ([C, 1, 1] against [N, C, H, W]: runs of H*W with one value) and per-channel NHWC ([C]
// against [N, H, W, C]: runs of C against a contiguous row) all become such runs. Work is split over OpenMP threads
// in blocks of whole runs (or pieces of a long run) once the tensor is large enough to pay for a parallel region.
// The row loops compare floats in selects (clamps, branch-free piecewise formulas). Under GCC's default
// -ftrapping-math those comparisons may raise FP exceptions, so GCC refuses to if-convert them and the loops stay
// scalar ("control flow in loop"). Nothing here reads FP exception flags: allowed for this whole file (set before
// any include, so inlined library code gets the same setting and inlines). Likewise errno: sqrtf of a negative sets
// it, so GCC keeps Sqrt's loop scalar unless errno is off, which CMakeLists.txt sets for this file
// (-fno-math-errno; the pragma does not reach the builtin). Nothing here reads errno; the result is NaN either way.
#pragma GCC optimize("no-trapping-math")
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/silu_vector.h"
#include "kernels/cpu/vector_math.h"
#include "ops/activation.h"

namespace osprey::cpu {
namespace {

// ---------------------------------------------------------------------------------------------------------------
// Op traits.

enum class UnaryOp {
  kRelu,
  kLeakyRelu,
  kClip,
  kSigmoid,
  kTanh,
  kHardSigmoid,
  kHardSwish,
  kElu,
  kSelu,
  kCelu,
  kGelu,
  kGeluTanh,
  kErf,
  kExp,
  kLog,
  kNeg,
  kAbs,
  kSqrt,
  kReciprocal,
  kRound,
  kFakeQuantize
};
enum class BinaryOp { kAdd, kSub, kMul, kDiv, kPRelu, kMax, kMin };

struct UnaryParams {
  UnaryOp op = UnaryOp::kRelu;
  float alpha = 0.f, beta = 0.f, gamma = 0.f;
};

struct UnaryTraits {
  const char* op_type;
  UnaryOp op;
  const char* kernel_name;
  bool transcendental;  // costly per element: worth threads at smaller sizes
};
constexpr UnaryTraits kUnary[] = {
    {"Relu", UnaryOp::kRelu, "ReluF32Fast", false},
    {"LeakyRelu", UnaryOp::kLeakyRelu, "LeakyReluF32Fast", false},
    {"Clip", UnaryOp::kClip, "ClipF32Fast", false},
    {"Sigmoid", UnaryOp::kSigmoid, "SigmoidF32Fast", true},
    {"Tanh", UnaryOp::kTanh, "TanhF32Fast", true},
    {"HardSigmoid", UnaryOp::kHardSigmoid, "HardSigmoidF32Fast", false},
    {"HardSwish", UnaryOp::kHardSwish, "HardSwishF32Fast", false},
    {"Elu", UnaryOp::kElu, "EluF32Fast", true},
    {"Selu", UnaryOp::kSelu, "SeluF32Fast", true},
    {"Celu", UnaryOp::kCelu, "CeluF32Fast", true},
    {"Gelu", UnaryOp::kGelu, "GeluF32Fast", true},
    {"Erf", UnaryOp::kErf, "ErfF32Fast", true},
    {"Exp", UnaryOp::kExp, "ExpF32Fast", true},
    {"Log", UnaryOp::kLog, "LogF32Fast", true},
    {"Neg", UnaryOp::kNeg, "NegF32Fast", false},
    {"Abs", UnaryOp::kAbs, "AbsF32Fast", false},
    {"Sqrt", UnaryOp::kSqrt, "SqrtF32Fast", false},
    {"Reciprocal", UnaryOp::kReciprocal, "ReciprocalF32Fast", false},
    {"Round", UnaryOp::kRound, "RoundF32Fast", false},
};

// Not an op type of its own: a Round carrying `_quant_scale` (see FakeQuantize below).
constexpr UnaryTraits kFakeQuantizeTraits{"Round", UnaryOp::kFakeQuantize, "FakeQuantizeF32Fast", false};

struct BinaryTraits {
  const char* op_type;
  BinaryOp op;
  const char* kernel_name;
};
constexpr BinaryTraits kBinary[] = {
    {"Add", BinaryOp::kAdd, "AddF32Fast"},
    {"Sub", BinaryOp::kSub, "SubF32Fast"},
    {"Mul", BinaryOp::kMul, "MulF32Fast"},
    {"Div", BinaryOp::kDiv, "DivF32Fast"},
    // The slope broadcasts to X (the schema checks it).
    {"PRelu", BinaryOp::kPRelu, "PReluF32Fast"},
    // Max and Min of two inputs (more: the reference kernel's fold).
    {"Max", BinaryOp::kMax, "MaxF32Fast"},
    {"Min", BinaryOp::kMin, "MinF32Fast"},
};

// The functors. Formulas follow kernels/reference/elementwise.cc expression for expression (NaN handling included);
// the transcendental ones use vector_math.h.
struct Relu {
  [[gnu::always_inline]] float operator()(float x) const { return x > 0 ? x : (x == x ? 0.f : x); }
};
struct LeakyRelu {
  float alpha;
  [[gnu::always_inline]] float operator()(float x) const { return x >= 0 ? x : x * alpha; }
};
struct Clip {
  float lo, hi;
  [[gnu::always_inline]] float operator()(float x) const {
    const float v = x < lo ? lo : x;
    return hi < v ? hi : v;
  }
};
struct Sigmoid {
  [[gnu::always_inline]] float operator()(float x) const { return vmath::Sigmoid(x); }
};
struct Tanh {
  [[gnu::always_inline]] float operator()(float x) const { return vmath::Tanh(x); }
};
struct HardSigmoid {
  float alpha, beta;
  [[gnu::always_inline]] float operator()(float x) const { return std::min(std::max(alpha * x + beta, 0.f), 1.f); }
};
struct HardSwish {
  [[gnu::always_inline]] float operator()(float x) const { return x * std::min(std::max(x / 6.f + 0.5f, 0.f), 1.f); }
};
// The ELU family (3-D U-Nets, Keras "elu"/"selu" layers) as the reference writes them, expm1 from vector_math.h.
struct Elu {
  float alpha;
  [[gnu::always_inline]] float operator()(float x) const { return x >= 0 ? x : alpha * vmath::Expm1(x); }
};
struct Selu {
  float alpha, gamma;
  [[gnu::always_inline]] float operator()(float x) const { return x > 0 ? gamma * x : gamma * alpha * vmath::Expm1(x); }
};
struct Celu {
  float alpha;
  [[gnu::always_inline]] float operator()(float x) const {
    return std::max(0.f, x) + std::min(0.f, alpha * vmath::Expm1(x / alpha));
  }
};
struct Gelu {
  [[gnu::always_inline]] float operator()(float x) const { return 0.5f * x * (1.f + vmath::Erf(x * 0.70710678118654752f)); }
};
struct GeluTanh {
  [[gnu::always_inline]] float operator()(float x) const {
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    return 0.5f * x * (1.f + vmath::Tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
  }
};
struct Erf {
  [[gnu::always_inline]] float operator()(float x) const { return vmath::Erf(x); }
};
struct Exp {
  [[gnu::always_inline]] float operator()(float x) const { return vmath::ExpFull(x); }
};
struct Log {
  [[gnu::always_inline]] float operator()(float x) const { return vmath::Log(x); }
};
struct Neg {
  [[gnu::always_inline]] float operator()(float x) const { return -x; }
};
struct Abs {
  [[gnu::always_inline]] float operator()(float x) const { return vmath::Abs(x); }
};
struct Sqrt {
  [[gnu::always_inline]] float operator()(float x) const { return __builtin_sqrtf(x); }
};
struct Reciprocal {
  [[gnu::always_inline]] float operator()(float x) const { return 1.f / x; }
};

struct Round {  // half to even: rint in the default rounding mode, as std::nearbyint in the reference kernel
  [[gnu::always_inline]] float operator()(float x) const { return __builtin_rintf(x); }
};

// A QuantizeLinear -> DequantizeLinear pair (Round carrying `_quant_scale`): clip(round(x / s), lo, hi) * s, as the
// Div, Round, Clip and Mul it replaces (a division, not a product with 1 / s, so the result is the same bits).
struct FakeQuantize {
  float s, lo, hi;
  [[gnu::always_inline]] float operator()(float x) const { return Clip{lo, hi}(Round{}(x / s)) * s; }
};

struct Add {
  [[gnu::always_inline]] float operator()(float a, float b) const { return a + b; }
};
struct Sub {
  [[gnu::always_inline]] float operator()(float a, float b) const { return a - b; }
};
struct Mul {
  [[gnu::always_inline]] float operator()(float a, float b) const { return a * b; }
};
struct Div {
  [[gnu::always_inline]] float operator()(float a, float b) const { return a / b; }
};
struct PRelu {  // x where !(x < 0) (NaN and -0 kept), else x * slope
  [[gnu::always_inline]] float operator()(float x, float slope) const { return x < 0 ? x * slope : x; }
};
// NaN if either is NaN (a + b is then NaN), else the larger / smaller; of -0 and 0 the first unless the second is
// strictly larger / smaller, as the reference's MaxOf / MinOf.
struct Max {
  [[gnu::always_inline]] float operator()(float a, float b) const {
    const float m = a < b ? b : a;
    return a != a || b != b ? a + b : m;
  }
};
struct Min {
  [[gnu::always_inline]] float operator()(float a, float b) const {
    const float m = b < a ? b : a;
    return a != a || b != b ? a + b : m;
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Row loops.

template <class F>
[[gnu::always_inline]] inline void MapRow(const float* __restrict x, float* __restrict y, int64_t n, F f) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
}

// y[0, n) = f(x[0, n)). x may equal y (element i is read before it is written); they never partly overlap.
__attribute__((target_clones("avx512f", "avx2", "default"))) void UnaryRow(const UnaryParams& p, const float* x,
                                                                             float* y, int64_t n) {
  if (x == y) {  // in place: __restrict would be a lie, so go through a small stack buffer
    float tmp[256];
    for (int64_t i = 0; i < n; i += 256) {
      const int64_t m = std::min<int64_t>(256, n - i);
      std::copy(x + i, x + i + m, tmp);
      UnaryRow(p, tmp, y + i, m);
    }
    return;
  }
  switch (p.op) {
    case UnaryOp::kRelu: return MapRow(x, y, n, Relu{});
    case UnaryOp::kLeakyRelu: return MapRow(x, y, n, LeakyRelu{p.alpha});
    case UnaryOp::kClip: return MapRow(x, y, n, Clip{p.alpha, p.beta});
    case UnaryOp::kSigmoid: return MapRow(x, y, n, Sigmoid{});
    case UnaryOp::kTanh: return MapRow(x, y, n, Tanh{});
    case UnaryOp::kHardSigmoid: return MapRow(x, y, n, HardSigmoid{p.alpha, p.beta});
    case UnaryOp::kHardSwish: return MapRow(x, y, n, HardSwish{});
    case UnaryOp::kElu:
      return MapRow(x, y, n, Elu{p.alpha});
    case UnaryOp::kSelu:
      return MapRow(x, y, n, Selu{p.alpha, p.gamma});
    case UnaryOp::kCelu:
      return MapRow(x, y, n, Celu{p.alpha});
    case UnaryOp::kGelu: return MapRow(x, y, n, Gelu{});
    case UnaryOp::kGeluTanh: return MapRow(x, y, n, GeluTanh{});
    case UnaryOp::kErf: return MapRow(x, y, n, Erf{});
    case UnaryOp::kExp: return MapRow(x, y, n, Exp{});
    case UnaryOp::kLog:
      return MapRow(x, y, n, Log{});
    case UnaryOp::kNeg: return MapRow(x, y, n, Neg{});
    case UnaryOp::kAbs: return MapRow(x, y, n, Abs{});
    case UnaryOp::kSqrt: return MapRow(x, y, n, Sqrt{});
    case UnaryOp::kReciprocal: return MapRow(x, y, n, Reciprocal{});
    case UnaryOp::kRound: return MapRow(x, y, n, Round{});
    case UnaryOp::kFakeQuantize: return MapRow(x, y, n, FakeQuantize{p.gamma, p.alpha, p.beta});
  }
}

// One run of a binary op: input k's element i is at pk[i * sk], sk in {0, 1}. Output may alias an input of stride 1
// (same index), so no __restrict.
template <class F>
[[gnu::always_inline]] inline void BinaryRowOf(const float* a, int64_t sa, const float* b, int64_t sb, float* y,
                                               int64_t n, F f) {
  if (sa == 1 && sb == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], b[i]);
  } else if (sa == 1) {
    const float s = b[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = f(a[i], s);
  } else if (sb == 1) {
    const float s = a[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = f(s, b[i]);
  } else {
    const float v = f(a[0], b[0]);
    for (int64_t i = 0; i < n; ++i) y[i] = v;
  }
}

// g(functor of op): the one mapping from a BinaryOp to its functor, for the row functions below.
template <class G>
[[gnu::always_inline]] inline void WithBinaryOp(BinaryOp op, G g) {
  switch (op) {
    case BinaryOp::kAdd:
      return g(Add{});
    case BinaryOp::kSub:
      return g(Sub{});
    case BinaryOp::kMul:
      return g(Mul{});
    case BinaryOp::kDiv:
      return g(Div{});
    case BinaryOp::kPRelu:
      return g(PRelu{});
    case BinaryOp::kMax:
      return g(Max{});
    case BinaryOp::kMin:
      return g(Min{});
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void BinaryRow(BinaryOp op, const float* a, int64_t sa,
                                                                              const float* b, int64_t sb, float* y,
                                                                              int64_t n) {
  WithBinaryOp(
      op, [&](auto f) __attribute__((always_inline)) { BinaryRowOf(a, sa, b, sb, y, n, f); });
}

template <class F>
[[gnu::always_inline]] inline void MapInPlace(float* y, int64_t n, F f) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = f(y[i]);
}

// m short runs of n elements (output run r at y + r * n; input k's run r at pk + r * rk, element i at i * sk): one
// call for a block of rows whose runs are too short for a call each (RAFT's [320, 1, 1, 2] + [1, 7, 7, 2]).
template <class F>
[[gnu::always_inline]] inline void BinaryRowsOf(const float* a, int64_t sa, int64_t ra, const float* b, int64_t sb,
                                                int64_t rb, float* y, int64_t n, int64_t m, F f) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = f(a[r * ra + i * sa], b[r * rb + i * sb]);
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void BinaryRows(BinaryOp op, const float* a, int64_t sa,
                                                                             int64_t ra, const float* b, int64_t sb,
                                                                             int64_t rb, float* y, int64_t n,
                                                                             int64_t m) {
  WithBinaryOp(
      op, [&](auto f) __attribute__((always_inline)) { BinaryRowsOf(a, sa, ra, b, sb, rb, y, n, m, f); });
}

// A fused step (ops/activation.h UnaryStep) on y[0, n), in place: the unary ops a chain may hold.
__attribute__((target_clones("avx512f", "avx2", "default"))) void StepRow(const UnaryParams& p, float* y, int64_t n) {
  switch (p.op) {
    case UnaryOp::kRelu:
      return MapInPlace(y, n, Relu{});
    case UnaryOp::kLeakyRelu:
      return MapInPlace(y, n, LeakyRelu{p.alpha});
    case UnaryOp::kClip:
      return MapInPlace(y, n, Clip{p.alpha, p.beta});
    case UnaryOp::kSigmoid:
      return MapInPlace(y, n, Sigmoid{});
    case UnaryOp::kTanh:
      return MapInPlace(y, n, Tanh{});
    case UnaryOp::kHardSigmoid:
      return MapInPlace(y, n, HardSigmoid{p.alpha, p.beta});
    case UnaryOp::kHardSwish:
      return MapInPlace(y, n, HardSwish{});
    case UnaryOp::kGelu:
      return MapInPlace(y, n, Gelu{});
    case UnaryOp::kGeluTanh:
      return MapInPlace(y, n, GeluTanh{});
    case UnaryOp::kFakeQuantize:
      return MapInPlace(y, n, FakeQuantize{p.gamma, p.alpha, p.beta});
    default:
      return;  // StepParams makes no other
  }
}

// One fused step (or a kernel's own activation) as StepRow parameters; false when it has no fast form. An activation
// step is the kUnary entry of its op (ActivationName), with its alpha and beta.
bool StepParamsOf(const UnaryStep& s, UnaryParams* out) {
  if (s.fake_quantize) {
    *out = {UnaryOp::kFakeQuantize, /*alpha=*/s.lo, /*beta=*/s.hi, /*gamma=*/s.scale};
    return true;
  }
  if (s.act.kind == ActivationKind::kGeluTanh) {  // Gelu's entry, approximate = "tanh"
    *out = {UnaryOp::kGeluTanh, 0.f, 0.f, 0.f};
    return true;
  }
  const std::string name = ActivationName(s.act.kind);
  const auto* t =
      std::find_if(std::begin(kUnary), std::end(kUnary), [&](const UnaryTraits& u) { return name == u.op_type; });
  if (t == std::end(kUnary)) return false;
  *out = {t->op, s.act.alpha, s.act.beta, 0.f};
  return true;
}

// The fused steps of a node as StepRow parameters; false when one has no fast form (the reference kernel runs).
bool StepParams(const Node& node, std::vector<UnaryParams>* out) {
  for (const UnaryStep& s : FusedSteps(node))
    if (!StepParamsOf(s, &out->emplace_back())) return false;
  return true;
}

void ApplySteps(const std::vector<UnaryParams>& steps, float* y, int64_t n) {
  for (const UnaryParams& p : steps) StepRow(p, y, n);
}

// ---------------------------------------------------------------------------------------------------------------
// Work split.

constexpr int kMaxRank = 8;
// Elements per unit of work: large enough to amortise the loop set-up, small enough to balance threads.
constexpr int64_t kBlockElements = int64_t{1} << 13;
// Below this many elements a parallel region costs more than it saves (cheap ops; transcendental ones: / 8).
constexpr int64_t kMinParallelElements = int64_t{1} << 15;

int ThreadsFor(int64_t n, bool costly, int max_threads) {
  const int64_t min = costly ? kMinParallelElements / 8 : kMinParallelElements;
  if (max_threads <= 1 || n < min) return 1;
  return static_cast<int>(std::min<int64_t>(max_threads, (n + kBlockElements - 1) / kBlockElements));
}

// Broadcast of two inputs to the output shape, merged as described at the top: dims[0..rank), the last innermost,
// and per input a stride per dim (0 where broadcast).
struct BinaryPlan {
  int rank = 0;
  std::array<int64_t, kMaxRank> dims{};
  std::array<int64_t, kMaxRank> stride_a{}, stride_b{};
  int64_t total = 1;

  // False when a shape has more than kMaxRank dims or does not broadcast (the factory's checks make neither happen).
  bool Build(const Shape& out, const Shape& a, const Shape& b) {
    const size_t r = out.size();
    if (r > kMaxRank || a.size() > r || b.size() > r) return false;
    std::array<int64_t, kMaxRank> fa{}, fb{};
    int64_t sa = 1, sb = 1;
    for (size_t j = r; j-- > 0;) {
      const int64_t da = j < r - a.size() ? 1 : a[j - (r - a.size())];
      const int64_t db = j < r - b.size() ? 1 : b[j - (r - b.size())];
      if ((da != out[j] && da != 1) || (db != out[j] && db != 1)) return false;
      fa[j] = da == 1 ? 0 : sa;
      fb[j] = db == 1 ? 0 : sb;
      sa *= da;
      sb *= db;
    }
    total = 1;
    for (int64_t d : out) total *= d;
    rank = 0;
    for (size_t j = 0; j < r; ++j) {
      if (out[j] == 1) continue;
      if (rank > 0 && stride_a[rank - 1] == fa[j] * out[j] && stride_b[rank - 1] == fb[j] * out[j]) {
        dims[rank - 1] *= out[j];
        stride_a[rank - 1] = fa[j];
        stride_b[rank - 1] = fb[j];
      } else {
        dims[rank] = out[j];
        stride_a[rank] = fa[j];
        stride_b[rank] = fb[j];
        ++rank;
      }
    }
    if (rank == 0) {  // a single element
      dims[0] = 1;
      stride_a[0] = stride_b[0] = 1;
      rank = 1;
    }
    return true;
  }

  // Short runs of a repeated pattern against a contiguous operand (an NHWC image minus a per-channel mean: runs of 3,
  // one call per pixel) cost a row call per few elements. Where one input repeats its innermost run on every row of
  // the next dim and the other is contiguous across those rows, `k` rows are merged into one of k * inner elements
  // and the repeating input (one run for the whole tensor) is read from `tile` (its run copied k times, at most
  // kMaxTile floats). Returns which input now reads the tile (0: none, 1: a, 2: b).
  static constexpr int64_t kMaxTile = 1024;
  int Widen(const float* a, const float* b, float* tile) {
    if (rank < 2) return 0;
    const int64_t inner = dims[rank - 1], outer = dims[rank - 2];
    if (inner >= 64) return 0;
    int which = 0;
    if (stride_a[rank - 1] == 1 && stride_a[rank - 2] == inner && stride_b[rank - 1] == 1 && stride_b[rank - 2] == 0)
      which = 2;
    else if (stride_b[rank - 1] == 1 && stride_b[rank - 2] == inner && stride_a[rank - 1] == 1 &&
             stride_a[rank - 2] == 0)
      which = 1;
    if (which == 0) return 0;
    const auto& pattern_strides = which == 2 ? stride_b : stride_a;
    for (int d = 0; d < rank - 2; ++d)
      if (pattern_strides[d] != 0) return 0;  // a different pattern per outer index
    int64_t k = 1;  // the largest divisor of `outer` with k * inner <= kMaxTile
    for (int64_t d = std::min<int64_t>(outer, kMaxTile / inner); d > 1; --d)
      if (outer % d == 0) {
        k = d;
        break;
      }
    if (k == 1) return 0;
    const float* pattern = which == 2 ? b : a;
    for (int64_t i = 0; i < k; ++i) std::copy(pattern, pattern + inner, tile + i * inner);
    dims[rank - 2] = outer / k;
    dims[rank - 1] = k * inner;
    (which == 2 ? stride_a : stride_b)[rank - 2] = k * inner;
    return which;
  }

  // Runs shorter than this are done a block of rows per call.
  static constexpr int64_t kShortRun = 16;

  // Output runs [first, last) of `inner` elements each, starting at element `skip` of the first and `take` of each.
  void RunRows(BinaryOp op, const float* a, const float* b, float* y, int64_t first, int64_t last, int64_t skip,
               int64_t take) const {
    const int64_t inner = dims[rank - 1];
    const int64_t ia = stride_a[rank - 1], ib = stride_b[rank - 1];
    std::array<int64_t, kMaxRank> counter{};
    int64_t oa = 0, ob = 0;
    int64_t rem = first;
    for (int d = rank - 2; d >= 0; --d) {
      counter[d] = rem % dims[d];
      rem /= dims[d];
      oa += counter[d] * stride_a[d];
      ob += counter[d] * stride_b[d];
    }
    auto next = [&](int from) {  // the next row, counting from dim `from` down
      for (int d = from; d >= 0; --d) {
        if (++counter[d] < dims[d]) {
          oa += stride_a[d];
          ob += stride_b[d];
          break;
        }
        counter[d] = 0;
        oa -= stride_a[d] * (dims[d] - 1);
        ob -= stride_b[d] * (dims[d] - 1);
      }
    };
    if (inner < kShortRun && rank >= 2) {  // rows along dim rank - 2 in one call (take == inner: short runs)
      const int64_t span = dims[rank - 2], ra = stride_a[rank - 2], rb = stride_b[rank - 2];
      for (int64_t row = first; row < last;) {
        const int64_t m = std::min(last - row, span - counter[rank - 2]);
        BinaryRows(op, a + oa, ia, ra, b + ob, ib, rb, y + row * inner, inner, m);
        row += m;
        counter[rank - 2] += m - 1;  // the last row of the block, then one more
        oa += (m - 1) * ra;
        ob += (m - 1) * rb;
        next(rank - 2);
      }
      return;
    }
    for (int64_t row = first; row < last; ++row) {
      BinaryRow(op, a + oa + skip * ia, ia, b + ob + skip * ib, ib, y + row * inner + skip, take);
      next(rank - 2);
    }
  }
};

// ---------------------------------------------------------------------------------------------------------------
// Kernels.

class UnaryKernel final : public Kernel {
 public:
  UnaryKernel(const UnaryTraits& traits, UnaryParams params, int num_threads, std::vector<UnaryParams> steps)
      : traits_(traits),
        params_(params),
        steps_(std::move(steps)),
        num_threads_(num_threads > 0 ? num_threads : omp_get_max_threads()) {}
  const char* Name() const override { return traits_.kernel_name; }

  void Run(KernelContext& ctx) override {
    const Tensor& in = ctx.In(0);
    Tensor& out = ctx.Out(0);
    OSPREY_CHECK(in.dtype() == DType::kF32 && out.dtype() == DType::kF32 && in.numel() == out.numel());
    const int64_t n = in.numel();
    if (n == 0) return;
    const float* x = in.data<float>();
    float* y = out.data<float>();
    const int threads = ThreadsFor(n, traits_.transcendental, num_threads_);
    const UnaryParams p = params_;
    if (threads == 1 && steps_.empty()) {
      UnaryRow(p, x, y, n);
      return;
    }
    // Fused steps follow block by block, while the block is in cache.
    const int64_t blocks = (n + kBlockElements - 1) / kBlockElements;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t begin = blk * kBlockElements, len = std::min(kBlockElements, n - begin);
      UnaryRow(p, x + begin, y + begin, len);
      ApplySteps(steps_, y + begin, len);
    }
  }

 private:
  const UnaryTraits& traits_;
  UnaryParams params_;
  std::vector<UnaryParams> steps_;  // fused steps (ops/activation.h), applied to each block after the op
  int num_threads_;
};

class BinaryKernel final : public Kernel {
 public:
  BinaryKernel(const BinaryTraits& traits, int num_threads, std::vector<UnaryParams> steps)
      : traits_(traits),
        steps_(std::move(steps)),
        num_threads_(num_threads > 0 ? num_threads : omp_get_max_threads()) {}
  const char* Name() const override { return traits_.kernel_name; }

  void Run(KernelContext& ctx) override {
    const Tensor& a = ctx.In(0);
    const Tensor& b = ctx.In(1);
    Tensor& out = ctx.Out(0);
    OSPREY_CHECK(a.dtype() == DType::kF32 && b.dtype() == DType::kF32 && out.dtype() == DType::kF32);
    BinaryPlan plan;
    if (!plan.Build(out.shape(), a.shape(), b.shape()))
      throw Error(ErrorCode::kInvalidArgument, ctx.node.Describe() + ": inputs of shapes " +
                                                   ShapeToString(a.shape()) + " and " + ShapeToString(b.shape()) +
                                                   " do not broadcast to " + ShapeToString(out.shape()));
    if (plan.total == 0) return;
    const float* pa = a.data<float>();
    const float* pb = b.data<float>();
    float* py = out.data<float>();
    alignas(64) float tile[BinaryPlan::kMaxTile];
    switch (plan.Widen(pa, pb, tile)) {
      case 1:
        pa = tile;
        break;
      case 2:
        pb = tile;
        break;
      default:
        break;
    }
    const BinaryOp op = traits_.op;
    const int64_t inner = plan.dims[plan.rank - 1];
    const int64_t rows = plan.total / inner;
    const int threads = ThreadsFor(plan.total, false, num_threads_);
    if (threads == 1 && steps_.empty()) {
      plan.RunRows(op, pa, pb, py, 0, rows, 0, inner);
      return;
    }
    // Units of about kBlockElements; fused steps follow unit by unit, while its output is in cache.
    if (inner >= kBlockElements) {
      // Long runs: each unit is a piece of one run.
      const int64_t pieces = (inner + kBlockElements - 1) / kBlockElements;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
      for (int64_t unit = 0; unit < rows * pieces; ++unit) {
        const int64_t row = unit / pieces, skip = (unit % pieces) * kBlockElements;
        const int64_t take = std::min(kBlockElements, inner - skip);
        plan.RunRows(op, pa, pb, py, row, row + 1, skip, take);
        ApplySteps(steps_, py + row * inner + skip, take);
      }
    } else {
      // Short runs: each unit is a block of whole runs.
      const int64_t rows_per_unit = std::max<int64_t>(1, kBlockElements / inner);
      const int64_t units = (rows + rows_per_unit - 1) / rows_per_unit;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
      for (int64_t unit = 0; unit < units; ++unit) {
        const int64_t first = unit * rows_per_unit, last = std::min(rows, first + rows_per_unit);
        plan.RunRows(op, pa, pb, py, first, last, 0, inner);
        ApplySteps(steps_, py + first * inner, (last - first) * inner);
      }
    }
  }

 private:
  const BinaryTraits& traits_;
  std::vector<UnaryParams> steps_;  // fused steps (ops/activation.h), applied to each unit's output after the op
  int num_threads_;
};

// A float32 scalar constant input, or false.
bool ScalarConstant(const KernelBuildContext& ctx, int i, float* value) {
  if (i >= static_cast<int>(ctx.input_values.size()) || ctx.input_values[i] == nullptr) return false;
  const Tensor& t = *ctx.input_values[i];
  if (t.dtype() != DType::kF32 || t.numel() != 1) return false;
  *value = t.data<float>()[0];
  return true;
}

bool AllF32(const KernelBuildContext& ctx, size_t num_inputs) {
  if (ctx.input_dtypes.size() < num_inputs || ctx.output_dtypes.size() != 1 || ctx.output_dtypes[0] != DType::kF32)
    return false;
  for (size_t i = 0; i < num_inputs; ++i)
    if (!ctx.present[i] || ctx.input_dtypes[i] != DType::kF32) return false;
  return true;
}

}  // namespace
}  // namespace osprey::cpu

namespace osprey {

using namespace cpu;  // NOLINT: the traits tables and kernels above

std::unique_ptr<Kernel> CreateElementwiseKernel(const KernelBuildContext& ctx) {
  const Node& node = ctx.node;
  if (!node.domain.empty()) return nullptr;
  std::vector<UnaryParams> steps;
  if (!StepParams(node, &steps)) return nullptr;
  for (const BinaryTraits& t : kBinary) {
    if (node.op_type != t.op_type) continue;
    if (ctx.input_dtypes.size() != 2 || !AllF32(ctx, 2)) return nullptr;
    if (ctx.output_shapes[0].size() > kMaxRank) return nullptr;
    return std::make_unique<BinaryKernel>(t, ctx.num_threads, std::move(steps));
  }
  for (const UnaryTraits& t : kUnary) {
    if (node.op_type != t.op_type) continue;
    if (!AllF32(ctx, 1)) return nullptr;
    UnaryParams p{t.op};
    switch (t.op) {
      case UnaryOp::kLeakyRelu:
        p.alpha = node.GetFloat("alpha", kLeakyReluAlpha);
        break;
      case UnaryOp::kHardSigmoid:
        p.alpha = node.GetFloat("alpha", kHardSigmoidAlpha);
        p.beta = node.GetFloat("beta", kHardSigmoidBeta);
        break;
      case UnaryOp::kElu:
      case UnaryOp::kCelu:
        p.alpha = node.GetFloat("alpha", 1.f);
        break;
      case UnaryOp::kSelu:
        p.alpha = node.GetFloat("alpha", kSeluAlpha);
        p.gamma = node.GetFloat("gamma", kSeluGamma);
        break;
      case UnaryOp::kGelu:
        if (node.GetString("approximate", "none") == "tanh") p.op = UnaryOp::kGeluTanh;
        break;
      case UnaryOp::kRound:
        if (ctx.input_dtypes.size() != 1) return nullptr;
        if (node.Has("_quant_scale")) {  // a fused QuantizeLinear -> DequantizeLinear pair (runtime/fusion_qdq.cc)
          p.op = UnaryOp::kFakeQuantize;
          p.gamma = node.GetFloat("_quant_scale", 1.f);
          p.alpha = node.GetFloat("_quant_lo", 0.f);
          p.beta = node.GetFloat("_quant_hi", 0.f);
          return std::make_unique<UnaryKernel>(kFakeQuantizeTraits, p, ctx.num_threads, std::move(steps));
        }
        break;
      case UnaryOp::kClip:
        p.alpha = std::numeric_limits<float>::lowest();
        p.beta = std::numeric_limits<float>::max();
        if (ctx.opset < 11) {
          p.alpha = node.GetFloat("min", p.alpha);
          p.beta = node.GetFloat("max", p.beta);
        } else {
          // Bounds must be constants (they are in every exported model); otherwise the reference kernel runs.
          for (int i = 1; i <= 2; ++i) {
            if (i >= static_cast<int>(ctx.present.size()) || !ctx.present[i]) continue;
            if (!ScalarConstant(ctx, i, i == 1 ? &p.alpha : &p.beta)) return nullptr;
          }
        }
        break;
      default:
        if (ctx.input_dtypes.size() != 1) return nullptr;
        break;
    }
    return std::make_unique<UnaryKernel>(t, p, ctx.num_threads, std::move(steps));
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------------------------------
// SiLU in place, for kernels that apply it to their own output (dnnl_conv.cc): oneDNN's swish post-op cost ~0.37 ns
// per element inside its convolutions on the 2-vCPU Zen 4 (a 1x1 16 -> 96 convolution on 112x112: 0.20 ms without,
// 0.64 ms with it); this pass (silu_vector.h) costs ~0.16 ns per element there. AVX-512, or AVX2 + FMA.
namespace {

__attribute__((target("avx512f"))) void SiluAvx512(float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(x + i, mask, SiluVector(_mm512_maskz_loadu_ps(mask, x + i)));
  }
}

__attribute__((target("avx2,fma"))) void SiluAvx2(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, SiluVector(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i mask =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(x + i, mask, SiluVector(_mm256_maskload_ps(x + i, mask)));
  }
}

using SiluRowFn = void (*)(float*, int64_t);

// The pass for this CPU (null: none, the scalar loop); OSPREY_OWN_SILU=avx2 takes the AVX2 pass on an AVX-512 CPU
// (tests of that path).
SiluRowFn SiluRow() {
  static const SiluRowFn row = []() -> SiluRowFn {
    const char* e = std::getenv("OSPREY_OWN_SILU");
    if (__builtin_cpu_supports("avx512f") && !(e && std::string(e) == "avx2")) return SiluAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SiluAvx2;
    return nullptr;
  }();
  return row;
}

}  // namespace

// OSPREY_OWN_SILU=0 leaves SiLU to oneDNN's post-op in the plans compiled while it is set (for comparisons:
// bench/ab_switch).
bool FastSiluAvailable() {
  const char* e = std::getenv("OSPREY_OWN_SILU");
  return SiluRow() != nullptr && !(e && std::string(e) == "0");
}

namespace {

// fn(block, count) over data[0, n) in blocks of kBlock floats (whole 64-byte lines, enough to split well), on up to
// `threads` OpenMP threads from 2 * kBlock floats on: the passes kernels make over their own output. On one thread
// no parallel region is entered (kernels call it from inside theirs, on a piece each thread just wrote).
template <typename Fn>
void InPlaceBlocks(float* data, int64_t n, int threads, Fn fn) {
  constexpr int64_t kBlock = int64_t{1} << 14;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const int team = n >= 2 * kBlock ? std::max(threads, 1) : 1;
  if (team == 1) {
    for (int64_t b = 0; b < blocks; ++b) fn(data + b * kBlock, std::min(kBlock, n - b * kBlock));
    return;
  }
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) fn(data + b * kBlock, std::min(kBlock, n - b * kBlock));
}

}  // namespace

void GeluTanhInPlace(float* data, int64_t n, int threads) {
  const UnaryParams p{UnaryOp::kGeluTanh};
  InPlaceBlocks(data, n, threads, [&](float* y, int64_t m) { StepRow(p, y, m); });
}

void SiluInPlace(float* data, int64_t n, int threads) {
  const SiluRowFn row = SiluRow();
  if (row == nullptr) {
    for (int64_t i = 0; i < n; ++i) data[i] = data[i] / (1.f + vmath::Exp(-data[i]));
    return;
  }
  InPlaceBlocks(data, n, threads, row);
}

void ActivateInPlace(const Activation& act, float* data, int64_t n, int threads) {
  if (act.kind == ActivationKind::kNone) return;
  if (act.kind == ActivationKind::kSilu) return SiluInPlace(data, n, threads);
  // The activation as a fused step, vectorised; the formula where it has no fast form.
  UnaryParams p;
  if (!StepParamsOf(UnaryStep{false, act}, &p)) {
    InPlaceBlocks(data, n, threads, [&](float* y, int64_t m) { act.Apply(y, m); });
    return;
  }
  InPlaceBlocks(data, n, threads, [&](float* y, int64_t m) { StepRow(p, y, m); });
}

}  // namespace osprey
