// DFT and STFT as one matrix product: each signal or frame (a row of n real points, or 2 x n interleaved real and
// imaginary ones) times a constant basis whose columns are the (window-weighted) cosines and signed sines of each
// output bin, interleaved as the output's [bins, 2] is, so the product is the output, laid out. oneDNN's matmul
// (vectorised, threaded) runs it. O(n^2) per row where an FFT is O(n log n), but for the lengths audio front ends use
// (Whisper's 400, 512) a GEMM at ~150 GFLOP/s beats a scalar FFT, and any length works (400 = 2^4 x 5^2 takes no
// radix-2 FFT). Built for bases of at most 4 MiB (n <= ~700 real points); longer transforms, sizes computed at run
// time or signals cut by dft_length take the reference kernels (kernels/reference/signal.cc), which these are tested
// against (tests/python/test_signal.py).
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/spare_pool.h"
#include "ops/signal.h"

namespace osprey::cpu {
namespace {

constexpr int64_t kMaxBasisBytes = int64_t{4} << 20;
constexpr int64_t kChunkRows = 2048;

// Whether a basis of depth x width floats fits kMaxBasisBytes (without forming the product: a dft_length from a model
// can make width large enough to wrap it).
bool BasisFits(int64_t depth, int64_t width) {
  return depth > 0 && width > 0 && depth <= kMaxBasisBytes / static_cast<int64_t>(sizeof(float)) / width;
}

// The basis [points x parts, 2 x bins] of an n-point transform of rows holding `points` (<= n) points of `parts` (1:
// real, 2: real and imaginary) values: row t * parts + c (input point t, c: its real or imaginary part) to column
// 2k + r (bin k, r: real or imaginary) of sum_t (a_t + i b_t) w_t e^(-+ 2 pi i k t / n), scaled by 1 / n when
// `inverse` (+). Built in double. `window`: w_t, null for 1.
Tensor Basis(int64_t n, int64_t points, int64_t bins, int64_t parts, const float* window, bool inverse) {
  const int64_t width = 2 * bins;
  const double sign = inverse ? 1.0 : -1.0, scale = inverse ? 1.0 / static_cast<double>(n) : 1.0;
  Tensor basis(DType::kF32, {points * parts, width});
  float* b = basis.data<float>();
  for (int64_t t = 0; t < points; ++t) {
    const double w = (window ? window[t] : 1.0) * scale;
    for (int64_t k = 0; k < bins; ++k) {
      const double angle = 2.0 * M_PI * static_cast<double>((k * t) % n) / static_cast<double>(n);
      const float c = static_cast<float>(w * std::cos(angle)), s = static_cast<float>(sign * w * std::sin(angle));
      b[(t * parts) * width + 2 * k] = c;  // (a + i b)(c + i s) = (ac - bs) + i(as + bc)
      b[(t * parts) * width + 2 * k + 1] = s;
      if (parts == 2) {
        b[(t * parts + 1) * width + 2 * k] = -s;
        b[(t * parts + 1) * width + 2 * k + 1] = c;
      }
    }
  }
  return basis;
}

// The basis [2 x size, n] of an inverse n-point transform from a one-sided spectrum (size = n / 2 + 1 bins, a_k + i
// b_k) to n real points: y_j = 1/n sum_t Re(X_t e^(2 pi i t j / n)) over the whole spectrum, whose other half is the
// conjugate of the given one (X_(n - k) = conj(X_k)); Re(conj(X) conj(w)) = Re(X w), so bin k counts twice where its
// mirror n - k is not given (1 <= k <= n - size) and once otherwise. Row 2k: a_k's weights, row 2k + 1: b_k's.
Tensor RealBasis(int64_t n, int64_t size) {
  Tensor basis(DType::kF32, {2 * size, n});
  float* b = basis.data<float>();
  for (int64_t k = 0; k < size; ++k) {
    const double weight = (k >= 1 && k <= n - size ? 2.0 : 1.0) / static_cast<double>(n);
    for (int64_t j = 0; j < n; ++j) {
      const double angle = 2.0 * M_PI * static_cast<double>((k * j) % n) / static_cast<double>(n);
      b[(2 * k) * n + j] = static_cast<float>(weight * std::cos(angle));  // Re((a + i b)(c + i s)) = ac - bs
      b[(2 * k + 1) * n + j] = static_cast<float>(-weight * std::sin(angle));
    }
  }
  return basis;
}

// oneDNN's matmul of `rows` rows times `basis` (null when it declines).
std::unique_ptr<Kernel> BasisProduct(const KernelBuildContext& ctx, const Node& node, int64_t rows,
                                     const Tensor& basis) {
  KernelBuildContext mc{node, ctx.opset};
  mc.present = {true, true};
  mc.input_dtypes = {DType::kF32, DType::kF32};
  mc.input_shapes = {{rows, basis.dim(0)}, basis.shape()};
  mc.input_values = {nullptr, &basis};
  mc.output_dtypes = {DType::kF32};
  mc.output_shapes = {{rows, basis.dim(1)}};
  mc.num_threads = ctx.num_threads;
  mc.tune = ctx.tune;
  mc.derive_weight = ctx.derive_weight;
  return CreateDnnlMatMul(mc);
}

// A float32 work buffer of `shape`, from `pool` or new.
Tensor TakeBuffer(SparePool<Tensor>& pool, const Shape& shape) {
  return pool.Take([&] { return Tensor(DType::kF32, shape); });
}

class StftGemmKernel final : public Kernel {
 public:
  const char* Name() const override { return "StftGemm"; }

