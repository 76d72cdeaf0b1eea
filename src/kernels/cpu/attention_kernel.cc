// _AttentionViews (ops/matmul_views.h) on AVX-512 or AVX2: softmax(scale q k) v for one block of query rows at a time,
// the block's scores kept in a per-thread scratch row block (in L1/L2) between the two products instead of written
// out as a [.., M, T] tensor, read by a Softmax pass and read again by the second product. Per attention head (a batch
// index of the product), k and v are packed once per thread in panels of 16 keys ([D][16] each) and of 16 context
// elements ([T][16] each), so that the products' loads run through memory in order (a [D][T] pack's rows were pages
// apart at 1500 keys: Whisper's encoder attention ran 15% slower). A block of kRows query rows then takes its scores
// a few vectors of keys at a time (kRows x up to 4 AVX-512 or 2 AVX2 vectors of accumulators over D), the softmax
// numerators of each row in place (max, e^(s - max), their sum), and the context rows as kRows x up to 4 (2) vectors
// of Dv over T, scaled by 1 / sum as they are stored. The loops are written once (attention_rows.inc) and compiled for
// each instruction set. Work is split into (head, row chunk) tasks over the plan's threads. On ViT-B/16 at batch 1
// (12 heads of 197 x 197 x 64) it replaced two _MatMulViews products and a Softmax (docs/performance.md, thirty-ninth
// session).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/silu_vector.h"
#include "kernels/cpu/simd_lanes.h"
#include "ops/matmul_views.h"

namespace osprey::cpu {
namespace {

// GCC 12's masked AVX-512 intrinsics pass an "undefined" vector through and then warn that it may be uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

constexpr int kRows = 6;            // query rows per block: kRows x kMaxVectors vectors of accumulators
constexpr int64_t kChunkRows = 48;  // query rows per task at most, where the heads alone do not share the work out

// One head's operands, in elements: q[i][d] = q[i * q_row + d * q_d], k (transposed) kt[d][j] = k[d * k_d + j * k_t],
// v[j][e] = v[j * v_t + e * v_e]; the context row i at o + i * o_row, its elements contiguous; the bias, if any.
struct Head {
  const float* q;
  int64_t q_row, q_d;
  const float* k;
  int64_t k_d, k_t;
  const float* v;
  int64_t v_t, v_e;
  float* o;
  int64_t o_row;
  const float* b = nullptr;  // the bias of score [i][j] at b[i * b_row + j * b_t] (null: none)
  int64_t b_row = 0, b_t = 0;
};

// ---- AVX-512: 16 lanes, 6 rows x 4 vectors of accumulators (of 32 registers).
#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {
using namespace simd::avx512;
constexpr int kMaxVectors = 4;
inline V ExpV(V x) { return ExpVector(x); }
inline float ReduceMax(V v) { return _mm512_reduce_max_ps(v); }
inline float ReduceAdd(V v) { return _mm512_reduce_add_ps(v); }
#include "kernels/cpu/attention_rows.inc"
}  // namespace avx512
#pragma GCC pop_options

// ---- AVX2 + FMA: 8 lanes, 6 rows x 2 vectors of accumulators (of 16 registers).
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
using namespace simd::avx2;
constexpr int kMaxVectors = 2;
inline V ExpV(V x) { return ExpVector(x); }  // silu_vector.h's AVX2 overload
inline float ReduceMax(V v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}
inline float ReduceAdd(V v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_add_ss(m, _mm_shuffle_ps(m, m, 1)));
}
#include "kernels/cpu/attention_rows.inc"
}  // namespace avx2
#pragma GCC pop_options

using RowsFn = void (*)(const Head&, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, float*,
                        int64_t, int64_t);

