// One row times a constant matrix: the classifier of a network at batch 1 (MatMul [1, K] x [K, N], Gemm with one
// row, a 1x1 Conv on a 1x1 image), y = x W + bias. The weights, several MB, are read once per run and no longer sit
// in the caches when the last layer comes; oneDNN's gemm:jit read them at ~15 GB/s in EfficientNetB0 (0.29-0.35 ms for
// 1280 x 1000). Here they are packed once into panels of 64 columns (K rows each, contiguous: oneDNN's aBdc64b on dims
// {1, N, 1, K}, through PackWeight, so shared and counted like every packed weight) and both threads stream their
// panels: 0.25 ms cold, 0.04 hot, against oneDNN's 0.36 and 0.056 (docs/performance.md, "Fifteenth session").
// A fused activation (`_activation`: the small MLP heads of openWakeWord, Gemm + Relu) is applied to the row after;
// a MatMul's fused residual (`_residual`, input 3) joins the bias the products accumulate onto (in place or not).
// AVX-512 only; elsewhere, and for anything else (a second row, alpha or beta), oneDNN runs it. OSPREY_GEMV=0 turns
// it off.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/cpu/gemv_panel.h"
#include "ops/activation.h"

namespace osprey::cpu {
namespace {

// Output columns per panel with AVX-512: four zmm accumulators (two sets, for two k at a time).
constexpr int64_t kPanel = 64;
// With AVX2: two ymm.
constexpr int64_t kPanelAvx2 = 16;

// y[0..63] = x[0..K) times one panel (K rows of 64).
__attribute__((target("avx512f"))) void PanelTimesRow(const float* x, const float* panel, int64_t k_size, float* y) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  int64_t k = 0;
  for (; k + 2 <= k_size; k += 2) {
    const float* r = panel + k * kPanel;
    const __m512 u = _mm512_set1_ps(x[k]), v = _mm512_set1_ps(x[k + 1]);
    a0 = _mm512_fmadd_ps(u, _mm512_loadu_ps(r), a0);
    a1 = _mm512_fmadd_ps(u, _mm512_loadu_ps(r + 16), a1);
    a2 = _mm512_fmadd_ps(u, _mm512_loadu_ps(r + 32), a2);
    a3 = _mm512_fmadd_ps(u, _mm512_loadu_ps(r + 48), a3);
    b0 = _mm512_fmadd_ps(v, _mm512_loadu_ps(r + 64), b0);
    b1 = _mm512_fmadd_ps(v, _mm512_loadu_ps(r + 80), b1);
    b2 = _mm512_fmadd_ps(v, _mm512_loadu_ps(r + 96), b2);
    b3 = _mm512_fmadd_ps(v, _mm512_loadu_ps(r + 112), b3);
  }
  if (k < k_size) {
    const float* r = panel + k * kPanel;
    const __m512 u = _mm512_set1_ps(x[k]);
    a0 = _mm512_fmadd_ps(u, _mm512_loadu_ps(r), a0);
    a1 = _mm512_fmadd_ps(u, _mm512_loadu_ps(r + 16), a1);
    a2 = _mm512_fmadd_ps(u, _mm512_loadu_ps(r + 32), a2);
    a3 = _mm512_fmadd_ps(u, _mm512_loadu_ps(r + 48), a3);
  }
  _mm512_storeu_ps(y, _mm512_add_ps(a0, b0));
  _mm512_storeu_ps(y + 16, _mm512_add_ps(a1, b1));
  _mm512_storeu_ps(y + 32, _mm512_add_ps(a2, b2));
  _mm512_storeu_ps(y + 48, _mm512_add_ps(a3, b3));
}

// y[r][0..63] = x row r (rows `x_stride` apart) times one panel, R rows at once, in passes of V vectors (16 columns
// each): R x V <= 16 accumulators. Each panel row is loaded once for all R rows per pass, so several batch items cost
// one pass over the panel: 4 rows x 4 vectors, or 8 rows x 2 vectors in two passes (half the panel bytes per
// multiply-add; the panel does not stay in the first-level cache between passes of 4 rows).
template <int R, int V>
__attribute__((target("avx512f"))) void PanelTimesRows(const float* x, int64_t x_stride, const float* panel,
                                                       int64_t k_size, float* y) {
  static_assert(R * V <= 16 && 4 % V == 0, "accumulators must fit the registers");
  for (int pass = 0; pass < 4 / V; ++pass) {
    const float* columns = panel + pass * V * 16;
    // Fully unrolled (GCC kept a rolled loop's accumulators in memory: 4 FMAs per iteration, a third of the speed).
    __m512 acc[R][V];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < k_size; ++k) {
      __m512 w[V];
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) w[v] = _mm512_loadu_ps(columns + k * kPanel + v * 16);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 u = _mm512_set1_ps(x[r * x_stride + k]);
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(u, w[v], acc[r][v]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) _mm512_storeu_ps(y + r * kPanel + (pass * V + v) * 16, acc[r][v]);
  }
}