  bool Build(const KernelBuildContext& ctx) {
    const Node& node = ctx.node;
    if (ctx.input_shapes.empty() || ctx.input_dtypes[0] != DType::kF32 ||
        (ctx.input_shapes[0].size() != 3 && ctx.input_shapes[0].size() != 2))
      return false;
    for (Layout l : ctx.input_layouts)
      if (l != Layout::kPlain) return false;
    auto constant = [&](size_t i) -> const Tensor* {
      return i < ctx.present.size() && ctx.present[i] && i < ctx.input_values.size() ? ctx.input_values[i] : nullptr;
    };
    const bool has_window = ctx.present.size() > 2 && ctx.present[2];
    const bool has_length = ctx.present.size() > 3 && ctx.present[3];
    const Tensor* step = constant(1);
    const Tensor* window = constant(2);
    const Tensor* frame_length = constant(3);
    if (step == nullptr || (has_window && window == nullptr) || (has_length && frame_length == nullptr)) return false;
    if (window && window->dtype() != DType::kF32) return false;
    x_ = ctx.input_shapes[0];
    const Shape window_shape = window ? window->shape() : Shape{};
    p_ = ResolveStft(node, x_, ctx.input_dtypes[0], *step, window ? &window_shape : nullptr, frame_length);
    parts_ = x_.size() == 3 ? x_[2] : 1;
    const int64_t n = p_.frame_length, depth = n * parts_, width = 2 * p_.bins;
    if (parts_ != 1 && parts_ != 2) return false;
    if (!BasisFits(depth, width)) return false;
    basis_ = Basis(n, n, p_.bins, parts_, window ? window->data<float>() : nullptr, /*inverse=*/false);
    // Rows in chunks of at most kChunkRows (the frames' copy stays a few MB however long the signal: with a hop of 1
    // the frames hold n times the signal), a second product for the last, shorter chunk.
    rows_ = x_[0] * p_.frames;
    if (rows_ <= 0) return false;  // an empty batch: the reference kernel writes nothing
    chunk_ = std::min(rows_, kChunkRows);
    matmul_node_ = Node{};
    matmul_node_.op_type = "MatMul";
    matmul_node_.name = node.name + "/basis";
    matmul_ = BasisProduct(ctx, matmul_node_, chunk_, basis_);
    if (rows_ % chunk_ != 0) tail_matmul_ = BasisProduct(ctx, matmul_node_, rows_ % chunk_, basis_);
    threads_ = std::max(1, ctx.num_threads);
    return matmul_ != nullptr && (rows_ % chunk_ == 0 || tail_matmul_ != nullptr);
  }