// The instruction set the kernel runs on: AVX-512 where the CPU has it, else AVX2 with FMA, else none (the fusion
// then keeps the unfused ops). OSPREY_ATTENTION_ISA=avx2 takes AVX2 on an AVX-512 CPU (tests of that path).
RowsFn RowsForThisCpu() {
  const char* isa = std::getenv("OSPREY_ATTENTION_ISA");
  const bool want_avx2 = isa != nullptr && std::string(isa) == "avx2";
  if (__builtin_cpu_supports("avx512f") && !want_avx2) return avx512::Rows;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return avx2::Rows;
  return nullptr;
}
// k and v packed in panels of 16 (whole vectors of either instruction set; the rows' loads then run through memory in
// order): kt[p][d][jj] = k[d][16 p + jj], zero past `keys` (tp keys, a multiple of 16); vp[p][t][ee] = v[t][16 p + ee]
// for t < keys, zero past dv (dv rounded up to 16).
void Pack(const Head& h, int64_t depth, int64_t keys, int64_t dv, int64_t tp, float* kt, float* vp) {
  for (int64_t j0 = 0; j0 < tp; j0 += 16) {
    float* panel = kt + j0 * depth;
    const int64_t n = std::min<int64_t>(16, keys - j0);
    for (int64_t jj = 0; jj < n; ++jj) {  // each key's depth floats read once
      const float* key = h.k + (j0 + jj) * h.k_t;
      for (int64_t d = 0; d < depth; ++d) panel[d * 16 + jj] = key[d * h.k_d];
    }
    if (n < 16)
      for (int64_t d = 0; d < depth; ++d) std::fill(panel + d * 16 + n, panel + d * 16 + 16, 0.f);
  }
  for (int64_t e0 = 0; e0 < dv; e0 += 16) {
    float* panel = vp + e0 * tp;
    const int64_t n = std::min<int64_t>(16, dv - e0);
    for (int64_t t = 0; t < keys; ++t) {
      const float* value = h.v + t * h.v_t + e0 * h.v_e;
      float* row = panel + t * 16;
      if (h.v_e == 1) {
        std::copy(value, value + n, row);
      } else {
        for (int64_t e = 0; e < n; ++e) row[e] = value[e * h.v_e];
      }
      std::fill(row + n, row + 16, 0.f);
    }
  }
}

class AttentionViewsKernel final : public Kernel {
 public:
  AttentionViewsKernel(const StridedView& q, const StridedView& k, const StridedView& v, const AttentionProducts& p,
                       const Shape* bias, float scale, int threads, RowsFn rows)
      : q_(q), k_(k), v_(v), p_(p), has_bias_(bias != nullptr), scale_(scale), threads_(threads), rows_fn_(rows) {
    if (bias != nullptr) bias_ = BroadcastView(*bias, p.scores);
    const size_t rank = q.dims.size();
    rows_ = p.scores[rank - 2];
    keys_ = p.scores[rank - 1];
    depth_ = q.dims[rank - 1];
    dv_ = v.dims[rank - 1];
    tp_ = (keys_ + 15) / 16 * 16;
    for (size_t d = 0; d + 2 < rank; ++d) heads_ *= p.context.dims[d];
    const int64_t dvp = (dv_ + 15) / 16 * 16;  // v's packed row length
    scratch_bytes_ = ThreadScratch::Align((depth_ * tp_ + kRows * tp_ + tp_ * dvp) * sizeof(float));
  }
  const char* Name() const override { return "AttentionF32"; }

  // The operands of the first head (batch index 0).
  Head Operands(const float* qd, const float* kd, const float* vd, float* yd, const float* bd) const {
    const size_t rank = q_.dims.size();
    Head h;
    h.q = qd + q_.offset;
    h.q_row = q_.strides[rank - 2];
    h.q_d = q_.strides[rank - 1];
    h.k = kd + k_.offset;
    h.k_d = k_.strides[rank - 2];
    h.k_t = k_.strides[rank - 1];
    h.v = vd + v_.offset;
    h.v_t = v_.strides[rank - 2];
    h.v_e = v_.strides[rank - 1];
    h.o = yd;
    h.o_row = p_.context.output_strides[rank - 2];
    if (bd != nullptr) {
      h.b = bd;
      h.b_row = bias_.strides[rank - 2];
      h.b_t = bias_.strides[rank - 1];
    }
    return h;
  }

