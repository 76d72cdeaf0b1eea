// RNN, GRU and LSTM on CPU: the reference computation (kernels/recurrent_cell.h) with oneDNN's sgemm for its matrix
// products: the input projection of all steps at once ([S*N, I] x [I, G*H]) and each step's h·R^T. The projection is
// most of the work for the short, wide recurrent heads of OCR recognisers and audio models.
#include <oneapi/dnnl/dnnl.h>

#include <memory>
#include <string>

#include "kernels/cpu/cpu_kernels.h"
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

class RecurrentF32Dnnl final : public Kernel {
 public:
  explicit RecurrentF32Dnnl(std::string name) : name_(std::move(name)) {}
  const char* Name() const override { return name_.c_str(); }
  void Run(KernelContext& ctx) override { RunRecurrent(ctx, DnnlGemmTransB); }

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
