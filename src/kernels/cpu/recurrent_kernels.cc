// RNN, GRU and LSTM on CPU: the reference computation (kernels/recurrent_cell.h) with oneDNN's sgemm for its matrix
// products (the input projection of all steps at once, [S*N, I] x [I, G*H], and each step's h·R^T) and
// vectorised sigmoid/tanh. Within 1e-4 of the reference (tests/unit/kernels/recurrent_test.cc).
// Float comparisons cannot trap here, which lets GCC turn the selects in vector_math.h into blends (as in
// elementwise_kernels.cc), so the activation loops vectorise.
#pragma GCC optimize("no-trapping-math")

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <memory>
#include <string>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/recurrent_cell.h"

namespace osprey {
namespace {

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

class RecurrentF32Dnnl final : public Kernel {
 public:
  explicit RecurrentF32Dnnl(std::string name) : name_(std::move(name)) {}
  const char* Name() const override { return name_.c_str(); }
  void Run(KernelContext& ctx) override { RunRecurrent(ctx, DnnlGemmTransB, FastActivate); }

 private:
  std::string name_;
};

}  // namespace

std::unique_ptr<Kernel> CreateRecurrentKernel(const KernelBuildContext& ctx) {
  const std::string& op = ctx.node.op_type;
  if (op != "RNN" && op != "GRU" && op != "LSTM") return nullptr;
  for (size_t i = 0; i < ctx.input_dtypes.size(); ++i)
    if (ctx.present[i] && i != 4 && ctx.input_dtypes[i] != DType::kF32) return nullptr;
  return std::make_unique<RecurrentF32Dnnl>(op + "F32Dnnl");
}

}  // namespace osprey
