// RNN, GRU and LSTM on CPU: the reference computation (kernels/recurrent_cell.h) with oneDNN's sgemm for the input
// projection of all steps at once ([S*N, I] x [I, G*H]), each step's h·R^T on R packed in panels of 64 columns
// (gemv_panel.h, AVX-512; else oneDNN's sgemm, which for one row took ~1.7x as long: ddddocr's bidirectional 512-wide
// LSTM, 32 steps, 2.9 against 1.75 ms for the recurrence alone), and vectorised sigmoid/tanh. Within 1e-4 of the
// reference (tests/unit/kernels/recurrent_test.cc).
// Float comparisons cannot trap here, which lets GCC turn the selects in vector_math.h into blends (as in
// elementwise_kernels.cc), so the activation loops vectorise.
#pragma GCC optimize("no-trapping-math")

#include <immintrin.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/dnnl_common.h"
#include "kernels/cpu/gemv_panel.h"
#include "kernels/cpu/int16_gemm.h"
#include "kernels/cpu/own_conv.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/recurrent_cell.h"

namespace osprey {
namespace {

// A core's own cache (L2) in bytes as the C library reports it; 1 MiB where it does not.
int64_t CoreCacheBytes() {
  static const int64_t bytes = [] {
    const long reported = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return reported > 0 ? static_cast<int64_t>(reported) : int64_t{1} << 20;
  }();
  return bytes;
}

void DnnlGemmTransB(const float* a, const float* b, float* c, int64_t rows, int64_t cols, int64_t depth) {
  if (rows == 0 || cols == 0) return;
  const dnnl_status_t status = dnnl_sgemm('N', 'T', rows, cols, depth, 1.f, a, depth, b, depth, 1.f, c, cols);
  if (status != dnnl_success)
    throw Error(ErrorCode::kInternal, "oneDNN sgemm failed (status " + std::to_string(static_cast<int>(status)) +
                                          ") for [" + std::to_string(rows) + ", " + std::to_string(depth) + "] x [" +
                                          std::to_string(depth) + ", " + std::to_string(cols) + "]");
}

// Sigmoid and Tanh (the default activations) with vector_math.h's polynomials in `omp simd` loops compiled for
// AVX-512/AVX2/baseline (as the elementwise kernels); the others as the reference computes them.
__attribute__((target_clones("avx512f", "avx2", "default"))) void FastActivate(const RecurrentActivation& act,
                                                                               float* data, int64_t n, float clip) {
  if (clip > 0.f) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) data[i] = data[i] < -clip ? -clip : (data[i] > clip ? clip : data[i]);
  }
  switch (act.kind) {
    case RecurrentActivation::Kind::kSigmoid:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) data[i] = cpu::vmath::Sigmoid(data[i]);
      return;
    case RecurrentActivation::Kind::kTanh:
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) data[i] = cpu::vmath::Tanh(data[i]);
      return;
    default:
      ApplyRecurrentActivation(act, data, n, 0.f);
  }
}

// The int8 products of an `_int8_weights` LSTM (kernels/recurrent_cell.h). With AVX-512 VNNI each weight of each
// direction is packed at build as [G/16][K/4][16 columns][4 bytes] (K and G padded with zeros), so one vpdpbusd
// multiplies 4 consecutive activation bytes with 4 weights of each of 16 columns. Without VNNI (AVX2) the weights are
// packed [G/8][K/2][8][2] as int8 and widened to int16 as they are loaded (vpmovsxbw: a step reads 1 byte per weight,
// as with VNNI; packed as int16, ddddocr's 512-wide LSTM read 2 MB per step and direction, beyond L2), and vpmaddwd
// multiplies 2 activation values with 2 weights of each of 8 columns, summing pairs in 32 bits (255 x 128 x 2 fits:
// exact, unlike vpmaddubsw's 16-bit sums). Either way the
// activation's zero point comes off with each column's weight sum. The plain loops ran ddddocr's LSTM in 43 ms where
// the float LSTM took 5.3 (docs/performance.md, "Twentieth session"). The int8 weights are 1/4 of the float ones per
// step (1 MB instead of 4 for ddddocr's 512-wide LSTM), which is what a step is bound by.
// 16 int8 weights (8 columns x 2 values) as int16.
__attribute__((target("avx2"))) inline __m256i WidenInt8(const int8_t* p) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

