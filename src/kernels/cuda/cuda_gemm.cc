// Gemm and MatMul through cuBLAS (strided-batched SGEMM). Row-major products are computed as the column-major
// product of the swapped operands: C[M, N] = A[M, K] B[K, N] row-major is C^T = B^T A^T column-major, and a row-major
// buffer read as column-major is its transpose, so cuBLAS gets (B, A) with m = N, n = M.
//
// float32 uses CUBLAS_DEFAULT_MATH (set on the handle: no TF32). fp16 mode (KernelBuildContext::fp16) calls
// cublasGemmStridedBatchedEx with CUBLAS_COMPUTE_32F_FAST_16F: fp32 in and out, Tensor Core half products, fp32 sums.
#include <climits>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/cuda_libs.h"
#include "kernels/reference/reference.h"

namespace osprey::cuda {
namespace {

bool FitsInt(int64_t v) { return v >= 0 && v <= INT_MAX; }

// One strided-batched call: `count` products, operand i at a + i * stride_a, b + i * stride_b, y + i * stride_y.
struct GemmCall {
  int64_t a_offset = 0, b_offset = 0, y_offset = 0;
  int count = 1;
};

struct GemmShape {
  cublasOperation_t op_a = CUBLAS_OP_N, op_b = CUBLAS_OP_N;  // applied to the row-major A / B buffers' transposes
  int m = 0, n = 0, k = 0;                                   // row-major M, N, K
  int lda = 0, ldb = 0;
  int64_t stride_a = 0, stride_b = 0, stride_y = 0;
};

class GemmKernel final : public CudaKernel {
 public:
  GemmKernel(std::string name, int ordinal, const CublasApi* api, bool fp16)
      : CudaKernel(std::move(name), ordinal), api_(api), fp16_(fp16) {}

  GemmShape shape;
  std::vector<GemmCall> calls;
  float alpha = 1.f, beta = 0.f;
  // Gemm's C: broadcast into Y before the product (beta scales it there).
  bool prefill_c = false;
  StridedCopyGeometry c_copy;
  // MatMul's fused bias [N] (input 2), residual (input 3, the output's shape) and any fused activation, after the
  // product.
  bool has_bias = false, has_residual = false;
  int bias_input = 2;
  Activation act;
  int64_t total = 0;

 protected:
  void RunOn(KernelContext& ctx, cudaStream_t stream) override {
    if (total == 0) return;
    float* y = static_cast<float*>(ctx.Out(0).raw());
    if (shape.k == 0 && !prefill_c) Check(cudaMemsetAsync(y, 0, static_cast<size_t>(total) * sizeof(float), stream));
    if (prefill_c) Check(LaunchStridedCopy(stream, c_copy, ctx.In(2).raw(), y, sizeof(float)));
    cublasHandle_t handle = BlasHandle(ordinal(), stream);
    if (handle == nullptr) throw Error(ErrorCode::kInternal, std::string(Name()) + ": cuBLAS is not available");
    const float* a = static_cast<const float*>(ctx.In(0).raw());
    const float* b = static_cast<const float*>(ctx.In(1).raw());
    const float beta_eff = prefill_c ? beta : 0.f;
    for (const GemmCall& c : calls) {
      cublasStatus_t s;
      if (fp16_) {
        s = api_->GemmStridedBatchedEx(
            handle, shape.op_b, shape.op_a, shape.n, shape.m, shape.k, &alpha, b + c.b_offset, CUDA_R_32F, shape.ldb,
            shape.stride_b, a + c.a_offset, CUDA_R_32F, shape.lda, shape.stride_a, &beta_eff, y + c.y_offset,
            CUDA_R_32F, shape.n, shape.stride_y, c.count, CUBLAS_COMPUTE_32F_FAST_16F, CUBLAS_GEMM_DEFAULT);
      } else {
        s = api_->SgemmStridedBatched(handle, shape.op_b, shape.op_a, shape.n, shape.m, shape.k, &alpha, b + c.b_offset,
                                      shape.ldb, shape.stride_b, a + c.a_offset, shape.lda, shape.stride_a, &beta_eff,
                                      y + c.y_offset, shape.n, shape.stride_y, c.count);
      }
      if (s != CUBLAS_STATUS_SUCCESS)
        throw Error(ErrorCode::kInternal, std::string(Name()) + ": cuBLAS GEMM: " + api_->GetStatusString(s));
    }
    if (has_bias || has_residual || act.op != kUnaryIdentity) {
      const float* bias = has_bias ? static_cast<const float*>(ctx.In(bias_input).raw()) : nullptr;
      const float* residual = has_residual ? static_cast<const float*>(ctx.In(3).raw()) : nullptr;
      Check(LaunchBiasResidualAct(stream, y, bias, residual, total, shape.n, 1, act));
    }
  }