// acc[r] += x[r][k] * the panel's row k (16 columns), for R rows.
template <int R>
__attribute__((target("avx2,fma"), always_inline)) inline void PanelRowTimesAvx2(const float* x, int64_t x_stride,
                                                                                 const float* panel, int64_t k,
                                                                                 __m256 (&acc)[R][2]) {
  const __m256 w0 = _mm256_loadu_ps(panel + k * kPanelAvx2), w1 = _mm256_loadu_ps(panel + k * kPanelAvx2 + 8);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m256 u = _mm256_broadcast_ss(x + r * x_stride + k);
    acc[r][0] = _mm256_fmadd_ps(u, w0, acc[r][0]);
    acc[r][1] = _mm256_fmadd_ps(u, w1, acc[r][1]);
  }
}

// PanelTimesRows on AVX2 + FMA (the recurrent steps only) for a panel of 16 columns: R rows x 2 vectors, each of the
// panel's rows (64 bytes) loaded once for the R rows. S interleaved sums over k (k = s mod S) make R x 2 x S >= 8
// independent accumulators: the FMA latency (4 cycles, 2 ports) hidden for one row as for four.
template <int R, int S>
__attribute__((target("avx2,fma"))) void PanelTimesRowsAvx2(const float* x, int64_t x_stride, const float* panel,
                                                            int64_t k_size, float* y) {
  static_assert(R >= 1 && R * S <= 6, "accumulators must fit the registers");
  __m256 acc[S][R][2];
#pragma GCC unroll 4
  for (int t = 0; t < S; ++t)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[t][r][0] = acc[t][r][1] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + S <= k_size; k += S)
#pragma GCC unroll 4
    for (int t = 0; t < S; ++t) PanelRowTimesAvx2<R>(x, x_stride, panel, k + t, acc[t]);
  for (; k < k_size; ++k) PanelRowTimesAvx2<R>(x, x_stride, panel, k, acc[0]);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    __m256 a0 = acc[0][r][0], a1 = acc[0][r][1];
#pragma GCC unroll 4
    for (int t = 1; t < S; ++t) {
      a0 = _mm256_add_ps(a0, acc[t][r][0]);
      a1 = _mm256_add_ps(a1, acc[t][r][1]);
    }
    _mm256_storeu_ps(y + r * kPanelAvx2, a0);
    _mm256_storeu_ps(y + r * kPanelAvx2 + 8, a1);
  }
}

class GemvKernel final : public Kernel {
 public:
  const char* Name() const override { return "GemvF32"; }

  // W(k, n) lies at n * n_stride + k * k_stride in input `weight_input` (a constant).
  bool Build(const KernelBuildContext& ctx, int weight_input, int64_t k_size, int64_t n_size, int64_t n_stride,
             int64_t k_stride, bool has_bias) {
    if (!ctx.node.GetString("_activation", "").empty() && !Activation::FromFusedNode(ctx.node, &activation_))
      return false;
    k_ = k_size;
    n_ = n_size;
    has_bias_ = has_bias;
    threads_ = ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads();
    const dnnl::memory::desc from({1, n_, 1, k_}, dnnl::memory::data_type::f32,
                                  dnnl::memory::dims{n_ * k_, n_stride, 1, k_stride});
    packed_ = PackGemvPanels(ctx, from, *ctx.input_values[weight_input], n_, k_);
    return packed_.memory.get_data_handle() != nullptr;
  }

