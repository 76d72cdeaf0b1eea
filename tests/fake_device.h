#pragma once
// A fake accelerator for testing device placement, transfers and the idle-release state machine on machines without
// a GPU (issue 16). Its "device memory" is host memory holding every byte inverted (~b): a host kernel that reads
// device memory, or a device kernel that reads host memory, without the planner's copy sees garbage and the test
// comparing with the host plan fails. Its kernels are the reference kernels of the ops in `ops`, run on decoded
// copies. Thread-safe.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <vector>

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
  void CopyOnDevice(int, void* dst, const void* src, size_t bytes, void*) override {
    std::memmove(dst, src, bytes);
    ++copies_on_device_;
  }
  int copies_on_device() const { return copies_on_device_.load(); }
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
  // Graphs: while capturing, fake kernels record closures instead of running; Replay runs them.
  bool BeginCapture(int, void*) override {
    if (!graphs_) return false;
    std::lock_guard<std::mutex> lock(mu_);
    OSPREY_CHECK(!capturing_);
    capturing_ = true;
    recorded_ = std::make_shared<std::vector<std::function<void()>>>();
    return true;
  }
  std::shared_ptr<void> EndCapture(int, void*) override {
    std::lock_guard<std::mutex> lock(mu_);
    capturing_ = false;
    ++captures_;
    return std::move(recorded_);
  }
  void Replay(int, void* graph, void*) override {
    for (auto& f : *static_cast<std::vector<std::function<void()>>*>(graph)) f();
    std::lock_guard<std::mutex> lock(mu_);
    ++replays_;
  }
  // True (and the closure kept) when a capture is recording.
  bool Record(std::function<void()> f) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!capturing_) return false;
    recorded_->push_back(std::move(f));
    return true;
  }
  void set_graphs(bool on) { graphs_ = on; }
  int captures() const {
    std::lock_guard<std::mutex> lock(mu_);
    return captures_;
  }
  int replays() const {
    std::lock_guard<std::mutex> lock(mu_);
    return replays_;
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
  bool graphs_ = true;
  bool capturing_ = false;
  std::shared_ptr<std::vector<std::function<void()>>> recorded_;
  int captures_ = 0, replays_ = 0;
  std::atomic<int> copies_on_device_{0};
};

// Runs the reference kernel on decoded host copies of its device inputs and encodes its outputs back. Under graph
// capture it records what a replay must do instead: the same device addresses, read and written then.
class FakeDeviceKernel : public Kernel {
 public:
  FakeDeviceKernel(FakeDevice* device, ReferenceKernel ref) : device_(device), ref_(ref) {}
  const char* Name() const override { return "FakeDevice"; }
  size_t WorkspaceBytes() const override { return 256; }
  void Run(KernelContext& ctx) override {
    OSPREY_CHECK(ctx.stream != nullptr && ctx.workspace != nullptr);
    std::vector<View> ins, outs;
    for (const Tensor* t : ctx.inputs) {
      OSPREY_CHECK(!t || !t->buffer() || t->buffer()->device() == Device::kCuda);
      ins.push_back(t ? View{true, t->dtype(), t->shape(), const_cast<void*>(t->raw())} : View{});
    }
    for (Tensor* t : ctx.outputs) {
      OSPREY_CHECK(t->buffer()->device() == Device::kCuda);
      outs.push_back({true, t->dtype(), t->shape(), t->raw()});
    }
    const Node* node = &ctx.node;  // the plan's step: lives as long as the plan and its graphs
    const int opset = ctx.opset;
    if (device_->Record([this, ins, outs, node, opset] { Execute(*node, opset, ins, outs); })) return;
    Execute(*node, opset, ins, outs);
  }

 private:
  struct View {
    bool present = false;
    DType dtype = DType::kF32;
    Shape shape;
    void* data = nullptr;
  };
  void Execute(const Node& node, int opset, const std::vector<View>& ins, const std::vector<View>& outs) const {
    std::vector<Tensor> host_in(ins.size()), host_out;
    KernelContext host{node, opset};
    for (size_t i = 0; i < ins.size(); ++i) {
      if (!ins[i].present) {
        host.inputs.push_back(nullptr);
        continue;
      }
      host_in[i] = Tensor(ins[i].dtype, ins[i].shape);
      FakeDevice::Invert(host_in[i].raw(), ins[i].data, host_in[i].nbytes());
      host.inputs.push_back(&host_in[i]);
    }
    host_out.reserve(outs.size());
    for (const View& v : outs) host_out.emplace_back(v.dtype, v.shape);
    for (Tensor& t : host_out) host.outputs.push_back(&t);
    ref_(host);
    for (size_t i = 0; i < outs.size(); ++i) FakeDevice::Invert(outs[i].data, host_out[i].raw(), host_out[i].nbytes());
  }
  FakeDevice* device_;
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
  return ref ? std::make_unique<FakeDeviceKernel>(this, ref) : nullptr;
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
