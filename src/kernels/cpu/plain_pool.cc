// MaxPool / AveragePool on plain float32 [N, C, W], [N, C, H, W] and [N, C, D, H, W] tensors. oneDNN pools plain 1-D
// and 3-D data with a scalar loop per output ("simple_nchw": a MaxPool1d of [8, 128, 4000] 31 ms against ONNX
// Runtime's 3 ms; S3D's 3 x 3 x 3 pools of [480, 4, 14, 14] 30 ms each) and 2-D plain data only through reorders to
// channels-last and back; here each output row is computed from the input rows it reads: those rows (of the window's
// depth and height) combined into one (max or sum, contiguous), then each tap a pass over the row's outputs (at
// strides 1 and 2 the compiler vectorises the loads; AVX-512, AVX2 or the baseline, picked at start-up with GCC
// target_clones), the columns whose window leaves the input walked apart. Channels-last pools stay with oneDNN's jit
// kernels (dnnl_pool.cc), as do (u)int8 pools.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/thread_scratch.h"
#include "ops/conv_window.h"

namespace osprey::cpu {
namespace {

// One spatial axis of the window: output o reads input o * s - pad + t * d for taps t in [0, k) inside [0, in).
struct Axis {
  int64_t in = 1, out = 1, k = 1, s = 1, d = 1, pad = 0, pad_end = 0;
  // The taps [lo, hi) of output o that land in the input.
  void Taps(int64_t o, int64_t* lo, int64_t* hi) const { WindowTapsWithin(o * s - pad, k, d, in, lo, hi); }
  // Taps before the end of the declared padding (count_include_pad's divisor; ceil_mode's overhang is not counted).
  int64_t PaddedTaps(int64_t o) const {
    int64_t lo, hi;
    WindowTapsWithin(o * s - pad, k, d, in + pad_end, &lo, &hi);
    return hi;
  }
};

// acc[i] = row[i] (first) or acc[i] max/+ row[i], i < n: a window's rows combined into one before its taps are.
__attribute__((target_clones("avx512f", "avx2", "default"))) void CombineRow(const float* row, float* acc, int64_t n,
                                                                             bool max, bool first) {
  if (first) {
    std::copy(row, row + n, acc);
  } else if (max) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) acc[i] = acc[i] < row[i] ? row[i] : acc[i];
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) acc[i] += row[i];
  }
}

// y[o] = max (or sum) over taps t < k of src[o * s + t * d], o in [lo, hi): one pass over the outputs per tap, at a
// compile-time stride of 1 or 2 where it is one (the compiler then vectorises the loads), the first tap assigning.
template <int64_t S>
inline void Taps(const float* src, float* y, int64_t lo, int64_t hi, int64_t k, int64_t s, int64_t d, bool max) {
  const int64_t step = S > 0 ? S : s;
  for (int64_t t = 0; t < k; ++t) {
    const float* p = src + t * d;
    if (t == 0) {
#pragma omp simd
      for (int64_t o = lo; o < hi; ++o) y[o] = p[o * step];
    } else if (max) {
#pragma omp simd
      for (int64_t o = lo; o < hi; ++o) y[o] = y[o] < p[o * step] ? p[o * step] : y[o];
    } else {
#pragma omp simd
      for (int64_t o = lo; o < hi; ++o) y[o] += p[o * step];
    }
  }
}
__attribute__((target_clones("avx512f", "avx2", "default"))) void WindowRow(const float* src, float* y, int64_t lo,
                                                                            int64_t hi, int64_t k, int64_t s, int64_t d,
                                                                            bool max) {
  if (s == 1)
    Taps<1>(src, y, lo, hi, k, s, d, max);
  else if (s == 2)
    Taps<2>(src, y, lo, hi, k, s, d, max);
  else
    Taps<0>(src, y, lo, hi, k, s, d, max);
}

class PlainPoolKernel final : public Kernel {
 public:
  PlainPoolKernel(bool max, bool include_pad, int64_t planes, Axis d, Axis h, Axis w, int threads)
      : max_(max), planes_(planes), d_(d), h_(h), w_(w), threads_(threads) {
    // Outputs [w_lo_, w_hi_) have every tap inside the input.
    w_lo_ = std::min(w.out, (w.pad + w.s - 1) / w.s);
    const int64_t last_start = w.in - 1 - (w.k - 1) * w.d + w.pad;  // the last start whose window fits
    w_hi_ = last_start < 0 ? w_lo_ : std::max(w_lo_, std::min(w.out, last_start / w.s + 1));
    if (!max) {
      inv_w_.resize(static_cast<size_t>(w.out));
      for (int64_t o = 0; o < w.out; ++o) {
        int64_t lo, hi;
        w.Taps(o, &lo, &hi);
        inv_w_[o] = 1.f / static_cast<float>(include_pad ? w.PaddedTaps(o) : hi - lo);
      }
      for (auto [a, inv] : {std::pair{&d, &inv_d_}, std::pair{&h, &inv_h_}}) {
        inv->resize(static_cast<size_t>(a->out));
        for (int64_t o = 0; o < a->out; ++o) {
          int64_t lo, hi;
          a->Taps(o, &lo, &hi);
          (*inv)[o] = 1.f / static_cast<float>(include_pad ? a->PaddedTaps(o) : hi - lo);
        }
      }
    }
  }
  const char* Name() const override { return max_ ? "MaxPoolF32Rows" : "AveragePoolF32Rows"; }