  void Run(KernelContext& ctx) override {
    const Node& node = ctx.node;
    if (ctx.In(0).numel() != k_ || ctx.Out(0).numel() != n_ || (has_bias_ && ctx.In(2).numel() != n_) ||
        (has_residual_ && ctx.In(3).numel() != n_))
      throw Error(ErrorCode::kInternal, node.Describe() + ": GemvF32 was built for " + std::to_string(k_) + " -> " +
                                            std::to_string(n_) + " values");
    const float* x = ctx.In(0).data<float>();
    const float* bias = has_bias_ ? ctx.In(2).data<float>() : nullptr;
    float* y = ctx.Out(0).data<float>();
    const float* w = static_cast<const float*>(packed_.memory.get_data_handle());
    const int64_t panels = (n_ + kPanel - 1) / kPanel;
    const int team =
        n_ * k_ >= (int64_t{1} << 16) ? std::max(1, std::min<int>(threads_, static_cast<int>(panels))) : 1;
    if (has_residual_) {
      const float* residual = ctx.In(3).data<float>();  // may be y itself (MayOverwriteInput)
      for (int64_t i = 0; i < n_; ++i) y[i] = residual[i] + (bias ? bias[i] : 0.f);
    } else if (bias) {
      std::copy(bias, bias + n_, y);
    }
#pragma omp parallel for num_threads(team) schedule(static) if (team > 1)
    for (int64_t p = 0; p < panels; ++p) GemvPanels(x, w, k_, n_, y, bias != nullptr || has_residual_, p, p + 1);
    activation_.Apply(y, n_);
  }

  bool MayOverwriteInput(int i) const override { return i == 3 && has_residual_; }

  bool has_residual_ = false;  // set by CreateGemv (a MatMul's `_residual`)

 private:
  int64_t k_ = 0, n_ = 0;
  bool has_bias_ = false;
  int threads_ = 1;
  PackedWeight packed_;
  Activation activation_;  // kNone unless fused
};

bool Float32Everywhere(const KernelBuildContext& ctx) {
  for (size_t i = 0; i < ctx.input_dtypes.size(); ++i)
    if (i < ctx.present.size() && ctx.present[i] && ctx.input_dtypes[i] != DType::kF32) return false;
  return ctx.output_dtypes.size() == 1 && ctx.output_dtypes[0] == DType::kF32;
}

bool IsConstant(const KernelBuildContext& ctx, size_t i) {
  return i < ctx.input_values.size() && ctx.input_values[i] != nullptr && ctx.input_values[i]->raw() != nullptr;
}

}  // namespace

// OSPREY_GEMV=0 turns the panels off (for comparisons).
static bool PanelsAllowed() {
  const char* e = std::getenv("OSPREY_GEMV");
  return !(e && std::string(e) == "0");
}

bool GemvPanelsAvailable() {
  static const bool available = __builtin_cpu_supports("avx512f") && PanelsAllowed();
  return available;
}

