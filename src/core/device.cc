#include "osprey/device.h"

#include <array>
#include <atomic>
#include <cstdlib>

namespace osprey {

namespace {
std::array<std::atomic<DeviceBackend*>, kNumDevices> g_installed{};
std::array<std::atomic<DeviceBackend*>, kNumDevices> g_builtin{};
}  // namespace

DeviceSpec ParseDevice(const std::string& text, const std::string& what) {
  if (text == "cpu") return {};
  if (text == "cuda") return {Device::kCuda, 0};
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() <= 8) {
    int ordinal = 0;
    for (size_t i = 5; i < text.size(); ++i) {
      if (text[i] < '0' || text[i] > '9') ordinal = -1;
      if (ordinal >= 0) ordinal = ordinal * 10 + (text[i] - '0');
    }
    if (ordinal >= 0) return {Device::kCuda, ordinal};
  }
  throw Error(ErrorCode::kInvalidArgument,
              what + " must be \"cpu\", \"cuda\" or \"cuda:N\" (N: the GPU's index), got \"" + text + "\"");
}

std::string DeviceSpecName(const DeviceSpec& spec) {
  if (spec.kind == Device::kHost) return "cpu";
  return "cuda:" + std::to_string(spec.ordinal);
}

DeviceBackend* GetDeviceBackend(Device kind) {
  const int d = static_cast<int>(kind);
  if (d <= 0 || d >= kNumDevices) return nullptr;
  if (DeviceBackend* b = g_installed[d].load()) return b;
  return g_builtin[d].load();
}

void InstallDeviceBackend(Device kind, DeviceBackend* backend) {
  const int d = static_cast<int>(kind);
  OSPREY_CHECK(d > 0 && d < kNumDevices);
  g_installed[d].store(backend);
}

void SetBuiltinDeviceBackend(Device kind, DeviceBackend* backend) {
  const int d = static_cast<int>(kind);
  OSPREY_CHECK(d > 0 && d < kNumDevices);
  g_builtin[d].store(backend);
}

DeviceBackend& RequireDevice(const DeviceSpec& spec) {
  if (spec.kind == Device::kHost) throw Error(ErrorCode::kInternal, "RequireDevice called for the host");
  DeviceBackend* backend = GetDeviceBackend(spec.kind);
  const std::string name = DeviceSpecName(spec);
  if (backend == nullptr)
    throw Error(ErrorCode::kUnsupported, "device " + name +
                                             ": this osprey was built without CUDA (rebuild on a machine with nvcc "
                                             "and cuDNN: the build finds them; see docs/gpu.md), use --device cpu");
  const int count = backend->DeviceCount();
  if (count == 0)
    throw Error(ErrorCode::kUnsupported,
                "device " + name + ": no CUDA device found (no NVIDIA driver, or no GPU visible to this process: "
                                   "check nvidia-smi and CUDA_VISIBLE_DEVICES), use --device cpu");
  if (spec.ordinal < 0 || spec.ordinal >= count)
    throw Error(ErrorCode::kUnsupported, "device " + name + ": only " + std::to_string(count) +
                                             " CUDA device(s) present (cuda:0 to cuda:" + std::to_string(count - 1) +
                                             ")");
  return *backend;
}

}  // namespace osprey