class PackedInt8Weight {
 public:
  // The packed weight lives in a buffer from the weight store where there is one (shared with other plans and
  // models, and counted in the model's bytes), else its own: [packed weights | column sums].
  PackedInt8Weight(const KernelBuildContext& ctx, const Tensor& w8, bool vnni) : vnni_(vnni) {
    dirs_ = w8.dim(0);
    cols_ = w8.dim(1);
    depth_ = w8.dim(2);
    const int64_t cw = vnni ? 16 : 8, kw = vnni ? 4 : 2;  // columns per block, values per column and step
    kb_ = (depth_ + kw - 1) / kw;
    gb_ = (cols_ + cw - 1) / cw;
    const size_t element = 1;
    const size_t packed_bytes = cpu::ThreadScratch::Align(static_cast<size_t>(dirs_ * gb_ * kb_ * cw * kw) * element);
    const size_t bytes = packed_bytes + static_cast<size_t>(dirs_ * gb_ * cw) * sizeof(int32_t);
    auto fill = [&](void* data) {
      std::memset(data, 0, bytes);
      int32_t* sums = reinterpret_cast<int32_t*>(static_cast<char*>(data) + packed_bytes);
      const int8_t* w = w8.data<int8_t>();
      for (int64_t d = 0; d < dirs_; ++d)
        for (int64_t g = 0; g < cols_; ++g)
          for (int64_t k = 0; k < depth_; ++k) {
            const int8_t v = w[(d * cols_ + g) * depth_ + k];
            const size_t at = static_cast<size_t>((((d * gb_ + g / cw) * kb_ + k / kw) * cw + g % cw) * kw + k % kw);
            static_cast<int8_t*>(data)[at] = v;
            sums[d * gb_ * cw + g] += v;
          }
    };
    if (ctx.derive_weight && w8.buffer()) {
      buffer_ = ctx.derive_weight(w8, vnni ? "lstm-int8-vnni" : "lstm-int8-avx2-bytes", bytes, fill);
    } else {
      buffer_ = Allocator::Host().Allocate(bytes);
      fill(buffer_->data());
    }
    packed_ = static_cast<const char*>(buffer_->data());
    col_sums_ = reinterpret_cast<const int32_t*>(packed_ + packed_bytes);
  }

  void Run(int64_t dir, const uint8_t* aq, int32_t a_zero, int32_t* acc) const {
    if (vnni_)
      RunVnni(dir, aq, a_zero, acc);
    else
      RunAvx2(dir, aq, a_zero, acc);
  }

 private:
  // acc[g] = sum_k (aq[k] - a_zero) * w[dir][g][k] for the `cols` columns (the weight's own).
  __attribute__((target("avx512f,avx512vnni"))) void RunVnni(int64_t dir, const uint8_t* aq, int32_t a_zero,
                                                              int32_t* acc) const {
    // The activation padded to whole groups of 4 (the padded weights are zero).
    static thread_local std::vector<uint8_t> padded;  // reused: this runs once per step
    const uint8_t* ap = aq;
    if (depth_ % 4 != 0) {
      padded.assign(static_cast<size_t>(kb_ * 4), 0);
      std::memcpy(padded.data(), aq, static_cast<size_t>(depth_));
      ap = padded.data();
    }
    const int8_t* w = reinterpret_cast<const int8_t*>(packed_) + dir * gb_ * kb_ * 64;
    const int32_t* sums = col_sums_ + dir * gb_ * 16;
    const __m512i zero = _mm512_set1_epi32(a_zero);
    int64_t gb = 0;
    for (; gb + 4 <= gb_; gb += 4) {  // four blocks of 16 columns share each broadcast of the activation
      __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
      const int8_t* w0 = w + gb * kb_ * 64;
      for (int64_t k = 0; k < kb_; ++k) {
        int32_t four;
        std::memcpy(&four, ap + 4 * k, 4);
        const __m512i x = _mm512_set1_epi32(four);
        a0 = _mm512_dpbusd_epi32(a0, x, _mm512_loadu_si512(w0 + k * 64));
        a1 = _mm512_dpbusd_epi32(a1, x, _mm512_loadu_si512(w0 + (kb_ + k) * 64));
        a2 = _mm512_dpbusd_epi32(a2, x, _mm512_loadu_si512(w0 + (2 * kb_ + k) * 64));
        a3 = _mm512_dpbusd_epi32(a3, x, _mm512_loadu_si512(w0 + (3 * kb_ + k) * 64));
      }
      Store(a0, zero, sums, gb, acc);
      Store(a1, zero, sums, gb + 1, acc);
      Store(a2, zero, sums, gb + 2, acc);
      Store(a3, zero, sums, gb + 3, acc);
    }
    for (; gb < gb_; ++gb) {
      __m512i a = _mm512_setzero_si512();
      const int8_t* wb = w + gb * kb_ * 64;
      for (int64_t k = 0; k < kb_; ++k) {
        int32_t four;
        std::memcpy(&four, ap + 4 * k, 4);
        a = _mm512_dpbusd_epi32(a, _mm512_set1_epi32(four), _mm512_loadu_si512(wb + k * 64));
      }
      Store(a, zero, sums, gb, acc);
    }
  }

  // acc[16 gb + j] = sum - a_zero * column sum, for the columns that exist.
  __attribute__((target("avx512f,avx512vnni"))) void Store(__m512i sum, __m512i zero, const int32_t* sums, int64_t gb,
                                                            int32_t* acc) const {
    const __m512i v = _mm512_sub_epi32(sum, _mm512_mullo_epi32(zero, _mm512_loadu_si512(sums + gb * 16)));
    const int64_t left = cols_ - gb * 16;
    if (left >= 16)
      _mm512_storeu_si512(acc + gb * 16, v);
    else
      _mm512_mask_storeu_epi32(acc + gb * 16, static_cast<__mmask16>((1u << left) - 1), v);
  }