  void Run(KernelContext& ctx) override {
    const Tensor& x = ctx.In(0);
    CheckShape(ctx.node, Name(), "signal", x, x_);
    const int64_t depth = p_.frame_length * parts_, length = x_[1], width = 2 * p_.bins;
    // Frames, one row each: copies of overlapping windows of the signal, a chunk at a time, in a buffer kept between
    // runs.
    Tensor frames = TakeBuffer(frames_, {chunk_, depth});
    const float* in = x.data<float>();
    for (int64_t r0 = 0; r0 < rows_; r0 += chunk_) {  // the output [B, frames, bins, 2] is [rows, 2 x bins]
      const int64_t rows = std::min(chunk_, rows_ - r0);
      float* f = frames.data<float>();
#pragma omp parallel for num_threads(threads_) schedule(static) if (threads_ > 1 && rows * depth >= (1 << 16))
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t batch = (r0 + r) / p_.frames, frame = (r0 + r) % p_.frames;
        std::memcpy(f + r * depth, in + (batch * length + frame * p_.step) * parts_,
                    static_cast<size_t>(depth) * sizeof(float));
      }
      const Tensor a = Tensor::View(DType::kF32, {rows, depth}, frames.buffer(), frames.offset());
      Tensor y = Tensor::View(DType::kF32, {rows, width}, ctx.Out(0).buffer(),
                              ctx.Out(0).offset() + static_cast<size_t>(r0 * width) * sizeof(float));
      KernelContext mc{matmul_node_, ctx.opset};
      mc.inputs = {&a, &basis_};
      mc.outputs = {&y};
      (rows == chunk_ ? matmul_ : tail_matmul_)->Run(mc);
    }
    frames_.Give(std::move(frames));
  }

 private:
  Shape x_;
  StftParams p_;
  int64_t parts_ = 1, rows_ = 0, chunk_ = 1;
  int threads_ = 1;
  Tensor basis_;
  Node matmul_node_;
  std::unique_ptr<Kernel> matmul_, tail_matmul_;  // chunk_ rows; the last rows_ % chunk_
  SparePool<Tensor> frames_;
};

// DFT with its sizes constant: each signal a row times the basis (the input's points beyond the signal's size,
// dft_length's zero padding, need no basis rows). Along the dim just before the last (every signal a row of the
// input, as audio front ends frame them) the rows are read where they lie; along an axis with dims after it (rfft2's
// first axis, [outer, n, inner, parts]) the signals are gathered into rows first and the product's rows scattered to
// [outer, bins, inner, 2]: two copies, against the n^2 products. From a one-sided spectrum back to real points
// (inverse and onesided: irfft) the basis folds in the spectrum's conjugate half and gives [.., n, .., 1].
class DftGemmKernel final : public Kernel {
 public:
  const char* Name() const override { return "DftGemm"; }

  bool Build(const KernelBuildContext& ctx) {
    if (ctx.input_shapes.empty() || ctx.input_dtypes[0] != DType::kF32 || ctx.input_shapes[0].size() < 2) return false;
    for (Layout l : ctx.input_layouts)
      if (l != Layout::kPlain) return false;
    auto given = [&](size_t i) { return i < ctx.present.size() && ctx.present[i]; };
    auto constant = [&](size_t i) -> const Tensor* {
      return given(i) && i < ctx.input_values.size() ? ctx.input_values[i] : nullptr;
    };
    const int axis_input = ctx.opset >= 20 ? 2 : -1;
    if ((given(1) && constant(1) == nullptr) || (axis_input > 0 && given(axis_input) && !constant(axis_input)))
      return false;
    // An empty size input means "omitted" to the reference kernel as well.
    auto optional = [&](int i) -> const Tensor* {
      const Tensor* t = i > 0 ? constant(static_cast<size_t>(i)) : nullptr;
      return t && t->numel() > 0 ? t : nullptr;
    };
    x_ = ctx.input_shapes[0];
    const DftParams p = ResolveDft(ctx.node, ctx.opset, x_, ctx.input_dtypes[0], optional(1), optional(axis_input));
    const int64_t rank = static_cast<int64_t>(x_.size()), parts = x_.back(), size = x_[p.axis];
    if (p.axis > rank - 2 || size > p.length || (parts != 1 && parts != 2)) return false;
    if (p.complex_to_real && parts != 2) return false;
    out_parts_ = p.complex_to_real ? 1 : 2;  // complex to real: n real points, no imaginary parts
    const int64_t depth = size * parts, width = out_parts_ * p.bins;
    if (!BasisFits(depth, width)) return false;
    outer_ = 1, inner_ = 1;
    for (int64_t i = 0; i < p.axis; ++i) outer_ *= x_[i];
    for (int64_t i = p.axis + 1; i < rank - 1; ++i) inner_ *= x_[i];
    rows_ = outer_ * inner_;
    if (rows_ <= 0 || depth == 0) return false;  // nothing to transform: the reference kernel writes what is due
    size_ = size, parts_ = parts, bins_ = p.bins;
    threads_ = std::max(1, ctx.num_threads);
    basis_ = p.complex_to_real ? RealBasis(p.length, size) : Basis(p.length, size, p.bins, parts, nullptr, p.inverse);
    matmul_node_.op_type = "MatMul";
    matmul_node_.name = ctx.node.name + "/basis";
    matmul_ = BasisProduct(ctx, matmul_node_, rows_, basis_);
    return matmul_ != nullptr;
  }

