// A convolution along one axis whose every output row reads one input row: a FIR filter bank (one input channel,
// 1-8 filters, as audio resamplers are exported: onnx-asr's and torchaudio's polyphase resamplers, a [N, 1, L] or
// [N, 1, 1, L] signal, filters of K taps, a stride) or a depthwise convolution (group = channels, one filter per
// channel: Silero VAD's, conformer encoders' and TCNs' 1-D depthwise layers). Each output is the dot product of K
// samples with a filter (taps d samples apart at dilation d, stride 1 only), read in place. oneDNN runs the bank as
// im2col + GEMM (a 48 -> 8 kHz resampler, 8001 outputs x 80 taps: 0.25 ms) and a depthwise 1-D convolution on plain
// [N, C, L] tensors as one small GEMM per channel (Silero VAD's 258 channels x 8 samples x 5 taps: 0.073 ms; a TCN's
// 128 channels x 1000 samples, dilation 8, batch 8: 2.5 ms, here 0.47). At stride 1 the outputs are vectorised (eight
// per register, one tap at a time); strided windows are dot products. Filter banks wider than kMaxFilters (Whisper's
// STFT as a 402-filter Conv1d) stay on oneDNN's GEMM, the better product there. A fused activation is applied per
// chunk. Tested against the reference kernel (tests/unit/kernels/fir_conv_test.cc).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "kernels/cpu/dnnl_common.h"
#include "ops/activation.h"
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

// Stride 1, windows wholly inside the signal: y[i] = b + sum_t w[t] x[i + t * d] for i in [0, n), 32 outputs at a
// time in four registers (independent FMA chains), then 8, then one by one.
__attribute__((target("avx2,fma"))) void Stride1Avx2(const float* x, const float* w, int64_t taps, int64_t d, float b,
                                                     float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 a0 = _mm256_set1_ps(b), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t t = 0; t < taps; ++t) {
      const __m256 wt = _mm256_broadcast_ss(w + t);
      const float* p = x + i + t * d;
      a0 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(p), a0);
      a1 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(p + 8), a1);
      a2 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(p + 16), a2);
      a3 = _mm256_fmadd_ps(wt, _mm256_loadu_ps(p + 24), a3);
    }
    _mm256_storeu_ps(y + i, a0);
    _mm256_storeu_ps(y + i + 8, a1);
    _mm256_storeu_ps(y + i + 16, a2);
    _mm256_storeu_ps(y + i + 24, a3);
  }
  for (; i + 8 <= n; i += 8) {
    __m256 a0 = _mm256_set1_ps(b);
    for (int64_t t = 0; t < taps; ++t)
      a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + t), _mm256_loadu_ps(x + i + t * d), a0);
    _mm256_storeu_ps(y + i, a0);
  }
  for (; i < n; ++i) {
    float sum = b;
    for (int64_t t = 0; t < taps; ++t) sum += w[t] * x[i + t * d];
    y[i] = sum;
  }
}

void Stride1Plain(const float* x, const float* w, int64_t taps, int64_t d, float b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float sum = b;
    for (int64_t t = 0; t < taps; ++t) sum += w[t] * x[i + t * d];
    y[i] = sum;
  }
}

class FirConvKernel final : public Kernel {
 public:
  const char* Name() const override { return "FirConvF32"; }