  // As RunVnni, 8 columns and 2 values per step, int16 (AVX2).
  __attribute__((target("avx2"))) void RunAvx2(int64_t dir, const uint8_t* aq, int32_t a_zero, int32_t* acc) const {
    // The activation as pairs of int16 in one int32 each (the padded weights are zero).
    static thread_local std::vector<int32_t> pairs;  // reused: this runs once per step
    pairs.resize(static_cast<size_t>(kb_));
    for (int64_t k = 0; k < kb_; ++k) {
      const uint32_t lo = aq[2 * k], hi = 2 * k + 1 < depth_ ? aq[2 * k + 1] : 0;
      pairs[static_cast<size_t>(k)] = static_cast<int32_t>(lo | (hi << 16));
    }
    const int8_t* w = reinterpret_cast<const int8_t*>(packed_) + dir * gb_ * kb_ * 16;
    const int32_t* sums = col_sums_ + dir * gb_ * 8;
    const __m256i zero = _mm256_set1_epi32(a_zero);
    auto store = [&](__m256i sum, int64_t b) {
      const __m256i v = _mm256_sub_epi32(
          sum, _mm256_mullo_epi32(zero, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums + b * 8))));
      alignas(32) int32_t out[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(out), v);
      const int64_t n = std::min<int64_t>(8, cols_ - b * 8);
      std::memcpy(acc + b * 8, out, static_cast<size_t>(n) * sizeof(int32_t));
    };
    int64_t b = 0;
    for (; b + 4 <= gb_; b += 4) {  // four blocks of 8 columns share each broadcast
      __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
      const int8_t* w0 = w + b * kb_ * 16;
      for (int64_t k = 0; k < kb_; ++k) {
        const __m256i x = _mm256_set1_epi32(pairs[static_cast<size_t>(k)]);
        auto load = [&](int64_t j) { return WidenInt8(w0 + (j * kb_ + k) * 16); };
        a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(x, load(0)));
        a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(x, load(1)));
        a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(x, load(2)));
        a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(x, load(3)));
      }
      store(a0, b);
      store(a1, b + 1);
      store(a2, b + 2);
      store(a3, b + 3);
    }
    for (; b < gb_; ++b) {
      __m256i a = _mm256_setzero_si256();
      const int8_t* wb = w + b * kb_ * 16;
      for (int64_t k = 0; k < kb_; ++k)
        a = _mm256_add_epi32(
            a, _mm256_madd_epi16(_mm256_set1_epi32(pairs[static_cast<size_t>(k)]), WidenInt8(wb + k * 16)));
      store(a, b);
    }
  }

  bool vnni_ = false;
  int64_t dirs_ = 0, cols_ = 0, depth_ = 0, kb_ = 0, gb_ = 0;  // blocks of values (4 or 2) and of columns (16 or 8)
  std::shared_ptr<Buffer> buffer_;
  const char* packed_ = nullptr;       // int8 blocks (VNNI: 16 columns x 4; AVX2: 8 x 2)
  const int32_t* col_sums_ = nullptr;  // per direction and (padded) column
};

// W [D, G, I] int8 as the B operand of int16_gemm.h's product ([I] x [G] per direction), for the input projection of
// every step at once on AVX2: row by row, each of ddddocr's 32 rows read W again (1 MB per direction).
class ProjectionInt16 {
 public:
  ProjectionInt16(const KernelBuildContext& ctx, const Tensor& w8) {
    dirs_ = w8.dim(0);
    cols_ = w8.dim(1);
    depth_ = w8.dim(2);
    threads_ = std::max(1, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads());
    const int64_t per_dir = cpu::Int16PackedSize(depth_, cols_);
    const size_t bytes = sizeof(int16_t) * static_cast<size_t>(dirs_ * per_dir);
    auto fill = [&](void* data) {
      const int8_t* w = w8.data<int8_t>();
      for (int64_t d = 0; d < dirs_; ++d)
        cpu::PackInt16B(
            depth_, cols_, [&](int64_t k, int64_t g) { return int16_t{w[(d * cols_ + g) * depth_ + k]}; },
            static_cast<int16_t*>(data) + d * per_dir);
    };
    if (ctx.derive_weight && w8.buffer()) {
      buffer_ = ctx.derive_weight(w8, "lstm-w-int16-panels", bytes, fill);
    } else {
      buffer_ = Allocator::Host().Allocate(bytes);
      fill(buffer_->data());
    }
  }

  // acc [rows, G] for aq [rows, I] of direction `dir`: the columns' panels split over the threads.
  void Run(int64_t dir, const uint8_t* aq, int64_t rows, int32_t a_zero, int32_t* acc) const {
    const int64_t kp = cpu::Int16PairedK(depth_);
    std::vector<int16_t> a(static_cast<size_t>(rows * kp), 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < depth_; ++k) a[r * kp + k] = static_cast<int16_t>(aq[r * depth_ + k] - a_zero);
    const int16_t* b = static_cast<const int16_t*>(buffer_->data()) + dir * cpu::Int16PackedSize(depth_, cols_);
    cpu::Int16GemmThreaded(a.data(), rows, kp, b, acc, cols_, threads_, int64_t{1} << 18);
  }