bool RecurrentPanelsAvailable() {
  static const bool available =
      (__builtin_cpu_supports("avx512f") || (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) &&
      PanelsAllowed();
  return available;
}

int64_t GemvPanelWidth() {
  static const int64_t width = __builtin_cpu_supports("avx512f") ? kPanel : kPanelAvx2;
  return width;
}

PackedWeight PackGemvPanels(const KernelBuildContext& ctx, const dnnl::memory::desc& from, const Tensor& source,
                            int64_t n, int64_t k) {
  const dnnl::memory::desc to(
      {1, n, 1, k}, dnnl::memory::data_type::f32,
      GemvPanelWidth() == kPanel ? dnnl::memory::format_tag::aBdc64b : dnnl::memory::format_tag::aBdc16b);
  return PackWeight(ctx, from, source, to);
}

void GemvPanels(const float* x, const float* panels, int64_t k, int64_t n, float* y, bool accumulate,
                int64_t first_panel, int64_t last_panel, int64_t rows) {
  const int64_t panel_width = GemvPanelWidth();
  const bool avx512 = panel_width == kPanel;
  for (int64_t p = first_panel; p < last_panel; ++p) {
    const float* panel = panels + p * panel_width * k;
    const int64_t n0 = p * panel_width, width = std::min(panel_width, n - n0);
    for (int64_t r0 = 0; r0 < rows;) {  // eight rows at a time (AVX2: four), then up to four
      const int64_t count = rows - r0 >= 8 && avx512 ? 8 : std::min<int64_t>(4, rows - r0);
      alignas(64) float out[8 * kPanel];
      const float* xr = x + r0 * k;
      if (!avx512) {
        switch (count) {
          case 1:
            PanelTimesRowsAvx2<1, 4>(xr, k, panel, k, out);
            break;
          case 2:
            PanelTimesRowsAvx2<2, 2>(xr, k, panel, k, out);
            break;
          case 3:
            PanelTimesRowsAvx2<3, 2>(xr, k, panel, k, out);
            break;
          default:
            PanelTimesRowsAvx2<4, 1>(xr, k, panel, k, out);
        }
      } else {
        switch (count) {
          case 1:
            PanelTimesRow(xr, panel, k, out);
            break;
          case 2:
            PanelTimesRows<2, 4>(xr, k, panel, k, out);
            break;
          case 3:
            PanelTimesRows<3, 4>(xr, k, panel, k, out);
            break;
          case 4:
            PanelTimesRows<4, 4>(xr, k, panel, k, out);
            break;
          default:
            PanelTimesRows<8, 2>(xr, k, panel, k, out);
        }
      }
      for (int64_t r = 0; r < count; ++r) {
        const float* o = out + r * panel_width;
        float* yp = y + (r0 + r) * n + n0;
        if (accumulate) {
          for (int64_t j = 0; j < width; ++j) yp[j] += o[j];
        } else {
          std::copy(o, o + width, yp);
        }
      }
      r0 += count;
    }
  }
}

std::unique_ptr<Kernel> CreateGemv(const KernelBuildContext& ctx) {
  const Node& node = ctx.node;
  if (!GemvPanelsAvailable() || ctx.bf16 == Bf16Use::kYes || !Float32Everywhere(ctx) || ctx.input_shapes.size() < 2 ||
      node.Has("_input_scale") || node.Has("_input_affine") || node.Has("_input_parts") || node.Has("_pool_kernel") ||
      (node.Has("_residual") && node.op_type != "MatMul"))
    return nullptr;
  const bool residual = node.GetInt("_residual", 0) != 0;
  if (residual && (ctx.present.size() < 4 || !ctx.present[3] || ctx.input_shapes[3] != ctx.output_shapes[0] ||
                   ctx.InLayout(3) != Layout::kPlain))
    return nullptr;
  const Shape& a = ctx.input_shapes[0];
  const Shape& w = ctx.input_shapes[1];
  const bool third = ctx.present.size() > 2 && ctx.present[2];
  int64_t k = 0, n = 0, n_stride = 0, k_stride = 0;
  if (node.op_type == "MatMul") {
    const bool bias = node.GetInt("_bias", 0) != 0;
    if (a.size() != 2 || a[0] != 1 || w.size() != 2 || (third && !bias) || ctx.input_shapes.size() > 4) return nullptr;
    k = w[0], n = w[1], n_stride = 1, k_stride = n;
  } else if (node.op_type == "Gemm") {
    if (a.size() != 2 || w.size() != 2 || node.GetInt("transA", 0) != 0 || node.GetFloat("alpha", 1.f) != 1.f ||
        (third && node.GetFloat("beta", 1.f) != 1.f))
      return nullptr;
    const bool trans_b = node.GetInt("transB", 0) != 0;
    if (a[0] != 1) return nullptr;
    k = trans_b ? w[1] : w[0], n = trans_b ? w[0] : w[1];
    n_stride = trans_b ? k : 1, k_stride = trans_b ? 1 : n;
    if (third && NumElements(ctx.input_shapes[2]) != n) return nullptr;  // C broadcast other than a row: oneDNN
  } else if (node.op_type == "Conv") {
    if (node.Has("_int8") || node.Has("_dw_strides") || node.Has("_prelu") || node.GetInt("group", 1) != 1 ||
        a.size() != 4 || w.size() != 4 || a[0] != 1 || a[2] != 1 || a[3] != 1 || w[2] != 1 || w[3] != 1 ||
        ctx.output_shapes.empty() || ctx.output_shapes[0] != Shape{1, w[0], 1, 1})
      return nullptr;
    k = w[1], n = w[0], n_stride = k, k_stride = 1;
  } else {
    return nullptr;
  }
  if (!IsConstant(ctx, 1) || k != a[1] || k <= 0 || n <= 0 || NumElements(ctx.output_shapes[0]) != n) return nullptr;
  auto kernel = std::make_unique<GemvKernel>();
  if (!kernel->Build(ctx, 1, k, n, n_stride, k_stride, third)) return nullptr;
  kernel->has_residual_ = residual;
  return kernel;
}

}  // namespace osprey::cpu
