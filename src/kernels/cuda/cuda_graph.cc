#include "kernels/cuda/cuda_graph.h"

#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_internal.h"

namespace osprey::cuda {

bool BeginGraphCapture(int ordinal, void* stream) {
  if (stream == nullptr || HostEmulation()) return false;
  UseDevice(ordinal);
  if (cudaStreamBeginCapture(static_cast<cudaStream_t>(stream), cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

std::shared_ptr<void> EndGraphCapture(int ordinal, void* stream) {
  UseDevice(ordinal);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(static_cast<cudaStream_t>(stream), &graph);
  if (ended != cudaSuccess || graph == nullptr) {
    cudaGetLastError();
    if (graph) cudaGraphDestroy(graph);
    return nullptr;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess || exec == nullptr) {
    cudaGetLastError();
    return nullptr;
  }
  return std::shared_ptr<void>(exec, [ordinal](void* e) {
    UseDevice(ordinal);
    cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e));
  });
}

void ReplayGraph(int ordinal, void* graph, void* stream) {
  UseDevice(ordinal);
  CheckCuda(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph), static_cast<cudaStream_t>(stream)),
            "cudaGraphLaunch");
}

}  // namespace osprey::cuda