 private:
  int64_t dirs_ = 0, cols_ = 0, depth_ = 0;
  int threads_ = 1;
  std::shared_ptr<Buffer> buffer_;
};

// R packed for the steps; W packed for the input projection, either as one int16 product (AVX2 without VNNI) or
// for the row-by-row products (VNNI).
struct PackedLstmWeights {
  PackedInt8Weight r;
  std::optional<PackedInt8Weight> w;
  std::unique_ptr<ProjectionInt16> projection;
  static void Product(const void* self, RecurrentWeight which, int64_t dir, const int8_t*, const uint8_t* aq,
                      int32_t a_zero, int32_t* acc, int64_t, int64_t) {
    const auto* p = static_cast<const PackedLstmWeights*>(self);
    (which == RecurrentWeight::kR ? p->r : *p->w).Run(dir, aq, a_zero, acc);
  }
  static bool Project(const void* self, int64_t dir, const uint8_t* aq, int64_t rows, int32_t a_zero, int32_t* acc) {
    static_cast<const PackedLstmWeights*>(self)->projection->Run(dir, aq, rows, a_zero, acc);
    return true;
  }
  RecurrentQuantProduct Products() const { return {Product, this, projection ? Project : nullptr}; }
};

// The float weights packed at build. R [D, G*H, H] per direction and per column range a step multiplies (LSTM: all
// 4H; GRU: z and r together, then h; RNN: H), as panels of 64 columns: one step's product runs the panels on the
// calling thread inside the (direction, item) parallel loop, or split over the plan's threads when that loop has
// a single pair (one direction, batch 1) and the product is large enough to pay for the fork. W [D, G*H, I] per
// direction in the layout of a oneDNN matmul primitive for the input projection of all [S*N] rows at once (with a
// sum post-op: the rows hold the biases already); oneDNN's sgemm on the plain W ([32, 512] x [512, 2048] in
// ddddocr's LSTM) took 1.35 ms per direction, repacking W at every call.
class PackedFloatWeights {
 public:
  PackedFloatWeights(const KernelBuildContext& ctx, const Tensor& r, const std::string& op, int64_t hidden)
      : hidden_(hidden), threads_(std::max(1, ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads())) {
    if (op == "LSTM") {
      ranges_ = {{0, 4 * hidden}};
    } else if (op == "GRU") {
      ranges_ = {{0, 2 * hidden}, {2 * hidden, hidden}};
    } else {
      ranges_ = {{0, hidden}};
    }
    const int64_t dirs = r.dim(0), gh = r.dim(1);
    const dnnl::memory::desc whole({dirs, gh, 1, hidden}, dnnl::memory::data_type::f32,
                                   dnnl::memory::dims{gh * hidden, hidden, hidden, 1});
    for (int64_t d = 0; d < dirs; ++d)
      for (const auto& [col0, cols] : ranges_)
        packs_.push_back(cpu::PackGemvPanels(ctx, whole.submemory_desc({1, cols, 1, hidden}, {d, col0, 0, 0}), r,
                                             cols, hidden));
    passes_ = std::make_unique<std::atomic<uint32_t>[]>(packs_.size());
    // A direction's R larger than a core's cache: each step's product split over the threads (each reading its part
    // of R) beats a direction per thread (each reading all of it from memory every step). ddddocr's bidirectional
    // 512-wide LSTM (4 MiB of R per direction, 2 MiB caches): 5.8 -> 3.0 ms with the alternating order below; a
    // 256-wide one (1 MiB): 0.67 ms with a direction per thread against 0.79 split (docs/performance.md,
    // "Thirty-fifth session").
    // Where a large last-level cache serves R, a direction per thread wins instead (ChooseRecurrentSplit times both).
    can_split_ = threads_ > 1 && gh * hidden >= kSplitProduct;
    splits_steps_ = can_split_ && gh * hidden * static_cast<int64_t>(sizeof(float)) > CoreCacheBytes();
  }

  // Whether each step's product may be split over the threads (the directions one after another) instead of each
  // (direction, group of items) running on a thread of its own; and whether it is.
  bool can_split() const { return can_split_; }
  void set_splits_steps(bool split) { splits_steps_ = split && can_split_; }

  bool splits_steps() const { return splits_steps_; }

  bool ok() const {
    for (const cpu::PackedWeight& p : packs_)
      if (p.memory.get_data_handle() == nullptr) return false;
    return !packs_.empty();
  }

