// Reference kernels of RNN, GRU and LSTM (schemas and shapes: src/ops/recurrent.cc). The computation is
// kernels/recurrent_cell.h; here its matrix products are plain dot-product loops.
#include <omp.h>

#include <algorithm>

#include "kernels/recurrent_cell.h"
#include "kernels/reference/reference.h"

namespace osprey {
namespace {

// c[m, n] += a[m, :] · b[n, :]. Blocked over rows of both so a block of `b` stays in cache while a block of `a`
// passes over it.
void GemmTransB(const float* a, const float* b, float* c, int64_t rows, int64_t cols, int64_t depth) {
  constexpr int64_t kRowBlock = 16, kColBlock = 64;
  const int64_t row_blocks = (rows + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (rows > 1 && static_cast <double>(rows) * cols * depth >= 1e6)
  for (int64_t rb = 0; rb < row_blocks; ++rb) {
    const int64_t r_end = std::min(rows, (rb + 1) * kRowBlock);
    for (int64_t c0 = 0; c0 < cols; c0 += kColBlock) {
      const int64_t c_end = std::min(cols, c0 + kColBlock);
      for (int64_t m = rb * kRowBlock; m < r_end; ++m)
        for (int64_t n = c0; n < c_end; ++n) {
          const float* am = a + m * depth;
          const float* bn = b + n * depth;
          float sum = 0.f;
#pragma omp simd reduction(+ : sum)
          for (int64_t k = 0; k < depth; ++k) sum += am[k] * bn[k];
          c[m * cols + n] += sum;
        }
    }
  }
}

void RecurrentKernel(KernelContext& ctx) { RunRecurrent(ctx, GemmTransB, ApplyRecurrentActivation); }

}  // namespace

void AddRecurrentReferenceKernels(ReferenceKernelTable& t) {
  t.Add("RNN", RecurrentKernel);
  t.Add("GRU", RecurrentKernel);
  t.Add("LSTM", RecurrentKernel);
}

}  // namespace osprey
