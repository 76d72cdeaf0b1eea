// Transpose on plain tensors of any 1-, 2-, 4- or 8-byte dtype. The reference kernel walks the output with a strided
// index per element (~5 ns per element: magika's [512, 256] swap took 0.69 ms, as long as the layer norm and the head
// together). Here the permutation is first simplified at build time: dims of size 1 dropped, input dims that stay
// adjacent and in order merged. What is left is one of
//   - a copy (the permutation became the identity),
//   - whole rows moving (the innermost dim stays innermost): one memcpy per row,
//   - a batch of 2-D transposes: the input's innermost dim (contiguous reads) and the output's innermost dim
//     (contiguous writes) are swapped in 32 x 32 tiles, so each tile's reads and writes stay in the cache; the other
//     dims are walked outside the tiles.
// Work is split over the plan's threads by rows or tiles once the tensor is large enough to pay for a parallel region.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"

namespace osprey {
namespace {

constexpr int64_t kTile = 32;
constexpr int64_t kMinParallelBytes = int64_t{1} << 16;

// The permutation reduced: dims (input order) and, per output position, the input dim it takes.
struct Reduced {
  std::vector<int64_t> dims;  // input dims after dropping 1s and merging
  std::vector<int> perm;      // output dim i is input dim perm[i]
};

Reduced Reduce(const Shape& in, const std::vector<int64_t>& perm) {
  // Keep dims of size > 1, in output order, as input dim indices.
  std::vector<int64_t> order;
  for (int64_t p : perm)
    if (in[p] != 1) order.push_back(p);
  // Merge runs that are consecutive in the input too.
  std::vector<std::vector<int64_t>> groups;
  for (int64_t p : order) {
    if (!groups.empty() && groups.back().back() + 1 == p)
      groups.back().push_back(p);
    else
      groups.push_back({p});
  }
  // Number the groups in input order.
  std::vector<size_t> by_input(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) by_input[g] = g;
  std::sort(by_input.begin(), by_input.end(), [&](size_t a, size_t b) { return groups[a][0] < groups[b][0]; });
  Reduced r;
  std::vector<int> index_of(groups.size());
  for (size_t k = 0; k < by_input.size(); ++k) {
    int64_t size = 1;
    for (int64_t d : groups[by_input[k]]) size *= in[d];
    r.dims.push_back(size);
    index_of[by_input[k]] = static_cast<int>(k);
  }
  for (size_t g = 0; g < groups.size(); ++g) r.perm.push_back(index_of[g]);
  return r;
}

class TransposeKernel final : public Kernel {
 public:
  TransposeKernel(const Shape& in, const std::vector<int64_t>& perm, size_t element, int threads)
      : element_(element), threads_(std::max(1, threads)) {
    const Reduced r = Reduce(in, perm);
    total_ = 1;
    for (int64_t d : in) total_ *= d;
    const int n = static_cast<int>(r.dims.size());
    bool identity = true;
    for (int i = 0; i < n; ++i) identity = identity && r.perm[i] == i;
    if (n <= 1 || identity) {
      mode_ = Mode::kCopy;
      return;
    }
    // Input strides (elements) of the reduced dims, and output strides per input dim.
    std::vector<int64_t> in_stride(n), out_stride(n);
    int64_t s = 1;
    for (int d = n - 1; d >= 0; --d) {
      in_stride[d] = s;
      s *= r.dims[d];
    }
    s = 1;
    for (int i = n - 1; i >= 0; --i) {
      out_stride[r.perm[i]] = s;
      s *= r.dims[r.perm[i]];
    }
    const int in_inner = n - 1, out_inner = r.perm[n - 1];
    if (in_inner == out_inner) {
      mode_ = Mode::kRows;
      row_ = r.dims[in_inner];
      for (int d = 0; d < n; ++d)
        if (d != in_inner) outer_.push_back({r.dims[d], in_stride[d], out_stride[d]});
      return;
    }
    mode_ = Mode::kTiles;
    a_ = {r.dims[out_inner], in_stride[out_inner], 1};  // walks the output contiguously
    b_ = {r.dims[in_inner], 1, out_stride[in_inner]};   // walks the input contiguously
    for (int d = 0; d < n; ++d)
      if (d != in_inner && d != out_inner) outer_.push_back({r.dims[d], in_stride[d], out_stride[d]});
  }

  const char* Name() const override { return "TransposeCpu"; }

