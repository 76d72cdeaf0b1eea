#include <omp.h>

#include <chrono>

#include "runtime/plan_impl.h"

namespace osprey {

Plan::Plan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Plan::~Plan() = default;
size_t Plan::num_steps() const { return impl_->steps.size(); }
size_t Plan::arena_bytes() const { return impl_->arena_bytes; }

size_t Plan::TrimArenas(double idle_seconds) const {
  const auto cutoff = std::chrono::steady_clock::now() -
                      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                          std::chrono::duration<double>(std::max(0.0, idle_seconds)));
  std::vector<std::shared_ptr<Buffer>> dropped;  // freed outside the lock
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->arena_mu);
    auto& pool = impl_->free_arenas;
    for (auto it = pool.begin(); it != pool.end();) {
      if (it->released <= cutoff) {
        bytes += it->buffer->size();
        dropped.push_back(std::move(it->buffer));
        it = pool.erase(it);
      } else {
        ++it;
      }
    }
  }
  return bytes;
}
const std::vector<TensorSpec>& Plan::output_specs() const { return impl_->output_specs; }
size_t Plan::num_fast_steps() const {
  size_t n = 0;
  for (const Step& s : impl_->steps) n += s.fast != nullptr;
  return n;
}

std::vector<Tensor> Plan::Run(const std::vector<Tensor>& inputs, std::vector<OpProfile>* profile) const {
  const Impl& p = *impl_;
  std::shared_ptr<Buffer> arena;
  {
    std::lock_guard<std::mutex> lock(p.arena_mu);
    if (!p.free_arenas.empty()) {
      arena = std::move(p.free_arenas.back().buffer);
      p.free_arenas.pop_back();
    }
  }
  if (!arena) arena = Allocator::Host().Allocate(p.arena_bytes, p.account);

  std::vector<Tensor> values(p.slots.size());
  for (size_t i = 0; i < p.slots.size(); ++i) {
    const Slot& s = p.slots[i];
    switch (s.kind) {
      case Slot::Kind::kConstant: values[i] = s.constant; break;
      case Slot::Kind::kInput:
        OSPREY_CHECK(s.input_index < static_cast<int>(inputs.size()));
        OSPREY_CHECK(inputs[s.input_index].shape() == s.shape && inputs[s.input_index].dtype() == s.dtype);
        values[i] = inputs[s.input_index];
        break;
      case Slot::Kind::kArena:
        values[i] = Tensor::View(s.dtype, PhysicalShape(s.shape, s.layout), arena, s.offset);
        break;
      case Slot::Kind::kOutput: values[i] = Tensor(s.dtype, s.shape); break;
    }
  }

  omp_set_num_threads(p.num_threads);
  std::vector<Tensor> views;
  try {
    for (const Step& step : p.steps) {
      KernelContext ctx{step.node, p.opset};
      ctx.inputs.reserve(step.inputs.size());
      views.clear();
      views.reserve(step.inputs.size());
      for (size_t k = 0; k < step.inputs.size(); ++k) {
        int s = step.inputs[k];
        if (s >= 0 && !step.has_view.empty() && step.has_view[k]) {
          views.push_back(values[s].Reshaped(step.input_views[k]));
          ctx.inputs.push_back(&views.back());
        } else {
          ctx.inputs.push_back(s >= 0 ? &values[s] : nullptr);
        }
      }
      for (int s : step.outputs) ctx.outputs.push_back(&values[s]);
      auto t0 = profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
      if (step.fast)
        step.fast->Run(ctx);
      else
        step.reference(ctx);
      if (profile) {
        double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        profile->push_back({step.node.name, step.node.op_type, step.fast ? step.fast->Name() : "reference", ms});
      }
    }
  } catch (...) {
    p.ReturnArena(std::move(arena));
    throw;
  }

  std::vector<Tensor> outputs;
  outputs.reserve(p.output_slots.size());
  std::vector<int> seen;
  for (int s : p.output_slots) {
    const Slot& slot = p.slots[s];
    // Outputs must own their memory: constants/inputs passed through are copied, and so is a repeated output.
    bool repeated = std::find(seen.begin(), seen.end(), s) != seen.end();
    if (slot.kind == Slot::Kind::kOutput && !repeated)
      outputs.push_back(values[s]);
    else
      outputs.push_back(values[s].Clone());
    seen.push_back(s);
  }
  p.ReturnArena(std::move(arena));
  return outputs;
}

}  // namespace osprey