  void Run(KernelContext& ctx) override {
    const Tensor& x = ctx.In(0);
    CheckShape(ctx.node, Name(), "input", x, x_);
    const int64_t depth = basis_.dim(0), width = basis_.dim(1);
    KernelContext mc{matmul_node_, ctx.opset};
    if (inner_ == 1) {
      const Tensor a = Tensor::View(DType::kF32, {rows_, depth}, x.buffer(), x.offset());
      Tensor y = Tensor::View(DType::kF32, {rows_, width}, ctx.Out(0).buffer(), ctx.Out(0).offset());
      mc.inputs = {&a, &basis_};
      mc.outputs = {&y};
      matmul_->Run(mc);
      return;
    }
    // Row (o, i) holds signal [o, :, i, :]; the product's row (o, i) goes to [o, :, i, :] of the output.
    Tensor a = TakeBuffer(rows_in_, {rows_, depth}), y = TakeBuffer(rows_out_, {rows_, width});
    const float* in = x.data<float>();
    float* rows = a.data<float>();
    const bool parallel = threads_ > 1 && rows_ * depth >= (1 << 16);
#pragma omp parallel for num_threads(threads_) schedule(static) if (parallel)
    for (int64_t r = 0; r < rows_; ++r) {
      const int64_t o = r / inner_, i = r % inner_;
      for (int64_t t = 0; t < size_; ++t)
        for (int64_t c = 0; c < parts_; ++c)
          rows[r * depth + t * parts_ + c] = in[((o * size_ + t) * inner_ + i) * parts_ + c];
    }
    mc.inputs = {&a, &basis_};
    mc.outputs = {&y};
    matmul_->Run(mc);
    const float* products = y.data<float>();
    float* out = ctx.Out(0).data<float>();
#pragma omp parallel for num_threads(threads_) schedule(static) if (parallel)
    for (int64_t r = 0; r < rows_; ++r) {
      const int64_t o = r / inner_, i = r % inner_;
      for (int64_t k = 0; k < bins_; ++k)
        std::memcpy(out + ((o * bins_ + k) * inner_ + i) * out_parts_, products + r * width + out_parts_ * k,
                    static_cast<size_t>(out_parts_) * sizeof(float));
    }
    rows_in_.Give(std::move(a));
    rows_out_.Give(std::move(y));
  }

 private:
  Shape x_;
  int64_t rows_ = 0, outer_ = 1, inner_ = 1, size_ = 0, parts_ = 1, bins_ = 0, out_parts_ = 2;
  int threads_ = 1;
  Tensor basis_;
  Node matmul_node_;
  std::unique_ptr<Kernel> matmul_;
  SparePool<Tensor> rows_in_, rows_out_;  // inner axes: the gathered signals and the products, kept between runs
};

}  // namespace

std::unique_ptr<Kernel> CreateStftKernel(const KernelBuildContext& ctx) {
  auto kernel = std::make_unique<StftGemmKernel>();
  if (!kernel->Build(ctx)) return nullptr;
  return kernel;
}

std::unique_ptr<Kernel> CreateDftKernel(const KernelBuildContext& ctx) {
  auto kernel = std::make_unique<DftGemmKernel>();
  if (!kernel->Build(ctx)) return nullptr;
  return kernel;
}

}  // namespace osprey::cpu