  // The input projection's matmul for `rows` rows of X [rows, I] when W is a constant [D, G*H, I]; left out (the
  // gemm runs) when oneDNN has only its reference implementation.
  void BuildProjection(const KernelBuildContext& ctx, const Tensor& w, int64_t rows) {
    using dnnl::memory;
    const int64_t dirs = w.dim(0), gh = w.dim(1), input = w.dim(2);
    if (rows <= 0 || gh <= 0 || input <= 0) return;
    cpu::OmpThreadsGuard threads(ctx.num_threads);
    const memory::desc x_md({1, rows, input}, memory::data_type::f32, memory::format_tag::abc);
    const memory::desc xw_md({1, rows, gh}, memory::data_type::f32, memory::format_tag::abc);
    const memory::desc w_any({1, input, gh}, memory::data_type::f32, memory::format_tag::any);
    const memory::desc bias_md({1, 1, gh}, memory::data_type::f32, memory::format_tag::abc);
    dnnl::matmul::primitive_desc pd(cpu::CpuEngine(), x_md, w_any, bias_md, xw_md, cpu::BaseAttr(),
                                    /*allow_empty=*/true);
    if (!pd || cpu::IsReferenceImpl(pd)) return;
    // W^T plain with G*H a multiple of 256 (an LSTM of hidden 64, 128, 256...): rows padded, as a MatMul's constant B
    // (a bidirectional 512-wide LSTM at batch 8: 3.3 -> 1.4 ms per direction on a 2-vCPU EPYC Zen 3).
    if (const memory::desc padded = cpu::PaddedRows(pd.weights_desc()); !padded.is_zero()) {
      dnnl::matmul::primitive_desc padded_pd(cpu::CpuEngine(), x_md, padded, bias_md, xw_md, cpu::BaseAttr(),
                                             /*allow_empty=*/true);
      if (padded_pd && !cpu::IsReferenceImpl(padded_pd) && padded_pd.weights_desc() == padded) pd = padded_pd;
    }
    // W_d^T as [1, I, G*H]: W's element (g, i) of direction d is at (d * G*H + g) * I + i.
    const memory::desc whole({dirs, input, gh}, memory::data_type::f32, memory::dims{gh * input, 1, input});
    std::vector<cpu::PackedWeight> packs;
    for (int64_t d = 0; d < dirs; ++d) {
      packs.push_back(cpu::PackWeight(ctx, whole.submemory_desc({1, input, gh}, {d, 0, 0}), w, pd.weights_desc()));
      if (packs.back().memory.get_data_handle() == nullptr) return;
    }
    matmul_ = dnnl::matmul(pd);
    x_md_ = x_md;
    xw_md_ = xw_md;
    bias_md_ = bias_md;
    scratch_md_ = pd.scratchpad_desc();
    w_packs_ = std::move(packs);
    rows_ = rows;
  }

  static bool Project(const void* self, int64_t dir, const float* x, const float* bias, float* xw, int64_t rows) {
    const auto* p = static_cast<const PackedFloatWeights*>(self);
    if (p->w_packs_.empty() || rows != p->rows_) return false;
    char* scratch = cpu::ThreadScratch::Reserve(cpu::ThreadScratch::Align(p->scratch_md_.get_size()));
    cpu::ExecArgs args;
    args.Add(DNNL_ARG_SRC, cpu::WrapMemory(p->x_md_, x))
        .Add(DNNL_ARG_WEIGHTS, p->w_packs_[static_cast<size_t>(dir)].memory)
        .Add(DNNL_ARG_BIAS, cpu::WrapMemory(p->bias_md_, bias))
        .Add(DNNL_ARG_DST, cpu::WrapMemory(p->xw_md_, xw))
        .Add(DNNL_ARG_SCRATCHPAD, cpu::WrapMemory(p->scratch_md_, scratch));
    dnnl::stream& stream = cpu::ThreadStream();
    args.Execute(p->matmul_, stream);
    stream.wait();
    return true;
  }

  // The packed panels of direction `dir`'s range (col0, cols); throws when it was not packed.
  const float* Panels(int64_t dir, int64_t col0, int64_t cols, int64_t depth, size_t* index_out = nullptr) const {
    size_t range = 0;
    while (range < ranges_.size() && ranges_[range].first != col0) ++range;
    if (range == ranges_.size() || ranges_[range].second != cols || depth != hidden_ || dir < 0 ||
        static_cast<size_t>(dir) * ranges_.size() + range >= packs_.size())
      throw Error(ErrorCode::kInternal, "recurrent step product asked for columns " + std::to_string(col0) + " + " +
                                            std::to_string(cols) + " of depth " + std::to_string(depth) +
                                            ", which were not packed");
    const size_t index = static_cast<size_t>(dir) * ranges_.size() + range;
    if (index_out) *index_out = index;
    return static_cast<const float*>(packs_[index].memory.get_data_handle());
  }

  // Columns [first, last) of Step's product on the calling thread (RecurrentFloatProducts::step_columns): first and
  // last multiples of the panel width, or last == cols.
  static void StepColumns(const void* self, int64_t dir, int64_t col0, const float* h, float* c, int64_t rows,
                          int64_t cols, int64_t depth, int64_t first, int64_t last) {
    const auto* p = static_cast<const PackedFloatWeights*>(self);
    const float* panels = p->Panels(dir, col0, cols, depth);
    const int64_t width = cpu::GemvPanelWidth();
    if (first < 0 || last > cols || first > last || first % width != 0 || (last % width != 0 && last != cols))
      throw Error(ErrorCode::kInternal, "recurrent step product asked for columns " + std::to_string(first) + ".." +
                                            std::to_string(last) + " of " + std::to_string(cols) +
                                            ", not on panel boundaries");
    if (first < last) cpu::GemvPanels(h, panels, depth, cols, c, true, first / width, (last + width - 1) / width, rows);
  }

