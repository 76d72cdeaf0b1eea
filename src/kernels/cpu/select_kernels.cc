// Where and the comparisons (Less, Greater, LessOrEqual, GreaterOrEqual, Equal) with numpy broadcasting: the masks of
// attention layers (Where(mask, scores, -inf) over [B, heads, T, T]), of audio front ends (Less(range, lengths),
// then Where) and of detectors' post-processing. The reference kernels walk every element through a general
// broadcast (0.33 ms for a [1, 12, 197, 197] mask); here the output is cut into rows as in elementwise_kernels.cc
// (dims of size 1 dropped, adjacent dims merged where every operand walks them alike) and each row runs a loop
// specialised for its operands' inner strides (0: one repeated value, 1: contiguous), compiled for AVX-512/AVX2/the
// baseline, split over threads for large outputs. Where moves elements of 1, 2, 4 or 8 bytes (any dtype); the
// comparisons read float32, int32 or int64 and write bool. Exact (tests/unit/kernels/select_test.cc).
#include <omp.h>

#include <array>
#include <cstring>
#include <memory>
#include <string>

#include "kernels/cpu/cpu_kernels.h"

namespace osprey {
namespace {

constexpr int kMaxRank = 8;
constexpr int64_t kMinParallelElements = int64_t{1} << 15;
constexpr int64_t kBlockElements = int64_t{1} << 13;  // elements per unit of parallel work

// K operands broadcast to the output: merged dims and per operand a stride (elements) per dim, 0 where broadcast.
template <int K>
struct Rows {
  int rank = 0;
  std::array<int64_t, kMaxRank> dims{};
  std::array<std::array<int64_t, kMaxRank>, K> stride{};
  int64_t total = 1;

  bool Build(const Shape& out, const std::array<Shape, K>& in) {
    const size_t r = out.size();
    if (r > static_cast<size_t>(kMaxRank)) return false;
    std::array<std::array<int64_t, kMaxRank>, K> full{};
    for (int k = 0; k < K; ++k) {
      if (in[k].size() > r) return false;
      int64_t s = 1;
      for (size_t j = r; j-- > 0;) {
        const int64_t d = j < r - in[k].size() ? 1 : in[k][j - (r - in[k].size())];
        if (d != out[j] && d != 1) return false;
        full[k][j] = d == 1 ? 0 : s;
        s *= d;
      }
    }
    total = 1;
    for (int64_t d : out) total *= d;
    rank = 0;
    for (size_t j = 0; j < r; ++j) {
      if (out[j] == 1) continue;
      bool merge = rank > 0;
      for (int k = 0; k < K && merge; ++k) merge = stride[k][rank - 1] == full[k][j] * out[j];
      if (merge) {
        dims[rank - 1] *= out[j];
        for (int k = 0; k < K; ++k) stride[k][rank - 1] = full[k][j];
      } else {
        dims[rank] = out[j];
        for (int k = 0; k < K; ++k) stride[k][rank] = full[k][j];
        ++rank;
      }
    }
    if (rank == 0) {
      dims[0] = 1;
      for (int k = 0; k < K; ++k) stride[k][0] = 1;
      rank = 1;
    }
    return true;
  }

  // row(offsets, out_offset, count) for elements [skip, skip + take) of output rows [first, last), each of
  // dims[rank - 1] elements; the offsets (per operand, elements) and out_offset already point at element `skip`.
  template <class F>
  void ForRows(int64_t first, int64_t last, int64_t skip, int64_t take, F row) const {
    std::array<int64_t, kMaxRank> counter{};
    std::array<int64_t, K> off{};
    int64_t rem = first;
    for (int d = rank - 2; d >= 0; --d) {
      counter[d] = rem % dims[d];
      rem /= dims[d];
      for (int k = 0; k < K; ++k) off[k] += counter[d] * stride[k][d];
    }
    const int64_t inner = dims[rank - 1];
    for (int64_t r = first; r < last; ++r) {
      std::array<int64_t, K> at = off;
      for (int k = 0; k < K; ++k) at[k] += skip * stride[k][rank - 1];
      row(at, r * inner + skip, take);
      for (int d = rank - 2; d >= 0; --d) {
        if (++counter[d] < dims[d]) {
          for (int k = 0; k < K; ++k) off[k] += stride[k][d];
          break;
        }
        counter[d] = 0;
        for (int k = 0; k < K; ++k) off[k] -= stride[k][d] * (dims[d] - 1);
      }
    }
  }

