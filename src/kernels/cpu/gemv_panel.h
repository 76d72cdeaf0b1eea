#pragma once
// Rows times a constant matrix packed in panels of columns (gemv_kernel.cc): the classifier at batch 1 (GemvF32,
// AVX-512 only: GemvPanelsAvailable) and each step of a float recurrent layer (recurrent_kernels.cc; AVX-512 or AVX2).
#include <cstdint>

#include "kernels/cpu/dnnl_common.h"

namespace osprey::cpu {

/// Columns per panel on this CPU: 64 with AVX-512 (four zmm), else 16 (two ymm: a panel's rows read one after another,
/// as the hardware prefetcher wants; strips of a 64-column panel, 256 bytes apart, left the AVX2 loop waiting on its
/// loads).
int64_t GemvPanelWidth();

/// Whether the panel product can run here: AVX-512, and not turned off with OSPREY_GEMV=0 (for comparisons).
bool GemvPanelsAvailable();

/// Whether the panel product runs here for the float recurrent steps: AVX-512 or AVX2 + FMA, and not turned off with
/// OSPREY_GEMV=0.
bool RecurrentPanelsAvailable();

/// W(k, n) for k < `k`, n < `n`, as `from` describes it in `source` (dims {1, n, 1, k}), packed into panels of
/// GemvPanelWidth() columns (k rows each, zero columns past n) through the weight store (shared and counted like every
/// pack).
PackedWeight PackGemvPanels(const KernelBuildContext& ctx, const dnnl::memory::desc& from, const Tensor& source,
                            int64_t n, int64_t k);

/// y[r][j] (+)= sum_k x[r][k] W(k, j) for r < rows, j < n (x rows of k, y rows of n), W packed by PackGemvPanels;
/// `accumulate`: add to y instead of writing. Panels [first, last) only (a caller splitting the columns over
/// threads). Up to eight rows (AVX2: four) go through a panel together.
void GemvPanels(const float* x, const float* panels, int64_t k, int64_t n, float* y, bool accumulate,
                int64_t first_panel, int64_t last_panel, int64_t rows = 1);

}  // namespace osprey::cpu