  static void Step(const void* self, int64_t dir, int64_t col0, const float* h, float* c, int64_t rows, int64_t cols,
                   int64_t depth) {
    const auto* p = static_cast<const PackedFloatWeights*>(self);
    size_t index = 0;
    const float* panels = p->Panels(dir, col0, cols, depth, &index);
    const int64_t width = cpu::GemvPanelWidth(), count = (cols + width - 1) / width;
    const int team = !omp_in_parallel() && rows * cols * depth >= kSplitProduct
                         ? std::max(1, std::min<int>(p->threads_, static_cast<int>(count)))
                         : 1;
    // Every other step reads its panels last to first: those read last, still in this core's cache, come first, so
    // an R larger than the cache streams only in part from memory (a bidirectional 512-wide LSTM, 2 MiB of R per core
    // per step on a 2 MiB cache: 3.6 -> 2.7 ms). The order changes nothing in the results.
    const bool backwards = (p->passes_[index].fetch_add(1, std::memory_order_relaxed) & 1) != 0;
    // Panel by panel, every row (batch item) through it together.
    auto product = [&](int64_t first, int64_t last) {
      if (!backwards) return cpu::GemvPanels(h, panels, depth, cols, c, true, first, last, rows);
      for (int64_t q = last; q > first; --q) cpu::GemvPanels(h, panels, depth, cols, c, true, q - 1, q, rows);
    };
    if (team == 1) return product(0, count);
#pragma omp parallel num_threads(team)
    {
      const int64_t part = omp_get_thread_num(), parts = omp_get_num_threads();
      product(count * part / parts, count * (part + 1) / parts);
    }
  }

 private:
  // A step's product with at least this many multiplications splits its columns over the threads.
  static constexpr int64_t kSplitProduct = int64_t{1} << 17;

  int64_t hidden_;
  int threads_;
  bool can_split_ = false;
  bool splits_steps_ = false;
  std::vector<std::pair<int64_t, int64_t>> ranges_;  // (first column, columns) a step multiplies
  std::vector<cpu::PackedWeight> packs_;             // R per direction, per range
  std::unique_ptr<std::atomic<uint32_t>[]> passes_;  // steps multiplied per pack (their parity picks the order)
  // The input projection (BuildProjection): W per direction, for rows_ rows.
  std::vector<cpu::PackedWeight> w_packs_;
  dnnl::matmul matmul_;
  dnnl::memory::desc x_md_, xw_md_, bias_md_, scratch_md_;
  int64_t rows_ = 0;
};

class RecurrentF32Dnnl final : public Kernel {
 public:
  RecurrentF32Dnnl(const KernelBuildContext& ctx, std::string name, std::unique_ptr<PackedLstmWeights> packed = nullptr,
                   std::unique_ptr<PackedFloatWeights> packed_float = nullptr)
      : name_(std::move(name)),
        packed_(std::move(packed)),
        packed_float_(std::move(packed_float)),
        projection_bytes_(
            ctx.input_shapes.size() > 1 ? RecurrentProjectionBytes(ctx.input_shapes[0], ctx.input_shapes[1]) : 0) {}
  const char* Name() const override { return name_.c_str(); }
  // The input projection in the run's arena: allocated once with it, not page-faulted in at every run.
  size_t WorkspaceBytes() const override { return projection_bytes_; }
  void Run(KernelContext& ctx) override {
    float* projection = ctx.workspace && projection_bytes_ &&
                                RecurrentProjectionBytes(ctx.In(0).shape(), ctx.In(1).shape()) == projection_bytes_
                            ? static_cast<float*>(ctx.workspace)
                            : nullptr;
    if (packed_)
      RunRecurrent(ctx, DnnlGemmTransB, FastActivate, packed_->Products(), {}, projection);
    else if (packed_float_)
      RunRecurrent(ctx, DnnlGemmTransB, FastActivate, {RecurrentQuantProductLoops, nullptr},
                   {PackedFloatWeights::Step, PackedFloatWeights::Project, packed_float_.get(),
                    packed_float_->splits_steps(), PackedFloatWeights::StepColumns, cpu::GemvPanelWidth()},
                   projection);
    else
      RunRecurrent(ctx, DnnlGemmTransB, FastActivate, {RecurrentQuantProductLoops, nullptr}, {}, projection);
  }

 private:
  std::string name_;
  std::unique_ptr<PackedLstmWeights> packed_;
  std::unique_ptr<PackedFloatWeights> packed_float_;
  size_t projection_bytes_;
};

