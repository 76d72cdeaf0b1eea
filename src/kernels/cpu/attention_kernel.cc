// _AttentionViews (ops/matmul_views.h) on AVX-512: softmax(scale q k) v for one block of query rows at a time, the
// block's scores kept in a per-thread scratch row block (in L1/L2) between the two products instead of written out
// as a [.., M, T] tensor, read by a Softmax pass and read again by the second product. Per attention head (a batch
// index of the product), k is packed transposed, [D][T rounded up to 16], and v row by row, [T][Dv], once per
// thread; a block of kRows query rows then takes its scores 16 keys at a time (kRows x up to 4 vectors of
// accumulators over D), the softmax numerators of each row in place (max, e^(s - max) by ExpVector, their sum), and
// the context rows as kRows x up to 4 vectors of Dv over T, scaled by 1 / sum as they are stored. Work is split into
// (head, row chunk) tasks over the plan's threads. On ViT-B/16 at batch 1 (12 heads of 197 x 197 x 64) it replaced
// two _MatMulViews products and a Softmax (docs/performance.md, thirty-ninth session).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/silu_avx512.h"
#include "ops/matmul_views.h"

namespace osprey::cpu {
namespace {

// GCC 12's masked AVX-512 intrinsics pass an "undefined" vector through and then warn that it may be uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

constexpr int kRows = 6;            // query rows per block: kRows x 4 vectors of accumulators
constexpr int64_t kChunkRows = 48;  // query rows per task (a multiple of kRows)

// One head's operands, in elements: q[i][d] = q[i * q_row + d * q_d], k (transposed) kt[d][j] = k[d * k_d + j * k_t],
// v[j][e] = v[j * v_t + e * v_e]; the context row i at o + i * o_row, its elements contiguous.
struct Head {
  const float* q;
  int64_t q_row, q_d;
  const float* k;
  int64_t k_d, k_t;
  const float* v;
  int64_t v_t, v_e;
  float* o;
  int64_t o_row;
};

// Scores of kRows query rows (qr) against C x 16 keys of the packed kt (row length tp), times `scale`, into s (row
// length tp).
template <int C>
__attribute__((target("avx512f"))) inline void Scores(const float* const* qr, int64_t q_d, int64_t depth,
                                                      const float* kt, int64_t tp, float* s, float scale) {
  __m512 acc[kRows][C];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t d = 0; d < depth; ++d, kt += tp) {
    __m512 kv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) kv[c] = _mm512_loadu_ps(kt + 16 * c);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512 b = _mm512_set1_ps(qr[r][d * q_d]);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(b, kv[c], acc[r][c]);
    }
  }
  const __m512 f = _mm512_set1_ps(scale);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(s + r * tp + 16 * c, _mm512_mul_ps(acc[r][c], f));
}

// Context rows: the kRows rows of s (numerators, row length tp) times the packed v (rows of dv floats, from column
// 16 c0 on, C vectors, the last one masked by `last`), each row times inv[r], stored to out[r] for r < count.
template <int C>
__attribute__((target("avx512f"))) inline void Values(const float* s, int64_t tp, int64_t keys, const float* v,
                                                      int64_t dv, __mmask16 last, float* const* out, const float* inv,
                                                      int count) {
  __m512 acc[kRows][C];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < keys; ++t, v += dv) {
    __m512 vv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c)
      vv[c] = c + 1 < C ? _mm512_loadu_ps(v + 16 * c) : _mm512_maskz_loadu_ps(last, v + 16 * c);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const __m512 b = _mm512_set1_ps(s[r * tp + t]);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(b, vv[c], acc[r][c]);
    }
  }
  // A loop over the constant kRows, unrolled: indexing acc by a run-time row count would put it on the stack.
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    if (r >= count) break;
    const __m512 f = _mm512_set1_ps(inv[r]);
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const __m512 y = _mm512_mul_ps(acc[r][c], f);
      if (c + 1 < C)
        _mm512_storeu_ps(out[r] + 16 * c, y);
      else
        _mm512_mask_storeu_ps(out[r] + 16 * c, last, y);
    }
  }
}

