// Device placement: copies between the host and the plan's device (docs/architecture.md, "Devices").
#include <map>

#include "runtime/plan_impl.h"

namespace osprey {

namespace {

constexpr const char* kCopyToDevice = "_CopyToDevice";
constexpr const char* kCopyToHost = "_CopyToHost";

class DeviceCopy : public Kernel {
 public:
  DeviceCopy(DeviceBackend* backend, int ordinal, bool to_device)
      : backend_(backend), ordinal_(ordinal), to_device_(to_device) {}
  const char* Name() const override { return to_device_ ? "CopyToDevice" : "CopyToHost"; }
  void Run(KernelContext& ctx) override {
    const Tensor& in = ctx.In(0);
    Tensor& out = ctx.Out(0);
    OSPREY_CHECK(in.nbytes() == out.nbytes());
    if (in.nbytes() == 0) return;
    if (to_device_)
      backend_->CopyToDevice(ordinal_, out.raw(), in.raw(), in.nbytes(), ctx.stream);
    else
      backend_->CopyToHost(ordinal_, out.raw(), in.raw(), in.nbytes(), ctx.stream);  // waits for the stream
  }

 private:
  DeviceBackend* backend_;
  int ordinal_;
  bool to_device_;
};

Step MakeCopyStep(const Plan::Impl& impl, int from, int to, bool to_device, const std::string& value_name) {
  Step step;
  step.node.op_type = to_device ? kCopyToDevice : kCopyToHost;
  step.node.domain = "osprey";
  step.node.name = value_name;
  step.node.inputs = {0};
  step.node.outputs = {1};
  step.inputs = {from};
  step.outputs = {to};
  step.fast = std::make_unique<DeviceCopy>(impl.backend, impl.device.ordinal, to_device);
  // A copy to the device runs on the stream; a copy to the host is a host step that waits for it.
  step.on_device = to_device;
  return step;
}

// The device copy of constant `host` (uploaded now, synchronously), shared through the weight store when there is one.
Tensor UploadConstant(const Plan::Impl& impl, WeightStore* weights, const Tensor& host) {
  DeviceBackend* backend = impl.backend;
  const int ordinal = impl.device.ordinal;
  const size_t bytes = host.nbytes();
  auto fill = [&](void* device_data) {
    if (bytes) backend->CopyToDevice(ordinal, device_data, host.raw(), bytes, nullptr);
    backend->Synchronize(ordinal, nullptr);
  };
  std::shared_ptr<Buffer> buffer;
  if (weights && host.buffer()) {
    buffer = weights->Derive(host, "upload", bytes, fill, impl.device);
  } else {
    buffer = Allocator::Host().AllocateOn(impl.device.kind, ordinal, std::max<size_t>(bytes, 1), impl.account);
    fill(buffer->data());
  }
  return Tensor::View(host.dtype(), host.shape(), std::move(buffer), 0);
}

}  // namespace

bool IsDeviceCopy(const Step& step) {
  return step.node.domain == "osprey" && (step.node.op_type == kCopyToDevice || step.node.op_type == kCopyToHost);
}

void PlaceOnDevice(Plan::Impl& impl, WeightStore* weights) {
  std::vector<Step> placed;
  placed.reserve(impl.steps.size() * 2);
  // Per slot, its copy on the other side (created at the first reader there).
  std::map<int, int> on_device, on_host;
  auto new_slot = [&](int like, Device device) {
    Slot s;
    s.kind = Slot::Kind::kArena;
    s.dtype = impl.slots[like].dtype;
    s.shape = impl.slots[like].shape;
    s.device = device;
    impl.slots.push_back(std::move(s));
    return static_cast<int>(impl.slots.size()) - 1;
  };
  for (Step& step : impl.steps) {
    const Device want = step.on_device ? impl.device.kind : Device::kHost;
    for (size_t k = 0; k < step.inputs.size(); ++k) {
      const int s = step.inputs[k];
      if (s < 0 || impl.slots[s].device == want) continue;
      const std::string name = step.node.name + ":in" + std::to_string(k);
      if (want != Device::kHost) {
        auto it = on_device.find(s);
        if (it == on_device.end()) {
          int d;
          if (impl.slots[s].kind == Slot::Kind::kConstant) {
            Slot c = impl.slots[s];
            c.constant = UploadConstant(impl, weights, impl.slots[s].constant);
            c.device = want;
            impl.slots.push_back(std::move(c));
            d = static_cast<int>(impl.slots.size()) - 1;
          } else {
            d = new_slot(s, want);
            placed.push_back(MakeCopyStep(impl, s, d, true, name));
          }
          it = on_device.emplace(s, d).first;
        }
        step.inputs[k] = it->second;
      } else {
        auto it = on_host.find(s);
        if (it == on_host.end()) {
          const int h = new_slot(s, Device::kHost);
          placed.push_back(MakeCopyStep(impl, s, h, false, name));
          it = on_host.emplace(s, h).first;
        }
        step.inputs[k] = it->second;
      }
    }
    std::vector<Step> after;
    if (step.on_device) {
      for (size_t k = 0; k < step.outputs.size(); ++k) {
        const int s = step.outputs[k];
        if (impl.slots[s].kind == Slot::Kind::kOutput) {
          // Graph outputs are host tensors the caller owns: write on the device, copy back right after.
          const int d = new_slot(s, want);
          step.outputs[k] = d;
          on_device[s] = d;
          after.push_back(MakeCopyStep(impl, d, s, false, step.node.name + ":out" + std::to_string(k)));
        } else {
          impl.slots[s].device = want;
        }
      }
    }
    placed.push_back(std::move(step));
    for (Step& a : after) placed.push_back(std::move(a));
  }

  // Uploads of graph inputs go first and downloads into graph outputs nobody else reads go last, so that a plan run
  // wholly on the device is [uploads][device kernels][downloads] and its kernels can be replayed as one graph.
  std::vector<char> read(impl.slots.size(), 0);
  for (const Step& s : placed)
    for (int in : s.inputs)
      if (in >= 0) read[in] = 1;
  auto is_upload = [&](const Step& s) {
    return IsDeviceCopy(s) && s.on_device && impl.slots[s.inputs[0]].kind == Slot::Kind::kInput;
  };
  auto is_download = [&](const Step& s) {
    return IsDeviceCopy(s) && !s.on_device && impl.slots[s.outputs[0]].kind == Slot::Kind::kOutput &&
           !read[s.outputs[0]];
  };
  // 0: upload of a graph input, 1: the rest, 2: download into a graph output nobody else reads.
  std::vector<int> group(placed.size());
  for (size_t i = 0; i < placed.size(); ++i) group[i] = is_upload(placed[i]) ? 0 : is_download(placed[i]) ? 2 : 1;
  std::vector<Step> ordered;
  ordered.reserve(placed.size());
  size_t begin = 0, end = 0;
  for (int g = 0; g < 3; ++g) {
    for (size_t i = 0; i < placed.size(); ++i)
      if (group[i] == g) ordered.push_back(std::move(placed[i]));
    if (g == 0) begin = ordered.size();
    if (g == 1) end = ordered.size();
  }
  impl.steps = std::move(ordered);
  bool graphable = end > begin;
  for (size_t i = begin; i < end && graphable; ++i)
    graphable = impl.steps[i].on_device && !IsDeviceCopy(impl.steps[i]);
  impl.graph_begin = graphable ? begin : 0;
  impl.graph_end = graphable ? end : 0;
}

}  // namespace osprey