  void Run(KernelContext& ctx) override {
    const Tensor& in = ctx.In(0);
    Tensor& out = ctx.Out(0);
    if (in.numel() != total_ || out.numel() != total_)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": TransposeCpu was built for " +
                                            std::to_string(total_) + " elements, got " + std::to_string(in.numel()));
    switch (element_) {
      case 1: Dispatch<uint8_t>(in.raw(), out.raw()); break;
      case 2: Dispatch<uint16_t>(in.raw(), out.raw()); break;
      case 4: Dispatch<uint32_t>(in.raw(), out.raw()); break;
      default: Dispatch<uint64_t>(in.raw(), out.raw()); break;
    }
  }

 private:
  enum class Mode { kCopy, kRows, kTiles };
  struct Axis {
    int64_t size, in_stride, out_stride;
  };

  // Offsets of outer index `i` (a flat index over outer_, last fastest).
  void OuterOffsets(int64_t i, int64_t* in_off, int64_t* out_off) const {
    *in_off = *out_off = 0;
    for (size_t k = outer_.size(); k-- > 0;) {
      const int64_t idx = i % outer_[k].size;
      i /= outer_[k].size;
      *in_off += idx * outer_[k].in_stride;
      *out_off += idx * outer_[k].out_stride;
    }
  }

  int64_t OuterCount() const {
    int64_t c = 1;
    for (const Axis& a : outer_) c *= a.size;
    return c;
  }

  template <class T>
  void Dispatch(const void* src, void* dst) const {
    const T* x = static_cast<const T*>(src);
    T* y = static_cast<T*>(dst);
    const int parts = total_ * static_cast<int64_t>(element_) >= kMinParallelBytes ? threads_ : 1;
    if (mode_ == Mode::kCopy) {
      std::memcpy(y, x, static_cast<size_t>(total_) * sizeof(T));
      return;
    }
    const int64_t outer = OuterCount();
    if (mode_ == Mode::kRows) {
#pragma omp parallel for num_threads(parts) schedule(static) if (parts > 1)
      for (int64_t i = 0; i < outer; ++i) {
        int64_t in_off, out_off;
        OuterOffsets(i, &in_off, &out_off);
        std::memcpy(y + out_off, x + in_off, static_cast<size_t>(row_) * sizeof(T));
      }
      return;
    }
    const int64_t ta = (a_.size + kTile - 1) / kTile, tb = (b_.size + kTile - 1) / kTile;
    const int64_t units = outer * ta * tb;
#pragma omp parallel for num_threads(parts) schedule(static) if (parts > 1)
    for (int64_t u = 0; u < units; ++u) {
      const int64_t i = u / (ta * tb), a0 = (u / tb) % ta * kTile, b0 = u % tb * kTile;
      int64_t in_off, out_off;
      OuterOffsets(i, &in_off, &out_off);
      const int64_t a1 = std::min(a_.size, a0 + kTile), b1 = std::min(b_.size, b0 + kTile);
      for (int64_t b = b0; b < b1; ++b) {
        const T* src = x + in_off + b + a0 * a_.in_stride;
        T* dst = y + out_off + b * b_.out_stride + a0;
        for (int64_t a = 0; a < a1 - a0; ++a) dst[a] = src[a * a_.in_stride];
      }
    }
  }

  size_t element_;
  int threads_;
  int64_t total_ = 0, row_ = 1;
  Mode mode_ = Mode::kCopy;
  Axis a_{1, 1, 1}, b_{1, 1, 1};
  std::vector<Axis> outer_;
};

}  // namespace

std::unique_ptr<Kernel> CreateTransposeKernel(const KernelBuildContext& ctx) {
  if (ctx.input_shapes.size() != 1 || ctx.output_shapes.size() != 1 || ctx.input_dtypes.empty()) return nullptr;
  for (Layout l : ctx.input_layouts)
    if (l != Layout::kPlain) return nullptr;
  for (Layout l : ctx.output_layouts)
    if (l != Layout::kPlain) return nullptr;
  const Shape& in = ctx.input_shapes[0];
  const int64_t rank = static_cast<int64_t>(in.size());
  std::vector<int64_t> perm = ctx.node.GetInts("perm");
  if (!ctx.node.Has("perm"))
    for (int64_t d = rank - 1; d >= 0; --d) perm.push_back(d);
  if (static_cast<int64_t>(perm.size()) != rank) return nullptr;
  std::vector<char> seen(static_cast<size_t>(rank), 0);
  for (int64_t p : perm) {
    if (p < 0 || p >= rank || seen[p]) return nullptr;
    seen[p] = 1;
  }
  for (int64_t d : in)
    if (d < 0) return nullptr;
  const size_t element = DTypeSize(ctx.input_dtypes[0]);
  if (element != 1 && element != 2 && element != 4 && element != 8) return nullptr;
  return std::make_unique<TransposeKernel>(in, perm, element, ctx.num_threads);
}

}  // namespace osprey