// The softmax numerators e^(s - max) of s[0, keys) in place; returns 1 / their sum.
__attribute__((target("avx512f"))) inline float Numerators(float* s, int64_t keys) {
  const int64_t full = keys / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (keys - full)) - 1);
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < full; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + j));
  if (tail) m = _mm512_mask_max_ps(m, tail, m, _mm512_maskz_loadu_ps(tail, s + full));
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(m));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < full; j += 16) {
    const __m512 e = ExpVector(_mm512_sub_ps(_mm512_loadu_ps(s + j), top));
    _mm512_storeu_ps(s + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (tail) {
    const __m512 e = ExpVector(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + full), top));
    _mm512_mask_storeu_ps(s + full, tail, e);
    sum = _mm512_mask_add_ps(sum, tail, sum, e);
  }
  return 1.f / _mm512_reduce_add_ps(sum);
}

// Query rows [i0, i1) of head h: kt packed [depth][tp], v packed [keys][dv], s a kRows x tp scratch.
__attribute__((target("avx512f"))) void Rows(const Head& h, int64_t depth, int64_t keys, int64_t dv, float scale,
                                             const float* kt, int64_t tp, const float* v, float* s, int64_t i0,
                                             int64_t i1) {
  const int64_t key_vectors = tp / 16, dv_vectors = (dv + 15) / 16;
  const int64_t key_groups = (key_vectors + 3) / 4, dv_groups = (dv_vectors + 3) / 4;
  const __mmask16 last = static_cast<__mmask16>(dv % 16 == 0 ? 0xffff : (1u << (dv % 16)) - 1);
  for (int64_t i = i0; i < i1; i += kRows) {
    const int count = static_cast<int>(std::min<int64_t>(kRows, i1 - i));
    const float* qr[kRows];
    float* out[kRows];
    for (int r = 0; r < kRows; ++r) {  // rows past the end repeat the last one (computed, not stored)
      const int64_t row = i + std::min(r, count - 1);
      qr[r] = h.q + row * h.q_row;
      out[r] = h.o + row * h.o_row;
    }
    for (int64_t g = 0, c0 = 0; g < key_groups; ++g) {  // groups of 1-4 vectors, as even as they come
      const int64_t c = key_vectors * (g + 1) / key_groups - c0;
      const float* kc = kt + 16 * c0;
      float* sc = s + 16 * c0;
      switch (c) {
        case 4: Scores<4>(qr, h.q_d, depth, kc, tp, sc, scale); break;
        case 3: Scores<3>(qr, h.q_d, depth, kc, tp, sc, scale); break;
        case 2: Scores<2>(qr, h.q_d, depth, kc, tp, sc, scale); break;
        default: Scores<1>(qr, h.q_d, depth, kc, tp, sc, scale); break;
      }
      c0 += c;
    }
    float inv[kRows];
    for (int r = 0; r < count; ++r) inv[r] = Numerators(s + r * tp, keys);
    for (int64_t g = 0, c0 = 0; g < dv_groups; ++g) {
      const int64_t c = dv_vectors * (g + 1) / dv_groups - c0;
      const __mmask16 mask = c0 + c == dv_vectors ? last : static_cast<__mmask16>(0xffff);
      float* oc[kRows];
      for (int r = 0; r < kRows; ++r) oc[r] = out[r] + 16 * c0;
      const float* vc = v + 16 * c0;
      switch (c) {
        case 4: Values<4>(s, tp, keys, vc, dv, mask, oc, inv, count); break;
        case 3: Values<3>(s, tp, keys, vc, dv, mask, oc, inv, count); break;
        case 2: Values<2>(s, tp, keys, vc, dv, mask, oc, inv, count); break;
        default: Values<1>(s, tp, keys, vc, dv, mask, oc, inv, count); break;
      }
      c0 += c;
    }
  }
}

// k transposed into kt[d][j] (rows of tp, zero past `keys`) and v into rows of dv floats, each read row by row.
void Pack(const Head& h, int64_t depth, int64_t keys, int64_t dv, int64_t tp, float* kt, float* v) {
  for (int64_t j = 0; j < keys; ++j) {
    const float* key = h.k + j * h.k_t;
    for (int64_t d = 0; d < depth; ++d) kt[d * tp + j] = key[d * h.k_d];
    const float* value = h.v + j * h.v_t;
    for (int64_t e = 0; e < dv; ++e) v[j * dv + e] = value[e * h.v_e];
  }
  for (int64_t d = 0; d < depth; ++d) std::fill(kt + d * tp + keys, kt + (d + 1) * tp, 0.f);
}

