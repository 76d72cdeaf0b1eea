#pragma once
// Host-side helpers shared by the CUDA kernels (*.cc). Not for use outside src/kernels/cuda.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <memory>
#include <string>

#include "kernels/cuda/cuda_launch.h"
#include "kernels/kernel.h"

namespace osprey::cuda {

/// Throws Error(kInternal, "<what>: <CUDA error>") unless `e` is cudaSuccess (clears the error state first).
void CheckCuda(cudaError_t e, const std::string& what);

/// The cuBLAS / cuDNN handle bound to `stream` on device `ordinal` (created on first use with the stream; destroyed by
/// ReleaseContext). nullptr when the library could not be loaded. Callers serialise their use of one stream (one run
/// per stream at a time), so the handle is not shared between threads. `stream` may be null (the default stream).
cublasHandle_t BlasHandle(int ordinal, void* stream);
cudnnHandle_t DnnHandle(int ordinal, void* stream);

/// Makes `ordinal` current on this thread and its context live (counted by ContextsCreated when it is new).
void UseDevice(int ordinal);

/// The fused activation of a node (_activation, _alpha, _beta). Returns false for an unknown name.
bool FusedActivation(const Node& node, Activation* act);

/// Kernel factories (cuda_kernels.cc, cuda_conv.cc, cuda_gemm.cc, cuda_shuffle.cc). nullptr: the step runs on the host.
std::unique_ptr<Kernel> CreateCudaKernel(const KernelBuildContext& bc);
std::unique_ptr<Kernel> CreateConvKernel(const KernelBuildContext& bc);
std::unique_ptr<Kernel> CreateConvTransposeKernel(const KernelBuildContext& bc);
std::unique_ptr<Kernel> CreateGemmKernel(const KernelBuildContext& bc);
std::unique_ptr<Kernel> CreateMatMulKernel(const KernelBuildContext& bc);
std::unique_ptr<Kernel> CreateChannelShuffleKernel(const KernelBuildContext& bc);

/// Base of the CUDA kernels: name, workspace, and the device its build context named.
class CudaKernel : public Kernel {
 public:
  CudaKernel(std::string name, int ordinal) : name_(std::move(name)), ordinal_(ordinal) {}
  const char* Name() const override { return name_.c_str(); }
  size_t WorkspaceBytes() const override { return workspace_bytes_; }
  void Run(KernelContext& ctx) final {
    if (!HostEmulation()) UseDevice(ordinal_);
    RunOn(ctx, static_cast<cudaStream_t>(ctx.stream));
  }

 protected:
  virtual void RunOn(KernelContext& ctx, cudaStream_t stream) = 0;
  /// Throws naming the kernel unless `e` is cudaSuccess.
  void Check(cudaError_t e) const { CheckCuda(e, name_); }
  int ordinal() const { return ordinal_; }
  size_t workspace_bytes_ = 0;

 private:
  std::string name_;
  int ordinal_;
};

}  // namespace osprey::cuda
