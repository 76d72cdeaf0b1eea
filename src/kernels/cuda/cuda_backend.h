#pragma once
// The CUDA device backend (issue 16): device memory, copies, a stream pool per device with per-stream cuBLAS/cuDNN
// handles, kernels (CreateKernel: float32 kernels for the zoo's ops, nullptr for the rest) and context release
// (ReleaseContext resets the primary context, so the process holds no device memory). Built only when nvcc is found
// (cmake/cuda.cmake); the runtime registers it with SetBuiltinDeviceBackend(Device::kCuda, osprey::cuda::Backend()).
#include "osprey/device.h"

namespace osprey::cuda {

/// The process-lifetime CUDA backend (never destroyed).
DeviceBackend* Backend();

}  // namespace osprey::cuda
