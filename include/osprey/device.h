#pragma once
/// Accelerators (issue 16). A device backend owns one kind of device's memory, copies, streams and context; the
/// runtime places each step of a plan on the device when the backend has a kernel for it and on the host otherwise,
/// inserting the copies (docs/architecture.md, "Devices"). The CUDA backend lives in src/kernels/cuda (built when nvcc
/// is found); tests install a fake backend whose "device memory" is host memory, so placement, transfers and the
/// idle-release state machine are tested on machines without a GPU.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "osprey/tensor.h"

namespace osprey {

class Kernel;
struct KernelBuildContext;

/// Where a plan runs: "cpu", "cuda" (= "cuda:0") or "cuda:N".
struct DeviceSpec {
  Device kind = Device::kHost;
  int ordinal = 0;
  bool operator==(const DeviceSpec&) const = default;
};
/// Parses "cpu", "cuda", "cuda:N" (kInvalidArgument naming `what` otherwise).
DeviceSpec ParseDevice(const std::string& text, const std::string& what = "device");
/// "cpu", "cuda:0".
std::string DeviceSpecName(const DeviceSpec& spec);

/// One kind of accelerator. Every method is thread-safe. Streams are opaque handles (cudaStream_t for CUDA).
/// The context is created by the first call that needs it and released only by ReleaseContext.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  /// "cuda", "fake".
  virtual const char* name() const = 0;
  /// Devices present (0 without a device or driver). Never throws, never creates a context.
  virtual int DeviceCount() = 0;
  /// Human-readable description of device `ordinal` ("NVIDIA H200, 143771 MiB, driver 13.0").
  virtual std::string Describe(int ordinal) = 0;
  /// Device memory. Malloc throws kResourceExhausted (with how much is free) when the device cannot hold `bytes`.
  virtual void* Malloc(int ordinal, size_t bytes) = 0;
  virtual void Free(int ordinal, void* data) = 0;
  /// Copies on `stream` (may be null: the default stream, synchronous). CopyToHost returns when the data is on the
  /// host; CopyToDevice and CopyOnDevice may return before the copy is done (later work on `stream` sees it).
  virtual void CopyToDevice(int ordinal, void* dst, const void* src, size_t bytes, void* stream) = 0;
  virtual void CopyToHost(int ordinal, void* dst, const void* src, size_t bytes, void* stream) = 0;
  virtual void CopyOnDevice(int ordinal, void* dst, const void* src, size_t bytes, void* stream) = 0;
  /// A stream for one run (pooled), and its return.
  virtual void* AcquireStream(int ordinal) = 0;
  virtual void ReleaseStream(int ordinal, void* stream) = 0;
  /// Waits for everything queued on `stream`; throws kInternal with the device's error message if a kernel failed.
  virtual void Synchronize(int ordinal, void* stream) = 0;
  /// A kernel for this node on this device, or nullptr (the step then runs on the host).
  virtual std::unique_ptr<Kernel> CreateKernel(const KernelBuildContext& bc) = 0;
  /// Whether the device's context exists now (it costs device memory: hundreds of MiB for CUDA).
  virtual bool ContextActive(int ordinal) = 0;
  /// Frees everything the backend holds on device `ordinal` (streams, library handles, caches) and destroys the
  /// context, so the process holds no device memory. Callers free their buffers first (osprey's own live device bytes
  /// must be 0: kUnavailable otherwise). The next call that needs the device creates a new context.
  virtual void ReleaseContext(int ordinal) = 0;
  /// How many contexts this backend has created (for statistics and tests of the idle sequence).
  virtual int64_t ContextsCreated() const = 0;

  /// Graph capture (CUDA Graphs): between BeginCapture and EndCapture the work queued on `stream` is recorded, not
  /// run; EndCapture returns the replayable graph, or nullptr when capture failed (the recorded work is discarded and
  /// the caller runs it normally). A backend without graphs returns false from BeginCapture. Replay queues the whole
  /// graph on `stream`; it reads and writes the same device addresses as the captured work did.
  virtual bool BeginCapture(int ordinal, void* stream) { return false; }
  virtual std::shared_ptr<void> EndCapture(int ordinal, void* stream) { return nullptr; }
  virtual void Replay(int ordinal, void* graph, void* stream) {}
};

/// The backend for `kind`: the one installed by InstallDeviceBackend, else the built-in one (CUDA when osprey was
/// built with it), else nullptr.
DeviceBackend* GetDeviceBackend(Device kind);
/// Replaces the backend for `kind` (tests install a fake; nullptr restores the built-in one). Not thread-safe with
/// running plans: install before compiling.
void InstallDeviceBackend(Device kind, DeviceBackend* backend);
/// Registers the built-in backend for `kind` (called once by the runtime when it was built with that backend).
void SetBuiltinDeviceBackend(Device kind, DeviceBackend* backend);

/// The backend for `spec` with at least ordinal+1 devices; throws kUnsupported saying why not (osprey built without
/// CUDA, no device or driver found, ordinal out of range).
DeviceBackend& RequireDevice(const DeviceSpec& spec);

}  // namespace osprey
