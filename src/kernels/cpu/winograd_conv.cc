// Winograd F(4x4, 3x3) convolution on channels-last float32 tensors (Lavin & Gray, "Fast Algorithms for
// Convolutional Neural Networks", 2015). The output is cut into 4x4 tiles; each tile's 6x6 input patch d becomes
// V = B^T d B, each filter g becomes U = G g G^T (once, at build), and the tile's output is A^T M A with
// M[p] = sum over channels of V[p] U[p] for each of the 36 positions p: 36 matrix products [tiles x C] x [C x K],
// 36 multiplications per tile and channel pair where the direct convolution needs 16 x 9 = 144.
//
// Tiles go in chunks sized so a chunk's V and M (36 x tiles x channels each) stay near the caches (kChunkBytes); per
// chunk: the input transform (osprey's threads, 16 channels per AVX-512 vector or 8 per AVX2 one, zeros outside the
// image), oneDNN's batched matrix multiplication (its brgemm kernels, weights prepacked in its layout), and the output
// transform with bias, residual and activation. A last chunk with fewer tiles multiplies zero rows (one primitive for
// every chunk).
//
// Measured on a 2-vCPU Zen 4 (docs/performance.md, "Seventeenth session"), each layer alone: ResNet-50's 3x3 layers
// 1.5-2.2x faster than oneDNN 3.2's direct convolution (brgconv) at batch 8 and 1.2-1.6x at batch 1 (less inside a
// model, where U comes from memory); relative error ~1e-5.
#include "kernels/cpu/winograd_conv.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/simd_lanes.h"

// GCC 12's AVX-512 intrinsics pass an "undefined" vector that -Wmaybe-uninitialized reports once inlined (a known
// false positive, as in augment_color_kernels.cc).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace osprey::cpu {
namespace {

using dnnl::memory;
constexpr int64_t kPositions = 36;              // 6x6 transformed tile
// V + M of one chunk. In ResNet-50 at batch 8, 1, 2 and 8 MiB were within this host's noise of 4 (in-process A/B);
// 512 KiB was slower.
constexpr int64_t kChunkBytes = int64_t{4} << 20;
constexpr int64_t kMinChunkTiles = 16;

// ---- The per-tile transforms (winograd_tiles.inc) for each instruction set: 16 channels per AVX-512 vector, 8 per
// AVX2 one.
#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {
using namespace simd::avx512;
inline V LeakyRelu(V v, V slope) { return _mm512_mask_mul_ps(v, _mm512_cmp_ps_mask(v, Zero(), _CMP_LT_OQ), v, slope); }
#include "kernels/cpu/winograd_tiles.inc"
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
using namespace simd::avx2;
inline V LeakyRelu(V v, V slope) {
  return _mm256_blendv_ps(v, _mm256_mul_ps(v, slope), _mm256_cmp_ps(v, Zero(), _CMP_LT_OQ));
}
#include "kernels/cpu/winograd_tiles.inc"
}  // namespace avx2
#pragma GCC pop_options

// The transforms of this CPU: AVX-512's where it has it, else AVX2's (with FMA), else none.
struct TileTransforms {
  decltype(&avx512::InputTile) input = nullptr;
  decltype(&avx512::OutputTile) output = nullptr;
};
const TileTransforms& Transforms() {
  static const TileTransforms t = [] {
    if (__builtin_cpu_supports("avx512f")) return TileTransforms{avx512::InputTile, avx512::OutputTile};
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      return TileTransforms{avx2::InputTile, avx2::OutputTile};
    return TileTransforms{};
  }();
  return t;
}

// G g for three taps (the weight transform's 1-D step), in double.
void WeightStep(const double* g, double* u) {
  u[0] = g[0] / 4;
  u[1] = -(g[0] + g[1] + g[2]) / 6;
  u[2] = -(g[0] - g[1] + g[2]) / 6;
  u[3] = g[0] / 24 + g[1] / 12 + g[2] / 6;
  u[4] = g[0] / 24 - g[1] / 12 + g[2] / 6;
  u[5] = g[2];
}

// U[p][c][k] = (G g[k][c] G^T)[p] for weights [K, C, 3, 3]; rows of U (one c) in parallel, k innermost so each of
// the 36 planes is written in order (ResNet-50's layers in ~1/3 of the time of the k-outer order on one thread).
void TransformWeights(const float* w, int64_t channels, int64_t filters, float* u, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t k = 0; k < filters; ++k) {
      const float* g = w + (k * channels + c) * 9;
      double rows[6][3];  // G g: 6 x 3
      for (int col = 0; col < 3; ++col) {
        const double taps[3] = {g[col], g[3 + col], g[6 + col]};
        double out[6];
        WeightStep(taps, out);
        for (int i = 0; i < 6; ++i) rows[i][col] = out[i];
      }
      for (int i = 0; i < 6; ++i) {
        double out[6];
        WeightStep(rows[i], out);
        for (int j = 0; j < 6; ++j) u[((i * 6 + j) * channels + c) * filters + k] = static_cast<float>(out[j]);
      }
    }
}

