// A convolution of one input channel along one axis under a few filters: a FIR filter bank, as audio resamplers are
// exported (onnx-asr's and torchaudio's polyphase resamplers: a [N, 1, L] or [N, 1, 1, L] signal, 1-8 filters of K
// taps, a stride). Each output is the dot product of K contiguous samples with a filter. oneDNN runs such a
// convolution as im2col + GEMM (a 48 -> 8 kHz resampler, 8001 outputs x 80 taps: 0.25 ms); this reads the signal in
// place. Filter banks wider than kMaxFilters (Whisper's STFT as a 402-filter Conv1d) stay on oneDNN's GEMM, which is
// the better product there. Tested against the reference kernel (tests/unit/kernels/fir_conv_test.cc).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "kernels/cpu/dnnl_common.h"
#include "ops/conv_window.h"

namespace osprey::cpu {
namespace {

constexpr int64_t kMaxFilters = 8;
constexpr int64_t kChunk = 512;                         // outputs per parallel task
constexpr int64_t kMinParallelWork = int64_t{1} << 16;  // multiply-adds below which one thread runs it

__attribute__((target("avx2,fma"))) float DotAvx2(const float* x, const float* w, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(w + i + 8), a1);
  }
  if (i + 8 <= n) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i), a0);
    i += 8;
  }
  a0 = _mm256_add_ps(a0, a1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  float sum = _mm_cvtss_f32(s);
  for (; i < n; ++i) sum += x[i] * w[i];
  return sum;
}

float DotPlain(const float* x, const float* w, int64_t n) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * w[i];
  return sum;
}

class FirConvKernel final : public Kernel {
 public:
  const char* Name() const override { return "FirConvF32"; }

  bool Build(const KernelBuildContext& ctx) {
    const Node& node = ctx.node;
    if (node.Has("_residual") || node.Has("_int8") || node.Has("_dw_strides") || node.Has("_activation") ||
        node.GetInt("group", 1) != 1 || ctx.input_shapes.size() < 2 || ctx.output_shapes.size() != 1)
      return false;
    for (size_t i = 0; i < ctx.input_dtypes.size(); ++i)
      if (i < ctx.present.size() && ctx.present[i] && ctx.input_dtypes[i] != DType::kF32) return false;
    for (Layout l : ctx.input_layouts)
      if (l != Layout::kPlain) return false;
    const Shape& x = ctx.input_shapes[0];
    const Shape& w = ctx.input_shapes[1];
    const Tensor* weights = ctx.input_values.size() > 1 ? ctx.input_values[1] : nullptr;
    const size_t rank = x.size();
    if ((rank != 3 && rank != 4) || w.size() != rank || x[1] != 1 || w[1] != 1 || w[0] < 1 || w[0] > kMaxFilters ||
        weights == nullptr || x[0] < 1 || x.back() < 1)
      return false;
    if (rank == 4 && (x[2] != 1 || w[2] != 1)) return false;
    const std::vector<int64_t> kernel(w.begin() + 2, w.end());
    if (node.GetInts("kernel_shape", kernel) != kernel) return false;
    const ConvWindow win = ResolveConvWindow(node, x, kernel, /*ceil_mode=*/false);
    const size_t a = rank - 3;  // the signal's axis among the spatial ones
    if (win.dilations[a] != 1 || win.pad_begin[a] < 0 || win.pad_end[a] < 0 || win.out[a] < 1) return false;
    if (rank == 4 && (win.out[0] != 1 || win.pad_begin[0] != 0 || win.pad_end[0] != 0)) return false;
    const Shape want = rank == 4 ? Shape{x[0], w[0], 1, win.out[a]} : Shape{x[0], w[0], win.out[a]};
    if (ctx.output_shapes[0] != want) return false;
    has_bias_ = ctx.present.size() > 2 && ctx.present[2];
    if (has_bias_ && ctx.input_shapes[2] != Shape{w[0]}) return false;
    batch_ = x[0], length_ = x.back(), filters_ = w[0], taps_ = w.back(), out_ = win.out[a];
    stride_ = win.strides[a], pad_ = win.pad_begin[a];
    weights_ = *weights;  // the constant's buffer, shared (a long filter is not copied)
    threads_ = std::max(1, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads());
    static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    dot_ = avx2 ? DotAvx2 : DotPlain;
    return true;
  }

  void Run(KernelContext& ctx) override {
    const Tensor& x = ctx.In(0);
    if (x.dim(0) != batch_ || x.numel() != batch_ * length_ || ctx.Out(0).numel() != batch_ * filters_ * out_)
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": FirConvF32 was built for other shapes");
    const float* in = x.data<float>();
    const float* bias = has_bias_ ? ctx.In(2).data<float>() : nullptr;
    float* y = ctx.Out(0).data<float>();
    const int64_t chunks = (out_ + kChunk - 1) / kChunk, tasks = batch_ * filters_ * chunks;
    const bool parallel = threads_ > 1 && tasks > 1 && batch_ * filters_ * out_ * taps_ >= kMinParallelWork;
#pragma omp parallel for num_threads(threads_) schedule(static) if (parallel)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t row = task / chunks, n = row / filters_, m = row % filters_;
      const int64_t o0 = (task % chunks) * kChunk, o1 = std::min(out_, o0 + kChunk);
      const float* signal = in + n * length_;
      const float* filter = weights_.data<float>() + m * taps_;
      const float b = bias ? bias[m] : 0.f;
      float* dst = y + row * out_;
      for (int64_t o = o0; o < o1; ++o) {
        // Taps [t0, t1) of the window starting at `start` fall on the signal; the rest on the zero padding.
        const int64_t start = o * stride_ - pad_;
        const int64_t t0 = std::max<int64_t>(0, -start), t1 = std::min(taps_, length_ - start);
        dst[o] = b + (t1 > t0 ? dot_(signal + start + t0, filter + t0, t1 - t0) : 0.f);
      }
    }
  }

 private:
  int64_t batch_ = 0, length_ = 0, filters_ = 0, taps_ = 0, out_ = 0, stride_ = 1, pad_ = 0;
  bool has_bias_ = false;
  int threads_ = 1;
  Tensor weights_;  // [filters, 1, (1,) taps]
  float (*dot_)(const float*, const float*, int64_t) = DotPlain;
};

}  // namespace

std::unique_ptr<Kernel> CreateFirConv(const KernelBuildContext& ctx) {
  auto kernel = std::make_unique<FirConvKernel>();
  if (!kernel->Build(ctx)) return nullptr;
  return kernel;
}

}  // namespace osprey::cpu