class AttentionViewsKernel final : public Kernel {
 public:
  AttentionViewsKernel(const StridedView& q, const StridedView& k, const StridedView& v, const AttentionProducts& p,
                       float scale, int threads)
      : q_(q), k_(k), v_(v), p_(p), scale_(scale), threads_(threads) {
    const size_t rank = q.dims.size();
    rows_ = p.scores[rank - 2];
    keys_ = p.scores[rank - 1];
    depth_ = q.dims[rank - 1];
    dv_ = v.dims[rank - 1];
    tp_ = (keys_ + 15) / 16 * 16;
    for (size_t d = 0; d + 2 < rank; ++d) heads_ *= p.context.dims[d];
    scratch_bytes_ = ThreadScratch::Align((depth_ * tp_ + kRows * tp_ + keys_ * dv_) * sizeof(float));
  }
  const char* Name() const override { return "AttentionF32"; }

  void Run(KernelContext& ctx) override {
    const float* qd = ctx.In(0).data<float>();
    const float* kd = ctx.In(1).data<float>();
    const float* vd = ctx.In(2).data<float>();
    float* yd = ctx.Out(0).data<float>();
    const size_t rank = q_.dims.size();
    const int64_t chunks = (rows_ + kChunkRows - 1) / kChunkRows, tasks = heads_ * chunks;
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
        Head h{qd + q_.offset, q_.strides[rank - 2], q_.strides[rank - 1], kd + k_.offset, k_.strides[rank - 2],
               k_.strides[rank - 1], vd + v_.offset, v_.strides[rank - 2], v_.strides[rank - 1], yd,
               p_.context.output_strides[rank - 2]};
        for (int64_t d = static_cast<int64_t>(rank) - 3, rest = head; d >= 0; --d) {
          const int64_t index = rest % p_.context.dims[d];
          rest /= p_.context.dims[d];
          if (q_.dims[d] != 1) h.q += index * q_.strides[d];
          if (k_.dims[d] != 1) h.k += index * k_.strides[d];
          if (v_.dims[d] != 1) h.v += index * v_.strides[d];
          h.o += index * p_.context.output_strides[d];
        }
        if (packed != head) {
          Pack(h, depth_, keys_, dv_, tp_, kt, v);
          packed = head;
        }
        Rows(h, depth_, keys_, dv_, scale_, kt, tp_, v, s, chunk * kChunkRows,
             std::min(rows_, (chunk + 1) * kChunkRows));
      }
    }
  }

 private:
  StridedView q_, k_, v_;
  AttentionProducts p_;
  float scale_;
  int threads_;
  int64_t rows_ = 0, keys_ = 0, depth_ = 0, dv_ = 0, tp_ = 0, heads_ = 1;
  size_t scratch_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Kernel> CreateAttentionViews(const KernelBuildContext& ctx) {
  if (!__builtin_cpu_supports("avx512f") || ctx.input_shapes.size() != 3 || ctx.output_shapes.size() != 1) return nullptr;
  for (DType t : ctx.input_dtypes)
    if (t != DType::kF32) return nullptr;
  for (Layout l : ctx.input_layouts)
    if (l != Layout::kPlain) return nullptr;
  if (ctx.OutLayout(0) != Layout::kPlain) return nullptr;
  const StridedView q = ReadView(ctx.node, "q"), k = ReadView(ctx.node, "k"), v = ReadView(ctx.node, "v");
  const AttentionProducts p = AttentionOf(ctx.node, q, k, v);
  const size_t rank = q.dims.size();
  // Context rows are stored as vectors: their elements must be contiguous in the output (out_perm keeps the last axis).
  if (p.context.output != ctx.output_shapes[0] || p.context.output_strides[rank - 1] != 1) return nullptr;
  const int threads = std::max(1, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads());
  return std::make_unique<AttentionViewsKernel>(q, k, v, p, ctx.node.GetFloat("scale", 1.f), threads);
}

}  // namespace osprey::cpu