  // Units of about kBlockElements: pieces of one row when rows are long, else blocks of whole rows.
  template <class F>
  void Run(int threads, F row) const {
    const int64_t inner = dims[rank - 1], rows = total / inner;
    if (threads <= 1 || total < kMinParallelElements) {
      ForRows(0, rows, 0, inner, row);
      return;
    }
    if (inner >= kBlockElements) {
      const int64_t pieces = (inner + kBlockElements - 1) / kBlockElements;
#pragma omp parallel for num_threads(threads) schedule(static)
      for (int64_t unit = 0; unit < rows * pieces; ++unit) {
        const int64_t r = unit / pieces, skip = (unit % pieces) * kBlockElements;
        ForRows(r, r + 1, skip, std::min(kBlockElements, inner - skip), row);
      }
      return;
    }
    const int64_t per = std::max<int64_t>(1, kBlockElements / inner), units = (rows + per - 1) / per;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t unit = 0; unit < units; ++unit) ForRows(unit * per, std::min(rows, (unit + 1) * per), 0, inner, row);
  }
};

// ---- Where: out[i] = c[i * SC] ? x[i * SX] : y[i * SY], strides 0 or 1.
// Both values are read and blended through a mask (unsigned T), so the loop vectorises: a conditional read of x or y
// would not.
template <class T, int SC, int SX, int SY>
[[gnu::always_inline]] inline void SelectLoop(const uint8_t* c, const T* x, const T* y, T* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const T mask = static_cast<T>(0) - static_cast<T>(c[i * SC] != 0);
    out[i] = static_cast<T>((x[i * SX] & mask) | (y[i * SY] & static_cast<T>(~mask)));
  }
}