  void Run(KernelContext& ctx) override {
    const float* xd = ctx.In(0).data<float>();
    float* yd = ctx.Out(0).data<float>();
    const int64_t rows = planes_ * d_.out * h_.out;
    // Taps inside the input, in double: a 3-D window's product of three axes over every output may pass 2^63.
    const double work = static_cast<double>(rows) * static_cast<double>(w_.out) *
                        static_cast<double>(std::min(d_.k, d_.in) * std::min(h_.k, h_.in) * std::min(w_.k, w_.in));
#pragma omp parallel num_threads(threads_) if (work >= 32768. && threads_ > 1)
    {
      float* tmp = reinterpret_cast<float*>(ThreadScratch::Reserve(static_cast<size_t>(w_.in) * sizeof(float)));
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t plane = r / (d_.out * h_.out), od = r / h_.out % d_.out, oh = r % h_.out;
        Row(xd + plane * d_.in * h_.in * w_.in, od, oh, yd + r * w_.out, tmp);
      }
    }
  }

 private:
  // Output row (od, oh) of one plane: the window's input rows combined into `tmp` (one row: read in place), then the
  // taps along it; y = their max (or mean).
  void Row(const float* x, int64_t od, int64_t oh, float* y, float* tmp) const {
    int64_t kd_lo, kd_hi, kh_lo, kh_hi;
    d_.Taps(od, &kd_lo, &kd_hi);
    h_.Taps(oh, &kh_lo, &kh_hi);
    const auto input_row = [&](int64_t kd, int64_t kh) {
      return x + ((od * d_.s - d_.pad + kd * d_.d) * h_.in + oh * h_.s - h_.pad + kh * h_.d) * w_.in;
    };
    const float* src = input_row(kd_lo, kh_lo);
    if ((kd_hi - kd_lo) * (kh_hi - kh_lo) > 1) {
      for (int64_t kd = kd_lo; kd < kd_hi; ++kd)
        for (int64_t kh = kh_lo; kh < kh_hi; ++kh)
          CombineRow(input_row(kd, kh), tmp, w_.in, max_, kd == kd_lo && kh == kh_lo);
      src = tmp;
    }
    // Interior outputs: every tap inside the row.
    WindowRow(src - w_.pad, y, w_lo_, w_hi_, w_.k, w_.s, w_.d, max_);
    // Edge outputs: the taps inside the row only.
    for (int64_t o = 0; o < w_.out; ++o) {
      if (o == w_lo_) o = std::max(o, w_hi_);
      if (o >= w_.out) break;
      int64_t lo, hi;
      w_.Taps(o, &lo, &hi);
      const float* p = src + o * w_.s - w_.pad;
      float v = p[lo * w_.d];
      for (int64_t kw = lo + 1; kw < hi; ++kw) v = max_ ? std::max(v, p[kw * w_.d]) : v + p[kw * w_.d];
      y[o] = v;
    }
    if (!max_) {
      const float fh = inv_d_[od] * inv_h_[oh];
      const float* fw = inv_w_.data();
#pragma omp simd
      for (int64_t o = 0; o < w_.out; ++o) y[o] *= fh * fw[o];
    }
  }

  bool max_;
  int64_t planes_;
  Axis d_, h_, w_;
  int threads_;
  int64_t w_lo_ = 0, w_hi_ = 0;
  std::vector<float> inv_w_, inv_h_, inv_d_;  // AveragePool: 1 / taps counted, per output column, row and plane
};

}  // namespace

std::unique_ptr<Kernel> CreatePlainPool(const KernelBuildContext& ctx) {
  const Node& node = ctx.node;
  const bool max = node.op_type == "MaxPool";
  if ((!max && node.op_type != "AveragePool") || ctx.input_shapes.size() != 1 || ctx.output_shapes.size() != 1 ||
      ctx.input_dtypes[0] != DType::kF32 || ctx.output_dtypes[0] != DType::kF32 || ctx.InLayout(0) != Layout::kPlain ||
      ctx.OutLayout(0) != Layout::kPlain)
    return nullptr;
  const Shape& x = ctx.input_shapes[0];
  const Shape& y = ctx.output_shapes[0];
  const size_t rank = x.size();
  if (rank < 3 || rank > 5 || y.size() != rank || y[0] != x[0] || y[1] != x[1]) return nullptr;
  for (size_t i = 0; i < rank; ++i)
    if (x[i] <= 0 || y[i] <= 0) return nullptr;
  const std::vector<int64_t> k = node.GetInts("kernel_shape");
  if (k.size() != rank - 2) return nullptr;
  const ConvWindow win = ResolveConvWindow(node, x, k, node.GetInt("ceil_mode", 0) != 0);
  std::vector<Axis> axes(3);  // [D, H, W]; a 2-D pool has D = 1, a 1-D one D = H = 1
  for (size_t i = 0; i < rank - 2; ++i) {
    Axis& a = axes[5 - rank + i];
    a = Axis{x[2 + i], y[2 + i], k[i], win.strides[i], win.dilations[i], win.pad_begin[i], win.pad_end[i]};
    if (a.pad < 0 || a.pad_end < 0) return nullptr;
    // Every window must hold an input element (one wholly in padding, or between dilated taps, has no maximum).
    for (int64_t o = 0; o < a.out; ++o) {
      int64_t lo, hi;
      a.Taps(o, &lo, &hi);
      if (lo >= hi) return nullptr;
    }
  }
  const bool include_pad = !max && node.GetInt("count_include_pad", 0) != 0;
  const int threads = std::max(1, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads());
  return std::make_unique<PlainPoolKernel>(max, include_pad, x[0] * x[1], axes[0], axes[1], axes[2], threads);
}

}  // namespace osprey::cpu