class WinogradConv final : public OwnConvKernel {
 public:
  const char* Name() const override { return "ConvF32Winograd"; }
  // TransformOutput reads each residual element just before it writes the output element at the same place.
  bool MayOverwriteInput(int i) const override { return i == 3 && g_.residual; }

  bool Build(const KernelBuildContext& ctx, const OwnConvGeometry& g) {
    g_ = g;
    threads_ = std::max(1, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads());
    tiles_h_ = (g.out_h + 3) / 4;
    tiles_w_ = (g.out_w + 3) / 4;
    tiles_ = g.batch * tiles_h_ * tiles_w_;
    const int64_t max_chunk = std::max(kMinChunkTiles, kChunkBytes / (kPositions * (g.in_c + g.out_c) * 4));
    const int64_t chunks = (tiles_ + max_chunk - 1) / max_chunk;
    chunk_ = (tiles_ + chunks - 1) / chunks;
    const memory::desc v_md({kPositions, chunk_, g.in_c}, memory::data_type::f32, memory::format_tag::abc);
    const memory::desc m_md({kPositions, chunk_, g.out_c}, memory::data_type::f32, memory::format_tag::abc);
    const memory::desc u_any({kPositions, g.in_c, g.out_c}, memory::data_type::f32, memory::format_tag::any);
    dnnl::matmul::primitive_desc pd(CpuEngine(), v_md, u_any, m_md, BaseAttr(), /*allow_empty=*/true);
    if (!pd || IsReferenceImpl(pd)) return false;
    matmul_ = dnnl::matmul(pd);

    const memory::desc u_plain({kPositions, g.in_c, g.out_c}, memory::data_type::f32, memory::format_tag::abc);
    const memory::desc u_md = pd.weights_desc();
    const Tensor& weights = *ctx.input_values[1];
    auto fill = [&](void* data) {
      std::vector<float> u(static_cast<size_t>(kPositions * g.in_c * g.out_c));
      TransformWeights(weights.data<float>(), g.in_c, g.out_c, u.data(), threads_);
      dnnl::memory from = WrapMemory(u_plain, u.data()), to(u_md, CpuEngine(), data);
      dnnl::reorder(from, to).execute(ThreadStream(), from, to);
      ThreadStream().wait();
    };
    const std::string key = BlockedDescKey(u_md);
    if (ctx.derive_weight && weights.buffer() && !key.empty()) {
      u_buffer_ = ctx.derive_weight(weights, "winograd-f4x3:" + key, u_md.get_size(), fill);
    } else {
      u_buffer_ = Allocator::Host().Allocate(std::max<size_t>(u_md.get_size(), 64));
      fill(u_buffer_->data());
    }
    v_bytes_ = ThreadScratch::Align(v_md.get_size());
    m_bytes_ = ThreadScratch::Align(m_md.get_size());
    scratch_md_ = pd.scratchpad_desc();
    scratch_bytes_ = ThreadScratch::Align(scratch_md_.get_size());
    u_ = WrapMemory(u_md, u_buffer_->data());
    v_md_ = v_md;
    m_md_ = m_md;
    return true;
  }

  void Run(KernelContext& ctx) override {
    CheckOwnConvTensors(ctx, Name(), g_, Layout::kNhwc);
    const float* residual = g_.residual ? ctx.In(3).data<float>() : nullptr;
    if (ctx.In(0).raw() == ctx.Out(0).raw())
      throw Error(ErrorCode::kInternal, ctx.node.Describe() + ": " + Name() + " cannot write over its input");
    RunDnnl(ctx.node, Name(), [&] {
      Execute(ctx.In(0).data<float>(), g_.bias ? ctx.In(2).data<float>() : nullptr, residual,
              ctx.Out(0).data<float>());
    });
  }

  double TimeMs(int runs) override {
    OwnConvTimingBuffers t(g_);
    return BestRunMs(
        runs, [&] { Execute(t.x.data(), t.bias.data(), g_.residual ? t.residual.data() : nullptr, t.y.data()); },
        // As in a model: weights cold, activations warm.
        [&] { EvictFromCaches(u_buffer_->data(), u_buffer_->size()); });
  }

 private:
  // The memories of one run's matrix multiplication (one set per concurrent caller).
  struct RunState {
    memory v, m, scratch;
    ExecArgs args;
  };

  void Execute(const float* x, const float* bias, const float* residual, float* y) {
    char* scratch = ThreadScratch::Reserve(v_bytes_ + m_bytes_ + scratch_bytes_);
    float* v = reinterpret_cast<float*>(scratch);
    float* m = reinterpret_cast<float*>(scratch + v_bytes_);
    const auto run = runs_.Acquire([this] {
      RunState r{UnboundMemory(v_md_), UnboundMemory(m_md_), UnboundMemory(scratch_md_), {}};
      r.args.Add(DNNL_ARG_SRC, r.v).Add(DNNL_ARG_WEIGHTS, u_).Add(DNNL_ARG_DST, r.m).Add(DNNL_ARG_SCRATCHPAD,
                                                                                        r.scratch);
      return r;
    });
    Point(run->v, v);
    Point(run->m, m);
    Point(run->scratch, scratch + v_bytes_ + m_bytes_);
    dnnl::stream& stream = ThreadStream();
    for (int64_t first = 0; first < tiles_; first += chunk_) {
      const int64_t count = std::min(chunk_, tiles_ - first);
      TransformInput(x, first, count, v);
      run->args.Execute(matmul_, stream);
      stream.wait();
      TransformOutput(m, first, count, bias, residual, y);
    }
  }