  void Run(KernelContext& ctx) override {
    const float* qd = ctx.In(0).data<float>();
    const float* kd = ctx.In(1).data<float>();
    const float* vd = ctx.In(2).data<float>();
    float* yd = ctx.Out(0).data<float>();
    const float* bd = has_bias_ ? ctx.In(3).data<float>() : nullptr;
    const size_t rank = q_.dims.size();
    // Whole heads per task where there are enough to go round (each packs its k and v once), else chunks of at most
    // kChunkRows rows, as even as whole blocks of kRows make them (49 rows: 30 + 19, not 48 + 1).
    const int64_t chunks = heads_ >= 4 * threads_ ? 1 : (rows_ + kChunkRows - 1) / kChunkRows;
    const int64_t chunk_rows = ((rows_ + chunks - 1) / chunks + kRows - 1) / kRows * kRows;
    const int64_t tasks = heads_ * chunks;
#pragma omp parallel num_threads(threads_) if (tasks > 1)
    {
      float* kt = reinterpret_cast<float*>(ThreadScratch::Reserve(scratch_bytes_));
      float* s = kt + depth_ * tp_;
      float* v = s + kRows * tp_;
      int64_t packed = -1;
#pragma omp for schedule(static)
      for (int64_t task = 0; task < tasks; ++task) {
        const int64_t head = task / chunks, chunk = task % chunks;
        // The head's batch index, axis by axis (innermost last), into each operand's offset (1: broadcast).
        Head h = Operands(qd, kd, vd, yd, bd);
        for (int64_t d = static_cast<int64_t>(rank) - 3, rest = head; d >= 0; --d) {
          const int64_t index = rest % p_.context.dims[d];
          rest /= p_.context.dims[d];
          if (q_.dims[d] != 1) h.q += index * q_.strides[d];
          if (k_.dims[d] != 1) h.k += index * k_.strides[d];
          if (v_.dims[d] != 1) h.v += index * v_.strides[d];
          if (bd != nullptr && p_.scores[d] != 1) h.b += index * bias_.strides[d];
          h.o += index * p_.context.output_strides[d];
        }
        if (packed != head) {
          Pack(h, depth_, keys_, dv_, tp_, kt, v);
          packed = head;
        }
        rows_fn_(h, depth_, keys_, dv_, scale_, kt, tp_, v, s, chunk * chunk_rows,
                 std::min(rows_, (chunk + 1) * chunk_rows));
      }
    }
  }

 private:
  StridedView q_, k_, v_, bias_;
  AttentionProducts p_;
  bool has_bias_;
  float scale_;
  int threads_;
  RowsFn rows_fn_;
  int64_t rows_ = 0, keys_ = 0, depth_ = 0, dv_ = 0, tp_ = 0, heads_ = 1;
  size_t scratch_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Kernel> CreateAttentionViews(const KernelBuildContext& ctx) {
  const RowsFn rows = RowsForThisCpu();
  if (rows == nullptr || ctx.input_shapes.size() < 3 || ctx.input_shapes.size() > 4 || ctx.output_shapes.size() != 1)
    return nullptr;
  const bool has_bias = ctx.input_shapes.size() == 4 && (ctx.present.size() < 4 || ctx.present[3]);
  for (size_t i = 0; i < ctx.input_dtypes.size(); ++i)
    if ((i < 3 || has_bias) && ctx.input_dtypes[i] != DType::kF32) return nullptr;
  for (Layout l : ctx.input_layouts)
    if (l != Layout::kPlain) return nullptr;
  if (ctx.OutLayout(0) != Layout::kPlain) return nullptr;
  const StridedView q = ReadView(ctx.node, "q"), k = ReadView(ctx.node, "k"), v = ReadView(ctx.node, "v");
  const AttentionProducts p = AttentionOf(ctx.node, q, k, v);
  const size_t rank = q.dims.size();
  // Context rows are stored as vectors: their elements must be contiguous in the output (out_perm keeps the last axis).
  if (p.context.output != ctx.output_shapes[0] || p.context.output_strides[rank - 1] != 1) return nullptr;
  const int threads = std::max(1, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads());
  return std::make_unique<AttentionViewsKernel>(q, k, v, p, has_bias ? &ctx.input_shapes[3] : nullptr,
                                                ctx.node.GetFloat("scale", 1.f), threads, rows);
}

}  // namespace osprey::cpu
