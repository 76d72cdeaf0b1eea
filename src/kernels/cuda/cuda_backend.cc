// The CUDA backend: memory, copies, streams with their library handles, kernels, and context release.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/cuda_graph.h"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/cuda_libs.h"
#include "kernels/kernel.h"

namespace osprey::cuda {
namespace {

constexpr int kMaxDevices = 64;

std::string DeviceName(int ordinal) { return "cuda:" + std::to_string(ordinal); }

std::string MiB(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

std::string VersionText(int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); }

// Library handles bound to one stream.
struct StreamHandles {
  cublasHandle_t blas = nullptr;
  void* blas_workspace = nullptr;
  cudnnHandle_t dnn = nullptr;
};

struct DeviceState {
  std::atomic<bool> active{false};
  std::vector<cudaStream_t> free_streams;
  std::vector<cudaStream_t> streams;  // every stream this backend created on the device
  std::unordered_map<cudaStream_t, StreamHandles> handles;
  std::unordered_map<void*, size_t> allocations;
  size_t blas_workspace_bytes = 0;
};

class CudaBackend final : public DeviceBackend {
 public:
  const char* name() const override { return "cuda"; }

  int DeviceCount() override {
    std::call_once(count_once_, [this] {
      int n = 0;
      if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // no driver, no device, driver too old: none
        n = 0;
      }
      count_ = n < 0 ? 0 : (n > kMaxDevices ? kMaxDevices : n);
    });
    return count_;
  }

