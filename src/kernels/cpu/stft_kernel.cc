// STFT as one matrix product: each frame (a row of `frame_length` real points, or 2 x frame_length interleaved real
// and imaginary ones) times a constant basis whose columns are the window-weighted cosines and negated sines of each
// output bin, interleaved as the output's [bins, 2] is, so the product is the output, laid out. oneDNN's matmul
// (vectorised, threaded) runs it. O(n^2) per frame where an FFT is O(n log n), but for the frame lengths audio front
// ends use (Whisper's 400, 512) a GEMM at ~150 GFLOP/s beats a scalar FFT, and any length works (400 = 2^4 x 5^2 takes
// no radix-2 FFT). Built for frame lengths whose basis is at most 4 MiB (n <= ~700); longer frames, and frame_step or
// frame_length computed at run time, take the reference kernel (kernels/reference/signal.cc), which this one is
// tested against (tests/python/test_signal.py).
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "kernels/cpu/dnnl_common.h"
#include "ops/signal.h"

namespace osprey::cpu {
namespace {

constexpr int64_t kMaxBasisBytes = int64_t{4} << 20;
constexpr int64_t kChunkRows = 2048;

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
    if (depth * width * static_cast<int64_t>(sizeof(float)) > kMaxBasisBytes) return false;
    // basis[t * parts + c][2k + r]: input point t (c: its real or imaginary part) to bin k (r: real or imaginary)
    // of sum_t (a_t + i b_t) w_t (cos(2 pi k t / n) - i sin(2 pi k t / n)).
    basis_ = Tensor(DType::kF32, {depth, width});
    float* b = basis_.data<float>();
    for (int64_t t = 0; t < n; ++t) {
      const double w = window ? window->data<float>()[t] : 1.0;
      for (int64_t k = 0; k < p_.bins; ++k) {
        const double angle = 2.0 * M_PI * static_cast<double>((k * t) % n) / static_cast<double>(n);
        const float c = static_cast<float>(w * std::cos(angle)), s = static_cast<float>(w * std::sin(angle));
        b[(t * parts_) * width + 2 * k] = c;
        b[(t * parts_) * width + 2 * k + 1] = -s;
        if (parts_ == 2) {
          b[(t * parts_ + 1) * width + 2 * k] = s;
          b[(t * parts_ + 1) * width + 2 * k + 1] = c;
        }
      }
    }
    // Rows in chunks of at most kChunkRows (the frames' copy stays a few MB however long the signal: with a hop of 1
    // the frames hold n times the signal), a second product for the last, shorter chunk.
    rows_ = x_[0] * p_.frames;
    if (rows_ <= 0) return false;  // an empty batch: the reference kernel writes nothing
    chunk_ = std::min(rows_, kChunkRows);
    matmul_node_ = Node{};
    matmul_node_.op_type = "MatMul";
    matmul_node_.name = node.name + "/basis";
    auto product = [&](int64_t rows) {
      KernelBuildContext mc{matmul_node_, ctx.opset};
      mc.present = {true, true};
      mc.input_dtypes = {DType::kF32, DType::kF32};
      mc.input_shapes = {{rows, depth}, basis_.shape()};
      mc.input_values = {nullptr, &basis_};
      mc.output_dtypes = {DType::kF32};
      mc.output_shapes = {{rows, width}};
      mc.num_threads = ctx.num_threads;
      mc.tune = ctx.tune;
      mc.derive_weight = ctx.derive_weight;
      return CreateDnnlMatMul(mc);
    };
    matmul_ = product(chunk_);
    if (rows_ % chunk_ != 0) tail_matmul_ = product(rows_ % chunk_);
    threads_ = std::max(1, ctx.num_threads);
    return matmul_ != nullptr && (rows_ % chunk_ == 0 || tail_matmul_ != nullptr);
  }

  void Run(KernelContext& ctx) override {
    const Tensor& x = ctx.In(0);
    CheckShape(ctx.node, Name(), "signal", x, x_);
    const int64_t depth = p_.frame_length * parts_, length = x_[1], width = 2 * p_.bins;
    // Frames, one row each: copies of overlapping windows of the signal, a chunk at a time, in a buffer kept between
    // runs (a fresh one is mapped and faulted in each time: 4.8 MB for 30 s of Whisper's input cost 1.8 ms).
    Tensor frames = TakeFrames();
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
    GiveFrames(std::move(frames));
  }

 private:
  Shape x_;
  StftParams p_;
  int64_t parts_ = 1, rows_ = 0, chunk_ = 1;
  int threads_ = 1;
  Tensor basis_;
  Node matmul_node_;
  std::unique_ptr<Kernel> matmul_, tail_matmul_;  // chunk_ rows; the last rows_ % chunk_
  std::mutex frames_mu_;
  std::vector<Tensor> spare_frames_;  // one per concurrent run, at most 4 kept

  Tensor TakeFrames() {
    {
      std::lock_guard<std::mutex> lock(frames_mu_);
      if (!spare_frames_.empty()) {
        Tensor t = std::move(spare_frames_.back());
        spare_frames_.pop_back();
        return t;
      }
    }
    return Tensor(DType::kF32, {chunk_, p_.frame_length * parts_});
  }
  void GiveFrames(Tensor t) {
    std::lock_guard<std::mutex> lock(frames_mu_);
    if (spare_frames_.size() < 4) spare_frames_.push_back(std::move(t));
  }
};

}  // namespace

std::unique_ptr<Kernel> CreateStftKernel(const KernelBuildContext& ctx) {
  auto kernel = std::make_unique<StftGemmKernel>();
  if (!kernel->Build(ctx)) return nullptr;
  return kernel;
}

}  // namespace osprey::cpu