template <class T>
[[gnu::always_inline]] inline void SelectRowOf(const uint8_t* c, int64_t sc, const T* x, int64_t sx, const T* y,
                                               int64_t sy, T* out, int64_t n) {
  switch ((sc << 2) | (sx << 1) | sy) {
    case 7:
      return SelectLoop<T, 1, 1, 1>(c, x, y, out, n);
    case 6:
      return SelectLoop<T, 1, 1, 0>(c, x, y, out, n);
    case 5:
      return SelectLoop<T, 1, 0, 1>(c, x, y, out, n);
    case 4:
      return SelectLoop<T, 1, 0, 0>(c, x, y, out, n);
    case 3:
      return SelectLoop<T, 0, 1, 1>(c, x, y, out, n);
    case 2:
      return SelectLoop<T, 0, 1, 0>(c, x, y, out, n);
    case 1:
      return SelectLoop<T, 0, 0, 1>(c, x, y, out, n);
    default:
      return SelectLoop<T, 0, 0, 0>(c, x, y, out, n);
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void SelectRow(int bytes, const uint8_t* c, int64_t sc,
                                                                            const void* x, int64_t sx, const void* y,
                                                                            int64_t sy, void* out, int64_t n) {
  switch (bytes) {
    case 1:
      return SelectRowOf(c, sc, static_cast<const uint8_t*>(x), sx, static_cast<const uint8_t*>(y), sy,
                         static_cast<uint8_t*>(out), n);
    case 2:
      return SelectRowOf(c, sc, static_cast<const uint16_t*>(x), sx, static_cast<const uint16_t*>(y), sy,
                         static_cast<uint16_t*>(out), n);
    case 4:
      return SelectRowOf(c, sc, static_cast<const uint32_t*>(x), sx, static_cast<const uint32_t*>(y), sy,
                         static_cast<uint32_t*>(out), n);
    default:
      return SelectRowOf(c, sc, static_cast<const uint64_t*>(x), sx, static_cast<const uint64_t*>(y), sy,
                         static_cast<uint64_t*>(out), n);
  }
}

// ---- Comparisons: out[i] = a[i * SA] op b[i * SB] (0 or 1), strides 0 or 1.
enum class Compare { kLess, kGreater, kLessOrEqual, kGreaterOrEqual, kEqual };

template <class T, Compare kOp>
[[gnu::always_inline]] inline bool Holds(T a, T b) {
  if constexpr (kOp == Compare::kLess) return a < b;
  if constexpr (kOp == Compare::kGreater) return a > b;
  if constexpr (kOp == Compare::kLessOrEqual) return a <= b;
  if constexpr (kOp == Compare::kGreaterOrEqual) return a >= b;
  return a == b;
}

template <class T, Compare kOp>
[[gnu::always_inline]] inline void CompareRowOf(const T* a, int64_t sa, const T* b, int64_t sb, uint8_t* out,
                                                int64_t n) {
  if (sa == 1 && sb == 1) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = Holds<T, kOp>(a[i], b[i]);
  } else if (sa == 1) {
    const T v = b[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = Holds<T, kOp>(a[i], v);
  } else if (sb == 1) {
    const T v = a[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = Holds<T, kOp>(v, b[i]);
  } else {
    std::memset(out, Holds<T, kOp>(a[0], b[0]) ? 1 : 0, static_cast<size_t>(n));
  }
}

template <class T>
[[gnu::always_inline]] inline void CompareRowTyped(Compare op, const void* a, int64_t sa, const void* b, int64_t sb,
                                                   uint8_t* out, int64_t n) {
  const T* pa = static_cast<const T*>(a);
  const T* pb = static_cast<const T*>(b);
  switch (op) {
    case Compare::kLess:
      return CompareRowOf<T, Compare::kLess>(pa, sa, pb, sb, out, n);
    case Compare::kGreater:
      return CompareRowOf<T, Compare::kGreater>(pa, sa, pb, sb, out, n);
    case Compare::kLessOrEqual:
      return CompareRowOf<T, Compare::kLessOrEqual>(pa, sa, pb, sb, out, n);
    case Compare::kGreaterOrEqual:
      return CompareRowOf<T, Compare::kGreaterOrEqual>(pa, sa, pb, sb, out, n);
    case Compare::kEqual:
      return CompareRowOf<T, Compare::kEqual>(pa, sa, pb, sb, out, n);
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void CompareRow(DType dtype, Compare op, const void* a,
                                                                             int64_t sa, const void* b, int64_t sb,
                                                                             uint8_t* out, int64_t n) {
  switch (dtype) {
    case DType::kF32:
      return CompareRowTyped<float>(op, a, sa, b, sb, out, n);
    case DType::kI32:
      return CompareRowTyped<int32_t>(op, a, sa, b, sb, out, n);
    default:
      return CompareRowTyped<int64_t>(op, a, sa, b, sb, out, n);
  }
}

class WhereKernel final : public Kernel {
 public:
  WhereKernel(int bytes, int threads) : bytes_(bytes), threads_(threads) {}
  const char* Name() const override { return "WhereFast"; }
  void Run(KernelContext& ctx) override {
    Rows<3> plan;
    if (!plan.Build(ctx.Out(0).shape(), {ctx.In(0).shape(), ctx.In(1).shape(), ctx.In(2).shape()}))
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": WhereFast: inputs do not broadcast to the output");
    if (plan.total == 0) return;
    const auto* c = static_cast<const uint8_t*>(ctx.In(0).raw());
    const char* x = static_cast<const char*>(ctx.In(1).raw());
    const char* y = static_cast<const char*>(ctx.In(2).raw());
    char* out = static_cast<char*>(ctx.Out(0).raw());
    const int r = plan.rank - 1, b = bytes_;
    plan.Run(threads_, [&](const std::array<int64_t, 3>& off, int64_t o, int64_t n) {
      SelectRow(b, c + off[0], plan.stride[0][r], x + off[1] * b, plan.stride[1][r], y + off[2] * b, plan.stride[2][r],
                out + o * b, n);
    });
  }

 private:
  int bytes_, threads_;
};

class CompareKernel final : public Kernel {
 public:
  CompareKernel(const char* name, Compare op, DType dtype, int threads)
      : name_(name), op_(op), dtype_(dtype), threads_(threads) {}
  const char* Name() const override { return name_; }
  void Run(KernelContext& ctx) override {
    Rows<2> plan;
    if (!plan.Build(ctx.Out(0).shape(), {ctx.In(0).shape(), ctx.In(1).shape()}))
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + name_ + ": inputs do not broadcast to the output");
    if (plan.total == 0) return;
    const char* a = static_cast<const char*>(ctx.In(0).raw());
    const char* b = static_cast<const char*>(ctx.In(1).raw());
    auto* out = static_cast<uint8_t*>(ctx.Out(0).raw());
    const int r = plan.rank - 1;
    const int64_t es = static_cast<int64_t>(DTypeSize(dtype_));
    plan.Run(threads_, [&](const std::array<int64_t, 2>& off, int64_t o, int64_t n) {
      CompareRow(dtype_, op_, a + off[0] * es, plan.stride[0][r], b + off[1] * es, plan.stride[1][r], out + o, n);
    });
  }

 private:
  const char* name_;
  Compare op_;
  DType dtype_;
  int threads_;
};

struct CompareTraits {
  const char* op_type;
  Compare op;
  const char* kernel_name;
};
constexpr CompareTraits kCompares[] = {
    {"Less", Compare::kLess, "LessFast"},
    {"Greater", Compare::kGreater, "GreaterFast"},
    {"LessOrEqual", Compare::kLessOrEqual, "LessOrEqualFast"},
    {"GreaterOrEqual", Compare::kGreaterOrEqual, "GreaterOrEqualFast"},
    {"Equal", Compare::kEqual, "EqualFast"},
};

// Broadcasting within kMaxRank dims, plain tensors only.
bool Fits(const KernelBuildContext& ctx, size_t inputs) {
  if (ctx.input_dtypes.size() != inputs || ctx.output_dtypes.size() != 1 || ctx.output_shapes.size() != 1 ||
      ctx.output_shapes[0].size() > static_cast<size_t>(kMaxRank))
    return false;
  for (size_t i = 0; i < inputs; ++i)
    if (i >= ctx.present.size() || !ctx.present[i] || ctx.InLayout(static_cast<int>(i)) != Layout::kPlain) return false;
  return ctx.OutLayout(0) == Layout::kPlain;
}

}  // namespace

std::unique_ptr<Kernel> CreateSelectKernel(const KernelBuildContext& ctx) {
  const Node& node = ctx.node;
  if (!node.domain.empty()) return nullptr;
  const int threads = std::max(1, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads());
  if (node.op_type == "Where") {
    if (!Fits(ctx, 3) || ctx.input_dtypes[0] != DType::kBool || ctx.input_dtypes[1] != ctx.input_dtypes[2] ||
        ctx.output_dtypes[0] != ctx.input_dtypes[1])
      return nullptr;
    const size_t bytes = DTypeSize(ctx.input_dtypes[1]);
    if (bytes != 1 && bytes != 2 && bytes != 4 && bytes != 8) return nullptr;
    return std::make_unique<WhereKernel>(static_cast<int>(bytes), threads);
  }
  for (const CompareTraits& t : kCompares) {
    if (node.op_type != t.op_type) continue;
    const DType d = ctx.input_dtypes.empty() ? DType::kF32 : ctx.input_dtypes[0];
    if (!Fits(ctx, 2) || ctx.input_dtypes[1] != d || ctx.output_dtypes[0] != DType::kBool ||
        (d != DType::kF32 && d != DType::kI32 && d != DType::kI64))
      return nullptr;
    return std::make_unique<CompareKernel>(t.kernel_name, t.op, d, threads);
  }
  return nullptr;
}

}  // namespace osprey