// One run of `kernel` on zeros (the sequence lengths, when an input, the whole sequence; constants as they are) in
// milliseconds: the second of two, or the first alone when it took kLongTimedRunMs or more (a long sequence is not
// run again and again at compile). Throws when a tensor is not float32/int32 or they are over 64 MiB together (the
// callers then keep their rule).
double RecurrentRunMs(const KernelBuildContext& bc, Kernel& kernel) {
  std::vector<Tensor> owned;
  owned.reserve(bc.input_shapes.size() + bc.output_shapes.size());
  KernelContext ctx{bc.node, bc.opset};
  int64_t bytes = 0;
  constexpr int64_t kMaxBytes = int64_t{64} << 20;
  auto zeros = [&](DType dtype, const Shape& shape) -> Tensor* {
    int64_t n = 1;
    for (int64_t d : shape) n = d < 0 || (d > 0 && n > kMaxBytes / d) ? kMaxBytes + 1 : n * d;
    bytes += std::min(n, kMaxBytes + 1) * static_cast<int64_t>(DTypeSize(dtype));
    if (bytes > kMaxBytes || (dtype != DType::kF32 && dtype != DType::kI32))
      throw Error(ErrorCode::kUnsupported, "recurrent timing: tensors too large or not float32/int32");
    owned.push_back(Tensor::Zeros(dtype, shape));
    return &owned.back();
  };
  for (size_t i = 0; i < bc.input_shapes.size(); ++i) {
    if (i >= bc.present.size() || !bc.present[i]) {
      ctx.inputs.push_back(nullptr);
    } else if (i < bc.input_values.size() && bc.input_values[i] != nullptr) {
      ctx.inputs.push_back(bc.input_values[i]);
    } else {
      Tensor* t = zeros(bc.input_dtypes[i], bc.input_shapes[i]);
      if (i == 4) {  // sequence_lens: every item the whole sequence
        const int64_t seq = bc.node.GetInt("layout", 0) == 0 ? bc.input_shapes[0][0] : bc.input_shapes[0][1];
        std::fill_n(t->data<int32_t>(), t->numel(), static_cast<int32_t>(seq));
      }
      ctx.inputs.push_back(t);
    }
  }
  for (size_t o = 0; o < bc.output_shapes.size(); ++o) {
    ctx.outputs.push_back(zeros(bc.output_dtypes[o], bc.output_shapes[o]));
  }
  double ms = 0;
  for (int run = 0; run < 2 && ms < cpu::kLongTimedRunMs; ++run) {
    const auto start = std::chrono::steady_clock::now();
    kernel.Run(ctx);
    ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  return ms;
}

// The operation and its shapes, for remembering timed choices: X's dims by size class (a recogniser's sequence length
// follows each text line's width: not timed again at every width, as TuningActivationKey), W, R and B exactly.
std::string RecurrentTuningKey(const KernelBuildContext& ctx) {
  std::string key = ctx.node.op_type + ":" + ctx.node.GetString("direction", "forward") + ":" +
                    std::to_string(ctx.node.GetInt("layout", 0)) + ":";
  for (size_t i = 0; i < ctx.input_shapes.size() && i < 4; ++i) {
    if (i == 0) {
      const dnnl::memory::dims x(ctx.input_shapes[0].begin(), ctx.input_shapes[0].end());
      key += cpu::TuningOperandKey(dnnl::memory::desc(x, dnnl::memory::data_type::f32, dnnl::memory::format_tag::abc),
                                   cpu::TuningDims::kAllByClass);
    } else {
      key += ShapeToString(ctx.input_shapes[i]) + ";";
    }
  }
  return key;
}

// Whether each step's product is split over the threads (the directions one after another) or each (direction, group
// of items) runs on a thread of its own: OSPREY_RECURRENT_SPLIT=1 / 0 forces it; else timed on this machine, the
// whole kernel both ways, when the build tunes (remembered like every tuning choice); else PackedFloatWeights' cache
// rule. The rule came from a Sapphire Rapids Xeon (2 MiB of L2 per core, R from memory): split 2.7 against 5.4 ms for
// a bidirectional 512-wide LSTM at batch 1. On a 2-vCPU EPYC Zen 3 (512 KiB of L2, 32 MiB of L3) a direction per
// thread won at every batch tried: 256-wide 1.0 against 1.1-1.4 ms at batch 1, 5.2-5.8 against 6.2-7.5 at batch 8
// (docs/performance.md, "Fifty-second session"). Timing the steps' products alone chose wrongly there: split, the
// activations run on one thread.
void ChooseRecurrentSplit(const KernelBuildContext& ctx, Kernel& kernel, PackedFloatWeights& weights) {
  if (!weights.can_split()) return;
  if (const char* forced = std::getenv("OSPREY_RECURRENT_SPLIT"); forced && (*forced == '0' || *forced == '1'))
    return weights.set_splits_steps(*forced == '1');
  if (!ctx.tune || ctx.input_shapes.empty() || ctx.input_shapes[0].size() != 3) return;
  cpu::OmpThreadsGuard threads(ctx.num_threads);
  const bool rule = weights.splits_steps();
  auto time = [&](bool split) {
    weights.set_splits_steps(split);
    return RecurrentRunMs(ctx, kernel);
  };
  try {
    weights.set_splits_steps(cpu::PreferFirstTimed(
        "recurrent-steps:" + RecurrentTuningKey(ctx), "split", "per-direction", [&] { return time(true); },
        [&] { return time(false); }));
  } catch (const std::exception&) {
    weights.set_splits_steps(rule);  // timing is advice: the rule stands
  }
}

// Without AVX-512 the panels (16 columns, AVX2) are timed against oneDNN's sgemm when the build tunes, the whole kernel
// each way: a one-step 128-wide LSTM (Silero VAD's) ran 17 us on the panels against 10 on the sgemm, which splits
// even that small a product over the threads (2-vCPU EPYC Zen 3); a 32-step bidirectional one 0.25-0.36 against
// 0.34-0.60 ms. OSPREY_GEMV=1 keeps the panels untimed (the tests), =0 leaves them out.
bool PanelsBeatOnednn(const KernelBuildContext& ctx, Kernel& panels, Kernel& onednn) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  const char* forced = std::getenv("OSPREY_GEMV");
  if (avx512 || (forced && std::string(forced) == "1") || !ctx.tune || ctx.input_shapes.empty() ||
      ctx.input_shapes[0].size() != 3)
    return true;
  cpu::OmpThreadsGuard threads(ctx.num_threads);
  try {
    return cpu::PreferFirstTimed(
        "recurrent-panels-avx2:" + RecurrentTuningKey(ctx), "panels", "onednn",
        [&] { return RecurrentRunMs(ctx, panels); }, [&] { return RecurrentRunMs(ctx, onednn); });
  } catch (const std::exception&) {
    return true;
  }
}

}  // namespace