  bool Build(const KernelBuildContext& ctx) {
    const Node& node = ctx.node;
    if (node.Has("_residual") || node.Has("_int8") || node.Has("_dw_strides") || node.Has("_prelu") ||
        node.Has("_input_scale") || node.Has("_pool_kernel") || ctx.input_shapes.size() < 2 ||
        ctx.output_shapes.size() != 1)
      return false;
    Activation::FromFusedNode(node, &activation_);
    for (size_t i = 0; i < ctx.input_dtypes.size(); ++i)
      if (i < ctx.present.size() && ctx.present[i] && ctx.input_dtypes[i] != DType::kF32) return false;
    for (Layout l : ctx.input_layouts)
      if (l != Layout::kPlain) return false;
    for (Layout l : ctx.output_layouts)  // a [N, C, 1, W] output stored channels-last is [N, 1, W, C]
      if (l != Layout::kPlain) return false;
    const Shape& x = ctx.input_shapes[0];
    const Shape& w = ctx.input_shapes[1];
    const Tensor* weights = ctx.input_values.size() > 1 ? ctx.input_values[1] : nullptr;
    const size_t rank = x.size();
    if ((rank != 3 && rank != 4) || w.size() != rank || w[1] != 1 || w[0] < 1 || weights == nullptr || x[0] < 1 ||
        x.back() < 1)
      return false;
    const int64_t group = node.GetInt("group", 1);
    depthwise_ = group > 1 && group == x[1] && w[0] == x[1];  // one filter per channel
    const bool bank = group == 1 && x[1] == 1 && w[0] <= kMaxFilters;
    if (!depthwise_ && !bank) return false;
    if (rank == 4 && (x[2] != 1 || w[2] != 1)) return false;
    const std::vector<int64_t> kernel(w.begin() + 2, w.end());
    if (node.GetInts("kernel_shape", kernel) != kernel) return false;
    const ConvWindow win = ResolveConvWindow(node, x, kernel, /*ceil_mode=*/false);
    const size_t a = rank - 3;  // the signal's axis among the spatial ones
    if ((win.dilations[a] != 1 && win.strides[a] != 1) || win.pad_begin[a] < 0 || win.pad_end[a] < 0 || win.out[a] < 1)
      return false;
    if (rank == 4 && (win.out[0] != 1 || win.pad_begin[0] != 0 || win.pad_end[0] != 0)) return false;
    const Shape want = rank == 4 ? Shape{x[0], w[0], 1, win.out[a]} : Shape{x[0], w[0], win.out[a]};
    if (ctx.output_shapes[0] != want) return false;
    has_bias_ = ctx.present.size() > 2 && ctx.present[2];
    if (has_bias_ && ctx.input_shapes[2] != Shape{w[0]}) return false;
    batch_ = x[0], channels_ = x[1], length_ = x.back(), filters_ = w[0], taps_ = w.back(), out_ = win.out[a];
    stride_ = win.strides[a], dilation_ = win.dilations[a], pad_ = win.pad_begin[a];
    weights_ = *weights;  // the constant's buffer, shared (a long filter is not copied)
    threads_ = std::max(1, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads());
    static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    dot_ = avx2 ? DotAvx2 : DotPlain;
    stride1_ = avx2 ? Stride1Avx2 : Stride1Plain;
    return true;
  }

  void Run(KernelContext& ctx) override {
    const Tensor& x = ctx.In(0);
    if (x.dim(0) != batch_ || x.numel() != batch_ * channels_ * length_ ||
        ctx.Out(0).numel() != batch_ * filters_ * out_)
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
      const float* signal = in + (depthwise_ ? row : n) * length_;
      const float* filter = weights_.data<float>() + m * taps_;
      const float b = bias ? bias[m] : 0.f;
      float* dst = y + row * out_;
      if (stride_ == 1) {
        // The samples the chunk's windows read, padding included, copied once; then vectorised across outputs.
        thread_local std::vector<float> window;
        const int64_t first = o0 - pad_, count = o1 - o0 + (taps_ - 1) * dilation_;
        window.assign(count, 0.f);
        const int64_t lo = std::max<int64_t>(first, 0), hi = std::min(first + count, length_);
        if (hi > lo) std::copy(signal + lo, signal + hi, window.begin() + (lo - first));
        stride1_(window.data(), filter, taps_, dilation_, b, dst + o0, o1 - o0);
      } else {
        for (int64_t o = o0; o < o1; ++o) {
          // Taps [t0, t1) of the window starting at `start` fall on the signal; the rest on the zero padding.
          const int64_t start = o * stride_ - pad_;
          const int64_t t0 = std::max<int64_t>(0, -start), t1 = std::min(taps_, length_ - start);
          dst[o] = b + (t1 > t0 ? dot_(signal + start + t0, filter + t0, t1 - t0) : 0.f);
        }
      }
      if (activation_.kind != ActivationKind::kNone) activation_.Apply(dst + o0, o1 - o0);
    }
  }

 private:
  int64_t batch_ = 0, channels_ = 1, length_ = 0, filters_ = 0, taps_ = 0, out_ = 0, stride_ = 1, dilation_ = 1,
          pad_ = 0;
  bool has_bias_ = false, depthwise_ = false;
  Activation activation_;
  int threads_ = 1;
  Tensor weights_;  // [filters, 1, (1,) taps]
  float (*dot_)(const float*, const float*, int64_t) = DotPlain;
  void (*stride1_)(const float*, const float*, int64_t, int64_t, float, float*, int64_t) = Stride1Plain;
};

}  // namespace

std::unique_ptr<Kernel> CreateFirConv(const KernelBuildContext& ctx) {
  auto kernel = std::make_unique<FirConvKernel>();
  if (!kernel->Build(ctx)) return nullptr;
  return kernel;
}

}  // namespace osprey::cpu