  // V[p][t][c] for the chunk's tiles t (zeros for t >= count, rows the multiplication still reads).
  void TransformInput(const float* x, int64_t first, int64_t count, float* v) const {
    const int64_t c_size = g_.in_c, chunk = chunk_;
    const auto input_tile = Transforms().input;
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int64_t t = 0; t < chunk; ++t) {
      if (t >= count) {
        for (int64_t p = 0; p < kPositions; ++p) std::memset(v + (p * chunk + t) * c_size, 0, c_size * sizeof(float));
        continue;
      }
      const int64_t tile = first + t, per_image = tiles_h_ * tiles_w_;
      const int64_t n = tile / per_image, ty = tile % per_image / tiles_w_, tx = tile % tiles_w_;
      const int64_t y0 = ty * 4 - g_.pad_top, x0 = tx * 4 - g_.pad_left;
      bool inside[6][6];
      for (int i = 0; i < 6; ++i)
        for (int j = 0; j < 6; ++j)
          inside[i][j] = y0 + i >= 0 && y0 + i < g_.in_h && x0 + j >= 0 && x0 + j < g_.in_w;
      const int64_t base = ((n * g_.in_h + y0) * g_.in_w + x0) * c_size;  // may be negative: read only inside
      input_tile(x, base, g_.in_w, c_size, inside, v + t * c_size, chunk * c_size);
    }
  }

  // y for the chunk's tiles from M[p][t][k], with bias, residual and activation.
  void TransformOutput(const float* m, int64_t first, int64_t count, const float* bias, const float* residual,
                       float* y) const {
    const int64_t k_size = g_.out_c, chunk = chunk_;
    const ActivationKind kind = g_.activation.kind;
    const bool inline_act = kind == ActivationKind::kNone || kind == ActivationKind::kRelu ||
                            kind == ActivationKind::kClip || kind == ActivationKind::kLeakyRelu;
    const auto output_tile = Transforms().output;
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int64_t t = 0; t < count; ++t) {
      const int64_t tile = first + t, per_image = tiles_h_ * tiles_w_;
      const int64_t n = tile / per_image, ty = tile % per_image / tiles_w_, tx = tile % tiles_w_;
      const int rows = static_cast<int>(std::min<int64_t>(4, g_.out_h - ty * 4));
      const int cols = static_cast<int>(std::min<int64_t>(4, g_.out_w - tx * 4));
      const int64_t offset = ((n * g_.out_h + ty * 4) * g_.out_w + tx * 4) * k_size;
      output_tile(m + t * k_size, chunk * k_size, k_size, rows, cols, g_.out_w, offset, bias, residual, kind,
                  g_.activation.alpha, g_.activation.beta, y);
      if (!inline_act)
        for (int i = 0; i < rows; ++i) {
          float* span = y + offset + i * g_.out_w * k_size;
          if (kind == ActivationKind::kSilu)
            SiluInPlace(span, cols * k_size, 1);
          else
            g_.activation.Apply(span, cols * k_size);
        }
    }
  }

  OwnConvGeometry g_;
  int threads_ = 1;
  int64_t tiles_h_ = 0, tiles_w_ = 0, tiles_ = 0, chunk_ = 0;
  dnnl::matmul matmul_;
  std::shared_ptr<Buffer> u_buffer_;
  memory u_;
  memory::desc v_md_, m_md_, scratch_md_;
  size_t v_bytes_ = 0, m_bytes_ = 0, scratch_bytes_ = 0;
  PerCaller<RunState> runs_;
};

}  // namespace

bool WinogradConvApplies(const OwnConvGeometry& g) {
  return Transforms().input != nullptr && g.pool_kh == 0 && g.batch > 0 && g.in_h > 0 && g.in_w > 0 && g.out_h > 0 &&
         g.out_w > 0 && g.in_c > 0 && g.out_c > 0 && g.in_c % 16 == 0 && g.out_c % 16 == 0 && g.pad_top >= 0 &&
         g.pad_left >= 0;
}

std::unique_ptr<OwnConvKernel> CreateWinogradConv(const KernelBuildContext& ctx, const OwnConvGeometry& g) {
  if (!WinogradConvApplies(g) || ctx.input_values.size() < 2 || ctx.input_values[1] == nullptr ||
      ctx.input_values[1]->raw() == nullptr)
    return nullptr;
  OmpThreadsGuard threads(ctx.num_threads);
  auto kernel = std::make_unique<WinogradConv>();
  try {
    if (!kernel->Build(ctx, g)) return nullptr;
  } catch (const dnnl::error&) {
    return nullptr;  // oneDNN could not make the matmul or reorder U: the caller keeps its direct convolution
  }
  return kernel;
}

}  // namespace osprey::cpu