 private:
  const CublasApi* api_;
  bool fp16_;
};

bool PresentF32(const KernelBuildContext& bc, int i) {
  return i < static_cast<int>(bc.present.size()) && bc.present[i] && bc.input_dtypes[i] == DType::kF32;
}

std::string NameFor(const KernelBuildContext& bc) {
  return bc.node.op_type + (bc.fp16 ? "F32CublasFp16" : "F32Cublas");
}

}  // namespace

std::unique_ptr<Kernel> CreateGemmKernel(const KernelBuildContext& bc) {
  const Node& node = bc.node;
  if (!PresentF32(bc, 0) || !PresentF32(bc, 1) || bc.output_dtypes[0] != DType::kF32) return nullptr;
  const CublasApi* api = Cublas();
  if (api == nullptr) return nullptr;
  const Shape& a = bc.input_shapes[0];
  const Shape& b = bc.input_shapes[1];
  const Shape& y = bc.output_shapes[0];
  if (a.size() != 2 || b.size() != 2 || y.size() != 2) return nullptr;
  const bool trans_a = node.GetInt("transA", 0) != 0, trans_b = node.GetInt("transB", 0) != 0;
  const int64_t m = y[0], n = y[1], k = trans_a ? a[0] : a[1];
  if ((trans_a ? a[1] : a[0]) != m || (trans_b ? b[0] : b[1]) != n || (trans_b ? b[1] : b[0]) != k) return nullptr;
  if (!FitsInt(m) || !FitsInt(n) || !FitsInt(k)) return nullptr;
  auto kernel = std::make_unique<GemmKernel>(NameFor(bc), bc.device.ordinal, api, bc.fp16);
  kernel->alpha = node.GetFloat("alpha", 1.f);
  kernel->beta = node.GetFloat("beta", 1.f);
  GemmShape& s = kernel->shape;
  s.m = static_cast<int>(m);
  s.n = static_cast<int>(n);
  s.k = static_cast<int>(k);
  s.op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  s.op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  s.lda = static_cast<int>(trans_a ? m : k);
  s.ldb = static_cast<int>(trans_b ? k : n);
  if (s.lda < 1) s.lda = 1;
  if (s.ldb < 1) s.ldb = 1;
  kernel->calls = {GemmCall{}};
  kernel->total = m * n;
  if (bc.present.size() > 2 && bc.present[2] && kernel->beta != 0.f) {
    if (!PresentF32(bc, 2)) return nullptr;
    // C unidirectionally broadcast to [M, N].
    const Shape& c = bc.input_shapes[2];
    if (c.size() > 2) return nullptr;
    const Shape c2 = c.size() == 2 ? c : (c.size() == 1 ? Shape{1, c[0]} : Shape{1, 1});
    if ((c2[0] != 1 && c2[0] != m) || (c2[1] != 1 && c2[1] != n)) return nullptr;
    StridedCopyGeometry& g = kernel->c_copy;
    g = StridedCopyGeometry{};
    g.rank = 2;
    g.total = m * n;
    g.dims[0] = m;
    g.dims[1] = n;
    g.src_strides[0] = c2[0] == 1 ? 0 : c2[1];
    g.src_strides[1] = c2[1] == 1 ? 0 : 1;
    g.dst_strides[0] = n;
    g.dst_strides[1] = 1;
    kernel->prefill_c = true;
  }
  if (!FusedActivation(node, &kernel->act)) return nullptr;
  return kernel;
}

std::unique_ptr<Kernel> CreateMatMulKernel(const KernelBuildContext& bc) {
  const Node& node = bc.node;
  if (!PresentF32(bc, 0) || !PresentF32(bc, 1) || bc.output_dtypes[0] != DType::kF32) return nullptr;
  const CublasApi* api = Cublas();
  if (api == nullptr) return nullptr;
  const Shape& as = bc.input_shapes[0];
  const Shape& bs = bc.input_shapes[1];
  if (as.empty() || bs.empty()) return nullptr;
  const MatMulBatches mm = BatchedMatMul(as, bs);
  const int64_t m = mm.m, k = mm.k, n = mm.n;
  const int64_t batch = static_cast<int64_t>(mm.offsets.size());
  if (!FitsInt(m) || !FitsInt(n) || !FitsInt(k) || !FitsInt(batch)) return nullptr;
  if (NumElements(bc.output_shapes[0]) != batch * m * n) return nullptr;
  auto kernel = std::make_unique<GemmKernel>(NameFor(bc), bc.device.ordinal, api, bc.fp16);
  GemmShape& s = kernel->shape;
  s.k = static_cast<int>(k);
  s.n = static_cast<int>(n);
  s.lda = static_cast<int>(k > 0 ? k : 1);
  s.ldb = static_cast<int>(n > 0 ? n : 1);
  s.stride_y = m * n;
  kernel->total = batch * m * n;
  // The batch as strided calls: B shared and A's matrices consecutive -> one product with M' = batch * M; else
  // the largest runs (a suffix block of the batch dims) whose A and B offsets advance by constant strides; else one
  // call per matrix (broadcast patterns no stride describes).
  auto strided = [&](int64_t start, int64_t count, int64_t sa, int64_t sb) {
    for (int64_t j = 0; j < count; ++j) {
      const auto& o = mm.offsets[start + j];
      if (o.first != mm.offsets[start].first + j * sa || o.second != mm.offsets[start].second + j * sb) return false;
    }
    return true;
  };
  const int64_t sa0 = batch > 1 ? mm.offsets[1].first - mm.offsets[0].first : 0;
  const int64_t sb0 = batch > 1 ? mm.offsets[1].second - mm.offsets[0].second : 0;
  if (batch >= 1 && strided(0, batch, sa0, sb0) && sb0 == 0 && (batch == 1 || sa0 == m * k) && FitsInt(batch * m)) {
    s.m = static_cast<int>(batch * m);
    s.stride_a = s.stride_b = 0;
    s.stride_y = 0;
    kernel->calls = {GemmCall{mm.offsets[0].first, mm.offsets[0].second, 0, 1}};
  } else {
    s.m = static_cast<int>(m);
    // Candidate run lengths: products of trailing batch dims of the output (largest first).
    const Shape& y = bc.output_shapes[0];
    std::vector<int64_t> batch_dims;
    const size_t mat_dims = (as.size() == 1 || bs.size() == 1) ? (as.size() == 1 && bs.size() == 1 ? 0 : 1) : 2;
    for (size_t i = 0; i + mat_dims < y.size(); ++i) batch_dims.push_back(y[i]);
    std::vector<int64_t> runs;
    int64_t r = 1;
    for (size_t i = batch_dims.size(); i-- > 0;) {
      r *= batch_dims[i];
      runs.insert(runs.begin(), r);
    }
    runs.push_back(1);
    for (int64_t run : runs) {
      if (run <= 0 || batch % run != 0) continue;
      const int64_t sa = run > 1 ? mm.offsets[1].first - mm.offsets[0].first : 0;
      const int64_t sb = run > 1 ? mm.offsets[1].second - mm.offsets[0].second : 0;
      bool all = true;
      for (int64_t start = 0; start < batch && all; start += run) all = strided(start, run, sa, sb);
      if (!all) continue;
      s.stride_a = sa;
      s.stride_b = sb;
      kernel->calls.clear();
      for (int64_t start = 0; start < batch; start += run)
        kernel->calls.push_back(
            GemmCall{mm.offsets[start].first, mm.offsets[start].second, start * m * n, static_cast<int>(run)});
      break;
    }
    if (kernel->calls.empty()) return nullptr;
  }
  if (node.GetInt("_bias", 0) != 0 && bc.present.size() > 2 && bc.present[2]) {
    if (!PresentF32(bc, 2) || NumElements(bc.input_shapes[2]) != n) return nullptr;
    kernel->has_bias = true;
  }
  if (node.GetInt("_residual", 0) != 0) {
    if (!PresentF32(bc, 3) || bc.input_shapes[3] != bc.output_shapes[0]) return nullptr;
    kernel->has_residual = true;
  }
  if (!FusedActivation(node, &kernel->act)) return nullptr;
  return kernel;
}

}  // namespace osprey::cuda