std::unique_ptr<Kernel> CreateRecurrentKernel(const KernelBuildContext& ctx) {
  const std::string& op = ctx.node.op_type;
  if (op != "RNN" && op != "GRU" && op != "LSTM") return nullptr;
  for (size_t i = 0; i < ctx.input_dtypes.size(); ++i)
    if (ctx.present[i] && i != 4 && i != 8 && i != 10 && ctx.input_dtypes[i] != DType::kF32) return nullptr;
  // `_int8_weights`: packed products (VNNI, else AVX2) when the weights are known, else the loops. VNNI is used
  // where the CPU has it and Int8ProductsExact() agrees (OSPREY_INT8_PAIRING=1 forces AVX2, for the tests).
  if (op == "LSTM" && ctx.node.GetInt("_int8_weights", 0) != 0) {
    const Tensor* r8 = ctx.input_values.size() > 10 ? ctx.input_values[8] : nullptr;
    const Tensor* w8 = ctx.input_values.size() > 10 ? ctx.input_values[10] : nullptr;
    static const bool has_vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512f");
    static const bool has_avx2 = __builtin_cpu_supports("avx2");
    const bool vnni = has_vnni && Int8ProductsExact();
    if (r8 != nullptr && r8->raw() != nullptr && w8 != nullptr && w8->raw() != nullptr && (vnni || has_avx2)) {
      auto packed = std::unique_ptr<PackedLstmWeights>(new PackedLstmWeights{PackedInt8Weight(ctx, *r8, vnni)});
      if (vnni)
        packed->w.emplace(ctx, *w8, vnni);
      else
        packed->projection = std::make_unique<ProjectionInt16>(ctx, *w8);  // AVX2 (has_avx2)
      return std::make_unique<RecurrentF32Dnnl>(ctx, vnni ? "LSTMInt8Vnni" : "LSTMInt8Avx2", std::move(packed));
    }
    return std::make_unique<RecurrentF32Dnnl>(ctx, "LSTMInt8");
  }
  // Packed R when it is a constant (known at build) and the panels can run here; then W too when it is constant.
  const Tensor* r = ctx.input_values.size() > 2 ? ctx.input_values[2] : nullptr;
  if (r != nullptr && r->raw() != nullptr && r->rank() == 3 && cpu::RecurrentPanelsAvailable()) {
    const int64_t hidden = r->dim(2);
    if (hidden > 0 && r->dim(1) % hidden == 0) {
      auto packed = std::make_unique<PackedFloatWeights>(ctx, *r, op, hidden);
      const Tensor* w = ctx.input_values.size() > 1 ? ctx.input_values[1] : nullptr;
      const Shape& x = ctx.input_shapes[0];
      if (w != nullptr && w->raw() != nullptr && w->rank() == 3 && x.size() == 3 && w->dim(1) == r->dim(1))
        packed->BuildProjection(ctx, *w, x[0] * x[1]);
      if (packed->ok()) {
        PackedFloatWeights* weights = packed.get();
        auto kernel = std::make_unique<RecurrentF32Dnnl>(ctx, op + "F32Panels", nullptr, std::move(packed));
        ChooseRecurrentSplit(ctx, *kernel, *weights);
        auto onednn = std::make_unique<RecurrentF32Dnnl>(ctx, op + "F32Dnnl");
        if (!PanelsBeatOnednn(ctx, *kernel, *onednn)) return onednn;
        return kernel;
      }
    }
  }
  return std::make_unique<RecurrentF32Dnnl>(ctx, op + "F32Dnnl");
}

}  // namespace osprey
