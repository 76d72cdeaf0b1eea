#pragma once
// A fake accelerator for testing device placement, transfers and the idle-release state machine on machines without
// a GPU (issue 16). Its "device memory" is host memory holding every byte inverted (~b): a host kernel that reads
// device memory, or a device kernel that reads host memory, without the planner's copy sees garbage and the test
// comparing with the host plan fails. Its kernels are the reference kernels of the ops in `ops`, run on decoded
// copies. Thread-safe.
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "kernels/kernel.h"
#include "kernels/reference/reference.h"
#include "osprey/device.h"

namespace osprey::testing {

class FakeDevice : public DeviceBackend {
 public:
  explicit FakeDevice(std::set<std::string> ops, int64_t capacity = int64_t{1} << 30)
      : ops_(std::move(ops)), capacity_(capacity) {}
  const char* name() const override { return "fake"; }
  int DeviceCount() override { return 1; }
  std::string Describe(int) override { return "fake device (host memory, inverted bytes)"; }
  void* Malloc(int ordinal, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    CheckOrdinal(ordinal);
    EnsureContextLocked();
    if (static_cast<int64_t>(bytes) > capacity_ - used_)
      throw Error(ErrorCode::kResourceExhausted, "fake device: out of memory allocating " + std::to_string(bytes));
    used_ += static_cast<int64_t>(bytes);
    void* p = std::malloc(bytes + sizeof(size_t));
    std::memcpy(p, &bytes, sizeof(size_t));
    return static_cast<char*>(p) + sizeof(size_t);
  }
  void Free(int, void* data) override {
    std::lock_guard<std::mutex> lock(mu_);
    char* p = static_cast<char*>(data) - sizeof(size_t);
    size_t bytes;
    std::memcpy(&bytes, p, sizeof(size_t));
    used_ -= static_cast<int64_t>(bytes);
    std::free(p);
  }
  void CopyToDevice(int, void* dst, const void* src, size_t bytes, void*) override { Invert(dst, src, bytes); }
  void CopyToHost(int, void* dst, const void* src, size_t bytes, void*) override { Invert(dst, src, bytes); }
  void CopyOnDevice(int, void* dst, const void* src, size_t bytes, void*) override { std::memmove(dst, src, bytes); }
  void* AcquireStream(int ordinal) override {
    std::lock_guard<std::mutex> lock(mu_);
    CheckOrdinal(ordinal);
    EnsureContextLocked();
    ++streams_out_;
    return &stream_token_;
  }
  void ReleaseStream(int, void* stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    OSPREY_CHECK(stream == &stream_token_);
    --streams_out_;
  }
  void Synchronize(int, void*) override {}
  std::unique_ptr<Kernel> CreateKernel(const KernelBuildContext& bc) override;
  bool ContextActive(int) override {
    std::lock_guard<std::mutex> lock(mu_);
    return active_;
  }
  void ReleaseContext(int) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (used_ != 0)
      throw Error(ErrorCode::kUnavailable,
                  "fake device: " + std::to_string(used_) + " bytes still allocated at context release");
    active_ = false;
  }
  int64_t ContextsCreated() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return created_;
  }
  int64_t bytes_used() const {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }
  int streams_out() const {
    std::lock_guard<std::mutex> lock(mu_);
    return streams_out_;
  }
  static void Invert(void* dst, const void* src, size_t bytes) {
    auto* d = static_cast<unsigned char*>(dst);
    const auto* s = static_cast<const unsigned char*>(src);
    for (size_t i = 0; i < bytes; ++i) d[i] = static_cast<unsigned char>(~s[i]);
  }

 private:
  void CheckOrdinal(int ordinal) const {
    if (ordinal != 0) throw Error(ErrorCode::kInvalidArgument, "fake device: ordinal " + std::to_string(ordinal));
  }
  void EnsureContextLocked() {
    if (!active_) {
      active_ = true;
      ++created_;
    }
  }
  mutable std::mutex mu_;
  std::set<std::string> ops_;
  int64_t capacity_;
  int64_t used_ = 0;
  int streams_out_ = 0;
  bool active_ = false;
  int64_t created_ = 0;
  int stream_token_ = 0;
};

// Runs the reference kernel on decoded host copies of its device inputs and encodes its outputs back.
class FakeDeviceKernel : public Kernel {
 public:
  explicit FakeDeviceKernel(ReferenceKernel ref) : ref_(ref) {}
  const char* Name() const override { return "FakeDevice"; }
  size_t WorkspaceBytes() const override { return 256; }
  void Run(KernelContext& ctx) override {
    OSPREY_CHECK(ctx.stream != nullptr && ctx.workspace != nullptr);
    std::vector<Tensor> ins(ctx.inputs.size()), outs;
    KernelContext host{ctx.node, ctx.opset};
    for (size_t i = 0; i < ctx.inputs.size(); ++i) {
      if (!ctx.inputs[i]) {
        host.inputs.push_back(nullptr);
        continue;
      }
      const Tensor& d = *ctx.inputs[i];
      OSPREY_CHECK(!d.buffer() || d.buffer()->device() == Device::kCuda);
      ins[i] = Tensor(d.dtype(), d.shape());
      FakeDevice::Invert(ins[i].raw(), d.raw(), d.nbytes());
      host.inputs.push_back(&ins[i]);
    }
    outs.reserve(ctx.outputs.size());
    for (Tensor* d : ctx.outputs) {
      OSPREY_CHECK(d->buffer()->device() == Device::kCuda);
      outs.emplace_back(d->dtype(), d->shape());
    }
    for (Tensor& t : outs) host.outputs.push_back(&t);
    ref_(host);
    for (size_t i = 0; i < outs.size(); ++i) FakeDevice::Invert(ctx.outputs[i]->raw(), outs[i].raw(), outs[i].nbytes());
  }

 private:
  ReferenceKernel ref_;
};

inline std::unique_ptr<Kernel> FakeDevice::CreateKernel(const KernelBuildContext& bc) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    EnsureContextLocked();
  }
  OSPREY_CHECK(bc.device.kind == Device::kCuda);
  if (!ops_.count(bc.node.op_type)) return nullptr;
  ReferenceKernel ref = FindReferenceKernel(bc.node.op_type);
  return ref ? std::make_unique<FakeDeviceKernel>(ref) : nullptr;
}

/// Installs a fake device as the CUDA backend for the scope of a test.
class ScopedFakeDevice {
 public:
  explicit ScopedFakeDevice(std::set<std::string> ops, int64_t capacity = int64_t{1} << 30)
      : device_(std::move(ops), capacity) {
    InstallDeviceBackend(Device::kCuda, &device_);
  }
  ~ScopedFakeDevice() { InstallDeviceBackend(Device::kCuda, nullptr); }
  FakeDevice& operator*() { return device_; }
  FakeDevice* operator->() { return &device_; }

 private:
  FakeDevice device_;
};

}  // namespace osprey::testing
