#include <set>
#include <sstream>

#include "ops/op_registry.h"
#include "osprey/runtime.h"

namespace osprey {

Model::Model(Graph graph, ModelOptions options)
    : graph_(std::move(graph)),
      options_(std::move(options)),
      weight_store_(options_.weight_store ? options_.weight_store : std::make_shared<WeightStore>()),
      account_(std::make_shared<MemoryAccount>("model:" + graph_.name)),
      plan_cache_(options_.plan_cache_capacity) {
  graph_.Validate();
  ValidateOps(graph_);
  fingerprint_ = graph_.Fingerprint();
  std::set<const Buffer*> held;
  for (auto& [id, t] : graph_.constants) {
    t = weight_store_->Intern(t);
    if (held.insert(t.buffer().get()).second) {
      weight_store_->Hold(t);
      held_weights_.push_back(t);
    }
  }
}

Model::~Model() {
  for (const Tensor& t : held_weights_) weight_store_->Unhold(t);
}

int64_t Model::WeightBytes() const {
  int64_t total = 0;
  for (const Tensor& t : held_weights_) total += static_cast<int64_t>(t.buffer()->size());
  return total;
}

int64_t Model::SharedWeightBytes() const {
  int64_t total = 0;
  for (const Tensor& t : held_weights_)
    if (weight_store_->Holders(t) > 1) total += static_cast<int64_t>(t.buffer()->size());
  return total;
}

std::vector<Tensor> Model::OrderedInputs(const std::map<std::string, Tensor>& inputs,
                                         std::vector<TensorSpec>* specs) const {
  auto expected_names = [&] {
    std::string s;
    for (size_t i = 0; i < graph_.input_infos.size(); ++i)
      s += (i ? ", " : "") + graph_.input_infos[i].name + " " + DTypeName(graph_.input_infos[i].dtype) +
           graph_.input_infos[i].ShapeString();
    return s;
  };
  for (const auto& [name, t] : inputs) {
    bool found = false;
    for (const ValueInfo& vi : graph_.input_infos) found = found || vi.name == name;
    if (!found)
      throw Error(ErrorCode::kInvalidArgument,
                  "unknown input '" + name + "'; the model's inputs are: " + expected_names());
  }
  std::vector<Tensor> ordered;
  std::map<std::string, int64_t> bound;  // symbolic dim -> size
  for (const ValueInfo& vi : graph_.input_infos) {
    auto it = inputs.find(vi.name);
    if (it == inputs.end())
      throw Error(ErrorCode::kInvalidArgument,
                  "missing input '" + vi.name + "' (" + DTypeName(vi.dtype) + vi.ShapeString() +
                      "); the model's inputs are: " + expected_names());
    const Tensor& t = it->second;
    const std::string what = "input '" + vi.name + "'";
    if (t.dtype() != vi.dtype)
      throw Error(ErrorCode::kInvalidArgument,
                  what + ": expected dtype " + DTypeName(vi.dtype) + ", got " + DTypeName(t.dtype()));
    if (vi.has_shape) {
      if (t.rank() != static_cast<int64_t>(vi.dims.size()))
        throw Error(ErrorCode::kInvalidArgument, what + ": expected rank " + std::to_string(vi.dims.size()) + " " +
                                                     vi.ShapeString() + ", got rank " + std::to_string(t.rank()) +
                                                     " " + ShapeToString(t.shape()));
      for (size_t d = 0; d < vi.dims.size(); ++d) {
        const Dim& dim = vi.dims[d];
        if (dim.value >= 0 && dim.value != t.shape()[d])
          throw Error(ErrorCode::kInvalidArgument, what + ": dim " + std::to_string(d) + " must be " +
                                                       std::to_string(dim.value) + " (expected shape " +
                                                       vi.ShapeString() + "), got " + ShapeToString(t.shape()));
        if (dim.value < 0 && !dim.symbol.empty() && dim.symbol != "?") {
          auto [b, inserted] = bound.emplace(dim.symbol, t.shape()[d]);
          if (!inserted && b->second != t.shape()[d])
            throw Error(ErrorCode::kInvalidArgument, what + ": dim " + std::to_string(d) + " ('" + dim.symbol +
                                                         "') is " + std::to_string(t.shape()[d]) +
                                                         " but another input bound it to " +
                                                         std::to_string(b->second));
        }
      }
    }
    if (!t.defined() || (t.numel() > 0 && t.raw() == nullptr))
      throw Error(ErrorCode::kInvalidArgument, what + ": tensor has no data");
    ordered.push_back(t);
    specs->push_back({t.dtype(), t.shape()});
  }
  return ordered;
}

std::shared_ptr<const Plan> Model::PlanFor(const std::map<std::string, Tensor>& inputs) {
  std::vector<TensorSpec> specs;
  OrderedInputs(inputs, &specs);
  return plan_cache_.GetOrCompile(fingerprint_, specs, options_.compile, [&] {
    return Compile(graph_, specs, options_.compile, weight_store_.get(), account_);
  });
}

std::vector<std::pair<std::string, Tensor>> Model::Run(const std::map<std::string, Tensor>& inputs,
                                                       std::vector<OpProfile>* profile) {
  std::vector<TensorSpec> specs;
  std::vector<Tensor> ordered = OrderedInputs(inputs, &specs);
  auto plan = plan_cache_.GetOrCompile(fingerprint_, specs, options_.compile, [&] {
    return Compile(graph_, specs, options_.compile, weight_store_.get(), account_);
  });
  std::vector<Tensor> outs = plan->Run(ordered, profile);
  std::vector<std::pair<std::string, Tensor>> named;
  for (size_t i = 0; i < outs.size(); ++i) named.emplace_back(graph_.value_names[graph_.outputs[i]], std::move(outs[i]));
  return named;
}

}  // namespace osprey