  std::string Describe(int ordinal) override {
    std::string libs = "; " + CudnnStatus() + "; " + CublasStatus();
    if (ordinal < 0 || ordinal >= DeviceCount()) {
      int n = 0;
      cudaError_t e = cudaGetDeviceCount(&n);
      cudaGetLastError();
      return "no CUDA device " + DeviceName(ordinal) +
             (e != cudaSuccess ? std::string(" (") + cudaGetErrorString(e) + ")" : std::string()) + libs;
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, ordinal) != cudaSuccess) {
      cudaError_t e = cudaGetLastError();
      return DeviceName(ordinal) + ": " + cudaGetErrorString(e) + libs;
    }
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);
    cudaGetLastError();
    return std::string(prop.name) + ", " + MiB(prop.totalGlobalMem) + ", sm_" + std::to_string(prop.major) +
           std::to_string(prop.minor) + ", driver " + VersionText(driver) + ", runtime " + VersionText(runtime) + libs;
  }

  void* Malloc(int ordinal, size_t bytes) override {
    DeviceState& d = Use(ordinal);
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, total = 0;
      std::string room;
      if (cudaMemGetInfo(&free_bytes, &total) == cudaSuccess) room = ": " + MiB(free_bytes) + " free of " + MiB(total);
      cudaGetLastError();
      throw Error(e == cudaErrorMemoryAllocation ? ErrorCode::kResourceExhausted : ErrorCode::kInternal,
                  DeviceName(ordinal) + ": cannot allocate " + std::to_string(bytes) + " bytes (" + MiB(bytes) +
                      ") of device memory" + room + " (" + cudaGetErrorString(e) + ")");
    }
    std::lock_guard<std::mutex> lock(mu_);
    d.allocations[p] = bytes;
    return p;
  }

  void Free(int ordinal, void* data) override {
    if (data == nullptr || ordinal < 0 || ordinal >= kMaxDevices) return;
    DeviceState& d = devices_[ordinal];
    {
      std::lock_guard<std::mutex> lock(mu_);
      // After ReleaseContext the block went with the context; freeing it would create a new one.
      if (d.allocations.erase(data) == 0 || !d.active.load()) return;
    }
    cudaSetDevice(ordinal);
    if (cudaFree(data) != cudaSuccess) cudaGetLastError();  // called from destructors: never throws
  }

  void CopyToDevice(int ordinal, void* dst, const void* src, size_t bytes, void* stream) override {
    Copy(ordinal, dst, src, bytes, stream, cudaMemcpyHostToDevice, "to the device");
  }
  void CopyToHost(int ordinal, void* dst, const void* src, size_t bytes, void* stream) override {
    Copy(ordinal, dst, src, bytes, stream, cudaMemcpyDeviceToHost, "to the host");
    if (stream != nullptr) Sync(ordinal, static_cast<cudaStream_t>(stream), "copy to the host");
  }
  void CopyOnDevice(int ordinal, void* dst, const void* src, size_t bytes, void* stream) override {
    Copy(ordinal, dst, src, bytes, stream, cudaMemcpyDeviceToDevice, "on the device");
  }

  void* AcquireStream(int ordinal) override {
    DeviceState& d = Use(ordinal);
    std::lock_guard<std::mutex> lock(mu_);
    if (!d.free_streams.empty()) {
      cudaStream_t s = d.free_streams.back();
      d.free_streams.pop_back();
      return s;
    }
    cudaStream_t s = nullptr;
    CheckCuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), DeviceName(ordinal) + ": creating a stream");
    d.streams.push_back(s);
    return s;
  }

  void ReleaseStream(int ordinal, void* stream) override {
    if (stream == nullptr || ordinal < 0 || ordinal >= kMaxDevices) return;
    DeviceState& d = devices_[ordinal];
    std::lock_guard<std::mutex> lock(mu_);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    for (cudaStream_t known : d.streams)
      if (known == s) {
        d.free_streams.push_back(s);
        return;
      }
    // Not ours (or destroyed by ReleaseContext meanwhile): nothing to pool.
  }

  void Synchronize(int ordinal, void* stream) override {
    CheckOrdinal(ordinal);
    if (!devices_[ordinal].active.load()) return;  // no context: nothing was queued
    CheckCuda(cudaSetDevice(ordinal), DeviceName(ordinal));
    Sync(ordinal, static_cast<cudaStream_t>(stream), "synchronize");
  }

  std::unique_ptr<Kernel> CreateKernel(const KernelBuildContext& bc) override {
    if (bc.device.kind != Device::kCuda) return nullptr;
    if (bc.node.Has("_then"))
      return nullptr;  // fused steps (ops/activation.h): CPU plans make them; the host runs them
    Use(bc.device.ordinal);
    return CreateCudaKernel(bc);
  }

  bool ContextActive(int ordinal) override {
    if (ordinal < 0 || ordinal >= kMaxDevices) return false;
    return devices_[ordinal].active.load();
  }

  void ReleaseContext(int ordinal) override {
    CheckOrdinal(ordinal);
    DeviceState& d = devices_[ordinal];
    std::lock_guard<std::mutex> lock(mu_);
    if (!d.active.load()) return;
    if (!d.allocations.empty()) {
      size_t live = 0;
      for (const auto& [p, n] : d.allocations) live += n;
      throw Error(ErrorCode::kUnavailable, DeviceName(ordinal) +
                                               ": cannot release the CUDA context: osprey still holds " +
                                               std::to_string(d.allocations.size()) + " device buffer(s) of " +
                                               std::to_string(live) + " bytes (free them first)");
    }
    cudaSetDevice(ordinal);
    cudaDeviceSynchronize();
    const CublasApi* blas = Cublas();
    const CudnnApi* dnn = Cudnn();
    for (auto& [stream, h] : d.handles) {
      if (h.blas && blas) blas->Destroy(h.blas);
      if (h.blas_workspace) cudaFree(h.blas_workspace);
      if (h.dnn && dnn) dnn->Destroy(h.dnn);
    }
    d.handles.clear();
    for (cudaStream_t s : d.streams) cudaStreamDestroy(s);
    d.streams.clear();
    d.free_streams.clear();
    // With the static runtime this releases the primary context: the process then holds no memory on the device.
    cudaDeviceReset();
    cudaGetLastError();
    d.active.store(false);
  }

  int64_t ContextsCreated() const override { return contexts_created_.load(); }

  bool BeginCapture(int ordinal, void* stream) override { return BeginGraphCapture(ordinal, stream); }
  std::shared_ptr<void> EndCapture(int ordinal, void* stream) override { return EndGraphCapture(ordinal, stream); }
  void Replay(int ordinal, void* graph, void* stream) override { ReplayGraph(ordinal, graph, stream); }

  // ------------------------------------------------------------ internal (cuda_internal.h)

  // Makes `ordinal` current and its context live.
  DeviceState& Use(int ordinal) {
    CheckOrdinal(ordinal);
    DeviceState& d = devices_[ordinal];
    CheckCuda(cudaSetDevice(ordinal), DeviceName(ordinal));
    if (d.active.load(std::memory_order_acquire)) return d;
    std::lock_guard<std::mutex> lock(mu_);
    if (!d.active.load()) {
      CheckCuda(cudaFree(nullptr), DeviceName(ordinal) + ": creating the CUDA context");  // creates it now
      if (d.blas_workspace_bytes == 0) {
        cudaDeviceProp prop{};
        const bool hopper = cudaGetDeviceProperties(&prop, ordinal) == cudaSuccess && prop.major >= 9;
        cudaGetLastError();
        d.blas_workspace_bytes = hopper ? (size_t{32} << 20) : (size_t{4} << 20);  // cuBLAS's recommendation
      }
      d.active.store(true, std::memory_order_release);
      contexts_created_.fetch_add(1);
    }
    return d;
  }

  cublasHandle_t BlasHandle(int ordinal, cudaStream_t stream) {
    const CublasApi* api = Cublas();
    if (api == nullptr) return nullptr;
    DeviceState& d = Use(ordinal);
    std::lock_guard<std::mutex> lock(mu_);
    StreamHandles& h = d.handles[stream];
    if (h.blas) return h.blas;
    cublasHandle_t handle = nullptr;
    cublasStatus_t s = api->Create(&handle);
    if (s != CUBLAS_STATUS_SUCCESS)
      throw Error(ErrorCode::kInternal, DeviceName(ordinal) + ": cublasCreate: " + api->GetStatusString(s));
    // An explicit workspace, so that cuBLAS never allocates while a run is captured into a CUDA Graph.
    void* workspace = nullptr;
    if (cudaMalloc(&workspace, d.blas_workspace_bytes) != cudaSuccess) {
      cudaGetLastError();
      api->Destroy(handle);
      throw Error(ErrorCode::kResourceExhausted,
                  DeviceName(ordinal) + ": cannot allocate the cuBLAS workspace (" + MiB(d.blas_workspace_bytes) + ")");
    }
    api->SetStream(handle, stream);
    api->SetWorkspace(handle, workspace, d.blas_workspace_bytes);
    api->SetMathMode(handle, CUBLAS_DEFAULT_MATH);  // no TF32 for float32 GEMMs
    h.blas = handle;
    h.blas_workspace = workspace;
    return handle;
  }

  cudnnHandle_t DnnHandle(int ordinal, cudaStream_t stream) {
    const CudnnApi* api = Cudnn();
    if (api == nullptr) return nullptr;
    DeviceState& d = Use(ordinal);
    std::lock_guard<std::mutex> lock(mu_);
    StreamHandles& h = d.handles[stream];
    if (h.dnn) return h.dnn;
    cudnnHandle_t handle = nullptr;
    cudnnStatus_t s = api->Create(&handle);
    if (s != CUDNN_STATUS_SUCCESS)
      throw Error(ErrorCode::kInternal, DeviceName(ordinal) + ": cudnnCreate: " + api->GetErrorString(s));
    api->SetStream(handle, stream);
    h.dnn = handle;
    return handle;
  }

 private:
  void CheckOrdinal(int ordinal) {
    const int n = DeviceCount();
    if (ordinal < 0 || ordinal >= n)
      throw Error(ErrorCode::kInvalidArgument,
                  DeviceName(ordinal) + ": no such CUDA device (" + std::to_string(n) + " present)");
  }

  void Sync(int ordinal, cudaStream_t stream, const char* what, bool device = false) {
    cudaError_t e = device ? cudaDeviceSynchronize() : cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw Error(ErrorCode::kInternal, DeviceName(ordinal) + ": " + what + ": " + cudaGetErrorString(e));
    }
  }

  void Copy(int ordinal, void* dst, const void* src, size_t bytes, void* stream, cudaMemcpyKind kind,
            const char* what) {
    if (bytes == 0) return;
    Use(ordinal);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    // No stream: synchronous with everything queued on the device (the backend's streams are non-blocking, so the
    // legacy default stream alone would not wait for them), and complete when this returns.
    if (s == nullptr) Sync(ordinal, nullptr, "copy", /*device=*/true);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, s);
    if (e != cudaSuccess) {
      cudaGetLastError();
      throw Error(ErrorCode::kInternal, DeviceName(ordinal) + ": copy of " + std::to_string(bytes) + " bytes " + what +
                                            " failed: " + cudaGetErrorString(e));
    }
    if (s == nullptr) Sync(ordinal, nullptr, "copy");
  }

  std::mutex mu_;
  std::array<DeviceState, kMaxDevices> devices_;
  std::atomic<int64_t> contexts_created_{0};
  std::once_flag count_once_;
  int count_ = 0;
};

CudaBackend* Instance() {
  static CudaBackend* backend = new CudaBackend();  // process lifetime: never destroyed (no exit-order issues)
  return backend;
}

std::atomic<bool> g_host_emulation{false};

}  // namespace

DeviceBackend* Backend() { return Instance(); }

void SetHostEmulation(bool on) { g_host_emulation.store(on); }
bool HostEmulation() { return g_host_emulation.load(std::memory_order_relaxed); }

cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0 || dst == src) return cudaSuccess;
  if (HostEmulation()) {
    std::memmove(dst, src, bytes);
    return cudaSuccess;
  }
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream);
}

void CheckCuda(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  throw Error(ErrorCode::kInternal, what + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

cublasHandle_t BlasHandle(int ordinal, void* stream) {
  return Instance()->BlasHandle(ordinal, static_cast<cudaStream_t>(stream));
}

cudnnHandle_t DnnHandle(int ordinal, void* stream) {
  return Instance()->DnnHandle(ordinal, static_cast<cudaStream_t>(stream));
}

void UseDevice(int ordinal) { Instance()->Use(ordinal); }

}  // namespace osprey::cuda
